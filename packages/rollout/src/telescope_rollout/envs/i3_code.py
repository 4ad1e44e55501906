"""i3_code: competitive-programming problems graded by running tests in a sandbox.

Two kinds of test, as in INTELLECT-3-RL: stdin/stdout tests feed ``input`` to the program and
compare its output line by line; function-call tests (rows with ``fn_name``) append a small
harness that reads the JSON argument list from stdin, calls the function (a top-level def or a
method of ``class Solution``) and prints the JSON result on the last line, which must equal the
expected JSON value.

The environment never imports telescope_sandbox: the composition root passes any
:class:`~telescope_rollout.SandboxLike` as ``sandbox=`` (or sets ``env.sandbox``) before the
first reward. Reward 1 iff every selected test passes. Sandbox failures are retried
(``max_retries``) and then reported as ``sandbox_error`` with reward 0.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from typing import Any, ClassVar

from telescope_rollout._env import SingleTurnEnvironment
from telescope_rollout._sandbox import SandboxLike
from telescope_rollout._types import RewardResult, Sample
from telescope_rollout.envs._data import BUNDLED, bundled_rows, hub_rows, take
from telescope_rollout.parsers import extract_code_block, strip_eos, strip_think_tags

INFO_CAP = 4_000


def outputs_match(got: str, expected: str) -> bool:
    """Line-by-line equality ignoring trailing whitespace and trailing blank lines."""
    a = [line.rstrip() for line in got.strip().splitlines()]
    b = [line.rstrip() for line in expected.strip().splitlines()]
    return a == b


# Appended to the model's code for a function-call test; the name is inserted with repr().
_CALL_HARNESS = """

import json as _tl_json, sys as _tl_sys
_tl_args = _tl_json.loads(_tl_sys.stdin.read())
_tl_fn = globals().get({name!r})
if _tl_fn is None and "Solution" in globals():
    _tl_fn = getattr(Solution(), {name!r})
