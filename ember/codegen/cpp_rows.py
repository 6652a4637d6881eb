"""Row arrays for the C++ code generator's multi-pass row kernels (see ``RowCache``).

In: a FusedKernel and the private buffers of a Schedule (``private_buffers``).  Out: which values
each pass stores into per-thread row arrays and later passes load, which private buffers live in
row arrays and which are not stored at all; codegen/cpp.py's KernelPrinter prints them.
"""
from __future__ import annotations

import dataclasses

import torch

from ember.lower import ir
from ember.lower.ir import Cast, Const, Expr, Index, Load, Op
from ember.lower.scheduler import FusedKernel, LoopStep, Schedule
from ember.symbolic import hint_of

# a row kernel keeps values that later passes over the same row reuse in per-thread row arrays
# (see RowCache) when a row has at most this many elements (0: never, for A/B runs) ...
ROW_CACHE_ELEMENTS = 16384
# ... and the arrays of one row take at most this many bytes (they stay in L1/L2)
ROW_CACHE_BYTES = 192 * 1024
# a value is kept only if recomputing it costs at least this much (ops, transcendental ones 8)
ROW_CACHE_MIN_COST = 4
MAX_ROW_ARRAYS = 16               # ember::row_scratch's slots (cpp_prelude.py)
EXPENSIVE_OPS = frozenset({
    "exp", "exp2", "expm1", "log", "log1p", "log2", "log10", "sqrt", "rsqrt", "reciprocal", "div", "sin",
    "cos", "tan", "asin", "acos", "atan", "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "erf", "erfc",
    "erfinv", "lgamma", "sigmoid", "pow", "atan2", "hypot", "fmod", "remainder", "floor_divide"})


def private_buffers(sched: Schedule) -> dict[str, str]:
    """Intermediate buffers that only the kernel storing them reads (or nobody): buffer -> kernel.
    Such a kernel may keep them in row arrays, or not store them at all (RowCache)."""
    returned = sched.program.returned_buffers()
    writer: dict[str, str] = {}
    read_elsewhere: set[str] = set()
    for step in sched.steps:
        if isinstance(step, FusedKernel):
            read_elsewhere |= set(step.reads)
            for name in step.writes:
                writer.setdefault(name, step.name)
        else:
            read_elsewhere |= set(step.node.reads())
    return {name: kernel for name, kernel in writer.items()
            if name not in read_elsewhere and name not in returned and name in sched.buffers
            and sched.buffers[name].kind == "intermediate"}


