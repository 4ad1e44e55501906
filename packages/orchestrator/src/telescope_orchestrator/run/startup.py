"""``telescope train``: start-up phases, then the loop, then a clean stop, whatever happens.

Phases (one console line each): run directory → model → Ray → vLLM servers and trainer ranks
(placed concurrently) → environments, evals and the rollout engine → weight-sync group → resume
→ loop (baseline evals, steps, periodic and final evals). The weight-sync groups are ``full`` and,
when periodic evals run beside training, ``training_only`` (every server but the eval servers).
Every process the run starts is stopped on the way out: normal end, error, Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import tempfile
import time
import uuid
from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import structlog

from telescope_orchestrator.cluster.calls import ActorCallError, call_all, setup_infos, start_all, wait_all
from telescope_orchestrator.cluster.guard import start_guard
from telescope_orchestrator.record.lines import MetricsLines
from telescope_orchestrator.record.rundir import RunDir, choose_run_dir
from telescope_orchestrator.recovery.trainers import dead_ranks, why_no_restarts
from telescope_orchestrator.run.scorers import in_trainer
from telescope_orchestrator.run.waiting import on_engine_event
from telescope_orchestrator.run.weights import WeightUpdates, weight_groups

if TYPE_CHECKING:
    from telescope_config import ResolvedConfig, TelescopeConfig
    from telescope_orchestrator.cluster.cores import CoreLease
    from telescope_orchestrator.run.report import Reporter
    from telescope_orchestrator.run.scorers import ScorerModel
    from telescope_orchestrator.run.sft import SupervisedBatches
    from telescope_orchestrator.run.wiring import EngineParts
    from telescope_rollout import RolloutEngine, Tokenizer
    from telescope_rollout.envs import BuiltEnvironment

__all__ = ["Finished", "TrainError", "sigterm_as_interrupt", "train"]

log = structlog.get_logger()
WEIGHTSYNC_EXTENSION = "telescope_weightsync.vllm_worker.WeightReceiver"


class TrainError(RuntimeError):
    """A run could not start or continue; the message says what to do."""


@dataclass(frozen=True)
class Finished:
    """How a run that ended without an error went."""

    run_dir: Path
    last_step: int
    """The last step trained (a resumed run that had finished: its checkpoint's step)."""
    stopped: bool
    """True when ``stop_requested`` stopped it before its last step."""


@contextlib.contextmanager
def sigterm_as_interrupt() -> Generator[None]:
    """While inside, SIGTERM raises ``KeyboardInterrupt`` in the main thread: a stop goes the way
    of Ctrl-C. The previous handler is put back on the way out. Outside the main thread it does
    nothing (Python installs signal handlers only there)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt(f"signal {signum}")

    with _signal_handlers((signal.SIGTERM,)):
        signal.signal(signal.SIGTERM, handler)
        yield


def _open_run(resolved: ResolvedConfig, run_dir: str | None) -> RunDir:
    """The run directory, with its config written."""
    cfg = resolved.config
    run_name = cfg.wandb_run_name if "wandb_run_name" in resolved.user_keys else None
    run = RunDir(
        choose_run_dir(explicit=run_dir, run_name=run_name, resuming=bool(cfg.resume_from_checkpoint))
    )
    run.write_config(resolved.to_yaml())
    return run


_RUN_VARIABLES = ("TELESCOPE_RUN_DIR", "TELESCOPE_RUN_ID")


@contextlib.contextmanager
def _driver_scope(run: RunDir, debug: bool) -> Generator[None]:
    """What a run changes in the driver's process, put back when it ends (a Python program may
    train again): the run's environment markers, the guard, file logging, SIGTERM as Ctrl-C and
    SIGUSR1 stack dumps (signal handlers only from the main thread, where Python allows them).
    Each change is undone in reverse order, also when a later one fails."""
    import threading

    from telescope_orchestrator.cluster.stacks import dump_stacks_on_sigusr1

    with contextlib.ExitStack() as undo:
        undo.enter_context(_environment(_RUN_VARIABLES))
        # every process of the run (Ray daemons, actors, vLLM) inherits this: tests and users find them by it
        os.environ["TELESCOPE_RUN_DIR"] = str(run.path)
        # ... and this marker, unique to this launch: the guard stops them all should the driver be killed
        os.environ["TELESCOPE_RUN_ID"] = run_id = uuid.uuid4().hex
        guard = start_guard(
            f"TELESCOPE_RUN_ID={run_id}",
            log_file=run.path / "logs" / "guard.log",
            stop_file=Path(tempfile.gettempdir()) / f"telescope-guard-{run_id}.stop",
        )
        if guard is not None:
            undo.callback(guard.stop)
        # structured JSON logs of the driver into the run directory; the console keeps phases only
        undo.enter_context(_file_logging(run, debug))
        undo.enter_context(sigterm_as_interrupt())
        if threading.current_thread() is threading.main_thread():
            undo.enter_context(_signal_handlers((signal.SIGUSR1,)))
            undo.callback(dump_stacks_on_sigusr1(run.path / "logs" / "stacks.txt"))
        yield


@contextlib.contextmanager
def _environment(names: tuple[str, ...]) -> Generator[None]:
    """Put the variables ``names`` back as they were (set or not) on the way out."""
    saved = {name: os.environ.get(name) for name in names}
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@contextlib.contextmanager
def _signal_handlers(signals: tuple[signal.Signals, ...]) -> Generator[None]:
    """Put the Python handlers of ``signals`` back on the way out (one set from C is left alone)."""
    saved = {s: signal.getsignal(s) for s in signals}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            if handler is not None:
                signal.signal(sig, handler)


@contextlib.contextmanager
def _file_logging(run: RunDir, debug: bool) -> Generator[None]:
    """The driver's logs into ``logs/telescope.jsonl`` while the run lasts; the program's own
    logging (structlog, the root logger's handlers and level, the noisy libraries' levels) is
    set aside, not closed, and put back on the way out."""
    import logging

    from telescope_orchestrator.record.logging import NOISY, configure_logging

    saved_structlog, root = structlog.get_config(), logging.getLogger()
    saved_handlers, saved_level = list(root.handlers), root.level
    saved_noisy = {name: logging.getLogger(name).level for name in NOISY}
    root.handlers[:] = []  # configure_logging replaces the root's handlers: these are not its to close
    with run.log_file.open("a", encoding="utf-8", buffering=1) as log_file:
        try:
            configure_logging(debug=debug, file=log_file)
            yield
        finally:
            structlog.configure(**saved_structlog)
            root.handlers[:] = saved_handlers
            root.setLevel(saved_level)
            for name, level in saved_noisy.items():
                logging.getLogger(name).setLevel(level)


@dataclass
class _Run:
    """What a run holds between its start-up phases and its stop."""

    resolved: ResolvedConfig
    run: RunDir
    console: Any
    cluster: Any
    sandboxes: list[Any] = field(default_factory=list[Any])
    """Filled by the start-up phases; closed on the way out (by the loop, once it started)."""
    wandb: Any = None
    loop_started: bool = False
    infra: Any = None
    """The infrastructure sampler (``record.observe.start_infra``), stopped on the way out."""
    remote_infra: Any = None
    """The other nodes' samplers (``cluster.observers.RemoteInfra``), stopped on the way out."""


