"""Every reward function and parser on tricky inputs: empty, unicode, huge, adversarial, almost right.

Expected values are worked out by hand from each function's documented rule.
"""

import pytest

from telescope_rollout import RolloutState, Sample, get_environment
from telescope_rollout.envs import TrajectoryStep, verify_math_answer
from telescope_rollout.envs._math import braces_balanced
from telescope_rollout.envs.boxed_math import MathEnv, score_math
from telescope_rollout.envs.countdown import CountdownEnv, equation_reward, format_reward
from telescope_rollout.envs.quickstart_add import QuickstartAddEnv, score_addition
from telescope_rollout.envs.wordle import WordleEnv, _format_one, feedback, parse_guess
from telescope_rollout.parsers import (
    extract_answer_tags,
    extract_boxed_answer,
    extract_code_block,
    extract_last_number,
    strip_think_tags,
    verify_exact_match,
)

GARBAGE = [
    "",
    "\x00\x01\ufffd",
    "🙂" * 10_000,
    "a" * 1_000_000,
    "<think>" * 10_000,
    "\\boxed{" * 10_000,
    "<answer>" * 10_000 + "</answer>",
    "<guess>" * 10_000,
    "\ud800 lone surrogate",
]


@pytest.mark.parametrize("text", GARBAGE, ids=range(len(GARBAGE)))
async def test_every_single_turn_reward_is_total_and_in_range(text):
    countdown = get_environment("countdown", dataset="bundled")
    assert isinstance(countdown, CountdownEnv)
    cd_sample = countdown.load_dataset(num_samples=1)[0]
    r = await countdown.score(text, cd_sample, eos_token="<|im_end|>")
    assert r.total_reward in (0.0, 0.5)  # garbage can at most look like a half-right format
    math_sample = Sample("q", "42")
    for name in ("hendrycks_math", "dapo_math", "deepscaler"):
        math_env = get_environment(name)
        assert isinstance(math_env, MathEnv)
        assert (await math_env.score(text, math_sample)).total_reward == 0.0
    q = get_environment("quickstart_add")
    assert isinstance(q, QuickstartAddEnv)
    assert (await q.score(text, Sample("What is 40 + 2?", "42"))).total_reward == 0.0


async def test_wordle_rewards_on_garbage_turns():
    env = get_environment("wordle", num_samples=1)
    assert isinstance(env, WordleEnv)
    sample = Sample("Make your first guess.", "crane")
    state = env.create_initial_state(sample)
    for text in GARBAGE[:4]:
        msgs = [{"role": "assistant", "content": text}]
        state.trajectory.append(TrajectoryStep(prompt=[], completion=msgs))
        _, done, _ = await env.step(msgs, state)
        if done:
            break
    r = await env.score(state)
    # Two invalid moves end the game: nothing solved, no feedback, format scores only from length.
    assert state.is_completed
    assert r.sample_metrics["_reward_correct"] == 0.0
    assert r.sample_metrics["_reward_partial"] == 0.0
    # format per message: "" -> 0.2 (short), "\x00\x01\ufffd" -> 0.2 (short): mean 0.2 (two turns ran)
    assert r.sample_metrics["format_reward"] == pytest.approx(0.2)
    assert r.total_reward == pytest.approx(0.2 * 0.2)


# --- almost-right answers ------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("completion", "answer", "ok"),
    [
        ("\\boxed{42}", "42", True),
        ("\\boxed{ 42 }", "42", True),
        ("\\boxed{-42}", "42", False),
        ("\\boxed{42.0001}", "42", False),
        # The plain checker drops all whitespace before comparing ("4 2" -> "42") and runs before
        # math-verify (which would read 4*2): counted right. Pinned so a change is noticed.
        ("\\boxed{4 2}", "42", True),
        ("\\boxed{\\frac{6}{8}}", "\\frac{3}{4}", True),
        ("\\boxed{0.333}", "\\frac{1}{3}", False),
        ("\\boxed{42} <think>", "42", True),
        ("<think>\\boxed{42}</think>", "42", False),  # only reasoning: nothing after </think>
        ("\\boxed{42}\\boxed{41}", "42", False),  # the last box counts
        ("\\boxed{42", "42", False),
        ("\\boxed{東京}", "東京", True),
    ],
)
def test_math_almost_right(completion, answer, ok):
    assert score_math(completion, answer).total_reward == float(ok)


def test_math_adversarial_predictions_are_rejected_fast():
    assert not braces_balanced("{" * 400)
    assert not braces_balanced("}{")
    assert braces_balanced("\\frac{1}{2}")
    # Unbalanced input never reaches math-verify (which would wait out its 5 s parse timeout).
    assert not verify_math_answer("{" * 400, "1")
    assert not verify_math_answer("\\frac{1}{", "1")
    assert not verify_math_answer("x" * 501, "x" * 501)


