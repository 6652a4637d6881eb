"""Activations and softmax.  Composite math runs in fp32 for fp16/bf16 inputs and is
rounded once at the end, as eager's fused kernels do."""
from __future__ import annotations

import functools
import math
from typing import Any

import torch

from ember.prims import ops
from ember.prims.functionalize import RunEagerly
from ember.prims.registry import register
from ember.prims.type_promotion import computation_dtype
from ember.prims.values import Value

F = torch.nn.functional
T = torch.Tensor


def _in_fp32(fn):
    """Run fn on the upcast input and cast the result back to the input's dtype.

    functools.wraps keeps fn's signature visible: the registry binds it to find `inplace=`."""
    @functools.wraps(fn)
    def wrapper(x: Value, *args: Any, **kwargs: Any) -> Value:
        return ops.cast(fn(ops.upcast(x), *args, **kwargs), x.dtype)
    return wrapper


@register(torch.relu, T.relu, F.relu, inplace_kw="inplace")
def relu(x: Value, inplace: bool = False) -> Value:
    return ops.where(ops.le(x, 0), ops._python_scalar(0, x.dtype), x) if x.dtype != torch.bool else x


@register(F.relu6, inplace_kw="inplace")
def relu6(x: Value, inplace: bool = False) -> Value:
    return hardtanh(x, 0.0, 6.0)


@register(F.hardtanh, inplace_kw="inplace")
def hardtanh(x: Value, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False) -> Value:
    value = ops.cast(ops.minimum(ops.maximum(x, min_val), max_val), x.dtype)
    if not x.dtype.is_floating_point:
        return value
    # eager's gradient: none at or beyond a bound (maximum/minimum would give half at a bound:
    # relu6 at exactly 0), all of it elsewhere, NaN included; hardtanh_backward compares float(x)
    # with float bounds (an fp16 x of 0.33325 is inside a bound of 1/3, not on it)
    outside = ops.logical_or(ops.le(ops.upcast(x), min_val), ops.ge(ops.upcast(x), max_val))
    # an x equal to a bound is itself the value, as eager's clamp keeps it (relu6(-0.0) is -0.0)
    value = ops.where(ops.logical_or(ops.lt(x, min_val), ops.gt(x, max_val)), value, x)
    return ops.where(outside, ops.stop_gradient(value), x)


@register(F.leaky_relu, inplace_kw="inplace")
def leaky_relu(x: Value, negative_slope: float = 0.01, inplace: bool = False) -> Value:
    return ops.where(ops.gt(x, 0), x, ops.cast(x * negative_slope, x.dtype))


@register(F.elu, inplace_kw="inplace")
@_in_fp32
def elu(x: Value, alpha: float = 1.0, inplace: bool = False) -> Value:
    return ops.where(ops.gt(x, 0), x, ops.expm1(x) * alpha)


@register(F.selu, torch.selu, inplace_kw="inplace")
@_in_fp32
def selu(x: Value, inplace: bool = False) -> Value:
    alpha, scale = 1.6732632423543772848170429916717, 1.0507009873554804934193349852946
    return ops.where(ops.gt(x, 0), x, ops.expm1(x) * alpha) * scale


@register(F.celu, torch.celu, inplace_kw="inplace")
@_in_fp32
def celu(x: Value, alpha: float = 1.0, inplace: bool = False) -> Value:
    return ops.where(ops.gt(x, 0), x, ops.expm1(x / alpha) * alpha)


@register(F.gelu)
@_in_fp32
def gelu(x: Value, approximate: str = "none") -> Value:
    if approximate == "tanh":
        inner = (x + x * x * x * 0.044715) * math.sqrt(2.0 / math.pi)
        return x * 0.5 * (ops.tanh(inner) + 1.0)
    return x * 0.5 * (ops.erf(x * (1.0 / math.sqrt(2.0))) + 1.0)


@register(F.silu, inplace_kw="inplace")
@_in_fp32
def silu(x: Value, inplace: bool = False) -> Value:
    return x * ops.sigmoid(x)


@register(F.mish, inplace_kw="inplace")
@_in_fp32
def mish(x: Value, inplace: bool = False) -> Value:
    return x * ops.tanh(softplus(x))


@register(F.sigmoid)
def sigmoid(x: Value) -> Value:
    return ops.sigmoid(x)


@register(F.tanh)
def tanh(x: Value) -> Value:
    return ops.tanh(x)


