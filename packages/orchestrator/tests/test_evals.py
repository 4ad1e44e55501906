"""In-training evals in the loop: the schedule, the servers each eval gets, periodic evals on drained
servers beside training (weight groups ``full``/``training_only``), and the records, with fake
engine, trainers and eval runner (no Ray, no vLLM)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any, cast

import pyarrow.parquet as pq
import pytest

from telescope_config import TelescopeConfig
from telescope_config.testing import make_config
from telescope_orchestrator.record.lines import MetricsLines
from telescope_orchestrator.record.rundir import RunDir
from telescope_orchestrator.run.evals import EvalPlan, console_line, eval_servers
from telescope_orchestrator.run.loop import LoopContext, training_loop
from telescope_orchestrator.run.weights import WeightUpdates, weight_groups
from telescope_rollout import EvalResult, RolloutBatch, ScoredGroup, ScoredSample

SERVERS = ["http://s0", "http://s1", "http://s2"]


# --------------------------------------------------------------------------------------- schedule
def plan(**kw: Any) -> EvalPlan:
    base = dict(every=(("quiz", 2), ("other", 3)), number_of_steps=6)
    return EvalPlan(**{**base, **kw})


def test_schedule_baseline_periodic_and_final():
    p = plan()
    assert p.baseline() == ["quiz", "other"]
    # steps counted from 1: quiz after 2, 4, 6; other after 3, 6
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


def test_weight_groups_leave_the_eval_servers_out_of_training_only():
    assert weight_groups(SERVERS, has_evals=True, eval_num_servers=1) == {
        "full": SERVERS, "training_only": SERVERS[:2],
    }  # fmt: skip
    assert weight_groups(SERVERS, has_evals=True, eval_num_servers=2)["training_only"] == SERVERS[:1]
    # no periodic evals (none configured, 0 eval servers, or no server left to train): one group
    assert weight_groups(SERVERS, has_evals=False, eval_num_servers=1) == {"full": SERVERS}
    assert weight_groups(SERVERS, has_evals=True, eval_num_servers=0) == {"full": SERVERS}
    assert weight_groups(SERVERS, has_evals=True, eval_num_servers=3) == {"full": SERVERS}


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
    """Counts batches (``step``), tracks each server's weight version and the drained servers."""

    def __init__(self):
        self.version = 0
        self.running = False
        self.stopped_at_version: int | None = None
        self.step = 0
        self.server_versions = dict.fromkeys(SERVERS, 0)
        self.drained: set[str] = set()
        self.events: list[tuple[Any, ...]] = []

    async def __aenter__(self):
        self.running = True
        return self

    async def __aexit__(self, *exc):
        await self.stop()

    async def stop(self):
        if self.running:
            self.stopped_at_version = self.version
        self.running = False

    def weights_updated(self, v, servers=None):
        targets = SERVERS if servers is None else list(servers)
        assert set(SERVERS) - self.drained <= set(targets), "a server in the pool missed an update"
        for url in targets:
            self.server_versions[url] = v
        self.version = v

    async def drain_servers(self, servers, reason="eval_drain"):
        await asyncio.sleep(0)
        self.events.append(("drain", self.step, list(servers), reason))
        self.drained |= set(servers)
        return 0

    def restore_servers(self, servers):
        assert all(self.server_versions[u] == self.version for u in servers), "restored with old weights"
        self.events.append(("restore", self.step, list(servers)))
        self.drained -= set(servers)

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
        self.published: list[tuple[int, str]] = []
        self.train_step = _Remote(lambda shard, step, objective: {"loss": 0.0, "grad_norm": 1.0})
        self.publish = _Remote(self._publish)
        self.drain_spans = _Remote(lambda: [{"step": 1, "name": "train_step", "rank": 0}])

    def _publish(self, step, group="full"):
        self.published.append((step, group))
        return {"bytes": 8}


