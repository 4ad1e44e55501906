"""Sequence packing: samples → padded micro-batches of at most ``seq_len`` tokens → balanced ranks.

The steps (docs/algorithms.md#packing):

1. Each :class:`TrainingSample` becomes one token sequence ``prompt_ids + completion_ids`` with
   ``loss_mask = 0 … 0 (prompt) + completion_mask`` and rollout logprobs ``0.0 … 0.0 (prompt) +
   rollout_logprobs`` (padded with 0.0 or cut to the completion length; None → 0.0), cut to
   ``seq_len``; teacher and reference logprobs, where a sample of the step has them, the same way.
   Its first token is never a loss token (nothing predicts it).
2. With ``share_prompts`` (a trainer whose attention honours branches), samples that begin with the
   same prompt tokens form a *family*: the first one whole (its *root*), each other one as a
   *branch*: only its tokens from the last shared one on, whose ``position_ids`` continue the
   shared prefix instead of restarting at 0 (docs/algorithms.md#shared-prompts). The shared prefix
   is computed once instead of once per sample; a family longer than ``seq_len`` is split into
   families of its own.
3. First-fit-decreasing: longest first (a family is one item), each into the first micro-batch with
   room, else a new one.
4. ``position_ids`` restart at 0 for every sample (varlen attention and the loss find the sample
   boundaries from them: a new sample starts wherever a position does not continue the one before
   it); each micro-batch is padded to a multiple of ``pad_to_multiple_of`` with
   ``pad_token_id``, mask 0, advantage 0, logprob 0 and positions restarting at 0 (a ghost segment).
   Pass ``math.lcm`` of the config's multiple and the context-parallel needs (CP for Megatron,
   2·CP for FSDP ring attention): the caller knows the config, this function does not.
5. If the count is not a multiple of ``num_ranks``, dummy micro-batches (copies of the first one
   with an all-zero mask and advantages, ``num_samples = num_tokens = 0``) are appended; then the
   micro-batches are sorted by length and dealt zig-zag (0,1,…,R−1,R−1,…,0,…) so every rank gets the
   same number and similar token totals.

Tensors are ``[1, L]`` in the layout :func:`telescope_algos.compute_loss` and the trainers consume
(aligned with ``input_ids``, see ``_tokens``).
"""

from __future__ import annotations

import array
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, cast

import numpy as np
import torch


@dataclass(frozen=True)
class TrainingSample:
    """One completion ready for training (not ``telescope_rollout.Sample``, a task to roll out).

    Attributes:
        prompt_ids: prompt tokens (never trained on).
        completion_ids: completion tokens; multi-turn: model and environment tokens interleaved.
        advantage: the sample's advantage, broadcast to its tokens.
        rollout_logprobs: the inference engine's logprob of each completion token (None entries → 0.0).
        completion_mask: 1 for model tokens, 0 for environment/template tokens and filtered samples;
            None means all 1.
        teacher_logprobs: a teacher model's logprob of each completion token (on-policy distillation).
        ref_logprobs: the frozen reference model's logprob of each completion token (reference KL).
    """

    prompt_ids: Sequence[int]
    completion_ids: Sequence[int]
    advantage: float
    rollout_logprobs: Sequence[float | None] | None = None
    completion_mask: Sequence[int] | None = None
    teacher_logprobs: Sequence[float | None] | None = None
    ref_logprobs: Sequence[float | None] | None = None


