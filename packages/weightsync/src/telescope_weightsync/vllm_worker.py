"""The receiver: a vLLM worker extension that applies streamed weights while the server serves.

Start vLLM with ``--worker-extension-cls telescope_weightsync.vllm_worker.WeightReceiver`` and
``VLLM_SERVER_DEV_MODE=1``. The publisher drives it through ``POST /collective_rpc`` (vLLM
forwards string arguments only, so every argument is a JSON string); each call runs on every
tensor-parallel worker of the server:

- ``telescope_info()`` -> ``{"tp_rank", "tp_size", "device", "version"}``
- ``telescope_join(json)`` joins a private broadcast group hosted by the trainer
  (``{"group", "host", "port", "rank_offset", "world_size", "backend", "timeout_s",
  "iface_host", "prefix"}``; this worker's rank is ``rank_offset + tp_rank``; ``prefix`` scopes
  the store keys of this forming of the group).
- ``telescope_receive(json)`` receives one update on ``{"group", "version"}`` and applies it in
  place with ``model_runner.reload_weights``; returns ``{"version", "bytes", "seconds", ...}``.
  With ``"adapter": {"name", "config", "folder"}`` the update is a LoRA adapter: it is written into
  the server's folder on this node (PEFT's format) and loaded in place of the served adapter with the worker's
  ``add_lora`` (``load_inplace``); the answer adds ``adapter_path`` and ``adapter_loaded`` (false:
  the worker held no adapter, the publisher registers this one over HTTP).
- ``telescope_load(json)`` loads the Hugging Face folder ``{"path", "version"}`` (on this node)
  in place of the served weights with ``model_runner.reload_weights``, as a server started on it
  would; returns ``{"version", "seconds"}``. ``telescope eval`` serves its checkpoints this way.
- ``telescope_version()`` -> the version of the weights this worker serves (-1: base model).
- ``telescope_leave(json)`` leaves one group (``{"group": name}``) or all (``{}``).
- ``telescope_raw_receive(json)`` receives one plain broadcast of ``{"group", "nbytes"}`` bytes and
  drops it (the transport baseline of ``tools/bench_weightsync.py``).

The engine runs a collective RPC between scheduler steps, so requests in flight pause for the
update and continue on the new weights. This is the only module of the package importing vLLM.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import structlog
import torch

from telescope_weightsync._adapter import write_adapter
from telescope_weightsync._errors import GroupError
from telescope_weightsync._protocol import Layout
from telescope_weightsync._stream import StreamStats, receive_update
from telescope_weightsync._transport import Group, make_group, open_store
from telescope_weightsync._version import BASE_VERSION

log = structlog.get_logger()


def _parse(payload: str | None) -> dict[str, Any]:
    if not payload:
        return {}
    data = json.loads(payload)
    if not isinstance(data, dict):
        raise ValueError(f"expected a JSON object argument, got {payload!r}")
    return cast(dict[str, Any], data)


@dataclass
class _ReceiverState:
    """What one worker keeps between calls: its groups, their cached layouts, its weights' version."""

    groups: dict[str, Group] = field(default_factory=dict[str, Group])
    layouts: dict[str, list[Layout]] = field(default_factory=dict[str, list[Layout]])
    version: int = BASE_VERSION
    adapter_dir: Path | None = None


