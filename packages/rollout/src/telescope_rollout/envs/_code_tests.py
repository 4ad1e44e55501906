"""Test cases of code tasks (i3_code): reading them from dataset rows, building the program to run,
and judging its output (docs/rollout.md, "The i3 code-test format").

Row layout (``PrimeIntellect/INTELLECT-3-RL``, subset ``code``): ``question`` and ``info``, a JSON
string whose ``tests`` is a JSON string again: ``{"inputs": [...], "outputs": [...], "fn_name"?}``.

* stdin tests: ``inputs[i]`` is the program's stdin and ``outputs[i]`` its expected stdout (a list
  is joined with newlines). Passed when equal after trimming, or line by line
  ignoring blank lines and surrounding spaces, or token by token, or all tokens numbers within
  1e-3 of each other.
* function-call tests (``fn_name`` set): ``inputs[i]`` is text with one Python literal per line,
  one line per positional argument (``"[2, 7, 11]\\n9"`` is ``f([2, 7, 11], 9)``); an already
  parsed list is taken as the argument list. ``outputs[i]`` is the expected return value as JSON
  text (or a plain string that is not JSON, or a parsed value). The function is a top-level def
  or a method of ``class Solution``; its result is compared after a JSON round trip. A one-item
  list also accepts its only item (datasets wrap return values that way), but an expected list of
  several items never accepts its first item alone (``f() == 0`` fails against ``[0, 1]``).
  Arguments are read with ``ast.literal_eval`` (nothing of the row is evaluated on the host),
  with a JSON fallback per line (``true``/``null``); blank lines are skipped; what the solution
  prints does not hide the result, which the harness writes after a marker.

Both kinds run after a prelude of the imports competitive solutions take for granted (``List``,
``defaultdict``, ``heapq``, ...).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from decimal import Decimal, InvalidOperation
from typing import Any, cast

PRELUDE = """\
import bisect, collections, copy, functools, heapq, itertools, math, operator, random, re, string, sys
from bisect import bisect_left, bisect_right, insort
from collections import Counter, OrderedDict, defaultdict, deque
from functools import cache, cmp_to_key, lru_cache, reduce
from heapq import heapify, heappop, heappush, heappushpop, heapreplace, nlargest, nsmallest
from itertools import accumulate, combinations, count, groupby, permutations, product, zip_longest
from math import ceil, comb, factorial, floor, gcd, inf, isqrt, log, log2, prod, sqrt
from typing import Any, Deque, Dict, FrozenSet, Iterable, List, Optional, Set, Tuple, Union
try:
    import numpy as np
except ImportError:
    pass
"""

RESULT_MARKER = "\u2063TELESCOPE_RESULT\u2063"

# Appended to the model's code for a function-call test; the name is inserted with repr().
_CALL_HARNESS = """

def _tl_main():
    import ast as _ast, json as _json, sys as _sys
    _args = []
    for _line in _sys.stdin.read().split("\\n"):
        if not _line.strip():
            continue
        try:
            _args.append(_ast.literal_eval(_line.strip()))
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            _args.append(_json.loads(_line))
    _fn = globals().get({name!r})
    if "Solution" in globals() and hasattr(Solution, {name!r}):
        _fn = getattr(Solution(), {name!r})
    _result = _fn(*_args)
    _sys.stdout.write("\\n" + {marker!r} + _json.dumps(_result) + "\\n")

_tl_main()
"""


def program_for(code: str, fn_name: str | None) -> str:
    """The program the sandbox runs for one test: prelude, the model's code, the call harness."""
    prelude = "" if "from __future__" in code else PRELUDE + "\n"
    harness = _CALL_HARNESS.format(name=fn_name, marker=RESULT_MARKER) if fn_name else ""
    return prelude + code + harness


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.strip().splitlines() if line.strip()]


