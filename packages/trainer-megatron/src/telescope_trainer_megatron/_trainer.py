"""``MegatronTrainer``: the ``telescope_algos.backend.TrainerBackend`` protocol on megatron-core.

Setup (:func:`create_trainer`, the pieces in ``_setup``; megatron-core is the ``[megatron]`` extra,
and without it an ImportError names it): process group from the environment (gloo on CPU, NCCL on GPU),
the CPU shim where CUDA is absent, ``initialize_model_parallel`` (TP, PP, CP, EP; expert TP 1),
Python, NumPy and torch seeded with ``seed`` (default ``config.seed``) and megatron's RNG tracker
with ``seed + 100 · pipeline rank``, the GPTModel twin of the Hugging Face model filled with its
weights, Megatron's DDP wrapper (fp32 grad buffers, overlap, distributed optimizer as configured)
and Megatron's Adam with decoupled weight decay, like AdamW.

Optimizer, compared with the FSDP backend: the same betas (0.9, 0.999) and eps (1e-8) as
``torch.optim.AdamW``'s defaults, so one config gives the same Adam on both. Weight decay differs
on purpose: Megatron's convention skips norms and biases (1-D parameters), FSDP's AdamW decays
every parameter; with ``weight_decay > 0`` FSDP shrinks norm weights and biases by the factor
``1 − lr · weight_decay`` each step, and this backend does not.

Learning rate: the k-th ``train_step`` (k = 1, 2, ...) trains with ``learning_rate ·
lr_multiplier(k − 1)``, as FSDP's ``LambdaLR``: the argument is the trainer's own count of steps
done (``scheduler_step``, saved in checkpoints), not the ``step`` argument.

Frozen models (``frozen_models``: a teacher, a reference model): each is a GPTModel of its own
architecture in the same parallel layout, filled with its Hugging Face weights, without DDP, an
optimizer or gradients; at the start of an RL step a forward-only pass of each over the micro-batches
fills their ``teacher_logprobs`` / ``ref_logprobs`` on the last pipeline stage (temperature 1).

One ``train_step``: optionally a no-grad pass for the pre-update log-probabilities
(``ppo_clip_ref_logprobs: batch``); then the micro-batches are dealt round-robin into
``number_of_minibatches`` groups and each group is one optimizer step through Megatron's
forward-backward schedule (pipelined when PP > 1). Each micro-batch loss is
``telescope_algos.backend.micro_batch_loss`` (``compute_loss`` with ``num_tokens`` and ``num_samples`` =
the loss tokens and the samples of the whole group over every data-parallel rank, one all-gather),
with the config's ``LossOptions`` (``telescope_algos.backend.loss_options``: each field is the config field
of that name, the rule the FSDP backend uses too), so gradients are *summed* over
micro-batches and ranks (``calculate_per_token_loss``) and the result is the group's exact token
mean (or Dr. GRPO's ``token_sum_norm`` over the group's samples). The step is skipped when the
gradient norm is not finite; otherwise gradients are clipped to ``grad_clip`` (0: no clip).

Checkpoints (layout in ``_checkpoint``): ``save_checkpoint(directory)`` writes into exactly the
folder the caller made: ``layout.json`` and ``hf/`` from rank 0, and with the training state one
shard per rank; it returns the layout facts for the caller's ``meta.json``. A full
``load_checkpoint`` needs the same parallel layout; ``weights_only`` reads ``hf/`` under any layout.

Context parallelism (CP > 1; docs/algorithms.md#context-parallelism): every CP rank of a
data-parallel replica gets the same micro-batches; each row is padded to a multiple of 2·CP and the
model runs on this rank's zig-zag chunks (RoPE on their global positions, keys and values
all-gathered inside attention). The per-token log-probabilities and entropies are all-gathered back
to the full row, and every CP rank runs ``compute_loss`` on the *whole* row: sequence-level terms
(GSPO's ratio, sequence IS masking, Dr. GRPO's per-sample lengths) and every metric are exactly
those of CP = 1, while the gather's backward keeps each rank's own tokens, and Megatron's DDP sums
the gradients over data × context parallel ranks.

Expert parallelism (EP > 1): each MoE layer's routed experts are split over EP ranks (carved out
of the data-parallel ranks) and megatron-core's ``alltoall`` token dispatcher sends every token to
the rank of its experts and back; it takes a different token count from every rank, so packed
micro-batches need no common length (on the CPU it runs through ``_cpu_shim``). Every rank must run
the same number of micro-batches, which each step checks first.

Spans (``MegatronTrainer.timeline``, a ``telescope_algos.backend.Timeline``; the caller drains it): every
step is ``train_step`` with ``prepare`` (the count check, padding, the counts), ``teacher_logprobs`` /
``ref_logprobs`` (frozen models), ``old_logprobs``,
per group ``minibatch`` (label ``minibatch``) with the micro-batches of Megatron's schedule
(``_spans``: without pipeline parallelism ``microbatch`` holding ``forward``, ``loss`` and
``backward``; with it ``forward`` and ``loss`` alone), ``grad_sync`` (``finalize_model_grads``) and
``optimizer``; and ``metrics``. Checkpoints are ``checkpoint/save`` (``hf_save``, ``get_state_dict``,
``rng_state``, ``shard_save``, ``layout``, ``barrier``) and ``checkpoint/load`` (``shard_load``,
``set_state_dict``, ``rng_state``, ``barrier``; weights only: ``load_hf``, ``reload_model_params``,
``barrier``), and a weight export is ``hf_weights``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import numpy as np
import structlog
import torch
import torch.distributed as dist

from telescope_algos import MicroBatch, align_to_inputs, next_token_labels, pad_micro_batch
from telescope_algos.backend import (
    FROZEN_TEMPERATURE,
    StepCounts,
    StepLog,
    StepPlan,
    Timeline,
    TokenTrace,
    check_micro_batches,
    cu_seqlens,
    gather_replicated,
    loss_options,
    lr_schedule,
    micro_batch_loss,
    minibatch_groups,
    row_multiple,
    step_counts,
    with_frozen_logprobs,
    zigzag_indices,
)
from telescope_algos.backend import frozen_models as frozen_models_checked
from telescope_config import TelescopeConfig
from telescope_trainer_megatron import _checkpoint as ckpt
from telescope_trainer_megatron._arch import Architecture, padded_vocab_size
from telescope_trainer_megatron._cpu_shim import cuda_type_names, install_cpu_shim
from telescope_trainer_megatron._export import ExportPlan, export_plan, iter_hf_weights
from telescope_trainer_megatron._hf_io import save_hf_weights
from telescope_trainer_megatron._model import (
    build_gpt_model,
    load_hf_weights,
    local_to_global,
    transformer_config,
)
from telescope_trainer_megatron._requirements import require_megatron
from telescope_trainer_megatron._settings import (
    ParallelLayout,
    check_megatron_settings,
    params_dtype_name,
    te_available,
    torch_dtype,
)
from telescope_trainer_megatron._setup import (
    build_optimizer,
    init_distributed,
    init_model_parallel,
    seed_ranks,
    sequence_parallel,
    wrap_ddp,
)
from telescope_trainer_megatron._spans import MicroBatchSpans
from telescope_trainer_megatron._vocab_parallel import vocab_parallel_label_logprobs_and_entropy

__all__ = ["MegatronTrainer", "create_trainer"]

log = structlog.get_logger()


@dataclass
class _Batch:
    """One micro-batch ready for the model: the padded row on the device, this rank's share of it and
    the packed-sequence bounds."""

    row: MicroBatch
    """The whole row, padded to the trainer's ``row_multiple``, on the device."""
    packed: Any
    model_ids: torch.Tensor
    """This CP rank's tokens (its zig-zag chunks; the whole row when CP = 1), ``[1, L / CP]``."""
    model_positions: torch.Tensor
    labels: torch.Tensor
    """The next token after each of ``model_ids`` (0 after the row's last token), ``[1, L / CP]``."""
    old_logprobs: torch.Tensor | None = None
    index: int = 0
    """Its place among the step's micro-batches."""


