"""Views (reshape, permute, slice, expand and their many spellings) and cat/stack/pad.

View decompositions are registered with view=True: the result aliases args[0] in eager
whenever it is reached from it through view prims only (functionalization checks).
"""
from __future__ import annotations

import builtins
from collections.abc import Sequence
from typing import Any

import torch

from ember.graph import stacked_at_end_strides
from ember.prims import ops
from ember.prims import primitives as P
from ember.prims.registry import register
from ember.prims.values import Value, is_tensor
from ember.symbolic import is_symbolic, known_equal_sizes

T = torch.Tensor


def _sizes(args: Sequence[Any]) -> tuple:
    """f(x, 2, 3) and f(x, (2, 3)) both mean the shape (2, 3)."""
    if len(args) == 1 and isinstance(args[0], (tuple, list, torch.Size)):
        return tuple(args[0])
    return tuple(args)


@register(T.view, view=True)
def view(x: Value, *shape: Any, **kwargs: Any) -> Value:
    if "size" in kwargs:
        shape = (kwargs["size"],)
    if len(shape) == 1 and isinstance(shape[0], torch.dtype):
        return ops.extern(T.view, x, shape[0])  # a bitcast, not a reshape
    return ops.reshape(x, _sizes(shape))


@register(torch.reshape, T.reshape, view=True)
def reshape(x: Value, *shape: Any, **kwargs: Any) -> Value:
    if "shape" in kwargs:
        shape = (kwargs["shape"],)
    return ops.reshape(x, _sizes(shape))


@register(T.view_as, T.reshape_as, view=True)
def view_as(x: Value, other: Value) -> Value:
    return ops.reshape(x, other.shape)


@register(torch.flatten, T.flatten, view=True)
def flatten(x: Value, start_dim: int = 0, end_dim: int = -1) -> Value:
    if x.ndim == 0:
        return ops.reshape(x, (1,))
    start, end = ops.normalize_dim(start_dim, x.ndim), ops.normalize_dim(end_dim, x.ndim)
    if start >= end:
        return x
    middle = ops.prod_sizes(x.shape[start:end + 1])
    return ops.reshape(x, tuple(x.shape[:start]) + (middle,) + tuple(x.shape[end + 1:]))


@register(torch.unflatten, T.unflatten, view=True)
def unflatten(x: Value, dim: int, sizes: Sequence[int]) -> Value:
    dim = ops.normalize_dim(dim, x.ndim)
    sizes = ops.infer_size(sizes, x.shape[dim])
    return ops.reshape(x, tuple(x.shape[:dim]) + tuple(sizes) + tuple(x.shape[dim + 1:]))


@register(torch.permute, T.permute, view=True)
def permute(x: Value, *dims: Any) -> Value:
    return ops.permute(x, _sizes(dims))


@register(torch.transpose, T.transpose, torch.swapaxes, T.swapaxes, torch.swapdims, T.swapdims, view=True)
def transpose(x: Value, dim0: int, dim1: int) -> Value:
    return ops.transpose(x, dim0, dim1)


@register(torch.t, T.t, view=True)
def t(x: Value) -> Value:
    return x if x.ndim < 2 else ops.transpose(x, 0, 1)


@register(torch.adjoint, T.adjoint, view=True)
def matrix_transpose(x: Value) -> Value:
    return ops.transpose(x, -2, -1)


@register(torch.movedim, T.movedim, torch.moveaxis, T.moveaxis, view=True)
def movedim(x: Value, source: Any, destination: Any) -> Value:
    source = [source] if isinstance(source, int) else list(source)
    destination = [destination] if isinstance(destination, int) else list(destination)
    source = [ops.normalize_dim(d, x.ndim) for d in source]
    destination = [ops.normalize_dim(d, x.ndim) for d in destination]
    order: list[int | None] = [None] * x.ndim
    for s, d in zip(source, destination):
        order[d] = s
    rest = iter(d for d in range(x.ndim) if d not in source)
    return ops.permute(x, [o if o is not None else next(rest) for o in order])


@register(T.expand, view=True)
def expand(x: Value, *sizes: Any) -> Value:
    return ops.expand(x, _sizes(sizes))


@register(T.expand_as, view=True)
def expand_as(x: Value, other: Value) -> Value:
    return ops.expand(x, other.shape)


@register(torch.broadcast_to, T.broadcast_to, view=True)
def broadcast_to(x: Value, size: Sequence[int]) -> Value:
    return ops.expand(x, size)


@register(torch.squeeze, T.squeeze, view=True)
def squeeze(x: Value, dim: Any = None) -> Value:
    return ops.squeeze(x, dim)


