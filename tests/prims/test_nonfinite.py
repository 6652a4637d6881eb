"""Rows holding infinities through softmax/log_softmax, compiled vs eager: eager's row is NaN when its
maximum is infinite (all -inf, or any +inf); fuzz seed 100202 got 0 where eager has NaN."""
from __future__ import annotations

import pytest
import torch

import ember

F = torch.nn.functional
INF = float("inf")
ROWS = torch.tensor([[-INF, -INF], [1.0, INF], [INF, INF], [-INF, 1.0], [INF, -INF], [0.5, 2.0], [float("nan"), 1.0]])


@pytest.mark.parametrize("fn", [
    lambda x: F.softmax(x, 1), lambda x: F.log_softmax(x, 1), lambda x: F.softmax(x.bfloat16(), 1),
    lambda x: F.softmax(x, 1, dtype=torch.float64), lambda x: torch.softmax(x.t(), 0),
], ids=["softmax", "log_softmax", "softmax_bf16", "softmax_fp64", "softmax_dim0"])
def test_infinite_rows(fn):
    expected, actual = fn(ROWS), ember.compile(fn)(ROWS)
    assert actual.dtype == expected.dtype
    torch.testing.assert_close(actual, expected, equal_nan=True)