def train(
    resolved: ResolvedConfig,
    *,
    reporter: Reporter,
    run_dir: str | None = None,
    debug: bool = False,
    stop_requested: Callable[[], bool] | None = None,
) -> Finished:
    """Run a whole training job from a resolved config; returns where and how far it went.
    ``reporter`` hears of the phases and steps (the command line's console, or
    ``run.report.SilentReporter``); ``stop_requested`` is asked after each step, and true stops
    the run there (``LoopContext.stop_requested``)."""
    cfg = resolved.config
    if cfg.use_wandb:
        _wandb_mode()  # a bad WANDB_MODE fails now, not after every process started
    run = _open_run(resolved, run_dir)
    with _driver_scope(run, debug):
        return _train(resolved, run, reporter, stop_requested or (lambda: False))


def _train(
    resolved: ResolvedConfig, run: RunDir, console: Reporter, stop_requested: Callable[[], bool]
) -> Finished:
    """Start-up, the loop and the stop, in the driver's scope (``train``)."""
    from telescope_orchestrator.cluster.ray_cluster import Cluster, ClusterError

    cfg = resolved.config
    console.on_phase = lambda text, at, seconds: run.records.event(
        "startup", None, duration_s=seconds, at=at, phase=text
    )
    console.info(f"run directory: {run.path}")
    state = _Run(resolved, run, console, Cluster(cfg, log_path=run.path / "logs" / "ray.log"))
    try:
        try:
            ctx = _start(state)
        except ClusterError as err:  # Ray could not be reached, or could not place the run
            raise TrainError(str(err)) from None
        ctx.stop_requested = stop_requested
        state.loop_started = True
        from telescope_orchestrator.recovery.trainers import TrainersGone
        from telescope_orchestrator.run.loop import training_loop
        from telescope_rollout import RolloutError

        try:
            asyncio.run(training_loop(ctx))
        # the input cannot make progress (hopeless prompts, every sample failing), or its parts died
        except (RolloutError, TrainersGone) as err:
            raise TrainError(str(err)) from None
        console.close()
        if ctx.stopped:
            console.info(f"stopped after step {ctx.last_step} as asked; records in {run.path}")
        else:
            console.info(f"[green]finished[/green] {cfg.number_of_steps} steps; records in {run.path}")
        console.info(f"look at the run: telescope ui {run.path.parent}")
        return Finished(run.path, ctx.last_step, ctx.stopped)
    finally:
        _stop(state)


