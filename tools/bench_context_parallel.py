"""Benchmark FSDP context parallelism: one long packed row per step at ``fsdp_context_parallel_size``
1 and 2, in the same run.

The samples (long-tailed lengths, as ``bench_trainer.py`` draws them) are packed into rows of
``--seq-len`` tokens. Each setting runs on its own gloo process group (one process per rank, one
thread each, so a rank stands for one GPU): CP = 1 on one rank, CP = 2 on two ranks splitting every
row. Per rank: the step time and the extra resident memory a train step needs on top of the model
and optimizer (``VmHWM`` minus ``VmRSS`` before the step, as in ``bench_trainer.py``), whose largest
part on long rows is the logits (tokens × vocabulary) and the activations, both divided by CP.
The same weights train on the same rows, so the losses must agree: the benchmark checks it.

Usage: ``python tools/bench_context_parallel.py [--seq-len 4096] [--samples 24] [--steps 2]``.
The last line is ``RESULT memory_cp2_vs_cp1=<peak per rank ratio> time_cp2_vs_cp1=<step time ratio>``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_trainer  # the model, samples and measurement of the trainer benchmark

SIZE = "cpu_long"
bench_trainer.SIZES[SIZE] = (2, 256, 4, 2, 704, 32768, False)  # a 32k vocabulary: logits matter


def _config(model: str, seq_len: int, cp: int):
    import telescope_config

    values = {
        **telescope_config.defaults(),
        "model": model,
        "environments": [{"name": "countdown"}],
        "trainer_num_workers": cp,
        "fsdp_context_parallel_size": cp,
        "mixed_precision_dtype": None,
        "learning_rate": 1e-6,
        "max_tokens": seq_len // 2,
        "seq_len": seq_len,
        "max_model_len": seq_len,
    }
    return telescope_config.TelescopeConfig.model_validate(values)


def worker(args: argparse.Namespace) -> None:
    """One rank: train ``--steps`` timed steps on the rows and write this rank's numbers."""
    from telescope_algos import pack_samples
    from telescope_trainer_fsdp import create_trainer

    vocab = bench_trainer.SIZES[SIZE][5]
    samples = bench_trainer.draw_samples(args.samples, max_len=args.seq_len, vocab=vocab, seed=args.seed)
    real_tokens = sum(len(s.prompt_ids) + len(s.completion_ids) for s in samples)
    (rows,) = pack_samples(samples, seq_len=args.seq_len, pad_to_multiple_of=64)
    trainer = create_trainer(_config(args.model, args.seq_len, args.cp), dist_timeout_s=600)
    try:
        trainer.train_step(rows, step=0)  # optimizer state, allocator caches
        result = bench_trainer.measure(trainer, rows, real_tokens=real_tokens, warmup=0, steps=args.steps)
    finally:
        trainer.close()
    Path(args.out).write_text(json.dumps(result))


def run_setting(cp: int, model: str, args: argparse.Namespace, tmp: Path) -> list[dict]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs, outs = [], []
    for rank in range(cp):
        out = tmp / f"cp{cp}_rank{rank}.json"
        outs.append(out)
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(cp), "MASTER_ADDR": "127.0.0.1",
               "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1"}  # fmt: skip
        cmd = [sys.executable, __file__, "--worker", "--cp", str(cp), "--model", model, "--out", str(out),
               "--seq-len", str(args.seq_len), "--samples", str(args.samples), "--steps", str(args.steps),
               "--seed", str(args.seed)]  # fmt: skip
        procs.append(subprocess.Popen(cmd, env=env))
    try:
        codes = [p.wait(timeout=1800) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    if any(codes):
        raise SystemExit(f"CP={cp}: ranks exited with {codes}")
    return [json.loads(o.read_text()) for o in outs]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--seq-len", type=int, default=4096)
    parser.add_argument("--samples", type=int, default=24)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--cp", type=int, default=1, help=argparse.SUPPRESS)
    parser.add_argument("--model", default="", help=argparse.SUPPRESS)
    parser.add_argument("--out", default="", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return

    with tempfile.TemporaryDirectory(prefix="bench_cp_") as tmp:
        n_params = bench_trainer.build_model(Path(tmp) / "model", SIZE)
        res = {cp: run_setting(cp, str(Path(tmp) / "model"), args, Path(tmp)) for cp in (1, 2)}
    losses = {cp: [r["loss"] for r in ranks] for cp, ranks in res.items()}
    if abs(losses[2][0] - losses[1][0]) > 1e-4 * max(abs(losses[1][0]), 1e-6):
        raise SystemExit(f"CP=2 trained something else than CP=1: losses {losses}")
    memory = {cp: max(r["peak_extra_mb"] for r in ranks) for cp, ranks in res.items()}
    step_s = {cp: max(r["step_s"] for r in ranks) for cp, ranks in res.items()}
    print(json.dumps({
        "device": f"{platform.processor() or 'cpu'} x{os.cpu_count()}", "params": n_params,
        "seq_len": args.seq_len, "rows": res[1][0]["micro_batches"], "peak_extra_mb_per_rank": memory,
        "step_s": step_s, "loss": losses,
    }, indent=1))  # fmt: skip
    print(
        f"RESULT memory_cp2_vs_cp1={memory[2] / memory[1]:.2f} time_cp2_vs_cp1={step_s[2] / step_s[1]:.2f} "
        f"cp1_peak_mb={memory[1]:.0f} cp2_peak_mb={memory[2]:.0f} cp1_step_s={step_s[1]:.2f} "
        f"cp2_step_s={step_s[2]:.2f}"
    )


if __name__ == "__main__":
    main()