@register(F.softplus)
@_in_fp32
def softplus(x: Value, beta: float = 1.0, threshold: float = 20.0) -> Value:
    scaled = x * beta if beta != 1 else x
    return ops.where(ops.gt(scaled, threshold), x, ops.log1p(ops.exp(scaled)) / beta if beta != 1
                     else ops.log1p(ops.exp(scaled)))


@register(F.hardswish, inplace_kw="inplace")
@_in_fp32
def hardswish(x: Value, inplace: bool = False) -> Value:
    value = x * ops.minimum(ops.maximum(x + 3.0, 0.0), 6.0) / 6.0
    # eager's gradient: none at or below -3, x/3 + 1/2 inside (-3, 3), the incoming gradient itself
    # from 3 on (NaN and inf included).  maximum and minimum would split the ties at -3 and 3 in
    # halves, and (x * 6) / 6 differentiates to g / 6 * 6 (and to NaN at inf).  Every branch has
    # the value of eager's formula: x + (value - x) is value exactly (Sterbenz: value is x within
    # an ulp), except at inf, which takes x.  The inside branch reads x only inside: elsewhere its
    # zero gradient times an infinite x would be NaN
    inner = ops.where(ops.logical_and(ops.gt(x, -3.0), ops.lt(x, 3.0)), x, 0.0)
    inside = inner * (inner + 3.0) / 6.0
    above = ops.where(ops.eq(x, math.inf), x, x + ops.stop_gradient(value - x))
    return ops.where(ops.le(x, -3.0), ops.stop_gradient(value), ops.where(ops.lt(x, 3.0), inside, above))


@register(F.hardsigmoid, inplace_kw="inplace")
@_in_fp32
def hardsigmoid(x: Value, inplace: bool = False) -> Value:
    value = ops.minimum(ops.maximum(x + 3.0, 0.0), 6.0) / 6.0
    # eager's gradient: 1/6 strictly inside (-3, 3), none at the bounds, beyond them or at NaN
    inside = ops.logical_and(ops.gt(x, -3.0), ops.lt(x, 3.0))
    return ops.where(inside, (x + 3.0) / 6.0, ops.stop_gradient(value))


@register(F.logsigmoid)
@_in_fp32
def logsigmoid(x: Value) -> Value:
    # -softplus(-x) written to stay finite for large |x|
    return ops.minimum(x, 0.0) - ops.log1p(ops.exp(-ops.abs(x)))


@register(F.softsign)  # eager: two bf16 ops, no upcast
def softsign(x: Value) -> Value:
    return x / (ops.abs(x) + 1.0)


@register(F.tanhshrink)
def tanhshrink(x: Value) -> Value:
    return x - ops.tanh(x)


@register(F.threshold, torch.threshold, inplace_kw="inplace")
def threshold(x: Value, threshold: float, value: float, inplace: bool = False) -> Value:
    # bf16/fp16: eager's CPU kernel compares float(x) with the threshold as a float, CUDA's with
    # the threshold rounded to x's dtype (F.threshold(x, 0.1, v) keeps a bf16 0.1 on CPU only)
    if x.device.type != "cpu":
        threshold = ops.rounded_to(threshold, x.dtype)
    return ops.cast(ops.where(ops.le(ops.upcast(x), threshold), value, x), x.dtype)



@register(F.hardshrink, torch.hardshrink, T.hardshrink)
def hardshrink(x: Value, lambd: float = 0.5) -> Value:
    return ops.where(ops.le(ops.abs(x), lambd), ops._python_scalar(0, x.dtype), x)


@register(F.softshrink)
def softshrink(x: Value, lambd: float = 0.5) -> Value:
    # eager's x * 0 inside the band (NaN stays NaN, -0 stays -0; a NaN gets the gradient, as eager).
    # bf16/fp16 on CPU: eager's forward tests and subtracts in float (a bf16 0.1 minus 0.1 is 1e-4,
    # not 0), and its backward tests |x| <= lambd in x's dtype, lambd rounded to it
    if x.device.type != "cpu":
        lambd = ops.rounded_to(lambd, x.dtype)     # CUDA's kernel: lambd in x's dtype, in value and gradient
    computed = ops.upcast(x) if x.device.type == "cpu" else x
    inside = ops.where(ops.isnan(computed), computed, computed * 0.0)
    shrunk = ops.where(ops.gt(computed, lambd), computed - lambd,
                       ops.where(ops.lt(computed, -lambd), computed + lambd, inside))
    value = ops.cast(shrunk, x.dtype)
    if computed is x:
        return value
    backward_band = ops.logical_and(ops.ge(x, -lambd), ops.le(x, lambd))
    forward_band = ops.logical_and(ops.ge(computed, -lambd), ops.le(computed, lambd))
    # inside the float band but outside the rounded one: the value x * 0, the gradient passes
    passing_zero = ops.cast(inside - (ops.stop_gradient(computed) - computed), x.dtype)
    return ops.where(backward_band, ops.stop_gradient(value), ops.where(forward_band, passing_zero, value))


