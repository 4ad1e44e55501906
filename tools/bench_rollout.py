"""Benchmark the rollout engine: its own overhead, and its throughput against offline vLLM.

Two measurements in one run:

* ``overhead``: the engine with an instant in-process fake server (``telescope_rollout.testing``)
  on the quickstart addition environment (chat template, tokenization, lanes, rewards,
  advantages, batching all real; generation free; the torch-free advantages of
  ``telescope_rollout.testing``). ``--overhead-samples`` samples, group size 8,
  16 groups per batch, weights announced after every batch so nothing pauses. Reported as samples
  per second of bookkeeping (target: >= 5,000 on 2 cores).
* ``engine_vs_offline``: completions per second through the engine against one real vLLM server
  (the CLI's launcher ``telescope_cli._vllm``, the tiny model of tools/tiny_model.py, fp32 eager on
  CPU), divided by the
  completions per second of vLLM's offline ``LLM.generate`` on the same prompt ids.

What is held equal so the ratio measures the engine and the serving path, not the settings:
``--samples`` completions on both sides, ``--max-tokens`` tokens each (temperature 1,
``ignore_eos``, one logprob per token), the same ``max_num_seqs`` (``--concurrency``) and
``max_num_batched_tokens``, prefix caching off on both, and the engine's lane slots per server
equal to ``max_num_seqs`` (``concurrency / 8`` groups of 8). The engine runs without weight
updates and with ``max_off_policy_steps=-1``, so no group is cancelled and no generation is
wasted. Only generation is timed (start-ups and one warm-up round excluded); every timed
measurement is repeated ``--repeats`` times and the best kept, since the 2-core machine is
shared. The server is stopped before the offline engine starts, and the offline engine runs in
its own process group, which is killed afterwards: nothing is left running.

Two more lines show where time goes (same server, same prompts, no engine):
``raw HTTP``: a plain asyncio + aiohttp loop with ``concurrency`` requests in flight, the engine's
request body; ``raw HTTP n=8``: one request per group (``n=8``), i.e. 8x fewer HTTP requests.
``--httpx`` adds the raw loop through httpx (what the client used before; see _client.py).

Usage: ``python tools/bench_rollout.py [--overhead-samples 20480] [--samples 512] [--max-tokens 32]
[--concurrency 64] [--repeats 3] [--skip-vllm] [--httpx]``. The last line is
``RESULT overhead_samples_per_s=<x> engine_vs_offline=<ratio>``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import importlib.util
import json
import os
import platform
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
GROUP = 8
CPU_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_LOGGING_LEVEL": "WARNING", "HF_HUB_OFFLINE": "1"}


def _engine(settings, client, tokenizer, num_samples: int = 2000):
    from telescope_rollout import MultiEnvSampler, RolloutEngine, SamplerEntry
    from telescope_rollout.envs.quickstart_add import QuickstartAddEnv
    from telescope_rollout.testing import group_advantages

    env = QuickstartAddEnv(num_samples=num_samples)
    env.load_dataset()
    sampler = MultiEnvSampler([SamplerEntry("add", 1.0, len(env))], seed=0)
    return RolloutEngine(
        settings, environments={"add": env}, sampler=sampler, tokenizer=tokenizer, client=client,
        advantage_fn=group_advantages,
    )  # fmt: skip


async def _drive(engine, num_samples: int, update_weights: bool) -> tuple[int, float, list[list[int]], int]:
    """Run until ``num_samples`` samples came out: (samples, seconds, prompt ids, cancelled groups)."""
    done, prompts, cancelled = 0, [], 0
    async with engine:
        t0 = time.perf_counter()
        while done < num_samples:
            batch = await engine.next_batch(timeout_s=1800)
            done += len(batch.samples) + sum(len(d.group.samples) for d in batch.discarded)
            cancelled += len(batch.cancelled)
            prompts += [s.prompt_ids for s in batch.samples]
            if update_weights:
                engine.weights_updated(engine.version + 1)
        elapsed = time.perf_counter() - t0
    return done, elapsed, prompts, cancelled


def bench_overhead(tokenizer, num_samples: int) -> float:
    from telescope_rollout import EngineSettings
    from telescope_rollout.testing import FakeInferenceServer

    settings = EngineSettings(
        group_size=GROUP, prompts_batch_size_for_trainer=16, max_concurrent_prompts_per_server=32,
        max_tokens=16, max_model_len=512, discard_group_zero_advantage=False,
    )  # fmt: skip
    server = FakeInferenceServer(
        server_urls=["http://fake-0", "http://fake-1"], reply=lambda r: ("42", [1, 2, 3])
    )
    asyncio.run(_drive(_engine(settings, server, tokenizer), 1024, True))  # warm-up
    done, elapsed, _, _ = asyncio.run(_drive(_engine(settings, server, tokenizer), num_samples, True))
    rate = done / elapsed
    print(f"overhead: {done} samples in {elapsed:.2f} s -> {rate:.0f} samples/s ({1e6 / rate:.0f} us/sample)")
    return rate


def _body(prompt: list[int], max_tokens: int, n: int = 1) -> dict[str, Any]:
    """The engine client's /v1/completions body (see InferenceClient.complete), ignore_eos."""
    return {
        "model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "n": n, "logprobs": 1,
        "return_token_ids": True, "skip_special_tokens": False, "include_stop_str_in_output": False,
        "temperature": 1.0, "ignore_eos": True,
    }  # fmt: skip