def _start(state: _Run) -> Any:
    """Every start-up phase after the run directory; returns the loop's context."""
    from telescope_orchestrator.run.loop import LoopContext
    from telescope_orchestrator.run.wiring import pad_token_id

    resolved, run, console = state.resolved, state.run, state.console
    cfg = resolved.config
    inputs = _prepare_inputs(cfg, run, console, state.sandboxes)
    resume_from = int(inputs.resume[1]["step"]) if inputs.resume is not None else None
    run.records.open(resume_from=resume_from, flush_every_s=float(cfg.event_upload_interval_seconds))
    _start_ray(state)
    servers, trainers, infos, scoring = _start_workers(state.cluster, resolved, inputs, run, console)
    log.info("trainer ranks ready", torch_threads=[i["threads"] for i in infos])
    urls = [s["url"] for s in servers]
    # a run of supervised steps only has no server, hence no engine, evals or weight-sync group
    parts = _build_engine(state, inputs, urls, scoring) if urls else None
    engine, evals = (parts.engine, parts.evals) if parts is not None else (None, None)
    pids = _observe(state, inputs, trainers, [*servers, *scoring], evals)
    groups = _connect(state, trainers, urls, resuming=inputs.resume is not None)
    start_step = 0
    if inputs.resume is not None:
        with console.phase("resume from checkpoint"):
            start_step = _resume(inputs.resume, trainers, engine, run)
    if cfg.use_wandb:
        state.wandb = _start_wandb(cfg, resolved, run)
    restarts = _trainer_restarts(state, inputs, groups, pids)
    supervisor = (
        _supervisor(state, engine, servers, trainers, evals, pids, groups, scoring=scoring)
        if engine is not None
        else None
    )
    return LoopContext(
        config=cfg,
        engine=engine,
        client=parts.client if parts is not None else None,
        trainers=trainers,
        dp_ranks=[i["dp_rank"] for i in infos],
        dp_world_size=infos[0]["dp_world_size"],
        run=run,
        console=console,
        checkpoint_root=run.checkpoints(cfg.checkpoint_dir),
        weights=(
            WeightUpdates(groups, engine, supervisor.publish)
            if engine is not None and supervisor is not None
            else None
        ),
        lines=MetricsLines(run, state.wandb, start_step=start_step),
        start_step=start_step,
        pad_token_id=parts.pad_token_id if parts is not None else pad_token_id(inputs.tokenizer),
        row_multiple=infos[0]["row_multiple"],
        share_prompts=all(i["shares_prompts"] for i in infos),
        evals=evals,
        sandboxes=state.sandboxes,
        supervisor=supervisor,
        trainer_restarts=restarts,
        cores=_lent_cores(state),
        scorer_clients=parts.scorer_clients if parts is not None else [],
        sft=inputs.sft,
    )


def _observe(
    state: _Run, inputs: _Inputs, trainers: list[Any], servers: list[dict[str, Any]], evals: Any
) -> dict[str, int]:
    """The setup record of every worker, then the infrastructure sampler over them (stopped by
    ``_stop``); returns the pids it samples, by role."""
    from telescope_orchestrator.record.observe import record_setup, start_infra

    cfg, run = state.resolved.config, state.run
    workers = setup_infos(trainers) + setup_infos([s["actor"] for s in servers])
    pids = record_setup(run, cfg.model, infos=workers, built=inputs.built, evals=evals)
    urls = [s["url"] for s in servers if "scorer" not in s]
    interval = float(cfg.system_metrics_collection_interval_seconds)
    state.infra = start_infra(run, pids=pids, urls=urls, interval_s=interval)
    state.remote_infra = _remote_infra(run, workers, interval)
    return pids


def _remote_infra(run: RunDir, workers: list[dict[str, Any]], interval: float) -> Any:
    """The samplers of the run's other nodes (``cluster.observers``), or None on one node; never
    stops the run."""
    from telescope_orchestrator.cluster.observers import RemoteInfra
    from telescope_orchestrator.record.observe import remote_pids
    from telescope_orchestrator.record.setup import ray_node_id

    others = remote_pids(workers, ray_node_id())
    if not others:
        return None
    try:
        return RemoteInfra(
            others,
            lambda rows: run.records.writer.append("infra", rows),
            interval_s=interval,
            attempt=run.records.attempt,
        )
    except Exception as exc:
        log.warning("the other nodes' infrastructure is not sampled", error=repr(exc))
        return None


def _connect(state: _Run, trainers: list[Any], urls: list[str], *, resuming: bool) -> dict[str, list[str]]:
    """The phase "weight-sync groups" (none without servers); returns the groups."""
    cfg = state.resolved.config
    if not urls:
        return {}
    groups = weight_groups(urls, has_evals=bool(cfg.evals), eval_num_servers=int(cfg.eval_num_servers))
    with state.console.phase(f"weight-sync group{'s' if len(groups) > 1 else ''} ({', '.join(groups)})"):
        _connect_weights(state.resolved, trainers, groups)
        _register_adapter(cfg, trainers, resuming=resuming)
    return groups


def _lent_cores(state: _Run) -> CoreLease | None:
    """The servers' cores lent to training while they idle (``cluster.cores``): the lease the
    cluster holds when the ranks were placed to borrow them (``_start_workers`` decides)."""
    lease: CoreLease | None = state.cluster.core_lease
    if lease is not None:
        log.info("the servers' cores are lent to training while they idle", lease=lease.path)
    return lease


