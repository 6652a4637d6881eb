"""Functionalization: in-place ops and views become pure values plus write-backs.

Every tensor of the torch-level graph is an `Alias`: a `Root` (a buffer: an input, or
the result of a non-view op) seen through a chain of view prims (reshape, permute,
slice, expand).  An in-place op on an Alias computes the new value out of place and
writes it back through the chain into the root ("view scatter"), bumping the root's
version; any alias read later re-derives its value from the root's current value.
Views eager makes that are no chain of view prims (diagonal, unfold, as_strided, Extern
views) are a `StorageView`: strides over the root's original storage, read and written
through index maps; bit-casts are an `OpaqueView`.  What cannot be reproduced exactly
(writes through overlapping or bit-cast views, in-place ops eager rejects) raises
`RunEagerly`, and the backend runs the graph eagerly.  At the end, roots of placeholders
whose value changed become extra outputs (`mutated_inputs`); convert.py decides how each
user output aliases inputs and other outputs (`output_sources`).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import torch

from ember.errors import CompileError
from ember.graph import Node, TensorMeta, is_dense
from ember.prims import ops
from ember.prims import primitives as P
from ember.prims.meta import view_strides
from ember.prims.values import Value, current, emit

VIEW_PRIMS = (P.reshape, P.permute, P.expand, P.slice_, P.as_strided, P.detach)


class RunEagerly(CompileError):
    """The graph does something functionalization cannot reproduce exactly (a write through an
    overlapping or bit-cast view, an in-place op eager rejects): the backend runs the graph eagerly."""

    def __init__(self, message: str) -> None:
        super().__init__(message, stage="prims", source_line=current().source_line or "")


@dataclasses.dataclass(eq=False)
class Root:
    current: Value
    original: Value
    placeholder_index: int | None = None
    version: int = 0
    identity: Alias | None = None   # the alias that *is* this tensor (eager's same Python object)


@dataclasses.dataclass(frozen=True)
class ViewStep:
    prim: P.Prim
    args: tuple

    def apply(self, x: Value) -> Value:
        return emit(self.prim, x, *self.args)

    def meta_of(self, meta: TensorMeta) -> TensorMeta:
        return self.prim.infer_meta(meta, *self.args)

    def scatter(self, x: Value, new: Value) -> Value:
        """The new value of x after writing `new` into this view of x."""
        if self.prim is P.reshape:
            return ops.reshape(new, x.shape)
        if self.prim is P.detach:
            return new
        if self.prim is P.permute:
            inverse = [0] * len(self.args[0])
            for i, d in enumerate(self.args[0]):
                inverse[d] = i
            return ops.permute(new, inverse)
        if self.prim is P.slice_:
            return slice_scatter(x, new, *self.args)
        if self.prim is P.expand and all(a == b for a, b in zip(x.shape, self.args[0])):
            return new
        # expand: several elements share one memory location (eager raises); as_strided: opaque
        raise RunEagerly(f"in-place update through a {self.prim.name} view")


@dataclasses.dataclass(frozen=True)
class StorageView:
    """A view given by (size, stride, storage_offset) over the root's storage, as eager's
    diagonal/unfold/as_strided/view-returning Externs make.  It reads and writes the root's
    *logical* value through index maps computed from the root's original layout, so it stays
    exact after the root was updated out of place.  Always the first step of an alias."""

    meta: TensorMeta          # the view's shape/strides/offset in the root's storage
    root_meta: TensorMeta     # the root's original layout (what the strides refer to)

    def meta_of(self, meta: TensorMeta) -> TensorMeta:
        return self.meta

    def _dense_root(self) -> tuple[list[int], bool]:
        """Root dims from slowest to fastest stride, and whether the root is dense."""
        shape, stride = self.root_meta.shape, self.root_meta.stride
        if not all(isinstance(v, int) for v in (*shape, *stride, *self.meta.shape, *self.meta.stride)):
            return [], False
        order = sorted(range(len(shape)), key=lambda d: (-stride[d], -shape[d]))
        return order, is_dense(shape, stride)

    def _flat(self, x: Value, order: list[int]) -> Value:
        return ops.reshape(ops.permute(x, order), (ops.prod_sizes(x.shape),))

    def _positions(self, device: torch.device) -> Value:
        """Index of each view element in the root's storage-ordered flat value."""
        size, stride = self.meta.shape, self.meta.stride
        position = ops.full((), self.meta.storage_offset - self.root_meta.storage_offset, torch.int64, device)
        for dim, (length, step) in enumerate(zip(size, stride)):
            along = ops.iota(length, 0, step, torch.int64, device)
            along = ops.reshape(along, [length if d == dim else 1 for d in range(len(size))])
            position = ops.add(position, along)
        return ops.expand_to(position, tuple(size))

    def apply(self, x: Value) -> Value:
        order, dense = self._dense_root()
        if not dense:
            if x.node.op == "placeholder":      # the untouched input: index its storage directly
                return emit(P.as_strided, x, tuple(self.meta.shape), tuple(self.meta.stride),
                            self.meta.storage_offset)
            raise RunEagerly("a strided view of a non-dense tensor that was updated in place")
        if ops.prod_sizes(self.meta.shape) == 0:
            return ops.full(self.meta.shape, 0, x.dtype, x.device)
        return emit(P.index, self._flat(x, order), [self._positions(x.device)])

    def scatter(self, x: Value, new: Value) -> Value:
        order, dense = self._dense_root()
        if not dense or not non_overlapping(self.meta.shape, self.meta.stride):
            raise RunEagerly("in-place update through a view whose elements overlap in memory")
        if ops.prod_sizes(self.meta.shape) == 0:
            return x
        flat = self._flat(x, order)
        positions = ops.reshape(self._positions(x.device), (-1,))
        updated = emit(P.scatter, flat, 0, positions, ops.reshape(new, (-1,)))
        inverse = [0] * len(order)
        for i, d in enumerate(order):
            inverse[d] = i
        return ops.permute(ops.reshape(updated, [x.shape[d] for d in order]), inverse)


