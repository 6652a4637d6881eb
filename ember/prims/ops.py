"""Emitter helpers that decompositions are written with: `ops.add(a, b)` inserts the
broadcasts and casts PyTorch's type promotion implies, then the prim node.

Operands are `Value`s or Python numbers.  Helpers never mutate; they return Values.
"""
from __future__ import annotations

import builtins
import dataclasses
import math
import operator
from collections.abc import Sequence
from typing import Any

import torch

from ember.graph import Size
from ember.prims import primitives as P
from ember.prims.meta import broadcast_shapes, view_strides  # noqa: F401  (re-exported)
from ember.prims.type_promotion import LOW_PRECISION, Promotion, computation_dtype, elementwise_dtypes
from ember.symbolic import SymInt, is_symbolic, known_equal
from ember.prims.values import Value, current, emit, emit_with_meta, is_tensor

Number = (bool, int, float, complex)


# ---------------------------------------------------------------- conversions
def cast(x: Any, dtype: torch.dtype) -> Any:
    if not is_tensor(x):
        return _python_scalar(x, dtype)
    if x.dtype == dtype:
        return x
    return emit(P.convert_element_type, x, dtype)


def _python_scalar(value: Any, dtype: torch.dtype) -> Any:
    if isinstance(value, Value):  # a runtime scalar: the generated code converts it
        return value
    if is_symbolic(value) and dtype != torch.bool and not dtype.is_complex:
        return value              # a size used as a number: the kernel reads it at run time
    if dtype == torch.bool:
        return bool(value)
    if dtype.is_complex:
        return complex(value)
    if dtype.is_floating_point:
        return float(value)
    return int(value)


def rounded_to(number: Any, dtype: torch.dtype) -> Any:
    """A Python int or float as a tensor of ``dtype`` holds it (bf16's 0.1 is 0.10009765625); other
    values, and numbers for other dtypes, as they are."""
    if dtype in (torch.bfloat16, torch.float16) and type(number) in (int, float):
        return torch.tensor(number, dtype=dtype).item()
    return number


def upcast(x: Value) -> Value:
    """fp16/bf16 -> fp32 for composite math; cast back with `cast(result, x.dtype)`."""
    return cast(x, computation_dtype(x.dtype))


def normalize_dim(dim: int, ndim: int) -> int:
    rank = builtins.max(ndim, 1)  # a 0-dim tensor accepts dim 0 and -1
    if not -rank <= dim < rank:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-rank}, {rank - 1}], "
                         f"but got {dim})")
    return dim % rank if ndim else 0


def normalize_dims(dims: Any, ndim: int) -> tuple[int, ...]:
    """None, (), [] mean all dims (as torch's reductions read them)."""
    if dims is None or (isinstance(dims, (tuple, list)) and len(dims) == 0):
        return tuple(range(ndim))
    if isinstance(dims, int):
        dims = (dims,)
    if ndim == 0:
        return ()
    return tuple(sorted({normalize_dim(d, ndim) for d in dims}))


# ------------------------------------------------------------------ broadcasting
def expand_to(x: Any, shape: Sequence[Size]) -> Any:
    if not is_tensor(x):
        return x
    shape = tuple(shape)
    # lengths first: tuple == compares items before lengths, and a size symbol against another
    # rank's size would be a needless guard
    if x.ndim == len(shape) and tuple(x.shape) == shape:
        return x
    if x.ndim < len(shape):
        x = reshape(x, (1,) * (len(shape) - x.ndim) + tuple(x.shape))
    if tuple(x.shape) == shape:
        return x
    return emit(P.expand, x, shape)


def broadcast(*values: Any) -> list[Any]:
    shape = broadcast_shapes(*(v.shape for v in values if is_tensor(v)))
    return [expand_to(v, shape) for v in values]


