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

``tools/plain_vllm.py`` is the same loop generating with vLLM in the same process; it imports the
loading, scoring and training from here (``load_loop``, ``learn``). ``tools/bench_e2e.py`` times
both against ``telescope train`` with the same settings; alone:

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
    completion tokens generated, the tokens trained (prompt and completion tokens of every row of the
    loss batch, padding not counted) and the mean reward."""

    started: float
    step_ends: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    trained_tokens: list[int] = field(default_factory=list)
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


@dataclass
class Loop:
    """What every step of a plain loop uses: the model it trains, its tokenizer, optimizer, environment,
    the run's prompts and the token ids that end a completion."""

    model: Any
    tok: Any
    opt: Any
    env: Any
    samples: list[Any]
    eos: list[int]

    def prompts(self, step: int, batch: int) -> tuple[list[Any], list[str]]:
        """Step ``step``'s ``batch`` samples and their prompts rendered with the chat template."""
        chosen = self.samples[step * batch : (step + 1) * batch]
        return chosen, [self.env.format_prompt(s.prompt, self.tok) for s in chosen]


def load_loop(cfg: dict[str, Any], *, env_name: str = "quickstart_add", seed: int = 0) -> Loop:
    """The model (float32), tokenizer (left padding), AdamW and ``steps x batch`` prompts of ``env_name``."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from telescope_rollout import SingleTurnEnvironment, get_environment

    torch.manual_seed(seed)
    tok = AutoTokenizer.from_pretrained(cfg["model"], padding_side="left")
    tok.pad_token = tok.pad_token or tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(cfg["model"], dtype=torch.float32)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg["learning_rate"], weight_decay=0.0)
    env = get_environment(env_name)
    assert isinstance(env, SingleTurnEnvironment), f"{env_name}: plain GRPO takes single-turn environments"
    samples = env.load_dataset(cfg["steps"] * cfg["batch"])
    return Loop(model, tok, opt, env, samples, _eos_ids(model))


def learn(
    loop: Loop, batch: list[Any], out: Any, masks: tuple[Any, Any], cfg: dict[str, Any], run: PlainRun
) -> None:
    """Score the completions in ``out`` (``[prompt | completion]`` rows, ``group_size`` per sample of
    ``batch``; ``masks``: prompt, completion), take GRPO's group advantages, train one step, and add
    the step's tokens generated and trained and its mean reward to ``run`` (the caller adds its end)."""
    import torch

    from telescope_algos import compute_advantages

    prompt_mask, mask = masks
    width = prompt_mask.shape[1]
    texts = [loop.tok.decode(row[: int(n)]) for row, n in zip(out[:, width:], mask.sum(1), strict=True)]
    owners = [s for s in batch for _ in range(cfg["group_size"])]
    rewards = [reward_of(loop.env, t, s) for t, s in zip(texts, owners, strict=True)]
    adv = compute_advantages(torch.tensor(rewards).view(len(batch), cfg["group_size"])).flatten()
    _train(loop.model, loop.opt, out, masks, adv, cfg)
    run.tokens.append(int(mask.sum()))
    run.trained_tokens.append(int(prompt_mask.sum()) + int(mask.sum()))
    run.rewards.append(sum(rewards) / len(rewards))


def run_plain(cfg: dict[str, Any], *, env_name: str = "quickstart_add", seed: int = 0) -> PlainRun:
    """``cfg`` holds model, steps, batch, group_size, max_tokens, temperature, learning_rate, grad_clip."""
    run = PlainRun(started=time.time())
    loop = load_loop(cfg, env_name=env_name, seed=seed)
    for step in range(cfg["steps"]):
        batch, prompts = loop.prompts(step, cfg["batch"])
        out, prompt_mask, width = _generate(loop.model, loop.tok, prompts, cfg)
        learn(loop, batch, out, (prompt_mask, _completion_mask(out[:, width:], loop.eos)), cfg, run)
        run.step_ends.append(time.time())
    return run


def arg_parser(description: str) -> argparse.ArgumentParser:
    """The flags of a plain loop (``tools/plain_vllm.py`` adds its own)."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--model", required=True)
    parser.add_argument("--steps", type=int, default=15)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=3e-5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", action="store_true", help="print the run as one JSON line")
    return parser


def config(args: argparse.Namespace) -> dict[str, Any]:
    """The loop's ``cfg`` from the flags; temperature 1 and gradient clipping 1, as Telescope's quickstart."""
    return {
        "model": args.model,
        "steps": args.steps,
        "batch": args.batch,
        "group_size": args.group_size,
        "max_tokens": args.max_tokens,
        "temperature": 1.0,
        "learning_rate": args.learning_rate,
        "grad_clip": 1.0,
    }


def report(run: PlainRun, *, as_json: bool) -> None:
    """The run as one JSON line (what ``tools/bench_e2e.py`` reads), or one line per step."""
    if as_json:
        print(json.dumps(dataclasses.asdict(run)), flush=True)
        return
    ends = [run.started, *run.step_ends]
    for i, (a, b) in enumerate(itertools.pairwise(ends)):
        print(
            f"step {i + 1}: {b - a:.1f} s, {run.tokens[i]} tokens generated, "
            f"{run.trained_tokens[i]} trained, reward {run.rewards[i]:.3f}"
        )


def main() -> None:
    args = arg_parser((__doc__ or "").partition("\n")[0]).parse_args()
    report(run_plain(config(args), seed=args.seed), as_json=args.json)


if __name__ == "__main__":
    main()
