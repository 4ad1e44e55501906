"""docs/records.md and telescope_records.TABLES describe the same record format."""

from __future__ import annotations

import re
from pathlib import Path

from telescope_records import TABLES

DOC = Path(__file__).resolve().parents[1] / "docs" / "records.md"
HEADER = re.compile(r"^### `(\w+)` \(version (\d+), by (\w+)\)$")


def _documented() -> dict[str, tuple[int, str, list[tuple[str, str, str]]]]:
    tables: dict[str, tuple[int, str, list[tuple[str, str, str]]]] = {}
    current = None
    for line in DOC.read_text(encoding="utf-8").splitlines():
        header = HEADER.match(line)
        if header:
            current = header.group(1)
            tables[current] = (int(header.group(2)), header.group(3), [])
        elif current and line.startswith("| `"):
            name, type_, meaning = (cell.strip() for cell in line.strip("|").split(" | ", 2))
            tables[current][2].append((name.strip("`"), type_, meaning))
        elif line.startswith("## "):
            current = None
    return tables


def test_every_table_is_documented_with_its_version_key_and_columns():
    documented = _documented()
    assert list(documented) == list(TABLES)
    for name, t in TABLES.items():
        version, key, columns = documented[name]
        assert (version, key) == (t.version, t.key), name
        assert columns == [(c.name, str(c.type), c.meaning) for c in t.columns], name


def test_the_documented_schema_versions_are_those_a_run_writes(tmp_path):
    from telescope_records import RecordWriter, read_manifest

    RecordWriter(tmp_path)
    assert read_manifest(tmp_path)["tables"] == {n: v for n, (v, _, _) in _documented().items()}
