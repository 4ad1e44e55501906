"""Replacing dead trainer ranks (``recovery.trainers`` and the loop's ``_on_trainers``), driven with
fakes of the rank actors (the real ones, killed in a real run: tests/test_e2e_chaos.py): the kept
batches pack exactly as trained, which ranks count as dead, when a run stops instead, and the order
of a restart."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from ray.exceptions import ActorDiedError

from telescope_algos import TrainingSample, pack_samples
from telescope_config.testing import make_config
from telescope_orchestrator.recovery import trainers as _trainer_restart
from telescope_orchestrator.recovery.trainers import (
    Replay,
    TrainerRestarts,
    TrainersGone,
    dead_ranks,
    replay_diff,
)
from telescope_orchestrator.run.loop import _on_trainers


def _samples() -> list[TrainingSample]:
    return [
        TrainingSample([1, 2, 3], [4, 5, 6, 7], 0.5, [-0.1, None, -0.3, -1.25], [1, 1, 0, 1]),
        TrainingSample([1, 2], [9], -1.5, None, None),
        TrainingSample([8], [3, 3], 0.25, [-0.7], None),  # fewer logprobs than tokens: padded with 0.0
    ]


def test_a_kept_step_packs_exactly_as_the_samples_it_was_trained_on():
    replay = Replay()
    replay.add(3, _samples(), {"loss": 0.5, "grad_norm": 2.0})
    ((step, again, metrics),) = list(replay)
    assert step == 3
    assert metrics == {"loss": 0.5}  # only the checked metrics
    kwargs: dict[str, Any] = {"seq_len": 16, "pad_to_multiple_of": 4, "num_ranks": 2, "pad_token_id": 0}
    for a, b in zip(pack_samples(_samples(), **kwargs), pack_samples(again, **kwargs), strict=True):
        for ma, mb in zip(a, b, strict=True):
            for name in ("input_ids", "position_ids", "loss_mask", "advantages", "rollout_logprobs"):
                assert torch.equal(getattr(ma, name), getattr(mb, name)), name
    # ids int32 (3+4 + 2+1 + 1+2 tokens), logprobs float32 (4 + 1), masks int8 (4)
    assert replay.nbytes == 13 * 4 + 5 * 4 + 4


def test_a_step_trained_again_replaces_itself_and_the_steps_after_it():
    replay = Replay()
    for step in (3, 4, 5):
        replay.add(step, _samples()[:1], {"loss": float(step)})
    replay.add(4, _samples()[1:2], {"loss": 9.0})
    assert [(s, m["loss"]) for s, _, m in replay] == [(3, 3.0), (4, 9.0)]
    replay.clear()
    assert list(replay) == []


def test_replay_diff():
    assert replay_diff({"loss": 0.5}, {"loss": 0.5}) == 0.0
    assert replay_diff({"loss": 0.5}, {"loss": 0.75}) == 0.25
    assert replay_diff({"loss": 0.5}, {}) == float("inf")
    assert replay_diff({"loss": float("nan")}, {"loss": float("nan")}) == 0.0
    assert replay_diff({"loss": 0.5}, {"loss": float("nan")}) == float("inf")
    assert replay_diff({}, {"loss": 1.0}) == 0.0


class _Rank:
    """A rank actor: ``ping``, ``train_step``, ``load_checkpoint`` as Ray handles call them."""

    def __init__(self, name: str, log: list, *, dead: bool = False, hung: bool = False) -> None:
        self.name, self.log, self.dead, self.hung = name, log, dead, hung
        self.fail_train = 0

    def __getattr__(self, method: str) -> Any:
        if method.startswith("_"):
            raise AttributeError(method)
        rank = self

        async def call(*args: Any) -> Any:
            rank.log.append((rank.name, method))
            if rank.dead:
                raise ActorDiedError()
            if rank.hung:
                await asyncio.sleep(60)
            if method == "train_step":
                if rank.fail_train:
                    rank.fail_train -= 1
                    raise RuntimeError("gloo: connection closed by peer")
                return {"loss": float(args[1])}
            return rank.name

        def remote(*args: Any) -> Any:  # started at once, as Ray starts a call
            coro = call(*args)
            try:
                return asyncio.ensure_future(coro)
            except RuntimeError:  # called from a worker thread (the loop sends train steps from one)
                return coro  # awaited on the loop

        return SimpleNamespace(remote=remote)


async def test_dead_ranks_are_those_gone_and_beside_them_those_stuck(monkeypatch):
    monkeypatch.setattr(_trainer_restart, "PING_S", 0.05)
    log: list = []
    ok, gone, stuck = _Rank("a", log), _Rank("b", log, dead=True), _Rank("c", log, hung=True)
    found = await dead_ranks([ok, gone, stuck])
    assert set(found) == {1, 2}
    assert found[1].startswith("its process is gone (ActorDiedError")
    assert "did not answer" in found[2]
    assert await dead_ranks([ok, ok]) == {}
    assert await dead_ranks([ok, stuck]) == {}  # stuck alone: the call's own failure, not a death


def _restarts(tmp_path, events: list, said: list, **config: Any) -> TrainerRestarts:
    cfg = {"trainer_max_restarts": 2, "checkpoint_every": 2, "checkpoint_save_training_state": True, **config}
    return TrainerRestarts(
        config=make_config(**cfg), place=lambda: [], connect=lambda trainers, groups: None,
        log_dir=tmp_path, event=lambda kind, **d: events.append((kind, d)), say=said.append,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("config", "why"),
    [
        ({"trainer_max_restarts": 0}, "trainer_max_restarts is 0"),
        ({"checkpoint_every": False}, "checkpoint_every: false"),
        ({"checkpoint_save_training_state": False}, "checkpoint_save_training_state: false"),
    ],
)
def test_a_run_that_cannot_restart_its_ranks_stops_with_the_fix_and_keeps_no_batch(tmp_path, config, why):
    (tmp_path / "rank_1.log").write_text("".join(f"line {i}\n" for i in range(30)) + "OutOfMemoryError\n")
    events: list = []
    rt = _restarts(tmp_path, events, [], **config)
    rt.trained(1, _samples(), {"loss": 1.0})
    assert list(rt.replay) == []
    with pytest.raises(TrainersGone) as err:
        rt.lost({1: "its process is gone (ActorDiedError)"}, "the training of step 2")
    text = str(err.value)
    assert "trainer rank 1 died during the training of step 2: its process is gone" in text
    assert why in text
    assert "The run has no checkpoint: fix the cause above, then start it again." in text
    assert "line 29\nOutOfMemoryError" in text
    assert "line 15" not in text  # the log's last 15 lines
    assert [k for k, _ in events] == ["trainer_lost"]


def test_restarts_are_counted_and_bounded(tmp_path):
    events: list = []
    said: list = []
    rt = _restarts(tmp_path, events, said)
    rt.checkpointed(4, "/ck/step_4")
    for attempt in (1, 2):
        rt.lost({0: "gone"}, f"step {attempt}")
        assert rt.restarts == attempt
    assert "from the checkpoint of step 4 (2/2)" in said[-1]
    with pytest.raises(TrainersGone, match=r"died 3 times \(trainer_max_restarts: 2\)") as err:
        rt.lost({0: "gone"}, "step 3")
    assert "The last checkpoint is of step 4 (/ck/step_4)" in str(err.value)
    assert "--resume_from_checkpoint true" in str(err.value)
    assert [k for k, _ in events] == ["trainer_lost", "trainer_restarting"] * 2 + ["trainer_lost"]


def _ctx(tmp_path, log: list, ranks: list[_Rank], new: list[_Rank]) -> Any:
    events: list = []

    def place() -> list:
        log.append(("driver", "place"))
        return new

    rt = _restarts(tmp_path, events, [])
    rt.place = place
    rt.connect = lambda trainers, groups: log.append(("driver", f"connect {[t.name for t in trainers]}"))
    cfg = make_config(seq_len=16, max_model_len=16, max_tokens=8, pad_to_multiple_of=1)
    return SimpleNamespace(
        config=cfg, trainers=list(ranks), dp_ranks=[0, 1], dp_world_size=2, pad_token_id=0, row_multiple=1,
        share_prompts=False, supervisor=None, trainer_restarts=rt, events=events, cores=None,
    )  # fmt: skip


async def test_a_dead_rank_is_replaced_from_the_restore_point_and_the_call_goes_again(tmp_path):
    log: list = []
    ctx = _ctx(
        tmp_path, log, [_Rank("a0", log), _Rank("a1", log, dead=True)], [_Rank("b0", log), _Rank("b1", log)]
    )
    rt = ctx.trainer_restarts
    rt.checkpointed(2, "/ck/step_2")
    rt.trained(3, _samples(), {"loss": 3.0})

    async def train_step_4() -> Any:
        return await asyncio.gather(*[t.train_step.remote([], 4) for t in ctx.trainers])

    out = await _on_trainers(ctx, "the training of step 4", train_step_4)
    assert out == [{"loss": 4.0}, {"loss": 4.0}]
    assert log[:2] == [("a0", "train_step"), ("a1", "train_step")]
    after = [entry for entry in log if entry[1] != "ping"][2:]
    assert after == [
        ("driver", "place"),
        ("b0", "load_checkpoint"), ("b1", "load_checkpoint"),
        ("b0", "train_step"), ("b1", "train_step"),  # step 3 again, from its kept batch
        ("driver", "connect ['b0', 'b1']"),
        ("b0", "train_step"), ("b1", "train_step"),  # step 4, the call that failed
    ]  # fmt: skip
    restarted = dict(ctx.events)["trainer_restarted"]
    assert (restarted["replayed"], restarted["replay_max_diff"], restarted["from_step"]) == ([3], 0.0, 2)


async def test_a_call_that_fails_on_live_ranks_raises_its_own_error(tmp_path):
    log: list = []
    ranks = [_Rank("a0", log), _Rank("a1", log)]
    ranks[0].fail_train = 1
    ctx = _ctx(tmp_path, log, ranks, [])

    async def train() -> Any:
        return await asyncio.gather(*[t.train_step.remote([], 1) for t in ctx.trainers])

    with pytest.raises(RuntimeError, match="gloo"):
        await _on_trainers(ctx, "the training of step 1", train)
    assert ("driver", "place") not in log
    assert ctx.trainer_restarts.restarts == 0