@register(torch.unsqueeze, T.unsqueeze, view=True)
def unsqueeze(x: Value, dim: int) -> Value:
    return ops.unsqueeze(x, dim)


@register(torch.select, T.select, view=True)
def select(x: Value, dim: int, index: int) -> Value:
    return ops.select(x, dim, index)


@register(torch.narrow, T.narrow, view=True)
def narrow(x: Value, dim: int, start: int, length: int) -> Value:
    dim = ops.normalize_dim(dim, x.ndim)
    if is_tensor(start):
        # start is data: read the `length` rows at start + iota (a copy, where eager makes a view)
        start = ops.cast(ops.reshape(start, ()), torch.int64)
        start = ops.where(ops.lt(start, 0), ops.add(start, x.shape[dim]), start)
        rows = ops.add(ops.iota(length, 0, 1, torch.int64, x.device), start)
        return ops.emit(P.index, x, [None] * dim + [rows])
    if isinstance(start, Value):
        return ops.extern(torch.narrow, x, dim, start, length)
    if isinstance(start, int) and start < 0:
        start = start + x.shape[dim]
    return ops.slice_dim(x, dim, start, start + length)


@register(torch.split, T.split, view=True)
def split(x: Value, split_size_or_sections: Any, dim: int = 0) -> tuple[Value, ...]:
    dim = ops.normalize_dim(dim, x.ndim)
    size = x.shape[dim]
    if isinstance(split_size_or_sections, int) or is_symbolic(split_size_or_sections):
        step = split_size_or_sections
        if is_symbolic(step):
            # x.split(C) with C a size symbol: the comparisons below guard the piece count
            sections, start = [], 0
            while start < size:
                sections.append(builtins.min(step, size - start))
                start = start + step
            return split_with_sizes(x, sections or [size], dim)
        sections = [builtins.min(step, size - start) for start in range(0, builtins.max(size, 1), step)] \
            if step > 0 else [size]
    else:
        sections = list(split_size_or_sections)
    return split_with_sizes(x, sections, dim)


@register(torch.split_with_sizes, T.split_with_sizes, view=True)
def split_with_sizes(x: Value, split_sizes: Sequence[int], dim: int = 0) -> tuple[Value, ...]:
    dim = ops.normalize_dim(dim, x.ndim)
    outs, start = [], 0
    for length in split_sizes:
        outs.append(_slice_keep(x, dim, start, start + length))
        start += length
    return tuple(outs)


def _slice_keep(x: Value, dim: int, start: Any, end: Any) -> Value:
    """A slice node even when it covers the whole dim, so each piece is its own view."""
    return ops.slice_dim(x, dim, start, end)


