"""The small CUDA-to-CPU redirection megatron-core needs to run on a machine without CUDA.

megatron-core 0.16 asks ``torch.cuda`` for the current device (rotary embeddings, attention,
gradient buffers) and for RNG states (``model_parallel_cuda_manual_seed``, activation
recomputation). On a CPU-only machine those calls raise. :func:`install_cpu_shim` points them at
the CPU: ``torch.cuda.current_device`` answers ``"cpu"`` (a valid ``device=`` argument),
``torch.cuda.get_rng_state`` / ``set_rng_state`` and megatron's ``_get_cuda_rng_state`` /
``_set_cuda_rng_state`` use the CPU generator, and the optimizer modules that create small
tensors with a literal ``device="cuda"`` (loss scale, overflow flag, grad-norm buffers) see a
``torch`` whose ``tensor``/``zeros``/``ones``/``empty`` put ``"cuda"`` tensors on the CPU instead,
and the rotary embeddings' context-parallel slice (``get_pos_emb_on_this_cp_rank``, which pins and
moves an index to CUDA) is the same zig-zag slice computed on the CPU.
The MoE ``alltoall`` token dispatcher (megatron-core's own, the one that handles a different token count on
every expert-parallel rank) copies its split sizes to the host on a CUDA side stream
(``MoEAlltoAllTokenDispatcher._maybe_dtoh_and_synchronize``, stream made in ``__init__``); on the
CPU the tensors are already on the host, so the shim gives the class a placeholder stream and a
method that only turns the splits into NumPy arrays at the same point, as the CUDA path does, and
the same dispatcher code runs on CPU and GPU.
Nothing is touched where CUDA is available, so
the same code path runs unchanged on GPUs. :func:`uninstall_cpu_shim` restores every original
(tests use it). Megatron's optimizer also checks ``param.type() == "torch.cuda.FloatTensor"``
when it is built and when it clips; :func:`cuda_type_names` is a context manager, wrapped around
exactly those calls, in which ``Tensor.type()`` reports CPU tensors under their CUDA names. The
shim also lists the fusions that need CUDA kernels (:data:`CPU_UNFUSED`):
the trainer turns them off in the ``TransformerConfig`` when the shim is active.
"""

from __future__ import annotations

import contextlib
import importlib
import types
from collections.abc import Generator
from typing import Any

import torch

from telescope_trainer_megatron._requirements import require_megatron

__all__ = ["CPU_UNFUSED", "cpu_shim_active", "cuda_type_names", "install_cpu_shim", "uninstall_cpu_shim"]

CPU_UNFUSED: dict[str, bool] = {
    "bias_activation_fusion": False,
    "masked_softmax_fusion": False,
    "bias_dropout_fusion": False,
    "gradient_accumulation_fusion": False,
    "persist_layer_norm": False,
    "apply_rope_fusion": False,
}
"""TransformerConfig fields that select CUDA-only fused kernels, with their CPU values."""

_saved: list[tuple[Any, str, Any]] = []
_CUDA_LITERAL_MODULES = (
    "megatron.core.optimizer.optimizer",
    "megatron.core.optimizer.clip_grads",
    "megatron.core.optimizer.grad_scaler",
    "megatron.core.pipeline_parallel.schedules",
    "megatron.core.pipeline_parallel.p2p_communication",
    "megatron.core.transformer.utils",
    "megatron.core.utils",
)

_ROPE_CP_MODULES = (
    "megatron.core.models.common.embeddings.rope_utils",
    "megatron.core.models.common.embeddings.rotary_pos_embedding",
    "megatron.core.models.common.embeddings.yarn_rotary_pos_embedding",
)


def _on_cpu(device: Any) -> Any:
    if device == "cuda" or (isinstance(device, torch.device) and device.type == "cuda"):
        return "cpu"
    return device


def _cpu_factory(fn: Any) -> Any:
    def make(*args: Any, device: Any = None, **kwargs: Any) -> torch.Tensor:
        return fn(*args, device=_on_cpu(device), **kwargs)

    return make


class _CpuDeviceTorch(types.ModuleType):
    """``torch`` as seen by one megatron module: tensor factories map ``device="cuda"`` to the CPU."""

    tensor = staticmethod(_cpu_factory(torch.tensor))
    zeros = staticmethod(_cpu_factory(torch.zeros))
    ones = staticmethod(_cpu_factory(torch.ones))
    empty = staticmethod(_cpu_factory(torch.empty))

    def __getattr__(self, name: str) -> Any:
        return getattr(torch, name)


def _cpu_current_device() -> str:
    return "cpu"


def _cpu_get_rng_state(*_args: Any, **_kwargs: Any) -> torch.Tensor:
    return torch.get_rng_state()


