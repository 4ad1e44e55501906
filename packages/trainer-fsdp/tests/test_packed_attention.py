"""Samples packed into one row never attend to each other (whichever attention kernel runs).

The trainer forward (FSDP2, gradient checkpointing on, train mode) of a packed row must give every
sample the per-token logprobs it gets alone, within 1e-5 in fp32. A negative control shows that the
same comparison fails when the segments are hidden from the attention.
"""

from __future__ import annotations

import pytest
import torch

from telescope_algos import pack_samples
from telescope_trainer_fsdp._step import forward_logprobs


def _alone(trainer, sample, temperature):
    (mbs,) = pack_samples([sample], seq_len=256)
    lp, ent = forward_logprobs(
        trainer.model, mbs[0], device=trainer.device, temperature=temperature, chunk_size=7
    )
    n = len(sample.prompt_ids) + len(sample.completion_ids)
    return lp[0, 1:n], ent[0, 1:n]  # drop column 0 (no prediction)


@pytest.mark.parametrize("attn", ["sdpa", "eager", "telescope_packed_sdpa"])
@pytest.mark.parametrize("tied", [False, True])
def test_packed_logprobs_equal_each_sample_alone(helpers, tiny_model_dir, tiny_tied_model_dir, attn, tied):
    model_dir = tiny_tied_model_dir if tied else tiny_model_dir
    samples = helpers.make_samples(5, seed=13)
    cfg = helpers.make_config(model_dir, temperature=0.8)
    with helpers.open_trainer(cfg, attn_implementation=attn) as trainer:
        assert trainer.model.training
        (mbs,) = pack_samples(samples, seq_len=256, pad_to_multiple_of=16)
        (mb,) = mbs
        assert mb.num_samples == 5
        lp, ent = forward_logprobs(trainer.model, mb, device=trainer.device, temperature=0.8, chunk_size=7)
        starts = (mb.position_ids[0] == 0).nonzero()[:, 0].tolist()
        # pack_samples orders by length (longest first); find each sample by its tokens
        for s in samples:
            ids = torch.tensor([*s.prompt_ids, *s.completion_ids])
            n = ids.numel()
            (start,) = [p for p in starts if torch.equal(mb.input_ids[0, p : p + n], ids)]
            alone_lp, alone_ent = _alone(trainer, s, 0.8)
            torch.testing.assert_close(lp[0, start + 1 : start + n], alone_lp, atol=1e-5, rtol=0)
            torch.testing.assert_close(ent[0, start + 1 : start + n], alone_ent, atol=1e-5, rtol=0)

        # Negative control: positions that never restart hide the boundaries -> cross-sample attention.
        leaky = type(mb)(**{**vars(mb), "position_ids": torch.arange(len(mb))[None]})
        lp_leaky, _ = forward_logprobs(
            trainer.model, leaky, device=trainer.device, temperature=0.8, chunk_size=7
        )
        second = starts[1]
        n2 = starts[2] - second
        assert (lp_leaky[0, second + 1 : second + n2] - lp[0, second + 1 : second + n2]).abs().max() > 1e-3


@pytest.mark.parametrize(
    ("positions", "spans"),
    [
        ([0, 1, 2, 0, 1, 0, 1, 2, 3], [(0, 3), (3, 5), (5, 9)]),  # three samples
        ([0, 1, 2, 3], [(0, 4)]),  # one sample fills the row
        ([0, 0, 0], [(0, 1), (1, 2), (2, 3)]),  # one-token samples
        ([5, 6, 7, 0, 1], [(0, 3), (3, 5)]),  # a row that starts mid-sample (a shard of a longer row)
    ],
)
def test_sample_spans_are_where_positions_stop_counting_up(positions, spans):
    from telescope_trainer_fsdp._packed_attention import sample_spans

    assert sample_spans(torch.tensor(positions)) == spans


def test_packed_sdpa_refuses_a_mask_or_missing_positions():
    from telescope_trainer_fsdp._packed_attention import packed_sdpa_forward

    q = torch.zeros(1, 2, 4, 8)
    module = torch.nn.Module()
    with pytest.raises(ValueError, match="needs position_ids"):
        packed_sdpa_forward(module, q, q, q, None)
    with pytest.raises(ValueError, match="takes no attention mask"):
        packed_sdpa_forward(module, q, q, q, torch.ones(1, 1, 4, 4), position_ids=torch.arange(4)[None])


def test_packed_sdpa_equals_sdpa_with_the_segment_mask_under_grouped_query_attention():
    """Hand-built reference: one row of two samples, 4 query heads over 2 key/value heads."""
    from telescope_trainer_fsdp._packed_attention import packed_sdpa_forward

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, h, 7, 8, generator=g) for h in (4, 2, 2))
    positions = torch.tensor([[0, 1, 2, 3, 0, 1, 2]])
    segment = torch.tensor([0, 0, 0, 0, 1, 1, 1])
    allowed = (segment[:, None] == segment[None, :]) & torch.ones(7, 7, dtype=torch.bool).tril()
    ref = torch.nn.functional.scaled_dot_product_attention(
        q, k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1), attn_mask=allowed
    )
    out, _ = packed_sdpa_forward(torch.nn.Module(), q, k, v, None, position_ids=positions)
    assert out.shape == (1, 7, 4, 8)
    torch.testing.assert_close(out, ref.transpose(1, 2), atol=1e-6, rtol=0)


