"""The Megatron trainer's timeline on gloo (slow): a step's spans nest, cover every micro-batch
(forward, loss, backward without pipeline parallelism; forward and loss with it) and drain once;
checkpoints and the weight export are spans too."""

from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest
from megatron_spawn import run_ranks

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning")]

WORKER = Path(__file__).with_name("spans_worker.py")
TOP = "train_step"


def _samples(n: int) -> list[dict]:
    rng = random.Random(9)
    out = []
    for _ in range(n):
        c = [rng.randrange(3, 400) for _ in range(rng.randint(4, 12))]
        out.append(
            {
                "prompt_ids": [rng.randrange(3, 400) for _ in range(rng.randint(3, 8))],
                "completion_ids": c,
                "advantage": rng.uniform(-1, 1),
                "rollout_logprobs": [-rng.uniform(3, 7) for _ in c],
            }
        )
    return out


def _run(model: Path, tmp: Path, *, world: int, pp: int = 1) -> list[dict]:
    spec = {
        "model_dir": str(model),
        "seq_len": 32,
        "samples": _samples(8),
        "overrides": {
            "number_of_minibatches": 2,
            "use_ppo_clip": True,
            "ppo_clip_ref_logprobs": "batch",
            "mixed_precision_dtype": None,
            "megatron_pipeline_parallel_size": pp,
        },
    }
    return run_ranks(spec, world, tmp, timeout=900, worker=WORKER)["ranks"]


def _count(rows: list[dict]) -> Counter:
    return Counter(r["name"] for r in rows)


def _check_checkpoint_spans(rank: dict) -> None:
    later = rank["later"]
    assert {r["step"] for r in later} == {3}  # checkpoint spans carry the last step
    names = _count(later)
    assert names["checkpoint/save"] == 1
    assert names["checkpoint/load"] == 2
    for phase in ("hf_save", "get_state_dict", "rng_state", "shard_save", "barrier"):
        assert names[f"checkpoint/save/{phase}"] == 1, phase
    assert names["checkpoint/save/hf_save/hf_weights"] == 1
    for phase in ("shard_load", "set_state_dict", "rng_state", "load_hf", "reload_model_params"):
        assert names[f"checkpoint/load/{phase}"] == 1, phase
    assert names["hf_weights"] == 1


def test_one_stage_spans_every_micro_batch(tiny_tp_model: Path, tmp_path: Path):
    (rank,) = _run(tiny_tp_model, tmp_path, world=1)
    assert rank["problems"] == []
    assert rank["again"] == 0
    rows, n = rank["step"], rank["micro_batches"]
    assert n >= 3
    assert {r["step"] for r in rows} == {3}
    names = _count(rows)
    assert names[TOP] == names[f"{TOP}/prepare"] == names[f"{TOP}/metrics"] == 1
    assert names[f"{TOP}/old_logprobs/microbatch"] == n
    assert (
        names[f"{TOP}/old_logprobs/microbatch/forward"] == names[f"{TOP}/old_logprobs/microbatch/loss"] == n
    )
    assert names[f"{TOP}/old_logprobs/microbatch/backward"] == 0
    assert names[f"{TOP}/minibatch"] == names[f"{TOP}/minibatch/grad_sync"] == 2
    for leaf in ("optimizer", "optimizer/grad_norm", "optimizer/update"):
        assert names[f"{TOP}/minibatch/{leaf}"] == 2, leaf
    micro = f"{TOP}/minibatch/microbatch"
    assert names[micro] == n
    for leaf in ("forward", "loss", "backward"):
        got = sorted((r["microbatch"], r["minibatch"]) for r in rows if r["name"] == f"{micro}/{leaf}")
        assert got == [(i, i % 2) for i in range(n)], leaf  # each micro-batch once, in its group
    _check_checkpoint_spans(rank)


def test_pipeline_stages_span_forward_and_loss(tiny_tp_model: Path, tmp_path: Path):
    ranks = _run(tiny_tp_model, tmp_path, world=2, pp=2)
    for stage, rank in enumerate(ranks):
        assert rank["problems"] == [], stage
        names, n = _count(rank["step"]), rank["micro_batches"]
        got = sorted(
            (r["microbatch"], r["minibatch"]) for r in rank["step"] if r["name"] == f"{TOP}/minibatch/forward"
        )
        assert got == [(i, i % 2) for i in range(n)], stage
        assert names[f"{TOP}/minibatch/loss"] == (n if stage == 1 else 0)  # the last stage's loss
        assert names[f"{TOP}/minibatch/microbatch"] == 0
        assert names[f"{TOP}/minibatch/grad_sync"] == names[f"{TOP}/minibatch/optimizer"] == 2
        _check_checkpoint_spans(rank)
