"""i3_code graded in the real local sandbox: rollout and sandbox meet only through a protocol."""

from __future__ import annotations

from telescope_rollout import SandboxLike, get_environment
from telescope_sandbox import LocalSandbox

SUM = "```python\na, b = map(int, input().split())\nprint(a + b)\n```"
WRONG = "```python\nprint(0)\n```"
ESCAPE = "```python\nprint(open('/etc/shadow').read())\n```"


async def test_bundled_problem_graded_in_bubblewrap():
    async with LocalSandbox() as sandbox:
        assert isinstance(sandbox, SandboxLike)
        env = get_environment("i3_code", dataset="bundled", sandbox=sandbox, timeout_per_test=10.0)
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
