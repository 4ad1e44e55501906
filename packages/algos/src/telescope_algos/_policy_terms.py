"""Per-token policy terms L_t of every algorithm, before modifiers, masking and aggregation.

Every term reads one :class:`PolicyInputs`: tensors ``[rows, seq]`` aligned with ``input_ids`` (see
``_tokens``), advantages already broadcast to every token of their sample. ``logprobs`` (ℓ) carries
the gradient; ``ref_logprobs`` (ℓ^ref) is the ratio denominator: the pre-update policy when the
trainer recomputed it ("batch"), else the rollout (vLLM) logprobs. δ = ℓ − ℓ^ref. Each function
returns L_t, whose mean over the loss tokens is the loss to *minimise*. Masked-out positions may
hold any finite values; the caller masks the result. The formulas: docs/algorithms.md#policy-terms.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from telescope_algos._segments import Segments, segment_mean

_RATIO_LOG_CLAMP = 20.0  # exp(±20) keeps ratios finite in float32
_GSPO_LOG_RATIO_MAX = 10.0


@dataclass(frozen=True)
class PolicyInputs:
    """What a policy term reads; every tensor is ``[rows, seq]``.

    Attributes:
        logprobs: ℓ, the current policy's log-probabilities of the taken tokens, with gradient.
        ref_logprobs: ℓ^ref, the ratio denominator; None when the term needs no ratio (REINFORCE).
        advantages: A, float, broadcast to every token of its sample.
        mask: bool, the loss tokens (after sequence-level IS masking).
        segments: the sample layout (``find_segments``).
    """

    logprobs: torch.Tensor
    ref_logprobs: torch.Tensor | None
    advantages: torch.Tensor
    mask: torch.Tensor
    segments: Segments

    @property
    def delta(self) -> torch.Tensor:
        """δ = ℓ − ℓ^ref (with ℓ's gradient); a ValueError when there is no reference."""
        if self.ref_logprobs is None:
            raise ValueError("this policy term needs a ratio: pass old_logprobs or rollout_logprobs")
        return self.logprobs - self.ref_logprobs

    @property
    def ratio(self) -> torch.Tensor:
        """ρ = exp(clamp(δ, ±20)), with gradient."""
        return torch.exp(self.delta.clamp(-_RATIO_LOG_CLAMP, _RATIO_LOG_CLAMP))


def _clipped_surrogate(
    ratio: torch.Tensor, advantages: torch.Tensor, clip_low: float, clip_high: float
) -> torch.Tensor:
    """``max(−ρA, −clamp(ρ, 1−ε_l, 1+ε_h)·A)`` (PPO, arXiv:1707.06347 eq. 7, as a loss)."""
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high)
    return torch.maximum(-ratio * advantages, -clipped * advantages)


def reinforce_policy_loss(x: PolicyInputs) -> torch.Tensor:
    """REINFORCE with a given advantage: ``L_t = −ℓ_t · A_t``.

    The policy term of grpo (arXiv:2402.03300), rloo (arXiv:2402.14740), reinforce_pp
    (arXiv:2501.03262) and dr_grpo (arXiv:2503.20783); they differ in their advantages and aggregation.
    """
    return -x.logprobs * x.advantages


def ppo_clip_policy_loss(x: PolicyInputs, *, clip_low: float = 0.4, clip_high: float = 0.5) -> torch.Tensor:
    """PPO clipped surrogate with asymmetric bounds (``use_ppo_clip``; replaces ``−ℓA``).

    ``L_t = max(−ρ_t A_t, −clamp(ρ_t, 1−ε_l, 1+ε_h) A_t)``.
    """
    return _clipped_surrogate(x.ratio, x.advantages, clip_low, clip_high)


def cispo_policy_loss(x: PolicyInputs, *, clip_low: float = 0.4, clip_high: float = 0.5) -> torch.Tensor:
    """CISPO, MiniMax-M1 (arXiv:2506.13585) eq. 4: clip the IS *weight*, keep every token's gradient.

    ``w_t = sg(clamp(ρ_t, 1−ε_l, 1+ε_h))``, ``L_t = −w_t · ℓ_t · A_t``.
    """
    weight = x.ratio.clamp(1.0 - clip_low, 1.0 + clip_high).detach()
    return -weight * x.logprobs * x.advantages


def gspo_policy_loss(x: PolicyInputs, *, clip_low: float = 0.4, clip_high: float = 0.5) -> torch.Tensor:
    """GSPO (arXiv:2507.18071) eq. 5-7: a sequence-level, length-normalised ratio shared by every token.

    Per sample s with N_s loss tokens: s̄ = masked mean of δ; per token
    ``λ_t = δ_t/N_s − sg(δ_t/N_s) + sg(s̄)`` (value s̄, gradient 1/N_s per token, i.e. the gradient of the
    geometric mean); ``ρ_t = exp(min(λ_t, 10))``; Ā_s = masked mean of A over the sample;
    ``L_t = max(−ρ_t Ā_s, −clamp(ρ_t, 1−ε_l, 1+ε_h) Ā_s)``. Note the defaults reuse PPO's (0.4, 0.5)
    clip range; the paper uses bounds of order 3e-4 / 4e-4.
    """
    delta = x.delta
    seq_delta, counts = segment_mean(delta.detach(), x.mask, x.segments)
    scaled = delta / counts.clamp_min(1)
    log_ratio = scaled - scaled.detach() + seq_delta
    ratio = torch.exp(log_ratio.clamp(max=_GSPO_LOG_RATIO_MAX))
    seq_adv, _ = segment_mean(x.advantages.detach(), x.mask, x.segments)
    return _clipped_surrogate(ratio, seq_adv, clip_low, clip_high)


def sapo_policy_loss(x: PolicyInputs, *, tau_pos: float = 1.0, tau_neg: float = 1.05) -> torch.Tensor:
    """SAPO (arXiv:2511.20347): a smooth sigmoid gate instead of a hard clip.

    ``τ_t = tau_pos if A_t > 0 else tau_neg``; ``g_t = σ(τ_t(ρ_t − 1))·4/τ_t``; ``L_t = −g_t A_t``.
    Since dg/dρ = 4σ(1−σ) = 1 at ρ = 1, the gradient there equals the vanilla policy gradient
    −A_t ∇ℓ_t; it decays smoothly as ρ leaves 1.
    """
    ratio = x.ratio
    tau = torch.where(x.advantages > 0, tau_pos, tau_neg).to(ratio.dtype)
    gate = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    return -gate * x.advantages
