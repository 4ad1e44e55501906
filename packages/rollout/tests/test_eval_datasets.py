"""The dedicated evals (math500, aime_2024, aime_2025, gpqa_diamond): hub-shaped rows through
``row_to_sample``, their scoring, hub loading with a stand-in for ``datasets`` (no network), and
their place in the registry."""

from __future__ import annotations

from typing import Any

import pytest

from telescope_rollout import Sample, get_environment, list_environments
from telescope_rollout.envs import evals
from telescope_rollout.envs.evals import BOXED_SUFFIX, HubEval, extract_choice

# Shapes of the hub rows (column names and types as the hub serves them)
MATH500_ROW = {
    "problem": "What is $\\frac{1}{4} + \\frac{1}{4}$?",
    "solution": "Add: $\\frac{2}{4} = \\frac{1}{2}$.",
    "answer": "\\frac{1}{2}",
    "subject": "Prealgebra",
    "level": 2,
    "unique_id": "test/prealgebra/1.json",
}
AIME24_ROW = {
    "id": 60,
    "problem": "Find the remainder.",
    "solution": "...",
    "answer": "204",
    "url": "u",
    "year": "2024",
}
AIME25_ROW = {"question": "Find the sum of all bases.", "answer": "70"}
GPQA_ROW = {
    "Question": "Which particle is a lepton?",
    "Correct Answer": "Electron",
    "Incorrect Answer 1": "Proton",
    "Incorrect Answer 2": "Neutron",
    "Incorrect Answer 3": "Pion",
    "Record ID": "rec1",
}


def _eval_env(name: str) -> HubEval:
    env = get_environment(name)
    assert isinstance(env, HubEval)
    return env


def _sample(env: HubEval, row: dict[str, Any]) -> Sample:
    s = env.row_to_sample(row)
    assert s is not None
    return s


async def test_math500_row_prompt_and_metrics():
    env = _eval_env("math500")
    s = _sample(env, MATH500_ROW)
    assert s.prompt == MATH500_ROW["problem"] + BOXED_SUFFIX
    assert s.answer == "\\frac{1}{2}"
    right = await env.compute_eval_metrics("<think>2/4</think> so \\boxed{\\frac{1}{2}}", s, "")
    assert right.metrics == {"correct": 1.0, "level": 2.0}
    assert right.golden_answers == {"correct": "\\frac{1}{2}"}
    assert right.sample_tags == {"subject": "Prealgebra"}
    wrong = await env.compute_eval_metrics("\\boxed{3}", s, "")
    assert wrong.metrics["correct"] == 0.0
    # "Level 4" strings also give the level
    assert _sample(env, {**MATH500_ROW, "level": "Level 4"}).metadata["level"] == 4.0
    assert env.row_to_sample({"problem": "x"}) is None


async def test_aime_rows():
    s24 = _sample(_eval_env("aime_2024"), AIME24_ROW)
    assert (s24.prompt, s24.answer) == ("Find the remainder." + BOXED_SUFFIX, "204")
    env25 = _eval_env("aime_2025")
    s25 = _sample(env25, AIME25_ROW)
    assert (s25.prompt, s25.answer) == ("Find the sum of all bases." + BOXED_SUFFIX, "70")
    assert (await env25.compute_eval_metrics("\\boxed{70}", s25, "")).metrics == {"correct": 1.0}
    assert _sample(_eval_env("aime_2024"), {**AIME24_ROW, "answer": 204}).answer == "204"


async def test_gpqa_row_shuffles_choices_and_reads_the_last_answer_line():
    env = _eval_env("gpqa_diamond")
    s = _sample(env, GPQA_ROW)
    assert isinstance(s.prompt, str)
    assert s.prompt.startswith(evals.GPQA_INSTRUCTION + "Which particle is a lepton?\n\n")
    lines = s.prompt.splitlines()[-4:]
    assert [line[:3] for line in lines] == ["A) ", "B) ", "C) ", "D) "]
    assert sorted(line[3:] for line in lines) == ["Electron", "Neutron", "Pion", "Proton"]
    # the answer letter points at the correct choice
    assert f"{s.answer}) Electron" in lines
    assert _sample(env, GPQA_ROW).answer == s.answer  # same seed, same order
    right = await env.compute_eval_metrics(f"<think>Answer: X</think>so... Answer: {s.answer}", s, "")
    assert right.metrics == {"correct": 1.0}
    other = "A" if s.answer != "A" else "B"
    assert (await env.compute_eval_metrics(f"Answer: {s.answer}\nAnswer: {other}", s, "")).metrics == {
        "correct": 0.0
    }
    assert env.row_to_sample({"Question": "q"}) is None


@pytest.mark.parametrize(
    ("text", "letter"),
    [
        ("Answer: C", "C"),
        ("answer: (B)", "B"),
        ("Answer: $D$", "D"),
        ("Answer: (D)", "D"),
        ("ANSWER: A.", "A"),
        ("Answer:A\nAnswer: B", "B"),
        ("Answer: C\nThe answer: definitely C", "C"),  # the last real answer counts
        ("none", ""),
        # no letter standing alone after "Answer:": no answer (these scored B and D before)
        ("Answer: because it is a lepton", ""),
        ("The answer: definitely C", ""),
        ("answer: $b$", ""),  # the letters are upper case
        ("Answer: Both are right", ""),
        ("Answer: A1", ""),
    ],
)
def test_extract_choice(text, letter):
    assert extract_choice(text) == letter


def test_hub_loading_concatenates_subsets_and_takes_the_first_items(monkeypatch):
    calls = []

    def fake_hub_rows(name, subset=None, split="train"):
        calls.append((name, subset, split))
        return [{"question": f"{subset}-{i}", "answer": str(i)} for i in range(15)]

    monkeypatch.setattr(evals, "hub_rows", fake_hub_rows)
    env = get_environment("aime_2025")
    samples = env.load_dataset()
    assert len(samples) == 30
    assert len(env) == 30
    assert samples[15].metadata["question"] == "AIME2025-II-0"
    assert calls == [
        ("opencompass/AIME2025", "AIME2025-I", "test"),
        ("opencompass/AIME2025", "AIME2025-II", "test"),
    ]
    calls.clear()
    first = get_environment("aime_2025").load_dataset(num_samples=3)
    assert [s.answer for s in first] == ["0", "1", "2"]
    # math500 from its own dataset and split
    monkeypatch.setattr(
        evals, "hub_rows", lambda n, s=None, split="x": calls.append((n, s, split)) or [MATH500_ROW]
    )
    assert len(get_environment("math500").load_dataset()) == 1
    assert calls[-1] == ("HuggingFaceH4/MATH-500", None, "test")


def test_gpqa_letters_do_not_depend_on_how_many_items_are_loaded(monkeypatch):
    rows = [{**GPQA_ROW, "Question": f"q{i}"} for i in range(6)]
    monkeypatch.setattr(evals, "hub_rows", lambda *a, **k: list(rows))
    all_six = [s.answer for s in get_environment("gpqa_diamond").load_dataset()]
    first_two = [s.answer for s in get_environment("gpqa_diamond").load_dataset(num_samples=2)]
    assert first_two == all_six[:2]


def test_dedicated_evals_are_registered_as_kind_eval():
    rows = {r["name"]: r for r in list_environments()}
    for name in ("math500", "aime_2024", "aime_2025", "gpqa_diamond"):
        assert rows[name]["kind"] == "eval"
        assert "error" not in rows[name]