# ------------------------------------------------------------------ elementwise
def _operand_tier(value: Any) -> tuple[str, Any]:
    if is_tensor(value):
        return ("tensor" if value.ndim else "zerodim", value.dtype)
    if isinstance(value, Value):
        return ("scalar", value.pytype or float)
    return ("scalar", value)


def elementwise(prim: P.Prim, *operands: Any, promotion: Promotion = Promotion.DEFAULT) -> Any:
    """Type-promote, broadcast and emit one elementwise prim."""
    if not any(is_tensor(v) for v in operands):
        return _scalar_math(prim, operands)
    compute, result = elementwise_dtypes([_operand_tier(v) for v in operands], promotion)
    if compute in LOW_PRECISION and len(operands) == 2:
        compute, operands = _cpu_scalar_precision(prim, compute, operands)
    # cast, then broadcast: the gradient of a broadcast operand is then summed in the compute
    # dtype and cast after, as eager's autograd does (sum_to_size, then the input's dtype)
    out = emit(prim, *broadcast(*(cast(v, compute) for v in operands)))
    return cast(out, result)


# How eager's CPU kernels read a scalar operand (a Python number or a 0-d tensor of another dtype)
# of an fp16/bf16 binary op (measured on torch 2.13): mul/div/floor_divide read it at fp32 op-math
# precision; add/sub (and the rest) round it to the fp16/bf16 dtype first.  CUDA kernels were not
# measured: the same rule is applied only to CPU tensors.
_OPMATH_SCALAR_PRIMS = frozenset({"mul", "div", "floor_divide"})


def _cpu_scalar_precision(prim: P.Prim, compute: torch.dtype, operands: tuple) -> tuple[torch.dtype, tuple]:
    tensors = [v for v in operands if is_tensor(v)]
    if not tensors or tensors[0].device.type != "cpu" or not builtins.any(v.ndim for v in tensors):
        return compute, operands
    is_scalar = [not is_tensor(v) or (v.ndim == 0 and v.dtype != compute) for v in operands]
    if not builtins.any(is_scalar) or builtins.all(is_scalar):
        return compute, operands
    # (a 0-d tensor only as the second operand: eager's kernels check that position; a Python
    # number always ends up there, `2.0 * x` being x.__rmul__)
    if prim.name in _OPMATH_SCALAR_PRIMS and (is_scalar[1] or not is_tensor(operands[0])):
        return torch.float32, operands        # a scalar at fp32; the result is rounded once
    rounded = tuple(float(torch.tensor(v, dtype=compute)) if scalar and isinstance(v, (int, float))
                    and not isinstance(v, bool) else v for v, scalar in zip(operands, is_scalar))
    return compute, rounded


def _scalar_math(prim: P.Prim, operands: Sequence[Any]) -> Any:
    """Python numbers only: fold now, or emit the prim on runtime scalars."""
    if any(isinstance(v, Value) for v in operands):
        return emit_with_meta(prim, None, tuple(operands), {}, pytype=float)
    return prim.reference(*(torch.tensor(v) for v in operands)).item()


def _unary(name: str, promotion: Promotion = Promotion.DEFAULT):
    prim = P.get(name)

    def helper(x: Any) -> Any:
        return elementwise(prim, x, promotion=promotion)
    helper.__name__ = name
    return helper


def _binary(name: str, promotion: Promotion = Promotion.DEFAULT):
    prim = P.get(name)

    def helper(a: Any, b: Any) -> Any:
        return elementwise(prim, a, b, promotion=promotion)
    helper.__name__ = name
    return helper


_FLOAT = Promotion.INT_TO_FLOAT
_BOOL = Promotion.ALWAYS_BOOL

