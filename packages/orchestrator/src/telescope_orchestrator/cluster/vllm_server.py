"""Starting, watching and stopping vLLM OpenAI servers as subprocesses: the one launcher.

Each server is ``python -m vllm.entrypoints.openai.api_server`` (a CPU server that runs its model
in its engine-core process: the same through ``cluster.vllm_main``, which forks that process
instead of spawning it) with the config's memory,
length, batching, parallelism, dtype, scheduling and prefix-caching options (prefix caching is
safe under live weight updates because the rollout client salts every request with its server's
weight version), logprobs of the distribution sampled from, and optionally the weight-sync worker
extension (with
``VLLM_SERVER_DEV_MODE=1``). :func:`server_command` builds the command line; :func:`launch_server`
starts one server in its own process group and returns a :class:`ServerHandle` at once (the
run's ``InferenceServerActor`` runs the same command under its reaper instead). A busy port fails
before launch, naming the port and ``inference_base_port``. Start-up failures are classified from
the log's tail (out of memory, model not found, CUDA mismatch, port in use) into one
:class:`ServerStartError` carrying the fix. Nothing here imports vllm or torch.

    with launch_server(settings, port=8100, log_path=run / "vllm_0.log") as server:
        server.wait_healthy(timeout_s=600)
        ...  # server.url answers /v1/completions; leaving the block stops the server
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

import httpx
import structlog

from telescope_orchestrator.cluster import vllm_main
from telescope_orchestrator.cluster.reaper import describe_exit
from telescope_orchestrator.cluster.vllm_main import VLLM_SERVER
from telescope_orchestrator.record.logging import log_tail
from telescope_rollout.engine import config_values

if TYPE_CHECKING:
    from telescope_config import ResolvedConfig, TelescopeConfig

__all__ = [
    "LOGPROBS_MODE",
    "ProcessLike",
    "ServerDiedError",
    "ServerHandle",
    "ServerSettings",
    "ServerStartError",
    "classify_failure",
    "free_port",
    "free_port_run",
    "launch_server",
    "one_engine_process",
    "port_in_use",
    "server_command",
]

log = structlog.get_logger()

# fmt: off
_FIXES: list[tuple[str, tuple[str, ...], str]] = [
    (
        "port in use",
        ("address already in use", "errno 98"),
        "another process listens on the port: set `inference_base_port` to a free range "
        "(each server uses consecutive ports) or stop that process.",
    ),
    (
        "out of memory",
        ("out of memory", "outofmemoryerror", "no available memory for the cache blocks",
         "larger than the available kv cache", "insufficient memory", "cannot allocate memory",
         "less than desired cpu memory utilization"),
        "the model and its initial KV cache do not fit: lower `gpu_memory_utilization`, reduce "
        "`max_model_len`, or increase `inference_tensor_parallel_size` (on CPU set VLLM_CPU_KVCACHE_SPACE "
        "to what the machine has).",
    ),
    (
        "model not found",
        ("does not appear to have a file named", "repository not found", "is not a valid model identifier",
         "not a local folder", "invalid repository id", "localentrynotfounderror",
         "no such file or directory", "can't load the configuration", "unrecognized model", "gatedrepoerror",
         "hfvalidationerror", "repo id must be in the form", "offlinemodeisenabled",
         "cannot find the requested files"),
        "ensure the `model` path is correct and accessible (a local folder with config.json, or a hub id "
        "reachable from this machine); for gated models set the Hugging Face token (HF_TOKEN).",
    ),
    (
        "CUDA mismatch",
        ("cuda driver version is insufficient", "no kernel image is available",
         "nvidia driver on your system is too old", "libcudart", "undefined symbol", "cuda error",
         "found no nvidia driver"),
        "vLLM requires specific CUDA versions: check vLLM's compatibility matrix and that the installed "
        "torch/vllm builds match the driver (on a CPU-only machine install vllm-cpu and pass device='cpu').",
    ),
]
# fmt: on


class ServerStartError(RuntimeError):
    """A server could not start; the message says why and how to fix it."""

    def __init__(self, message: str, kind: str = "unknown", log_path: Path | None = None):
        super().__init__(message)
        self.kind = kind
        self.log_path = log_path


class ServerDiedError(ServerStartError):
    """A running server exited."""


def classify_failure(log_text: str) -> tuple[str, str] | None:
    """``(kind, fix)`` of the first known failure found in a server log, else None."""
    low = log_text.lower()
    for kind, needles, fix in _FIXES:
        if any(n in low for n in needles):
            return kind, fix
    return None


def failure_report(what: str, log_path: Path) -> str:
    """``what`` with the failure kind and fix found in the server log, its path and last lines."""
    return _report(what, log_path)[0]


def _report(what: str, log_path: Path) -> tuple[str, str]:
    text = log_tail(log_path, 200_000)
    found = classify_failure(text)
    kind, fix = found if found else ("unknown", "read the log for the cause.")
    lines = [ln for ln in text.splitlines() if ln.strip()][-15:]
    return f"{what} ({kind}). Fix: {fix}\nLog: {log_path}\n--- last lines ---\n" + "\n".join(lines), kind


def _failure(what: str, log_path: Path, cls: type[ServerStartError] = ServerStartError) -> ServerStartError:
    msg, kind = _report(what, log_path)
    return cls(msg, kind, log_path)


@dataclass(frozen=True)
class ServerSettings:
    """Options of the vLLM servers, named like the config fields they come from (``CONFIG_NAMES``
    for those named otherwise there); ``NOT_IN_CONFIG`` are set by the caller, not the config."""

    CONFIG_NAMES: ClassVar[dict[str, str]] = {
        "host": "inference_host",
        "base_port": "inference_base_port",
        "tensor_parallel_size": "inference_tensor_parallel_size",
        "scheduling_policy": "vllm_scheduling_policy",
    }
    NOT_IN_CONFIG: ClassVar[frozenset[str]] = frozenset(
        {"dtype", "served_model_name", "device", "enforce_eager", "access_log", "extra_args"}
    )
    OWN_DEFAULTS: ClassVar[dict[str, str]] = {
        "host": "a server launched without a config listens on loopback only (its weight-sync routes "
        "take no credentials); a run passes inference_host",
        "seed": "None leaves vLLM's own seed; a run passes the config's seed",
    }
    """Fields whose default differs from the packaged config on purpose, with the reason."""

    model: str
    host: str = "127.0.0.1"
    """Address the server listens on; its URL uses 127.0.0.1 for 0.0.0.0."""
    base_port: int = 8100
    gpu_memory_utilization: float = 0.9
    max_model_len: int = 4096
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    tensor_parallel_size: int = 1
    scheduling_policy: str = "priority"
    enable_prefix_caching: bool = True
    """Reuse the KV cache of shared prompt prefixes; requests must then carry a cache salt per
    weight version (``telescope_rollout.inference.cache_salt``), which the rollout client sends."""
    seed: int | None = None
    dtype: str = "auto"
    served_model_name: str | None = None
    device: str = "cuda"
    """"cpu" adds ``--dtype float32 --enforce-eager`` (fp32 is ~3x faster than bf16 on AVX2)."""
    enforce_eager: bool = False
    lora_rank: int = 0
    """> 0: serve a LoRA adapter (``--enable-lora``, one adapter, vLLM's smallest maximum rank that holds it);
    the adapter is registered and replaced at run time (``VLLM_ALLOW_RUNTIME_LORA_UPDATING``)."""
    access_log: bool = False
    """uvicorn's line per request in the server log; off by default (thousands of requests per step)."""
    extra_args: tuple[str, ...] = ()

    @classmethod
    def from_config(cls, config: TelescopeConfig | ResolvedConfig, **overrides: Any) -> ServerSettings:
        """Settings from a ``TelescopeConfig``/``ResolvedConfig``; ``overrides`` win (a run gives
        ``model`` as resolved on disk and ``device``)."""
        return cls(**config_values(cls, config, overrides))


CPU_BLOCK_SIZE = 32
"""KV-cache block size of a CPU server with prefix caching. vLLM caches whole blocks only, and its CPU
default (128) never reuses a prompt shorter than 128 tokens; 32 is the smallest its CPU attention
prefers. A group of 8 quickstart prompts (47 tokens, 32 of them reused) generated 32 tokens each in
6.1 s instead of 7.7 s on one core (SmolLM2-135M, vllm-cpu 0.32)."""

LOGPROBS_MODE = "processed_logprobs"
"""vLLM's ``--logprobs-mode``: its default (``raw_logprobs``) is computed before temperature, so at
any temperature but 1 the rollout logprobs would describe another distribution than the trainer's."""


FORKED_SERVER = vllm_main.__name__
"""The same server with its engine-core process forked (``cluster.vllm_main``): the module a server of
:func:`one_engine_process` runs."""


def one_engine_process(settings: ServerSettings, pinned_cores: int) -> bool:
    """Whether a server runs its model in its engine-core process (vLLM's ``uni`` executor) instead
    of a worker process of its own: a CPU server of one tensor-parallel rank whose process tree the
    caller pins to ``pinned_cores`` cores. vllm-cpu otherwise always starts a worker process (its
    ``mp`` executor binds the OpenMP threads there), a third process importing torch and vLLM: on
    one core the server was ready in 26.4 s instead of 33.2 s, at the same tokens/s (SmolLM2-135M,
    85.1 against 83.9, vllm-cpu 0.32; ``tools/bench_server_start.py``). The caller's pinning and
    ``OMP_NUM_THREADS`` (``server_env``) then place the threads as vLLM's binding did, and the engine
    process is forked rather than spawned (:data:`FORKED_SERVER`): SmolLM2 ready in 21 s, not 30."""
    return settings.device == "cpu" and settings.tensor_parallel_size == 1 and pinned_cores > 0


def server_command(
    settings: ServerSettings,
    port: int,
    *,
    extension_cls: str | None = None,
    python: str = sys.executable,
    pinned_cores: int = 0,
) -> list[str]:
    """The command line of one server (``pinned_cores``: see :func:`one_engine_process`)."""
    s = settings
    cpu = s.device == "cpu"
    cmd = [
        python,
        "-m",
        FORKED_SERVER if one_engine_process(s, pinned_cores) else VLLM_SERVER,
        "--model",
        str(s.model),
        "--host",
        s.host,
        "--port",
        str(port),
        "--max-model-len",
        str(s.max_model_len),
        "--tensor-parallel-size",
        str(s.tensor_parallel_size),
        "--dtype",
        "float32" if cpu and s.dtype == "auto" else s.dtype,
        "--scheduling-policy",
        s.scheduling_policy,
        "--enable-prefix-caching" if s.enable_prefix_caching else "--no-enable-prefix-caching",
        "--override-generation-config",
        '{"max_new_tokens": null}',
        # logprobs of the distribution tokens are sampled from (after temperature, top-k, top-p),
        # the one the trainer computes with its logits divided by the temperature
        "--logprobs-mode",
        LOGPROBS_MODE,
        # each answer carries the request's queue, prefill and decode times (the record's turns)
        "--enable-per-request-metrics",
    ]
    cmd += _device_args(s, pinned_cores)
    if s.served_model_name:
        cmd += ["--served-model-name", s.served_model_name]
    if s.max_num_seqs is not None:
        cmd += ["--max-num-seqs", str(s.max_num_seqs)]
    if s.max_num_batched_tokens is not None:
        cmd += ["--max-num-batched-tokens", str(s.max_num_batched_tokens)]
    if s.seed is not None:
        cmd += ["--seed", str(s.seed)]
    if s.lora_rank > 0:
        cmd += ["--enable-lora", "--max-loras", "1", "--max-lora-rank", str(vllm_lora_rank(s.lora_rank))]
    if not s.access_log:
        cmd.append("--disable-uvicorn-access-log")
    if extension_cls:
        cmd += ["--worker-extension-cls", extension_cls]
    return [*cmd, *s.extra_args]


def _device_args(s: ServerSettings, pinned_cores: int) -> list[str]:
    """The options that depend on the device: a GPU's memory share; a CPU's eager mode, KV block
    size and executor (:func:`one_engine_process`)."""
    cpu = s.device == "cpu"
    args = [] if cpu else ["--gpu-memory-utilization", str(s.gpu_memory_utilization)]
    if cpu or s.enforce_eager:
        args.append("--enforce-eager")
    if cpu and s.enable_prefix_caching and "--block-size" not in s.extra_args:
        args += ["--block-size", str(CPU_BLOCK_SIZE)]
    if one_engine_process(s, pinned_cores):
        args += ["--distributed-executor-backend", "uni"]
    return args


VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)
"""The values vLLM accepts for ``--max-lora-rank`` (a server serves adapters of any rank up to it)."""


