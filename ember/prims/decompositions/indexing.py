"""Indexing: x[idx] (getitem), x[idx] = v (setitem), gather/scatter/index_select,
index_put, embedding.

`x[idx]` is split into a basic part (ints -> select, slices, None, Ellipsis: views)
followed by one advanced `index` prim for the tensor indices, as PyTorch does.
"""
from __future__ import annotations

import dataclasses
import itertools
import operator
from collections.abc import Sequence
from typing import Any

import torch

from ember.graph import elementwise_strides, preserved_strides
from ember.prims import ops
from ember.prims import primitives as P
from ember.prims.meta import view_strides
from ember.prims.registry import differentiated, register
from ember.prims.values import Value, is_tensor

T = torch.Tensor
F = torch.nn.functional


class _NeedsExtern(Exception):
    """An index this decomposition does not cover (bool masks, lists): run it eagerly."""


def _basic_then_advanced(x: Value, index: Any) -> tuple[Value, list[tuple[int, Value]]]:
    """Apply ints/slices/None/Ellipsis as views; return the view and the tensor indices by dim."""
    items = list(index) if isinstance(index, tuple) else [index]
    items = [_int_list_as_index(item, x.device) if _is_int_list(item) else item for item in items]
    for item in items:
        if isinstance(item, bool) or (is_tensor(item) and item.dtype in (torch.bool, torch.uint8)) \
                or isinstance(item, (list, Value)) and not is_tensor(item):
            raise _NeedsExtern
    consumed = sum(0 if item is None or item is Ellipsis else 1 for item in items)
    if Ellipsis in [i for i in items if not is_tensor(i)]:
        position = next(n for n, item in enumerate(items) if item is Ellipsis and not is_tensor(item))
        items[position:position + 1] = [slice(None)] * (x.ndim - consumed)
    if consumed > x.ndim:
        raise IndexError(f"too many indices for tensor of dimension {x.ndim}")
    result, dim, advanced = x, 0, []
    for item in items:
        if item is None:
            result = ops.unsqueeze(result, dim)
            dim += 1
        elif isinstance(item, int):
            result = ops.select(result, dim, item)
        elif isinstance(item, slice):
            step = 1 if item.step is None else item.step
            if step <= 0:
                raise ValueError("step must be greater than zero")
            result = ops.slice_dim(result, dim, item.start, item.stop, step)
            dim += 1
        elif is_tensor(item):
            advanced.append((dim, item))
            dim += 1
        else:
            raise _NeedsExtern
    return result, advanced


def _is_int_list(item: Any) -> bool:
    return isinstance(item, list) and 0 < len(item) <= _MAX_LIST_INDEX and \
        all(isinstance(i, int) and not isinstance(i, bool) for i in item)


_MAX_LIST_INDEX = 64   # longer lists run eagerly rather than as a chain of selects


def _int_list_as_index(values: list[int], device: torch.device) -> Value:
    """x[[1, 2]] indexes with tensor([1, 2]): an iota when evenly spaced, else a where-chain over one."""
    step = values[1] - values[0] if len(values) > 1 else 1
    if all(b - a == step for a, b in itertools.pairwise(values)):
        return ops.iota(len(values), values[0], step, torch.int64, device)
    positions = ops.iota(len(values), 0, 1, torch.int64, device)
    index = ops.full((len(values),), values[0], torch.int64, device)
    for position, value in enumerate(values[1:], start=1):
        index = ops.where(ops.eq(positions, position), value, index)
    return index


def _index_list(x: Value, advanced: list[tuple[int, Value]]) -> list[Any]:
    """Full-length index list (None = not indexed) with negative indices wrapped."""
    indices: list[Any] = [None] * x.ndim
    for dim, index in advanced:
        index = ops.cast(index, torch.int64)
        indices[dim] = ops.where(ops.lt(index, 0), index + x.shape[dim], index)
    while indices and indices[-1] is None:
        indices.pop()
    return indices


@register(operator.getitem, T.__getitem__, view=True)
def getitem(x: Any, index: Any) -> Any:
    if not is_tensor(x):
        return x[index]  # a tuple of results (split, max(dim) ...)
    try:
        view, advanced = _basic_then_advanced(x, index)
    except _NeedsExtern:
        return ops.extern(_eager_getitem, x, index)
    if not advanced:
        return view
    indices = _index_list(view, advanced)
    result = ops.emit(P.index, view, indices)
    if result.node.target is not P.index:
        return result
    return ops.relaid(result, _advanced_index_strides(view, indices, result))