neg = _unary("neg")
abs = _unary("abs", Promotion.COMPLEX_TO_FLOAT)
exp, exp2, expm1 = _unary("exp", _FLOAT), _unary("exp2", _FLOAT), _unary("expm1", _FLOAT)
log, log1p, log2, log10 = (_unary(n, _FLOAT) for n in ("log", "log1p", "log2", "log10"))
sqrt, rsqrt, reciprocal = _unary("sqrt", _FLOAT), _unary("rsqrt", _FLOAT), _unary("reciprocal", _FLOAT)
sin, cos, tan, asin, acos, atan = (_unary(n, _FLOAT) for n in ("sin", "cos", "tan", "asin", "acos", "atan"))
sinh, cosh, tanh, asinh, acosh, atanh = (_unary(n, _FLOAT) for n in
                                         ("sinh", "cosh", "tanh", "asinh", "acosh", "atanh"))
erf, erfc, erfinv, lgamma = (_unary(n, _FLOAT) for n in ("erf", "erfc", "erfinv", "lgamma"))
sigmoid = _unary("sigmoid", _FLOAT)
floor, ceil, round, trunc, sign = (_unary(n) for n in ("floor", "ceil", "round", "trunc", "sign"))
signbit, isnan, isinf, isfinite, logical_not = (_unary(n, _BOOL) for n in
                                                ("signbit", "isnan", "isinf", "isfinite", "logical_not"))
bitwise_not = _unary("bitwise_not")

add, sub, mul = _binary("add"), _binary("sub"), _binary("mul")
div = _binary("div", _FLOAT)
floor_divide, remainder, fmod, pow = (_binary(n) for n in ("floor_divide", "remainder", "fmod", "pow"))
maximum, minimum = _binary("maximum"), _binary("minimum")
atan2, hypot, copysign = _binary("atan2", _FLOAT), _binary("hypot", _FLOAT), _binary("copysign", _FLOAT)
eq, ne, lt, le, gt, ge = (_binary(n, _BOOL) for n in ("eq", "ne", "lt", "le", "gt", "ge"))
logical_and, logical_or, logical_xor = (_binary(n, _BOOL) for n in ("logical_and", "logical_or", "logical_xor"))
bitwise_and, bitwise_or, bitwise_xor = (_binary(n) for n in ("bitwise_and", "bitwise_or", "bitwise_xor"))
bitwise_left_shift, bitwise_right_shift = _binary("bitwise_left_shift"), _binary("bitwise_right_shift")


def where(cond: Any, a: Any, b: Any) -> Any:
    """where(cond, a, b) with promotion of a and b; cond is cast to bool."""
    if not is_tensor(cond):
        return a if cond else b
    dtype = elementwise_dtypes([_operand_tier(a), _operand_tier(b)], Promotion.DEFAULT)[0]
    cond = cast(cond, torch.bool)
    if not is_tensor(a) and not is_tensor(b):
        a = full((), a, dtype, cond.device)
    return emit(P.where, *broadcast(cond, cast(a, dtype), cast(b, dtype)))


def stop_gradient(x: Value) -> Value:
    """x itself, through which autodiff sends no gradient (a stabilizing shift such as softmax's
    max: the result does not depend on it, and its gradient would compare values for ties)."""
    return emit(P.detach, x)


def relaid(x: Value, stride: Sequence[Size] | None) -> Value:
    """``x``, a value this decomposition just emitted, with the strides eager gives its buffer
    (the prim computes in any layout; lowering allocates with these).  None keeps x's own."""
    if stride is not None:
        x.meta = x.node.meta = dataclasses.replace(x.meta, stride=tuple(stride))
    return x


def clone(x: Value) -> Value:
    return emit(P.clone, x)


# ----------------------------------------------------------------------- views
def infer_size(shape: Sequence[Any], numel: Size) -> tuple[Size, ...]:
    shape = list(shape)
    if -1 in [s for s in shape if isinstance(s, int)]:
        known = 1
        for s in shape:
            if not (isinstance(s, int) and s == -1):
                known = known * s
        shape[next(i for i, s in enumerate(shape) if isinstance(s, int) and s == -1)] = numel // known
    return tuple(shape)


