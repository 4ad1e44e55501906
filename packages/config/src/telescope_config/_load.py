"""Loading: packaged defaults, the run YAML, values from Python, command-line overrides, then validation.

Later layers win; dicts deep-merge and lists replace. Every user mistake on the way — a file
that is missing, unreadable or not YAML, an unknown key, a wrong value, a broken cross-field
rule, a bad flag — becomes a ``Problem``; all of them are raised together as one
``ConfigError``. Nothing else escapes for bad input.
"""

from __future__ import annotations

import copy
import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from pydantic import ValidationError
from pydantic_core import ErrorDetails

from telescope_config import _render, _rules
from telescope_config._errors import MISSING, ConfigError, Problem, did_you_mean
from telescope_config._fieldinfo import choices, field_info, submodel_fields
from telescope_config._overrides import CLI, parse_collecting
from telescope_config._schema import SKIP_RULES, TelescopeConfig
from telescope_config._yaml import DEFAULTS_SOURCE, defaults, read_file

__all__ = ["ResolvedConfig", "deep_merge", "load_config"]


def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """``over`` layered on ``base``: nested dicts merge key by key; anything else (lists too) replaces."""
    out = dict(base)
    for key, value in over.items():
        below, above = _mapping(out.get(key)), _mapping(value)
        out[key] = (
            deep_merge(below, above) if below is not None and above is not None else copy.deepcopy(value)
        )
    return out


def _mapping(value: object) -> dict[str, Any] | None:
    return cast(dict[str, Any], value) if isinstance(value, dict) else None


@dataclass(frozen=True)
class ResolvedConfig:
    """A validated config plus where it came from.

    ``user_keys`` are the top-level fields the run YAML, the Python values or the command line set;
    ``sources`` the layers used, lowest first; ``notes`` the adjustments made (also logged as warnings).
    """

    config: TelescopeConfig
    user_keys: frozenset[str]
    sources: tuple[str, ...]
    notes: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """Every field, in the order of ``defaults.yaml``, as plain Python data."""
        return self.config.model_dump(mode="json")

    def to_yaml(self, mark_user_keys: bool = True) -> str:
        """The resolved config as YAML in the order of ``defaults.yaml``, user-set keys marked."""
        return _render.resolved_yaml(
            self.to_dict(), self.user_keys if mark_user_keys else frozenset(), self.sources, self.notes
        )


PYTHON_SOURCE = "the Python values"
"""The label of the ``values`` layer of :func:`load_config` in ``sources`` and problems."""


def load_config(
    config_path: str | os.PathLike[str] | None = None,
    overrides: Sequence[str] = (),
    *,
    values: Mapping[str, Any] | None = None,
    defaults_path: str | os.PathLike[str] | None = None,
) -> ResolvedConfig:
    """Resolve defaults, the run YAML at ``config_path``, ``values`` (fields given from Python, as
    in the YAML) and ``overrides`` into a validated config, in that order.

    Raises ``ConfigError`` listing every problem found; no other exception comes from bad input.
    """
    problems: list[Problem] = []
    layers = _file_layers(defaults_path, config_path, problems)
    base = layers[0][1]
    if values is not None:
        layers.append((PYTHON_SOURCE, _python_layer(values, problems)))
    cli_values, found, flag_of = parse_collecting(overrides)
    problems += found
    if overrides:
        layers.append((CLI, cli_values))

    where = " and ".join(
        ([str(config_path)] if config_path is not None else [])
        + ([PYTHON_SOURCE] if values is not None else [])
        + (["the command line"] if overrides else [])
    )
    where = where or "the defaults"
    if any(data is None for _, data in layers):  # a file we could not read: nothing to validate
        raise ConfigError(problems, where)

    merged: dict[str, Any] = {}
    origin: dict[str, str] = {}
    for label, data in layers:
        assert data is not None
        merged = deep_merge(merged, data)
        for key in data:
            origin[key] = flag_of.get(key, label) if label == CLI else label
    user_keys = frozenset(k for _, data in layers[1:] if data for k in data)

    cfg, failed, field_problems = _validate(merged, origin, base or {})
    problems += field_problems
    notes: list[str] = []
    if cfg is not None and not problems:
        for adj in _rules.adjustments(cfg):
            cfg = cfg.model_copy(update={adj.field: adj.value})
            notes.append(adj.note)
        notes += _rules.no_effect_notes(cfg, user_keys, base or {})
    if cfg is not None:
        for v in _rules.check(cfg, skip=failed):
            top = re.split(r"[.\[]", v.field, maxsplit=1)[0]
            problems.append(Problem(v.field, v.value, v.rule, v.fix, origin.get(top, DEFAULTS_SOURCE)))
    if problems or cfg is None:
        raise ConfigError(problems, where)
    return ResolvedConfig(cfg, user_keys, tuple(label for label, _ in layers), tuple(notes))


def _file_layers(
    defaults_path: str | os.PathLike[str] | None,
    config_path: str | os.PathLike[str] | None,
    problems: list[Problem],
) -> list[tuple[str, dict[str, Any] | None]]:
    """The defaults and the run YAML as ``(label, data)`` layers; data None for a file that could
    not be read (its problems go to ``problems``)."""
    if defaults_path is None:
        base: dict[str, Any] | None = defaults()
    else:
        base, found = read_file(defaults_path, DEFAULTS_SOURCE)
        problems += found
    layers: list[tuple[str, dict[str, Any] | None]] = [(DEFAULTS_SOURCE, base)]
    if config_path is not None:
        data, found = read_file(config_path, str(config_path))
        problems += found
        layers.append((str(config_path), data))
    return layers


