"""The training loop: scored groups in, one optimizer step and one weight update out, per step.

    batch   = await engine.next_batch()              # telescope-rollout (runs ahead by max_async_rollout)
    samples = to_train_samples(batch)                # + batch-level advantage whitening (telescope-algos)
    shards  = pack_samples(samples, ...)             # one list of micro-batches per data-parallel rank
    metrics = train_step on every rank               # trainer backend, through Ray
    publish weights (version = step)                 # telescope-weightsync, servers keep generating
    engine.weights_updated(version)                  # resumes paused dispatch, counts off-policy steps
    write the step's metrics line and rollouts, then its checkpoint (when due)
    evals due after this step                        # telescope-rollout EvalRunner, see _evals.py

Periodic evals run in the background on drained eval servers while training goes on; meanwhile
weights go to the ``training_only`` group (see ``_evals``). A step's records and checkpoint are
written before any eval of it runs, and once its trainers have stepped its records are written
whatever happens next (a failed publish, Ctrl-C while waiting for a running eval): an eval never
costs a trained step. Eval failures are recorded and training goes on (see ``_evals``).

Steps are counted from 1 in metrics, rollouts and checkpoints (``step_N`` holds N finished steps);
the weight version after step N is N, the base model is version 0.
"""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import structlog

from telescope_cli._evals import (
    EvalPlan,
    PeriodicEval,
    eval_servers,
    failed_metrics,
    run_scheduled_evals,
    weight_groups,
)
from telescope_cli._rundir import RunDir, rollout_rows, write_rollouts

__all__ = ["LoopContext", "to_train_samples", "training_loop"]

log = structlog.get_logger()


@dataclass
class LoopContext:
    """Everything the loop needs; built by ``_train`` after the start-up phases."""

    config: Any
    engine: Any
    client: Any
    trainers: list[Any]
    dp_ranks: list[int]
    dp_world_size: int
    run: RunDir
    console: Any
    checkpoint_root: Any
    start_step: int = 0
    pad_token_id: int = 0
    row_multiple: int = 1
    """The trainer's required row-length multiple (``TrainerBackend.row_multiple``)."""
    wandb: Any = None
    extra_metrics: dict[str, float] = field(default_factory=dict)
    evals: Any = None
    """A telescope_rollout.EvalRunner (datasets loaded), or None when the config lists no evals."""
    wandb_step: int = 0
    """The last step logged to W&B (evals that end between steps are logged there)."""
    running_eval: PeriodicEval | None = None
    """The periodic evals running in the background, from their start until the loop took them back
    (cancelled when the run ends early)."""
    sandboxes: list[Any] = field(default_factory=list)
    """The environments' sandbox pools (``_sandboxes``), closed when the loop ends."""


def _filtered(s: Any, config: Any) -> dict[str, bool]:
    """Which output filters (spec §3.8) flag a sample; flagged samples stay, with zero loss."""
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


