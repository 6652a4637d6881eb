"""Pooling: global average pooling as a mean; 2-D max pooling generated (the pool_* prims).
Other pooling runs eager's kernels (Externs, whose backward rules are in autodiff/extern_rules.py)."""
from __future__ import annotations

import dataclasses
from typing import Any

import torch
import torch.nn.functional as F

from ember import config
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
    """Floating max pooling of static height and width can be generated (_max_pool2d_prims, on
    config.generated_max_pool_devices): it fuses with what produced x, and so does its backward
    (eager's CUDA kernels took 0.67 ms of ResNet-50's training step, 0.46 ms of it the backward).
    Otherwise eager's kernel runs; in a step that will be differentiated, the one that returns its
    indices (the backward reads them, and recomputing them cost a second pass over the input)."""
    window = _window(x, kernel_size, stride, padding, dilation, ceil_mode)
    if window is not None:
        return _max_pool2d_prims(x, window, ceil_mode, return_indices)
    if return_indices or not differentiated():
        return ops.extern(F.max_pool2d, x, kernel_size, stride, padding, dilation, ceil_mode=ceil_mode,
                          return_indices=return_indices)
    values, _ = ops.extern(F.max_pool2d_with_indices, x, kernel_size, stride, padding, dilation,
                           ceil_mode=ceil_mode, return_indices=True)
    return values


# windows of more taps than this run eager's kernel (each tap is a load of the generated kernels)
MAX_POOL_TAPS = 64


@dataclasses.dataclass(frozen=True)
class _Window:
    """A 2-D pooling window over (.., height, width), per dim (height first)."""
    kernel: tuple[int, int]
    stride: tuple[int, int]
    padding: tuple[int, int]
    dilation: tuple[int, int]


def _pair(value: Any) -> tuple[Any, Any] | None:
    if isinstance(value, int):
        return value, value
    if isinstance(value, (tuple, list)) and len(value) in (1, 2) and all(isinstance(v, int) for v in value):
        return (value[0], value[-1])
    return None


def _window(x: Any, kernel_size: Any, stride: Any, padding: Any, dilation: Any, ceil_mode: Any) -> _Window | None:
    """The window when the generated pooling computes exactly what eager does: a floating 3-D or
    4-D input of static height and width, arguments eager accepts; else None (eager's kernel runs,
    and raises eager's error for bad arguments)."""
    if not is_tensor(x) or x.ndim not in (3, 4) or not x.dtype.is_floating_point or not isinstance(ceil_mode, bool) \
            or x.device.type not in config.generated_max_pool_devices:
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
    if min(pooled_size(n, k, s, p, d, ceil_mode)
           for n, k, s, p, d in zip((height, width), kernel, stride, padding, dilation)) < 1:
        return None
    return _Window(kernel, stride, padding, dilation)


def pooled_size(size: int, kernel: int, stride: int, padding: int, dilation: int, ceil_mode: bool) -> int:
    """eager's pooling output size; in ceil mode the last window must start inside the input or
    its left padding."""
    span = size + 2 * padding - dilation * (kernel - 1) - 1 + (stride - 1 if ceil_mode else 0)
    out = span // stride + 1
    if ceil_mode and (out - 1) * stride >= size + padding:
        out -= 1
    return out


def _max_pool2d_prims(x: Any, window: _Window, ceil_mode: bool, return_indices: bool) -> Any:
    """Each window's max position (pool_argmax: eager's scan, the index narrow enough for the
    plane, which is what a training step saves), then the values there (pool_select, whose gradient
    pool_scatter sends each window's gradient to that position)."""
    plane = x.shape[-2] * x.shape[-1]
    index_dtype = torch.int16 if plane <= torch.iinfo(torch.int16).max else \
        torch.int32 if plane <= torch.iinfo(torch.int32).max else torch.int64
    args = (window.kernel, window.stride, window.padding, window.dilation)
    index = ops.emit(P.pool_argmax, x, *args, ceil_mode, index_dtype)
    values = ops.emit(P.pool_select, x, index, *args)
    return (values, ops.cast(index, torch.int64)) if return_indices else values