def reshape(x: Value, shape: Sequence[Any]) -> Value:
    shape = infer_size(shape, x.numel())
    if tuple(x.shape) == shape:
        return x
    return emit(P.reshape, x, shape)


def permute(x: Value, dims: Sequence[int]) -> Value:
    dims = tuple(normalize_dim(d, x.ndim) for d in dims)
    if dims == tuple(range(x.ndim)):
        return x
    return emit(P.permute, x, dims)


def transpose(x: Value, dim0: int, dim1: int) -> Value:
    if x.ndim < 2 and x.ndim == 0:
        return x
    order = list(range(x.ndim))
    d0, d1 = normalize_dim(dim0, x.ndim), normalize_dim(dim1, x.ndim)
    order[d0], order[d1] = order[d1], order[d0]
    return permute(x, order)


def expand(x: Value, shape: Sequence[Any]) -> Value:
    shape = list(shape)
    offset = len(shape) - x.ndim
    for i, size in enumerate(shape):  # -1 keeps the existing size
        if isinstance(size, int) and size == -1:
            shape[i] = x.shape[i - offset]
    return expand_to(x, shape)


def slice_dim(x: Value, dim: int, start: Any = None, end: Any = None, step: int = 1) -> Value:
    """x[..., start:end:step, ...] along dim, with Python's clamping of start and end."""
    dim = normalize_dim(dim, x.ndim)
    size = x.shape[dim]
    start = 0 if start is None else start
    end = size if end is None else end
    start, end = _clamp_index(start, size), _clamp_index(end, size)
    if _is_size(start) and _is_size(end) and end < start:
        end = start
    # a whole-dim slice is x itself; with symbolic bounds only when always so (no guard)
    if known_equal(start, 0) and known_equal(end, size) and step == 1:
        return x
    return emit(P.slice_, x, dim, start, end, step)


def _is_size(value: Any) -> bool:
    """An int or a symbolic size (whose comparisons are guarded decisions)."""
    return isinstance(value, (int, SymInt)) and not isinstance(value, bool)


def _clamp_index(index: Any, size: Size) -> Any:
    """Python's clamping of a slice bound into [0, size] (with symbolic sizes: guarded)."""
    if _is_size(index) and index < 0:
        index = index + size
        return builtins.max(index, 0) if _is_size(index) else index
    if _is_size(index) and _is_size(size):
        return builtins.min(index, size)
    return index


def select(x: Value, dim: int, index: int) -> Value:
    dim = normalize_dim(dim, x.ndim)
    size = x.shape[dim]
    if isinstance(index, int) and isinstance(size, int) and not -size <= index < size:
        raise IndexError(f"index {index} is out of bounds for dimension {dim} with size {size}")
    if isinstance(index, int) and index < 0:
        index = index + size
    sliced = emit(P.slice_, x, dim, index, index + 1, 1) if x.shape[dim] != 1 else x
    return reshape(sliced, tuple(s for i, s in enumerate(x.shape) if i != dim))


def unsqueeze(x: Value, dim: int) -> Value:
    dim = normalize_dim(dim, x.ndim + 1)
    shape = list(x.shape)
    shape.insert(dim, 1)
    return reshape(x, shape)


def squeeze(x: Value, dims: Any = None) -> Value:
    if isinstance(dims, (tuple, list)) and len(dims) == 0:
        return x  # squeeze(x, ()) squeezes nothing (unlike a reduction's empty dims)
    dims = normalize_dims(dims, x.ndim)
    shape = [s for i, s in enumerate(x.shape) if not (i in dims and s == 1)]
    return reshape(x, shape)


# ------------------------------------------------------------------ reductions
def reduce(prim: P.Prim, x: Value, dims: Any, keepdim: bool = False) -> Value:
    dims = normalize_dims(dims, x.ndim)
    out = emit(prim, x, dims)
    return keep_dims(out, x, dims) if keepdim else out


