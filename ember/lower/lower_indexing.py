"""Loop lowerings of the data-movement prims: cat, constant_pad, gather, index, philox_rand, and
2-D max pooling's pool_argmax / pool_select / pool_scatter.

Each becomes a Pointwise body (so it fuses with what reads it) instead of an eager Extern:

* cat / constant_pad select among their inputs with ``where`` over index ranges.  Every
  branch of a ``where`` is evaluated, so the index a branch loads with is first wrapped into
  its input's range (``wrap_into``): the value is discarded, but the read stays in bounds.
* gather / index (and so embedding) load through ``Indirect`` indices, each checked
  (``check_index``): an out-of-range index raises eager's exception (IndexError for
  indexing, RuntimeError for gather) on CPU and is a device-side assert on CUDA; the
  kernel never reads outside its buffer.  Negative indices were already wrapped by the
  decompositions where eager allows them.
* philox_rand is the counter-based generator of ember/prims/philox.py, element i using
  counter ``offset + i`` (row-major); the code generators render the ``philox_uniform`` op.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from ember.graph import Node
from ember.lower import ir
from ember.lower.ir import Const, Expr, Index, IndexValue, Op
from ember.prims.meta import broadcast_shapes
from ember.symbolic import is_symbolic


def wrap_into(idx: Index, size: int) -> Index:
    """idx itself where 0 <= idx < size; some in-range index elsewhere (never out of bounds)."""
    lo, hi = idx.bounds()
    if lo >= 0 and hi < size:
        return idx
    if lo >= 0:
        shift = 0
    elif is_symbolic(lo) or is_symbolic(size):
        shift = -lo * size          # a multiple of size >= -lo, without a division of sizes
    else:
        shift = (-lo + size - 1) // size * size    # the smallest multiple of size making idx >= 0
    return (idx + shift) % size


def _int_value(value: Any) -> Expr:
    """An int64 constant, or a size read at run time (dynamic shapes)."""
    return IndexValue(ir.const_index(value), torch.int64) if is_symbolic(value) else Const(value, torch.int64)


def in_range(idx: Index, start: int, stop: int) -> Expr | None:
    """A bool Expr for start <= idx < stop, or None when the bounds already guarantee it."""
    lo, hi = idx.bounds()
    value = IndexValue(idx, torch.int64)
    tests = []
    if lo < start:
        tests.append(Op("ge", (value, _int_value(start)), torch.bool))
    if hi >= stop:
        tests.append(Op("lt", (value, _int_value(stop)), torch.bool))
    if not tests:
        return None
    return tests[0] if len(tests) == 1 else Op("logical_and", tuple(tests), torch.bool)


# ------------------------------------------------------------ bounds checks of indirect indices
# check_index(index, size, code, reported) -> index: an out-of-range index is an error, as in eager.
# The C++ kernel records the first bad one and the host raises after the kernel; a Triton kernel
# asserts on the device (CUDA) or raises from the interpreter.  ``code`` packs what the error
# says: dim * 4 + WRAPPED (negatives were wrapped before the check: ``reported`` is the index
# as written) + RUNTIME_ERROR (gather/scatter raise RuntimeError, indexing IndexError).
RUNTIME_ERROR, WRAPPED = 1, 2


def checked_indirect(self: Any, value: Expr, size: int, dim: int, runtime_error: bool = False) -> Index:
    """An Indirect index whose value is checked against [0, size) in the kernel."""
    value = value if value.dtype == torch.int64 else ir.Cast(value, torch.int64)
    reported = _index_before_wrapping(self, value, size)
    code = dim * 4 + (RUNTIME_ERROR if runtime_error else 0) + (WRAPPED if reported is not None else 0)
    checked = Op("check_index", (value, _int_value(size), Const(code, torch.int64),
                                 reported if reported is not None else value), torch.int64)
    return ir.index(ir.Indirect(checked, size))


def index_error(value: int, size: int, code: int) -> Exception:
    """The exception eager PyTorch raises for this out-of-range index (CPU tensors)."""
    dim = code // 4
    if code & RUNTIME_ERROR:
        return RuntimeError(f"index {value} is out of bounds for dimension {dim} with size {size}")
    if code & WRAPPED:
        return IndexError(f"index {value} is out of bounds for dimension {dim} with size {size}")
    return IndexError(f"index out of range in self (index {value}, dimension {dim} with size {size})")


def has_index_check(expr: Expr) -> bool:
    """Does expr (or an index it loads through) check an indirect index?"""
    for node in ir.walk(expr):
        if isinstance(node, Op) and node.op == "check_index":
            return True
        for idx in ir.indices_of(node):
            if any(has_index_check(atom.value) for atom in ir.indirect_atoms(idx)):
                return True
    return False


def _index_before_wrapping(self: Any, value: Expr, size: int) -> Expr | None:
    """``a`` when value is ``where(a < 0, a + size, a)`` (the decompositions' negative wrapping,
    possibly through pointwise nodes not yet fused), so the error names the index as written."""
    value = _body_of(self, value)
    if not (isinstance(value, Op) and value.op == "where"):
        return None
    cond, wrapped, original = (_body_of(self, a) for a in value.args)
    if not (isinstance(cond, Op) and cond.op == "lt" and isinstance(wrapped, Op) and wrapped.op == "add"):
        return None
    zero, shift = _body_of(self, cond.args[1]), _body_of(self, wrapped.args[1])
    if (isinstance(zero, Const) and zero.value == 0 and isinstance(shift, Const) and shift.value == size
            and _body_of(self, cond.args[0]) is original and _body_of(self, wrapped.args[0]) is original):
        return value.args[2]
    return None


def _body_of(self: Any, expr: Expr) -> Expr:
    """A Load of a pointwise node, replaced by that node's body at the load's index."""
    if isinstance(expr, ir.Load):
        node = self.nodes.get(expr.buffer)
        if isinstance(node, ir.Pointwise) and len(node.vars) == len(expr.index):
            return ir.substitute(node.body, dict(zip(node.vars, expr.index)))
    return expr


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


# ------------------------------------------------------------ 2-D max pooling (pooling.py)
def _all(conditions: list[Expr | None]) -> Expr | None:
    present = [c for c in conditions if c is not None]
    if not present:
        return None
    result = present[0]
    for c in present[1:]:
        result = Op("logical_and", (result, c), torch.bool)
    return result


def _pool_static(x: Any, *sizes: Any) -> bool:
    return all(isinstance(s, int) for s in (*x.shape[-2:], *sizes))


def _pool_argmax(self, node: Node, x: Any, kernel: Any, stride: Any, padding: Any, dilation: Any,
                 ceil_mode: bool, dtype: torch.dtype) -> Any:
    """Eager's scan of each window, tap by tap in row-major order: a tap inside the input is taken
    when it is greater than the best so far or NaN, or when it is the first inside (the index of a
    window of -inf); the index is h * width + w."""
    from ember.lower.lowering import _meta
    meta = _meta(node)
    height, width = x.shape[-2:]
    if not _pool_static(x, *meta.shape[-2:]):
        return self.lower_extern(node)
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32

    def body(idx: tuple[Index, ...]) -> Expr:
        best, arg = Const(-math.inf, compute), Const(-1, torch.int64)
        for i in range(kernel[0]):
            for j in range(kernel[1]):
                h = idx[-2] * stride[0] + (i * dilation[0] - padding[0])
                w = idx[-1] * stride[1] + (j * dilation[1] - padding[1])
                inside = _all([in_range(h, 0, height), in_range(w, 0, width)])
                value = _as_dtype(x.load(idx[:-2] + (wrap_into(h, height), wrap_into(w, width))), compute)
                if i == j == 0:
                    taken = inside
                else:
                    first = Op("eq", (arg, Const(-1, torch.int64)), torch.bool)
                    greater = Op("logical_or", (Op("gt", (value, best), torch.bool),
                                                Op("isnan", (value,), torch.bool)), torch.bool)
                    taken = _all([inside, Op("logical_or", (greater, first), torch.bool)])
                position = IndexValue(h * width + w, torch.int64)
                if taken is None:
                    best, arg = value, position
                else:
                    best = Op("where", (taken, value, best), compute)
                    arg = Op("where", (taken, position, arg), torch.int64)
        return _as_dtype(arg, dtype)
    return self.pointwise(node, tuple(meta.shape), dtype, body)


def _pool_select(self, node: Node, x: Any, index: Any, *window: Any) -> Any:
    """x at each window's position (an index pool_argmax made: always inside the plane)."""
    from ember.lower.lowering import _meta
    meta = _meta(node)
    height, width = x.shape[-2:]
    if not _pool_static(x):
        return self.lower_extern(node)

    def body(idx: tuple[Index, ...]) -> Expr:
        position = _as_dtype(index.load(idx), torch.int64)
        row = Op("floor_divide", (position, Const(width, torch.int64)), torch.int64)
        col = Op("remainder", (position, Const(width, torch.int64)), torch.int64)
        return x.load(idx[:-2] + (ir.index(ir.Indirect(row, height)), ir.index(ir.Indirect(col, width))))
    return self.pointwise(node, tuple(meta.shape), meta.dtype, body)