def _advanced_index_strides(view: Value, indices: list[Any], result: Value) -> tuple[int, ...] | None:
    """The result's strides as eager's aten::index lays it out (None for symbolic sizes): a
    TensorIterator over the result whose operands are the source restrided (its kept dims'
    strides, 0 across the indexed block) and each index, broadcast to the others and reshaped into
    the block, so ``x.t()[idx]`` keeps x.t()'s order of the kept dims (graph.elementwise_strides).
    Indexed dims that are not adjacent are moved to the front first, with their indices, as eager
    does; the size-1 dims of each operand keep the strides ATen's expand and reshape give them,
    because they break ties in the order."""
    indexed = [d for d, ix in enumerate(indices) if ix is not None]
    metas = [indices[d].meta for d in indexed]
    shape = tuple(result.shape)
    sizes = (*shape, *view.shape, *view.meta.stride, *(v for m in metas for v in (*m.shape, *m.stride)))
    if not all(isinstance(v, int) for v in sizes):
        return None
    source_shape, source_stride = tuple(view.shape), tuple(view.meta.stride)
    if indexed != list(range(indexed[0], indexed[-1] + 1)):      # eager's transposeToFront
        order = indexed + [d for d in range(view.ndim) if d not in indexed]
        source_shape, source_stride = tuple(source_shape[d] for d in order), tuple(source_stride[d] for d in order)
        indexed = list(range(len(indexed)))
    before, after = indexed[0], len(source_shape) - indexed[-1] - 1
    block = shape[before:len(shape) - after]
    operands = [dataclasses.replace(view.meta, shape=shape, stride=(*source_stride[:before], *(0,) * len(block),
                                                                    *source_stride[indexed[-1] + 1:]))]
    for meta in metas:
        if tuple(meta.shape) != block and len(set(tuple(m.shape) for m in metas)) > 1:
            meta = dataclasses.replace(meta, shape=block, stride=_expanded_strides(meta, block))
        full = (*(1,) * before, *block, *(1,) * after)
        strides = view_strides(meta, full)
        if strides is None:
            return None
        operands.append(dataclasses.replace(meta, shape=full, stride=strides))
    return tuple(elementwise_strides(shape, operands))


def _expanded_strides(meta: Any, shape: tuple[int, ...]) -> tuple[int, ...]:
    """ATen's expand of ``meta`` to ``shape``: broadcast dims get stride 0, a new leading dim that
    stays of size 1 the stride of the dims after it."""
    strides = [0] * len(shape)
    for i in range(len(shape) - 1, -1, -1):
        dim = meta.ndim - len(shape) + i
        size = meta.shape[dim] if dim >= 0 else 1
        stride = meta.stride[dim] if dim >= 0 else (shape[i + 1] * strides[i + 1] if i + 1 < len(shape) else 1)
        strides[i] = 0 if size != shape[i] else stride
    return tuple(strides)


@register(operator.setitem, T.__setitem__)
def setitem(x: Value, index: Any, value: Any) -> None:
    try:
        view, advanced = _basic_then_advanced(x, index)
    except _NeedsExtern:
        ops.mutate(x, ops.extern(_functional_setitem, x, index, value))
        return
    if not advanced:
        ops.mutate(view, _as_values(value, view.shape, view.dtype, view.device), base=x)
        return
    indices = _index_list(view, advanced)
    target_meta = P.index.infer_meta(view.meta, [i.meta if i is not None else None for i in indices])
    values = _as_values(value, target_meta.shape, view.dtype, view.device)
    ops.mutate(view, ops.emit(P.index_put, view, indices, values, False), base=x)
    return


def _as_values(value: Any, shape: Sequence[Any], dtype: torch.dtype, device: torch.device) -> Value:
    if not is_tensor(value):
        return ops.full(shape, value, dtype, device)
    return ops.expand_to(ops.cast(value, dtype), shape)


def _eager_getitem(x: torch.Tensor, index: Any) -> torch.Tensor:
    """x[index] run by the wrapper (bool masks, nested lists).  Not operator.getitem itself: in a
    prim graph that names the element of a multi-output node.  Externs are functional: a
    result that shares x's memory is copied."""
    out = x[index]
    return out.clone() if out.untyped_storage().data_ptr() == x.untyped_storage().data_ptr() else out


def _functional_setitem(x: torch.Tensor, index: Any, value: Any) -> torch.Tensor:
    out = x.clone()
    out[index] = value
    return out


@register(torch.index_put, T.index_put)
def index_put(x: Value, indices: Sequence[Any], values: Value, accumulate: bool = False) -> Value:
    if any(is_tensor(i) and i.dtype in (torch.bool, torch.uint8) for i in indices):
        return ops.extern(torch.index_put, x, tuple(indices), values, accumulate)
    index_list = _index_list(x, [(d, i) for d, i in enumerate(indices) if i is not None])
    target_meta = P.index.infer_meta(x.meta, [i.meta if i is not None else None for i in index_list])
    values = _as_values(values, target_meta.shape, x.dtype, x.device)
    # eager's out-of-place index_put writes into x.clone(): empty_like's layout
    return ops.relaid(ops.emit(P.index_put, x, index_list, values, accumulate),
                      preserved_strides(x.shape, x.meta.stride))


