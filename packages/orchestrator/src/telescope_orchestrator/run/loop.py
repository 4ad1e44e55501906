"""The training loop: scored groups in, one optimizer step and one weight update out, per step.

    batch   = await engine.next_batch()              # telescope-rollout (runs ahead by max_async_rollout)
    samples = to_train_samples(batch)                # + batch-level advantage whitening (telescope-algos)
    shards  = pack_samples(samples, ...)             # one list of micro-batches per data-parallel rank
                                                     # (these two in a worker thread: dispatch goes on)
    metrics = train_step on every rank               # trainer backend, through Ray
    weights.publish(step, group)                     # run.weights: telescope-weightsync, servers keep
                                                     # generating; then engine.weights_updated(version)
    write the step's metrics line and records (docs/records.md), then its checkpoint (when due)
    evals due after this step                        # telescope-rollout EvalRunner, see run.evals

Periodic evals run in the background on drained eval servers while training goes on; meanwhile
weights go to the ``training_only`` group (see ``run.evals``). A step's records and checkpoint are
written before any eval of it runs, and once its trainers have stepped its records are written
whatever happens next (a failed publish, Ctrl-C while waiting for a running eval): an eval never
costs a trained step. Eval failures are recorded and training goes on (see ``run.evals``).

On a CPU node the servers' cores are lent to a step's training once nothing will generate before its
weights are published (``_lend_cores``, ``cluster.cores``).

A trainer rank that dies is replaced: the step's training, weight update or checkpoint goes again
on new ranks that loaded the last checkpoint and trained again on the steps since
(``recovery.trainers``); no step is recorded twice.

Steps are counted from 1 in metrics, rollouts and checkpoints (``step_N`` holds N finished steps);
the weight version after step N is N, the base model is version 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

import structlog

from telescope_orchestrator.record.rundir import RunDir
from telescope_orchestrator.recovery.servers import ServerSupervisor
from telescope_orchestrator.recovery.trainers import TrainerRestarts, TrainersGone, dead_ranks, replay_diff
from telescope_orchestrator.run.collector import between_steps, steps_collector
from telescope_orchestrator.run.evals import InTrainingEvals
from telescope_orchestrator.run.waiting import next_batch
from telescope_rollout import RolloutError

if TYPE_CHECKING:
    from collections.abc import Awaitable
    from pathlib import Path

    from telescope_algos import MicroBatch, TrainingSample
    from telescope_config import TelescopeConfig
    from telescope_orchestrator.cluster.cores import CoreLease
    from telescope_orchestrator.record.lines import MetricsLines
    from telescope_orchestrator.record.tokens import Trained
    from telescope_orchestrator.run.report import Reporter
    from telescope_orchestrator.run.sft import SupervisedBatches
    from telescope_orchestrator.run.weights import WeightUpdates
    from telescope_rollout import EvalRunner, InferenceClient, RolloutEngine
    from telescope_rollout.inference import CompletionClient
    from telescope_sandbox import SandboxPool

__all__ = ["LoopContext", "to_train_samples", "training_loop"]

log = structlog.get_logger()

LEND_POLL_S = 0.1
"""How often a training step asks whether the servers' cores can be lent (``_lend_cores``)."""
LEND_SETTLE_S = 1.0
"""How long nothing must generate before the cores are lent: vLLM aborts a cancelled request an
engine step later, and its engine core busy-waits for a second after its last read."""


