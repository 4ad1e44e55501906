"""``FSDPTrainer``: the FSDP2 implementation of ``telescope_algos.backend.TrainerBackend``.

One train step (every rank, collectively; the shared pieces are ``telescope_algos``' train-step
helpers, the ones the Megatron backend uses too):

1. One all-gather of the micro-batch count and of the loss tokens / samples per minibatch group
   (``step_counts``), so each update is the exact token mean of its group over all ranks
   (docs/algorithms.md#normalisation).
2. With frozen models in the trainer (``frozen_models``: the teacher, the reference model; each
   loaded and sharded like the policy, without gradients), a no-grad pass of each over the
   micro-batches fills their ``teacher_logprobs`` / ``ref_logprobs`` (temperature 1). With LoRA, a
   reference model that is the policy's start is the policy's base: its pass runs on the policy with
   the adapters off (``_lora.adapters_off``), and no second copy of the base is loaded. With
   ``ppo_clip_ref_logprobs: batch`` and a ratio-based loss, a no-grad pass stores π_old.
3. Micro-batches are dealt round-robin into ``number_of_minibatches`` groups; per group:
   ``zero_grad`` → forward/backward each micro-batch (gradient reduce-scatter only on the last) →
   global grad norm, clipped to ``grad_clip`` (0: norm only) → AdamW step, **skipped** (and counted)
   when the norm is not finite.
4. The LR scheduler steps once; metrics are reduced over micro-batches and ranks (``_metrics``).

With ``fsdp_context_parallel_size`` > 1 each row is split over the context-parallel ranks of its
replica (``_context_parallel``); the counts and sums above then count each replica once.

Spans (``FSDPTrainer.timeline``, a ``telescope_algos.backend.Timeline``; the caller drains it): every
step is ``train_step`` with ``prepare`` (padding, the counts), ``teacher_logprobs`` / ``ref_logprobs``
and ``old_logprobs`` (a ``forward`` per micro-batch each), per group ``minibatch`` (label
``minibatch``) with per micro-batch ``microbatch`` (label ``microbatch``: its index in the step)
holding ``forward``, ``loss`` and ``backward``, then ``optimizer`` with ``grad_norm`` and ``update``;
and ``metrics`` (the reduction over ranks).
Checkpoints are ``checkpoint/save`` and ``checkpoint/load`` with their phases (``_state``), and a
weight export is ``hf_weights``, from the first tensor asked for to the last.
"""

from __future__ import annotations

import contextlib
import json
import math
import warnings
from collections.abc import Generator, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import numpy as np
import structlog
import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

from telescope_algos import MicroBatch, pad_micro_batch
from telescope_algos.backend import (
    FROZEN_TEMPERATURE,
    StepCounts,
    StepLog,
    StepPlan,
    Timeline,
    TokenTrace,
    check_micro_batches,
    loss_options,
    micro_batch_loss,
    minibatch_groups,
    rng_state,
    row_multiple,
    seed_everything,
    set_rng_state,
    step_counts,
    with_frozen_logprobs,
)
from telescope_algos.backend import frozen_models as frozen_models_checked
from telescope_trainer_fsdp import _checkpoint as ck
from telescope_trainer_fsdp import _export, _state, _step
from telescope_trainer_fsdp._context_parallel import (
    ATTENTION,
    CPLayout,
    cp_logprobs,
    make_layout,
    register_attention,
)
from telescope_trainer_fsdp._distributed import DistInfo, init_distributed
from telescope_trainer_fsdp._lora import (
    adapter_config,
    adapter_weights,
    adapters_off,
    lora_settings,
    merged_hf_weights,
)
from telescope_trainer_fsdp._metrics import StepMetrics
from telescope_trainer_fsdp._model import load_frozen_model, load_sharded_model
from telescope_trainer_fsdp._packed_attention import PACKED_SDPA
from telescope_trainer_fsdp._schedule import build_lr_scheduler

if TYPE_CHECKING:
    from telescope_config import TelescopeConfig

__all__ = ["FSDPTrainer", "create_trainer"]

_log = structlog.get_logger()


