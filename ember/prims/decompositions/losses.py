"""Losses: cross_entropy (class indices or probabilities, ignore_index, label_smoothing,
weights), nll_loss, mse/l1/smooth_l1/huber, binary cross entropy (with logits)."""
from __future__ import annotations

from typing import Any

import torch

from ember.prims import ops
from ember.prims import primitives as P
from ember.prims.decompositions.activations import logsigmoid
from ember.prims.registry import register
from ember.prims.values import Value

F = torch.nn.functional


def _reduction(size_average: Any, reduce: Any, reduction: str) -> str:
    if size_average is None and reduce is None:
        return reduction
    size_average = True if size_average is None else size_average
    reduce = True if reduce is None else reduce
    return "none" if not reduce else ("mean" if size_average else "sum")


def _reduce(loss: Value, reduction: str) -> Value:
    if reduction == "mean":
        return ops.mean(loss)
    if reduction == "sum":
        return ops.sum(loss)
    return loss


def _class_dim(x: Value) -> int:
    return 0 if x.ndim == 1 else 1


def _nll(logp: Value, target: Value, weight: Value | None, ignore_index: int, reduction: str) -> Value:
    class_dim = _class_dim(logp)
    valid = ops.ne(target, ignore_index)
    safe_target = ops.where(valid, target, 0)
    picked = ops.emit(P.gather, logp, class_dim, ops.unsqueeze(ops.cast(safe_target, torch.int64), class_dim))
    picked = ops.squeeze(picked, class_dim)
    per_item_weight = ops.emit(P.index, weight, [ops.cast(safe_target, torch.int64)]) if weight is not None \
        else ops.full_like(picked, 1.0)
    per_item_weight = ops.where(valid, per_item_weight, 0.0)
    loss = ops.neg(picked) * per_item_weight
    if reduction == "none":
        return loss
    if reduction == "sum":
        return ops.sum(loss)
    return ops.sum(loss) / ops.sum(per_item_weight)


@register(F.nll_loss)
def nll_loss(input: Value, target: Value, weight: Value | None = None, size_average: Any = None,
             ignore_index: int = -100, reduce: Any = None, reduction: str = "mean") -> Value:
    return _nll(input, target, weight, ignore_index, _reduction(size_average, reduce, reduction))


@register(F.cross_entropy)
def cross_entropy(input: Value, target: Value, weight: Value | None = None, size_average: Any = None,
                  ignore_index: int = -100, reduce: Any = None, reduction: str = "mean",
                  label_smoothing: float = 0.0) -> Value:
    from ember.prims.decompositions.activations import log_softmax
    reduction = _reduction(size_average, reduce, reduction)
    class_dim = _class_dim(input)
    logp = ops.upcast(log_softmax(input, class_dim))
    classes = input.shape[class_dim]
    weight_shape = [classes if d == class_dim else 1 for d in range(input.ndim)]
    weight_b = ops.reshape(ops.upcast(weight), weight_shape) if weight is not None else None
    if target.dtype.is_floating_point:  # class probabilities
        probs = ops.upcast(target)
        if label_smoothing > 0:
            probs = probs * (1 - label_smoothing) + label_smoothing / classes
        weighted = logp * probs if weight_b is None else logp * probs * weight_b
        loss = ops.neg(ops.sum(weighted, class_dim))
        if reduction == "mean":
            batch = input.numel() // classes if isinstance(input.numel(), int) else input.numel() / classes
            return ops.cast(ops.sum(loss) / batch, input.dtype)
        return ops.cast(_reduce(loss, reduction), input.dtype)
    nll = _nll(logp, target, weight, ignore_index, reduction)
    if label_smoothing <= 0:
        return ops.cast(nll, input.dtype)
    # eager's formula: mix the nll with the (weighted) mean over classes of -log p
    valid = ops.ne(target, ignore_index)
    smooth = ops.neg(ops.sum(logp if weight_b is None else logp * weight_b, class_dim))
    smooth = ops.where(valid, smooth, 0.0)
    if reduction == "mean":
        if weight is not None:
            picked_weight = ops.emit(P.index, ops.upcast(weight), [ops.cast(ops.where(valid, target, 0),
                                                                             torch.int64)])
            denominator = ops.sum(ops.where(valid, picked_weight, 0.0))
        else:
            denominator = ops.sum(ops.cast(valid, torch.float32))
        smooth = ops.sum(smooth) / denominator
    elif reduction == "sum":
        smooth = ops.sum(smooth)
    return ops.cast(nll * (1 - label_smoothing) + smooth * (label_smoothing / classes), input.dtype)


