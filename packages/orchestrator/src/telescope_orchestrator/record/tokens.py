"""The run record's token table (docs/records.md, "tokens"): for every completion token of the kept
samples, what the sampler, the trainer's loss, the teacher and the reference model made of it.

:func:`trained_tokens` reads the trainer ranks' ``step_tokens`` (one dict of per-token arrays per
micro-batch they trained) back by training sequence, through the micro-batches' spans
(``telescope_algos.sample_tokens``); :func:`token_columns` joins them with what each sample carries
(token ids, the sampler's, teacher's and reference model's logprobs, and the weight versions of the
model turn that generated each token). Training sequences are those of ``run.loop.to_train_samples``,
in its order: each kept sample, then its further sequences.

The table is built as whole columns (``telescope_records.ListColumn``: flat arrays and row offsets,
each token's text taken from :class:`TokenTexts` by id), never a Python object per token: at 8,192
samples of 512 tokens a step, rows of per-token lists and strings held the GIL for seconds.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from telescope_algos import MicroBatch
    from telescope_rollout import RolloutBatch, ScoredSample

__all__ = ["TokenTexts", "sequences", "token_columns", "token_versions", "trained_tokens"]

Trained = dict[str, list[np.ndarray]]
"""Per :data:`telescope_algos.TOKEN_FIELDS` name (and ``teacher_logprob`` / ``ref_logprob`` where the
trainer ranks hold that frozen model: ``telescope_algos.backend.FROZEN_TOKEN_FIELDS``), one array per
training sequence (prompt and completion positions; NaN where no trainer rank computed the token)."""


def sequences(batch: RolloutBatch) -> list[tuple[ScoredSample, int, Any]]:
    """Every training sequence of the kept samples, as ``run.loop.to_train_samples`` makes them:
    ``(sample, k, sequence)`` with ``k`` 0 for the sample itself, else its further sequence ``k``."""
    return [
        (s, k, seq) for g in batch.groups for s in g.samples for k, seq in enumerate((s, *s.extra_sequences))
    ]


def trained_tokens(
    shards: Sequence[Sequence[MicroBatch]],
    dp_ranks: Sequence[int],
    per_rank: Sequence[Sequence[Mapping[str, np.ndarray] | None]],
    lengths: Sequence[int],
) -> Trained:
    """The trainer ranks' token records read back by training sequence: ``shards[dp]`` are the
    micro-batches data-parallel rank ``dp`` trained, ``per_rank[i]`` what rank ``i`` (of data-parallel
    rank ``dp_ranks[i]``) returned for them; the first rank of a replica with a row gives it (pipeline
    stages before the last have none). ``lengths``: each sequence's prompt and completion tokens."""
    from telescope_algos import TOKEN_FIELDS, sample_tokens
    from telescope_algos.backend import FROZEN_TOKEN_FIELDS

    rows: dict[int, list[Mapping[str, np.ndarray] | None]] = {}
    for dp, got in zip(dp_ranks, per_rank, strict=True):
        mine = rows.setdefault(dp, [None] * len(shards[dp]))
        for i, row in enumerate(list(got)[: len(mine)]):
            mine[i] = mine[i] if mine[i] is not None else row
    pairs = [
        (mb, row)
        for dp, shard in enumerate(shards)
        for mb, row in zip(shard, rows.get(dp, [None] * len(shard)), strict=True)
        if row is not None
    ]
    micro_batches = [mb for mb, _ in pairs]
    frozen = [f for f in FROZEN_TOKEN_FIELDS.values() if pairs and all(f in row for _, row in pairs)]
    return {
        name: sample_tokens(micro_batches, [row[name] for _, row in pairs], lengths)
        for name in (*TOKEN_FIELDS, *frozen)
    }


class TokenTexts:
    """Each token id decoded on its own, once (a run's steps repeat most of theirs): ``texts[id]``."""

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self._decode = decode
        self.texts: list[str] = []
        """Indexed by token id ("" for an id not seen yet)."""
        self._known = np.zeros(0, dtype=bool)

    def cover(self, ids: np.ndarray) -> list[str]:
        """:attr:`texts`, with every id of ``ids`` (non-negative ints) decoded."""
        if ids.size == 0:
            return self.texts
        if int(ids.min()) < 0:
            raise ValueError(f"a token id below 0 ({int(ids.min())}) has no text")
        grow = int(ids.max()) + 1 - len(self.texts)
        if grow > 0:
            self.texts += [""] * grow
            self._known = np.concatenate([self._known, np.zeros(grow, dtype=bool)])
        new = np.unique(ids[~self._known[ids]])
        for token in new.tolist():
            self.texts[token] = self._decode([token])
        self._known[new] = True
        return self.texts


