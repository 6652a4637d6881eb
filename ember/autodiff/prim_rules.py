"""VJP rules for every primitive of ``ember.prims.primitives`` (the contract: ``rules.py``).

Each rule follows eager PyTorch's derivative formula (tools/autograd/derivatives.yaml and
FunctionsManual.cpp), including its conventions at edge points: abs'(0) = 0, ties of
maximum/minimum split the gradient in halves, amax/amin split it evenly among the tied
elements, pow's exponent gradient is 0 where the base is 0 and the exponent >= 0, prod handles
zeros exactly.

Conventions of this file:
  * Only floating-point tensors receive gradients; integer/bool tensors, Python numbers, dims,
    shapes and index tensors get ``None``.
  * Elementwise formulas of fp16/bf16 values are computed in fp32 and rounded once to the
    argument's dtype (``_opmath``): eager rounds after every op of a composite formula, so
    low-precision results may differ from eager's by an ulp or two (never in fp32/fp64).
  * Complex tensors are not handled (no conj): the prims are used with real dtypes.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ember import config
from ember.autodiff.rules import vjp_rule
from ember.prims import ops
from ember.prims import primitives as P
from ember.prims.type_promotion import computation_dtype
from ember.prims.values import Value, emit, is_tensor
from ember.symbolic import is_symbolic

Grad = Value | None


# ====================================================================== helpers
def _differentiable(value: Any) -> bool:
    """A tensor that can carry a gradient (floating point)."""
    return is_tensor(value) and (value.dtype.is_floating_point or value.dtype.is_complex)


def _opmath(fn: Callable[..., Value], like: Value, *operands: Any) -> Value:
    """fn(*operands) computed in fp32 for fp16/bf16 operands, rounded once to like's dtype."""
    compute = computation_dtype(like.dtype)
    upcast = [ops.cast(v, compute) if is_tensor(v) and v.dtype.is_floating_point else v for v in operands]
    return ops.cast(fn(*upcast), like.dtype)


def _grad_for(arg: Any, fn: Callable[..., Value], *operands: Any) -> Grad:
    """fn(*operands) as the gradient of `arg` (in arg's dtype), or None if arg takes none."""
    if not _differentiable(arg):
        return None
    return _opmath(fn, arg, *operands)


def zeros_like(x: Value) -> Value:
    return ops.full(x.shape, 0, x.dtype, x.device)


def _zero_grad(x: Any) -> Grad:
    """Piecewise-constant functions (floor, sign ...): eager's zeros_like(x)."""
    return zeros_like(x) if _differentiable(x) else None


def _unreduce(g: Value, x: Value, dims: Sequence[int]) -> Value:
    """A reduction's output (dims dropped) broadcast back to x's shape."""
    return ops.expand_to(ops.keep_dims(g, x, dims), x.shape)


def _sum_to(v: Value, shape: Sequence[Any]) -> Value:
    """Sum v over the dims that broadcasting to v's shape added or stretched (sum_to_size)."""
    shape = tuple(shape)
    lead = v.ndim - len(shape)
    dims = tuple(range(lead)) + tuple(lead + i for i, size in enumerate(shape)
                                      if size == 1 and v.shape[lead + i] != 1)
    if dims:
        v = emit(P.sum_, v, dims)
    return ops.reshape(v, shape)


def _none_for_all(grad: Any, out: Any, *args: Any) -> tuple:
    return (None,) * len(args)


# ================================================================ elementwise
LN2, LN10 = math.log(2.0), math.log(10.0)
TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)
HALF_SQRT_PI = 0.5 * math.sqrt(math.pi)


def _unary(name: str, uses_out: bool = False) -> Callable[[Callable[..., Value]], Callable[..., Value]]:
    """Register a unary rule from formula(g, x) (or formula(g, out) when uses_out)."""
    def register(formula: Callable[..., Value]) -> Callable[..., Value]:
        @vjp_rule(name)
        def rule(grad: Value, out: Value, x: Value) -> tuple[Grad]:
            return (_grad_for(x, formula, grad, out if uses_out else x),)
        rule.__name__ = f"{name}_vjp"
        return formula
    return register


