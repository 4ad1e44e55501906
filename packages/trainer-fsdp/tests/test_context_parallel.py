"""FSDP context parallelism (``fsdp_context_parallel_size``) on gloo ranks against one rank without it.

Each case trains two steps on rows that need padding to a multiple of 2·cp and whose samples
straddle the zig-zag chunk edges, and checks: metrics identical on every rank; loss, grad norm,
entropy, KL and token count equal to the one-rank run (rel 1e-5); updated weights equal (as in
test_two_ranks: fp32, at most 0.1% of elements beyond 2e-6, from the order of sums); and the
checkpoint written under CP loads on one rank.
"""

from __future__ import annotations

import pytest
import torch
from fsdp_spawn import one_rank_order, run_ranks

from telescope_algos import pack_samples

pytestmark = pytest.mark.slow

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
}


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
