"""The supervised steps' data: conversations read and checked up front, each step's batch by step."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

import pytest

from telescope_config import TelescopeConfig, defaults
from telescope_orchestrator.run.sft import SftDataError, SupervisedBatches, load_conversations
from telescope_rollout import Tokenizer

HELLO = [{"role": "user", "content": "Say hello."}, {"role": "assistant", "content": "Hello!"}]


def _config(data: str) -> TelescopeConfig:
    values = {**defaults(), "environments": [{"name": "countdown"}], "sft_steps": 1, "sft_dataset": data}
    return TelescopeConfig.model_validate(values)


def test_each_step_takes_the_next_conversations_of_a_seeded_pass():
    batches = SupervisedBatches([([i], [1]) for i in range(5)], batch_size=3, seed=7)
    steps = [batches.indices(k) for k in range(1, 6)]  # 15 positions: three passes of five
    flat = [i for s in steps for i in s]
    for p in range(3):
        assert sorted(flat[5 * p : 5 * p + 5]) == list(range(5))  # every pass is a permutation
    assert flat[:5] != flat[5:10]  # each pass has its own order
    assert (
        SupervisedBatches(batches.conversations, 3, seed=7).indices(4) == steps[3]
    )  # a function of the step
    assert SupervisedBatches(batches.conversations, 3, seed=8).indices(1) != steps[0]
    (sample, *_) = batches.samples(1)
    assert (list(sample.prompt_ids), sample.advantage, list(sample.completion_mask)) == ([], 1.0, [1])


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".parquet"])
def test_conversations_load_from_local_files(tmp_path: Path, tiny_model_dir: Path, suffix: str):
    rows = [{"messages": HELLO}, {"messages": [*HELLO[:1], {"role": "assistant", "content": "Hi!"}]}]
    path = tmp_path / f"data{suffix}"
    if suffix == ".jsonl":
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    elif suffix == ".json":
        path.write_text(json.dumps(rows))
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.Table.from_pylist(rows), path)
    tok = Tokenizer.from_pretrained(tiny_model_dir)
    conversations = load_conversations(_config(str(path)), tok)
    assert len(conversations) == 2
    ids, mask = conversations[0]
    assert tok.decode([t for t, m in zip(ids, mask, strict=True) if m]) == "Hello!<|im_end|>"


@pytest.mark.parametrize(
    ("content", "name", "match"),
    [
        ("x", "data.csv", "must be .jsonl, .json or .parquet"),
        (None, "missing.jsonl", "no such file"),
        ('{"text": "hi"}\n', "data.jsonl", r"row 0: no `messages` list"),
        (
            '{"messages": [{"role": "user", "content": "hi"}]}\n',
            "data.jsonl",
            "row 0: the conversation has no",
        ),
        ("", "data.jsonl", "holds no conversation"),
        ("{not json", "data.jsonl", "could not be read"),
    ],
)
def test_bad_data_names_the_file_and_row(tmp_path: Path, tiny_model_dir: Path, content, name, match):
    path = tmp_path / name
    if content is not None:
        path.write_text(content)
    with pytest.raises(SftDataError, match=match):
        load_conversations(_config(str(path)), Tokenizer.from_pretrained(tiny_model_dir))


# ------------------------------------------------------------------ the loop's supervised steps
class _Remote:
    def __init__(self, fn):
        self.fn = fn

    def remote(self, *args):
        async def call():
            return self.fn(*args)

        return call()


class _Trainer:
    """Records the steps it trains (with their objective), publishes and checkpoints."""

    def __init__(self):
        self.trained: list[tuple[int, str]] = []
        self.published: list[int] = []
        self.train_step = _Remote(self._train)
        self.publish = _Remote(lambda step, group="full": self.published.append(step) or {"bytes": 8})
        self.save_checkpoint = _Remote(lambda path, state: {"world_size": 1})
        self.drain_spans = _Remote(lambda: [])

    def _train(self, shard, step, objective):
        self.trained.append((step, objective))
        return {"loss": 1.0 / step}


class _Engine:
    """An engine a stopped run must never start (entering it fails the test)."""

    def __init__(self):
        self.versions: list[int] = []
        self.state: dict = {"step": 0, "version": 0}

    async def __aenter__(self):
        raise AssertionError("the engine started though no RL step was left")

    async def __aexit__(self, *exc):
        return None

    def weights_updated(self, v, servers=None):
        self.versions.append(v)

    def state_dict(self):
        return dict(self.state)

    def load_state_dict(self, state):
        self.state = dict(state)


class _Client:
    server_urls = ("http://s0",)

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        return None


class _Console:
    def start_training(self, first_step):
        pass

    def info(self, text):
        pass

    def step(self, metrics):
        pass


def _loop(tmp_path: Path, config: TelescopeConfig, engine: Any = None, stop_after: int | None = None):
    from telescope_orchestrator.record.lines import MetricsLines
    from telescope_orchestrator.record.rundir import RunDir
    from telescope_orchestrator.run.loop import LoopContext
    from telescope_orchestrator.run.weights import WeightUpdates

    trainer = _Trainer()
    run = RunDir(tmp_path / "run")
    conversations = [([5, 6, 7], [1, 1, 1]), ([8, 9], [0, 1])]
    weights = None
    if engine is not None:

        async def send(step, group):
            await trainer.publish.remote(step, group)
            return {}, ["http://s0"]

        weights = WeightUpdates({"full": ["http://s0"]}, engine, send)
    ctx = LoopContext(
        config=config, engine=engine, client=cast(Any, _Client()) if engine is not None else None,
        trainers=[trainer], dp_ranks=[0], dp_world_size=1, run=run, console=cast(Any, _Console()),
        checkpoint_root=tmp_path / "ckpt", weights=weights, lines=MetricsLines(run, None),
        sft=SupervisedBatches(conversations, batch_size=2, seed=0),
    )  # fmt: skip
    if stop_after is not None:
        ctx.stop_requested = lambda: ctx.last_step >= stop_after
    return ctx, trainer


async def test_a_run_of_supervised_steps_only_trains_and_checkpoints_with_no_engine(tmp_path: Path):
    from telescope_config.testing import make_config
    from telescope_orchestrator.run.loop import training_loop

    cfg = make_config(
        sft_steps=3, number_of_steps=3, sft_dataset="x.jsonl", checkpoint_every=2, eval_after_training=False
    )
    assert cfg.supervised_only
    ctx, trainer = _loop(tmp_path, cfg)
    await training_loop(ctx)
    assert trainer.trained == [(1, "sft"), (2, "sft"), (3, "sft")]
    assert trainer.published == []  # no server to send weights to
    lines = ctx.run.read_metrics()
    assert [m["step"] for m in lines] == [1, 2, 3]
    assert [m["sft/loss"] for m in lines] == [1.0, 0.5, pytest.approx(1 / 3)]
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["step_2", "step_3"]
    meta = json.loads((tmp_path / "ckpt" / "step_3" / "meta.json").read_text())
    assert meta["extra_state"] == {"engine": None}  # a run resuming it starts its engine fresh


async def test_a_run_stopped_in_its_supervised_steps_never_starts_the_engine(tmp_path: Path):
    from telescope_config.testing import make_config
    from telescope_orchestrator.run.loop import training_loop

    cfg = make_config(
        sft_steps=2, number_of_steps=4, sft_dataset="x.jsonl", checkpoint_every=0,
        eval_before_training=False, eval_after_training=False,
    )  # fmt: skip
    assert not cfg.supervised_only
    ctx, trainer = _loop(tmp_path, cfg, engine=_Engine(), stop_after=1)
    await training_loop(ctx)  # _Engine fails the test if entered
    assert ctx.stopped
    assert ctx.last_step == 1
    assert trainer.trained == [(1, "sft")]
    assert trainer.published == []  # the RL steps' weights were never needed


async def test_the_supervised_steps_weights_reach_the_servers_before_the_rl_steps(tmp_path: Path):
    from telescope_config.testing import make_config
    from telescope_orchestrator.run.loop import _supervised_steps

    cfg = make_config(sft_steps=2, number_of_steps=4, sft_dataset="x.jsonl", checkpoint_every=0)
    engine = _Engine()
    ctx, trainer = _loop(tmp_path, cfg, engine=engine)
    await _supervised_steps(ctx)
    assert trainer.trained == [(1, "sft"), (2, "sft")]
    assert trainer.published == [2]
    assert engine.state == {"step": 2, "version": 2}  # the engine counts on from the last supervised step
    assert engine.versions == [2]


def test_an_rl_run_resumes_a_checkpoint_of_supervised_steps_only_with_a_fresh_engine(tmp_path, monkeypatch):
    from telescope_orchestrator.record.rundir import RunDir
    from telescope_orchestrator.run import startup

    calls: list[tuple[str, tuple]] = []
    monkeypatch.setattr(startup, "call_all", lambda actors, method, *args: calls.append((method, args)))
    engine = _Engine()
    engine.state = {"step": 0, "version": 0, "sampler": {"drawn": 0}}  # a fresh engine's
    checkpoint = tmp_path / "checkpoints" / "step_24"
    checkpoint.mkdir(parents=True)
    meta = {"step": 24, "extra_state": {"engine": None}}  # what `telescope sft` writes
    run = RunDir(tmp_path / "run")
    assert startup._resume((checkpoint, meta), [object()], cast(Any, engine), run) == 24
    assert engine.state == {"step": 24, "version": 24, "sampler": {"drawn": 0}}
    assert calls == [("load_checkpoint", (str(checkpoint),)), ("publish", (24,))]
    calls.clear()
    assert startup._resume((checkpoint, meta), [object()], None, run) == 24  # `telescope sft` itself
    assert calls == [("load_checkpoint", (str(checkpoint),))]
