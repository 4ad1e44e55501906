"""Rows to Arrow: coercion, truncation marks, values JSON cannot hold, unknown columns."""

from __future__ import annotations

import json
from typing import Any

import pytest

from telescope_records import REPR_MARK, TABLES, TRUNCATION_MARK, cut, to_arrow, to_json_text


def test_cut_keeps_short_text_and_marks_long_text():
    assert cut("abc", 3) == "abc"
    # 10 characters, 4 kept: 6 dropped
    assert cut("abcdefghij", 4) == f"abcd{TRUNCATION_MARK}6 chars]"


def test_json_text_writes_what_json_cannot_hold_as_marked_repr():
    class Opaque:
        def __repr__(self) -> str:
            return "<opaque>"

    assert json.loads(to_json_text({"a": [1, 2]})) == {"a": [1, 2]}
    assert json.loads(to_json_text({"a": Opaque()})) == {"a": f"{REPR_MARK}<opaque>"}
    assert json.loads(to_json_text({"x": float("nan")})) == {"x": f"{REPR_MARK}nan"}


def test_values_are_coerced_to_the_column_types():
    table: Any = to_arrow(  # a pyarrow.Table: pyarrow ships no types
        TABLES["samples"],
        [{"step": "3", "reward": "abc", "truncated": 1, "metrics": {"acc": 1, "bad": "x"}, "tags": {"k": 2}}],
    )
    data = table.to_pylist()[0]
    assert data["step"] == 3
    assert data["reward"] is None  # not a number
    assert data["truncated"] is True
    assert dict(data["metrics"]) == {"acc": 1.0, "bad": None}
    assert dict(data["tags"]) == {"k": "2"}
    assert data["prompt"] is None  # missing columns are null


def test_a_column_is_passed_through_when_plain_and_coerced_when_not_as_each_row_alone():
    """Columns of plain values go to Arrow as they are; one value to coerce makes the column's every
    value go through the coercion; either way each row is what it is alone."""
    limit = TABLES["samples"].column("prompt").max_chars or 200_000
    rows: list[dict[str, Any]] = [
        dict(step=1, reward=0.5, metrics={"a": 1}, tags={"k": "v"}, prompt="p", truncated=False),
        {"step": 2, "reward": 1, "metrics": {"a": 2.5}, "tags": None, "prompt": None, "truncated": True},
        {"step": "3", "reward": "x", "metrics": {"a": "x"}, "tags": {"k": 2}, "prompt": "q" * (limit + 1)},
    ]
    each = [to_arrow(TABLES["samples"], [r]).to_pylist()[0] for r in rows]
    table: Any = to_arrow(TABLES["samples"], rows)
    assert table.to_pylist() == each
    assert (each[0]["step"], each[0]["reward"], dict(each[0]["metrics"])) == (1, 0.5, {"a": 1.0})
    assert (each[1]["reward"], each[1]["tags"], each[1]["prompt"]) == (1.0, None, None)
    assert (each[2]["step"], each[2]["reward"], dict(each[2]["metrics"])) == (3, None, {"a": None})
    assert dict(each[2]["tags"]) == {"k": "2"}
    assert each[2]["prompt"] == cut("q" * (limit + 1), limit)
    assert each[2]["truncated"] is None
    # an integer a float does not hold exactly is converted as before, not refused by Arrow
    big: Any = to_arrow(TABLES["samples"], [{"reward": 2**60, "metrics": {"n": 2**70}}])
    assert big.to_pylist()[0]["reward"] == float(2**60)
    assert dict(big.to_pylist()[0]["metrics"]) == {"n": float(2**70)}


def test_only_text_is_dictionary_encoded_in_the_files():
    from telescope_records._arrow import text_paths

    samples = text_paths(TABLES["samples"].schema())
    assert {"prompt", "env", "metrics.key_value.key", "tags.key_value.value"} <= set(samples)
    assert not {"reward", "step", "metrics.key_value.value"} & set(samples)
    assert "token_text.list.element" in text_paths(TABLES["tokens"].schema())
    assert "sampler_logprob.list.element" not in text_paths(TABLES["tokens"].schema())


