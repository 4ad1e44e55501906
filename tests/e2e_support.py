"""Running ``telescope train`` as a user does, and checking what a user checks afterwards.

``train(run_dir, *args)`` runs ``python -m telescope_cli train --run-dir RUN_DIR ARGS`` in a
subprocess with its output piped (so the console is the plain, non-terminal one), the test
environment modules importable (``e2e_envs``) and a small vLLM KV cache. ``check_finished`` is the
user's view of a finished run: exit 0, no traceback, one metrics line per step, a rollouts file per
step whose samples carry no error, and no process of the run left.

Processes of a run are found by the ``TELESCOPE_RUN_DIR=<run dir>`` entry the driver puts in its
environment, which Ray's daemons, the actors and the vLLM servers all inherit.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent

SCALE_DOWN = [
    "--ray_address", "", "--inference_num_workers", "1", "--trainer_num_workers", "1",
    "--ray_inference_cpus_per_worker", "1", "--ray_trainer_cpus_per_worker", "1",
    "--group_size", "4", "--prompts_batch_size_for_trainer", "2", "--max_concurrent_prompts_per_server", "2",
    "--number_of_steps", "2", "--max_model_len", "1024", "--seq_len", "1024", "--max_tokens", "16",
    "--discard_group_zero_advantage", "false", "--model_dtype", "float32", "--mixed_precision_dtype", "null",
    "--use_wandb", "false", "--checkpoint_every", "0", "--learning_rate", "1e-4",
]  # fmt: skip
"""Overrides that scale an example config down to a tiny model on a 2-core CPU machine."""


def free_port() -> int:
    """A free run of ports for a run's servers (``cluster.vllm_server.free_port_run``)."""
    from telescope_orchestrator.cluster.vllm_server import free_port_run

    return free_port_run()


def base_args(model_dir: Path) -> list[str]:
    """The model and a free port range for the servers (several tests run at once)."""
    return ["--model", str(model_dir), "--inference_base_port", str(free_port())]


def run_env() -> dict[str, str]:
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
        "VLLM_CPU_KVCACHE_SPACE": "1",
    }
    env.pop("TELESCOPE_RUN_DIR", None)
    return env


def convert(checkpoint: Path, out: Path) -> int:
    """``telescope convert CHECKPOINT OUT`` as a user runs it; its exit code."""
    cmd = [sys.executable, "-m", "telescope_cli", "convert", str(checkpoint), str(out)]
    return subprocess.run(cmd, env=run_env(), capture_output=True, check=False).returncode


def command(run_dir: Path, *args: str, name: str = "train") -> list[str]:
    """``telescope <name> --run-dir RUN_DIR ARGS`` (``train``, or ``sft``)."""
    return [sys.executable, "-m", "telescope_cli", name, "--run-dir", str(run_dir), *args]


@dataclass
class Finished:
    returncode: int
    output: str
    wall_s: float
    run_dir: Path

    def metrics(self) -> list[dict[str, Any]]:
        path = self.run_dir / "metrics.jsonl"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []

    def step_metrics(self) -> list[dict[str, Any]]:
        """The training steps' lines (eval lines carry ``eval/step``)."""
        return [m for m in self.metrics() if "eval/step" not in m]

    def rollouts(self, step: int) -> list[dict[str, Any]]:
        """Every sample row of ``step``: its file, and the groups dropped while it waited long for
        its batch (``step_N-dropped-K``, docs/records.md)."""
        import pyarrow.parquet as pq

        folder = self.run_dir / "records" / "samples"
        files = [
            folder / f"step_{step:06d}.parquet",
            *sorted(folder.glob(f"step_{step:06d}-dropped-*.parquet")),
        ]
        return [row for f in files for row in pq.read_table(f).to_pylist()]