def _actor_env(cfg: TelescopeConfig, run: RunDir) -> dict[str, str]:
    """What the run's actors get in their environment besides Ray's own (unset ones left out)."""
    env = {
        "TELESCOPE_RUN_DIR": str(run.path) if cfg.ray_propagate_run_dir else "",
        "HF_HUB_OFFLINE": os.environ.get("HF_HUB_OFFLINE", ""),
    }
    return {k: v for k, v in env.items() if v}


def _build_engine(
    state: _Run, inputs: _Inputs, urls: list[str], scoring: list[dict[str, Any]]
) -> EngineParts:
    """The phase "evals and rollout engine"; the evals' sandbox pools join ``state.sandboxes``;
    ``scoring`` are the teacher's and reference model's servers (``run.scorers``)."""
    from telescope_orchestrator.run.sandboxes import SandboxSetupError
    from telescope_orchestrator.run.wiring import build_engine

    run, console = state.run, state.console
    with console.phase("evals and rollout engine"):
        try:
            parts = build_engine(
                state.resolved.config,
                inputs.tokenizer,
                urls,
                inputs.built,
                on_event=on_engine_event(run.records, console),
                scorer_urls={
                    name: [s["url"] for s in scoring if s["scorer"] == name] for name in _names(scoring)
                },
            )
        except SandboxSetupError as err:
            raise TrainError(str(err)) from None
        state.sandboxes.extend(parts.eval_sandboxes)
    return parts


def _names(scoring: list[dict[str, Any]]) -> list[str]:
    return list(dict.fromkeys(s["scorer"] for s in scoring))


def _record_event(run: RunDir) -> Callable[..., None]:
    """``event(kind, **detail)``: records one event of the run, at no step (``RunRecords.event``)."""

    def event(kind: str, **detail: Any) -> None:
        run.records.event(kind, None, **detail)

    return event


def _trainer_restarts(
    state: _Run, inputs: _Inputs, groups: dict[str, list[str]], pids: dict[str, int]
) -> Any:
    """What restarting dead trainer ranks takes (``recovery.trainers``): placing them again (their
    new pids go to the infrastructure sampler's ``pids``), forming their weight-sync groups
    (``groups`` less the servers that are out), the restore point."""
    from telescope_orchestrator.recovery.trainers import TrainerRestarts

    cfg, cluster, run = state.resolved.config, state.cluster, state.run
    log_dir = run.path / "logs" / "trainer"

    def place() -> list[Any]:
        cluster.stop_trainers()
        trainers = cluster.place_trainers(
            inputs.model_path, str(log_dir), lend=False, frozen_models=in_trainer(inputs.scorers)
        )
        call_all(trainers, "setup", timeout=float(cfg.ray_placement_timeout_s))
        from telescope_orchestrator.record.observe import local_pids

        pids.update(local_pids(setup_infos(trainers)))
        return list(trainers)

    def connect(trainers: list[Any], now: dict[str, list[str]] | None) -> None:
        _connect_weights(state.resolved, trainers, groups if now is None else now)

    restarts = TrainerRestarts(
        config=cfg,
        place=place,
        connect=connect,
        log_dir=log_dir,
        event=_record_event(run),
        say=state.console.info,
    )
    if inputs.resume is not None:
        restarts.restore_from, restarts.restore_step = str(inputs.resume[0]), int(inputs.resume[1]["step"])
    return restarts


def _supervisor(
    state: _Run,
    engine: Any,
    servers: list[dict[str, Any]],
    trainers: list[Any],
    evals: Any,
    pids: dict[str, int],
    groups: dict[str, list[str]],
    *,
    scoring: list[dict[str, Any]],
) -> Any:
    """The watcher that restarts dead inference servers, the policy's and the teacher's and reference
    model's (``scoring``, each with its engine scorer; ``recovery.servers``): it tells the evals under
    way of a lost server and the infrastructure sampler of a restarted one's pid, and leaves a
    failure of the trainer ranks to the loop."""
    from telescope_orchestrator.record.observe import local_pids
    from telescope_orchestrator.recovery.servers import ServerSupervisor, SupervisorLimits

    cfg, run = state.resolved.config, state.run
    scorers = {scorer.name: scorer for scorer in engine.scorers}
    supervisor = ServerSupervisor(
        engine=engine,
        servers=[(s["url"], s["actor"]) for s in servers],
        scorer_servers=[(s["url"], s["actor"], scorers[s["scorer"]]) for s in scoring],
        trainers=trainers,
        groups=groups,
        limits=SupervisorLimits.from_config(cfg),
        event=_record_event(run),
        say=state.console.info,
        # the ranks of now: a trainer restart hands the supervisor the new ones (run.loop)
        trainers_dead=lambda: dead_ranks(supervisor.trainers),
        on_lost=evals.server_lost if evals is not None else None,
        on_restarted=lambda actor: pids.update(local_pids(setup_infos([actor]))),
    )
    return supervisor


