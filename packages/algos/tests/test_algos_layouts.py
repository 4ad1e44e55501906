"""Padded and packed layouts give the same loss and gradients; padding and micro-batching change nothing."""

import pytest
import torch
from torch.testing import assert_close

import telescope_algos as ta

ALL_MODIFIERS = {
    "use_tis": True,
    "tis_mode": "icepop",
    "tis_cap": 1.03,
    "tis_floor": 0.97,
    "kl_penalty_tau": 0.05,
    "kl_estimator": "k3",
    "seq_is_masking": True,
    "seq_is_mask_low": 0.9,
    "seq_is_mask_high": 1.1,
    "entropy_coef": 0.01,
}
CONFIGS = [
    {"algorithm": "grpo"},
    {"algorithm": "rloo", "use_ppo_clip": True, "clip_low": 0.1, "clip_high": 0.1, "clip_ratio_c": 1.5},
    {"algorithm": "reinforce_pp", **ALL_MODIFIERS},
    {"algorithm": "dr_grpo", "dr_grpo_loss_agg_mode": "token_sum_norm"},
    {"algorithm": "cispo", "clip_low": 0.05, "clip_high": 0.05, **ALL_MODIFIERS},
    {"algorithm": "gspo", "clip_low": 0.01, "clip_high": 0.01, "clip_ratio_c": 2.0},
    {"algorithm": "sapo", **ALL_MODIFIERS},
    {
        "algorithm": "opd",
        "distill_coef": 0.7,
        "distill_reward_weight": 0.3,
        "ref_kl_coef": 0.2,
        **ALL_MODIFIERS,
    },
]


def make_samples(seed, lengths=(5, 9, 3, 7, 6)):
    """Per-sample leaves (ℓ, entropy) and data; every sample starts with one or two prompt tokens."""
    g = torch.Generator().manual_seed(seed)
    samples = []
    for i, n in enumerate(lengths):
        mask = torch.rand(n, generator=g) < 0.85
        mask[: 1 + i % 2] = False
        samples.append(
            {
                "logprobs": (-torch.rand(n, generator=g) * 2).requires_grad_(),
                "entropy": torch.rand(n, generator=g).requires_grad_(),
                "rollout": -torch.rand(n, generator=g) * 2,
                "old": -torch.rand(n, generator=g) * 2,
                "teacher": -torch.rand(n, generator=g) * 2,
                "ref": -torch.rand(n, generator=g) * 2,
                "mask": mask,
                "adv": (-1.0) ** i * (0.5 + torch.rand((), generator=g)),
            }
        )
    # keep some samples near-on-policy so the clips and sequence masks are neither all on nor all off
    for s in samples[::2]:
        s["rollout"] = s["logprobs"].detach() + 0.03 * torch.randn(s["mask"].shape, generator=g)
        s["old"] = s["rollout"].clone()
    return samples


def padded(samples, extra=0):
    t = max(len(s["mask"]) for s in samples) + extra

    def stack(key, fill=0.0):
        rows = [torch.cat([s[key], s[key].new_full((t - len(s[key]),), fill)]) for s in samples]
        return torch.stack(rows)

    return {
        "logprobs": stack("logprobs", -3.0),  # garbage in the padding: it must not matter
        "entropy": stack("entropy", 5.0),
        "rollout_logprobs": stack("rollout"),
        "old_logprobs": stack("old"),
        "teacher_logprobs": stack("teacher"),
        "ref_logprobs": stack("ref"),
        "loss_mask": stack("mask", False),
        "advantages": torch.stack([s["adv"] for s in samples]),
    }


