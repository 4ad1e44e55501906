"""Every policy term and modifier of compute_loss against hand-worked numbers (docs/algorithms.md).

Unless a test says otherwise the batch is one padded row of four tokens: column 0 is the prompt (and
is never a loss token), so the loss is a mean over the three tokens t = 1, 2, 3.
"""

import math

import pytest
import torch
from torch.testing import assert_close

import telescope_algos as ta

LN2, LN_HALF, LN3, LN4 = math.log(2.0), math.log(0.5), math.log(3.0), math.log(4.0)
MASK = torch.tensor([[False, True, True, True]])


def lp(*values):
    """A [1, 4] leaf of current-policy logprobs; the first value sits on the prompt token."""
    return torch.tensor([[0.0, *values]], requires_grad=True)


def behind(logprobs, *deltas):
    """Reference logprobs such that ℓ − ℓ^ref = deltas (the prompt column gets δ = 0)."""
    return logprobs.detach() - torch.tensor([[0.0, *deltas]])


def grad(loss, leaf):
    (g,) = torch.autograd.grad(loss, leaf)
    return g[0, 1:]


def test_reinforce_for_grpo_rloo_reinforce_pp_dr_grpo():
    # L = −ℓ·A with A = 2: [2, 4, 1] → 7/3 = 2.333333; dL/dℓ_t = −A/3 = −0.666667
    for algorithm in ("grpo", "rloo", "reinforce_pp", "dr_grpo"):
        logprobs = lp(-1.0, -2.0, -0.5)
        loss, metrics = ta.compute_loss(
            ta.LossInputs(logprobs, advantages=torch.tensor([2.0]), loss_mask=MASK),
            ta.LossOptions(algorithm=algorithm),
        )
        assert_close(loss, torch.tensor(7 / 3))
        assert_close(grad(loss, logprobs), torch.full((3,), -2 / 3))
        assert_close(metrics["num_tokens"], torch.tensor(3.0))
        assert_close(metrics["loss"], torch.tensor(7 / 3))
        assert not metrics["loss"].requires_grad


def test_cispo_clips_the_detached_weight():
    # δ = [ln2, ln0.5, 0] → ρ = [2, 0.5, 1] → w = clamp(ρ, 0.6, 1.5) = [1.5, 0.6, 1]
    # L = −w·ℓ·A with A = 1: [1.5·1, 0.6·2, 1·0.5] = [1.5, 1.2, 0.5] → 3.2/3 = 1.066667
    # dL/dℓ = −w·A/3 = [−0.5, −0.2, −0.333333] (w is a constant: every token keeps its gradient)
    logprobs = lp(-1.0, -2.0, -0.5)
    ref = behind(logprobs, LN2, LN_HALF, 0.0)
    loss, metrics = ta.compute_loss(
        ta.LossInputs(logprobs, advantages=torch.tensor([1.0]), loss_mask=MASK, rollout_logprobs=ref),
        ta.LossOptions(algorithm="cispo"),
    )
    assert_close(loss, torch.tensor(3.2 / 3))
    assert_close(grad(loss, logprobs), torch.tensor([-0.5, -0.2, -1 / 3]))
    # CISPO reports any clipped weight: ρ=2 above 1.5, ρ=0.5 below 0.6
    assert_close(metrics["clip_high_frac"], torch.tensor(1 / 3))
    assert_close(metrics["clip_low_frac"], torch.tensor(1 / 3))


def test_ppo_clip_asymmetric_bounds_positive_advantage():
    # ρ = [2, 0.5, 1], A = +1: max(−ρ, −clamp(ρ, 0.6, 1.5)) = [max(−2, −1.5), max(−0.5, −0.6), −1]
    # = [−1.5, −0.5, −1] → −3/3 = −1. Gradients: token 1 clipped → 0; token 2: −ρA/3 = −0.166667;
    # token 3: −1/3.
    logprobs = lp(-1.0, -2.0, -0.5)
    ref = behind(logprobs, LN2, LN_HALF, 0.0)
    loss, metrics = ta.compute_loss(
        ta.LossInputs(logprobs, advantages=torch.tensor([1.0]), loss_mask=MASK, rollout_logprobs=ref),
        ta.LossOptions(use_ppo_clip=True),
    )
    assert_close(loss, torch.tensor(-1.0))
    assert_close(grad(loss, logprobs), torch.tensor([0.0, -0.5 / 3, -1 / 3]))
    assert_close(metrics["clip_high_frac"], torch.tensor(1 / 3))
    assert_close(metrics["clip_low_frac"], torch.tensor(0.0))