@_unary("neg")
def _neg(g, x): return ops.neg(g)
@_unary("abs")
def _abs(g, x): return g * ops.sign(x)                                  # abs'(0) = sign(0) = 0
@_unary("exp", uses_out=True)
def _exp(g, out): return g * out
@_unary("exp2", uses_out=True)
def _exp2(g, out): return g * out * LN2
@_unary("expm1", uses_out=True)
def _expm1(g, out): return g * (out + 1.0)
@_unary("log")
def _log(g, x): return g / x
@_unary("log1p")
def _log1p(g, x): return g / (x + 1.0)
@_unary("log2")
def _log2(g, x): return g / (x * LN2)
@_unary("log10")
def _log10(g, x): return g / (x * LN10)
@_unary("sqrt", uses_out=True)
def _sqrt(g, out): return g / (out * 2.0)                              # sqrt'(0) = inf as eager
@_unary("rsqrt", uses_out=True)
def _rsqrt(g, out): return g * out * out * out * -0.5
@_unary("reciprocal", uses_out=True)
def _reciprocal(g, out): return -g * (out * out)
@_unary("sin")
def _sin(g, x): return g * ops.cos(x)
@_unary("cos")
def _cos(g, x): return -g * ops.sin(x)
@_unary("tan", uses_out=True)
def _tan(g, out): return g * (out * out + 1.0)
@_unary("asin")
def _asin(g, x): return g * ops.rsqrt(1.0 - x * x)
@_unary("acos")
def _acos(g, x): return -g * ops.rsqrt(1.0 - x * x)
@_unary("atan")
def _atan(g, x): return g / (x * x + 1.0)
@_unary("sinh")
def _sinh(g, x): return g * ops.cosh(x)
@_unary("cosh")
def _cosh(g, x): return g * ops.sinh(x)
@_unary("tanh", uses_out=True)
def _tanh(g, out): return g * (1.0 - out * out)
@_unary("asinh")
def _asinh(g, x): return g * ops.rsqrt(x * x + 1.0)
@_unary("acosh")
def _acosh(g, x): return g * ops.rsqrt(x * x - 1.0)
@_unary("atanh")
def _atanh(g, x): return g / (1.0 - x * x)
@_unary("erf")
def _erf(g, x): return g * TWO_OVER_SQRT_PI * ops.exp(-(x * x))
@_unary("erfc")
def _erfc(g, x): return g * -TWO_OVER_SQRT_PI * ops.exp(-(x * x))
@_unary("erfinv", uses_out=True)
def _erfinv(g, out): return g * HALF_SQRT_PI * ops.exp(out * out)
@_unary("lgamma")
def _lgamma(g, x): return g * ops.extern(torch.digamma, x)              # no digamma prim: eager's
@_unary("sigmoid", uses_out=True)
def _sigmoid(g, out): return g * (1.0 - out) * out


@vjp_rule("floor", "ceil", "round", "trunc", "sign")
def piecewise_constant_vjp(grad: Value, out: Value, x: Value) -> tuple[Grad]:
    return (_zero_grad(x),)


@vjp_rule("signbit", "isnan", "isinf", "isfinite", "logical_not", "bitwise_not")
def boolean_unary_vjp(grad: Any, out: Value, x: Value) -> tuple[Grad]:
    return (None,)


@vjp_rule("eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor",
          "bitwise_and", "bitwise_or", "bitwise_xor", "bitwise_left_shift", "bitwise_right_shift")
def boolean_binary_vjp(grad: Any, out: Value, a: Any, b: Any) -> tuple[Grad, Grad]:
    return None, None


@vjp_rule("add")
def add_vjp(grad: Value, out: Value, a: Any, b: Any) -> tuple[Grad, Grad]:
    return (grad if _differentiable(a) else None), (grad if _differentiable(b) else None)


@vjp_rule("sub")
def sub_vjp(grad: Value, out: Value, a: Any, b: Any) -> tuple[Grad, Grad]:
    return (grad if _differentiable(a) else None), _grad_for(b, ops.neg, grad)


@vjp_rule("mul")
def mul_vjp(grad: Value, out: Value, a: Any, b: Any) -> tuple[Grad, Grad]:
    return _grad_for(a, ops.mul, grad, b), _grad_for(b, ops.mul, grad, a)


