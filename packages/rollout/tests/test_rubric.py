import math

import pytest

from telescope_rollout import RewardResult, Rubric, Sample


def exact(completion, sample):
    return float(completion.strip() == sample.answer), sample.answer


async def length_penalty(completion):
    return -len(completion) / 100


def wants_all(**kwargs):
    return float(len(kwargs))


def boom(completion):
    raise RuntimeError("bad")


def nan_reward():
    return math.nan


async def test_weights_metrics_and_golden():
    r = Rubric()
    r.add_reward(exact, 2.0, range_min=0, range_max=1)
    r.add_reward(length_penalty, 0.5, name="len")
    r.add_metric(wants_all)
    out = await r.score("42", Sample("q", "42"), eos_token="<eos>")
    assert isinstance(out, RewardResult)
    # 2.0 * 1 + 0.5 * (-2/100) + 0 * 3 = 1.99
    assert math.isclose(out.total_reward, 1.99)
    assert out.sample_metrics == {"exact": 1.0, "len": -0.02, "wants_all": 3.0}  # state=None not passed
    assert out.golden_answers == {"exact": "42"}
    assert r.metrics_ranges == {"exact": {"min": 0, "max": 1, "invert": False}}


async def test_failures_score_zero_and_extras_merge():
    r = Rubric().add_reward(boom).add_reward(nan_reward).add_reward(lambda: "not a number", name="junk")
    out = await r.score("x", extra_metrics={"m": 1.0}, sample_tags={"k": "v"}, info_turns=[{"a": 1}])
    assert out.total_reward == 0.0
    assert out.sample_metrics == {"boom": 0.0, "nan_reward": 0.0, "junk": 0.0, "m": 1.0}
    assert out.sample_tags == {"k": "v"}
    assert out.info_turns == [{"a": 1}]


def test_duplicate_names_rejected_and_max_reward():
    r = (
        Rubric()
        .add_reward(exact, range_min=0, range_max=1)
        .add_reward(length_penalty, 0.2, range_min=-1, range_max=0)
    )
    assert r.max_reward == 1.0
    with pytest.raises(ValueError, match="name="):
        r.add_reward(exact)