def test_ppo_clip_negative_advantage_uses_old_logprobs_when_given():
    # A = −1: [max(2, 1.5), max(0.5, 0.6), 1] = [2, 0.6, 1] → 3.6/3 = 1.2
    # gradients: ρA·(−1)/3 = [2/3, 0 (clipped), 1/3]
    logprobs = lp(-1.0, -2.0, -0.5)
    old = behind(logprobs, LN2, LN_HALF, 0.0)
    rollout = logprobs.detach() + 5.0  # must be ignored for the ratio when old_logprobs is given
    loss, metrics = ta.compute_loss(
        ta.LossInputs(
            logprobs,
            advantages=torch.tensor([-1.0]),
            loss_mask=MASK,
            rollout_logprobs=rollout,
            old_logprobs=old,
        ),
        ta.LossOptions(use_ppo_clip=True),
    )
    assert_close(loss, torch.tensor(1.2))
    assert_close(grad(loss, logprobs), torch.tensor([2 / 3, 0.0, 1 / 3]))
    assert_close(metrics["clip_low_frac"], torch.tensor(1 / 3))
    assert_close(metrics["clip_high_frac"], torch.tensor(0.0))


def test_dual_clip_bounds_negative_advantage_losses():
    # A = −1, ρ = [4, 0.5, 1]: PPO gives [max(4, 1.5), 0.6, 1] = [4, 0.6, 1]; c·|A| = 3 caps the first
    # → [3, 0.6, 1] → 4.6/3 = 1.533333; the capped token has no gradient; dual_clip_frac = 1/3
    logprobs = lp(-1.0, -2.0, -0.5)
    ref = behind(logprobs, LN4, LN_HALF, 0.0)
    loss, metrics = ta.compute_loss(
        ta.LossInputs(logprobs, advantages=torch.tensor([-1.0]), loss_mask=MASK, rollout_logprobs=ref),
        ta.LossOptions(use_ppo_clip=True, clip_ratio_c=3.0),
    )
    assert_close(loss, torch.tensor(4.6 / 3))
    assert_close(grad(loss, logprobs), torch.tensor([0.0, 0.0, 1 / 3]))
    assert_close(metrics["dual_clip_frac"], torch.tensor(1 / 3))
    with pytest.raises(ValueError, match="clip_ratio_c must be > 1"):
        ta.compute_loss(
            ta.LossInputs(logprobs, advantages=torch.tensor([1.0]), loss_mask=MASK, rollout_logprobs=ref),
            ta.LossOptions(clip_ratio_c=1.0),
        )


def test_gspo_sequence_ratio_and_one_over_n_gradient():
    # Two padded samples: row 0 has N=2 loss tokens, row 1 has N=4. δ averages to 0 in each sample, so
    # ρ_t = exp(s̄) = 1 everywhere; A = 1 → L_t = −1 per token → loss = −6/6 = −1.
    # dL/dℓ_t = (1/6 token mean)·(−A)·ρ·(1/N_s): row 0: −1/12, row 1: −1/24 (each sample's total is −1/6).
    logprobs = torch.tensor([[0.0, -1.0, -2.0, 0.0, 0.0], [0.0, -1.0, -2.0, -3.0, -4.0]], requires_grad=True)
    deltas = torch.tensor([[0.0, 0.3, -0.3, 9.0, 9.0], [0.0, 0.2, -0.2, 0.5, -0.5]])  # 9.0: padding, ignored
    mask = torch.tensor([[0, 1, 1, 0, 0], [0, 1, 1, 1, 1]], dtype=torch.bool)
    loss, _ = ta.compute_loss(
        ta.LossInputs(
            logprobs,
            advantages=torch.tensor([1.0, 1.0]),
            loss_mask=mask,
            rollout_logprobs=logprobs.detach() - deltas,
        ),
        ta.LossOptions(algorithm="gspo"),
    )
    assert_close(loss, torch.tensor(-1.0))
    (g,) = torch.autograd.grad(loss, logprobs)
    expected = torch.tensor([[0.0, -1 / 12, -1 / 12, 0.0, 0.0], [0.0, -1 / 24, -1 / 24, -1 / 24, -1 / 24]])
    assert_close(g, expected)