@dataclasses.dataclass(frozen=True)
class OpaqueView:
    """A view eager makes that ember does not model (x.view(torch.int32) reinterprets the bytes).
    Its value (an Extern's copy) is right until its root changes: a later read, a write through
    it, or returning it runs the graph eagerly."""

    meta: TensorMeta

    def meta_of(self, meta: TensorMeta) -> TensorMeta:
        return self.meta

    def apply(self, x: Value) -> Value:
        raise RunEagerly("a bit-cast view read after its base was updated in place")

    def scatter(self, x: Value, new: Value) -> Value:
        raise RunEagerly("in-place update through a bit-cast view")


def non_overlapping(size: tuple, stride: tuple) -> bool:
    """No two elements of the view share a memory location (exact for small views; False when
    unsure)."""
    if not all(isinstance(v, int) for v in (*size, *stride)):
        return False
    dims = sorted((abs(st), n) for n, st in zip(size, stride) if n != 1)
    reach = 0
    for st, n in dims:
        if st <= reach:
            break
        reach += (n - 1) * st
    else:
        return True
    numel = math.prod(size)
    if numel > (1 << 20):
        return False
    positions = np.zeros((), dtype=np.int64)
    for n, st in zip(size, stride):
        positions = np.add.outer(positions, np.arange(n, dtype=np.int64) * st)
    return len(np.unique(positions)) == numel


def memory_overlaps(a: TensorMeta, b: TensorMeta) -> bool:
    """Do two views of one storage share an element?  (True when unsure: symbolic or huge.)"""
    sizes = (*a.shape, *a.stride, *b.shape, *b.stride, a.storage_offset, b.storage_offset)
    if not all(isinstance(v, int) for v in sizes) or a.dtype.itemsize != b.dtype.itemsize:
        return True
    if math.prod(a.shape) == 0 or math.prod(b.shape) == 0:
        return False
    def span(m: TensorMeta) -> tuple[int, int]:
        low = m.storage_offset + sum((n - 1) * st for n, st in zip(m.shape, m.stride) if st < 0)
        high = m.storage_offset + sum((n - 1) * st for n, st in zip(m.shape, m.stride) if st > 0)
        return low, high
    (a_low, a_high), (b_low, b_high) = span(a), span(b)
    if a_high < b_low or b_high < a_low:
        return False
    if math.prod(a.shape) + math.prod(b.shape) > (1 << 20):
        return True
    def positions(m: TensorMeta) -> np.ndarray:
        out = np.full((), m.storage_offset, dtype=np.int64)
        for n, st in zip(m.shape, m.stride):
            out = np.add.outer(out, np.arange(n, dtype=np.int64) * st)
        return out.ravel()
    return bool(np.intersect1d(positions(a), positions(b)).size)


