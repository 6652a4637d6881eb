"""Explicit meta rules: output TensorMeta of each primitive from its input metas.

Written with plain arithmetic on sizes so that they also work when sizes are sympy
expressions (dynamic shapes).  Elementwise prims (and convert_element_type, where) take
the stride order of their inputs as eager's TensorIterator does (a permuted/channels-last
input gives a permuted/channels-last result; lower/ allocates buffers with these strides);
other non-view prims produce contiguous strides; view prims produce the strides and
storage offset eager PyTorch would give the view, which is what lets the wrapper rebuild
outputs that alias inputs.
Importing this module installs the rules on the prims (`Prim.meta`).
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ember.graph import (
    Size,
    TensorMeta,
    contiguous_strides,
    elementwise_strides,
    memory_format_strides,
    suggested_memory_format,
)
from ember.prims import primitives as P
from ember.symbolic import known_equal

BOOL_RESULT = {"eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or", "logical_xor",
               "logical_not", "isnan", "isinf", "isfinite", "signbit"}


def _dense(shape: Sequence[Size], dtype: torch.dtype, device: torch.device) -> TensorMeta:
    shape = tuple(shape)
    return TensorMeta(shape, contiguous_strides(shape), dtype, torch.device(device))


def _tensors(args: Sequence[Any]) -> list[TensorMeta]:
    return [a for a in args if isinstance(a, TensorMeta)]


def _check_same_shape(name: str, metas: list[TensorMeta]) -> None:
    for m in metas[1:]:
        if len(m.shape) != len(metas[0].shape):
            raise ValueError(f"prims.{name}: operands of different rank {metas[0].shape} vs {m.shape}")


# ----------------------------------------------------------------- elementwise
def _elementwise_result(shape: Sequence[Size], dtype: torch.dtype, device: Any,
                        inputs: Sequence[TensorMeta]) -> TensorMeta:
    shape = tuple(shape)
    return TensorMeta(shape, elementwise_strides(shape, inputs), dtype, torch.device(device))


def _elementwise_rule(name: str):
    def rule(*args: Any) -> TensorMeta:
        tensors = _tensors(args)
        _check_same_shape(name, tensors)
        dtype = torch.bool if name in BOOL_RESULT else tensors[0].dtype
        return _elementwise_result(tensors[0].shape, dtype, tensors[0].device, tensors)
    return rule


def clone_rule(x: TensorMeta) -> TensorMeta:
    return _dense(x.shape, x.dtype, x.device)   # prims.clone is a contiguous copy


def where_rule(cond: Any, a: Any, b: Any) -> TensorMeta:
    tensors = _tensors((cond, a, b))
    values = _tensors((a, b))
    dtype = values[0].dtype if values else torch.get_default_dtype()
    return _elementwise_result(tensors[0].shape, dtype, tensors[0].device, tensors)


def convert_rule(x: TensorMeta, dtype: torch.dtype) -> TensorMeta:
    return _elementwise_result(x.shape, dtype, x.device, [x])


# ----------------------------------------------------------------------- views
def view_strides(old: TensorMeta, shape: Sequence[Size]) -> tuple[Size, ...] | None:
    """Strides of `old.reshape(shape)` if it can be a view, else None (eager would copy).

    The same chunking as ATen's computeStride: walk the old dims in groups that are
    contiguous among themselves and match them to groups of new dims of equal numel.
    """
    shape = tuple(shape)
    numel = old.numel()
    if numel == 0 or len(old.shape) == 0:
        return contiguous_strides(shape)
    new_strides: list[Size] = [0] * len(shape)
    view_d = len(shape) - 1
    chunk_base_stride = old.stride[-1] if old.stride else 1
    tensor_numel: Size = 1
    view_numel: Size = 1
    for tensor_d in range(len(old.shape) - 1, -1, -1):
        tensor_numel = tensor_numel * old.shape[tensor_d]
        if tensor_d == 0 or (old.shape[tensor_d - 1] != 1
                             and old.stride[tensor_d - 1] != tensor_numel * chunk_base_stride):
            while view_d >= 0 and (view_numel != tensor_numel or shape[view_d] == 1):
                new_strides[view_d] = view_numel * chunk_base_stride
                view_numel = view_numel * shape[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if tensor_d > 0:
                chunk_base_stride = old.stride[tensor_d - 1]
                tensor_numel = 1
                view_numel = 1
    if view_d != -1:
        return None
    return tuple(new_strides)


def reshape_rule(x: TensorMeta, shape: Sequence[Size]) -> TensorMeta:
    shape = tuple(shape)
    strides = view_strides(x, shape)
    if strides is None:  # eager copies: a fresh contiguous tensor
        return _dense(shape, x.dtype, x.device)
    return TensorMeta(shape, strides, x.dtype, x.device, storage_offset=x.storage_offset)


def permute_rule(x: TensorMeta, dims: Sequence[int]) -> TensorMeta:
    return TensorMeta(tuple(x.shape[d] for d in dims), tuple(x.stride[d] for d in dims), x.dtype, x.device,
                      storage_offset=x.storage_offset)


def expand_rule(x: TensorMeta, shape: Sequence[Size]) -> TensorMeta:
    assert len(shape) == len(x.shape), f"prims.expand needs equal rank: {x.shape} -> {tuple(shape)}"
    strides = tuple(old_stride if old == new else 0
                    for old, new, old_stride in zip(x.shape, shape, x.stride))
    return TensorMeta(tuple(shape), strides, x.dtype, x.device, storage_offset=x.storage_offset)


def slice_rule(x: TensorMeta, dim: int, start: Size, end: Size, step: Size = 1) -> TensorMeta:
    length = (end - start + step - 1) // step
    shape = list(x.shape)
    strides = list(x.stride)
    shape[dim] = length
    offset = x.storage_offset + start * x.stride[dim]
    strides[dim] = x.stride[dim] * step
    return TensorMeta(tuple(shape), tuple(strides), x.dtype, x.device, storage_offset=offset)


def as_strided_rule(x: TensorMeta, size: Sequence[Size], stride: Sequence[Size], storage_offset: Size = 0):
    return TensorMeta(tuple(size), tuple(stride), x.dtype, x.device, storage_offset=storage_offset)


# ------------------------------------------------------------------ reductions
def _reduced_shape(x: TensorMeta, dims: Sequence[int]) -> tuple[Size, ...]:
    return tuple(s for i, s in enumerate(x.shape) if i not in set(dims))


def reduction_rule(x: TensorMeta, dims: Sequence[int]) -> TensorMeta:
    return _dense(_reduced_shape(x, dims), x.dtype, x.device)


def arg_reduction_rule(x: TensorMeta, dim: int) -> TensorMeta:
    return _dense(_reduced_shape(x, (dim,)), torch.int64, x.device)


def var_mean_rule(x: TensorMeta, dims: Sequence[int], correction: Any = 0,
                  whole: bool = False) -> tuple[TensorMeta, TensorMeta]:
    out = _dense(_reduced_shape(x, dims), x.dtype, x.device)
    return out, out


def cumsum_rule(x: TensorMeta, dim: int) -> TensorMeta:
    return _dense(x.shape, x.dtype, x.device)


# -------------------------------------------------------------------- creation
def iota_rule(length: Size, start: Any, step: Any, dtype: torch.dtype, device: Any) -> TensorMeta:
    return _dense((length,), dtype, device)


def full_rule(shape: Sequence[Size], value: Any, dtype: torch.dtype, device: Any,
              stride: Sequence[Size] | None = None) -> TensorMeta:
    if stride is not None:
        return TensorMeta(tuple(shape), tuple(stride), dtype, torch.device(device))
    return _dense(shape, dtype, device)


def philox_rule(shape: Sequence[Size], seed: Any, offset: Any, dtype: torch.dtype, device: Any) -> TensorMeta:
    return _dense(shape, dtype, device)


# -------------------------------------------------------------------- indexing
def gather_rule(x: TensorMeta, dim: int, index: TensorMeta) -> TensorMeta:
    return _dense(index.shape, x.dtype, x.device)


def broadcast_shapes(*shapes: Sequence[Size]) -> tuple[Size, ...]:
    rank = max((len(s) for s in shapes), default=0)
    out: list[Size] = [1] * rank
    for shape in shapes:
        for i, size in enumerate(shape):
            j = rank - len(shape) + i
            if known_equal(size, out[j]):
                continue      # the same size (x beside a function of x): no guard on it being 1
            if out[j] == 1:
                out[j] = size
            elif size != 1 and size != out[j] and isinstance(size, int) and isinstance(out[j], int):
                raise ValueError(f"shapes {shapes} do not broadcast")
    return tuple(out)


def index_rule(x: TensorMeta, indices: Sequence[Any]) -> TensorMeta:
    indexed = [i for i, ix in enumerate(indices) if ix is not None]
    index_shape = broadcast_shapes(*(indices[i].shape for i in indexed))
    kept_before = [x.shape[i] for i in range(len(x.shape)) if i < indexed[0]]
    kept_after = [x.shape[i] for i in range(len(x.shape)) if i > indexed[-1]]
    adjacent = indexed == list(range(indexed[0], indexed[-1] + 1))
    if adjacent:
        shape = tuple(kept_before) + index_shape + tuple(kept_after)
    else:
        rest = [x.shape[i] for i in range(len(x.shape)) if i not in indexed]
        shape = index_shape + tuple(rest)
    return _dense(shape, x.dtype, x.device)


def same_as_input_rule(x: TensorMeta, *args: Any, **kwargs: Any) -> TensorMeta:
    return _dense(x.shape, x.dtype, x.device)


def cat_rule(tensors: Sequence[TensorMeta], dim: int) -> TensorMeta:
    """Channels-last when every input suggests it (eager's cat: the inputs' common suggested memory
    format, ATen's stride rule with its size-1 cases)."""
    shape = list(tensors[0].shape)
    shape[dim] = 0
    for t in tensors:
        shape[dim] = shape[dim] + t.shape[dim]
    formats = {suggested_memory_format(t.shape, t.stride) for t in tensors}
    if len(formats) == 1 and formats != {torch.contiguous_format}:
        return TensorMeta(tuple(shape), memory_format_strides(shape, formats.pop()), tensors[0].dtype,
                          torch.device(tensors[0].device))
    return _dense(shape, tensors[0].dtype, tensors[0].device)


def constant_pad_rule(x: TensorMeta, pad: Sequence[Size], value: Any) -> TensorMeta:
    """Eager's constant_pad_nd allocates in the input's suggested memory format (a channels-last
    input, sliced too, stays channels-last); anything else comes out contiguous."""
    shape = list(x.shape)
    for i in range(len(pad) // 2):
        dim = len(shape) - 1 - i
        shape[dim] = shape[dim] + pad[2 * i] + pad[2 * i + 1]
    memory_format = suggested_memory_format(x.shape, x.stride)
    if memory_format is not torch.contiguous_format:
        return TensorMeta(tuple(shape), memory_format_strides(shape, memory_format), x.dtype, torch.device(x.device))
    return _dense(shape, x.dtype, x.device)


def pool_argmax_rule(x: TensorMeta, kernel: Sequence[int], stride: Sequence[int], padding: Sequence[int],
                     dilation: Sequence[int], ceil_mode: bool, dtype: torch.dtype) -> TensorMeta:
    from ember.prims.decompositions.pooling import pooled_size
    out = [pooled_size(n, k, s, p, d, ceil_mode)
           for n, k, s, p, d in zip(x.shape[-2:], kernel, stride, padding, dilation)]
    return _dense([*x.shape[:-2], *out], dtype, x.device)


def pool_select_rule(x: TensorMeta, index: TensorMeta, *window: Any) -> TensorMeta:
    return _dense([*x.shape[:-2], *index.shape[-2:]], x.dtype, x.device)


def pool_scatter_rule(grad: TensorMeta, index: TensorMeta, height: Size, width: Size, *window: Any) -> TensorMeta:
    return _dense([*grad.shape[:-2], height, width], grad.dtype, grad.device)


def _install() -> None:
    for name in list(P.UNARY) + list(P.BINARY):
        P.get(name).meta = _elementwise_rule(name)
    rules = {
        "clone": clone_rule, "where": where_rule, "convert_element_type": convert_rule,
        "reshape": reshape_rule, "permute": permute_rule, "expand": expand_rule, "slice": slice_rule,
        "as_strided": as_strided_rule, "detach": lambda x: x,
        "sum": reduction_rule, "prod": reduction_rule, "amax": reduction_rule, "amin": reduction_rule,
        "argmax": arg_reduction_rule, "argmin": arg_reduction_rule, "var_mean": var_mean_rule,
        "cumsum": cumsum_rule, "iota": iota_rule, "full": full_rule, "philox_rand": philox_rule,
        "gather": gather_rule, "index": index_rule, "scatter": same_as_input_rule,
        "scatter_add": same_as_input_rule, "index_put": same_as_input_rule, "cat": cat_rule,
        "constant_pad": constant_pad_rule,
        "pool_argmax": pool_argmax_rule, "pool_select": pool_select_rule, "pool_scatter": pool_scatter_rule,
    }
    for name, rule in rules.items():
        P.get(name).meta = rule
    missing = [name for name, prim in P.REGISTRY.items() if prim.meta is None]
    assert not missing, f"prims without a meta rule: {missing}"


_install()
