"""EvalRunner against the in-process fake server: completions per sample, sampling overrides,
eval metrics, pass@k aggregation, errors, multi-turn evals and held-out training indices; and when
things go wrong: unreachable or hung servers get no more requests, a hung or broken eval comes back failed
within ``timeout_s`` (never raises), a pass_k metric the eval never reports and a num_samples
beyond the dataset are warned about, and a bare ``pass_k`` list keeps to the success metrics."""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import Any

import pytest
from structlog.testing import capture_logs

from telescope_rollout import (
    EngineSettings,
    EvalRunner,
    EvalSpec,
    MultiEnvSampler,
    MultiTurnEnvironment,
    RewardResult,
    Sample,
    SamplerEntry,
    SingleTurnEnvironment,
    get_environment,
)
from telescope_rollout.envs import EvalMetricsResult
from telescope_rollout.evals._runner import DEFAULT_TIMEOUT_S, HUNG_AFTER_TIMEOUTS, _ServerHealth
from telescope_rollout.inference import ServerTimeoutError, ServerUnavailableError
from telescope_rollout.testing import FakeInferenceServer, FakeRequest

# successes per prompt q0..q3 among 4 completions
RIGHT = {0: 4, 1: 1, 2: 0, 3: 2}


class QuizEnv(SingleTurnEnvironment):
    """Prompts ``q<i>``; ``correct`` = the completion is ``a<i>``; a completion ``boom`` fails."""

    def load_dataset(self, num_samples: int = -1, **kw: Any) -> list[Sample]:
        return self._set_samples([Sample(f"q{i}", f"a{i}") for i in range(6)], num_samples)

    def compute_reward(self, completion: str, sample: Sample, eos_token: str = "") -> RewardResult:
        if completion == "boom":
            raise RuntimeError("scorer crashed")
        ok = float(completion == sample.answer)
        return RewardResult(ok, {"correct": ok, "chars": float(len(completion))})


def quiz_server(tokenizer, right: dict[int, int], boom: tuple[int, int] | None = None) -> FakeInferenceServer:
    """Answers prompt q<i> right for its first ``right[i]`` requests, wrong after."""
    seen: Counter[int] = Counter()

    def reply(req: FakeRequest) -> tuple[str, list[int]]:
        m = re.search(r"q(\d)", tokenizer.decode(req.prompt))
        assert m is not None
        i = int(m.group(1))
        n = seen[i]
        seen[i] += 1
        if boom == (i, n):
            return "boom", [7]
        return (f"a{i}", [5, 6]) if n < right.get(i, 0) else ("nope", [8, 9, 10])

    return FakeInferenceServer(server_urls=["http://fake-0", "http://fake-1"], reply=reply)


def settings(**kw: Any) -> EngineSettings:
    base = dict(max_tokens=16, max_model_len=256, temperature=1.0, top_p=0.9, group_size=2,
                max_concurrent_prompts_per_server=2, enable_thinking=None)  # fmt: skip
    return EngineSettings(**{**base, **kw})


def runner(tokenizer, server, *entries: Any, env: Any = None, **kw: Any) -> EvalRunner:
    env = env if env is not None else QuizEnv()
    r = EvalRunner(
        entries, tokenizer=tokenizer, client=server, settings=settings(**kw), environments={"quiz": env}
    )
    env.load_dataset(r.spec("quiz").num_samples)
    r.load()
    return r


PASS = {"at_k": {"metrics": ["correct"], "k": [1, 4]}, "pow_k": {"metrics": ["correct"], "k": [2]}}


