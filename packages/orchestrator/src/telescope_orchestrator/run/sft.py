"""The supervised steps at the start of a run (``sft_steps``): the conversations, each step's batch.

:func:`load_conversations` reads ``sft_dataset`` (a local ``.jsonl``, ``.json`` or ``.parquet``
file, or a Hugging Face dataset id with ``datasets``) and checks every row before any server
starts: a row needs ``messages`` and may hold ``tools``; each conversation is tokenized with its
assistant mask then (``telescope_rollout.chat.conversation_tokens``), so a bad row stops the run
with its index and the reason. :class:`SupervisedBatches` gives step ``k``'s conversations as
training samples: ``sft_batch_size`` of them, in a seeded order drawn anew for each pass over the
data, a function of the step alone, so a resumed run trains the very batches it would have.
docs/algorithms.md#sft.
"""

from __future__ import annotations

import functools
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

if TYPE_CHECKING:
    from telescope_config import TelescopeConfig
    from telescope_rollout import Tokenizer

__all__ = ["SftDataError", "SupervisedBatches", "load_conversations"]


class SftDataError(ValueError):
    """``sft_dataset`` cannot be read or holds a row that is not a conversation; the message says which."""


def _rows(source: str, split: str) -> list[Any]:
    path = Path(source).expanduser()
    if path.is_file():
        if path.suffix == ".jsonl":
            lines = path.read_text(encoding="utf-8").splitlines()
            return [json.loads(line) for line in lines if line.strip()]
        if path.suffix == ".json":
            data = json.loads(path.read_text(encoding="utf-8"))
            return cast("list[Any]", data) if isinstance(data, list) else [data]
        if path.suffix == ".parquet":
            import pyarrow.parquet as pq

            table: Any = cast("Any", pq).read_table(path)
            return cast("list[Any]", table.to_pylist())
        raise SftDataError(f"sft_dataset {source}: a local file must be .jsonl, .json or .parquet")
    if path.exists() or source.startswith((".", "/", "~")):
        raise SftDataError(f"sft_dataset {source}: no such file (.jsonl, .json or .parquet)")
    try:
        import datasets
    except ImportError:
        raise SftDataError(
            f"sft_dataset {source!r} is a Hugging Face dataset id, and the `datasets` package is not "
            "installed: pip install datasets (or give a local .jsonl file)"
        ) from None
    return list(cast("Any", datasets).load_dataset(source, split=split))


def load_conversations(cfg: TelescopeConfig, tokenizer: Tokenizer) -> list[tuple[list[int], list[int]]]:
    """Every conversation of ``sft_dataset`` as ``(ids, assistant mask)``; :class:`SftDataError` names
    the first row that is not one."""
    from telescope_rollout.chat import TemplateError, conversation_tokens

    source = str(cfg.sft_dataset)
    try:
        rows = _rows(source, str(cfg.sft_dataset_split))
    except (OSError, ValueError) as exc:
        raise SftDataError(f"sft_dataset {source}: could not be read: {exc}") from None
    if not rows:
        raise SftDataError(f"sft_dataset {source} holds no conversation")
    out: list[tuple[list[int], list[int]]] = []
    for i, row in enumerate(rows):
        fields: dict[str, Any] = cast("dict[str, Any]", row) if isinstance(row, dict) else {}
        messages: Any = fields.get("messages")
        if not isinstance(messages, list):
            shown = repr(cast("object", row))[:200]
            raise SftDataError(f"sft_dataset {source}, row {i}: no `messages` list (got {shown})")
        tools = fields.get("tools")
        try:
            tokens = conversation_tokens(tokenizer, cast("Any", messages), tools=tools or None)
        except (TemplateError, ValueError) as exc:
            raise SftDataError(f"sft_dataset {source}, row {i}: {exc}") from None
        out.append((tokens.ids, tokens.mask))
    return out


@functools.lru_cache(maxsize=4)
def _order(seed: int, number: int, n: int) -> tuple[int, ...]:
    """The order of pass ``number`` over ``n`` conversations."""
    order = list(range(n))
    random.Random(f"{seed}-{number}").shuffle(order)
    return tuple(order)


@dataclass(frozen=True)
class SupervisedBatches:
    """Step ``k``'s conversations (1-based, ``k <= sft_steps``) as ``telescope_algos.TrainingSample``s."""

    conversations: list[tuple[list[int], list[int]]]
    batch_size: int
    seed: int

    def indices(self, step: int) -> list[int]:
        """The conversations of step ``step``: positions ``(step-1)·B .. step·B-1`` of the passes'
        orders laid end to end, each pass a permutation seeded by ``seed`` and its number."""
        n, b = len(self.conversations), self.batch_size
        return [_order(self.seed, p // n, n)[p % n] for p in range((step - 1) * b, step * b)]

    def samples(self, step: int) -> list[Any]:
        from telescope_algos import TrainingSample

        return [
            TrainingSample(prompt_ids=[], completion_ids=ids, advantage=1.0, completion_mask=mask)
            for ids, mask in (self.conversations[i] for i in self.indices(step))
        ]
