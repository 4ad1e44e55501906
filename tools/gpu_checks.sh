#!/usr/bin/env bash
# The GPU checks of a device session, as one short script (docs: README "Benchmarks"):
#   1. the tests marked gpu (trainer side only: the device machine has no vLLM);
#   2. bench_trainer on a random 0.5B Llama at 16k packed tokens per micro-batch against the fair
#      baseline (samples sorted by length, each micro-batch padded to its own longest), with MFU.
# Usage on the device machine, from the repository root:  bash tools/gpu_checks.sh
set -euo pipefail
export PYTHONPATH="$(printf '%s:' packages/*/src apps/*/src)${PYTHONPATH:-}"
python -m pytest -q -m gpu -p no:cacheprovider packages/algos/tests packages/trainer-fsdp/tests
python tools/bench_trainer.py --size 0.5b --seq-len 16384 --samples 96 --steps 3 --repeats 2
