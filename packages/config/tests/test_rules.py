"""Every cross-field rule, both sides: a config that passes and one that fails with a useful message."""

from __future__ import annotations

import pytest
import structlog
from pydantic import ValidationError

from telescope_config import TelescopeConfig, defaults, num_inference_servers


def test_rule1_needs_an_environment(run, problems, only):
    p = only(problems({"environments": []}), "environments")
    assert p.value == []
    assert "at least one" in p.rule
    assert "environments: [{name: countdown}]" in p.fix
    assert len(run({"environments": [{"name": "countdown"}]}).config.environments) == 1


def test_rule2_no_double_importance_correction(run, problems, only):
    bad = {"use_tis": True, "use_ppo_clip": True, "ppo_clip_ref_logprobs": "rollout"}
    p = only(problems(bad), "ppo_clip_ref_logprobs")
    assert p.value == "rollout"
    assert "use_tis" in p.rule
    assert "use_ppo_clip" in p.rule
    assert "ppo_clip_ref_logprobs: batch" in p.fix
    assert run({**bad, "ppo_clip_ref_logprobs": "batch"}).config.use_tis
    assert run({**bad, "use_tis": False}).config.use_ppo_clip


@pytest.mark.parametrize("algorithm", ["cispo", "gspo", "sapo"])
def test_rule3_no_ppo_clip_on_self_bounding_objectives(algorithm, run, problems, only):
    p = only(problems({"use_ppo_clip": True, "algorithm": algorithm}), "use_ppo_clip")
    assert algorithm in p.rule
    assert "use_ppo_clip: false" in p.fix
    assert run({"use_ppo_clip": False, "algorithm": algorithm}).config.algorithm == algorithm


@pytest.mark.parametrize("algorithm", ["grpo", "rloo", "reinforce_pp", "dr_grpo"])
def test_rule3_ppo_clip_fine_on_plain_objectives(algorithm, run):
    assert run({"use_ppo_clip": True, "algorithm": algorithm}).config.use_ppo_clip


def test_rule4_dual_clip_needs_a_clipped_objective(run, problems, only):
    p = only(problems({"clip_ratio_c": 3.0}), "clip_ratio_c")
    assert p.value == 3.0
    assert "use_ppo_clip" in p.rule
    assert "clip_ratio_c: null" in p.fix
    assert run({"clip_ratio_c": 3.0, "use_ppo_clip": True}).config.clip_ratio_c == 3.0
    assert run({"clip_ratio_c": 3.0, "algorithm": "cispo"}).config.clip_ratio_c == 3.0
    assert run({"clip_ratio_c": 3.0, "algorithm": "gspo"}).config.clip_ratio_c == 3.0
    assert run({"clip_ratio_c": None}).config.clip_ratio_c is None


@pytest.mark.parametrize("value", [1.0, 0.5])
def test_rule4_dual_clip_constant_above_one(value, problems, only):
    p = only(problems({"clip_ratio_c": value, "use_ppo_clip": True}), "clip_ratio_c")
    assert "greater than 1" in p.rule
    assert "greater than 1" in p.fix


@pytest.mark.parametrize("algorithm", ["rloo", "dr_grpo"])
def test_rule5_group_baselines_need_group_norm(algorithm, run, problems, only):
    p = only(problems({"advantage_norm": "batch", "algorithm": algorithm}), "advantage_norm")
    assert p.value == "batch"
    assert algorithm in p.rule
    assert "advantage_norm: group" in p.fix
    assert run({"advantage_norm": "group", "algorithm": algorithm}).config.advantage_norm == "group"
    assert run({"advantage_norm": "batch", "algorithm": "grpo"}).config.advantage_norm == "batch"


def test_rule6_reinforce_pp_switches_to_batch_norm_with_a_warning(run):
    with structlog.testing.capture_logs() as logs:
        resolved = run({"algorithm": "reinforce_pp"})
    assert resolved.config.advantage_norm == "batch"
    assert len(resolved.notes) == 1
    assert "advantage_norm" in resolved.notes[0]
    assert "batch" in resolved.notes[0]
    warnings = [e for e in logs if e["log_level"] == "warning"]
    assert len(warnings) == 1
    assert "reinforce_pp" in warnings[0]["event"]


