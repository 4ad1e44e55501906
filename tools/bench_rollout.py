"""Benchmark the rollout engine: its own overhead, its throughput against offline vLLM, and
vLLM's prefix caching on prompt-heavy groups.

Three measurements in one run (each output line names the model it used):

* ``overhead``: the engine with an instant in-process fake server (``telescope_rollout.testing``)
  on the quickstart addition environment (chat template, tokenization, lanes, rewards,
  advantages, batching all real; generation free; the torch-free advantages of
  ``telescope_rollout.testing``). ``--overhead-samples`` samples, group size 8,
  16 groups per batch, weights announced after every batch so nothing pauses. Reported as samples
  per second of bookkeeping (target: >= 5,000 on 2 cores).
* ``engine_vs_offline``: completions per second through the engine against one real vLLM server
  (the public launcher ``telescope_orchestrator.cluster.vllm_server``, the tiny model of
  tools/tiny_model.py, fp32 eager on CPU), divided by the completions per second of vLLM's
  offline ``LLM.generate`` on the same prompt ids.
* ``prefix_cache_speedup``: prompt-heavy generation through the engine, completions per second
  with vLLM's prefix caching on (the default; every request carries its server's weight-version
  salt) over off (``enable_prefix_caching: false``). Each prompt is the addition task behind a
  document of ``--prompt-tokens`` tokens of its own; groups of 8 share it; ``--prefix-max-tokens``
  tokens per completion. One server is started each way by the orchestrator's launcher, with the same
  settings otherwise (``--concurrency`` sequences, ``--batched-tokens``, ``--prefix-kv-gib`` GiB of
  KV cache). It runs on each of ``--models``: ``tiny`` (``--prefix-samples`` completions per round)
  and ``smollm2`` (SmolLM2-135M-Instruct from ``telescope_orchestrator.run.models.resolve_model``,
  ``--smol-samples``). Prompts are drawn from 100,000 documents with another seed each round, so
  rounds do not reuse each other's prompts: what is reused is a group's shared prompt. The share
  of prompt tokens served from the cache (vLLM's ``/metrics``) is printed for both servers.

What is held equal so the ``engine_vs_offline`` ratio measures the engine and the serving path, not
the settings:
``--samples`` completions on both sides, ``--max-tokens`` tokens each (temperature 1,
``ignore_eos``, one logprob per token; every completion's length is checked on both sides), the
same ``max_num_seqs`` (``--concurrency``) and
``max_num_batched_tokens``, prefix caching off on both, and the engine's lane slots per server
equal to ``max_num_seqs`` (``concurrency / 8`` groups of 8). The engine runs without weight
updates and with ``max_off_policy_steps=-1``, so no group is cancelled and no generation is
wasted. Only generation is timed (start-ups and one warm-up round excluded); every timed
measurement is repeated ``--repeats`` times and the best kept, since the 2-core machine is
shared. The server is stopped before the offline engine starts, and the offline engine runs in
its own process group, which is killed afterwards: nothing is left running. On two or more cores the
server's processes run on the first core and this process (the engine or the raw loop) on the others,
as ``telescope train`` places a server and its trainer (``--no-pin``: every process on every core,
where vLLM's busy-waiting engine core and the client take each other's time); the offline engine, one
process tree, keeps every core.

Two more lines show where time goes (same server, same prompts, no engine):
``raw HTTP``: a plain asyncio + aiohttp loop with ``concurrency`` requests in flight, the engine's
request body; ``raw HTTP n=8``: one request per group (``n=8``), i.e. 8x fewer HTTP requests.
``--httpx`` adds the raw loop through httpx (what the client used before; see _client.py).

Usage: ``python tools/bench_rollout.py [--overhead-samples 20480] [--samples 512] [--max-tokens 32]
[--concurrency 64] [--repeats 3] [--models tiny,smollm2] [--prompt-tokens 512] [--skip-vllm]
[--skip-offline] [--skip-prefix] [--httpx]``. The last line is ``RESULT engine_vs_offline=<ratio>
prefix_cache_speedup=<ratio, tiny> prefix_cache_speedup_smollm2=<ratio> overhead_samples_per_s=<x>``
(nan for a measurement that did not run).
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
import random
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
TINY = "tiny (tools/tiny_model.py)"
WORDS = [
    "the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "what", "is", "answer", "you",
    "are", "helpful", "assistant", "guess", "five", "letter", "word", "red", "green", "blue", "cat",
    "apple", "using", "numbers", "create", "an", "equation", "that", "equals", "target", "tool", "call",
]  # fmt: skip
DOCUMENTS = 100_000
"""Prompts of the prefix-cache measurement: enough that rounds of a few hundred groups rarely share one."""


def _engine(settings, client, tokenizer, num_samples: int = 2000, *, env=None, seed: int = 0):
    from telescope_rollout import MultiEnvSampler, RolloutEngine, SamplerEntry
    from telescope_rollout.envs.quickstart_add import QuickstartAddEnv
    from telescope_rollout.testing import group_advantages

    if env is None:
        env = QuickstartAddEnv(num_samples=num_samples)
        env.load_dataset()
    sampler = MultiEnvSampler([SamplerEntry("add", 1.0, len(env))], seed=seed)
    return RolloutEngine(
        settings, environments={"add": env}, sampler=sampler, tokenizer=tokenizer, client=client,
        advantage_fn=group_advantages,
    )  # fmt: skip


def _long_prompt_env(tokenizer, prompt_tokens: int):
    """quickstart_add with a document of ``prompt_tokens`` tokens before each question, its own per
    prompt (made when the prompt is drawn): the 8 samples of a group share one long prompt."""
    from telescope_rollout import Sample
    from telescope_rollout.envs.quickstart_add import QuickstartAddEnv

    class LongPromptAdd(QuickstartAddEnv):
        def get_sample(self, idx: int) -> Sample:
            sample = super().get_sample(idx)
            rng = random.Random(idx)
            words = " ".join(rng.choice(WORDS) for _ in range(prompt_tokens))  # >= 1 token per word
            document = tokenizer.decode(tokenizer.encode(words)[:prompt_tokens])
            return Sample(f"{document}\n\n{sample.prompt}", sample.answer, sample.metadata)

    env = LongPromptAdd(num_samples=DOCUMENTS)
    env.load_dataset()
    return env


def _check_lengths(samples, max_tokens: int) -> None:
    """Every completion has exactly ``max_tokens`` tokens (``ignore_eos``): the work timed is the work
    asked for."""
    wrong = [
        (s.sample_id, len(s.completion_ids), s.error) for s in samples if len(s.completion_ids) != max_tokens
    ]
    if wrong:
        raise RuntimeError(
            f"{len(wrong)} completions without exactly {max_tokens} tokens (sample id, tokens, error): "
            f"{wrong[:5]}"
        )


async def _drive(
    engine, num_samples: int, update_weights: bool, max_tokens: int | None = None
) -> tuple[int, float, list[list[int]], int]:
    """Run until ``num_samples`` samples came out: (samples, seconds, prompt ids, cancelled groups).

    With ``max_tokens`` (a real server, ``ignore_eos``) every completion must have exactly that many
    tokens."""
    done, prompts, cancelled = 0, [], 0
    async with engine:
        t0 = time.perf_counter()
        while done < num_samples:
            batch = await engine.next_batch(timeout_s=1800)
            samples = [*batch.samples, *(s for d in batch.discarded for s in d.group.samples)]
            if max_tokens is not None:
                _check_lengths(samples, max_tokens)
            done += len(samples)
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
    print(
        f"overhead [fake server, {TINY} tokenizer]: {done} samples in {elapsed:.2f} s -> "
        f"{rate:.0f} samples/s ({1e6 / rate:.0f} us/sample)"
    )
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
                except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
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


@contextlib.contextmanager
def _on_cores(cores: set[int]):
    """The calling thread (the main one: the event loop and the processes it starts meanwhile) on
    ``cores``; its own cores again after (Linux sets affinity per thread; new threads inherit it)."""
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cores)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


def _split_cores(pin: bool) -> tuple[set[int], set[int], dict[str, str]]:
    """(the server's cores, the client's, the server's extra env): with ``pin`` and two or more cores,
    the server's whole tree on the first core (vLLM's OpenMP threads bound there) and this process on
    the rest, as ``telescope train`` places a server and its trainer; else every core for both."""
    cores = sorted(os.sched_getaffinity(0))
    if not pin or len(cores) < 2:
        return set(cores), set(cores), {}
    return {cores[0]}, set(cores[1:]), {"VLLM_CPU_OMP_THREADS_BIND": str(cores[0])}


def bench_server(model_dir: Path, tokenizer, args, log_dir: Path) -> tuple[float, list[list[int]]]:
    """Engine and raw-HTTP completions/s on one server; returns (best engine rate, prompt ids)."""
    from telescope_orchestrator.cluster.vllm_server import ServerSettings, launch_server
    from telescope_rollout import EngineSettings, InferenceClient

    cfg = ServerSettings(
        model=str(model_dir), host="127.0.0.1", device="cpu", max_model_len=512,
        max_num_seqs=args.concurrency, max_num_batched_tokens=args.batched_tokens,
        served_model_name="tiny", scheduling_policy="fcfs", seed=0, enable_prefix_caching=False,
        extra_args=tuple(args.server_arg),
    )  # fmt: skip
    port = args.port or _free_port()
    settings = EngineSettings(
        group_size=GROUP, prompts_batch_size_for_trainer=args.concurrency // GROUP,
        max_concurrent_prompts_per_server=args.concurrency // GROUP, max_tokens=args.max_tokens,
        max_model_len=512, discard_group_zero_advantage=False, scheduling_policy="fcfs",
        extra_sampling={"ignore_eos": True}, max_async_rollout=10**6, max_off_policy_steps=-1,
    )  # fmt: skip
    legacy = dataclasses.replace(settings, max_off_policy_steps=8)

    server_cores, client_cores, pin_env = _split_cores(args.pin)
    print(f"  server on cores {sorted(server_cores)}, client on {sorted(client_cores)}", flush=True)

    async def run() -> tuple[float, list[list[int]]]:
        with _on_cores(server_cores):  # the server's processes inherit these cores
            launched = launch_server(
                cfg, port=port, log_path=log_dir / "vllm_0.log", env={**CPU_ENV, **pin_env}
            )
        with launched as server, _on_cores(client_cores):
            await asyncio.to_thread(server.wait_healthy, 900)
            url = server.url
            async with InferenceClient([url], model="tiny", timeout_s=1800) as client:
                _, _, prompts, _ = await _drive(
                    _engine(settings, client, tokenizer), 2 * args.concurrency, False, args.max_tokens
                )
                await raw_aiohttp(url, prompts, args.max_tokens, args.concurrency)  # warm-up
                engine_rates, raw_rates, n8_rates = [], [], []
                for _ in range(args.repeats):
                    done, elapsed, prompts, cancelled = await _drive(
                        _engine(settings, client, tokenizer), args.samples, False, args.max_tokens
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
            f"engine+vLLM server [{TINY}]: {max(engine_rates):.1f} completions/s (best of {args.repeats}); "
            f"raw HTTP {max(raw_rates):.1f}/s; raw HTTP n={GROUP} {max(n8_rates):.1f}/s"
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
    print(
        f"offline LLM.generate [{TINY}]: {len(prompts)} completions, best of {len(rates)}: {max(rates):.1f}/s"
    )
    return max(rates)


def _prefix_counters(url: str) -> tuple[float, float]:
    """(prompt tokens found in the prefix cache, prompt tokens looked up) so far: vLLM's /metrics."""
    import httpx

    totals = {"vllm:prefix_cache_hits_total": 0.0, "vllm:prefix_cache_queries_total": 0.0}
    for line in httpx.get(f"{url}/metrics", timeout=30).raise_for_status().text.splitlines():
        name = line.split("{", 1)[0].split(" ", maxsplit=1)[0]
        if name in totals:
            totals[name] += float(line.rsplit(" ", 1)[1])
    return totals["vllm:prefix_cache_hits_total"], totals["vllm:prefix_cache_queries_total"]