@dataclass(frozen=True)
class _Frozen:
    """A frozen model beside the policy: its GPTModel (no DDP, no gradients) and true vocabulary size."""

    module: Any
    vocab_size: int


def create_trainer(
    config: TelescopeConfig, *, model_path: str | Path | None = None, seed: int | None = None, **options: Any
) -> MegatronTrainer:
    """Build the Megatron backend for ``config``, the run's validated ``TelescopeConfig`` (read as
    is, never validated again here).

    Args:
        model_path: local Hugging Face folder; defaults to ``config.model``.
        seed: seeds Python, NumPy and torch on every rank before the model is built, and megatron's
            RNG tracker with ``seed + 100 · pipeline rank``; defaults to ``config.seed``.
        options: ``params_dtype`` (overrides the config's: ``mixed_precision_dtype``, or
            ``model_dtype`` when that is null; bfloat16 by default, float32 for exact tests),
            ``adam_beta1`` (0.9), ``adam_beta2`` (0.999), ``adam_eps`` (1e-8): PyTorch AdamW's
            defaults, as the FSDP backend; ``init_timeout_s`` (600, process-group timeout);
            ``frozen_models``: ``{name: local folder}`` of the teacher and reference model held beside
            the policy (``telescope_algos.backend.FROZEN_MODELS``; module docstring).

    Raises:
        ImportError: megatron-core is missing (the message names the ``[megatron]`` extra).
        telescope_config.ConfigError: the settings cannot work with this model on this machine.
    """
    require_megatron()
    return MegatronTrainer(config, model_path=model_path, seed=seed, **options)