def _groups(helpers, *, groups: int, size: int):
    """``groups`` prompts of random samples, ``size`` completions each (the samples of a GRPO group)."""
    from telescope_algos import TrainingSample

    out = []
    for g, prompt_of in enumerate(helpers.make_samples(groups, seed=21)):
        for s in helpers.make_samples(size, seed=100 + g):
            out.append(
                TrainingSample(prompt_of.prompt_ids, s.completion_ids, s.advantage, s.rollout_logprobs)
            )
    return out


def _loss_and_grads(trainer, mb):
    lp, ent = forward_logprobs(trainer.model, mb, device=trainer.device, temperature=0.8, chunk_size=7)
    mask = mb.loss_mask.to(trainer.device)
    loss = -(lp * mb.advantages.to(trainer.device))[mask].sum()
    loss.backward()
    grads = [p.grad.full_tensor().clone() for p in trainer.model.parameters()]
    trainer.model.zero_grad(set_to_none=True)
    # every loss token's (advantage, logprob, entropy), in a layout-free order
    rows = torch.stack([mb.advantages[mb.loss_mask], lp.detach()[mask].cpu(), ent.detach()[mask].cpu()], 1)
    return loss.detach(), grads, rows[torch.argsort(rows[:, 0] * 1e4 + rows[:, 1])]


def test_shared_prompts_give_the_same_logprobs_and_gradients(helpers, tiny_model_dir):
    """A group's prompt packed once (branches) trains exactly as each sample packed whole."""
    samples = _groups(helpers, groups=3, size=4)
    cfg = helpers.make_config(tiny_model_dir, temperature=0.8)
    with helpers.open_trainer(cfg, attn_implementation="telescope_packed_sdpa") as trainer:
        assert trainer.shares_prompts
        ([whole],) = pack_samples(samples, seq_len=512)
        ([shared],) = pack_samples(samples, seq_len=512, share_prompts=True)
        pos = shared.position_ids[0]
        branches = int(((pos[1:] != pos[:-1] + 1) & (pos[1:] > 0)).sum())
        assert branches == 3 * 3  # each group: a root and three branches
        assert len(shared) < len(whole)
        assert shared.num_tokens == whole.num_tokens
        loss_w, grads_w, rows_w = _loss_and_grads(trainer, whole)
        loss_s, grads_s, rows_s = _loss_and_grads(trainer, shared)
        torch.testing.assert_close(rows_s, rows_w, atol=1e-5, rtol=0)
        torch.testing.assert_close(loss_s, loss_w, atol=1e-5, rtol=1e-6)
        # fp32 sums in another order (a shared prompt's gradient gathers its branches in one sum,
        # the whole layout in one per sample): within 1e-4 of each tensor's largest element (a CI
        # run saw 2e-5 on an element of 0.05); a wrong mask is off by the gradient's own size
        for gs, gw in zip(grads_s, grads_w, strict=True):
            torch.testing.assert_close(gs, gw, atol=1e-4 * float(gw.abs().max()), rtol=1e-4)

    # Negative control: transformers' SDPA does not know branches (a branch would attend to the sample
    # packed before it), so that trainer does not share prompts, and forcing the layout on it is wrong
    with helpers.open_trainer(cfg, attn_implementation="sdpa") as trainer:
        assert not trainer.shares_prompts
        _, grads_bad, rows_bad = _loss_and_grads(trainer, shared)
        assert (rows_bad[:, 1] - rows_w[:, 1]).abs().max() > 1e-3
        # and its gradients are off by far more than the tolerance above
        off = max(
            float((gb - gw).abs().max() / gw.abs().max()) for gb, gw in zip(grads_bad, grads_w, strict=True)
        )
        assert off > 1e-2, off


def test_a_branch_sees_its_roots_prefix_and_itself():
    """Hand-built reference for ``row_attention``: a root of 4 tokens and a branch of 3 at position 2."""
    from telescope_trainer_fsdp._packed_attention import row_attention

    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 7, 8, generator=g) for _ in range(3))
    positions = torch.tensor([0, 1, 2, 3, 2, 3, 4])
    # token i may attend to token j: the root causally; the branch to root tokens 0, 1 and itself causally
    allowed = torch.zeros(7, 7, dtype=torch.bool)
    allowed[:4, :4] = torch.ones(4, 4).tril().bool()
    allowed[4:, :2] = True
    allowed[4:, 4:] = torch.ones(3, 3).tril().bool()
    ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=allowed)
    out = row_attention(q, k, v, positions, dropout=0.0, scale=None)
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=0)