@vjp_rule("div")
def div_vjp(grad: Value, out: Value, a: Any, b: Any) -> tuple[Grad, Grad]:
    return (_grad_for(a, ops.div, grad, b),
            _grad_for(b, lambda g, a, b: -g * a / (b * b), grad, a, b))


@vjp_rule("floor_divide")
def floor_divide_vjp(grad: Value, out: Value, a: Any, b: Any) -> tuple[Grad, Grad]:
    # eager raises for floor_divide's derivative; div(rounding_mode="floor") (which decomposes to
    # this prim) has zero gradients: so do we
    return _zero_grad(a), _zero_grad(b)


@vjp_rule("remainder")
def remainder_vjp(grad: Value, out: Value, a: Any, b: Any) -> tuple[Grad, Grad]:
    # d/db (a - b * floor(a / b)) = -floor(a / b), with eager's div(rounding_mode="floor")
    return (grad if _differentiable(a) else None,
            _grad_for(b, lambda g, a, b: -g * ops.floor_divide(a, b), grad, a, b))


@vjp_rule("fmod")
def fmod_vjp(grad: Value, out: Value, a: Any, b: Any) -> tuple[Grad, Grad]:
    return (grad if _differentiable(a) else None,
            _grad_for(b, lambda g, a, b: -g * ops.trunc(a / b), grad, a, b))


@vjp_rule("pow")
def pow_vjp(grad: Value, out: Value, a: Any, b: Any) -> tuple[Grad, Grad]:
    # a runtime scalar (a Value without a tensor meta) cannot be tested for 0 here: make it a tensor
    a_, b_ = (ops.full(out.shape, v, out.dtype, out.device) if isinstance(v, Value) and not v.is_tensor else v
              for v in (a, b))
    return (_grad_for(a, _pow_base_grad, grad, a_, b_, _exponent_minus_one(b_)),
            _grad_for(b, _pow_exponent_grad, grad, out, a_, b_))


def _pow_base_grad(g: Value, a: Value, b: Any, b_minus_one: Any) -> Value:
    """eager's pow_backward_self: 0 where the exponent is 0 (even for a zero base)."""
    if not is_tensor(b):
        return zeros_like(g) if b == 0 else g * (b * ops.pow(a, b_minus_one))
    return ops.where(ops.eq(b, 0), 0.0, g * (b * ops.pow(a, b_minus_one)))


def _exponent_minus_one(b: Any) -> Any:
    """b - 1 as eager's pow_backward_self computes it: in the exponent tensor's own dtype.  pow
    reads a bf16/fp16 exponent cast up to a float32 base's dtype; eager subtracts 1 before that
    cast, so the difference rounds to bf16 (an exponent of 0.2598: -0.7422, not -0.7402, and the
    base's gradient 1% off eager's; training fuzz seed 20581)."""
    if not is_tensor(b):
        return b - 1
    node = b.node
    while getattr(node.target, "name", None) in _SAME_VALUES and hasattr(node.args[0], "target"):
        node = node.args[0]         # broadcast to the base's shape after the cast
    if getattr(node.target, "name", None) == "convert_element_type":
        source_dtype = getattr(getattr(node.args[0], "meta", None), "dtype", None)
        if source_dtype in (torch.bfloat16, torch.float16) and b.dtype in (torch.float32, torch.float64):
            return ops.cast(ops.cast(b, source_dtype) - 1.0, b.dtype)
    return b - 1.0


_SAME_VALUES = frozenset({"expand", "reshape"})       # view prims that keep every value


def _pow_exponent_grad(g: Value, out: Value, a: Any, b: Value) -> Value:
    """eager's pow_backward_exponent: 0 where the base is 0 and the exponent >= 0."""
    out = ops.cast(out, g.dtype)
    if not is_tensor(a):
        log_a = math.log(a) if a > 0 else (-math.inf if a == 0 else math.nan)
        if a == 0:
            return g * ops.where(ops.ge(b, 0), 0.0, out * log_a)
        return g * (out * log_a)
    return g * ops.where(ops.logical_and(ops.ge(b, 0), ops.eq(a, 0)), 0.0, out * ops.log(a))


def _tie_split(g: Value, a: Any, b: Any, loses: Callable[[Any, Any], Value]) -> Value:
    """maximum/minimum: the whole gradient to the winner, half to each on a tie (eager's)."""
    return ops.where(loses(a, b), 0.0, ops.where(ops.eq(a, b), g * 0.5, g))


