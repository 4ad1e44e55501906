"""Reward shaping and output filters against hand-worked numbers.

The rules: docs/algorithms.md#filters-and-the-overlong-penalty.
"""

import random

import pytest

import telescope_algos as ta


def test_overlong_penalty_ramp():
    # Lmax 1000, buffer 200 → the ramp starts after 800 tokens
    assert ta.overlong_penalty(800, max_tokens=1000, buffer_tokens=200, factor=1.0) == 0.0
    # 900 tokens: −(900 − 800)/200 · 1.0 = −0.5
    assert ta.overlong_penalty(900, max_tokens=1000, buffer_tokens=200, factor=1.0) == pytest.approx(-0.5)
    # 1000 tokens, factor 0.4: −(200/200)·0.4 = −0.4
    assert ta.overlong_penalty(1000, max_tokens=1000, buffer_tokens=200, factor=0.4) == pytest.approx(-0.4)
    assert ta.overlong_penalty(950, max_tokens=1000, buffer_tokens=200, factor=0.0) == 0.0  # disabled
    with pytest.raises(ValueError, match="buffer_tokens"):
        ta.overlong_penalty(10, max_tokens=100, buffer_tokens=0)


def test_is_overlong():
    assert ta.is_overlong("length")
    assert ta.is_overlong("context_exhausted")
    assert not ta.is_overlong("stop")
    assert not ta.is_overlong(None)


def test_is_gibberish():
    # floor = −11.5 − 2.0 = −13.5: flags only a token with id > 100000 *and* logprob < −13.5
    assert ta.is_gibberish([5, 100_001], [-0.1, -14.0])
    assert not ta.is_gibberish([5, 100_001], [-0.1, -13.0])  # not unlikely enough
    assert not ta.is_gibberish([150_000, 5], [-0.1, -20.0])  # unlikely token has a low id
    assert not ta.is_gibberish([100_001], [None])  # missing logprob never flags
    assert not ta.is_gibberish([100_001, 100_002], [-1.0])  # only tokens with a logprob count
    assert ta.is_gibberish([60], [-10.0], token_threshold=50, logprob_offset=-2.0)  # floor −9.5


def test_is_repetitive():
    assert not ta.is_repetitive("ab" * 49)  # 98 characters: too short to judge
    assert ta.is_repetitive("ab" * 500)  # 1000 bytes compress to a few dozen
    rng = random.Random(0)
    text = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz ") for _ in range(2000))
    assert not ta.is_repetitive(text)  # random text compresses < 2x
    assert ta.is_repetitive(text, threshold=1.0)
