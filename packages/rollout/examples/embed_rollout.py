"""Embed Telescope's rollout engine in your own program: server URLs and environments in, scored
groups out. Needs only ``telescope-rollout`` (no torch, no Telescope CLI, no config file).

Start an OpenAI-compatible vLLM server first (``return_token_ids`` needs vLLM >= 0.10), e.g.
    python -m vllm.entrypoints.openai.api_server --model MODEL_DIR --port 8100
then run
    python packages/rollout/examples/embed_rollout.py --model-dir MODEL_DIR --server http://127.0.0.1:8100

Each batch holds ``prompts_batch_size_for_trainer`` groups of ``group_size`` completions with their
token ids, vLLM logprobs, rewards and group advantages. The advantages are yours to choose: pass
``advantage_fn`` (the rewards of one group in, one advantage per completion out). Here it is the
torch-free GRPO of ``telescope_rollout.testing``; with torch installed,
``functools.partial(telescope_algos.group_advantages, algorithm="grpo")`` is what ``telescope train``
uses, and a plain function works as well. After you change the server's weights, call
``engine.weights_updated(version)`` so the engine keeps the rollouts within ``max_async_rollout``
steps of them (and cancels groups older than ``max_off_policy_steps``).
"""

from __future__ import annotations

import argparse
import asyncio

from telescope_rollout import (
    EngineSettings,
    InferenceClient,
    MultiEnvSampler,
    RewardResult,
    RolloutEngine,
    Sample,
    SamplerEntry,
    SingleTurnEnvironment,
    Tokenizer,
)
from telescope_rollout.testing import group_advantages


class Parrot(SingleTurnEnvironment):
    """Reward 1 when the reply contains the requested word."""

    words = ("apple", "river", "stone", "cloud")

    def load_dataset(self, num_samples: int = -1, **kwargs) -> list[Sample]:
        samples = [Sample(f"Say the word '{w}'.", w) for w in self.words]
        return self._set_samples(samples, num_samples)

    def compute_reward(self, completion: str, sample: Sample, eos_token: str = "") -> RewardResult:
        hit = sample.answer in completion.lower()
        return RewardResult(float(hit), {"hit": float(hit)})


async def main(model_dir: str, servers: list[str], steps: int) -> None:
    """Run ``steps`` batches of the Parrot environment on ``servers`` and print each."""
    tokenizer = Tokenizer.from_pretrained(model_dir)  # tokenizer.json + chat template, no transformers
    env = Parrot()
    env.load_dataset()
    sampler = MultiEnvSampler([SamplerEntry("parrot", 1.0, len(env))], seed=0)
    settings = EngineSettings(
        group_size=4,
        prompts_batch_size_for_trainer=2,
        max_concurrent_prompts_per_server=4,
        max_tokens=32,
        max_model_len=512,  # the server's --max-model-len
        scheduling_policy="fcfs",  # "priority" only if the server runs --scheduling-policy priority
        discard_group_zero_advantage=False,
    )
    async with InferenceClient(servers, timeout_s=300) as client:
        engine = RolloutEngine(
            settings, environments={"parrot": env}, sampler=sampler, tokenizer=tokenizer, client=client,
            advantage_fn=group_advantages,  # GRPO; any function of one group's rewards works
        )  # fmt: skip
        async with engine:
            for _ in range(steps):
                batch = await engine.next_batch(timeout_s=600)
                reward = batch.metrics["rollout/reward_mean"]
                print(f"step {batch.step}: {len(batch.groups)} groups, mean reward {reward:.2f}")
                for group in batch.groups:
                    for s in group.samples:
                        text = s.completion_text[:40]
                        print(
                            f"  [{s.group_id}/{s.sample_id}] r={s.reward:.0f} A={s.advantage:+.2f} {text!r}"
                        )
                # ... train on batch.samples here, push the weights, then:
                engine.weights_updated(engine.version + 1)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="Embed the Telescope rollout engine")
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--server", action="append", required=True, help="repeat for several servers")
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()
    asyncio.run(main(args.model_dir, args.server, args.steps))
