"""Elementwise math, comparisons, casts, clamp/lerp/addcmul and friends."""
from __future__ import annotations

import functools
import math
import operator
from typing import Any

import torch

from ember.graph import contiguous_strides, is_dense, memory_format_strides, preserved_strides
from ember.prims import ops
from ember.prims.registry import register
from ember.prims.type_promotion import Promotion, computation_dtype, result_type
from ember.prims.values import Value, is_tensor
from ember.symbolic import known_equal

T = torch.Tensor
special = torch.special


def _opmath(fn, int_to_float: bool = False):
    """Compute in the promoted type of the tensor operands (fp32 for fp16/bf16) and round once, as
    eager's kernels do.  The result has the promoted type (a half `x` with a float `end` gives float),
    the default float type for integer and bool operands when ``int_to_float`` (sinc, logit)."""
    def wrapper(x: Value, *args: Any, **kwargs: Any) -> Value:
        tensors = [v for v in (x, *args) if is_tensor(v)]
        if not tensors:
            return fn(x, *args, **kwargs)
        # TensorIterator casts every operand to the common dtype first, not pairwise, and the
        # kernel widens that: a 0-d float32 weight of a bf16 lerp is rounded to bf16 (19% of
        # lerp(a, b, tensor(0.3337)) elements differed when it was not)
        dtype = result_type([ops._operand_tier(v) for v in tensors])
        if int_to_float and not (dtype.is_floating_point or dtype.is_complex):
            dtype = torch.get_default_dtype()
        compute = computation_dtype(dtype)
        common = lambda v: ops.cast(ops.cast(v, dtype), compute) if is_tensor(v) else v
        return ops.cast(fn(common(x), *[common(a) for a in args], **kwargs), dtype)
    wrapper.__name__ = fn.__name__
    return wrapper

# ------------------------------------------------------------------ unary math
_UNARY_ALIASES = {
    "neg": [torch.negative, T.negative, operator.neg, T.__neg__],
    "abs": [torch.absolute, T.absolute, operator.abs, T.__abs__],
    "asin": [torch.arcsin, T.arcsin], "acos": [torch.arccos, T.arccos], "atan": [torch.arctan, T.arctan],
    "asinh": [torch.arcsinh, T.arcsinh], "acosh": [torch.arccosh, T.arccosh],
    "atanh": [torch.arctanh, T.arctanh],
    "sigmoid": [special.expit], "exp2": [special.exp2], "expm1": [special.expm1], "log1p": [special.log1p],
    "erf": [special.erf], "erfc": [special.erfc], "erfinv": [special.erfinv], "trunc": [torch.fix, T.fix],
    "bitwise_not": [operator.invert, T.__invert__],
}
for _name in ["neg", "abs", "exp", "exp2", "expm1", "log", "log1p", "log2", "log10", "sqrt",
              "reciprocal", "sin", "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh",
              "acosh", "atanh", "erf", "erfc", "erfinv", "lgamma", "sigmoid", "floor", "ceil", "trunc",
              "sign", "signbit", "isnan", "isinf", "isfinite", "logical_not", "bitwise_not"]:
    register(getattr(torch, _name), getattr(T, _name), *_UNARY_ALIASES.get(_name, []))(getattr(ops, _name))


@register(torch.sign, T.sign)
def sign(x: Any) -> Any:
    if is_tensor(x) and x.dtype.is_floating_point:
        # eager's (0 < x) - (x < 0): sign(NaN) is 0, not NaN
        return ops.sub(ops.cast(ops.gt(x, 0), x.dtype), ops.cast(ops.lt(x, 0), x.dtype))
    return ops.sign(x)


@register(torch.abs, T.abs, *_UNARY_ALIASES["abs"])
def abs_(x: Any) -> Any:
    if is_tensor(x) and x.dtype == torch.bool:
        raise NotImplementedError('"abs_cpu" not implemented for \'Bool\'')  # eager has no bool kernel
    return ops.abs(x)