class FakeRunner:
    """Records each call: (step, evals, servers, the weight version its servers hold, whether
    rollouts run). With ``hold``, an eval run beside training lasts until training has taken
    ``hold`` more batches (or the last one); ``ends`` records (step, batches taken, the versions
    its servers hold) when it ends."""

    def __init__(self, engine: FakeEngine, number_of_steps: int, hold: int = 0):
        self.engine, self.number_of_steps, self.hold = engine, number_of_steps, hold
        self.calls: list[tuple[int, list[str], list[str], int, bool]] = []
        self.ends: list[tuple[int, int, set[int]]] = []
        self.fail_at: int | None = None

    def _versions(self, servers) -> set[int]:
        return {self.engine.server_versions[u] for u in servers}

    async def run(self, *, step, names, servers):
        (version,) = self._versions(servers)
        self.calls.append((step, list(names), list(servers), version, self.engine.running))
        until = min(step + self.hold, self.number_of_steps)
        while self.engine.running and self.engine.step < until:
            await asyncio.sleep(0)
        if step == self.fail_at:
            raise RuntimeError("eval server fell over")
        self.ends.append((step, self.engine.step, self._versions(servers)))
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


def loop_config(**kw: Any) -> TelescopeConfig:
    base = dict(
        number_of_steps=4, seq_len=64, max_model_len=64, max_tokens=32, pad_to_multiple_of=1,
        train_backend="fsdp", fsdp_context_parallel_size=1, checkpoint_every=0, advantage_norm="group",
        algorithm="grpo", filter_overlong=False, filter_gibberish=False, filter_repetition=False,
        evals=[{"name": "quiz", "eval_every": 2}, {"name": "other", "eval_every": 3}],
        eval_before_training=True, eval_after_training=True, eval_num_servers=1,
        eval_start_end_use_all_servers=True, model="tiny", checkpoint_save_training_state=True,
        checkpoint_keep_last=None, checkpoint_keep_every=None, event_upload_interval_seconds=5,
    )  # fmt: skip
    return make_config(**{**base, **kw})


def send_to(trainers: list[FakeTrainer], groups: dict[str, list[str]]):
    """A publish with no server supervisor: every trainer sends, every member of the group gets it."""

    async def send(step: int, group: str) -> tuple[dict[str, float], list[str]]:
        sync = await asyncio.gather(*[t.publish.remote(step, group) for t in trainers])
        return sync[0], groups[group]

    return send


def run_loop(tmp_path, start_step: int = 0, hold: int = 0, config: TelescopeConfig | None = None, **kw: Any):
    engine: Any = FakeEngine()
    engine.step = start_step  # batches taken so far: a resumed engine carries on from its state
    config = config or loop_config(**kw)
    runner: Any = FakeRunner(engine, config.number_of_steps, hold)
    console: Any = FakeConsole()
    wandb = FakeWandb()
    trainers = [FakeTrainer()]
    groups = weight_groups(SERVERS, has_evals=bool(config.evals), eval_num_servers=config.eval_num_servers)
    run = RunDir(tmp_path / "run")
    ctx = LoopContext(
        config=config, engine=engine, client=cast(Any, FakeClient()), trainers=trainers, dp_ranks=[0],
        dp_world_size=1, run=run, console=console, checkpoint_root=tmp_path / "ckpt",
        weights=WeightUpdates(groups, engine, send_to(trainers, groups)),
        lines=MetricsLines(run, wandb, start_step=start_step), start_step=start_step, evals=runner,
    )  # fmt: skip
    return ctx, engine, runner, console, wandb