def test_rule6_explicit_batch_norm_needs_no_note(run):
    with structlog.testing.capture_logs() as logs:
        resolved = run({"algorithm": "reinforce_pp", "advantage_norm": "batch"})
    assert resolved.config.advantage_norm == "batch"
    assert resolved.notes == ()
    assert logs == []


def test_rule7_whole_inference_servers(run, problems, only):
    p = only(
        problems({"inference_num_workers": 3, "inference_tensor_parallel_size": 2}), "inference_num_workers"
    )
    assert p.value == 3
    assert "multiple of inference_tensor_parallel_size" in p.rule
    assert "multiple of 2" in p.fix
    cfg = run({"inference_num_workers": 4, "inference_tensor_parallel_size": 2}).config
    assert num_inference_servers(cfg) == 2 == cfg.num_inference_servers


def test_rule8_fsdp_context_parallel_needs_fsdp(run, problems, only):
    p = only(
        problems({"fsdp_context_parallel_size": 2, "train_backend": "megatron"}), "fsdp_context_parallel_size"
    )
    assert "train_backend fsdp" in p.rule
    assert "fsdp_context_parallel_size: 1" in p.fix
    assert run({"fsdp_context_parallel_size": 2}).config.fsdp_context_parallel_size == 2
    # CP 1 is "off", so any backend is fine
    assert (
        run({"fsdp_context_parallel_size": 1, "train_backend": "megatron"}).config.train_backend == "megatron"
    )


def test_lora_needs_the_fsdp_backend(run, problems, only):
    p = only(problems({"lora_rank": 8, "train_backend": "megatron"}), "lora_rank")
    assert p.value == 8
    assert "train_backend fsdp only" in p.rule
    assert "train_backend: fsdp" in p.fix
    assert "lora_rank: 0" in p.fix
    assert run({"lora_rank": 8}).config.lora_rank == 8
    assert run({"lora_rank": 0, "train_backend": "megatron"}).config.train_backend == "megatron"


def test_lora_rank_is_one_vllm_can_serve(run, problems, only):
    p = only(problems({"lora_rank": 513}), "lora_rank")
    assert p.value == 513
    assert "512" in p.rule
    assert "512" in p.fix  # the field's description: the largest rank vLLM serves
    assert run({"lora_rank": 512}).config.lora_rank == 512


@pytest.mark.parametrize("bad", ["*proj", "[qk]_proj", " "])
def test_lora_targets_are_layer_names(bad, run, problems, only):
    p = only(problems({"lora_target_modules": ["q_proj", bad]}), "lora_target_modules")
    assert repr(bad) in p.rule
    assert "q_proj, v_proj" in p.fix
    assert run({"lora_target_modules": ["q_proj", "v_proj"]}).config.lora_target_modules == [
        "q_proj",
        "v_proj",
    ]


@pytest.mark.parametrize(
    ("field", "value", "fragment"),
    [("lora_rank", -1, "greater than or equal to 0"), ("lora_alpha", 0, "greater than 0"),
     ("lora_dropout", 1.0, "less than 1"), ("lora_target_modules", [], "at least 1")],
)  # fmt: skip
def test_lora_values_out_of_range_name_the_field(field, value, fragment, problems, only):
    p = only(problems({field: value}), field)
    assert p.value == value
    assert fragment in p.rule


def test_rule8_seq_len_divisible_by_twice_cp(run, problems, only):
    # 4098 = 4 * 1024 + 2 is not a multiple of 2 * 2 = 4; the next multiple is 4100
    p = only(problems({"fsdp_context_parallel_size": 2, "seq_len": 4098}), "seq_len")
    assert "divisible by 4" in p.rule
    assert "seq_len: 4100" in p.fix
    cfg = run({"fsdp_context_parallel_size": 4, "seq_len": 4096, "trainer_num_workers": 4}).config
    assert cfg.seq_len == 4096


def test_rule8_trainer_ranks_are_whole_context_parallel_replicas(run, problems, only):
    p = only(problems({"fsdp_context_parallel_size": 2, "trainer_num_workers": 3}), "trainer_num_workers")
    assert p.value == 3
    assert "multiple of 2" in p.rule
    assert "multiple of 2 for trainer_num_workers" in p.fix
    assert run({"fsdp_context_parallel_size": 2, "trainer_num_workers": 6}).config.trainer_num_workers == 6
    # Megatron's own CP sizes are checked by its own rule; fsdp_context_parallel_size 1 needs nothing
    assert run({"trainer_num_workers": 3}).config.trainer_num_workers == 3


