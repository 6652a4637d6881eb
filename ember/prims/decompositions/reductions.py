"""Reductions: sum/mean/var/std/prod/amax/amin/max/min/argmax/argmin/logsumexp/cumsum/
all/any/norm.  Low-precision floats accumulate in fp32 (prims convention)."""
from __future__ import annotations

import math
from typing import Any

import torch

from ember.prims import ops
from ember.prims import primitives as P
from ember.prims.decompositions.indexing import gather
from ember.prims.registry import differentiated, register
from ember.prims.type_promotion import computation_dtype
from ember.prims.values import Value, is_tensor

T = torch.Tensor


@register(torch.sum, T.sum)
def sum_(x: Value, dim: Any = None, keepdim: bool = False, *, dtype: torch.dtype | None = None) -> Value:
    if isinstance(dim, torch.dtype):  # torch.sum(x, torch.float64)
        dim, dtype = None, dim
    return ops.sum(x, dim, keepdim, dtype)


@register(torch.nansum, T.nansum)
def nansum(x: Value, dim: Any = None, keepdim: bool = False, *, dtype: torch.dtype | None = None) -> Value:
    if x.dtype.is_floating_point:
        x = ops.where(ops.isnan(x), 0, x)
    return ops.sum(x, dim, keepdim, dtype)


@register(torch.mean, T.mean)
def mean(x: Value, dim: Any = None, keepdim: bool = False, *, dtype: torch.dtype | None = None) -> Value:
    return ops.mean(x, dim, keepdim, dtype)


@register(torch.prod, T.prod)
def prod(x: Value, dim: Any = None, keepdim: bool = False, *, dtype: torch.dtype | None = None) -> Value:
    if dtype is not None:
        x = ops.cast(x, dtype)
    elif not x.dtype.is_floating_point and not x.dtype.is_complex:
        x = ops.cast(x, torch.int64)
    return ops.reduce(P.prod, x, dim, keepdim)


def _var_args(dim: Any, unbiased: Any, correction: Any) -> tuple[Any, Any]:
    if isinstance(dim, bool):  # var(x, unbiased)
        dim, unbiased = None, dim
    if correction is None:
        correction = 1 if unbiased is None or unbiased else 0
    return dim, correction


def _var_mean(x: Value, dim: Any, unbiased: Any, keepdim: bool, correction: Any) -> tuple[Value, Value]:
    dim, correction = _var_args(dim, unbiased, correction)
    if not x.dtype.is_floating_point and not x.dtype.is_complex:
        raise RuntimeError(f"std and var only support floating point and complex dtypes, got {x.dtype}")
    if x.ndim == 0:  # one element: reduce it as a 1-D tensor (dims=() would reduce nothing: var 0, not NaN)
        ops.normalize_dims(dim, 0)  # eager's IndexError for a bad dim
        return ops.var_mean(ops.reshape(x, (1,)), 0, correction, False, whole=True)
    return ops.var_mean(x, dim, correction, keepdim, whole=dim is None)


@register(torch.var, T.var)
def var(x: Value, dim: Any = None, unbiased: Any = None, keepdim: bool = False, *,
        correction: Any = None) -> Value:
    return _var_mean(x, dim, unbiased, keepdim, correction)[0]


@register(torch.std, T.std)
def std(x: Value, dim: Any = None, unbiased: Any = None, keepdim: bool = False, *,
        correction: Any = None) -> Value:
    # eager takes the sqrt of the fp32 variance and rounds once (not the rounded bf16 variance)
    variance = var(ops.upcast(x), dim, unbiased, keepdim, correction=correction)
    return ops.cast(_zero_gradient_at_zero(variance, ops.sqrt), x.dtype)


@register(torch.var_mean)
def var_mean(x: Value, dim: Any = None, unbiased: Any = None, keepdim: bool = False, *,
             correction: Any = None) -> tuple[Value, Value]:
    return _var_mean(x, dim, unbiased, keepdim, correction)