class RowCache:
    """Per-thread arrays that carry values of one row from a pass over it to later passes.

    A row kernel (a softmax after an RMS norm after a layer norm) walks each row once per
    reduction: the general form recomputes in every pass all that the pass's body needs, so the
    forward of benchmarks/train_cpu.py's pointwise block evaluated its erf/exp/sigmoid chain in
    four passes.  Here a value of a later pass that an earlier pass computed already (the
    largest such sub-expressions, of at least ROW_CACHE_MIN_COST) is stored by the earlier pass
    into a row array (``alignas(64) float row_cacheN[row]``, declared in the outer loop: one per
    thread, in L1/L2) and loaded by the later one.  A private buffer (``private_buffers``) that
    only later passes of this kernel read, at the index it is stored at, lives in a row array
    instead of memory; one that nobody reads is not stored at all.  The values and their
    rounding are the same: only where they come from changes."""

    def __init__(self, kernel: FusedKernel, private: set[str]) -> None:
        self.kernel = kernel
        self.arrays: list[tuple[str, torch.dtype, str]] = []      # (C name, value dtype, comment)
        self.available: dict[Expr, tuple[int, str]] = {}          # value -> (step storing it, array)
        self.stored_by: dict[int, list[tuple[Expr, str]]] = {}    # step -> values it stores
        self.private_arrays: dict[str, tuple[str, tuple[Index, ...]]] = {}   # buffer -> (array, index)
        self.dropped: set[str] = set()                            # private buffers nobody reads
        self._per_element: dict[Expr, bool] = {}
        private = private & set(kernel.writes)
        loaded = {ld.buffer for step in kernel.steps for body in _step_bodies(step) for ld in ir.loads(body)}
        self.dropped = private - loaded     # in any kernel: a store nobody reads
        inner = kernel.inner_vars
        # a symbolic row is judged at its hint (no guard): a longer row still runs right, its
        # arrays on the heap (cpp.py), only less of it stays in cache
        if not (ROW_CACHE_ELEMENTS and kernel.outer_vars and inner and 0 < hint_of(kernel.inner_numel) <= ROW_CACHE_ELEMENTS):
            return
        if sum(step.inner for step in kernel.steps) < 2:
            return
        bodies = [b for step in kernel.steps for b in _step_bodies(step)]
        if any(any(True for idx in ir.indices_of(n) for _ in ir.indirect_atoms(idx))
               for body in bodies for n in ir.walk(body)):
            return
        self._plan_private(private - self.dropped)
        self._plan_values()

    def _new_array(self, dtype: torch.dtype, comment: str) -> str | None:
        row = hint_of(self.kernel.inner_numel)
        used = sum(row * _computed_size(t) for _, t, _ in self.arrays)
        if used + row * _computed_size(dtype) > ROW_CACHE_BYTES or len(self.arrays) == MAX_ROW_ARRAYS:
            return None
        name = f"row_cache{len(self.arrays)}"
        self.arrays.append((name, dtype, comment))
        return name

    def _plan_private(self, private: set[str]) -> None:
        """Private buffers stored by an inner step and loaded only by later inner steps at the
        same index: row arrays."""
        inner_vars = set(self.kernel.inner_vars)
        for name in sorted(private):
            stores = [(i, st) for i, step in enumerate(self.kernel.steps) for st in step.stores if st.buffer == name]
            if len(stores) != 1 or not self.kernel.steps[stores[0][0]].inner:
                continue
            position, store = stores[0]
            if not inner_vars <= set().union(*(idx.free_vars() for idx in store.index)):
                continue
            loads = [(i, ld) for i, step in enumerate(self.kernel.steps)
                     for body in _step_bodies(step) for ld in ir.loads(body) if ld.buffer == name]
            if all(i > position and self.kernel.steps[i].inner and ld.index == store.index for i, ld in loads):
                array = self._new_array(store.body.dtype, f"buffer {name}: only later passes of this kernel read it")
                if array is not None:
                    self.private_arrays[name] = (array, store.index)

    def _plan_values(self) -> None:
        computed: list[tuple[int, set[Expr]]] = []
        passes = [position for position, step in enumerate(self.kernel.steps) if step.inner]
        for position, step in enumerate(self.kernel.steps):
            if not step.inner:
                continue

            def reuse(node: Expr) -> bool:
                if node in self.available:
                    return True
                if not self.per_element(node) or self.cost(node) < ROW_CACHE_MIN_COST:
                    return False
                for earlier, nodes in computed:
                    if node in nodes:
                        comment = f"a value of pass {passes.index(earlier) + 1} that later passes reuse"
                        array = self._new_array(node.dtype, comment)
                        if array is None:
                            return False
                        self.available[node] = (earlier, array)
                        self.stored_by.setdefault(earlier, []).append((node, array))
                        return True
                return False
            computed.append((position, _visit(self.bodies(step), reuse)))
        # each value must be computed (not itself loaded from a row array) by the pass storing it
        for position, step in enumerate(self.kernel.steps):
            if step.inner and position in self.stored_by:
                visited = _visit(self.bodies(step), lambda n, p=position: self.reads_cached(n, p))
                if any(node not in visited for node, _ in self.stored_by[position]):
                    self.available.clear()
                    self.stored_by.clear()
                    self.arrays = [a for a in self.arrays if not a[2].startswith("a value")]
                    return

    def bodies(self, step: LoopStep) -> list[Expr]:
        return _step_bodies(step, skip=self.dropped)

    def reads_cached(self, node: Expr, step: int) -> bool:
        """Does pass ``step`` load ``node`` from a row array (an earlier pass stored it)?"""
        entry = self.available.get(node)
        return entry is not None and entry[0] < step

    def per_element(self, node: Expr) -> bool:
        known = self._per_element.get(node)
        if known is None:
            inner = set(self.kernel.inner_vars)
            known = any(inner & idx.free_vars() for idx in ir.indices_of(node)) or \
                any(self.per_element(child) for child in node.children())
            self._per_element[node] = known
        return known

    def cost(self, node: Expr) -> int:
        """Per-element operations to recompute ``node`` from the values in row arrays so far (a
        transcendental counts 8)."""
        total = 0
        for part in _visit([node], lambda n: n is not node and n in self.available):
            if isinstance(part, (Op, Cast)) and self.per_element(part):
                total += 8 if isinstance(part, Op) and part.op in EXPENSIVE_OPS else 1
        return total