def outputs_match(got: str, expected: str, tolerance: str = "1e-3") -> bool:
    """Whether stdout ``got`` passes for ``expected`` (the four rules of the module docstring)."""
    if got.strip() == expected.strip():
        return True
    a, b = _lines(got), _lines(expected)
    if a == b:
        return True
    ta, tb = [line.split() for line in a], [line.split() for line in b]
    if ta == tb:
        return True
    fa, fb = [t for line in ta for t in line], [t for line in tb for t in line]
    if not fa or len(fa) != len(fb):
        return False
    try:
        tol = Decimal(tolerance)
        return all(abs(Decimal(x) - Decimal(y)) <= tol for x, y in zip(fa, fb, strict=True))
    except (InvalidOperation, ValueError):
        return False


def call_result_matches(stdout: str, expected_json: str) -> bool:
    """The harness's result (after its marker, else the last line) equals the expected JSON value,
    or its only item when the expected value is a one-item list (compared with Python ``==``, so
    ``1 == 1.0 == True``)."""
    pos = stdout.rfind(RESULT_MARKER)
    if pos >= 0:
        result_text = stdout[pos + len(RESULT_MARKER) :].strip()
    else:
        lines = [line for line in stdout.strip().splitlines() if line.strip()]
        if not lines:
            return False
        result_text = lines[-1]
    try:
        got = json.loads(result_text)
    except (ValueError, RecursionError):
        return False
    try:
        expected = json.loads(expected_json)
    except (ValueError, RecursionError):
        expected = expected_json  # a plain string that is not JSON: compared as that string
    if got == expected:
        return True
    items = _as_list(expected)
    return items is not None and len(items) == 1 and got == items[0]


def as_json_text(value: Any) -> str:
    """An expected result as JSON text: JSON text kept, other strings quoted, values dumped."""
    if isinstance(value, str):
        try:
            json.loads(value)
        except (ValueError, RecursionError):
            return json.dumps(value)
        return value
    return json.dumps(value)


def call_args_text(value: Any) -> str:
    """Function-call arguments as one Python literal per line (a parsed list is the argument list)."""
    if isinstance(value, str):
        return value
    if isinstance(value, list | tuple):
        return "\n".join(repr(v) for v in cast(Sequence[object], value))
    return repr(value)


def _stdio_text(value: Any) -> str:
    if isinstance(value, list):
        return "\n".join(str(v) for v in cast(list[object], value))
    return "" if value is None else str(value)


def _json_value(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except (ValueError, RecursionError):
            return None
    return value


def _as_list(value: object) -> list[Any] | None:
    return cast(list[Any], value) if isinstance(value, list) else None


def _as_dict(value: object) -> dict[str, Any] | None:
    return cast(dict[str, Any], value) if isinstance(value, dict) else None


def tests_from_row(row: dict[str, Any]) -> list[dict[str, str]]:
    """``[{"input", "output", "fn_name"?}]`` from a hub row (``info`` JSON with ``tests`` JSON) or a
    bundled row (``tests`` list); [] for a row whose tests cannot be read."""
    info = _as_dict(_json_value(row.get("info") or row.get("verification_info"))) or {}
    tests = _json_value(row.get("tests") or info.get("tests") or info.get("test_cases") or [])
    spec = _as_dict(tests)
    if spec is not None and "inputs" in spec:
        inputs, outputs = _as_list(spec.get("inputs") or []), _as_list(spec.get("outputs") or [])
        if inputs is None or outputs is None:
            return []
        fn_name = spec.get("fn_name")
        if fn_name:
            return [
                {"input": call_args_text(i), "output": as_json_text(o), "fn_name": str(fn_name)}
                for i, o in zip(inputs, outputs, strict=False)
            ]
        pairs = zip(inputs, outputs, strict=False)
        return [{"input": _stdio_text(i), "output": _stdio_text(o)} for i, o in pairs]
    items = _as_list(tests)
    if items is None:
        return []
    rows = [t for t in map(_as_dict, items) if t is not None]
    return [
        {"input": _stdio_text(t.get("input", "")), "output": _stdio_text(t.get("output", ""))}
        | ({"fn_name": str(t["fn_name"])} if t.get("fn_name") else {})
        for t in rows
    ]
