"""Hub dataset rows, shaped as the hub datasets have them, through our row mappings (no network).

Row shapes: countdown reads ``nums``/``target``;
hendrycks_math ``prompt`` + JSON-string ``verification_info.ground_truth``; dapo_math
``prompt[0].content`` + ``reward_model.ground_truth`` (dict or JSON string); deepscaler
``problem``/``answer``; wordle has no hub dataset (secret words drawn from its word list).
"""

import json
from typing import Any

import pytest

from telescope_rollout import Sample, get_environment
from telescope_rollout.envs import _data
from telescope_rollout.envs._data import HubDatasetEnv


def _hub_env(name: str, **kwargs: Any) -> HubDatasetEnv:
    env = get_environment(name, **kwargs)
    assert isinstance(env, HubDatasetEnv)
    return env


def _sample(env: HubDatasetEnv, row: dict[str, Any]) -> Sample:
    s = env.row_to_sample(row)
    assert s is not None
    return s


# --- countdown -----------------------------------------------------------------------------------
def test_countdown_row():
    env = _hub_env("countdown")
    s = _sample(env, {"target": 98, "nums": [44, 19, 35]})
    assert s.answer == "98"
    assert s.metadata == {"question": s.prompt, "nums": [44, 19, 35], "target": 98}
    assert "[44, 19, 35]" in s.prompt
    assert "equals 98" in s.prompt
    for bad in [{"nums": [1, 2]}, {"nums": "1 2", "target": 3}, {"nums": [1, None], "target": 3}, {}]:
        assert env.row_to_sample(bad) is None
    # The alias kwarg names (as INTELLECT-3 configs spell them) select the dataset.
    named = _hub_env("countdown", dataset_name="me/cd", dataset_subset="default", dataset_split="test")
    assert (named.dataset, named.subset, named.split) == ("me/cd", "default", "test")


# --- math ----------------------------------------------------------------------------------------
HENDRYCKS_ROW = {
    "problem_id": "hendrycks_math_1",
    "task_type": "verifiable_math",
    "prompt": "What is $\\frac{1}{4} + \\frac{1}{4}$?",
    "verification_info": json.dumps({"ground_truth": "\\frac{1}{2}"}),
}
DAPO_ROW = {
    "data_source": "math_dapo",
    "prompt": [{"content": "Find the sum of 15 and 19.", "role": "user"}],
    "ability": "MATH",
    "reward_model": {"ground_truth": "34", "style": "rule-lighteval/MATH_v2"},
    "extra_info": {"index": "a1"},
}
DEEPSCALER_ROW = {"problem": "What is 3/4 of 1?", "answer": "\\frac{3}{4}", "solution": "3/4."}


@pytest.mark.parametrize(
    ("name", "row", "question", "answer"),
    [
        ("hendrycks_math", HENDRYCKS_ROW, HENDRYCKS_ROW["prompt"], "\\frac{1}{2}"),
        ("dapo_math", DAPO_ROW, "Find the sum of 15 and 19.", "34"),
        ("deepscaler", DEEPSCALER_ROW, "What is 3/4 of 1?", "\\frac{3}{4}"),
    ],
)
async def test_math_rows(name, row, question, answer):
    env = _hub_env(name)
    s = _sample(env, row)
    assert (s.prompt, s.answer) == (question, answer)
    assert s.metadata["question"] == question
    good = await env.score(f"<think>...</think> The answer is $\\boxed{{{answer}}}$.", s)
    assert good.total_reward == 1.0
    assert good.golden_answers == {"correct": answer}


def test_math_row_variants_and_rejects():
    h, d, ds = (_hub_env(n) for n in ("hendrycks_math", "dapo_math", "deepscaler"))
    # verification_info / reward_model may also come parsed, or as JSON text.
    assert _sample(h, {**HENDRYCKS_ROW, "verification_info": {"ground_truth": "7"}}).answer == "7"
    as_text = {**DAPO_ROW, "reward_model": json.dumps(DAPO_ROW["reward_model"])}
    assert _sample(d, as_text).answer == "34"
    assert _sample(d, DAPO_ROW).metadata["data_source"] == "math_dapo"
    # Rows without a usable question or answer are skipped.
    rejects = [
        (h, {**HENDRYCKS_ROW, "verification_info": "{broken"}),
        (h, {**HENDRYCKS_ROW, "verification_info": json.dumps({"ground_truth": 7})}),
        (h, {**HENDRYCKS_ROW, "prompt": None}),
        (d, {**DAPO_ROW, "reward_model": {"ground_truth": ""}}),
        (d, {**DAPO_ROW, "reward_model": {"ground_truth": 34}}),
        (d, {**DAPO_ROW, "reward_model": None}),
        (d, {**DAPO_ROW, "prompt": "not a chat"}),
        (d, {**DAPO_ROW, "prompt": []}),
        (ds, {**DEEPSCALER_ROW, "answer": ""}),
        (ds, {**DEEPSCALER_ROW, "problem": None}),
    ]
    for env, row in rejects:
        assert env.row_to_sample(row) is None, row


def test_hub_load_skips_bad_rows_and_takes_the_alias_kwargs(monkeypatch):
    seen = []

    def fake_hub_rows(name, subset=None, split="train"):
        seen.append((name, subset, split))
        empty = {"problem": "", "answer": "1"}
        return [empty, DEEPSCALER_ROW, {"problem": "q2", "answer": "2"}, DEEPSCALER_ROW]

    monkeypatch.setattr(_data, "hub_rows", fake_hub_rows)  # what every hub-backed built-in reads
    env = get_environment("deepscaler", dataset_name="me/ds", dataset_subset="default", dataset_split="test")
    samples = env.load_dataset(num_samples=2)
    assert seen == [("me/ds", "default", "test")]
    assert [s.answer for s in samples] == ["\\frac{3}{4}", "2"]  # the empty problem is skipped
    assert len(env) == 2

    monkeypatch.setattr(_data, "hub_rows", lambda *a, **k: [{"nums": [1, 2], "target": 3}])
    (s,) = get_environment("countdown").load_dataset()
    assert s.metadata["nums"] == [1, 2]


# --- wordle --------------------------------------------------------------------------------------
def test_wordle_samples_are_seeded_secret_words():
    env = get_environment("wordle", num_samples=50, seed=3)
    samples = env.load_dataset()
    assert len(samples) == 50
    for s in samples:
        assert len(s.answer) == 5
        assert s.answer.isalpha()
        assert s.answer.islower()
        assert s.metadata == {"secret_word": s.answer}
    again = [s.answer for s in get_environment("wordle", num_samples=50, seed=3).load_dataset()]
    assert again == [s.answer for s in samples]  # seeded
    assert len(get_environment("wordle").load_dataset(num_samples=7)) == 7