async def raw_aiohttp(
    url: str, prompts: list[list[int]], max_tokens: int, concurrency: int, n: int = 1
) -> float:
    """Completions per second of a plain aiohttp loop keeping ``concurrency`` requests in flight."""
    import aiohttp

    todo = list(prompts)
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=2.0)  # as InferenceClient
    async with aiohttp.ClientSession(connector=connector) as http:

        async def post(body: dict[str, Any]) -> int:
            for attempt in range(3):  # a kept-alive connection the server just closed: retry, as the client
                try:
                    async with http.post(f"{url}/v1/completions", json=body) as r:
                        assert r.status == 200, await r.text()
                        return len(json.loads(await r.read())["choices"])
                except aiohttp.ServerDisconnectedError:
                    if attempt == 2:
                        raise
            raise AssertionError("unreachable")

        async def worker() -> int:
            got = 0
            while todo:
                got += await post(_body(todo.pop(), max_tokens, n))
            return got

        t0 = time.perf_counter()
        done = sum(await asyncio.gather(*(worker() for _ in range(concurrency))))
        return done / (time.perf_counter() - t0)


async def raw_httpx(url: str, prompts: list[list[int]], max_tokens: int, concurrency: int) -> float:
    import httpx

    todo = list(prompts)
    limits = httpx.Limits(max_connections=4096, max_keepalive_connections=4096)
    async with httpx.AsyncClient(timeout=1800, limits=limits) as http:

        async def worker() -> None:
            while todo:
                r = await http.post(f"{url}/v1/completions", json=_body(todo.pop(), max_tokens))
                r.raise_for_status()
                r.json()

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return len(prompts) / (time.perf_counter() - t0)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def bench_server(model_dir: Path, tokenizer, args, log_dir: Path) -> tuple[float, list[list[int]]]:
    """Engine and raw-HTTP completions/s on one server; returns (best engine rate, prompt ids)."""
    from telescope_cli._vllm import ServerSettings, launch_server
    from telescope_rollout import EngineSettings, InferenceClient

    cfg = ServerSettings(
        model=str(model_dir), host="127.0.0.1", device="cpu", max_model_len=512,
        max_num_seqs=args.concurrency, max_num_batched_tokens=args.batched_tokens,
        served_model_name="tiny", scheduling_policy="fcfs", seed=0, extra_args=tuple(args.server_arg),
    )  # fmt: skip
    port = args.port or _free_port()
    settings = EngineSettings(
        group_size=GROUP, prompts_batch_size_for_trainer=args.concurrency // GROUP,
        max_concurrent_prompts_per_server=args.concurrency // GROUP, max_tokens=args.max_tokens,
        max_model_len=512, discard_group_zero_advantage=False, scheduling_policy="fcfs",
        extra_sampling={"ignore_eos": True}, max_async_rollout=10**6, max_off_policy_steps=-1,
    )  # fmt: skip
    legacy = dataclasses.replace(settings, max_off_policy_steps=8)

    async def run() -> tuple[float, list[list[int]]]:
        with launch_server(cfg, port=port, log_path=log_dir / "vllm_0.log", env=CPU_ENV) as server:
            await asyncio.to_thread(server.wait_healthy, 900)
            url = server.url
            async with InferenceClient([url], model="tiny", timeout_s=1800) as client:
                _, _, prompts, _ = await _drive(
                    _engine(settings, client, tokenizer), 2 * args.concurrency, False
                )
                await raw_aiohttp(url, prompts, args.max_tokens, args.concurrency)  # warm-up
                engine_rates, raw_rates, n8_rates = [], [], []
                for _ in range(args.repeats):
                    done, elapsed, prompts, cancelled = await _drive(
                        _engine(settings, client, tokenizer), args.samples, False
                    )
                    engine_rates.append(done / elapsed)
                    print(
                        f"  engine: {done} completions in {elapsed:.2f} s -> {done / elapsed:.1f}/s",
                        flush=True,
                    )
                    prompts = prompts[: args.samples]
                    raw_rates.append(await raw_aiohttp(url, prompts, args.max_tokens, args.concurrency))
                    print(
                        f"  raw HTTP (aiohttp, {args.concurrency} in flight): {raw_rates[-1]:.1f}/s",
                        flush=True,
                    )
                    n8_rates.append(
                        await raw_aiohttp(
                            url, prompts[::GROUP], args.max_tokens, args.concurrency // GROUP, GROUP
                        )
                    )
                    print(f"  raw HTTP n={GROUP} (one request per group): {n8_rates[-1]:.1f}/s", flush=True)
                if args.legacy:
                    done, elapsed, _, cancelled = await _drive(
                        _engine(legacy, client, tokenizer), args.samples, True
                    )
                    print(
                        f"  engine, old bench settings (weights_updated each batch, max_off_policy_steps=8): "
                        f"{done / elapsed:.1f}/s, {cancelled} groups cancelled", flush=True,
                    )  # fmt: skip
                if args.httpx:
                    rate = await raw_httpx(url, prompts, args.max_tokens, args.concurrency)
                    print(f"  raw HTTP (httpx, {args.concurrency} in flight): {rate:.1f}/s", flush=True)
        print(
            f"engine+vLLM server: {max(engine_rates):.1f} completions/s (best of {args.repeats}); raw HTTP "
            f"{max(raw_rates):.1f}/s; raw HTTP n={GROUP} {max(n8_rates):.1f}/s"
        )
        return max(engine_rates), prompts

    return asyncio.run(run())


