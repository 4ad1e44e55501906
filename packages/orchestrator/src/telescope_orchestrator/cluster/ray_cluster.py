"""Ray: start or join a cluster, reserve placement groups, place servers and trainer ranks.

- ``ray_address`` "" starts a local Ray; "auto" (default) joins a running cluster and, when none
  answers and ``ray_auto_start_local`` is true, starts a local one; any other value is a cluster
  address (multi-node: ``ray start --head`` on one node, ``ray start --address`` on the others,
  then ``--ray_address <head>:6379``).
- Two placement groups: inference bundles ``{CPU, GPU: tp}`` and trainer bundles
  ``{CPU, GPU: 1}`` (no GPU entry on a CPU-only machine), strategies from ``ray_*_placement_strategy``.
- A local Ray gets at least as many logical CPUs as the bundles ask for (a 2-core laptop runs the
  quickstart's two 1-CPU bundles plus the driver); oversubscription is logged, not refused.
- Actor output goes to files in the run directory (``log_to_driver`` off unless ``debug`` and
  ``ray_log_to_driver``), so vLLM and Ray warnings stay out of the console.
- Workers get the run's environment variables (``TELESCOPE_RUN_DIR`` when
  ``ray_propagate_run_dir``, ``VIRTUAL_ENV`` when ``ray_propagate_active_venv``) and, with
  ``ray_pin_py_executable``, the driver's interpreter (``runtime_env.py_executable``).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, cast

import structlog

from telescope_orchestrator.cluster.actors import CpuPlan, InferenceServerActor, TrainerActor, cpu_plan
from telescope_orchestrator.cluster.cores import CoreLease, LentCores

if TYPE_CHECKING:
    from telescope_config import TelescopeConfig

__all__ = [
    "Cluster",
    "ClusterError",
    "alive_nodes",
    "has_cuda",
    "policy_servers",
    "ray_init_options",
    "scorer_servers",
]

log = structlog.get_logger()


class _Ray(Protocol):
    """The part of the ``ray`` module this file calls, typed (Ray leaves parts of these signatures
    unknown)."""

    def init(self, address: str | None = None, **kwargs: Any) -> object: ...

    def get(self, object_refs: Any, *, timeout: float | None = None) -> Any: ...

    def put(self, value: Any) -> Any: ...

    def wait(self, object_refs: list[Any], *, num_returns: int = 1, timeout: float | None = None) -> Any: ...

    def kill(self, actor: Any, *, no_restart: bool = True) -> None: ...

    def is_initialized(self) -> bool: ...

    def shutdown(self) -> None: ...


def _ray() -> _Ray:
    """The ``ray`` module (imported on first use), as :class:`_Ray`."""
    import ray

    return cast(_Ray, ray)


def ray_init_options(
    cfg: TelescopeConfig, run_env: dict[str, str], environ: Any = os.environ, keep_out: Sequence[Path] = ()
) -> dict[str, Any]:
    """The keyword arguments of ``ray.init`` for this run (both when joining and when starting Ray).
    ``keep_out``: folders never uploaded with a ``working_dir`` of ``ray_runtime_env`` (the run and
    checkpoint directories), added to its ``excludes`` where they lie inside it."""
    runtime_env: dict[str, Any] = dict(cfg.ray_runtime_env or {})
    if excluded := _excluded(runtime_env.get("working_dir"), keep_out):
        runtime_env["excludes"] = [*list(runtime_env.get("excludes") or []), *excluded]
    env_vars = {**run_env, **dict(runtime_env.get("env_vars") or {})}
    if cfg.ray_propagate_active_venv:
        for name in ("VIRTUAL_ENV", "UV_PROJECT_ENVIRONMENT"):
            if environ.get(name):
                env_vars.setdefault(name, environ[name])
    runtime_env["env_vars"] = env_vars
    if cfg.ray_pin_py_executable:
        runtime_env.setdefault("py_executable", sys.executable)
    return {
        "namespace": cfg.ray_namespace,
        "log_to_driver": bool(cfg.ray_log_to_driver and cfg.debug),
        "runtime_env": runtime_env,
        "ignore_reinit_error": True,
        "configure_logging": False,
    }


def _excluded(working_dir: Any, folders: Sequence[Path]) -> list[str]:
    """``folders`` inside the local ``working_dir``, as anchored ``excludes`` patterns ("/runs/a/")."""
    if not isinstance(working_dir, str) or "://" in working_dir:  # a URI is uploaded as it is
        return []
    root = Path(working_dir).expanduser().resolve()
    out: list[str] = []
    for folder in folders:
        try:
            inside = Path(folder).expanduser().resolve().relative_to(root)
        except ValueError:
            continue
        if inside.parts:
            out.append(f"/{inside.as_posix()}/")
    return out


class ClusterError(RuntimeError):
    """Ray could not start or place the run; the message says how to fix it."""


def scorer_servers(cfg: TelescopeConfig) -> dict[str, tuple[int, int]]:
    """The frozen models a run serves beside the policy, ``{name: (servers, GPUs per server)}``: its
    teacher and its reference model (``TelescopeConfig.frozen_models``) where their placement is
    ``servers`` (a frozen model placed in the trainer has no server)."""
    out: dict[str, tuple[int, int]] = {}
    for name, placement in cfg.frozen_models.items():
        if placement != "servers":
            continue
        if name == "teacher":
            tp = cfg.teacher_tensor_parallel_size
            out[name] = (cfg.teacher_num_workers // tp, tp)
        else:
            tp = cfg.inference_tensor_parallel_size
            out[name] = (cfg.ref_num_workers // tp, tp)
    return out


def policy_servers(cfg: TelescopeConfig) -> int:
    """How many vLLM servers of the policy a run starts: none when every step is supervised
    (``TelescopeConfig.supervised_only``), else ``num_inference_servers``."""
    return 0 if cfg.supervised_only else cfg.num_inference_servers


def alive_nodes() -> list[dict[str, Any]]:
    """``ray.nodes()`` of the nodes alive now (Ray types them loosely)."""
    ray: Any = _ray()
    nodes: list[dict[str, Any]] = list(ray.nodes())
    return [n for n in nodes if n.get("Alive")]


def _free_per_node(bundle: dict[str, float]) -> str:
    """What each alive node has free of the resources ``bundle`` asks for, and how many bundles of it
    each could hold, e.g. "free now: 10.0.0.1 CPU 1 (0 such bundles), 10.0.0.2 CPU 1 (0)"."""
    from ray._private import state

    free: dict[str, dict[str, float]] = cast(Any, state).available_resources_per_node()
    parts: list[str] = []
    for n in alive_nodes():
        mine = free.get(str(n["NodeID"]), {})
        fits = min(int(mine.get(k, 0.0) // v) for k, v in bundle.items() if v > 0) if bundle else 0
        have = " ".join(f"{k} {mine.get(k, 0.0):g}" for k in bundle)
        parts.append(
            f"{n.get('NodeManagerAddress', '?')} {have} ({fits} such bundle{'s' if fits != 1 else ''})"
        )
    return "free now: " + (", ".join(parts) if parts else "no node is alive")


def _joined_summary() -> str:
    """The console's line for a joined cluster: "joined the Ray cluster at ADDRESS: N node(s), C CPUs"
    (and G GPUs)."""
    ray: Any = _ray()
    total: dict[str, float] = dict(ray.cluster_resources())
    address = str(ray.get_runtime_context().gcs_address)
    gpus = f", {total.get('GPU', 0):g} GPUs" if total.get("GPU") else ""
    nodes = len(alive_nodes())
    return f"joined the Ray cluster at {address}: {nodes} node(s), {total.get('CPU', 0):g} CPUs{gpus}"


def has_cuda() -> bool:
    """Whether torch sees a CUDA device on this machine."""
    import torch

    return torch.cuda.is_available()


@contextlib.contextmanager
def _output_to(path: Any):
    """Point file descriptors 1 and 2 at ``path`` (children started meanwhile inherit it)."""
    if path is None:
        yield
        return
    import sys

    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(path, "ab") as fh:
        os.dup2(fh.fileno(), 1)
        os.dup2(fh.fileno(), 2)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        os.close(saved[0])
        os.close(saved[1])


@dataclass
class Cluster:
    """The Ray side of a run: placement groups and actor handles; ``close()`` stops everything."""

    config: TelescopeConfig
    log_path: Any = None
    """File that receives the output of a locally started Ray (its daemons keep writing there)."""
    started_ray: bool = False
    gpu: bool = False
    server_actors: list[Any] = field(default_factory=list[Any])
    trainer_actors: list[Any] = field(default_factory=list[Any])
    groups: list[Any] = field(default_factory=list[Any])
    trainer_group: Any = None
    """The trainer ranks' placement group (also in ``groups``)."""
    core_lease: CoreLease | None = None
    """The servers' cores lent to the trainer ranks while they idle (``cluster.cores``): a CPU plan
    with cores to lend; None otherwise."""
    summary: str = ""
    """What :meth:`start` did, for the console: joined which cluster, or started a local Ray."""
    close_seconds: dict[str, float] = field(default_factory=dict[str, float])
    """How long :meth:`close` took to stop the trainer ranks, the servers and Ray."""

    def start(self, *, run_env: dict[str, str], keep_out: Sequence[Path] = ()) -> None:
        """Join the cluster of ``ray_address`` or start a local Ray (module docstring); ``keep_out``
        (``ray_init_options``) stay out of a ``working_dir`` upload."""
        ray = _ray()

        cfg = self.config
        self.gpu = has_cuda()
        if cfg.ray_disable_runtime_env_hook:
            os.environ.pop("RAY_RUNTIME_ENV_HOOK", None)
        common = ray_init_options(cfg, run_env, keep_out=keep_out)
        address = cfg.ray_address
        if address not in ("", "local"):
            try:
                ray.init(address=address, **common)
                self.summary = _joined_summary()
                log.info("joined a Ray cluster", address=address, summary=self.summary)
                return
            except (ConnectionError, RuntimeError) as exc:
                if address != "auto" or not cfg.ray_auto_start_local:
                    raise ClusterError(
                        f"could not connect to Ray at ray_address={address!r}: {exc}. Start the cluster "
                        "(`ray start --head`) or set --ray_address '' to start a local Ray."
                    ) from exc
        need = self._bundle_cpus()
        cpus = max(os.cpu_count() or 1, int(need + 1))
        if need + 1 > (os.cpu_count() or 1):
            log.info("more CPUs reserved than this machine has; they will share cores", reserved=need)
        # "local": a new Ray of this run's own, even where `ray start` left an address behind (with
        # none, ray.init joins the cluster of /tmp/ray/ray_current_cluster)
        try:
            with _output_to(self.log_path):  # Ray's own notices go to the run's log, not the console
                ray.init(address="local", num_cpus=cpus, include_dashboard=False, **common)
        except OSError as exc:
            if "AF_UNIX path length" not in str(exc):
                raise
            raise ClusterError(
                f"Ray could not start: its socket paths under the temp folder are too long ({exc}). Point "
                "TMPDIR (or RAY_TMPDIR) at a short folder, e.g. TMPDIR=/tmp."
            ) from exc
        self.started_ray = True
        why = " (no cluster answered ray_address: auto)" if address == "auto" else ""
        self.summary = f"started a local Ray of {cpus} CPUs for this run{why}"
        log.info("started a local Ray", cpus=cpus)

    def _bundle_cpus(self) -> float:
        cfg = self.config
        servers = policy_servers(cfg) + sum(n for n, _ in scorer_servers(cfg).values())
        return (
            servers * cfg.ray_inference_cpus_per_worker
            + cfg.trainer_num_workers * cfg.ray_trainer_cpus_per_worker
        )

    def _placement_group(self, bundles: list[dict[str, float]], strategy: str, what: str) -> Any:
        from ray.exceptions import GetTimeoutError
        from ray.util.placement_group import placement_group, remove_placement_group

        ray = _ray()
        cpus = what if what in ("inference", "trainer") else "inference"  # scorers use the servers' field
        pg: Any = placement_group(bundles, strategy=strategy)
        try:
            ray.get(pg.ready(), timeout=self.config.ray_placement_timeout_s)
        except GetTimeoutError as exc:
            with contextlib.suppress(Exception):
                remove_placement_group(pg)  # never leave a half-reserved group on a user's cluster
            free = _free_per_node(bundles[0])
            raise ClusterError(
                f"Ray could not reserve {len(bundles)} {what} bundle(s) of {bundles[0]} within "
                f"ray_placement_timeout_s={self.config.ray_placement_timeout_s}s: {free}. "
                f"Lower {what}_num_workers or ray_{cpus}_cpus_per_worker, free those resources, or add "
                "nodes (`ray status` shows the cluster)."
            ) from exc
        self.groups.append(pg)
        return pg

    def _options(self, pg: Any, index: int, cpus: float, gpus: float) -> dict[str, Any]:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        return {
            "num_cpus": cpus,
            "num_gpus": gpus,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=pg, placement_group_bundle_index=index
            ),
        }

    def place_servers(
        self, launches: list[dict[str, Any]], *, tensor_parallel: int | None = None, what: str = "inference"
    ) -> list[Any]:
        """One InferenceServerActor per launch (``InferenceServerActor``'s arguments), placed in one
        placement group of ``tensor_parallel`` GPUs per server (default: the policy servers'); returns
        these actors. ``what`` names them in placement errors: ``inference``, or a scorer's name
        (``teacher``, ``ref``), whose servers share the inference servers' cores on a CPU node."""
        if not launches:  # a run of supervised steps only
            return []
        cfg = self.config
        tp = cfg.inference_tensor_parallel_size if tensor_parallel is None else tensor_parallel
        bundle: dict[str, float] = {"CPU": cfg.ray_inference_cpus_per_worker}
        if self.gpu:
            bundle["GPU"] = float(tp)
        pg = self._placement_group([bundle] * len(launches), cfg.ray_inference_placement_strategy, what)
        plan = self._cpu_plan()
        placed: list[Any] = []
        for i, launch in enumerate(launches):
            opts = self._options(pg, i, cfg.ray_inference_cpus_per_worker, float(tp) if self.gpu else 0.0)
            bind = plan.server_binds[i % len(plan.server_binds)] if plan and plan.server_binds else None
            actor = InferenceServerActor.options(**opts).remote(index=i, **launch, cpu_bind=bind)
            placed.append(actor)
        self.server_actors.extend(placed)
        return placed

    def _cpu_plan(self) -> CpuPlan | None:
        """The cores' split between servers and trainer ranks, for a CPU run on a Ray this run started
        (one node). None: GPUs, a joined cluster or OMP_NUM_THREADS set by the user keep Ray's and
        vLLM's settings."""
        if self.gpu or not self.started_ray or "OMP_NUM_THREADS" in os.environ:
            return None
        cfg = self.config
        cores = sorted(os.sched_getaffinity(0))
        tp = cfg.inference_tensor_parallel_size
        return cpu_plan(cores, policy_servers(cfg), tp, cfg.trainer_num_workers)

    def place_trainers(
        self, model_path: str, log_dir: str, *, lend: bool = True, frozen_models: dict[str, str] | None = None
    ) -> list[Any]:
        """One TrainerActor per rank, forming one torch.distributed world.

        The validated config goes into Ray's object store once and every rank receives that object
        (no rank validates it again). ``lend``: the ranks may borrow the servers' idle cores
        (``cluster.cores``; :attr:`core_lease` is set when the CPU plan leaves any to lend).
        ``frozen_models``: the teacher and reference model the ranks load beside the policy
        (``run.scorers.in_trainer``).
        """
        ray = _ray()
        cfg = self.config
        config_ref = ray.put(cfg)
        n = cfg.trainer_num_workers
        bundle: dict[str, float] = {"CPU": cfg.ray_trainer_cpus_per_worker}
        if self.gpu:
            bundle["GPU"] = 1.0
        pg = self.trainer_group = self._placement_group(
            [bundle] * n, cfg.ray_trainer_placement_strategy, "trainer"
        )
        gpus = 1.0 if self.gpu else 0.0
        plan = self._cpu_plan()
        cores = self._lent_cores(plan) if lend else None

        def options(r: int) -> dict[str, Any]:
            opts = self._options(pg, r, cfg.ray_trainer_cpus_per_worker, gpus)
            if plan is not None:  # merged into the job's runtime_env (env_vars merge key by key)
                opts["runtime_env"] = {"env_vars": {"OMP_NUM_THREADS": str(plan.trainer_threads)}}
            return opts

        def rank(r: int) -> Any:
            return TrainerActor.options(**options(r)).remote(
                rank=r,
                world_size=n,
                config=config_ref,
                model_path=model_path,
                log_dir=log_dir,
                cores=cores,
                frozen_models=frozen_models,
            )

        first = rank(0)
        addr, port = ray.get(first.master_address.remote())
        self.trainer_actors = [first, *(rank(r) for r in range(1, n))]
        for actor in self.trainer_actors:
            actor.set_master.remote(addr, port)
        return self.trainer_actors

    def lendable(self) -> bool:
        """Whether the CPU plan leaves the servers' cores to lend to the trainer ranks while the
        servers idle (a CPU node whose ranks have fewer threads than cores)."""
        plan = self._cpu_plan()
        return plan is not None and plan.lent_threads > plan.trainer_threads

    def _lent_cores(self, plan: CpuPlan | None) -> LentCores | None:
        """What the trainer ranks need to borrow the servers' idle cores (None: nothing to lend)."""
        if plan is None or plan.lent_threads <= plan.trainer_threads:
            return None
        if self.core_lease is None:
            self.core_lease = CoreLease()
        return LentCores(self.core_lease.path, plan.trainer_threads, plan.lent_threads)

    def stop_trainers(self) -> None:
        """Kill every trainer rank and free their placement group (a rank died: they are placed
        again with :meth:`place_trainers`). Never raises."""
        from ray.util.placement_group import remove_placement_group

        ray = _ray()
        for actor in self.trainer_actors:
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
        self.trainer_actors = []
        if self.trainer_group is not None:
            with contextlib.suppress(Exception):
                remove_placement_group(self.trainer_group)
            self.groups = [g for g in self.groups if g is not self.trainer_group]
            self.trainer_group = None

    def close(self) -> None:
        """Stop trainers first (a collective may hang), then servers (all at once), then Ray if we
        started it; :attr:`close_seconds` has how long each part took."""
        ray = _ray()
        t0, self.close_seconds = time.monotonic(), {}
        if ray.is_initialized():
            for actor in self.trainer_actors:
                with contextlib.suppress(Exception):
                    ray.kill(actor, no_restart=True)
        if self.core_lease is not None:
            self.core_lease.close()
        if not ray.is_initialized():
            return
        t1 = time.monotonic()
        stops: list[Any] = []
        for actor in self.server_actors:
            with contextlib.suppress(Exception):
                stops.append(actor.stop.remote())
        with contextlib.suppress(Exception):
            ray.wait(stops, num_returns=len(stops), timeout=30)
        for actor in self.server_actors:
            with contextlib.suppress(Exception):
                ray.kill(actor, no_restart=True)
        from ray.util.placement_group import remove_placement_group

        for pg in self.groups:
            with contextlib.suppress(Exception):
                remove_placement_group(pg)
        self.trainer_actors, self.server_actors, self.groups = [], [], []
        t2 = time.monotonic()
        if self.started_ray or self.config.ray_shutdown_on_exit:
            ray.shutdown()
        t3 = time.monotonic()
        self.close_seconds = {"trainers": t1 - t0, "servers": t2 - t1, "ray": t3 - t2}
