"""Advantage estimators against hand-worked numbers (docs/algorithms.md#advantages)."""

import math

import pytest
import torch
from torch.testing import assert_close

import telescope_algos as ta

# Two groups of four: μ1 = 0.5, μ2 = 0.25.
REWARDS = torch.tensor([[1.0, 0.0, 1.0, 0.0], [0.0, 0.0, 0.0, 1.0]])


def test_grpo_group_mean_and_sample_std():
    # group 1: deviations ±0.5, sample var = 4·0.25/3 = 1/3, σ = 0.577350; 0.5/(0.577350+1e-4) = 0.865875
    # group 2: deviations −0.25 (x3), 0.75; var = (3·0.0625 + 0.5625)/3 = 0.25, σ = 0.5
    #          −0.25/0.5001 = −0.499900, 0.75/0.5001 = 1.499700
    a = 0.5 / (math.sqrt(1 / 3) + 1e-4)
    expected = torch.tensor([[a, -a, a, -a], [-0.499900, -0.499900, -0.499900, 1.499700]])
    assert_close(ta.grpo_advantages(REWARDS), expected, atol=1e-6, rtol=0)
    assert_close(ta.compute_advantages(REWARDS), expected, atol=1e-6, rtol=0)


@pytest.mark.parametrize("algorithm", ["cispo", "gspo", "sapo"])
def test_ratio_algorithms_use_grpo_advantages(algorithm):
    assert_close(ta.compute_advantages(REWARDS, algorithm=algorithm), ta.grpo_advantages(REWARDS))


def test_rloo_leave_one_out():
    # (r − μ)·n/(n−1): group 1: ±0.5·4/3 = ±0.666667 (= 1 − mean(0,1,0) = 2/3);
    # group 2: −0.25·4/3 = −1/3 and 0.75·4/3 = 1 (= 1 − mean(0,0,0))
    expected = torch.tensor([[2 / 3, -2 / 3, 2 / 3, -2 / 3], [-1 / 3, -1 / 3, -1 / 3, 1.0]])
    assert_close(ta.rloo_advantages(REWARDS), expected)
    assert_close(ta.compute_advantages(REWARDS, algorithm="rloo"), expected)


def test_dr_grpo_mean_centred_only():
    expected = torch.tensor([[0.5, -0.5, 0.5, -0.5], [-0.25, -0.25, -0.25, 0.75]])
    assert_close(ta.compute_advantages(REWARDS, algorithm="dr_grpo"), expected)


def test_reinforce_pp_centres_then_whitens_over_batch():
    # centre: [[0.5, −0.5], [1, −1]]; batch mean 0; var (0.25+0.25+1+1)/3 = 0.833333, std 0.912871
    # whiten: 0.5/0.912971 = 0.547663, 1/0.912971 = 1.095325
    rewards = torch.tensor([[1.0, 0.0], [3.0, 1.0]])
    expected = torch.tensor([[0.547663, -0.547663], [1.095325, -1.095325]])
    for norm in ("group", "batch"):  # reinforce_pp always whitens over the batch
        assert_close(ta.compute_advantages(rewards, algorithm="reinforce_pp", advantage_norm=norm), expected)


def test_batch_norm_for_grpo_is_reinforce_pp_stage():
    rewards = torch.tensor([[1.0, 0.0], [3.0, 1.0]])
    assert_close(
        ta.compute_advantages(rewards, algorithm="grpo", advantage_norm="batch"),
        ta.reinforce_pp_advantages(rewards),
    )


def test_size_one_groups_are_defined():
    rewards = torch.tensor([[3.0], [5.0]])
    zeros = torch.zeros(2, 1)
    assert_close(ta.grpo_advantages(rewards), zeros)  # σ := 0, r − μ = 0
    assert_close(ta.rloo_advantages(rewards), zeros)
    assert_close(ta.dr_grpo_advantages(rewards), zeros)
    # reinforce_pp: the group stage keeps the raw reward [3, 5]; batch mean 4, std √2 = 1.414214
    # (3 − 4)/(1.414214 + 1e-4) = −0.707057
    assert_close(ta.reinforce_pp_advantages(rewards), torch.tensor([[-0.707057], [0.707057]]))
    # a batch of one sample whitens to 0
    assert_close(ta.reinforce_pp_advantages([[7.0]]), torch.zeros(1, 1))


def test_constant_group_gives_zero_and_no_nan():
    out = ta.grpo_advantages(torch.ones(3, 5))
    assert_close(out, torch.zeros(3, 5))


def test_input_types_and_dtypes():
    assert ta.compute_advantages([[1, 0], [0, 1]]).dtype == torch.float32
    assert ta.compute_advantages(torch.tensor([[1.0, 0.0]], dtype=torch.float64)).dtype == torch.float64


def test_errors():
    with pytest.raises(ValueError, match="unknown algorithm"):
        ta.compute_advantages(REWARDS, algorithm="ppo")
    with pytest.raises(ValueError, match="unknown advantage_norm"):
        ta.compute_advantages(REWARDS, advantage_norm="global")
    for algorithm in ("rloo", "dr_grpo"):
        with pytest.raises(ValueError, match="not defined"):
            ta.compute_advantages(REWARDS, algorithm=algorithm, advantage_norm="batch")
    with pytest.raises(ValueError, match="num_groups, group_size"):
        ta.compute_advantages(torch.ones(4))


def test_group_advantages_is_the_per_group_stage():
    # grpo [1, 0]: μ = 0.5, σ = √0.5 = 0.707107 → ±0.5/(0.707107 + 1e-4) = ±0.70700679
    a = 0.5 / (math.sqrt(0.5) + 1e-4)
    assert ta.group_advantages([1.0, 0.0]) == pytest.approx([a, -a], abs=1e-12)
    assert a == pytest.approx(0.70700679, abs=1e-8)
    # rloo [3, 1, 2]: μ = 2 → (r − μ)·3/2 = [1.5, −1.5, 0]
    assert ta.group_advantages([3, 1, 2], algorithm="rloo") == pytest.approx([1.5, -1.5, 0.0])
    # batch normalisation is two stages: the group stage of a group of one is its raw reward
    assert ta.group_advantages([2.0], advantage_norm="batch") == [2.0]
    with pytest.raises(ValueError, match="not defined for rloo"):
        ta.group_advantages([1.0, 0.0], algorithm="rloo", advantage_norm="batch")