def to_train_samples(batch: Any, config: Any) -> tuple[list[Any], dict[str, float]]:
    """Kept samples → telescope_algos.Sample, with output filters and batch whitening applied.

    Returns the samples and ``filter/<name>_frac`` metrics.
    """
    from telescope_algos import Sample, whiten_advantages

    kept = [s for g in batch.groups for s in g.samples]
    advantages = [float(s.advantage) for s in kept]
    if kept and (config.advantage_norm == "batch" or config.algorithm == "reinforce_pp"):
        advantages = whiten_advantages(advantages).tolist()
    counts = {"overlong": 0, "gibberish": 0, "repetition": 0}
    samples = []
    for s, a in zip(kept, advantages, strict=True):
        flags = _filtered(s, config)
        for name, hit in flags.items():
            counts[name] += int(hit)
        mask = [0] * len(s.completion_ids) if any(flags.values()) else s.completion_mask
        samples.append(
            Sample(
                prompt_ids=s.prompt_ids,
                completion_ids=s.completion_ids,
                advantage=a,
                rollout_logprobs=s.completion_logprobs,
                completion_mask=mask,
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
    """The trainer's metrics (identical on every rank by contract; rank 0's copy is used)."""
    return dict(per_rank[0]) if per_rank else {}


async def _gather(refs: list[Any]) -> list[Any]:
    return list(await asyncio.gather(*refs))


def _should_checkpoint(config: Any, step: int) -> bool:
    every = config.checkpoint_every
    if not every:
        return False
    return step % int(every) == 0 or step == config.number_of_steps


async def training_loop(ctx: LoopContext) -> None:
    """Baseline evals, then steps ``start_step + 1 .. number_of_steps`` (engine started and stopped here)."""
    cfg, engine = ctx.config, ctx.engine
    plan = EvalPlan.from_config(cfg, ctx.start_step) if ctx.evals is not None else None
    if plan is not None and plan.periodic and "training_only" not in _groups(ctx):
        raise ValueError(
            f"periodic evals need a server left for training: eval_num_servers is {cfg.eval_num_servers} "
            f"with {len(ctx.client.server_urls)} server(s); lower eval_num_servers or add inference workers"
        )
    ctx.wandb_step = ctx.start_step
    ctx.console.start_training(ctx.start_step)
    if ctx.start_step:
        engine.weights_updated(ctx.start_step)  # resumed: the servers hold that step's weights
    try:
        async with ctx.client:
            await _evals_and_steps(ctx, plan)
    finally:
        from telescope_cli._sandboxes import close_sandboxes

        await close_sandboxes(ctx.sandboxes)


async def _evals_and_steps(ctx: LoopContext, plan: EvalPlan | None) -> None:
    """Baseline evals, the evals a resumed checkpoint never finished, then the steps."""
    if plan is not None and plan.baseline():
        baseline = await _run_evals(ctx, 0, plan.baseline(), end=True)
        _write_eval_step(ctx, 0, baseline)
    start = ctx.start_step
    if plan is not None and start and plan.after_step(start) and not _evals_recorded(ctx, start):
        # Resumed from a checkpoint whose evals never ended (the run was stopped during them):
        # the servers hold that step's weights, so run them now, before rollouts start.
        _write_eval_step(ctx, start, await _run_evals(ctx, start, plan.after_step(start), end=True))
    async with ctx.engine:
        await _steps(ctx, plan)


def _evals_recorded(ctx: LoopContext, step: int) -> bool:
    """True when metrics.jsonl already holds an eval line for ``step`` (its evals ran, or failed)."""
    return any(m.get("eval/step") == step for m in ctx.run.read_metrics())


def _groups(ctx: LoopContext) -> dict[str, list[str]]:
    cfg = ctx.config
    return weight_groups(
        ctx.client.server_urls, has_evals=bool(cfg.evals), eval_num_servers=int(cfg.eval_num_servers)
    )


def _servers(ctx: LoopContext, *, end: bool) -> list[str]:
    cfg = ctx.config
    return eval_servers(
        ctx.client.server_urls,
        eval_num_servers=int(cfg.eval_num_servers),
        use_all_at_ends=bool(cfg.eval_start_end_use_all_servers),
        end=end,
    )


async def _run_evals(ctx: LoopContext, step: int, names: list[str], *, end: bool) -> dict[str, float]:
    servers = _servers(ctx, end=end)
    return await run_scheduled_evals(ctx.evals, ctx.run, ctx.console, step=step, names=names, servers=servers)


async def _background_evals(ctx: LoopContext, step: int, names: list[str]) -> dict[str, float]:
    """A periodic eval's body: run, then record its metrics line as soon as it is done.

    Never raises but for cancellation: a failure is logged and recorded (``eval/<name>/failed``),
    so the loop takes the eval servers back and trains on.
    """
    try:
        results = await _run_evals(ctx, step, names, end=False)
    except Exception as exc:  # run_scheduled_evals records failures itself; this is a last resort
        for name in names:
            log.warning("eval failed", eval=name, step=step, error=f"{type(exc).__name__}: {exc}")
        results = failed_metrics(names, step)
    try:
        _write_eval_step(ctx, step, results)
    except Exception as exc:
        log.warning("eval metrics not recorded", step=step, evals=names, error=f"{type(exc).__name__}: {exc}")
    return results


async def _steps(ctx: LoopContext, plan: EvalPlan | None) -> None:
    try:
        for step in range(ctx.start_step + 1, ctx.config.number_of_steps + 1):
            await _step(ctx, plan, step)
    finally:
        running, ctx.running_eval = ctx.running_eval, None
        if running is not None:
            await running.cancel()


async def _step(ctx: LoopContext, plan: EvalPlan | None, step: int) -> None:
    """One training step, its records and checkpoint, then the evals due after it.

    A periodic eval started here stays running in ``ctx.running_eval``.
    """
    from telescope_algos import pack_samples, pad_multiple

    cfg, engine = ctx.config, ctx.engine
    t0 = time.monotonic()
    batch = await engine.next_batch()
    t_rollout = time.monotonic() - t0
    samples, filter_stats = to_train_samples(batch, cfg)
    shards = pack_samples(
        samples,
        seq_len=cfg.seq_len,
        pad_to_multiple_of=pad_multiple(cfg.pad_to_multiple_of, ctx.row_multiple),
        num_ranks=ctx.dp_world_size,
        pad_token_id=ctx.pad_token_id,
    )
    t1 = time.monotonic()
    per_rank = await _gather(
        [a.train_step.remote(shards[dp], step) for a, dp in zip(ctx.trainers, ctx.dp_ranks, strict=True)]
    )
    t2 = time.monotonic()
    num_tokens = sum(len(s.prompt_ids) + len(s.completion_ids) for s in samples)
    metrics: dict[str, Any] = {"step": step, "time": time.time(), **reward_metrics(batch)}
    metrics.update(_mean_metrics(per_rank))
    metrics.update(filter_stats)
    metrics.update(batch.metrics)
    metrics.update(
        {
            "async_level": batch.metrics.get("rollout/async_level", 0),
            "groups/kept": len(batch.groups),
            "groups/discarded": len(batch.discarded),
            "groups/cancelled": len(batch.cancelled),
            "throughput/tokens_per_s": num_tokens / max(t2 - t1, 1e-9),
            "timing/rollout_wait_s": t_rollout,
            "timing/train_s": t2 - t1,
        }
    )
    due = plan.after_step(step) if plan is not None else []
    last = step == cfg.number_of_steps
    try:
        rejoin: list[str] = []
        running = ctx.running_eval
        if running is not None and (running.done() or due or last):
            await running.wait()  # a new eval step (or the end) waits for the running evals
            rejoin, ctx.running_eval = running.servers, None
        t_wait = time.monotonic() - t2
        group = "full" if ctx.running_eval is None else "training_only"
        sync = await _gather([a.publish.remote(step, group) for a in ctx.trainers])
        only = None if ctx.running_eval is None else _groups(ctx)["training_only"]
        engine.weights_updated(step, servers=only)
        if rejoin and not (due and not last):  # back to training, unless a new periodic eval takes them
            engine.restore_servers(rejoin)
        metrics.update({f"weight_sync/{k}": v for k, v in (sync[0] or {}).items()})
        metrics.update(
            {
                "timing/weight_sync_s": time.monotonic() - t2 - t_wait,
                "timing/eval_s": t_wait,
                "weight_sync/training_only": float(group == "training_only"),
                "timing/step_s": time.monotonic() - t0,
            }
        )
    except BaseException:  # the trainers stepped: keep the step's records whatever stopped us
        log.warning("step interrupted after training: recorded without weight-sync metrics", step=step)
        _write_step(ctx, step, batch, metrics)
        raise
    _write_step(ctx, step, batch, metrics)
    if _should_checkpoint(cfg, step):
        await save_checkpoint(ctx, step)
    if due and last:
        await engine.stop()  # nothing more to train: the final evals get their servers alone
        _write_eval_step(ctx, step, await _run_evals(ctx, step, due, end=True))
    elif due:
        servers = _servers(ctx, end=False)
        ctx.running_eval = await PeriodicEval.start(
            engine, step, servers, lambda: _background_evals(ctx, step, due)
        )


def _write_step(ctx: LoopContext, step: int, batch: Any, metrics: dict[str, Any]) -> None:
    rows = [r for g in batch.groups for r in rollout_rows(step, "kept", None, g.samples)]
    for status in ("discarded", "cancelled"):
        for dropped in getattr(batch, status):
            rows += rollout_rows(step, status, dropped.reason, dropped.group.samples)
    write_rollouts(ctx.run, step, rows)
    ctx.run.append_metrics(metrics)
    if ctx.wandb is not None:
        ctx.wandb.log({k: v for k, v in metrics.items() if k != "step"}, step=step)
        ctx.wandb_step = max(ctx.wandb_step, step)
    ctx.console.step(metrics)
    log.info("step done", **{k: v for k, v in metrics.items() if not k.startswith("rollout/")})


def _write_eval_step(ctx: LoopContext, step: int, eval_results: dict[str, float]) -> None:
    """The metrics line of the evals of ``step`` (baseline, periodic or final): a line of its own.

    W&B cannot go back to an earlier step: a periodic eval that ends after later steps were
    logged goes to the latest one (its ``eval/step`` says which weights it measured).
    """
    if not eval_results:
        return
    metrics = {"step": step, "time": time.time(), **eval_results}
    ctx.run.append_metrics(metrics)
    if ctx.wandb is not None:
        ctx.wandb.log(eval_results, step=max(step, ctx.wandb_step))
        ctx.wandb_step = max(step, ctx.wandb_step)


async def save_checkpoint(ctx: LoopContext, step: int) -> None:
    """``step_<step>`` under the checkpoint root: every rank writes into one temporary folder, then
    the folder gets its ``meta.json`` (with the engine's state) and its name, then retention runs
    (layout and rules: ``_checkpoints``)."""
    import hashlib

    from telescope_cli import _checkpoints as ck

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
        "extra_state": {"engine": ctx.engine.state_dict()},
    }
    path = await asyncio.to_thread(ck.commit, tmp, step, meta)
    keep = {"keep_last": cfg.checkpoint_keep_last, "keep_every": cfg.checkpoint_keep_every}
    deleted = await asyncio.to_thread(ck.prune, ctx.checkpoint_root, current=step, **keep)
    log.info("checkpoint saved", step=step, path=str(path), deleted=[str(p) for p in deleted])