def vllm_lora_rank(rank: int) -> int:
    """The smallest ``--max-lora-rank`` vLLM accepts that serves an adapter of ``rank``."""
    for allowed in VLLM_LORA_RANKS:
        if rank <= allowed:
            return allowed
    raise ValueError(f"lora_rank {rank} is above {VLLM_LORA_RANKS[-1]}, the largest rank vLLM serves")


def server_env(
    settings: ServerSettings, *, extension_cls: str | None, pinned_cores: int = 0
) -> dict[str, str]:
    """What a server's process needs in its environment on top of the caller's: the dev-mode routes
    the weight sync drives (``/collective_rpc``), with LoRA the adapter's registration at run time,
    and in one engine process (:func:`one_engine_process`) vLLM told so and its OpenMP threads."""
    env: dict[str, str] = {}
    if one_engine_process(settings, pinned_cores):
        env["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # else vllm-cpu replaces the uni executor with mp
        env["OMP_NUM_THREADS"] = str(pinned_cores)
    if extension_cls:
        env["VLLM_SERVER_DEV_MODE"] = "1"
    if settings.lora_rank > 0:
        env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "1"  # POST /v1/load_lora_adapter
    return env


def free_port() -> int:
    """A TCP port the kernel says is free now (``bind(0)``): for a rendezvous that binds it at
    once (torch's ``MASTER_PORT``)."""
    with socket.socket() as sock:
        sock.bind(("", 0))
        return int(sock.getsockname()[1])


def _ephemeral_start() -> int:
    """The first port of the kernel's ephemeral range (32768 when it cannot be read)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port_run(span: int = 8) -> int:
    """The first of ``span`` consecutive ports free on this machine, below the kernel's ephemeral range
    when it leaves room there (from 20000). A port the kernel hands out for ``bind(0)`` is soon taken
    again by some outgoing connection (Ray opens many): a vLLM server that bound one a few seconds
    after it was picked found it in use. A host whose ephemeral range starts below 20000 + ``span``
    gets runs that start at ``bind(0)`` ports instead."""
    import random

    top = min(_ephemeral_start(), 32768) - span
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.randrange(20000, top) if top > 20000 else free_port()
        if port + span <= 65536 and not any(port_in_use("0.0.0.0", p) for p in range(port, port + span)):
            return port
    raise RuntimeError(f"no run of {span} free ports found in 200 tries")


def port_in_use(host: str, port: int) -> bool:
    """True when something already listens on ``host:port`` (or it cannot be bound)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False


class ProcessLike(Protocol):
    """What a handle needs of the server's process: a ``subprocess.Popen``, or the orchestrator's view of a
    server run by its reaper."""

    @property
    def pid(self) -> int: ...

    @property
    def returncode(self) -> int | None: ...

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


@dataclass
class ServerHandle:
    """One launched server (a context manager that stops it on exit)."""

    index: int
    port: int
    url: str
    process: ProcessLike
    log_path: Path
    command: list[str] = field(default_factory=list[str])
    env: dict[str, str] = field(default_factory=dict[str, str])

    def __enter__(self) -> ServerHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def alive(self) -> bool:
        return self.process.poll() is None

    def check(self) -> None:
        """Raise :class:`ServerDiedError` (with the classified log tail) if the server exited."""
        if not self.alive():
            raise _failure(
                f"vLLM server {self.index} ({self.url}) died: it "
                f"{describe_exit(self.process.returncode or 0)}",
                self.log_path,
                ServerDiedError,
            )

    def healthy(self, timeout_s: float = 2.0) -> bool:
        try:
            return httpx.get(f"{self.url}/health", timeout=timeout_s).status_code == 200
        except httpx.HTTPError:
            return False

    def wait_healthy(self, timeout_s: float = 900.0, poll_s: float = 1.0) -> None:
        """Block until ``/health`` answers; raise a classified :class:`ServerStartError` otherwise."""
        deadline = time.monotonic() + timeout_s
        while True:
            if not self.alive():
                raise _failure(
                    f"vLLM server {self.index} on port {self.port} "
                    f"{describe_exit(self.process.returncode or 0)}",
                    self.log_path,
                )
            if self.healthy():
                return
            if time.monotonic() > deadline:
                self.stop()
                raise _failure(
                    f"vLLM server {self.index} on port {self.port} not ready after {timeout_s:.0f} s "
                    "(raise ray_placement_timeout_s for large models)",
                    self.log_path,
                )
            time.sleep(poll_s)

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM the server's process group, SIGKILL after ``timeout_s``; then SIGKILL whatever
        of the group is left, also when the server itself had exited: a forked engine core holds the
        server's listening socket, so the port stays taken while it lives."""
        if self.process.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.process.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(timeout=timeout_s)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=timeout_s)


