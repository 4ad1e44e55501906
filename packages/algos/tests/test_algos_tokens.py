"""Chunked token log-probabilities and entropy: values, gradients, alignment, temperature."""

import math

import pytest
import torch
from torch.autograd import gradcheck
from torch.testing import assert_close

import telescope_algos as ta


def naive(logits, input_ids, temperature):
    """The unchunked reference: full log_softmax, aligned with input_ids (column 0 = 0)."""
    logp = (logits[:, :-1].float() / temperature).log_softmax(-1)
    lp = logp.gather(-1, input_ids[:, 1:, None]).squeeze(-1)
    ent = -(logp.exp() * logp).sum(-1)
    pad = lp.new_zeros(lp.shape[0], 1)
    return torch.cat([pad, lp], 1), torch.cat([pad, ent], 1)


def test_hand_worked_values():
    # vocab 2, logits at position 0 = [0, ln3], temperature 1: p = [1/4, 3/4]; token 1 = id 1
    # log p = ln(3/4) = −0.287682; H = −(¼ln¼ + ¾ln¾) = 0.562335
    # temperature 2: z = [0, ln3/2], p ∝ [1, √3] → p1 = √3/(1+√3) = 0.633975
    logits = torch.tensor([[[0.0, math.log(3.0)], [5.0, 5.0]]])
    ids = torch.tensor([[0, 1]])
    lp, ent = ta.token_logprobs_and_entropy(logits, ids)
    assert_close(lp, torch.tensor([[0.0, math.log(0.75)]]))
    assert_close(ent, torch.tensor([[0.0, -(0.25 * math.log(0.25) + 0.75 * math.log(0.75))]]))
    p1 = math.sqrt(3) / (1 + math.sqrt(3))
    assert_close(ta.token_logprobs(logits, ids, temperature=2.0), torch.tensor([[0.0, math.log(p1)]]))


@pytest.mark.parametrize("chunk_size", [1, 5, 1024, 0, -1])
def test_matches_naive_values_and_gradients(chunk_size):
    torch.manual_seed(0)
    logits = torch.randn(3, 8, 50, requires_grad=True)
    ids = torch.randint(0, 50, (3, 8))
    w_lp, w_ent = torch.randn(3, 8), torch.randn(3, 8)
    lp, ent = ta.token_logprobs_and_entropy(logits, ids, temperature=0.7, chunk_size=chunk_size)
    lp_ref, ent_ref = naive(logits, ids, 0.7)
    assert_close(lp, lp_ref)
    assert_close(ent, ent_ref)
    for objective in (
        lambda a, b: (a * w_lp).sum(),
        lambda a, b: (b * w_ent).sum(),
        lambda a, b: (a * w_lp + b * w_ent).sum(),
    ):
        (g,) = torch.autograd.grad(objective(lp, ent), logits, retain_graph=True)
        (g_ref,) = torch.autograd.grad(objective(lp_ref, ent_ref), logits, retain_graph=True)
        assert_close(g, g_ref)


def test_gradcheck_float64():
    torch.manual_seed(1)
    logits = torch.randn(2, 4, 6, dtype=torch.float64, requires_grad=True)
    ids = torch.randint(0, 6, (2, 4))
    assert gradcheck(
        lambda x: ta.token_logprobs_and_entropy(x, ids, temperature=1.3, chunk_size=3), (logits,)
    )


def test_bfloat16_logits_compute_in_float32():
    torch.manual_seed(2)
    logits = torch.randn(2, 6, 40).to(torch.bfloat16).requires_grad_()
    ids = torch.randint(0, 40, (2, 6))
    lp, ent = ta.token_logprobs_and_entropy(logits, ids, chunk_size=4)
    assert lp.dtype == torch.float32
    lp_ref, ent_ref = naive(logits.detach().float(), ids, 1.0)
    assert_close(lp, lp_ref)
    assert_close(ent, ent_ref)
    lp.sum().backward()
    assert logits.grad is not None
    assert logits.grad.dtype == torch.bfloat16


def test_does_not_modify_logits():
    torch.manual_seed(3)
    logits = torch.randn(1, 5, 9)
    before = logits.clone()
    ta.token_logprobs_and_entropy(logits, torch.zeros(1, 5, dtype=torch.long), temperature=0.5, chunk_size=2)
    assert torch.equal(logits, before)


@pytest.mark.parametrize("temperature", [0.0, -1.0])
def test_temperature_must_be_positive(temperature):
    with pytest.raises(ValueError, match="temperature must be > 0"):
        ta.token_logprobs(torch.zeros(1, 2, 3), torch.zeros(1, 2, dtype=torch.long), temperature=temperature)


def test_shape_errors():
    with pytest.raises(ValueError, match="batch, seq, vocab"):
        ta.token_logprobs(torch.zeros(2, 3), torch.zeros(2, dtype=torch.long))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_matches_cpu():
    torch.manual_seed(4)
    logits = torch.randn(2, 64, 1000, requires_grad=True)
    ids = torch.randint(0, 1000, (2, 64))
    lp, ent = ta.token_logprobs_and_entropy(logits, ids, chunk_size=16)
    (lp.sum() + ent.sum()).backward()
    logits_cuda = logits.detach().cuda().requires_grad_()
    lp_c, ent_c = ta.token_logprobs_and_entropy(logits_cuda, ids.cuda(), chunk_size=16)
    (lp_c.sum() + ent_c.sum()).backward()
    assert_close(lp_c.cpu(), lp)
    assert_close(ent_c.cpu(), ent)
    assert logits_cuda.grad is not None
    assert_close(logits_cuda.grad.cpu(), logits.grad)