@register(torch.rsqrt, T.rsqrt)
def rsqrt(x: Any) -> Any:
    if _low_precision_on_cpu(x):
        # eager's CPU kernel for bf16/fp16 is 1 / sqrt(x) with the square root rounded first
        return ops.reciprocal(ops.sqrt(x))
    return ops.rsqrt(x)


@register(torch.round, T.round)
def round_(x: Value, *, decimals: int = 0) -> Value:
    if decimals == 0:
        return ops.round(x)
    if x.device.type == "cpu":
        return _round_decimals_in_float(x, decimals)    # eager's CPU kernel: in float, rounded once
    return _round_decimals(x, decimals)                 # CUDA's: each step in x's dtype


def _round_decimals(x: Value, decimals: int) -> Value:
    # eager's kernels: nearbyint(x * 10^d) / 10^d, or for d < 0 nearbyint(x / 10^-d) * 10^-d
    # (x * 0.01 and x / 100 round apart)
    if decimals < 0:
        scale = 10.0 ** -decimals
        return ops.round(x / scale) * scale
    scale = 10.0 ** decimals
    return ops.round(x * scale) / scale


_round_decimals_in_float = _opmath(_round_decimals)


@register(torch.square, T.square)
def square(x: Value) -> Value:
    return ops.mul(ops.cast(x, torch.int64) if x.dtype == torch.bool else x, x)


@register(torch.positive, T.positive, operator.pos, T.__pos__)
def positive(x: Value) -> Value:
    return x


@register(torch.frac, T.frac)
def frac(x: Value) -> Value:
    return x - ops.trunc(x)


@register(torch.deg2rad, T.deg2rad)
def deg2rad(x: Value) -> Value:
    return ops.mul(x, math.pi / 180.0) if x.dtype.is_floating_point else ops.mul(ops.cast(x, torch.float32),
                                                                                  math.pi / 180.0)


@register(torch.rad2deg, T.rad2deg)
def rad2deg(x: Value) -> Value:
    return ops.mul(x, 180.0 / math.pi) if x.dtype.is_floating_point else ops.mul(ops.cast(x, torch.float32),
                                                                                  180.0 / math.pi)


@register(torch.sinc, T.sinc, special.sinc)
@functools.partial(_opmath, int_to_float=True)
def sinc(x: Value) -> Value:
    # the branch not taken at 0 reads 1 instead: its zero gradient through sin(0) / 0 was NaN
    pix = ops.where(ops.eq(x, 0), 1.0, x) * math.pi
    return ops.where(ops.eq(x, 0), 1.0, ops.sin(pix) / pix)


@register(torch.logit, T.logit, special.logit)
def logit(x: Value, eps: float | None = None) -> Value:
    if _low_precision_on_cpu(x):
        return _logit(x, eps)     # eager's CPU kernel: each step in bf16/fp16, rounded
    return _logit_in_float(x, eps)


def _logit(x: Value, eps: float | None = None) -> Value:
    if eps is not None:
        x = clamp(x, eps, 1 - eps)
    return ops.log(x / (1 - x))


_logit_in_float = functools.partial(_opmath, int_to_float=True)(_logit)


def _low_precision_on_cpu(x: Any) -> bool:
    """A bf16/fp16 tensor on the CPU: eager's CPU kernels round some steps there that its CUDA
    kernels compute in float (logit, rsqrt)."""
    return is_tensor(x) and x.dtype in (torch.bfloat16, torch.float16) and x.device.type == "cpu"