def packed(samples, rows, extra=0, use_segment_ids=False):
    """Pack samples into the given rows (lists of sample indices), padding every row to one length."""
    cols = {
        k: []
        for k in (
            "logprobs",
            "entropy",
            "rollout_logprobs",
            "old_logprobs",
            "teacher_logprobs",
            "ref_logprobs",
            "loss_mask",
            "advantages",
        )
    }
    pos_rows, seg_rows = [], []
    lengths = [sum(len(samples[i]["mask"]) for i in r) for r in rows]
    t = max(lengths) + extra
    for r, length in zip(rows, lengths, strict=True):
        pad = t - length
        for key, src, fill in (
            ("logprobs", "logprobs", -3.0),
            ("entropy", "entropy", 5.0),
            ("rollout_logprobs", "rollout", 0.0),
            ("old_logprobs", "old", 0.0),
            ("teacher_logprobs", "teacher", 0.0),
            ("ref_logprobs", "ref", 0.0),
            ("loss_mask", "mask", False),
        ):
            parts = [samples[i][src] for i in r]
            cols[key].append(torch.cat([*parts, parts[0].new_full((pad,), fill)]))
        cols["advantages"].append(
            torch.cat([*(samples[i]["adv"].expand(len(samples[i]["mask"])) for i in r), torch.zeros(pad)])
        )
        pos_rows.append(torch.cat([*(torch.arange(len(samples[i]["mask"])) for i in r), torch.arange(pad)]))
        seg_rows.append(
            torch.cat(
                [torch.full((len(samples[i]["mask"]),), j) for j, i in enumerate([*r, -1]) if i >= 0]
                + [torch.full((pad,), 99)]
            )
        )
    out = {k: torch.stack(v) for k, v in cols.items()}
    if use_segment_ids:
        out["segment_ids"] = torch.stack(seg_rows)
    else:
        out["position_ids"] = torch.stack(pos_rows)
    return out


def loss_and_grads(samples, batch, config):
    loss, metrics = ta.compute_loss(ta.LossInputs(**batch), ta.LossOptions(**config))
    leaves = [s[k] for s in samples for k in ("logprobs", "entropy")]
    grads = torch.autograd.grad(loss, leaves, allow_unused=True)
    return (
        loss,
        metrics,
        [torch.zeros_like(x) if g is None else g for g, x in zip(grads, leaves, strict=True)],
    )


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c["algorithm"])
def test_padded_and_packed_agree(config):
    samples = make_samples(seed=1)
    ref_loss, ref_metrics, ref_grads = loss_and_grads(samples, padded(samples), config)
    for batch in (
        packed(samples, [[0, 1], [2, 3, 4]]),
        packed(samples, [[1, 2, 3, 0, 4]], extra=3),
        packed(samples, [[4, 0], [1], [3, 2]], use_segment_ids=True),
        padded(samples, extra=4),  # more padding changes nothing
    ):
        loss, metrics, grads = loss_and_grads(samples, batch, config)
        assert_close(loss, ref_loss)
        for g, r in zip(grads, ref_grads, strict=True):
            assert_close(g, r)
        assert metrics.keys() == ref_metrics.keys()
        for k in metrics:
            assert_close(metrics[k], ref_metrics[k], msg=k)


def test_global_num_tokens_makes_micro_batches_sum_to_the_step_mean():
    # Splitting a step into micro-batches and summing their losses, each divided by the step's token
    # count, is exactly the loss of the whole step (averaging per-micro-batch means would not be).
    samples = make_samples(seed=2)
    config = {"algorithm": "cispo", "entropy_coef": 0.02, "kl_penalty_tau": 0.1}
    whole, _, whole_grads = loss_and_grads(samples, padded(samples), config)
    total = sum(int(s["mask"][1:].sum()) + 0 for s in samples)  # the first token never counts
    split = [samples[:2], samples[2:]]
    losses = []
    for part in split:
        batch = padded(part)
        loss, _ = ta.compute_loss(ta.LossInputs(**batch, num_tokens=total), ta.LossOptions(**config))
        losses.append(loss)
    step = losses[0] + losses[1]
    assert_close(step, whole)
    leaves = [s[k] for s in samples for k in ("logprobs", "entropy")]
    for g, r in zip(torch.autograd.grad(step, leaves), whole_grads, strict=True):
        assert_close(g, r)


