#!/usr/bin/env bash
# The GPU checks of a device session, as one short script (docs: README "Benchmarks"):
#   1. the tests marked gpu (trainer side only: the device machine has no vLLM);
#   2. bench_trainer on a random 0.5B Llama at 16k packed tokens per micro-batch against the fair
#      baseline (samples sorted by length, each micro-batch padded to its own longest), with MFU
#      (the target: 25% on an H200);
#   3. bench_weightsync over NCCL at 1.2B parameters between two processes (--transport-only: the
#      device machine has no vLLM), when there are two GPUs (NCCL refuses two ranks on one);
# A check that cannot run on this machine says so and why; the others still run. bench_e2e on a
# 0.5B model is not here yet: Telescope's sides need vLLM and a GPU for the server beside the
# trainer's (the lent machine has one GPU and no vLLM), and the plain loops train on the CPU only.
# Usage on the device machine, from the repository root:  bash tools/gpu_checks.sh
set -euo pipefail
export PYTHONPATH="$(printf '%s:' packages/*/src apps/*/src)${PYTHONPATH:-}"
python -m pytest -q -m gpu -p no:cacheprovider packages/algos/tests packages/trainer-fsdp/tests
python tools/bench_trainer.py --size 0.5b --seq-len 16384 --samples 96 --steps 3 --repeats 2
gpus=$(python -c 'import torch; print(torch.cuda.device_count())')
if [ "$gpus" -ge 2 ]; then
  python tools/bench_weightsync.py --transport-only --backend nccl --params 1.2e9 --repeats 5
else
  echo "bench_weightsync over NCCL: not run, it needs 2 GPUs and this machine has $gpus"
fi