def _step_bodies(step: LoopStep, skip: set[str] = frozenset()) -> list[Expr]:
    return [r.body for r in step.reductions] + [st.body for st in step.stores if st.buffer not in skip]


def _visit(bodies: list[Expr], stop) -> set[Expr]:
    """Nodes reached from ``bodies`` top-down, not entering (nor counting) nodes where ``stop`` holds."""
    seen: set[Expr] = set()
    stack = list(bodies)
    while stack:
        node = stack.pop()
        if node in seen or stop(node):
            continue
        seen.add(node)
        stack.extend(node.children())
    return seen


def _computed_size(dtype: torch.dtype) -> int:
    """Bytes of a value as the kernel computes it (bf16/fp16 in float)."""
    return 4 if dtype in (torch.float16, torch.bfloat16) else dtype.itemsize


# ============================================================ one buffer for values read only summed
def combine_stored_terms(sched: Schedule) -> None:
    """Buffers that a kernel stores and that every reader loads only inside one same expression
    of them (``a + b + c * 0.5``: the terms of a norm's input gradient, which the backward of
    benchmarks/train_cpu.py's pointwise block stored as three [16, 256, 1024] buffers, re-read by
    the same kernel's last pass and by the weight gradients' column reduction) -> the kernel
    stores that expression into the first of them, the readers load it, the others are gone.
    Two fewer buffers written and read per element there.  Only float32/float64 buffers of one
    layout, stored at one index by one pass: the loaded value is the expression's value exactly."""
    returned = sched.program.returned_buffers()
    extern_read: set[str] = set()
    for step in sched.steps:
        if not isinstance(step, FusedKernel):
            extern_read |= set(step.node.reads())
    allocations = {plan.allocation for name, plan in sched.buffers.items() if plan.allocation != name}
    writers: dict[str, int] = {}
    for kernel in sched.kernels:
        for name in set(kernel.writes):
            writers[name] = writers.get(name, 0) + 1
    shared = {name for name, count in writers.items() if count > 1}
    for kernel in sched.kernels:
        _combine_in(sched, kernel, returned | extern_read | shared, allocations)


def _combine_in(sched: Schedule, kernel: FusedKernel, excluded: set[str], allocations: set[str]) -> None:
    stores: dict[str, tuple[int, object]] = {}
    counts: dict[str, int] = {}
    for position, step in enumerate(kernel.steps):
        for store in step.stores:
            counts[store.buffer] = counts.get(store.buffer, 0) + 1
            stores[store.buffer] = (position, store)
    candidates = set()
    for name, (position, store) in stores.items():
        plan = sched.buffers.get(name)
        if counts[name] != 1 or plan is None or name in excluded or name in allocations or \
                plan.kind != "intermediate" or plan.dtype not in (torch.float32, torch.float64) or \
                store.body.dtype != plan.dtype:
            continue
        candidates.add(name)
    if len(candidates) < 2:
        return
    readers = [k for k in sched.kernels if candidates & set(k.reads) or k is kernel]
    # each maximal expression of candidate loads (and constants) in the readers' bodies
    forms: dict[str, set[Expr]] = {name: set() for name in candidates}
    for reader in readers:
        for step in reader.steps:
            for body in _step_bodies(step):
                for node, form, index in _occurrences(body, candidates):
                    buffers = {ld.buffer for ld in ir.loads(node) if ld.buffer in candidates}
                    for name in buffers:
                        forms[name].add(form if index is not None else None)
    groups: dict[Expr, set[str]] = {}
    for name, found in forms.items():
        if len(found) == 1 and None not in found:
            form = next(iter(found))
            groups.setdefault(form, set()).add(name)
    for form, group in groups.items():
        members = {ld.buffer for ld in ir.loads(form)}
        if members != group or len(group) < 2 or form.dtype not in (torch.float32, torch.float64):
            continue
        layouts = {(p.shape, p.stride, p.dtype, p.storage_offset) for p in (sched.buffers[n] for n in group)}
        places = {(stores[n][0], stores[n][1].index) for n in group}
        if len(layouts) != 1 or len(places) != 1 or sched.buffers[next(iter(group))].dtype != form.dtype:
            continue
        _apply(sched, kernel, form, group, readers)


