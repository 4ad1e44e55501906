"""In-training evals in the loop: the schedule, the servers each eval gets, and the records, with
fake engine, trainers and eval runner (no Ray, no vLLM)."""

from __future__ import annotations

import json
from types import SimpleNamespace
from typing import Any

import pyarrow.parquet as pq
import pytest

from telescope_cli._evals import EvalPlan, console_line, eval_servers
from telescope_cli._loop import LoopContext, training_loop
from telescope_cli._rundir import RunDir
from telescope_rollout import EvalResult, RolloutBatch, ScoredGroup, ScoredSample

SERVERS = ["http://s0", "http://s1", "http://s2"]


# --------------------------------------------------------------------------------------- schedule
def plan(**kw: Any) -> EvalPlan:
    base = dict(every=(("quiz", 2), ("other", 3)), number_of_steps=6)
    return EvalPlan(**{**base, **kw})


def test_schedule_baseline_periodic_and_final():
    p = plan()
    assert p.baseline() == ["quiz", "other"]
    # steps counted from 1: quiz after 2, 4, 6; other after 3, 6 (the original's (s+1) % every, s from 0)
    assert {s: p.after_step(s) for s in range(1, 7)} == {
        1: [], 2: ["quiz"], 3: ["other"], 4: ["quiz"], 5: [], 6: ["quiz", "other"],
    }  # fmt: skip
    # the final eval adds only the evals that did not already run at the last step
    p7 = plan(number_of_steps=7)
    assert p7.after_step(6) == ["quiz", "other"]
    assert p7.after_step(7) == ["quiz", "other"]  # both final, none periodic at 7
    p8 = plan(number_of_steps=8)
    assert p8.after_step(8) == ["quiz", "other"]  # quiz periodic, other final


def test_schedule_switches():
    assert plan(start_step=2).baseline() == []  # resumed: no baseline
    assert plan(before=False).baseline() == []
    assert plan(after=False).after_step(7 - 1) == ["quiz", "other"]  # both periodic at 6
    assert plan(after=False, number_of_steps=7).after_step(7) == []
    no_periodic = plan(periodic=False)
    assert [no_periodic.after_step(s) for s in range(1, 6)] == [[], [], [], [], []]
    assert no_periodic.after_step(6) == ["quiz", "other"]  # the final eval still runs


def test_servers_for_each_kind_of_eval():
    # periodic: the last eval_num_servers servers
    assert eval_servers(SERVERS, eval_num_servers=1, use_all_at_ends=True, end=False) == ["http://s2"]
    assert eval_servers(SERVERS, eval_num_servers=2, use_all_at_ends=True, end=False) == SERVERS[1:]
    # baseline and final: every server, unless told to keep to the eval servers
    assert eval_servers(SERVERS, eval_num_servers=1, use_all_at_ends=True, end=True) == SERVERS
    assert eval_servers(SERVERS, eval_num_servers=1, use_all_at_ends=False, end=True) == ["http://s2"]
    # no server reserved: baseline and final use them all (nothing trains then)
    assert eval_servers(SERVERS, eval_num_servers=0, use_all_at_ends=False, end=True) == SERVERS


def test_console_line_shows_the_main_metric_and_its_pass_metrics():
    r = EvalResult(
        "math500", 10,
        {"correct": 0.425, "level": 3.0, "pass@4/correct": 0.61, "pass@4/level": 1.0, "completions": 40.0,
         "errors": 2.0, "time_s": 12.34},
        [], "correct",
    )  # fmt: skip
    assert console_line(r) == (
        "eval math500 @ step 10: correct 0.425  pass@4/correct 0.610  (40 completions, 2 failed, 12.3 s)"
    )


# ----------------------------------------------------------------------------- loop with fakes
class FakeEngine:
    def __init__(self):
        self.version = 0
        self.running = False
        self.stopped_at_version: int | None = None
        self.step = 0

    async def __aenter__(self):
        self.running = True
        return self

    async def __aexit__(self, *exc):
        await self.stop()

    async def stop(self):
        if self.running:
            self.stopped_at_version = self.version
        self.running = False

    def weights_updated(self, v):
        self.version = v

    async def next_batch(self):
        assert self.running, "next_batch outside the engine's context"
        self.step += 1
        samples = [
            ScoredSample(group_id=self.step, sample_id=i, env_name="add", prompt_ids=[1, 2],
                         completion_ids=[3, 4], completion_mask=[1, 1], completion_logprobs=[-0.1, -0.2],
                         reward=float(i), advantage=i - 0.5)
            for i in range(2)
        ]  # fmt: skip
        return RolloutBatch(self.step - 1, [ScoredGroup(self.step, "add", samples)])

    def state_dict(self):
        return {}


class FakeClient:
    server_urls = SERVERS

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        return None


class _Remote:
    def __init__(self, fn):
        self.fn = fn

    def remote(self, *args):
        async def call():
            return self.fn(*args)

        return call()


class FakeTrainer:
    def __init__(self):
        self.train_step = _Remote(lambda shard, step: {"loss": 0.0, "grad_norm": 1.0})
        self.publish = _Remote(lambda step: {"bytes": 8})


class FakeRunner:
    """Records each call with the weight version live at that moment."""

    def __init__(self, engine: FakeEngine):
        self.engine = engine
        self.calls: list[tuple[int, list[str], list[str], int, bool]] = []

    async def run(self, *, step, names, servers):
        self.calls.append((step, list(names), list(servers), self.engine.version, self.engine.running))
        return [
            EvalResult(n, step, {"correct": step / 10, "completions": 2.0, "time_s": 0.5},
                       [{"step": step, "eval": n, "sample_index": 0, "completion": "x"}], "correct")
            for n in names
        ]  # fmt: skip


