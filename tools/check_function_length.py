"""Fail when a function in ``packages/*/src`` or ``apps/*/src`` is longer than a screen.

A ``# fmt: skip`` inside a function is refused too: folding code by hand past the formatter would
pass the count without making the function any shorter. The limit (``max-lines``) and the named
exceptions, each with its reason, live in pyproject.toml under ``[tool.telescope.function-length]``;
an exception that no longer applies is an error too, so the list stays true. Lines are counted
from ``def`` to the last line of the body, docstring included.

    python3 tools/check_function_length.py
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def long_functions(path: Path, max_lines: int) -> list[tuple[str, int, int]]:
    """``(qualified name, first line, length)`` of every function in ``path`` over ``max_lines``."""
    found: list[tuple[str, int, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    length = (child.end_lineno or child.lineno) - child.lineno + 1
                    if length > max_lines:
                        found.append((name, child.lineno, length))
                visit(child, f"{name}.")

    visit(ast.parse(path.read_text(), filename=str(path)), "")
    return found


_FMT_MARK = re.compile(r"fmt:\s*(skip|off)")


def skipped_formatting(path: Path) -> list[tuple[str, int]]:
    """``(function name, line)`` of each ``# fmt: skip`` (or ``fmt: off``) comment inside a
    function of ``path``."""
    import io
    import tokenize

    text = path.read_text()
    marks = [
        tok.start[0]
        for tok in tokenize.generate_tokens(io.StringIO(text).readline)
        if tok.type == tokenize.COMMENT and _FMT_MARK.search(tok.string)
    ]
    if not marks:
        return []
    functions = [
        (node.name, node.lineno, node.end_lineno or node.lineno)
        for node in ast.walk(ast.parse(text, filename=str(path)))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    ]
    found = []
    for line in marks:
        inside = [(name, first) for name, first, last in functions if first <= line <= last]
        if inside:
            found.append((max(inside, key=lambda f: f[1])[0], line))
    return found


def main() -> int:
    settings = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["telescope"]["function-length"]
    max_lines, allowed = int(settings["max-lines"]), dict(settings.get("allow", {}))
    problems, used = [], set()
    for path in sorted([*ROOT.glob("packages/*/src/**/*.py"), *ROOT.glob("apps/*/src/**/*.py")]):
        rel = path.relative_to(ROOT).as_posix()
        problems += [
            f"{rel}:{line}: `# fmt: skip/off` inside {name}: let the formatter lay it out, and split the "
            "function if it then runs past the limit"
            for name, line in skipped_formatting(path)
        ]
        for name, line, length in long_functions(path, max_lines):
            key = f"{rel}::{name}"
            if key in allowed:
                used.add(key)
            else:
                problems.append(f"{rel}:{line}: {name} is {length} lines (limit {max_lines})")
    problems += [
        f"pyproject.toml: [tool.telescope.function-length] allows {key!r}, which is no longer over the limit"
        for key in sorted(set(allowed) - used)
    ]
    for line in problems:
        print(line)
    if problems:
        print(
            f"{len(problems)} problem(s): split the function, or name it in [tool.telescope.function-length] "
            "allow with the reason it must stay whole",
            file=sys.stderr,
        )
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