@register(torch.std_mean)
def std_mean(x: Value, dim: Any = None, unbiased: Any = None, keepdim: bool = False, *,
             correction: Any = None) -> tuple[Value, Value]:
    variance, average = _var_mean(ops.upcast(x), dim, unbiased, keepdim, correction)
    return ops.cast(_zero_gradient_at_zero(variance, ops.sqrt), x.dtype), ops.cast(average, x.dtype)


def _zero_gradient_at_zero(value: Value, fn: Any) -> Value:
    """``fn(value)`` (where fn(0) is 0: a root, a power below 1), whose gradient is 0 where the
    value is 0, as eager's std and norm backward give: they mask the zeros that the chain rule
    through the root would make inf * 0 = NaN (a constant row, an all-zero vector: F.normalize
    of padding).  Only when differentiated: the forward is the same either way."""
    if not differentiated():
        return fn(value)
    zero = ops.eq(value, 0)
    return ops.where(zero, 0, fn(ops.where(zero, 1, value)))


@register(torch.amax, T.amax)
def amax(x: Value, dim: Any = (), keepdim: bool = False) -> Value:
    return ops.amax(x, dim, keepdim)


@register(torch.amin, T.amin)
def amin(x: Value, dim: Any = (), keepdim: bool = False) -> Value:
    return ops.amin(x, dim, keepdim)


def _arg_reduce(prim: P.Prim, x: Value, dim: Any, keepdim: bool) -> Value:
    if dim is None:
        out = ops.emit(prim, ops.reshape(x, (-1,)), 0)
        return ops.reshape(out, (1,) * x.ndim) if keepdim else out
    dim = ops.normalize_dim(dim, x.ndim)
    if x.ndim == 0:
        return ops.full((), 0, torch.int64, x.device)
    out = ops.emit(prim, x, dim)
    return ops.keep_dims(out, x, (dim,)) if keepdim else out


@register(torch.argmax, T.argmax)
def argmax(x: Value, dim: Any = None, keepdim: bool = False) -> Value:
    return _arg_reduce(P.argmax, x, dim, keepdim)


@register(torch.argmin, T.argmin)
def argmin(x: Value, dim: Any = None, keepdim: bool = False) -> Value:
    return _arg_reduce(P.argmin, x, dim, keepdim)


def _max_or_min(values_fn, arg_prim: P.Prim, binary_fn, return_type):
    def decomposition(x: Value, dim: Any = None, keepdim: bool = False) -> Any:
        if is_tensor(dim):  # max(x, other)
            return binary_fn(x, dim)
        if dim is None:
            return values_fn(x, None, False)
        if x.ndim and differentiated():
            # eager's gradient goes to the returned index only (amax's would share ties evenly):
            # the values are read at the indices, so that autodiff scatters there
            dim = ops.normalize_dim(dim, x.ndim)
            indices = _arg_reduce(arg_prim, x, dim, True)
            values = gather(x, dim, indices)
            if keepdim:
                return return_type((values, indices))
            return return_type((ops.squeeze(values, dim), ops.squeeze(indices, dim)))
        values = values_fn(x, dim, keepdim)
        indices = _arg_reduce(arg_prim, x, dim, keepdim)
        return return_type((values, indices))
    return decomposition


register(torch.max, T.max)(_max_or_min(ops.amax, P.argmax, ops.maximum, torch.return_types.max))
register(torch.min, T.min)(_max_or_min(ops.amin, P.argmin, ops.minimum, torch.return_types.min))