@pytest.mark.parametrize("value", [0, -0.5])
def test_temperature_must_be_positive(value, run, problems, only):
    p = only(problems({"temperature": value}), "temperature")
    assert "greater than 0" in p.rule
    assert "greater than 0" in p.fix
    assert run({"temperature": 0.1}).config.temperature == 0.1


def test_max_tokens_leaves_room_for_a_prompt(run, problems, only):
    p = only(problems({"max_tokens": 4096, "max_model_len": 4096}), "max_tokens")
    assert p.value == 4096
    assert "smaller than max_model_len (4096)" in p.rule
    assert "below 4096" in p.fix
    assert run({"max_tokens": 4095, "max_model_len": 4096}).config.max_tokens == 4095


def test_eval_max_tokens_leaves_room_for_a_prompt(run, problems, only):
    evals = [{"name": "math500"}, {"name": "aime_2024", "max_tokens": 5000}]
    p = only(problems({"evals": evals}), "evals[1].max_tokens")
    assert p.value == 5000
    assert "max_model_len" in p.rule
    evals[1]["max_tokens"] = 3000
    assert run({"evals": evals}).config.evals[1].max_tokens == 3000


def test_seq_len_holds_a_full_sample(run, problems, only):
    p = only(problems({"seq_len": 2048}), "seq_len")
    assert p.value == 2048
    assert "at least max_model_len (4096)" in p.rule
    assert "seq_len: 4096" in p.fix
    assert run({"seq_len": 8192}).config.seq_len == 8192


def test_eval_servers_leave_a_training_server(run, problems, only):
    evals = [{"name": "math500"}]
    # 4 workers / TP 2 = 2 servers; reserving 2 for evals leaves none for training
    values = {
        "evals": evals,
        "inference_num_workers": 4,
        "inference_tensor_parallel_size": 2,
        "eval_num_servers": 2,
    }
    p = only(problems(values), "eval_num_servers")
    assert p.value == 2
    assert "all 2 inference server" in p.rule
    assert "below 2" in p.fix
    assert run({**values, "eval_num_servers": 1}).config.eval_num_servers == 1
    assert run({**values, "eval_num_servers": 0}).config.eval_num_servers == 0
    # without evals the setting is unused, so it is not checked
    assert run({**values, "evals": []}).config.eval_num_servers == 2


def test_checkpoint_every_true_is_rejected(problems, only):
    p = only(problems({"checkpoint_every": True}), "checkpoint_every")
    assert p.value is True
    assert "ambiguous" in p.rule
    assert "integer N" in p.fix
    assert "1 for every step" in p.fix


@pytest.mark.parametrize("value", [False, 0, 1, 100])
def test_checkpoint_every_accepts_false_zero_and_intervals(value, run):
    got = run({"checkpoint_every": value}).config.checkpoint_every
    assert got == value
    assert type(got) is type(value)


@pytest.mark.parametrize("value", [-1, 2.5, "often", [1]])
def test_checkpoint_every_rejects_other_values(value, problems, only):
    p = only(problems({"checkpoint_every": value}), "checkpoint_every")
    assert "whole number of steps" in p.rule
    assert "checkpoint_every: 100" in p.fix


@pytest.mark.parametrize("value", [True, False, 1, 250])
def test_resume_from_checkpoint_accepts_bool_and_steps(value, run):
    got = run({"resume_from_checkpoint": value}).config.resume_from_checkpoint
    assert got == value
    assert type(got) is type(value)


@pytest.mark.parametrize("value", [0, -3, "latest"])
def test_resume_from_checkpoint_rejects_other_values(value, problems, only):
    p = only(problems({"resume_from_checkpoint": value}), "resume_from_checkpoint")
    assert "step >= 1" in p.rule
    assert "latest checkpoint" in p.fix


