"""Token log-probabilities and entropy from logits whose vocabulary is split over TP ranks.

Megatron's output layer leaves each tensor-parallel rank with a slice of the vocabulary. The
log-normaliser, the label's logit and the entropy need the whole row, so each is a local sum
followed by an all-reduce over the TP group (a max for numerical stability first). The backward
needs no communication: every rank holds the (replicated) loss, and the gradient for its logits
slice is the slice of the full gradient — exactly as ``vocab_parallel_cross_entropy`` does.

Rows of the padded vocabulary (ids ≥ ``vocab_size``) exist only to make the split even; they are
masked to −∞ so the distribution is the Hugging Face model's over the real vocabulary.

The result is unshifted (value t from logits t), like ``telescope_algos.label_logprobs_and_entropy``,
which it equals with TP = 1; ``telescope_algos.align_to_inputs`` turns a whole row into the
``input_ids``-aligned layout of :mod:`telescope_algos`.
"""

from __future__ import annotations

from typing import Any, cast

import torch
import torch.distributed as dist
from torch.autograd.function import once_differentiable

__all__ = ["vocab_parallel_label_logprobs_and_entropy"]


def _all_reduce(
    t: torch.Tensor, op: dist.ReduceOp.RedOpType, group: dist.ProcessGroup | None
) -> torch.Tensor:
    if group is not None and dist.get_world_size(group) > 1:
        dist.all_reduce(t, op=op, group=group)  # pyright: ignore[reportUnknownMemberType] (untyped tensor)
    return t


class _VocabParallelLogprobEntropy(torch.autograd.Function):
    """Rows ``[N, V_local]`` → (log p of the global label, entropy), both ``[N]`` float32."""

    @staticmethod
    def forward(
        ctx: Any,
        logits: torch.Tensor,
        labels: torch.Tensor,
        temperature: float,
        vocab_start: int,
        vocab_size: int,
        group: dist.ProcessGroup | None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        z = logits.float() / temperature
        v_local = z.shape[-1]
        cols = torch.arange(vocab_start, vocab_start + v_local, device=z.device)
        z = z.masked_fill(cols >= vocab_size, float("-inf"))
        zmax = _all_reduce(z.max(dim=-1).values, dist.ReduceOp.MAX, group)
        shifted = z - zmax[:, None]
        e = shifted.exp()
        sums = torch.stack([e.sum(-1), (e * shifted.nan_to_num(neginf=0.0)).sum(-1)])
        _all_reduce(sums, dist.ReduceOp.SUM, group)
        lse = zmax + sums[0].log()
        entropy = sums[0].log() - sums[1] / sums[0]  # H = log S - E[z - max]
        local = labels - vocab_start
        inside = (local >= 0) & (local < v_local)
        picked = z.gather(1, local.clamp(0, v_local - 1)[:, None]).squeeze(1)
        label_logit = _all_reduce(torch.where(inside, picked, 0.0), dist.ReduceOp.SUM, group)
        logprobs = label_logit - lse
        ctx.save_for_backward(logits, local, inside, lse, entropy)
        ctx.temperature, ctx.vocab_start, ctx.vocab_size = temperature, vocab_start, vocab_size
        ctx.set_materialize_grads(False)
        return logprobs, entropy

    @staticmethod
    @once_differentiable
    def backward(  # pyright: ignore[reportIncompatibleMethodOverride] (once_differentiable's typing)
        ctx: Any, grad_logprobs: torch.Tensor | None, grad_entropy: torch.Tensor | None
    ) -> tuple[torch.Tensor, None, None, None, None, None]:
        logits, local, inside, lse, entropy = ctx.saved_tensors
        z = logits.float() / ctx.temperature
        cols = torch.arange(ctx.vocab_start, ctx.vocab_start + z.shape[-1], device=z.device)
        logp = (z - lse[:, None]).masked_fill(cols >= ctx.vocab_size, float("-inf"))
        p = logp.exp()
        grad = torch.zeros_like(z)
        if grad_entropy is not None:  # dH/dz = -p (log p + H)
            grad -= p * (logp.nan_to_num(neginf=0.0) + entropy[:, None]) * grad_entropy[:, None]
        if grad_logprobs is not None:  # d log p_y / dz = onehot(y) - p
            grad -= p * grad_logprobs[:, None]
            rows = torch.nonzero(inside).squeeze(1)
            grad[rows, local[rows]] += grad_logprobs[rows]
        grad /= ctx.temperature
        return grad.to(logits.dtype), None, None, None, None, None


def vocab_parallel_label_logprobs_and_entropy(
    logits: torch.Tensor,
    labels: torch.Tensor,
    *,
    vocab_size: int,
    temperature: float = 1.0,
    group: dist.ProcessGroup | None = None,
    chunk_size: int = 1024,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Unshifted ``[batch, seq]`` log p(``labels[t]`` | logits t) and the entropy of logits t.

    Under context parallelism a rank's logits are not contiguous, so the caller passes each
    position's next-token label itself (``telescope_algos.next_token_labels`` of the whole row, at
    this rank's positions) and aligns the gathered row afterwards (``telescope_algos.align_to_inputs``).

    Args:
        logits: ``[batch, seq, V / TP]``, this rank's vocabulary slice (rank r holds ids
            ``r·V/TP … (r+1)·V/TP − 1`` of the padded vocabulary).
        labels: ``[batch, seq]`` global token ids, the label of each position.
        vocab_size: the real vocabulary size; padded ids above it are excluded.
        temperature: > 0, the sampling temperature the logits are divided by.
        group: the tensor-parallel process group (None: no split).
        chunk_size: positions per chunk (bounds the float32 ``chunk × V/TP`` work buffers); ≤ 0: all.
    """
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    b, t, v_local = logits.shape
    if tuple(labels.shape) != (b, t):
        raise ValueError(f"labels have shape {tuple(labels.shape)}, expected {(b, t)} like the logits")
    rank = dist.get_rank(group) if group is not None and dist.get_world_size(group) > 1 else 0
    flat, flat_labels = logits.reshape(b * t, v_local), labels.reshape(-1)
    chunk = chunk_size if chunk_size > 0 else max(b * t, 1)
    lps: list[torch.Tensor] = []
    ents: list[torch.Tensor] = []
    for s in range(0, b * t, chunk):
        lp, ent = cast(
            tuple[torch.Tensor, torch.Tensor],
            _VocabParallelLogprobEntropy.apply(  # pyright: ignore[reportUnknownMemberType] (apply is untyped)
                flat[s : s + chunk],
                flat_labels[s : s + chunk],
                float(temperature),
                rank * v_local,
                vocab_size,
                group,
            ),
        )
        lps.append(lp)
        ents.append(ent)
    return torch.cat(lps).view(b, t), torch.cat(ents).view(b, t)