@register(torch.xlogy, T.xlogy, special.xlogy)
def xlogy(x: Any, y: Any) -> Value:
    # TensorIterator casts both tensors to their common dtype first: a float32 0-d y of a bf16 x
    # gives bf16, a bf16 y of a float32 x has its log taken in float32
    dtype = result_type([ops._operand_tier(v) for v in (x, y) if is_tensor(v)])
    if not (dtype.is_floating_point or dtype.is_complex):
        dtype = torch.get_default_dtype()
    x, y = (ops.cast(v, dtype) if is_tensor(v) else v for v in (x, y))
    if is_tensor(y) and dtype in (torch.bfloat16, torch.float16) and y.device.type != "cpu":
        log_y = ops.log(ops.upcast(y))     # eager's CUDA kernel keeps log(y) in float, its CPU one rounds it
    else:
        log_y = ops.log(y)
    # 0 where x is 0 (0 * log(0) and 0 * log(inf) would be NaN), with eager's gradients: log(y)
    # for x wherever y > 0 (x == 0 included: a where choosing the constant 0 gave it none), none
    # where x == 0 and y <= 0
    if not is_tensor(y) and is_tensor(x) and x.dtype in (torch.bfloat16, torch.float16) and type(y) in (int, float):
        # eager: the number becomes a tensor of x's dtype; its log is rounded to that dtype too on
        # the CPU, kept in float on CUDA
        y = ops.rounded_to(y, x.dtype)
        log_y = torch.log(torch.tensor(y, dtype=x.dtype if x.device.type == "cpu" else torch.float32)).item()
    if is_tensor(log_y):
        unbounded = ops.logical_or(ops.le(y, 0), ops.eq(y, math.inf))
        log_y = ops.where(ops.logical_and(ops.eq(x, 0), unbounded), 0.0, log_y)
    elif not 0 < y < math.inf:          # a Python y whose log is -inf, inf or NaN
        log_y = ops.where(ops.eq(x, 0), 0.0, log_y)
    product = ops.cast(ops.mul(x, log_y), dtype) if is_tensor(x) else ops.mul(x, log_y)
    result = ops.where(ops.eq(x, 0), product + 0.0, product)   # + 0.0: eager's +0, not 0 * -log's -0
    if not is_tensor(y):
        return result + math.nan if math.isnan(y) else result
    return ops.cast(ops.where(ops.isnan(y), math.nan, result), dtype)


@register(torch.nan_to_num, T.nan_to_num)
def nan_to_num(x: Value, nan: float = 0.0, posinf: float | None = None, neginf: float | None = None) -> Value:
    if not x.dtype.is_floating_point:
        return x
    info = torch.finfo(x.dtype)
    x = ops.where(ops.isnan(x), nan, x)
    x = ops.where(ops.logical_and(ops.isinf(x), ops.gt(x, 0)), info.max if posinf is None else posinf, x)
    return ops.where(ops.logical_and(ops.isinf(x), ops.lt(x, 0)), info.min if neginf is None else neginf, x)


# ----------------------------------------------------------------- binary math
@register(torch.add, T.add, operator.add, T.__add__, T.__radd__)
def add(x: Any, other: Any, *, alpha: Any = 1) -> Any:
    fused = _fused_alpha(ops.add, x, other, alpha)
    return fused if fused is not None else ops.add(x, _times_alpha(x, other, alpha))


@register(torch.sub, T.sub, torch.subtract, T.subtract, operator.sub, T.__sub__)
def sub(x: Any, other: Any, *, alpha: Any = 1) -> Any:
    if any((is_tensor(v) and v.dtype == torch.bool) or isinstance(v, bool) for v in (x, other)):
        raise RuntimeError("Subtraction, the `-` operator, with a bool tensor is not supported. If you are "
                           "trying to invert a mask, use the `~` or `logical_not()` operator instead.")
    fused = _fused_alpha(ops.sub, x, other, alpha)
    return fused if fused is not None else ops.sub(x, _times_alpha(x, other, alpha))