@dataclass
class LoopContext:
    """Everything the loop needs; built by ``run.startup`` after the start-up phases."""

    config: TelescopeConfig
    engine: RolloutEngine | None
    """The rollout engine; None in a run of supervised steps only (``TelescopeConfig.supervised_only``),
    which starts no inference server."""
    client: CompletionClient | None
    """The engine's client (``InferenceClient``), entered for the run's steps."""
    trainers: list[Any]
    """The trainer ranks' actor handles (``cluster.actors.TrainerActor``), in rank order."""
    dp_ranks: list[int]
    dp_world_size: int
    run: RunDir
    console: Reporter
    checkpoint_root: Path
    weights: WeightUpdates | None
    """The weight-sync groups and the one publish path (``run.weights``); None without servers."""
    lines: MetricsLines
    """Where metrics lines go: ``metrics.jsonl`` and W&B (``record.lines``)."""
    start_step: int = 0
    pad_token_id: int = 0
    row_multiple: int = 1
    """The trainer's required row-length multiple (``TrainerBackend.row_multiple``)."""
    share_prompts: bool = False
    """Pack a group's shared prompt once (``TrainerBackend.shares_prompts`` on every rank)."""
    evals: EvalRunner | None = None
    """The evals' runner (datasets loaded), or None when the config lists no evals."""
    eval_schedule: InTrainingEvals | None = None
    """The run's evals around its steps (set by ``training_loop``)."""
    sandboxes: list[SandboxPool] = field(default_factory=list["SandboxPool"])
    """The environments' sandbox pools (``run.sandboxes``), closed when the loop ends."""
    records_task: asyncio.Task[None] | None = None
    """The last step's record being written in the background (``_record_step``)."""
    supervisor: ServerSupervisor | None = None
    """Restarts dead inference servers (``recovery.servers``); None: a dead server stays dead."""
    last_step: int = 0
    """The last step trained, published and recorded."""
    trainer_restarts: TrainerRestarts | None = None
    """Replaces dead trainer ranks (``recovery.trainers``); None: a dead rank's error stops the run."""
    stop_requested: Callable[[], bool] = lambda: False
    """Asked after each step: true stops the run there (with a checkpoint of that step when
    checkpoints are on; the evals under way are cancelled and no final eval runs)."""
    stopped: bool = False
    """Set when ``stop_requested`` stopped the run before its last step."""
    cores: CoreLease | None = None
    """The servers' cores, lent to the trainer ranks while nothing generates (``cluster.cores``)."""
    sft: SupervisedBatches | None = None
    """The conversations of the run's supervised steps (``sft_steps``; ``run.sft``), or None."""
    scorer_clients: list[InferenceClient] = field(default_factory=list["InferenceClient"])
    """The clients of the teacher's and reference model's servers (``run.scorers``), closed at the end."""
    shards: list[list[MicroBatch]] = field(default_factory=list["list[MicroBatch]"])
    """The micro-batches of the last step trained, per data-parallel rank (``_train``)."""
    trained: TokenRequest | None = None
    """The trainer ranks' token records of the last RL step, asked for (``_ask_tokens``)."""

    @property
    def rollout(self) -> RolloutEngine:
        """The engine, in the code of RL steps (a run of supervised steps only never gets there)."""
        if self.engine is None:
            raise RuntimeError("a run of supervised steps only has no rollout engine")
        return self.engine


def _filtered(s: Any, config: TelescopeConfig) -> dict[str, bool]:
    """Which output filters flag a sample; flagged samples stay, with zero loss.

    See docs/algorithms.md#filters-and-the-overlong-penalty.
    """
    from telescope_algos import is_gibberish, is_overlong, is_repetitive

    return {
        "overlong": bool(config.filter_overlong)
        and (bool(getattr(s, "is_truncated", False)) or is_overlong(s.finish_reason)),
        "gibberish": bool(config.filter_gibberish)
        and is_gibberish(
            s.completion_ids,
            s.completion_logprobs,
            token_threshold=config.gibberish_token_threshold,
            logprob_offset=config.gibberish_logprob_offset,
        ),
        "repetition": bool(config.filter_repetition)
        and is_repetitive(s.completion_text or "", threshold=config.repetition_compression_threshold),
    }


def to_train_samples(batch: Any, config: TelescopeConfig) -> tuple[list[TrainingSample], dict[str, float]]:
    """Kept samples → telescope_algos.TrainingSample (one per training sequence: an agent's sample
    can hold more, ``ScoredSample.extra_sequences``), with output filters and batch whitening applied.

    Returns the samples and ``filter/<name>_frac`` metrics.
    """
    from telescope_algos import TrainingSample, batch_normalised, whiten_advantages

    kept = [s for g in batch.groups for s in g.samples]
    advantages = [float(s.advantage) for s in kept]
    if kept and batch_normalised(config.algorithm, config.advantage_norm):
        whitened: Any = whiten_advantages(advantages)  # a tensor: torch types tolist() as a bare list
        advantages = cast("list[float]", whitened.tolist())
    counts = {"overlong": 0, "gibberish": 0, "repetition": 0}
    samples: list[TrainingSample] = []
    for s, a in zip(kept, advantages, strict=True):
        flags = _filtered(s, config)
        for name, hit in flags.items():
            counts[name] += int(hit)
        # an agent that rewrote its history made more sequences: each trains with the sample's advantage
        for seq in (s, *s.extra_sequences):
            mask = [0] * len(seq.completion_ids) if any(flags.values()) else seq.completion_mask
            samples.append(
                TrainingSample(
                    prompt_ids=seq.prompt_ids,
                    completion_ids=seq.completion_ids,
                    advantage=a,
                    rollout_logprobs=seq.completion_logprobs,
                    completion_mask=mask,
                    teacher_logprobs=seq.teacher_logprobs,
                    ref_logprobs=seq.ref_logprobs,
                )
            )
    stats = {f"filter/{k}_frac": v / len(kept) if kept else 0.0 for k, v in counts.items()}
    return samples, stats


