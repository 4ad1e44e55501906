"""FSDP context parallelism (``fsdp_context_parallel_size``) on gloo ranks against one rank without it.

Each case trains two steps on rows that need padding to a multiple of 2·cp and whose samples
straddle the zig-zag chunk edges, and checks: metrics identical on every rank; loss, grad norm,
entropy, KL and token count equal to the one-rank run (rel 1e-5); updated weights equal (as in
test_two_ranks: fp32, at most 0.1% of elements beyond 2e-6, from the order of sums); and the
checkpoint written under CP loads on one rank. Then the row padding by hand and the attention's
refusals.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from fsdp_spawn import one_rank_order, run_ranks

from telescope_algos import MicroBatch, pack_samples, pad_micro_batch
from telescope_algos.backend import row_multiple
from telescope_trainer_fsdp._context_parallel import _ACTIVE, CPLayout, _Active, _cp_attention

CASES = {
    # name: (cp, data-parallel replicas, tied embeddings, config overrides)
    "grpo_cp2": (2, 1, False, {"number_of_minibatches": 2, "lr_scheduler": "linear"}),
    "gspo_cp2_tied": (
        2,
        1,
        True,
        {
            "algorithm": "gspo",
            "ppo_clip_ref_logprobs": "batch",  # the no-grad pass for π_old runs under CP too
            "number_of_minibatches": 2,  # the second update has sequence ratios != 1
            "clip_low": 2e-4,
            "clip_high": 2e-4,
            "entropy_coef": 0.01,  # the entropy's gradient crosses the all-gather
        },
    ),
    "cp2_dp2": (2, 2, False, {"number_of_minibatches": 2}),
    # LoRA adapters under CP: the same adapters (seeded init on every rank), the same merged weights
    "lora_cp2_tied": (2, 1, True, {"lora_rank": 4, "lora_alpha": 8.0}),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_context_parallel_equals_one_rank(helpers, tiny_model_dir, tiny_tied_model_dir, tmp_path, case):
    cp, dp, tied, overrides = CASES[case]
    model_dir = tiny_tied_model_dir if tied else tiny_model_dir
    samples = helpers.make_samples(9, seed=70)
    by_rank = pack_samples(samples, seq_len=24, pad_to_multiple_of=1, num_ranks=dp)
    rows = [len(mb) for mbs in by_rank for mb in mbs]
    assert any(n % (2 * cp) for n in rows), f"want rows that need padding, got lengths {rows}"
    cfg = helpers.make_config(
        model_dir, trainer_num_workers=cp * dp, fsdp_context_parallel_size=cp, number_of_steps=2, **overrides
    )
    job = {"config": cfg.model_dump(mode="json"), "micro_batches": by_rank, "steps": 2}
    torch.save(job, tmp_path / "job.pt")
    results = run_ranks(tmp_path, world=cp * dp)

    assert [r["dp"] for r in results] == [(rank // cp, dp) for rank in range(cp * dp)]
    assert all(r["cp"] == cp for r in results)
    for other in results[1:]:
        assert other["metrics"] == results[0]["metrics"]

    cfg1 = helpers.make_config(model_dir, number_of_steps=2, **overrides)
    one_rank = one_rank_order(by_rank, cfg1.number_of_minibatches)
    with helpers.open_trainer(cfg1) as trainer:
        metrics = [trainer.train_step(one_rank, step=s) for s in range(2)]
        expected = helpers.hf_state(trainer)
    for got, want in zip(results[0]["metrics"], metrics, strict=True):
        assert got.keys() == want.keys()
        for key in (k for k in want if not k.startswith("timing/")):
            assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-7), key
    assert metrics[1]["loss"] != metrics[0]["loss"]  # the first step changed the weights
    if overrides.get("algorithm") == "gspo":  # the sequence ratio needs tokens from both CP ranks
        clipped = [m["clip_low_frac"] + m["clip_high_frac"] for m in metrics]
        assert all(0 < c < 1 for c in clipped), f"want some sequences clipped and some not, got {clipped}"
    weights = results[0]["weights"]
    assert weights.keys() == expected.keys()
    far = sum(int(((weights[k] - expected[k]).abs() > 2e-6).sum()) for k in weights)
    assert far <= 1e-3 * sum(t.numel() for t in weights.values())

    with helpers.open_trainer(cfg1) as trainer:  # the CP checkpoint on one rank
        trainer.load_checkpoint(tmp_path / "ckpt")
        for name, tensor in trainer.hf_weights():
            torch.testing.assert_close(tensor, weights[name], atol=0, rtol=0)


def _row(ids: list[int], positions: list[int], mask: list[bool]) -> MicroBatch:
    n = len(ids)
    return MicroBatch(
        input_ids=torch.tensor([ids]),
        position_ids=torch.tensor([positions]),
        loss_mask=torch.tensor([mask]),
        advantages=torch.full((1, n), 0.5),
        rollout_logprobs=torch.full((1, n), -1.0),
        num_samples=2,
        num_tokens=sum(mask),
    )


def test_rows_pad_to_twice_cp_with_a_segment_of_their_own():
    # 6 tokens (samples of 4 and 2), cp = 2: padded to 8 with a new segment at positions 0, 1
    mb = _row([5, 6, 7, 8, 9, 10], [0, 1, 2, 3, 0, 1], [False, True, True, True, False, True])
    got = pad_micro_batch(mb, row_multiple(context_parallel=2))
    assert got.input_ids.tolist() == [[5, 6, 7, 8, 9, 10, 0, 0]]
    assert got.position_ids.tolist() == [[0, 1, 2, 3, 0, 1, 0, 1]]
    assert got.loss_mask.tolist() == [[False, True, True, True, False, True, False, False]]
    assert got.advantages.tolist() == [[0.5] * 6 + [0.0, 0.0]]
    assert got.rollout_logprobs.tolist() == [[-1.0] * 6 + [0.0, 0.0]]
    assert (got.num_samples, got.num_tokens) == (2, 4)
    assert mb.input_ids.shape == (1, 6)  # the caller's micro-batch is left alone
    assert pad_micro_batch(got, row_multiple(context_parallel=2)) is got  # already a multiple of 4
    assert pad_micro_batch(mb, row_multiple(context_parallel=3)) is mb  # 6 = 2 x 3


def test_cp_attention_refuses_outside_the_trainer_and_unsupported_attention():
    q = torch.zeros(1, 2, 4, 8)
    kv = torch.zeros(1, 1, 4, 8)
    _ACTIVE.clear()
    with pytest.raises(RuntimeError, match="only inside the FSDP trainer's context-parallel forward"):
        _cp_attention(torch.nn.Module(), q, kv, kv, None)
    _ACTIVE["batch"] = _Active(cu_seqlens=[0, 8], layout=CPLayout(2, 0, 0, 1, None))
    try:
        windowed: Any = torch.nn.Module()
        windowed.sliding_window = 4
        with pytest.raises(NotImplementedError, match="set fsdp_context_parallel_size: 1"):
            _cp_attention(windowed, q, kv, kv, None)
        with pytest.raises(NotImplementedError, match="soft-capped"):
            _cp_attention(torch.nn.Module(), q, kv, kv, None, softcap=30.0)
        with pytest.raises(ValueError, match="one packed row at a time, got 2 rows"):
            _cp_attention(torch.nn.Module(), q.expand(2, -1, -1, -1), kv, kv, None)
    finally:
        _ACTIVE.clear()
