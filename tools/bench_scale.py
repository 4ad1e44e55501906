"""Benchmark the driver of `telescope train` at scale: does it keep up with many servers and big steps?

The real training loop (``telescope_orchestrator.run.loop.training_loop``: the rollout engine,
``to_train_samples``, packing, the step's records with its token table, derived metrics, the
metrics line) runs in this process against N fake inference servers (``telescope_rollout.testing.
FakeInferenceServer``: every completion is ``--tokens`` tokens and comes
``--seconds-per-token`` x tokens after its request, each server decoding every request at its own
pace) and ``--ranks`` fake trainer ranks that answer at once. What is fake is what runs elsewhere in
a real run (vLLM, the trainer ranks); what a real run does on the driver is here, with one stand-in:
a trainer rank's ``.remote()`` pickles its micro-batches, as Ray serializes a call's arguments on the
caller's thread.

For each point (N servers, S samples per step: groups of 16 of the quickstart's addition task, the
servers' lanes sized to hold one step's samples, the default ``max_async_rollout``) it runs one warm-up step
and ``--steps`` timed steps, and prints:

* ``driver_cpu_s``: CPU seconds of this process per step (every thread: the engine, the fake servers'
  timers, batch preparation, packing, the records), the driver's own work;
* ``wall_s`` and ``samples_per_s``: a step's wall time and samples per second (the fake servers'
  latency bounds them from below: ``--tokens`` x ``--seconds-per-token`` per completion);
* ``stall_ms``: the event loop's longest stall during the timed steps: a task that wakes every 2 ms
  measures how late it wakes.

The baseline, in the same run at the largest point, alternating with the measured code: the loop
with its off-loop work back on the event loop (batch preparation, packing, the derived metrics and
the trainer calls' serialization: :data:`INLINE`, run inline by a stand-in for ``asyncio.to_thread``
in the loop's module).

The default latency, 10 ms a token (``--seconds-per-token 0.01``), is a fast GPU server's: about
100 tokens/s for each of 32 sequences in flight (a 7B model on one H100). At 1 ms a token (a tiny
model) the fake servers answer a step's 8,192 samples every half second and the driver cannot keep
up, so the event loop never idles and ``stall_ms`` measures its whole turns, not a blocking task.

Targets (2-core machine): at 256 servers and 8,192 samples per step, driver CPU under 2 s per step,
the longest stall under 50 ms, and driver CPU from 512 to 8,192 samples growing no worse than
linearly (``growth`` = (CPU at 8,192 / CPU at 512) / 16: at most 1).

Usage: ``python tools/bench_scale.py [--servers 1,8,64,256] [--samples 512,2048,8192] [--tokens 512]
[--steps 3] [--ranks 8] [--seconds-per-token 0.01] [--repeats 2]``. The last line is ``RESULT
stall_inline_vs_thread=<x> growth=<x> driver_cpu_s=<s> stall_ms=<ms> samples_per_s=<x>`` (the largest
point; ``growth`` of the largest server count).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import math
import os
import pickle
import platform
import statistics
import sys
import tempfile
import time
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
GROUP = 16
INLINE = {"to_train_samples", "pack_samples", "_derived", "_send_train_steps"}
"""What the loop runs in a worker thread, run on its event loop by the baseline."""


@dataclass
class Point:
    servers: int
    samples: int
    mode: str
    driver_cpu_s: float
    wall_s: float
    stall_ms: float

    @property
    def samples_per_s(self) -> float:
        return self.samples / self.wall_s


class _Remote:
    """A trainer rank's method as Ray shows it: ``.remote(*args)`` serializes the arguments here and
    returns something to await."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn

    def remote(self, *args: Any) -> Any:
        pickle.dumps(args, protocol=5)
        result = self.fn(*args)  # now, in call order, as an actor runs its calls

        async def call() -> Any:
            return result

        return call()


class FakeRank:
    """A trainer rank that trains in no time and answers ``step_tokens`` with arrays of the right shape."""

    def __init__(self) -> None:
        self.shard: list[Any] = []
        self.train_step = _Remote(self._train)
        self.publish = _Remote(lambda step, group="full": {"bytes": 1.0})
        self.drain_spans = _Remote(lambda: [])
        self.step_tokens = _Remote(self._tokens)

    def _train(self, shard: list[Any], step: int, objective: str) -> dict[str, float]:
        self.shard = shard
        return {"loss": 0.0, "grad_norm": 1.0}

    def _tokens(self) -> list[dict[str, Any]]:
        import numpy as np

        from telescope_algos import TOKEN_FIELDS

        return [{f: np.zeros(len(mb), np.float32) for f in TOKEN_FIELDS} for mb in self.shard]