SCORED_DROPS = ("zero_advantage", "max_async")
"""Dropped groups whose samples were generated and scored normally: they count in reward/mean."""


def reward_metrics(batch: Any) -> dict[str, float]:
    """reward/mean over every sample scored this step, overall and per environment.

    Groups dropped for zero advantage or staleness count (they were generated and scored like the
    rest; leaving them out would hide progress: once a model solves a prompt, its all-correct
    group is dropped). Errored and cancelled groups do not. ``reward/kept_mean`` is the mean over
    the samples trained on.
    """
    groups = list(batch.groups) + [d.group for d in batch.discarded if d.reason in SCORED_DROPS]
    per_env: dict[str, list[float]] = defaultdict(list)
    for group in groups:
        for s in group.samples:
            per_env[s.env_name].append(float(s.reward))
    every = [r for rs in per_env.values() for r in rs]
    kept = [float(s.reward) for g in batch.groups for s in g.samples]
    out = {
        "reward/mean": sum(every) / len(every) if every else float("nan"),
        "reward/kept_mean": sum(kept) / len(kept) if kept else float("nan"),
    }
    for env, rs in sorted(per_env.items()):
        out[f"reward/{env}/mean"] = sum(rs) / len(rs)
    return out


def _mean_metrics(per_rank: list[dict[str, float]]) -> dict[str, float]:
    """The trainer's metrics, rank 0's copy: the loss, token counts and norms are identical on every
    rank by contract (reduced over the world); the ``timing/*`` ones, ``timing/cores_lent_s``
    included, are rank 0's own."""
    return dict(per_rank[0]) if per_rank else {}


async def _gather(refs: list[Any]) -> list[Any]:
    return list(await asyncio.gather(*refs))


def _should_checkpoint(config: TelescopeConfig, step: int) -> bool:
    every = config.checkpoint_every
    if not every:
        return False
    return step % int(every) == 0 or step == config.number_of_steps


async def training_loop(ctx: LoopContext) -> None:
    """Baseline evals, then steps ``start_step + 1 .. number_of_steps`` (engine started and stopped here).
    A run of supervised steps only (no engine) trains its steps and stops."""
    ctx.last_step = ctx.start_step
    ctx.console.start_training(ctx.start_step)
    with steps_collector():  # the garbage collector out of the event loop's way (run.collector)
        await _steps(ctx)


async def _steps(ctx: LoopContext) -> None:
    """The steps, with or without the engine; the records written and closed however they end."""
    records = ctx.run.records
    try:
        records.event("training_start", ctx.start_step)
        records.flush_events(ctx.start_step, tag=f"startup-a{records.attempt:03d}")
        if ctx.engine is None:
            await _supervised_steps(ctx)
        else:
            await _with_engine(ctx, ctx.engine)
    finally:
        from telescope_orchestrator.run.sandboxes import close_sandboxes

        try:
            await _records_written(ctx)
        finally:
            await close_sandboxes(ctx.sandboxes)
            records.close()


