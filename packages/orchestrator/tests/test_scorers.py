"""The teacher's and reference model's servers (``run.scorers``): which models a config serves, the
tokenizer and context checks made before any server starts, and their servers' launches."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from telescope_config.testing import make_config
from telescope_orchestrator.run.scorers import (
    ScorerModel,
    check_contexts,
    check_tokenizers,
    in_trainer,
    model_positions,
    scorer_launches,
    scorer_models,
)
from telescope_rollout import Tokenizer

OPD = {"algorithm": "opd", "temperature": 1.0, "max_tokens": 64}


def _with_positions(src: Path, dst: Path, positions: int) -> Path:
    shutil.copytree(src, dst)
    config = json.loads((dst / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**config, "max_position_embeddings": positions}))
    return dst


def test_a_config_serves_its_teacher_and_its_reference_which_defaults_to_the_policy(tiny_model_dir):
    cfg = make_config(**OPD, teacher_model=str(tiny_model_dir), teacher_num_workers=2, ref_kl_coef=0.1)
    teacher, ref = scorer_models(cfg, "/resolved/policy")
    assert (teacher.name, teacher.path, teacher.servers, teacher.tensor_parallel) == (
        "teacher", str(tiny_model_dir), 2, 1
    )  # fmt: skip
    assert (ref.name, ref.model, ref.path, ref.servers) == ("ref", cfg.model, "/resolved/policy", 1)
    assert scorer_models(make_config(), "/p") == []
    only_sft = make_config(**OPD, teacher_model="t", sft_steps=4, number_of_steps=4, sft_dataset="d.jsonl")
    assert scorer_models(only_sft, "/p") == []  # no RL step to score


def test_a_frozen_model_placed_in_the_trainer_has_no_server_and_goes_to_the_ranks(tiny_model_dir, tmp_path):
    from telescope_orchestrator.cluster.ray_cluster import scorer_servers
    from telescope_orchestrator.cluster.vllm_server import ServerSettings

    cfg = make_config(**OPD, teacher_model=str(tiny_model_dir), teacher_placement="trainer", ref_kl_coef=0.1)
    assert cfg.frozen_models == {"teacher": "trainer", "ref": "servers"}
    assert scorer_servers(cfg) == {"ref": (1, 1)}
    teacher, ref = scorer_models(cfg, "/resolved/policy")
    assert (teacher.placement, teacher.servers, teacher.path) == ("trainer", 0, str(tiny_model_dir))
    assert (ref.placement, ref.servers) == ("servers", 1)
    assert in_trainer([teacher, ref]) == {"teacher": str(tiny_model_dir)}
    policy = ServerSettings.from_config(cfg, model="/policy", device="cpu", seed=0, host="127.0.0.1")
    launches = scorer_launches(cfg, [teacher, ref], policy, tmp_path, first_port=9000)
    assert [x["scorer"] for x in launches] == ["ref"]  # the teacher has no server
    both = make_config(
        **OPD, teacher_model="t", teacher_placement="trainer", ref_kl_coef=0.1, ref_placement="trainer"
    )
    assert scorer_servers(both) == {}
    assert both.frozen_models == {"teacher": "trainer", "ref": "trainer"}


def test_a_teacher_sharing_the_tokenizer_passes_and_another_is_named(
    tiny_model_dir, tmp_path, tiny_model_tools
):
    cfg = make_config(**OPD, teacher_model=str(tiny_model_dir))
    policy = Tokenizer.from_pretrained(tiny_model_dir)
    same = ScorerModel("teacher", "same", str(tiny_model_dir), 1, 1)
    assert check_tokenizers(cfg, policy, [same]) is None
    other = tmp_path / "other"
    shutil.copytree(tiny_model_dir, other)
    tiny_model_tools.build_tokenizer(other, vocab_size=400)
    problem = check_tokenizers(cfg, policy, [ScorerModel("teacher", "other-model", str(other), 1, 1)])
    assert problem is not None
    assert problem.startswith(f"the teacher 'other-model' has another tokenizer than model '{cfg.model}'")
    assert "share one tokenizer" in problem


def test_a_teacher_with_a_shorter_context_than_max_model_len_is_refused(tiny_model_dir, tmp_path):
    short = _with_positions(tiny_model_dir, tmp_path / "short", 128)
    assert model_positions(str(short)) == 128
    cfg = make_config(**OPD, teacher_model=str(short), max_model_len=256, seq_len=256)
    problem = check_contexts(cfg, [ScorerModel("teacher", "short-model", str(short), 1, 1)])
    assert problem == (
        "the teacher 'short-model' holds at most 128 positions (max_position_embeddings in its config.json), "
        "fewer than max_model_len 256: it could not score the end of the longest samples. Set max_model_len "
        "to at most 128, or choose a teacher with a longer context."
    )
    fits = make_config(**OPD, teacher_model=str(short), max_model_len=128, seq_len=128)
    assert check_contexts(fits, [ScorerModel("teacher", "short-model", str(short), 1, 1)]) is None


def test_positions_come_from_a_text_config_and_unknown_ones_pass(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"text_config": {"max_position_embeddings": 4096}}))
    assert model_positions(str(tmp_path)) == 4096
    yarn = {"max_position_embeddings": 4096, "rope_scaling": {"rope_type": "yarn", "factor": 4.0}}
    (tmp_path / "config.json").write_text(json.dumps(yarn))
    assert model_positions(str(tmp_path)) == 16384  # vLLM serves YaRN's stretched context
    llama3 = {"max_position_embeddings": 131072, "rope_scaling": {"rope_type": "llama3", "factor": 8.0}}
    (tmp_path / "config.json").write_text(json.dumps(llama3))
    assert model_positions(str(tmp_path)) == 131072
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "x"}))
    assert model_positions(str(tmp_path)) is None
    assert model_positions(str(tmp_path / "missing")) is None


def test_scorer_servers_get_one_more_position_and_no_weight_sync(tiny_model_dir, tmp_path):
    from telescope_orchestrator.cluster.vllm_server import ServerSettings

    cfg = make_config(**OPD, teacher_model=str(tiny_model_dir), teacher_num_workers=2, max_model_len=512)
    policy = ServerSettings.from_config(cfg, model="/policy", device="cpu", seed=0, host="127.0.0.1")
    teacher = ScorerModel("teacher", "t", str(tiny_model_dir), 2, 1)
    launches = scorer_launches(cfg, [teacher], policy, tmp_path, first_port=9000)
    assert [x["port"] for x in launches] == [9000, 9001]
    assert [Path(x["log_path"]).relative_to(tmp_path).as_posix() for x in launches] == [
        "logs/teacher/server_0.log",
        "logs/teacher/server_1.log",
    ]
    first = launches[0]
    assert first["settings"]["model"] == str(tiny_model_dir)
    assert first["settings"]["max_model_len"] == 513
    assert first["extension_cls"] is None  # frozen: never a weight update
    assert first["env"] == {"VLLM_ALLOW_LONG_MAX_MODEL_LEN": "1"}
    assert first["scorer"] == "teacher"
