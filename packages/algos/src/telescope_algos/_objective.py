"""``compute_loss``: one micro-batch's policy loss and its metrics, for every algorithm and modifier.

Three steps, each a short function: **validate** the inputs against the :class:`LossOptions`;
the **per-token loss**: sequence IS masking, then the algorithm's policy term (looked up in
:data:`POLICY_TERMS`; ``opd`` first turns the advantages into per-token ones with the teacher's
logprobs, :func:`~telescope_algos.distill_advantages`), then dual clip, TIS and the KL penalties (to
the rollout policy and to the frozen reference model); **aggregate** it into one number
(``token_mean``, or Dr. GRPO's ``token_sum_norm``) and subtract the entropy bonus. The formulas
and their order: docs/algorithms.md#the-loss-of-one-micro-batch.

**Normalisation.** The caller passes the denominator: ``num_tokens`` = loss tokens of the whole
optimizer step (every micro-batch, every rank), so that summing the micro-batch losses (DDP/FSDP:
summing gradients over ranks, i.e. multiply by the world size if the backend averages) gives the
true token mean of the step, whatever the packing and however many dummy micro-batches were added.
``None`` uses the local count, which is the plain mean of a single micro-batch
(docs/algorithms.md#normalisation).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal, NamedTuple

import torch

from telescope_algos import _policy_terms as terms
from telescope_algos._advantages import ALGORITHMS, Algorithm, distill_advantages
from telescope_algos._modifiers import KL_ESTIMATORS, dual_clip, kl_penalty, seq_is_mask, tis_weights
from telescope_algos._policy_terms import PolicyInputs
from telescope_algos._segments import find_segments, segment_mean, segment_sum

Number = float | int | torch.Tensor
_REINFORCE = ("grpo", "rloo", "reinforce_pp", "dr_grpo", "opd")
_NEEDS_REF = ("cispo", "gspo", "sapo")
_AGG_MODES = ("token_mean", "token_sum_norm")
_LOG_RATIO_CLAMP = 20.0
_GSPO_LOG_RATIO_MAX = 10.0


@dataclass(frozen=True)
class LossOptions:
    """Every setting of :func:`compute_loss` that is not data: the config fields of the same names.

    Build it from a run config with :func:`telescope_algos.backend.loss_options`; the defaults are the
    config's. ``algorithm`` picks the policy term (:data:`POLICY_TERMS`): grpo, rloo, reinforce_pp and
    dr_grpo (and opd, on its per-token advantages) use REINFORCE (PPO's clipped surrogate with
    ``use_ppo_clip``), cispo, gspo and sapo their own. ``clip_low``/``clip_high`` bound the ratio of
    PPO clip, CISPO and GSPO; ``clip_ratio_c`` (None: off) is dual clip; ``use_tis``/``tis_*``
    truncated importance sampling; ``seq_is_*`` sequence-level IS masking;
    ``kl_penalty_tau``/``kl_estimator`` the KL penalty to the rollout policy; ``entropy_coef`` the
    entropy bonus; ``sapo_tau_*`` SAPO's gate temperatures; ``dr_grpo_loss_agg_mode`` dr_grpo's
    aggregation; ``distill_coef``/``distill_reward_weight`` the weights of opd's teacher term and of
    the environment's advantage; ``ref_kl_coef``/``ref_kl_estimator`` the KL penalty to the frozen
    reference model. See docs/algorithms.md.
    """

    algorithm: Algorithm | str = "grpo"
    use_ppo_clip: bool = False
    clip_low: float = 0.4
    clip_high: float = 0.5
    clip_ratio_c: float | None = None
    use_tis: bool = False
    tis_cap: float = 2.0
    tis_mode: Literal["truncate", "icepop"] | str = "truncate"
    tis_floor: float = 0.0
    tis_logprob_clamp: float = 20.0
    seq_is_masking: bool = False
    seq_is_mask_low: float = 0.8
    seq_is_mask_high: float = 1.2
    kl_penalty_tau: float = 0.0
    kl_estimator: Literal["k2", "k3"] | str = "k2"
    ref_kl_coef: float = 0.0
    ref_kl_estimator: Literal["k2", "k3"] | str = "k3"
    distill_coef: float = 1.0
    distill_reward_weight: float = 0.0
    entropy_coef: float = 0.0
    sapo_tau_pos: float = 1.0
    sapo_tau_neg: float = 1.05
    dr_grpo_loss_agg_mode: Literal["token_mean", "token_sum_norm"] | str = "token_mean"


PolicyTerm = Callable[[PolicyInputs, LossOptions], torch.Tensor]


def _reinforce_term(x: PolicyInputs, o: LossOptions) -> torch.Tensor:
    if o.use_ppo_clip:
        return terms.ppo_clip_policy_loss(x, clip_low=o.clip_low, clip_high=o.clip_high)
    return terms.reinforce_policy_loss(x)


POLICY_TERMS: Mapping[str, PolicyTerm] = {
    **dict.fromkeys(_REINFORCE, _reinforce_term),
    "cispo": lambda x, o: terms.cispo_policy_loss(x, clip_low=o.clip_low, clip_high=o.clip_high),
    "gspo": lambda x, o: terms.gspo_policy_loss(x, clip_low=o.clip_low, clip_high=o.clip_high),
    "sapo": lambda x, o: terms.sapo_policy_loss(x, tau_pos=o.sapo_tau_pos, tau_neg=o.sapo_tau_neg),
}
"""The per-token policy term of every algorithm (``_policy_terms``), given the options."""


@dataclass(frozen=True)
class LossInputs:
    """The data of one micro-batch. Per-token tensors are ``[rows, seq]``, aligned with ``input_ids``.

    Padded layout: one sample per row, nothing else to pass. Packed: several samples per row, their
    boundaries from ``position_ids`` (restarting at 0 per sample) or ``segment_ids`` (a new sample
    where the id changes). Both layouts give the same loss and gradients. The first token of every
    sample is never a loss token (nothing predicts it), whatever ``loss_mask`` says.

    Attributes:
        logprobs: ℓ, the current policy's log-probabilities of the taken tokens, with gradient.
        advantages: ``[rows]`` (padded layout: one per row) or ``[rows, seq]`` (broadcast per token).
        loss_mask: bool or 0/1; True on tokens the model generated.
        rollout_logprobs: ℓ^roll from the inference engine; needed by TIS, the KL penalty, sequence IS
            masking and the ``kl_divergence_inference`` metric, and the ratio denominator when
            ``old_logprobs`` is None (``ppo_clip_ref_logprobs: rollout``).
        old_logprobs: the pre-update policy recomputed by the trainer (``ppo_clip_ref_logprobs: batch``).
        entropy: per-token entropy (``token_logprobs_and_entropy``); needed by ``entropy_coef > 0``
            (then with gradient) and for the ``entropy`` metric.
        teacher_logprobs: ℓ^T, a teacher model's logprob of each taken token; needed by ``opd``.
        ref_logprobs: ℓ^ref, the frozen reference model's; needed by ``ref_kl_coef > 0``.
        position_ids, segment_ids: the packed layout (at most one of them).
        num_tokens: denominator of ``token_mean`` and of the entropy bonus: the loss-token count of the
            whole step (``step_counts``: every micro-batch, every rank); clamped to ≥ 1. None: the
            local count of ``loss_mask`` (before sequence IS masking, which therefore removes samples
            without re-weighting the others).
        num_samples, max_len: dr_grpo's ``token_sum_norm`` divides the masked sum by
            ``num_samples · max_len`` (a constant per-sample length, arXiv:2503.20783 section 3.2): the
            step's sample count and the generation budget (``max_tokens``). None: the local number of
            samples with a loss token, and the local longest sample's loss-token count.
    """

    logprobs: torch.Tensor
    advantages: torch.Tensor
    loss_mask: torch.Tensor
    rollout_logprobs: torch.Tensor | None = None
    old_logprobs: torch.Tensor | None = None
    entropy: torch.Tensor | None = None
    teacher_logprobs: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    position_ids: torch.Tensor | None = None
    segment_ids: torch.Tensor | None = None
    num_tokens: Number | None = None
    num_samples: Number | None = None
    max_len: Number | None = None


@dataclass(frozen=True)
class _Batch(PolicyInputs):
    """A validated micro-batch: the policy term's inputs (``mask`` after sequence IS masking), the
    data, and the loss tokens before sequence IS masking."""

    data: LossInputs
    input_mask: torch.Tensor


class _PerToken(NamedTuple):
    loss: torch.Tensor
    before_dual: torch.Tensor
    tis: torch.Tensor | None


def compute_loss(inputs: LossInputs, options: LossOptions) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Policy loss of one micro-batch (to minimise) and its detached metrics.

    Returns:
        ``(loss, metrics)``. ``loss`` is a 0-dim tensor. ``metrics`` maps names to detached 0-dim float32
        tensors: ``loss``, ``num_tokens`` (local loss tokens after sequence IS masking: the weight of
        every mean below), and token-weighted means over those tokens: ``entropy`` (if given),
        ``kl_divergence_inference`` (k3 form ``e^δ − 1 − δ`` of δ^roll, if rollout logprobs are given),
        ``clip_low_frac`` / ``clip_high_frac`` (PPO clip, CISPO, GSPO: ratio clipped at the lower / upper
        bound where it changed the loss, for CISPO where it changed the weight), ``dual_clip_frac``,
        ``tis_mean``, ``tis_zero_frac`` (icepop), ``kl_penalty`` (without τ), ``ref_kl`` (the reference
        penalty without β), ``teacher_reverse_kl`` (mean ``ℓ^roll − ℓ^T``, the k1 estimate of
        ``KL(student ‖ teacher)`` on the sampled tokens, if teacher logprobs are given),
        ``entropy_bonus``; plus
        ``seq_is_masked_frac``, a fraction of the loss tokens *before* masking.

    Raises:
        ValueError: an unknown option, a shape that does not match ``logprobs``, or an option
            without the data it needs (e.g. ``use_tis`` without ``rollout_logprobs``).
    """
    batch = _prepare(inputs, options)
    per_token = _per_token_loss(batch, options)
    loss = _aggregate(per_token.loss, batch, options)
    with torch.no_grad():
        metrics = _metrics(loss, batch, options, per_token)
    return loss, metrics