def _connect_weights(resolved: ResolvedConfig, trainers: list[Any], groups: dict[str, list[str]]) -> None:
    """The weight-sync group(s) between the broadcast rank and the servers."""
    from telescope_weightsync import PublisherSettings

    if not groups:  # no server to send weights to (a run of supervised steps only)
        return
    cfg = resolved.config
    settings = PublisherSettings.from_config(cfg, user_keys=resolved.user_keys)
    loopback = cfg.ray_broadcast_prefer_loopback_if_single_node
    call_all(trainers, "connect_weights", groups, settings, loopback)


def _register_adapter(cfg: TelescopeConfig, trainers: list[Any], *, resuming: bool) -> None:
    """With LoRA, send the untrained adapter (``B = 0``: the base model exactly) as the weights of
    step 0: each server registers it under the name generation requests use (docs/weightsync.md,
    "LoRA adapters"). A resumed run sends its checkpoint's adapter instead (``_resume``)."""
    if cfg.lora_rank <= 0 or resuming:
        return
    try:
        call_all(trainers, "publish", 0)
    except ActorCallError as err:
        raise TrainError(f"the inference servers did not take the LoRA adapter: {err.cause}") from None


def _stop(state: _Run) -> None:
    """Close what the run started, whatever stopped it: sandboxes (unless the loop did), every
    process of the run, then W&B (after the workers stopped: their logs are complete)."""
    state.console.close()
    reason = _stop_reason()
    log.info("stopping", reason=reason)
    if state.infra is not None:
        state.infra.stop()
    if state.remote_infra is not None:
        state.remote_infra.stop()  # a last drain, before the record closes
    state.run.records.event("stop", None, reason=reason)
    state.run.records.close()  # never raises
    if state.sandboxes and not state.loop_started:
        from telescope_orchestrator.run.sandboxes import close_sandboxes

        asyncio.run(close_sandboxes(state.sandboxes))
    try:
        with state.console.phase("stopping every process of the run"):
            state.cluster.close()
        took = {f"{part}_s": round(s, 2) for part, s in state.cluster.close_seconds.items()}
        log.info("stopped every process of the run", **took)
    finally:
        if state.wandb is not None:
            _finish_wandb(state.wandb, state.resolved.config, state.run)


def _stop_reason() -> str:
    """``finished``, or the exception the run is stopping with (called on the way out)."""
    import sys

    error = sys.exc_info()[1]
    return "finished" if error is None else f"{type(error).__name__}: {str(error)[:300]}"


@dataclass
class _Inputs:
    """What the start-up phases before Ray produce (everything that can be wrong with the input)."""

    built: list[BuiltEnvironment]
    model_path: str
    tokenizer: Tokenizer
    resume: tuple[Path, dict[str, Any]] | None
    """The checkpoint to resume and its meta.json, when ``resume_from_checkpoint`` is set."""
    scorers: list[ScorerModel]
    """The teacher and reference model the run serves beside the policy (``run.scorers``)."""
    sft: SupervisedBatches | None = None
    """The conversations of the supervised steps (``sft_steps``; ``run.sft``), or None."""


def _prepare_inputs(cfg: TelescopeConfig, run: RunDir, console: Any, sandboxes: list[Any]) -> _Inputs:
    """Start-up checks, environments with their sandboxes, model, datasets, the checkpoint to resume.

    Everything here fails with a ``TrainError`` before any process starts; ``sandboxes`` receives
    the pools as they are built (the caller closes them).
    """
    from telescope_orchestrator.run.checks import backend_problem
    from telescope_orchestrator.run.models import resolve_model
    from telescope_orchestrator.run.sandboxes import SandboxSetupError
    from telescope_orchestrator.run.wiring import DatasetError, build_training_environments, load_datasets
    from telescope_rollout import UnknownEnvironmentError

    if (problem := backend_problem(cfg.train_backend, lora=cfg.lora_rank > 0)) is not None:
        raise TrainError(problem)
    _warn_settings(cfg, console)
    resume = None
    if cfg.resume_from_checkpoint:
        resume = _choose_checkpoint(cfg, run.checkpoints(cfg.checkpoint_dir))
    built: list[BuiltEnvironment] = []
    if not cfg.supervised_only:  # a run of supervised steps only samples from no environment
        with console.phase("environments and sandboxes"):
            try:
                built, pools = build_training_environments(cfg)
            except (SandboxSetupError, UnknownEnvironmentError, ValueError) as err:
                raise TrainError(str(err)) from None
            sandboxes.extend(pools)
    with console.phase("model"):
        model_path = resolve_model(cfg.model)
    with console.phase("datasets and prompts" if built else "tokenizer"):
        try:
            tokenizer, problem = load_datasets(cfg, built, model_path)
        except DatasetError as err:
            raise TrainError(str(err)) from None
        if problem is not None:
            raise TrainError(problem)
    scorers = _scorer_models(cfg, model_path, tokenizer, console)
    resumed_at = int(resume[1]["step"]) if resume is not None else 0
    sft = _conversations(cfg, tokenizer, console) if resumed_at < cfg.sft_steps else None
    return _Inputs(built, model_path, tokenizer, resume, scorers, sft)


