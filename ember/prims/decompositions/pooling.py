"""Pooling: global average pooling as a mean; max pooling keeps its indices when differentiated.
Other pooling runs eager's kernels (Externs, whose backward rules are in autodiff/extern_rules.py)."""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

from ember.prims import ops
from ember.prims.registry import differentiated, register


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
    """In a step that will be differentiated, the pooling that returns its indices: the backward
    reads them, and recomputing them cost a second pooling pass over the input in the forward."""
    if return_indices or not differentiated():
        return ops.extern(F.max_pool2d, x, kernel_size, stride, padding, dilation, ceil_mode=ceil_mode,
                          return_indices=return_indices)
    values, _ = ops.extern(F.max_pool2d_with_indices, x, kernel_size, stride, padding, dilation,
                           ceil_mode=ceil_mode, return_indices=True)
    return values