# -- validate ----------------------------------------------------------------------------------


def _prepare(x: LossInputs, o: LossOptions) -> _Batch:
    """Check ``x`` against ``o``; resolve the sample layout and the loss tokens."""
    _check_options(o)
    lp = x.logprobs
    adv = _checked_advantages(
        lp, x.advantages, packed=x.position_ids is not None or x.segment_ids is not None
    )
    for name, t in (
        ("loss_mask", x.loss_mask),
        ("rollout_logprobs", x.rollout_logprobs),
        ("old_logprobs", x.old_logprobs),
        ("entropy", x.entropy),
        ("teacher_logprobs", x.teacher_logprobs),
        ("ref_logprobs", x.ref_logprobs),
    ):
        _check_shape(name, t, lp.shape)
    _check_requirements(o, x)
    segments = find_segments(
        lp.shape, position_ids=x.position_ids, segment_ids=x.segment_ids, device=lp.device
    )
    input_mask = x.loss_mask.bool() & ~segments.starts
    mask = input_mask
    if o.seq_is_masking:
        assert x.rollout_logprobs is not None  # _check_requirements
        low, high = o.seq_is_mask_low, o.seq_is_mask_high
        mask = seq_is_mask(lp, x.rollout_logprobs, mask, segments, low=low, high=high)
    if o.algorithm == "opd":
        assert x.teacher_logprobs is not None  # _check_requirements
        assert x.rollout_logprobs is not None
        adv = distill_advantages(
            adv,
            x.teacher_logprobs.to(lp.dtype),
            x.rollout_logprobs.to(lp.dtype),
            coef=o.distill_coef,
            reward_weight=o.distill_reward_weight,
        )
    ref = x.old_logprobs if x.old_logprobs is not None else x.rollout_logprobs
    return _Batch(lp, ref, adv, mask, segments, data=x, input_mask=input_mask)


