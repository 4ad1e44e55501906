"""``compute_loss``: one micro-batch's policy loss and its metrics, for every algorithm and modifier.

Order (spec §3.3-3.4): sequence-level IS masking → policy term → PPO clip → dual clip → TIS → KL
penalty → mask → aggregation → entropy bonus.

**Normalisation (deviation from upstream, on purpose).** Upstream divides every micro-batch by its
own token count and averages the micro-batches, so a token's weight depends on how the step was
packed and how many dummy micro-batches were added. Here the caller passes the denominator:
``num_tokens`` = loss tokens of the whole optimizer step (every micro-batch, every rank), so that
summing the micro-batch losses (DDP/FSDP: summing gradients over ranks, i.e. multiply by the world
size if the backend averages) gives the true token mean of the step. ``None`` uses the local count,
which equals upstream for a single micro-batch.
"""

from __future__ import annotations

from typing import Literal

import torch

from telescope_algos._advantages import ALGORITHMS, Algorithm
from telescope_algos._losses import (
    cispo_policy_loss,
    gspo_policy_loss,
    ppo_clip_policy_loss,
    reinforce_policy_loss,
    sapo_policy_loss,
)
from telescope_algos._modifiers import dual_clip, kl_penalty, seq_is_mask, tis_weights
from telescope_algos._segments import Segments, find_segments, segment_mean, segment_sum

__all__ = ["compute_loss"]

_REINFORCE = ("grpo", "rloo", "reinforce_pp", "dr_grpo")
_NEEDS_REF = ("cispo", "gspo", "sapo")
Number = float | int | torch.Tensor


def _check(name: str, t: torch.Tensor | None, shape: torch.Size) -> None:
    if t is not None and t.shape != shape:
        raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {tuple(shape)} like logprobs")


