"""Loop lowerings of the data-movement prims: cat, constant_pad, gather, index, philox_rand.

Each becomes a Pointwise body (so it fuses with what reads it) instead of an eager Extern:

* cat / constant_pad select among their inputs with ``where`` over index ranges.  Every
  branch of a ``where`` is evaluated, so the index a branch loads with is first wrapped into
  its input's range (``wrap_into``): the value is discarded, but the read stays in bounds.
* gather / index (and so embedding) load through ``Indirect`` indices.  Out-of-range
  indices are *clamped* to [0, size - 1]: torch raises an IndexError there, a compiled
  kernel must never read outside its buffer, and raising would need a device-to-host check
  on every call.  Negative indices were already wrapped by the decompositions.
* philox_rand is the counter-based generator of ember/prims/philox.py, element i using
  counter ``offset + i`` (row-major); the code generators render the ``philox_uniform`` op.
"""
from __future__ import annotations

from typing import Any

import torch

from ember.graph import Node
from ember.lower import ir
from ember.lower.ir import Const, Expr, Index, IndexValue, Op


def wrap_into(idx: Index, size: int) -> Index:
    """idx itself where 0 <= idx < size; some in-range index elsewhere (never out of bounds)."""
    lo, hi = idx.bounds()
    if lo >= 0 and hi < size:
        return idx
    shift = (-lo + size - 1) // size * size if lo < 0 else 0    # a multiple of size making idx >= 0
    return (idx + shift) % size


def in_range(idx: Index, start: int, stop: int) -> Expr | None:
    """A bool Expr for start <= idx < stop, or None when the bounds already guarantee it."""
    lo, hi = idx.bounds()
    value = IndexValue(idx, torch.int64)
    tests = []
    if lo < start:
        tests.append(Op("ge", (value, Const(start, torch.int64)), torch.bool))
    if hi >= stop:
        tests.append(Op("lt", (value, Const(stop, torch.int64)), torch.bool))
    if not tests:
        return None
    return tests[0] if len(tests) == 1 else Op("logical_and", tuple(tests), torch.bool)


def clamped_indirect(value: Expr, size: int) -> Index:
    value = value if value.dtype == torch.int64 else ir.Cast(value, torch.int64)
    low = Op("maximum", (value, Const(0, torch.int64)), torch.int64)
    return ir.index(ir.Indirect(Op("minimum", (low, Const(max(size - 1, 0), torch.int64)), torch.int64), size))


def _cat(self, node: Node, tensors: Any, dim: int) -> Any:
    from ember.lower.lowering import TensorValue, _meta
    meta = _meta(node)
    parts = [t for t in tensors if isinstance(t, TensorValue) and t.shape[dim % len(t.shape)] > 0]
    if not parts:
        return self.lower_extern(node)
    dim = dim % len(meta.shape)

    def body(idx: tuple[Index, ...]) -> Expr:
        starts, start = [], 0
        for part in parts:
            starts.append(start)
            start += part.shape[dim]
        value = None
        for part, begin in reversed(list(zip(parts, starts))):
            inner = idx[:dim] + (wrap_into(idx[dim] - begin, part.shape[dim]),) + idx[dim + 1:]
            loaded = _as_dtype(part.load(inner), meta.dtype)
            if value is None:
                value = loaded
                continue
            cond = in_range(idx[dim], begin, begin + part.shape[dim])
            value = loaded if cond is None else Op("where", (cond, loaded, value), meta.dtype)
        return value
    return self.pointwise(node, tuple(meta.shape), meta.dtype, body)