def _fused_alpha(op: Any, x: Any, other: Any, alpha: Any) -> Any:
    """x + alpha * y with a bf16/fp16 result as eager's kernels compute it: in float, rounded once
    (CUDA: alpha as given; CPU's vector lanes: alpha, and a number y, rounded to the dtype first,
    an fmadd; its scalar tail lanes round the product too, which no fixed rule can follow).  None
    for other cases (other dtypes, alpha 1, a number y on CUDA)."""
    if type(alpha) not in (int, float) or alpha == 1 or not is_tensor(x):
        return None
    dtype = _promoted(x, other)
    if dtype not in (torch.bfloat16, torch.float16):
        return None
    compute = computation_dtype(dtype)
    if type(other) in (int, float) and x.device.type == "cpu":
        scaled = ops.rounded_to(alpha, dtype) * ops.rounded_to(other, dtype)
        return ops.cast(op(ops.cast(x, compute), scaled), dtype)      # exact in float: 8-bit mantissas
    if not is_tensor(other):
        return None
    if x.device.type == "cpu":
        alpha = ops.rounded_to(alpha, dtype)
    product = ops.mul(ops.cast(ops.cast(other, dtype), compute), alpha)
    return ops.cast(op(ops.cast(ops.cast(x, dtype), compute), product), dtype)


def _promoted(*operands: Any) -> torch.dtype | None:
    if not any(is_tensor(v) for v in operands):
        return None
    return result_type([ops._operand_tier(v) for v in operands])


def _times_alpha(x: Any, other: Any, alpha: Any) -> Any:
    """alpha * other as eager computes it: in the promoted type of x and other, with alpha cast to
    that type (alpha=2 is True for bools), not promoted by alpha itself."""
    if isinstance(alpha, bool) or alpha != 1:
        dtype = _promoted(x, other)
        if dtype is None:
            return other * alpha
        if isinstance(alpha, float) and not (dtype.is_floating_point or dtype.is_complex):
            raise RuntimeError("For integral input tensors, argument alpha must not be a floating point number.")
        other = ops.cast(other, dtype) if is_tensor(other) else other
        return ops.mul(other, ops._python_scalar(alpha, dtype))
    return other


@register(torch.rsub, T.__rsub__)
def rsub(x: Any, other: Any, *, alpha: Any = 1) -> Any:
    return sub(other, x, alpha=alpha)


@register(torch.mul, T.mul, torch.multiply, T.multiply, operator.mul, T.__mul__, T.__rmul__)
def mul(x: Any, other: Any) -> Any:
    return ops.mul(x, other)


@register(torch.div, T.div, torch.divide, T.divide, torch.true_divide, T.true_divide, operator.truediv,
          T.__truediv__)
def div(x: Any, other: Any, *, rounding_mode: str | None = None) -> Any:
    if rounding_mode is None:
        if not is_tensor(x) and is_tensor(other):      # number / tensor is other.__rtruediv__(x)
            return rtruediv(other, x)
        return ops.div(x, other)
    if rounding_mode == "floor":
        return ops.floor_divide(x, other)
    result_dtype = ops.elementwise_dtypes([ops._operand_tier(x), ops._operand_tier(other)],
                                          Promotion.DEFAULT)[1]
    if result_dtype.is_floating_point:
        if result_dtype in (torch.bfloat16, torch.float16) and is_tensor(x) and \
                isinstance(other, (int, float)) and not isinstance(other, bool):
            # eager's kernels (CPU and CUDA) divide by a Python number in float, unrounded, then
            # truncate: bf16 100 / -0.7 is -142.857 -> -142 (rounded to bf16 first, -143)
            return ops.cast(ops.trunc(ops.div(ops.upcast(x), other)), result_dtype)
        return ops.trunc(ops.div(x, other))
    # integer division rounding toward zero: floor division, then fix the negative quotients
    quotient = ops.floor_divide(x, other)
    inexact = ops.ne(ops.remainder(x, other), 0)
    negative = ops.ne(ops.lt(x, 0), ops.lt(other, 0))
    return ops.where(ops.logical_and(inexact, negative), quotient + 1, quotient)


@register(T.__rtruediv__)
def rtruediv(x: Value, other: Any) -> Any:
    # torch's Tensor.__rtruediv__ is x.reciprocal() * other (a bf16 reciprocal rounded first)
    return ops.mul(ops.reciprocal(x), other)


@register(torch.floor_divide, T.floor_divide, operator.floordiv, T.__floordiv__)
def floor_divide(x: Any, other: Any) -> Any:
    if not is_tensor(x) and is_tensor(other):      # number // tensor is other.__rfloordiv__(x)
        return rfloordiv(other, x)
    return ops.floor_divide(x, other)