def slice_scatter(x: Value, new: Value, dim: int, start: Any, end: Any, step: Any = 1) -> Value:
    """x with x[..., start:end:step, ...] (along dim) replaced by new."""
    if step == 1:
        # pointwise form (fuses): pad `new` to x's size and select by position
        pad = [0, 0] * (x.ndim - 1 - dim) + [start, x.shape[dim] - end]
        padded = ops.emit(P.constant_pad, new, tuple(pad), ops._python_scalar(0, new.dtype))
        position = ops.iota(x.shape[dim], 0, 1, torch.int64, x.device)
        inside = ops.logical_and(ops.ge(position, start), ops.lt(position, end))
        inside = ops.reshape(inside, [x.shape[dim] if i == dim else 1 for i in range(x.ndim)])
        return ops.where(inside, padded, x)
    index = ops.iota(new.shape[dim], start, step, torch.int64, x.device)
    index = ops.expand_to(ops.reshape(index, [new.shape[dim] if i == dim else 1 for i in range(x.ndim)]),
                          new.shape)
    return emit(P.scatter, x, dim, index, new)


@dataclasses.dataclass(eq=False)
class Alias:
    root: Root
    steps: tuple[ViewStep, ...]
    cached: Value
    cached_version: int

    def extended(self, steps: tuple[ViewStep, ...], value: Value) -> Alias:
        return Alias(self.root, self.steps + steps, value, self.root.version)


def new_root(value: Value, placeholder_index: int | None = None) -> Alias:
    root = Root(value, value, placeholder_index)
    root.identity = Alias(root, (), value, 0)
    return root.identity


def original_meta(alias: Alias) -> TensorMeta:
    """The alias's layout over the root's original storage (strides eager sees)."""
    meta = alias.root.original.meta
    for step in alias.steps:
        meta = step.meta_of(meta)
    return meta


def storage_view(alias: Alias, view_meta: TensorMeta, value: Value) -> Alias:
    """An alias for `value`, a view of alias's root with view_meta's strides over its storage."""
    root = alias.root
    step = StorageView(view_meta, root.original.meta)
    return Alias(root, (step,), value, root.version)


def resolve(alias: Alias) -> Value:
    """The current value of an alias (re-derived from its root after a mutation)."""
    if alias.cached_version != alias.root.version:
        value = alias.root.current
        for step in alias.steps:
            value = step.apply(value)
        alias.cached, alias.cached_version = value, alias.root.version
    fresh = Value(alias.cached.node, alias.cached.meta)
    fresh.alias = alias
    return fresh


def write(alias: Alias, new_value: Value) -> None:
    """In-place update: `alias` now holds new_value (same shape; cast to its dtype here)."""
    target_meta = alias.cached.meta
    new_value = ops.cast(ops.expand_to(new_value, target_meta.shape), target_meta.dtype)
    root = alias.root
    if not alias.steps:
        root.current = new_value
    else:
        inputs = [root.current]
        for step in alias.steps[:-1]:
            inputs.append(step.apply(inputs[-1]))
        value = new_value
        for step, x in zip(reversed(alias.steps), reversed(inputs)):
            value = step.scatter(x, value)
        root.current = value
    root.current = _in_layout(root.current, root.original.meta)
    root.version += 1
    # reads re-derive the alias from the root: its strides stay eager's (x.view(-1), x.contiguous()
    # after x.t()[0].mul_(2) or x.copy_(row) must see x's own layout, not the update's)
    alias.cached, alias.cached_version = root.current, (root.version if not alias.steps else -1)


def _in_layout(value: Value, original: TensorMeta) -> Value:
    """value with the root's original strides: an in-place update never changes a tensor's layout."""
    shape, stride = tuple(original.shape), tuple(original.stride)
    if tuple(value.meta.stride) == stride or tuple(value.meta.shape) != shape or \
            not all(isinstance(v, int) for v in (*shape, *stride)) or not is_dense(shape, stride):
        return value
    return ops.relaid(ops.clone(value), stride)


def view_chain(base: Node, out: Node, emitted: set[Node], base_meta: TensorMeta | None = None
               ) -> tuple[ViewStep, ...] | None:
    """The view prims (emitted by this decomposition) leading from base to out, or None
    when out is not a view of base in eager (a non-view prim, or a reshape that copies).

    base_meta is base's layout in eager (an alias's original_meta): a reshape is a view only if
    eager's strides allow it, and a prim value's own strides may be compact where eager's are not
    (a diagonal's: flatten of it copies in eager, so writes to the result must not reach the root)."""
    steps: list[ViewStep] = []
    node = out
    while node is not base:
        if node not in emitted or node.target not in VIEW_PRIMS:
            return None
        steps.append(ViewStep(node.target, tuple(node.args[1:])))
        node = node.args[0]
    steps.reverse()
    meta = base_meta if base_meta is not None else base.meta
    for step in steps:
        if step.prim is P.reshape and view_strides(meta, step.args[0]) is None:
            return None
        meta = step.meta_of(meta)
    return tuple(steps)


def is_view_of_placeholder(node: Node) -> bool:
    while node.op == "call" and node.target in VIEW_PRIMS:
        node = node.args[0]
    return node.op == "placeholder"
