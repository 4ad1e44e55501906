"""Log-probabilities of the taken tokens and full-vocabulary entropy, from logits at a temperature.

Shift convention (used by every tensor in this package): all per-token tensors are **aligned with
``input_ids``**. ``logprobs[b, t] = log π(input_ids[b, t] | input_ids[b, :t])``, computed from
``logits[b, t-1] / temperature``; ``entropy[b, t]`` is the entropy of that same distribution. Column 0
has no prediction and holds 0. In a packed row the value at the first token of a sample is computed
from the previous sample's last logit: it is meaningless, and :func:`telescope_algos.compute_loss`
masks the first token of every sample for that reason. This is the common "after shift" layout
(``logits[:, :-1]`` against ``input_ids[:, 1:]``) shifted back by one, so that ``loss_mask``,
``advantages`` and ``rollout_logprobs`` share the index of the token they describe.

Memory: the work runs over chunks of ``chunk_size`` positions in a custom autograd function that
saves only the log-normaliser and the entropy per position and recomputes the softmax in backward,
so the peak beyond the logits and their gradient is about ``chunk_size × vocab`` floats instead of
several ``tokens × vocab`` tensors (log_softmax output, its exp, their product, and their grads).
"""

from __future__ import annotations

from typing import Any, cast

import torch
from torch.autograd.function import once_differentiable


def _check_temperature(temperature: float) -> None:
    if not temperature > 0:
        raise ValueError(
            f"temperature must be > 0 to scale logits, got {temperature}; greedy decoding (temperature 0) "
            "has no log-probabilities to train on"
        )


