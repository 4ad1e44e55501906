"""i3_code: hub rows, the stdin judge, and function-call tests run for real in a local subprocess."""

import asyncio
import json
import sys
from typing import Any

import pytest

from telescope_rollout import Sample, SandboxLike, get_environment
from telescope_rollout.envs import RunResult
from telescope_rollout.envs._code_tests import call_result_matches, outputs_match
from telescope_rollout.envs._code_tests import tests_from_row as read_tests
from telescope_rollout.envs.i3_code import I3CodeEnv


def _i3(**kwargs: Any) -> I3CodeEnv:
    env = get_environment("i3_code", **kwargs)
    assert isinstance(env, I3CodeEnv)
    return env


def _sample(env: I3CodeEnv, row: dict[str, Any]) -> Sample:
    s = env.row_to_sample(row)
    assert s is not None
    return s


class FakeSandbox:
    """Scripted results for the retry/error paths; 'runs' ``print(N)`` by returning N."""

    def __init__(self, fail_times=0):
        self.calls = 0
        self.fail_times = fail_times

    async def run(self, code, *, language="python", stdin="", timeout_s=10.0, memory_mb=512):
        self.calls += 1
        if self.calls <= self.fail_times:
            raise ConnectionError("sandbox down")
        await asyncio.sleep(0)
        if "while True" in code:
            return RunResult("", "", -9, True, timeout_s)
        if "raise" in code:
            return RunResult("", "Traceback: boom", 1, False, 0.01)
        printed = code.rsplit("print(", 1)[1].split(")", 1)[0]
        return RunResult(printed + "\n", "", 0, False, 0.01)


class LocalSandbox:
    """Runs the program with this interpreter in a subprocess (tests only; no isolation)."""

    async def run(self, code, *, language="python", stdin="", timeout_s=10.0, memory_mb=512):
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-I",
            "-c",
            code,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(stdin.encode()), timeout_s)
        except TimeoutError:
            proc.kill()
            await proc.wait()
            return RunResult("", "", -9, True, timeout_s)
        assert proc.returncode is not None  # set once communicate() has returned
        return RunResult(out.decode(), err.decode(), proc.returncode, False, 0.0)


def _one_test_sample(output):
    return Sample("p", "", {"tests": [{"input": "", "output": output}, {"input": "x", "output": output}]})


async def test_i3_code_with_fake_sandbox():
    sb = FakeSandbox()
    assert isinstance(sb, SandboxLike)
    env = _i3(dataset="bundled", sandbox=sb)
    assert len(env.load_dataset()) >= 10
    ok = await env.score("```python\nprint(7)\n```", _one_test_sample("7"))
    assert ok.total_reward == 1.0
    assert ok.sample_metrics["pass_rate"] == 1.0
    assert {t["info_key"] for t in ok.info_turns} == {"generated_code", "test_summary"}
    wrong = await env.score("```python\nprint(8)\n```", _one_test_sample("7"))
    assert wrong.total_reward == 0.0
    assert wrong.sample_metrics["pass_rate"] == 0.0
    crash = await env.score("```python\nraise\n```", _one_test_sample("7"))
    assert crash.sample_metrics["num_errors"] == 2
    assert any(t["info_type"] == "stderr" for t in crash.info_turns)
    slow = await env.score("```python\nwhile True: pass\n```", _one_test_sample("7"))
    assert slow.sample_metrics["num_timeouts"] == 2
    none = await env.score("no code here", _one_test_sample("7"))
    assert none.total_reward == 0.0
    assert none.info_turns[0]["info_value"] == "no python code block"


async def test_i3_code_sandbox_errors_and_missing_sandbox():
    env = _i3(dataset="bundled", sandbox=FakeSandbox(fail_times=100), max_retries=2)
    r = await env.score("```python\nprint(7)\n```", _one_test_sample("7"))
    assert r.total_reward == 0.0
    assert r.sample_metrics["sandbox_error"] == 1.0
    flaky = _i3(sandbox=FakeSandbox(fail_times=1), max_concurrent_tests=1)
    r = await flaky.score("```python\nprint(7)\n```", _one_test_sample("7"))
    assert r.total_reward == 1.0
    assert r.sample_metrics["retry_count"] == 1
    with pytest.raises(RuntimeError, match="sandbox"):
        await get_environment("i3_code").prepare_resources()


