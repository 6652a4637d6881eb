"""Functionalization: in-place ops and views become pure values plus write-backs.

Every tensor of the torch-level graph is an `Alias`: a `Root` (a buffer: an input, or
the result of a non-view op) seen through a chain of view prims (reshape, permute,
slice, expand).  An in-place op on an Alias computes the new value out of place and
writes it back through the chain into the root ("view scatter"), bumping the root's
version; any alias read later re-derives its value from the root's current value.
At the end, roots of placeholders whose value changed become extra outputs
(`mutated_inputs`), and user outputs that are views of inputs become `output_aliases`.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch

from ember.errors import CompileError
from ember.graph import Node
from ember.prims import ops
from ember.prims import primitives as P
from ember.prims.meta import view_strides
from ember.prims.values import Value, current, emit

VIEW_PRIMS = (P.reshape, P.permute, P.expand, P.slice_, P.as_strided)


@dataclasses.dataclass(eq=False)
class Root:
    current: Value
    original: Value
    placeholder_index: int | None = None
    version: int = 0


@dataclasses.dataclass(frozen=True)
class ViewStep:
    prim: P.Prim
    args: tuple

    def apply(self, x: Value) -> Value:
        return emit(self.prim, x, *self.args)

    def scatter(self, x: Value, new: Value) -> Value:
        """The new value of x after writing `new` into this view of x."""
        if self.prim is P.reshape:
            return ops.reshape(new, x.shape)
        if self.prim is P.permute:
            inverse = [0] * len(self.args[0])
            for i, d in enumerate(self.args[0]):
                inverse[d] = i
            return ops.permute(new, inverse)
        if self.prim is P.slice_:
            return slice_scatter(x, new, *self.args)
        raise CompileError(f"in-place update through a {self.prim.name} view is not supported", stage="prims",
                           op=self.prim.name, source_line=current().source_line or "",
                           hint="clone the tensor before updating it in place")


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
    return Alias(root, (), value, 0)


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


def replay_on_original(alias: Alias) -> Value:
    value = alias.root.original
    for step in alias.steps:
        value = step.apply(value)
    return value


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
    root.version += 1
    alias.cached, alias.cached_version = new_value, root.version


def view_chain(base: Node, out: Node, emitted: set[Node]) -> tuple[ViewStep, ...] | None:
    """The view prims (emitted by this decomposition) leading from base to out, or None
    when out is not a view of base in eager (a non-view prim, or a reshape that copies)."""
    steps: list[ViewStep] = []
    node = out
    while node is not base:
        if node not in emitted or node.target not in VIEW_PRIMS:
            return None
        source = node.args[0]
        if node.target is P.reshape and view_strides(source.meta, node.args[1]) is None:
            return None
        steps.append(ViewStep(node.target, tuple(node.args[1:])))
        node = source
    return tuple(reversed(steps))


def is_view_of_placeholder(node: Node) -> bool:
    while node.op == "call" and node.target in VIEW_PRIMS:
        node = node.args[0]
    return node.op == "placeholder"