def _check_shape(name: str, t: torch.Tensor | None, shape: torch.Size) -> None:
    if t is not None and t.shape != shape:
        raise ValueError(f"{name} has shape {tuple(t.shape)}, expected {tuple(shape)} like logprobs")


def _check_options(o: LossOptions) -> None:
    if o.algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {o.algorithm!r}; known: {', '.join(ALGORITHMS)}")
    for name, estimator in (("kl_estimator", o.kl_estimator), ("ref_kl_estimator", o.ref_kl_estimator)):
        if estimator not in KL_ESTIMATORS:
            raise ValueError(f"unknown {name} {estimator!r}; known: {', '.join(KL_ESTIMATORS)}")
    if o.dr_grpo_loss_agg_mode not in _AGG_MODES:
        raise ValueError(
            f"unknown dr_grpo_loss_agg_mode {o.dr_grpo_loss_agg_mode!r}; known: {', '.join(_AGG_MODES)}"
        )


def _checked_advantages(logprobs: torch.Tensor, advantages: torch.Tensor, *, packed: bool) -> torch.Tensor:
    """The advantages as ``[rows, seq]`` in the dtype of ``logprobs`` (per-row ones broadcast)."""
    if logprobs.dim() != 2:
        raise ValueError(f"logprobs must be [rows, seq], got shape {tuple(logprobs.shape)}")
    shape = logprobs.shape
    adv = advantages.to(logprobs.dtype)
    if adv.shape == shape[:1]:
        if packed:
            raise ValueError("per-row advantages [rows] need the padded layout; give packed rows [rows, seq]")
        adv = adv[:, None].expand(shape)
    _check_shape("advantages", adv, shape)
    return adv


