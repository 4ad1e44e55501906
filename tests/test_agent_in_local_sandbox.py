"""Command agents (``CommandAgentEnvironment``) in the real local sandbox, through the rollout engine.

The agent is a program in bubblewrap (no network): it reaches its episode's endpoint at
``127.0.0.1:8000`` inside, relayed to the episode's own Unix socket; the model is the fake server.
The built-in ``quickstart_agent_command`` (plain HTTP) makes two calls, both model turns of one
sample trained on the sampled ids, and is rewarded on the file it writes. A program that exits
badly, hangs, never calls, or tries an episode path not its own fails its sample with the reason, and
nothing is left: no episode, no socket folder, no process.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import pytest

from telescope_rollout import (
    EngineSettings,
    MultiEnvSampler,
    RolloutBatch,
    RolloutEngine,
    RolloutError,
    Sample,
    SamplerEntry,
    Tokenizer,
    get_environment,
)
from telescope_rollout.envs import CommandAgentEnvironment, CommandSandboxLike
from telescope_rollout.envs.quickstart_agent import QuickstartCommandAgentEnv
from telescope_rollout.gateway import AgentGateway
from telescope_rollout.testing import FakeInferenceServer, FakeRequest, group_advantages
from telescope_sandbox import LocalSandbox


class Sevens(QuickstartCommandAgentEnv):
    """quickstart_agent_command on "3 + 4" only."""

    def load_dataset(self, num_samples: int | None = -1, **kwargs: Any) -> list[Sample]:
        return self._set_samples([Sample("What is 3 + 4? Reply with just the number.", "7")], -1)


def _script(code: str) -> CommandAgentEnvironment:
    """A command agent whose program is ``code`` (Python)."""
    folder = Path(tempfile.mkdtemp(prefix="agent-script-"))
    (folder / "agent.py").write_text(code)
    env = Sevens(command=["python3", "agent.py"], files={"agent.py": str(folder / "agent.py")})
    env.agent_timeout_s = 20.0
    return env


def _engine(tokenizer: Tokenizer, server: FakeInferenceServer, env: Any) -> RolloutEngine:
    env.load_dataset()
    settings = EngineSettings(
        group_size=2, prompts_batch_size_for_trainer=1, max_concurrent_prompts_per_server=2,
        max_async_rollout=10, max_tokens=16, max_model_len=512, enable_prompt_prefetch=False,
        enable_thinking=None, discard_group_zero_advantage=False,  # every reward is the same here
    )  # fmt: skip
    sampler = MultiEnvSampler([SamplerEntry("agent", 1.0, len(env))])
    return RolloutEngine(
        settings, environments={"agent": env}, sampler=sampler, tokenizer=tokenizer, client=server,
        advantage_fn=group_advantages,
    )  # fmt: skip


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path) -> Tokenizer:
    return Tokenizer.from_pretrained(tiny_model_dir)


async def _run(
    tokenizer: Tokenizer, env: Any, monkeypatch: pytest.MonkeyPatch
) -> tuple[RolloutBatch | RolloutError, dict[str, list[int]]]:
    """One batch of ``env``'s agents (or the engine's error), the fake model answering "7"; checks
    that nothing is left of the episodes."""
    sampled: dict[str, list[int]] = {}

    def answer(req: FakeRequest) -> tuple[str, list[int]]:
        ids = [*tokenizer.encode("7"), tokenizer.eos_token_id]
        sampled[req.request_id] = ids
        return "7", ids

    sockets: list[str] = []
    listen = AgentGateway.listen_unix

    async def listening(self: AgentGateway, episode: Any) -> str:
        sockets.append(await listen(self, episode))
        return sockets[-1]

    monkeypatch.setattr(AgentGateway, "listen_unix", listening)
    outcome = await _batch(tokenizer, env, answer)
    assert sockets
    assert [p for p in sockets if os.path.exists(os.path.dirname(p))] == []  # every folder gone
    return outcome, sampled


async def _batch(tokenizer: Tokenizer, env: Any, answer: Any) -> RolloutBatch | RolloutError:
    async with LocalSandbox() as sandbox:
        env.sandbox = sandbox
        engine = _engine(tokenizer, FakeInferenceServer(reply=answer), env)
        async with engine:
            try:
                outcome: RolloutBatch | RolloutError = await engine.next_batch(timeout_s=60)
            except RolloutError as exc:
                outcome = exc
            gateway = engine.gateway
            assert gateway is not None
        assert gateway.episodes == {}
    return outcome


async def test_a_command_agent_in_bubblewrap_is_trained_on_its_calls_and_rewarded_on_its_file(
    tokenizer, monkeypatch
):
    env = Sevens()
    assert isinstance(LocalSandbox(), CommandSandboxLike)
    batch, sampled = await _run(tokenizer, env, monkeypatch)
    assert isinstance(batch, RolloutBatch), batch
    (group,) = batch.groups
    for s in group.samples:
        assert s.error is None, s.error_detail
        assert s.num_turns == 2
        assert [t.role for t in s.turns] == ["model", "env", "model"]
        ids = [sampled[f"sample-{s.sample_id}-turn-{k}"] for k in (0, 1)]
        assert [i for i, m in zip(s.completion_ids, s.completion_mask, strict=True) if m] == [
            *ids[0],
            *ids[1],
        ]
        assert s.reward == 1.0  # "7" read back from answer.txt
        assert s.extra_sequences == []


UNKNOWN_EPISODE = """
import os, urllib.error, urllib.request
url = os.environ["OPENAI_BASE_URL"].rsplit("/e/", 1)[0] + "/e/0000000000000000/v1/models"
auth = {"Authorization": "Bearer " + os.environ["OPENAI_API_KEY"]}
try:
    urllib.request.urlopen(urllib.request.Request(url, headers=auth), timeout=10)