async def test_loop_runs_evals_on_the_policy_of_their_step_and_records_them(tmp_path):
    ctx, engine, runner, console, wandb = run_loop(tmp_path)
    await training_loop(ctx)
    # (step, evals, servers, weight version its servers hold, engine generating)
    assert runner.calls == [
        (0, ["quiz", "other"], SERVERS, 0, False),  # baseline: before any rollout, every server
        (2, ["quiz"], ["http://s2"], 2, True),  # periodic: after step 2's weights, the eval server
        (3, ["other"], ["http://s2"], 3, True),  # waited for quiz@2, then got step 3's weights
        (4, ["quiz", "other"], SERVERS, 4, False),  # quiz periodic + other final; rollouts stopped
    ]
    assert engine.stopped_at_version == 4
    # every publish reached every server: each eval ended before the next publish
    assert ctx.trainers[0].published == [(1, "full"), (2, "full"), (3, "full"), (4, "full")]
    assert engine.events == [
        ("drain", 2, ["http://s2"], "eval_drain"),
        ("drain", 3, ["http://s2"], "eval_drain"),  # still drained: the next eval takes it at once
        ("restore", 4, ["http://s2"]),
    ]
    lines = ctx.run.read_metrics()
    # every eval gets a line of its own, written when it ends: periodic ones during the next step,
    # the final ones last, after step 4's own line
    assert [m["step"] for m in lines] == [0, 1, 2, 2, 3, 3, 4, 4]
    assert lines[0]["eval/quiz/correct"] == 0.0
    assert lines[0]["eval/other/completions"] == 2.0
    assert lines[0]["eval/step"] == 0
    assert not any(k.startswith("eval/") for k in lines[1] | lines[2])
    assert lines[3]["eval/quiz/correct"] == pytest.approx(0.2)
    assert lines[3]["eval/step"] == 2
    assert "eval/other/correct" not in lines[3]
    assert "reward/mean" not in lines[3]
    assert lines[5]["eval/other/correct"] == pytest.approx(0.3)
    assert lines[6]["timing/eval_s"] >= 0
    assert not any(k.startswith("eval/") for k in lines[6])
    assert lines[7]["eval/other/correct"] == pytest.approx(0.4)
    assert lines[7]["eval/quiz/correct"] == pytest.approx(0.4)
    assert lines[7]["eval/step"] == 4
    assert "reward/mean" not in lines[7]
    # W&B gets the same numbers; an eval that ends after later steps goes to the latest one
    assert wandb.logged[0] == (0, {
        "eval/quiz/correct": 0.0, "eval/quiz/completions": 2.0, "eval/quiz/time_s": 0.5,
        "eval/other/correct": 0.0, "eval/other/completions": 2.0, "eval/other/time_s": 0.5,
        "eval/step": 0,
    })  # fmt: skip
    assert [(s, d.get("eval/step")) for s, d in wandb.logged] == [
        (0, 0),
        (1, None),
        (2, None),
        (2, 2),
        (3, None),
        (3, 3),
        (4, None),
        (4, 4),
    ]
    assert wandb.logged[5][1]["eval/other/correct"] == pytest.approx(0.3)
    # one record file per eval per step
    tables = sorted(p.name for p in (ctx.run.path / "records" / "eval_samples").glob("*.parquet"))
    assert tables == [
        "step_000000-other.parquet", "step_000000-quiz.parquet", "step_000002-quiz.parquet",
        "step_000003-other.parquet", "step_000004-other.parquet", "step_000004-quiz.parquet",
    ]  # fmt: skip
    rows = pq.read_table(ctx.run.path / "records/eval_samples/step_000002-quiz.parquet").to_pylist()
    assert [(r["step"], r["eval"], r["sample_index"], r["completion"]) for r in rows] == [(2, "quiz", 0, "x")]
    assert console.lines[2] == "eval quiz @ step 2: correct 0.200  (2 completions, 0.5 s)"
    assert len(console.lines) == 6