def _check_requirements(o: LossOptions, x: LossInputs) -> None:
    """The data each option needs, and the options that do not combine."""
    if x.rollout_logprobs is None:
        for flag, on in (
            ("use_tis", o.use_tis),
            ("seq_is_masking", o.seq_is_masking),
            ("kl_penalty_tau", o.kl_penalty_tau > 0),
        ):
            if on:
                raise ValueError(f"{flag} compares against the rollout policy: pass rollout_logprobs")
    if (
        x.old_logprobs is None
        and x.rollout_logprobs is None
        and (o.algorithm in _NEEDS_REF or o.use_ppo_clip)
    ):
        what = "use_ppo_clip" if o.use_ppo_clip else f"algorithm={o.algorithm!r}"
        raise ValueError(f"{what} needs a ratio: pass old_logprobs or rollout_logprobs")
    if o.use_ppo_clip and o.algorithm not in _REINFORCE:
        raise ValueError(
            f"use_ppo_clip applies to {', '.join(_REINFORCE)}; {o.algorithm} has its own clipping"
        )
    if o.use_tis and o.use_ppo_clip and x.old_logprobs is None:
        raise ValueError(
            "use_tis with use_ppo_clip against rollout logprobs corrects twice; pass old_logprobs"
        )
    if o.entropy_coef > 0 and x.entropy is None:
        raise ValueError("entropy_coef > 0 needs the per-token entropy (with gradient)")
    if o.algorithm == "opd" and (x.teacher_logprobs is None or x.rollout_logprobs is None):
        raise ValueError(
            "algorithm='opd' needs teacher_logprobs and rollout_logprobs (ℓ^T − ℓ^roll per token)"
        )
    if o.ref_kl_coef > 0 and x.ref_logprobs is None:
        raise ValueError("ref_kl_coef > 0 compares against the reference model: pass ref_logprobs")


# -- per-token loss ----------------------------------------------------------------------------


def _per_token_loss(b: _Batch, o: LossOptions) -> _PerToken:
    """Policy term, then dual clip, × TIS weight, + τ · KL penalty + β · reference KL
    (docs/algorithms.md#modifiers)."""
    per_token = POLICY_TERMS[o.algorithm](b, o)
    before_dual = per_token
    if o.clip_ratio_c is not None:
        per_token = dual_clip(per_token, b.advantages, o.clip_ratio_c)
    tis = _tis(b, o)
    if tis is not None:
        per_token = per_token * tis
    if o.kl_penalty_tau > 0:
        assert b.data.rollout_logprobs is not None  # _check_requirements
        penalty = kl_penalty(b.logprobs, b.data.rollout_logprobs, estimator=o.kl_estimator)
        per_token = per_token + o.kl_penalty_tau * penalty
    if o.ref_kl_coef > 0:
        assert b.data.ref_logprobs is not None  # _check_requirements
        penalty = kl_penalty(b.logprobs, b.data.ref_logprobs, estimator=o.ref_kl_estimator)
        per_token = per_token + o.ref_kl_coef * penalty
    return _PerToken(per_token, before_dual, tis)