def test_gspo_clips_the_sequence_ratio_and_averages_advantages():
    # δ = [ln2, ln2, ln2] → s̄ = ln2 → ρ = 2 for all three tokens. Per-token A = [1, 2, 3] → Ā = 2.
    # A > 0: max(−2·2, −1.5·2) = −3 per token → loss −3, no gradient (clipped); clip_high_frac = 1.
    logprobs = lp(-1.0, -2.0, -0.5)
    ref = behind(logprobs, LN2, LN2, LN2)
    adv = torch.tensor([[0.0, 1.0, 2.0, 3.0]])
    loss, metrics = ta.compute_loss(
        ta.LossInputs(logprobs, advantages=adv, loss_mask=MASK, rollout_logprobs=ref),
        ta.LossOptions(algorithm="gspo"),
    )
    assert_close(loss, torch.tensor(-3.0))
    assert_close(grad(loss, logprobs), torch.zeros(3))
    assert_close(metrics["clip_high_frac"], torch.tensor(1.0))
    # A = −2 everywhere: max(4, 3) = 4 (unclipped); dL/dℓ_t = (1/3)·(−A)·ρ/N = (1/3)·2·2/3 = 0.444444
    loss, _ = ta.compute_loss(
        ta.LossInputs(logprobs, advantages=torch.tensor([-2.0]), loss_mask=MASK, rollout_logprobs=ref),
        ta.LossOptions(algorithm="gspo"),
    )
    assert_close(loss, torch.tensor(4.0))
    assert_close(grad(loss, logprobs), torch.full((3,), 4 / 9))


def test_sapo_gate_values():
    # δ = [ln2, 0, 0], A = [1, 1, −1] (per token), τ_pos = 1, τ_neg = 1.05:
    # t1: ρ = 2, g = σ(1)·4 = 0.731059·4 = 2.924234 → L = −2.924234
    # t2: ρ = 1, g = σ(0)·4 = 2 → L = −2
    # t3: ρ = 1, A < 0: g = σ(0)·4/1.05 = 1.904762 → L = +1.904762
    # loss = (−2.924234 − 2 + 1.904762)/3 = −1.006491
    logprobs = lp(-1.0, -2.0, -0.5)
    ref = behind(logprobs, LN2, 0.0, 0.0)
    adv = torch.tensor([[0.0, 1.0, 1.0, -1.0]])
    loss, _ = ta.compute_loss(
        ta.LossInputs(logprobs, advantages=adv, loss_mask=MASK, rollout_logprobs=ref),
        ta.LossOptions(algorithm="sapo"),
    )
    assert_close(loss, torch.tensor((-2.924234 - 2 + 1.904762) / 3))
    # gradient: −A·4σ(1−σ)·ρ/3: t1: −4·0.731059·0.268941·2/3 = −0.524301; t2: −1/3; t3: +1/3
    assert_close(grad(loss, logprobs), torch.tensor([-0.524301, -1 / 3, 1 / 3]))


def test_sapo_equals_vanilla_policy_gradient_at_ratio_one():
    torch.manual_seed(0)
    logprobs = torch.randn(3, 6).clamp(max=0).requires_grad_()
    adv = torch.randn(3)
    mask = torch.ones(3, 6, dtype=torch.bool)
    inputs = ta.LossInputs(logprobs, advantages=adv, loss_mask=mask, rollout_logprobs=logprobs.detach())
    sapo, _ = ta.compute_loss(inputs, ta.LossOptions(algorithm="sapo", sapo_tau_pos=0.7, sapo_tau_neg=1.3))
    pg, _ = ta.compute_loss(inputs, ta.LossOptions(algorithm="grpo"))
    assert_close(torch.autograd.grad(sapo, logprobs)[0], torch.autograd.grad(pg, logprobs)[0])