class _ChunkedLogprobEntropy(torch.autograd.Function):
    """Per row i of ``logits [N, V]``: ``log softmax(z_i)[label_i]`` and ``H(softmax(z_i))``; z = logits/T.

    Gradients, with p = softmax(z), log p = z − lse: d log p_y / dz = onehot(y) − p and
    dH/dz = −p · (log p + H); both are multiplied by 1/T for the logits.
    """

    @staticmethod
    def forward(
        ctx: Any, logits: torch.Tensor, labels: torch.Tensor, temperature: float, chunk: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        n = logits.shape[0]
        dtype = torch.promote_types(logits.dtype, torch.float32)
        logprobs = torch.empty(n, dtype=dtype, device=logits.device)
        entropy = torch.empty_like(logprobs)
        lse = torch.empty_like(logprobs)
        for s in range(0, n, chunk):
            e = min(s + chunk, n)
            logp = logits[s:e].to(dtype) / temperature  # a fresh chunk x vocab buffer
            lse[s:e] = torch.logsumexp(logp, dim=-1)
            logp.sub_(lse[s:e, None])
            logprobs[s:e] = logp.gather(1, labels[s:e, None]).squeeze(1)
            entropy[s:e] = -(logp.exp() * logp).sum(dim=-1)
        ctx.save_for_backward(logits, labels, lse, entropy)
        ctx.temperature = temperature
        ctx.chunk = chunk
        ctx.set_materialize_grads(False)
        return logprobs, entropy

    @staticmethod
    @once_differentiable
    def backward(  # pyright: ignore[reportIncompatibleMethodOverride] (once_differentiable's typing)
        ctx: Any, grad_logprobs: torch.Tensor | None, grad_entropy: torch.Tensor | None
    ) -> tuple[torch.Tensor | None, None, None, None]:
        if grad_logprobs is None and grad_entropy is None:
            return None, None, None, None
        logits, labels, lse, entropy = ctx.saved_tensors
        temperature, chunk = ctx.temperature, ctx.chunk
        n = logits.shape[0]
        grad_logits = torch.empty_like(logits)
        for s in range(0, n, chunk):
            e = min(s + chunk, n)
            logp = logits[s:e].to(lse.dtype) / temperature
            logp.sub_(lse[s:e, None])
            g_lp = None if grad_logprobs is None else grad_logprobs[s:e, None]
            g_ent = None if grad_entropy is None else grad_entropy[s:e, None]
            g = _chunk_grad(logp, entropy[s:e, None], g_lp, g_ent)
            if g_lp is not None:
                g.scatter_add_(1, labels[s:e, None], g_lp)
            grad_logits[s:e] = g.div_(temperature)
        return grad_logits, None, None, None


def _chunk_grad(
    logp: torch.Tensor, entropy: torch.Tensor, g_lp: torch.Tensor | None, g_ent: torch.Tensor | None
) -> torch.Tensor:
    """``−p·(g_lp + g_ent·(log p + H))`` for one chunk (the one-hot part of d log p_y is the caller's),
    computed in ``logp``'s buffer when the entropy has a gradient."""
    p = logp.exp()
    if g_ent is None:
        assert g_lp is not None  # backward returns early without either gradient
        return p.mul_(-g_lp)
    # dH/dz = -p (log p + H), plus -p * g_lp from the log-probability: one buffer, reused.
    g = logp.add_(entropy).mul_(-g_ent)
    if g_lp is not None:
        g.sub_(g_lp)
    return g.mul_(p)


def _check_shapes(logits: torch.Tensor, ids: torch.Tensor, name: str) -> None:
    if logits.dim() != 3 or ids.shape != logits.shape[:2]:
        raise ValueError(
            f"expected logits [batch, seq, vocab] and {name} [batch, seq], got {tuple(logits.shape)} "
            f"and {tuple(ids.shape)}"
        )


def next_token_labels(input_ids: torch.Tensor) -> torch.Tensor:
    """``labels[:, t] = input_ids[:, t + 1]``; the last column (nothing follows) is 0."""
    labels = torch.zeros_like(input_ids)
    labels[:, :-1] = input_ids[:, 1:]
    return labels


def align_to_inputs(values: torch.Tensor) -> torch.Tensor:
    """Per-position values ``[batch, seq]`` (value t from logits t) → the aligned layout of this
    package (value t from logits t−1; column 0 is 0)."""
    return torch.cat([values.new_zeros(values.shape[0], 1), values[:, :-1]], dim=1)


def label_logprobs_and_entropy(
    logits: torch.Tensor, labels: torch.Tensor, *, temperature: float = 1.0, chunk_size: int = 1024
) -> tuple[torch.Tensor, torch.Tensor]:
    """``log softmax(logits[b, t] / T)[labels[b, t]]`` and that distribution's entropy, **unshifted**.

    The building block of :func:`token_logprobs_and_entropy` for callers that hold only some positions
    of a row (context parallelism): pass ``next_token_labels(input_ids)`` at the same positions, and
    :func:`align_to_inputs` the full row afterwards.

    Args:
        logits: ``[batch, seq, vocab]``. labels: ``[batch, seq]`` long.
        temperature, chunk_size: as in :func:`token_logprobs_and_entropy`.

    Returns:
        ``(logprobs, entropy)``, both ``[batch, seq]`` float32 (float64 for float64 logits).
    """
    _check_temperature(temperature)
    _check_shapes(logits, labels, "labels")
    b, t, v = logits.shape
    chunk = chunk_size if chunk_size > 0 else max(b * t, 1)
    flat = logits.reshape(b * t, v)  # a view for contiguous logits: no copy
    lp, ent = cast(
        tuple[torch.Tensor, torch.Tensor],
        _ChunkedLogprobEntropy.apply(  # pyright: ignore[reportUnknownMemberType] (apply is untyped)
            flat, labels.reshape(-1), float(temperature), chunk
        ),
    )
    return lp.view(b, t), ent.view(b, t)


def token_logprobs_and_entropy(
    logits: torch.Tensor, input_ids: torch.Tensor, *, temperature: float = 1.0, chunk_size: int = 1024
) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probabilities of the taken tokens and the full-vocabulary entropy, both differentiable.

    Args:
        logits: ``[batch, seq, vocab]`` model output (computed in float32, or float64 for float64 input).
        input_ids: ``[batch, seq]`` long, the tokens the logits were computed on.
        temperature: > 0; the logits are divided by it (the sampling temperature of the rollouts).
        chunk_size: positions per chunk (config ``entropy_chunk_size``); ≤ 0 processes everything at once.

    Returns:
        ``(logprobs, entropy)``, both ``[batch, seq]`` float32 (float64 for float64 logits), aligned with
        ``input_ids`` (column 0 is 0; see the module docstring). Backpropagate through either or both.
    """
    _check_shapes(logits, input_ids, "input_ids")
    # Position t predicts input_ids[t+1]; the last position has no label (its outputs are dropped).
    lp, ent = label_logprobs_and_entropy(
        logits, next_token_labels(input_ids), temperature=temperature, chunk_size=chunk_size
    )
    return align_to_inputs(lp), align_to_inputs(ent)


def token_logprobs(
    logits: torch.Tensor, input_ids: torch.Tensor, *, temperature: float = 1.0, chunk_size: int = 1024
) -> torch.Tensor:
    """``[batch, seq]`` log-probabilities of the taken tokens; see :func:`token_logprobs_and_entropy`."""
    return token_logprobs_and_entropy(logits, input_ids, temperature=temperature, chunk_size=chunk_size)[0]
