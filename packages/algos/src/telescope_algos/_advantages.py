"""Advantage estimators: rewards of groups of completions in, one advantage per completion out.

The estimators and when each applies: docs/algorithms.md#advantages.

All functions take rewards shaped ``[num_groups, group_size]`` (one row per prompt, one column per
completion; anything ``torch.as_tensor`` accepts) and return advantages of the same shape, as a
float tensor (the rewards' float dtype, float32 for integer input). They compute in float64.

Group statistics: mean μ and *sample* standard deviation σ (ddof=1) over each row; σ is defined as 0
for a group of one (instead of NaN), which makes every estimator well defined for size-1 groups:

==============  ==========================================  =========================
estimator       formula                                     group of one
==============  ==========================================  =========================
grpo            (r − μ) / (σ + 1e-4)                        0 (r − μ = 0)
rloo            (r − μ) · n/(n−1) = r − mean(others)        0
dr_grpo         r − μ                                       0
center          r − μ                                       r (raw reward)
whiten          (A − mean) / (std + 1e-4) over the batch    0 for a batch of one
reinforce_pp    whiten(center(r))                           see center and whiten
==============  ==========================================  =========================

On-policy distillation (``opd``) takes GRPO's group advantage of the environment reward and adds a
per-token term from a teacher: :func:`distill_advantages`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal, cast

import torch

Algorithm = Literal["grpo", "rloo", "reinforce_pp", "dr_grpo", "cispo", "gspo", "sapo", "opd"]
ALGORITHMS: tuple[str, ...] = ("grpo", "rloo", "reinforce_pp", "dr_grpo", "cispo", "gspo", "sapo", "opd")
_EPS = 1e-4


def _as_groups(rewards: object) -> tuple[torch.Tensor, torch.dtype]:
    r = torch.as_tensor(rewards)
    if r.dim() != 2:
        raise ValueError(f"rewards must be shaped [num_groups, group_size], got shape {tuple(r.shape)}")
    dtype = r.dtype if r.is_floating_point() else torch.float32
    return r.to(torch.float64), dtype


def _mean_std(x: torch.Tensor, dim: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean and sample std (ddof=1) along ``dim`` (all elements when None); std = 0 for one element."""
    n = x.shape[dim] if dim is not None else x.numel()
    mean = x.mean(dim=dim, keepdim=dim is not None)
    var = (x - mean).square().sum(dim=dim, keepdim=dim is not None) / max(n - 1, 1)
    return mean, var.sqrt()


def grpo_advantages(rewards: object, *, eps: float = _EPS) -> torch.Tensor:
    """GRPO, DeepSeekMath (arXiv:2402.03300) section 4.1.2: ``A_i = (r_i − μ) / (σ + eps)``, per group."""
    r, dtype = _as_groups(rewards)
    mean, std = _mean_std(r, dim=-1)
    return ((r - mean) / (std + eps)).to(dtype)


def rloo_advantages(rewards: object) -> torch.Tensor:
    """RLOO (arXiv:2402.14740) eq. 5: ``A_i = r_i − mean_{j≠i} r_j = (r_i − μ)·n/(n−1)``; 0 when n = 1."""
    r, dtype = _as_groups(rewards)
    n = r.shape[-1]
    if n <= 1:
        return torch.zeros_like(r, dtype=dtype)
    return ((r - r.mean(dim=-1, keepdim=True)) * (n / (n - 1))).to(dtype)


def dr_grpo_advantages(rewards: object) -> torch.Tensor:
    """Dr. GRPO (arXiv:2503.20783) section 3.2: ``A_i = r_i − μ`` (no division by the group std)."""
    r, dtype = _as_groups(rewards)
    return (r - r.mean(dim=-1, keepdim=True)).to(dtype)


def center_advantages(rewards: object) -> torch.Tensor:
    """Group stage of batch normalisation: ``r_i − μ`` for groups of two or more, the raw ``r_i`` for one."""
    r, dtype = _as_groups(rewards)
    if r.shape[-1] <= 1:
        return r.to(dtype)
    return (r - r.mean(dim=-1, keepdim=True)).to(dtype)


def whiten_advantages(advantages: object, *, eps: float = _EPS) -> torch.Tensor:
    """Batch stage: ``(A − mean) / (std + eps)`` over *all* elements of the step (std with ddof=1).

    Any shape; a single element gives 0. Call it once on every sample of the training step (not per
    group, not per micro-batch).
    """
    a = torch.as_tensor(advantages)
    dtype = a.dtype if a.is_floating_point() else torch.float32
    a = a.to(torch.float64)
    if a.numel() == 0:
        return a.to(dtype)
    mean, std = _mean_std(a, dim=None)
    return ((a - mean) / (std + eps)).to(dtype)