@vjp_rule("maximum")
def maximum_vjp(grad: Value, out: Value, a: Any, b: Any) -> tuple[Grad, Grad]:
    return (_grad_for(a, lambda g, a, b: _tie_split(g, a, b, ops.lt), grad, a, b),
            _grad_for(b, lambda g, a, b: _tie_split(g, a, b, ops.gt), grad, a, b))


@vjp_rule("minimum")
def minimum_vjp(grad: Value, out: Value, a: Any, b: Any) -> tuple[Grad, Grad]:
    return (_grad_for(a, lambda g, a, b: _tie_split(g, a, b, ops.gt), grad, a, b),
            _grad_for(b, lambda g, a, b: _tie_split(g, a, b, ops.lt), grad, a, b))


@vjp_rule("atan2")
def atan2_vjp(grad: Value, out: Value, a: Any, b: Any) -> tuple[Grad, Grad]:
    # eager: recip = 1 / (a^2 + b^2), 0 at the origin; (g * b * recip, g * -a * recip)
    return (_grad_for(a, lambda g, a, b: g * b * _atan2_recip(a, b), grad, a, b),
            _grad_for(b, lambda g, a, b: g * -a * _atan2_recip(a, b), grad, a, b))


def _atan2_recip(a: Any, b: Any) -> Any:
    denominator = a * a + b * b
    return ops.where(ops.eq(denominator, 0), 0.0, ops.reciprocal(denominator))


@vjp_rule("hypot")
def hypot_vjp(grad: Value, out: Value, a: Any, b: Any) -> tuple[Grad, Grad]:
    return (_grad_for(a, lambda g, a, out: g * a / out, grad, a, out),
            _grad_for(b, lambda g, b, out: g * b / out, grad, b, out))


@vjp_rule("copysign")
def copysign_vjp(grad: Value, out: Value, a: Any, b: Any) -> tuple[Grad, Grad]:
    # eager: g * (out / a) with 0 where a == 0; the sign operand gets zeros
    return (_grad_for(a, lambda g, a, out: g * ops.where(ops.eq(a, 0), 0.0, out / a), grad, a, out),
            _zero_grad(b))


@vjp_rule("clone")
def clone_vjp(grad: Value, out: Value, x: Value) -> tuple[Grad]:
    return (grad if _differentiable(x) else None,)


@vjp_rule("where")
def where_vjp(grad: Value, out: Value, cond: Value, a: Any, b: Any) -> tuple[Grad, Grad, Grad]:
    cond = _condition_from_output(out, cond, a, b)
    return (None,
            _grad_for(a, lambda g: ops.where(cond, g, 0.0), grad),
            _grad_for(b, lambda g: ops.where(cond, 0.0, g), grad))


_HOLDS = {"le": lambda v, t: v <= t, "lt": lambda v, t: v < t, "ge": lambda v, t: v >= t, "gt": lambda v, t: v > t}


def _condition_from_output(out: Value, cond: Value, a: Any, b: Any) -> Value:
    """``cond`` recomputed from where's output when that is exact: relu is where(x <= 0, 0, x), and
    x <= 0 exactly where relu(x) <= 0 (NaN included: false for both).  Eager's relu backward reads
    the output too, so the partitioner saves that output (the next layer's matmul saves it anyway)
    rather than a bool mask beside it: less memory, one store and allocation fewer per activation.

    Holds for where(x CMP t, c, x) when c CMP t is true, and for where(x CMP t, x, c) when it is
    false: the output passes the test exactly where x did.  t and c must be numbers the output's
    dtype holds exactly, so that rounding cannot move c across t."""
    node = cond.node if isinstance(cond, Value) else None
    compare = getattr(getattr(node, "target", None), "name", None)
    if not config.mask_from_output or compare not in _HOLDS or not isinstance(out, Value) or not out.is_tensor:
        return cond
    x, threshold = node.args
    if not _exact_number(threshold, out.dtype):
        return cond
    if isinstance(b, Value) and b.node is x and _exact_number(a, out.dtype) and _HOLDS[compare](a, threshold):
        return getattr(ops, compare)(out, threshold)
    if isinstance(a, Value) and a.node is x and _exact_number(b, out.dtype) and not _HOLDS[compare](b, threshold):
        return getattr(ops, compare)(out, threshold)
    return cond