async def _with_engine(ctx: LoopContext, engine: RolloutEngine) -> None:
    """The baseline evals, the supervised steps not trained yet, then the RL steps with the engine
    running (not started when the run stopped in its supervised steps)."""
    assert ctx.client is not None
    assert ctx.weights is not None
    evals = ctx.eval_schedule = InTrainingEvals(
        ctx.config,
        runner=ctx.evals,
        engine=engine,
        weights=ctx.weights,
        lines=ctx.lines,
        run=ctx.run,
        console=ctx.console,
        start_step=ctx.start_step,
    )
    if ctx.start_step:
        ctx.weights.resumed(ctx.start_step)
    async with ctx.client:
        await evals.before_training()
        await _supervised_steps(ctx)
        if ctx.stopped:  # in the supervised steps: the engine never starts
            await evals.close()
        else:
            await _rl_steps(ctx, evals, engine)  # closes the evals before the engine stops
        for scorer_client in ctx.scorer_clients:  # after the engine: no sample is being scored
            await scorer_client.aclose()


async def _rl_steps(ctx: LoopContext, evals: InTrainingEvals, engine: RolloutEngine) -> None:
    """The RL steps after ``ctx.last_step``, the engine running; a stop asked for ends them early."""
    async with engine:
        if ctx.supervisor is not None:
            ctx.supervisor.start()
        try:
            for step in range(ctx.last_step + 1, ctx.config.number_of_steps + 1):
                await _step(ctx, evals, step)
                between_steps(step)
                if step < ctx.config.number_of_steps and ctx.stop_requested():
                    ctx.stopped = True
                    if ctx.config.checkpoint_every:  # checkpoints on: one of this step
                        await _checkpoint_before_stopping(ctx)
                    break
        except RolloutError:  # servers gone, hopeless input: keep what was trained, then stop
            await _checkpoint_before_stopping(ctx)
            raise
        finally:
            if ctx.supervisor is not None:
                await ctx.supervisor.close()
            await evals.close()


async def _checkpoint_before_stopping(ctx: LoopContext) -> None:
    """A checkpoint of the last finished step, unless it has one or the run trained nothing yet."""
    step = ctx.last_step
    if step <= ctx.start_step or _should_checkpoint(ctx.config, step):
        return
    try:
        await _checkpoint(ctx, step)
        ctx.console.info(f"saved a checkpoint of step {step} before stopping")
    except Exception as exc:  # the stop's own error says more
        log.error("checkpoint before stopping failed", step=step, error=f"{type(exc).__name__}: {exc}")


async def _supervised_steps(ctx: LoopContext) -> None:
    """The run's supervised steps not trained yet (``sft_steps``, before the engine starts), then
    their weights onto the servers, where the RL steps begin (docs/algorithms.md#sft); a run of
    supervised steps only has no server to send them to."""
    last = int(ctx.config.sft_steps)
    if ctx.sft is None or ctx.last_step >= last:
        return
    for step in range(ctx.last_step + 1, last + 1):
        await _supervised_step(ctx, step)
        between_steps(step)
        if ctx.stop_requested() and step < ctx.config.number_of_steps:
            ctx.stopped = True
            if ctx.config.checkpoint_every:
                await _checkpoint_before_stopping(ctx)
            return
    if ctx.engine is None or ctx.weights is None:
        return
    # as after a resume at step `last`: the engine counts from there, every server holds its weights
    from telescope_orchestrator.run.startup import resumed_engine_state

    ctx.engine.load_state_dict(resumed_engine_state(ctx.engine.state_dict(), last))
    await _on_trainers(
        ctx,
        f"the weight update of step {last}",
        lambda: _gather([a.publish.remote(last) for a in ctx.trainers]),
        locked=False,
    )
    ctx.weights.resumed(last)


async def _supervised_step(ctx: LoopContext, step: int) -> None:
    """One supervised step on its conversations (``run.sft``), its metrics line and record, and its
    checkpoint when one is due."""
    assert ctx.sft is not None
    records = ctx.run.records
    samples = ctx.sft.samples(step)
    tokens = sum(len(s.completion_ids) for s in samples)
    t0 = time.monotonic()
    with records.phase("train_step", step, samples=len(samples), tokens=tokens):
        per_rank = await _on_trainers(ctx, f"the training of step {step}", lambda: _train(ctx, samples, step))
    seconds = time.monotonic() - t0
    trained = _mean_metrics(per_rank)
    if ctx.trainer_restarts is not None:
        ctx.trainer_restarts.trained(step, samples, trained)
    metrics = {
        "step": step,
        "time": time.time(),
        **trained,
        "sft/loss": trained.get("loss", float("nan")),
        "sft/conversations": float(len(samples)),
        "throughput/tokens_per_s": tokens / max(seconds, 1e-9),
        "timing/train_s": seconds,
        "timing/step_s": seconds,
    }
    ctx.lines.write(metrics, step=step)
    ctx.console.step(metrics)
    log.info("supervised step done", **metrics)
    spans, events = await _spans(ctx), records.take_events()
    await asyncio.to_thread(records.write_supervised, step, spans, events)
    ctx.last_step = step
    if _should_checkpoint(ctx.config, step):
        await _on_trainers(
            ctx, f"the checkpoint of step {step}", lambda: _checkpoint(ctx, step), locked=False
        )


