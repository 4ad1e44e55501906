"""Reward shaping and output-quality filters, as pure functions of one sample.

The rules: docs/algorithms.md#filters-and-the-overlong-penalty.

A flagged sample stays in the batch (it takes packing space and keeps its group's advantages) but
its completion mask is zeroed, so it adds no loss; the caller counts flags for the
``filter/*_frac`` metrics. These functions only decide; they change nothing.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np

_LN_100K = 11.5  # ≈ ln(100_000): the log-probability of a uniform pick from a ~100k vocabulary
_OVERLONG_REASONS = frozenset({"length", "context_exhausted"})


def overlong_penalty(
    num_tokens: int, *, max_tokens: int, buffer_tokens: int = 256, factor: float = 1.0
) -> float:
    """Soft overlong penalty (DAPO, arXiv:2503.14476 eq. 13), added to the reward before advantages.

    With L = completion tokens (multi-turn: model tokens only), Lmax = ``max_tokens``, B = ``buffer_tokens``:
    0 while L ≤ Lmax − B, then ``−(L − (Lmax − B)) / B · factor`` (a ramp to −factor at L = Lmax), never
    positive. ``factor`` is ``overlong_penalty_factor``; 0 disables.
    """
    if buffer_tokens < 1:
        raise ValueError(f"buffer_tokens must be >= 1, got {buffer_tokens}")
    start = max_tokens - buffer_tokens
    if num_tokens <= start:
        return 0.0
    return min(-(num_tokens - start) / buffer_tokens * factor, 0.0)


def is_overlong(finish_reason: str | None) -> bool:
    """``filter_overlong``: True for a truncated completion.

    ``"length"`` (single-turn finish reason) or ``"context_exhausted"`` (multi-turn stop reason).
    """
    return finish_reason in _OVERLONG_REASONS


def is_gibberish(
    completion_ids: Sequence[int],
    rollout_logprobs: Sequence[float | None],
    *,
    token_threshold: int = 100_000,
    logprob_offset: float = 2.0,
) -> bool:
    """``filter_gibberish``: any token with id > ``token_threshold`` sampled at logprob < −11.5 − offset.

    Rare high-id BPE pieces drawn at near-uniform probability are the signature of a degenerate,
    high-entropy completion. Tokens without a logprob (missing or None) never flag.
    """
    n = min(len(completion_ids), len(rollout_logprobs))
    if n == 0:
        return False
    ids = np.asarray(completion_ids[:n], dtype=np.int64)
    lps = np.asarray([np.nan if x is None else x for x in rollout_logprobs[:n]], dtype=np.float64)
    return bool(np.any((ids > token_threshold) & (lps < -_LN_100K - logprob_offset)))


def is_repetitive(text: str, *, threshold: float = 10.0) -> bool:
    """``filter_repetition``: the last 10,000 characters compress (zlib level 1) by more than ``threshold``.

    Texts shorter than 100 characters never flag. Ratio = UTF-8 bytes / compressed bytes.
    """
    if len(text) < 100:
        return False
    tail = text[-10_000:].encode("utf-8", errors="replace")
    return len(tail) / max(len(zlib.compress(tail, level=1)), 1) > threshold
