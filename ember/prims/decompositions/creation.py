"""Tensor creation: full/zeros/ones/empty(+_like, new_*), arange, eye, tril/triu."""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from ember.graph import contiguous_strides, memory_format_strides, preserved_strides
from ember.prims import ops
from ember.symbolic import is_symbolic
from ember.prims.registry import register
from ember.prims.type_promotion import default_dtype_for_category, scalar_category
from ember.prims.values import Value, is_tensor

T = torch.Tensor


def _shape(size: Sequence[Any]) -> tuple:
    if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        return tuple(size[0])
    return tuple(size)


def _device(device: Any) -> torch.device:
    return torch.device(device) if device is not None else torch.device("cpu")


def _filled(value: Any):
    def create(*size: Any, dtype: torch.dtype | None = None, device: Any = None, layout: Any = None,
               pin_memory: bool = False, requires_grad: bool = False, memory_format: Any = None,
               out: Any = None, names: Any = None) -> Value:
        return ops.full(_shape(size), value, dtype or torch.get_default_dtype(), _device(device))
    return create


register(torch.zeros)(_filled(0))
register(torch.ones)(_filled(1))
register(torch.empty)(_filled(0))  # contents are unspecified; zeros are a valid choice


@register(torch.full)
def full(size: Sequence[Any], fill_value: Any, *, dtype: torch.dtype | None = None, device: Any = None,
         layout: Any = None, pin_memory: bool = False, requires_grad: bool = False) -> Value:
    if dtype is None:
        dtype = default_dtype_for_category(scalar_category(fill_value))
    return ops.full(tuple(size), fill_value, dtype, _device(device))


def _like(value: Any):
    def create(x: Value, *args: Any, dtype: torch.dtype | None = None, device: Any = None, layout: Any = None,
               pin_memory: bool = False, requires_grad: bool = False, memory_format: Any = None) -> Value:
        fill = args[0] if value is None else value
        return ops.full(x.shape, fill, dtype or x.dtype, device or x.device, _like_strides(x, memory_format))
    return create


def _like_strides(x: Value, memory_format: Any) -> tuple[int, ...] | None:
    """The strides eager gives a *_like result when they are not contiguous: empty_like's for
    preserve_format, the default (x's own where x is dense, else dense in x's order of dims),
    channels-last when asked; None for contiguous."""
    shape, stride = tuple(x.shape), tuple(x.meta.stride)
    if not all(isinstance(v, int) for v in (*shape, *stride)):
        return None
    if memory_format in (torch.channels_last, torch.channels_last_3d):
        return memory_format_strides(shape, memory_format)
    if memory_format in (None, torch.preserve_format):
        kept = preserved_strides(shape, stride)     # eager's empty_like (a transposed slice stays transposed)
        if kept is not None and any(size != 1 and st != want
                                    for size, st, want in zip(shape, kept, contiguous_strides(shape))):
            return kept
    return None


register(torch.zeros_like)(_like(0))
register(torch.ones_like)(_like(1))
register(torch.empty_like)(_like(0))
register(torch.full_like)(_like(None))


def _new(value: Any):
    def create(x: Value, *size: Any, dtype: torch.dtype | None = None, device: Any = None, layout: Any = None,
               pin_memory: bool = False, requires_grad: bool = False) -> Value:
        return ops.full(_shape(size), value, dtype or x.dtype, device or x.device)
    return create


register(T.new_zeros)(_new(0))
register(T.new_ones)(_new(1))
register(T.new_empty)(_new(0))


@register(T.new_full)
def new_full(x: Value, size: Sequence[Any], fill_value: Any, *, dtype: torch.dtype | None = None,
             device: Any = None, layout: Any = None, pin_memory: bool = False, requires_grad: bool = False) -> Value:
    return ops.full(tuple(size), fill_value, dtype or x.dtype, device or x.device)


@register(torch.scalar_tensor)
def scalar_tensor(value: Any, *, dtype: torch.dtype | None = None, device: Any = None, layout: Any = None,
                  pin_memory: bool = False, requires_grad: bool = False) -> Value:
    return ops.full((), value, dtype or torch.get_default_dtype(), _device(device))


@register(torch.arange)
def arange(start: Any, end: Any = None, step: Any = 1, *, dtype: torch.dtype | None = None, device: Any = None,
           layout: Any = None, pin_memory: bool = False, requires_grad: bool = False, out: Any = None) -> Value:
    if end is None:
        start, end = 0, start
    if dtype is None:
        floating = any(isinstance(v, float) for v in (start, end, step))
        dtype = torch.get_default_dtype() if floating else torch.int64
    if all(isinstance(v, int) or is_symbolic(v) for v in (start, end, step)):    # a size: arange(T)
        length = max(0, -(-(end - start) // step))
    elif dtype == torch.int64:      # eager counts int64 values between the truncated bounds
        if int(step) == 0:
            raise ValueError("step must be nonzero")
        length = max(0, math.ceil((int(end) - int(start)) / int(step)))
    else:
        length = max(0, math.ceil((end - start) / step))
    if not (dtype.is_floating_point or dtype.is_complex):
        # and computes integer values from the truncated start and step: arange(-0.9, 2.1, 2.0,
        # dtype=int32) is [0, 2], and arange(3.1, dtype=int64) has 3 values, int32 4
        start, step = (int(v) if isinstance(v, float) else v for v in (start, step))
    if dtype.is_floating_point or isinstance(start, float) or isinstance(step, float):
        # eager computes start + i * step in double precision, then rounds once
        positions = ops.iota(length, 0, 1, torch.int64, _device(device))
        values = ops.cast(positions, torch.float64) * float(step) + float(start)
        return ops.cast(values, dtype)
    return ops.iota(length, start, step, dtype, _device(device))


@register(torch.eye)
def eye(n: int, m: int | None = None, *, dtype: torch.dtype | None = None, device: Any = None,
        layout: Any = None, pin_memory: bool = False, requires_grad: bool = False) -> Value:
    m = n if m is None else m
    rows = ops.reshape(ops.iota(n, 0, 1, torch.int64, _device(device)), (n, 1))
    cols = ops.reshape(ops.iota(m, 0, 1, torch.int64, _device(device)), (1, m))
    return ops.cast(ops.eq(rows, cols), dtype or torch.get_default_dtype())


def _triangle_mask(x: Value, diagonal: int, lower: bool) -> Value:
    rows, cols = x.shape[-2], x.shape[-1]
    row = ops.reshape(ops.iota(rows, 0, 1, torch.int64, x.device), (rows, 1))
    col = ops.reshape(ops.iota(cols, 0, 1, torch.int64, x.device), (1, cols))
    offset = col - row
    return ops.le(offset, diagonal) if lower else ops.ge(offset, diagonal)


@register(torch.tril, T.tril)
def tril(x: Value, diagonal: int = 0) -> Value:
    return ops.where(_triangle_mask(x, diagonal, True), x, ops._python_scalar(0, x.dtype))


@register(torch.triu, T.triu)
def triu(x: Value, diagonal: int = 0) -> Value:
    return ops.where(_triangle_mask(x, diagonal, False), x, ops._python_scalar(0, x.dtype))


_ = is_tensor
