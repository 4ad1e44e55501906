"""Run the CPU quickstart (`telescope train` with no config) and report its learning curve.

The quickstart trains SmolLM2-135M-Instruct on "What is a + b? Reply with just the number." with
GRPO, one vLLM server, one FSDP rank and live weight sync. This script runs it as users do (the
`telescope` command, no arguments but a run directory), then prints the reward per step and ends
with ``RESULT last5_vs_first5=<ratio> first5=<mean> last5=<mean> wall_min=<minutes>``.

``--control`` then runs the same quickstart again, same seed (so the same first batch) and flags,
with a learning rate of 1e-30 in place of 0 (the config requires ``learning_rate > 0``; an AdamW
step of about 1e-30 is below float32's resolution for every weight, so none changes): the curve of
a model that does not learn, on the same prompts and sampling. Both curves are printed side by side,
and the RESULT line adds ``control_first5``, ``control_last5``, ``control_last5_vs_first5`` and
``control_wall_min``: a rise of the trained curve is learning only where the control stays flat.

    python tools/quickstart_curve.py [--run-dir runs/quickstart_curve] [--control] [extra telescope flags]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

CONTROL_LR = "1e-30"  # the config refuses 0; below float32 resolution, no weight moves


def _train(run: Path, extra: list[str]) -> tuple[list[dict[str, Any]], float]:
    """``telescope train`` into a fresh ``run``: its metrics lines (one per step) and wall seconds."""
    shutil.rmtree(run, ignore_errors=True)
    cmd = [sys.executable, "-m", "telescope_cli", "train", "--run-dir", str(run), *extra]
    t0 = time.monotonic()
    code = subprocess.call(cmd, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    wall = time.monotonic() - t0
    if code != 0:
        raise SystemExit(f"telescope train exited with {code}; see {run}/logs")
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()], wall


def _first_last(metrics: list[dict[str, Any]]) -> tuple[float, float]:
    rewards = [m["reward/mean"] for m in metrics]
    return sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--run-dir", default="runs/quickstart_curve")
    parser.add_argument("--control", action="store_true", help="also run it at learning rate ~0 (same seed)")
    args, extra = parser.parse_known_args()
    run = Path(args.run_dir)
    metrics, wall = _train(run, extra)
    for m in metrics:
        print(
            f"step {m['step']:3d}  reward {m['reward/mean']:.3f}  step_s {m['timing/step_s']:.1f}  "
            f"loss {m['loss']:+.4f}  kl {m['kl_divergence_inference']:.4f}"
        )
    first, last = _first_last(metrics)
    print(f"machine: {os.cpu_count()} CPUs; {len(metrics)} steps in {wall / 60:.1f} min (start-up included)")
    ratio = last / max(first, 1e-9)
    result = (
        f"RESULT last5_vs_first5={ratio:.2f} first5={first:.3f} last5={last:.3f} wall_min={wall / 60:.1f}"
    )
    if args.control:
        control, control_wall = _train(
            run.with_name(f"{run.name}_control"), [*extra, "--learning_rate", CONTROL_LR]
        )
        print(f"step  reward  control (learning rate {CONTROL_LR}, same seed)")
        by_step = {m["step"]: m["reward/mean"] for m in control}
        for m in metrics:
            print(f"{m['step']:4d}  {m['reward/mean']:6.3f}  {by_step.get(m['step'], float('nan')):7.3f}")
        c_first, c_last = _first_last(control)
        result += (
            f" control_first5={c_first:.3f} control_last5={c_last:.3f}"
            f" control_last5_vs_first5={c_last / max(c_first, 1e-9):.2f}"
            f" control_wall_min={control_wall / 60:.1f}"
        )
    print(result)


if __name__ == "__main__":
    main()