def _start_ray(state: _Run) -> None:
    """The phase "Ray" (join or start it; the console says which), then, on a joined cluster, the
    shared-storage check."""
    cfg, run = state.resolved.config, state.run
    folders = [run.path, run.checkpoints(cfg.checkpoint_dir)]
    with state.console.phase("Ray"):
        state.cluster.start(run_env=_actor_env(cfg, run), keep_out=folders)
    state.console.info(state.cluster.summary)
    if not state.cluster.started_ray:
        _check_storage(state, folders)


def _check_storage(state: _Run, folders: list[Path]) -> None:
    """The phase "shared storage" of a joined cluster: every other node sees ``folders`` (the run and
    checkpoint directories; ``cluster.storage``), or the run stops here, before anything is placed."""
    from telescope_orchestrator.cluster.storage import check_shared_storage

    timeout = float(state.resolved.config.ray_placement_timeout_s)
    with state.console.phase("shared storage on every node"):
        problem = check_shared_storage(folders, timeout_s=timeout)
    if problem is not None:
        raise TrainError(problem)


def _warn_settings(cfg: TelescopeConfig, console: Any) -> None:
    """The start-up warnings of settings that work, but not as a user may think (``run.checks``)."""
    from telescope_orchestrator.run import checks

    for check in (
        checks.truncated_sampling_warning,
        checks.frozen_model_temperature_warning,
        checks.supervised_only_warning,
        checks.unused_placement_warning,
    ):
        if (warning := check(cfg)) is not None:
            log.warning("sampling settings", detail=warning)
            console.warning(warning)


def _conversations(cfg: TelescopeConfig, tokenizer: Tokenizer, console: Any) -> SupervisedBatches | None:
    """The phase "conversations for the supervised steps": every row read and tokenized now."""
    from telescope_orchestrator.run.sft import SftDataError, SupervisedBatches, load_conversations

    if not cfg.sft_steps:
        return None
    with console.phase("conversations for the supervised steps"):
        try:
            conversations = load_conversations(cfg, tokenizer)
        except SftDataError as err:
            raise TrainError(str(err)) from None
    log.info("supervised conversations", count=len(conversations), steps=cfg.sft_steps)
    return SupervisedBatches(conversations, int(cfg.sft_batch_size), int(cfg.seed))


def _scorer_models(
    cfg: TelescopeConfig, model_path: str, tokenizer: Tokenizer, console: Any
) -> list[ScorerModel]:
    """The phase "teacher and reference model": resolved, their tokenizers checked against the policy's."""
    from telescope_orchestrator.run.scorers import check_contexts, check_tokenizers, scorer_models

    if not cfg.frozen_models:
        return []
    with console.phase("teacher and reference model"):
        scorers = scorer_models(cfg, model_path)
        problem = check_tokenizers(cfg, tokenizer, scorers) or check_contexts(cfg, scorers)
        if problem is not None:
            raise TrainError(problem)
    return scorers


def _choose_checkpoint(cfg: TelescopeConfig, root: Path) -> tuple[Path, dict[str, Any]]:
    """The checkpoint to resume and its meta, checked against the config before anything starts."""
    from telescope_orchestrator.run import checkpoints as ck

    try:
        path = ck.find_checkpoint(root, cfg.resume_from_checkpoint)
        meta = ck.read_meta(path)
    except (ck.CheckpointError, ValueError) as err:
        raise TrainError(str(err)) from None
    if not meta.get("training_state"):
        raise TrainError(
            f"{path} holds weights only (checkpoint_save_training_state was false): it cannot resume a run. "
            "Start a new run from it with --model <converted folder> instead (telescope convert)."
        )
    if meta.get("backend") != cfg.train_backend:
        raise TrainError(
            f"{path} was written by the {meta.get('backend')!r} backend; this run has train_backend "
            f"{cfg.train_backend!r}. Resume with --train_backend {meta.get('backend')}, or convert it "
            "(telescope convert) and start a new run from the converted folder."
        )
    if meta.get("backend") == "megatron":
        layout = {
            "world_size": cfg.trainer_num_workers,
            "tp_size": cfg.megatron_tensor_parallel_size,
            "pp_size": cfg.megatron_pipeline_parallel_size,
            "cp_size": cfg.megatron_context_parallel_size,
            "ep_size": cfg.megatron_expert_parallel_size,
        }
        diff = {k: (meta.get(k), v) for k, v in layout.items() if k in meta and meta[k] != v}
        if diff:
            raise TrainError(
                f"{path} was written with another parallel layout {diff} (saved, now): resume with the "
                "saved sizes, or convert it (telescope convert) and start a new run from the converted "
                "folder."
            )
    return path, meta