@register(F.mse_loss)
def mse_loss(input: Value, target: Value, size_average: Any = None, reduce: Any = None,
             reduction: str = "mean", weight: Value | None = None) -> Value:
    diff = input - target
    loss = diff * diff
    if weight is not None:
        loss = loss * weight
    return _reduce(loss, _reduction(size_average, reduce, reduction))


@register(F.l1_loss)
def l1_loss(input: Value, target: Value, size_average: Any = None, reduce: Any = None,
            reduction: str = "mean", weight: Value | None = None) -> Value:
    loss = ops.abs(input - target)
    if weight is not None:
        loss = loss * weight
    return _reduce(loss, _reduction(size_average, reduce, reduction))


@register(F.smooth_l1_loss)
def smooth_l1_loss(input: Value, target: Value, size_average: Any = None, reduce: Any = None,
                   reduction: str = "mean", beta: float = 1.0) -> Value:
    diff = ops.abs(input - target)
    loss = diff if beta == 0 else ops.where(ops.lt(diff, beta), diff * diff * (0.5 / beta), diff - 0.5 * beta)
    return _reduce(loss, _reduction(size_average, reduce, reduction))


@register(F.huber_loss)
def huber_loss(input: Value, target: Value, reduction: str = "mean", delta: float = 1.0,
               weight: Value | None = None) -> Value:
    # eager's kernel computes each element at fp32 (the difference too) and rounds once
    out_dtype = torch.promote_types(input.dtype, target.dtype)
    diff = ops.abs(ops.upcast(input) - ops.upcast(target))
    loss = ops.where(ops.lt(diff, delta), diff * diff * 0.5, (diff - 0.5 * delta) * delta)
    loss = ops.cast(loss, out_dtype)
    if weight is not None:
        loss = loss * weight
    return _reduce(loss, reduction)


@register(F.binary_cross_entropy)
def binary_cross_entropy(input: Value, target: Value, weight: Value | None = None, size_average: Any = None,
                         reduce: Any = None, reduction: str = "mean") -> Value:
    # eager clamps the logs at -100 and computes in fp32
    out_dtype = input.dtype
    input, target = ops.upcast(input), ops.upcast(target)
    log_p = ops.maximum(ops.log(input), -100.0)
    log_not_p = ops.maximum(ops.log1p(ops.neg(input)), -100.0)
    loss = ops.neg(target * log_p + (1 - target) * log_not_p)
    if weight is not None:
        loss = loss * weight
    return ops.cast(_reduce(loss, _reduction(size_average, reduce, reduction)), out_dtype)


@register(F.binary_cross_entropy_with_logits)
def binary_cross_entropy_with_logits(input: Value, target: Value, weight: Value | None = None,
                                     size_average: Any = None, reduce: Any = None, reduction: str = "mean",
                                     pos_weight: Value | None = None) -> Value:
    # eager's formula, op for op (each rounds in fp16/bf16): log_sigmoid's kernel (fp32 inside),
    # times the positive weight's factor, then (1 - target) * input - that
    log_sigmoid = logsigmoid(input)
    if pos_weight is not None:
        log_sigmoid = log_sigmoid * ((pos_weight - 1) * target + 1)
    loss = (1 - target) * input - log_sigmoid
    if weight is not None:
        loss = loss * weight
    return _reduce(loss, _reduction(size_average, reduce, reduction))