def test_rules_still_run_when_unrelated_fields_fail(problems):
    found = problems({"learning_rate": -1, "max_tokens": 5000, "nonsense": 1})
    assert {p.field for p in found} == {"learning_rate", "max_tokens", "nonsense"}
    assert "max_model_len" in next(p.rule for p in found if p.field == "max_tokens")


def test_a_rule_is_skipped_when_its_own_field_fails(problems, only):
    # max_tokens is not a number, so the max_tokens < max_model_len rule cannot be judged
    p = only(problems({"max_tokens": "lots"}), "max_tokens")
    assert "integer" in p.rule
    # a broken environment entry does not also claim "no environments"
    found = problems({"environments": [{"name": "countdown", "weight": 0}]})
    assert [p.field for p in found] == ["environments[0].weight"]


def test_a_directly_built_config_is_checked_too():
    values = defaults()
    with pytest.raises(ValidationError, match="at least one training environment"):
        TelescopeConfig.model_validate(values)
    values["environments"] = [{"name": "countdown"}]
    values["algorithm"] = "reinforce_pp"
    with structlog.testing.capture_logs() as logs:
        cfg = TelescopeConfig.model_validate(values)
    assert cfg.advantage_norm == "batch"
    assert [e["log_level"] for e in logs] == ["warning"]
    with pytest.raises(ValidationError, match="max_tokens must be smaller"):
        TelescopeConfig.model_validate({**values, "max_tokens": 9000})


MEGATRON = {"train_backend": "megatron"}


def test_megatron_defaults_are_valid(run):
    cfg = run(MEGATRON).config
    assert (cfg.train_backend, cfg.trainer_num_workers, cfg.megatron_tensor_parallel_size) == (
        "megatron",
        2,
        1,
    )


def test_megatron_rules_apply_only_to_megatron(run):
    # Every value below breaks a Megatron rule, and none matters to the FSDP backend.
    values = {
        "trainer_num_workers": 3,
        "megatron_tensor_parallel_size": 2,
        "megatron_context_parallel_size": 2,
        "megatron_expert_parallel_size": 2,
        "megatron_fp8": True,
        "megatron_use_distributed_optimizer": False,
        "megatron_optimizer_cpu_offload": True,
        "megatron_exp_avg_dtype": "bfloat16",
        "mixed_precision_dtype": "float16",
    }
    assert run({**values, "train_backend": "fsdp"}).config.megatron_context_parallel_size == 2


@pytest.mark.parametrize("sizes", [(3, 2, 1, 1), (4, 1, 3, 1), (6, 2, 2, 1)])
def test_megatron_workers_hold_whole_replicas(sizes, run, problems, only):
    workers, tp, pp, cp = sizes
    values = {
        **MEGATRON,
        "trainer_num_workers": workers,
        "megatron_tensor_parallel_size": tp,
        "megatron_pipeline_parallel_size": pp,
        "megatron_context_parallel_size": cp,
    }
    p = only(problems(values), "trainer_num_workers")
    assert p.value == workers
    replica = tp * pp * cp
    assert f"= {replica})" in p.rule
    assert f"multiple of {replica}" in p.fix
    assert run({**values, "trainer_num_workers": 2 * replica}).config.trainer_num_workers == 2 * replica


def test_megatron_expert_parallel_divides_a_pipeline_stage(run, problems, only):
    # 6 workers / PP 2 = 3 ranks per stage; EP 2 cannot split 3 ranks into expert groups
    values = {
        **MEGATRON,
        "trainer_num_workers": 6,
        "megatron_pipeline_parallel_size": 2,
        "megatron_expert_parallel_size": 2,
    }
    p = only(problems(values), "megatron_expert_parallel_size")
    assert p.value == 2
    assert "= 3)" in p.rule
    assert "divisor of 3" in p.fix
    assert run({**values, "trainer_num_workers": 8}).config.megatron_expert_parallel_size == 2
    assert run({**values, "megatron_expert_parallel_size": 3}).config.megatron_expert_parallel_size == 3


def test_megatron_context_parallel_is_accepted_with_every_other_parallelism(run):
    # CP runs in the backend's own attention: TP, PP and EP combine with it, and seq_len need not be
    # a multiple of 2 x CP (the trainer pads each row to one).
    values = {
        **MEGATRON,
        "trainer_num_workers": 16,
        "megatron_tensor_parallel_size": 2,
        "megatron_pipeline_parallel_size": 2,
        "megatron_context_parallel_size": 2,
        "megatron_expert_parallel_size": 2,
        "seq_len": 4097,
        "max_model_len": 4097,
    }
    cfg = run(values).config
    assert (cfg.megatron_context_parallel_size, cfg.seq_len) == (2, 4097)


