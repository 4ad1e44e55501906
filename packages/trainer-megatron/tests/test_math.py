"""Vocab-parallel log-probabilities (TP=1 path) and the LR schedule, against independent references."""

from __future__ import annotations

import math

import pytest
import torch

from telescope_algos import align_to_inputs, next_token_labels, token_logprobs_and_entropy
from telescope_trainer_megatron import lr_multiplier
from telescope_trainer_megatron._vocab_parallel import vocab_parallel_label_logprobs_and_entropy


def vocab_parallel_logprobs_and_entropy(logits, input_ids, **kwargs):
    """What the trainer does with a whole row: next-token labels in, ``input_ids``-aligned out."""
    lp, ent = vocab_parallel_label_logprobs_and_entropy(logits, next_token_labels(input_ids), **kwargs)
    return align_to_inputs(lp), align_to_inputs(ent)


def test_matches_algos_on_the_real_vocab_and_ignores_padding_columns():
    torch.manual_seed(0)
    real, padded = 7, 10
    logits = torch.randn(2, 5, padded, dtype=torch.float64, requires_grad=True)
    ids = torch.randint(0, real, (2, 5))
    lp, ent = vocab_parallel_logprobs_and_entropy(logits, ids, vocab_size=real, temperature=0.7, chunk_size=3)
    ref_logits = logits.detach()[..., :real].clone().requires_grad_(True)
    rlp, rent = token_logprobs_and_entropy(ref_logits, ids, temperature=0.7)
    torch.testing.assert_close(lp, rlp.float(), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(ent, rent.float(), rtol=1e-5, atol=1e-6)
    w1, w2 = torch.randn(2, 5), torch.randn(2, 5)
    ((lp * w1).sum() + (ent * w2).sum()).backward()
    ((rlp * w1).sum() + (rent * w2).sum()).backward()
    assert logits.grad is not None
    torch.testing.assert_close(logits.grad[..., :real], ref_logits.grad, rtol=1e-5, atol=1e-6)
    assert torch.count_nonzero(logits.grad[..., real:]) == 0


def test_hand_worked_logprob():
    # logits [0, ln 3] over 2 tokens: p = [1/4, 3/4]; token 1 follows -> log(3/4);
    # H = -(1/4 ln 1/4 + 3/4 ln 3/4)
    logits = torch.tensor([[[0.0, math.log(3.0)], [0.0, 0.0]]])
    lp, ent = vocab_parallel_logprobs_and_entropy(logits, torch.tensor([[0, 1]]), vocab_size=2)
    assert lp[0, 0] == 0
    assert ent[0, 0] == 0
    assert lp[0, 1].item() == pytest.approx(math.log(0.75), abs=1e-6)
    assert ent[0, 1].item() == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)), abs=1e-6)


@pytest.mark.parametrize(
    ("schedule", "step", "expected"),
    [
        ("none", 0, 1.0),
        ("constant", 0, 0.0),  # warmup 4: 0/4
        ("constant", 2, 0.5),
        ("constant", 9, 1.0),
        ("linear", 4, 1.0),  # p = 0
        ("linear", 8, 1.0 - 0.9 * 0.5),  # p = 4/8, rho = 0.1
        ("linear", 20, 0.1),
        ("cosine", 8, 0.1 + 0.9 * 0.5),  # cos(pi/2) = 0
        ("cosine", 12, 0.1),
    ],
)
def test_lr_schedule_by_hand(schedule: str, step: int, expected: float):
    got = lr_multiplier(step, schedule=schedule, warmup_steps=4, total_steps=12, min_lr_ratio=0.1)
    assert got == pytest.approx(expected)


def test_unknown_schedule():
    with pytest.raises(ValueError, match="unknown lr_scheduler"):
        lr_multiplier(0, schedule="step", warmup_steps=0, total_steps=1, min_lr_ratio=0.0)
