"""Gradients at the points where an op's formula has a tie, a zero or a removable singularity,
against eager: each op walked over every pair of the values below (ties, signed zeros, the
boundaries its decomposition branches on).  A where() that picks a constant, or maximum's split
tie, gives a gradient eager does not: fmax(x, x) gave each side half (eager: all to x), xlogy(0, y)
gave x no gradient (eager: log(y)), sinc'(0) was NaN (eager: 0)."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import ember

VALUES = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 3.0]
A = torch.tensor([a for a in VALUES for _ in VALUES])
B = torch.tensor([b for _ in VALUES for b in VALUES])

CASES = {
    "fmax": (lambda a, b: torch.fmax(a, b), 2), "fmin": (lambda a, b: torch.fmin(a, b), 2),
    "maximum": (lambda a, b: torch.maximum(a, b), 2), "minimum": (lambda a, b: torch.minimum(a, b), 2),
    "xlogy": (lambda a, b: torch.xlogy(a, b.abs()), 2), "special_xlogy": (lambda a, b: torch.special.xlogy(a, b + 3), 2),
    "sinc": (lambda a: torch.sinc(a), 1), "softshrink": (lambda a: F.softshrink(a, 0.5), 1),
    "hardshrink": (lambda a: F.hardshrink(a, 0.5), 1), "relu": (lambda a: F.relu(a), 1),
    "leaky_relu": (lambda a: F.leaky_relu(a, 0.1), 1), "elu": (lambda a: F.elu(a), 1),
    "threshold": (lambda a: F.threshold(a, 0.5, -1.0), 1), "abs": (lambda a: a.abs(), 1),
}


@pytest.mark.parametrize("name", list(CASES))
def test_gradients_at_special_points_equal_eager(name):
    fn, arity = CASES[name]
    weights = torch.linspace(0.5, 1.5, len(A))

    def run(f):
        inputs = [t.clone().requires_grad_() for t in (A, B)[:arity]]
        out = f(*inputs)
        (out * weights).sum().backward()
        return [out.detach()] + [t.grad for t in inputs]
    expected = run(fn)
    actual = run(ember.compile(fn, options={"fallback": "error"}))
    for what, a, e in zip(("value", "grad a", "grad b"), actual, expected):
        torch.testing.assert_close(a, e, rtol=1e-6, atol=1e-7, equal_nan=True, msg=lambda m: f"{name} {what}: {m}")


def test_softshrink_keeps_nan_and_signed_zero():
    x = torch.tensor([float("nan"), -0.0, 0.25, -0.25, 0.75])
    actual = ember.compile(lambda t: F.softshrink(t), options={"fallback": "error"})(x)
    expected = F.softshrink(x)
    torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True)
    assert torch.equal(actual.signbit(), expected.signbit())


@pytest.mark.parametrize("y", [0.0, 2.0, -1.0, float("inf"), float("nan")])
def test_xlogy_of_a_python_y(y):
    """A Python y whose log is not finite: 0 where x is 0, NaN everywhere for a NaN y (a NaN y
    was returned as a Python float the wrapper could not name)."""
    x = torch.tensor([0.0, 1.0, -2.0, 0.0])
    fn = lambda t: (torch.xlogy(t, y), float("nan"), float("-inf"))     # noqa: E731
    actual = ember.compile(fn, options={"fallback": "error"})(x)
    expected = fn(x)
    torch.testing.assert_close(actual[0], expected[0], rtol=0, atol=0, equal_nan=True)
    assert math.isnan(actual[1]) and actual[2] == -math.inf
