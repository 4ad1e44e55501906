"""Benchmark the rollout engine: its own overhead, and its throughput against offline vLLM.

Two measurements in one run:

* ``overhead``: the engine with an instant in-process fake server (``telescope_rollout.testing``)
  on the quickstart addition environment (chat template, tokenization, lanes, rewards,
  advantages, batching all real; generation free). ``--overhead-samples`` samples, group size 8,
  16 groups per batch, weights announced after every batch so nothing pauses. Reported as samples
  per second of bookkeeping (target: >= 5,000 on 2 cores).
* ``engine_vs_offline``: completions per second through the engine against one real vLLM server
  (``start_servers``, the tiny model of tools/tiny_model.py, fp32 eager on CPU), divided by the
  completions per second of vLLM's offline ``LLM.generate`` on the same prompt ids, same model and
  sampling (temperature 1, ``ignore_eos`` so every completion has exactly ``--max-tokens``
  tokens). Only generation is timed on both sides (server/engine start-up excluded). The server is
  stopped before the offline engine starts, so they never share the cores.

Usage: ``python tools/bench_rollout.py [--overhead-samples 20480] [--samples 256] [--max-tokens 32]
[--skip-vllm]``. The last line is ``RESULT overhead_samples_per_s=<x> engine_vs_offline=<ratio>``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _engine(settings, client, tokenizer, num_samples: int = 2000):
    from telescope_rollout import MultiEnvSampler, RolloutEngine, SamplerEntry
    from telescope_rollout.envs.quickstart_add import QuickstartAddEnv

    env = QuickstartAddEnv(num_samples=num_samples)
    env.load_dataset()
    sampler = MultiEnvSampler([SamplerEntry("add", 1.0, len(env))], seed=0)
    return RolloutEngine(
        settings, environments={"add": env}, sampler=sampler, tokenizer=tokenizer, client=client
    )


async def _drive(engine, num_samples: int) -> tuple[int, float, list[list[int]]]:
    """Run until ``num_samples`` samples came out; returns (samples, seconds, prompt ids)."""
    done, prompts = 0, []
    async with engine:
        t0 = time.perf_counter()
        while done < num_samples:
            batch = await engine.next_batch(timeout_s=1800)
            done += len(batch.samples) + sum(len(d.group.samples) for d in batch.discarded)
            prompts += [s.prompt_ids for s in batch.samples]
            engine.weights_updated(engine.version + 1)
        elapsed = time.perf_counter() - t0
    return done, elapsed, prompts


def bench_overhead(tokenizer, num_samples: int) -> float:
    from telescope_rollout import EngineSettings
    from telescope_rollout.testing import FakeInferenceServer

    settings = EngineSettings(
        group_size=8, prompts_batch_size_for_trainer=16, max_concurrent_prompts_per_server=32,
        max_tokens=16, max_model_len=512, discard_group_zero_advantage=False,
    )  # fmt: skip
    server = FakeInferenceServer(
        server_urls=["http://fake-0", "http://fake-1"], reply=lambda r: ("42", [1, 2, 3])
    )
    asyncio.run(_drive(_engine(settings, server, tokenizer), 1024))  # warm-up
    done, elapsed, _ = asyncio.run(_drive(_engine(settings, server, tokenizer), num_samples))
    rate = done / elapsed
    print(f"overhead: {done} samples in {elapsed:.2f} s -> {rate:.0f} samples/s ({1e6 / rate:.0f} us/sample)")
    return rate


def bench_engine_on_server(model_dir: Path, tokenizer, args, log_dir: Path) -> tuple[float, list[list[int]]]:
    from telescope_rollout import EngineSettings, InferenceClient, ServerSettings, start_servers

    cfg = ServerSettings(
        model=str(model_dir), device="cpu", base_port=args.port, max_model_len=512, max_num_seqs=64,
        served_model_name="tiny", scheduling_policy="fcfs", seed=0,
    )  # fmt: skip
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_LEVEL": "WARNING"}
    settings = EngineSettings(
        group_size=8, prompts_batch_size_for_trainer=4, max_concurrent_prompts_per_server=8,
        max_tokens=args.max_tokens, max_model_len=512, discard_group_zero_advantage=False,
        scheduling_policy="fcfs", extra_sampling={"ignore_eos": True}, max_async_rollout=1000,
    )  # fmt: skip

    async def run() -> tuple[int, float, list[list[int]]]:
        with start_servers(cfg, 1, log_dir=log_dir, env=env) as group:
            await group.wait_healthy(timeout_s=600)
            async with InferenceClient(group.urls, timeout_s=600) as client:
                await _drive(_engine(settings, client, tokenizer), 32)  # warm-up
                return await _drive(_engine(settings, client, tokenizer), args.samples)

    done, elapsed, prompts = asyncio.run(run())
    rate = done / elapsed
    print(f"engine+vLLM server: {done} completions in {elapsed:.2f} s -> {rate:.1f} completions/s")
    return rate, prompts


def bench_offline(model_dir: Path, prompts: list[list[int]], max_tokens: int) -> float:
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # same KV cache as the server
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(
        model=str(model_dir), dtype="float32", enforce_eager=True, max_model_len=512, max_num_seqs=64, seed=0
    )
    params = SamplingParams(n=1, temperature=1.0, max_tokens=max_tokens, ignore_eos=True, logprobs=1)
    llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts[:32]], params, use_tqdm=False)  # warm-up
    t0 = time.perf_counter()
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    elapsed = time.perf_counter() - t0
    with contextlib.suppress(Exception):  # else the engine-core process keeps the script alive
        llm.llm_engine.engine_core.shutdown()
    assert all(len(o.outputs[0].token_ids) == max_tokens for o in outs)
    rate = len(outs) / elapsed
    print(f"offline LLM.generate: {len(outs)} completions in {elapsed:.2f} s -> {rate:.1f} completions/s")
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--overhead-samples", type=int, default=20480)
    parser.add_argument("--samples", type=int, default=256)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--port", type=int, default=18901)
    parser.add_argument("--skip-vllm", action="store_true", help="only the overhead measurement")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    print(f"machine: {platform.machine()}, {os.cpu_count()} cpus, python {platform.python_version()}")

    from telescope_rollout import Tokenizer

    spec = importlib.util.spec_from_file_location("tiny_model", ROOT / "tools" / "tiny_model.py")
    assert spec is not None
    assert spec.loader is not None
    tiny = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tiny)
    with tempfile.TemporaryDirectory(prefix="bench_rollout_") as tmp:
        model_dir = tiny.build_tiny_model(Path(tmp) / "tiny", tied=False)
        tokenizer = Tokenizer.from_pretrained(model_dir)
        overhead = bench_overhead(tokenizer, args.overhead_samples)
        ratio = float("nan")
        if not args.skip_vllm:
            engine_rate, prompts = bench_engine_on_server(model_dir, tokenizer, args, Path(tmp) / "logs")
            offline_rate = bench_offline(model_dir, prompts, args.max_tokens)
            ratio = engine_rate / offline_rate
    print(f"RESULT overhead_samples_per_s={overhead:.0f} engine_vs_offline={ratio:.3f}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
