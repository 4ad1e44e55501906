#!/usr/bin/env bash
# The GPU checks of a device session, as one short script (docs: README "Benchmarks"):
#   1. the tests marked gpu (trainer side only: the device machine has no vLLM);
#   2. bench_trainer on a random 0.5B Llama at 16k packed tokens per micro-batch against the fair
#      baseline (samples sorted by length, each micro-batch padded to its own longest), with MFU
#      (the target: 25% on an H200);
#   3. bench_weightsync over NCCL at 1.2B parameters between two processes (--transport-only: the
#      device machine has no vLLM), when there are two GPUs (NCCL refuses two ranks on one);
#   4. bench_e2e on a 0.5B model (TELESCOPE_GPU_E2E_MODEL, a hub id or a folder), when vLLM is
#      installed: every Telescope side runs vLLM servers.
# A check that cannot run on this machine says so and why; the others still run.
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
if python -c 'import vllm' 2>/dev/null; then
  python tools/bench_e2e.py --model "${TELESCOPE_GPU_E2E_MODEL:-Qwen/Qwen2.5-0.5B-Instruct}" --steps 8 \
    --repeats 3 --sides plain_hf,plain_vllm,async0,async1
else
  echo "bench_e2e on a 0.5B model: not run, vLLM is not installed on this machine"
fi
