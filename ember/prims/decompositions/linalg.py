"""Matmul family: Externs (cuBLAS / oneDNN), with bias adds left as prims so that the
scheduler can fuse them (and what follows) into an epilogue.  Convolution, attention and
pooling need no entry here: ops without a decomposition become Externs automatically.

In bf16/fp16 the bias goes into the Extern (addmm, baddbmm, linear): the library adds it to
the fp32 accumulator and rounds once, where a separate add would round the product first
(up to one low-precision ulp off eager, and further from the exact result)."""
from __future__ import annotations

import operator
from typing import Any

import torch

from ember.prims import ops
from ember.prims.registry import register
from ember.prims.values import Value

F = torch.nn.functional
T = torch.Tensor


_LOW_PRECISION = (torch.bfloat16, torch.float16)


def _scaled(value: Value, factor: Any) -> Value:
    return value if factor == 1 else value * factor


def _factor(factor: Any, dtype: torch.dtype) -> Any:
    """beta or alpha as eager reads it for ``dtype``: truncated to an integer for integer tensors
    (baddbmm of int64 with beta=0.2 is 0 * bias, and the result stays int64)."""
    if isinstance(factor, float) and not (dtype.is_floating_point or dtype.is_complex):
        return int(factor)
    return factor


@register(F.linear)
def linear(x: Value, weight: Value, bias: Value | None = None) -> Value:
    if bias is not None and x.dtype in _LOW_PRECISION:
        return ops.extern(F.linear, x, weight, bias)
    weight_t = ops.transpose(weight, 0, 1) if weight.ndim == 2 else weight
    if x.ndim == 2 and weight.ndim == 2:
        out = ops.extern(torch.mm, x, weight_t)
    elif x.ndim > 2 and weight.ndim == 2:
        # fold the batch dims so the Extern is one mm; the reshapes are free views
        flat = ops.reshape(x, (-1, x.shape[-1]))
        out = ops.reshape(ops.extern(torch.mm, flat, weight_t), tuple(x.shape[:-1]) + (weight.shape[0],))
    else:
        out = ops.extern(torch.matmul, x, weight_t)
    return out + bias if bias is not None else out


@register(torch.addmm, T.addmm)
def addmm(bias: Value, mat1: Value, mat2: Value, *, beta: Any = 1, alpha: Any = 1) -> Value:
    beta, alpha = _factor(beta, mat1.dtype), _factor(alpha, mat1.dtype)
    if beta != 0 and mat1.dtype in _LOW_PRECISION:
        return ops.extern(torch.addmm, bias, mat1, mat2, beta=beta, alpha=alpha)
    product = _scaled(ops.extern(torch.mm, mat1, mat2), alpha)
    return product if beta == 0 else product + _scaled(bias, beta)


@register(torch.baddbmm, T.baddbmm)
def baddbmm(bias: Value, batch1: Value, batch2: Value, *, beta: Any = 1, alpha: Any = 1) -> Value:
    beta, alpha = _factor(beta, batch1.dtype), _factor(alpha, batch1.dtype)
    if beta != 0 and batch1.dtype in _LOW_PRECISION:
        return ops.extern(torch.baddbmm, bias, batch1, batch2, beta=beta, alpha=alpha)
    product = _scaled(ops.extern(torch.bmm, batch1, batch2), alpha)
    return product if beta == 0 else product + _scaled(bias, beta)


@register(torch.addbmm, T.addbmm)
def addbmm(bias: Value, batch1: Value, batch2: Value, *, beta: Any = 1, alpha: Any = 1) -> Value:
    # eager accumulates all batches in one pass; bmm then a sum rounds each product first
    return ops.extern(torch.addbmm, bias, batch1, batch2, beta=beta, alpha=alpha)


@register(torch.mm, T.mm)
def mm(a: Value, b: Value) -> Value:
    return ops.extern(torch.mm, a, b)


@register(torch.bmm, T.bmm)
def bmm(a: Value, b: Value) -> Value:
    return ops.extern(torch.bmm, a, b)


@register(torch.matmul, T.matmul, operator.matmul, T.__matmul__)
def matmul(a: Value, b: Value) -> Value:
    if a.ndim == 2 and b.ndim == 2:
        return ops.extern(torch.mm, a, b)
    if a.ndim == 3 and b.ndim == 3 and a.shape[0] == b.shape[0]:
        return ops.extern(torch.bmm, a, b)
    return ops.extern(torch.matmul, a, b)  # broadcasts batch dims (bmm does not), 1-D operands