def test_tis_truncate():
    # δ^roll = [ln3, ln0.5, 0] → e^δ = [3, 0.5, 1] → w = min(·, 2) = [2, 0.5, 1]
    # REINFORCE with A = 1: −ℓ = [1, 2, 0.5] → ·w = [2, 1, 0.5] → 3.5/3 = 1.166667; tis_mean = 3.5/3
    logprobs = lp(-1.0, -2.0, -0.5)
    rollout = behind(logprobs, LN3, LN_HALF, 0.0)
    loss, metrics = ta.compute_loss(
        ta.LossInputs(logprobs, advantages=torch.tensor([1.0]), loss_mask=MASK, rollout_logprobs=rollout),
        ta.LossOptions(use_tis=True),
    )
    assert_close(loss, torch.tensor(3.5 / 3))
    assert_close(metrics["tis_mean"], torch.tensor(3.5 / 3))
    assert_close(grad(loss, logprobs), torch.tensor([-2 / 3, -0.5 / 3, -1 / 3]))  # −A·w/3, w detached
    assert "tis_zero_frac" not in metrics


def test_tis_icepop_and_logprob_clamp():
    # icepop, band [0.6, 2]: w = [0 (3 > 2), 0 (0.5 < 0.6), 1] → L = [0, 0, 0.5] → 0.5/3 = 0.166667
    # tis_mean = 1/3, tis_zero_frac = 2/3
    logprobs = lp(-1.0, -2.0, -0.5)
    rollout = behind(logprobs, LN3, LN_HALF, 0.0)
    loss, metrics = ta.compute_loss(
        ta.LossInputs(logprobs, advantages=torch.tensor([1.0]), loss_mask=MASK, rollout_logprobs=rollout),
        ta.LossOptions(use_tis=True, tis_mode="icepop", tis_floor=0.6),
    )
    assert_close(loss, torch.tensor(0.5 / 3))
    assert_close(metrics["tis_mean"], torch.tensor(1 / 3))
    assert_close(metrics["tis_zero_frac"], torch.tensor(2 / 3))
    # truncate ignores the floor; a log-ratio of 5 clamped to 1 gives e = 2.718282 under a cap of 10
    w = ta.tis_weights(torch.tensor([5.0, -1.0]), torch.zeros(2), cap=10.0, floor=0.9, logprob_clamp=1.0)
    assert_close(w, torch.tensor([math.e, math.exp(-1.0)]))


def test_kl_penalty_k2_and_k3():
    # A = 0 leaves only τ·penalty. δ^roll = [0.5, −1, 0], τ = 0.1.
    # k2: δ² = [0.25, 1, 0] → loss 0.1·1.25/3 = 0.041667; metric (without τ) 1.25/3 = 0.416667;
    #     gradient τ·2δ/3 = [0.033333, −0.066667, 0]
    logprobs = lp(-1.0, -2.0, -0.5)
    rollout = behind(logprobs, 0.5, -1.0, 0.0)
    inputs = ta.LossInputs(logprobs, advantages=torch.tensor([0.0]), loss_mask=MASK, rollout_logprobs=rollout)
    loss, metrics = ta.compute_loss(inputs, ta.LossOptions(kl_penalty_tau=0.1))
    assert_close(loss, torch.tensor(0.125 / 3))
    assert_close(metrics["kl_penalty"], torch.tensor(1.25 / 3))
    assert_close(grad(loss, logprobs), torch.tensor([0.1 / 3, -0.2 / 3, 0.0]))
    # k3: e^{−δ} − 1 + δ = [0.606531 − 0.5, 2.718282 − 2, 0] = [0.106531, 0.718282, 0]
    loss, metrics = ta.compute_loss(inputs, ta.LossOptions(kl_penalty_tau=0.1, kl_estimator="k3"))
    assert_close(metrics["kl_penalty"], torch.tensor((0.106531 + 0.718282) / 3))
    assert_close(loss, torch.tensor(0.1 * (0.106531 + 0.718282) / 3))
    # k3 is capped at 10 (δ = −20 would give e^20)
    assert_close(ta.kl_penalty(torch.tensor([-20.0]), torch.zeros(1), estimator="k3"), torch.tensor([10.0]))