def _constant_pad(self, node: Node, x: Any, pad: Any, value: Any) -> Any:
    from ember.lower.lowering import _meta, _operand
    meta = _meta(node)
    pad = [int(p) for p in pad]
    rank = len(x.shape)

    def body(idx: tuple[Index, ...]) -> Expr:
        if any(s == 0 for s in x.shape):  # nothing to read (and no size to wrap indices into)
            return _operand(value, idx, meta.dtype)
        source, conditions = list(idx), []
        for k in range(len(pad) // 2):
            d = rank - 1 - k
            before = pad[2 * k]
            shifted = idx[d] - before
            cond = in_range(shifted, 0, x.shape[d])
            if cond is not None:
                conditions.append(cond)
            source[d] = wrap_into(shifted, x.shape[d])
        loaded = _as_dtype(x.load(tuple(source)), meta.dtype)
        if not conditions:
            return loaded
        inside = conditions[0]
        for cond in conditions[1:]:
            inside = Op("logical_and", (inside, cond), torch.bool)
        return Op("where", (inside, loaded, _operand(value, idx, meta.dtype)), meta.dtype)
    return self.pointwise(node, tuple(meta.shape), meta.dtype, body)


def _gather(self, node: Node, x: Any, dim: int, index: Any) -> Any:
    from ember.lower.lowering import _meta
    meta = _meta(node)
    if not x.shape:
        return self.lower_extern(node)
    dim = dim % len(x.shape)

    def body(idx: tuple[Index, ...]) -> Expr:
        picked = clamped_indirect(index.load(idx), x.shape[dim])
        return x.load(idx[:dim] + (picked,) + idx[dim + 1:])
    return self.pointwise(node, tuple(meta.shape), meta.dtype, body)


def _index(self, node: Node, x: Any, indices: Any) -> Any:
    """Advanced indexing: indexed dims are replaced by the broadcast index shape (in place when
    the indexed dims are adjacent, first otherwise), as torch/numpy do."""
    from ember.lower.lowering import TensorValue, _meta
    meta = _meta(node)
    indices = list(indices) + [None] * (len(x.shape) - len(indices))
    indexed = [d for d, t in enumerate(indices) if t is not None]
    if not indexed or any(not isinstance(indices[d], TensorValue) for d in indexed):
        return self.lower_extern(node)
    broadcast = tuple(torch.broadcast_shapes(*(indices[d].shape for d in indexed)))
    adjacent = indexed == list(range(indexed[0], indexed[-1] + 1))
    first = indexed[0] if adjacent else 0
    kept = [d for d in range(len(x.shape)) if indices[d] is None]
    if adjacent:
        out_shape = [x.shape[d] for d in kept if d < first] + list(broadcast) + \
            [x.shape[d] for d in kept if d > indexed[-1]]
    else:
        out_shape = list(broadcast) + [x.shape[d] for d in kept]
    if tuple(out_shape) != tuple(meta.shape):
        return self.lower_extern(node)

    def body(idx: tuple[Index, ...]) -> Expr:
        block = idx[first:first + len(broadcast)]
        rest = idx[:first] + idx[first + len(broadcast):]
        source: list[Index] = [ir.const_index(0)] * len(x.shape)
        for d, i in zip(kept, rest):
            source[d] = i
        for d in indexed:
            t = indices[d]
            lead = len(broadcast) - len(t.shape)
            t_idx = tuple(ir.const_index(0) if t.shape[k] == 1 else block[lead + k] for k in range(len(t.shape)))
            source[d] = clamped_indirect(t.load(t_idx), x.shape[d])
        return x.load(tuple(source))
    return self.pointwise(node, tuple(meta.shape), meta.dtype, body)


def _philox_rand(self, node: Node, shape: Any, seed: Any, offset: Any, dtype: torch.dtype, device: Any) -> Any:
    from ember.lower.lowering import TensorValue, _meta
    meta = _meta(node)
    if not isinstance(offset, int):
        return self.lower_extern(node)
    seed_expr = seed.load(()) if isinstance(seed, TensorValue) else Const(int(seed), torch.int64)
    if seed_expr.dtype != torch.int64:
        seed_expr = ir.Cast(seed_expr, torch.int64)

    def body(idx: tuple[Index, ...]) -> Expr:
        counter = IndexValue(ir.linearize(idx, meta.shape) + offset, torch.int64)
        uniform = Op("philox_uniform", (seed_expr, counter), torch.float32)
        return uniform if dtype == torch.float32 else ir.Cast(uniform, dtype)
    return self.pointwise(node, tuple(meta.shape), dtype, body)


def _as_dtype(expr: Expr, dtype: torch.dtype) -> Expr:
    return expr if expr.dtype == dtype else ir.Cast(expr, dtype)


LOWERINGS = {"cat": _cat, "constant_pad": _constant_pad, "gather": _gather, "index": _index,
             "philox_rand": _philox_rand}
