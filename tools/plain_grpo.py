"""A plain synchronous GRPO loop: the simplest thing a user could run instead of `telescope train`.

One process, no server, no overlap, every core for torch. Each step takes the next ``batch`` prompts
of an environment, renders them with the model's chat template (the environment's own
``format_prompt``, as Telescope sends them), generates ``group_size`` completions per prompt with
Hugging Face ``generate`` (sampling at ``temperature``, ``max_tokens`` new tokens), scores them
with the environment's reward, takes GRPO's group advantages (``telescope_algos.compute_advantages``,
the same formula Telescope trains with), then one forward and backward over the padded batch
(on-policy policy gradient, the loss averaged over every completion token of the step, as
Telescope's default normalisation), gradient clipping and one AdamW update. No gradient
checkpointing (the batch is small), float32.

``tools/bench_e2e.py`` times it against ``telescope train`` with the same settings; alone:

    python tools/plain_grpo.py --model PATH [--steps 15] [--batch 4] [--group-size 8] [--max-tokens 32]
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import inspect
import itertools
import json
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class PlainRun:
    """What a run did: the start (before the model loads), each step's end, and per step the
    completion tokens generated and the mean reward."""

    started: float
    step_ends: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)


def _completion_mask(completions: Any, eos_ids: list[int]) -> Any:
    """1 up to and including each row's first EOS (what the model generated), 0 after it."""
    import torch

    is_eos = torch.isin(completions, torch.tensor(eos_ids))
    after = (torch.cumsum(is_eos.int(), dim=1) - is_eos.int()) > 0
    return (~after).float()


def _generate(model: Any, tok: Any, prompts: list[str], cfg: dict[str, Any]) -> tuple[Any, Any, int]:
    """``[prompt ids left-padded | completion]`` rows (``group_size`` per prompt, in prompt order), the
    prompts' attention mask repeated to match, and the prompt width."""
    import torch

    enc = tok(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
    model.eval()
    with torch.no_grad():
        out = model.generate(
            **enc, do_sample=True, temperature=cfg["temperature"], top_p=1.0, top_k=0,
            max_new_tokens=cfg["max_tokens"], num_return_sequences=cfg["group_size"],
            pad_token_id=tok.pad_token_id,
        )  # fmt: skip
    width = enc["input_ids"].shape[1]
    prompt_mask = enc["attention_mask"].repeat_interleave(cfg["group_size"], dim=0)
    return out, prompt_mask, width


def _train(model: Any, opt: Any, out: Any, masks: tuple[Any, Any], adv: Any, cfg: dict[str, Any]) -> None:
    """One on-policy policy-gradient update on the padded batch (``masks``: prompt, completion)."""
    import torch

    prompt_mask, mask = masks
    width = prompt_mask.shape[1]
    completions = out[:, width:]
    model.train()
    attention = torch.cat([prompt_mask, mask.long()], dim=1)
    positions = (attention.cumsum(-1) - 1).clamp(min=0)  # as generate numbered the left-padded rows
    logits = model(input_ids=out, attention_mask=attention, position_ids=positions, use_cache=False).logits
    logits = logits[:, width - 1 : -1]
    logp = torch.log_softmax(logits.float() / cfg["temperature"], dim=-1)
    logp = logp.gather(-1, completions[..., None]).squeeze(-1)
    loss = -(adv[:, None] * logp * mask).sum() / mask.sum().clamp(min=1)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg["grad_clip"])
    opt.step()
    opt.zero_grad(set_to_none=True)


def _eos_ids(model: Any) -> list[int]:
    eos = model.generation_config.eos_token_id
    return list(eos) if isinstance(eos, (list, tuple)) else [eos]


def reward_of(env: Any, text: str, sample: Any) -> float:
    """``env.compute_reward(text, sample).total_reward``, awaited when the environment's is async
    (countdown's, i3_code's)."""
    result = env.compute_reward(text, sample)
    if inspect.isawaitable(result):

        async def wait() -> Any:
            return await result

        result = asyncio.run(wait())
    return float(result.total_reward)


def run_plain(cfg: dict[str, Any], *, env_name: str = "quickstart_add", seed: int = 0) -> PlainRun:
    """``cfg`` holds model, steps, batch, group_size, max_tokens, temperature, learning_rate, grad_clip."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from telescope_algos import compute_advantages
    from telescope_rollout import SingleTurnEnvironment, get_environment

    run = PlainRun(started=time.time())
    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(cfg["model"], padding_side="left")
    tok.pad_token = tok.pad_token or tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(cfg["model"], dtype=torch.float32)
    eos = _eos_ids(model)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["learning_rate"], weight_decay=0.0)
    env = get_environment(env_name)
    assert isinstance(env, SingleTurnEnvironment), f"{env_name}: plain GRPO takes single-turn environments"
    samples = env.load_dataset(cfg["steps"] * cfg["batch"])
    for step in range(cfg["steps"]):
        batch = samples[step * cfg["batch"] : (step + 1) * cfg["batch"]]
        prompts = [env.format_prompt(s.prompt, tok) for s in batch]
        out, prompt_mask, width = _generate(model, tok, prompts, cfg)
        mask = _completion_mask(out[:, width:], eos)
        texts = [tok.decode(row[: int(n)]) for row, n in zip(out[:, width:], mask.sum(1), strict=True)]
        owners = [s for s in batch for _ in range(cfg["group_size"])]
        rewards = [reward_of(env, t, s) for t, s in zip(texts, owners, strict=True)]
        adv = compute_advantages(torch.tensor(rewards).view(len(batch), cfg["group_size"])).flatten()
        _train(model, opt, out, (prompt_mask, mask), adv, cfg)
        run.step_ends.append(time.time())
        run.tokens.append(int(mask.sum()))
        run.rewards.append(sum(rewards) / len(rewards))
    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=3e-5)
    parser.add_argument("--json", action="store_true", help="print the run as one JSON line")
    args = parser.parse_args()
    cfg = {
        "model": args.model, "steps": args.steps, "batch": args.batch, "group_size": args.group_size,
        "max_tokens": args.max_tokens, "temperature": 1.0, "learning_rate": args.learning_rate,
        "grad_clip": 1.0,
    }  # fmt: skip
    run = run_plain(cfg)
    if args.json:
        print(json.dumps(dataclasses.asdict(run)))
        return
    ends = [run.started, *run.step_ends]
    for i, (a, b) in enumerate(itertools.pairwise(ends)):
        print(f"step {i + 1}: {b - a:.1f} s, {run.tokens[i]} tokens, reward {run.rewards[i]:.3f}")


if __name__ == "__main__":
    main()