def _server_settings(cfg: TelescopeConfig, model_path: str, *, gpu: bool) -> tuple[Any, dict[str, Any]]:
    """The policy servers' ``ServerSettings``, and as the fields an actor takes."""
    import dataclasses

    from telescope_orchestrator.cluster.vllm_server import ServerSettings

    device = "cuda" if gpu else "cpu"
    own = ServerSettings.from_config(
        cfg, model=model_path, device=device, seed=cfg.seed, host=cfg.inference_host
    )
    settings = dataclasses.asdict(own)
    settings["extra_args"] = tuple(settings["extra_args"])
    return own, settings


def _start_workers(
    cluster: Any, resolved: Any, inputs: _Inputs, run: RunDir, console: Any
) -> tuple[list[dict[str, Any]], list[Any], list[Any], list[dict[str, Any]]]:
    """Place the vLLM servers (the policy's, then the teacher's and reference model's) and the trainer
    ranks, start them concurrently, wait for all. Returns the policy servers, the trainer ranks, their
    infos and the scorer servers (each with its ``scorer`` name)."""
    from telescope_orchestrator.cluster.ray_cluster import policy_servers
    from telescope_orchestrator.cluster.vllm_server import ServerStartError
    from telescope_orchestrator.run.scorers import scorer_launches

    cfg = resolved.config
    count = policy_servers(cfg)
    own, settings = _server_settings(cfg, inputs.model_path, gpu=cluster.gpu)
    scoring = scorer_launches(cfg, inputs.scorers, own, run.path, cfg.inference_base_port + count)
    launches = [
        {
            "settings": settings,
            "port": cfg.inference_base_port + i,
            "log_path": str(run.path / "logs" / "inference" / f"server_{i}.log"),
            "extension_cls": WEIGHTSYNC_EXTENSION,
        }
        for i in range(count)
    ]
    extra = f" (+{len(scoring)} teacher/reference)" if scoring else ""
    servers = f"{count} vLLM server(s){extra} and " if count or scoring else ""
    with console.phase(f"{servers}{cfg.trainer_num_workers} trainer rank(s)"):
        try:
            actors = cluster.place_servers(launches)
            urls = call_all(actors, "start")
            scorer_actors = _place_scorers(cluster, scoring, inputs.scorers)
            scorer_urls = call_all(scorer_actors, "start")
            trainers = _place_trainers(cluster, cfg, inputs, run)
            setting_up = start_all(trainers, "setup")  # loads the model while vLLM boots
            call_all([*actors, *scorer_actors], "wait_healthy", float(cfg.ray_placement_timeout_s))
            infos = wait_all(setting_up)
        except ActorCallError as err:
            cause = err.cause
            if isinstance(cause, ServerStartError):
                raise TrainError(str(cause)) from None
            raise TrainError(f"a worker failed to start: {cause}") from cause
    return (
        [
            {"url": u, "log": launch["log_path"], "actor": a}
            for u, launch, a in zip(urls, launches, actors, strict=True)
        ],
        trainers,
        infos,
        [
            {"url": u, "log": launch["log_path"], "actor": a, "scorer": launch["scorer"]}
            for u, launch, a in zip(scorer_urls, scoring, scorer_actors, strict=True)
        ],
    )


def _place_trainers(cluster: Any, cfg: TelescopeConfig, inputs: _Inputs, run: RunDir) -> list[Any]:
    """The trainer ranks, with the frozen models placed in them; they borrow the servers' idle cores
    unless a restarted rank must replay a step exactly (lending changes a step's thread count, and
    how float sums split)."""
    lend = why_no_restarts(cfg) is not None
    if not lend and cluster.lendable():
        log.info("the servers' idle cores are not lent: trainer restarts replay steps exactly")
    return cluster.place_trainers(
        inputs.model_path,
        str(run.path / "logs" / "trainer"),
        lend=lend,
        frozen_models=in_trainer(inputs.scorers),
    )


def _place_scorers(cluster: Any, launches: list[dict[str, Any]], scorers: list[ScorerModel]) -> list[Any]:
    """The teacher's and reference model's server actors, one placement group each."""
    actors: list[Any] = []
    for scorer in scorers:
        mine = [
            {**{k: v for k, v in x.items() if k != "scorer"}, "role": f"vllm-{scorer.name}"}
            for x in launches
            if x["scorer"] == scorer.name
        ]
        actors += cluster.place_servers(mine, tensor_parallel=scorer.tensor_parallel, what=scorer.name)
    return actors