async def test_periodic_evals_run_on_drained_servers_while_training_goes_on(tmp_path):
    # quiz every 3 of 7 steps: periodic after 3 and 6, final after 7; each eval lasts 2 batches
    ctx, engine, runner, _, _ = run_loop(
        tmp_path, number_of_steps=7, hold=2, evals=[{"name": "quiz", "eval_every": 3}]
    )
    await training_loop(ctx)
    assert runner.calls == [
        (0, ["quiz"], SERVERS, 0, False),
        (3, ["quiz"], ["http://s2"], 3, True),
        (6, ["quiz"], ["http://s2"], 6, True),
        (7, ["quiz"], SERVERS, 7, False),
    ]
    # (eval step, batches taken by then, versions its servers held): training took batches 4 and 5
    # during the eval at 3 while the eval server kept step 3's weights
    assert runner.ends[1:3] == [(3, 5, {3}), (6, 7, {6})]
    # step 4 published while the eval ran: training_only; step 5 found it done: full, and s2 rejoined
    assert ctx.trainers[0].published == [
        (1, "full"), (2, "full"), (3, "full"), (4, "training_only"), (5, "full"), (6, "full"), (7, "full"),
    ]  # fmt: skip
    assert engine.events == [
        ("drain", 3, ["http://s2"], "eval_drain"),
        ("restore", 5, ["http://s2"]),
        ("drain", 6, ["http://s2"], "eval_drain"),
        ("restore", 7, ["http://s2"]),  # the last step waited for the eval at 6
    ]
    assert engine.server_versions == dict.fromkeys(SERVERS, 7)
    lines = ctx.run.read_metrics()
    train = [m for m in lines if "reward/mean" in m]
    assert [m["step"] for m in train] == [1, 2, 3, 4, 5, 6, 7]
    assert [m["weight_sync/training_only"] for m in train] == [0.0, 0.0, 0.0, 1.0, 0.0, 0.0, 0.0]
    evals = [(m["step"], m["eval/step"], m["eval/quiz/correct"]) for m in lines if "eval/step" in m]
    # baseline, periodic at 3 (ends during step 5) and 6 (during 7), final after step 7's line
    assert evals == [(0, 0, 0.0), (3, 3, 0.3), (6, 6, 0.6), (7, 7, 0.7)]
    assert [m["step"] for m in lines] == [0, 1, 2, 3, 4, 3, 5, 6, 6, 7, 7]


async def test_a_failed_periodic_eval_is_recorded_and_training_goes_on(tmp_path):
    ctx, engine, runner, console, _ = run_loop(
        tmp_path, number_of_steps=7, hold=2, evals=[{"name": "quiz", "eval_every": 3}]
    )
    runner.fail_at = 3
    await training_loop(ctx)  # no error: the run trains to the end
    lines = ctx.run.read_metrics()
    assert [m["step"] for m in lines] == [0, 1, 2, 3, 4, 3, 5, 6, 6, 7, 7]
    failed = lines[5]
    assert failed == {"step": 3, "time": failed["time"], "eval/quiz/failed": 1.0, "eval/step": 3}
    assert [m.get("eval/quiz/failed") for m in lines if "eval/step" in m] == [None, 1.0, None, None]
    assert "eval quiz @ step 3: FAILED (RuntimeError: eval server fell over)" in console.lines
    # the eval server rejoined training after the failed eval, as after one that worked
    assert engine.events[:2] == [("drain", 3, ["http://s2"], "eval_drain"), ("restore", 5, ["http://s2"])]
    assert engine.server_versions == dict.fromkeys(SERVERS, 7)
    assert not engine.running


async def test_a_failed_final_eval_keeps_the_last_step_and_its_checkpoint(tmp_path):
    ctx, _engine, runner, _, _ = run_loop(
        tmp_path, eval_num_servers=0, evals=[{"name": "quiz", "eval_every": 100}], checkpoint_every=2
    )
    saved = []
    ctx.trainers[0].save_checkpoint = _Remote(lambda directory, training_state: saved.append(directory) or {})
    runner.fail_at = 4
    await training_loop(ctx)
    lines = ctx.run.read_metrics()
    assert [m["step"] for m in lines] == [0, 1, 2, 3, 4, 4]
    assert "reward/mean" in lines[4]
    assert lines[5]["eval/quiz/failed"] == 1.0
    assert [Path(d).name for d in saved] == ["step_2.tmp", "step_4.tmp"]
    assert (ctx.run.path / "records" / "samples" / "step_000004.parquet").is_file()