def test_a_text_column_given_objects_stores_json_and_cuts_to_its_limit():
    info_limit = TABLES["samples"].column("info").max_chars
    rows: Any = to_arrow(  # a pyarrow.Table: pyarrow ships no types
        TABLES["samples"], [{"info": [{"info_key": "k", "info_value": "v" * (info_limit + 10)}]}]
    )
    info = rows.to_pylist()[0]["info"]
    assert info.startswith('[{"info_key": "k"')
    text = json.dumps([{"info_key": "k", "info_value": "v" * (info_limit + 10)}], ensure_ascii=False)
    assert info == f"{text[:info_limit]}{TRUNCATION_MARK}{len(text) - info_limit} chars]"
    assert len(info) < info_limit + 40


def test_an_unknown_column_is_an_error_naming_it():
    with pytest.raises(ValueError, match=r"has no column\(s\) \['rewad'\]"):
        to_arrow(TABLES["samples"], [{"rewad": 1.0}])


def test_every_table_builds_an_empty_arrow_table_of_its_schema():
    for t in TABLES.values():
        assert to_arrow(t, []).schema == t.schema()
        assert t.columns[0].name in {"attempt", "time"}


def test_whole_columns_give_the_table_rows_give():
    """The token table from whole columns (flat values and offsets, text by codes, a null row) is the
    table the same rows give through ``to_arrow``."""
    import numpy as np

    from telescope_records import ListColumn, columns_to_arrow, table, to_arrow

    texts = ["<a>", "b", "ccc"]
    ids = [[2, 0], [1], [0, 0, 2]]
    teacher = [[-1.0, -2.0], None, [-0.5, -0.25, -4.0]]
    rows = [
        {"attempt": 1, "step": 3, "env": "e", "group_id": 7, "sample_id": k, "sequence": 0,
         "token_ids": i, "token_text": [texts[t] for t in i], "teacher_logprob": teacher[k]}
        for k, i in enumerate(ids)
    ]  # fmt: skip
    offsets = np.array([0, 2, 3, 6], dtype=np.int32)
    flat = np.array([t for i in ids for t in i], dtype=np.int32)
    columns = {
        "attempt": [1] * 3, "step": [3] * 3, "env": ["e"] * 3, "group_id": [7] * 3, "sample_id": [0, 1, 2],
        "sequence": [0] * 3, "token_ids": ListColumn(offsets, flat),
        "token_text": ListColumn(offsets, flat, texts=texts),
        "teacher_logprob": ListColumn(
            offsets, np.array([-1.0, -2.0, 0.0, -0.5, -0.25, -4.0]), valid=np.array([True, False, True])
        ),
    }  # fmt: skip
    tokens = table("tokens")
    whole = columns_to_arrow(tokens, columns, 3)
    assert whole.schema == tokens.schema()
    assert whole.to_pylist() == to_arrow(tokens, rows).to_pylist()
    assert whole.to_pylist()[0]["token_text"] == ["ccc", "<a>"]
    assert whole.to_pylist()[1]["teacher_logprob"] is None
    assert whole.to_pylist()[1]["ref_logprob"] is None  # left out: null


def test_whole_columns_of_the_wrong_size_or_name_are_errors():
    import numpy as np

    from telescope_records import ListColumn, columns_to_arrow, table

    tokens = table("tokens")
    with pytest.raises(ValueError, match="no column"):
        columns_to_arrow(tokens, {"nope": [1]}, 1)
    with pytest.raises(ValueError, match="has 2 values, not 1"):
        columns_to_arrow(tokens, {"step": [1, 2]}, 1)
    with pytest.raises(ValueError, match="has 2 rows, not 1"):
        columns_to_arrow(tokens, {"token_ids": ListColumn(np.array([0, 1, 2]), np.array([5, 6]))}, 1)
    with pytest.raises(ValueError, match="has 1 values; its offsets end at 2"):
        columns_to_arrow(tokens, {"token_ids": ListColumn(np.array([0, 2]), np.array([5]))}, 1)
    with pytest.raises(ValueError, match="2 validity flags, not 1"):
        columns_to_arrow(
            tokens, {"ref_logprob": ListColumn(np.array([0, 1]), np.array([5.0]), valid=np.ones(2, bool))}, 1
        )
    with pytest.raises(TypeError, match="not a list"):
        columns_to_arrow(tokens, {"env": ListColumn(np.array([0, 1]), np.array([5]))}, 1)