def _resume(
    chosen: tuple[Path, dict[str, Any]], trainers: list[Any], engine: RolloutEngine | None, run: RunDir
) -> int:
    """Load the chosen checkpoint on every rank, the engine's state, and the servers' weights.

    The engine's step counter is set to the trainer's: batches it had queued but the trainer never
    trained are generated again, so ``max_async_rollout`` means the same after a resume. Checkpoints
    of later steps (a run resumed from an earlier one) are set aside, never resumed or kept by retention.
    """
    from telescope_orchestrator.run import checkpoints as ck

    path, meta = chosen
    step = int(meta["step"])
    try:
        call_all(trainers, "load_checkpoint", str(path))
    except ActorCallError as err:
        raise TrainError(f"could not load {path}: {err.cause}") from None
    for moved in ck.set_aside_later(path.parent, step):
        log.warning("later checkpoint set aside", path=str(moved), resumed_step=step)
    if engine is not None:
        # a checkpoint of a run of supervised steps only has no engine state: the engine starts fresh
        saved = meta.get("extra_state", {}).get("engine") or engine.state_dict()
        engine.load_state_dict(resumed_engine_state(saved, step))
        call_all(trainers, "publish", step)  # the servers still hold the base model
    run.truncate_metrics(step)
    log.info("resumed", checkpoint=str(path), step=step, at=time.time())
    return step


def resumed_engine_state(state: dict[str, Any], step: int) -> dict[str, Any]:
    """The engine's saved state with its counters at the trainer's ``step``.

    A checkpoint of step N is written while the engine may already have assembled batches N+1 ..
    N+max_async_rollout (its ``step`` counter ahead of N); those batches die with the run, so the
    resumed engine counts from N and generates them again (from new prompts: the sampler goes on
    from where it was, so no prompt is drawn twice).
    """
    return {**state, "step": step, "version": step}


def _wandb_mode() -> Literal["online", "offline", "disabled", "shared"]:
    """WANDB_MODE when set (one of wandb's modes); else online with credentials (WANDB_API_KEY or
    ~/.netrc), offline without.

    Offline runs write to ``<run dir>/wandb`` and upload later with ``wandb sync``; a run never
    stops to ask for a login.
    """
    given = os.environ.get("WANDB_MODE", "")
    mode = {"dryrun": "offline", "run": "online"}.get(given, given)  # wandb's older names
    if mode in ("online", "offline", "disabled", "shared"):
        return mode
    if mode:
        raise TrainError(f"WANDB_MODE={mode!r} is not a wandb mode: use online, offline, disabled or shared")
    netrc = Path.home() / ".netrc"
    logged_in = netrc.is_file() and "api.wandb.ai" in netrc.read_text(encoding="utf-8", errors="ignore")
    return "online" if os.environ.get("WANDB_API_KEY") or logged_in else "offline"


def _start_wandb(cfg: TelescopeConfig, resolved: ResolvedConfig, run: RunDir) -> Any:
    """A W&B run with the config, tags and the step metrics of ``metrics.jsonl``."""
    try:
        import wandb
    except ImportError as exc:
        raise TrainError(
            "use_wandb is true but wandb is not installed: pip install 'telescope-orchestrator[wandb]'"
        ) from exc
    from telescope_orchestrator.record.setup import process_setup

    mode = _wandb_mode()
    log.info("wandb", mode=mode, dir=str(run.path / "wandb"))
    setup = process_setup("driver")
    tags = os.environ["WANDB_TAGS"].split(",") if os.environ.get("WANDB_TAGS") else list(cfg.wandb_tags)
    tags += _version_tags(setup)
    wb = wandb.init(
        project=os.environ.get("WANDB_PROJECT", cfg.wandb_project),
        name=os.environ.get("WANDB_RUN_NAME", cfg.wandb_run_name),
        tags=tags,
        config={**resolved.to_dict(), "_user_keys": sorted(resolved.user_keys)},
        dir=str(run.path),
        mode=mode,
    )
    wb.summary["setup"] = setup  # the driver's hardware and software; every process: records/setup
    # periodic evals end steps after the weights they measured: chart them against eval/step
    wb.define_metric("eval/step")
    wb.define_metric("eval/*", step_metric="eval/step")
    if cfg.wandb_upload_code:
        from telescope_orchestrator.record.wandb import upload_code

        try:
            upload_code(wb, cfg, root=Path.cwd(), run_dir=run.path)
        except Exception as exc:  # the metrics matter more than the code snapshot
            log.warning("wandb code upload failed", error=f"{type(exc).__name__}: {exc}")
    return wb


def _version_tags(setup: dict[str, Any]) -> list[str]:
    """``version:<telescope-orchestrator version>``, ``commit:<sha>`` (when known) and the record
    format."""
    from telescope_records import FORMAT_VERSION

    versions: dict[str, Any] = setup.get("versions") or {}
    tags = [f"version:{versions.get('telescope-orchestrator', '')}", f"records_format:{FORMAT_VERSION}"]
    if setup.get("git_commit"):
        tags.append(f"commit:{str(setup['git_commit'])[:12]}")
    return [t[:64] for t in tags]  # W&B's tag length limit


def _finish_wandb(wb: Any, cfg: TelescopeConfig, run: RunDir) -> None:
    """Hand the logs to W&B (``wandb_upload_logs*``) and close the run; never raises."""
    from telescope_orchestrator.record.wandb import save_logs

    try:
        save_logs(wb, cfg, run.path)
    except Exception as exc:
        log.warning("wandb log upload failed", error=f"{type(exc).__name__}: {exc}")
    with contextlib.suppress(Exception):
        wb.finish()
