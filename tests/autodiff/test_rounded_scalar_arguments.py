"""Activations whose scalar arguments (thresholds, bounds, lambdas) a bf16/fp16 tensor cannot hold
exactly, on CPU: eager's kernels differ in where they round them.  F.threshold and softshrink's
forward compare (and subtract) in float, softshrink's backward compares in x's dtype, and
hardtanh's backward compares float(x) with float bounds.  ember followed none of that:
F.threshold(x, 0.1, v) replaced a bf16 x of 0.1 (0.10009766) that eager kept, softshrink gave 0
where eager gives 1e-4, and hardtanh's fp16 gradient was 0 at x = 1/3 (0.33325) inside a bound
of 1/3.  Each op is walked over values at, just inside and just outside its rounded and
unrounded arguments: values and gradients bit for bit (signed zeros included)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import ember

NAN, INF = float("nan"), float("inf")
VALUES = [-2.0, -1.0, -1 / 3, -0.33325, -0.3, -0.1001, -0.1, -0.0996, -0.05, -0.0, 0.0, 0.05, 0.0996, 0.1,
          0.1001, 0.3, 0.333, 0.33325, 1 / 3, 0.3334, 0.334, 1.0, 2.0, 6.0, INF, -INF, NAN]
OPS = {
    "threshold": lambda x, a: F.threshold(x, a, 5.0),
    "threshold_fill_rounded": lambda x, a: F.threshold(x, 0.0, a),
    "hardtanh": lambda x, a: F.hardtanh(x, -a, a),
    "softshrink": lambda x, a: F.softshrink(x, a),
    "hardshrink": lambda x, a: F.hardshrink(x, a),
    "clamp": lambda x, a: torch.clamp(x, -a, a),
    "leaky_relu": lambda x, a: F.leaky_relu(x, a),
    "relu6": lambda x, a: F.relu6(x),
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("argument", [0.1, 1 / 3, 0.3, 0.5])
@pytest.mark.parametrize("name", list(OPS))
def test_values_and_gradients_equal_eager(name, argument, dtype):
    x = torch.tensor(VALUES, dtype=dtype)
    weights = torch.arange(1, len(VALUES) + 1, dtype=dtype)

    def run(f):
        xs = x.clone().requires_grad_()
        out = f(xs, argument)
        (out * weights).nansum().backward()
        return out.detach(), xs.grad
    expected = run(OPS[name])
    actual = run(ember.compile(OPS[name], options={"fallback": "error"}))
    for what, a, e in zip(("value", "x.grad"), actual, expected):
        torch.testing.assert_close(a, e, rtol=0, atol=0, equal_nan=True, msg=f"{name}: {what}")
        assert torch.equal(a.signbit(), e.signbit()), f"{name}: {what}: signed zeros differ"


@pytest.mark.parametrize("exponent_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(), (1, 5)])
def test_pow_base_gradient_subtracts_one_in_the_exponents_dtype(exponent_dtype, shape):
    """eager's pow_backward_self computes exponent - 1 in the exponent's own dtype: a bf16 exponent
    0.2598 of a float32 base gives a^-0.7422 (bf16), not a^-0.7402 (training fuzz seed 20581)."""
    def fn(a, b):
        return torch.pow(a, b)

    compiled = ember.compile(fn, options={"fallback": "error"})
    report = ember.explain(fn, torch.rand(8, 5).requires_grad_(), torch.full(shape, 0.5).to(exponent_dtype))
    assert (report.graph_count, report.break_count) == (1, 0) and report.kernel_count >= 1, str(report)
    gen = torch.Generator().manual_seed(0)
    for value in (0.2598, 1.7, -0.33, 2.0):
        base = torch.rand(8, 5, generator=gen) * 3 + 0.01
        exponent = torch.full(shape, value).to(exponent_dtype)
        a, b = base.clone().requires_grad_(), base.clone().requires_grad_()
        (grad_eager,) = torch.autograd.grad(torch.pow(a, exponent).sum(), [a])
        (grad_ember,) = torch.autograd.grad(compiled(b, exponent).sum(), [b])
        torch.testing.assert_close(grad_ember, grad_eager, rtol=1e-5, atol=1e-6)