async def _train(ctx: LoopContext, samples: list[Any], step: int) -> list[dict[str, float]]:
    """Pack the step's samples into one list of micro-batches per data-parallel rank and train:
    supervised for the run's first ``sft_steps`` steps, RL after them."""
    from telescope_algos import pack_samples
    from telescope_algos.backend import pad_multiple

    cfg = ctx.config
    pack = functools.partial(
        pack_samples,
        samples,
        seq_len=cfg.seq_len,
        pad_to_multiple_of=pad_multiple(cfg.pad_to_multiple_of, ctx.row_multiple),
        num_ranks=ctx.dp_world_size,
        pad_token_id=ctx.pad_token_id,
        share_prompts=ctx.share_prompts,
    )
    shards = ctx.shards = await asyncio.to_thread(pack)  # off the event loop: dispatch goes on
    pairs = zip(ctx.trainers, ctx.dp_ranks, strict=True)
    lend = asyncio.create_task(_lend_cores(ctx, step)) if ctx.cores is not None else None
    try:
        objective = "sft" if step <= cfg.sft_steps else "rl"
        calls = [functools.partial(a.train_step.remote, shards[dp], step, objective) for a, dp in pairs]
        return await _gather(await asyncio.to_thread(_send_train_steps, calls))
    finally:
        if lend is not None:
            lend.cancel()
        if ctx.cores is not None:
            ctx.cores.revoke()  # a step trained again (a replay, a retry) never finds an old grant


def _send_train_steps(calls: list[Callable[[], Any]]) -> list[Any]:
    """Each rank's ``train_step.remote(...)``, in a worker thread: Ray serializes a call's arguments
    (the rank's micro-batches) on the thread that makes it, which must not be the event loop's."""
    return [call() for call in calls]


def _servers_quiet(ctx: LoopContext) -> bool:
    """Nothing computes on the servers' cores until the next weight update: the engine is idle until
    then, no eval uses a server and no server is being restarted."""
    evals, supervisor = ctx.eval_schedule, ctx.supervisor
    return (
        ctx.rollout.idle
        and (evals is None or evals.idle)
        and (supervisor is None or not supervisor.restarting)
    )


async def _lend_cores(ctx: LoopContext, step: int) -> None:
    """Lend the servers' cores to step ``step``'s training once they have been quiet for
    ``LEND_SETTLE_S`` (``_servers_quiet``; ``cluster.cores``)."""
    assert ctx.cores is not None
    quiet_since: float | None = None
    while True:
        now = time.monotonic()
        quiet_since = (quiet_since or now) if _servers_quiet(ctx) else None
        if quiet_since is not None and now - quiet_since >= LEND_SETTLE_S:
            ctx.cores.grant(step)
            return
        await asyncio.sleep(LEND_POLL_S)


