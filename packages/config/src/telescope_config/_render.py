"""Config as text: the commented ``defaults.yaml``, the resolved YAML a user sees, the JSON Schema.

``defaults.yaml`` holds the values (the one source of defaults); its comments are rendered from
the field descriptions of ``_schema`` so the two cannot drift. After editing a description or
a section, rewrite the file's comments (values are kept) with::

    python -c "from telescope_config._render import rewrite_defaults; rewrite_defaults()"

A test fails while the file and this rendering differ.
"""

from __future__ import annotations

import textwrap
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from telescope_config._schema import TelescopeConfig
from telescope_config._yaml import defaults

__all__ = ["DIFFERENCES", "SECTIONS", "json_schema", "render_defaults", "resolved_yaml"]

USER_MARK = "# set by you"
_WIDTH = 100

# (title, first field of the section), in field order.
SECTIONS: tuple[tuple[str, str], ...] = (
    ("General and model", "debug"),
    ("Ray cluster", "ray_address"),
    ("GPUs", "inference_num_workers"),
    ("Environments", "environments"),
    ("Orchestrator: rollout scheduling", "max_concurrent_prompts_per_server"),
    ("Trainer and optimizer", "learning_rate"),
    ("Megatron backend (ignored unless train_backend is megatron)", "megatron_tensor_parallel_size"),
    ("Algorithm and loss", "algorithm"),
    ("Teacher and reference model", "teacher_model"),
    ("Supervised fine-tuning", "sft_steps"),
    ("Sample filters and reward shaping", "filter_overlong"),
    ("Weight synchronisation, trainer to vLLM", "weight_broadcast_mode"),
    ("Sequence packing", "seq_len"),
    ("Inference servers (vLLM)", "inference_host"),
    ("Sampling", "group_size"),
    ("Checkpoints", "checkpoint_every"),
    ("Logging, W&B and telemetry", "use_wandb"),
    ("Evals and tracing", "eval_before_training"),
)

# Deliberate differences from upstream Telescope's defaults, stated next to the key.
DIFFERENCES: dict[str, str] = {
    "use_wandb": "Differs from upstream Telescope, whose default is true: a first run needs no W&B account.",
    "environments": "Empty here on purpose: each run YAML (or --environments) names its own.",
    "evals": "Empty here: a run evaluates nothing unless its run YAML lists evals.",
}

_HEADER = """\
# Telescope: every setting of a training run, with its default value.
#
# This file is the single source of the defaults and the reference of every field. A run starts
# from these values, then applies the run YAML given with --config, then command-line flags such
# as --learning_rate 5e-7. Later layers win; dicts merge key by key; lists are replaced.
#
# The comments are generated from the field descriptions in telescope_config/_schema.py: edit
# values here, descriptions there, then run `rewrite_defaults()` in telescope_config._render."""


class _Entry(dict[str, Any]):
    """One top-level ``key: value``: always block style, while small nested values stay inline."""


class _Dumper(yaml.SafeDumper):
    pass


def _block(dumper: yaml.SafeDumper, data: _Entry) -> yaml.MappingNode:
    return dumper.represent_mapping("tag:yaml.org,2002:map", data.items(), flow_style=False)


def _text(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    style = "|" if "\n" in data else None  # templates read best as literal blocks
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style=style)  # pyright: ignore[reportUnknownMemberType]


_Dumper.add_representer(_Entry, _block)

_Dumper.add_representer(str, _text)


def _dump(key: str, value: Any) -> str:
    return yaml.dump(
        _Entry({key: value}),
        Dumper=_Dumper,
        sort_keys=False,
        default_flow_style=None,
        width=_WIDTH,
        allow_unicode=True,
    )


def _section_starts() -> dict[str, str]:
    return {first: title for title, first in SECTIONS}


def render_defaults(values: Mapping[str, Any]) -> str:
    """The full text of ``defaults.yaml`` for these values: header, sections, a comment per key."""
    starts = _section_starts()
    out = [_HEADER]
    for name, info in TelescopeConfig.model_fields.items():
        if name in starts:
            out += ["", "", f"# {'-' * (_WIDTH - 2)}", f"# {starts[name]}", f"# {'-' * (_WIDTH - 2)}"]
        out.append("")
        text = info.description or ""
        if name in DIFFERENCES:
            text += " " + DIFFERENCES[name]
        out += textwrap.wrap(
            text, _WIDTH, initial_indent="# ", subsequent_indent="# ", break_on_hyphens=False
        )
        out.append(_dump(name, values[name]).rstrip("\n"))
    return "\n".join(out) + "\n"


def resolved_yaml(
    data: Mapping[str, Any], user_keys: Iterable[str], sources: Iterable[str], notes: Iterable[str]
) -> str:
    """A resolved config as YAML in field order; the first line of each user-set key ends in a mark."""
    user = frozenset(user_keys)
    starts = _section_starts()
    out = [f"# Resolved Telescope config. Layers, lowest first: {', '.join(sources)}."]
    if user:
        out.append(f"# Keys marked '{USER_MARK}' come from your run YAML or the command line.")
    out += [f"# Note: {note}" for note in notes]
    for name in TelescopeConfig.model_fields:
        if name in starts:
            out += ["", f"# --- {starts[name]} ---"]
        lines = _dump(name, data[name]).rstrip("\n").split("\n")
        if name in user:
            # A trailing comment is safe after "key:" (block value follows) or a one-line scalar;
            # a scalar folded over several lines gets the mark on a line of its own above it.
            if len(lines) == 1 or lines[0] == f"{name}:":
                lines[0] += f"  {USER_MARK}"
            else:
                lines.insert(0, USER_MARK)
        out += lines
    return "\n".join(out) + "\n"


def json_schema() -> dict[str, Any]:
    """JSON Schema of a run YAML file: every field optional (defaults fill it), documented, no extras."""
    schema = TelescopeConfig.model_json_schema()
    schema.pop("required", None)
    values = defaults()
    for name, prop in schema["properties"].items():
        prop["default"] = values[name]
    schema["properties"]["environments"]["minItems"] = 1
    schema["additionalProperties"] = False
    schema["description"] = (
        "A Telescope run YAML file. Every key is optional: the packaged defaults fill in the rest, "
        "except that a run must list at least one environment."
    )
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}


def rewrite_defaults() -> Path:
    """Rewrite the packaged ``defaults.yaml`` in place: same values, comments from the schema."""
    path = Path(__file__).with_name("defaults.yaml")
    path.write_text(render_defaults(defaults()), encoding="utf-8")
    return path
