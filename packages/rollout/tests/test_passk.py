"""pass@k / pass^k estimators and the pass_k config forms, against hand-worked numbers."""

from __future__ import annotations

import pytest

from telescope_rollout.evals import PassKSpec, pass_at_k, pass_pow_k
from telescope_rollout.evals._passk import sample_pass_metrics, unit_metrics


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (4, 1, 2, 0.5),  # 1 - C(3,2)/C(4,2) = 1 - 3/6
        (4, 2, 2, 5 / 6),  # 1 - C(2,2)/C(4,2) = 1 - 1/6
        (4, 3, 2, 1.0),  # C(1,2) = 0: any 2 of 4 contain a success
        (5, 2, 1, 0.4),  # k = 1 is the success rate c/n = 2/5
        (4, 0, 2, 0.0),
        (4, 4, 4, 1.0),
        (8, 2, 4, 1 - 15 / 70),  # 1 - C(6,4)/C(8,4) = 1 - 15/70
        # fewer completions than k (some failed): any success counts
        (2, 1, 4, 1.0),
        (2, 0, 4, 0.0),
        (0, 0, 1, 0.0),
    ],
)
def test_pass_at_k(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected)


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (4, 2, 2, 1 / 6),  # C(2,2)/C(4,2)
        (4, 3, 2, 0.5),  # C(3,2)/C(4,2) = 3/6
        (4, 1, 2, 0.0),
        (4, 4, 2, 1.0),
        (5, 2, 1, 0.4),  # k = 1: c/n
        (8, 6, 3, 20 / 56),  # C(6,3)/C(8,3)
        (2, 2, 4, 0.0),  # n < k: cannot have k successes
    ],
)
def test_pass_pow_k(n, c, k, expected):
    assert pass_pow_k(n, c, k) == pytest.approx(expected)


def test_bad_counts_raise():
    with pytest.raises(ValueError, match="0 <= c <= n"):
        pass_at_k(2, 3, 1)
    with pytest.raises(ValueError, match="k >= 1"):
        pass_pow_k(2, 1, 0)


def test_all_completions_are_used_not_only_the_first_k():
    # 4 completions, only the first right. Looking at the first k = 2 only would give
    # "any of [1, 0]" = 1; over all 4 the chance that 2 random draws hold the right one is 1/2.
    spec = PassKSpec(at_k=(2,), at_k_metrics=("correct",))
    out = sample_pass_metrics(spec, [{"correct": 1.0}, {"correct": 0.0}, {"correct": 0.0}, {"correct": 0.0}])
    assert out == {"pass@2/correct": pytest.approx(0.5)}


def test_sample_pass_metrics_per_metric_and_kind():
    spec = PassKSpec(at_k=(1, 2), at_k_metrics=None, pow_k=(2,), pow_k_metrics=("correct",))
    rows = [{"correct": 1.0, "fmt": 0.5}, {"correct": 0.0, "fmt": 0.0}, {"correct": 0.0}, {"correct": 1.0}]
    # no metrics named: the success metrics; by default those within [0, 1] (not tokens)
    counted = [{**r, "tokens": 12.0} for r in rows]
    assert sample_pass_metrics(PassKSpec(at_k=(1,)), counted) == pytest.approx(
        {"pass@1/correct": 0.5, "pass@1/fmt": 0.25}
    )
    assert sample_pass_metrics(spec, rows, success=["correct"]) == pytest.approx(
        {"pass@1/correct": 0.5, "pass@2/correct": 5 / 6, "pass^2/correct": 1 / 6}
    )
    out = sample_pass_metrics(spec, rows, success=["correct", "fmt"])
    # correct: n=4 c=2. fmt: reported by 2 completions, missing counts as failure: n=4 c=1
    assert out == pytest.approx(
        {
            "pass@1/correct": 0.5,
            "pass@2/correct": 5 / 6,
            "pass@1/fmt": 0.25,
            "pass@2/fmt": 0.5,
            "pass^2/correct": 1 / 6,
        }
    )
    assert sample_pass_metrics(spec, []) == {}
    # a requested metric the eval never reports is skipped
    assert sample_pass_metrics(PassKSpec(at_k=(1,), at_k_metrics=("nope",)), rows) == {}