async def _step(ctx: LoopContext, evals: InTrainingEvals, step: int) -> None:
    """One training step, its records and checkpoint, then the evals due after it."""
    t0 = time.monotonic()
    batch = await next_batch(ctx, step)  # ctx.engine.next_batch(), saying how it goes while it waits
    t_rollout = time.monotonic() - t0
    # the trainer holds the weights of the pool's version outside this block (a restarted server's
    # resync sends them: recovery.servers)
    async with ctx.supervisor.lock if ctx.supervisor is not None else contextlib.nullcontext():
        metrics = await _train_and_publish(ctx, evals, step, batch, {"timing/rollout_wait_s": t_rollout})
    metrics["timing/step_s"] = time.monotonic() - t0
    t3 = time.monotonic()
    try:  # from here on Ctrl-C keeps this step's records: it trained and published
        metrics.update(await asyncio.to_thread(_derived, batch, metrics))  # off the event loop
        t3 = time.monotonic()
        await _records_written(ctx)  # the previous step's, if still being written
    except asyncio.CancelledError:
        if not any(k.startswith("derived/") for k in metrics):  # stopped while they were computed
            metrics.update(_derived(batch, metrics))
        _write_step(ctx, step, batch, metrics, spans=[])
        raise
    metrics["timing/records_wait_s"] = time.monotonic() - t3
    ctx.records_task = asyncio.create_task(
        _record_step(ctx, step, batch, ctx.trained), name=f"records-step-{step}"
    )
    _write_step(ctx, step, batch, metrics, spans=None)
    ctx.last_step = step
    if _should_checkpoint(ctx.config, step):
        await _on_trainers(
            ctx, f"the checkpoint of step {step}", lambda: _checkpoint(ctx, step), locked=False
        )
    await evals.after_step(step)


async def _checkpoint(ctx: LoopContext, step: int) -> None:
    """Step ``step``'s checkpoint, with its spans and events filed with the step."""
    records = ctx.run.records
    await _records_written(ctx)  # a checkpoint's step has its whole record
    with records.phase("checkpoint", step):
        path = await save_checkpoint(ctx, step)
    if ctx.trainer_restarts is not None:
        ctx.trainer_restarts.checkpointed(step, str(path))
    # its spans and event, filed with its step (a resume from it keeps them)
    spans = await _spans(ctx)
    await asyncio.to_thread(records.write_checkpoint, step, spans, records.take_events())


async def _train_and_publish(
    ctx: LoopContext, evals: InTrainingEvals, step: int, batch: Any, timing: dict[str, float]
) -> dict[str, Any]:
    """Train on ``batch`` and publish the new weights; returns the step's metrics so far. Once the
    trainers stepped, the step's records are written whatever stops the publish."""
    records = ctx.run.records
    samples, filter_stats = await asyncio.to_thread(to_train_samples, batch, ctx.config)
    num_tokens = sum(len(s.prompt_ids) + len(s.completion_ids) for s in samples)
    t1 = time.monotonic()
    with records.phase("train_step", step, samples=len(samples), tokens=num_tokens):
        per_rank = await _on_trainers(ctx, f"the training of step {step}", lambda: _train(ctx, samples, step))
    t_train = time.monotonic() - t1
    ctx.trained = _ask_tokens(ctx, samples)
    if ctx.trainer_restarts is not None:
        ctx.trainer_restarts.trained(step, samples, _mean_metrics(per_rank))
    metrics: dict[str, Any] = {
        "step": step,
        "time": time.time(),
        **reward_metrics(batch),
        **_mean_metrics(per_rank),
        **filter_stats,
        **batch.metrics,
        "async_level": batch.metrics.get("rollout/async_level", 0),
        "groups/kept": len(batch.groups),
        "groups/discarded": len(batch.discarded),
        "groups/cancelled": len(batch.cancelled),
        "throughput/tokens_per_s": num_tokens / max(t_train, 1e-9),
        **timing,
        "timing/train_s": t_train,
    }
    try:
        t2 = time.monotonic()
        with records.phase("weights_published", step) as published:
            metrics.update(
                await _on_trainers(ctx, f"the weight update of step {step}", lambda: evals.publish(step))
            )
            published["bytes"] = metrics.get("weight_sync/bytes")
        metrics["timing/weight_sync_s"] = time.monotonic() - t2
    except BaseException:  # the trainers stepped: keep the step's records whatever stopped us
        log.warning("step interrupted after training: recorded without weight-sync metrics", step=step)
        await _records_written(ctx)
        _write_step(ctx, step, batch, metrics, spans=[])
        raise
    if ctx.supervisor is not None:
        metrics.update(ctx.supervisor.metrics())
    if ctx.trainer_restarts is not None:
        metrics["restarts/trainer"] = float(ctx.trainer_restarts.restarts)
    from telescope_orchestrator.run.sandboxes import sandbox_metrics

    metrics.update(sandbox_metrics(ctx.sandboxes))
    return metrics


