"""Normalizations: layer_norm, rms_norm, group_norm, batch_norm (with functionalized
running-stat updates), F.normalize.  Statistics are computed in fp32 for fp16/bf16."""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ember.prims import ops
from ember.prims.registry import register
from ember.prims.values import Value, is_tensor
from ember.symbolic import is_symbolic

F = torch.nn.functional


def _affine(y: Value, weight: Value | None, bias: Value | None) -> Value:
    if weight is not None:
        y = y * weight
    if bias is not None:
        y = y + bias
    return y


@register(F.layer_norm, torch.layer_norm)
def layer_norm(x: Value, normalized_shape: Sequence[int], weight: Value | None = None,
               bias: Value | None = None, eps: float = 1e-5, cudnn_enable: bool = True) -> Value:
    dims = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    xf = ops.upcast(x)
    variance, average = ops.var_mean(xf, dims, 0, keepdim=True)
    y = (xf - average) * ops.rsqrt(variance + eps)
    return ops.cast(_affine(y, weight, bias), x.dtype)


@register(F.rms_norm if hasattr(F, "rms_norm") else None, getattr(torch, "rms_norm", None))
def rms_norm(x: Value, normalized_shape: Sequence[int], weight: Value | None = None,
             eps: float | None = None) -> Value:
    dims = tuple(range(x.ndim - len(normalized_shape), x.ndim))
    xf = ops.upcast(x)
    if eps is None:     # eager: the epsilon of the float math (bf16's own, 0.0078, swamped small inputs)
        eps = torch.finfo(xf.dtype).eps
    y = xf * ops.rsqrt(ops.mean(xf * xf, dims, keepdim=True) + eps)
    if weight is not None:
        y = y * weight
    return ops.cast(y, x.dtype)


@register(F.group_norm, torch.group_norm)
def group_norm(x: Value, num_groups: int, weight: Value | None = None, bias: Value | None = None,
               eps: float = 1e-5, cudnn_enabled: bool = True) -> Value:
    batch, channels = x.shape[0], x.shape[1]
    grouped = ops.reshape(ops.upcast(x), (batch, num_groups, -1))
    variance, average = ops.var_mean(grouped, (2,), 0, keepdim=True)
    y = ops.reshape((grouped - average) * ops.rsqrt(variance + eps), x.shape)
    per_channel = (1, channels) + (1,) * (x.ndim - 2)
    y = _affine(y, ops.reshape(weight, per_channel) if weight is not None else None,
                ops.reshape(bias, per_channel) if bias is not None else None)
    return ops.cast(y, x.dtype)


@register(F.batch_norm, torch.batch_norm)
def batch_norm(x: Value, running_mean: Value | None, running_var: Value | None, weight: Value | None = None,
               bias: Value | None = None, training: bool = False, momentum: Any = 0.1, eps: float = 1e-5,
               cudnn_enabled: bool = True) -> Value:
    if x.ndim < 2:  # only an empty 1-D input gets here without an error in eager
        return x
    channels = x.shape[1]
    per_channel = (1, channels) + (1,) * (x.ndim - 2)
    reduce_dims = tuple(d for d in range(x.ndim) if d != 1)
    xf = ops.upcast(x)
    if training or running_mean is None:
        variance, average = ops.var_mean(xf, reduce_dims, 0)
        if training and running_mean is not None:
            _update_running_stats(running_mean, running_var, average, variance,
                                  ops.reduced_numel(x, reduce_dims), momentum)
    else:
        average, variance = ops.upcast(running_mean), ops.upcast(running_var)
    y = (xf - ops.reshape(average, per_channel)) * ops.reshape(ops.rsqrt(variance + eps), per_channel)
    y = _affine(y, ops.reshape(weight, per_channel) if weight is not None else None,
                ops.reshape(bias, per_channel) if bias is not None else None)
    return ops.cast(y, x.dtype)


def _update_running_stats(running_mean: Value, running_var: Value | None, average: Value, variance: Value,
                          count: Any, momentum: Any) -> None:
    """running = (1 - momentum) * running + momentum * batch_stat; the variance is unbiased.
    nn.BatchNorm's momentum=None (cumulative average) reaches here as momentum = 1 / num_batches
    (a constant or a runtime scalar); F.batch_norm itself rejects None, as eager does."""
    if momentum is None:
        raise TypeError("batch_norm(): argument 'momentum' must be float, not NoneType")
    factor = momentum
    if is_symbolic(count):     # at least 2 (sizes 0 and 1 are specialised); read at run time
        unbiased = variance * count / (count - 1)
    else:
        unbiased = variance * (count / (count - 1)) if count > 1 else variance
    ops.mutate(running_mean, ops.upcast(running_mean) * (1 - factor) + average * factor)
    if running_var is not None and is_tensor(running_var):
        ops.mutate(running_var, ops.upcast(running_var) * (1 - factor) + unbiased * factor)


@register(F.normalize)
def normalize(x: Value, p: float = 2.0, dim: int = 1, eps: float = 1e-12, out: Any = None) -> Value:
    from ember.prims.decompositions.reductions import vector_norm
    denominator = ops.maximum(vector_norm(x, p, dim, keepdim=True), eps)
    return x / ops.expand_to(denominator, x.shape)