except urllib.error.HTTPError as e:
    raise SystemExit(f"status {e.code}")
"""
"""An episode path that is not its own, with its key, on its socket (that a socket answers no other
open episode is tested in packages/rollout/tests/test_gateway_server.py)."""


@pytest.mark.parametrize(
    ("code", "kind", "detail"),
    [
        ("import sys\nsys.stderr.write('boom\\n')\nsys.exit(2)\n", "rollout_error",
         "the agent exited with status 2: boom"),
        ("import time\ntime.sleep(60)\n", "rollout_error", "the agent did not finish within 2 s"),
        ("print('no call')\n", "empty_trajectory", "the agent made no model call"),
        (UNKNOWN_EPISODE, "rollout_error", "the agent exited with status 1: status 401"),
    ],
    ids=["exits", "hangs", "never_calls", "unknown_episode"],
)  # fmt: skip
async def test_a_bad_command_agent_fails_its_sample_with_the_reason(
    tokenizer, code, kind, detail, monkeypatch
):
    env = _script(code)
    env.agent_timeout_s = 2.0
    outcome, _ = await _run(tokenizer, env, monkeypatch)
    assert isinstance(outcome, RolloutError)  # every group failed: the run stops with the reason
    assert kind in str(outcome)
    assert detail in str(outcome)


def test_the_builtin_is_registered_and_reads_its_script():
    env = get_environment("quickstart_agent_command")
    assert isinstance(env, CommandAgentEnvironment)
    sample = Sample("What is 1 + 2?", "3", {"a": 1, "tests": "secret", "_env_name": "x"})
    files = env.agent_files(sample)
    assert b"urllib.request" in files["sums_agent.py"]  # type: ignore[operator]
    opening = json.loads(files["sample.json"])
    assert opening == {"messages": [{"role": "user", "content": "What is 1 + 2?"}], "metadata": {}}
    env.shared_metadata = ["a"]  # what the environment chooses to show
    assert json.loads(env.agent_files(sample)["sample.json"])["metadata"] == {"a": 1}