async def _prefix_round(model: str, label: str, caching: bool, args, log_dir: Path, samples: int) -> float:
    """Best completions/s of prompt-heavy groups on one server with prefix caching on or off."""
    from telescope_orchestrator.cluster.vllm_server import ServerSettings, launch_server
    from telescope_rollout import EngineSettings, InferenceClient, Tokenizer

    tokenizer = Tokenizer.from_pretrained(model)
    model_len = args.prompt_tokens + 128 + args.prefix_max_tokens  # the chat template and the question
    cfg = ServerSettings(
        model=model, host="127.0.0.1", device="cpu", max_model_len=model_len, max_num_seqs=args.concurrency,
        max_num_batched_tokens=args.batched_tokens, served_model_name="bench", scheduling_policy="fcfs",
        seed=0, enable_prefix_caching=caching, extra_args=tuple(args.server_arg),
    )  # fmt: skip
    settings = EngineSettings(
        group_size=GROUP, prompts_batch_size_for_trainer=max(min(args.concurrency, samples) // GROUP, 1),
        max_concurrent_prompts_per_server=args.concurrency // GROUP, max_tokens=args.prefix_max_tokens,
        max_model_len=model_len, discard_group_zero_advantage=False, scheduling_policy="fcfs",
        extra_sampling={"ignore_eos": True}, max_async_rollout=10**6, max_off_policy_steps=-1,
    )  # fmt: skip
    env = _long_prompt_env(tokenizer, args.prompt_tokens)
    server_env = {**CPU_ENV, "VLLM_CPU_KVCACHE_SPACE": str(args.prefix_kv_gib)}
    log_path = log_dir / f"vllm_prefix_{Path(model).name}_{'on' if caching else 'off'}.log"
    rates, prompts = [], []
    with launch_server(cfg, port=_free_port(), log_path=log_path, env=server_env) as server:
        await asyncio.to_thread(server.wait_healthy, 900)
        async with InferenceClient([server.url], model="bench", timeout_s=1800) as client:
            warm = dataclasses.replace(settings, prompts_batch_size_for_trainer=2)  # two groups
            engine = _engine(warm, client, tokenizer, env=env, seed=10**6)
            await _drive(engine, 1, False, args.prefix_max_tokens)
            hits0, queries0 = _prefix_counters(server.url)
            for i in range(args.repeats):  # another seed each round: no prompt of an earlier round
                engine = _engine(settings, client, tokenizer, env=env, seed=i)
                done, elapsed, got, _ = await _drive(engine, samples, False, args.prefix_max_tokens)
                rates.append(done / elapsed)
                prompts += got
            hits, queries = _prefix_counters(server.url)
    share = (hits - hits0) / max(queries - queries0, 1.0)
    if (share > 0) != caching:
        state = "on" if caching else "off"
        raise RuntimeError(f"prefix caching {state}, yet {share:.0%} of the prompt tokens were cached")
    mean = sum(map(len, prompts)) / max(len(prompts), 1)
    print(
        f"  prefix caching {'on ' if caching else 'off'} [{label}]: {max(rates):.1f} completions/s (best of "
        f"{len(rates)}); prompts {mean:.0f} tokens, {share:.0%} of them from the cache",
        flush=True,
    )  # fmt: skip
    return max(rates)


def bench_prefix_cache(model: str, label: str, args, log_dir: Path, samples: int) -> float:
    """Completions/s with prefix caching on over off, one server each way (on first)."""
    on = asyncio.run(_prefix_round(model, label, True, args, log_dir, samples))
    off = asyncio.run(_prefix_round(model, label, False, args, log_dir, samples))
    print(
        f"prefix cache [{label}]: {samples} completions of {GROUP}-sample groups, "
        f"{args.prefix_max_tokens} tokens each: on {on:.1f}/s, off {off:.1f}/s -> {on / off:.2f}x"
    )
    return on / off


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
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
    parser.add_argument("--skip-offline", action="store_true", help="no offline side (server still timed)")
    parser.add_argument("--httpx", action="store_true", help="also time the raw loop through httpx")
    parser.add_argument(
        "--pin",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="server on the first core, client on the rest (engine vs offline)",
    )
    parser.add_argument(
        "--legacy", action="store_true", help="also time the engine as the old bench drove it"
    )
    parser.add_argument("--offline-worker", help=argparse.SUPPRESS)
    prefix = parser.add_argument_group("prefix caching on vs off (prompt-heavy groups)")
    prefix.add_argument("--skip-prefix", action="store_true", help="no prefix-cache measurement")
    prefix.add_argument("--models", default="tiny,smollm2", help="comma-separated: tiny, smollm2")
    prefix.add_argument("--prompt-tokens", type=int, default=512, help="document tokens per prompt")
    prefix.add_argument("--prefix-max-tokens", type=int, default=8, help="tokens per completion")
    prefix.add_argument("--prefix-samples", type=int, default=512, help="completions per round, tiny model")
    prefix.add_argument("--smol-samples", type=int, default=32, help="completions per round, SmolLM2")
    prefix.add_argument(
        "--prefix-kv-gib", type=int, default=4, help="VLLM_CPU_KVCACHE_SPACE (whole GiB) of these servers"
    )
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    if args.offline_worker:
        offline_worker(args.offline_worker)
        return
    if args.concurrency % GROUP:
        parser.error(f"--concurrency must be a multiple of the group size {GROUP}")
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if set(models) - {"tiny", "smollm2"}:
        parser.error(f"--models takes tiny and smollm2, not {sorted(set(models) - {'tiny', 'smollm2'})}")
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
        speedup = {"tiny": float("nan"), "smollm2": float("nan")}
        if not args.skip_vllm:
            engine_rate, prompts = bench_server(model_dir, tokenizer, args, tmp / "logs")
            if not args.skip_offline:
                ratio = engine_rate / bench_offline(model_dir, prompts, args, tmp)
        if not args.skip_vllm and not args.skip_prefix:
            for which in models:
                model, label, samples = (str(model_dir), TINY, args.prefix_samples)
                if which == "smollm2":
                    from telescope_orchestrator.run.models import SMOLLM2_ID, resolve_model

                    model, label, samples = (resolve_model(SMOLLM2_ID), SMOLLM2_ID, args.smol_samples)
                speedup[which] = bench_prefix_cache(model, label, args, tmp / "logs", samples)
    print(
        f"RESULT engine_vs_offline={ratio:.3f} prefix_cache_speedup={speedup['tiny']:.3f} "
        f"prefix_cache_speedup_smollm2={speedup['smollm2']:.3f} overhead_samples_per_s={overhead:.0f}"
    )
    sys.stdout.flush()


if __name__ == "__main__":
    main()