def test_reference_kl_against_the_reference_logprobs():
    # GRPO, A = 1, ℓ = [−1, −2, −0.5]: policy part [1, 2, 0.5]. Reference δ^ref = [ln2, 0, −0.5], β = 0.5,
    # k3: e^{−δ} − 1 + δ = [0.5 − 1 + 0.693147, 0, 1.648721 − 1 − 0.5] = [0.193147, 0, 0.148721]
    # loss = (3.5 + 0.5·0.341868)/3 = 1.223645; ref_kl metric (without β) 0.341868/3 = 0.113956
    # gradient: −A/3 + β·(1 − e^{−δ})/3 = [−1/3 + 0.5·0.5/3, −1/3, −1/3 + 0.5·(1 − 1.648721)/3]
    logprobs = lp(-1.0, -2.0, -0.5)
    ref = behind(logprobs, LN2, 0.0, -0.5)
    rollout = logprobs.detach().clone()
    inputs = ta.LossInputs(
        logprobs, advantages=torch.tensor([1.0]), loss_mask=MASK, rollout_logprobs=rollout, ref_logprobs=ref
    )
    loss, metrics = ta.compute_loss(inputs, ta.LossOptions(ref_kl_coef=0.5))
    assert_close(loss, torch.tensor((3.5 + 0.5 * 0.341868) / 3))
    assert_close(metrics["ref_kl"], torch.tensor(0.341868 / 3))
    expected = torch.tensor([-1 / 3 + 0.25 / 3, -1 / 3, -1 / 3 + 0.5 * (1 - math.exp(0.5)) / 3])
    assert_close(grad(loss, logprobs), expected)
    # the rollout-policy KL and the reference KL are separate terms: τ adds its own penalty (δ^roll = 0 here)
    both, _ = ta.compute_loss(inputs, ta.LossOptions(ref_kl_coef=0.5, kl_penalty_tau=1.0))
    assert_close(both, loss)
    # k2 against the reference: δ² = [0.480453, 0, 0.25] → ref_kl = 0.730453/3
    _, m2 = ta.compute_loss(inputs, ta.LossOptions(ref_kl_coef=0.5, ref_kl_estimator="k2"))
    assert_close(m2["ref_kl"], torch.tensor((LN2**2 + 0.25) / 3))
    # with β = 0 the metric is still reported and the loss is the policy term alone
    plain, m0 = ta.compute_loss(inputs, ta.LossOptions())
    assert_close(plain, torch.tensor(3.5 / 3))
    assert_close(m0["ref_kl"], metrics["ref_kl"])


def test_reference_kl_is_zero_where_the_reference_is_the_policy():
    logprobs = lp(-1.0, -2.0, -0.5)
    same = logprobs.detach().clone()
    for estimator in ta.KL_ESTIMATORS:
        inputs = ta.LossInputs(logprobs, advantages=torch.tensor([0.0]), loss_mask=MASK, ref_logprobs=same)
        loss, metrics = ta.compute_loss(inputs, ta.LossOptions(ref_kl_coef=1.0, ref_kl_estimator=estimator))
        assert_close(metrics["ref_kl"], torch.tensor(0.0))
        assert_close(loss, torch.tensor(0.0))


