"""Cross-field rules: combinations of individually valid values that cannot run.

Each rule names the fields it reads, so ``load_config`` can still run the rules whose fields
all validated when other fields failed, and report everything in one pass. A rule yields
``Violation``s; ``adjustments`` holds the rules that repair instead of failing (REINFORCE++ needs
batch normalisation, on-policy distillation learns from groups whose rewards are all equal; each is
switched with a warning). The Megatron rules apply only
with ``train_backend: megatron`` and need nothing but the config; the checks that need the
model's ``config.json`` (heads, layers, experts) or the machine (CUDA, Transformer Engine) run
when the Megatron trainer is created. ``NO_EFFECT`` lists fields that are accepted, so that
upstream Telescope's configs load, but do nothing here. docs/config.md gives each rule's reason.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import structlog

if TYPE_CHECKING:
    from telescope_config._schema import TelescopeConfig

__all__ = ["RULE_FIELDS", "Adjustment", "Violation", "adjustments", "check"]

_log = structlog.get_logger(__name__)


@dataclass(frozen=True)
class Violation:
    """A broken rule, reported against its main ``field``."""

    field: str
    value: object
    rule: str
    fix: str


@dataclass(frozen=True)
class Adjustment:
    """A value the rules changed, with the note that explains why."""

    field: str
    value: object
    note: str


_Rule = Callable[["TelescopeConfig"], Iterator[Violation]]
_RULES: list[tuple[frozenset[str], _Rule]] = []


_TIMELINE = "upstream Telescope's live timeline UI is not part of it"
NO_EFFECT: dict[str, str] = {
    **dict.fromkeys(
        (
            "torch_memory_sample_interval_seconds",
            "event_tail_window_seconds",
            "event_block_duration_seconds",
            "metrics_logger_interval_seconds",
            "ray_torch_memory_drain_interval_seconds",
            "rollout_block_size",
            "enable_vllm_tracing",
            "otlp_receiver_port",
        ),
        _TIMELINE,
    ),
    "wandb_upload_logs_detailed": "the driver keeps one log, with debug lines when debug is true, "
    "and wandb_upload_logs uploads it",
}
"""Fields accepted so that upstream Telescope's configs load, and why they do nothing here. Most
feed upstream's live timeline (its Telescope UI, through W&B); Telescope records metrics.jsonl,
Parquet rollouts and W&B metrics instead."""


def no_effect_notes(
    cfg: TelescopeConfig, user_keys: frozenset[str], defaults: Mapping[str, object]
) -> list[str]:
    """A note (also logged as a warning) for each :data:`NO_EFFECT` field the user set to something
    other than its default."""
    notes = [
        f"{name} has no effect in Telescope ({NO_EFFECT[name]}); it is accepted so that "
        "upstream Telescope's configs load"
        for name in sorted(NO_EFFECT.keys() & user_keys)
        if getattr(cfg, name) != defaults.get(name)
    ]
    for note in notes:
        _log.warning(note)
    return notes


def _rule(*fields: str) -> Callable[[_Rule], _Rule]:
    def register(fn: _Rule) -> _Rule:
        _RULES.append((frozenset(fields), fn))
        return fn

    return register


def check(cfg: TelescopeConfig, skip: frozenset[str] = frozenset()) -> list[Violation]:
    """Every violation of every rule that reads none of the ``skip`` fields."""
    return [v for fields, rule in _RULES if not fields & skip for v in rule(cfg)]


def adjustments(cfg: TelescopeConfig) -> list[Adjustment]:
    """The values to change before checking; each change is logged as a warning."""
    found: list[Adjustment] = []
    if cfg.algorithm == "reinforce_pp" and cfg.advantage_norm == "group":
        found.append(
            Adjustment(
                "advantage_norm",
                "batch",
                "advantage_norm switched from 'group' to 'batch': REINFORCE++ (algorithm reinforce_pp) "
                "normalises advantages over the whole batch. Set advantage_norm: batch to silence this.",
            )
        )
    if cfg.algorithm == "opd" and cfg.discard_group_zero_advantage:
        found.append(
            Adjustment(
                "discard_group_zero_advantage",
                False,
                "discard_group_zero_advantage switched to false: on-policy distillation (algorithm opd) "
                "learns from every sampled token's teacher logprob, also in groups whose rewards are all "
                "equal. Set discard_group_zero_advantage: false to silence this.",
            )
        )
    for adj in found:
        _log.warning(adj.note, field=adj.field, new_value=adj.value)
    return found


@_rule("algorithm", "teacher_model")
def _opd_and_its_teacher(c: TelescopeConfig) -> Iterator[Violation]:
    if c.algorithm == "opd" and c.teacher_model is None:
        yield Violation(
            "teacher_model",
            c.teacher_model,
            "algorithm opd distils from a teacher, and teacher_model is null",
            "set teacher_model to a Hugging Face model id or a local folder that shares the model's "
            "tokenizer",
        )
    if c.algorithm != "opd" and c.teacher_model is not None:
        yield Violation(
            "teacher_model",
            c.teacher_model,
            f"a teacher is read only by algorithm opd (this run's algorithm is {c.algorithm})",
            "set algorithm: opd to distil from it, or teacher_model: null",
        )


@_rule("sft_steps", "sft_dataset", "number_of_steps")
def _sft_steps_need_conversations(c: TelescopeConfig) -> Iterator[Violation]:
    if c.sft_steps and c.sft_dataset is None:
        yield Violation(
            "sft_dataset",
            c.sft_dataset,
            f"sft_steps is {c.sft_steps} and there is no sft_dataset to train on",
            "set sft_dataset to a .jsonl/.parquet file of conversations (rows with `messages`) or a "
            "Hugging Face dataset id, or sft_steps: 0",
        )
    if c.sft_steps > c.number_of_steps:
        yield Violation(
            "sft_steps",
            c.sft_steps,
            f"sft_steps ({c.sft_steps}) are counted in number_of_steps ({c.number_of_steps}), which is fewer",
            f"set number_of_steps to at least {c.sft_steps} (the RL steps follow the supervised ones)",
        )


@_rule("teacher_num_workers", "teacher_tensor_parallel_size", "teacher_placement")
def _whole_teacher_servers(c: TelescopeConfig) -> Iterator[Violation]:
    if c.teacher_placement == "servers" and c.teacher_num_workers % c.teacher_tensor_parallel_size:
        yield Violation(
            "teacher_num_workers",
            c.teacher_num_workers,
            f"teacher_num_workers must be a multiple of teacher_tensor_parallel_size "
            f"({c.teacher_tensor_parallel_size}) so that every teacher server gets the same number of GPUs",
            f"use a multiple of {c.teacher_tensor_parallel_size} for teacher_num_workers",
        )


@_rule("ref_num_workers", "inference_tensor_parallel_size", "ref_kl_coef", "ref_model", "ref_placement")
def _whole_reference_servers(c: TelescopeConfig) -> Iterator[Violation]:
    served = c.uses_reference and c.ref_placement == "servers"
    if served and c.ref_num_workers % c.inference_tensor_parallel_size:
        yield Violation(
            "ref_num_workers",
            c.ref_num_workers,
            f"reference servers take inference_tensor_parallel_size ({c.inference_tensor_parallel_size}) "
            "GPUs each, and ref_num_workers is not a multiple of it",
            f"use a multiple of {c.inference_tensor_parallel_size} for ref_num_workers",
        )


@_rule("environments")
def _needs_an_environment(c: TelescopeConfig) -> Iterator[Violation]:
    if not c.environments:
        yield Violation(
            "environments",
            c.environments,
            "a run needs at least one training environment",
            "add one to the run YAML, e.g. environments: [{name: countdown}], or pass "
            '--environments \'[{"name": "countdown"}]\'',
        )


@_rule("use_tis", "use_ppo_clip", "ppo_clip_ref_logprobs")
def _no_double_importance_correction(c: TelescopeConfig) -> Iterator[Violation]:
    if c.use_tis and c.use_ppo_clip and c.ppo_clip_ref_logprobs == "rollout":
        yield Violation(
            "ppo_clip_ref_logprobs",
            c.ppo_clip_ref_logprobs,
            "with use_tis and use_ppo_clip both true, a PPO ratio against the rollout logprobs corrects for "
            "the sampler twice",
            "set ppo_clip_ref_logprobs: batch, or turn off use_tis or use_ppo_clip",
        )


@_rule("use_ppo_clip", "algorithm")
def _ppo_clip_only_for_plain_objectives(c: TelescopeConfig) -> Iterator[Violation]:
    if c.use_ppo_clip and c.algorithm in ("cispo", "gspo", "sapo"):
        yield Violation(
            "use_ppo_clip",
            c.use_ppo_clip,
            f"algorithm {c.algorithm} bounds its update on its own and cannot take PPO clipping on top",
            "set use_ppo_clip: false, or choose algorithm grpo, rloo, reinforce_pp or dr_grpo",
        )


@_rule("clip_ratio_c", "use_ppo_clip", "algorithm")
def _dual_clip_needs_a_clipped_objective(c: TelescopeConfig) -> Iterator[Violation]:
    if c.clip_ratio_c is not None and not (c.use_ppo_clip or c.algorithm in ("cispo", "gspo")):
        yield Violation(
            "clip_ratio_c",
            c.clip_ratio_c,
            f"dual clipping applies only with use_ppo_clip or algorithm cispo or gspo (algorithm is "
            f"{c.algorithm}, use_ppo_clip is false)",
            "set clip_ratio_c: null, or use_ppo_clip: true",
        )


@_rule("advantage_norm", "algorithm")
def _group_norm_for_group_baselines(c: TelescopeConfig) -> Iterator[Violation]:
    if c.advantage_norm == "batch" and c.algorithm in ("rloo", "dr_grpo"):
        yield Violation(
            "advantage_norm",
            c.advantage_norm,
            f"algorithm {c.algorithm} defines its advantages within each prompt group",
            "set advantage_norm: group",
        )


@_rule("inference_num_workers", "inference_tensor_parallel_size")
def _whole_inference_servers(c: TelescopeConfig) -> Iterator[Violation]:
    if c.inference_num_workers % c.inference_tensor_parallel_size:
        yield Violation(
            "inference_num_workers",
            c.inference_num_workers,
            f"inference_num_workers must be a multiple of inference_tensor_parallel_size "
            f"({c.inference_tensor_parallel_size}) so that every vLLM server gets the same number of GPUs",
            f"use a multiple of {c.inference_tensor_parallel_size} for inference_num_workers, or change "
            "inference_tensor_parallel_size",
        )


@_rule("lora_rank", "train_backend")
def _lora_needs_fsdp(c: TelescopeConfig) -> Iterator[Violation]:
    if c.lora_rank and c.train_backend != "fsdp":
        yield Violation(
            "lora_rank",
            c.lora_rank,
            f"LoRA is trained with train_backend fsdp only; this run has train_backend {c.train_backend!r} "
            "(Megatron adapters are not supported yet)",
            "set train_backend: fsdp, or lora_rank: 0 to train the whole model with Megatron",
        )


@_rule("lora_target_modules")
def _lora_targets_are_names(c: TelescopeConfig) -> Iterator[Violation]:
    bad = [m for m in c.lora_target_modules if not m.strip() or any(ch in m for ch in " */[]")]
    if bad:
        yield Violation(
            "lora_target_modules",
            c.lora_target_modules,
            f"each target is the name of a linear layer (the end of its module name); {bad} is not",
            "list layer names such as q_proj, v_proj, down_proj",
        )


@_rule("fsdp_context_parallel_size", "train_backend", "seq_len", "trainer_num_workers")
def _fsdp_context_parallel(c: TelescopeConfig) -> Iterator[Violation]:
    cp = c.fsdp_context_parallel_size
    if cp <= 1:
        return
    if c.train_backend != "fsdp":
        yield Violation(
            "fsdp_context_parallel_size",
            cp,
            f"FSDP context parallelism needs train_backend fsdp (it is {c.train_backend})",
            "set fsdp_context_parallel_size: 1, or train_backend: fsdp",
        )
    if c.seq_len % (2 * cp):
        yield Violation(
            "seq_len",
            c.seq_len,
            f"with fsdp_context_parallel_size {cp}, seq_len must be divisible by {2 * cp} "
            "(two chunks per rank)",
            f"use a multiple of {2 * cp}, e.g. seq_len: {(c.seq_len // (2 * cp) + 1) * 2 * cp}",
        )
    if c.train_backend == "fsdp" and c.trainer_num_workers % cp:
        yield Violation(
            "trainer_num_workers",
            c.trainer_num_workers,
            f"with fsdp_context_parallel_size {cp}, trainer_num_workers must be a multiple of {cp} "
            "(each data-parallel replica is that many ranks)",
            f"use a multiple of {cp} for trainer_num_workers, or lower fsdp_context_parallel_size",
        )


@_rule("max_tokens", "max_model_len")
def _room_for_a_prompt(c: TelescopeConfig) -> Iterator[Violation]:
    if c.max_tokens >= c.max_model_len:
        yield Violation(
            "max_tokens",
            c.max_tokens,
            f"max_tokens must be smaller than max_model_len ({c.max_model_len}) to leave room for the prompt",
            f"lower max_tokens below {c.max_model_len} or raise max_model_len",
        )


@_rule("evals", "max_model_len")
def _eval_room_for_a_prompt(c: TelescopeConfig) -> Iterator[Violation]:
    for i, ev in enumerate(c.evals):
        if ev.max_tokens is not None and ev.max_tokens >= c.max_model_len:
            yield Violation(
                f"evals[{i}].max_tokens",
                ev.max_tokens,
                f"an eval's max_tokens must be smaller than max_model_len ({c.max_model_len}) to leave room "
                "for the prompt",
                f"lower evals[{i}].max_tokens below {c.max_model_len}, or remove it to use max_tokens",
            )


@_rule("seq_len", "max_model_len")
def _micro_batch_holds_a_sample(c: TelescopeConfig) -> Iterator[Violation]:
    if c.seq_len < c.max_model_len:
        yield Violation(
            "seq_len",
            c.seq_len,
            f"seq_len must be at least max_model_len ({c.max_model_len}) so a full-length sample fits in "
            "a micro-batch instead of being truncated",
            f"set seq_len: {c.max_model_len} or more, or lower max_model_len",
        )


@_rule("evals", "eval_num_servers", "inference_num_workers", "inference_tensor_parallel_size")
def _training_keeps_a_server(c: TelescopeConfig) -> Iterator[Violation]:
    servers = c.num_inference_servers
    if c.evals and c.eval_num_servers >= servers:
        yield Violation(
            "eval_num_servers",
            c.eval_num_servers,
            f"periodic evals would take all {servers} inference server(s) and leave none for training",
            f"set eval_num_servers below {servers} (0 disables periodic evals), or add inference workers",
        )


_MEGATRON_SIZES = (
    "megatron_tensor_parallel_size",
    "megatron_pipeline_parallel_size",
    "megatron_context_parallel_size",
)
_OPTIMIZER_DTYPES = (
    "megatron_main_grads_dtype",
    "megatron_main_params_dtype",
    "megatron_exp_avg_dtype",
    "megatron_exp_avg_sq_dtype",
)


@_rule("train_backend", "trainer_num_workers", *_MEGATRON_SIZES)
def _megatron_whole_model_replicas(c: TelescopeConfig) -> Iterator[Violation]:
    tp, pp, cp = (
        c.megatron_tensor_parallel_size,
        c.megatron_pipeline_parallel_size,
        c.megatron_context_parallel_size,
    )
    replica = tp * pp * cp
    if c.train_backend == "megatron" and c.trainer_num_workers % replica:
        yield Violation(
            "trainer_num_workers",
            c.trainer_num_workers,
            f"with Megatron, trainer_num_workers must be a multiple of tensor x pipeline x context parallel "
            f"size ({tp} x {pp} x {cp} = {replica}) so that every model replica is complete",
            f"use a multiple of {replica} for trainer_num_workers, or lower the megatron_*_parallel_size "
            "values",
        )


@_rule(
    "train_backend", "trainer_num_workers", "megatron_pipeline_parallel_size", "megatron_expert_parallel_size"
)
def _megatron_expert_groups(c: TelescopeConfig) -> Iterator[Violation]:
    ep, pp = c.megatron_expert_parallel_size, c.megatron_pipeline_parallel_size
    if c.train_backend != "megatron" or ep <= 1 or c.trainer_num_workers % pp:
        return
    stage = c.trainer_num_workers // pp
    if stage % ep:
        yield Violation(
            "megatron_expert_parallel_size",
            ep,
            f"megatron_expert_parallel_size must divide the ranks of one pipeline stage (trainer_num_workers "
            f"/ megatron_pipeline_parallel_size = {stage})",
            f"use a divisor of {stage} for megatron_expert_parallel_size, or change trainer_num_workers",
        )


@_rule("train_backend", "megatron_context_parallel_size", "megatron_use_transformer_engine")
def _megatron_context_parallel_without_te(c: TelescopeConfig) -> Iterator[Violation]:
    # The backend does CP in its own packed attention on the local layers (it pads every row to a
    # multiple of 2 x CP itself, so seq_len needs no rule); TE's CP attention is not wired.
    cp = c.megatron_context_parallel_size
    if c.train_backend == "megatron" and cp > 1 and c.megatron_use_transformer_engine:
        yield Violation(
            "megatron_context_parallel_size",
            cp,
            "Megatron context parallelism runs in the backend's own packed attention on the local layers; "
            "Transformer Engine's context-parallel attention is not wired, and "
            "megatron_use_transformer_engine is true",
            "set megatron_use_transformer_engine: false (and megatron_fp8: false), or "
            "megatron_context_parallel_size: 1",
        )


@_rule("train_backend", "model_dtype", "mixed_precision_dtype")
def _megatron_no_float16(c: TelescopeConfig) -> Iterator[Violation]:
    if c.train_backend != "megatron":
        return
    field = "mixed_precision_dtype" if c.mixed_precision_dtype is not None else "model_dtype"
    if getattr(c, field) == "float16":
        yield Violation(
            field,
            "float16",
            "the Megatron backend computes in mixed_precision_dtype (or model_dtype when it is null) and "
            "supports bfloat16 and float32 only: float16 would need loss scaling, which it does not do",
            f"set {field}: bfloat16",
        )


@_rule("train_backend", "megatron_fp8", "megatron_use_transformer_engine")
def _megatron_fp8_needs_te(c: TelescopeConfig) -> Iterator[Violation]:
    if c.train_backend == "megatron" and c.megatron_fp8 and not c.megatron_use_transformer_engine:
        yield Violation(
            "megatron_fp8",
            True,
            "FP8 matrix multiplies come from Transformer Engine layers, and megatron_use_transformer_engine "
            "is false",
            "set megatron_use_transformer_engine: true (transformer-engine installed, Hopper or newer GPU), "
            "or megatron_fp8: false",
        )


@_rule(
    "train_backend",
    "megatron_use_distributed_optimizer",
    "megatron_use_precision_aware_optimizer",
    "megatron_optimizer_cpu_offload",
)
def _megatron_needs_distributed_optimizer(c: TelescopeConfig) -> Iterator[Violation]:
    if c.train_backend != "megatron" or c.megatron_use_distributed_optimizer:
        return
    for field in ("megatron_use_precision_aware_optimizer", "megatron_optimizer_cpu_offload"):
        if getattr(c, field):
            yield Violation(
                field,
                True,
                f"{field} works only with Megatron's distributed optimizer, and "
                "megatron_use_distributed_optimizer is false",
                f"set megatron_use_distributed_optimizer: true, or {field}: false",
            )


@_rule("train_backend", "megatron_use_precision_aware_optimizer", *_OPTIMIZER_DTYPES)
def _megatron_dtypes_need_precision_aware(c: TelescopeConfig) -> Iterator[Violation]:
    if c.train_backend != "megatron" or c.megatron_use_precision_aware_optimizer:
        return
    for field in _OPTIMIZER_DTYPES:
        value = getattr(c, field)
        if value != "float32":
            yield Violation(
                field,
                value,
                f"{field} takes effect only with the precision-aware optimizer, and "
                "megatron_use_precision_aware_optimizer is false (the setting would be ignored)",
                f"set megatron_use_precision_aware_optimizer: true, or {field}: float32",
            )


@_rule("interleaved_rollouts")
def _interleaved_only(c: TelescopeConfig) -> Iterator[Violation]:
    if not c.interleaved_rollouts:
        yield Violation(
            "interleaved_rollouts",
            False,
            "Telescope always reuses the exact token ids of earlier turns; re-rendering the "
            "conversation each turn (a non-interleaved mode) can train on tokens the model never "
            "generated",
            "remove interleaved_rollouts or set it to true",
        )


RULE_FIELDS: frozenset[str] = frozenset[str]().union(*(fields for fields, _ in _RULES))