def _exact_number(value: Any, dtype: torch.dtype) -> bool:
    """A Python int or float (not NaN) that ``dtype`` represents exactly."""
    if type(value) not in (int, float) or value != value or dtype == torch.bool:
        return False
    try:
        return torch.tensor(value, dtype=dtype).item() == value
    except (RuntimeError, OverflowError):
        return False


@vjp_rule("detach")
def detach_vjp(grad: Value, out: Value, x: Value) -> tuple[None]:
    return (None,)       # x.detach() stops the gradient


@vjp_rule("convert_element_type")
def convert_element_type_vjp(grad: Value, out: Value, x: Value, dtype: torch.dtype) -> tuple[Grad, None]:
    if not _differentiable(x) or not _differentiable(out):
        return None, None
    return ops.cast(grad, x.dtype), None


# ======================================================================= views
@vjp_rule("reshape")
def reshape_vjp(grad: Value, out: Value, x: Value, shape: Any) -> tuple[Grad, None]:
    return ops.reshape(grad, x.shape) if _differentiable(x) else None, None


@vjp_rule("permute")
def permute_vjp(grad: Value, out: Value, x: Value, dims: Sequence[int]) -> tuple[Grad, None]:
    inverse = [0] * len(dims)
    for position, dim in enumerate(dims):
        inverse[dim] = position
    return ops.permute(grad, inverse) if _differentiable(x) else None, None


@vjp_rule("expand")
def expand_vjp(grad: Value, out: Value, x: Value, shape: Any) -> tuple[Grad, None]:
    return _sum_to(grad, x.shape) if _differentiable(x) else None, None


@vjp_rule("slice")
def slice_vjp(grad: Value, out: Value, x: Value, dim: int, start: Any, end: Any, step: Any = 1
              ) -> tuple[Grad, None, None, None, None]:
    nones = (None, None, None, None)
    if not _differentiable(x):
        return (None, *nones)
    if step != 1:
        # put step-1 zeros after each element: (.., n, ..) -> (.., n, 1, ..) -> pad -> (.., n*step, ..)
        n = grad.shape[dim]
        spread = ops.unsqueeze(grad, dim + 1)
        spread = emit(P.constant_pad, spread, _pad_for(spread.ndim, dim + 1, 0, step - 1), 0.0)
        grad = ops.reshape(spread, (*grad.shape[:dim], n * step, *grad.shape[dim + 1:]))
        # the trailing zeros of the last element may reach past the end of x: drop them
        grad = ops.slice_dim(grad, dim, 0, x.shape[dim] - start)
    before, after = start, x.shape[dim] - start - grad.shape[dim]
    return (emit(P.constant_pad, grad, _pad_for(grad.ndim, dim, before, after), 0.0), *nones)


def _pad_for(ndim: int, dim: int, before: Any, after: Any) -> list[Any]:
    """F.pad's list (last dim first) padding only `dim`."""
    pad: list[Any] = [0, 0] * (ndim - dim)
    pad[-2:] = [before, after]
    return pad


@vjp_rule("as_strided")
def as_strided_vjp(grad: Value, out: Value, x: Value, size: Any, stride: Any, storage_offset: Any = 0
                   ) -> tuple:
    """Scatter-add the gradient into x's storage (the storage range both views touch), then read
    x's elements from it, as eager's as_strided_backward (which also divides by how many
    elements of x share a location when x overlaps itself).  Needs concrete sizes."""
    nones = (None,) * 3
    if not _differentiable(x):
        return (None, *nones)
    if ops.prod_sizes(out.shape) == 0 or ops.prod_sizes(x.shape) == 0:
        return (zeros_like(x), *nones)
    out_positions = _storage_positions(out.shape, out.meta.stride, out.meta.storage_offset - x.meta.storage_offset,
                                       x.device)
    x_positions = _storage_positions(x.shape, x.meta.stride, 0, x.device)
    low = min(0, _min_position(out.shape, out.meta.stride, out.meta.storage_offset - x.meta.storage_offset))
    high = max(_max_position(x.shape, x.meta.stride, 0),
               _max_position(out.shape, out.meta.stride, out.meta.storage_offset - x.meta.storage_offset))
    length = high - low + 1
    storage = _scatter_add_flat(length, out_positions - low, grad)
    if x.meta.is_contiguous() and low == 0 and length == ops.prod_sizes(x.shape):
        return (ops.reshape(storage, x.shape), *nones)     # x is the storage itself: no gather
    result = emit(P.index, storage, [x_positions - low])
    from ember.prims.functionalize import non_overlapping
    if not non_overlapping(tuple(x.shape), tuple(x.meta.stride)):
        count = _scatter_add_flat(length, x_positions - low, ops.full(x.shape, 1, grad.dtype, x.device))
        result = result / emit(P.index, count, [x_positions - low])
    return (result, *nones)