async def test_pass_k_means_over_samples_and_metric_means_over_completions(tokenizer):
    server = quiz_server(tokenizer, RIGHT)
    r = runner(tokenizer, server, {"name": "quiz", "num_samples": 4, "pass_k": PASS})
    [res] = await r.run(step=10)
    assert res.name == "quiz"
    assert res.step == 10
    assert res.main_metric == "correct"
    m = res.metrics
    assert (m["samples"], m["completions"], m["errors"]) == (4.0, 16.0, 0.0)
    # right answers 4 + 1 + 0 + 2 = 7 of 16 completions
    assert m["correct"] == pytest.approx(7 / 16)
    # per prompt (n = 4): pass@1 = c/4 -> 1, .25, 0, .5; pass@4 -> 1, 1, 0, 1;
    # pass^2 = C(c,2)/C(4,2) -> 1, 0, 0, 1/6
    assert m["pass@1/correct"] == pytest.approx((1 + 0.25 + 0 + 0.5) / 4)
    assert m["pass@4/correct"] == pytest.approx(3 / 4)
    assert m["pass^2/correct"] == pytest.approx((1 + 1 / 6) / 4)
    # chars: right "a<i>" has 2, wrong "nope" 4: (7 * 2 + 9 * 4) / 16
    assert m["chars"] == pytest.approx((7 * 2 + 9 * 4) / 16)
    assert m["completion_tokens_mean"] == pytest.approx((7 * 2 + 9 * 3) / 16)
    assert "pass@1/chars" not in m  # metrics were named
    assert len(res.rows) == 16
    assert [(row["sample_index"], row["completion_index"]) for row in res.rows[:5]] == [
        (0, 0), (0, 1), (0, 2), (0, 3), (1, 0),
    ]  # fmt: skip
    row = res.rows[4]
    assert row["eval"] == "quiz"
    assert row["step"] == 10
    assert row["answer"] == "a1"
    assert json.loads(row["metrics_json"]) == {"correct": 1.0, "chars": 2.0}
    assert json.loads(row["pass_json"]) == pytest.approx({"pass@1/correct": 0.25, "pass@4/correct": 1.0,
                                                          "pass^2/correct": 0.0})  # fmt: skip
    assert json.loads(row["golden_answers_json"]) == {}
    # requests spread over both servers
    assert {q.url for q in server.requests} == {"http://fake-0", "http://fake-1"}


async def test_prompts_use_the_chat_template_and_the_eval_sampling_overrides(tokenizer):
    server = quiz_server(tokenizer, RIGHT)
    r = runner(tokenizer, server, {"name": "quiz", "num_samples": 2, "temperature": 0.5, "max_tokens": 8})
    [res] = await r.run(step=3)
    env = r.environments["quiz"]
    assert isinstance(env, QuizEnv)
    expected = env.format_prompt("q0", tokenizer)
    assert "<|im_start|>user" in expected  # the ChatML template of the test tokenizer
    assert res.rows[0]["prompt"] == expected
    assert server.requests[0].prompt == tokenizer.encode(expected)
    # no pass_k: one completion per sample; training top_p 0.9 kept, temperature and max_tokens overridden
    assert len(server.requests) == 2
    for q in server.requests:
        assert q.sampling == {"temperature": 0.5, "top_p": 0.9}
        assert q.max_tokens == 8
        assert q.request_id.startswith("eval-quiz-s3-")
        assert q.cache_salt == "telescope-w3"  # the servers hold step 3's weights: its prefix-cache salt
    assert res.metrics["correct"] == pytest.approx(1.0)  # RIGHT[0], RIGHT[1] >= 1


async def test_failed_completions_are_rows_but_not_in_the_means(tokenizer):
    server = quiz_server(tokenizer, RIGHT, boom=(1, 0))
    r = runner(tokenizer, server, {"name": "quiz", "num_samples": 2, "pass_k": [2]})
    [res] = await r.run(step=0)
    m = res.metrics
    assert (m["completions"], m["errors"]) == (4.0, 1.0)
    # valid: q0 -> a0, a0 (right); q1 -> (boom failed), nope -> correct 2/3
    assert m["correct"] == pytest.approx(2 / 3)
    # bare list of k: pass@2 over the success metrics. q0: n=2 c=2 -> 1; q1: n=1 < k, c=0 -> 0
    assert m["pass@2/correct"] == pytest.approx(0.5)
    # chars (2 or 4) is a count, no outcome: no pass@k of it, though it is > 0 everywhere
    assert "pass@2/chars" not in m
    failed = [row for row in res.rows if row["error"]]
    assert len(failed) == 1
    assert failed[0]["sample_index"] == 1
    assert failed[0]["error"] == "sample_error"


