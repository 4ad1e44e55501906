"""The FSDP trainer's timeline on one gloo rank: a real step's spans nest, cover every micro-batch,
and drain once; checkpoints and the weight export are spans too."""

from __future__ import annotations

import time
from collections import Counter

import pytest
import torch

from telescope_algos import pack_samples
from telescope_algos.backend import Timeline, nesting_problems


def _names(spans) -> Counter:
    return Counter(s.name for s in spans)


def test_a_step_is_a_tree_of_spans_with_every_micro_batch(helpers, tiny_model_dir, tmp_path):
    cfg = helpers.make_config(
        tiny_model_dir, number_of_minibatches=2, use_ppo_clip=True, ppo_clip_ref_logprobs="batch"
    )
    (mbs,) = pack_samples(helpers.make_samples(8, seed=11), seq_len=24, pad_to_multiple_of=8)
    assert len(mbs) >= 3
    with helpers.open_trainer(cfg) as trainer:
        assert isinstance(trainer.timeline, Timeline)
        trainer.train_step(mbs, step=5)
        spans = trainer.timeline.drain()
        assert trainer.timeline.drain() == []  # drained: nothing twice
        (tmp_path / "step_5").mkdir()
        trainer.save_checkpoint(tmp_path / "step_5")
        trainer.load_checkpoint(tmp_path / "step_5")
        exported = sum(1 for _ in trainer.hf_weights())
        later = trainer.timeline.drain()
    assert nesting_problems(spans) == []
    assert {s.step for s in spans} == {5}
    names = _names(spans)
    top = "train_step"
    assert names[top] == 1
    assert names[f"{top}/prepare"] == names[f"{top}/metrics"] == names[f"{top}/old_logprobs"] == 1
    assert names[f"{top}/old_logprobs/forward"] == len(mbs)
    assert names[f"{top}/minibatch"] == 2
    assert names[f"{top}/minibatch/optimizer"] == 2
    assert names[f"{top}/minibatch/optimizer/grad_norm"] == names[f"{top}/minibatch/optimizer/update"] == 2
    micro = f"{top}/minibatch/microbatch"
    assert names[micro] == len(mbs)
    for leaf in ("forward", "loss", "backward"):
        assert names[f"{micro}/{leaf}"] == len(mbs), leaf
        # one of each per micro-batch, labelled with its index and its group (i mod 2)
        labelled = sorted(
            (s.labels["microbatch"], s.labels["minibatch"]) for s in spans if s.name == f"{micro}/{leaf}"
        )
        assert labelled == [(i, i % 2) for i in range(len(mbs))]
    rows = [s.to_row() for s in spans]
    assert {r["minibatch"] for r in rows if r["name"] == f"{top}/minibatch"} == {0, 1}
    assert all(r["server"] == "" for r in rows)

    assert nesting_problems(later) == []
    assert {s.step for s in later} == {5}  # checkpoint spans carry the last step
    later_names = _names(later)
    for phase in ("get_state_dict", "dcp_save", "rng_state", "trainer_state", "hf_meta", "barrier"):
        assert later_names[f"checkpoint/save/{phase}"] == 1, phase
    for phase in ("get_state_dict", "dcp_load", "set_state_dict", "trainer_state", "barrier"):
        assert later_names[f"checkpoint/load/{phase}"] == 1, phase
    assert later_names["checkpoint/save"] == later_names["checkpoint/load"] == later_names["hf_weights"] == 1
    assert exported > 0


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_spans_are_wall_clock_and_nest(helpers, tiny_model_dir):
    cfg = helpers.make_config(tiny_model_dir, number_of_minibatches=2)
    (mbs,) = pack_samples(helpers.make_samples(8, seed=11), seq_len=24, pad_to_multiple_of=8)
    before = time.time()
    with helpers.open_trainer(cfg, device="cuda") as trainer:
        assert trainer.timeline.device.type == "cuda"
        trainer.train_step(mbs, step=1)
        spans = trainer.timeline.drain()
    after = time.time()
    assert nesting_problems(spans, tolerance=1e-4) == []
    names = _names(spans)
    for leaf in ("forward", "loss", "backward"):
        assert names[f"train_step/minibatch/microbatch/{leaf}"] == len(mbs), leaf
    for s in spans:
        assert before - 0.05 <= s.start <= s.end <= after + 0.05, s
