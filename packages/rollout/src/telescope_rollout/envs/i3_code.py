"""i3_code: competitive-programming problems graded by running tests in a sandbox.

Two kinds of test, as in INTELLECT-3-RL: stdin/stdout tests and function-call tests (rows with
``fn_name``); how rows are read and outputs judged is in :mod:`._code_tests`.

The environment never imports telescope_sandbox: the composition root passes any
:class:`~telescope_rollout.envs.SandboxLike` as ``sandbox=`` (or sets ``env.sandbox``) before the
first reward. Reward 1 iff every selected test passes. Sandbox failures are retried
(``max_retries``) and then reported as ``sandbox_error`` with reward 0.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass
from typing import Any, ClassVar

from telescope_rollout._types import RewardResult, Sample
from telescope_rollout.envs._code_tests import (
    call_result_matches,
    outputs_match,
    program_for,
    tests_from_row,
)
from telescope_rollout.envs._data import HubDatasetEnv
from telescope_rollout.envs._env import unit_ranges
from telescope_rollout.envs._sandbox import SandboxLike
from telescope_rollout.parsers import extract_code_block, strip_eos, strip_think_tags

__all__ = ["I3CodeEnv", "call_result_matches", "outputs_match", "tests_from_row"]

INFO_CAP = 4_000


class I3CodeEnv(HubDatasetEnv):
    """Kwargs: ``sandbox``, ``dataset`` ("bundled" or a hub name; alias ``dataset_name``),
    ``subset``/``dataset_subset`` ("code"), ``split``/``dataset_split``, ``max_num_tests`` 15,
    ``timeout_per_test`` 10 s, ``memory_mb`` 2048, ``max_concurrent_tests`` 8, ``random_seed`` 42,
    ``difficulty_key`` (``avg@8_qwen3_4b_instruct_2507``) with ``min_difficulty``/``max_difficulty``
    (a row without the value counts as 0), and the sandbox provider settings (``provider``,
    ``provider_kwargs``, ...) that the CLI reads to build the sandbox."""

    instruction_prompt = (
        "Solve the following problem in Python. Read from stdin, write to stdout, and put your solution "
        "in one ```python code block."
    )
    metrics_ranges: ClassVar[dict[str, dict[str, Any]]] = unit_ranges(
        "passed", "pass_rate", inverted=("sandbox_error",)
    )
    needs: ClassVar[tuple[str, ...]] = ("sandbox",)
    reward_min = 0.0
    reward_max = 1.0
    sandbox: SandboxLike | None = None
    dataset = "PrimeIntellect/INTELLECT-3-RL"
    subset = "code"
    bundled_file = "i3_code.jsonl"
    max_num_tests: int = 15
    timeout_per_test: float = 10.0
    memory_mb: int = 2048
    max_concurrent_tests: int = 8
    max_retries: int = 3
    random_seed: int = 42
    difficulty_key: str | None = "avg@8_qwen3_4b_instruct_2507"
    min_difficulty: float | None = None
    max_difficulty: float | None = None

    async def prepare_resources(self) -> None:
        if self.sandbox is None:
            raise RuntimeError(
                "i3_code needs a sandbox: pass sandbox=<SandboxLike> (the CLI builds one from `provider`)"
            )

    def _keep(self, row: dict[str, Any]) -> bool:
        if not self.difficulty_key or (self.min_difficulty is None and self.max_difficulty is None):
            return True
        d = row.get(self.difficulty_key)
        d = 0.0 if d is None else float(d)
        return (self.min_difficulty is None or d >= self.min_difficulty) and (
            self.max_difficulty is None or d <= self.max_difficulty
        )

    def row_to_sample(self, row: dict[str, Any]) -> Sample | None:
        """One hub row (``question``, ``info`` JSON with ``tests`` JSON) as a Sample; None when it
        has no question or no readable tests, or falls outside the difficulty range."""
        question = row.get("question") or row.get("prompt") or row.get("problem")
        tests = tests_from_row(row)
        if not isinstance(question, str) or not question or not tests or not self._keep(row):
            return None
        info = row.get("info")
        source = ""
        if isinstance(info, str):
            try:
                parsed: Any = json.loads(info) or {}  # any JSON: .get on a non-object raises AttributeError
                source = str(parsed.get("source") or "")
            except (ValueError, AttributeError):
                source = ""
        return Sample(question, "", {"tests": tests, "source": source, "num_test_cases": len(tests)})

    async def _run_test(self, code: str, test: dict[str, str], sem: asyncio.Semaphore) -> _TestRun:
        assert self.sandbox is not None
        err = "no attempt made"
        fn_name = test.get("fn_name")
        program = program_for(code, fn_name)
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
                return _TestRun(ok, res.timed_out, res.exit_code != 0, res.stderr, attempt)
        return _TestRun(False, False, False, err, self.max_retries, sandbox_error=True)

    def _tests_of(self, sample: Sample) -> list[dict[str, str]]:
        """The sample's tests, at most ``max_num_tests`` of them (a seeded choice per prompt)."""
        tests = list(sample.metadata.get("tests") or [])
        if len(tests) > self.max_num_tests:
            tests = random.Random(f"{self.random_seed}:{sample.prompt}").sample(tests, self.max_num_tests)
        return tests

    async def compute_reward(self, completion: str, sample: Sample, eos_token: str = "") -> RewardResult:
        await self.prepare_resources()
        text = strip_think_tags(strip_eos(completion, eos_token or self.eos_token))
        code = extract_code_block(text, "python")
        tests = self._tests_of(sample)
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
            return RewardResult(0.0, metrics, {}, [] if code else [_info("error", "no python code block")])
        t0 = time.perf_counter()
        sem = asyncio.Semaphore(max(1, self.max_concurrent_tests))
        results = await asyncio.gather(*(self._run_test(code, t, sem) for t in tests))
        n_ok = sum(r.ok for r in results)
        sandbox_error = any(r.sandbox_error for r in results)
        passed = n_ok == len(tests) and not sandbox_error
        metrics.update(
            passed=float(passed),
            pass_rate=n_ok / len(tests),
            sandbox_error=float(sandbox_error),
            num_timeouts=float(sum(r.timeout for r in results)),
            num_errors=float(sum(r.error for r in results)),
            retry_count=float(sum(r.retries for r in results)),
            test_time_s=time.perf_counter() - t0,
        )
        info = [
            _info("generated_code", code[:INFO_CAP]),
            _info("test_summary", f"{n_ok}/{len(tests)} passed"),
        ]
        stderr = next((r.stderr for r in results if r.stderr), "")
        if stderr:
            info.append(_info("runner_stderr", stderr[:INFO_CAP], "stderr"))
        return RewardResult(float(passed), metrics, {}, info)


@dataclass
class _TestRun:
    """How one test went: passed, timed out, exited with an error; the first retries failed to reach
    the sandbox (``sandbox_error``: every attempt did)."""

    ok: bool
    timeout: bool
    error: bool
    stderr: str
    retries: int
    sandbox_error: bool = False


def _info(key: str, value: str, kind: str = "text") -> dict[str, Any]:
    """One ``info_turns`` row of the reward."""
    return {"turn_order": 0, "info_key": key, "info_value": value, "info_type": kind}