async def test_compute_eval_metrics_is_used_instead_of_the_reward(tokenizer):
    class Graded(QuizEnv):
        async def compute_eval_metrics(self, completion, sample, eos_token=""):
            return EvalMetricsResult({"graded": 0.25}, {"graded": sample.answer}, sample_tags={"t": "x"})

    server = quiz_server(tokenizer, RIGHT)
    r = runner(tokenizer, server, {"name": "quiz", "num_samples": 1}, env=Graded())
    [res] = await r.run(step=1)
    assert res.metrics["graded"] == 0.25
    assert "correct" not in res.metrics
    assert res.main_metric == "graded"
    assert json.loads(res.rows[0]["golden_answers_json"]) == {"graded": "a0"}
    assert json.loads(res.rows[0]["tags_json"]) == {"t": "x"}


async def test_multi_turn_eval_plays_the_whole_episode(tokenizer):
    class Chat(MultiTurnEnvironment):
        max_turns = 2

        def load_dataset(self, num_samples=-1, **kw):
            return self._set_samples([Sample("q0", "a0"), Sample("q1", "a1")], num_samples)

        def env_response(self, messages, state):
            return [{"role": "user", "content": "again"}]

        def compute_reward(self, state, eos_token=""):
            return RewardResult(1.0, {"turns": float(state.num_turns)})

    server = quiz_server(tokenizer, {0: 9, 1: 9})
    r = runner(tokenizer, server, {"name": "quiz"}, env=Chat())
    [res] = await r.run(step=2)
    assert res.metrics["turns"] == 2.0
    assert res.metrics["samples"] == 2.0
    assert [row["num_turns"] for row in res.rows] == [2, 2]
    assert len(server.requests) == 4
    assert server.requests[1].request_id.endswith("-turn-1")
    assert {q.cache_salt for q in server.requests} == {"telescope-w2"}  # every turn, salted by the step


async def test_several_evals_run_together_and_names_must_be_distinct(tokenizer):
    server = quiz_server(tokenizer, RIGHT)
    other = QuizEnv()
    other.load_dataset(1)
    r = EvalRunner(
        [{"name": "quiz"}, {"name": "quiz2"}],
        tokenizer=tokenizer, client=server, settings=settings(),
        environments={"quiz": QuizEnv(), "quiz2": other},
    )  # fmt: skip
    r.environments["quiz"].load_dataset(3)
    r.load()
    results = await r.run(step=5, names=["quiz2", "quiz"], servers=["http://fake-1"])
    assert [x.name for x in results] == ["quiz2", "quiz"]
    assert [x.metrics["samples"] for x in results] == [1.0, 3.0]
    assert {q.url for q in server.requests} == {"http://fake-1"}
    with pytest.raises(ValueError, match="distinct name"):
        EvalRunner([{"name": "a"}, {"name": "a"}], tokenizer=tokenizer, client=server, settings=settings())
    with pytest.raises(KeyError, match="no eval named"):
        await r.run(step=0, names=["missing"])


def test_spec_from_config_entry_and_sampling_overlay():
    from telescope_config import EvalEntry

    spec = EvalSpec.from_entry(EvalEntry(name="math500", eval_every=5, num_samples=3, top_p=0.5,
                                         pass_k=[4], kwargs={"split": "test"}))  # fmt: skip
    assert (spec.name, spec.eval_every, spec.num_samples, spec.pass_k.completions_per_sample) == (
        "math500", 5, 3, 4,
    )  # fmt: skip
    s = spec.sampling(settings(temperature=0.7))
    assert (s.temperature, s.top_p, s.max_tokens) == (0.7, 0.5, 16)