def test_token_sum_norm_removes_length_bias():
    # dr_grpo token_sum_norm: every loss token gets gradient −A/(num_samples·max_len), whatever the length
    # of its own sample or of the others. Short sample: 2 loss tokens, long: 8; max_len 10, 2 samples.
    def grads(long_len, mode):
        logprobs = torch.zeros(2, long_len + 1, requires_grad=True)
        mask = torch.zeros(2, long_len + 1, dtype=torch.bool)
        mask[0, 1:3] = True
        mask[1, 1:] = True
        loss, _ = ta.compute_loss(
            ta.LossInputs(logprobs, advantages=torch.tensor([1.0, 1.0]), loss_mask=mask, max_len=10),
            ta.LossOptions(algorithm="dr_grpo", dr_grpo_loss_agg_mode=mode),
        )
        return torch.autograd.grad(loss, logprobs)[0]

    g = grads(8, "token_sum_norm")
    assert_close(g[0, 1:3], torch.full((2,), -1 / 20))  # −1/(2·10)
    assert_close(g[1, 1:], torch.full((8,), -1 / 20))
    assert_close(grads(4, "token_sum_norm")[0, 1:3], g[0, 1:3])  # unaffected by the other sample's length
    # token_mean: the short sample's tokens depend on how long the other sample is (1/10 vs 1/6)
    assert_close(grads(8, "token_mean")[0, 1:3], torch.full((2,), -1 / 10))
    assert_close(grads(4, "token_mean")[0, 1:3], torch.full((2,), -1 / 6))


def test_token_sum_norm_defaults_and_explicit_denominators():
    # two samples with 2 and 3 loss tokens, ℓ = −1, A = 1 → masked sum 5.
    logprobs = torch.full((2, 4), -1.0)
    mask = torch.tensor([[0, 1, 1, 0], [0, 1, 1, 1]], dtype=torch.bool)
    kw = {"advantages": torch.ones(2), "loss_mask": mask}
    options = ta.LossOptions(algorithm="dr_grpo", dr_grpo_loss_agg_mode="token_sum_norm")
    # defaults: 2 samples with loss tokens · longest sample 3 → 5/6
    assert_close(ta.compute_loss(ta.LossInputs(logprobs, **kw), options)[0], torch.tensor(5 / 6))
    # explicit: 8 samples in the step, generation budget 100 → 5/800
    explicit = ta.LossInputs(logprobs, num_samples=8, max_len=100, **kw)
    assert_close(ta.compute_loss(explicit, options)[0], torch.tensor(5 / 800))


def test_segments_are_vectorised_and_global():
    pos = torch.tensor([[0, 1, 2, 0, 1, 0], [0, 1, 0, 1, 2, 3]])
    assert ta.backend.segment_ids_from_position_ids(pos).tolist() == [[0, 0, 0, 1, 1, 2], [3, 3, 4, 4, 4, 4]]
    seg = ta.backend.find_segments(
        pos.shape, segment_ids=torch.tensor([[7, 7, 7, 2, 2, 9], [9, 9, 1, 1, 1, 1]])
    )
    assert seg.ids.tolist() == [[0, 0, 0, 1, 1, 2], [3, 3, 4, 4, 4, 4]]
    assert seg.count == 5
    # a branch (positions that jump back, not to 0) is a sample of its own
    assert ta.backend.segment_ids_from_position_ids(torch.tensor([[0, 1, 2, 1, 2, 0]])).tolist() == [
        [0, 0, 0, 1, 1, 2]
    ]
    # a row that does not start at position 0 still opens a segment
    assert ta.backend.segment_ids_from_position_ids(torch.tensor([[3, 4, 0]])).tolist() == [[0, 0, 1]]
    padded_layout = ta.backend.find_segments((2, 3))
    assert padded_layout.ids.tolist() == [[0, 0, 0], [1, 1, 1]]