def test_parse_config_forms():
    assert PassKSpec.parse([]) == PassKSpec()
    assert PassKSpec.parse({}) == PassKSpec()
    assert PassKSpec.parse(None).completions_per_sample == 1
    bare = PassKSpec.parse([8, 1, 4])
    assert (bare.at_k, bare.at_k_metrics, bare.pow_k) == ((1, 4, 8), None, ())
    assert bare.completions_per_sample == 8
    full = PassKSpec.parse(
        {"at_k": {"metrics": ["correct"]}, "pow_k": {"metrics": ["correct"], "k": [2, 16]}}
    )
    assert full == PassKSpec(at_k=(1,), at_k_metrics=("correct",), pow_k=(2, 16), pow_k_metrics=("correct",))
    assert full.completions_per_sample == 16
    only_pow = PassKSpec.parse({"pow_k": {"k": [3]}})
    assert (only_pow.at_k, only_pow.pow_k, only_pow.pow_k_metrics) == ((), (3,), None)
    with pytest.raises(ValueError, match="unknown kind"):
        PassKSpec.parse({"best_k": {}})
    with pytest.raises(ValueError, match="integer >= 1"):
        PassKSpec.parse([0, 2])
    assert PassKSpec.parse({"at_k": {"k": 4}}).at_k == (4,)  # one k without a list


@pytest.mark.parametrize(
    "value",
    [
        {"at_k": {"k": [2.5]}},  # was read as k = 2
        {"at_k": {"k": "12"}},  # was read as k = 1, 2
        {"at_k": {"k": ["x"]}},  # was a bare int() error
        {"pow_k": {"k": [True]}},
        {"pow_k": {"k": [0]}},
        {"at_k": {"k": {"a": 1}}},
        [2.5],
        [1, "4"],
    ],
)
def test_parse_rejects_k_values_that_are_not_integers(value):
    with pytest.raises(ValueError, match=r"integer >= 1.*e\.g\. k: \[1, 4\]"):
        PassKSpec.parse(value)


def test_parse_rejects_malformed_kinds_and_metrics():
    with pytest.raises(ValueError, match=r"pass_k\.at_k must be a mapping with keys metrics and k"):
        PassKSpec.parse({"at_k": [1, 2]})
    with pytest.raises(ValueError, match=r"pass_k\.pow_k must be a mapping"):
        PassKSpec.parse({"pow_k": {"ks": [2]}})
    with pytest.raises(ValueError, match="metrics must be a metric name or a list"):
        PassKSpec.parse({"at_k": {"metrics": [1], "k": [1]}})
    assert PassKSpec.parse({"at_k": {"metrics": "correct"}}).at_k_metrics == ("correct",)


def test_unit_metrics_are_those_within_0_and_1():
    rows = [{"correct": 1.0, "level": 3.0, "fmt": 0.0}, {"correct": 0.0, "level": 1.0, "fmt": 0.5}, {"x": 1}]
    assert unit_metrics(rows) == ["correct", "fmt", "x"]
    assert unit_metrics([{"neg": -0.5, "ok": 0.0}]) == ["ok"]
    assert unit_metrics([]) == []


def test_parse_what_telescope_config_validated():
    from telescope_config import EvalEntry

    entry = EvalEntry(name="math500", pass_k={"at_k": {"metrics": ["correct"], "k": [1, 4]}})
    assert PassKSpec.parse(entry.pass_k) == PassKSpec(at_k=(1, 4), at_k_metrics=("correct",))
    assert PassKSpec.parse(EvalEntry(name="x", pass_k=[2, 4]).pass_k).at_k == (2, 4)