def test_megatron_context_parallel_refuses_transformer_engine(run, problems, only):
    values = {**MEGATRON, "megatron_context_parallel_size": 2, "megatron_use_transformer_engine": True}
    p = only(problems(values), "megatron_context_parallel_size")
    assert p.value == 2
    assert "Transformer Engine" in p.rule
    assert "megatron_use_transformer_engine: false" in p.fix
    assert "megatron_context_parallel_size: 1" in p.fix
    # Transformer Engine without CP, and CP without Transformer Engine, are both fine.
    assert run({**values, "megatron_context_parallel_size": 1}).config.megatron_use_transformer_engine
    without_te = run({**values, "megatron_use_transformer_engine": False}).config
    assert without_te.megatron_context_parallel_size == 2


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"mixed_precision_dtype": "float16"}, "mixed_precision_dtype"),
        ({"mixed_precision_dtype": None, "model_dtype": "float16"}, "model_dtype"),
    ],
)
def test_megatron_refuses_float16_compute(values, field, run, problems, only):
    p = only(problems({**MEGATRON, **values}), field)
    assert p.value == "float16"
    assert "loss scaling" in p.rule
    assert f"{field}: bfloat16" in p.fix
    # float16 master weights with bfloat16 compute are fine: Megatron computes in bfloat16
    assert run({**MEGATRON, "model_dtype": "float16"}).config.model_dtype == "float16"


def test_megatron_fp8_needs_transformer_engine(run, problems, only):
    p = only(problems({**MEGATRON, "megatron_fp8": True}), "megatron_fp8")
    assert "megatron_use_transformer_engine is false" in p.rule
    assert "megatron_use_transformer_engine: true" in p.fix
    # CUDA and an installed Transformer Engine are checked when the trainer starts, not here
    values = {**MEGATRON, "megatron_fp8": True, "megatron_use_transformer_engine": True}
    assert run(values).config.megatron_fp8


@pytest.mark.parametrize(
    "field", ["megatron_use_precision_aware_optimizer", "megatron_optimizer_cpu_offload"]
)
def test_megatron_options_that_need_the_distributed_optimizer(field, run, problems, only):
    values = {**MEGATRON, field: True, "megatron_use_distributed_optimizer": False}
    p = only(problems(values), field)
    assert p.value is True
    assert "megatron_use_distributed_optimizer is false" in p.rule
    assert "megatron_use_distributed_optimizer: true" in p.fix
    assert getattr(run({**values, "megatron_use_distributed_optimizer": True}).config, field)


def test_megatron_optimizer_dtypes_need_the_precision_aware_optimizer(run, problems):
    values = {**MEGATRON, "megatron_exp_avg_dtype": "bfloat16", "megatron_main_grads_dtype": "float16"}
    found = problems(values)
    assert {(p.field, p.value) for p in found} == {
        ("megatron_exp_avg_dtype", "bfloat16"),
        ("megatron_main_grads_dtype", "float16"),
    }
    assert all("megatron_use_precision_aware_optimizer: true" in p.fix for p in found)
    cfg = run({**values, "megatron_use_precision_aware_optimizer": True}).config
    assert cfg.megatron_exp_avg_dtype == "bfloat16"


def test_megatron_problems_are_reported_together(problems):
    values = {
        **MEGATRON,
        "trainer_num_workers": 3,
        "megatron_tensor_parallel_size": 2,
        "megatron_fp8": True,
        "megatron_use_distributed_optimizer": False,
        "megatron_optimizer_cpu_offload": True,
    }
    fields = {p.field for p in problems(values)}
    assert fields == {"trainer_num_workers", "megatron_fp8", "megatron_optimizer_cpu_offload"}


def test_the_non_interleaved_multi_turn_mode_is_refused(run, problems, only):
    p = only(problems({"interleaved_rollouts": False}), "interleaved_rollouts")
    assert "exact token ids" in p.rule
    assert "set it to true" in p.fix
    assert run({"interleaved_rollouts": True}).config.interleaved_rollouts is True