def test_separate_eval_samples_holds_out_the_same_dataset_under_any_name(tokenizer):
    # the training entry is named "my_math" (not the eval's name): matching by name would miss it
    train_math = get_environment("hendrycks_math", dataset="bundled")
    train_math.load_dataset()
    train_cd = get_environment("countdown", dataset="bundled")
    train_cd.load_dataset()
    r = EvalRunner(
        [
            {"name": "hendrycks_math", "num_samples": 3, "separate_eval_samples": True,
             "kwargs": {"dataset": "bundled"}},
            {"name": "deepscaler", "num_samples": 2, "separate_eval_samples": True,
             "kwargs": {"dataset": "bundled"}},
            {"name": "countdown", "num_samples": 2, "kwargs": {"dataset": "bundled"}},
        ],
        tokenizer=tokenizer, client=FakeInferenceServer(), settings=settings(),
    )  # fmt: skip
    r.load()
    held = r.exclusions({"my_math": train_math, "cd": train_cd})
    # deepscaler is another dataset (class) and countdown did not ask: only my_math loses 0, 1, 2
    assert held == {"my_math": [0, 1, 2]}
    sampler = MultiEnvSampler(
        [SamplerEntry("my_math", 1.0, len(train_math)), SamplerEntry("cd", 1.0, len(train_cd))],
        exclude=held,
    )
    assert list(sampler.candidates("my_math")) == list(range(3, len(train_math)))
    assert list(sampler.candidates("cd")) == list(range(len(train_cd)))
    # a different split is another dataset
    other = get_environment("hendrycks_math", dataset="bundled", split="test")
    other.load_dataset()
    assert r.exclusions({"other": other}) == {}


# ---------------------------------------------------------------------------- failures, warnings
def _warnings(logs: Sequence[Mapping[str, Any]], event: str) -> list[Mapping[str, Any]]:
    return [e for e in logs if e["log_level"] == "warning" and e["event"] == event]


async def test_an_unreachable_server_gets_no_more_requests(tokenizer):
    server = quiz_server(tokenizer, {i: 9 for i in range(4)})
    server.dead = {"http://fake-1"}
    r = runner(tokenizer, server, {"name": "quiz", "num_samples": 4, "pass_k": [2]})
    with capture_logs() as logs:
        [res] = await r.run(step=1)
    sent = [q.url for q in server.requests]
    # the first request to fake-1 failed; every later one went to fake-0
    assert sent.count("http://fake-1") == 1
    assert sent.count("http://fake-0") == 8 - 1
    assert (res.metrics["completions"], res.metrics["errors"]) == (8.0, 1.0)
    assert res.metrics["correct"] == 1.0
    assert not res.failed
    [lost] = [row for row in res.rows if row["error"]]
    assert lost["server"] == "http://fake-1"
    [warn] = _warnings(logs, "eval server unreachable: no more eval requests go to it in this run")
    assert (warn["eval"], warn["server"], warn["left"]) == ("quiz", "http://fake-1", ["http://fake-0"])
    # the next call tries it again (it may have been restarted)
    server.dead = set()
    server.requests.clear()
    await r.run(step=2)
    assert {q.url for q in server.requests} == {"http://fake-0", "http://fake-1"}


async def test_a_server_that_stops_answering_gets_no_more_requests(tokenizer):
    # fake-1 takes requests and never answers (each one times out): two in a row take it out
    server = quiz_server(tokenizer, {i: 9 for i in range(4)})
    server.hung = {"http://fake-1"}
    r = runner(tokenizer, server, {"name": "quiz", "num_samples": 4, "pass_k": [2]})
    with capture_logs() as logs:
        [res] = await r.run(step=1)
    sent = [q.url for q in server.requests]
    assert sent.count("http://fake-1") == HUNG_AFTER_TIMEOUTS == 2
    assert sent.count("http://fake-0") == 8 - 2
    assert (res.metrics["completions"], res.metrics["errors"]) == (8.0, 2.0)
    assert not res.failed
    [warn] = _warnings(logs, "eval server unreachable: no more eval requests go to it in this run")
    assert (warn["server"], warn["reason"]) == ("http://fake-1", "2 requests in a row got no answer in time")


async def test_a_server_reported_lost_gets_no_more_requests_in_the_calls_under_way(tokenizer):
    server = quiz_server(tokenizer, {i: 9 for i in range(4)})
    server.hold = lambda req: True  # every request waits until released
    r = runner(
        tokenizer,
        server,
        {"name": "quiz", "num_samples": 4, "pass_k": [2]},
        max_concurrent_prompts_per_server=1,
        group_size=1,
    )  # one request in flight per server
    call = asyncio.ensure_future(r.run(step=1))
    while len(server.pending) < 2:
        await asyncio.sleep(0)
    await asyncio.sleep(0.01)  # whatever else goes out before the loss
    before = [q.url for q in server.requests]
    assert "http://fake-1" in before
    r.server_lost("http://fake-1/")
    r.server_lost("http://fake-1")  # twice: marked once
    server.hold = None
    server.release()
    [res] = await call
    after = [q.url for q in server.requests][len(before) :]
    assert after
    assert set(after) == {"http://fake-0"}  # nothing more to the lost server in this call
    assert len(before) + len(after) == 8
    assert not res.failed
    assert r._calls == []
    r.server_lost("http://fake-1")  # no call under way: nothing to mark
    server.requests.clear()
    await r.run(step=2)  # a later call uses it again (restarted with current weights)
    assert {q.url for q in server.requests} == {"http://fake-0", "http://fake-1"}


