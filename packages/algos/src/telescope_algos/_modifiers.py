"""Loss modifiers that wrap any policy term: sequence IS masking, dual clip, TIS and the KL penalties.

:func:`telescope_algos.compute_loss` applies them in this order (docs/algorithms.md#modifiers):

1. :func:`seq_is_mask` on the loss mask; 2. the policy term (``_policy_terms``, PPO clip included);
3. :func:`dual_clip`; 4. multiply by :func:`tis_weights`; 5. add ``τ ·`` :func:`kl_penalty` to the
rollout policy and ``β ·`` :func:`kl_penalty` to the frozen reference model; 6. mask.

All but the reference KL measure the distance to the **rollout** policy with δ^roll = ℓ − ℓ^roll; the
reference KL uses δ^ref = ℓ − ℓ^ref with the same estimators. Shapes: ``[rows, seq]`` aligned with
``input_ids``.
"""

from __future__ import annotations

from typing import Literal

import torch

from telescope_algos._segments import Segments, segment_mean


def seq_is_mask(
    logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor,
    mask: torch.Tensor,
    segments: Segments,
    *,
    low: float = 0.8,
    high: float = 1.2,
) -> torch.Tensor:
    """Sequence-level importance-sampling masking: drop whole samples that drifted off-policy.

    Per sample, ``g = exp(clamp(masked mean of δ^roll, ±20))`` (the geometric-mean IS ratio); samples
    with ``g ∉ [low, high]`` lose every loss token. Returns the new bool mask (no gradient).
    """
    with torch.no_grad():
        mean_delta, _ = segment_mean(logprobs.detach() - rollout_logprobs, mask, segments)
        g = torch.exp(mean_delta.clamp(-20.0, 20.0))
        return mask & (g >= low) & (g <= high)


def dual_clip(loss: torch.Tensor, advantages: torch.Tensor, clip_ratio_c: float) -> torch.Tensor:
    """Dual-clip PPO (Ye et al., arXiv:1912.09729 eq. 5, as a loss): ``L_t ← min(L_t, c·|A_t|)``.

    Bounds the loss of tokens with negative advantage whose ratio exploded; for A ≥ 0 the clipped
    surrogate is already ≤ c·|A| whenever the PPO clip is on. ``clip_ratio_c`` must be > 1.
    """
    if not clip_ratio_c > 1.0:
        raise ValueError(
            f"clip_ratio_c must be > 1 (it is a ratio bound above 1+clip_high), got {clip_ratio_c}"
        )
    return torch.minimum(loss, clip_ratio_c * advantages.abs())


def tis_weights(
    logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor,
    *,
    mode: Literal["truncate", "icepop"] | str = "truncate",
    cap: float = 2.0,
    floor: float = 0.0,
    logprob_clamp: float = 20.0,
) -> torch.Tensor:
    """Truncated importance-sampling weights against the rollout policy (no gradient).

    ``d_t = clamp(δ^roll_t, ±logprob_clamp)``. ``truncate`` (TIS, Yao et al. 2025, "Your efficient RL
    framework secretly brings you off-policy RL training"): ``w_t = min(e^{d_t}, cap)``; ``floor`` is
    ignored. ``icepop`` (Ling team, "IcePop", 2025): ``w_t = e^{d_t} · 1[floor ≤ e^{d_t} ≤ cap]``, i.e.
    tokens outside the band get weight 0 instead of a truncated one.
    """
    with torch.no_grad():
        ratio = torch.exp((logprobs - rollout_logprobs).clamp(-logprob_clamp, logprob_clamp))
        if mode == "truncate":
            return ratio.clamp(max=cap)
        if mode == "icepop":
            return torch.where((ratio >= floor) & (ratio <= cap), ratio, torch.zeros_like(ratio))
        raise ValueError(f"unknown tis_mode {mode!r}; known: truncate, icepop")


KL_ESTIMATORS = ("k2", "k3")
"""The penalty's estimators. Not k1 (δ): on the policy's own samples its gradient is zero in
expectation (E[∇ℓ] = 0), so as a loss term it only adds noise."""


def kl_penalty(
    logprobs: torch.Tensor,
    other_logprobs: torch.Tensor,
    *,
    estimator: Literal["k2", "k3"] | str = "k2",
) -> torch.Tensor:
    """Per-token KL penalty toward another policy (Schulman, "Approximating KL divergence", 2020):
    the rollout policy (``kl_penalty_tau``) or the frozen reference model (``ref_kl_coef``).

    δ = ℓ − ℓ^other. ``k2``: δ² (without the usual ½). ``k3``: ``e^{−δ} − 1 + δ`` with δ
    clamped to ±20 and the result capped at 10. Differentiable through ``logprobs``.
    """
    delta = logprobs - other_logprobs
    if estimator == "k2":
        return delta.square()
    if estimator == "k3":
        d = delta.clamp(-20.0, 20.0)
        return (torch.exp(-d) - 1.0 + d).clamp(max=10.0)
    raise ValueError(f"unknown KL estimator {estimator!r}; known: {', '.join(KL_ESTIMATORS)}")