def reinforce_pp_advantages(rewards: object, *, eps: float = _EPS) -> torch.Tensor:
    """REINFORCE++ with group baseline (arXiv:2501.03262): centre per group, then whiten over the batch."""
    return whiten_advantages(center_advantages(rewards), eps=eps)


def compute_advantages(
    rewards: object,
    *,
    algorithm: Algorithm | str = "grpo",
    advantage_norm: Literal["group", "batch"] | str = "group",
) -> torch.Tensor:
    """Advantages for every completion of a training step.

    Args:
        rewards: ``[num_groups, group_size]``, every group of the step (batch normalisation needs them all).
        algorithm: one of :data:`ALGORITHMS`. cispo, gspo, sapo and opd use GRPO's advantages (opd
            adds its per-token teacher term in the loss: :func:`distill_advantages`).
        advantage_norm: ``"group"`` or ``"batch"``. ``"batch"`` centres per group and whitens over the batch
            (:func:`reinforce_pp_advantages`); it is not defined for rloo and dr_grpo (ValueError).
            ``reinforce_pp`` always whitens over the batch, whatever this says.

    Returns:
        ``[num_groups, group_size]`` float tensor.
    """
    if batch_normalised(algorithm, advantage_norm):
        return reinforce_pp_advantages(rewards)
    if algorithm in ("rloo", "dr_grpo"):
        return rloo_advantages(rewards) if algorithm == "rloo" else dr_grpo_advantages(rewards)
    return grpo_advantages(rewards)


def batch_normalised(algorithm: str, advantage_norm: str) -> bool:
    """True when the pair normalises over the batch (centre per group here, then whiten the step's
    samples with :func:`whiten_advantages`); a pair that is not defined is a ValueError."""
    if algorithm not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {algorithm!r}; known: {', '.join(ALGORITHMS)}")
    if advantage_norm not in ("group", "batch"):
        raise ValueError(f"unknown advantage_norm {advantage_norm!r}; known: group, batch")
    if algorithm in ("rloo", "dr_grpo") and advantage_norm == "batch":
        raise ValueError(f"advantage_norm='batch' is not defined for {algorithm}; use 'group'")
    return algorithm == "reinforce_pp" or advantage_norm == "batch"


def group_advantages(
    rewards: Sequence[float],
    *,
    algorithm: Algorithm | str = "grpo",
    advantage_norm: Literal["group", "batch"] | str = "group",
) -> list[float]:
    """The per-group stage of :func:`compute_advantages` for one group, as a list (the rollout engine's
    ``advantage_fn``: it decides which groups to keep before a step is assembled).

    Batch normalisation (``advantage_norm="batch"`` or ``reinforce_pp``) is two stages: this returns
    the group stage (:func:`center_advantages`); the caller whitens the step's kept samples with
    :func:`whiten_advantages`. Every other algorithm is complete here.
    """
    row = torch.tensor([[float(r) for r in rewards]], dtype=torch.float64)
    if batch_normalised(algorithm, advantage_norm):
        out = center_advantages(row)[0]
    else:
        out = compute_advantages(row, algorithm=algorithm, advantage_norm=advantage_norm)[0]
    # one read back, not a tensor per element (torch types tolist loosely)
    return cast("list[float]", cast(Any, out).double().tolist())


def distill_advantages(
    advantages: torch.Tensor,
    teacher_logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor,
    *,
    coef: float = 1.0,
    reward_weight: float = 0.0,
) -> torch.Tensor:
    """On-policy distillation's per-token advantage: ``A_t = w · A + c · (ℓ^T_t − ℓ^roll_t)``.

    The student sampled token t with log-probability ℓ^roll_t; the teacher gives it ℓ^T_t. The
    per-token reward ``ℓ^T_t − ℓ^roll_t`` is minus the one-sample estimate of the reverse KL
    ``KL(π_student ‖ π_teacher)`` at that position, so a policy gradient on it moves the student
    toward the teacher on the student's own samples (Agarwal et al., arXiv:2306.13649; Thinking
    Machines, "On-Policy Distillation", 2025). ``A`` is the environment reward's advantage
    (weight ``w = reward_weight``, 0: distillation alone), ``c = coef``. Same shape in, same shape
    out, no gradient (all three are data). docs/algorithms.md#on-policy-distillation.
    """
    with torch.no_grad():
        return reward_weight * advantages + coef * (teacher_logprobs - rollout_logprobs)
