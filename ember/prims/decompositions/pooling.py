"""Pooling: global average pooling as a mean; 2-D max pooling as a max over the window's taps.
Other pooling runs eager's kernels (Externs, whose backward rules are in autodiff/extern_rules.py)."""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch
import torch.nn.functional as F

from ember.prims import ops
from ember.prims import primitives as P
from ember.prims.registry import differentiated, register
from ember.prims.values import is_tensor


@register(F.adaptive_avg_pool2d, torch._C._nn.adaptive_avg_pool2d)
def adaptive_avg_pool2d(x: Any, output_size: Any) -> Any:
    """Global average pooling (output 1 x 1, the head of every ResNet) is a mean over H and W: it
    fuses with what produced x, and its backward is a broadcast (eager's CUDA backward kernel
    took 0.75 ms of ResNet-50's step).  Other output sizes run eager's kernel."""
    sizes = tuple(output_size) if isinstance(output_size, (tuple, list)) else (output_size, output_size)
    if all(size == 1 for size in sizes):
        return ops.cast(ops.mean(x, (-2, -1), True), x.dtype)
    return ops.extern(F.adaptive_avg_pool2d, x, output_size)


@register(F.max_pool2d, torch.max_pool2d)
def max_pool2d(x: Any, kernel_size: Any, stride: Any = None, padding: Any = 0, dilation: Any = 1,
               ceil_mode: bool = False, return_indices: bool = False) -> Any:
    """Floating max pooling with static sizes is a max over the window's taps, in prims: it fuses
    with what produced x, and its backward is generated too (eager's CUDA kernels took 0.67 ms of
    ResNet-50's training step, the backward 0.46 ms of it).  Other pooling runs eager's kernel; in
    a step that will be differentiated, the one that returns its indices (the backward reads them,
    and recomputing them cost a second pass over the input)."""
    window = _window(x, kernel_size, stride, padding, dilation, ceil_mode)
    if window is not None:
        return _max_pool2d_taps(x, window, return_indices)
    if return_indices or not differentiated():
        return ops.extern(F.max_pool2d, x, kernel_size, stride, padding, dilation, ceil_mode=ceil_mode,
                          return_indices=return_indices)
    values, _ = ops.extern(F.max_pool2d_with_indices, x, kernel_size, stride, padding, dilation,
                           ceil_mode=ceil_mode, return_indices=True)
    return values


# windows of more taps than this run eager's kernel (each tap is a load of the generated kernel)
MAX_POOL_TAPS = 64


@dataclasses.dataclass(frozen=True)
class _Window:
    """A 2-D pooling window over (.., height, width), per dim (height first)."""
    kernel: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]
    output: tuple[int, int]

    def taps(self) -> list[tuple[int, int]]:
        return [(i, j) for i in range(self.kernel[0]) for j in range(self.kernel[1])]


def _pair(value: Any) -> tuple[Any, Any] | None:
    if isinstance(value, int):
        return value, value
    if isinstance(value, (tuple, list)) and len(value) in (1, 2) and all(isinstance(v, int) for v in value):
        return (value[0], value[-1])
    return None