def test_opd_advantage_is_the_teacher_log_ratio():
    # ℓ^roll = [−1, −2, −0.5], ℓ^T = [−0.5, −3, −0.5] → ℓ^T − ℓ^roll = [0.5, −1, 0].
    # c = 2, w = 0: A_t = [1, −2, 0]; REINFORCE on ℓ = ℓ^roll: L = −ℓ·A = [1, −4, 0] → −3/3 = −1;
    # dL/dℓ_t = −A_t/3 = [−1/3, 2/3, 0]. teacher_reverse_kl = mean(ℓ^roll − ℓ^T) = (−0.5 + 1 + 0)/3
    logprobs = lp(-1.0, -2.0, -0.5)
    rollout = logprobs.detach().clone()
    teacher = torch.tensor([[0.0, -0.5, -3.0, -0.5]])
    inputs = ta.LossInputs(
        logprobs,
        advantages=torch.tensor([4.0]),
        loss_mask=MASK,
        rollout_logprobs=rollout,
        teacher_logprobs=teacher,
    )
    loss, metrics = ta.compute_loss(inputs, ta.LossOptions(algorithm="opd", distill_coef=2.0))
    assert_close(loss, torch.tensor(-1.0))
    assert_close(grad(loss, logprobs), torch.tensor([-1 / 3, 2 / 3, 0.0]))
    assert_close(metrics["teacher_reverse_kl"], torch.tensor(0.5 / 3))
    # w = 0.5 adds half the environment's advantage (4): A_t = [3, 0, 2] → L = [3, 0, 1] → 4/3
    loss, _ = ta.compute_loss(
        inputs, ta.LossOptions(algorithm="opd", distill_coef=2.0, distill_reward_weight=0.5)
    )
    assert_close(loss, torch.tensor(4 / 3))
    # the pure function
    a = ta.distill_advantages(
        torch.tensor([4.0]), torch.tensor([-0.5]), torch.tensor([-1.0]), coef=2.0, reward_weight=0.5
    )
    assert_close(a, torch.tensor([3.0]))
    # under PPO clip at ratio 1 the surrogate is −A_t = [−1, 2, 0] → 1/3, with REINFORCE's gradient
    clipped, _ = ta.compute_loss(inputs, ta.LossOptions(algorithm="opd", use_ppo_clip=True, distill_coef=2.0))
    assert_close(clipped, torch.tensor(1 / 3))
    assert_close(grad(clipped, logprobs), torch.tensor([-1 / 3, 2 / 3, 0.0]))


def test_seq_is_masking_drops_whole_samples():
    # Packed row, two samples. δ^roll sample A = [0.1, 0.1] → g = e^0.1 = 1.105 ∈ [0.8, 1.2]: kept;
    # sample B = [0.3, 0.5] → g = e^0.4 = 1.492: dropped. REINFORCE, A = 1, ℓ = −1 on A's tokens:
    # kept sum = 2; denominator = the 4 input loss tokens → 0.5. seq_is_masked_frac = 1 − 2/4.
    logprobs = torch.tensor([[0.0, -1.0, -1.0, 0.0, -2.0, -2.0]], requires_grad=True)
    rollout = logprobs.detach() - torch.tensor([[0.0, 0.1, 0.1, 0.0, 0.3, 0.5]])
    loss, metrics = ta.compute_loss(
        ta.LossInputs(
            logprobs,
            advantages=torch.ones(1, 6),
            loss_mask=torch.tensor([[0, 1, 1, 0, 1, 1]]),
            position_ids=torch.tensor([[0, 1, 2, 0, 1, 2]]),
            rollout_logprobs=rollout,
        ),
        ta.LossOptions(seq_is_masking=True),
    )
    assert_close(loss, torch.tensor(0.5))
    assert_close(metrics["seq_is_masked_frac"], torch.tensor(0.5))
    assert_close(metrics["num_tokens"], torch.tensor(2.0))


def test_entropy_bonus_and_metrics():
    # REINFORCE 7/3 (A = 2, as above); entropy [1, 2, 3] → H̄ = 2; coef 0.01 → loss 7/3 − 0.02
    # dloss/dH_t = −0.01/3. kl_divergence_inference: δ^roll = [ln2, 0, 0] → (2 − 1 − ln2)/3 = 0.102284
    logprobs = lp(-1.0, -2.0, -0.5)
    entropy = torch.tensor([[9.0, 1.0, 2.0, 3.0]], requires_grad=True)
    loss, metrics = ta.compute_loss(
        ta.LossInputs(
            logprobs,
            advantages=torch.tensor([2.0]),
            loss_mask=MASK,
            rollout_logprobs=behind(logprobs, LN2, 0.0, 0.0),
            entropy=entropy,
        ),
        ta.LossOptions(entropy_coef=0.01),
    )
    assert_close(loss, torch.tensor(7 / 3 - 0.02))
    assert_close(grad(loss, entropy), torch.full((3,), -0.01 / 3))
    assert_close(metrics["entropy"], torch.tensor(2.0))
    assert_close(metrics["entropy_bonus"], torch.tensor(0.02))
    assert_close(metrics["kl_divergence_inference"], torch.tensor((1 - LN2) / 3))
    assert all(not v.requires_grad and v.dim() == 0 for v in metrics.values())


