"""Environments of the end-to-end tests (``telescope train`` imports them as ``e2e_envs:<Class>``).

- ``DigitsEnv``: reward = the share of digits among a completion's characters, so even a random
  tiny model's groups have spread, and a model that learns writes more digits.
- ``SlowDigitsEnv``: the same reward, given only once ``metrics.jsonl`` (kwarg ``metrics``) holds
  the line of step ``hold_until_step`` (asynchronously; at most two minutes), so an eval of it
  outlasts the training steps before that one however fast the machine is.
- ``LongPromptEnv``: every prompt is far longer than the tests' ``max_model_len``.
- ``EchoToolEnv``: a tool environment whose every model turn counts as one call of its ``echo``
  tool (a random model writes no call syntax), two turns per episode, the digits reward.
- ``HeldToolEnv``: ``EchoToolEnv`` whose first tool call waits two minutes, so its group is still
  in flight, its reward not begun, when the batches after it are assembled.
- ``BrokenRewardEnv``: every reward raises the same error (a grader that is down).
- ``DigitsCommandAgentEnv``: the built-in ``quickstart_agent_command`` (a program in the sandbox,
  two calls), rewarded with the share of digits in the file it writes.
- ``ToolAgentEnv``: an agent on the openai client with an ``echo`` tool (``TOOLS_TEMPLATE`` shows
  tools to the tiny model): three calls, each answer sent back as the result of an ``echo`` call
  (a random model writes no call syntax; a call it did write is answered as such), then a fourth
  call without the first exchange (a history it rewrote: a second training sequence). It returns
  the token ids each answer reported (``return_token_ids``); reward: the digits' share.
"""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path
from typing import Any

from telescope_rollout import AgentEnvironment, RewardResult, Sample, SingleTurnEnvironment
from telescope_rollout.envs import AgentEpisode, ToolCall, ToolEnvironment
from telescope_rollout.envs.quickstart_agent import QuickstartCommandAgentEnv


class DigitsEnv(SingleTurnEnvironment):
    """Reward: the share of digits among the completion's characters (spread even for noise)."""

    reward_min = 0.0
    reward_max = 1.0

    def load_dataset(self, num_samples: int = -1, **kwargs: Any) -> list[Sample]:
        samples = [Sample(f"Count to {n}.", str(n)) for n in range(50)]
        return self._set_samples(samples, num_samples)

    def compute_reward(self, completion: str, sample: Sample, eos_token: str = "") -> RewardResult:
        share = sum(c.isdigit() for c in completion) / max(len(completion), 1)
        return RewardResult(share, {"digits": share})


class SlowDigitsEnv(DigitsEnv):
    """``DigitsEnv`` whose reward waits (without blocking the event loop) for a step's metrics line."""

    def __init__(self, metrics: str = "", hold_until_step: int = 0, **kwargs: Any):
        super().__init__(**kwargs)
        self.metrics = Path(metrics) if metrics else None
        self.hold_until_step = hold_until_step

    def _released(self) -> bool:
        if self.metrics is None or not self.metrics.is_file():
            return self.metrics is None
        lines = [json.loads(x) for x in self.metrics.read_text().splitlines() if x.strip()]
        return any(m.get("step", 0) >= self.hold_until_step and "eval/step" not in m for m in lines)

    async def compute_reward(self, completion: str, sample: Sample, eos_token: str = "") -> RewardResult:
        deadline = time.monotonic() + 120.0
        while not self._released() and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        return super().compute_reward(completion, sample, eos_token)


def echo(text: str) -> str:
    """Return the text."""
    return text


class EchoToolEnv(ToolEnvironment):
    """Every model turn calls ``echo`` with its first characters; the episode ends after 2 turns."""

    reward_min = 0.0
    reward_max = 1.0

    def __init__(self, **kwargs: Any):
        super().__init__(tools=[echo], max_turns=2, **kwargs)

    def load_dataset(self, num_samples: int = -1, **kwargs: Any) -> list[Sample]:
        samples = [Sample(f"Echo {n}.", str(n)) for n in range(50)]
        return self._set_samples(samples, num_samples)

    def parse_tool_calls(self, text: str) -> list[ToolCall]:
        return [ToolCall("echo", {"text": text[:20]}, raw=text[:50])]

    def compute_reward(self, state: Any, eos_token: str = "") -> RewardResult:
        text = state.last_completion_text
        return RewardResult(sum(c.isdigit() for c in text) / max(len(text), 1), self.get_tool_metrics(state))


