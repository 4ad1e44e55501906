"""One train step on one gloo rank against an independent reference.

The reference is a plain transformers model run on each sample alone (no packing, no FSDP, no
telescope code): loss = −Σ A·logπ over all completion tokens of the step / their count, then
``clip_grad_norm_`` and ``torch.optim.AdamW``. The trainer must give the same loss, pre-clip gradient
norm, metrics and updated weights whatever the packing. Tolerances (fp32): metrics rel 1e-5; weights
atol 2e-6 with lr 1e-3 (an AdamW step moves each weight by about lr; 2e-6 is 0.2% of it), except the
few elements whose gradient is near AdamW's eps (``assert_weights_close``).
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from telescope_algos import pack_samples

WEIGHT_ATOL = 2e-6


def reference_step(model_dir, groups, *, lr=1e-3, wd=0.01, clip=1.0, temperature=1.0):
    """Plain transformers + AdamW; one update per group of samples. Returns (state, metrics per group)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="sdpa")
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=lr, weight_decay=wd)
    out = []
    for samples in groups:
        opt.zero_grad()
        count = sum(
            len(s.completion_ids) for s in samples
        )  # prompts have >= 2 tokens: all completion tokens count
        loss = torch.zeros(())
        entropy = kl = 0.0
        for s in samples:
            ids = torch.tensor([*s.prompt_ids, *s.completion_ids])[None]
            logits = model(input_ids=ids, use_cache=False).logits[0, :-1].double() / temperature
            logp_all = logits.log_softmax(-1)
            start = len(s.prompt_ids) - 1  # row t predicts token t+1: completion starts at prompt_len - 1
            lp = logp_all.gather(1, ids[0, 1:, None])[:, 0][start:]
            loss = loss + (-(s.advantage * lp)).sum().float()
            entropy += float(-(logp_all.exp() * logp_all).detach().sum(-1)[start:].sum())
            d = lp.detach() - torch.tensor(s.rollout_logprobs, dtype=torch.float64)
            kl += float((torch.expm1(d) - d).sum())
        loss = loss / count
        loss.backward()
        squares = 0.0
        for p in params:
            assert p.grad is not None
            squares += float(p.grad.double().pow(2).sum())
        norm = math.sqrt(squares)
        torch.nn.utils.clip_grad_norm_(params, clip)
        opt.step()
        out.append(
            {"loss": float(loss.detach()), "grad_norm": norm, "entropy": entropy / count, "kl": kl / count}
        )
    return {k: v.detach().clone() for k, v in model.state_dict().items()}, out


def assert_weights_close(trainer_state, reference, atol=WEIGHT_ATOL, lr=1e-3):
    """All but 0.1% of the weights within ``atol``; the rest within one AdamW step (``lr``).

    AdamW's first update is g/(|g| + 1e-8) per element: where |g| is near 1e-8 the last-bit noise of
    the fp32 gradient moves the update by up to lr. The gradient itself is checked exactly through
    ``grad_norm``.
    """
    assert trainer_state, "no weights"
    far = total = 0
    for name, t in trainer_state.items():
        diff = (t - reference[name]).abs()
        assert float(diff.max()) <= lr, f"{name}: differs by {float(diff.max())} > one step"
        far += int((diff > atol).sum())
        total += diff.numel()
    assert far <= 1e-3 * total, f"{far} of {total} weights differ by more than {atol}"


@pytest.fixture(params=["untied", "tied"])
def model_dir(request, tiny_model_dir, tiny_tied_model_dir):
    return tiny_model_dir if request.param == "untied" else tiny_tied_model_dir