@register(F.glu)
def glu(x: Value, dim: int = -1) -> Value:
    dim = ops.normalize_dim(dim, x.ndim)
    half = x.shape[dim] // 2
    # eager's kernel computes a * sigmoid(b) in float and rounds once (bf16/fp16)
    a, b = ops.upcast(ops.slice_dim(x, dim, 0, half)), ops.upcast(ops.slice_dim(x, dim, half, x.shape[dim]))
    return ops.cast(a * ops.sigmoid(b), x.dtype)


# ---------------------------------------------------------------------- softmax
def _softmax_dim(x: Value, dim: Any) -> int:
    if dim is None:  # F.softmax's legacy implicit dim
        dim = 0 if x.ndim in (0, 1, 3) else 1
    return ops.normalize_dim(dim, x.ndim)


def _integer_input(x: Value, dtype: torch.dtype | None) -> Value | None:
    """softmax of an integer or bool tensor: eager raises NotImplementedError, except for an empty
    tensor, which it returns in its own dtype (fuzz seeds 107405, 109063)."""
    if dtype is not None or x.dtype.is_floating_point or x.dtype.is_complex:
        return None
    if any(size == 0 for size in x.shape):
        return ops.clone(x)
    raise RunEagerly(f"softmax of a {x.dtype} tensor: eager raises NotImplementedError")


def _shifted(x: Value, dim: Any, dtype: torch.dtype | None) -> tuple[Value, int, torch.dtype]:
    if dtype is not None:
        x = ops.cast(x, dtype)
    out_dtype = x.dtype if x.dtype.is_floating_point else torch.get_default_dtype()
    x = ops.cast(x, computation_dtype(out_dtype))
    dim = _softmax_dim(x, dim)
    if x.ndim == 0 or x.shape[dim] == 0:
        return x - x, dim, out_dtype
    # no guard for an infinite maximum: eager's row is NaN then (all -inf, or any +inf; fuzz seed 100202)
    largest = ops.stop_gradient(ops.amax(x, dim, keepdim=True))
    return x - largest, dim, out_dtype


@register(F.softmax, torch.softmax, T.softmax, torch.special.softmax)
def softmax(x: Value, dim: Any = None, _stacklevel: int = 3, dtype: torch.dtype | None = None) -> Value:
    dtype = _stacklevel if isinstance(_stacklevel, torch.dtype) else dtype  # torch.softmax(x, dim, dtype)
    integer = _integer_input(x, dtype)
    if integer is not None:
        return integer
    shifted, dim, out_dtype = _shifted(x, dim, dtype)
    exps = ops.exp(shifted)
    total = ops.sum(exps, dim, keepdim=True) if x.ndim else exps
    return ops.cast(exps / total, out_dtype)


@register(F.log_softmax, torch.log_softmax, T.log_softmax, torch.special.log_softmax)
def log_softmax(x: Value, dim: Any = None, _stacklevel: int = 3, dtype: torch.dtype | None = None) -> Value:
    dtype = _stacklevel if isinstance(_stacklevel, torch.dtype) else dtype
    integer = _integer_input(x, dtype)
    if integer is not None:
        return integer
    shifted, dim, out_dtype = _shifted(x, dim, dtype)
    total = ops.sum(ops.exp(shifted), dim, keepdim=True) if x.ndim else ops.exp(shifted)
    if out_dtype in (torch.bfloat16, torch.float16) and x.device.type == "cpu" and dim == x.ndim - 1:
        # eager's CPU kernel over the last dim rounds the sum, then its log, to the dtype before
        # subtracting in float (its other kernels, and CUDA's, keep both in float)
        log_total = _rounded(ops.log(_rounded(total, out_dtype)), out_dtype)
    else:
        log_total = ops.log(total)
    return ops.cast(shifted - log_total, out_dtype)


def _rounded(x: Value, dtype: torch.dtype) -> Value:
    """x (float) rounded to ``dtype`` and read back as float."""
    return ops.cast(ops.cast(x, dtype), x.dtype)
