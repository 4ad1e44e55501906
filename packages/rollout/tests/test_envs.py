import asyncio

import pytest

from telescope_rollout import RunResult, Sample, SandboxLike, TrajectoryStep, get_environment
from telescope_rollout.envs.countdown import equation_reward, format_reward, safe_eval
from telescope_rollout.envs.quickstart_add import score_addition
from telescope_rollout.envs.wordle import feedback, parse_guess, word_list


# --- countdown -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("x</think><answer>(1 + 2) * 3</answer>", 1.0),
        ("x</think>\n<answer>1+2</answer>\n", 1.0),
        ("x</think><answer>one plus two</answer>", 0.5),
        ("<answer>1+2</answer>", 0.0),  # no </think>
        ("x</think><answer>1</answer> trailing", 0.0),
        ("", 0.0),
    ],
)
def test_countdown_format(completion, expected):
    assert format_reward(completion) == expected


@pytest.mark.parametrize(
    ("answer", "expected"),
    [
        ("(95 - 5) / 2 + 1", 1.0),
        ("1 + (95 - 5) / 2", 1.0),
        ("95 - 5 / 2 + 1", 0.0),  # wrong value
        ("(95 - 5) / 2", 0.0),  # misses a number
        ("(95 - 5) / 2 + 1 + 1", 0.0),  # uses 1 twice
        ("__import__('os')", 0.0),
        ("9**9**9", 0.0),
        ("1/0 + 95 + 5 + 2", 0.0),
        ("(" * 150 + "1" + ")" * 150, 0.0),
        ("４６", 0.0),  # fullwidth digits
    ],
)
def test_countdown_equation(answer, expected):
    assert equation_reward(f"<answer>{answer}</answer>", [95, 5, 2, 1], 46) == expected


def test_safe_eval_total():
    assert safe_eval("2*(3+4)") == 14.0
    assert safe_eval("1e309") is None
    assert safe_eval("-(-2)") == 2.0
    assert safe_eval("") is None


async def test_countdown_env_bundled():
    env = get_environment("countdown", dataset="bundled")
    samples = env.load_dataset(num_samples=5)
    assert len(samples) == 5 == len(env)
    s = samples[0]
    nums = s.metadata["nums"]
    assert str(nums[0]) in s.prompt
    assert s.answer in s.prompt
    r = await env.score("hm</think><answer>0</answer><|endoftext|>", s, eos_token="<|endoftext|>")
    assert r.sample_metrics == {"_format_reward": 1.0, "_equation_reward": 0.0}
    assert r.golden_answers == {"_equation_reward": s.answer}
    assert len(env.load_dataset()) >= 30


# --- math ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["hendrycks_math", "dapo_math", "deepscaler"])
async def test_math_envs(name, tokenizer):
    env = get_environment(name, dataset="bundled")
    s = env.load_dataset()[0]
    assert s.answer == "39"
    prompt = env.format_prompt(s.prompt, tokenizer)
    assert "\\boxed{}" in prompt
    good = await env.score(f"<think>\\boxed{{1}}</think> so \\boxed{{{s.answer}}}<|im_end|>", s, "<|im_end|>")
    assert good.total_reward == 1.0
    assert good.golden_answers == {"correct": "39"}
    for bad in [
        "\\boxed{38}",
        "39",
        "\\boxed{39",
        "<think>\\boxed{39}</think>",
        "",
        "\\boxed{" + "9" * 600 + "}",
    ]:
        assert (await env.score(bad, s)).total_reward == 0.0


def test_hub_without_datasets_names_the_extra(monkeypatch):
    import builtins

    real = builtins.__import__

    def fake(name, *a, **k):
        if name == "datasets":
            raise ImportError("no")
        return real(name, *a, **k)

    monkeypatch.setattr(builtins, "__import__", fake)
    with pytest.raises(ImportError, match=r"telescope-rollout\[datasets\]"):
        get_environment("deepscaler").load_dataset(num_samples=2)


def test_math_row_mappings():
    from telescope_rollout.envs.boxed_math import DapoMathEnv, DeepScalerEnv, HendrycksMathEnv

    h = HendrycksMathEnv().row_to_sample({"prompt": "p", "verification_info": '{"ground_truth": "3"}'})
    d = DapoMathEnv().row_to_sample({"prompt": [{"content": "p"}], "reward_model": {"ground_truth": 4}})
    ds = DeepScalerEnv().row_to_sample({"problem": "p", "answer": "5"})
    assert (h.answer, d.answer, ds.answer) == ("3", "4", "5")


