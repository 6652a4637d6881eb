"""softmax/log_softmax edge cases compiled vs eager: rows holding infinities (eager's row is NaN when
its maximum is infinite; fuzz seed 100202 got 0), integer and bool inputs (eager raises
NotImplementedError, or returns an empty input in its own dtype; seeds 107405, 109063)."""
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
    expected, actual = fn(ROWS), ember.compile(fn, options={"fallback": "error"})(ROWS)
    assert actual.dtype == expected.dtype
    torch.testing.assert_close(actual, expected, equal_nan=True)


@pytest.mark.parametrize("fn", [F.softmax, F.log_softmax], ids=["softmax", "log_softmax"])
@pytest.mark.parametrize("x", [torch.zeros(3, 8, 0, dtype=torch.int64), torch.ones(5, 1, 8, 0, dtype=torch.bool),
                               torch.ones(5, 1, 8, dtype=torch.bool), torch.ones(2, 3, dtype=torch.int64)],
                         ids=["empty_int", "empty_bool", "bool", "int"])
def test_integer_inputs(fn, x):
    f = lambda t: fn(t, 1)  # noqa: E731
    try:
        expected = f(x)
    except NotImplementedError as error:
        with pytest.raises(NotImplementedError, match=str(error).split('"')[1]):
            ember.compile(f)(x)
        return
    actual = ember.compile(f)(x)
    assert actual.dtype == expected.dtype and actual.shape == expected.shape
