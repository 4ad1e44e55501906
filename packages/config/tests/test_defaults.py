"""The packaged defaults: one value per schema field, documented, in sync with the schema."""

from __future__ import annotations

import re
from importlib import resources
from pathlib import Path

import pytest
import yaml

from telescope_config import ConfigError, EnvironmentEntry, EvalEntry, TelescopeConfig, defaults, load_config
from telescope_config._render import render_defaults

DATA = Path(__file__).parent / "data"


def _defaults_text() -> str:
    return resources.files("telescope_config").joinpath("defaults.yaml").read_text(encoding="utf-8")


def test_defaults_and_schema_list_the_same_178_fields_in_the_same_order():
    assert list(defaults()) == list(TelescopeConfig.model_fields)
    assert len(TelescopeConfig.model_fields) == 178


def test_the_defaults_file_is_the_only_source_of_defaults():
    assert all(f.is_required() for f in TelescopeConfig.model_fields.values())


def test_defaults_match_upstream_except_the_deliberate_differences():
    upstream = yaml.safe_load((DATA / "upstream_defaults.yaml").read_text())
    assert len(upstream) == 147
    ours = defaults()
    assert set(ours) - set(upstream) == {
        "environments", "evals", "seed", "max_consecutive_unfit_prompts", "max_zero_advantage_batches",
        "enable_prefix_caching",
        "fsdp_gradient_checkpointing", "inference_max_restarts", "inference_health_timeout_seconds",
        "weight_broadcast_timeout_s", "trainer_max_restarts", "lora_rank", "lora_alpha", "lora_dropout",
        "lora_target_modules", "teacher_model", "teacher_placement", "teacher_num_workers",
        "teacher_tensor_parallel_size", "ref_placement",
        "distill_coef", "distill_reward_weight", "ref_model", "ref_num_workers", "ref_kl_coef",
        "ref_kl_estimator", "sft_steps", "sft_dataset", "sft_dataset_split", "sft_batch_size",
        "record_tokens",
    }  # fmt: skip
    assert set(upstream) <= set(ours)
    changed = {k for k in upstream if upstream[k] != ours[k] or type(upstream[k]) is not type(ours[k])}
    assert changed == {"use_wandb"}
    assert (upstream["use_wandb"], ours["use_wandb"]) == (True, False)
    assert ours["environments"] == []
    assert ours["evals"] == []


def test_every_field_is_documented():
    for model in (TelescopeConfig, EnvironmentEntry, EvalEntry):
        for name, info in model.model_fields.items():
            assert len(info.description or "") >= 25, f"{model.__name__}.{name}"


def test_every_key_in_the_defaults_file_has_a_comment_above_it():
    lines = _defaults_text().splitlines()
    keys = [(i, m.group(1)) for i, ln in enumerate(lines) if (m := re.match(r"^([a-z0-9_]+):", ln))]
    assert [k for _, k in keys] == list(TelescopeConfig.model_fields)
    for i, key in keys:
        assert lines[i - 1].startswith("# "), key
        assert not lines[i - 1].startswith("# --"), key


def test_the_deliberate_differences_are_explained_next_to_their_keys():
    text = _defaults_text()
    for key in ("use_wandb", "environments", "evals"):
        block = text.split(f"\n{key}:")[0].rsplit("\n\n", 1)[1]
        assert "Differs from upstream" in block or "Empty here" in block, key


def test_the_defaults_file_comments_are_rendered_from_the_schema():
    assert _defaults_text() == render_defaults(defaults()), (
        "defaults.yaml is out of date with the field descriptions; run "
        'python -c "from telescope_config._render import rewrite_defaults; rewrite_defaults()"'
    )


def test_defaults_returns_a_fresh_copy():
    first = defaults()
    first["wandb_tags"].append("mutated")
    assert defaults()["wandb_tags"] == ["telescope"]


def test_defaults_alone_fail_only_for_the_missing_environments():
    with pytest.raises(ConfigError) as info:
        load_config()
    [p] = info.value.problems
    assert (p.field, p.source) == ("environments", "defaults")
    assert str(info.value).startswith("1 problem in the defaults:")