@register(torch.logsumexp, T.logsumexp, torch.special.logsumexp)
def logsumexp(x: Value, dim: Any, keepdim: bool = False) -> Value:
    out_dtype = x.dtype if x.dtype.is_floating_point else torch.get_default_dtype()
    # eager's logsumexp is composite: for bf16/fp16, x - max, exp, the sum, log and + max each
    # round to the dtype (its gradient, grad * exp(x - result) in eager, still rounds other steps)
    x = ops.cast(x, out_dtype if out_dtype in (torch.bfloat16, torch.float16) else computation_dtype(out_dtype))
    dims = ops.normalize_dims(dim, x.ndim)
    if not dims and x.ndim:
        return ops.cast(x, out_dtype)
    largest = ops.stop_gradient(ops.amax(x, dims, keepdim=True))
    largest = ops.where(ops.isinf(largest), 0.0, largest)  # all -inf (or an inf) stays finite
    total = ops.sum(ops.exp(x - largest), dims, keepdim=True)
    result = ops.log(total) + largest
    if not keepdim:
        result = ops.squeeze(result, dims) if x.ndim else result
    return ops.cast(result, out_dtype)


@register(torch.cumsum, T.cumsum)
def cumsum(x: Value, dim: int, *, dtype: torch.dtype | None = None) -> Value:
    if dtype is not None:
        x = ops.cast(x, dtype)
    elif not x.dtype.is_floating_point and not x.dtype.is_complex:
        x = ops.cast(x, torch.int64)
    if x.ndim == 0:
        return x
    return ops.emit(P.cumsum, x, ops.normalize_dim(dim, x.ndim))


def _bool_reduce(reduce_fn, x: Value, dim: Any, keepdim: bool) -> Value:
    as_bool = ops.ne(x, 0) if x.dtype != torch.bool else x
    out = reduce_fn(as_bool, dim, keepdim)
    return ops.cast(out, torch.uint8) if x.dtype == torch.uint8 else out


@register(torch.all, T.all)
def all_(x: Value, dim: Any = None, keepdim: bool = False) -> Value:
    return _bool_reduce(ops.amin, x, dim, keepdim)


@register(torch.any, T.any)
def any_(x: Value, dim: Any = None, keepdim: bool = False) -> Value:
    return _bool_reduce(ops.amax, x, dim, keepdim)


@register(torch.count_nonzero, T.count_nonzero)
def count_nonzero(x: Value, dim: Any = None) -> Value:
    return ops.sum(ops.cast(ops.ne(x, 0), torch.int64), dim)


@register(torch.linalg.vector_norm)
def vector_norm(x: Value, ord: Any = 2, dim: Any = None, keepdim: bool = False, *,
                dtype: torch.dtype | None = None) -> Value:
    if dtype is not None:
        x = ops.cast(x, dtype)
    out_dtype = x.dtype
    x = ops.upcast(x)
    magnitude = ops.abs(x)
    if ord == 2:
        result = _zero_gradient_at_zero(ops.sum(x * x, dim, keepdim), ops.sqrt)
    elif ord == 1:
        result = ops.sum(magnitude, dim, keepdim)
    elif ord == math.inf:
        result = ops.amax(magnitude, dim, keepdim)
    elif ord == -math.inf:
        result = ops.amin(magnitude, dim, keepdim)
    elif ord == 0:
        result = ops.sum(ops.cast(ops.ne(x, 0), x.dtype), dim, keepdim)
    elif ord > 0:
        powers = _zero_gradient_at_zero(magnitude, lambda m: ops.pow(m, ord)) if ord < 1 else ops.pow(magnitude, ord)
        result = _zero_gradient_at_zero(ops.sum(powers, dim, keepdim), lambda total: ops.pow(total, 1.0 / ord))
    else:
        result = ops.pow(ops.sum(ops.pow(magnitude, ord), dim, keepdim), 1.0 / ord)
    return ops.cast(result, out_dtype)


@register(torch.norm, T.norm)
def norm(x: Value, p: Any = "fro", dim: Any = None, keepdim: bool = False, dtype: torch.dtype | None = None) -> Value:
    if p == "fro" and (dim is None or isinstance(dim, int) or len(dim) <= 2):
        p = 2
    if isinstance(p, str):
        return ops.extern(torch.norm, x, p, dim, keepdim, dtype=dtype)
    return vector_norm(x, p, dim, keepdim, dtype=dtype)