def token_versions(sample: ScoredSample, k: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The weight versions at the start and end of the model turn that generated each of the ``n``
    completion tokens of the sample's training sequence ``k`` (-1 for environment and template
    tokens). Turns whose token counts do not add up to ``n`` (none recorded, an episode cut short)
    give every generated token the sample's own versions."""
    mask = np.asarray((sample if k == 0 else sample.extra_sequences[k - 1]).completion_mask, dtype=bool)
    start = np.full(n, -1, dtype=np.int32)
    end = np.full(n, -1, dtype=np.int32)
    turns = [t for t in sample.turns if t.segment == k]
    if turns and sum(max(t.tokens, 0) for t in turns) == n:
        at = 0
        for t in turns:
            size = max(t.tokens, 0)
            if t.role == "model":
                start[at : at + size], end[at : at + size] = t.version_start, t.version_end
            at += size
        return start, end
    generated = mask[:n] if mask.size >= n else np.ones(n, dtype=bool)
    start[generated], end[generated] = sample.version_start, sample.version_end
    return start, end


def token_columns(
    step: int, batch: RolloutBatch, trained: Trained | None, texts: TokenTexts | None = None
) -> tuple[dict[str, Any], int]:
    """The token table of ``batch``'s kept samples as whole columns (module docstring) and its row
    count, one row per training sequence; ``trained`` (:func:`trained_tokens`) fills the trainer's
    columns, else they are NaN; ``texts`` decodes the tokens (None: no ``token_text``)."""
    from telescope_algos import TOKEN_FIELDS
    from telescope_records import ListColumn

    seqs = sequences(batch)
    sizes = [len(seq.completion_ids) for _, _, seq in seqs]
    offsets = np.zeros(len(seqs) + 1, dtype=np.int32)
    offsets[1:] = np.cumsum(sizes)
    ids = _flat((seq.completion_ids for _, _, seq in seqs), sizes, np.int32)
    versions = [token_versions(s, k, n) for (s, k, _), n in zip(seqs, sizes, strict=True)]
    columns: dict[str, Any] = {
        "step": [step] * len(seqs),
        "env": [s.env_name for s, _, _ in seqs],
        "group_id": [s.group_id for s, _, _ in seqs],
        "sample_id": [s.sample_id for s, _, _ in seqs],
        "sequence": [k for _, k, _ in seqs],
        "token_ids": ListColumn(offsets, ids),
        "sampler_logprob": ListColumn(
            offsets, _flat((seq.completion_logprobs for _, _, seq in seqs), sizes, np.float32)
        ),
        "version_start": ListColumn(offsets, _joined([v[0] for v in versions], np.int32)),
        "version_end": ListColumn(offsets, _joined([v[1] for v in versions], np.int32)),
    }
    if texts is not None:
        columns["token_text"] = ListColumn(offsets, ids, texts=texts.cover(ids))
    spans = [(len(seq.prompt_ids), n) for (_, _, seq), n in zip(seqs, sizes, strict=True)]
    for name in TOKEN_FIELDS:  # the trainer's columns, of the same names
        got = None if trained is None else trained[name]
        parts = [
            np.full(n, np.nan, dtype=np.float32) if got is None else _fit(got[j][p : p + n], n)
            for j, (p, n) in enumerate(spans)
        ]
        columns[name] = ListColumn(offsets, _joined(parts, np.float32))
    for name, field in (("teacher", "teacher_logprob"), ("ref", "ref_logprob")):
        given = [getattr(seq, f"{name}_logprobs") for _, _, seq in seqs]
        columns[field] = _frozen_column(
            offsets, given, spans, None if trained is None else trained.get(field)
        )
    return columns, len(seqs)


def _frozen_column(
    offsets: np.ndarray,
    given: Sequence[Sequence[float] | None],
    spans: Sequence[tuple[int, int]],
    trainer: Sequence[np.ndarray] | None,
) -> Any:
    """A frozen model's logprobs per sequence: the sample's own (its servers scored it), else the
    trainer ranks' (they hold it), else null."""
    from telescope_records import ListColumn

    parts: list[np.ndarray] = []
    valid = np.ones(len(spans), dtype=bool)
    for j, ((p, n), mine) in enumerate(zip(spans, given, strict=True)):
        if mine is not None:
            parts.append(_fit(np.asarray(mine, dtype=np.float32), n))
        elif trainer is not None:
            parts.append(_fit(trainer[j][p : p + n], n))
        else:
            parts.append(np.zeros(n, dtype=np.float32))
            valid[j] = False
    return ListColumn(offsets, _joined(parts, np.float32), valid=valid)


def _flat(lists: Iterable[Sequence[Any]], sizes: Sequence[int], dtype: Any) -> np.ndarray:
    """Each sequence's values (cut or NaN/0-padded to its size) end to end; a finished sample's
    ``TokenArray`` is read as it lies in memory, without a Python object a value."""
    return _joined([_fit(np.asarray(v, dtype=dtype), n) for v, n in zip(lists, sizes, strict=True)], dtype)


def _fit(values: np.ndarray, n: int) -> np.ndarray:
    """``values`` cut or padded (NaN for floats, 0 for ints) to ``n``."""
    if len(values) >= n:
        return values[:n]
    pad = np.nan if np.issubdtype(values.dtype, np.floating) else 0
    return np.concatenate([values, np.full(n - len(values), pad, dtype=values.dtype)])


def _joined(parts: Sequence[np.ndarray], dtype: Any) -> np.ndarray:
    return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype=dtype)