@register(torch.chunk, T.chunk, view=True)
def chunk(x: Value, chunks: int, dim: int = 0) -> tuple[Value, ...]:
    dim = ops.normalize_dim(dim, x.ndim)
    size = x.shape[dim]
    if not size:       # eager: `chunks` empty pieces (split of a size-0 dim gives one)
        return split_with_sizes(x, [0] * builtins.max(chunks, 1), dim)
    step = -(-size // chunks) if chunks > 0 else size
    return split(x, builtins.max(step, 1), dim)


@register(torch.unbind, T.unbind, view=True)
def unbind(x: Value, dim: int = 0) -> tuple[Value, ...]:
    dim = ops.normalize_dim(dim, x.ndim)
    return tuple(ops.select(x, dim, i) for i in range(x.shape[dim]))


# ------------------------------------------------------------- cat, stack, pad
@register(torch.cat, torch.concat, torch.concatenate)
def cat(tensors: Sequence[Value], dim: int = 0) -> Value:
    # legacy: 1-D empty tensors are skipped whatever the other ranks are, but their dtypes still
    # take part in the result's (eager: cat([float32 empty, float16]) is float32)
    dtype = tensors[0].dtype
    for t in tensors[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    kept = [t for t in tensors if not (t.ndim == 1 and t.shape[0] == 0)]
    if not kept:
        return ops.full((0,), 0, dtype, tensors[0].device)     # a new tensor, as eager's
    dim = ops.normalize_dim(dim, kept[0].ndim)
    # one tensor too: a new tensor in cat's layout (a transposed input comes back contiguous)
    return ops.emit(P.cat, [ops.cast(t, dtype) for t in kept], dim)


@register(torch.stack)
def stack(tensors: Sequence[Value], dim: int = 0) -> Value:
    """As eager's: a cat along ``dim`` split by a view, so the result has cat's layout of the
    inputs themselves (contiguous for transposed inputs, where cat of the unsqueezed inputs followed
    their order); a new last dim has nothing to split: cat of the unsqueezed inputs."""
    dim = ops.normalize_dim(dim, tensors[0].ndim + 1)
    if not all(known_equal_sizes(tuple(t.shape), tuple(tensors[0].shape)) for t in tensors):
        # unequal sizes (eager raises: cat says how), or symbolic ones not provably equal
        return cat([ops.unsqueeze(t, dim) for t in tensors], dim)
    if dim == tensors[0].ndim:
        joined = cat([ops.unsqueeze(t, dim) for t in tensors], dim)
        if joined.node.target is not P.cat:
            return joined
        return ops.relaid(joined, stacked_at_end_strides(joined.shape, [t.meta for t in tensors]))
    joined = cat(tensors, dim)
    shape = tuple(tensors[0].shape)
    return ops.reshape(joined, (*shape[:dim], len(tensors), *shape[dim:]))


@register(torch.hstack)
def hstack(tensors: Sequence[Value]) -> Value:
    return cat(tensors, 0 if tensors[0].ndim == 1 else 1)


@register(torch.vstack)
def vstack(tensors: Sequence[Value]) -> Value:
    return cat([ops.reshape(t, (1, -1)) if t.ndim < 2 else t for t in tensors], 0)


@register(torch.nn.functional.pad)
def pad(x: Value, pad: Sequence[int], mode: str = "constant", value: float | None = None) -> Value:
    if mode != "constant":
        return ops.extern(torch.nn.functional.pad, x, pad, mode, value)
    if len(pad) % 2 == 0 and len(pad) // 2 <= x.ndim and \
            all(isinstance(p, int) and p <= 0 for p in pad) and not _narrows_below_zero(x, pad):
        # eager's constant_pad_nd: no positive pad is a narrowed clone, in x's layout where dense
        # (F.pad(x.t(), (0, 0)) is transposed in eager)
        narrowed = x
        for i in range(len(pad) // 2):
            dim = x.ndim - 1 - i
            narrowed = ops.slice_dim(narrowed, dim, -pad[2 * i], x.shape[dim] + pad[2 * i + 1])
        from ember.prims.decompositions.elementwise import clone
        return clone(narrowed)
    return ops.emit(P.constant_pad, x, tuple(pad), ops._python_scalar(value or 0, x.dtype))


def _narrows_below_zero(x: Value, pad: Sequence[int]) -> bool:
    """Negative pads that remove more than a dim holds (eager raises: the constant_pad path says so)."""
    return any(not isinstance(x.shape[x.ndim - 1 - i], int) or x.shape[x.ndim - 1 - i] + pad[2 * i] + pad[2 * i + 1] < 0
               for i in range(len(pad) // 2))


@register(torch.constant_pad_nd)
def constant_pad_nd(x: Value, pad: Sequence[int], value: float = 0) -> Value:
    return ops.emit(P.constant_pad, x, tuple(pad), ops._python_scalar(value, x.dtype))


# ---------------------------------------------------------- attribute queries
@register(builtins.getattr, view=True)
def getattr_(x: Any, name: str, *default: Any) -> Any:
    if not is_tensor(x):
        return builtins.getattr(x, name, *default)
    if name == "T":
        return ops.permute(x, list(reversed(range(x.ndim))))
    if name in ("mT", "mH"):
        return ops.transpose(x, -2, -1)
    if name in ("shape",):
        return torch.Size(x.shape) if all(isinstance(s, int) for s in x.shape) else tuple(x.shape)
    if name in ("dtype", "device"):
        return builtins.getattr(x.meta, name)
    if name == "ndim":
        return x.ndim
    return builtins.getattr(x.meta.to_meta_tensor(), name, *default)


@register(T.size)
def size(x: Value, dim: int | None = None) -> Any:
    if dim is None:
        return getattr_(x, "shape")
    return x.shape[ops.normalize_dim(dim, x.ndim)]


@register(T.dim, T.ndimension)
def dim(x: Value) -> int:
    return x.ndim


@register(T.numel, torch.numel)
def numel(x: Value) -> Any:
    return x.numel()


@register(T.stride)
def stride(x: Value, dim: int | None = None) -> Any:
    return tuple(x.meta.stride) if dim is None else x.meta.stride[ops.normalize_dim(dim, x.ndim)]


@register(builtins.len)
def len_(x: Any) -> Any:
    return x.shape[0] if is_tensor(x) else builtins.len(x)