def _occurrences(body: Expr, candidates: set[str]):
    """(node, its form with indices dropped, the one index of its loads or None) of each maximal
    sub-expression of ``body`` built only of candidate loads and constants (one load at least)."""
    pure: dict[Expr, bool] = {}
    for node in ir.walk(body):
        if isinstance(node, Load):
            # read at a gathered position (its index loads a tensor): no plain value (fuzz seed 401477)
            pure[node] = node.buffer in candidates and len(ir.loads(node)) == 1
        elif isinstance(node, Const):
            pure[node] = True
        elif isinstance(node, (Op, Cast)):
            pure[node] = all(pure[c] for c in node.children())
        else:
            pure[node] = False
    found = []
    stack, seen = [body], set()
    while stack:
        node = stack.pop()
        if node in seen:
            continue
        seen.add(node)
        if pure[node] and not isinstance(node, Const):
            indices = {ld.index for ld in ir.loads(node)}
            form = ir.map_expr(node, lambda n, args: Load(n.buffer, (), n.dtype) if isinstance(n, Load)
                               else ir.replace_children(n, args))
            found.append((node, form, next(iter(indices)) if len(indices) == 1 else None))
            continue
        if isinstance(node, Load) and node.buffer in candidates:
            found.append((node, node, None))
        stack.extend(node.children())
        # a candidate load inside an index (a gather's position) is no plain value: give up on it
        for idx in ir.indices_of(node):
            for atom in ir.indirect_atoms(idx):
                for ld in ir.loads(atom.value):
                    if ld.buffer in candidates:
                        found.append((ld, ld, None))
    return found


def _apply(sched: Schedule, kernel: FusedKernel, form: Expr, group: set[str], readers: list[FusedKernel]) -> None:
    target = sorted(group)[0]
    position = next(i for i, step in enumerate(kernel.steps) for st in step.stores if st.buffer in group)
    step = kernel.steps[position]
    values = {st.buffer: st.body for st in step.stores if st.buffer in group}
    index = next(st.index for st in step.stores if st.buffer in group)
    combined = ir.map_expr(form, lambda n, args: values[n.buffer] if isinstance(n, Load)
                           else ir.replace_children(n, args))
    new_stores, placed = [], False
    for st in step.stores:
        if st.buffer not in group:
            new_stores.append(st)
        elif not placed:
            new_stores.append(dataclasses.replace(st, buffer=target, index=index, body=combined))
            placed = True
    step.stores = new_stores
    for reader in readers:
        for rstep in reader.steps:
            for red in rstep.reductions:
                red.body = _replace_occurrences(red.body, form, group, target)
            for st in rstep.stores:
                st.body = _replace_occurrences(st.body, form, group, target)
        loaded = {ld.buffer for s in reader.steps for b in _step_bodies(s) for ld in ir.loads(b)}
        reader.reads = [name for name in reader.reads if name not in group or name in loaded]
        if target in loaded and target not in reader.reads and reader is not kernel:
            reader.reads.append(target)
    kernel.writes = [name for name in kernel.writes if name not in group or name == target]
    for name in group - {target}:
        del sched.buffers[name]


def _replace_occurrences(body: Expr, form: Expr, group: set[str], target: str) -> Expr:
    replacements = {node: Load(target, index, form.dtype)
                    for node, node_form, index in _occurrences(body, group) if node_form is form}
    if not replacements:
        return body
    return ir.map_expr(body, lambda n, args: replacements.get(n) or ir.replace_children(n, args))
