"""Gradients of where(x CMP t, c, x) and where(x CMP t, x, c), the shape of relu, threshold and
friends, whose backward may read the test from the output instead of from x (prim_rules.py
``_condition_from_output``: exact only when c lands on the same side of t as the x it replaces,
and t and c are numbers the dtype holds exactly).  Every comparison, both branch orders, fills on
either side of the threshold, thresholds and fills bf16 cannot hold exactly, and x at the
threshold, at +-0, +-inf and NaN, in float32, bfloat16 and float16: values and gradients equal
eager's bit for bit."""
from __future__ import annotations

import itertools

import pytest
import torch
import torch.nn.functional as F

import ember

NAN, INF = float("nan"), float("inf")
COMPARE = {"le": torch.le, "lt": torch.lt, "ge": torch.ge, "gt": torch.gt}
# (threshold, fill): equal, fill below, fill above, and numbers bf16/fp16 round (0.1, 1/3)
PAIRS = [(0.0, 0.0), (0.0, -1.0), (0.0, 1.0), (1.0, 1.0), (-2.0, 0.5), (0.1, 0.1), (0.1, 0.0),
         (1 / 3, 1 / 3), (0.0, 0.1)]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _x(threshold: float, dtype: torch.dtype) -> torch.Tensor:
    t = torch.tensor(threshold, dtype=dtype).item()
    values = [-INF, -3.0, -1.0, -0.0, 0.0, 0.1, 1 / 3, 0.5, 1.0, 2.0, INF, NAN, threshold, t,
              torch.nextafter(torch.tensor(t), torch.tensor(INF)).item(),
              torch.nextafter(torch.tensor(t), torch.tensor(-INF)).item()]
    return torch.tensor(values, dtype=torch.float64).to(dtype)


def _check(fn, x: torch.Tensor) -> None:
    weights = torch.arange(1, len(x) + 1, dtype=x.dtype)

    def run(f):
        xs = x.clone().requires_grad_()
        out = f(xs)
        (out * weights).nansum().backward()
        return out.detach(), xs.grad
    expected = run(fn)
    actual = run(ember.compile(fn, options={"fallback": "error"}))
    for what, a, e in zip(("value", "x.grad"), actual, expected):
        torch.testing.assert_close(a, e, rtol=0, atol=0, equal_nan=True, msg=what)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("fill_first", [True, False], ids=["where(test, c, x)", "where(test, x, c)"])
@pytest.mark.parametrize("compare", list(COMPARE))
def test_every_comparison_fill_and_threshold(compare, fill_first, dtype):
    for threshold, fill in PAIRS:
        test = COMPARE[compare]
        if fill_first:
            fn = lambda x, test=test, threshold=threshold, fill=fill: torch.where(test(x, threshold), fill, x)
        else:
            fn = lambda x, test=test, threshold=threshold, fill=fill: torch.where(test(x, threshold), x, fill)
        _check(fn, _x(threshold, dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", ["relu", "threshold", "threshold_rounded", "relu_then_mul", "masked_fill"])
def test_activations(name, dtype):
    ops = {
        "relu": torch.relu,
        "threshold": lambda x: F.threshold(x, 1.0, -2.0),
        "threshold_rounded": lambda x: F.threshold(x, 0.1, 0.1),
        "relu_then_mul": lambda x: torch.relu(x) * x,     # the output and x both read
        "masked_fill": lambda x: x.masked_fill(x <= 0, 0.0),
    }
    for threshold in (0.0, 1.0, 0.1):
        _check(ops[name], _x(threshold, dtype))
    _check(ops[name], torch.tensor(list(itertools.chain(*[[v] * 2 for v in (-1.0, 0.0, 1.0)])), dtype=dtype))
