"""quickstart_agent: the quickstart's sums, asked by an agent on the OpenAI API in two calls.

The agent (``QuickstartAgentEnv.run``, on the ``openai`` client the gateway hands it) asks
"What is a + b?", then, with the model's answer in the conversation, "Check it, then reply with
just the number." Both calls are model turns of one sample, trained on the tokens sampled. Reward
as ``quickstart_add`` on the final answer: 1.0 for the bare right number, 0.5 when its last number
is right. Procedurally generated and offline. A template for agents of one's own: replace ``run``.
"""

from __future__ import annotations

from typing import Any, ClassVar

from telescope_rollout._types import Message, RewardResult, Sample
from telescope_rollout.envs._agent import AgentEnvironment, AgentEpisode
from telescope_rollout.envs._env import unit_ranges
from telescope_rollout.envs.quickstart_add import QuickstartAddEnv, score_addition
from telescope_rollout.parsers import strip_eos

CHECK = "Check it, then reply with just the number."


class QuickstartAgentEnv(AgentEnvironment):
    """Two-call addition agent; kwargs ``num_samples`` (2000), ``seed`` (0), ``max_operand`` (99)."""

    metrics_ranges: ClassVar[dict[str, dict[str, Any]]] = unit_ranges("exact", "correct")
    reward_min = 0.0
    reward_max = 1.0
    num_samples: int = 2000
    seed: int = 0
    max_operand: int = 99
    max_calls = 4

    def load_dataset(self, num_samples: int | None = -1, **kwargs: Any) -> list[Sample]:
        sums = QuickstartAddEnv(num_samples=self.num_samples, seed=self.seed, max_operand=self.max_operand)
        return self._set_samples(sums.load_dataset(num_samples), -1)

    async def run(self, client: Any, sample: Sample) -> str:
        messages: list[Message] = self.get_initial_prompt(sample)
        first = await client.chat.completions.create(model="policy", messages=messages)
        messages += [first.choices[0].message.model_dump(), {"role": "user", "content": CHECK}]
        second = await client.chat.completions.create(model="policy", messages=messages)
        return str(second.choices[0].message.content or "")

    def compute_reward(self, episode: AgentEpisode, eos_token: str = "") -> RewardResult:
        answer = episode.sample.answer
        reward, exact, last = score_addition(
            strip_eos(str(episode.result or ""), eos_token or self.eos_token), answer
        )
        return RewardResult(
            reward, {"exact": float(exact), "correct": float(last)}, {"exact": answer, "correct": answer}
        )
