"""NumPy, which the token table and packing use, reads a sample's token arrays in place and compares
with them elementwise (telescope-rollout itself does not depend on NumPy)."""

from __future__ import annotations

from typing import Any

import numpy as np

from telescope_rollout.engine import TokenArray


def test_numpy_reads_a_token_array_without_a_copy():
    values = TokenArray.logprobs([-0.5, -0.25])
    view = np.asarray(values)
    assert view.dtype == np.float64
    values[0] = -2.0
    assert view[0] == -2.0  # the same memory
    assert np.asarray(TokenArray.ids([1, 2])).dtype == np.int32
    assert np.asarray(TokenArray.mask([0, 1])).dtype == np.int8


def test_a_token_array_compared_with_a_numpy_array_gets_numpys_elementwise_answer():
    differs: Any = TokenArray.ids([5, 7, 9]) != np.array([5, 0, 9])
    assert differs.tolist() == [False, True, False]