class MegatronTrainer:
    """The Megatron-core training backend (module docstring). Every method is collective."""

    def __init__(
        self,
        config: TelescopeConfig,
        *,
        model_path: str | Path | None = None,
        params_dtype: str | None = None,
        adam_beta1: float = 0.9,
        adam_beta2: float = 0.999,
        adam_eps: float = 1e-8,
        seed: int | None = None,
        init_timeout_s: float = 600.0,
        frozen_models: Mapping[str, str] | None = None,
    ) -> None:
        require_megatron()
        frozen_paths = frozen_models_checked(frozen_models)
        self.config = config
        self.seed = int(config.seed if seed is None else seed)
        self.model_path = Path(model_path or config.model)
        self.arch = Architecture.from_pretrained(self.model_path)
        self._owns_group = init_distributed(init_timeout_s)
        self._cpu = install_cpu_shim()
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        layout = ParallelLayout.from_config(config, self.world_size)
        check_megatron_settings(
            config, self.arch, layout, has_te=te_available(), has_cuda=torch.cuda.is_available()
        )
        self.layout = layout
        # Rows must be a multiple of this (sequence parallel over TP, 2·CP zig-zag chunks); the caller
        # pads to it (protocol), and _prepare pads any row that is not.
        self.row_multiple = row_multiple(context_parallel=layout.cp, tensor_parallel=layout.tp)
        self.shares_prompts = False  # Megatron's packed attention keeps every sample apart
        self.params_dtype = torch_dtype(params_dtype or params_dtype_name(config))
        self._closed = False
        self._plan: ExportPlan | None = None
        self._loss_options = loss_options(config)
        self._temperature = float(config.temperature)
        """The temperature of this step's logprobs (``StepPlan.temperature``)."""
        self._lr_multiplier = lr_schedule(config)  # a bad schedule fails here, with its message
        self.timeline = Timeline(self._device)
        """Spans of every step, checkpoint and weight export on this rank; the caller drains it."""
        self._tokens: list[dict[str, np.ndarray] | None] = []
        """The last step's token record (``step_tokens``)."""
        self._micro: MicroBatchSpans | None = None
        self._build(self.seed, (adam_beta1, adam_beta2), adam_eps)
        self.frozen = {name: self._build_frozen(Path(where)) for name, where in frozen_paths.items()}
        """The frozen models beside the policy (``frozen_models``), by name."""

    # ------------------------------------------------------------------ setup
    def _build(self, seed: int, betas: tuple[float, float], eps: float) -> None:
        """Parallel groups, seeds, the model with its weights, DDP and Adam (``_setup``)."""
        cfg, lo = self.config, self.layout
        init_model_parallel(lo)
        seed_ranks(seed)
        use_te = bool(cfg.megatron_use_transformer_engine)
        self.tf_config = transformer_config(
            self.arch,
            lo,
            params_dtype=self.params_dtype,
            sequence_parallel=sequence_parallel(cfg, lo),
            recompute=bool(cfg.megatron_gradient_checkpointing),
            fp8=bool(cfg.megatron_fp8),
            cpu=self._cpu,
        )
        self.padded_vocab = padded_vocab_size(self.arch.vocab_size, lo.tp)
        module = build_gpt_model(self.arch, self.tf_config, padded_vocab=self.padded_vocab, use_te=use_te)
        if torch.cuda.is_available():
            module.cuda(torch.cuda.current_device())
        load_hf_weights(module, self.arch, str(self.model_path), padded_vocab=self.padded_vocab)
        self.model = wrap_ddp(cfg, self.tf_config, module)
        self.tf_config.finalize_model_grads_func = self._timed_finalize(
            self.tf_config.finalize_model_grads_func
        )
        self.optimizer = build_optimizer(
            cfg, self.model, params_dtype=self.params_dtype, betas=betas, eps=eps
        )
        self._read_parallel_state()
        self.scheduler_step = 0
        self.skipped_steps_total = 0

    def _build_frozen(self, path: Path) -> _Frozen:
        """A frozen model in the policy's parallel layout (module docstring), built without drawing
        from the RNGs (the policy's training draws the same numbers with and without it)."""
        cfg, lo = self.config, self.layout
        arch = Architecture.from_pretrained(path)
        check_megatron_settings(cfg, arch, lo, has_te=te_available(), has_cuda=torch.cuda.is_available())
        tf_config = transformer_config(
            arch,
            lo,
            params_dtype=self.params_dtype,
            sequence_parallel=sequence_parallel(cfg, lo),
            recompute=False,
            fp8=False,
            cpu=self._cpu,
        )
        padded = padded_vocab_size(arch.vocab_size, lo.tp)
        state = ckpt.rng_state()
        try:
            module = build_gpt_model(
                arch, tf_config, padded_vocab=padded, use_te=bool(cfg.megatron_use_transformer_engine)
            )
        finally:
            ckpt.set_rng_state(state)
        if torch.cuda.is_available():
            module.cuda(torch.cuda.current_device())
        load_hf_weights(module, arch, str(path), padded_vocab=padded)
        module.requires_grad_(False)
        module.eval()
        return _Frozen(module, arch.vocab_size)

    def _read_parallel_state(self) -> None:
        """This rank's groups and coordinates, and the rank whose metrics every rank returns."""
        from megatron.core import parallel_state as ps

        self.tp_group = cast(dist.ProcessGroup, ps.get_tensor_model_parallel_group())
        self.cp_group = cast(dist.ProcessGroup, ps.get_context_parallel_group())
        self.cp_rank = cast(int, ps.get_context_parallel_rank())
        self.dp_group = cast(dist.ProcessGroup, ps.get_data_parallel_group())
        self.dp_rank = cast(int, ps.get_data_parallel_rank())
        self.dp_world_size = cast(int, ps.get_data_parallel_world_size())
        self._is_last_stage = cast(
            bool,
            ps.is_pipeline_last_stage(),  # pyright: ignore[reportUnknownMemberType] (untyped vp_stage)
        )
        self._coords = (
            cast(int, ps.get_tensor_model_parallel_rank()),
            cast(int, ps.get_pipeline_model_parallel_rank()),
            cast(int, ps.get_context_parallel_rank()),
            self.dp_rank,
        )
        src = torch.tensor(
            [self.rank if self._is_last_stage and self._coords[0] == 0 and self._coords[2:] == (0, 0) else -1]
        )
        dist.all_reduce(src, op=dist.ReduceOp.MAX)  # pyright: ignore[reportUnknownMemberType]
        self._metrics_src = int(src.item())

    # --------------------------------------------------------------- protocol
    @property
    def is_broadcast_rank(self) -> bool:
        """True on the rank with data, tensor, pipeline, context and expert coordinates all 0."""
        from megatron.core import parallel_state as ps

        return all(c == 0 for c in self._coords) and cast(int, ps.get_expert_model_parallel_rank()) == 0

    def train_step(
        self, micro_batches: Sequence[MicroBatch], *, step: int, objective: str = "rl"
    ) -> dict[str, float]:
        """One training step on this data-parallel rank's micro-batches; returns the step metrics.

        ``step`` (the caller's count) only labels logs and spans: the learning rate follows
        ``scheduler_step``. ``objective``: ``rl`` or ``sft`` (``telescope_algos.backend.StepPlan``).
        """
        plan = StepPlan.of(objective, self.config, self._loss_options)
        self._temperature = plan.temperature
        self.timeline.set_step(step)
        with self.timeline.span("train_step"):
            return self._train_step(micro_batches, step, plan)

    def _train_step(self, micro_batches: Sequence[MicroBatch], step: int, plan: StepPlan) -> dict[str, float]:
        tl = self.timeline
        log = StepLog(timeline=tl)
        with tl.span("prepare"):
            self._check_same_micro_batch_count(len(micro_batches))
            check_micro_batches(micro_batches)
            batches = [self._prepare(mb, i) for i, mb in enumerate(micro_batches)]
            trace = TokenTrace([len(mb) for mb in micro_batches]) if self._traces(plan) else None
            groups = minibatch_groups(len(batches), plan.minibatches)
            # each group's loss tokens and samples over the data-parallel ranks (CP ranks share theirs)
            counts = step_counts(micro_batches, groups, device=self._device, group=self.dp_group)
        if not plan.sft:
            self._frozen_logprobs(batches, log, trace)
        if plan.needs_old:
            with log.timed("old_logprobs"):
                for b, lp in zip(batches, self._forward_logprobs(batches), strict=True):
                    b.old_logprobs = lp
        lr = self._set_learning_rate()
        sums: dict[str, float] = {}
        for g, indices in enumerate(groups):
            with tl.span("minibatch", minibatch=g):
                with log.timed("forward_backward", span=False):
                    outputs = self._forward_backward(batches, indices, counts, g, plan, trace)
                with log.timed("optimizer"):
                    norm, applied = self._optimizer_step(step)
            log.update(norm, applied=applied)
            _accumulate(sums, outputs)
        self.scheduler_step += 1
        self.skipped_steps_total += log.skipped
        self._tokens = trace.rows() if trace is not None else []
        sums["num_samples"] = float(sum(mb.num_samples for mb in micro_batches))
        with tl.span("metrics"):
            metrics = self._reduce_metrics(sums, len(groups))
            metrics.update(
                log.metrics(learning_rate=lr, skipped_total=self.skipped_steps_total, device=self._device)
            )
            metrics.update(log.timing_metrics())
            box = [metrics]
            dist.broadcast_object_list(box, src=self._metrics_src)
        return box[0]

    def _frozen_logprobs(self, batches: list[_Batch], log: StepLog, trace: TokenTrace | None) -> None:
        """Each frozen model's logprobs of ``batches`` into their rows (the last pipeline stage), each
        model's pass its ``<name>_logprobs`` span; ``trace`` records them."""
        for name, frozen in self.frozen.items():
            with log.timed(f"{name}_logprobs"):
                found = self._forward_logprobs(
                    batches, model=frozen.module, vocab_size=frozen.vocab_size, temperature=FROZEN_TEMPERATURE
                )
            for b, lp in zip(batches, found, strict=True):
                if lp is not None:
                    b.row = with_frozen_logprobs(b.row, name, lp)
                    if trace is not None:
                        trace.add_frozen(b.index, name, lp)

    def _traces(self, plan: StepPlan) -> bool:
        """Whether this step's tokens are recorded (``record_tokens``; never for a supervised step)."""
        return bool(self.config.record_tokens) and not plan.sft

    def step_tokens(self) -> list[dict[str, np.ndarray] | None]:
        """What the loss of the last ``train_step`` did with each token (``TrainerBackend.step_tokens``);
        None for the micro-batches whose loss this rank did not compute (pipeline stages but the last)."""
        return list(self._tokens)

    def adapter_config(self) -> dict[str, Any] | None:
        """None: this backend trains the full model (LoRA is refused with Megatron by the config)."""
        return None

    def adapter_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        raise ValueError("the Megatron backend trains no LoRA adapter (lora_rank needs train_backend: fsdp)")

    def hf_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The full model in Hugging Face names, one parameter at a time (collective; every rank); the
        whole export, from the first tensor asked for to the last, is the span ``hf_weights``."""
        params = {self._global_names[n]: p for n, p in self.model.module.named_parameters()}
        if self._plan is None:
            self._plan = export_plan(params, self.arch, self.layout.tp)
        weights = iter_hf_weights(
            params,
            self._plan,
            self.arch,
            tp_group=self.tp_group,
            ddp_model=self.model,
            free_grad_buffers=bool(self.config.weight_broadcast_free_grad_buffers),
            cpu_staging=bool(self.config.weight_broadcast_cpu_staging),
            pin_memory=bool(self.config.weight_broadcast_pin_memory),
        )
        return self.timeline.span_iter("hf_weights", weights)

    def save_checkpoint(self, directory: str | Path, *, training_state: bool = True) -> dict[str, Any]:
        """Write this trainer into exactly ``directory`` (made, empty, by the caller); see ``_checkpoint``.

        Rank 0 writes ``layout.json`` and the ``hf/`` folder (always); with ``training_state`` every
        rank also writes its shard (model shard, optimizer, ``scheduler_step``,
        ``skipped_steps_total``, RNG states). Returns the layout facts, identical on every rank.
        """
        path = Path(directory)
        tl = self.timeline
        with tl.span("checkpoint/save"):
            self._raise_on_any_rank(
                None
                if path.is_dir()
                else f"checkpoint folder {path} does not exist (the caller makes it, empty)"
            )
            facts = {**self._layout_facts(), "training_state": bool(training_state)}
            with tl.span("hf_save"):
                weights = self.hf_weights()
                if self.rank == 0:
                    save_hf_weights(((n, t.clone()) for n, t in weights), path / ckpt.HF_DIR)
                    ckpt.copy_hf_meta(self.model_path, path / ckpt.HF_DIR)
                else:
                    for _ in weights:
                        pass
            if training_state:
                self._save_shard(path)
            if self.rank == 0:
                with tl.span("layout"):
                    ckpt.write_layout(path, facts)
            with tl.span("barrier"):
                dist.barrier()  # pyright: ignore[reportUnknownMemberType] (untyped device_ids)
        return facts

    def _save_shard(self, path: Path) -> None:
        """This rank's training state into ``shards/rank_R.pt`` (spans ``get_state_dict``,
        ``rng_state``, ``shard_save``)."""
        tl = self.timeline
        shard = ckpt.shard_path(path, self.rank)
        shard.parent.mkdir(parents=True, exist_ok=True)
        with tl.span("get_state_dict"):
            state = {
                "model": self.model.module.state_dict(),
                "optimizer": ckpt.optimizer_state(self.optimizer),
                "scheduler_step": self.scheduler_step,
                "skipped_steps_total": self.skipped_steps_total,
            }
        with tl.span("rng_state"):
            state["rng"] = ckpt.rng_state()
        with tl.span("shard_save"):
            torch.save(state, shard)

    def load_checkpoint(self, directory: str | Path, *, weights_only: bool = False) -> None:
        """Restore what :meth:`save_checkpoint` wrote into ``directory``.

        Full load: model, optimizer, ``scheduler_step``, ``skipped_steps_total`` and RNG states from
        this rank's shard; needs the same parallel layout and params dtype (clear error otherwise).
        ``weights_only``: the model alone, from ``hf/`` (any layout); optimizer moments, schedule,
        counters and RNG keep their current values (fp32 main parameters are refreshed from the model).
        """
        with self.timeline.span("checkpoint/load"):
            self._load_checkpoint(Path(directory), weights_only=weights_only)

    def _load_checkpoint(self, path: Path, *, weights_only: bool) -> None:
        tl = self.timeline
        saved = ckpt.read_layout(path)
        if weights_only:
            with tl.span("load_hf"), torch.no_grad():
                load_hf_weights(
                    self.model.module, self.arch, str(path / ckpt.HF_DIR), padded_vocab=self.padded_vocab
                )
            with tl.span("reload_model_params"), cuda_type_names():
                self.optimizer.reload_model_params()
            with tl.span("barrier"):
                dist.barrier()  # pyright: ignore[reportUnknownMemberType] (untyped device_ids)
            return
        if not saved.get("training_state", True):
            raise ValueError(
                f"checkpoint {path} was saved without the training state (training_state=False): it holds "
                "the model weights only; load it with weights_only=True"
            )
        diff = ckpt.layout_mismatch(saved, self._layout_facts())
        if diff:
            raise ValueError(
                f"checkpoint {path} was written with another layout {diff} (saved, now); resume with the "
                "same parallel sizes and params dtype, or load the weights alone (weights_only=True), or "
                f"start a new run with model: {path / ckpt.HF_DIR}"
            )
        with tl.span("shard_load"):
            state = torch.load(ckpt.shard_path(path, self.rank), map_location="cpu", weights_only=False)
        with tl.span("set_state_dict"):
            with torch.no_grad():
                self.model.module.load_state_dict(state["model"], strict=True)
            ckpt.set_optimizer_state(self.optimizer, state["optimizer"])
        self.scheduler_step = int(state["scheduler_step"])
        self.skipped_steps_total = int(state.get("skipped_steps_total", 0))
        with tl.span("rng_state"):
            ckpt.set_rng_state(state["rng"])
        with tl.span("barrier"):
            dist.barrier()  # pyright: ignore[reportUnknownMemberType] (untyped device_ids)

    def close(self) -> None:
        """Leave the model-parallel groups and, if this trainer created it, the process group."""
        if self._closed:
            return
        self._closed = True
        self.frozen = {}
        from megatron.core import parallel_state as ps

        ps.destroy_model_parallel()
        if self._owns_group and dist.is_initialized():
            dist.destroy_process_group()

    # --------------------------------------------------------------- internals
    @functools.cached_property
    def _global_names(self) -> dict[str, str]:
        return local_to_global(self.model.module)

    def _layout_facts(self) -> dict[str, Any]:
        """What a checkpoint records about this trainer (``layout.json`` and the caller's meta)."""
        lo = self.layout
        return {
            "backend": ckpt.BACKEND,
            "format": ckpt.FORMAT,
            "base_model": str(self.model_path),
            "vocab_size": self.arch.vocab_size,
            "padded_vocab_size": self.padded_vocab,
            "world_size": lo.world,
            "tp_size": lo.tp,
            "pp_size": lo.pp,
            "cp_size": lo.cp,
            "ep_size": lo.ep,
            "params_dtype": str(self.params_dtype).removeprefix("torch."),
        }

    def _raise_on_any_rank(self, problem: str | None) -> None:
        """Raise ``problem`` (the first rank's that has one) on every rank at once, as a
        ``FileNotFoundError`` (collective: no rank is left waiting in a later barrier)."""
        problems: list[str | None] = [None] * self.world_size
        dist.all_gather_object(problems, problem)  # pyright: ignore[reportUnknownMemberType]
        first = next((p for p in problems if p), None)
        if first:
            raise FileNotFoundError(first)

    def _check_same_micro_batch_count(self, count: int) -> None:
        """Every rank must run the same number of micro-batches (collective; raises on every rank).

        Each micro-batch is one forward/backward with collectives inside (the expert-parallel
        all-to-all in every MoE layer, pipeline sends) and each group of them ends in a gradient
        all-reduce: a rank with fewer would leave the others waiting until the timeout.
        """
        if self.world_size == 1:
            return
        bounds = torch.tensor([count, -count], dtype=torch.int64)
        dist.all_reduce(bounds, op=dist.ReduceOp.MAX)  # pyright: ignore[reportUnknownMemberType]
        most, fewest = int(bounds[0]), -int(bounds[1])
        if most != fewest:
            raise ValueError(
                f"data-parallel ranks got different numbers of micro-batches ({fewest} to {most}; this "
                f"rank {count}); every rank must run the same number. Pack the step with "
                f"telescope_algos.pack_samples(..., num_ranks={self.dp_world_size}), which pads the "
                "count with empty micro-batches"
            )

    @property
    def _device(self) -> torch.device:
        """Where this rank's tensors live (and its collectives run: NCCL on CUDA, gloo on the CPU)."""
        return (
            torch.device("cuda", torch.cuda.current_device())
            if torch.cuda.is_available()
            else torch.device("cpu")
        )

    def _prepare(self, mb: MicroBatch, index: int = 0) -> _Batch:
        from megatron.core.packed_seq_params import PackedSeqParams

        if mb.input_ids.dim() != 2 or mb.input_ids.shape[0] != 1:
            raise ValueError(f"a micro-batch must be one packed row [1, L], got {tuple(mb.input_ids.shape)}")
        dev = self._device
        row = pad_micro_batch(mb, self.row_multiple).to(dev)
        length = len(row)
        cu = torch.tensor(cu_seqlens(row.position_ids), dtype=torch.int32, device=dev)
        packed = PackedSeqParams(
            qkv_format="sbhd", cu_seqlens_q=cu, cu_seqlens_kv=cu, max_seqlen_q=length, max_seqlen_kv=length
        )
        labels = next_token_labels(row.input_ids)
        cp = self.layout.cp
        local = zigzag_indices(length, cp, self.cp_rank, dev) if cp > 1 else slice(None)
        return _Batch(
            row,
            packed,
            model_ids=row.input_ids[:, local],
            model_positions=row.position_ids[:, local],
            labels=labels[:, local],
            index=index,
        )

    def _logprobs(
        self,
        logits: torch.Tensor,
        batch: _Batch,
        *,
        vocab_size: int | None = None,
        temperature: float | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Full-row ``[1, L]`` log-probabilities and entropies in the ``telescope_algos`` layout, of the
        policy's logits (a frozen model's: its ``vocab_size``) at the step's temperature (or that given)."""
        lp, ent = vocab_parallel_label_logprobs_and_entropy(
            logits,
            batch.labels,
            vocab_size=self.arch.vocab_size if vocab_size is None else vocab_size,
            temperature=self._temperature if temperature is None else temperature,
            group=self.tp_group,
            chunk_size=self.config.entropy_chunk_size,
        )
        if self.layout.cp > 1:  # every CP rank computes the loss of the whole row (module docstring)
            lp, ent = gather_replicated(lp, 1, self.cp_group), gather_replicated(ent, 1, self.cp_group)
        return align_to_inputs(lp), align_to_inputs(ent)

    def _run_schedule(
        self,
        batches: list[_Batch],
        indices: Sequence[int],
        loss_func: Any,
        *,
        forward_only: bool,
        model: Any = None,
    ) -> list[Any]:
        """Megatron's forward-backward schedule over ``batches`` (the step's micro-batches ``indices``)
        through ``model`` (default: the policy), each micro-batch's forward and loss (and backward) a
        span (``_spans``)."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        spans = MicroBatchSpans(
            self.timeline, indices, backward=not forward_only, pipelined=self.layout.pp > 1
        )

        def timed_loss(b: _Batch, logits: torch.Tensor) -> Any:
            with spans.loss():
                return loss_func(b, logits)

        def forward_step(data_iterator: Iterator[_Batch], model: Any) -> tuple[torch.Tensor, Any]:
            b = next(data_iterator)
            with spans.forward():
                out = model(b.model_ids, b.model_positions, None, packed_seq_params=b.packed)
            return out, functools.partial(timed_loss, b)

        self._micro = spans
        try:
            schedule = cast(Callable[..., list[Any]], get_forward_backward_func())
            return schedule(
                forward_step_func=forward_step,
                data_iterator=iter(batches),
                model=[self.model if model is None else model],
                num_microbatches=len(batches),
                seq_length=max(b.model_ids.shape[1] for b in batches),
                micro_batch_size=1,
                forward_only=forward_only,
            )
        finally:
            spans.finish()
            self._micro = None

    def _timed_finalize(self, finalize: Any) -> Any:
        """Megatron's ``finalize_model_grads`` (the gradient reduction after the last backward) as the
        span ``grad_sync``, after the last micro-batch's spans."""
        if finalize is None:
            return None

        def finalize_with_span(*args: Any, **kwargs: Any) -> Any:
            if self._micro is not None:
                self._micro.finish()
            with self.timeline.span("grad_sync"):
                return finalize(*args, **kwargs)

        return finalize_with_span

    @torch.no_grad()
    def _forward_logprobs(
        self,
        batches: list[_Batch],
        *,
        model: Any = None,
        vocab_size: int | None = None,
        temperature: float | None = None,
    ) -> list[torch.Tensor | None]:
        """Log-probabilities of every micro-batch without gradients (last pipeline stage; None
        elsewhere): the policy's before the update, or a frozen ``model``'s (``_logprobs``' arguments)."""

        def loss_func(b: _Batch, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
            lp, _ = self._logprobs(logits, b, vocab_size=vocab_size, temperature=temperature)
            return logits.new_zeros(()), torch.tensor(0, dtype=torch.int), {"logprobs": lp.detach()}

        policy = model is None
        if policy:
            self.model.eval()
        try:
            out = self._run_schedule(batches, range(len(batches)), loss_func, forward_only=True, model=model)
        finally:
            if policy:
                self.model.train()
        return [o["logprobs"] for o in out] if self._is_last_stage else [None] * len(batches)

    def _forward_backward(
        self,
        batches: list[_Batch],
        indices: list[int],
        counts: StepCounts,
        index: int,
        plan: StepPlan,
        trace: TokenTrace | None = None,
    ) -> list[dict[str, torch.Tensor]]:
        """Forward and backward of minibatch group ``index`` (the micro-batches ``indices`` of
        ``batches``); ``counts`` are the totals over the DP ranks; ``trace`` gets each token's record."""

        def loss_func(b: _Batch, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, Any]]:
            lp, ent = self._logprobs(logits, b)
            loss, metrics = micro_batch_loss(
                b.row,
                lp,
                ent,
                old_logprobs=b.old_logprobs,
                counts=counts,
                group=index,
                max_len=self.config.max_tokens,
                options=plan.options,
                sft=plan.sft,
                trace=trace,
                index=b.index,
            )
            return loss, torch.tensor(b.row.num_tokens, dtype=torch.int), metrics

        self.model.zero_grad_buffer()
        self.optimizer.zero_grad()
        group = [batches[i] for i in indices]
        return self._run_schedule(group, indices, loss_func, forward_only=False)

    def _set_learning_rate(self) -> float:
        """The learning rate of this step (``scheduler_step`` done so far), set on every param group."""
        lr = _learning_rate(self.config, self.scheduler_step, self._lr_multiplier)
        for group in self.optimizer.param_groups:
            # Megatron's own scheduler applies these multipliers; without it, this is the place:
            # wd_mult is 0 for norms and biases (no weight decay there), lr_mult is 1.
            group["lr"] = lr * group.get("lr_mult", 1.0)
            group["weight_decay"] = self.config.weight_decay * group.get("wd_mult", 1.0)
        return lr

    @torch.no_grad()
    def _optimizer_step(self, step: int) -> tuple[float, bool]:
        """Clip and apply the update (spans ``grad_norm``, ``update``), or skip a non-finite one."""
        with self.timeline.span("grad_norm"):
            found_inf = self.optimizer.prepare_grads()
            norm = float(self.optimizer.get_grad_norm())
        with self.timeline.span("update"):
            if found_inf or not torch.isfinite(torch.tensor(norm)):
                log.warning("megatron.step_skipped", step=step, grad_norm=norm)
                self.optimizer.zero_grad()
                return norm, False
            if self.config.grad_clip > 0:
                with cuda_type_names():
                    self._clip(norm)
            return norm, bool(self.optimizer.step_with_ready_grads())

    def _clip(self, norm: float) -> None:
        from megatron.core.optimizer.clip_grads import clip_grad_by_total_norm_fp32

        for opt in getattr(self.optimizer, "chained_optimizers", [self.optimizer]):
            params = opt.get_parameters()
            if params:
                clip_grad_by_total_norm_fp32(
                    params,
                    max_norm=self.config.grad_clip,
                    total_norm=norm,
                    use_decoupled_grad=opt.config.use_precision_aware_optimizer_no_fp8_or_ds_fp8,
                )

    def _reduce_metrics(self, sums: dict[str, float], n_groups: int) -> dict[str, float]:
        """Token-weighted means over micro-batches and data-parallel ranks (last stage only)."""
        if not self._is_last_stage:
            return {}
        keys = sorted(sums)
        vec = torch.tensor([sums[k] for k in keys], dtype=torch.float64)
        dist.all_reduce(vec, group=self.dp_group)  # pyright: ignore[reportUnknownMemberType]
        values = cast(list[float], vec.tolist())  # pyright: ignore[reportUnknownMemberType]
        total = dict(zip(keys, values, strict=True))
        weight = max(total.get("num_tokens", 0.0), 1.0)
        out = {
            "loss": total.pop("loss", 0.0) / n_groups,
            "num_tokens": total.pop("num_tokens", 0.0),
            "num_samples": total.pop("num_samples", 0.0),
        }
        out.update({k: v / weight for k, v in total.items()})
        return out


def _learning_rate(
    config: TelescopeConfig, steps_done: int, multiplier: Callable[[int], float] | None = None
) -> float:
    """The learning rate of the train step after ``steps_done`` completed ones (k-th call: k − 1).

    As the FSDP backend's ``LambdaLR`` (built at construction, stepped after each train step);
    ``multiplier`` is ``lr_schedule(config)``, built once by the trainer.
    """
    return config.learning_rate * (multiplier or lr_schedule(config))(steps_done)


def _accumulate(sums: dict[str, float], outputs: list[dict[str, torch.Tensor]]) -> None:
    """Add micro-batch metrics: ``loss`` and ``num_tokens`` summed, the rest weighted by tokens."""
    for m in outputs:
        w = float(m["num_tokens"])
        for k, v in m.items():
            value = float(v)
            sums[k] = sums.get(k, 0.0) + (value if k in ("loss", "num_tokens") else value * w)