async def test_ctrl_c_during_the_final_eval_keeps_the_last_step_and_its_checkpoint(tmp_path):
    ctx, _engine, runner, _, _ = run_loop(
        tmp_path, eval_num_servers=0, evals=[{"name": "quiz", "eval_every": 100}], checkpoint_every=2
    )
    saved = []
    ctx.trainers[0].save_checkpoint = _Remote(lambda directory, training_state: saved.append(directory) or {})
    started = asyncio.Event()

    async def hang(*, step, names, servers):
        if step == 4:
            started.set()
            await asyncio.sleep(3600)
        return []

    runner.run = hang
    task = asyncio.create_task(training_loop(ctx))
    await asyncio.wait_for(started.wait(), 10)
    task.cancel()  # what asyncio.run does on Ctrl-C
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 10)
    assert [m["step"] for m in ctx.run.read_metrics()] == [1, 2, 3, 4]
    assert [Path(d).name for d in saved] == ["step_2.tmp", "step_4.tmp"]


async def test_ctrl_c_while_waiting_for_a_periodic_eval_still_records_the_trained_step(tmp_path):
    # quiz every 2 of 4 steps; the eval at 2 never ends: step 4 (the last) waits for it
    ctx, _engine, runner, _, _ = run_loop(
        tmp_path, eval_num_servers=1, evals=[{"name": "quiz", "eval_every": 2}]
    )
    trained = []
    ctx.trainers[0].train_step = _Remote(lambda shard, step, objective: trained.append(step) or {"loss": 0.0})

    async def hang(*, step, names, servers):
        await asyncio.sleep(3600 if step == 2 else 0)
        return []

    runner.run = hang
    task = asyncio.create_task(training_loop(ctx))
    while trained != [1, 2, 3, 4]:
        await asyncio.sleep(0.01)
    for _ in range(20):
        await asyncio.sleep(0)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(task, 10)
    lines = ctx.run.read_metrics()
    assert [m["step"] for m in lines] == [1, 2, 3, 4]
    assert "weight_sync/bytes" not in lines[3]  # stopped before its publish
    assert lines[3]["loss"] == 0.0
    assert _eval_tasks() == []


def _eval_tasks() -> list[asyncio.Task[Any]]:
    return [t for t in asyncio.all_tasks() if t.get_name().startswith("evals-") and not t.done()]


async def test_a_failed_checkpoint_keeps_the_step_and_leaves_no_eval_running(tmp_path):
    # quiz every 3; the checkpoint of step 3 fails: its records are written first, its eval never starts
    ctx, _engine, runner, _, _ = run_loop(
        tmp_path, number_of_steps=7, hold=100, evals=[{"name": "quiz", "eval_every": 3}],
        checkpoint_every=3,
    )  # fmt: skip

    def save(directory, training_state):
        raise OSError("disk full")

    ctx.trainers[0].save_checkpoint = _Remote(save)
    with pytest.raises(OSError, match="disk full"):
        await training_loop(ctx)
    assert [m["step"] for m in ctx.run.read_metrics()] == [0, 1, 2, 3]
    assert _eval_tasks() == []
    assert [c[0] for c in runner.calls] == [0]


async def test_a_step_that_fails_beside_a_periodic_eval_stops_it(tmp_path):
    ctx, _engine, runner, _, _ = run_loop(
        tmp_path, number_of_steps=7, hold=100, evals=[{"name": "quiz", "eval_every": 3}]
    )

    def train(shard, step, objective):
        if step == 5:
            raise RuntimeError("trainer died")
        return {"loss": 0.0}

    ctx.trainers[0].train_step = _Remote(train)
    with pytest.raises(RuntimeError, match="trainer died"):
        await training_loop(ctx)
    assert [c[0] for c in runner.calls] == [0, 3]
    assert runner.ends[1:] == []  # the eval at 3 was cancelled, not left running
    assert _eval_tasks() == []
    assert ctx.eval_schedule is not None
    assert ctx.eval_schedule.running is None


