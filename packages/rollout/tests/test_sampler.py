import json
from collections import Counter

import pytest

from telescope_rollout import MultiEnvSampler, SamplerEntry
from telescope_rollout.engine._sampler import sample_from

ENTRIES = [
    SamplerEntry("countdown", 0.5, 100),
    SamplerEntry("hendrycks_math", 0.3, 50, env_name="hendrycks-math"),
    SamplerEntry("wordle", 0.2, 10),
]


def test_shares_follow_weights():
    s = MultiEnvSampler(ENTRIES, seed=123)
    counts = Counter(s.draw().entry for _ in range(10_000))
    for e in ENTRIES:
        assert abs(counts[e.name] / 10_000 - e.weight) < 0.02


def test_resume_continues_the_same_sequence():
    a = MultiEnvSampler(ENTRIES, seed=7)
    for _ in range(37):
        a.draw()
    state = json.loads(json.dumps(a.state_dict()))
    rest = [a.draw() for _ in range(50)]
    b = MultiEnvSampler(ENTRIES, seed=999)
    b.load_state_dict(state)
    assert [b.draw() for _ in range(50)] == rest
    assert [MultiEnvSampler(ENTRIES, seed=8).draw() for _ in range(3)] != rest[:3]
    with pytest.raises(ValueError, match="checkpoint"):
        MultiEnvSampler(ENTRIES[:2]).load_state_dict(state)


@pytest.mark.parametrize("key", ["hendrycks_math", "hendrycks-math"])
def test_eval_indices_excluded_under_either_name(key):
    s = MultiEnvSampler(ENTRIES, seed=1, exclude={key: range(10), "wordle": [0, 1]})
    seen = {(d.entry, d.index) for d in (s.draw() for _ in range(5_000))}
    assert not any(e == "hendrycks_math" and i < 10 for e, i in seen)
    assert not any(e == "wordle" and i < 2 for e, i in seen)
    assert {i for e, i in seen if e == "hendrycks_math"} == set(range(10, 50))


def test_bad_configs():
    with pytest.raises(ValueError, match="no training samples"):
        MultiEnvSampler([SamplerEntry("a", 1, 3)], exclude={"a": [0, 1, 2]})
    with pytest.raises(KeyError, match="known"):
        MultiEnvSampler([SamplerEntry("a", 1, 3)], exclude={"b": [0]})
    with pytest.raises(ValueError, match="weight"):
        MultiEnvSampler([SamplerEntry("a", 0, 3)])
    with pytest.raises(ValueError, match="duplicate"):
        MultiEnvSampler([SamplerEntry("a", 1, 3), SamplerEntry("a", 1, 3)])
    with pytest.raises(ValueError, match="at least one"):
        MultiEnvSampler([])


def test_sample_from_tags_env_name():
    from telescope_rollout import get_environment

    env = get_environment("quickstart_add", num_samples=5)
    env.load_dataset()
    s = MultiEnvSampler([SamplerEntry("add", 1.0, len(env))], seed=0)
    d = next(iter(s))
    sample = sample_from({"add": env}, d)
    assert sample.metadata["_env_name"] == "add"
    assert sample.prompt == env.get_sample(d.index).prompt
    assert "_env_name" not in env.get_sample(d.index).metadata