def offline_worker(spec_path: str) -> None:
    """Child process: offline ``LLM.generate`` on the prompts in ``spec_path``; prints ``OFFLINE <rate>``."""
    spec = json.loads(Path(spec_path).read_text())
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(
        model=spec["model"], dtype="float32", enforce_eager=True, max_model_len=512, seed=0,
        max_num_seqs=spec["concurrency"], max_num_batched_tokens=spec["batched_tokens"],
        enable_prefix_caching=False,
    )  # fmt: skip
    params = SamplingParams(n=1, temperature=1.0, max_tokens=spec["max_tokens"], ignore_eos=True, logprobs=1)
    prompts = [TokensPrompt(prompt_token_ids=p) for p in spec["prompts"]]
    llm.generate(prompts[: spec["concurrency"]], params, use_tqdm=False)  # warm-up
    for _ in range(spec["repeats"]):
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        elapsed = time.perf_counter() - t0
        assert all(len(o.outputs[0].token_ids) == spec["max_tokens"] for o in outs)
        print(f"OFFLINE {len(outs) / elapsed}", flush=True)
    llm.llm_engine.engine_core.shutdown()


def bench_offline(model_dir: Path, prompts: list[list[int]], args, tmp: Path) -> float:
    """Offline completions/s, run in its own process group (killed afterwards)."""
    spec = {
        "model": str(model_dir), "prompts": prompts, "max_tokens": args.max_tokens, "repeats": args.repeats,
        "concurrency": args.concurrency, "batched_tokens": args.batched_tokens,
    }  # fmt: skip
    spec_path = tmp / "offline.json"
    spec_path.write_text(json.dumps(spec))
    cmd = [sys.executable, __file__, "--offline-worker", str(spec_path)]
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ, **CPU_ENV},
        start_new_session=True, text=True,
    )  # fmt: skip
    try:
        out, _ = proc.communicate(timeout=args.offline_timeout_s)
    except subprocess.TimeoutExpired:
        out = ""
    finally:
        with contextlib.suppress(ProcessLookupError):  # the engine-core and worker processes too
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
    rates = [float(line.split()[1]) for line in out.splitlines() if line.startswith("OFFLINE ")]
    if not rates:
        tail = "\n".join(out.splitlines()[-30:])
        raise RuntimeError(f"offline LLM.generate failed or timed out ({args.offline_timeout_s} s):\n{tail}")
    print(f"offline LLM.generate: {len(prompts)} completions, best of {len(rates)}: {max(rates):.1f}/s")
    return max(rates)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--overhead-samples", type=int, default=20480)
    parser.add_argument("--samples", type=int, default=512)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=64, help="max_num_seqs = engine lane slots")
    parser.add_argument("--batched-tokens", type=int, default=4096, help="max_num_batched_tokens, both sides")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--port", type=int, default=0, help="server port (0: a free one)")
    parser.add_argument("--server-arg", action="append", default=[], help="extra vLLM server argument")
    parser.add_argument("--offline-timeout-s", type=float, default=900.0)
    parser.add_argument("--skip-vllm", action="store_true", help="only the overhead measurement")
    parser.add_argument("--httpx", action="store_true", help="also time the raw loop through httpx")
    parser.add_argument(
        "--legacy", action="store_true", help="also time the engine as the old bench drove it"
    )
    parser.add_argument("--offline-worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.offline_worker:
        offline_worker(args.offline_worker)
        return
    if args.concurrency % GROUP:
        parser.error(f"--concurrency must be a multiple of the group size {GROUP}")
    print(f"machine: {platform.machine()}, {os.cpu_count()} cpus, python {platform.python_version()}")

    from telescope_rollout import Tokenizer

    spec = importlib.util.spec_from_file_location("tiny_model", ROOT / "tools" / "tiny_model.py")
    assert spec is not None
    assert spec.loader is not None
    tiny = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tiny)
    with tempfile.TemporaryDirectory(prefix="bench_rollout_") as tmp_name:
        tmp = Path(tmp_name)
        model_dir = tiny.build_tiny_model(tmp / "tiny", tied=False)
        tokenizer = Tokenizer.from_pretrained(model_dir)
        overhead = bench_overhead(tokenizer, args.overhead_samples)
        ratio = float("nan")
        if not args.skip_vllm:
            engine_rate, prompts = bench_server(model_dir, tokenizer, args, tmp / "logs")
            offline_rate = bench_offline(model_dir, prompts, args, tmp)
            ratio = engine_rate / offline_rate
    print(f"RESULT overhead_samples_per_s={overhead:.0f} engine_vs_offline={ratio:.3f}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