def test_server_health_counts_timeouts_in_a_row_only():
    timeout = ServerTimeoutError("x: no answer", "x")
    health = _ServerHealth()
    assert health.record("a", timeout) is None  # one timeout: a slow answer, not a hung server
    assert health.record("a", None) is None  # an answer resets the count
    assert health.record("a", timeout) is None
    assert health.record("b", timeout) is None  # counted per server
    assert health.record("a", timeout) == "2 requests in a row got no answer in time"
    assert health.down == {"a"}
    assert health.record("a", timeout) is None  # already out: reported once
    assert health.record("c", ServerUnavailableError("c: refused", "c")) == "unreachable"
    assert health.down == {"a", "c"}


async def test_with_every_server_unreachable_the_rest_are_errors_not_requests(tokenizer):
    server = quiz_server(tokenizer, RIGHT)
    server.dead = {"http://fake-0", "http://fake-1"}
    r = runner(tokenizer, server, {"name": "quiz", "num_samples": 3, "pass_k": [2]})
    [res] = await r.run(step=1)
    assert len(server.requests) == 2  # one each, then nothing is sent
    assert (res.metrics["completions"], res.metrics["errors"]) == (6.0, 6.0)
    assert [row["error"] for row in res.rows] == ["rollout_error"] * 6


async def test_a_hung_eval_fails_after_timeout_s_and_the_others_still_report(tokenizer):
    # every request of "quiz" hangs (a server that accepts and never answers); "quiz2" is fine
    server = quiz_server(tokenizer, RIGHT)
    server.hold = lambda req: req.request_id.startswith("eval-quiz-")
    other = QuizEnv()
    other.load_dataset(2)
    quiz = QuizEnv()
    quiz.load_dataset(2)
    r = EvalRunner(
        [{"name": "quiz"}, {"name": "quiz2"}], tokenizer=tokenizer, client=server, settings=settings(),
        environments={"quiz": quiz, "quiz2": other}, timeout_s=0.3,
    )  # fmt: skip
    r.load()
    with capture_logs() as logs:
        hung, fine = await asyncio.wait_for(r.run(step=4), 30)
    assert hung.failed
    assert hung.error == "did not finish within 0.3 s (EvalRunner timeout_s)"
    assert hung.metrics["failed"] == 1.0
    assert hung.metrics["time_s"] >= 0.3
    assert hung.rows == []
    assert server.pending == []  # its requests were cancelled, none left waiting
    assert not fine.failed
    assert fine.metrics["samples"] == 2.0
    assert "failed" not in fine.metrics
    [warn] = _warnings(logs, "eval failed")
    assert (warn["eval"], warn["step"]) == ("quiz", 4)


async def test_an_eval_that_raises_comes_back_failed(tokenizer):
    class Broken(QuizEnv):
        def get_sample(self, idx: int) -> Sample:
            raise KeyError(f"row {idx} is corrupt")

    r = runner(tokenizer, quiz_server(tokenizer, RIGHT), {"name": "quiz", "num_samples": 2}, env=Broken())
    with capture_logs() as logs:
        [res] = await r.run(step=7)
    assert res.failed
    assert res.error == "KeyError: 'row 0 is corrupt'"
    assert _warnings(logs, "eval failed")[0]["error"] == "KeyError: 'row 0 is corrupt'"