@register(T.__rfloordiv__)
def rfloordiv(x: Value, other: Any) -> Any:
    # torch.floor_divide(other, x): the number is an operand of x's dtype, rounded to it (bf16 0.1 // 0.05 is 2)
    return ops.floor_divide(ops.rounded_to(other, x.dtype), x)


@register(torch.remainder, T.remainder, operator.mod, T.__mod__)
def remainder(x: Any, other: Any) -> Any:
    return ops.remainder(x, other)


@register(T.__rmod__)
def rmod(x: Value, other: Any) -> Any:
    return ops.remainder(other, x)


@register(torch.fmod, T.fmod)
def fmod(x: Any, other: Any) -> Any:
    return ops.fmod(x, other)


@register(torch.pow, T.pow, operator.pow, T.__pow__)
def pow_(x: Any, exponent: Any) -> Any:
    if isinstance(exponent, int) and exponent < 0 and is_tensor(x) and not x.dtype.is_floating_point \
            and not x.dtype.is_complex:
        raise RuntimeError("Integers to negative integer powers are not allowed.")
    if isinstance(exponent, (int, float)) and not isinstance(exponent, bool) and is_tensor(x):
        if exponent == 1:
            return ops.cast(x, ops.elementwise_dtypes([ops._operand_tier(x), ("scalar", exponent)],
                                                      Promotion.DEFAULT)[1])
        # the exponents ATen's pow kernel special-cases too (x*x*x, not a libm pow: GPT-2's GELU)
        if exponent == 2 and x.dtype != torch.bool:
            return ops.mul(x, x)
        if exponent == 3 and x.dtype.is_floating_point:
            return ops.mul(ops.mul(x, x), x)
        if exponent == 0.5 and x.dtype.is_floating_point:
            return ops.sqrt(x)
        if exponent == -0.5 and x.dtype.is_floating_point:
            return ops.rsqrt(x)
        if exponent == -1 and x.dtype.is_floating_point:
            return ops.reciprocal(x)
    return ops.pow(x, exponent)


@register(T.__rpow__)
def rpow(x: Value, other: Any) -> Any:
    return ops.pow(other, x)


@register(torch.float_power, T.float_power)
def float_power(x: Any, exponent: Any) -> Any:
    return ops.pow(ops.cast(x, torch.float64), ops.cast(exponent, torch.float64))


@register(torch.maximum, T.maximum, torch.max_other if hasattr(torch, "max_other") else None)
def maximum(x: Value, other: Value) -> Value:
    return ops.maximum(x, other)


@register(torch.minimum, T.minimum)
def minimum(x: Value, other: Value) -> Value:
    return ops.minimum(x, other)


@register(torch.fmax, T.fmax)
def fmax(x: Value, other: Value) -> Value:
    # x where x >= other or other is NaN, else other: eager's values, and its gradients (a tie is
    # all x's; maximum would split it in halves)
    return ops.where(ops.logical_or(ops.ge(x, other), ops.isnan(other)), x, other)


@register(torch.fmin, T.fmin)
def fmin(x: Value, other: Value) -> Value:
    return ops.where(ops.logical_or(ops.le(x, other), ops.isnan(other)), x, other)


for _name, _extra in {
    "atan2": [torch.arctan2, T.arctan2], "hypot": [], "copysign": [],
    "eq": [operator.eq, T.__eq__], "ne": [operator.ne, T.__ne__, torch.not_equal, T.not_equal],
    "lt": [operator.lt, T.__lt__, torch.less, T.less], "le": [operator.le, T.__le__, torch.less_equal,
                                                           T.less_equal],
    "gt": [operator.gt, T.__gt__, torch.greater, T.greater],
    "ge": [operator.ge, T.__ge__, torch.greater_equal, T.greater_equal],
    "logical_and": [], "logical_or": [], "logical_xor": [],
    "bitwise_and": [operator.and_, T.__and__, T.__rand__], "bitwise_or": [operator.or_, T.__or__, T.__ror__],
    "bitwise_xor": [operator.xor, T.__xor__, T.__rxor__],
    "bitwise_left_shift": [operator.lshift, T.__lshift__],
    "bitwise_right_shift": [operator.rshift, T.__rshift__],
}.items():
    register(getattr(torch, _name), getattr(T, _name), *_extra)(getattr(ops, _name))