def test_modifier_order_dual_clip_before_tis_and_kl():
    # A = −1, ρ = 4 on token 1 → PPO 4 → dual clip 3 → TIS (δ^roll = ln4, w = min(4, 2) = 2) → 6
    # → KL k2 τ = 0.1: + 0.1·ln(4)² = 0.192181 → 6.192181. Tokens 2, 3: δ = 0 → L = ρA·(−1) = 1 each.
    # loss = (6.192181 + 1 + 1)/3 = 2.730727
    logprobs = lp(-1.0, -2.0, -0.5)
    ref = behind(logprobs, LN4, 0.0, 0.0)
    loss, _ = ta.compute_loss(
        ta.LossInputs(
            logprobs, advantages=torch.tensor([-1.0]), loss_mask=MASK, rollout_logprobs=ref, old_logprobs=ref
        ),
        ta.LossOptions(use_ppo_clip=True, clip_ratio_c=3.0, use_tis=True, kl_penalty_tau=0.1),
    )
    assert_close(loss, torch.tensor((6 + 0.1 * LN4**2 + 2) / 3))


def test_first_token_of_a_sample_is_never_a_loss_token():
    logprobs = torch.tensor([[-5.0, -1.0]], requires_grad=True)
    loss, metrics = ta.compute_loss(
        ta.LossInputs(logprobs, advantages=torch.tensor([1.0]), loss_mask=torch.ones(1, 2)), ta.LossOptions()
    )
    assert_close(loss, torch.tensor(1.0))  # only token 1: −(−1)·1/1
    assert_close(metrics["num_tokens"], torch.tensor(1.0))


def test_all_masked_micro_batch_is_zero_not_nan():
    logprobs = torch.zeros(2, 4, requires_grad=True)
    loss, metrics = ta.compute_loss(
        ta.LossInputs(logprobs, advantages=torch.zeros(2), loss_mask=torch.zeros(2, 4)), ta.LossOptions()
    )
    assert_close(loss, torch.tensor(0.0))
    assert_close(metrics["num_tokens"], torch.tensor(0.0))


@pytest.mark.parametrize(
    ("options", "data", "match"),
    [
        ({"algorithm": "ppo"}, {}, "unknown algorithm"),
        ({"algorithm": "cispo"}, {}, "needs a ratio"),
        ({"use_ppo_clip": True}, {}, "needs a ratio"),
        ({"use_tis": True}, {}, "rollout_logprobs"),
        ({"seq_is_masking": True}, {}, "rollout_logprobs"),
        ({"kl_penalty_tau": 0.1}, {}, "rollout_logprobs"),
        ({"entropy_coef": 0.1}, {}, "entropy"),
        ({"dr_grpo_loss_agg_mode": "seq_mean"}, {}, "dr_grpo_loss_agg_mode"),
        ({"kl_estimator": "k1"}, {}, "unknown kl_estimator"),
        ({"ref_kl_estimator": "abs"}, {}, "unknown ref_kl_estimator"),
        ({"algorithm": "opd"}, {"rollout_logprobs": torch.zeros(1, 4)}, "teacher_logprobs"),
        ({"algorithm": "opd"}, {"teacher_logprobs": torch.zeros(1, 4)}, "teacher_logprobs and rollout"),
        ({"ref_kl_coef": 0.1}, {}, "ref_logprobs"),
        ({}, {"ref_logprobs": torch.zeros(1, 3)}, "ref_logprobs has shape"),
        (
            {"algorithm": "sapo", "use_ppo_clip": True},
            {"rollout_logprobs": torch.zeros(1, 4)},
            "own clipping",
        ),
        ({"use_ppo_clip": True, "use_tis": True}, {"rollout_logprobs": torch.zeros(1, 4)}, "corrects twice"),
        ({}, {"position_ids": torch.zeros(1, 4, dtype=torch.long)}, "padded layout"),
        ({}, {"rollout_logprobs": torch.zeros(2, 4)}, "shape"),
    ],
)
def test_argument_errors(options, data, match):
    with pytest.raises(ValueError, match=match):
        ta.compute_loss(
            ta.LossInputs(torch.zeros(1, 4), advantages=torch.zeros(1), loss_mask=MASK, **data),
            ta.LossOptions(**options),
        )