@register(torch.index_select, T.index_select)
def index_select(x: Value, dim: int, index: Value) -> Value:
    dim = ops.normalize_dim(dim, x.ndim)
    if x.ndim == 0:
        flat = ops.reshape(x, (1,))
        return ops.reshape(ops.emit(P.index, flat, _index_list(flat, [(0, ops.reshape(index, (-1,)))])), ())
    index = ops.cast(ops.reshape(index, (-1,)), torch.int64)
    if dim == 1:
        # eager's CPU fast path for dim 1 raises RuntimeError for a bad index (gather's kind of
        # error); the other dims raise IndexError (index's).  The same values either way.
        shape = list(x.shape)
        shape[1] = index.shape[0]
        return ops.emit(P.gather, x, 1, ops.expand_to(ops.reshape(index, [1, -1] + [1] * (x.ndim - 2)), shape))
    # no negative wrapping: eager's index_select raises for -1 ("index out of range in self")
    return ops.emit(P.index, x, [None] * dim + [index])


@register(torch.gather, T.gather)
def gather(x: Value, dim: int, index: Value, *, sparse_grad: bool = False) -> Value:
    dim = ops.normalize_dim(dim, x.ndim)
    return ops.emit(P.gather, x, dim, _wrap_negative(index, x.shape[dim] if x.ndim else 1))


def _wrap_negative(index: Value, size: Any) -> Value:
    # gather/scatter do not wrap negative indices in eager: -1 is out of range (a RuntimeError,
    # raised by the kernel's bounds check); only the cast remains
    return ops.cast(index, torch.int64)


@register(torch.take_along_dim, T.take_along_dim)
def take_along_dim(x: Value, indices: Value, dim: int | None = None) -> Value:
    if dim is None:
        return gather(ops.reshape(x, (-1,)), 0, ops.reshape(indices, (-1,)))
    dim = ops.normalize_dim(dim, x.ndim)
    shape_x = list(x.shape)
    shape_i = list(indices.shape)
    shape_x[dim] = shape_i[dim] = 1
    common = ops.broadcast_shapes(shape_x, shape_i)
    x_shape, i_shape = list(common), list(common)
    x_shape[dim], i_shape[dim] = x.shape[dim], indices.shape[dim]
    # with a dim, eager wraps negative indices before its gather (without one it raises for them)
    indices = ops.cast(indices, torch.int64)
    indices = ops.where(ops.lt(indices, 0), ops.add(indices, x.shape[dim]), indices)
    return gather(ops.expand_to(x, x_shape), dim, ops.expand_to(indices, i_shape))


@register(torch.scatter, T.scatter)
def scatter(x: Value, dim: int, index: Value, src: Any = None, *, value: Any = None, reduce: Any = None) -> Value:
    if reduce is not None:
        return ops.extern(torch.scatter, x, dim, index, src if src is not None else value, reduce=reduce)
    if src is None:
        src = value
    dim = ops.normalize_dim(dim, x.ndim)
    if not is_tensor(src):
        src = ops.full(index.shape, src, x.dtype, x.device)
    src = _fit_src(src, index, x.dtype)
    return ops.emit(P.scatter, x, dim, _wrap_negative(index, x.shape[dim] if x.ndim else 1), src)


def _fit_src(src: Value, index: Value, dtype: torch.dtype) -> Value:
    """scatter reads src only where index has entries: slice it to index's shape."""
    src = ops.cast(src, dtype)
    for d, size in enumerate(index.shape):
        if src.shape[d] != size:
            src = ops.slice_dim(src, d, 0, size)
    return src


@register(torch.scatter_add, T.scatter_add)
def scatter_add(x: Value, dim: int, index: Value, src: Value) -> Value:
    dim = ops.normalize_dim(dim, x.ndim)
    src = _fit_src(src, index, x.dtype)
    return ops.emit(P.scatter_add, x, dim, _wrap_negative(index, x.shape[dim] if x.ndim else 1), src)


@register(F.embedding)
def embedding(input: Value, weight: Value, padding_idx: int | None = None, max_norm: float | None = None,
              norm_type: float = 2.0, scale_grad_by_freq: bool = False, sparse: bool = False) -> Value:
    # max_norm renormalizes weight in place: eager's.  padding_idx and scale_grad_by_freq change
    # only the gradient (the padding row gets none; rows are scaled by 1 / their count), which the
    # extern's VJP rule computes and a plain gather's would not
    shapes_gradient = (padding_idx is not None or scale_grad_by_freq) and differentiated()
    if max_norm is not None or shapes_gradient:
        return ops.extern(F.embedding, input, weight, padding_idx, max_norm, norm_type, scale_grad_by_freq,
                          sparse)
    return ops.emit(P.index, weight, [ops.cast(input, torch.int64)])


@register(T.copy_, inplace=True)
def copy_(x: Value, src: Any, non_blocking: bool = False) -> Value:
    if is_tensor(src) and src.device != x.device:
        src = ops.extern(T.to, src, x.device)
    return _as_values(src, x.shape, x.dtype, x.device)


@register(T.fill_, torch.fill_, inplace=True)
def fill_(x: Value, value: Any) -> Value:
    return _as_values(value, x.shape, x.dtype, x.device)


@register(T.zero_, torch.zero_, inplace=True)
def zero_(x: Value) -> Value:
    return ops.full(x.shape, 0, x.dtype, x.device)


@register(torch.fill, T.fill if hasattr(T, "fill") else None)
def fill(x: Value, value: Any) -> Value:
    return _as_values(value, x.shape, x.dtype, x.device)