# ----------------------------------------------------------- ternary and clamps
@register(torch.where)
def where(condition: Value, x: Any = None, other: Any = None) -> Any:
    if x is None and other is None:
        return ops.extern(torch.where, condition)  # the 1-arg form is nonzero: data-dependent shape
    return ops.where(condition, x, other)


@register(T.where)
def where_method(x: Value, condition: Value, other: Any) -> Any:
    # x.where(cond, other) is torch.where(cond, x, other): self is the value kept where cond holds
    return ops.where(condition, x, other)


@register(torch.clamp, T.clamp, torch.clip, T.clip)
def clamp(x: Value, min: Any = None, max: Any = None) -> Value:
    # NaN in x propagates (maximum/minimum propagate NaN).  The result type is the promotion of x
    # and both bounds together (int x with half and bf16 0-d bounds is float32, not half)
    bounds = [b for b in (min, max) if b is not None]
    result = ops.cast(x, result_type([ops._operand_tier(v) for v in (x, *bounds)])) if is_tensor(x) else x
    if is_tensor(result) and not result.dtype.is_floating_point and result.dtype != torch.bool:
        for bound in bounds:
            _check_int_bound(bound, result.dtype)
    value = result
    if min is not None:
        value = ops.maximum(value, min)
    if max is not None:
        value = ops.minimum(value, max)
    if not is_tensor(value) or not value.dtype.is_floating_point:
        return value
    return _with_clamp_gradients(result, min, max, value)


def _with_clamp_gradients(x: Value, low: Any, high: Any, value: Value) -> Value:
    """clamp's ``value`` (maximum/minimum: NaN propagates), routed so that autodiff gives eager's
    clamp gradients: to x where low <= x <= high, to a tensor low where x < low < high, to a tensor
    high where x > high or high < low, to nothing elsewhere (NaN, or x outside bounds that are
    equal).  maximum and minimum split a tie in halves: ``x.clamp(min=0)`` gave an x of exactly 0
    half its gradient.  Each branch below is the clamp's value wherever it is selected: every
    comparison with a NaN is false, and ``above`` is also kept off a NaN value (a NaN min with x
    above max, or a NaN x between crossed bounds, is NaN, not max)."""
    inside = None
    for bound, compare in ((low, ops.ge), (high, ops.le)):
        if bound is not None:
            inside = compare(x, bound) if inside is None else ops.logical_and(inside, compare(x, bound))
    out = ops.stop_gradient(value)
    if is_tensor(high):
        above = ops.gt(x, high) if low is None else ops.logical_and(
            ops.logical_or(ops.gt(x, high), ops.lt(high, low)), ops.logical_not(ops.isnan(value)))
        out = ops.where(above, high, out)
    if is_tensor(low):
        below = ops.lt(x, low) if high is None else ops.logical_and(ops.lt(x, low), ops.lt(low, high))
        out = ops.where(below, low, out)
    return ops.where(inside, x, out)


def _check_int_bound(bound: Any, dtype: torch.dtype) -> None:
    """Eager converts an int bound to the tensor's type with an overflow check (uint8 takes -255..255)."""
    if not isinstance(bound, int) or isinstance(bound, bool):
        return
    info = torch.iinfo(dtype)
    low = -info.max if info.min == 0 else info.min
    if not low <= bound <= info.max:
        name = {torch.uint8: "uint8_t", torch.int8: "int8_t", torch.int16: "int16_t", torch.int32: "int",
                torch.int64: "int64_t"}.get(dtype, str(dtype))
        raise RuntimeError(f"value cannot be converted to type {name} without overflow")


@register(torch.clamp_min, T.clamp_min)
def clamp_min(x: Value, min: Any) -> Value:
    return clamp(x, min=min)