class StallWatch:
    """The event loop's longest stall while armed (:meth:`set_armed`)."""

    def __init__(self, tick_s: float = 0.002) -> None:
        self.tick_s, self.armed, self.worst = tick_s, False, 0.0
        self.since = time.perf_counter()
        """When the tick now waited for began (or when the watch was armed, if later)."""

    def set_armed(self, armed: bool) -> None:
        """Called from inside the loop's work: a stall under way counts up to now while armed, and
        from now once armed."""
        now = time.perf_counter()
        if self.armed:
            self.worst = max(self.worst, now - self.since - self.tick_s)
        else:
            self.since = now
        self.armed = armed

    async def run(self) -> None:
        while True:
            self.since = time.perf_counter()
            await asyncio.sleep(self.tick_s)
            late = time.perf_counter() - self.since - self.tick_s
            if self.armed:
                self.worst = max(self.worst, late)


class StepClock:
    """The loop's metrics lines, with the time of each, (step, wall, this process's CPU time); the
    stall watch is armed from the first line to the last."""

    def __init__(self, lines: Any, watch: StallWatch, last_step: int) -> None:
        self.lines, self.watch, self.last_step = lines, watch, last_step
        self.marks: list[tuple[int, float, float]] = []

    def write(self, metrics: Any, *, step: int, file_only: Any = None) -> None:
        self.marks.append((step, time.perf_counter(), time.process_time()))
        self.watch.set_armed(step < self.last_step)
        self.lines.write(metrics, step=step, file_only=file_only)


def _inline_loop_module(loop_mod: Any) -> Any:
    """The baseline: ``asyncio`` as the loop module sees it, with ``to_thread`` running :data:`INLINE`
    on the event loop."""
    real = asyncio.to_thread

    async def to_thread(fn: Any, /, *args: Any, **kwargs: Any) -> Any:
        name = getattr(getattr(fn, "func", fn), "__name__", "")
        if name in INLINE:
            return fn(*args, **kwargs)
        return await real(fn, *args, **kwargs)

    proxy = types.SimpleNamespace(**{k: getattr(asyncio, k) for k in dir(asyncio) if not k.startswith("__")})
    proxy.to_thread = to_thread
    return proxy


def _config(servers: int, samples: int, tokens: int, *, steps: int) -> Any:
    from telescope_config.testing import make_config

    groups = samples // GROUP
    return make_config(
        model="tiny", environments=[{"name": "quickstart_add"}], group_size=GROUP,
        prompts_batch_size_for_trainer=groups, max_concurrent_prompts_per_server=math.ceil(groups / servers),
        max_tokens=tokens, max_model_len=4096, seq_len=4096, number_of_steps=steps,
        discard_group_zero_advantage=False, checkpoint_every=0, eval_before_training=False,
        eval_after_training=False, evals=[], use_wandb=False, record_tokens=True,
    )  # fmt: skip


def _engine(cfg: Any, tokenizer: Any, client: Any) -> Any:
    from telescope_orchestrator.run.wiring import engine_math
    from telescope_rollout import EngineSettings, MultiEnvSampler, RolloutEngine, SamplerEntry
    from telescope_rollout.envs.quickstart_add import QuickstartAddEnv

    env = QuickstartAddEnv(num_samples=20_000)
    env.load_dataset()
    advantage_fn, shaping = engine_math(cfg)
    return RolloutEngine(
        EngineSettings.from_config(cfg), environments={"quickstart_add": env},
        sampler=MultiEnvSampler([SamplerEntry("quickstart_add", 1.0, len(env))], seed=0),
        tokenizer=tokenizer, client=client, advantage_fn=advantage_fn, reward_shaping=shaping,
    )  # fmt: skip