def keep_dims(out: Value, x: Value, dims: Sequence[int]) -> Value:
    shape = [1 if i in dims else s for i, s in enumerate(x.shape)]
    return reshape(out, shape)


def sum(x: Value, dims: Any = None, keepdim: bool = False, dtype: torch.dtype | None = None) -> Value:
    if dtype is not None:
        x = cast(x, dtype)
    elif not x.dtype.is_floating_point and not x.dtype.is_complex:
        x = cast(x, torch.int64)  # eager sums bool and ints in int64
    return reduce(P.sum_, x, dims, keepdim)


def amax(x: Value, dims: Any = None, keepdim: bool = False) -> Value:
    return reduce(P.amax, x, dims, keepdim)


def amin(x: Value, dims: Any = None, keepdim: bool = False) -> Value:
    return reduce(P.amin, x, dims, keepdim)


def reduced_numel(x: Value, dims: Sequence[int]) -> Size:
    n: Size = 1
    for d in dims:
        n = n * x.shape[d]
    return n


def mean(x: Value, dims: Any = None, keepdim: bool = False, dtype: torch.dtype | None = None) -> Value:
    out_dtype = dtype or x.dtype
    x = cast(x, computation_dtype(out_dtype))
    dims = normalize_dims(dims, x.ndim)
    total = reduce(P.sum_, x, dims, keepdim)
    return cast(div(total, reduced_numel(x, dims)), out_dtype)


def var_mean(x: Value, dims: Any = None, correction: Any = 1, keepdim: bool = False,
             whole: bool = False) -> tuple[Value, Value]:
    dims = normalize_dims(dims, x.ndim)
    var, avg = emit(P.var_mean, x, dims, correction, whole) if whole else emit(P.var_mean, x, dims, correction)
    if keepdim:
        var, avg = keep_dims(var, x, dims), keep_dims(avg, x, dims)
    return var, avg


# -------------------------------------------------------------------- creation
def full(shape: Sequence[Size], value: Any, dtype: torch.dtype, device: Any,
         stride: Sequence[Size] | None = None) -> Value:
    """``stride``: a dense layout for the result (None: contiguous)."""
    args = (tuple(shape), _python_scalar(value, dtype), dtype, torch.device(device))
    return emit(P.full, *args) if stride is None else emit(P.full, *args, tuple(stride))


def full_like(x: Value, value: Any, dtype: torch.dtype | None = None) -> Value:
    return full(x.shape, value, dtype or x.dtype, x.device)


def iota(length: Size, start: Any = 0, step: Any = 1, dtype: torch.dtype = torch.int64,
         device: Any = "cpu") -> Value:
    return emit(P.iota, length, start, step, dtype, torch.device(device))


def scalar_tensor(value: Any, like: Value) -> Value:
    return full((), value, like.dtype, like.device)


# ----------------------------------------------------------------- side effects
def mutate(target: Value, new_value: Value, base: Value | None = None) -> None:
    """Record that `target` now holds `new_value` (an in-place op on an argument).

    `target` is an argument of the decomposition, or (with `base`) a view of the argument
    `base` that the decomposition made with view ops (setitem writes through x[idx])."""
    hook = current().mutate_hook
    assert hook is not None, "in-place update outside functionalization"
    hook(target, new_value, base)


def extern(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """A torch callable the wrapper runs eagerly (meta from the meta device)."""
    return emit(fn, *args, **kwargs)


def is_number(value: Any) -> bool:
    return isinstance(value, Number) or (isinstance(value, Value) and not value.is_tensor)


def prod_sizes(sizes: Sequence[Size]) -> Size:
    return math.prod(sizes) if all(isinstance(s, int) for s in sizes) else _symbolic_prod(sizes)


def _symbolic_prod(sizes: Sequence[Size]) -> Size:
    out: Size = 1
    for s in sizes:
        out = out * s
    return out


_ = operator  # kept for decompositions that import it from here
