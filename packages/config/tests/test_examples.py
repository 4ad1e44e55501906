"""The example configs and upstream Telescope's run.yaml load unchanged."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from telescope_config import load_config

HERE = Path(__file__).parent
EXAMPLES = sorted((HERE.parents[2] / "configs" / "examples").glob("*.yaml"))
UPSTREAM_RUN = HERE / "data" / "upstream_run.yaml"


@pytest.mark.parametrize("path", [*EXAMPLES, UPSTREAM_RUN], ids=lambda p: p.stem)
def test_loads_unchanged_with_every_value_as_written(path):
    written = yaml.safe_load(path.read_text())
    resolved = load_config(path)
    assert resolved.user_keys == set(written)
    assert resolved.notes == ()
    values = resolved.to_dict()
    for key, value in written.items():
        if key in ("environments", "evals"):  # entries gain their defaults
            assert len(values[key]) == len(value)
            for got, given in zip(values[key], value, strict=True):
                assert {k: got[k] for k in given} == given
        else:
            assert values[key] == value, key


def test_countdown_example():
    cfg = load_config(HERE.parents[2] / "configs" / "examples" / "countdown.yaml").config
    [env] = cfg.environments
    assert (env.name, env.weight, env.reward_min, env.reward_max) == ("countdown", 1.0, 0.0, 2.0)
    assert env.kwargs == {"add_thinking_prefix": True}
    assert (cfg.max_tokens, cfg.max_model_len, cfg.number_of_steps) == (3600, 4096, 300)


def test_eval_example():
    cfg = load_config(HERE.parents[2] / "configs" / "examples" / "hendrycks_math_with_eval.yaml").config
    math500, own = cfg.evals
    assert (math500.name, math500.eval_every, math500.num_samples, math500.max_tokens) == (
        "math500",
        10,
        100,
        3000,
    )
    assert (own.name, own.separate_eval_samples, own.max_tokens) == ("hendrycks_math", True, None)
    assert cfg.eval_num_servers == 1
    assert cfg.num_inference_servers == 2


def test_upstream_run_yaml_notable_values():
    cfg = load_config(UPSTREAM_RUN).config
    assert cfg.prompt_prefetch_buffer_size == 8
    assert (cfg.tis_cap, cfg.tis_logprob_clamp, cfg.entropy_chunk_size) == (10, 2, 2048)
    assert cfg.max_tokens == 3600
    assert cfg.eval_before_training is False
    assert cfg.checkpoint_every is False
    assert cfg.enable_individual_sample_lanes is True  # written `True`
    assert cfg.environments[0].reward_max == 2.0
