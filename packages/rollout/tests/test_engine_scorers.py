"""Teachers and reference models: the engine scores every finished sample's tokens with them."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from engine_fakes import by_sample_parity, make_engine

from telescope_rollout.engine import TokenArray
from telescope_rollout.inference import InferenceError, ServedScorer, TokenScorer
from telescope_rollout.inference._client import parse_prompt_logprobs
from telescope_rollout.testing import FakeInferenceServer


async def test_every_sample_gets_each_scorers_logprobs_of_its_completion(tokenizer):
    server = FakeInferenceServer(reply=by_sample_parity)
    # the teacher gives token i of the whole sequence -i/100; the reference -1 everywhere
    teacher = FakeInferenceServer(server_urls=["http://teacher-0", "http://teacher-1"])
    teacher.prompt_logprob = lambda ids, i: -i / 100
    ref = FakeInferenceServer(server_urls=["http://ref-0"])
    ref.prompt_logprob = lambda ids, i: -1.0
    scorers = [ServedScorer(teacher, name="teacher"), ServedScorer(ref, name="ref")]
    engine = make_engine(tokenizer, server, scorers=scorers, group_size=2, prompts_batch_size_for_trainer=2)
    async with engine:
        batch = await engine.next_batch(timeout_s=10)
    for s in batch.samples:
        n = len(s.prompt_ids)
        assert s.completion_ids == [10 + s.sample_id % 2, 3]
        assert s.teacher_logprobs == [-n / 100, -(n + 1) / 100]
        assert s.ref_logprobs == [-1.0, -1.0]
        assert "score_s" in s.timings
    # each scorer saw every sample's whole sequence (more groups may have finished), over its servers
    sequences = {(*s.prompt_ids, *s.completion_ids) for s in batch.samples}
    assert sequences <= {tuple(ids) for _, ids in teacher.scored}
    assert sequences <= {tuple(ids) for _, ids in ref.scored}
    assert len(teacher.scored) == len(ref.scored)
    assert {url for url, _ in teacher.scored} == {"http://teacher-0", "http://teacher-1"}


async def test_a_failing_scorer_fails_its_sample_with_the_reason(tokenizer):
    server = FakeInferenceServer(reply=by_sample_parity)
    teacher = FakeInferenceServer(server_urls=["http://teacher-0"], dead={"http://teacher-0"})
    engine = make_engine(
        tokenizer, server, scorers=[ServedScorer(teacher, name="teacher")], max_consecutive_unfit_prompts=1
    )
    async with engine:
        with pytest.raises(Exception, match="teacher model's server failed"):
            await engine.next_batch(timeout_s=10)


class _Returns(TokenScorer):
    """A user's scorer that returns ``value`` for any sequence."""

    name = "ref"

    def __init__(self, value: Any) -> None:
        self.value = value

    async def score(self, prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> Any:
        return self.value


@pytest.mark.parametrize(
    ("value", "detail"),
    [
        ([-1.0], "the ref scorer returned 1 logprobs for 2 tokens"),
        (["x", "y"], "the ref scorer returned list, not a list of floats"),
        (None, "the ref scorer returned NoneType, not a list of floats"),
        ([-1.0, None], "the ref scorer returned list, not a list of floats"),
        (b"\0" * 16, "the ref scorer returned bytes, not a list of floats"),
    ],
)
async def test_a_scorer_that_returns_the_wrong_thing_fails_its_sample_with_what_is_wrong(
    tokenizer, value, detail
):
    server = FakeInferenceServer(reply=by_sample_parity)
    engine = make_engine(tokenizer, server, scorers=[_Returns(value)], max_consecutive_unfit_prompts=1)
    async with engine:
        with pytest.raises(Exception, match="scoring_error") as caught:
            await engine.next_batch(timeout_s=10)
    assert detail in str(caught.value)


async def test_a_scorers_logprobs_are_a_token_array(tokenizer):
    server = FakeInferenceServer(reply=by_sample_parity)
    engine = make_engine(tokenizer, server, scorers=[_Returns([-1, -2.5])])
    async with engine:
        batch = await engine.next_batch(timeout_s=10)
    for s in batch.samples:
        assert isinstance(s.ref_logprobs, TokenArray)
        assert s.ref_logprobs == [-1.0, -2.5]


def test_scorers_are_named_teacher_or_ref_once(tokenizer):
    server = FakeInferenceServer()
    with pytest.raises(ValueError, match="at most one of each of teacher, ref"):
        make_engine(tokenizer, server, scorers=[ServedScorer(server, name="critic")])
    with pytest.raises(ValueError, match="at most one"):
        make_engine(
            tokenizer, server, scorers=[ServedScorer(server, name="ref"), ServedScorer(server, name="ref")]
        )


def test_prompt_logprobs_are_read_for_the_prompts_own_tokens():
    answer = {
        "choices": [
            {
                "prompt_logprobs": [
                    None,
                    {"7": {"logprob": -0.5}, "9": {"logprob": -0.1}},
                    {"8": {"logprob": -2.0}},
                ]
            }
        ]
    }
    assert parse_prompt_logprobs(answer, [5, 7, 8]) == [None, -0.5, -2.0]
    with pytest.raises(InferenceError, match="no prompt logprob for token 6 at 1"):
        parse_prompt_logprobs(answer, [5, 6, 8], "http://t")
    with pytest.raises(InferenceError, match="sent 3 prompt logprobs for 2 tokens"):
        parse_prompt_logprobs(answer, [5, 7], "http://t")
    with pytest.raises(InferenceError, match="sent none prompt logprobs"):
        parse_prompt_logprobs({"choices": [{}]}, [5, 7], "http://t")
