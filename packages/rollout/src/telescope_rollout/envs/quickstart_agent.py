"""quickstart_agent: the quickstart's sums, asked by an agent on the OpenAI API in two calls.

The agent (``QuickstartAgentEnv.run``, on the ``openai`` client the gateway hands it) asks
"What is a + b?", then, with the model's answer in the conversation, "Check it, then reply with
just the number." Both calls are model turns of one sample, trained on the tokens sampled. Reward
as ``quickstart_add`` on the final answer: 1.0 for the bare right number, 0.5 when its last number
is right. Procedurally generated and offline. A template for agents of one's own: replace ``run``.

quickstart_agent_command: the same agent as a program (``agents/sums_agent.py``, plain HTTP), run
in the local sandbox (bubblewrap) once per episode; it writes its last answer to ``answer.txt``,
which the reward reads. A template for agents that are programs: set ``command`` and ``files``.
"""

from __future__ import annotations

from pathlib import Path
from types import MappingProxyType
from typing import Any

from telescope_rollout._types import Message, RewardResult, Sample
from telescope_rollout.envs._agent import AgentEnvironment, AgentEpisode, CommandAgentEnvironment
from telescope_rollout.envs.quickstart_add import AdditionSums, addition_reward
from telescope_rollout.parsers import strip_eos

CHECK = "Check it, then reply with just the number."


class QuickstartAgentEnv(AdditionSums, AgentEnvironment):
    """Two-call addition agent (the sums task: ``quickstart_add.AdditionSums``)."""

    max_calls = 4

    def load_dataset(self, num_samples: int | None = -1, **kwargs: Any) -> list[Sample]:
        return self._set_samples(self.sums(num_samples), -1)

    async def run(self, client: Any, sample: Sample) -> str:
        messages: list[Message] = self.get_initial_prompt(sample)
        first = await client.chat.completions.create(model="policy", messages=messages)
        messages += [first.choices[0].message.model_dump(), {"role": "user", "content": CHECK}]
        second = await client.chat.completions.create(model="policy", messages=messages)
        return str(second.choices[0].message.content or "")

    def compute_reward(self, episode: AgentEpisode, eos_token: str = "") -> RewardResult:
        text = strip_eos(str(episode.result or ""), eos_token or self.eos_token)
        return addition_reward(text, episode.sample.answer)


class QuickstartCommandAgentEnv(AdditionSums, CommandAgentEnvironment):
    """The two-call addition agent as a sandboxed program (module docstring)."""

    max_calls = 4
    command = ("python3", "sums_agent.py")
    files = MappingProxyType({"sums_agent.py": str(Path(__file__).parent / "agents" / "sums_agent.py")})
    files_out = ("answer.txt",)

    def load_dataset(self, num_samples: int | None = -1, **kwargs: Any) -> list[Sample]:
        return self._set_samples(self.sums(num_samples), -1)

    def compute_reward(self, episode: AgentEpisode, eos_token: str = "") -> RewardResult:
        text = episode.files.get("answer.txt", b"").decode(errors="replace")
        return addition_reward(strip_eos(text, eos_token or self.eos_token), episode.sample.answer)
