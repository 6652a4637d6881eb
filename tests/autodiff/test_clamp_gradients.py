"""The gradients of clamp and the hard activations at their bounds, as eager gives them.

maximum and minimum split the gradient of a tie in halves; eager's clamp gives all of it to x on
[min, max], hardtanh (relu6) none at a bound, hardsigmoid none at +-3, hardswish x/3 + 1/2 on
[-3, 3].  ``x.clamp(min=0)`` at an x of exactly 0 got half its gradient, a wrong answer with no
error.  Every op is walked over values below, at, inside and above its bounds, equal and crossed
tensor bounds, +-inf and NaN; values must equal eager's bit for bit, and so must gradients, but
for hardsigmoid's and hardswish's inside their bounds: eager multiplies by a rounded 1/6 there, a
differentiated forward divides by 6 (an ulp apart; a split tie is half)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import ember

NAN, INF = float("nan"), float("inf")
X = torch.tensor([-4.0, -3.0, -1.0, 0.0, 0.5, 1.0, 2.0, 3.0, 6.0, 7.0, -INF, INF, NAN, -0.0, 1.0, 2.0, 2.0, 0.5])
LOW = torch.tensor([-3.0, -3.0, 0.0, 0.0, 0.5, 1.0, 2.0, 2.5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, NAN, 3.0, 2.0, 0.0])
HIGH = torch.tensor([3.0, 3.0, 1.0, 0.0, 0.5, 1.0, 1.0, 3.0, 6.0, 6.0, 1.0, 1.0, 1.0, 0.0, 2.0, 1.0, NAN, 1.0])

OPS = {
    "clamp_scalar_min": lambda x, lo, hi: torch.clamp(x, min=0.0),
    "clamp_scalars": lambda x, lo, hi: x.clamp(-1.0, 1.0),
    "clamp_tensors": lambda x, lo, hi: torch.clamp(x, lo, hi),
    "clamp_tensor_min": lambda x, lo, hi: torch.clamp(x, min=lo),
    "clamp_tensor_max": lambda x, lo, hi: torch.clamp(x, max=hi),
    "clamp_min": lambda x, lo, hi: torch.clamp_min(x, lo),
    "clamp_max": lambda x, lo, hi: x.clamp_max(hi),
    "clip": lambda x, lo, hi: torch.clip(x, lo, hi),
    "hardtanh": lambda x, lo, hi: F.hardtanh(x, -1.0, 1.0),
    "relu6": lambda x, lo, hi: F.relu6(x),
    "hardsigmoid": lambda x, lo, hi: F.hardsigmoid(x),
    "hardswish": lambda x, lo, hi: F.hardswish(x),
}


@pytest.mark.parametrize("bounds_need_grad", [True, False], ids=["bounds_grad", "bounds_fixed"])
@pytest.mark.parametrize("name", list(OPS))
def test_gradients_at_the_bounds_equal_eager(name, bounds_need_grad):
    for what, a, e in _compiled_and_eager(OPS[name], X, LOW, HIGH, bounds_need_grad):
        if name == "hardswish" and what == "x.grad":
            # at NaN eager's CPU kernel gives NaN in vector lanes and the incoming gradient in
            # its scalar tail; CUDA gives the incoming gradient (as ember does)
            a, e = a[~X.isnan()], e[~X.isnan()]
        exact = what == "value" or not name.startswith("hards")
        torch.testing.assert_close(a, e, rtol=0 if exact else 1e-6, atol=0, equal_nan=True, msg=f"{name}: {what}")


def test_clamp_between_0d_bounds_in_triton():
    """The bounds compared with each other are a bool from 0-d loads alone, which Triton's
    interpreter types as float: & and | of it failed (the graph could not run on that path)."""
    pytest.importorskip("triton")
    fn = lambda x, lo, hi: torch.clamp(x, lo, hi) * 2      # noqa: E731
    inputs = [torch.tensor([-1.0, -0.5, 0.0, 0.5, 1.0]), torch.tensor(-0.5), torch.tensor(0.5)]
    compiled = ember.compile(fn, options={"cpu_backend": "triton", "fallback": "error"})
    ours = [t.clone().requires_grad_() for t in inputs]
    theirs = [t.clone().requires_grad_() for t in inputs]
    torch.testing.assert_close(compiled(*ours), fn(*theirs), rtol=0, atol=0)
    compiled(*ours).sum().backward()
    fn(*theirs).sum().backward()
    for a, e in zip(ours, theirs):
        torch.testing.assert_close(a.grad, e.grad, rtol=0, atol=0)


@pytest.mark.parametrize("bounds_need_grad", [True, False], ids=["bounds_grad", "bounds_fixed"])
@pytest.mark.parametrize("name", ["clamp_tensors", "clamp_tensor_min", "clamp_tensor_max"])
def test_every_combination_of_value_and_tensor_bounds(name, bounds_need_grad):
    """x, min and max each over -inf, -1, 0, 1, inf and NaN, every combination (216): a NaN
    anywhere is the value, as eager's maximum/minimum give it.  A NaN min with x above max
    came out as max, and a NaN x between crossed bounds as max (seed 8106 of the fuzzer)."""
    import itertools
    values = [-INF, -1.0, 0.0, 1.0, INF, NAN]
    x, low, high = (torch.tensor(column) for column in zip(*itertools.product(values, repeat=3)))
    for what, a, e in _compiled_and_eager(OPS[name], x, low, high, bounds_need_grad):
        torch.testing.assert_close(a, e, rtol=0, atol=0, equal_nan=True, msg=f"{name}: {what}")


def _compiled_and_eager(fn, x, low, high, bounds_need_grad):
    """(what, compiled, eager) for fn's value and its gradients to x, min and max, the loss
    weighted by integers (x * 6 / 6 rounds nothing); compiled with fallback="error".  A gradient
    eager does not give must be absent or zero under ember (asserted here, not yielded)."""
    weights = torch.arange(1.0, len(x) + 1)

    def run(f):
        xs = x.clone().requires_grad_()
        lo, hi = low.clone().requires_grad_(bounds_need_grad), high.clone().requires_grad_(bounds_need_grad)
        out = f(xs, lo, hi)
        (out * weights).nansum().backward()
        return out.detach(), xs.grad, lo.grad, hi.grad
    expected = run(fn)
    actual = run(ember.compile(fn, options={"fallback": "error"}))
    for what, a, e in zip(("value", "x.grad", "min.grad", "max.grad"), actual, expected):
        if e is None:
            assert a is None or not a.any(), what
            continue
        yield what, a, e