@register(torch.clamp_max, T.clamp_max)
def clamp_max(x: Value, max: Any) -> Value:
    return clamp(x, max=max)


@register(torch.lerp, T.lerp)
def lerp(start: Value, end: Value, weight: Any) -> Value:
    for name, other in (("end", end), ("weight", weight)):  # eager does not promote lerp's operands
        if is_tensor(other) and other.dtype != start.dtype and (name == "end" or other.ndim):
            raise RuntimeError(f"expected dtype {start.dtype} for `{name}` but got dtype {other.dtype}")
    return _lerp(start, end, weight)


@_opmath
def _lerp(start: Value, end: Value, weight: Any) -> Value:
    # the two-sided formula eager uses, exact at weight 0 and 1
    diff = end - start
    small = ops.lt(ops.abs(weight), 0.5) if is_tensor(weight) else abs(weight) < 0.5
    return ops.where(small, start + weight * diff, end - diff * (1 - weight))


@register(torch.addcmul, T.addcmul)
@_opmath
def addcmul(x: Value, tensor1: Value, tensor2: Value, *, value: Any = 1) -> Value:
    # eager: self + value * t1 * t2, with value cast to the tensors' promoted type (an int for ints)
    value = _value_scalar(value, x, tensor1, tensor2)
    product = tensor1 * tensor2
    return x + (ops.mul(value, product) if value != 1 else product)


@register(torch.addcdiv, T.addcdiv)
@_opmath
def addcdiv(x: Value, tensor1: Value, tensor2: Value, *, value: Any = 1) -> Value:
    if not _is_floating(tensor1) and not _is_floating(tensor2):
        raise RuntimeError("Integer division with addcdiv is no longer supported, and in a future release "
                           "addcdiv will perform a true division of tensor1 and tensor2.")
    value = _value_scalar(value, x, tensor1, tensor2)
    if value == 1:
        return x + tensor1 / tensor2
    # eager's CPU kernel computes value * t1 / t2 left to right, its CUDA kernel value * (t1 / t2)
    if x.device.type == "cpu":
        return x + ops.mul(value, tensor1) / tensor2
    return x + ops.mul(value, tensor1 / tensor2)


def _is_floating(v: Any) -> bool:
    return (is_tensor(v) and (v.dtype.is_floating_point or v.dtype.is_complex)) or isinstance(v, float)


def _value_scalar(value: Any, *tensors: Any) -> Any:
    """addcmul/addcdiv's `value` takes the promoted type of the tensors: 0.5 is 0 for int tensors."""
    dtype = result_type([ops._operand_tier(t) for t in tensors])
    return ops._python_scalar(value, dtype) if not isinstance(value, Value) else value


@register(torch.masked_fill, T.masked_fill)
def masked_fill(x: Value, mask: Value, value: Any) -> Value:
    if is_tensor(value):
        value = ops.cast(value, x.dtype)
    else:
        value = ops._python_scalar(value, x.dtype)
    return ops.cast(ops.where(mask, value, x), x.dtype)


# ------------------------------------------------------------------------ casts
_CAST_METHODS = {T.float: torch.float32, T.double: torch.float64, T.half: torch.float16,
                 T.bfloat16: torch.bfloat16, T.int: torch.int32, T.long: torch.int64, T.short: torch.int16,
                 T.char: torch.int8, T.byte: torch.uint8, T.bool: torch.bool}


def _laid_out(x: Value, stride: tuple) -> bool:
    """x has these strides where it matters (size-1 dims are free, as in is_contiguous(format)),
    provably at every size: no guard is taken, and a symbolic x that is not known to be so gets
    copied (then x.contiguous() of a contiguous x must still be x itself: is_contiguous decides)."""
    if stride == contiguous_strides(tuple(x.shape)) and x.meta.is_contiguous():
        return True
    return all(known_equal(a, b) for a, b, n in zip(x.meta.stride, stride, x.shape)
               if not (isinstance(n, int) and n == 1))