def _masked_mean(x: torch.Tensor, mask: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    return torch.where(mask, x, torch.zeros_like(x)).sum() / count


def compute_loss(
    logprobs: torch.Tensor,
    *,
    advantages: torch.Tensor,
    loss_mask: torch.Tensor,
    rollout_logprobs: torch.Tensor | None = None,
    old_logprobs: torch.Tensor | None = None,
    entropy: torch.Tensor | None = None,
    algorithm: Algorithm | str = "grpo",
    position_ids: torch.Tensor | None = None,
    segment_ids: torch.Tensor | None = None,
    num_tokens: Number | None = None,
    num_samples: Number | None = None,
    max_len: Number | None = None,
    use_ppo_clip: bool = False,
    clip_low: float = 0.4,
    clip_high: float = 0.5,
    clip_ratio_c: float | None = None,
    use_tis: bool = False,
    tis_cap: float = 2.0,
    tis_mode: Literal["truncate", "icepop"] | str = "truncate",
    tis_floor: float = 0.0,
    tis_logprob_clamp: float = 20.0,
    seq_is_masking: bool = False,
    seq_is_mask_low: float = 0.8,
    seq_is_mask_high: float = 1.2,
    kl_penalty_tau: float = 0.0,
    kl_estimator: Literal["k2", "k3"] | str = "k2",
    entropy_coef: float = 0.0,
    sapo_tau_pos: float = 1.0,
    sapo_tau_neg: float = 1.05,
    dr_grpo_loss_agg_mode: Literal["token_mean", "token_sum_norm"] | str = "token_mean",
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Policy loss of one micro-batch (to minimise) and its detached metrics.

    Layout: every per-token tensor is ``[rows, seq]`` aligned with ``input_ids`` (``_tokens`` module).
    Padded: one sample per row, nothing else to pass. Packed: several samples per row, boundaries from
    ``position_ids`` (restarting at 0 per sample) or ``segment_ids`` (new sample where the id changes).
    Both layouts give the same loss and gradients. The first token of every sample is never a loss
    token (nothing predicts it), whatever ``loss_mask`` says.

    Args:
        logprobs: ℓ, ``[rows, seq]`` current-policy log-probabilities of the taken tokens, with gradient.
        advantages: ``[rows]`` (padded layout: one per row) or ``[rows, seq]`` (broadcast per token).
        loss_mask: ``[rows, seq]`` bool or 0/1; True on tokens the model generated.
        rollout_logprobs: ℓ^roll from the inference engine; needed by TIS, the KL penalty, sequence IS
            masking and the ``kl_divergence_inference`` metric, and as ratio denominator when
            ``old_logprobs`` is None (``ppo_clip_ref_logprobs: rollout``).
        old_logprobs: the pre-update policy recomputed by the trainer (``ppo_clip_ref_logprobs: batch``).
        entropy: per-token entropy (``token_logprobs_and_entropy``); needed by ``entropy_coef > 0``
            (then with gradient) and for the ``entropy`` metric.
        algorithm: grpo, rloo, reinforce_pp, dr_grpo (REINFORCE term), cispo, gspo or sapo.
        num_tokens: denominator of ``token_mean`` and of the entropy bonus: the loss-token count of the
            whole step (sum of ``MicroBatch.num_tokens`` over micro-batches and ranks); clamped to ≥ 1.
            None: the local count of ``loss_mask`` (before sequence IS masking, which therefore removes
            samples without re-weighting the others).
        num_samples, max_len: dr_grpo ``token_sum_norm`` divides the masked sum by
            ``num_samples · max_len`` (Dr. GRPO §3.2: a constant per-sample length). Pass the step's
            sample count and the generation budget (``max_tokens``). None: the local number of samples
            with a loss token, and the local longest sample's loss-token count.
        Remaining keywords: the config fields of the same names (spec §2.2), with the same defaults.

    Returns:
        ``(loss, metrics)``. ``loss`` is a 0-dim tensor. ``metrics`` maps names to detached 0-dim float32
        tensors: ``loss``, ``num_tokens`` (local loss tokens after sequence IS masking: the weight of
        every mean below), and token-weighted means over those tokens: ``entropy`` (if given),
        ``kl_divergence_inference`` (k3 form ``e^δ − 1 − δ`` of δ^roll, if rollout logprobs are given),
        ``clip_low_frac`` / ``clip_high_frac`` (PPO clip, CISPO, GSPO: ratio clipped at the lower / upper
        bound where it changed the loss, for CISPO where it changed the weight), ``dual_clip_frac``,
        ``tis_mean``, ``tis_zero_frac`` (icepop), ``kl_penalty`` (without τ), ``entropy_bonus``; plus
        ``seq_is_masked_frac``, a fraction of the loss tokens *before* masking.
    """
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}; known: {', '.join(ALGORITHMS)}")
    if dr_grpo_loss_agg_mode not in ("token_mean", "token_sum_norm"):
        raise ValueError(
            f"unknown dr_grpo_loss_agg_mode {dr_grpo_loss_agg_mode!r}; known: token_mean, token_sum_norm"
        )
    if logprobs.dim() != 2:
        raise ValueError(f"logprobs must be [rows, seq], got shape {tuple(logprobs.shape)}")
    shape = logprobs.shape
    for name, t in (
        ("loss_mask", loss_mask),
        ("rollout_logprobs", rollout_logprobs),
        ("old_logprobs", old_logprobs),
        ("entropy", entropy),
    ):
        _check(name, t, shape)
    adv = advantages.to(logprobs.dtype)
    if adv.shape == shape[:1]:
        if position_ids is not None or segment_ids is not None:
            raise ValueError("per-row advantages [rows] need the padded layout; give packed rows [rows, seq]")
        adv = adv[:, None].expand(shape)
    _check("advantages", adv, shape)

    ref = old_logprobs if old_logprobs is not None else rollout_logprobs
    if rollout_logprobs is None:
        for flag, on in (
            ("use_tis", use_tis),
            ("seq_is_masking", seq_is_masking),
            ("kl_penalty_tau", kl_penalty_tau > 0),
        ):
            if on:
                raise ValueError(f"{flag} compares against the rollout policy: pass rollout_logprobs")
    if ref is None and (algorithm in _NEEDS_REF or use_ppo_clip):
        what = "use_ppo_clip" if use_ppo_clip else f"algorithm={algorithm!r}"
        raise ValueError(f"{what} needs a ratio: pass old_logprobs or rollout_logprobs")
    if use_ppo_clip and algorithm not in _REINFORCE:
        raise ValueError(f"use_ppo_clip applies to {', '.join(_REINFORCE)}; {algorithm} has its own clipping")
    if use_tis and use_ppo_clip and old_logprobs is None:
        raise ValueError(
            "use_tis with use_ppo_clip against rollout logprobs corrects twice; pass old_logprobs"
        )
    if entropy_coef > 0 and entropy is None:
        raise ValueError("entropy_coef > 0 needs the per-token entropy (with gradient)")

    segments = find_segments(
        shape, position_ids=position_ids, segment_ids=segment_ids, device=logprobs.device
    )
    input_mask = loss_mask.bool() & ~segments.starts
    input_count = input_mask.sum()
    mask = input_mask
    if seq_is_masking:
        mask = seq_is_mask(
            logprobs, rollout_logprobs, mask, segments, low=seq_is_mask_low, high=seq_is_mask_high
        )

    if algorithm == "cispo":
        per_token = cispo_policy_loss(logprobs, ref, adv, clip_low=clip_low, clip_high=clip_high)
    elif algorithm == "gspo":
        per_token = gspo_policy_loss(
            logprobs, ref, adv, mask, segments, clip_low=clip_low, clip_high=clip_high
        )
    elif algorithm == "sapo":
        per_token = sapo_policy_loss(logprobs, ref, adv, tau_pos=sapo_tau_pos, tau_neg=sapo_tau_neg)
    elif use_ppo_clip:
        per_token = ppo_clip_policy_loss(logprobs, ref, adv, clip_low=clip_low, clip_high=clip_high)
    else:
        per_token = reinforce_policy_loss(logprobs, adv)
    before_dual = per_token
    if clip_ratio_c is not None:
        per_token = dual_clip(per_token, adv, clip_ratio_c)
    tis = None
    if use_tis:
        tis = tis_weights(
            logprobs,
            rollout_logprobs,
            mode=tis_mode,
            cap=tis_cap,
            floor=tis_floor,
            logprob_clamp=tis_logprob_clamp,
        )
        per_token = per_token * tis
    if kl_penalty_tau > 0:
        per_token = per_token + kl_penalty_tau * kl_penalty(
            logprobs, rollout_logprobs, estimator=kl_estimator
        )
    masked_sum = torch.where(mask, per_token, torch.zeros_like(per_token)).sum()

    token_denom = _denominator(num_tokens, input_count, logprobs)
    if algorithm == "dr_grpo" and dr_grpo_loss_agg_mode == "token_sum_norm":
        per_sample = segment_sum(input_mask.to(logprobs.dtype), segments)
        n = _denominator(num_samples, (per_sample > 0).sum(), logprobs)
        length = _denominator(
            max_len, per_sample.max() if per_sample.numel() else per_sample.new_zeros(()), logprobs
        )
        loss = masked_sum / (n * length)
    else:
        loss = masked_sum / token_denom
    if entropy_coef > 0:
        loss = loss - entropy_coef * _masked_mean(entropy, mask, token_denom)

    with torch.no_grad():
        metrics = _metrics(
            loss=loss,
            logprobs=logprobs,
            ref=ref,
            rollout_logprobs=rollout_logprobs,
            entropy=entropy,
            adv=adv,
            mask=mask,
            input_count=input_count,
            segments=segments,
            algorithm=algorithm,
            use_ppo_clip=use_ppo_clip,
            clip_low=clip_low,
            clip_high=clip_high,
            clip_ratio_c=clip_ratio_c,
            before_dual=before_dual,
            tis=tis,
            tis_mode=tis_mode,
            seq_is_masking=seq_is_masking,
            kl_penalty_tau=kl_penalty_tau,
            kl_estimator=kl_estimator,
            entropy_coef=entropy_coef,
        )
    return loss, metrics


def _denominator(given: Number | None, local: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    value = local if given is None else torch.as_tensor(given)
    return value.to(device=like.device, dtype=like.dtype).clamp_min(1)


def _metrics(
    *,
    loss: torch.Tensor,
    logprobs: torch.Tensor,
    ref: torch.Tensor | None,
    rollout_logprobs: torch.Tensor | None,
    entropy: torch.Tensor | None,
    adv: torch.Tensor,
    mask: torch.Tensor,
    input_count: torch.Tensor,
    segments: Segments,
    algorithm: str,
    use_ppo_clip: bool,
    clip_low: float,
    clip_high: float,
    clip_ratio_c: float | None,
    before_dual: torch.Tensor,
    tis: torch.Tensor | None,
    tis_mode: str,
    seq_is_masking: bool,
    kl_penalty_tau: float,
    kl_estimator: str,
    entropy_coef: float,
) -> dict[str, torch.Tensor]:
    """Detached metrics; every mean is token-weighted over the final mask (weight ``num_tokens``)."""
    f32 = torch.float32
    count = mask.sum().to(f32)
    denom = count.clamp_min(1)

    def mean(x: torch.Tensor) -> torch.Tensor:
        return _masked_mean(x.detach().to(f32), mask, denom)

    out = {"loss": loss.detach().to(f32), "num_tokens": count}
    if entropy is not None:
        out["entropy"] = mean(entropy)
        if entropy_coef > 0:
            out["entropy_bonus"] = entropy_coef * out["entropy"]
    if rollout_logprobs is not None:
        d = (logprobs.detach() - rollout_logprobs).clamp(-20.0, 20.0)
        out["kl_divergence_inference"] = mean(torch.expm1(d) - d)
    if ref is not None and (use_ppo_clip or algorithm in ("cispo", "gspo")):
        delta = (logprobs.detach() - ref).clamp(-20.0, 20.0)
        a = adv
        if algorithm == "gspo":
            delta = segment_mean(delta, mask, segments)[0].clamp(max=10.0)
            a = segment_mean(adv, mask, segments)[0]
        ratio = delta.exp()
        low, high = ratio < 1.0 - clip_low, ratio > 1.0 + clip_high
        if algorithm != "cispo":  # for a clipped surrogate, the clip only binds on one side of A
            low, high = low & (a < 0), high & (a > 0)
        out["clip_low_frac"] = mean(low)
        out["clip_high_frac"] = mean(high)
    if clip_ratio_c is not None:
        out["dual_clip_frac"] = mean(clip_ratio_c * adv.abs() < before_dual)
    if tis is not None:
        out["tis_mean"] = mean(tis)
        if tis_mode == "icepop":
            out["tis_zero_frac"] = mean(tis == 0)
    if kl_penalty_tau > 0:
        out["kl_penalty"] = mean(kl_penalty(logprobs.detach(), rollout_logprobs, estimator=kl_estimator))
    if seq_is_masking:
        out["seq_is_masked_frac"] = 1.0 - count / input_count.to(f32).clamp_min(1)
    return out