# --- the hub row layout (docs/rollout.md, "The i3 code-test format") ----------------------------
def _hub_row(tests, question: object = "Write f.", **extra):
    # INTELLECT-3-RL code rows: `info` is a JSON string whose `tests` is a JSON string again.
    return {"question": question, "info": json.dumps({"tests": json.dumps(tests), "source": "lc"}), **extra}


def test_hub_rows_map_to_samples():
    env = _i3(dataset_name="PrimeIntellect/INTELLECT-3-RL", dataset_subset="code")
    assert (env.dataset, env.subset, env.split) == ("PrimeIntellect/INTELLECT-3-RL", "code", "train")
    stdin = _sample(env, _hub_row({"inputs": ["1 2\n", ["3", "4"]], "outputs": ["3\n", ["7"]]}))
    assert stdin.prompt == "Write f."
    assert stdin.answer == ""
    assert stdin.metadata["tests"] == [{"input": "1 2\n", "output": "3\n"}, {"input": "3\n4", "output": "7"}]
    assert stdin.metadata["source"] == "lc"
    fn = _sample(
        env,
        _hub_row(
            {
                "fn_name": "twoSum",
                "inputs": ["[2, 7, 11, 15]\n9", [[3, 3], 6]],
                "outputs": ["[0, 1]", [[0, 1]]],
            }
        ),
    )
    assert fn.metadata["tests"] == [
        {"input": "[2, 7, 11, 15]\n9", "output": "[0, 1]", "fn_name": "twoSum"},
        {"input": "[3, 3]\n6", "output": "[[0, 1]]", "fn_name": "twoSum"},
    ]
    # Rows that are skipped: unreadable info/tests, no question.
    assert env.row_to_sample({"question": "q", "info": "{not json"}) is None
    assert env.row_to_sample({"question": "q", "info": json.dumps({"tests": "{bad"})}) is None
    assert env.row_to_sample({"question": "q", "info": json.dumps({"no_tests": 1})}) is None
    assert env.row_to_sample(_hub_row({"inputs": ["1"], "outputs": ["1"]}, question=None)) is None
    assert read_tests({"info": json.dumps({"tests": json.dumps({"inputs": 3, "outputs": 4})})}) == []


def test_difficulty_filter_counts_a_missing_value_as_zero():
    env = _i3(min_difficulty=0.2, max_difficulty=0.8)
    tests = {"inputs": ["1"], "outputs": ["1"]}
    key = "avg@8_qwen3_4b_instruct_2507"
    assert env.row_to_sample(_hub_row(tests, **{key: 0.5})) is not None
    assert env.row_to_sample(_hub_row(tests, **{key: 0.9})) is None
    assert env.row_to_sample(_hub_row(tests)) is None  # missing counts as 0, below the minimum
    other = _i3(difficulty_key="pass_rate", max_difficulty=0.5)
    assert other.row_to_sample(_hub_row(tests, pass_rate=0.7, **{key: 0.1})) is None


# --- stdin judge ---------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("got", "expected", "ok"),
    [
        ("3\n", "3", True),
        ("  1 2  \n\n3\n", "1 2\n3\n", True),  # blank lines and surrounding spaces ignored
        ("1  2\n", "1 2", True),  # token-wise
        ("0.3333\n", "0.333333", True),  # |diff| = 0.000033 <= 1e-3
        ("0.335\n", "0.333", False),  # |diff| = 0.002 > 1e-3
        ("12345678901234567891", "12345678901234567890", False),  # exact decimals: |diff| = 1
        ("YES", "yes", False),
        ("", "0", False),
        ("1 2", "1 2 3", False),
        ("nan", "nan", True),  # equal strings pass before any number parsing
        ("inf 1", "inf 2", False),
        ("東京", "東京\n", True),
    ],
)
def test_stdout_judge(got, expected, ok):
    assert outputs_match(got, expected) is ok


def test_call_result_judge():
    assert call_result_matches("debug print\n\n[1, 2]\n", "[1, 2]")  # no marker: the last line
    assert call_result_matches("\n3\n", "[3]")  # a one-item list also accepts its item
    assert not call_result_matches("\n0\n", "[0, 1]")  # not the first of several items
    assert not call_result_matches("\n[2, 1]\n", "[1, 2]")
    assert not call_result_matches("", "3")
    assert not call_result_matches("not json", "3")
    assert not call_result_matches("\n3\n", "{broken")
    assert call_result_matches('\n"{broken"\n', "{broken")  # not JSON: the expected plain string


