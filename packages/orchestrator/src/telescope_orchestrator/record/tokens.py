"""The run record's token table (docs/records.md, "tokens"): for every completion token of the kept
samples, what the sampler, the trainer's loss, the teacher and the reference model made of it.

:func:`trained_tokens` reads the trainer ranks' ``step_tokens`` (one dict of per-token arrays per
micro-batch they trained) back by training sequence, through the micro-batches' spans
(``telescope_algos.sample_tokens``); :func:`token_rows` joins them with what each sample carries
(token ids, the sampler's, teacher's and reference model's logprobs, and the weight versions of the
model turn that generated each token). Training sequences are those of ``run.loop.to_train_samples``,
in its order: each kept sample, then its further sequences.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from telescope_algos import MicroBatch
    from telescope_rollout import RolloutBatch, ScoredSample

__all__ = ["pieces", "sequences", "token_rows", "token_versions", "trained_tokens"]

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


def pieces(decode: Callable[[list[int]], str]) -> Callable[[int], str]:
    """One token decoded on its own, each id decoded once (a run's steps repeat most of theirs)."""
    seen: dict[int, str] = {}

    def piece(token: int) -> str:
        text = seen.get(token)
        if text is None:
            text = seen[token] = decode([token])
        return text

    return piece


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


def token_rows(
    step: int, batch: RolloutBatch, trained: Trained | None, piece: Callable[[int], str] | None = None
) -> list[dict[str, Any]]:
    """One row of the token table per training sequence of ``batch``'s kept samples; ``trained``
    (:func:`trained_tokens`) fills the trainer's columns, else they are NaN; ``piece`` decodes one
    token (:func:`pieces`; None: no ``token_text``)."""
    from telescope_algos import TOKEN_FIELDS

    rows: list[dict[str, Any]] = []
    for j, (s, k, seq) in enumerate(sequences(batch)):
        n_prompt, n = len(seq.prompt_ids), len(seq.completion_ids)
        start, end = token_versions(s, k, n)

        def trainer(name: str, j: int = j, n_prompt: int = n_prompt, n: int = n) -> np.ndarray:
            if trained is None:
                return np.full(n, np.nan, dtype=np.float32)
            return trained[name][j][n_prompt : n_prompt + n]

        def frozen(given: Any, name: str) -> Any:
            """A frozen model's logprobs: the sample's (its servers scored it), else the trainer's."""
            return given if given is not None or trained is None or name not in trained else trainer(name)

        rows.append(
            {
                "step": step,
                "env": s.env_name,
                "group_id": s.group_id,
                "sample_id": s.sample_id,
                "sequence": k,
                "token_ids": seq.completion_ids,
                "token_text": [piece(t) for t in seq.completion_ids] if piece is not None else None,
                "sampler_logprob": seq.completion_logprobs,
                "teacher_logprob": frozen(seq.teacher_logprobs, "teacher_logprob"),
                "ref_logprob": frozen(seq.ref_logprobs, "ref_logprob"),
                **{name: trainer(name) for name in TOKEN_FIELDS},  # the columns of the same names
                "version_start": start,
                "version_end": end,
            }
        )
    return rows