async def _on_trainers(
    ctx: LoopContext, what: str, call: Callable[[], Awaitable[Any]], *, locked: bool = True
) -> Any:
    """``call()``; when a trainer rank died in it, the ranks are restarted and it goes again
    (``recovery.trainers``). ``locked``: the caller holds the supervisor's lock."""
    dead: dict[int, str] = {}
    while True:
        try:
            if dead:
                async with (
                    ctx.supervisor.lock
                    if ctx.supervisor is not None and not locked
                    else contextlib.nullcontext()
                ):
                    await _recover_trainers(ctx, dead, what)
                dead = {}
            return await call()
        except TrainersGone:
            raise
        except Exception as exc:
            if ctx.trainer_restarts is None:
                raise
            restarting = bool(dead)
            dead = await dead_ranks(ctx.trainers)
            if not dead and restarting:
                raise TrainersGone(
                    f"the trainer ranks could not be restarted: {type(exc).__name__}: {exc}"
                ) from exc
            if not dead:
                raise


async def _recover_trainers(ctx: LoopContext, dead: dict[int, str], what: str) -> None:
    """New trainer ranks where the dead ones were: placed, the restore point loaded, the steps since
    trained again, the weight-sync groups formed (see ``recovery.trainers``)."""
    rt = ctx.trainer_restarts
    assert rt is not None
    rt.lost(dead, what)  # raises when they are not restarted
    t0 = time.monotonic()
    ctx.trainers[:] = await asyncio.to_thread(rt.place)
    if rt.restore_from is not None:
        await _gather([a.load_checkpoint.remote(rt.restore_from) for a in ctx.trainers])
    diffs: dict[int, float] = {}
    for step, samples, recorded in rt.replay:
        diffs[step] = replay_diff(recorded, _mean_metrics(await _train(ctx, samples, step)))
    groups = ctx.supervisor.groups_now() if ctx.supervisor is not None else None
    await asyncio.to_thread(rt.connect, ctx.trainers, groups)
    if ctx.supervisor is not None and groups is not None:
        ctx.supervisor.trainers, ctx.supervisor.connected = ctx.trainers, groups
    rt.back(time.monotonic() - t0, diffs)


async def _records_written(ctx: LoopContext) -> None:
    """Wait for the step record being written in the background (see :func:`_record_step`);
    cancelling the wait (Ctrl-C) does not cancel the writing, which the loop's end waits for."""
    task = ctx.records_task
    if task is None:
        return
    try:
        await asyncio.shield(task)
    finally:
        if task.done():
            ctx.records_task = None


async def _record_step(ctx: LoopContext, step: int, batch: Any, asked: TokenRequest | None) -> None:
    """A step's record, written off the event loop while the next step goes on: the trainer ranks'
    spans (one call per rank, queued before their next step), then the files, in a thread, with the
    token table when ``record_tokens`` is on. Never raises: the record of a step must never cost the
    step."""
    records = ctx.run.records
    events = records.take_events()
    spans = await _spans(ctx)
    trained = await _trained_tokens(asked)
    decode = getattr(getattr(ctx.engine, "tokenizer", None), "decode", None)
    t0 = time.monotonic()
    written = functools.partial(
        records.write_step, decode=decode, spans=spans, events=events, tokens=bool(ctx.config.record_tokens)
    )
    try:
        await asyncio.to_thread(written, step, batch, trained=trained)
    except Exception as exc:
        log.warning("step records not written", step=step, error=repr(exc))
    log.debug("step records written", step=step, seconds=round(time.monotonic() - t0, 4))


@dataclass
class TokenRequest:
    """The trainer ranks' ``step_tokens`` of one step, asked for right after it trained (each rank
    answers in call order, so later steps cannot change them) and read with the step's record."""

    answers: list[Any]
    shards: list[list[MicroBatch]]
    dp_ranks: list[int]
    lengths: list[int]


def _ask_tokens(ctx: LoopContext, samples: list[TrainingSample]) -> TokenRequest | None:
    """Ask every trainer rank for what its loss did with each token of the step just trained
    (``record_tokens``); None when off or a rank cannot be asked."""
    if not ctx.config.record_tokens or not ctx.shards:
        return None
    try:
        answers = [a.step_tokens.remote() for a in ctx.trainers]
    except Exception as exc:  # the record of a step must never cost the step
        log.warning("trainer token records not asked for", error=repr(exc))
        return None
    lengths = [len(s.prompt_ids) + len(s.completion_ids) for s in samples]
    return TokenRequest(answers, ctx.shards, list(ctx.dp_ranks), lengths)