def _storage_positions(size: Sequence[Any], stride: Sequence[Any], offset: Any, device: torch.device) -> Value:
    """offset + sum_k i_k * stride_k for every index of a view, as an int64 tensor of its shape."""
    position = ops.full((), offset, torch.int64, device)
    for dim, (length, step) in enumerate(zip(size, stride)):
        along = ops.iota(length, 0, step, torch.int64, device)
        position = ops.add(position, ops.reshape(along, [length if d == dim else 1 for d in range(len(size))]))
    return ops.expand_to(position, tuple(size))


def _min_position(size: Sequence[int], stride: Sequence[int], offset: int) -> int:
    return offset + sum((n - 1) * s for n, s in zip(size, stride) if s < 0)


def _max_position(size: Sequence[int], stride: Sequence[int], offset: int) -> int:
    return offset + sum((n - 1) * s for n, s in zip(size, stride) if s > 0)


def _scatter_add_flat(length: int, positions: Value, values: Value) -> Value:
    zeros = ops.full((length,), 0, values.dtype, values.device)
    flat = (ops.prod_sizes(values.shape),)
    return emit(P.scatter_add, zeros, 0, ops.reshape(positions, flat), ops.reshape(values, flat))


# ================================================================== reductions
@vjp_rule("sum")
def sum_vjp(grad: Value, out: Value, x: Value, dims: Sequence[int]) -> tuple[Grad, None]:
    return _unreduce(grad, x, dims) if _differentiable(x) else None, None


@vjp_rule("prod")
def prod_vjp(grad: Value, out: Value, x: Value, dims: Sequence[int]) -> tuple[Grad, None]:
    """Without zeros: g * out / x.  A single zero gets g * (product of the others); with two or
    more zeros every gradient is 0 (eager's prod_backward)."""
    if not _differentiable(x):
        return None, None
    if not dims:
        return grad, None

    def formula(g: Value, out: Value, x: Value) -> Value:
        is_zero = ops.eq(x, 0)
        zeros = _unreduce(ops.sum(is_zero, dims), x, dims)
        others = _unreduce(emit(P.prod, ops.where(is_zero, 1.0, x), dims), x, dims)
        g, out = _unreduce(g, x, dims), _unreduce(out, x, dims)
        one_zero = ops.where(ops.logical_and(is_zero, ops.eq(zeros, 1)), g * others, 0.0)
        return ops.where(ops.eq(zeros, 0), g * out / x, one_zero)
    return _opmath(formula, x, grad, out, x), None


def _extremum_vjp(grad: Value, out: Value, x: Value, dims: Sequence[int]) -> tuple[Grad, None]:
    """amax/amin: eager's grad * (x == out) / count: ties share the gradient evenly."""
    if not _differentiable(x):
        return None, None
    if not dims:
        return grad, None

    def formula(g: Value, out: Value, x: Value) -> Value:
        is_extremum = ops.eq(x, _unreduce(out, x, dims))
        count = ops.sum(ops.cast(is_extremum, g.dtype), dims)
        # a product (not a where) as eager: a NaN row gets NaN gradients (0 * inf)
        return _unreduce(g / count, x, dims) * ops.cast(is_extremum, g.dtype)
    return _opmath(formula, x, grad, out, x), None


vjp_rule("amax", "amin")(_extremum_vjp)
vjp_rule("argmax", "argmin")(_none_for_all)


