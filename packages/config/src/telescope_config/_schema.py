"""The run configuration schema: one flat ``TelescopeConfig`` (its list entries are in ``_entries``).

Every top-level field is required and has no Python default: the packaged ``defaults.yaml`` is
the one source of default values, and ``load_config`` layers the user's file and flags over it.
Each field carries its type, its range and a description (unit, range, why); the YAML comments
of ``defaults.yaml`` are rendered from these descriptions. Cross-field rules live in
``_rules``; the model's validator runs them so that a directly built config is checked too.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, ValidationInfo, model_validator

from telescope_config import _rules
from telescope_config._entries import EnvironmentEntry, EvalEntry
from telescope_config._errors import rule_error

__all__ = ["SKIP_RULES", "TelescopeConfig", "num_inference_servers"]

# Context key that makes ``model_validate`` skip the cross-field rules: ``load_config`` runs
# them itself so it can report them next to field errors.
SKIP_RULES = "telescope_skip_rules"


def _checkpoint_every(value: object) -> object:
    if value is True:
        raise rule_error(
            "true is ambiguous for a checkpoint interval",
            "use an integer N to save every N steps, e.g. 1 for every step; false or 0 disables checkpoints",
        )
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if value is False or (isinstance(value, int) and value >= 0):
        return value
    raise rule_error(
        "must be false, 0 or a whole number of steps >= 1",
        "e.g. checkpoint_every: 100 saves every 100 steps and at the last step; false disables checkpoints",
    )


def _resume_from_checkpoint(value: object) -> object:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or (isinstance(value, int) and value >= 1):
        return value
    raise rule_error(
        "must be true, false or a checkpoint step >= 1",
        "true resumes from the latest checkpoint, an integer N from step_N, false starts fresh",
    )


Dtype = Literal["float32", "float16", "bfloat16"]
PlacementStrategy = Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"]
Algorithm = Literal["grpo", "rloo", "reinforce_pp", "dr_grpo", "cispo", "gspo", "sapo", "opd"]
KlEstimator = Literal["k2", "k3"]
FrozenPlacement = Literal["servers", "trainer"]
CheckpointEvery = Annotated[Annotated[int, Field(ge=0)] | Literal[False], BeforeValidator(_checkpoint_every)]
ResumeFrom = Annotated[bool | Annotated[int, Field(ge=1)], BeforeValidator(_resume_from_checkpoint)]


def num_inference_servers(cfg: TelescopeConfig) -> int:
    """How many vLLM servers a run starts: inference GPUs divided by GPUs per server."""
    return cfg.inference_num_workers // cfg.inference_tensor_parallel_size


_NO_EFFECT = "No effect in Telescope (a setting of upstream Telescope's live timeline UI). "


class TelescopeConfig(BaseModel):
    """Every setting of a training run, flat; defaults come from the packaged ``defaults.yaml``."""

    model_config = ConfigDict(extra="forbid", frozen=True, title="Telescope run configuration")

    # General and model
    debug: bool = Field(
        description="Debug mode, the same as `telescope train --debug`: the driver's log "
        "(logs/telescope.jsonl) at DEBUG level, Ray workers' output forwarded to the console when "
        "ray_log_to_driver is true, and the traceback of an internal error instead of a one-line "
        "message. The ray, vllm, httpx, urllib3 and filelock loggers stay at WARNING; vLLM servers and "
        "trainer ranks log to their own files in logs/ either way."
    )
    model: str = Field(
        min_length=1,
        description="Model to train: a Hugging Face hub id or a local directory. The trainer, the vLLM "
        "servers and the tokenizer all load it.",
    )
    model_dtype: Dtype = Field(
        description="Dtype of the master weights the trainer keeps and updates; float32 keeps optimizer "
        "updates exact. FSDP loads the model in it. Megatron's optimizer always keeps float32 master "
        "weights (or megatron_main_params_dtype with the precision-aware optimizer), so with Megatron "
        "model_dtype only sets the compute dtype when mixed_precision_dtype is null."
    )
    mixed_precision_dtype: Dtype | None = Field(
        description="Compute dtype of the parameters in forward and backward; gradients are still reduced in"
        " float32. FSDP casts the model_dtype weights to it; Megatron holds its parameters in it (the "
        "default bfloat16 is Megatron's usual setup). null turns mixed precision off and computes in "
        "model_dtype. Megatron takes bfloat16 or float32, not float16."
    )

    # Ray
    ray_address: str = Field(
        description="Ray cluster to join: 'auto' looks for a running cluster, 'host:port' names one, an "
        "empty string always starts a local head."
    )
    ray_auto_start_local: bool = Field(
        description="When ray_address is 'auto' and no cluster is running, start a local Ray head instead "
        "of failing."
    )
    ray_namespace: str = Field(
        min_length=1,
        description="Ray namespace of the run's actors; distinct namespaces keep concurrent runs on one "
        "cluster apart.",
    )
    ray_log_to_driver: bool = Field(
        description="Forward Ray worker logs to the driver console. Only honoured when debug is true, to "
        "keep the console readable."
    )
    ray_runtime_env: dict[str, Any] | None = Field(
        description="Extra Ray runtime_env (env_vars, working_dir, ...) merged over the built-in one; null "
        "adds nothing. A local working_dir is uploaded without the run and checkpoint directories (added "
        "to its excludes). One entry can be set from the command line: "
        "--ray_runtime_env.env_vars.NAME value."
    )
    ray_disable_runtime_env_hook: bool = Field(
        description="Unset RAY_RUNTIME_ENV_HOOK before starting Ray, so workers reuse the driver's "
        "environment instead of each building a uv environment."
    )
    ray_pin_py_executable: bool = Field(
        description="Run Ray workers with the driver's Python interpreter, so both sides import the same "
        "packages."
    )
    ray_propagate_active_venv: bool = Field(
        description="Pass VIRTUAL_ENV and UV_PROJECT_ENVIRONMENT to the workers so they use the driver's "
        "virtual environment."
    )
    ray_propagate_run_dir: bool = Field(
        description="Pass TELESCOPE_RUN_DIR to the workers so every process writes into the same run "
        "directory (matters on a joined cluster: a local Ray's workers inherit it from the driver)."
    )
    ray_broadcast_init_timeout_s: int = Field(
        ge=1,
        description="Seconds (>= 1) to wait for the weight-broadcast group of trainer rank 0 and every vLLM"
        " server to form.",
    )
    ray_broadcast_prefer_loopback_if_single_node: bool = Field(
        description="On a single node, bootstrap the broadcast group over 127.0.0.1 rather than the node's "
        "address; avoids firewall and network-interface surprises."
    )
    ray_shutdown_on_exit: bool = Field(
        description="Also call ray.shutdown() at the end of a run that joined a running Ray cluster: it "
        "disconnects the driver, and the cluster keeps running either way (stop it with `ray stop`). "
        "The end of every run stops its actors and removes its placement groups, and a Ray that the run "
        "started itself is always shut down."
    )
    ray_inference_cpus_per_worker: float = Field(
        ge=0, description="CPUs (>= 0) reserved next to each inference GPU in the Ray placement group."
    )
    ray_trainer_cpus_per_worker: float = Field(
        ge=0,
        description="CPUs (>= 0) of each trainer rank's Ray bundle (the trainer placement group has one "
        "bundle per rank) and of the rank's actor; a Ray that the run starts itself gets at least the "
        "sum of all bundles plus one CPU. On a CPU run with a Ray it started itself, telescope train "
        "splits the node's cores instead: half to the vLLM servers, the rest shared by the trainer "
        "ranks as their OMP_NUM_THREADS (unless OMP_NUM_THREADS is set where it starts); otherwise Ray "
        "sets a rank's OMP_NUM_THREADS to this number rounded down (at least 1). Batches are packed in "
        "the driver, not on these CPUs.",
    )
    ray_inference_placement_strategy: PlacementStrategy = Field(
        description="Ray placement strategy of the inference GPUs: PACK fills one node before the next, "
        "SPREAD spreads over nodes, the STRICT_ variants fail rather than deviate."
    )
    ray_trainer_placement_strategy: PlacementStrategy = Field(
        description="Ray placement strategy of the trainer GPUs; same choices as for inference."
    )
    ray_placement_timeout_s: int = Field(
        ge=1,
        description="Seconds (>= 1) to wait for the GPUs to be reserved and for the vLLM servers to start. "
        "Raise it for large models that load slowly.",
    )

    # Workers
    inference_num_workers: int = Field(
        ge=1,
        description="GPUs given to vLLM inference, >= 1. They form inference_num_workers / "
        "inference_tensor_parallel_size servers.",
    )
    inference_tensor_parallel_size: int = Field(
        ge=1,
        description="GPUs per vLLM server (tensor parallelism), >= 1; must divide inference_num_workers. "
        "Raise it when the model does not fit on one GPU.",
    )
    trainer_num_workers: int = Field(
        ge=1,
        description="GPUs (ranks) of the trainer, >= 1; with train_backend megatron a multiple of "
        "megatron_tensor_parallel_size x megatron_pipeline_parallel_size x megatron_context_parallel_size.",
    )
    trainer_max_restarts: int = Field(
        ge=0,
        description="Restarts of the trainer ranks in a run, >= 0. When a rank dies, every rank is stopped "
        "and placed again, loads the last checkpoint and trains again on the batches of the steps since "
        "(kept in the driver's memory): the run goes on where it was, no step recorded twice. Needs "
        "checkpoint_every and checkpoint_save_training_state; without them, or past this many restarts, "
        "the run stops with a message. 0: a dead rank stops the run. New in Telescope.",
    )

    # Environments
    environments: list[EnvironmentEntry] = Field(
        description="Training environments, sampled by weight. Each entry has name (a registered "
        "environment), weight (> 0, default 1.0), reward_min and reward_max (only scale the UI "
        "charts) and kwargs (passed to the environment). A run needs at least one."
    )

    # Orchestrator
    max_concurrent_prompts_per_server: int = Field(
        ge=1,
        description="Prompt groups in flight per vLLM server, >= 1; a server has this times group_size lane"
        " slots. More keeps GPUs busier; fewer keeps samples fresher.",
    )
    prompts_batch_size_for_trainer: int = Field(
        ge=1,
        description="Prompt groups per training step, >= 1; a step trains on this times group_size "
        "completions.",
    )
    number_of_steps: int = Field(ge=1, description="Training steps of the run, >= 1.")
    seed: int = Field(
        ge=0,
        description="Seeds the prompt sampler, the vLLM servers (--seed) and the trainer ranks (Python, "
        "NumPy, torch RNGs before the model loads); the same seed gives the same first update. An "
        "integer >= 0. New in Telescope: upstream Telescope has no seed (its sampler is unseeded).",
    )
    max_async_rollout: int = Field(
        ge=0,
        description="Training steps inference may run ahead of the trainer, >= 0. 0 is fully synchronous "
        "(on-policy); more overlaps generation with training but trains on older samples.",
    )
    discard_group_zero_advantage: bool = Field(
        description="Drop a group whose completions all got the same reward: every advantage is zero, so it"
        " carries no learning signal."
    )
    enable_prompt_prefetch: bool = Field(
        description="Format prompts (chat template, tokenization) in the background so lanes never wait for"
        " them."
    )
    prompt_prefetch_buffer_size: int = Field(
        ge=0, description="Prompts the prefetcher keeps ready, >= 0; 0 disables the buffer."
    )
    max_consecutive_unfit_prompts: int = Field(
        ge=1,
        description="Consecutive prompts of one environment that do not fit max_model_len (prompt tokens "
        ">= max_model_len) after which the run stops with the environment's name and the longest prompt; "
        ">= 1. Such prompts are dropped (reason prompt_too_long) and one that fits resets the count. "
        "Before any server starts, the first this-many prompts of each dataset are checked the same way. "
        "New in Telescope (upstream Telescope drew unfit prompts forever).",
    )
    max_zero_advantage_batches: int = Field(
        ge=0,
        description="With discard_group_zero_advantage, the run stops (exit 1, naming the rewards seen "
        "per environment and the fixes) once this many batches' worth of groups (times "
        "prompts_batch_size_for_trainer) in a row were dropped for zero advantage with no group kept in "
        "between: a reward that never varies within a group (a parser that never matches, a task far "
        "too hard or too easy). An environment alone in that state is named in a warning. >= 0; 0 "
        "generates forever. New in Telescope (upstream Telescope waited silently; verl's DAPO filter "
        "stops after max_num_gen_batches).",
    )
    enable_individual_sample_lanes: bool = Field(
        description="Give each completion its own lane slot instead of one slot per group, so a finished "
        "completion frees capacity without waiting for its siblings."
    )
    max_off_policy_steps: int = Field(
        ge=-1,
        description="Cancel a group once an in-flight sample of it has seen more than this many weight "
        "updates; -1 never cancels. Bounds how stale a sample can get.",
    )
    free_lane_after_generation: bool = Field(
        description="Release a lane as soon as generation ends, before the reward is computed; helps when "
        "rewards are slow (sandboxes). Needs enable_individual_sample_lanes."
    )
    eager_prepare_resources: bool = Field(
        description="Call prepare_resources() on every environment before the rollout loop starts, e.g. to "
        "warm a sandbox pool before the first request."
    )

    # Trainer
    learning_rate: float = Field(
        gt=0,
        description="Peak learning rate of the Adam optimizer, > 0. RL fine-tuning of LLMs uses small "
        "values, about 1e-7 to 1e-5.",
    )
    weight_decay: float = Field(ge=0, description="Decoupled (AdamW) weight decay, >= 0; 0 disables it.")
    grad_clip: float = Field(
        ge=0,
        description="Largest global gradient norm, >= 0; larger gradients are scaled down to it. 0 disables"
        " clipping.",
    )
    lr_scheduler: Literal["none", "constant", "linear", "cosine"] = Field(
        description="Learning-rate schedule: none (fixed), constant (warmup, then flat), linear or cosine "
        "(warmup, then decay to min_lr_ratio times learning_rate at the last step)."
    )
    warmup_steps: int = Field(
        ge=0,
        description="Steps of linear warmup from 0 to learning_rate, >= 0; 0 starts at the peak. The none "
        "schedule ignores it.",
    )
    min_lr_ratio: float = Field(
        ge=0,
        le=1,
        description="Final learning rate of the linear and cosine schedules as a fraction of learning_rate,"
        " in [0, 1].",
    )
    train_backend: Literal["fsdp", "megatron"] = Field(
        description="Trainer implementation: fsdp (PyTorch FSDP2, any Hugging Face model) or megatron "
        "(Megatron-core, with tensor, pipeline and expert parallelism for large and MoE "
        "models)."
    )
    fsdp_context_parallel_size: int = Field(
        ge=1,
        description="FSDP context parallelism, >= 1: each packed row is split over this many trainer ranks"
        " (keys and values all-gathered; exact, GSPO included), for rows too long for one GPU. 1 "
        "disables it; more needs train_backend fsdp, seq_len divisible by twice this value and "
        "trainer_num_workers a multiple of it.",
    )
    fsdp_gradient_checkpointing: bool = Field(
        description="FSDP: recompute each decoder layer's activations in the backward pass instead of "
        "storing them: much less activation memory for more compute (measured on CPU for a 135M model: "
        "about twice the step time). Keep it on for large models and long rows; the CPU quickstart "
        "turns it off.",
    )
    lora_rank: int = Field(
        ge=0,
        le=512,
        description="LoRA (PEFT's r), in [0, 512]: train low-rank adapters of this rank on the frozen base "
        "model instead of every weight (optimizer state for the adapters only); the inference servers load "
        "each new adapter in place (512 is the largest rank vLLM serves). 0 (the default) trains the whole "
        "model. Needs train_backend fsdp. New in Telescope.",
    )
    lora_alpha: float = Field(
        gt=0,
        description="LoRA scaling numerator (PEFT's lora_alpha), > 0: an adapter adds "
        "(lora_alpha / lora_rank) x B A to its layer's weight.",
    )
    lora_dropout: float = Field(
        ge=0,
        lt=1,
        description="Dropout on the adapters' input during training (PEFT's lora_dropout), in [0, 1). Keep 0 "
        "for RL: with dropout the trainer's logprobs differ from the inference servers' by design.",
    )
    lora_target_modules: list[str] = Field(
        min_length=1,
        description="Names of the linear layers that get adapters (PEFT's target_modules, matched against "
        "the end of each module's name); the default covers the attention and MLP projections of "
        "Llama-, Qwen- and Mistral-style models.",
    )

    # Megatron
    megatron_tensor_parallel_size: int = Field(
        ge=1, description="Megatron tensor parallelism, >= 1: splits each layer's matrices over GPUs."
    )
    megatron_pipeline_parallel_size: int = Field(
        ge=1, description="Megatron pipeline parallelism, >= 1: splits the layers into stages."
    )
    megatron_context_parallel_size: int = Field(
        ge=1,
        description="Megatron context parallelism, >= 1: splits each packed micro-batch row over this many "
        "GPUs along the sequence (load-balanced zig-zag chunks, keys and values all-gathered in attention). "
        "Needs megatron_use_transformer_engine false; rows are padded to a multiple of twice this value.",
    )
    megatron_expert_parallel_size: int = Field(
        ge=1,
        description="Megatron expert parallelism for mixture-of-experts models, >= 1; must divide the "
        "number of experts and trainer_num_workers / megatron_pipeline_parallel_size.",
    )
    megatron_global_batch_size: int | None = Field(
        ge=1,
        description="Accepted for compatibility and not used: the batch is prompts_batch_size_for_trainer "
        "times group_size. null or an integer >= 1.",
    )
    megatron_disable_unified_memory_jit: bool = Field(
        description="No effect in Telescope (kept so that upstream Telescope's configs load): "
        "megatron-core 0.16 builds its unified-memory extension only when its inference engine asks for "
        "a memory pool, which training never does, so there is no build to skip."
    )
    megatron_optimizer_cpu_offload: bool = Field(
        description="Keep the optimizer state in CPU memory and step it there: frees GPU memory, costs speed."
    )
    megatron_optimizer_offload_fraction: float = Field(
        ge=0,
        le=1,
        description="Fraction of the optimizer state moved to the CPU when megatron_optimizer_cpu_offload "
        "is on, in [0, 1].",
    )
    megatron_overlap_cpu_optimizer_d2h_h2d: bool = Field(
        description="Overlap the GPU-to-CPU and CPU-to-GPU copies of the offloaded optimizer with compute."
    )
    megatron_use_precision_aware_optimizer: bool = Field(
        description="Use Megatron's precision-aware optimizer, which can hold main parameters, gradients "
        "and Adam moments in the dtypes below."
    )
    megatron_main_grads_dtype: Dtype = Field(
        description="Dtype of the main gradients with the precision-aware optimizer."
    )
    megatron_main_params_dtype: Dtype = Field(
        description="Dtype of the main (master) parameters with the precision-aware optimizer."
    )
    megatron_exp_avg_dtype: Dtype = Field(
        description="Dtype of Adam's first moment with the precision-aware optimizer."
    )
    megatron_exp_avg_sq_dtype: Dtype = Field(
        description="Dtype of Adam's second moment with the precision-aware optimizer."
    )
    megatron_grad_reduce_in_fp32: bool = Field(
        description="Keep the data-parallel gradient buffer and its all-reduce in float32; false halves "
        "that buffer (bfloat16) at some cost in precision."
    )
    megatron_gradient_checkpointing: bool = Field(
        description="Recompute activations in the backward pass instead of storing them: much less "
        "activation memory for roughly a third more compute."
    )
    megatron_sequence_parallel: bool = Field(
        description="Shard LayerNorm and dropout activations along the sequence over the tensor-parallel "
        "group; only has an effect when megatron_tensor_parallel_size > 1."
    )
    megatron_use_distributed_optimizer: bool = Field(
        description="Shard the optimizer state over data-parallel ranks (ZeRO-1); saves memory when there "
        "is more than one data-parallel rank."
    )
    megatron_overlap_grad_reduce: bool = Field(
        description="Overlap the gradient all-reduce with the backward pass."
    )
    megatron_use_transformer_engine: bool = Field(
        description="Build the layers from NVIDIA Transformer Engine (fused attention, FP8-capable); needed"
        " for megatron_fp8, not available with megatron_context_parallel_size > 1."
    )
    megatron_fp8: bool = Field(
        description="Run matrix multiplies in FP8; needs megatron_use_transformer_engine and a Hopper or "
        "newer GPU."
    )

    # Algorithm and loss
    algorithm: Algorithm = Field(
        description="Policy-gradient objective: grpo; rloo (leave-one-out baseline); reinforce_pp "
        "(REINFORCE++, batch-normalised advantages); dr_grpo (no std division, no length bias);"
        " cispo (clipped importance weights); gspo (sequence-level ratio); sapo (soft gate "
        "instead of a hard clip); opd (on-policy distillation: each sampled token's advantage is the "
        "teacher's logprob minus the sampler's, see teacher_model)."
    )
    number_of_minibatches: int = Field(
        ge=1,
        description="Optimizer steps per training step, >= 1: the batch is split into this many "
        "minibatches. With more than 1 the later minibatches are off-policy; pair it with "
        "use_ppo_clip.",
    )
    use_ppo_clip: bool = Field(
        description="Replace the plain policy-gradient term by PPO's clipped surrogate, which keeps the "
        "ratio within [1 - clip_low, 1 + clip_high]. Not for cispo, gspo or sapo, which bound "
        "the update themselves."
    )
    ppo_clip_ref_logprobs: Literal["rollout", "batch"] = Field(
        description="Denominator of the PPO ratio: rollout takes the logprobs vLLM returned; batch "
        "recomputes them with the trainer before the first update (one more forward pass, no "
        "sampler/learner mismatch)."
    )
    clip_low: float = Field(
        ge=0,
        le=1,
        description="Lower clip margin, in [0, 1]: ratios below 1 - clip_low are clipped (PPO, CISPO, GSPO).",
    )
    clip_high: float = Field(
        ge=0,
        description="Upper clip margin, >= 0: ratios above 1 + clip_high are clipped. A wider upper than "
        "lower margin (clip-higher) keeps exploration alive.",
    )
    clip_ratio_c: float | None = Field(
        gt=1,
        description="Dual-clip constant, > 1: bounds the loss of tokens with negative advantage by "
        "clip_ratio_c times the advantage. null disables it; it needs use_ppo_clip or algorithm"
        " cispo or gspo.",
    )
    sapo_tau_pos: float = Field(
        gt=0, description="SAPO gate temperature for tokens with positive advantage, > 0 (sapo only)."
    )
    sapo_tau_neg: float = Field(
        gt=0, description="SAPO gate temperature for tokens with zero or negative advantage, > 0 (sapo only)."
    )
    dr_grpo_loss_agg_mode: Literal["token_mean", "token_sum_norm"] = Field(
        description="Loss aggregation of dr_grpo: token_mean averages over tokens; token_sum_norm sums and "
        "divides by a constant, which removes the preference for short answers."
    )
    advantage_norm: Literal["group", "batch"] = Field(
        description="Where advantages are normalised: group (within each prompt's group) or batch (over the"
        " training batch). rloo and dr_grpo need group; reinforce_pp needs batch and is "
        "switched to it."
    )
    use_tis: bool = Field(
        description="Truncated importance sampling: weight each token by its trainer/vLLM probability "
        "ratio, capped at tis_cap, to correct for the gap between sampler and learner."
    )
    tis_cap: float = Field(gt=0, description="Largest importance weight, > 0.")
    tis_logprob_clamp: float = Field(
        gt=0,
        description="Bound on the log-ratio before it is exponentiated, > 0; keeps weights finite when the "
        "two logprobs disagree wildly.",
    )
    tis_mode: Literal["truncate", "icepop"] = Field(
        description="Weights outside [tis_floor, tis_cap]: truncate clamps them; icepop drops those tokens."
    )
    tis_floor: float = Field(
        ge=0, description="Smallest importance weight kept in icepop mode, >= 0; 0 means no lower bound."
    )
    kl_penalty_tau: float = Field(
        ge=0,
        description="Weight of a KL penalty toward the sampling policy (the weights that generated each "
        "token) added to the loss, >= 0; 0 disables it. For a penalty toward a fixed model, see "
        "ref_kl_coef.",
    )
    kl_estimator: KlEstimator = Field(
        description="Estimator of the KL penalty: k2 (squared log-ratio) or k3 (ratio - 1 - log-ratio; never "
        "negative, lower variance)."
    )
    entropy_coef: float = Field(
        ge=0,
        description="Entropy bonus, >= 0: subtracts this times the mean token entropy from the loss to slow"
        " entropy collapse. 0 disables it.",
    )
    entropy_chunk_size: int = Field(
        description="Rows per chunk when the token entropy metric is computed; bounds peak memory with "
        "large vocabularies. 0 or less computes it in one piece."
    )
    seq_is_masking: bool = Field(
        description="Drop whole sequences whose geometric-mean importance ratio lies outside "
        "[seq_is_mask_low, seq_is_mask_high], i.e. samples that drifted far off-policy."
    )
    seq_is_mask_low: float = Field(
        gt=0, lt=1, description="Lower bound of the sequence importance ratio, in (0, 1); on-policy is 1."
    )
    seq_is_mask_high: float = Field(
        gt=1, description="Upper bound of the sequence importance ratio, > 1; on-policy is 1."
    )

    # Teacher and reference model
    teacher_model: str | None = Field(
        description="The teacher of on-policy distillation (algorithm opd): a Hugging Face model id or a "
        "local folder, that scores every token the student samples (teacher_placement says where). "
        "It must share the student's tokenizer (checked at start). null: no teacher; algorithm opd "
        "needs one."
    )
    teacher_placement: FrozenPlacement = Field(
        description="Where the teacher scores the sampled tokens: servers (vLLM servers of its own, "
        "teacher_num_workers GPUs, while the next samples generate) or trainer (a frozen copy in every "
        "trainer rank, sharded like the policy, one forward pass per micro-batch before the loss: no "
        "GPUs of its own; for teachers that fit beside the policy). docs/algorithms.md#frozen-models."
    )
    teacher_num_workers: int = Field(
        ge=1,
        description="GPUs given to the teacher's vLLM servers, >= 1; they form teacher_num_workers / "
        "teacher_tensor_parallel_size servers. Read only with a teacher_model on servers.",
    )
    teacher_tensor_parallel_size: int = Field(
        ge=1,
        description="GPUs per teacher server (tensor parallelism), >= 1; must divide teacher_num_workers.",
    )
    distill_coef: float = Field(
        ge=0,
        description="opd: weight c of the teacher term of each token's advantage, c * (teacher logprob - "
        "sampler logprob), >= 0.",
    )
    distill_reward_weight: float = Field(
        ge=0,
        description="opd: weight of the environment reward's group advantage added to each token's "
        "advantage, >= 0; 0 distils alone (the reward is still recorded).",
    )
    ref_model: str | None = Field(
        description="The frozen reference model of the reference KL: a Hugging Face model id or a local "
        "folder (ref_placement says where it runs). null: the run's model as it was at step 0 (before any "
        "sft_steps: give the fine-tuned folder to stay near it). Setting "
        "it (or ref_kl_coef > 0) starts the reference model; with ref_kl_coef 0 the run only "
        "records ref_kl.",
    )
    ref_placement: FrozenPlacement = Field(
        description="Where the reference model scores the sampled tokens: servers (vLLM servers of its "
        "own, ref_num_workers GPUs) or trainer (a frozen copy in every trainer rank, sharded like the "
        "policy: no GPUs of its own, one more forward pass per micro-batch). "
        "docs/algorithms.md#frozen-models."
    )
    ref_num_workers: int = Field(
        ge=1,
        description="GPUs given to the reference model's vLLM servers, >= 1, inference_tensor_parallel_size "
        "per server (the reference is the size of the model). Read only with a reference model on servers.",
    )
    ref_kl_coef: float = Field(
        ge=0,
        description="Weight of a KL penalty toward the frozen reference model (ref_model) added to the loss, "
        ">= 0; 0 disables it. Unlike kl_penalty_tau, which pulls toward the weights that sampled, this "
        "pulls toward a model that never changes (the classic RLHF KL).",
    )
    ref_kl_estimator: KlEstimator = Field(
        description="Estimator of the reference KL: k2 (squared log-ratio) or k3 (ratio - 1 - log-ratio; "
        "never negative, lower variance)."
    )

    # Supervised fine-tuning
    sft_steps: int = Field(
        ge=0,
        description="The first sft_steps steps of the run are supervised steps on sft_dataset (counted in "
        "number_of_steps; the RL steps follow, from the fine-tuned weights), >= 0; 0: none. Each trains "
        "on the assistant's tokens of sft_batch_size conversations (docs/algorithms.md#sft).",
    )
    sft_dataset: str | None = Field(
        description="Conversations for the supervised steps: a local .jsonl, .json or .parquet file, or a "
        "Hugging Face dataset id (its sft_dataset_split). Each row holds `messages` (role system, user, "
        "assistant or tool, content, and tool_calls on assistant messages) and may hold `tools`. null: "
        "none; sft_steps > 0 needs one.",
    )
    sft_dataset_split: str = Field(
        min_length=1, description="The split of a Hugging Face sft_dataset (a local file has one)."
    )
    sft_batch_size: int = Field(
        ge=1,
        description="Conversations per supervised step, >= 1; they go through the dataset in a seeded "
        "order, a new one each pass.",
    )

    # Filters and reward shaping
    filter_overlong: bool = Field(
        description="Leave out of the loss completions cut off at max_tokens (no end-of-sequence token), "
        "whose reward is often misleading."
    )
    overlong_penalty_factor: float = Field(
        ge=0,
        description="Largest reward penalty for long completions, >= 0; it grows linearly over the last "
        "overlong_buffer_tokens before max_tokens. 0 disables it.",
    )
    overlong_buffer_tokens: int = Field(
        ge=1, description="Width in tokens of the ramp of the overlong penalty, >= 1."
    )
    filter_gibberish: bool = Field(
        description="Leave out of the loss completions containing rare tokens generated at very low "
        "probability, a sign of degenerate output."
    )
    gibberish_token_threshold: int = Field(ge=1, description="Token ids above this count as rare, >= 1.")
    gibberish_logprob_offset: float = Field(
        gt=0,
        description="With filter_gibberish, a completion is flagged when a token with id above "
        "gibberish_token_threshold was sampled with a vLLM logprob below -11.5 minus this offset (11.5 "
        "is about ln 100,000, a fixed constant, not the model's vocabulary size), > 0. A flagged "
        "completion stays in the batch with a zero loss mask (counted in filter/gibberish_frac); "
        "tokens without a logprob never flag.",
    )
    filter_repetition: bool = Field(
        description="Leave out of the loss completions that repeat themselves, found by a high zlib "
        "compression ratio."
    )
    repetition_compression_threshold: float = Field(
        gt=1, description="zlib compression ratio above which a completion counts as repetitive, > 1."
    )

    # Weight synchronisation
    weight_broadcast_mode: Literal["flattened_bucket", "per_tensor"] = Field(
        description="How new weights reach vLLM: flattened_bucket packs tensors into large buffers (fewer, "
        "larger transfers); per_tensor sends them one by one (less memory)."
    )
    weight_broadcast_bucket_mb: int = Field(
        ge=1,
        description="Bucket size of flattened_bucket in MiB, >= 1; larger is faster on GPUs but needs more"
        " free GPU memory. Left unset, `telescope train` uses 32 on a CPU (gloo) transport, where smaller"
        " buckets let a server apply one bucket while the next arrives.",
    )
    weight_broadcast_cpu_staging: bool = Field(
        description="Stage gathered weights in CPU memory before broadcasting: saves GPU memory, costs time."
    )
    weight_broadcast_pin_memory: bool = Field(
        description="Stage in pinned CPU memory, for faster copies back to the GPU."
    )
    weight_broadcast_free_grad_buffers: bool = Field(
        description="Free Megatron's gradient buffers during the broadcast to make room for it; they are "
        "rebuilt for the next step."
    )
    weight_broadcast_timeout_s: int = Field(
        ge=1,
        description="Seconds (>= 1) one weight update may take: each broadcast and every server's apply. A "
        "server that has not applied it by then, and does not answer a probe, counts as dead and is "
        "restarted (inference_max_restarts). New in Telescope.",
    )

    # Packing
    seq_len: int = Field(
        ge=1,
        description="Token capacity of one packed micro-batch, >= 1; longer samples are truncated. Must be "
        "at least max_model_len so that a full-length sample fits.",
    )
    pad_to_multiple_of: int = Field(
        ge=1,
        description="Pad each micro-batch's length to a multiple of this, >= 1; regular shapes suit the "
        "kernels.",
    )

    # Inference server
    inference_host: str = Field(min_length=1, description="Address the vLLM servers listen on.")
    inference_base_port: int = Field(
        ge=1,
        le=65535,
        description="Port of the first vLLM server, 1 to 65535: server i (one per "
        "inference_tensor_parallel_size inference workers) listens on inference_base_port + i, on "
        "inference_host of its node. A port already in use stops the run before vLLM starts, naming the "
        "port: choose a free range.",
    )
    inference_max_restarts: int = Field(
        ge=0,
        description="Restarts of each vLLM server that dies (its process exits, /health fails for "
        "inference_health_timeout_seconds, or it does not apply a weight update within "
        "weight_broadcast_timeout_s), >= 0. A restarted server rejoins the weight-sync groups and receives "
        "the current weights before it serves again; its unfinished groups are generated again (reason "
        "server_restart in the rollouts). Past this many restarts the run goes on without it, or, with no "
        "server left, stops after a checkpoint. 0: a dead server is never restarted. New in Telescope.",
    )
    inference_health_timeout_seconds: float = Field(
        ge=1,
        description="Seconds a vLLM server may fail /health, or a probe through its engine (a stuck engine "
        "still answers /health), in a row before it counts as dead and is restarted, >= 1. New in Telescope.",
    )
    gpu_memory_utilization: float = Field(
        gt=0,
        le=1,
        description="Fraction of each inference GPU's memory that vLLM may take for weights and KV cache, "
        "in (0, 1].",
    )
    max_model_len: int = Field(
        ge=1,
        description="Context length of the vLLM servers in tokens (prompt plus completion), >= 1. A prompt "
        "too long to leave max_tokens gets a smaller completion budget.",
    )
    max_num_seqs: int | None = Field(
        ge=1, description="Most sequences one vLLM server runs at once, >= 1; null lets vLLM choose."
    )
    max_num_batched_tokens: int | None = Field(
        ge=1,
        description="Most tokens one vLLM scheduler step processes (prefill plus decode), >= 1; null lets "
        "vLLM choose.",
    )
    vllm_scheduling_policy: Literal["priority", "fcfs"] = Field(
        description="vLLM request order: priority serves later turns of multi-turn episodes first so "
        "episodes finish; fcfs serves requests as they arrive."
    )
    enable_prefix_caching: bool = Field(
        description="vLLM's prefix caching: a server reuses the KV cache of prompt prefixes it already "
        "computed (a group's samples share their prompt, later turns the conversation so far). Every "
        "request carries a cache salt naming the weight version its server holds, so a prefix computed "
        "under older weights is never reused after a weight update. false starts the servers with "
        "--no-enable-prefix-caching."
    )
    enable_thinking: bool = Field(
        description="Value of enable_thinking given to the chat template (e.g. Qwen3's thinking mode)."
    )
    chat_template: str | None = Field(
        description="Jinja2 chat template replacing the tokenizer's own; null keeps the tokenizer's. Needed"
        " for base models that ship without one."
    )

    # Rollout and sampling
    group_size: int = Field(
        ge=1,
        description="Completions sampled per prompt, >= 1. Advantages compare completions of one group, so "
        "learning needs at least 2.",
    )
    temperature: float = Field(
        gt=0,
        description="Sampling temperature, > 0. The trainer divides its logits by the same value so its "
        "logprobs match the sampler's; 0 (greedy) would divide by zero.",
    )
    max_tokens: int = Field(
        ge=1,
        description="Most tokens generated per request (per turn in multi-turn environments), >= 1; must be"
        " below max_model_len to leave room for the prompt.",
    )
    top_p: float | None = Field(
        gt=0,
        le=1,
        description="Nucleus sampling threshold, in (0, 1]; null disables it. The servers return the "
        "logprobs of the truncated, renormalised distribution they sample from; the trainer's cover the "
        "whole vocabulary, so per token they are lower by -log(kept probability mass) (up to 0.69 at "
        "top_p 0.5 on the tiny test model). A run with top_p < 1 warns when TIS, PPO clipping, the KL "
        "penalty, sequence IS masking or the gibberish filter compare the two.",
    )
    interleaved_rollouts: bool = Field(
        description="In multi-turn episodes, reuse the exact token ids of earlier turns instead of "
        "re-tokenizing the conversation, so the trainer sees exactly what was generated."
    )

    # Checkpoints
    checkpoint_every: CheckpointEvery = Field(
        description="Save a checkpoint every N steps and at the last step: an integer N >= 1; false or 0 "
        "disables checkpoints. true is rejected as ambiguous: write 1 for every step."
    )
    checkpoint_save_training_state: bool = Field(
        description="Also save optimizer, scheduler, random and orchestrator state so the run can resume; "
        "false saves the weights only."
    )
    resume_from_checkpoint: ResumeFrom = Field(
        description="Resume a run: false starts fresh, true resumes from the latest checkpoint in "
        "checkpoint_dir, an integer N >= 1 from step N."
    )
    checkpoint_dir: str | None = Field(
        min_length=1, description="Directory of the checkpoints; null means <run directory>/checkpoints."
    )
    checkpoint_keep_last: int | None = Field(
        ge=1,
        description="Keep the N most recent checkpoints, >= 1 (with checkpoint_keep_every, its multiples "
        "too); null: no limit by recency (with checkpoint_keep_every set, only its multiples and the "
        "newest are kept; with both null every checkpoint is kept).",
    )
    checkpoint_keep_every: int | None = Field(
        ge=1,
        description="Also keep every checkpoint whose step is a multiple of N (e.g. 100), >= 1; null turns "
        "this off.",
    )

    # Logging and W&B
    use_wandb: bool = Field(
        description="Also log the run to Weights & Biases (metrics, tables, code, logs). The local run "
        "directory is the primary record; W&B is opt-in."
    )
    wandb_project: str = Field(
        min_length=1, description="W&B project; the WANDB_PROJECT environment variable overrides it."
    )
    wandb_run_name: str = Field(
        min_length=1, description="W&B run name; the WANDB_RUN_NAME environment variable overrides it."
    )
    wandb_tags: list[str] = Field(
        description="Tags of the W&B run (with use_wandb: true); a non-empty WANDB_TAGS environment "
        "variable (comma-separated) replaces them. The default tag, telescope, is the one "
        "upstream Telescope's UI finds runs by."
    )
    wandb_upload_code: bool = Field(
        description="Upload the source tree under the working directory as a W&B code artifact, "
        "filtered by wandb_code_exclude_patterns and wandb_code_max_file_size_mb (at most 5000 files)."
    )
    wandb_upload_logs: bool = Field(
        description="Upload the driver's structured log (logs/telescope.jsonl) and the run guard's log "
        "to the W&B run at its end."
    )
    wandb_upload_logs_detailed: bool = Field(
        description="No effect in Telescope: the driver keeps one log (debug lines in it when debug is "
        "true), which wandb_upload_logs uploads."
    )
    wandb_upload_logs_stdout: bool = Field(
        description="Also upload the raw output of every vLLM server, trainer rank and Ray (logs/*/*.log)."
    )
    wandb_code_max_file_size_mb: float = Field(
        gt=0, description="Files larger than this many MiB (> 0) are left out of the code upload."
    )
    wandb_code_exclude_patterns: list[str] = Field(
        description="fnmatch patterns of directory and file names left out of the code upload."
    )
    system_metrics_collection_interval_seconds: float = Field(
        gt=0,
        description="Seconds between infrastructure samples (CPU, memory, GPUs, the run's processes, each "
        "vLLM server's /metrics) on the driver node, written to the run record's infra table, > 0.",
    )
    torch_memory_sample_interval_seconds: float = Field(
        gt=0, description=_NO_EFFECT + "Seconds between samples of the trainer's torch allocator memory, > 0."
    )
    event_tail_window_seconds: int = Field(
        ge=1, description=_NO_EFFECT + "Seconds of recent events uploaded for the live timeline, >= 1."
    )
    event_block_duration_seconds: int = Field(
        ge=1, description=_NO_EFFECT + "Seconds of timeline events per archived block, >= 1."
    )
    event_upload_interval_seconds: int = Field(
        ge=1,
        description="Seconds between flushes of the run record's time tables (infra) to disk, >= 1; the "
        "tables of a step are written once per step. Also the interval at which a step that waits for "
        "its batch reports how the batch is going (docs/troubleshooting.md, 'Every group is dropped for "
        "zero advantage').",
    )
    metrics_logger_interval_seconds: float = Field(
        gt=0, description=_NO_EFFECT + "Seconds between polls of the cluster-wide Ray node metrics, > 0."
    )
    ray_torch_memory_drain_interval_seconds: float = Field(
        gt=0,
        description=_NO_EFFECT
        + "Seconds between collections of torch memory samples from the Ray actors, > 0.",
    )
    rollout_block_size: int = Field(
        ge=1, description=_NO_EFFECT + "Training steps per archived block of samples, >= 1."
    )
    track_gpu_events: bool = Field(
        description="Record every trainer rank's spans (forward, backward, optimizer step, weight sync, "
        "checkpoints) in the run record's trainer_spans table; on GPU timed with CUDA events."
    )
    record_tokens: bool = Field(
        description="Record, for every token of the kept samples, what the sampler, the trainer's loss and "
        "the teacher and reference model made of it (logprobs, advantage, loss mask, IS weight, clipping, "
        "weight versions) in the run record's tokens table, which the inspector colours completions by."
    )

    # Evals and tracing
    eval_before_training: bool = Field(
        description="Run the evals before the first step as a baseline (step 0); skipped when resuming."
    )
    eval_after_training: bool = Field(
        description="Run the evals after the last step, unless they already ran at that step."
    )
    eval_num_servers: int = Field(
        ge=0,
        description="vLLM servers taken from training while a periodic eval runs, >= 0; 0 disables periodic"
        " evals. At least one server must stay with training.",
    )
    eval_start_end_use_all_servers: bool = Field(
        description="Run the baseline and final evals on every server, since no training runs then."
    )
    evals: list[EvalEntry] = Field(
        description="Evals run during training. Each entry has name (a registered eval or environment), "
        "eval_every (steps, default 10), pass_k, num_samples (-1 = all), separate_eval_samples,"
        " kwargs, and temperature, top_p, max_tokens (null = the training value)."
    )
    enable_vllm_tracing: bool = Field(
        description=_NO_EFFECT
        + "Collect per-request timings from vLLM over OpenTelemetry (OTLP) for the timeline."
    )
    otlp_receiver_port: int = Field(
        ge=1,
        le=65535,
        description=_NO_EFFECT + "Port of the local OTLP receiver of the vLLM traces, 1 to 65535.",
    )

    @property
    def num_inference_servers(self) -> int:
        """How many vLLM servers the run starts (inference_num_workers // inference_tensor_parallel_size)."""
        return num_inference_servers(self)

    @property
    def uses_reference(self) -> bool:
        """Whether the run starts reference servers: a reference KL (ref_kl_coef > 0), or a ref_model
        whose KL is only recorded."""
        return self.ref_kl_coef > 0 or self.ref_model is not None

    @property
    def frozen_models(self) -> dict[str, FrozenPlacement]:
        """The frozen models an RL step of the run scores its tokens with, ``{name: placement}``: the
        teacher (``algorithm: opd``) and the reference model (:attr:`uses_reference`); none when every
        step is supervised."""
        out: dict[str, FrozenPlacement] = {}
        if self.supervised_only:
            return out
        if self.algorithm == "opd" and self.teacher_model is not None:
            out["teacher"] = self.teacher_placement
        if self.uses_reference:
            out["ref"] = self.ref_placement
        return out

    @property
    def supervised_only(self) -> bool:
        """Whether every step is supervised (``sft_steps`` equal to ``number_of_steps``, what ``telescope
        sft`` runs): the run starts no inference servers, no teacher or reference model, and no evals."""
        return 0 < self.number_of_steps <= self.sft_steps

    @model_validator(mode="after")
    def _cross_field_rules(self, info: ValidationInfo) -> TelescopeConfig:
        if info.context and info.context.get(SKIP_RULES):
            return self
        for adj in _rules.adjustments(self):
            object.__setattr__(self, adj.field, adj.value)  # the model is frozen; this is its own validator
        violations = _rules.check(self)
        if violations:
            raise ValueError("\n".join(f"{v.field}: {v.rule}; fix: {v.fix}" for v in violations))
        return self
