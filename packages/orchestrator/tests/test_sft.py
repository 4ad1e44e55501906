"""The supervised steps' data: conversations read and checked up front, each step's batch by step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from telescope_config import TelescopeConfig, defaults
from telescope_orchestrator.run.sft import SftDataError, SupervisedBatches, load_conversations
from telescope_rollout import Tokenizer

HELLO = [{"role": "user", "content": "Say hello."}, {"role": "assistant", "content": "Hello!"}]


def _config(data: str) -> TelescopeConfig:
    values = {**defaults(), "environments": [{"name": "countdown"}], "sft_steps": 1, "sft_dataset": data}
    return TelescopeConfig.model_validate(values)


def test_each_step_takes_the_next_conversations_of_a_seeded_pass():
    batches = SupervisedBatches([([i], [1]) for i in range(5)], batch_size=3, seed=7)
    steps = [batches.indices(k) for k in range(1, 6)]  # 15 positions: three passes of five
    flat = [i for s in steps for i in s]
    for p in range(3):
        assert sorted(flat[5 * p : 5 * p + 5]) == list(range(5))  # every pass is a permutation
    assert flat[:5] != flat[5:10]  # each pass has its own order
    assert (
        SupervisedBatches(batches.conversations, 3, seed=7).indices(4) == steps[3]
    )  # a function of the step
    assert SupervisedBatches(batches.conversations, 3, seed=8).indices(1) != steps[0]
    (sample, *_) = batches.samples(1)
    assert (list(sample.prompt_ids), sample.advantage, list(sample.completion_mask)) == ([], 1.0, [1])


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".parquet"])
def test_conversations_load_from_local_files(tmp_path: Path, tiny_model_dir: Path, suffix: str):
    rows = [{"messages": HELLO}, {"messages": [*HELLO[:1], {"role": "assistant", "content": "Hi!"}]}]
    path = tmp_path / f"data{suffix}"
    if suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif suffix == ".json":
        path.write_text(json.dumps(rows))
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    tok = Tokenizer.from_pretrained(tiny_model_dir)
    conversations = load_conversations(_config(str(path)), tok)
    assert len(conversations) == 2
    ids, mask = conversations[0]
    assert tok.decode([t for t, m in zip(ids, mask, strict=True) if m]) == "Hello!<|im_end|>"


@pytest.mark.parametrize(
    ("content", "name", "match"),
    [
        ("x", "data.csv", "must be .jsonl, .json or .parquet"),
        (None, "missing.jsonl", "no such file"),
        ('{"text": "hi"}\n', "data.jsonl", r"row 0: no `messages` list"),
        (
            '{"messages": [{"role": "user", "content": "hi"}]}\n',
            "data.jsonl",
            "row 0: the conversation has no",
        ),
        ("", "data.jsonl", "holds no conversation"),
        ("{not json", "data.jsonl", "could not be read"),
    ],
)
def test_bad_data_names_the_file_and_row(tmp_path: Path, tiny_model_dir: Path, content, name, match):
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    with pytest.raises(SftDataError, match=match):
        load_conversations(_config(str(path)), Tokenizer.from_pretrained(tiny_model_dir))