async def _measure(
    cfg: Any, servers: int, tokenizer: Any, args: argparse.Namespace, run_path: Path
) -> tuple[float, float, float]:
    """One point: (driver CPU s per step, wall s per step, longest stall in ms) over the timed steps."""
    from telescope_orchestrator.record.lines import MetricsLines
    from telescope_orchestrator.record.rundir import RunDir
    from telescope_orchestrator.run.loop import LoopContext, training_loop
    from telescope_orchestrator.run.report import SilentReporter
    from telescope_orchestrator.run.weights import WeightUpdates
    from telescope_rollout.testing import FakeInferenceServer

    urls = [f"http://fake-{i}" for i in range(servers)]
    ids = list(range(10, 10 + args.tokens))
    server = FakeInferenceServer(
        server_urls=urls, reply=lambda r: ("42", ids), seconds_per_token=args.seconds_per_token,
        keep_requests=False,
    )  # fmt: skip
    engine = _engine(cfg, tokenizer, server)
    ranks = [FakeRank() for _ in range(args.ranks)]

    async def send(step: int, group: str) -> tuple[dict[str, float], list[str]]:
        await asyncio.gather(*[r.publish.remote(step, group) for r in ranks])
        return {"weight_sync/bytes": 1.0}, urls

    run, watch = RunDir(run_path), StallWatch()
    clock = StepClock(MetricsLines(run), watch, cfg.number_of_steps)
    ctx = LoopContext(
        config=cfg, engine=engine, client=server, trainers=list(ranks), dp_ranks=list(range(args.ranks)),
        dp_world_size=args.ranks, run=run, console=SilentReporter(), checkpoint_root=run_path / "ckpt",
        weights=WeightUpdates({"full": urls}, engine, send), lines=clock,  # type: ignore[arg-type]
    )  # fmt: skip
    watcher = asyncio.create_task(watch.run())
    try:
        await training_loop(ctx)
    finally:
        watcher.cancel()
    marks = clock.marks  # timed from the end of the warm-up step (the first line)
    steps = len(marks) - 1
    wall = (marks[-1][1] - marks[0][1]) / steps
    cpu = (marks[-1][2] - marks[0][2]) / steps
    return cpu, wall, watch.worst * 1000


def point(servers: int, samples: int, mode: str, tokenizer: Any, args: argparse.Namespace) -> Point:
    import telescope_orchestrator.run.loop as loop_mod

    cfg = _config(servers, samples, args.tokens, steps=1 + args.steps)
    saved = loop_mod.asyncio
    if mode == "inline":
        loop_mod.asyncio = _inline_loop_module(loop_mod)
    try:
        with tempfile.TemporaryDirectory(prefix="bench_scale_") as tmp:
            cpu, wall, stall = asyncio.run(_measure(cfg, servers, tokenizer, args, Path(tmp) / "run"))
    finally:
        loop_mod.asyncio = saved
    p = Point(servers, samples, mode, cpu, wall, stall)
    print(
        f"{mode:6s} servers={servers:4d} samples/step={samples:5d}: driver_cpu_s={cpu:.3f} "
        f"wall_s={wall:.3f} samples_per_s={p.samples_per_s:.0f} stall_ms={stall:.1f}",
        flush=True,
    )
    return p


def _ints(text: str) -> list[int]:
    return [int(x) for x in text.split(",") if x.strip()]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--servers", type=_ints, default=[1, 8, 64, 256])
    parser.add_argument("--samples", type=_ints, default=[512, 2048, 8192])
    parser.add_argument("--tokens", type=int, default=512, help="tokens per completion")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per point (after one warm-up)")
    parser.add_argument("--ranks", type=int, default=8, help="data-parallel trainer ranks")
    parser.add_argument("--seconds-per-token", type=float, default=0.01)
    parser.add_argument("--repeats", type=int, default=2, help="baseline/measured pairs at the largest point")
    args = parser.parse_args()
    if any(s % GROUP for s in args.samples):
        parser.error(f"--samples must be multiples of the group size {GROUP}")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import structlog

    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(30))  # warnings and up
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cpus, "
          f"python {platform.python_version()}")  # fmt: skip
    from telescope_rollout import Tokenizer

    spec = importlib.util.spec_from_file_location("tiny_model", ROOT / "tools" / "tiny_model.py")
    assert spec is not None
    assert spec.loader is not None
    tiny = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tiny)
    with tempfile.TemporaryDirectory(prefix="bench_scale_tok_") as tmp:
        tokenizer = Tokenizer.from_pretrained(tiny.build_tiny_model(Path(tmp) / "tiny", tied=False))
    points = [point(n, s, "thread", tokenizer, args) for n in args.servers for s in args.samples]
    top_n, top_s = max(args.servers), max(args.samples)
    pairs = []
    for _ in range(args.repeats):  # the baseline and the measured code, alternating
        inline = point(top_n, top_s, "inline", tokenizer, args)
        pairs.append((inline, point(top_n, top_s, "thread", tokenizer, args)))
    measured = [p for p in points if (p.servers, p.samples) == (top_n, top_s)] + [t for _, t in pairs]
    stall = statistics.median(p.stall_ms for p in measured)
    cpu = statistics.median(p.driver_cpu_s for p in measured)
    rate = statistics.median(p.samples_per_s for p in measured)
    inline_stall = statistics.median(i.stall_ms for i, _ in pairs) if pairs else float("nan")
    small = next(p for p in points if (p.servers, p.samples) == (top_n, min(args.samples)))
    growth = (cpu / small.driver_cpu_s) / (top_s / small.samples)
    print(
        f"RESULT stall_inline_vs_thread={inline_stall / stall:.2f} growth={growth:.3f} "
        f"driver_cpu_s={cpu:.3f} stall_ms={stall:.1f} samples_per_s={rate:.0f}"
    )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