def launch_server(
    settings: ServerSettings,
    *,
    port: int,
    log_path: str | Path,
    index: int = 0,
    extension_cls: str | None = None,
    env: Mapping[str, str] | None = None,
    url_host: str | None = None,
    engine_threads: int = 0,
) -> ServerHandle:
    """Start one server in its own process group and return without waiting for it.

    ``engine_threads`` > 0 (a CPU server of one tensor-parallel rank): its model runs in its
    engine-core process with that many OpenMP threads, forked (:func:`one_engine_process`, ready
    sooner; the threads are not bound to cores); 0: vLLM's own executor and binding."""
    host = settings.host if settings.host not in ("0.0.0.0", "") else "127.0.0.1"
    if port_in_use(host, port):
        raise ServerStartError(
            f"port {port} for vLLM server {index} is already in use. Fix: set `inference_base_port` to a "
            f"free range (servers use {settings.base_port}..{settings.base_port + index}+ consecutively) "
            "or stop the process listening there.",
            "port in use",
        )
    model = str(settings.model)
    if model.startswith(("/", "./", "../", "~")) and not Path(model).expanduser().exists():
        raise ServerStartError(
            f"model folder {model} does not exist. Fix: ensure the `model` path is correct and accessible "
            "(a local folder with config.json, or a hub id).",
            "model not found",
        )
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    own = server_env(settings, extension_cls=extension_cls, pinned_cores=engine_threads)
    full_env = {**os.environ, **(env or {}), **own}
    cmd = server_command(settings, port, extension_cls=extension_cls, pinned_cores=engine_threads)
    with log_path.open("ab") as fh:
        fh.write(f"$ {' '.join(cmd)}\n".encode())
        fh.flush()
        proc = subprocess.Popen(
            cmd, stdout=fh, stderr=subprocess.STDOUT, env=full_env, start_new_session=True
        )
    url = f"http://{url_host or host}:{port}"
    log.info("vllm_server_started", index=index, url=url, pid=proc.pid, log=str(log_path))
    return ServerHandle(index, port, url, proc, log_path, cmd, dict(env or {}))