class HeldToolEnv(EchoToolEnv):
    """``EchoToolEnv`` whose first tool call waits (without blocking the event loop) two minutes:
    an asynchronous run cancels its group as too stale (``max_async``) before it ends."""

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self._held = False

    async def execute_tool(self, call: ToolCall, state: Any = None) -> tuple[bool, str]:
        if not self._held:
            self._held = True
            await asyncio.sleep(120.0)
        return await super().execute_tool(call, state)


class LongPromptEnv(SingleTurnEnvironment):
    """Prompts of 3,000 words: no context of the tests holds one."""

    def load_dataset(self, num_samples: int = -1, **kwargs: Any) -> list[Sample]:
        samples = [Sample("tell me more " * 1000 + str(n), str(n)) for n in range(20)]
        return self._set_samples(samples, num_samples)

    def compute_reward(self, completion: str, sample: Sample, eos_token: str = "") -> RewardResult:
        return RewardResult(0.0, {})


class BrokenRewardEnv(DigitsEnv):
    """Every reward raises: the run can never assemble a batch."""

    def compute_reward(self, completion: str, sample: Sample, eos_token: str = "") -> RewardResult:
        raise RuntimeError("the grader is down")


class DigitsCommandAgentEnv(QuickstartCommandAgentEnv):
    """The sandboxed sums agent, rewarded with the share of digits in its ``answer.txt``."""

    def compute_reward(self, episode: AgentEpisode, eos_token: str = "") -> RewardResult:
        text = episode.files.get("answer.txt", b"").decode(errors="replace")
        share = sum(c.isdigit() for c in text) / max(len(text), 1)
        return RewardResult(share, {"digits": share})


TOOLS_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTools: {% for t in tools %}{{ t.function.name }} {% endfor %}"
    "<|im_end|>\n{% endif %}"
    "{% for m in messages %}{% if m.role == 'tool' %}"
    "<|im_start|>user\n<tool_response>{{ m.content }}</tool_response><|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content or '' }}"
    "{% for c in m.tool_calls or [] %}<tool_call>{{ c.function.name }}</tool_call>{% endfor %}<|im_end|>\n"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
"""ChatML that shows ``tools`` and renders tool calls and results (the tiny model's own ignores tools)."""
ECHO = {
    "type": "function",
    "function": {
        "name": "echo",
        "description": "Say the text back.",
        "parameters": {"type": "object", "properties": {"text": {"type": "string"}}},
    },
}


class ToolAgentEnv(AgentEnvironment):
    """Three tool-using calls, then one with a rewritten history (module docstring)."""

    reward_min = 0.0
    reward_max = 1.0
    max_calls = 8

    def load_dataset(self, num_samples: int = -1, **kwargs: Any) -> list[Sample]:
        return self._set_samples([Sample(f"Count to {n}.", str(n)) for n in range(50)], num_samples)

    async def run(self, client: Any, sample: Sample) -> list[list[int]]:
        messages: list[Any] = [{"role": "user", "content": sample.prompt}]
        sampled: list[list[int]] = []
        for k in range(4):
            if k == 3:  # the agent compacts its history: the first exchange goes
                messages = [messages[0], *messages[3:]]
            reply = await client.chat.completions.create(
                model="policy", messages=messages, tools=[ECHO], extra_body={"return_token_ids": True}
            )
            choice = reply.choices[0]
            sampled.append(list(choice.model_extra["token_ids"]))
            message = choice.message
            messages.append(message.model_dump())
            calls = [(c.id, c.function.arguments) for c in message.tool_calls or []]
            for call_id, text in calls or [(f"echo_{k}", json.dumps({"text": message.content or ""}))]:
                messages.append({"role": "tool", "tool_call_id": call_id, "content": text[:200]})
        return sampled

    def compute_reward(self, episode: AgentEpisode, eos_token: str = "") -> RewardResult:
        text = "".join(str(c["message"].get("content") or "") for c in episode.calls)
        share = sum(ch.isdigit() for ch in text) / max(len(text), 1)
        reported = {"turn_order": 0, "info_key": "token_ids", "info_value": json.dumps(episode.result)}
        return RewardResult(share, {"digits": share}, info_turns=[{**reported, "info_type": "text"}])
