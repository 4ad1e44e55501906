"""i3_code graded in the real local sandbox: rollout and sandbox meet only through a protocol."""

from __future__ import annotations

import json

from telescope_rollout import Sample, SandboxLike, SingleTurnEnvironment, get_environment
from telescope_rollout.envs.i3_code import tests_from_row as read_tests  # not collected as a test
from telescope_sandbox import LocalSandbox

SUM = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
WRONG = "```python\nprint(0)\n```"
ESCAPE = "```python\nprint(open('/etc/shadow').read())\n```"


async def test_bundled_problem_graded_in_bubblewrap():
    async with LocalSandbox() as sandbox:
        assert isinstance(sandbox, SandboxLike)
        env = get_environment("i3_code", dataset="bundled", sandbox=sandbox, timeout_per_test=10.0)
        assert isinstance(env, SingleTurnEnvironment)
        samples = env.load_dataset()
        add = next(s for s in samples if "sum" in str(s.prompt))
        right = await env.score(SUM, add)
        assert right.total_reward == 1.0
        assert right.sample_metrics["pass_rate"] == 1.0
        wrong = await env.score(WRONG, add)
        assert wrong.total_reward == 0.0
        escape = await env.score(ESCAPE, add)
        assert escape.total_reward == 0.0
        assert escape.sample_metrics["num_errors"] >= 1  # /etc/shadow does not exist inside


TOP_LEVEL = "```python\ndef add(a, b):\n    return a + b\n```"
METHOD = (
    "```python\nclass Solution:\n    def add(self, a, b):\n        print('noise')\n        return a + b\n```"
)
OFF_BY_ONE = "```python\ndef add(a, b):\n    return a + b + 1\n```"


async def test_function_call_tests_graded_in_bubblewrap():
    row = {
        "question": "Write add(a, b).",
        "info": json.dumps(
            {"tests": json.dumps({"fn_name": "add", "inputs": [[1, 2], [-3, 3]], "outputs": [3, 0]})}
        ),
    }
    sample = Sample(row["question"], "", {"tests": read_tests(row)})
    async with LocalSandbox() as sandbox:
        env = get_environment("i3_code", dataset="bundled", sandbox=sandbox)
        assert isinstance(env, SingleTurnEnvironment)
        for code in (TOP_LEVEL, METHOD):
            result = await env.score(code, sample)
            assert result.total_reward == 1.0, result.info_turns
        wrong = await env.score(OFF_BY_ONE, sample)
        assert wrong.total_reward == 0.0
        assert wrong.sample_metrics["pass_rate"] == 0.0