async def test_periodic_evals_need_a_server_left_for_training(tmp_path):
    # the config's rules refuse this already (model_copy skips them); the loop checks the servers it has
    ctx, _, runner, _, _ = run_loop(tmp_path, config=loop_config().model_copy(update={"eval_num_servers": 3}))
    with pytest.raises(ValueError, match="eval_num_servers is 3 with 3 server"):
        await training_loop(ctx)
    assert runner.calls == []


async def test_resume_skips_the_baseline_and_zero_eval_servers_skip_periodic_evals(tmp_path):
    ctx, _engine, runner, _, _ = run_loop(tmp_path, start_step=2, eval_num_servers=0)
    await training_loop(ctx)
    assert runner.calls == [(4, ["quiz", "other"], SERVERS, 4, False)]
    assert [m["step"] for m in ctx.run.read_metrics()] == [3, 4, 4]


async def test_no_evals_leaves_the_loop_as_it_was(tmp_path):
    ctx, _engine, _runner, console, _ = run_loop(tmp_path)
    ctx.evals = None
    await training_loop(ctx)
    assert [m["step"] for m in ctx.run.read_metrics()] == [1, 2, 3, 4]
    assert not (ctx.run.path / "evals").exists()
    assert console.lines == []
    assert json.dumps(ctx.run.read_metrics()).count("eval/") == 0


async def test_resumed_at_the_last_step_runs_final_evals_that_never_ended(tmp_path):
    # the run was killed after its step-4 checkpoint, while its final evals ran: no eval line for 4
    ctx, _engine, runner, _, _ = run_loop(tmp_path, start_step=4, eval_num_servers=0)
    ctx.run.append_metrics({"step": 4, "loss": 0.1})
    await training_loop(ctx)
    assert [(step, names) for step, names, *_ in runner.calls] == [(4, ["quiz", "other"])]
    assert [m["step"] for m in ctx.run.read_metrics()] == [4, 4]
    assert ctx.run.read_metrics()[-1]["eval/step"] == 4


async def test_resumed_at_a_periodic_eval_step_runs_the_evals_that_never_ended(tmp_path):
    # killed during quiz@2 after the step-2 checkpoint: resumed, it evaluates step 2's weights first
    ctx, _engine, runner, _, _ = run_loop(tmp_path, start_step=2)
    ctx.run.append_metrics({"step": 2, "loss": 0.1})
    await training_loop(ctx)
    assert runner.calls[0] == (2, ["quiz"], SERVERS, 2, False)  # every server, before rollouts start
    assert [(step, names) for step, names, *_ in runner.calls[1:]] == [(3, ["other"]), (4, ["quiz", "other"])]
    eval_steps = [m["eval/step"] for m in ctx.run.read_metrics() if "eval/step" in m]
    assert eval_steps == [2, 3, 4]


async def test_resumed_at_a_step_without_evals_or_with_recorded_ones_runs_none_first(tmp_path):
    ctx, _engine, runner, _, _ = run_loop(tmp_path, start_step=1)  # nothing is due after step 1
    await training_loop(ctx)
    assert [step for step, *_ in runner.calls] == [2, 3, 4]
    ctx, _engine, runner, _, _ = run_loop(tmp_path / "b", start_step=2)
    ctx.run.append_metrics({"step": 2, "eval/step": 2, "eval/quiz/failed": 1.0})  # ran (and failed)
    await training_loop(ctx)
    assert [step for step, *_ in runner.calls] == [3, 4]


async def test_resumed_after_the_final_evals_does_not_repeat_them(tmp_path):
    ctx, _engine, runner, _, _ = run_loop(tmp_path, start_step=4, eval_num_servers=0)
    ctx.run.append_metrics({"step": 4, "loss": 0.1})
    ctx.run.append_metrics({"step": 4, "eval/step": 4, "eval/quiz/correct": 0.5})
    await training_loop(ctx)
    assert runner.calls == []
    assert [m["step"] for m in ctx.run.read_metrics()] == [4, 4]