@pytest.mark.parametrize(
    ("answer", "nums", "target", "expected"),
    [
        ("44 + 19 + 35", [44, 19, 35], 98, 1.0),
        ("44 + 19 + 34", [44, 19, 35], 97, 0.0),  # right value, wrong number
        ("44 + 19 + 35 = 98", [44, 19, 35], 98, 0.0),  # "=" is not arithmetic; 98 also counts as a number
        ("44+19+35.0", [44, 19, 35], 98, 0.0),  # 35.0 reads as the numbers 35 and 0
        ("(44 + 19 + 35)", [44, 19, 35], 98, 1.0),
        ("４４ + 19 + 35", [44, 19, 35], 98, 0.0),  # fullwidth digits
        ("", [1], 1, 0.0),
        ("1/3*3", [1, 3, 3], 1, 1.0),  # float rounding within 1e-5
    ],
)
def test_countdown_almost_right(answer, nums, target, expected):
    assert equation_reward(f"<think>x</think><answer>{answer}</answer>", nums, target) == expected


@pytest.mark.parametrize(
    ("completion", "expected"),
    [
        ("é</think><answer>1 + 2</answer>", 1.0),
        ("x</think><answer>1 + 2</answer><answer>3</answer>", 0.5),  # the answer group spans both tags
        # Fullwidth digits are Unicode digits (\d), so the format counts as arithmetic; the
        # equation reward then fails to evaluate them (test_countdown_almost_right).
        ("x</think> <answer>１+２</answer>", 1.0),
        ("x</think>\n\n<answer>\n1\n</answer>\n\n", 1.0),
        ("x</think>" + "<answer>1</answer>" * 2, 0.5),
    ],
)
def test_countdown_format_tricky(completion, expected):
    assert format_reward(completion) == expected


@pytest.mark.parametrize(
    ("completion", "reward"),
    [
        ("４２", 0.0),  # fullwidth digits are not ASCII
        ("42\n\n", 1.0),
        ("-42", 0.0),
        ("42.0", 0.5),  # not bare; the last number is 42 (trailing zeros dropped)
        ("4.2e1", 0.0),
        ("<think>42</think>", 0.0),
        ("The answer is 42 🙂", 0.5),
    ],
)
def test_quickstart_almost_right(completion, reward):
    assert score_addition(completion, "42")[0] == reward


def test_wordle_tricky_guesses_and_format():
    assert parse_guess("<guess>[CRÂNE]</guess>") == "crâne"  # parsed; rejected later as not ASCII
    assert parse_guess("<guess>" * 5_000 + "crane</guess>") == "crane"
    assert parse_guess("<think><guess>crane</guess>") == "crane"  # unclosed think: all text counts
    assert parse_guess("") is None
    assert feedback("speed", "abide") == "XXYXY"  # first e: Y, second e: X (abide has one e); d: Y
    assert feedback("eerie", "there") == "YXYXG"  # hand-worked: duplicates counted once each
    # one tag (0.4) + five letters (0.2) + ends with the tag (0.2) + short (0.2) = 1.0
    assert _format_one("<think>long " * 100 + "</think><guess>crane</guess>") == pytest.approx(1.0)
    assert _format_one("<guess>crane</guess> and more") == pytest.approx(0.8)
    assert _format_one("<guess>a</guess><guess>b</guess>") == pytest.approx(0.2)
    assert _format_one("x" * 201) == 0.0


# --- parsers -------------------------------------------------------------------------------------
def test_parsers_on_tricky_text():
    assert strip_think_tags("<think>unclosed") == "<think>unclosed"
    assert strip_think_tags("") == ""
    assert strip_think_tags("</think>") == ""
    assert extract_boxed_answer("\\boxed{\\{1,2\\}}") == "\\{1,2\\}"  # escaped braces balance
    assert extract_boxed_answer("\\boxed{a}" + "x" * 1_000_000) == "a"
    assert extract_answer_tags("<answer>" + "🙂" * 1000 + "</answer>") == "🙂" * 1000
    assert extract_code_block("```python\n```") == ""
    assert extract_code_block("```PYTHON\nx\n```") == "x\n"
    assert extract_last_number("1e5") == "5"  # scientific notation is not read as one number
    assert extract_last_number("٣ and 3") == "3"
    assert verify_exact_match("a\u00a0b", "a b")  # unicode whitespace collapses too
    assert not verify_exact_match("ab", "a b")


def test_rollout_state_helpers_on_empty_trajectories():
    state = RolloutState(sample=Sample("q"), env_name="x")
    assert state.num_turns == 0
    assert state.get_full_completion_ids() == []