def _pool_scatter(self, node: Node, grad: Any, index: Any, height: Any, width: Any, kernel: Any, stride: Any,
                  padding: Any, dilation: Any) -> Any:
    """Input position (h, w) adds the gradients of the windows whose tap (i, j) lies on it and whose
    index names it: window oh = (h + padding - i * dilation) / stride where that is whole and in
    range.  Added in fp32 in the windows' order and rounded once, as eager's CUDA kernels accumulate."""
    from ember.lower.lowering import _meta
    meta = _meta(node)
    out_h, out_w = grad.shape[-2:]
    if not _pool_static(grad, height, width):
        return self.lower_extern(node)
    compute = torch.float64 if grad.dtype == torch.float64 else torch.float32

    def window_of(i: Index, tap: int, dim: int, count: int) -> tuple[Expr | None, Index]:
        shifted = i + (padding[dim] - tap * dilation[dim])
        on_stride = Op("eq", (IndexValue(shifted % stride[dim], torch.int64), Const(0, torch.int64)), torch.bool)
        valid = _all([in_range(shifted, 0, (count - 1) * stride[dim] + 1), on_stride])
        return valid, wrap_into(shifted // stride[dim], count)

    def body(idx: tuple[Index, ...]) -> Expr:
        here = IndexValue(idx[-2] * width + idx[-1], torch.int64)
        total: Expr = Const(0.0, compute)
        for i in reversed(range(kernel[0])):         # windows in eager's order: oh, then ow ascending
            valid_h, oh = window_of(idx[-2], i, 0, out_h)
            for j in reversed(range(kernel[1])):
                valid_w, ow = window_of(idx[-1], j, 1, out_w)
                at = idx[:-2] + (oh, ow)
                named = Op("eq", (_as_dtype(index.load(at), torch.int64), here), torch.bool)
                hit = _all([valid_h, valid_w, named])
                term = _as_dtype(grad.load(at), compute)
                total = Op("add", (total, Op("where", (hit, term, Const(0.0, compute)), compute)), compute)
        return _as_dtype(total, meta.dtype)
    return self.pointwise(node, tuple(meta.shape), meta.dtype, body)


def _gather(self, node: Node, x: Any, dim: int, index: Any) -> Any:
    from ember.lower.lowering import _meta
    meta = _meta(node)
    if not x.shape:
        return self.lower_extern(node)
    dim = dim % len(x.shape)
    if x.shape[dim] in (0, 1):
        # no element to read: eager raises (or returns empty); one element: a size-1 dim takes no
        # part in addresses, so an in-kernel check of the index would be dropped with it
        return self.lower_extern(node)

    def body(idx: tuple[Index, ...]) -> Expr:
        picked = checked_indirect(self, index.load(idx), x.shape[dim], dim, runtime_error=True)
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
    broadcast = broadcast_shapes(*(indices[d].shape for d in indexed))   # symbolic sizes stay symbols
    adjacent = indexed == list(range(indexed[0], indexed[-1] + 1))
    first = indexed[0] if adjacent else 0
    kept = [d for d in range(len(x.shape)) if indices[d] is None]
    if adjacent:
        out_shape = [x.shape[d] for d in kept if d < first] + list(broadcast) + \
            [x.shape[d] for d in kept if d > indexed[-1]]
    else:
        out_shape = list(broadcast) + [x.shape[d] for d in kept]
    if tuple(out_shape) != tuple(meta.shape) or any(x.shape[d] in (0, 1) for d in indexed):
        return self.lower_extern(node)     # (size 1: see _gather)

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
            source[d] = checked_indirect(self, t.load(t_idx), x.shape[d], d)
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
             "pool_argmax": _pool_argmax, "pool_select": _pool_select, "pool_scatter": _pool_scatter,
             "philox_rand": _philox_rand}