@pytest.mark.parametrize(("seq_len", "temperature"), [(512, 1.0), (24, 0.7)])
def test_step_matches_reference_whatever_the_packing(helpers, model_dir, seq_len, temperature):
    samples = helpers.make_samples(7, seed=3)
    cfg = helpers.make_config(model_dir, temperature=temperature)
    (mbs,) = pack_samples(samples, seq_len=seq_len, pad_to_multiple_of=8)
    assert (len(mbs) == 1) == (seq_len == 512)  # one row with all 7 samples, or several rows
    with helpers.open_trainer(cfg) as trainer:
        before = helpers.hf_state(trainer)
        metrics = trainer.train_step(mbs, step=0)
        after = helpers.hf_state(trainer)
    ref_state, (ref,) = reference_step(model_dir, [samples], temperature=temperature)
    assert metrics["num_tokens"] == sum(len(s.completion_ids) for s in samples)
    assert metrics["loss"] == pytest.approx(ref["loss"], rel=1e-5, abs=1e-6)
    assert metrics["grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-5)
    assert metrics["entropy"] == pytest.approx(ref["entropy"], rel=1e-5)
    assert metrics["kl_divergence_inference"] == pytest.approx(ref["kl"], rel=1e-5)
    assert metrics["learning_rate"] == pytest.approx(1e-3)
    assert metrics["skipped_steps"] == 0
    for key in ("timing/forward_backward", "timing/optimizer", "timing/step"):
        assert metrics[key] > 0
    assert any(not torch.equal(before[n], after[n]) for n in after), "the step changed nothing"
    assert_weights_close(after, ref_state)


def test_dummy_micro_batches_and_split_change_nothing(helpers, tiny_model_dir):
    samples = helpers.make_samples(6, seed=5)
    cfg = helpers.make_config(tiny_model_dir)
    # Three ranks' worth of micro-batches (with dummies, no loss tokens) trained on one rank.
    by_rank = pack_samples(samples, seq_len=20, pad_to_multiple_of=4, num_ranks=3)
    mbs = [mb for rank in by_rank for mb in rank]
    assert any(mb.num_samples == 0 for mb in mbs), "expected a dummy micro-batch"
    with helpers.open_trainer(cfg) as trainer:
        metrics = trainer.train_step(mbs, step=0)
        after = helpers.hf_state(trainer)
    ref_state, (ref,) = reference_step(tiny_model_dir, [samples])
    assert metrics["grad_norm"] == pytest.approx(ref["grad_norm"], rel=1e-5)
    assert_weights_close(after, ref_state)


def test_minibatches_make_one_update_per_group(helpers, tiny_model_dir):
    group_a = helpers.make_samples(4, seed=11)
    group_b = helpers.make_samples(3, seed=12)
    (a,) = pack_samples(group_a, seq_len=24)
    (b,) = pack_samples(group_b, seq_len=24)
    assert len(a) > 1
    assert len(b) > 1
    b += [
        dataclasses.replace(b[0], loss_mask=torch.zeros_like(b[0].loss_mask), num_samples=0, num_tokens=0)
    ] * (len(a) - len(b))  # equal lengths, a dummy if needed
    mbs = [
        mb for pair in zip(a, b, strict=True) for mb in pair
    ]  # dealt round-robin: group 0 = a, group 1 = b
    cfg = helpers.make_config(tiny_model_dir, number_of_minibatches=2)
    with helpers.open_trainer(cfg) as trainer:
        metrics = trainer.train_step(mbs, step=0)
        after = helpers.hf_state(trainer)
    ref_state, refs = reference_step(tiny_model_dir, [group_a, group_b])
    assert metrics["grad_norm"] == pytest.approx((refs[0]["grad_norm"] + refs[1]["grad_norm"]) / 2, rel=1e-5)
    assert metrics["loss"] == pytest.approx((refs[0]["loss"] + refs[1]["loss"]) / 2, rel=1e-5, abs=1e-6)
    assert_weights_close(after, ref_state)


def test_nonfinite_gradient_skips_the_update_and_is_counted(helpers, tiny_model_dir):
    samples = helpers.make_samples(3, seed=8)
    (mbs,) = pack_samples(samples, seq_len=64)
    bad = [dataclasses.replace(mb, advantages=mb.advantages.clone()) for mb in mbs]
    bad[0].advantages[0, bad[0].loss_mask[0].nonzero()[0, 0]] = float("nan")  # on a loss token
    cfg = helpers.make_config(tiny_model_dir)
    with helpers.open_trainer(cfg) as trainer:
        before = helpers.hf_state(trainer)
        m1 = trainer.train_step(bad, step=0)
        unchanged = helpers.hf_state(trainer)
        m2 = trainer.train_step(mbs, step=1)
        after = helpers.hf_state(trainer)
    assert not math.isfinite(m1["grad_norm"])
    assert (m1["skipped_steps"], m1["skipped_steps_total"]) == (1, 1)
    for name in before:
        assert torch.equal(before[name], unchanged[name]), name
    assert (m2["skipped_steps"], m2["skipped_steps_total"]) == (0, 1)
    ref_state, _ = reference_step(tiny_model_dir, [samples])  # the first AdamW step happens at step 1
    assert_weights_close(after, ref_state)


def test_batch_old_logprobs_make_ppo_clip_on_policy(helpers, tiny_model_dir):
    # With pi_old recomputed before the update and one minibatch the ratio is 1: PPO-clip's gradient
    # is exactly REINFORCE's, so the update equals the plain step; against the (random) rollout
    # logprobs it does not.
    samples = helpers.make_samples(5, seed=21)
    (mbs,) = pack_samples(samples, seq_len=40)
    results = {}
    for ref in ("batch", "rollout"):
        cfg = helpers.make_config(tiny_model_dir, use_ppo_clip=True, ppo_clip_ref_logprobs=ref)
        with helpers.open_trainer(cfg) as trainer:
            metrics = trainer.train_step(mbs, step=0)
            results[ref] = (metrics, helpers.hf_state(trainer))
    ref_state, _ = reference_step(tiny_model_dir, [samples])
    batch_metrics, batch_state = results["batch"]
    assert batch_metrics["timing/old_logprobs"] > 0
    assert batch_metrics["clip_low_frac"] == batch_metrics["clip_high_frac"] == 0.0
    assert_weights_close(batch_state, ref_state)
    rollout_metrics, rollout_state = results["rollout"]
    assert "timing/old_logprobs" not in rollout_metrics
    assert rollout_metrics["clip_low_frac"] + rollout_metrics["clip_high_frac"] > 0
    assert any(not torch.allclose(rollout_state[n], ref_state[n], atol=1e-5) for n in rollout_state)


def test_learning_rate_follows_the_schedule_and_empty_steps_fail(helpers, tiny_model_dir):
    cfg = helpers.make_config(tiny_model_dir, lr_scheduler="linear", warmup_steps=1, number_of_steps=3)
    (mbs,) = pack_samples(helpers.make_samples(2, seed=1), seq_len=64)
    with helpers.open_trainer(cfg) as trainer:
        lrs = [trainer.train_step(mbs, step=s)["learning_rate"] for s in range(3)]
        with pytest.raises(ValueError, match="no micro-batches"):
            trainer.train_step([], step=3)
    # 1e-3 x [0 (warmup), 1 (p = 0), 1 - 1/2 (p = 1/2, rho 0)]
    assert lrs == pytest.approx([0.0, 1e-3, 5e-4])


def test_config_checks_fail_clearly_and_leave_no_process_group(helpers, tiny_model_dir):
    import torch.distributed as dist

    from telescope_trainer_fsdp import create_trainer

    with pytest.raises(ValueError, match=r"trainer_num_workers is 2 but .* 1 ranks"):
        create_trainer(helpers.make_config(tiny_model_dir, trainer_num_workers=2))
    assert not dist.is_initialized()
    cp = helpers.make_config(tiny_model_dir, fsdp_context_parallel_size=2, trainer_num_workers=2)
    with pytest.raises(ValueError, match="context parallelism uses its own attention"):
        create_trainer(cp, attn_implementation="eager")
    assert not dist.is_initialized()