def test_timeline_fields_load_with_a_note_when_set_to_another_value(run):
    with structlog.testing.capture_logs() as logs:
        values = {"enable_vllm_tracing": False, "otlp_receiver_port": 4318, "rollout_block_size": 7}
        resolved = run({**values, "track_gpu_events": False, "event_upload_interval_seconds": 2})
    # otlp_receiver_port is set to its default: nothing to say; track_gpu_events and
    # event_upload_interval_seconds act on the run record (docs/records.md, "Limits")
    assert len(resolved.notes) == 2
    assert resolved.notes[0].startswith("enable_vllm_tracing has no effect in Telescope")
    assert resolved.notes[1].startswith("rollout_block_size has no effect in Telescope")
    assert [e["event"] for e in logs if e["log_level"] == "warning"] == list(resolved.notes)
    assert resolved.config.rollout_block_size == 7  # kept as written


def test_opd_needs_a_teacher_and_a_teacher_needs_opd(run, problems, only):
    p = only(problems({"algorithm": "opd"}), "teacher_model")
    assert p.value is None
    assert "teacher_model is null" in p.rule
    assert "shares the model's tokenizer" in p.fix
    p = only(problems({"teacher_model": "Qwen/Qwen3-8B"}), "teacher_model")
    assert "only by algorithm opd" in p.rule
    assert "algorithm: opd" in p.fix
    assert run({"algorithm": "opd", "teacher_model": "Qwen/Qwen3-8B"}).config.teacher_model == "Qwen/Qwen3-8B"


def test_opd_keeps_groups_of_equal_rewards_with_a_warning(run):
    with structlog.testing.capture_logs() as logs:
        resolved = run({"algorithm": "opd", "teacher_model": "t"})
    assert resolved.config.discard_group_zero_advantage is False
    assert len(resolved.notes) == 1
    assert "discard_group_zero_advantage" in resolved.notes[0]
    assert [e["event"] for e in logs if e["log_level"] == "warning"] == [resolved.notes[0]]
    quiet = run({"algorithm": "opd", "teacher_model": "t", "discard_group_zero_advantage": False})
    assert quiet.notes == ()


def test_whole_teacher_and_reference_servers(run, problems, only):
    p = only(problems({"teacher_num_workers": 3, "teacher_tensor_parallel_size": 2}), "teacher_num_workers")
    assert "multiple of teacher_tensor_parallel_size (2)" in p.rule
    bad = {"ref_num_workers": 1, "inference_num_workers": 2, "inference_tensor_parallel_size": 2}
    assert run(bad).config.ref_num_workers == 1  # no reference model: the field is not read
    p = only(problems({**bad, "ref_kl_coef": 0.1}), "ref_num_workers")
    assert "inference_tensor_parallel_size (2)" in p.rule
    assert "multiple of 2" in p.fix
    p = only(problems({**bad, "ref_model": "m"}), "ref_num_workers")
    assert run({**bad, "ref_num_workers": 2, "ref_kl_coef": 0.1}).config.ref_kl_coef == 0.1
    # placed in the trainer, neither has servers to share GPUs among
    in_trainer = {"ref_kl_coef": 0.1, "ref_placement": "trainer"}
    assert run({**bad, **in_trainer}).config.ref_placement == "trainer"
    odd_teacher = {
        "teacher_num_workers": 3,
        "teacher_tensor_parallel_size": 2,
        "teacher_placement": "trainer",
    }
    assert run(odd_teacher).config.teacher_num_workers == 3


def test_supervised_steps_need_conversations_and_fit_in_the_run(run, problems, only):
    p = only(problems({"sft_steps": 2}), "sft_dataset")
    assert "sft_steps is 2" in p.rule
    assert "rows with `messages`" in p.fix
    p = only(problems({"sft_steps": 9, "sft_dataset": "c.jsonl", "number_of_steps": 4}), "sft_steps")
    assert "counted in number_of_steps (4)" in p.rule
    assert "at least 9" in p.fix
    assert run({"sft_steps": 4, "sft_dataset": "c.jsonl", "number_of_steps": 4}).config.sft_steps == 4