# --- quickstart_add ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("completion", "reward"),
    [
        ("42", 1.0),
        (" 42.\n", 1.0),
        ("<think>4+38</think>42", 1.0),
        ("The answer is 42.", 0.5),
        ("42 is the answer, not 41", 0.0),
        ("4 2", 0.0),
        ("forty-two", 0.0),
        ("042", 0.0),  # leading zeros are not the number it asked for
        ("", 0.0),
        ("9" * 100_000, 0.0),
    ],
)
def test_quickstart_scores(completion, reward):
    assert score_addition(completion, "42")[0] == reward


async def test_quickstart_env_deterministic():
    a = get_environment("quickstart_add", num_samples=20, seed=3)
    b = get_environment("quickstart_add", num_samples=20, seed=3)
    assert [s.prompt for s in a.load_dataset()] == [s.prompt for s in b.load_dataset()]
    s = a.get_sample(0)
    assert s.prompt.endswith("Reply with just the number.")
    r = await a.score(s.answer + "<|endoftext|>", s)
    assert r.total_reward == 1.0
    assert r.sample_metrics == {"exact": 1.0, "correct": 1.0}


# --- wordle --------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("guess", "secret", "fb"),
    [
        ("crane", "crane", "GGGGG"),
        ("speed", "abide", "XXYXY"),
        ("eerie", "there", "YXYXG"),  # one spare e: only the first e is yellow
        ("llama", "hello", "YYXXX"),
        ("zzzzz", "crane", "XXXXX"),
    ],
)
def test_wordle_feedback(guess, secret, fb):
    assert feedback(guess, secret) == fb


def test_wordle_parse_and_words():
    assert parse_guess("<think><guess>wrong</guess></think> <guess>[Crane]</guess>") == "crane"
    assert parse_guess("no tag") is None
    assert parse_guess("<guess></guess>") == ""
    words = word_list()
    assert len(words) > 300
    assert all(len(w) == 5 for w in words)


def _say(state, text):
    state.trajectory.append(TrajectoryStep(prompt=[], completion=[{"role": "assistant", "content": text}]))
    return [{"role": "assistant", "content": text}]


async def test_wordle_game_solved():
    env = get_environment("wordle", num_samples=3)
    s = env.load_dataset()[0]
    state = env.create_initial_state(s)
    assert env.get_initial_prompt(s)[0]["role"] == "system"
    first = "abcde" if s.answer != "abcde" else "vwxyz"
    reply, done, _ = await env.step(_say(state, f"<guess>[{first}]</guess>"), state)
    assert not done
    assert "You have 5 guesses left." in reply[0]["content"]
    reply, done, reason = await env.step(_say(state, f"<guess>{s.answer}</guess>"), state)
    assert done
    assert reason == "game_over"
    assert "Solved" in reply[0]["content"]
    r = await env.score(state)
    m = r.sample_metrics
    assert m["_reward_correct"] == 1.0
    assert m["_reward_length"] == 0.5
    assert m["_reward_partial"] == 0.0
    assert m["format_reward"] == 1.0
    assert r.total_reward == pytest.approx(1.0 + 0.5 + 0.2)
    assert r.golden_answers["_reward_correct"] == s.answer


async def test_wordle_invalid_moves_and_turn_limit():
    env = get_environment("wordle", num_samples=1, max_turns=3)
    s = Sample("Make your first guess.", "crane")
    state = env.create_initial_state(s)
    reply, done, _ = await env.step(_say(state, "I think CRANE"), state)
    assert not done
    assert "Invalid move" in reply[0]["content"]
    reply, done, reason = await env.step(_say(state, "<guess>toolong</guess>"), state)
    assert done
    assert reason == "game_over"
    r = await env.score(state)
    assert r.sample_metrics["_reward_correct"] == 0.0

    state = env.create_initial_state(s)
    for word in ["track", "brace", "grace"]:
        reply, done, reason = await env.step(_say(state, f"<guess>{word}</guess>"), state)
    assert done
    assert reason in ("game_over", "max_turns_reached")
    r = await env.score(state)
    # last feedback grace vs crane: XGGYG -> 3 G, 1 Y -> 0.2*3 + 0.1*1 = 0.7
    assert r.sample_metrics["_reward_partial"] == pytest.approx(0.7)