@vjp_rule("var_mean")
def var_mean_vjp(grad: tuple[Grad, Grad], out: tuple[Value, Value], x: Value, dims: Sequence[int],
                 correction: Any = 0, whole: bool = False) -> tuple[Grad, ...]:
    """var: 2 / (N - correction) * g * (x - mean); mean: g / N.  N == correction gives eager's
    inf * (x - mean) (NaN where x == mean).  Called without dims (``whole``), eager clamps: where
    N <= correction its gradient is g * inf, NaN where x == mean, whatever the sign of x - mean."""
    grad_var, grad_mean = grad
    nones = (None,) * (3 + whole)              # one per argument
    if not _differentiable(x) or (grad_var is None and grad_mean is None):
        return nones
    count = ops.reduced_numel(x, dims)
    dof = count - correction
    clamped = whole and not is_symbolic(dof) and dof <= 0
    # with N a size symbol, 2 / (N - correction) in Python would pin N: the kernel divides instead
    scale = None if is_symbolic(dof) else math.inf if clamped or dof == 0 else 2.0 / dof

    def formula(*operands: Value) -> Value:
        operands = list(operands)
        total = None
        if grad_var is not None:
            g, mean = operands.pop(0), operands.pop(0)
            centered = operands[-1] - _unreduce(mean, x, dims)
            if clamped:
                centered = ops.abs(centered)
            total = _unreduce(g * 2.0 / dof, x, dims) * centered if scale is None else \
                scale * _unreduce(g, x, dims) * centered
        if grad_mean is not None:
            by_mean = _unreduce(operands.pop(0), x, dims) / count
            total = by_mean if total is None else total + by_mean
        return total
    operands = ([grad_var, out[1]] if grad_var is not None else []) + \
        ([grad_mean] if grad_mean is not None else []) + [x]
    return (_opmath(formula, x, *operands),) + nones[1:]


# ======================================================================= scans
@vjp_rule("cumsum")
def cumsum_vjp(grad: Value, out: Value, x: Value, dim: int) -> tuple[Grad, None]:
    """A reversed cumsum: flip, cumsum, flip (flips are `index` with a descending iota)."""
    if not _differentiable(x):
        return None, None
    if grad.ndim == 0 or (isinstance(grad.shape[dim], int) and grad.shape[dim] <= 1):
        return grad, None
    return _flip(emit(P.cumsum, _flip(grad, dim), dim), dim), None


def _flip(x: Value, dim: int) -> Value:
    n = x.shape[dim]
    return emit(P.index, x, [None] * dim + [ops.iota(n, n - 1, -1, torch.int64, x.device)])


# ==================================================== creation and randomness
vjp_rule("iota", "full", "philox_rand")(_none_for_all)


# ==================================================================== indexing
@vjp_rule("gather")
def gather_vjp(grad: Value, out: Value, x: Value, dim: int, index: Value) -> tuple[Grad, None, None]:
    if not _differentiable(x):
        return None, None, None
    return emit(P.scatter_add, zeros_like(x), dim, index, grad), None, None


@vjp_rule("index")
def index_vjp(grad: Value, out: Value, x: Value, indices: list) -> tuple[Grad, None]:
    if not _differentiable(x):
        return None, None
    rows = _table_rows(x, indices)
    if rows is not None:
        # rows of a table (an embedding): ATen's sort-and-segment embedding_dense_backward, as
        # eager's F.embedding; an index_put with accumulate of BERT's bf16 rows took 0.86 ms, this 0.05
        return ops.extern(torch.ops.aten.embedding_dense_backward.default, grad, rows, x.shape[0], -1, False), None
    return emit(P.index_put, zeros_like(x), list(indices), grad, True), None


def _table_rows(x: Value, indices: list) -> Value | None:
    """For ``x[rows]`` of a 2-D floating table by one integer tensor: the rows, made non-negative."""
    if x.ndim != 2 or x.dtype.is_complex or len(indices) != 1 or not is_tensor(indices[0]) or \
            indices[0].dtype not in (torch.int32, torch.int64):
        return None
    rows = ops.cast(indices[0], torch.int64)
    return ops.where(ops.lt(rows, 0), ops.add(rows, x.shape[0]), rows)


