"""bf16/fp16 ops on the CPU with Python numbers (and constant-filled tensors) round where eager's
CPU kernels round, bit for bit.  Found by a sweep of 46 ops x 5 numbers x 2 dtypes:

* ``torch.full_like(x, 0.1)`` read by a fused op as 0.1, not bf16's 0.10009766 (atan2 was off);
* ``2.5 / x`` is ``x.reciprocal() * 2.5`` in torch (the reciprocal rounded first);
* ``torch.div(x, 0.7, rounding_mode="trunc")``: the quotient in float, unrounded (bf16 100 / -0.7
  is -142, not -143; fp16 0.1 / 0.1 is 0, not 1);
* glu: a * sigmoid(b) in float, rounded once;
* logit and ``xlogy``'s number: eager's CPU kernels round each step in x's dtype (its CUDA kernels
  compute them in float, as ember does on CUDA);
* ``add``/``sub`` with alpha: one rounding in float, alpha (and a number y) rounded to the dtype on
  CPU, as eager's vector lanes compute it;
* rsqrt: eager's CPU kernel is 1 / sqrt(x) with the square root rounded;
* ``round(x, decimals)``: in float, and x / 10 ** -d for negative d (not x * 0.1);
* ``0.1 // x``: torch.floor_divide(0.1, x), the number rounded to x's dtype.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import ember

VALUES = [-7.0, -2.0, -1.0, -1 / 3, -0.1001, -0.1, -0.05, -0.0, 0.0, 1e-3, 0.05, 0.0996, 0.1, 0.1001, 1 / 3,
          0.5, 1.0, 2.0, 3.0, 7.0, 100.0]
NUMBERS = [0.1, 1 / 3, 2.5, -0.7, 1e-3]
OPS = {
    "add": lambda x, s: x + s, "rsub": lambda x, s: s - x, "mul": lambda x, s: x * s, "div": lambda x, s: x / s,
    "rdiv": lambda x, s: s / x, "pow": lambda x, s: x.abs() ** s, "fmod": lambda x, s: torch.fmod(x, s),
    "remainder": lambda x, s: torch.remainder(x, s),
    "floor_div": lambda x, s: torch.div(x, s, rounding_mode="floor"),
    "trunc_div": lambda x, s: torch.div(x, s, rounding_mode="trunc"),
    "lerp": lambda x, s: torch.lerp(x, x * 2, s), "addcmul": lambda x, s: torch.addcmul(x, x, x, value=s),
    "addcdiv": lambda x, s: torch.addcdiv(x, x, x + 3, value=s), "clamp": lambda x, s: x.clamp(-abs(s), abs(s)),
    "where": lambda x, s: torch.where(x > 0, x, s), "masked_fill": lambda x, s: x.masked_fill(x > 0.5, s),
    "leaky_relu": lambda x, s: F.leaky_relu(x, s), "elu": lambda x, s: F.elu(x, abs(s)),
    "softplus": lambda x, s: F.softplus(x, beta=abs(s) * 3, threshold=2.0),
    "xlogy": lambda x, s: torch.xlogy(x, abs(s)), "atan2_full": lambda x, s: torch.atan2(x, torch.full_like(x, s)),
    "mul_full": lambda x, s: x * torch.full_like(x, s) * 7, "logit": lambda x, s: torch.logit(torch.sigmoid(x), abs(s) / 10),
    "glu": lambda x, s: F.glu(torch.cat([x, x * s]), 0), "gelu_tanh": lambda x, s: F.gelu(x * s, approximate="tanh"),
    "rfloordiv": lambda x, s: s // x, "rmod": lambda x, s: s % x, "rsqrt": lambda x, s: torch.rsqrt(x.abs() + s * s),
    "round_2": lambda x, s: torch.round(x * s, decimals=2), "round_-1": lambda x, s: torch.round(x * s * 100, decimals=-1),
    "copysign": lambda x, s: torch.copysign(x, s), "logaddexp": lambda x, s: torch.logaddexp(x, torch.full_like(x, s)),
    "heaviside": lambda x, s: torch.heaviside(x, torch.tensor(s, dtype=x.dtype)),
}


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("name", list(OPS))
def test_values_equal_eager(name, dtype):
    x = torch.tensor(VALUES, dtype=dtype)
    for number in NUMBERS:
        fn = OPS[name]
        expected = fn(x, number)
        actual = ember.compile(lambda x, fn=fn, number=number: fn(x, number), options={"fallback": "error"})(x)
        assert actual.dtype == expected.dtype
        torch.testing.assert_close(actual, expected, rtol=0, atol=0, equal_nan=True, msg=f"{name}({number})")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("name", ["rdiv", "glu", "xlogy", "atan2_full", "logit"])
def test_gradients_close_to_eager(name, dtype):
    """The changed decompositions differentiate: gradients within a low-precision rounding or two
    of eager's (its backward kernels round differently again).  |x| >= 0.05: eager's fp16
    reciprocal gradient at 1e-3 squares 1000 in fp16 and overflows to -inf (ember's is -999.5)."""
    x = torch.tensor([v for v in VALUES if abs(v) >= 0.05], dtype=dtype)
    for number in NUMBERS:
        fn = OPS[name]
        xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()
        fn(xe, number).float().sum().backward()
        ember.compile(lambda x, fn=fn, number=number: fn(x, number), options={"fallback": "error"})(xc).float().sum().backward()
        torch.testing.assert_close(xc.grad, xe.grad, rtol=2e-2, atol=1e-3, equal_nan=True, msg=f"{name}({number})")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("scale", [0.02, 1.0, 30.0])
def test_rms_norm_default_eps_is_the_float_math_epsilon(dtype, scale):
    """eps=None is float32's epsilon for bf16/fp16 inputs, as eager's kernel computes in float.
    ember used bf16's own (0.0078): an nn.RMSNorm(64) of bf16 activations of size 0.02 came out
    about half of eager's, with no error."""
    torch.manual_seed(0)
    x = (torch.randn(4, 64) * scale).to(dtype)
    module = torch.nn.RMSNorm(64).to(dtype)
    with torch.no_grad():
        module.weight.uniform_(0.5, 1.5)
    for fn in (module, lambda x: F.rms_norm(x, (64,)), lambda x: F.rms_norm(x, (64,), eps=1e-6)):
        torch.testing.assert_close(ember.compile(fn, options={"fallback": "error"})(x), fn(x), rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("alpha", [1 / 3, 0.3, 2.5, -0.7, 3])
def test_add_and_sub_with_alpha(dtype, alpha):
    """256 elements: every one in eager's vector lanes, which compute x + round(alpha) * y in float
    (an fmadd) and round once.  Its scalar tail (the last n % 16 or 32 elements) rounds the product
    first; ember follows the vector lanes, so a shorter tensor can differ there by one rounding."""
    torch.manual_seed(0)
    x, y = (torch.randn(256) * 3).to(dtype), torch.randn(256).to(dtype)
    for other in (y, 7.0, 0.1, 1 / 3):
        for fn in (lambda x, other=other: torch.add(x, other, alpha=alpha),
                   lambda x, other=other: torch.sub(x, other, alpha=alpha), lambda x: torch.rsub(x, y, alpha=alpha)):
            torch.testing.assert_close(ember.compile(fn, options={"fallback": "error"})(x), fn(x), rtol=0, atol=0)