def _grad_norm(params: list[torch.nn.Parameter]) -> torch.Tensor:
    """Global L2 norm of the gradients (sharded DTensors are reduced over the mesh)."""
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.zeros(())
    norm = torch.nn.utils.get_total_norm(grads, norm_type=2.0, foreach=None)
    return norm.full_tensor() if isinstance(norm, DTensor) else norm


class FSDPTrainer:
    """A Hugging Face causal LM trained with FSDP2; build it with :func:`create_trainer`."""

    def __init__(
        self,
        config: TelescopeConfig,
        *,
        model_path: str,
        dist_info: DistInfo,
        model: torch.nn.Module,
        layout: CPLayout | None = None,
        frozen: Mapping[str, torch.nn.Module] | None = None,
    ) -> None:
        self.config = config
        self.model_path = model_path
        self._dist = dist_info
        self.rank = dist_info.rank
        self.world_size = dist_info.world_size
        self._cp = layout if layout is not None and layout.cp > 1 else None
        self.cp_size = self._cp.cp if self._cp else 1
        self.dp_rank = self._cp.dp_rank if self._cp else dist_info.rank
        self.dp_world_size = self._cp.dp_world_size if self._cp else dist_info.world_size
        self.device = dist_info.device
        self.model = model
        self.frozen = dict(frozen or {})
        """The frozen models beside the policy (``create_trainer``'s ``frozen_models``), by name."""
        self._params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer: torch.optim.Optimizer = torch.optim.AdamW(
            self._params, lr=config.learning_rate, weight_decay=config.weight_decay
        )
        self.scheduler = build_lr_scheduler(self.optimizer, config)
        self._loss_options = loss_options(config)
        self._temperature = float(config.temperature)
        """The temperature of this step's logprobs (``StepPlan.temperature``)."""
        self.row_multiple = row_multiple(context_parallel=self.cp_size)
        attention = getattr(getattr(model, "config", None), "_attn_implementation", None)
        self.shares_prompts = attention == PACKED_SDPA
        """Branches are honoured (only by the per-sample SDPA; see ``_packed_attention``)."""
        self.skipped_steps_total = 0
        self.steps_done = 0
        self.timeline = Timeline(self.device)
        """Spans of every step, checkpoint and weight export on this rank; the caller drains it."""
        self._tokens: list[dict[str, np.ndarray] | None] = []
        """The last step's token record (``step_tokens``)."""
        self._closed = False

    # -- protocol --------------------------------------------------------------------------------

    @property
    def is_broadcast_rank(self) -> bool:
        return self.rank == 0

    def train_step(
        self, micro_batches: Sequence[MicroBatch], *, step: int, objective: str = "rl"
    ) -> dict[str, float]:
        """One optimizer step (per minibatch group) on this rank's micro-batches; see the module docstring."""
        plan = StepPlan.of(objective, self.config, self._loss_options)
        self.timeline.set_step(step)
        with self.timeline.span("train_step"):
            return self._train_step(micro_batches, step, plan)

    def _train_step(self, micro_batches: Sequence[MicroBatch], step: int, plan: StepPlan) -> dict[str, float]:
        tl = self.timeline
        log = StepLog(timeline=tl)
        with tl.span("prepare"):
            check_micro_batches(micro_batches)
            mbs = [pad_micro_batch(mb, self.row_multiple).to(self.device) for mb in micro_batches]
            groups = minibatch_groups(len(mbs), plan.minibatches)
            counts = step_counts(mbs, groups, device=self.device, copies=self.cp_size)
        metrics = StepMetrics()
        self.model.train()
        self._temperature = plan.temperature
        recording = bool(self.config.record_tokens) and not plan.sft
        trace = TokenTrace([len(mb) for mb in micro_batches]) if recording else None
        if not plan.sft:
            mbs = self._frozen_logprobs(mbs, log, trace)
        old = self._old_logprobs(mbs, log) if plan.needs_old else [None] * len(mbs)
        lr = float(self.optimizer.param_groups[0]["lr"])
        for g, indices in enumerate(groups):
            with tl.span("minibatch", minibatch=g):
                self.optimizer.zero_grad(set_to_none=True)
                with log.timed("forward_backward", span=False):
                    for j, i in enumerate(indices):
                        last = j == len(indices) - 1
                        with tl.span("microbatch", microbatch=i):
                            self._forward_backward(
                                mbs[i], old[i], counts, g, metrics, plan, sync=last, trace=trace, index=i
                            )
                with log.timed("optimizer"):
                    self._optimizer_step(log, step)
        self._step_scheduler()
        self._tokens = trace.rows() if trace is not None else []
        self.skipped_steps_total += log.skipped
        self.steps_done += 1
        with tl.span("metrics"):
            for name, seconds in log.timing_metrics().items():
                metrics.set_rank_mean(name, seconds)
            out = metrics.reduce(device=self.device, copies=self.cp_size)
        group_losses = [out.pop(f"_group_loss/{g}") for g in range(len(groups))]
        out["loss"] = sum(group_losses) / len(group_losses)
        out["num_tokens"] = float(sum(counts.tokens))
        out["num_samples"] = float(sum(counts.samples))
        out.update(log.metrics(learning_rate=lr, skipped_total=self.skipped_steps_total, device=self.device))
        return out

    def hf_weights(self, *, dtype: torch.dtype | None = None) -> Iterator[tuple[str, torch.Tensor]]:
        """The model in Hugging Face names, one gathered parameter at a time (every rank must exhaust it);
        the whole export is the span ``hf_weights``."""
        lora = lora_settings(self.config)
        weights = (
            _export.iter_hf_weights(self.model, dtype=dtype)
            if lora is None
            else merged_hf_weights(self.model, lora, dtype=dtype)
        )
        return self.timeline.span_iter("hf_weights", weights)

    def step_tokens(self) -> list[dict[str, np.ndarray] | None]:
        """What the loss of the last ``train_step`` did with each token (``TrainerBackend.step_tokens``)."""
        return list(self._tokens)

    def adapter_config(self) -> dict[str, Any] | None:
        """The LoRA adapter's ``adapter_config.json`` (PEFT's), or None when the full model trains."""
        lora = lora_settings(self.config)
        return None if lora is None else adapter_config(lora, base=str(self.config.model))

    def adapter_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The LoRA adapter alone under PEFT's names, one gathered tensor at a time (every rank must
        exhaust it); the export is the span ``hf_weights``."""
        if lora_settings(self.config) is None:
            raise ValueError("adapter_weights: this run trains the full model (lora_rank is 0)")
        return self.timeline.span_iter("hf_weights", adapter_weights(self.model))

    def save_checkpoint(self, directory: str | Path, *, training_state: bool = True) -> dict[str, Any]:
        """Write this rank's part into exactly ``directory`` (layout: ``_checkpoint``); see the protocol."""
        with self.timeline.span("checkpoint/save"):
            _state.save_state(
                directory,
                model=self.model,
                optimizer=self.optimizer,
                trainer_state={
                    "scheduler": self.scheduler.state_dict(),
                    "skipped_steps_total": self.skipped_steps_total,
                    "steps_done": self.steps_done,
                },
                training_state=training_state,
                write_hf_meta=self._write_hf_meta,
                timeline=self.timeline,
            )
        lora = lora_settings(self.config)
        if lora is not None and self.rank == 0:
            (Path(directory) / ck.LORA_FILE).write_text(json.dumps(lora), encoding="utf-8")
        return {
            "backend": "fsdp",
            "world_size": self.world_size,
            "model_path": str(self.model_path),
            "model_dtype": self.config.model_dtype,
            **({"lora": lora} if lora is not None else {}),
        }

    def load_checkpoint(self, directory: str | Path, *, weights_only: bool = False) -> None:
        """Restore a folder written by :meth:`save_checkpoint` (any world size).

        ``weights_only`` restores the model alone; optimizer, scheduler, RNG and counters keep their
        current values.
        """
        with self.timeline.span("checkpoint/load"):
            trainer_state = _state.load_state(
                directory,
                model=self.model,
                optimizer=self.optimizer,
                weights_only=weights_only,
                timeline=self.timeline,
            )
        if trainer_state is not None:
            self.scheduler.load_state_dict(trainer_state["scheduler"])
            self.skipped_steps_total = int(trainer_state["skipped_steps_total"])
            self.steps_done = int(trainer_state["steps_done"])

    def close(self) -> None:
        """Drop the model and optimizer; destroy the process group if this trainer created it."""
        if self._closed:
            return
        self._closed = True
        del self.model, self.optimizer, self.scheduler
        self._params, self.frozen = [], {}
        if self._dist.owns_group and dist.is_initialized():
            dist.destroy_process_group()
        elif self._cp is not None and self._cp.group is not None and dist.is_initialized():
            dist.destroy_process_group(self._cp.group)  # the caller's world stays; our subgroup goes

    # -- internals -------------------------------------------------------------------------------

    def _old_logprobs(self, mbs: list[MicroBatch], log: StepLog) -> list[torch.Tensor | None]:
        """π_old of every micro-batch (without dropout), for a loss that needs it (``StepPlan.needs_old``)."""
        with log.timed("old_logprobs"), self._without_dropout():
            return [*self._no_grad_logprobs(mbs)]

    @contextlib.contextmanager
    def _without_dropout(self) -> Generator[None]:
        """The policy in eval mode inside, in train mode again on the way out."""
        self.model.eval()
        try:
            yield
        finally:
            self.model.train()

    def _frozen_logprobs(
        self, mbs: list[MicroBatch], log: StepLog, trace: TokenTrace | None
    ) -> list[MicroBatch]:
        """``mbs`` with each frozen model's logprobs of their tokens (its ``<name>_logprobs`` span, a
        ``forward`` per micro-batch); ``trace`` records them."""
        out = list(mbs)
        for name, model in self.frozen.items():
            with log.timed(f"{name}_logprobs"):
                if model is self.model:  # the LoRA policy's base (create_trainer)
                    found = self._base_logprobs(out)
                else:
                    found = self._no_grad_logprobs(out, model=model, temperature=FROZEN_TEMPERATURE)
                    # FSDP2 keeps the root's parameters gathered after a forward, for the backward
                    # that a frozen model never runs: free them now, or its unsharded head stays
                    cast(FSDPModule, model).reshard()
            for i, lp in enumerate(found):
                out[i] = with_frozen_logprobs(out[i], name, lp)
                if trace is not None:
                    trace.add_frozen(i, name, lp)
        return out

    def _base_logprobs(self, mbs: list[MicroBatch]) -> list[torch.Tensor]:
        """The LoRA policy's base model's logprobs (adapters off, no dropout) at temperature 1."""
        with self._without_dropout(), adapters_off(self.model):
            return self._no_grad_logprobs(mbs, temperature=FROZEN_TEMPERATURE)

    def _no_grad_logprobs(
        self, mbs: list[MicroBatch], *, model: torch.nn.Module | None = None, temperature: float | None = None
    ) -> list[torch.Tensor]:
        """Every micro-batch's logprobs without gradients, a ``forward`` span each (``_logprobs``'
        arguments: the policy at the step's temperature by default)."""
        out: list[torch.Tensor] = []
        with torch.no_grad():
            for i, mb in enumerate(mbs):
                with self.timeline.span("forward", microbatch=i):
                    out.append(self._logprobs(mb, model=model, temperature=temperature)[0].detach())
        return out

    def _forward_backward(
        self,
        mb: MicroBatch,
        old: torch.Tensor | None,
        counts: StepCounts,
        group: int,
        metrics: StepMetrics,
        plan: StepPlan,
        *,
        sync: bool,
        trace: TokenTrace | None = None,
        index: int = 0,
    ) -> None:
        """Forward and backward of one micro-batch of minibatch group ``group`` (gradients are
        reduce-scattered with ``sync``, the group's last); ``trace`` gets its tokens' record as the
        step's micro-batch ``index``."""
        tl = self.timeline
        cast(FSDPModule, self.model).set_requires_gradient_sync(sync)
        with tl.span("forward"):
            logprobs, entropy = self._logprobs(mb)
        with tl.span("loss"):
            loss, mb_metrics = micro_batch_loss(
                mb,
                logprobs,
                entropy,
                old_logprobs=old,
                counts=counts,
                group=group,
                max_len=self.config.max_tokens,
                options=plan.options,
                sft=plan.sft,
                trace=trace,
                index=index,
            )
        # FSDP averages gradients over ranks; the loss is already the replica's share of the
        # sum, and context-parallel ranks each hold the part of the gradient through their tokens.
        with tl.span("backward"):  # the group's last micro-batch also reduce-scatters the gradients
            cast(Any, loss * self.world_size).backward()  # torch leaves backward's parameters unannotated
        metrics.add_micro_batch(mb_metrics, input_tokens=mb.num_tokens)
        metrics.add_sum(f"_group_loss/{group}", float(mb_metrics["loss"]))

    def _optimizer_step(self, log: StepLog, step: int) -> None:
        """Clip and apply this group's update, or skip it when the gradient norm is not finite."""
        with self.timeline.span("grad_norm"):
            norm = _grad_norm(self._params)
            value = float(norm)
        finite = math.isfinite(value)
        with self.timeline.span("update"):
            if finite:
                if self.config.grad_clip > 0:
                    torch.nn.utils.clip_grads_with_norm_(self._params, self.config.grad_clip, norm)
                self.optimizer.step()
            else:
                _log.warning("non-finite gradient norm: optimizer update skipped", step=step, norm=value)
            self.optimizer.zero_grad(set_to_none=True)
        log.update(value, applied=finite)

    def _step_scheduler(self) -> None:
        with warnings.catch_warnings():
            # After a skipped update torch warns that the scheduler stepped before the optimizer.
            warnings.filterwarnings(
                "ignore", "Detected call of `lr_scheduler.step\\(\\)` before", UserWarning
            )
            self.scheduler.step()

    def _logprobs(
        self, mb: MicroBatch, *, model: torch.nn.Module | None = None, temperature: float | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(logprobs, entropy)`` of ``mb`` under ``model`` (default: the policy) at ``temperature``
        (default: the step's)."""
        net = self.model if model is None else model
        temp = self._temperature if temperature is None else temperature
        chunk = self.config.entropy_chunk_size
        if self._cp:
            return cp_logprobs(net, mb, self._cp, device=self.device, temperature=temp, chunk_size=chunk)
        return _step.forward_logprobs(net, mb, device=self.device, temperature=temp, chunk_size=chunk)

    def _write_hf_meta(self, out: Path) -> None:
        from transformers import AutoConfig, AutoTokenizer, GenerationConfig

        out.mkdir(parents=True, exist_ok=True)
        # transformers leaves their **kwargs (and the tokenizer's type) unannotated
        cast(Any, AutoConfig).from_pretrained(self.model_path).save_pretrained(out)
        with contextlib.suppress(OSError):  # models without a generation config
            cast(Any, GenerationConfig).from_pretrained(self.model_path).save_pretrained(out)
        try:
            cast(Any, AutoTokenizer).from_pretrained(self.model_path).save_pretrained(out)
        except (OSError, ValueError) as exc:
            _log.warning("no tokenizer saved with the checkpoint", model=self.model_path, error=str(exc))


def create_trainer(
    config: TelescopeConfig,
    *,
    model_path: str | None = None,
    device: str | torch.device | None = None,
    gradient_checkpointing: bool | None = None,
    attn_implementation: str | None = None,
    seed: int | None = None,
    trust_remote_code: bool = False,
    dist_timeout_s: float = 1800.0,
    frozen_models: Mapping[str, str] | None = None,
) -> FSDPTrainer:
    """Build the FSDP2 trainer from a ``TelescopeConfig`` (collective: every rank calls it).

    Args:
        config: the run's validated ``TelescopeConfig`` (read as is; never validated again here).
        model_path: overrides ``config.model`` (e.g. a local folder).
        device: ``"cpu"`` or ``"cuda"``; default CUDA when available.
        gradient_checkpointing: recompute activations in backward (default the config's field).
        attn_implementation: force a transformers attention implementation (default: flash-attn on GPU
            when installed, else SDPA; on CPU the per-sample SDPA of ``_packed_attention``; all isolate
            packed samples). Context parallelism uses its own ``telescope_cp``: this must stay None.
        seed: seeds Python, NumPy and torch on every rank before the model loads (default ``config.seed``).
        trust_remote_code: passed to transformers.
        dist_timeout_s: collective timeout when this call creates the process group.
        frozen_models: ``{name: folder}`` of the teacher and reference model held beside the policy
            (``telescope_algos.backend.FROZEN_MODELS``), sharded like it (``_model.load_frozen_model``).
    """
    frozen_paths, cp = frozen_models_checked(frozen_models), config.fsdp_context_parallel_size
    _check_attention(cp, attn_implementation)
    info = init_distributed(device=device, timeout_s=dist_timeout_s)
    try:
        _check_world(config, info)
        layout = make_layout(cp)
        attn_implementation = _attention(cp, attn_implementation)
        seed_everything(int(config.seed if seed is None else seed))
        path = model_path or config.model
        recompute = (
            config.fsdp_gradient_checkpointing if gradient_checkpointing is None else gradient_checkpointing
        )
        model = load_sharded_model(
            path,
            device=info.device,
            model_dtype=config.model_dtype,
            mixed_precision_dtype=config.mixed_precision_dtype,
            gradient_checkpointing=recompute,
            attn_implementation=attn_implementation,
            trust_remote_code=trust_remote_code,
            lora=lora_settings(config),
        )
        frozen = _frozen_models(
            config, frozen_paths, (path, model), info, attn_implementation, trust_remote_code
        )
    except BaseException:
        if info.owns_group and dist.is_initialized():
            dist.destroy_process_group()
        raise
    _log.debug("fsdp trainer ready", model=path, rank=info.rank, world_size=info.world_size)
    return FSDPTrainer(config, model_path=path, dist_info=info, model=model, layout=layout, frozen=frozen)


def _check_attention(cp: int, attn_implementation: str | None) -> None:
    """Context parallelism runs its own attention: another one asked for is an error."""
    if cp > 1 and attn_implementation not in (None, ATTENTION):
        raise ValueError(
            f"attn_implementation={attn_implementation!r} cannot be combined with fsdp_context_parallel_size "
            f"{cp}: context parallelism uses its own attention; leave attn_implementation unset"
        )


def _attention(cp: int, attn_implementation: str | None) -> str | None:
    """The attention to load the models with: context parallelism's own (registered now), or as given."""
    if cp > 1:
        register_attention()
        return ATTENTION
    return attn_implementation


def _frozen_models(
    config: TelescopeConfig,
    paths: Mapping[str, str],
    policy: tuple[str, torch.nn.Module],
    info: DistInfo,
    attention: str | None,
    trust_remote_code: bool,
) -> dict[str, torch.nn.Module]:
    """The frozen models by name: each loaded (``_frozen``), but for the reference model at the
    start of a LoRA policy, which is the policy's own frozen base: the policy itself stands for it,
    and its pass runs with the adapters off (``FSDPTrainer._base_logprobs``)."""
    path, model = policy
    lora = lora_settings(config) is not None
    out: dict[str, torch.nn.Module] = {}
    for name, where in paths.items():
        base = lora and name == "ref" and where == path
        out[name] = model if base else _frozen(config, where, info, attention, trust_remote_code)
    return out


def _frozen(
    config: TelescopeConfig, path: str, info: DistInfo, attention: str | None, trust_remote_code: bool
) -> torch.nn.Module:
    """One frozen model, loaded without drawing from the RNGs (the policy's training draws the same
    numbers with and without it)."""
    state = rng_state()
    try:
        return load_frozen_model(
            path,
            device=info.device,
            model_dtype=config.model_dtype,
            mixed_precision_dtype=config.mixed_precision_dtype,
            attn_implementation=attention,
            trust_remote_code=trust_remote_code,
        )
    finally:
        set_rng_state(state)


def _check_world(config: TelescopeConfig, info: DistInfo) -> None:
    if info.world_size != config.trainer_num_workers:
        raise ValueError(
            f"trainer_num_workers is {config.trainer_num_workers} but the torch.distributed world has "
            f"{info.world_size} ranks; start that many trainer processes or set trainer_num_workers: "
            f"{info.world_size}"
        )