def _cpu_set_rng_state(new_state: torch.Tensor, *_args: Any, **_kwargs: Any) -> None:
    torch.set_rng_state(new_state)


def _cpu_synchronize(*_args: Any, **_kwargs: Any) -> None:
    """CPU work is synchronous: nothing to wait for (pipeline p2p calls this)."""


def _cpu_manual_seed(seed: int) -> None:
    torch.manual_seed(seed)  # pyright: ignore[reportUnknownMemberType] (its parameter is unannotated)


def _cpu_pos_emb_on_this_cp_rank(pos_emb: torch.Tensor, seq_dim: int, cp_group: Any) -> torch.Tensor:
    """Megatron's ``get_pos_emb_on_this_cp_rank`` (chunks r and 2·cp−1−r) without CUDA."""
    from telescope_algos.backend import zigzag_indices

    if cp_group is None:
        raise ValueError("cp_group must be provided to get positional embedding per CP rank")
    index = zigzag_indices(pos_emb.shape[seq_dim], cp_group.size(), cp_group.rank(), pos_emb.device)
    return pos_emb.index_select(seq_dim, index)


_NO_STREAM = object()
"""Stands for the dispatcher's CUDA copy stream on the CPU (so ``__init__`` does not create one)."""


def _cpu_dtoh_and_synchronize(
    self: Any, point: str, tokens_per_expert: torch.Tensor | None = None
) -> torch.Tensor | None:
    """``MoEAlltoAllTokenDispatcher._maybe_dtoh_and_synchronize`` on the CPU: no copy, no stream.

    At the dispatcher's copy point the split sizes become NumPy arrays (what ``all_to_all_single``
    takes as sizes, and what the CUDA path makes of them); there is nothing to wait for.
    """
    if not self.drop_and_pad and point == self.cuda_dtoh_point:
        for name in ("input_splits", "output_splits", "output_splits_tp"):
            value = getattr(self, name)
            if torch.is_tensor(value):
                setattr(self, name, value.numpy())
    return tokens_per_expert


def cpu_shim_active() -> bool:
    """True while the redirections of :func:`install_cpu_shim` are in place."""
    return bool(_saved)


def install_cpu_shim() -> bool:
    """Redirect megatron-core's CUDA calls to the CPU; a no-op where CUDA is available.

    Idempotent. Returns True when the shim is (now) active.
    """
    if torch.cuda.is_available():
        return False
    if _saved:
        return True
    require_megatron()
    from megatron.core.tensor_parallel import random as mrandom
    from megatron.core.transformer.moe.token_dispatcher import MoEAlltoAllTokenDispatcher

    patches: list[tuple[Any, str, Any]] = [
        (torch.cuda, "current_device", _cpu_current_device),
        (torch.cuda, "get_rng_state", _cpu_get_rng_state),
        (torch.cuda, "set_rng_state", _cpu_set_rng_state),
        (torch.cuda, "manual_seed", _cpu_manual_seed),
        (torch.cuda, "synchronize", _cpu_synchronize),
        (mrandom, "_get_cuda_rng_state", _cpu_get_rng_state),
        (mrandom, "_set_cuda_rng_state", _cpu_set_rng_state),
        (MoEAlltoAllTokenDispatcher, "cuda_dtoh_stream", _NO_STREAM),
        (MoEAlltoAllTokenDispatcher, "_maybe_dtoh_and_synchronize", _cpu_dtoh_and_synchronize),
    ]
    for module_name in _CUDA_LITERAL_MODULES:
        module = importlib.import_module(module_name)
        patches.append((module, "torch", _CpuDeviceTorch("torch")))
    for module_name in _ROPE_CP_MODULES:
        module = importlib.import_module(module_name)
        patches.append((module, "get_pos_emb_on_this_cp_rank", _cpu_pos_emb_on_this_cp_rank))
    for owner, name, replacement in patches:
        _saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, replacement)
    return True


def uninstall_cpu_shim() -> None:
    """Put back every original the shim replaced (idempotent)."""
    while _saved:
        owner, name, original = _saved.pop()
        setattr(owner, name, original)


@contextlib.contextmanager
def cuda_type_names() -> Generator[None]:
    """While active (and only with the shim installed), ``t.type()`` names CPU tensors as CUDA ones."""
    if not _saved:
        yield
        return
    original = torch.Tensor.type

    def type_(self: torch.Tensor, dtype: Any = None, non_blocking: bool = False, **kwargs: Any) -> Any:
        if dtype is None and not kwargs:
            name = original(self)
            if self.device.type == "cpu" and not name.startswith("torch.cuda."):
                return "torch.cuda." + name.removeprefix("torch.")
            return name
        return original(self, dtype, non_blocking, **kwargs)

    torch.Tensor.type = type_
    try:
        yield
    finally:
        torch.Tensor.type = original