class FakeConsole:
    def __init__(self):
        self.lines: list[str] = []

    def start_training(self, first_step):
        pass

    def info(self, text):
        self.lines.append(text)

    def step(self, metrics):
        pass


class FakeWandb:
    def __init__(self):
        self.logged: list[tuple[int, dict[str, Any]]] = []

    def log(self, data, step):
        self.logged.append((step, dict(data)))


def loop_config(**kw: Any) -> SimpleNamespace:
    base = dict(
        number_of_steps=4, seq_len=64, pad_to_multiple_of=1, train_backend="fsdp",
        fsdp_context_parallel_size=1, checkpoint_every=0, advantage_norm="group", algorithm="grpo",
        filter_overlong=False, filter_gibberish=False, filter_repetition=False,
        evals=[SimpleNamespace(name="quiz", eval_every=2), SimpleNamespace(name="other", eval_every=3)],
        eval_before_training=True, eval_after_training=True, eval_num_servers=1,
        eval_start_end_use_all_servers=True,
    )  # fmt: skip
    return SimpleNamespace(**{**base, **kw})


def run_loop(tmp_path, start_step: int = 0, **kw: Any):
    engine = FakeEngine()
    runner = FakeRunner(engine)
    console = FakeConsole()
    wandb = FakeWandb()
    ctx = LoopContext(
        config=loop_config(**kw), engine=engine, client=FakeClient(), trainers=[FakeTrainer()], dp_ranks=[0],
        dp_world_size=1, run=RunDir(tmp_path / "run"), console=console, checkpoint_root=tmp_path / "ckpt",
        start_step=start_step, wandb=wandb, evals=runner,
    )  # fmt: skip
    return ctx, engine, runner, console, wandb


async def test_loop_runs_evals_on_the_policy_of_their_step_and_records_them(tmp_path):
    ctx, engine, runner, console, wandb = run_loop(tmp_path)
    await training_loop(ctx)
    # (step, evals, servers, weight version live, engine generating)
    assert runner.calls == [
        (0, ["quiz", "other"], SERVERS, 0, False),  # baseline: before any rollout, every server
        (2, ["quiz"], ["http://s2"], 2, True),  # periodic: after step 2's weights, the eval server
        (3, ["other"], ["http://s2"], 3, True),
        (4, ["quiz", "other"], SERVERS, 4, False),  # quiz periodic + other final; rollouts stopped
    ]
    assert engine.stopped_at_version == 4
    lines = ctx.run.read_metrics()
    assert [m["step"] for m in lines] == [0, 1, 2, 3, 4]
    assert lines[0]["eval/quiz/correct"] == 0.0
    assert lines[0]["eval/other/completions"] == 2.0
    assert not any(k.startswith("eval/") for k in lines[1])
    assert lines[2]["eval/quiz/correct"] == pytest.approx(0.2)
    assert "eval/other/correct" not in lines[2]
    assert lines[4]["eval/other/correct"] == pytest.approx(0.4)
    assert lines[4]["timing/eval_s"] >= 0
    # W&B gets the same numbers at the same steps
    assert wandb.logged[0] == (0, {
        "eval/quiz/correct": 0.0, "eval/quiz/completions": 2.0, "eval/quiz/time_s": 0.5,
        "eval/other/correct": 0.0, "eval/other/completions": 2.0, "eval/other/time_s": 0.5,
    })  # fmt: skip
    assert wandb.logged[3][0] == 3
    assert wandb.logged[3][1]["eval/other/correct"] == pytest.approx(0.3)
    # one parquet table per eval per step
    tables = sorted(
        p.relative_to(ctx.run.path).as_posix() for p in (ctx.run.path / "evals").rglob("*.parquet")
    )
    assert tables == [
        "evals/other/step_000000.parquet", "evals/other/step_000003.parquet",
        "evals/other/step_000004.parquet", "evals/quiz/step_000000.parquet",
        "evals/quiz/step_000002.parquet", "evals/quiz/step_000004.parquet",
    ]  # fmt: skip
    rows = pq.read_table(ctx.run.path / "evals/quiz/step_000002.parquet").to_pylist()
    assert rows == [{"step": 2, "eval": "quiz", "sample_index": 0, "completion": "x"}]
    assert console.lines[2] == "eval quiz @ step 2: correct 0.200  (2 completions, 0.5 s)"
    assert len(console.lines) == 6


async def test_resume_skips_the_baseline_and_zero_eval_servers_skip_periodic_evals(tmp_path):
    ctx, _engine, runner, _, _ = run_loop(tmp_path, start_step=2, eval_num_servers=0)
    await training_loop(ctx)
    assert runner.calls == [(4, ["quiz", "other"], SERVERS, 4, False)]
    assert [m["step"] for m in ctx.run.read_metrics()] == [3, 4]


async def test_no_evals_leaves_the_loop_as_it_was(tmp_path):
    ctx, _engine, _runner, console, _ = run_loop(tmp_path)
    ctx.evals = None
    await training_loop(ctx)
    assert [m["step"] for m in ctx.run.read_metrics()] == [1, 2, 3, 4]
    assert not (ctx.run.path / "evals").exists()
    assert console.lines == []
    assert json.dumps(ctx.run.read_metrics()).count("eval/") == 0
