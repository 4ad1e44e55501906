"""Training from Python (``telescope_orchestrator.train``) as a user's script does it: twice in one
process, the first run stopped from its ``on_step`` callback (it hands back its metrics), the
second from a dict config with a reward that always raises (``TrainError`` with the run's message,
as ``telescope train`` prints it); each leaves no process, Ray, signal handler or environment
marker behind. A bad config raises ``ConfigError`` before anything starts."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from e2e_support import ROOT, free_port, run_env, wait_gone

CONFIG = ROOT / "configs" / "ci" / "e2e_tiny.yaml"

SCRIPT = textwrap.dedent(
    """
    import json, os, signal, sys, time
    from pathlib import Path

    import ray
    import yaml

    from e2e_support import processes_of
    from telescope_config import ConfigError
    from telescope_orchestrator import StopTraining, TrainError, train

    args = json.loads(sys.argv[1])
    out = {}
    sigterm = signal.getsignal(signal.SIGTERM)
    try:
        train({"number_of_steps": 0})
    except ConfigError as err:
        out["bad_config"] = str(err)

    seen = []

    def stop_after_two(metrics):
        seen.append(metrics["step"])
        if metrics["step"] == 2:
            raise StopTraining("enough")

    first = train(
        args["config"], overrides=args["overrides"] + ["--number_of_steps", "4", "--checkpoint_every", "3"],
        run_dir=args["run1"], on_step=stop_after_two,
    )
    deadline = time.monotonic() + 30
    while processes_of(Path(args["run1"])) and time.monotonic() < deadline:
        time.sleep(0.5)
    out["first"] = {
        "run_dir": str(first.run_dir), "last_step": first.last_step, "stopped": first.stopped_early,
        "metrics_step": first.metrics.get("step"), "seen": seen,
        "left": processes_of(Path(args["run1"])), "ray": ray.is_initialized(),
        "run_id": os.environ.get("TELESCOPE_RUN_ID"),
        "sigterm_kept": signal.getsignal(signal.SIGTERM) is sigterm,
    }
    values = yaml.safe_load(Path(args["config"]).read_text())
    values.update(model=args["model"], number_of_steps=2, checkpoint_every=0, eval_after_training=False,
                  environments=[{"name": "e2e_envs:BrokenRewardEnv"}])
    try:
        train(values, overrides=["--inference_base_port", args["port2"]], run_dir=args["run2"])
        out["second"] = {"error": None}
    except TrainError as err:
        out["second"] = {"error": str(err), "ray": ray.is_initialized(),
                         "sigterm_kept": signal.getsignal(signal.SIGTERM) is sigterm}
    print("RESULT-JSON " + json.dumps(out))
    """
)


@pytest.mark.slow
@pytest.mark.vllm
def test_a_script_trains_twice_in_one_process_and_leaves_nothing_behind(tmp_path: Path, tiny_model_dir: Path):
    script = tmp_path / "train_twice.py"
    script.write_text(SCRIPT)
    run1, run2 = tmp_path / "runs" / "first", tmp_path / "runs" / "second"
    args = {
        "config": str(CONFIG),
        "model": str(tiny_model_dir),
        "overrides": ["--model", str(tiny_model_dir), "--inference_base_port", str(free_port())],
        "port2": str(free_port()),
        "run1": str(run1),
        "run2": str(run2),
    }
    command = [sys.executable, str(script), json.dumps(args)]
    done = subprocess.run(
        command, env=run_env(), capture_output=True, text=True, timeout=900, cwd=tmp_path, check=False
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    [line] = [x for x in done.stdout.splitlines() if x.startswith("RESULT-JSON ")]
    out = json.loads(line.removeprefix("RESULT-JSON "))
    # a bad config: the loader's message, nothing started
    assert "number_of_steps" in out["bad_config"]
    assert "environments" in out["bad_config"]

    first = out["first"]
    assert first["run_dir"] == str(run1)
    assert first["seen"] == [1, 2]
    assert (first["last_step"], first["stopped"], first["metrics_step"]) == (2, True, 2)
    assert first["left"] == [], "processes of the first run outlived it"
    assert first["ray"] is False
    assert first["run_id"] is None, "the run's marker stayed in the environment"
    assert first["sigterm_kept"], "the SIGTERM handler of the program was not put back"
    steps = [json.loads(x)["step"] for x in (run1 / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2], steps  # stopped: no step 3, no final eval
    assert (run1 / "checkpoints" / "step_2" / "meta.json").is_file(), "no checkpoint of the last step"
    assert "stopped after step 2" not in done.stdout  # the default reporter shows nothing

    # a reward that always raises: the run's own message, as the command prints it
    second = out["second"]
    error = " ".join(str(second["error"]).split())  # the message may wrap
    assert "failed with sample_error (environment e2e_envs:BrokenRewardEnv)" in error, second
    assert "the grader is down" in error
    assert "This is a bug" not in error
    assert second["ray"] is False
    assert second["sigterm_kept"]
    assert not (run2 / "metrics.jsonl").is_file() or not (run2 / "metrics.jsonl").read_text().strip()
    assert wait_gone(run2, timeout_s=30) == []
