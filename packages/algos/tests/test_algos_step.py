"""The backend-neutral pieces of a train step: loss options, minibatch groups, row multiples, RNG."""

from __future__ import annotations

import inspect
import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from telescope_algos import (
    compute_loss,
    loss_options,
    minibatch_groups,
    needs_old_logprobs,
    pad_multiple,
    rng_state,
    row_multiple,
    set_rng_state,
)
from telescope_algos._step import DATA_KEYWORDS


def _option_names() -> list[str]:
    params = inspect.signature(compute_loss).parameters.values()
    keyword = inspect.Parameter.KEYWORD_ONLY
    return [p.name for p in params if p.kind is keyword and p.name not in DATA_KEYWORDS]


def test_loss_options_read_every_non_data_keyword_of_compute_loss():
    names = _option_names()
    assert {"algorithm", "use_tis", "clip_low", "dr_grpo_loss_agg_mode", "entropy_coef"} <= set(names)
    config = SimpleNamespace(**{n: f"value of {n}" for n in names}, unrelated=1)
    assert loss_options(config) == {n: f"value of {n}" for n in names}


def test_a_config_without_a_loss_field_is_an_error():
    names = _option_names()
    config = SimpleNamespace(**{n: 0 for n in names if n != "tis_cap"})
    with pytest.raises(ValueError, match=r"lacks loss fields \['tis_cap'\]"):
        loss_options(config)


@pytest.mark.parametrize(
    ("algorithm", "ppo", "ref", "expected"),
    [
        ("grpo", False, "batch", False),  # no ratio: no pre-update pass
        ("grpo", True, "batch", True),
        ("grpo", True, "rollout", False),  # the ratio is against the rollout's logprobs
        ("gspo", False, "batch", True),
        ("cispo", False, "rollout", False),
    ],
)
def test_needs_old_logprobs(algorithm, ppo, ref, expected):
    config = SimpleNamespace(algorithm=algorithm, use_ppo_clip=ppo, ppo_clip_ref_logprobs=ref)
    assert needs_old_logprobs(config) is expected


def test_minibatch_groups_deal_round_robin():
    assert minibatch_groups(5, 2) == [[0, 2, 4], [1, 3]]
    assert minibatch_groups(2, 4) == [[0], [1]]  # never an empty group
    assert minibatch_groups(3, 1) == [[0, 1, 2]]
    with pytest.raises(ValueError, match=">= 1"):
        minibatch_groups(3, 0)


@pytest.mark.parametrize(
    ("cp", "tp", "expected"),
    [(1, 1, 1), (1, 2, 2), (2, 1, 4), (4, 1, 8), (2, 2, 4), (3, 2, 6), (2, 3, 12)],  # cp·lcm(2, tp)
)
def test_row_multiple(cp, tp, expected):
    assert row_multiple(context_parallel=cp, tensor_parallel=tp) == expected


def test_pad_multiple_is_the_least_common_multiple():
    assert pad_multiple(1, 1) == 1
    assert pad_multiple(6, 4) == 12
    assert pad_multiple(8, 4) == 8


def test_rng_state_round_trip():
    random.seed(1)
    np.random.seed(1)
    torch.manual_seed(1)
    saved = rng_state()
    expected = (random.random(), np.random.rand(), torch.rand(2))
    random.seed(7)
    np.random.seed(7)
    torch.manual_seed(7)
    set_rng_state(saved)
    got = (random.random(), np.random.rand(), torch.rand(2))
    assert got[:2] == expected[:2]
    assert torch.equal(got[2], expected[2])