def test_timeout_defaults_to_a_multiple_of_the_client_timeout(tokenizer):
    client: Any = SimpleNamespace(server_urls=["http://x"], timeout_s=1200.0)  # a client with a timeout
    assert EvalRunner([], tokenizer=tokenizer, client=client, settings=settings()).timeout_s == 4800.0
    fake = FakeInferenceServer()  # no per-request timeout
    assert (
        EvalRunner([], tokenizer=tokenizer, client=fake, settings=settings()).timeout_s == DEFAULT_TIMEOUT_S
    )
    assert EvalRunner([], tokenizer=tokenizer, client=fake, settings=settings(), timeout_s=5).timeout_s == 5
    with pytest.raises(ValueError, match="timeout_s must be > 0"):
        EvalRunner([], tokenizer=tokenizer, client=fake, settings=settings(), timeout_s=0)


async def test_a_pass_k_metric_the_eval_never_reports_is_warned_about_once(tokenizer):
    server = quiz_server(tokenizer, RIGHT)
    pass_k = {"at_k": {"metrics": ["corect", "correct"], "k": [2]}}  # a typo
    r = runner(tokenizer, server, {"name": "quiz", "num_samples": 2, "pass_k": pass_k})
    with capture_logs() as logs:
        [res] = await r.run(step=1)
        await r.run(step=2)
    [warn] = _warnings(logs, "pass_k names a metric the eval does not report: no pass metrics for it")
    assert (warn["eval"], warn["metric"], warn["reported"]) == ("quiz", "corect", ["chars", "correct"])
    assert "pass@2/correct" in res.metrics


def test_num_samples_beyond_the_dataset_is_warned_about(tokenizer):
    with capture_logs() as logs:
        r = runner(tokenizer, quiz_server(tokenizer, RIGHT), {"name": "quiz", "num_samples": 10})
    assert len(r.environments["quiz"]) == 6  # QuizEnv has 6 items
    [warn] = _warnings(logs, "eval dataset smaller than num_samples: evaluating all of it")
    assert (warn["eval"], warn["asked"], warn["available"]) == ("quiz", 10, 6)
    with capture_logs() as logs:
        runner(tokenizer, quiz_server(tokenizer, RIGHT), {"name": "quiz", "num_samples": 6})
    assert _warnings(logs, "eval dataset smaller than num_samples: evaluating all of it") == []


class Leveled(QuizEnv):
    """QuizEnv with a ``level`` metric, 1 for every item (so its values happen to lie in [0, 1] too)."""

    def compute_reward(self, completion: str, sample: Sample, eos_token: str = "") -> RewardResult:
        r = super().compute_reward(completion, sample, eos_token)
        return RewardResult(r.total_reward, {**r.sample_metrics, "level": 1.0})


async def test_bare_pass_k_list_uses_the_declared_success_metrics(tokenizer):
    class Declared(Leveled):
        success_metrics = ("correct",)

    r = runner(tokenizer, quiz_server(tokenizer, RIGHT), {"name": "quiz", "num_samples": 4, "pass_k": [4]},
               env=Declared())  # fmt: skip
    [res] = await r.run(step=1)
    assert sorted(k for k in res.metrics if k.startswith("pass")) == ["pass@4/correct"]
    assert res.metrics["pass@4/correct"] == pytest.approx(3 / 4)  # RIGHT: 3 of 4 prompts have a success
    # undeclared, every metric within [0, 1] throughout counts (here level too; chars is 2 or 4)
    r = runner(tokenizer, quiz_server(tokenizer, RIGHT), {"name": "quiz", "num_samples": 4, "pass_k": [4]},
               env=Leveled())  # fmt: skip
    [res] = await r.run(step=1)
    assert sorted(k for k in res.metrics if k.startswith("pass")) == ["pass@4/correct", "pass@4/level"]


def test_the_dedicated_evals_declare_correct_as_their_success_metric():
    from telescope_rollout import get_environment

    for name in ("math500", "aime_2024", "aime_2025", "gpqa_diamond"):
        assert get_environment(name).success_metrics == ("correct",), name


def test_an_agent_environment_as_an_eval_is_refused_with_the_reason(tokenizer):
    from telescope_rollout.envs.quickstart_agent import QuickstartAgentEnv

    agent = QuickstartAgentEnv(num_samples=3)
    agent.load_dataset()
    r = EvalRunner([{"name": "sums"}], tokenizer=tokenizer, client=FakeInferenceServer(), settings=settings(),
                   environments={"sums": agent})  # fmt: skip
    with pytest.raises(ValueError, match="'sums' is an agent environment: agents are not evaluated yet"):
        r.load()