# --- i3_code -------------------------------------------------------------------------------------
class FakeSandbox:
    """Runs the 'program' as a Python function of stdin, in-process (tests only)."""

    def __init__(self, fail_times=0):
        self.calls = 0
        self.fail_times = fail_times

    async def run(self, code, *, language="python", stdin="", timeout_s=10.0, memory_mb=512):
        self.calls += 1
        if self.calls <= self.fail_times:
            raise ConnectionError("sandbox down")
        await asyncio.sleep(0)
        if "while True" in code:
            return RunResult("", "", -9, True, timeout_s)
        if "raise" in code:
            return RunResult("", "Traceback: boom", 1, False, 0.01)
        return RunResult(code.replace("print(", "").rstrip(")\n").strip() + "\n", "", 0, False, 0.01)


def _one_test_sample(output):
    return Sample("p", "", {"tests": [{"input": "", "output": output}, {"input": "x", "output": output}]})


async def test_i3_code_with_fake_sandbox():
    sb = FakeSandbox()
    assert isinstance(sb, SandboxLike)
    env = get_environment("i3_code", dataset="bundled", sandbox=sb)
    assert len(env.load_dataset()) >= 10
    ok = await env.score("```python\nprint(7)\n```", _one_test_sample("7"))
    assert ok.total_reward == 1.0
    assert ok.sample_metrics["pass_rate"] == 1.0
    assert {t["info_key"] for t in ok.info_turns} == {"generated_code", "test_summary"}
    wrong = await env.score("```python\nprint(8)\n```", _one_test_sample("7"))
    assert wrong.total_reward == 0.0
    assert wrong.sample_metrics["pass_rate"] == 0.0
    crash = await env.score("```python\nraise\n```", _one_test_sample("7"))
    assert crash.sample_metrics["num_errors"] == 2
    assert any(t["info_type"] == "stderr" for t in crash.info_turns)
    slow = await env.score("```python\nwhile True: pass\n```", _one_test_sample("7"))
    assert slow.sample_metrics["num_timeouts"] == 2
    none = await env.score("no code here", _one_test_sample("7"))
    assert none.total_reward == 0.0
    assert none.info_turns[0]["info_value"] == "no python code block"


async def test_i3_code_sandbox_errors_and_missing_sandbox():
    env = get_environment("i3_code", dataset="bundled", sandbox=FakeSandbox(fail_times=100), max_retries=2)
    r = await env.score("```python\nprint(7)\n```", _one_test_sample("7"))
    assert r.total_reward == 0.0
    assert r.sample_metrics["sandbox_error"] == 1.0
    flaky = get_environment("i3_code", sandbox=FakeSandbox(fail_times=1), max_concurrent_tests=1)
    r = await flaky.score("```python\nprint(7)\n```", _one_test_sample("7"))
    assert r.total_reward == 1.0
    assert r.sample_metrics["retry_count"] == 1
    with pytest.raises(RuntimeError, match="sandbox"):
        await get_environment("i3_code").prepare_resources()


def test_i3_code_reads_the_hub_row_layout():
    import json

    from telescope_rollout.envs.i3_code import _tests_from_row

    # INTELLECT-3-RL code rows: `info` is a JSON string whose `tests` is a JSON string again.
    stdin_row = {
        "question": "q",
        "info": json.dumps({"tests": json.dumps({"inputs": ["1 2\n"], "outputs": ["3\n"]})}),
    }
    assert _tests_from_row(stdin_row) == [{"input": "1 2\n", "output": "3\n"}]
    fn_row = {
        "question": "q",
        "info": json.dumps({"tests": json.dumps({"fn_name": "add", "inputs": [[1, 2]], "outputs": [3]})}),
    }
    assert _tests_from_row(fn_row) == [{"input": "[1, 2]", "output": "3", "fn_name": "add"}]


def test_function_call_results_compare_as_json():
    from telescope_rollout.envs.i3_code import call_result_matches

    assert call_result_matches("debug print\n\n[1, 2]\n", "[1, 2]")
    assert call_result_matches("\n3\n", "[3]")  # a result wrapped in a one-item list
    assert not call_result_matches("\n[2, 1]\n", "[1, 2]")
    assert not call_result_matches("", "3")
    assert not call_result_matches("not json", "3")
    assert not call_result_matches("\n3\n", "{broken")