def _window(x: Any, kernel_size: Any, stride: Any, padding: Any, dilation: Any, ceil_mode: Any) -> _Window | None:
    """The window when the taps form can compute this pooling exactly as eager does: a floating
    3-D or 4-D input of static height and width, arguments eager accepts; else None (eager's kernel
    runs, and raises eager's error for bad arguments)."""
    if not is_tensor(x) or x.ndim not in (3, 4) or not x.dtype.is_floating_point or not isinstance(ceil_mode, bool):
        return None
    height, width = x.shape[-2], x.shape[-1]
    kernel = _pair(kernel_size)
    stride = kernel if stride is None or (isinstance(stride, (tuple, list)) and not stride) else _pair(stride)
    padding, dilation = _pair(padding), _pair(dilation)
    if not (isinstance(height, int) and isinstance(width, int)) or None in (kernel, stride, padding, dilation):
        return None
    if min(*kernel, *stride, *dilation) <= 0 or min(padding) < 0 or kernel[0] * kernel[1] > MAX_POOL_TAPS or \
            any(p > k // 2 for p, k in zip(padding, kernel)):
        return None
    output = tuple(_pooled_size(n, k, s, p, d, ceil_mode)
                   for n, k, s, p, d in zip((height, width), kernel, stride, padding, dilation))
    if min(output) < 1:
        return None
    return _Window(kernel, stride, padding, dilation, output)


def _pooled_size(size: int, kernel: int, stride: int, padding: int, dilation: int, ceil_mode: bool) -> int:
    """eager's pooling output size; in ceil mode the last window must start inside the input or
    its left padding."""
    span = size + 2 * padding - dilation * (kernel - 1) - 1 + (stride - 1 if ceil_mode else 0)
    out = span // stride + 1
    if ceil_mode and (out - 1) * stride >= size + padding:
        out -= 1
    return out


def _max_pool2d_taps(x: Any, window: _Window, return_indices: bool) -> Any:
    """Eager's scan over the window, tap by tap in row-major order: a tap is taken when it is
    greater than the best so far or NaN, and the first tap inside the input is always taken (its
    position is the index of a window of -inf).  The index is the position in x's plane.

    Differentiated, the values are the sum of the taps the index selects (one per window), so that
    each window's gradient goes to the one tap it took; the taps are read in fp32 and their
    gradients added in fp32, rounded once, as eager's backward accumulates."""
    height, width = x.shape[-2], x.shape[-1]
    plane = height * width
    index_dtype = torch.int16 if plane <= torch.iinfo(torch.int16).max else \
        torch.int32 if plane <= torch.iinfo(torch.int32).max else torch.int64
    padded = _pad_for_taps(ops.upcast(x), window)
    best = index = None
    taps = []
    for i, j in window.taps():
        value = _tap_values(padded, window, i, j)
        rows, cols = _tap_positions(x, window, i, j)
        inside = ops.logical_and(ops.logical_and(ops.ge(rows, 0), ops.lt(rows, height)),
                                 ops.logical_and(ops.ge(cols, 0), ops.lt(cols, width)))
        position = ops.cast(rows * width + cols, index_dtype)
        if best is None:
            best, index = ops.where(inside, value, -math.inf), ops.where(inside, position, -1)
        else:
            greater = ops.logical_or(ops.logical_or(ops.gt(value, best), ops.isnan(value)), ops.eq(index, -1))
            taken = ops.logical_and(inside, greater)
            best, index = ops.where(taken, value, best), ops.where(taken, position, index)
        taps.append((value, position, inside))
    if differentiated():
        # exactly one tap is selected: adding -0.0 for the others keeps its value, -0.0 included
        best = None
        for value, position, inside in taps:     # (a tap outside x may share a position)
            term = ops.where(ops.logical_and(inside, ops.eq(index, position)), value, -0.0)
            best = term if best is None else best + term
    best = ops.cast(best, x.dtype)
    return (best, ops.cast(index, torch.int64)) if return_indices else best


def _pad_for_taps(x: Any, window: _Window) -> Any:
    """x padded with -inf so that every tap's strided slice lies inside it (ceil mode's last
    window may reach past the padding; rows no window reaches are cropped)."""
    pads = []
    for dim in (-1, -2):
        k, s, p, d, out = (getattr(window, f)[dim] for f in ("kernel", "stride", "padding", "dilation", "output"))
        reach = (out - 1) * s + (k - 1) * d + 1
        pads += [p, reach - x.shape[dim] - p]
    return ops.emit(P.constant_pad, x, tuple(pads), -math.inf)


def _tap_values(padded: Any, window: _Window, i: int, j: int) -> Any:
    """The input under tap (i, j) of every window: a strided slice of the padded input."""
    for dim, tap in ((-2, i), (-1, j)):
        start = tap * window.dilation[dim]
        padded = ops.slice_dim(padded, dim, start, start + (window.output[dim] - 1) * window.stride[dim] + 1,
                               window.stride[dim])
    return padded


def _tap_positions(x: Any, window: _Window, i: int, j: int) -> tuple[Any, Any]:
    """Row (out_h, 1) and column (1, out_w) in x of tap (i, j) of each window."""
    rows = ops.iota(window.output[0], i * window.dilation[0] - window.padding[0], window.stride[0],
                    torch.int64, x.device)
    cols = ops.iota(window.output[1], j * window.dilation[1] - window.padding[1], window.stride[1],
                    torch.int64, x.device)
    return ops.reshape(rows, (window.output[0], 1)), ops.reshape(cols, (1, window.output[1]))