@dataclass
class MicroBatch:
    """One packed row. Tensors are ``[1, L]``; ``L`` is a multiple of ``pad_to_multiple_of``.

    Attributes:
        input_ids: long. position_ids: long, restarting at 0 per sample and for the padding.
        loss_mask: bool. advantages: float32. rollout_logprobs: float32.
        teacher_logprobs, ref_logprobs: float32, or None when no sample of the step had them.
        num_samples: real samples packed in (0 for a dummy micro-batch).
        num_tokens: loss tokens (``loss_mask.sum()``); the step total is ``LossInputs.num_tokens``.
        spans: where each sample's tokens are: ``(sample, column, position, length)``, the sample's
            index in ``pack_samples``'s list, the first column of its part of the row, the position
            in the sample of that column (0, or ``q`` for a branch), and the part's length
            (:func:`sample_tokens` reads per-token values back by sample).
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    loss_mask: torch.Tensor
    advantages: torch.Tensor
    rollout_logprobs: torch.Tensor
    num_samples: int
    num_tokens: int
    teacher_logprobs: torch.Tensor | None = None
    ref_logprobs: torch.Tensor | None = None
    spans: tuple[tuple[int, int, int, int], ...] = ()

    def __len__(self) -> int:
        return self.input_ids.shape[-1]

    def to(self, device: torch.device | str) -> MicroBatch:
        """The same micro-batch with its tensors on ``device``."""
        return self.map_tensors(lambda t: t.to(device))

    def map_tensors(self, fn: Callable[[torch.Tensor], torch.Tensor]) -> MicroBatch:
        """A copy with ``fn`` applied to every tensor (the counts stay; a None stays None)."""
        tensors = {name: getattr(self, name) for name in _TENSOR_FIELDS}
        return replace(self, **{name: fn(t) for name, t in tensors.items() if t is not None})


_TENSOR_FIELDS = (
    "input_ids",
    "position_ids",
    "loss_mask",
    "advantages",
    "rollout_logprobs",
    "teacher_logprobs",
    "ref_logprobs",
)
_SIDE_LOGPROBS = ("teacher_logprobs", "ref_logprobs")
"""Per-token logprobs of other models that a sample may carry, packed like ``rollout_logprobs``."""


def pad_micro_batch(mb: MicroBatch, multiple: int) -> MicroBatch:
    """``mb`` with its row padded to a multiple of ``multiple``: a padding segment (positions restart
    at 0) without loss tokens. ``mb`` itself when it already is one."""
    length = len(mb)
    pad = -length % multiple
    if pad == 0:
        return mb
    out = mb.map_tensors(lambda t: torch.cat([t, t.new_zeros(1, pad)], dim=1))
    out.position_ids[0, length:] = torch.arange(pad)
    return out


@dataclass
class _Prepared:
    ids: np.ndarray
    mask: np.ndarray
    logprobs: np.ndarray
    advantage: float
    side: dict[str, np.ndarray]
    """Teacher / reference logprobs (:data:`_SIDE_LOGPROBS`) where the step has them."""
    index: int = 0
    """The sample's index in ``pack_samples``'s list."""
    start: int = 0
    """Position of ``ids[0]``: 0 for a whole sample, ``q`` for a branch that shares the first ``q``
    tokens of its root."""

    def branch(self, q: int) -> _Prepared:
        """This sample without its first ``q`` tokens (its root holds them)."""
        side = {name: v[q:] for name, v in self.side.items()}
        return _Prepared(
            self.ids[q:], self.mask[q:], self.logprobs[q:], self.advantage, side, index=self.index, start=q
        )


def logprob_array(values: Sequence[float | None]) -> np.ndarray:
    """A sample's logprobs as packing takes them: float32, a missing one (None) as 0.0. An
    ``array.array`` (the rollout engine's ``TokenArray``: no None in it) is converted at once."""
    if isinstance(values, array.array):
        return np.asarray(cast(Any, values), dtype=np.float32)
    return np.asarray([0.0 if x is None else x for x in values], dtype=np.float32)


def _token_logprobs(given: Sequence[float | None] | None, n_prompt: int, n_comp: int) -> np.ndarray:
    """0.0 for the prompt, then the completion's logprobs (:func:`logprob_array`; padded with 0.0 or
    cut to ``n_comp``)."""
    out = np.zeros(n_prompt + n_comp, dtype=np.float32)
    values = logprob_array(given[:n_comp] if given is not None else [])
    out[n_prompt : n_prompt + values.size] = values
    return out


def _prepare(sample: TrainingSample, seq_len: int, side: Sequence[str] = (), index: int = 0) -> _Prepared:
    n_prompt, n_comp = len(sample.prompt_ids), len(sample.completion_ids)
    if n_prompt + n_comp == 0:
        raise ValueError("a sample needs at least one token")
    comp_mask = (
        np.ones(n_comp, dtype=bool) if sample.completion_mask is None else np.asarray(sample.completion_mask)
    )
    if comp_mask.shape != (n_comp,):
        raise ValueError(f"completion_mask has {comp_mask.size} entries for {n_comp} completion tokens")
    lps = _token_logprobs(sample.rollout_logprobs, n_prompt, n_comp)
    others = {name: _token_logprobs(getattr(sample, name), n_prompt, n_comp)[:seq_len] for name in side}
    prompt, completion = np.asarray(sample.prompt_ids, np.int64), np.asarray(sample.completion_ids, np.int64)
    ids = np.concatenate([prompt, completion])
    mask = np.concatenate([np.zeros(n_prompt, dtype=bool), comp_mask.astype(bool)])
    mask[0] = False  # nothing predicts the first token
    return _Prepared(ids[:seq_len], mask[:seq_len], lps[:seq_len], float(sample.advantage), others, index)


def _shared_prefix(root: _Prepared, other: _Prepared) -> int:
    """How many leading tokens ``other`` can take from ``root``: equal tokens that are loss tokens in
    neither, less one (the branch keeps the last shared token, whose output predicts its first loss
    token), and never all of ``other`` (a branch has at least one token)."""
    n = min(root.ids.size, other.ids.size)
    same = (root.ids[:n] == other.ids[:n]) & ~root.mask[:n] & ~other.mask[:n]
    length = int(np.argmin(same)) if not same.all() else n
    return max(0, min(length - 1, other.ids.size - 1))


def _families(prepared: list[_Prepared], seq_len: int) -> list[list[_Prepared]]:
    """Samples grouped by their prompt tokens, in order: each family is a root followed by branches
    (a branch needs a shared prefix of at least one token); a family that would pass ``seq_len``
    starts a new one."""
    by_prompt: dict[bytes, list[list[_Prepared]]] = {}
    order: list[list[_Prepared]] = []
    for p in prepared:
        key = p.ids[: int(np.argmax(p.mask))].tobytes() if p.mask.any() else p.ids.tobytes()
        family = by_prompt.get(key, [[]])[-1]
        q = _shared_prefix(family[0], p) if family else 0
        # a branch must not look like the continuation of the part before it
        follows = bool(family) and family[-1].start + family[-1].ids.size == q
        if q >= 1 and not follows and sum(x.ids.size for x in family) + p.ids.size - q <= seq_len:
            family.append(p.branch(q))
            continue
        family = [p]
        by_prompt.setdefault(key, []).append(family)
        order.append(family)
    return order


def first_fit_decreasing(lengths: Sequence[int], capacity: int) -> list[list[int]]:
    """Bin packing: indices of ``lengths`` grouped into bins of total ≤ ``capacity``, longest first.

    Ties keep input order, so the result is deterministic. An item longer than ``capacity`` gets a bin
    of its own.
    """
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    smallest = min(lengths, default=0)
    bins: list[list[int]] = []
    room: list[int] = []
    # the bins with room for the smallest item, in order: a bin without it takes nothing more, so it
    # is not looked at again (the same bins as looking at every one, without a pass over full ones)
    open_bins: list[int] = []
    for i in order:
        n = lengths[i]
        for k, b in enumerate(open_bins):
            if n <= room[b]:
                bins[b].append(i)
                room[b] -= n
                if room[b] < smallest:
                    del open_bins[k]
                break
        else:
            bins.append([i])
            room.append(capacity - n)
            if room[-1] >= smallest:
                open_bins.append(len(bins) - 1)
    return bins


def _build(parts: list[_Prepared], multiple: int, pad_token_id: int, side: Sequence[str] = ()) -> MicroBatch:
    length = sum(p.ids.size for p in parts)
    pad = -length % multiple
    ids = np.concatenate([*(p.ids for p in parts), np.full(pad, pad_token_id, dtype=np.int64)])
    pos = np.concatenate([*(np.arange(p.start, p.start + p.ids.size) for p in parts), np.arange(pad)])
    mask = np.concatenate([*(p.mask for p in parts), np.zeros(pad, dtype=bool)])
    adv = np.concatenate(
        [*(np.full(p.ids.size, p.advantage, dtype=np.float32) for p in parts), np.zeros(pad, np.float32)]
    )
    lps = np.concatenate([*(p.logprobs for p in parts), np.zeros(pad, dtype=np.float32)])
    others = {
        name: torch.as_tensor(np.concatenate([*(p.side[name] for p in parts), np.zeros(pad, np.float32)]))[
            None
        ]
        for name in side
    }
    columns = np.cumsum([0, *(p.ids.size for p in parts)])
    spans = tuple((p.index, int(c), p.start, p.ids.size) for p, c in zip(parts, columns, strict=False))
    return MicroBatch(
        input_ids=torch.as_tensor(ids)[None],
        position_ids=torch.as_tensor(pos.astype(np.int64))[None],
        loss_mask=torch.as_tensor(mask)[None],
        advantages=torch.as_tensor(adv)[None],
        rollout_logprobs=torch.as_tensor(lps)[None],
        num_samples=len(parts),
        num_tokens=int(mask.sum()),
        spans=spans,
        **others,
    )


def _zigzag(micro_batches: list[MicroBatch], num_ranks: int) -> list[list[MicroBatch]]:
    ordered = sorted(micro_batches, key=lambda mb: -len(mb))
    ranks: list[list[MicroBatch]] = [[] for _ in range(num_ranks)]
    for i, mb in enumerate(ordered):
        row, col = divmod(i, num_ranks)
        ranks[col if row % 2 == 0 else num_ranks - 1 - col].append(mb)
    return ranks


def pack_samples(
    samples: Sequence[TrainingSample],
    *,
    seq_len: int,
    pad_to_multiple_of: int = 1,
    num_ranks: int = 1,
    pad_token_id: int = 0,
    share_prompts: bool = False,
) -> list[list[MicroBatch]]:
    """Pack a training step's samples into micro-batches, per data-parallel rank (module docstring).

    ``share_prompts`` only for a trainer whose attention honours branches
    (``TrainerBackend.shares_prompts``): any other attention would let a branch see the sample packed
    before it.

    Returns:
        ``num_ranks`` lists of equal length (empty lists when there are no samples).
    """
    if seq_len < 1 or pad_to_multiple_of < 1 or num_ranks < 1:
        raise ValueError(
            "seq_len, pad_to_multiple_of and num_ranks must be >= 1, "
            f"got {seq_len}, {pad_to_multiple_of}, {num_ranks}"
        )
    side = [name for name in _SIDE_LOGPROBS if any(getattr(s, name) is not None for s in samples)]
    for name in side:
        if missing := sum(getattr(s, name) is None for s in samples):
            raise ValueError(
                f"{missing} of {len(samples)} samples have no {name}: give them to every sample or none"
            )
    prepared = [_prepare(s, seq_len, side, i) for i, s in enumerate(samples)]
    items = _families(prepared, seq_len) if share_prompts else [[p] for p in prepared]
    bins = first_fit_decreasing([sum(p.ids.size for p in item) for item in items], seq_len)
    micro_batches = [
        _build([p for i in b for p in items[i]], pad_to_multiple_of, pad_token_id, side) for b in bins
    ]
    if micro_batches and len(micro_batches) % num_ranks:
        first = micro_batches[0]
        dummy = replace(
            first,
            loss_mask=torch.zeros_like(first.loss_mask),
            advantages=torch.zeros_like(first.advantages),
            num_samples=0,
            num_tokens=0,
            spans=(),
        )
        micro_batches += [replace(dummy) for _ in range(-len(micro_batches) % num_ranks)]
    return _zigzag(micro_batches, num_ranks)


def sample_tokens(
    micro_batches: Sequence[MicroBatch], rows: Sequence[torch.Tensor | np.ndarray], lengths: Sequence[int]
) -> list[np.ndarray]:
    """Per-token values of packed rows read back by sample: ``rows[i]`` holds one value per column of
    ``micro_batches[i]`` (e.g. the trainer's logprobs, aligned with ``input_ids``); returns, for each
    sample ``k`` of the step, its ``lengths[k]`` values from position 0 (NaN where no row holds them:
    a branch's shared prefix, which its root holds, or tokens past ``seq_len``)."""
    out = [np.full(n, np.nan, dtype=np.float32) for n in lengths]
    for mb, row in zip(micro_batches, rows, strict=True):
        values = np.asarray(row, dtype=np.float32).reshape(-1)
        if values.size != len(mb):
            raise ValueError(f"a row of {values.size} values for a micro-batch of {len(mb)} columns")
        for index, column, position, length in mb.spans:
            end = min(position + length, lengths[index])
            if end > position:
                out[index][position:end] = values[column : column + end - position]
    return out