_tl_result = _tl_fn(*_tl_args) if isinstance(_tl_args, list) else _tl_fn(_tl_args)
print()
print(_tl_json.dumps(_tl_result))
"""


def call_result_matches(stdout: str, expected_json: str) -> bool:
    """The last stdout line, read as JSON, equals the expected JSON value (or its one-item list)."""
    lines = [line for line in stdout.strip().splitlines() if line.strip()]
    if not lines:
        return False
    try:
        got = json.loads(lines[-1])
        expected = json.loads(expected_json)
    except ValueError:
        return False
    return expected in (got, [got])


def _tests_from_row(row: dict[str, Any]) -> list[dict[str, str]]:
    info = row.get("verification_info") or row.get("info") or {}
    info = json.loads(info) if isinstance(info, str) else info
    tests = row.get("tests") or info.get("tests") or info.get("test_cases") or []
    tests = json.loads(tests) if isinstance(tests, str) else tests
    if isinstance(tests, dict) and tests.get("fn_name"):
        name = str(tests["fn_name"])
        return [
            {"input": _as_json(i), "output": _as_json(o), "fn_name": name}
            for i, o in zip(tests.get("inputs", []), tests.get("outputs", []), strict=False)
        ]
    if isinstance(tests, dict) and "inputs" in tests:
        tests = [{"input": i, "output": o} for i, o in zip(tests["inputs"], tests["outputs"], strict=False)]
    return [
        {"input": str(t.get("input", "")), "output": str(t.get("output", ""))}
        | ({"fn_name": str(t["fn_name"])} if t.get("fn_name") else {})
        for t in tests
        if isinstance(t, dict)
    ]


def _as_json(value: Any) -> str:
    """A function-call argument list or result as JSON text (rows may hold it parsed or as text)."""
    if isinstance(value, str):
        try:
            json.loads(value)
        except ValueError:
            return json.dumps(value)
        return value
    return json.dumps(value)


class I3CodeEnv(SingleTurnEnvironment):
    """Kwargs: ``sandbox``, ``dataset`` ("bundled" or a hub name), ``max_num_tests`` 15,
    ``timeout_per_test`` 10 s, ``memory_mb`` 2048, ``max_concurrent_tests`` 8, ``random_seed`` 42,
    ``min_difficulty``/``max_difficulty`` (hub column ``avg@8_qwen3_4b_instruct_2507``), and the
    original's provider settings (``provider``, ``provider_kwargs``, ...) kept for the CLI."""

    instruction_prompt = (
        "Solve the following problem in Python. Read from stdin, write to stdout, and put your solution "
        "in one ```python code block."
    )
    metrics_ranges: ClassVar[dict[str, dict[str, Any]]] = {
        "passed": {"min": 0.0, "max": 1.0, "invert": False},
        "pass_rate": {"min": 0.0, "max": 1.0, "invert": False},
        "sandbox_error": {"min": 0.0, "max": 1.0, "invert": True},
    }
    optional: ClassVar[tuple[str, ...]] = ("datasets",)
    needs: ClassVar[tuple[str, ...]] = ("sandbox",)
    reward_min = 0.0
    reward_max = 1.0
    sandbox: SandboxLike | None = None
    dataset: str = "PrimeIntellect/INTELLECT-3-RL"
    subset: str | None = "code"
    split: str = "train"
    max_num_tests: int = 15
    timeout_per_test: float = 10.0
    memory_mb: int = 2048
    max_concurrent_tests: int = 8
    max_retries: int = 3
    random_seed: int = 42
    min_difficulty: float | None = None
    max_difficulty: float | None = None

    async def prepare_resources(self) -> None:
        if self.sandbox is None:
            raise RuntimeError(
                "i3_code needs a sandbox: pass sandbox=<SandboxLike> (the CLI builds one from `provider`)"
            )

    def _keep(self, row: dict[str, Any]) -> bool:
        d = row.get("avg@8_qwen3_4b_instruct_2507")
        if d is None:
            return True
        return (self.min_difficulty is None or d >= self.min_difficulty) and (
            self.max_difficulty is None or d <= self.max_difficulty
        )

    def load_dataset(self, num_samples: int = -1, **kwargs: Any) -> list[Sample]:
        if self.dataset == BUNDLED:
            rows = bundled_rows("i3_code.jsonl")
        else:
            rows = (r for r in hub_rows(self.dataset, self.subset, self.split) if self._keep(r))
        samples = []
        for r in take(rows, num_samples):
            tests = _tests_from_row(r)
            if tests:
                samples.append(
                    Sample(r.get("question") or r.get("prompt") or r["problem"], "", {"tests": tests})
                )
        return self._set_samples(samples, num_samples)

    async def _run_test(self, code: str, test: dict[str, str], sem: asyncio.Semaphore) -> dict[str, Any]:
        assert self.sandbox is not None
        err = "no attempt made"
        fn_name = test.get("fn_name")
        program = code + _CALL_HARNESS.format(name=fn_name) if fn_name else code
        async with sem:
            for attempt in range(self.max_retries):
                try:
                    res = await self.sandbox.run(
                        program,
                        stdin=test["input"],
                        timeout_s=self.timeout_per_test,
                        memory_mb=self.memory_mb,
                    )
                except Exception as exc:
                    err = f"{type(exc).__name__}: {exc}"
                    continue
                matches = call_result_matches if fn_name else outputs_match
                ok = not res.timed_out and res.exit_code == 0 and matches(res.stdout, test["output"])
                return {
                    "ok": ok,
                    "timeout": res.timed_out,
                    "error": res.exit_code != 0,
                    "stderr": res.stderr,
                    "retries": attempt,
                    "sandbox_error": False,
                }
        return {
            "ok": False,
            "timeout": False,
            "error": False,
            "stderr": err,
            "retries": self.max_retries,
            "sandbox_error": True,
        }

    async def compute_reward(self, completion: str, sample: Sample, eos_token: str = "") -> RewardResult:
        await self.prepare_resources()
        text = strip_think_tags(strip_eos(completion, eos_token or self.eos_token))
        code = extract_code_block(text, "python")
        tests = list(sample.metadata.get("tests") or [])
        if len(tests) > self.max_num_tests:
            tests = random.Random(f"{self.random_seed}:{sample.prompt}").sample(tests, self.max_num_tests)
        metrics = {
            "passed": 0.0,
            "pass_rate": 0.0,
            "sandbox_error": 0.0,
            "num_test_cases": float(len(tests)),
            "num_timeouts": 0.0,
            "num_errors": 0.0,
            "retry_count": 0.0,
            "generated_code_chars": float(len(code or "")),
        }
        if not code or not tests:
            info = [
                {
                    "turn_order": 0,
                    "info_key": "error",
                    "info_value": "no python code block",
                    "info_type": "text",
                }
            ]
            return RewardResult(0.0, metrics, {}, info if not code else [])
        t0 = time.perf_counter()
        sem = asyncio.Semaphore(max(1, self.max_concurrent_tests))
        results = await asyncio.gather(*(self._run_test(code, t, sem) for t in tests))
        n_ok = sum(r["ok"] for r in results)
        sandbox_error = any(r["sandbox_error"] for r in results)
        passed = n_ok == len(tests) and not sandbox_error
        metrics.update(
            passed=float(passed),
            pass_rate=n_ok / len(tests),
            sandbox_error=float(sandbox_error),
            num_timeouts=float(sum(r["timeout"] for r in results)),
            num_errors=float(sum(r["error"] for r in results)),
            retry_count=float(sum(r["retries"] for r in results)),
            test_time_s=time.perf_counter() - t0,
        )
        stderr = next((r["stderr"] for r in results if r["stderr"]), "")
        info = [
            {
                "turn_order": 0,
                "info_key": "generated_code",
                "info_value": code[:INFO_CAP],
                "info_type": "text",
            },
            {
                "turn_order": 0,
                "info_key": "test_summary",
                "info_value": f"{n_ok}/{len(tests)} passed",
                "info_type": "text",
            },
        ]
        if stderr:
            info.append(
                {
                    "turn_order": 0,
                    "info_key": "runner_stderr",
                    "info_value": stderr[:INFO_CAP],
                    "info_type": "stderr",
                }
            )
        return RewardResult(float(passed), metrics, {}, info)