def _python_layer(values: object, problems: list[Problem]) -> dict[str, Any] | None:
    """``values`` as a layer: a mapping with string keys, else a problem (and no layer)."""
    kind = type(values).__name__
    if isinstance(values, Mapping):
        layer = {k: v for k, v in cast(Mapping[object, Any], values).items() if isinstance(k, str)}
        if len(layer) == len(cast(Mapping[object, Any], values)):
            return layer
    rule = "the values must be a mapping of field names (strings) to values"
    fix = "pass a dict such as {'model': 'Qwen/Qwen3-0.6B', 'number_of_steps': 10}"
    problems.append(Problem("(config)", kind, rule, fix, PYTHON_SOURCE))
    return None


def _validate(
    merged: dict[str, Any], origin: Mapping[str, str], base: Mapping[str, Any]
) -> tuple[TelescopeConfig | None, frozenset[str], list[Problem]]:
    """Validate field by field; on errors, rebuild from the valid fields so the rules can still run."""
    try:
        return TelescopeConfig.model_validate(merged, context={SKIP_RULES: True}), frozenset(), []
    except ValidationError as err:
        errors = err.errors(include_url=False)
    problems: dict[str, Problem] = {}
    for e in errors:
        p = _problem(e, origin, base)
        problems.setdefault(p.field, p)
    fields = TelescopeConfig.model_fields
    failed = frozenset(str(e["loc"][0]) for e in errors if e["loc"] and e["loc"][0] in fields)
    repaired = {k: v for k, v in merged.items() if k in fields and k not in failed}
    repaired |= {k: base[k] for k in failed if k in base}
    try:
        cfg = TelescopeConfig.model_validate(repaired, context={SKIP_RULES: True})
    except ValidationError:
        cfg = None
    return cfg, failed, list(problems.values())


def _loc_text(loc: Sequence[str | int]) -> str:
    text = ""
    for part in loc:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


def _problem(e: ErrorDetails, origin: Mapping[str, str], base: Mapping[str, Any]) -> Problem:
    """One pydantic error as a ``Problem`` with a rule and a fix a user can act on."""
    loc = tuple(e["loc"])
    field = _loc_text(loc) or "(config)"
    source = origin.get(str(loc[0]), DEFAULTS_SOURCE) if loc else DEFAULTS_SOURCE
    ctx: dict[str, Any] = e.get("ctx") or {}
    kind, value = e["type"], e.get("input")
    if kind == "extra_forbidden":
        hint = did_you_mean(str(loc[-1]), submodel_fields(loc[:-1]))
        where = "config field" if len(loc) == 1 else f"key in an {loc[0]} entry"
        return Problem(
            field,
            value,
            f"unknown {where}: {str(loc[-1])!r}",
            hint or "remove it; `telescope config show` and defaults.yaml list every valid key",
            source,
        )
    if kind == "telescope_rule":
        return Problem(field, value, ctx["rule"], ctx["fix"], source)
    found = field_info(loc)
    info = found[1] if found else None
    about = f" ({info.description.split('. ')[0].rstrip('.')})" if info and info.description else ""
    if len(loc) == 1:
        default = base.get(str(loc[0]), MISSING)
    elif found is not None and found[0] is not TelescopeConfig and not found[1].is_required():
        default = found[1].get_default(call_default_factory=True)  # an entry's own field
    else:
        default = MISSING
    shown = json.dumps(default) if default is not MISSING else ""
    if kind == "missing":
        example = "" if default is MISSING else f", e.g. {loc[-1]}: {shown}"
        return Problem(field, MISSING, "this key is required", f"add it{example}{about}", source)
    rule = str(e["msg"]).replace("Input should be", "must be").replace("Value error, ", "")
    rule = re.sub(r" or instance of \w+", "", rule)
    if kind == "literal_error" and info is not None:
        options = choices(info.annotation)
        hint = did_you_mean(str(value), options) if isinstance(value, str) else None
        return Problem(field, value, rule, hint or "choose one of: " + ", ".join(options), source)
    wanted = rule.removeprefix("must be ").split(", ")[0]
    if wanted.startswith(("greater", "less", "at least", "at most")):
        wanted = "a value " + wanted
    fix = f"use {wanted}"
    if default is not MISSING:
        fix += f" (default: {shown})"
    if kind == "list_type" and not source.startswith("--"):
        fix = "write a list: one '- item' line per entry, or [a, b]" + (
            f" (default: {shown})" if shown else ""
        )
    elif kind in ("dict_type", "model_type") and not source.startswith("--"):
        fix = "write a mapping of key: value pairs, e.g. {name: countdown}" if len(loc) == 2 else fix
        fix = fix.replace("use a valid dictionary", "write a mapping of key: value pairs")
    if kind == "string_type" and isinstance(value, int | float):
        fix = f'quote it so YAML reads text: {field}: "{value}"'
    elif kind in ("list_type", "dict_type") and source.startswith("--"):
        example = '["a", "b"]' if kind == "list_type" else '{"key": "value"}'
        fix += f"; on the command line write it as JSON, e.g. {source} '{example}'"
    return Problem(field, value, rule, fix + about, source)