def _tis(b: _Batch, o: LossOptions) -> torch.Tensor | None:
    """The TIS weight of each token (``use_tis``), else None."""
    if not o.use_tis:
        return None
    assert b.data.rollout_logprobs is not None  # _check_requirements
    return tis_weights(
        b.logprobs,
        b.data.rollout_logprobs,
        mode=o.tis_mode,
        cap=o.tis_cap,
        floor=o.tis_floor,
        logprob_clamp=o.tis_logprob_clamp,
    )


# -- aggregate ---------------------------------------------------------------------------------


def _masked_mean(x: torch.Tensor, mask: torch.Tensor, count: torch.Tensor) -> torch.Tensor:
    return torch.where(mask, x, torch.zeros_like(x)).sum() / count


def _denominator(given: Number | None, local: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    value = local if given is None else torch.as_tensor(given)
    return value.to(device=like.device, dtype=like.dtype).clamp_min(1)


def _sum_norm_denominator(b: _Batch) -> torch.Tensor:
    """Dr. GRPO's ``num_samples · max_len`` (local defaults: samples with a loss token, longest one)."""
    per_sample = segment_sum(b.input_mask.to(b.logprobs.dtype), b.segments)
    n = _denominator(b.data.num_samples, (per_sample > 0).sum(), b.logprobs)
    longest = per_sample.max() if per_sample.numel() else per_sample.new_zeros(())
    return n * _denominator(b.data.max_len, longest, b.logprobs)


def _aggregate(per_token: torch.Tensor, b: _Batch, o: LossOptions) -> torch.Tensor:
    """The masked sum over the step's denominator, minus the entropy bonus.

    docs/algorithms.md#normalisation.
    """
    masked_sum = torch.where(b.mask, per_token, torch.zeros_like(per_token)).sum()
    token_denom = _denominator(b.data.num_tokens, b.input_mask.sum(), b.logprobs)
    if o.algorithm == "dr_grpo" and o.dr_grpo_loss_agg_mode == "token_sum_norm":
        loss = masked_sum / _sum_norm_denominator(b)
    else:
        loss = masked_sum / token_denom
    if o.entropy_coef > 0:
        assert b.data.entropy is not None  # _check_requirements
        loss = loss - o.entropy_coef * _masked_mean(b.data.entropy, b.mask, token_denom)
    return loss


# -- metrics -----------------------------------------------------------------------------------


def _metrics(loss: torch.Tensor, b: _Batch, o: LossOptions, per_token: _PerToken) -> dict[str, torch.Tensor]:
    """Detached metrics; every mean is token-weighted over the final mask (weight ``num_tokens``)."""
    f32 = torch.float32
    count = b.mask.sum().to(f32)
    denom = count.clamp_min(1)

    def mean(x: torch.Tensor) -> torch.Tensor:
        return _masked_mean(x.detach().to(f32), b.mask, denom)

    out = {"loss": loss.detach().to(f32), "num_tokens": count}
    if b.data.entropy is not None:
        out["entropy"] = mean(b.data.entropy)
        if o.entropy_coef > 0:
            out["entropy_bonus"] = o.entropy_coef * out["entropy"]
    if b.data.rollout_logprobs is not None:
        d = (b.logprobs.detach() - b.data.rollout_logprobs).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
        out["kl_divergence_inference"] = mean(torch.expm1(d) - d)
        if b.data.teacher_logprobs is not None:
            out["teacher_reverse_kl"] = mean(b.data.rollout_logprobs - b.data.teacher_logprobs)
    if b.ref_logprobs is not None and (o.use_ppo_clip or o.algorithm in ("cispo", "gspo")):
        low, high = _clipped(b, o)
        out["clip_low_frac"], out["clip_high_frac"] = mean(low), mean(high)
    out.update(_modifier_metrics(b, o, per_token, mean))
    if o.seq_is_masking:
        out["seq_is_masked_frac"] = 1.0 - count / b.input_mask.sum().to(f32).clamp_min(1)
    return out


TOKEN_FIELDS = ("trainer_logprob", "advantage", "loss_mask", "is_weight", "clipped")
"""What :func:`loss_tokens` gives for each token."""


def loss_tokens(inputs: LossInputs, options: LossOptions) -> dict[str, torch.Tensor]:
    """What :func:`compute_loss` did with each token, as float32 ``[rows, seq]`` tensors (no gradient),
    for the run record's token table (docs/records.md, "tokens"): ``trainer_logprob`` (the logprob it
    trained with; NaN for the first token of each sample, which nothing predicts), ``advantage`` (per
    token: after ``opd``'s teacher term), ``loss_mask`` (1 where the token counted, after sequence IS
    masking), ``is_weight`` (its TIS weight; 1 without TIS and outside the loss) and
    ``clipped`` (−1 where the ratio was clipped at the lower bound, +1 at the upper, else 0; as
    ``clip_low_frac`` / ``clip_high_frac`` count them)."""
    with torch.no_grad():
        b = _prepare(inputs, options)
        f32 = torch.float32
        tis = _tis(b, options)
        clipped = torch.zeros_like(b.logprobs, dtype=f32)
        if b.ref_logprobs is not None and (options.use_ppo_clip or options.algorithm in ("cispo", "gspo")):
            low, high = _clipped(b, options)
            clipped = torch.where(b.mask, high.to(f32) - low.to(f32), 0.0)  # as the metrics count them
        if tis is not None:
            tis = torch.where(b.mask, tis.to(f32), 1.0)  # a token out of the loss is weighed by nothing
        # nothing predicts the first token of a sample: its "logprob" is left out
        trainer = torch.where(b.segments.starts, torch.nan, b.logprobs.detach().to(f32))
        return {
            "trainer_logprob": trainer,
            "advantage": b.advantages.detach().to(f32),
            "loss_mask": b.mask.to(f32),
            "is_weight": tis.to(f32) if tis is not None else torch.ones_like(b.logprobs, dtype=f32),
            "clipped": clipped,
        }


def _clipped(b: _Batch, o: LossOptions) -> tuple[torch.Tensor, torch.Tensor]:
    """Where the ratio was clipped at the lower / upper bound (bool ``[rows, seq]``)."""
    assert b.ref_logprobs is not None  # _metrics
    delta = (b.logprobs.detach() - b.ref_logprobs).clamp(-_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    a = b.advantages
    if o.algorithm == "gspo":
        delta = segment_mean(delta, b.mask, b.segments)[0].clamp(max=_GSPO_LOG_RATIO_MAX)
        a = segment_mean(a, b.mask, b.segments)[0]
    ratio = delta.exp()
    low, high = ratio < 1.0 - o.clip_low, ratio > 1.0 + o.clip_high
    if o.algorithm != "cispo":  # for a clipped surrogate, the clip only binds on one side of A
        low, high = low & (a < 0), high & (a > 0)
    return low, high


def _modifier_metrics(
    b: _Batch, o: LossOptions, per_token: _PerToken, mean: Callable[[torch.Tensor], torch.Tensor]
) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    if o.clip_ratio_c is not None:
        out["dual_clip_frac"] = mean(o.clip_ratio_c * b.advantages.abs() < per_token.before_dual)
    if per_token.tis is not None:
        out["tis_mean"] = mean(per_token.tis)
        if o.tis_mode == "icepop":
            out["tis_zero_frac"] = mean(per_token.tis == 0)
    if o.kl_penalty_tau > 0:
        assert b.data.rollout_logprobs is not None  # _check_requirements
        out["kl_penalty"] = mean(
            kl_penalty(b.logprobs.detach(), b.data.rollout_logprobs, estimator=o.kl_estimator)
        )
    if b.data.ref_logprobs is not None:
        estimator = o.ref_kl_estimator
        out["ref_kl"] = mean(kl_penalty(b.logprobs.detach(), b.data.ref_logprobs, estimator=estimator))
    return out