def _in_format(x: Value, memory_format: Any, fresh: bool) -> Value:
    """x in ``memory_format``: x itself when it is laid out so already, else a copy with those strides.
    ``fresh``: x was just computed here (a cast), so its own layout may be set instead of copying."""
    stride = memory_format_strides(tuple(x.shape), memory_format)
    if stride is None or _laid_out(x, stride):
        return x
    return ops.relaid(x if fresh else ops.clone(x), stride)


def _fresh_copy(x: Value, memory_format: Any) -> Value:
    """A new tensor with x's values (``x.to(copy=True)``): in ``memory_format``, or for
    preserve_format in eager's empty_like layout (graph.preserved_strides)."""
    copy = ops.clone(x)
    if memory_format not in (None, torch.preserve_format):
        return _in_format(copy, memory_format, fresh=True)
    return ops.relaid(copy, preserved_strides(x.shape, x.meta.stride))


def _cast_method(dtype: torch.dtype):
    def cast_method(x: Value, memory_format: Any = None) -> Value:
        result = ops.cast(x, dtype)  # same dtype: eager returns self (an alias)
        return _in_format(result, memory_format, fresh=result is not x)
    return cast_method


for _method, _dtype in _CAST_METHODS.items():
    register(_method, view=True)(_cast_method(_dtype))


@register(T.to, view=True)
def to(x: Value, *args: Any, **kwargs: Any) -> Any:
    dtype, device = kwargs.get("dtype"), kwargs.get("device")
    for arg in args:
        if isinstance(arg, torch.dtype):
            dtype = arg
        elif isinstance(arg, (str, torch.device)):
            device = torch.device(arg)
        elif is_tensor(arg):
            dtype, device = arg.dtype, arg.device
    if device is not None and torch.device(device) != x.device:
        return ops.extern(T.to, x, *args, **kwargs)
    result = ops.cast(x, dtype) if dtype is not None else x
    memory_format = kwargs.get("memory_format")
    if kwargs.get("copy") and result is x:
        return _fresh_copy(x, memory_format)
    return _in_format(result, memory_format, fresh=result is not x)


@register(T.type, view=True)
def type_(x: Value, dtype: Any = None, non_blocking: bool = False) -> Any:
    if dtype is None:
        return ops.extern(T.type, x)
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype.split(".")[-1].replace("Tensor", "").lower(), None) or dtype
    return ops.cast(x, dtype)


@register(T.type_as, view=True)
def type_as(x: Value, other: Value) -> Value:
    return ops.cast(x, other.dtype)


@register(torch.clone, T.clone)
def clone(x: Value, *, memory_format: Any = None) -> Value:
    """Values are immutable here (the output step copies if it must), so a clone with the layout of
    ``x`` is ``x`` itself.  Eager's clone keeps a non-overlapping and dense layout but makes any
    other one (a strided slice) dense in x's order of dims (empty_like's infer_dense_strides, which
    the copy prim's elementwise layout is): then a copy, so that views of the clone have eager's
    strides (a returned view of the clone of ``x[:, ::2]`` was rebuilt from the slice's strides,
    out of its buffer's bounds; fuzz seed 40262)."""
    meta = x.meta
    if memory_format in (None, torch.preserve_format):
        try:
            same_layout = is_dense(meta.shape, meta.stride)
        except TypeError:       # symbolic strides that do not order: copy, never guess
            same_layout = False
    else:
        return _in_format(x, memory_format, fresh=False)
    return x if same_layout else ops.clone(x)


@register(T.contiguous, view=True)
def contiguous(x: Value, memory_format: Any = torch.contiguous_format) -> Value:
    # eager returns self when already laid out so (an alias) and a fresh copy otherwise
    if memory_format is torch.preserve_format:
        raise RuntimeError("preserve memory format is unsupported by the contiguous operator")
    return _in_format(x, memory_format, fresh=False)


@register(T.detach, torch.detach, T.requires_grad_, view=True)
def detach(x: Value, *args: Any) -> Value:
    return x


_ = computation_dtype