def train(run_dir: Path, *args: str, timeout_s: float = 600.0, name: str = "train") -> Finished:
    """Run ``telescope train`` (or ``name``) to its end (killed at ``timeout_s``); output piped, as in
    CI or nohup."""
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    try:
        done = subprocess.run(
            command(run_dir, *args, name=name), env=run_env(), stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, timeout=timeout_s, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired as exc:
        out = (exc.output or b"").decode(errors="replace")
        raise AssertionError(f"telescope {name} ran past {timeout_s} s:\n{out[-4000:]}") from exc
    finished = Finished(done.returncode, done.stdout.decode(errors="replace"), time.monotonic() - t0, run_dir)
    print(f"telescope {name} {run_dir.name}: exit {done.returncode} in {finished.wall_s:.1f} s")
    return finished


def start(run_dir: Path, *args: str, name: str = "train") -> subprocess.Popen:
    """Start ``telescope train`` (or ``name``) in the background; its output goes to ``<run dir>.console``."""
    run_dir.parent.mkdir(parents=True, exist_ok=True)
    with (run_dir.parent / f"{run_dir.name}.console").open("ab") as log:
        return subprocess.Popen(command(run_dir, *args, name=name), env=run_env(), stdout=log, stderr=log)


def stuck_report(run_dir: Path, proc: subprocess.Popen) -> str:
    """What a run that does not stop is doing: every thread's stack (``kill -USR1``, see
    docs/troubleshooting.md), the tail of its console and of its driver log."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGUSR1)
        time.sleep(2)
    parts = []
    for path in (run_dir / "logs" / "stacks.txt", run_dir.parent / f"{run_dir.name}.console",
                 run_dir / "logs" / "telescope.jsonl"):  # fmt: skip
        text = path.read_text(errors="replace") if path.is_file() else "(missing)"
        parts.append(f"--- {path.name}\n{text[-6000:]}")
    return "\n".join(parts)


def wait_for(path: Path, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert proc.poll() is None, f"run exited early with {proc.returncode}: see {path.parent}"
        assert time.monotonic() < deadline, f"{path} did not appear within {timeout_s} s"
        time.sleep(0.05)  # tiny-model steps take a fraction of a second: act close to the event


def interrupt(run_dir: Path, proc: subprocess.Popen, *, timeout_s: float = 120.0) -> int:
    """Ctrl-C (SIGINT) to a running ``telescope train``; its exit code once it stopped (a test
    failure with every thread's stack when it does not stop within ``timeout_s``)."""
    import pytest

    proc.send_signal(signal.SIGINT)
    try:
        return proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        pytest.fail(
            f"the run did not stop within {timeout_s:.0f} s of Ctrl-C:\n{stuck_report(run_dir, proc)}"
        )


def reap(proc: subprocess.Popen) -> None:
    """Kill a run that is still going and collect its exit status (a ``Popen`` dropped while its
    process runs warns, and pytest fails whichever test the warning lands in)."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()


def processes_of(run_dir: Path) -> list[int]:
    """PIDs whose environment carries TELESCOPE_RUN_DIR=<run_dir>."""
    marker = f"TELESCOPE_RUN_DIR={run_dir}".encode()
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if marker in env.split(b"\0"):
            found.append(int(pid))
    return found


def wait_gone(run_dir: Path, timeout_s: float = 90.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while (left := processes_of(run_dir)) and time.monotonic() < deadline:
        time.sleep(1)
    return left


def kill_after_checkpoint(
    run_dir: Path, *args: str, step: int = 2, timeout_s: float = 400.0, name: str = "train"
) -> None:
    """Start ``telescope train`` (or ``name``) and SIGKILL it (no cleanup code of ours runs) once the
    checkpoint of ``step`` is committed; then every process of the run must be gone (the guard's work).
    The caller resumes it with ``--resume_from_checkpoint true``."""
    first = start(run_dir, *args, name=name)
    try:
        wait_for(run_dir / "checkpoints" / f"step_{step}" / "meta.json", first, timeout_s=timeout_s)
    finally:
        first.kill()
        first.wait()
    assert wait_gone(run_dir) == [], "processes of the killed run are still alive"


def check_finished(run: Finished, steps: int, *, resumed_at: int = 0) -> list[dict[str, Any]]:
    """What a user checks after a run (resumed after step ``resumed_at``); returns the steps' lines."""
    assert run.returncode == 0, run.output[-4000:]
    assert "Traceback" not in run.output, run.output[-4000:]
    assert wait_gone(run.run_dir, timeout_s=30) == [], "processes of the run are still alive"
    lines = run.step_metrics()
    assert [m["step"] for m in lines] == list(range(1, steps + 1)), [m["step"] for m in lines]
    for m in lines:
        assert m["groups/kept"] >= 1
        assert m["reward/mean"] is not None
    for step in range(1, steps + 1):
        rows = run.rollouts(step)
        kept = [r for r in rows if r["status"] == "kept"]
        assert kept, f"step {step} has no kept sample"
        errors = [r["error"] for r in rows if r["error"] and r["status"] != "cancelled"]
        assert not errors, f"step {step}: sample errors {errors[:3]}"
        assert all(r["completion_tokens"] > 0 for r in kept)
    # the console of a pipe: one plain line per step this run trained, then where to look at it
    for step in range(resumed_at + 1, steps + 1):
        assert f"step {step}/{steps}" in run.output, run.output[-2000:]
    assert f"look at the run: telescope ui {run.run_dir.parent}" in run.output, run.output[-2000:]
    _check_trainer_threads(run.run_dir)
    return lines


def _check_trainer_threads(run_dir: Path) -> None:
    """The node's cores are split: the servers take half (at least one, at most all but one), the
    trainer ranks share the rest (docs/architecture.md#threads), not Ray's one thread per CPU."""
    import yaml

    if "OMP_NUM_THREADS" in os.environ:
        return  # the user's thread count is kept as it is
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    ranks, servers = cfg["trainer_num_workers"], cfg["inference_num_workers"]
    cores = len(os.sched_getaffinity(0))
    for_servers = min(max(servers, cores // 2), max(1, cores - 1))
    events = [json.loads(x) for x in (run_dir / "logs" / "telescope.jsonl").read_text().splitlines()]
    (ready,) = [e for e in events if e.get("event") == "trainer ranks ready"][-1:]
    assert ready["torch_threads"] == [max(1, (cores - for_servers) // ranks)] * ranks, ready
    log = (run_dir / "logs" / "inference" / "server_0.log").read_text()
    first = sorted(os.sched_getaffinity(0))[: max(1, for_servers // servers)]
    mine = ",".join(map(str, first))
    assert f"the server's processes run on cores {mine}" in log, "server 0's tree is not on its cores"
    # said by the process that runs the model (its weight receiver), each time it joins weight sync
    joined = [line for line in log.splitlines() if "weightsync.joined" in line]
    assert joined, "server 0 never joined weight sync"
    for line in joined:
        assert f"cores={first}" in line, (first, line)
        assert f"threads={len(first)}" in line, (first, line)
    # while the servers idle, the ranks borrow their cores (cluster.cores): every step says how long;
    # never with trainer restarts, whose replays must match exactly
    restarts = bool(
        cfg["trainer_max_restarts"] > 0 and cfg["checkpoint_every"] and cfg["checkpoint_save_training_state"]
    )
    lends = max(1, cores // ranks) > ready["torch_threads"][0] and not restarts
    lines = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in lines if "timing/train_s" in m]
    assert steps, "no step in metrics.jsonl"
    lent = [m.get("timing/cores_lent_s") for m in steps]
    assert all(("timing/cores_lent_s" in m) == lends for m in steps), lent