class WeightReceiver:
    """Mixed into vLLM's worker class; all state lives in ``telescope_*`` attributes."""

    # Attributes of the vLLM worker this class is mixed into (declared only, never set here).
    vllm_config: Any
    model_runner: Any
    add_lora: Any
    list_loras: Any

    def _telescope_state(self) -> _ReceiverState:
        state = self.__dict__.get("_telescope_ws")
        if not isinstance(state, _ReceiverState):
            state = self.__dict__["_telescope_ws"] = _ReceiverState()
        return state

    def _telescope_tp(self) -> tuple[int, int]:
        from vllm.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size

        return get_tensor_model_parallel_rank(), get_tensor_model_parallel_world_size()

    def telescope_info(self) -> dict[str, Any]:
        tp_rank, tp_size = self._telescope_tp()
        device = str(getattr(self, "device", "cpu"))
        pp_size = self.vllm_config.parallel_config.pipeline_parallel_size
        return {
            "tp_rank": tp_rank,
            "tp_size": tp_size,
            "pp_size": pp_size,
            "device": device,
            "version": self._telescope_state().version,
        }

    def telescope_join(self, payload: str) -> dict[str, Any]:
        args = _parse(payload)
        state = self._telescope_state()
        name = str(args["group"])
        old = state.groups.pop(name, None)
        if old is not None:
            old.close()
        tp_rank, _ = self._telescope_tp()
        rank = int(args["rank_offset"]) + tp_rank
        timeout_s = float(args["timeout_s"])
        prefix = str(args.get("prefix") or f"telescope/{name}/")  # the publisher's, one per forming
        store = open_store(
            args["host"], int(args["port"]), is_master=False, timeout_s=timeout_s, prefix=prefix
        )
        device = getattr(self, "device", None)
        group = make_group(
            store,
            rank=rank,
            world_size=int(args["world_size"]),
            backend=str(args["backend"]),
            timeout_s=timeout_s,
            name=name,
            iface_host=args.get("iface_host"),
            device=device if isinstance(device, torch.device) else None,
        )
        state.groups[name] = group
        state.layouts[name] = []
        where = {"threads": torch.get_num_threads(), "cores": sorted(os.sched_getaffinity(0))}
        log.info(  # where this worker computes: the run's core plan is checked against it
            "weightsync.joined",
            group=name,
            rank=rank,
            world_size=group.world_size,
            backend=group.backend,
            **where,
        )
        return {"group": name, "rank": rank, "backend": group.backend}

    def telescope_receive(self, payload: str) -> dict[str, Any]:
        args = _parse(payload)
        state = self._telescope_state()
        name = str(args.get("group", "full"))
        group = state.groups.get(name)
        if group is None:
            raise GroupError(f"this server has not joined weight group {name!r}: call telescope_join first")
        version = int(args["version"])
        layouts = state.layouts[name]
        stats = StreamStats()
        start = time.perf_counter()
        adapter: dict[str, Any] | None = args.get("adapter")
        answer: dict[str, Any] = {}
        try:
            if adapter is None:
                self.model_runner.reload_weights(weights_iterator=receive_update(group, layouts, stats))
                self._telescope_repack_tied_lm_head()
            else:
                answer = self._telescope_swap_adapter(adapter, dict(receive_update(group, layouts, stats)))
        except BaseException:
            # The stream position is unknown now: this group cannot carry another update.
            state.groups.pop(name, None)
            group.close()
            raise
        state.version = version
        seconds = time.perf_counter() - start
        log.info(
            "weightsync.applied", group=name, version=version, bytes=stats.bytes, seconds=round(seconds, 3)
        )
        return {
            **answer,
            "version": version,
            "bytes": stats.bytes,
            "buckets": stats.buckets,
            "tensors": stats.tensors,
            "receive_s": stats.seconds,
            "wait_s": stats.wait_seconds,
            "seconds": seconds,
        }

    def telescope_load(self, payload: str) -> dict[str, Any]:
        args = _parse(payload)
        path = Path(str(args["path"])).expanduser()
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"{path} is not a Hugging Face model folder (no config.json) here")
        version = int(args["version"])
        start = time.perf_counter()
        self.model_runner.reload_weights(weights_path=str(path))
        self._telescope_repack_tied_lm_head()
        self._telescope_state().version = version
        seconds = time.perf_counter() - start
        log.info("weightsync.loaded", path=str(path), version=version, seconds=round(seconds, 3))
        return {"version": version, "seconds": seconds}

    def _telescope_swap_adapter(
        self, adapter: dict[str, Any], tensors: dict[str, torch.Tensor]
    ) -> dict[str, Any]:
        """Write the received LoRA adapter into this worker's folder and load it in place of the one
        served (vLLM's worker ``add_lora`` with ``load_inplace``: requests in flight keep its id and
        go on with the new weights). A worker that holds no adapter (a server just started) only
        gets the folder: the publisher then registers it through ``/v1/load_lora_adapter``."""
        from vllm.lora.request import LoRARequest

        folder = write_adapter(
            self._telescope_adapter_dir(str(adapter["folder"])), adapter["config"], tensors
        )
        loaded = sorted(self.list_loras())
        if len(loaded) > 1:
            raise RuntimeError(
                f"this server holds LoRA adapters {loaded}; a Telescope run serves exactly one "
                "(start vLLM with --max-loras 1 and load no other adapter)"
            )
        if loaded:
            request = LoRARequest(
                lora_name=str(adapter["name"]),
                lora_int_id=loaded[0],
                lora_path=str(folder),
                load_inplace=True,
            )
            self.add_lora(request)
        return {"adapter_path": str(folder), "adapter_loaded": bool(loaded)}

    def _telescope_adapter_dir(self, name: str) -> Path:
        """The server's adapter folder ``name`` (the publisher's, one per server) under
        ``TELESCOPE_ADAPTER_DIR``, else the temp dir: the same path on every node of the server,
        each node holding its own copy, and a server started again on that port reuses it."""
        state = self._telescope_state()
        if state.adapter_dir is None or state.adapter_dir.name != name:
            root = Path(os.environ.get("TELESCOPE_ADAPTER_DIR") or tempfile.gettempdir())
            state.adapter_dir = root / name
            state.adapter_dir.mkdir(parents=True, exist_ok=True)
            atexit.register(shutil.rmtree, state.adapter_dir, ignore_errors=True)
        return state.adapter_dir

    def _telescope_repack_tied_lm_head(self) -> None:
        """vLLM on CPU keeps the tied lm_head's oneDNN handle packed from the old weight: repack it."""
        device: object = getattr(self, "device", None)  # a worker without one runs on the CPU
        if isinstance(device, torch.device | str) and torch.device(device).type != "cpu":
            return
        model = self.model_runner.get_model()
        lm_head = getattr(model, "lm_head", None)
        hf_config = self.vllm_config.model_config.hf_text_config
        if lm_head is None or not getattr(hf_config, "tie_word_embeddings", False):
            return
        if not hasattr(lm_head, "weight"):
            return
        from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

        dispatch_cpu_unquantized_gemm(lm_head, remove_weight=False)

    def telescope_raw_receive(self, payload: str) -> dict[str, Any]:
        args = _parse(payload)
        group = self._telescope_state().groups.get(str(args.get("group", "full")))
        if group is None:
            raise GroupError("this server has not joined that weight group: call telescope_join first")
        start = time.perf_counter()
        buf = torch.empty(int(args["nbytes"]), dtype=torch.uint8, device=group.device)
        group.broadcast(buf, what=f"the raw baseline ({buf.numel()} bytes)")
        return {"seconds": time.perf_counter() - start, "bytes": buf.numel()}

    def telescope_version(self) -> int:
        return self._telescope_state().version

    def telescope_leave(self, payload: str = "") -> dict[str, Any]:
        args = _parse(payload)
        state = self._telescope_state()
        names = [str(args["group"])] if "group" in args else list(state.groups)
        for name in names:
            group = state.groups.pop(name, None)
            state.layouts.pop(name, None)
            if group is not None:
                group.close()
        return {"left": names}