async def _trained_tokens(asked: TokenRequest | None) -> Trained | None:
    """The ranks' answers to ``asked`` read back by training sequence (``record.tokens``), off the
    event loop; None when there are none."""
    if asked is None:
        return None
    from telescope_orchestrator.record.tokens import trained_tokens

    try:
        per_rank = await _gather(asked.answers)
        return await asyncio.to_thread(trained_tokens, asked.shards, asked.dp_ranks, per_rank, asked.lengths)
    except Exception as exc:  # the record of a step must never cost the step
        log.warning("trainer token records not collected", error=repr(exc))
        return None


def _derived(batch: Any, metrics: dict[str, Any]) -> dict[str, float]:
    """The step's ``derived/*`` metrics (docs/records.md, "Step metrics")."""
    from telescope_orchestrator.record.derived import derived_metrics

    timings = {
        "train_s": metrics.get("timing/train_s", 0.0),
        "weight_sync_s": metrics.get("timing/weight_sync_s", 0.0),
        "step_s": metrics.get("timing/step_s", 0.0),
    }
    try:
        return derived_metrics(batch, timings=timings)
    except Exception as exc:  # a statistic must never stop a run
        log.warning("derived metrics failed", error=repr(exc))
        return {}


async def _spans(ctx: LoopContext) -> list[dict[str, Any]]:
    """Every trainer rank's spans since the last step (the last checkpoint's included)."""
    try:
        per_rank = await _gather([a.drain_spans.remote() for a in ctx.trainers])
    except Exception as exc:
        log.warning("trainer spans not collected", error=repr(exc))
        return []
    return [row for rows in per_rank for row in rows]


def _write_step(
    ctx: LoopContext, step: int, batch: Any, metrics: dict[str, Any], *, spans: list[dict[str, Any]] | None
) -> None:
    """The step's metrics line (W&B, console); with ``spans`` given, its record too, here and now
    (a step interrupted after training; otherwise :func:`_record_step` writes it)."""
    if spans is not None:
        try:
            decode = getattr(getattr(ctx.engine, "tokenizer", None), "decode", None)
            ctx.run.records.write_step(step, batch, decode=decode, spans=spans)
        except Exception as exc:  # the record of a step must never cost the step
            log.warning("step records not written", step=step, error=repr(exc))
    ctx.lines.write(metrics, step=step)
    ctx.console.step(metrics)
    log.info("step done", **{k: v for k, v in metrics.items() if not k.startswith("rollout/")})


async def save_checkpoint(ctx: LoopContext, step: int) -> Any:
    """``step_<step>`` under the checkpoint root: every rank writes into one temporary folder, then
    the folder gets its ``meta.json`` (with the engine's state) and its name, then retention runs
    (layout and rules: ``run.checkpoints``)."""
    import hashlib

    from telescope_orchestrator.run import checkpoints as ck

    cfg = ctx.config
    training_state = bool(cfg.checkpoint_save_training_state)
    config = ctx.run.path / "config.yaml"
    # folder work (clearing a stale .tmp, renames, deleting old checkpoints) off the event loop
    tmp = await asyncio.to_thread(ck.begin, ctx.checkpoint_root, step)
    facts = await _gather([a.save_checkpoint.remote(str(tmp), training_state) for a in ctx.trainers])
    meta = {
        **facts[0],
        "base_model": cfg.model,
        "config_sha256": hashlib.sha256(config.read_bytes()).hexdigest() if config.is_file() else None,
        "training_state": training_state,
        # None in a run of supervised steps only: a run that resumes it starts its engine fresh
        "extra_state": {"engine": ctx.engine.state_dict() if ctx.engine is not None else None},
    }
    path = await asyncio.to_thread(ck.commit, tmp, step, meta)
    keep = {"keep_last": cfg.checkpoint_keep_last, "keep_every": cfg.checkpoint_keep_every}
    deleted = await asyncio.to_thread(ck.prune, ctx.checkpoint_root, current=step, **keep)
    log.info("checkpoint saved", step=step, path=str(path), deleted=[str(p) for p in deleted])
    return path