# --- function-call tests, run for real -----------------------------------------------------------
def _fn_sample(fn_name, cases):
    tests = [{"input": i, "output": o, "fn_name": fn_name} for i, o in cases]
    return Sample("p", "", {"tests": tests})


FN_CASES = [
    # (solution, fn_name, [(input text, expected output), ...], reward)
    (
        "class Solution:\n    def twoSum(self, nums: List[int], target: int) -> List[int]:\n"
        "        seen = {}\n        for i, x in enumerate(nums):\n"
        "            if target - x in seen:\n                return [seen[target - x], i]\n"
        "            seen[x] = i\n",
        "twoSum",
        [("[2, 7, 11, 15]\n9", "[0, 1]"), ("[3, 3]\n6", "[[0, 1]]")],  # List from the prelude
        1.0,
    ),
    (
        "def rep(s, k):\n    print('debugging', s)\n    return s * k\n",
        "rep",
        [('"ab"\n2', '"abab"'), ("'x\\ny'\n1", '"x\\ny"'), ('""\n5', '""')],  # string args
        1.0,
    ),
    (
        "def flat(xs):\n    out = []\n    for x in xs:\n"
        "        out.extend(flat(x) if isinstance(x, list) else [x])\n    return out\n",
        "flat",
        [("[[1, [2, [3]]], [], [4]]", "[1, 2, 3, 4]"), ("[[[]]]", "[]")],  # nested lists, one arg
        1.0,
    ),
    (
        "def pair(a, b):\n    return (b, a)\n",
        "pair",
        [("(1, 2)\nNone", "[null, [1, 2]]"), ("true\nnull", "[null, true]")],  # tuples; JSON lines
        1.0,
    ),
    (
        "def name(d):\n    return {v: k for k, v in d.items()}\n",
        "name",
        [("{'a': 1}", '{"1": "a"}'), ("{}", "{}")],  # int keys come back as JSON strings
        1.0,
    ),
    ("def word():\n    return 'abc'\n", "word", [("", "abc")], 1.0),  # expected: a plain non-JSON string
    ("def first(xs):\n    return xs[0]\n", "first", [("[0, 1]", "[0, 1]")], 0.0),  # 0 is not [0, 1]
    ("def boom(x):\n    return 1 / x\n", "boom", [("0", "1")], 0.0),
    ("def slow(x):\n    while True:\n        pass\n", "slow", [("1", "1")], 0.0),
]


@pytest.mark.parametrize(("solution", "fn_name", "cases", "reward"), FN_CASES, ids=[c[1] for c in FN_CASES])
async def test_function_call_tests_are_graded(solution, fn_name, cases, reward):
    env = _i3(sandbox=LocalSandbox(), timeout_per_test=5.0)
    if fn_name == "slow":
        env.timeout_per_test = 0.5
    r = await env.score(f"<think>easy</think>\n```python\n{solution}```", _fn_sample(fn_name, cases))
    assert r.total_reward == reward, r.info_turns
    if fn_name == "slow":
        assert r.sample_metrics["num_timeouts"] == 1


async def test_function_call_from_a_hub_row_end_to_end():
    env = _i3(sandbox=LocalSandbox())
    row = _hub_row({"fn_name": "add", "inputs": ["1\n2", [3, 4]], "outputs": ["3", [7]]})
    sample = _sample(env, row)
    good = await env.score("```python\ndef add(a, b):\n    return a + b\n```", sample)
    assert good.total_reward == 1.0
    bad = await env.score("```python\ndef add(a, b):\n    return a - b\n```", sample)
    assert bad.total_reward == 0.0
    assert bad.sample_metrics["pass_rate"] == 0.0
    stdin = _sample(env, _hub_row({"inputs": ["2 3\n"], "outputs": ["5\n"]}))
    ok = await env.score("```python\na, b = map(int, input().split())\nprint(a + b)\n```", stdin)
    assert ok.total_reward == 1.0
    # `from __future__` must stay first: no prelude then, and the code still runs.
    fut = await env.score(
        "```python\nfrom __future__ import annotations\nprint(sum(map(int, input().split())))\n```", stdin
    )
    assert fut.total_reward == 1.0
