"""Run the CPU quickstart (`telescope train` with no config) and report its learning curve.

The quickstart trains SmolLM2-135M-Instruct on "What is a + b? Reply with just the number." with
GRPO, one vLLM server, one FSDP rank and live weight sync. This script runs it as users do (the
`telescope` command, no arguments but a run directory), then prints the reward per step and ends
with ``RESULT last5_vs_first5=<ratio> first5=<mean> last5=<mean> wall_min=<minutes>``.

    python tools/quickstart_curve.py [--run-dir runs/quickstart_curve] [extra telescope flags]
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


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--run-dir", default="runs/quickstart_curve")
    args, extra = parser.parse_known_args()
    run = Path(args.run_dir)
    shutil.rmtree(run, ignore_errors=True)
    cmd = [sys.executable, "-m", "telescope_cli", "train", "--run-dir", str(run), *extra]
    t0 = time.monotonic()
    code = subprocess.call(cmd, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    wall = time.monotonic() - t0
    if code != 0:
        raise SystemExit(f"telescope train exited with {code}; see {run}/logs")
    metrics = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    rewards = [m["reward/mean"] for m in metrics]
    for m in metrics:
        print(
            f"step {m['step']:3d}  reward {m['reward/mean']:.3f}  step_s {m['timing/step_s']:.1f}  "
            f"loss {m['loss']:+.4f}  kl {m['kl_divergence_inference']:.4f}"
        )
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    print(f"machine: {os.cpu_count()} CPUs; {len(rewards)} steps in {wall / 60:.1f} min (start-up included)")
    ratio = last / max(first, 1e-9)
    print(f"RESULT last5_vs_first5={ratio:.2f} first5={first:.3f} last5={last:.3f} wall_min={wall / 60:.1f}")


if __name__ == "__main__":
    main()