@vjp_rule("scatter")
def scatter_vjp(grad: Value, out: Value, x: Value, dim: int, index: Value, src: Value
                ) -> tuple[Grad, None, None, Grad]:
    """x: the gradient with the overwritten positions zeroed; src: the gradient gathered back."""
    grad_x = None
    if _differentiable(x):
        grad_x = emit(P.scatter, grad, dim, index, ops.full(index.shape, 0, grad.dtype, grad.device))
    return grad_x, None, None, _gather_for_src(grad, dim, index, src)


@vjp_rule("scatter_add")
def scatter_add_vjp(grad: Value, out: Value, x: Value, dim: int, index: Value, src: Value
                    ) -> tuple[Grad, None, None, Grad]:
    return (grad if _differentiable(x) else None), None, None, _gather_for_src(grad, dim, index, src)


def _gather_for_src(grad: Value, dim: int, index: Value, src: Any) -> Grad:
    """grad.gather(dim, index), zero-padded to src's shape where src is larger (unread)."""
    if not _differentiable(src):
        return None
    picked = ops.cast(emit(P.gather, grad, dim, index), src.dtype)
    if tuple(picked.shape) == tuple(src.shape):
        return picked
    pad: list[Any] = []
    for d in reversed(range(src.ndim)):
        pad += [0, src.shape[d] - picked.shape[d]]
    return emit(P.constant_pad, picked, pad, 0.0)


@vjp_rule("index_put")
def index_put_vjp(grad: Value, out: Value, x: Value, indices: list, values: Value, accumulate: bool = False
                  ) -> tuple[Grad, None, Grad, None]:
    """x: the gradient, zeroed where written unless accumulating; values: the gradient at the
    written positions (summed over the dims broadcasting added)."""
    indices = list(indices)
    grad_x = None
    if _differentiable(x):
        grad_x = grad
        if not accumulate:
            target = P.index.infer_meta(x.meta, [i.meta if i is not None else None for i in indices])
            grad_x = emit(P.index_put, grad, indices, ops.full(target.shape, 0, grad.dtype, grad.device), False)
    grad_values = None
    if _differentiable(values):
        grad_values = ops.cast(_sum_to(emit(P.index, grad, indices), values.shape), values.dtype)
    return grad_x, None, grad_values, None


@vjp_rule("cat")
def cat_vjp(grad: Value, out: Value, tensors: list, dim: int) -> tuple[list, None]:
    grads: list[Grad] = []
    start: Any = 0
    for tensor in tensors:
        length = tensor.shape[dim]
        if _differentiable(tensor):
            piece = emit(P.slice_, grad, dim, start, start + length, 1) if length != grad.shape[dim] else grad
            grads.append(ops.cast(piece, tensor.dtype))
        else:
            grads.append(None)
        start = start + length
    return grads, None


@vjp_rule("pool_argmax")
def pool_argmax_vjp(grad: Any, out: Value, x: Value, *window: Any) -> tuple:
    return (None,) * (1 + len(window))          # an index: no gradient


@vjp_rule("pool_select")
def pool_select_vjp(grad: Value, out: Value, x: Value, index: Value, kernel: Any, stride: Any, padding: Any,
                    dilation: Any) -> tuple:
    """Each window's gradient goes to the position its index names (eager's max pooling backward)."""
    grad_x = emit(P.pool_scatter, grad, index, x.shape[-2], x.shape[-1], kernel, stride, padding, dilation) \
        if _differentiable(x) else None
    return grad_x, None, None, None, None, None


@vjp_rule("pool_scatter")
def pool_scatter_vjp(grad: Value, out: Value, g: Value, index: Value, height: Any, width: Any, kernel: Any,
                     stride: Any, padding: Any, dilation: Any) -> tuple:
    grad_g = emit(P.pool_select, grad, index, kernel, stride, padding, dilation) if _differentiable(g) else None
    return grad_g, None, None, None, None, None, None, None


@vjp_rule("constant_pad")
def constant_pad_vjp(grad: Value, out: Value, x: Value, pad: Sequence[Any], value: Any
                     ) -> tuple[Grad, None, None]:
    """eager's constant_pad_nd_backward: pad the gradient by the negated pads (crop what was
    padded, zero-fill what a negative pad cut off)."""
    if not _differentiable(x):
        return None, None, None
    if all(p == 0 for p in pad):
        return grad, None, None
    return emit(P.constant_pad, grad, [-p for p in pad], 0.0), None, None
