"""Two gloo ranks in two processes: the same step as one rank, metrics identical on both ranks,
and a two-rank checkpoint that loads on one rank (DCP reshards).

Tolerance: fp32, metrics rel 1e-5 and weights as in test_train_step (the split changes only the
order of floating-point sums).
"""

from __future__ import annotations

import pytest
import torch
from fsdp_spawn import one_rank_order, run_ranks

from telescope_algos import pack_samples


@pytest.mark.slow
@pytest.mark.parametrize("tied", [False, True])
def test_two_ranks_equal_one_rank_and_reshard_on_load(
    helpers, tiny_model_dir, tiny_tied_model_dir, tmp_path, tied
):
    model_dir = tiny_tied_model_dir if tied else tiny_model_dir
    samples = helpers.make_samples(7, seed=40)
    by_rank = pack_samples(samples, seq_len=24, pad_to_multiple_of=4, num_ranks=2)
    assert any(mb.num_samples == 0 for mb in by_rank[1] + by_rank[0]), "want an uneven count (a dummy)"
    overrides = {"number_of_minibatches": 2 if tied else 1, "lr_scheduler": "linear", "number_of_steps": 2}
    cfg2 = helpers.make_config(model_dir, trainer_num_workers=2, **overrides)
    torch.save(
        {"config": cfg2.model_dump(mode="json"), "micro_batches": by_rank, "steps": 2}, tmp_path / "job.pt"
    )
    results = run_ranks(tmp_path)

    assert [r["dp"] for r in results] == [(0, 2), (1, 2)]
    assert results[0]["metrics"] == results[1]["metrics"]  # identical on every rank, timings included

    # One rank holding both ranks' micro-batches, ordered so that each minibatch group gets the same members.
    cfg1 = helpers.make_config(model_dir, **overrides)
    one_rank = one_rank_order(by_rank, cfg1.number_of_minibatches)
    with helpers.open_trainer(cfg1) as trainer:
        metrics = [trainer.train_step(one_rank, step=s) for s in range(2)]
        expected = helpers.hf_state(trainer)
    for got, want in zip(results[0]["metrics"], metrics, strict=True):
        for key in ("loss", "grad_norm", "entropy", "kl_divergence_inference", "num_tokens", "learning_rate"):
            assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-7), key
    weights = results[0]["weights"]
    assert weights.keys() == expected.keys()
    far = sum(int(((weights[k] - expected[k]).abs() > 2e-6).sum()) for k in weights)
    assert far <= 1e-3 * sum(t.numel() for t in weights.values())

    with helpers.open_trainer(cfg1) as trainer:  # a two-rank checkpoint loaded on one rank
        trainer.load_checkpoint(tmp_path / "ckpt")
        for name, tensor in trainer.hf_weights():
            torch.testing.assert_close(tensor, weights[name], atol=0, rtol=0)
