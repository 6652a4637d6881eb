"""C++/OpenMP code generator: a Schedule's FusedKernels -> one readable .cpp.

Each FusedKernel becomes one ``extern "C" void kernelN(...)`` taking a pointer
per buffer it touches (inputs ``const T* __restrict__``, outputs ``T*``).
Strides and sizes are baked in as constants.  The outer loop nest is
OpenMP-parallel when the work is large enough; inner loops carry
``#pragma omp simd`` so g++ vectorizes them.  bf16/fp16 are stored as
uint16_t and computed in float (rounded once on store); sums accumulate in
float (double for float64, int64 for integers); variance is one pass of shifted Welford per
row (``emit_welford_lanes``; two passes for a reduction over a whole tensor).
An indirect index is checked (``ember_check_index``): the first out-of-range one
is recorded in the error record the caller passes as the kernel's last argument
(``int64_t* ember_error``, one per calling thread) and the host raises eager's
exception after the kernel (``cpp_build.index_checked``); the load reads element 0.
A reduction over the rows of column-contiguous data (weight and bias gradients) is emitted
column-tiled instead: see ``is_column_reduction`` and ``KernelPrinter.emit_column_reduction``.
A kernel with several passes over each row carries values between them in per-thread row arrays
(codegen/cpp_rows.py).  A pointwise kernel's innermost loop runs as several ranges where comparisons
or wrap-arounds of its var change along it (a concatenation: ``KernelPrinter.innermost_segments``),
and a column sum of what a pointwise kernel stores, or a row kernel's pass computes, is folded into
it (``fuse_column_sums``).
"""
from __future__ import annotations

import dataclasses
import math
import re

import torch

from ember.codegen.cpp_externs import apply_matmul_policy
from ember.codegen.cpp_prelude import PRELUDE, VECTOR_PRELUDE
from ember.codegen.cpp_rows import RowCache, combine_stored_terms, private_buffers
from ember.errors import CompileError
from ember.lower import ir
from ember.lower.ir import Cast, Const, Expr, Index, IndexValue, Load, Op
from ember.symbolic import as_size, c_code, hint_of, is_symbolic, known_equal, printing_c
from ember.lower.lower_indexing import has_index_check
from ember.lower.scheduler import BufferPlan, FusedKernel, KernelReduction, KernelStore, LoopStep, Schedule

# work (elements x ops) below which a kernel runs serially: thread start-up costs more
PARALLEL_THRESHOLD = 1 << 15
# adjacent columns reduced together by a column-tiled reduction (0: never column-tile, for A/B runs)
COLUMN_TILE = 64
# ... and at most this many bytes of accumulators per tile: wider tiles, as many as the threads
# need (``column_tile``), walk each row's memory in longer runs (a 64-column tile read 256 bytes of
# every 4 KB row, a page each: the pointwise block's weight gradients 113 -> 96 ms a training step
# with 512-column tiles, A/B in one process).  0: COLUMN_TILE columns always
COLUMN_TILE_BYTES = 16384
COLUMN_REDUCTIONS = ("sum", "max", "min", "prod")
# a pointwise kernel's innermost loop split into ranges at the points where a comparison of its var
# or a wrap-around (% d, // d) changes (KernelPrinter.innermost_segments): at most this many ranges,
# each at least SEGMENT_MIN long (0: never split, for A/B runs)
SEGMENTS_MAX = 8
SEGMENT_MIN = 16
# a column sum (a Linear's bias gradient: the output gradient summed over its rows) computed by the
# pointwise kernel that stores what it adds up, when that kernel comes right before it
# (fuse_column_sums); False: a kernel of its own, for A/B runs
FUSE_COLUMN_SUMS = True
# float exp through the prelude's ember_expf, vectorized for every input, where its argument may be
# far below zero: a masked value (-inf) or one minus a row's max (softmax, logsumexp).  libmvec's
# expf goes lane by lane there (5-12x slower), but is faster in the plain range (1.15 vs 1.9
# ns/element on a Zen 1 host), so other exps keep it.  False: libmvec's everywhere, for A/B runs.
INLINE_EXPF = True
# split each pass over a row across threads when there are too few rows (KernelPrinter.splits_rows).
# Off: on the loaded 2-core dev VM the split form was slower (3 rows of 4M: sum 48.5 vs 15.5 ms,
# softmax 281 vs 249 ms, benchmarks/RESULTS.md session 10); not measured on a quiet or larger host
SPLIT_ROWS = False
# running (mean, M2) pairs of a one-pass variance in float (KernelPrinter.emit_welford_lanes; half as
# many in double): 2 AVX2 vectors.  32 were 2x slower (g++ kept them in memory); 0: the two-pass form,
# for A/B runs
WELFORD_LANES = 16
# one buffer for the terms that every reader only adds up (codegen/cpp_rows.py combine_stored_terms;
# False: each term its own buffer, for A/B runs)
COMBINE_STORED_TERMS = True
# the innermost loop through the prelude's own vector types (VECTOR_PRELUDE, issue #13): float lanes
# loaded and stored whole, a masked tail, the vector math of known accuracy.  Where every value that
# changes along the loop is float32/bf16/fp16, read and written contiguously, and made of the ops in
# VECTOR_OPS: the innermost loop of a pointwise kernel and a row pass (sum/max/min, stores, row
# arrays) over a kernel's one inner var (KernelPrinter.vector_loop_fits).  The rest keeps the
# scalar loop that g++ vectorizes itself.
# None (the default): only loops that call exp/log/erf/tanh/sigmoid, and only where the build has
# no libmvec (EMBER_USE_LIBMVEC undefined: glibc before 2.35, other C libraries), both forms printed
# under #ifndef.  There g++ leaves such a loop scalar (a bf16 GELU 30.3 -> 11.4 ms on the vector
# types, 1 thread on the Zen 1 dev host); with libmvec g++'s own loops were as fast or faster
# (A/B, 1 thread: fp32 0.98-1.01x; bf16 GELU and RMS norm 1.6x, softmax 1.2x slower on the vector
# types: g++ converts 16 bf16 lanes a step, two libmvec calls a loop; masked tails cost more than its
# scalar ones).  True: the vector form wherever it fits, False: never (A/B runs, tests)
VECTOR_TYPES: bool | None = None
VECTOR_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
VECTOR_OPS = {
    "add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})", "div": "({0} / {1})", "neg": "(-{0})",
    "maximum": "ember::vec_max({0}, {1})", "minimum": "ember::vec_min({0}, {1})", "abs": "ember::vec_abs({0})",
    "exp": "ember::vec_libm_exp({0})", "log": "ember::vec_libm_log({0})", "tanh": "ember::vec_libm_tanh({0})",
    "erf": "ember::vec_libm_erf({0})", "sigmoid": "ember::vec_libm_sigmoid({0})", "sqrt": "ember::vec_sqrt({0})",
    "rsqrt": "(1.0f / ember::vec_sqrt({0}))", "reciprocal": "(1.0f / {0})",
}
# ops whose scalar form only vectorizes through libmvec's SIMD variants
VECTOR_LIBM_OPS = frozenset({"exp", "log", "tanh", "erf", "sigmoid"})
VECTOR_REDUCTIONS = {"sum": ("0.0f", "ember::vec_sum"), "max": ("-INFINITY", "ember::vec_reduce_max"),
                     "min": ("INFINITY", "ember::vec_reduce_min")}
STORAGE_TYPE = {
    torch.float32: "float", torch.float64: "double", torch.float16: "uint16_t", torch.bfloat16: "uint16_t",
    torch.int8: "int8_t", torch.uint8: "uint8_t", torch.int16: "int16_t", torch.int32: "int32_t",
    torch.int64: "int64_t", torch.bool: "bool",
}
# a bool tensor's pointer is read and written as bytes (torch stores 0 or 1): g++ has no vector
# type for bool loads and left every loop reading a mask scalar (a causal softmax 3x slower)
POINTER_TYPE = {**STORAGE_TYPE, torch.bool: "uint8_t"}
LOW_PRECISION = (torch.float16, torch.bfloat16)


def compute_type(dtype: torch.dtype) -> str:
    if dtype in LOW_PRECISION:
        return "float"
    try:
        return STORAGE_TYPE[dtype]
    except KeyError:
        raise CompileError(f"dtype {dtype} is not supported by the C++ backend", stage="codegen") from None


def generate_cpp(sched: Schedule, size_args: dict[str, list[str]] | None = None) -> str:
    """The whole translation unit: prelude + one function per kernel.  ``size_args`` (if given)
    gets, per kernel, the size symbols it takes after its pointers (dynamic shapes).  The CPU's
    policy for the Schedule's Externs is applied here too (codegen/cpp_externs.py: bf16/fp16
    matrix products in float32 where that is faster)."""
    apply_matmul_policy(sched)
    if COMBINE_STORED_TERMS:
        combine_stored_terms(sched)
    column_sums = fuse_column_sums(sched) if FUSE_COLUMN_SUMS else {}
    kernels = []
    private = private_buffers(sched)
    for kernel in sched.kernels:
        mine = {name for name, writer in private.items() if writer == kernel.name}
        printer = KernelPrinter(kernel, sched.buffers, mine, column_sums.get(kernel.name, []))
        with printing_c():
            kernels.append(printer.render())
        if size_args is not None:
            size_args[kernel.name] = printer.size_args
    body = "\n".join(kernels)
    headers = sorted({header for use, header in OPTIONAL_HEADERS if use in body})
    vector_types = ""
    if "ember::vec_" in body:   # (parsed only where a form that uses it is compiled)
        vector_types = VECTOR_PRELUDE if VECTOR_TYPES else f"#ifndef EMBER_USE_LIBMVEC\n{VECTOR_PRELUDE}#endif\n"
    return "\n".join(["// Generated by ember (codegen/cpp.py).  One function per fused kernel.",
                      *(f"#include {header}" for header in headers), PRELUDE, vector_types, body])


# standard headers that the kernels include only where they use them: <limits> alone took 18 ms of
# a 0.27 s build (the prelude's own needs are g++ builtins)
OPTIONAL_HEADERS = (("std::numeric_limits", "<limits>"), ("omp_get_", "<omp.h>"),
                    ("std::max<", "<algorithm>"), ("std::min<", "<algorithm>"))   # symbolic.py's c_code


def checks_indices(kernel: FusedKernel) -> bool:
    """Does the kernel check indirect indices (its launcher must then look at the error record)?"""
    for step in kernel.steps:
        bodies = [r.body for r in step.reductions] + [st.body for st in step.stores]
        if any(has_index_check(body) for body in bodies):
            return True
    return False


def flat_address(plan: BufferPlan, index: tuple[Index, ...]) -> Index:
    """The element offset of a logical index into a buffer, from its strides."""
    flat = ir.const_index(0)
    for idx, stride, size in zip(index, plan.stride, plan.shape):
        if not known_equal(size, 1):     # (a size that may be 1 indexes 0 there: no guard needed)
            flat = flat + idx * as_size(stride)
    return flat


def is_column_reduction(kernel: FusedKernel, buffers: dict[str, BufferPlan]) -> bool:
    """Is the kernel a reduction down the columns of a row-major layout (the weight and bias
    gradients of a norm or linear layer: sums over the batch rows of [rows, features])?

    That is: one inner step of sum/max/min/prod and nothing else inside the inner loops, stores
    only after it, and loads contiguous along the last outer (kept) var but not along the last
    inner (reduced) var.  Loads that do not depend on the last outer var (per-row values such as
    a mean) do not count."""
    if not COLUMN_TILE or not kernel.outer_vars or not kernel.inner_vars or checks_indices(kernel):
        return False
    first, *rest = kernel.steps
    if not first.inner or first.stores or not first.reductions or any(step.inner for step in rest):
        return False
    if any(red.reduction_type not in COLUMN_REDUCTIONS for red in first.reductions):
        return False
    column, row = kernel.outer_vars[-1], kernel.inner_vars[-1]
    contiguous_along_columns = False
    for red in first.reductions:
        for load in ir.loads(red.body):
            if load.buffer not in buffers:
                continue
            flat = flat_address(buffers[load.buffer], load.index)
            if column not in flat.free_vars():
                continue
            coefficients = {atom: coeff for atom, coeff in flat.terms if isinstance(atom, ir.Var)}
            if coefficients.get(row) == 1:
                return False
            contiguous_along_columns |= coefficients.get(column) == 1
    return contiguous_along_columns


_COMPARISONS = {"lt": lambda a, b: a < b, "le": lambda a, b: a <= b, "gt": lambda a, b: a > b,
                "ge": lambda a, b: a >= b, "eq": lambda a, b: a == b, "ne": lambda a, b: a != b}
_MIRRORED = {"lt": "gt", "gt": "lt", "le": "ge", "ge": "le", "eq": "eq", "ne": "ne"}   # a op b == b mirrored a


def _unit_offset(idx: Index, var: ir.Var) -> int | None:
    """k where ``idx`` is ``var + k`` (nothing else), else None."""
    if len(idx.terms) == 1 and idx.terms[0] == (var, 1) and isinstance(idx.const, int):
        return idx.const
    return None


def _integer_operand(node: Expr) -> Index | None:
    """The Index an integer comparison operand stands for (an IndexValue or an integer Const)."""
    if isinstance(node, Cast) and not node.dtype.is_floating_point and node.dtype != torch.bool:
        node = node.arg
    if isinstance(node, IndexValue) and not node.dtype.is_floating_point and \
            not any(True for _ in ir.indirect_atoms(node.index)):    # (a gathered value's bounds are no promise)
        return node.index
    if isinstance(node, Const) and isinstance(node.value, int) and not isinstance(node.value, bool):
        return ir.const_index(node.value)
    return None


def _known_comparison(op: str, left: Index | None, right: Index | None) -> bool | None:
    """The answer of ``left op right`` wherever both stay within their bounds, if it is one."""
    if left is None or right is None:
        return None
    (llo, lhi), (rlo, rhi) = left.bounds(), right.bounds()
    if not all(isinstance(v, int) for v in (llo, lhi, rlo, rhi)):
        return None
    if op in ("eq", "ne"):
        if lhi < rlo or rhi < llo:
            return op == "ne"
        if llo == lhi == rlo == rhi:
            return op == "eq"
        return None
    compare = _COMPARISONS[op]      # monotone in each operand: the corners decide
    answers = {compare(a, b) for a in (llo, lhi) for b in (rlo, rhi)}
    return answers.pop() if len(answers) == 1 else None


def _segment_cuts(node: Expr, var: ir.Var, indices: list[Index]) -> list[int]:
    """Values of ``var`` at which ``node`` (a comparison of ``var + k`` with a constant) or one of
    ``indices`` (the addresses ``node`` reads at, holding ``(var + k) % d`` or ``(var + k) // d``)
    changes its rule; [] if none."""
    cuts = []
    if isinstance(node, Op) and node.op in _COMPARISONS and len(node.args) == 2:
        left, right = (_integer_operand(arg) for arg in node.args)
        if left is not None and right is not None:
            for moving, fixed in ((left, right), (right, left)):
                offset = _unit_offset(moving, var)
                if offset is not None and fixed.is_constant() and isinstance(fixed.const, int):
                    # var + offset against c: var < c - offset and var >= c - offset differ (lt, ge),
                    # var <= c - offset and var > c - offset (le, gt), eq and ne both
                    point = fixed.const - offset
                    cuts += {"lt": [point], "ge": [point], "le": [point + 1], "gt": [point + 1]}.get(
                        node.op if moving is left else _MIRRORED[node.op], [point, point + 1])
    for idx in indices:
        for atom in _all_atoms(idx):
            if isinstance(atom, (ir.ModIndex, ir.FloorDiv)) and isinstance(atom.divisor, int):
                offset = _unit_offset(atom.arg, var)
                if offset is not None:
                    first = -offset % atom.divisor
                    cuts += range(first, var.size, atom.divisor)[:SEGMENTS_MAX + 1]
    return cuts


def _all_atoms(idx: Index):
    for atom in idx.atoms():
        yield atom
        if isinstance(atom, (ir.ModIndex, ir.FloorDiv)):
            yield from _all_atoms(atom.arg)


def segment_steps(steps: list[LoopStep], var: ir.Var, start: int, stop: int) -> tuple[ir.Var, list[LoopStep]]:
    """``steps`` with ``var`` restricted to [start, stop): a var of that length (same name) plus
    ``start`` substituted, and each comparison with a constant that now has one answer folded."""
    local = ir.Var(var.name, stop - start)
    mapping = {var: ir.index(local) + start}
    out = []
    for step in steps:
        stores = [dataclasses.replace(store, index=tuple(i.substitute(mapping) for i in store.index),
                                      body=fold_known_comparisons(ir.substitute(store.body, mapping)))
                  for store in step.stores]
        out.append(dataclasses.replace(step, stores=stores))
    return local, out


def fold_known_comparisons(expr: Expr) -> Expr:
    """Comparisons of integer indices whose answer the indices' bounds decide -> constants, and
    the ``where``s and logical ops they decide -> the chosen operand."""
    def fold(node: Expr, args: tuple[Expr, ...]) -> Expr:
        node = ir.replace_children(node, args)
        if not isinstance(node, Op):
            return node
        if node.op in _COMPARISONS and len(args) == 2:
            answer = _known_comparison(node.op, *(_integer_operand(arg) for arg in args))
            return node if answer is None else Const(answer, node.dtype)
        known = [arg.value if isinstance(arg, Const) and isinstance(arg.value, bool) else None for arg in args]
        if node.op == "where" and known[0] is not None:
            chosen = args[1] if known[0] else args[2]
            return chosen if chosen.dtype == node.dtype else node
        if node.op in ("logical_and", "logical_or") and node.dtype == torch.bool:
            absorbing = node.op == "logical_or"      # True absorbs an or, False an and
            if absorbing in known:
                return Const(absorbing, torch.bool)
            if known[0] is not None and args[1].dtype == torch.bool:
                return args[1]
            if known[1] is not None and args[0].dtype == torch.bool:
                return args[0]
        return node
    return ir.map_expr(expr, fold)


@dataclasses.dataclass
class ColumnSum:
    """A column-sum kernel folded into a pointwise or row kernel (``fuse_column_sums``)."""

    reduction: KernelReduction      # a float32 sum, as the sum kernel had it
    value: Expr                     # the element in the kernel's vars (stored, loaded or computed in its pass)
    column: ir.Var                  # the sum kernel's column var: ``finish`` is over it
    finish: list[LoopStep]          # the sum kernel's stores of its results (Loads of the reduction)
    step: int | None = None         # a row kernel's pass (index in its steps) that adds it up


def fuse_column_sums(sched: Schedule) -> dict[str, list[ColumnSum]]:
    """Fold each column-sum kernel into a pointwise kernel that stores or reads, element for
    element, what it adds up, or into a row kernel whose pass over the columns has every value
    it adds up at hand (``_column_sums_of``): that kernel adds each such value to its thread's
    partial sums as well, and the threads' partials are combined in thread order at its end
    (``emit_outer_with_column_sums``).  The kernel right before the sum is taken when it fits;
    else any kernel that reads the summed buffer, when the sums are outputs of their own
    storage that no step between the two reads.  The bias gradients of a Linear layer re-read
    the whole output gradient otherwise (the 12 MB q/k/v gradient of benchmarks/train_cpu.py's
    nanoGPT block: 1.9 ms on 2 threads), a layer norm's weight and bias gradients the output
    gradient and the normalized input (which the row kernel then stored for them alone), and
    each kernel is one more fork and join of the threads (on a loaded 2-core host a join waits
    for a descheduled thread).  Returns kernel name -> its column sums; the sum kernels leave
    ``sched.steps``."""
    fused: dict[str, list[ColumnSum]] = {}
    steps = sched.steps
    position = 0
    while position < len(steps):
        summer = steps[position]
        if not isinstance(summer, FusedKernel) or not is_column_reduction(summer, sched.buffers):
            position += 1
            continue
        found = None
        if position > 0 and isinstance(steps[position - 1], FusedKernel):
            sums = _column_sums_of(steps[position - 1], summer, sched.buffers)
            found = (steps[position - 1], sums) if sums is not None else None
        if found is None and _movable(summer, sched):
            for other, step in enumerate(steps):
                if isinstance(step, FusedKernel) and step is not summer and not _read_between(
                        summer, steps[min(other, position) + 1:max(other, position)]):
                    sums = _column_sums_of(step, summer, sched.buffers)
                    if sums is not None:
                        found = (step, sums)
                        break
        if found is None:
            position += 1
            continue
        producer, sums = found
        fused.setdefault(producer.name, []).extend(sums)
        producer.writes = producer.writes + [name for name in summer.writes if name not in producer.writes]
        producer.fused_ops = producer.fused_ops + summer.fused_ops
        producer.bytes_accessed += summer.bytes_accessed
        producer.flops += summer.flops
        del steps[position]
    return fused


def _movable(summer: FusedKernel, sched: Schedule) -> bool:
    """May the sum kernel's work move to another step: are its results in storage of their own
    (not a dead buffer's, which may still be live at the other step)?  (A later buffer reuses
    them only after their last reader, which ``_read_between`` keeps after the other step.)"""
    return all(sched.buffers[name].allocation in ("", name) and sched.buffers[name].kind in ("output", "intermediate")
               for name in summer.writes)


def _read_between(summer: FusedKernel, between: list) -> bool:
    """Does any of the steps ``between`` read what the sum kernel writes?"""
    written = set(summer.writes)
    for step in between:
        reads = step.reads if isinstance(step, FusedKernel) else step.node.reads()
        if written & set(reads):
            return True
    return False


def _column_sums_of(producer: FusedKernel, summer: FusedKernel,
                    buffers: dict[str, BufferPlan]) -> list[ColumnSum] | None:
    """The ColumnSums when ``summer`` only sums, over its rows, values that ``producer`` has at
    hand element for element, and stores the sums; else None.  ``producer``: a pointwise kernel
    over [rows..., columns] that stores once each or reads the summed buffers, or a row kernel
    over rows [rows...] with one pass over the columns that stores or reads, at its element,
    every buffer the summed values load (a layer norm backward's row kernel, whose weight and
    bias gradients are sums of what it reads and stores).  Static sizes."""
    if len(summer.outer_vars) != 1 or checks_indices(producer) or not is_column_reduction(summer, buffers):
        return None
    rows_kernel = bool(producer.inner_vars)
    if rows_kernel:
        passes = [position for position, step in enumerate(producer.steps) if step.inner]
        # (a Welford pass is printed in lanes of its own, which add up nothing else)
        if len(producer.inner_vars) != 1 or not producer.outer_vars or not passes or any(
                red.reduction_type.startswith("welford") for red in producer.steps[passes[-1]].reductions):
            return None
        nest, last = list(producer.outer_vars), producer.inner_vars[0]
    else:
        if len(producer.outer_vars) < 2:
            return None
        *nest, last = producer.outer_vars
    (column,) = summer.outer_vars
    sizes = [v.size for v in (*producer.outer_vars, *producer.inner_vars, *summer.inner_vars, column)]
    # (no rows: the pointwise kernel is skipped, and the sums must still come out zero)
    if any(is_symbolic(size) or size == 0 for size in sizes) or \
            [v.size for v in summer.inner_vars] != [v.size for v in nest] \
            or column.size != last.size:
        return None
    mapping = {row: ir.index(var) for row, var in zip(summer.inner_vars, nest)}
    mapping[column] = ir.index(last)
    first, *finish = summer.steps
    steps = [producer.steps[passes[-1]]] if rows_kernel else producer.steps
    stores: dict[str, list[KernelStore]] = {}
    for step in steps:
        for store in step.stores:
            stores.setdefault(store.buffer, []).append(store)
    sums = []
    for red in first.reductions:
        if red.reduction_type != "sum" or red.dtype != torch.float32 or red.body.dtype != torch.float32:
            return None
        if rows_kernel:
            value = _in_row_pass(red.body, mapping, stores, producer, buffers)
        elif isinstance(red.body, Load):
            value = _element_of(red.body, mapping, stores, producer, buffers)
        else:
            value = None
        if value is None:
            return None
        sums.append(ColumnSum(red, value, column, finish, passes[-1] if rows_kernel else None))
    summed = {load.buffer for red in first.reductions for load in ir.loads(red.body)}
    if set(summer.reads) != summed:
        return None
    names = {red.name for red in first.reductions}
    for step in finish:
        if step.inner or step.reductions or any(
                load.buffer not in names for store in step.stores for load in ir.loads(store.body)):
            return None
        if any(buffers[store.buffer].dtype != torch.float32 for store in step.stores):
            return None
    # the sums' buffers may reuse storage that is dead after the producer (the planner frees a
    # buffer after its last reader): not the storage of anything the producer reads or writes
    touched = {buffers[name].allocation or name for name in (*producer.reads, *producer.writes)}
    if any((buffers[name].allocation or name) in touched for name in summer.writes):
        return None
    return sums


def _element_of(load: Load, mapping: dict, stores: dict[str, list[KernelStore]], producer: FusedKernel,
                buffers: dict[str, BufferPlan]) -> Expr | None:
    """A float32 element that the summer loads (its vars in ``mapping``'s), as the producer has
    it: the value it stores there (its one store of that buffer), or the same load where it
    reads that element too; None if it has neither."""
    plan = buffers[load.buffer]
    if load.dtype != torch.float32 or plan.dtype != torch.float32:
        return None
    wanted = flat_address(plan, tuple(i.substitute(mapping) for i in load.index))
    if load.buffer in stores:
        (store, *others) = stores[load.buffer]
        if not others and store.body.dtype == torch.float32 and flat_address(plan, store.index) == wanted:
            return store.body
        return None
    if load.buffer in producer.reads:
        return next((found for store in stores.values() for one in store for found in ir.loads(one.body)
                     if found.buffer == load.buffer and found.dtype == torch.float32 and
                     flat_address(plan, found.index) == wanted), None)
    return None


def _in_row_pass(body: Expr, mapping: dict, stores: dict[str, list[KernelStore]], producer: FusedKernel,
                 buffers: dict[str, BufferPlan]) -> Expr | None:
    """The summer's value ``body`` in a row kernel's pass: its vars mapped, each load of a buffer
    that the pass stores replaced by the stored value, loads of what the kernel reads kept (at
    any index: the kernel has the pointer); None where it loads anything else."""
    if ir.has_indirect(body):
        return None
    replaced: dict[int, Expr] = {}
    for load in ir.loads(body):
        if load.buffer in stores:
            value = _element_of(load, mapping, stores, producer, buffers)
            if value is None:
                return None
            replaced[id(load)] = value
        elif load.buffer not in producer.reads:
            return None

    def rebuild(node: Expr, args: tuple[Expr, ...]) -> Expr:
        if id(node) in replaced:
            return replaced[id(node)]
        if isinstance(node, Load):
            return Load(node.buffer, tuple(i.substitute(mapping) for i in node.index), node.dtype)
        if isinstance(node, IndexValue):
            return IndexValue(node.index.substitute(mapping), node.dtype)
        return ir.replace_children(node, args)
    return ir.map_expr(body, rebuild)


def kernel_arguments(kernel: FusedKernel) -> list[str]:
    """Buffer names in the order the kernel function takes their pointers."""
    return list(kernel.reads) + list(kernel.writes)


# a size symbol in printed code (ember/symbolic.py names them s0, s1, ...)
SIZE_SYMBOL = re.compile(r"\bs\d+\b")


# ============================================================ one kernel
class KernelPrinter:
    def __init__(self, kernel: FusedKernel, buffers: dict[str, BufferPlan], private: set[str] = frozenset(),
                 column_sums: list[ColumnSum] = ()):
        self.kernel = kernel
        self.column_sums = list(column_sums)
        self.buffers = buffers
        self.row_cache = RowCache(kernel, set(private))
        self.current_step: int | None = None    # the inner step being printed (RowCache reads)
        self.lines: list[str] = []
        self.tmp_counter = 0
        self.registers: dict[str, str] = {}     # reduction name -> C variable holding its result
        self.size_args: list[str] = []
        self.parallel_if = ""       # an OpenMP if() clause: symbolic sizes fork only when the work is big
        self.scopes: list[dict[Expr, str]] = []
        self.float_to_int = False               # a float -> integer cast is printed (see render)
        self.vector: tuple[ir.Var, str | None] | None = None   # (the lanes' var, a tail's count)
        self.varying: dict[Expr, bool] = {}     # lane_varying's answers for the loop being printed
        self.vector_calls_libm = False          # vector_loop_fits saw an op of VECTOR_LIBM_OPS

    # ---------------------------------------------------------- structure
    def render(self) -> str:
        k = self.kernel
        params = []
        for name in kernel_arguments(k):
            ctype = POINTER_TYPE[self.buffers[name].dtype]
            const = "const " if name in k.reads else ""
            params.append(f"{const}{ctype}* __restrict__ {self.pointer(name)}")
        if checks_indices(k):
            params.append("int64_t* __restrict__ ember_error")   # the caller's record of a bad index
        header = [f"// {k.name}: {len(k.fused_ops)} fused ops: {', '.join(k.fused_ops[:12])}"
                  + (" ..." if len(k.fused_ops) > 12 else ""),
                  (f"// loops: outer {[v.size for v in k.outer_vars]}, inner {[v.size for v in k.inner_vars]}; "
                   f"bytes: {k.bytes_accessed}, flops: {k.flops}"),
                  f'extern "C" void {k.name}({", ".join(params)}) {{']
        self.lines = header
        elements = k.outer_numel * max(k.inner_numel, 1)
        work = elements * max(1, hint_of(k.flops) // max(hint_of(elements), 1))     # flops per element at the hints
        if k.outer_numel == 0 or (k.inner_vars and k.inner_numel == 0 and not any(s.reductions for s in k.steps)):
            self.lines.append("  // zero-size: nothing to do")
            self.lines.append("}")
            return "\n".join(self.lines) + "\n"
        if is_symbolic(work):   # dynamic shapes: whether to fork is decided per call
            parallel, self.parallel_if = True, f" if({c_code(work)} >= {PARALLEL_THRESHOLD})"
        else:
            parallel = work >= PARALLEL_THRESHOLD
        if self.column_sums:
            self.emit_outer_with_column_sums(parallel)
        elif is_column_reduction(k, self.buffers):
            self.emit_column_reduction(parallel)
        else:
            self.emit_outer(parallel)
        self.lines.append("}")
        self._add_size_parameters(params)
        if self.float_to_int:
            # under the build's -fno-trapping-math g++ folds (double)(int)x into trunc(x), which is
            # -0.0 for x in (-1, 0) where eager's integer 0 is +0.0 (1 / that: -inf instead of +inf)
            signature = next(i for i, line in enumerate(self.lines) if line.startswith('extern "C" '))
            self.lines[signature] = self.lines[signature].replace(
                'extern "C" ', 'extern "C" __attribute__((optimize("trapping-math"))) ')
        return "\n".join(self.lines) + "\n"

    def _add_size_parameters(self, params: list[str]) -> None:
        """Size symbols the body uses (dynamic shapes) become int64_t parameters after the pointers
        (and before the error record, which the launcher appends last)."""
        body = "\n".join(self.lines[3:])
        self.size_args = sorted(set(SIZE_SYMBOL.findall(body)), key=lambda name: int(name[1:]))
        if not self.size_args:
            return
        sizes = [f"int64_t {name}" for name in self.size_args]
        if params and params[-1].endswith(" ember_error"):
            params = params[:-1] + sizes + params[-1:]
        else:
            params = params + sizes
        signature = next(i for i, line in enumerate(self.lines) if line.startswith('extern "C" '))
        self.lines[signature] = f'extern "C" void {self.kernel.name}({", ".join(params)}) {{'

    def pointer(self, buffer: str) -> str:
        """C name of a buffer's pointer: prefixed so it never clashes with a C function or a loop variable."""
        return f"{'in' if buffer in self.kernel.reads else 'out'}_{buffer}"

    def emit(self, depth: int, text: str) -> None:
        self.lines.append("  " * depth + text)

    def emit_outer(self, parallel: bool) -> None:
        k = self.kernel
        outer = list(k.outer_vars)
        pointwise_only = not k.inner_vars
        depth = 1
        # pointwise kernels vectorize their innermost (contiguous) outer loop
        simd_last = pointwise_only and outer
        nest = outer[:-1] if simd_last else outer
        split = parallel and not pointwise_only and self.splits_rows()
        if split:
            self.emit(depth, f"// {k.outer_numel} rows for {torch.get_num_threads()} threads: each pass over a row "
                             "is split over the threads instead")
            parallel = False
        if nest and parallel:
            collapse = f" collapse({len(nest)})" if len(nest) > 1 else ""
            self.emit(depth, f"#pragma omp parallel for{collapse}{self.parallel_if}")
        for var in nest:
            self.emit(depth, f"for (int64_t {var.name} = 0; {var.name} < {var.size}; ++{var.name}) {{")
            depth += 1
        segments = self.innermost_segments(outer[-1]) if simd_last and (nest or not parallel) else None
        if segments:
            self.emit(depth, f"// {outer[-1].name} in {len(segments)} ranges, on each of which every comparison and "
                             f"wrap-around of {outer[-1].name} is known")
            for start, stop in segments:
                var, steps = segment_steps(k.steps, outer[-1], start, stop)
                self.emit(depth, f"{{  // {outer[-1].name} in [{start}, {stop})")
                self.emit_pointwise_innermost(var, steps, depth + 1, False)
                self.emit(depth, "}")
            self.close_loops(nest, depth)
            return
        stores = [st for step in k.steps for st in step.stores]
        choice = self.vector_choice(outer[-1], [], stores) if simd_last else None
        if choice:
            self.emit_vector_choice(choice, True)
            self.scopes.append({})
            self.emit_vector_loop(outer[-1], depth, parallel and not nest,
                                  lambda inner_depth: [self.emit_stores(step, inner_depth) for step in k.steps])
            self.scopes.pop()
            if choice == "only":
                self.close_loops(nest, depth)
                return
            self.emit_vector_choice(choice, False)
        if simd_last:
            last = outer[-1]
            pragma = f"#pragma omp parallel for simd{self.parallel_if}" if parallel and not nest else "#pragma omp simd"
            self.emit(depth, pragma)
            self.emit(depth, f"for (int64_t {last.name} = 0; {last.name} < {last.size}; ++{last.name}) {{")
            depth += 1
        self.emit_row(depth, (parallel and not outer) or split)
        if simd_last:
            depth -= 1
            self.emit(depth, "}")
        if choice:
            self.emit_vector_choice(choice, None)
        self.close_loops(nest, depth)

    def emit_row(self, depth: int, parallel_reduce: bool) -> None:
        """One row's (one element's, for a pointwise kernel) steps: its row arrays, its passes
        over the inner vars and its stores."""
        k = self.kernel
        for slot, (name, dtype, comment) in enumerate(self.row_cache.arrays):
            ctype = compute_type(dtype)
            if is_symbolic(k.inner_numel):
                self.emit(depth, f"{ctype}* __restrict__ {name} = ember::row_scratch<{ctype}>({slot}, "
                                 f"{c_code(k.inner_numel)});  // {comment}")
            else:
                self.emit(depth, f"alignas(64) {ctype} {name}[{k.inner_numel}];  // {comment}")
        self.scopes.append({})
        for position, step in enumerate(k.steps):
            if step.inner:
                self.current_step = position
                self.emit_inner_step(step, depth, parallel_reduce)
                self.current_step = None
            else:
                self.emit_stores(step, depth)
        self.scopes.pop()

    def emit_pointwise_innermost(self, var: ir.Var, steps: list[LoopStep], depth: int, parallel: bool,
                                 mapping: dict[ir.Var, Index] | None = None) -> None:
        """The innermost loop of a pointwise kernel over ``var``, storing ``steps``' values: the
        vector types' form where it fits (VECTOR_TYPES), else an ``omp simd`` loop.  ``mapping``:
        the kernel's last var in ``var`` (a range of it, ``segment_steps``), for its column sums."""
        stores = [st for step in steps for st in step.stores]
        sums = self.column_sum_values(mapping)
        choice = self.vector_choice(var, [value for value, _ in sums], stores)

        def body(inner_depth: int) -> None:
            for step in steps:
                self.emit_stores(step, inner_depth)
            self.emit_column_sum_updates(sums, inner_depth)
        if choice:
            self.emit_vector_choice(choice, True)
            self.scopes.append({})
            self.emit_vector_loop(var, depth, parallel, body)
            self.scopes.pop()
            if choice == "only":
                return
            self.emit_vector_choice(choice, False)
        self.emit(depth, f"#pragma omp parallel for simd{self.parallel_if}" if parallel else "#pragma omp simd")
        self.emit(depth, f"for (int64_t {var.name} = 0; {var.name} < {var.size}; ++{var.name}) {{")
        self.scopes.append({})
        body(depth + 1)
        self.scopes.pop()
        self.emit(depth, "}")
        if choice:
            self.emit_vector_choice(choice, None)

    def column_sum_values(self, mapping: dict[ir.Var, Index] | None) -> list[tuple[Expr, Index]]:
        """(value, column index) of each column sum in the innermost loop (``mapping``: its var's range)."""
        if not self.column_sums:
            return []
        last = self.kernel.outer_vars[-1]
        mapping = mapping or {last: ir.index(last)}
        return [(fold_known_comparisons(ir.substitute(column_sum.value, mapping)), ir.index(last).substitute(mapping))
                for column_sum in self.column_sums]

    def emit_column_sum_updates(self, sums: list[tuple[Expr, Index]], depth: int) -> None:
        """Each column sum adds its value to its thread's partial sum of the column."""
        for column_sum, (value, column) in zip(self.column_sums, sums):
            partial = f"{column_sum.reduction.name}_part"
            if self.vector is not None:
                pointer = f"{partial} + ({self.index(column)})"
                total = f"({self.vector_access(torch.float32, pointer)} + {self.vector_value(value, depth)})"
                self.emit(depth, self.vector_access(torch.float32, pointer, total))
            else:
                self.emit(depth, f"{partial}[{self.index(column)}] += {self.expr(value, depth)};")

    def emit_outer_with_column_sums(self, parallel: bool) -> None:
        """A pointwise kernel with column sums folded in (``fuse_column_sums``): each thread adds
        what it stores to partial sums of its own, one array per sum in a block allocated per
        call, and after the rows (the barrier of their ``omp for``) the columns are shared out
        and each adds the threads' partials in thread order: the same sums at every call for a
        given thread count."""
        k = self.kernel
        nest, last = (list(k.outer_vars), k.inner_vars[0]) if k.inner_vars else (k.outer_vars[:-1], k.outer_vars[-1])
        columns, count = last.size, len(self.column_sums)
        depth = 1
        self.emit(depth, f"// {count} column sum(s) of what this kernel stores or reads: partial sums per thread, "
                         "then added up in thread order")
        self.emit(depth, "const int ember_max_threads = omp_get_max_threads();")
        self.emit(depth, f"float* __restrict__ ember_partials = static_cast<float*>(__builtin_malloc("
                         f"sizeof(float) * {count * columns} * ember_max_threads));")
        self.emit(depth, f"#pragma omp parallel{'' if parallel else ' if(0)'}")
        self.emit(depth, "{")
        depth += 1
        self.emit(depth, "const int ember_thread = omp_get_thread_num(), ember_team = omp_get_num_threads();")
        for slot, column_sum in enumerate(self.column_sums):
            partial = f"{column_sum.reduction.name}_part"
            self.emit(depth, f"float* __restrict__ {partial} = ember_partials + "
                             f"(static_cast<int64_t>(ember_thread) * {count} + {slot}) * {columns};")
            self.emit(depth, f"for (int64_t ember_column = 0; ember_column < {columns}; ++ember_column) "
                             f"{partial}[ember_column] = 0.0f;")
        collapse = f" collapse({len(nest)})" if len(nest) > 1 else ""
        self.emit(depth, f"#pragma omp for{collapse} schedule(static)")
        depth = self.open_loops(nest, depth)
        segments = None if k.inner_vars else self.innermost_segments(last)
        if k.inner_vars:
            self.emit_row(depth, False)     # (the pass that adds them up: emit_scalar_pass)
        elif segments:
            self.emit(depth, f"// {last.name} in {len(segments)} ranges, on each of which every comparison and "
                             f"wrap-around of {last.name} is known")
            for start, stop in segments:
                var, steps = segment_steps(k.steps, last, start, stop)
                self.emit(depth, f"{{  // {last.name} in [{start}, {stop})")
                self.emit_pointwise_innermost(var, steps, depth + 1, False, {last: ir.index(var) + start})
                self.emit(depth, "}")
        else:
            self.emit_pointwise_innermost(last, k.steps, depth, False)
        depth = self.close_loops(nest, depth)
        groups: dict[int, list[tuple[int, ColumnSum]]] = {}     # the sums of one folded kernel
        for slot, column_sum in enumerate(self.column_sums):
            groups.setdefault(id(column_sum.finish), []).append((slot, column_sum))
        # one loop finishes every folded kernel's sums, with no barrier of its own (the region's end
        # is one): on a loaded host each barrier may wait for a descheduled thread
        column = self.column_sums[0].column
        self.emit(depth, "#pragma omp for schedule(static) nowait")
        self.emit(depth, f"for (int64_t {column.name} = 0; {column.name} < {columns}; ++{column.name}) {{")
        for group in groups.values():
            self.emit(depth + 1, "{")
            own = group[0][1].column.name
            if own != column.name:
                self.emit(depth + 2, f"const int64_t {own} = {column.name};")
            self.scopes.append({})
            for slot, column_sum in group:
                red = column_sum.reduction
                self.emit(depth + 2, f"float {red.name}_acc = 0.0f;")
                self.emit(depth + 2, f"for (int ember_t = 0; ember_t < ember_team; ++ember_t) {red.name}_acc += "
                                     f"ember_partials[(static_cast<int64_t>(ember_t) * {count} + {slot}) * {columns}"
                                     f" + {column.name}];")
                self.finish_accumulator(red, f"{red.name}_acc", depth + 2)
            for step in group[0][1].finish:
                self.emit_stores(step, depth + 2)
            self.scopes.pop()
            self.emit(depth + 1, "}")
        self.emit(depth, "}")
        depth -= 1
        self.emit(depth, "}")
        self.emit(depth, "__builtin_free(ember_partials);")

    def innermost_segments(self, var: ir.Var) -> list[tuple[int, int]] | None:
        """Ranges of a pointwise kernel's innermost var on each of which every comparison of it
        with a constant has one answer and every ``% d`` / ``// d`` of it one period, when there
        are 2 to SEGMENTS_MAX of them, each at least SEGMENT_MIN long; else None.

        A concatenation (the q/k/v gradients of attention assembled into one [B, T, 3C] buffer:
        three padded copies added up) compares the column with the part boundaries and reads
        each part at ``column % C``: a gather that kept g++'s loop scalar, reading all parts at
        every column.  Split at the boundaries, each range folds to one contiguous copy."""
        if not SEGMENTS_MAX or is_symbolic(var.size) or self.row_cache.arrays:
            return None
        cuts = set()
        for step in self.kernel.steps:
            for store in step.stores:
                for node in [*ir.walk(store.body), store]:
                    for point in _segment_cuts(node, var, self.addresses_of(node)):
                        if 0 < point < var.size:
                            cuts.add(point)
                    if len(cuts) >= SEGMENTS_MAX:
                        return None
        if not cuts:
            return None
        bounds = [0, *sorted(cuts), var.size]
        segments = list(zip(bounds, bounds[1:]))
        if any(stop - start < SEGMENT_MIN for start, stop in segments):
            return None
        return segments

    def addresses_of(self, node: object) -> list[Index]:
        """The flat element offsets, as printed, that a Load or KernelStore reads or writes at (an
        IndexValue: its index)."""
        if isinstance(node, IndexValue):
            return [node.index]
        if not isinstance(node, (Load, KernelStore)) or node.buffer in self.registers or \
                node.buffer not in self.buffers:
            return []
        return [flat_address(self.buffers[node.buffer], node.index)]

    def splits_rows(self) -> bool:
        """Are there too few rows to share out to torch.get_num_threads() threads (fewer rows than
        threads, or the last round of rows leaving over a fifth of the threads' time idle: 3 rows on
        2 threads), and are they long?  Then the rows run one after another and each pass over a
        row is an OpenMP loop of its own (a reduction combining the threads' partials; the order
        of the additions changes with the thread count, as in a kernel without outer rows)."""
        k = self.kernel
        threads = torch.get_num_threads()
        rows, inner = hint_of(k.outer_numel), hint_of(k.inner_numel)
        if not SPLIT_ROWS or not k.outer_vars or threads < 2 or inner < PARALLEL_THRESHOLD or self.row_cache.arrays:
            return False
        return rows >= 1 and -(-rows // threads) * threads > 1.25 * rows

    # ---------------------------------------------------------- inner loops
    def emit_inner_step(self, step: LoopStep, depth: int, parallel_reduce: bool) -> None:
        k = self.kernel
        # a heuristic only (any answer is correct): symbolic sizes decide it at their hints.  A
        # variance over a whole tensor (no outer rows) keeps the two-pass form, whose OpenMP
        # reduction clauses split it over threads
        parallel_inner = parallel_reduce and (not step.stores or bool(k.outer_vars)) and \
            hint_of(k.inner_numel) >= PARALLEL_THRESHOLD
        sums_here = any(column_sum.step == self.current_step for column_sum in self.column_sums)
        choice = None if parallel_inner or sums_here else self.vector_pass_choice(step)
        self.emit_row_invariants(step, depth)      # once, before both forms of the loop
        if choice:
            self.emit_vector_choice(choice, True)
            self.scopes.append({})
            self.emit_vector_pass(step, depth)
            self.scopes.pop()
            if choice == "only":
                return
            self.emit_vector_choice(choice, False)
        self.scopes.append({})
        self.emit_scalar_pass(step, depth, parallel_inner)
        self.scopes.pop()
        if choice:
            self.emit_vector_choice(choice, None)

    def emit_scalar_pass(self, step: LoopStep, depth: int, parallel_inner: bool) -> None:
        """A row pass as scalar code in ``omp simd`` loops (g++ vectorizes them)."""
        k = self.kernel
        reductions = step.reductions
        accumulators = []
        clauses = []
        welford_groups: dict[Expr, list[KernelReduction]] = {}
        for red in reductions:
            if red.reduction_type.startswith("welford"):
                welford_groups.setdefault(red.body, []).append(red)
                continue
            acc, clause = self.declare_accumulator(red, depth)
            accumulators.append((red, acc))
            if clause:
                clauses.append(clause)
        if welford_groups and not accumulators and WELFORD_LANES and not parallel_inner:
            self.emit_row_invariants(step, depth)
            self.emit_welford_lanes(step, welford_groups, depth)
            return
        welford_sums = {}
        for body, group in welford_groups.items():
            name = f"{group[0].name}_sum"
            self.emit(depth, f"{_accumulator_type(group[0].dtype)} {name} = 0;")
            clauses.append(f"+:{name}")
            welford_sums[body] = name
        has_arg = any(r.reduction_type in ("argmax", "argmin") for r in reductions)
        simd_ok = not has_arg and all(r.reduction_type in ("sum", "max", "min", "prod") or
                                      r.reduction_type.startswith("welford") for r in reductions)
        reduction_clause = (" reduction(" + ") reduction(".join(clauses) + ")") if clauses else ""
        self.emit_row_invariants(step, depth)
        depth = self.open_inner_loops(depth, reduction_clause if simd_ok else None, parallel_inner and simd_ok)
        self.scopes.append({})
        for red, acc in accumulators:
            value = self.expr(red.body, depth)
            self.update_accumulator(red, acc, value, depth)
        for body, name in welford_sums.items():
            value = self.expr(body, depth)
            self.emit(depth, f"{name} += {value};")
        for store in step.stores:
            self.emit_store(store.buffer, store.index, store.body, depth)
        for node, array in self.row_cache.stored_by.get(self.current_step, []):
            self.emit(depth, f"{array}[{self.row_position()}] = {self.lookup(node)};")
        if any(column_sum.step == self.current_step for column_sum in self.column_sums):
            column = ir.index(k.inner_vars[0])
            self.emit_column_sum_updates([(column_sum.value, column) for column_sum in self.column_sums], depth)
        self.scopes.pop()
        depth = self.close_inner_loops(depth)
        for red, acc in accumulators:
            self.finish_accumulator(red, acc, depth)
        if welford_groups:
            self.emit_welford_second_pass(welford_groups, welford_sums, depth, parallel_inner)

    def emit_row_invariants(self, step: LoopStep, depth: int) -> None:
        """Temporaries, before a pass's loops, for the parts of its bodies that are the same along
        the row (an embedding's token index and its bounds check, a mean, a row's scale).  g++
        hoists pure ones itself, but not a bounds check (a call that may record an error): left
        in the loop it kept the embedding + layer norm kernel of every GPT from vectorizing.  Only
        where the row is known to be non-empty: a hoisted load runs even if the loop does not."""
        inner = self.kernel.inner_numel
        if is_symbolic(inner) or inner <= 0:
            return
        per_element = self.row_cache.per_element
        stack = [body for body in self.row_cache.bodies(step)]
        seen: set[Expr] = set()
        while stack:
            node = stack.pop()
            if node in seen or isinstance(node, Const):
                continue
            seen.add(node)
            if per_element(node):
                stack.extend(node.children())
                # the gathered index of a per-element load (an embedding row) may be the same along the row
                stack.extend(atom.value for idx in ir.indices_of(node) for atom in ir.indirect_atoms(idx))
            elif any(isinstance(part, (Load, IndexValue)) for part in ir.walk(node)):
                self.expr(node, depth)

    def open_inner_loops(self, depth: int, simd_clause: str | None = None, parallel: bool = False) -> int:
        """The inner loop nest; ``simd_clause`` (reductions) vectorizes its innermost (contiguous)
        loop, ``parallel`` splits its outermost loop over threads."""
        inner = self.kernel.inner_vars
        for i, var in enumerate(inner):
            innermost, outermost = i == len(inner) - 1, i == 0
            if simd_clause is not None:
                if innermost and outermost:
                    self.emit(depth, f"#pragma omp {'parallel for simd' if parallel else 'simd'}{simd_clause}"
                                     f"{self.parallel_if if parallel else ''}")
                elif outermost and parallel:
                    self.emit(depth, f"#pragma omp parallel for{simd_clause}{self.parallel_if}")
                elif innermost:
                    self.emit(depth, f"#pragma omp simd{simd_clause}")
            self.emit(depth, f"for (int64_t {var.name} = 0; {var.name} < {var.size}; ++{var.name}) {{")
            depth += 1
        return depth

    def close_inner_loops(self, depth: int) -> int:
        for _ in self.kernel.inner_vars:
            depth -= 1
            self.emit(depth, "}")
        return depth

    def declare_accumulator(self, red: KernelReduction, depth: int) -> tuple[str, str]:
        acc_type, init = _accumulator_start(red)
        acc = f"{red.name}_acc"
        rtype = red.reduction_type
        self.emit(depth, f"{acc_type} {acc} = {init};")
        if rtype == "sum":
            return acc, f"+:{acc}"
        if rtype == "prod":
            return acc, f"*:{acc}"
        if rtype in ("argmax", "argmin"):
            self.emit(depth, f"int64_t {red.name}_index = 0;")
            return acc, ""
        if _has_nan_flag(red):
            # vectorizable max/min plus a separate NaN flag: torch propagates NaN.  An int, not a
            # bool: g++ has no vector type for a bool reduction and left the whole loop scalar
            self.emit(depth, f"int {red.name}_nan = 0;")
            return acc, f"{rtype}:{acc}) reduction(|:{red.name}_nan"
        return acc, f"{rtype}:{acc}"

    def update_accumulator(self, red: KernelReduction, acc: str, value: str, depth: int,
                           lane: str = "") -> None:
        """``lane``: a subscript (``[x1_lane]``) when the accumulator and NaN flag are arrays."""
        rtype = red.reduction_type
        acc += lane
        if rtype == "sum":
            self.emit(depth, f"{acc} += {value};")
        elif rtype == "prod":
            self.emit(depth, f"{acc} *= {value};")
        elif rtype in ("max", "min"):
            self.emit(depth, f"{acc} = ({value} {'>' if rtype == 'max' else '<'} {acc}) ? {value} : {acc};")
            if _has_nan_flag(red):
                self.emit(depth, f"{red.name}_nan{lane} |= ({value} != {value});")
        else:  # argmax / argmin: first occurrence wins, NaN counts as the extreme
            cmp = ">" if rtype == "argmax" else "<"
            flat = ir.linearize([ir.index(v) for v in self.kernel.inner_vars], [v.size for v in self.kernel.inner_vars])
            nan_test = f" || ({value} != {value} && {acc} == {acc})" if red.body.dtype.is_floating_point else ""
            self.emit(depth, f"if (({value} {cmp} {acc}){nan_test}) {{ {acc} = {value}; "
                             f"{red.name}_index = {self.index(flat)}; }}")

    def finish_accumulator(self, red: KernelReduction, acc: str, depth: int, lane: str = "") -> None:
        rtype = red.reduction_type
        ctype = compute_type(red.dtype)
        if rtype in ("argmax", "argmin"):
            result = f"{red.name}_index"
        elif _has_nan_flag(red):
            result = f"({red.name}_nan{lane} ? NAN : {acc}{lane})"
        else:
            result = acc + lane
        self.emit(depth, f"const {ctype} {red.name}_val = {_register_value(result, red.dtype)};")
        self.registers[red.name] = f"{red.name}_val"

    def emit_welford_second_pass(self, groups: dict[Expr, list[KernelReduction]], sums: dict[Expr, str],
                                 depth: int, parallel: bool = False) -> None:
        """var = sum((x - mean)^2) / (n - correction): a second pass over the (cached) row."""
        n = max(self.kernel.inner_numel, 0)
        for body, group in groups.items():
            acc_type = _accumulator_type(group[0].dtype)
            base = group[0].name
            mean = f"{base}_mean_value"
            self.emit(depth, f"const {acc_type} {mean} = {sums[body]} / {acc_type}({n});")
            self.emit(depth, f"{acc_type} {base}_m2 = 0;")
            inner_depth = self.open_inner_loops(depth, f" reduction(+:{base}_m2)", parallel)
            self.scopes.append({})
            value = self.expr(body, inner_depth)
            self.emit(inner_depth, f"const {acc_type} {base}_delta = {value} - {mean};")
            self.emit(inner_depth, f"{base}_m2 += {base}_delta * {base}_delta;")
            self.scopes.pop()
            self.close_inner_loops(inner_depth)
            for red in group:
                ctype = compute_type(red.dtype)
                if red.reduction_type == "welford_mean":
                    result = mean
                else:
                    if is_symbolic(n):
                        denom = f"ember::max<{acc_type}>({acc_type}({n}) - {red.correction!r}, 0)"
                    else:
                        denom = f"{acc_type}({max(n - red.correction, 0)!r})"
                    result = f"{base}_m2 / {denom}"
                self.emit(depth, f"const {ctype} {red.name}_val = {_register_value(result, red.dtype)};")
                self.registers[red.name] = f"{red.name}_val"

    # ---------------------------------------------------------- column reductions
    def emit_column_reduction(self, parallel: bool) -> None:
        """A reduction down the columns (``is_column_reduction``), column-tiled.

        The general form reduces one column at a time with its simd loop along the reduced rows,
        so every load in that loop is a row apart: a cache line (and often a page) for each value.
        The LayerNorm weight and bias gradients of benchmarks/train_cpu.py's pointwise block took
        300 ms that way, more than the rest of the training step; column-tiled, 16 ms.  Here
        COLUMN_TILE adjacent columns are reduced together: the simd loop runs along them
        (contiguous loads), each column keeping its own accumulator in an array, and the rows
        are walked once per tile.  Values of a row that no column changes (a mean, an rstd) are
        computed once per row, outside the simd loop.  Same accumulator types as the general
        form; only the order of the additions within a column changes."""
        k = self.kernel
        step, *after = k.steps
        *nest, column = k.outer_vars
        symbolic_columns = is_symbolic(column.size)
        tile = COLUMN_TILE if symbolic_columns else self.column_tile(column.size, nest, parallel)
        start, lane, count = f"{column.name}_tile", f"{column.name}_lane", f"{column.name}_count"
        depth = 1
        self.emit(depth, f"// column-tiled reduction: {tile} adjacent columns per tile, the simd loop along them")
        if parallel:
            collapse = f" collapse({len(nest) + 1})" if nest else ""
            self.emit(depth, f"#pragma omp parallel for{collapse}{self.parallel_if}")
        for var in nest:
            self.emit(depth, f"for (int64_t {var.name} = 0; {var.name} < {var.size}; ++{var.name}) {{")
            depth += 1
        self.emit(depth, f"for (int64_t {start} = 0; {start} < {column.size}; {start} += {tile}) {{")
        depth += 1
        if not symbolic_columns and column.size % tile == 0:
            self.emit(depth, f"const int64_t {count} = {tile};")
        else:
            rest = f"{column.size} - {start}"
            self.emit(depth, f"const int64_t {count} = {rest} < {tile} ? {rest} : {tile};")

        accumulators = [(red, f"{red.name}_acc") for red in step.reductions]
        initial = []
        for red, acc in accumulators:
            acc_type, init = _accumulator_start(red)
            self.emit(depth, f"alignas(64) {acc_type} {acc}[{tile}];")
            initial.append(f"{acc}[{lane}] = {init};")
            if _has_nan_flag(red):
                self.emit(depth, f"int {red.name}_nan[{tile}];")
                initial.append(f"{red.name}_nan[{lane}] = 0;")
        self.emit(depth, f"for (int64_t {lane} = 0; {lane} < {tile}; ++{lane}) {{")
        for line in initial:
            self.emit(depth + 1, line)
        self.emit(depth, "}")

        depth = self.open_inner_loops(depth)
        self.scopes.append({})
        self.emit_row_values([red.body for red in step.reductions], column, depth)
        self.emit(depth, "#pragma omp simd")
        depth = self.open_column_lanes(column, depth)
        self.scopes.append({})
        for red, acc in accumulators:
            value = self.expr(red.body, depth)
            self.update_accumulator(red, acc, value, depth, lane=f"[{lane}]")
        self.scopes.pop()
        depth = self.close_column_lanes(depth)
        self.scopes.pop()
        depth = self.close_inner_loops(depth)

        depth = self.open_column_lanes(column, depth)
        self.scopes.append({})
        for red, acc in accumulators:
            self.finish_accumulator(red, acc, depth, lane=f"[{lane}]")
        for later in after:
            self.emit_stores(later, depth)
        self.scopes.pop()
        depth = self.close_column_lanes(depth)
        for _ in range(len(nest) + 1):
            depth -= 1
            self.emit(depth, "}")

    def column_tile(self, columns: int, nest: list[ir.Var], parallel: bool) -> int:
        """Columns per tile: as wide as leaves a tile for each thread (with the nest's outer
        iterations) and keeps the accumulators within COLUMN_TILE_BYTES, in multiples of
        COLUMN_TILE; at least COLUMN_TILE.  Each column still adds its rows in the same order:
        the width changes no result."""
        if columns <= COLUMN_TILE or not COLUMN_TILE_BYTES:
            return min(COLUMN_TILE, columns)
        outer = math.prod(hint_of(v.size) for v in nest) if nest else 1
        tiles = max(1, -(-torch.get_num_threads() // max(outer, 1))) if parallel else 1
        step = self.kernel.steps[0]
        per_column = sum(8 if _accumulator_type(red.dtype) in ("double", "int64_t") else 4
                         for red in step.reductions) + 4 * sum(_has_nan_flag(red) for red in step.reductions)
        widest = max(COLUMN_TILE, COLUMN_TILE_BYTES // max(per_column, 1) // COLUMN_TILE * COLUMN_TILE)
        wanted = -(-columns // tiles)
        wanted = -(-wanted // COLUMN_TILE) * COLUMN_TILE
        return max(COLUMN_TILE, min(wanted, widest, -(-columns // COLUMN_TILE) * COLUMN_TILE))

    def open_column_lanes(self, column: ir.Var, depth: int) -> int:
        """The loop over a tile's columns, defining the column var itself for the body."""
        lane = f"{column.name}_lane"
        self.emit(depth, f"for (int64_t {lane} = 0; {lane} < {column.name}_count; ++{lane}) {{")
        self.emit(depth + 1, f"const int64_t {column.name} = {column.name}_tile + {lane};")
        return depth + 1

    def close_column_lanes(self, depth: int) -> int:
        self.emit(depth - 1, "}")
        return depth - 1

    def emit_row_values(self, bodies: list[Expr], column: ir.Var, depth: int) -> None:
        """Temporaries for the parts of ``bodies`` that do not depend on the column var."""
        per_column: set[Expr] = set()
        for body in bodies:
            for node in ir.walk(body):
                if node in per_column:
                    continue
                if any(child in per_column for child in node.children()) or \
                        any(column in idx.free_vars() for idx in ir.indices_of(node)):
                    per_column.add(node)
                elif not isinstance(node, Const):
                    self.expr(node, depth)

    # ---------------------------------------------------------- stores
    def emit_stores(self, step: LoopStep, depth: int) -> None:
        for store in step.stores:
            self.emit_store(store.buffer, store.index, store.body, depth)

    def emit_store(self, buffer: str, index: tuple[Index, ...], body: Expr, depth: int) -> None:
        if buffer in self.row_cache.dropped:
            return
        if self.vector is not None:
            self.emit_vector_store(buffer, index, body, depth)
            return
        value = self.expr(body, depth)
        if buffer in self.row_cache.private_arrays:
            array, _ = self.row_cache.private_arrays[buffer]
            self.emit(depth, f"{array}[{self.row_position()}] = {value};")
            return
        plan = self.buffers[buffer]
        self.emit(depth, f"{self.pointer(buffer)}[{self.address(plan, index)}] = "
                         f"{_to_storage(value, plan.dtype, body.dtype, self.holds_rounded(body, plan.dtype))};")

    # ---------------------------------------------------------- expressions
    def lookup(self, expr: Expr) -> str | None:
        for scope in reversed(self.scopes):
            if expr in scope:
                return scope[expr]
        return None

    def expr(self, expr: Expr, depth: int) -> str:
        """Emit temporaries for expr (CSE'd per scope) and return the C expression naming its value."""
        for node in self.walk_new(expr):
            if self.lookup(node) is not None:
                continue
            vector = self.vector is not None and self.lane_varying(node)
            if self.current_step is not None and self.row_cache.reads_cached(node, self.current_step):
                array = self.row_cache.available[node][1]
                text = (self.vector_access(torch.float32, f"{array} + {self.row_position()}") if vector
                        else f"{array}[{self.row_position()}]")
            elif vector:
                text = self.render_vector_node(node, depth)
            else:
                text = self.render_node(node, depth)
            if isinstance(node, Const) or (isinstance(node, Load) and node.buffer in self.registers):
                self.scopes[-1][node] = text
                continue
            name = f"tmp{self.tmp_counter}"
            self.tmp_counter += 1
            self.emit(depth, f"const {'ember::Vec' if vector else compute_type(node.dtype)} {name} = {text};")
            self.scopes[-1][node] = name
        return self.lookup(expr)

    def walk_new(self, expr: Expr) -> list[Expr]:
        """The nodes of ``expr`` to print, children first, not entering nodes already named in a
        scope or loaded from a row array (RowCache)."""
        order: list[Expr] = []
        seen: set[Expr] = set()
        stack: list[tuple[Expr, bool]] = [(expr, False)]
        while stack:
            node, expanded = stack.pop()
            if node in seen:
                continue
            if expanded or self.lookup(node) is not None or (
                    self.current_step is not None and self.row_cache.reads_cached(node, self.current_step)):
                seen.add(node)
                order.append(node)
                continue
            stack.append((node, True))
            stack.extend((child, False) for child in reversed(node.children()) if child not in seen)
        return order

    def row_position(self) -> str:
        """The element of the current row (the inner loops' flat index) in a row array."""
        inner = self.kernel.inner_vars
        return self.index(ir.linearize([ir.index(v) for v in inner], [v.size for v in inner]))

    def arg(self, expr: Expr) -> str:
        return self.lookup(expr)

    def render_node(self, node: Expr, depth: int) -> str:
        if isinstance(node, Load):
            if node.buffer in self.registers:
                return self.registers[node.buffer]
            if node.buffer in self.row_cache.private_arrays:
                return f"{self.row_cache.private_arrays[node.buffer][0]}[{self.row_position()}]"
            plan = self.buffers[node.buffer]
            raw = f"{self.pointer(node.buffer)}[{self.address(plan, node.index, depth)}]"
            return _from_storage(raw, plan.dtype)
        if isinstance(node, Const):
            return _literal(node.value, node.dtype)
        if isinstance(node, IndexValue):
            return f"static_cast<{compute_type(node.dtype)}>({self.index(node.index, depth)})"
        if isinstance(node, Cast):
            if node.arg.dtype.is_floating_point and not node.dtype.is_floating_point and node.dtype != torch.bool:
                self.float_to_int = True
            return _cast(self.arg(node.arg), node.arg.dtype, node.dtype,
                         skip_rounding=self.holds_rounded(node.arg, node.arg.dtype if node.arg.dtype in LOW_PRECISION
                                                          else node.dtype))
        if isinstance(node, Op):
            inline_exp = node.op == "exp" and INLINE_EXPF and self.may_be_far_below_zero(node.args[0])
            return render_op(node, [self.arg(a) for a in node.args], inline_exp)
        raise CompileError(f"cannot print {type(node).__name__}", stage="codegen")

    def holds_rounded(self, expr: Expr, dtype: torch.dtype) -> bool:
        """Is ``expr``'s value, as printed, already a ``dtype`` (bf16/fp16) number, so that rounding
        it to ``dtype`` changes nothing?  A load from a buffer stored in ``dtype``, a reduction
        result of ``dtype`` (rounded in its register), a cast to ``dtype``, or a widening of a
        ``dtype`` value.  The bf16 blocks' casts rounded the same value up to three times."""
        if dtype not in LOW_PRECISION:
            return False
        if isinstance(expr, Load):
            if expr.buffer in self.registers:
                return expr.dtype == dtype
            plan = self.buffers.get(expr.buffer)
            return (plan is not None and plan.dtype == dtype and expr.dtype == dtype
                    and expr.buffer not in self.row_cache.private_arrays)
        if isinstance(expr, Cast):
            return expr.dtype == dtype or (expr.arg.dtype == dtype and expr.dtype in (torch.float32, torch.float64))
        return False

    def may_be_far_below_zero(self, expr: Expr) -> bool:
        """Does ``expr`` hold a -inf constant or subtract a max reduction (see INLINE_EXPF)?"""
        maxima = self.max_reductions
        for node in ir.walk(expr):
            if isinstance(node, Const) and node.dtype.is_floating_point and node.value == float("-inf"):
                return True
            if isinstance(node, Op) and node.op == "sub" and any(
                    isinstance(part, Load) and part.buffer in maxima for part in ir.walk(node.args[1])):
                return True
        return False

    @property
    def max_reductions(self) -> set[str]:
        """Names of this kernel's max reductions (a Load of one reads its register)."""
        return {red.name for step in self.kernel.steps for red in step.reductions
                if red.reduction_type in ("max", "amax")}

    def address(self, plan: BufferPlan, index: tuple[Index, ...], depth: int = 0) -> str:
        return self.index(flat_address(plan, index), depth)

    def index(self, idx: Index, depth: int = 0) -> str:
        def atom(a: ir.Atom) -> str:
            if isinstance(a, ir.Var):
                return a.name
            if isinstance(a, ir.FloorDiv):
                return f"(({a.arg.render(atom)}) / {a.divisor})"
            if isinstance(a, ir.ModIndex):
                return f"(({a.arg.render(atom)}) % {a.divisor})"
            if isinstance(a, ir.Indirect):
                return f"static_cast<int64_t>({self.expr(a.value, depth)})"
            raise TypeError(a)
        return idx.render(atom)


    def emit_welford_lanes(self, step: LoopStep, groups: dict[Expr, list[KernelReduction]], depth: int) -> None:
        """Mean and variance in one pass over the row (Welford), vectorized by keeping
        WELFORD_LANES running (mean, M2) pairs: lane j takes element j of each block of LANES along
        the innermost var, so all lanes have the same count and one reciprocal a block serves them
        all.  Values enter shifted by the row's first one (see the prelude's ember_welford);
        elements past the last whole block go to a scalar Welford (``tail``), and
        ``ember_welford_lanes`` combines lanes and tail (Chan et al.).  The two-pass form read the
        row (and computed its body) twice, and in float its variance of values near 1e4 with a
        standard deviation of 1e-2 was 1e-2 off where this one is 1e-7 (tests/codegen/test_cpu_welford.py)."""
        k = self.kernel
        *nest, last = k.inner_vars
        size = last.size
        # the count of whole blocks is named after this pass's first reduction: a kernel may hold
        # several Welford passes over the same var in one scope
        first = next(iter(groups.values()))[0].name
        block, lane, blocks = f"{last.name}_block", f"{last.name}_lane", f"{first}_blocks"
        acc_types = {body: _accumulator_type(group[0].dtype) for body, group in groups.items()}
        lanes = WELFORD_LANES * 4 // max(4, *(8 if t == "double" else 4 for t in acc_types.values()))
        n = max(k.inner_numel, 0)
        # the shift: each body at the row's first element (none in an empty row)
        for body, group in groups.items():
            self.emit(depth, f"{acc_types[body]} {group[0].name}_shift = 0;")
        self.emit(depth, f"if ({n} > 0) {{" if is_symbolic(n) or n == 0 else "{")
        self.scopes.append({})
        for var in k.inner_vars:
            self.emit(depth + 1, f"const int64_t {var.name} = 0;")
        for body, group in groups.items():
            self.emit(depth + 1, f"{group[0].name}_shift = {self.expr(body, depth + 1)};")
        self.scopes.pop()
        self.emit(depth, "}")
        self.emit(depth, f"// Welford: {lanes} lanes, each a running mean and M2 of one element of every block of {lanes}")
        for body, group in groups.items():
            base, acc_type = group[0].name, acc_types[body]
            for part in ("mean", "m2"):
                self.emit(depth, f"alignas(64) {acc_type} {base}_lane_{part}[{lanes}] = {{}};")
            self.emit(depth, f"ember_welford<{acc_type}> {base}_tail;")
        self.emit(depth, f"int64_t {blocks} = 0;")
        # the lanes' loop: whole blocks
        depth = self.open_loops(nest, depth)
        self.emit(depth, f"for (int64_t {block} = 0; {block} + {lanes} <= {size}; {block} += {lanes}) {{")
        depth += 1
        self.emit(depth, f"++{blocks};")
        for acc_type in sorted(set(acc_types.values())):   # 1 / the lanes' count: one division a block
            self.emit(depth, f"const {acc_type} {blocks}_{acc_type}_weight = {acc_type}(1) / {acc_type}({blocks});")
        self.emit(depth, "#pragma omp simd")
        self.emit(depth, f"for (int64_t {lane} = 0; {lane} < {lanes}; ++{lane}) {{")
        self.emit(depth + 1, f"const int64_t {last.name} = {block} + {lane};")
        self.emit_welford_body(step, groups, depth + 1, lambda body, value, d: self.welford_update(
            groups[body][0].name, acc_types[body], value, f"{blocks}_{acc_types[body]}_weight", f"[{lane}]", d))
        self.emit(depth, "}")
        depth -= 1
        self.emit(depth, "}")
        depth = self.close_loops(nest, depth)
        # the tail: elements past the last whole block of each innermost run
        static_tail = None if is_symbolic(size) else size % lanes
        if static_tail != 0:
            start = f"{size - static_tail}" if static_tail is not None else f"({size}) - ({size}) % {lanes}"
            depth = self.open_loops(nest, depth)
            self.emit(depth, f"for (int64_t {last.name} = {start}; {last.name} < {size}; ++{last.name}) {{")
            self.emit_welford_body(step, groups, depth + 1, lambda body, value, d: self.emit(
                d, f"ember_welford_add({groups[body][0].name}_tail, {value} - {groups[body][0].name}_shift);"))
            self.emit(depth, "}")
            depth = self.close_loops(nest, depth)
        for body, group in groups.items():
            base, acc_type = group[0].name, acc_types[body]
            self.emit(depth, f"const ember_welford<{acc_type}> {base}_all = ember_welford_lanes<{lanes}>("
                             f"{base}_lane_mean, {base}_lane_m2, {blocks}, {base}_tail, {base}_shift);")
            for red in group:
                if red.reduction_type == "welford_mean":
                    result = f"{base}_all.mean"
                else:
                    if is_symbolic(n):
                        denom = f"ember::max<{acc_type}>({acc_type}({n}) - {red.correction!r}, 0)"
                    else:
                        denom = f"{acc_type}({max(n - red.correction, 0)!r})"
                    result = f"{base}_all.m2 / {denom}"
                self.emit(depth, f"const {compute_type(red.dtype)} {red.name}_val = {_register_value(result, red.dtype)};")
                self.registers[red.name] = f"{red.name}_val"

    def emit_welford_body(self, step: LoopStep, groups: dict[Expr, list[KernelReduction]], depth: int,
                          update) -> None:
        """One element of a Welford pass: each group's update, the step's stores and row arrays."""
        self.scopes.append({})
        for body in groups:
            update(body, self.expr(body, depth), depth)
        for store in step.stores:
            self.emit_store(store.buffer, store.index, store.body, depth)
        for node, array in self.row_cache.stored_by.get(self.current_step, []):
            self.emit(depth, f"{array}[{self.row_position()}] = {self.lookup(node)};")
        self.scopes.pop()

    def welford_update(self, base: str, acc_type: str, value: str, weight: str, lane: str, depth: int) -> None:
        mean, m2 = f"{base}_lane_mean{lane}", f"{base}_lane_m2{lane}"
        self.emit(depth, f"const {acc_type} {base}_shifted = {value} - {base}_shift;")
        self.emit(depth, f"const {acc_type} {base}_delta = {base}_shifted - {mean};")
        self.emit(depth, f"{mean} += {base}_delta * {weight};")
        self.emit(depth, f"{m2} += {base}_delta * ({base}_shifted - {mean});")

    def open_loops(self, variables: list[ir.Var], depth: int) -> int:
        for var in variables:
            self.emit(depth, f"for (int64_t {var.name} = 0; {var.name} < {var.size}; ++{var.name}) {{")
            depth += 1
        return depth

    def close_loops(self, variables: list[ir.Var], depth: int) -> int:
        for _ in variables:
            depth -= 1
            self.emit(depth, "}")
        return depth

    # ---------------------------------------------------------- vector loops (VECTOR_TYPES)
    def vector_loop_fits(self, var: ir.Var, bodies: list[Expr], stores) -> bool:
        """Can the loop over ``var`` run on the prelude's vector types?  Every value that changes
        along it is float32/bf16/fp16 and made of VECTOR_OPS, its loads and stores step through
        memory (or a row array) one element at a time; the values that do not change are
        printed as now (scalars, which the vector operators broadcast)."""
        self.vector, self.varying, self.vector_calls_libm = (var, None), {}, False
        try:
            bodies = list(bodies)
            for store in stores:
                if store.buffer in self.row_cache.dropped:
                    continue
                if store.body.dtype not in VECTOR_DTYPES:
                    return False
                if store.buffer not in self.row_cache.private_arrays:
                    plan = self.buffers[store.buffer]
                    if plan.dtype not in VECTOR_DTYPES or not _unit_stride(flat_address(plan, store.index), var):
                        return False
                bodies.append(store.body)
            stack, seen = bodies, set()
            while stack:
                node = stack.pop()
                if node in seen or not self.lane_varying(node):
                    continue
                seen.add(node)
                if node.dtype not in VECTOR_DTYPES:
                    return False
                if self.current_step is not None and self.row_cache.reads_cached(node, self.current_step):
                    continue
                if isinstance(node, Load):
                    if node.buffer in self.row_cache.private_arrays:
                        continue
                    plan = self.buffers[node.buffer]
                    if plan.dtype not in VECTOR_DTYPES or not _unit_stride(flat_address(plan, node.index), var):
                        return False
                elif isinstance(node, Cast):
                    if node.arg.dtype not in VECTOR_DTYPES:
                        return False
                elif not isinstance(node, Op) or node.op not in VECTOR_OPS or \
                        any(arg.dtype not in VECTOR_DTYPES for arg in node.args):
                    return False
                elif node.op in VECTOR_LIBM_OPS and not (
                        node.op == "exp" and INLINE_EXPF and self.may_be_far_below_zero(node.args[0])):
                    self.vector_calls_libm = True
                stack.extend(node.children())
            return True
        finally:
            self.vector = None

    def lane_varying(self, node: Expr) -> bool:
        """Does ``node``'s value change along the vector loop's var (a vector, not a scalar)?"""
        known = self.varying.get(node)
        if known is None:
            var = self.vector[0]
            if isinstance(node, Load) and node.buffer in self.registers:
                known = False
            elif (self.current_step is not None and self.row_cache.reads_cached(node, self.current_step)) or \
                    (isinstance(node, Load) and node.buffer in self.row_cache.private_arrays):
                known = True
            elif isinstance(node, Load):
                known = var in flat_address(self.buffers[node.buffer], node.index).free_vars()
            elif isinstance(node, IndexValue):
                known = var in node.index.free_vars()
            else:
                known = any(self.lane_varying(child) for child in node.children())
            self.varying[node] = known
        return known

    def emit_vector_loop(self, var: ir.Var, depth: int, parallel: bool, body) -> None:
        """``body(depth)`` over ``var`` in blocks of ember::VEC_WIDTH lanes, then once more for the
        tail (``var``'s last, partial block: its loads and stores touch only ``{var}_count``
        lanes).  ``parallel``: the blocks are shared out to the threads."""
        whole, count, size = f"{var.name}_whole", f"{var.name}_count", var.size
        self.emit(depth, f"{{  // {var.name} in blocks of ember::VEC_WIDTH lanes, then the tail's")
        depth += 1
        self.emit(depth, f"const int64_t {whole} = ({size}) / ember::VEC_WIDTH * ember::VEC_WIDTH;")
        if parallel:
            self.emit(depth, f"#pragma omp parallel for{self.parallel_if}")
        self.emit(depth, f"for (int64_t {var.name} = 0; {var.name} < {whole}; {var.name} += ember::VEC_WIDTH) {{")
        for tail in (False, True):
            if tail:
                self.emit(depth, "}")
                self.emit(depth, f"if {'' if is_symbolic(size) else 'constexpr '}({whole} < {size}) {{")
                self.emit(depth + 1, f"const int64_t {var.name} = {whole}, {count} = {size} - {whole};")
            self.vector, self.varying = (var, count if tail else None), {}
            self.scopes.append({})
            body(depth + 1)
            self.scopes.pop()
        self.vector = None
        self.emit(depth, "}")
        self.emit(depth - 1, "}")

    def vector_choice(self, var: ir.Var, bodies: list[Expr], stores) -> str | None:
        """Which form the loop over ``var`` takes (see VECTOR_TYPES): "only" the vector types',
        "without-libmvec" both (the vector form where the build has no libmvec), or None: the
        scalar one."""
        if VECTOR_TYPES is False or not self.vector_loop_fits(var, bodies, stores):
            return None
        if VECTOR_TYPES:
            return "only"
        return "without-libmvec" if self.vector_calls_libm else None

    def vector_pass_choice(self, step: LoopStep) -> str | None:
        """vector_choice for a row pass: over the kernel's one inner var, its reductions sum/max/min
        in float."""
        k = self.kernel
        if VECTOR_TYPES is False or len(k.inner_vars) != 1 or any(
                red.reduction_type not in VECTOR_REDUCTIONS or _accumulator_type(red.dtype) != "float"
                for red in step.reductions):
            return None
        row_values = [node for node, _ in self.row_cache.stored_by.get(self.current_step, [])]
        return self.vector_choice(k.inner_vars[0], [red.body for red in step.reductions] + row_values, step.stores)

    def emit_vector_choice(self, choice: str, vector_form: bool | None) -> None:
        """The preprocessor lines around the two forms of a "without-libmvec" loop: before the
        vector form (``vector_form`` True), between the two (False), after the scalar one (None)."""
        if choice == "without-libmvec":
            self.emit(0, {True: "#ifndef EMBER_USE_LIBMVEC  // no vector libm: ember's vector types and math",
                          False: "#else", None: "#endif"}[vector_form])

    def emit_vector_pass(self, step: LoopStep, depth: int) -> None:
        """A row pass over the kernel's one inner var on vector types (vector_pass_choice said it
        fits): sum/max/min in float lanes (max/min propagate NaN lane by lane, as torch's), the
        stores and row arrays."""
        k = self.kernel
        var = k.inner_vars[0]
        self.emit_row_invariants(step, depth)
        for red in step.reductions:
            initial = VECTOR_REDUCTIONS[red.reduction_type][0]
            self.emit(depth, f"ember::Vec {red.name}_lanes = ember::vec_splat({initial});")

        def body(inner_depth: int) -> None:
            count = self.vector[1]
            for red in step.reductions:
                value, lanes = self.vector_value(red.body, inner_depth), f"{red.name}_lanes"
                update = (f"{lanes} + {value}" if red.reduction_type == "sum"
                          else f"ember::vec_{red.reduction_type}({value}, {lanes})")
                if count is not None:
                    update = f"ember::vec_select(ember::vec_tail_mask({count}), {update}, {lanes})"
                self.emit(inner_depth, f"{lanes} = {update};")
            for store in step.stores:
                self.emit_store(store.buffer, store.index, store.body, inner_depth)
            for node, array in self.row_cache.stored_by.get(self.current_step, []):
                self.emit(inner_depth, self.vector_access(torch.float32, f"{array} + {self.row_position()}",
                                                          self.vector_value(node, inner_depth)))
        self.emit_vector_loop(var, depth, False, body)
        for red in step.reductions:
            result = f"{VECTOR_REDUCTIONS[red.reduction_type][1]}({red.name}_lanes)"
            self.emit(depth, f"const {compute_type(red.dtype)} {red.name}_val = {_register_value(result, red.dtype)};")
            self.registers[red.name] = f"{red.name}_val"

    def vector_value(self, expr: Expr, depth: int) -> str:
        """``expr`` as an ember::Vec (a scalar broadcast)."""
        name = self.expr(expr, depth)
        return name if self.lane_varying(expr) else f"ember::vec_splat({name})"

    def vector_access(self, dtype: torch.dtype, pointer: str, value: str | None = None) -> str:
        """A load (``value`` None) or store of the lanes at ``pointer``, of ``dtype`` in memory."""
        suffix = {torch.float32: "", torch.bfloat16: "_bf16", torch.float16: "_half"}[dtype]
        count = self.vector[1]
        tail, extra = ("_tail", f", {count}") if count is not None else ("", "")
        if value is None:
            return f"ember::vec_load{suffix}{tail}({pointer}{extra})"
        return f"ember::vec_store{suffix}{tail}({pointer}, {value}{extra});"

    def emit_vector_store(self, buffer: str, index: tuple[Index, ...], body: Expr, depth: int) -> None:
        value = self.vector_value(body, depth)
        if buffer in self.row_cache.private_arrays:
            array, _ = self.row_cache.private_arrays[buffer]
            self.emit(depth, self.vector_access(torch.float32, f"{array} + {self.row_position()}", value))
            return
        plan = self.buffers[buffer]
        pointer = f"{self.pointer(buffer)} + ({self.address(plan, index)})"
        self.emit(depth, self.vector_access(plan.dtype, pointer, value))

    def render_vector_node(self, node: Expr, depth: int) -> str:
        """A lane-varying node (vector_loop_fits said which) as an ember::Vec expression."""
        if isinstance(node, Load):
            if node.buffer in self.row_cache.private_arrays:
                return self.vector_access(torch.float32, f"{self.row_cache.private_arrays[node.buffer][0]} + "
                                                         f"{self.row_position()}")
            plan = self.buffers[node.buffer]
            return self.vector_access(plan.dtype, f"{self.pointer(node.buffer)} + "
                                                  f"({self.address(plan, node.index, depth)})")
        if isinstance(node, Cast):
            src, dst = node.arg.dtype, node.dtype
            value = self.arg(node.arg)
            skip_rounding = self.holds_rounded(node.arg, src if src in LOW_PRECISION else dst)
            if src in LOW_PRECISION and dst != src and not skip_rounding:   # as _cast
                value = f"ember::vec_round_{'bf16' if src == torch.bfloat16 else 'half'}({value})"
            if dst in LOW_PRECISION and not (src not in LOW_PRECISION and skip_rounding):
                value = f"ember::vec_round_{'bf16' if dst == torch.bfloat16 else 'half'}({value})"
            return value
        template = VECTOR_OPS[node.op]
        if node.op == "exp" and INLINE_EXPF and self.may_be_far_below_zero(node.args[0]):
            template = "ember::vec_exp({0})"      # ember's own: libmvec's goes lane by lane there
        args = [self.arg(a) if self.lane_varying(a) or not template.startswith("ember::")
                else f"ember::vec_splat({self.arg(a)})" for a in node.args]
        return template.format(*args)


# ============================================================ scalar printing
def _accumulator_start(red: KernelReduction) -> tuple[str, str]:
    """(C type, initial value) of a reduction's accumulator."""
    rtype = red.reduction_type
    acc_type = _accumulator_type(red.dtype if rtype not in ("argmax", "argmin") else red.body.dtype)
    if rtype == "sum":
        return acc_type, "0"
    if rtype == "prod":
        return acc_type, "1"
    if rtype in ("max", "min", "argmax", "argmin"):
        low = rtype in ("max", "argmax")
        if acc_type in ("float", "double"):
            return acc_type, "-INFINITY" if low else "INFINITY"
        return acc_type, f"std::numeric_limits<{acc_type}>::{'lowest' if low else 'max'}()"
    raise CompileError(f"unknown reduction {rtype}", stage="codegen", op=red.name)


def _unit_stride(flat: Index, var: ir.Var) -> bool:
    """Does the address ``flat`` step by exactly one element along ``var`` (and take it nowhere
    else: not inside a division, modulo or gathered index)?"""
    rest = [(atom, coeff) for atom, coeff in flat.terms if atom != var]
    return dict(flat.terms).get(var) == 1 and var not in ir.Index(rest).free_vars()


def _has_nan_flag(red: KernelReduction) -> bool:
    """Float max/min keep a NaN flag beside the accumulator (torch propagates NaN; the
    accumulator's compare-and-select does not)."""
    return red.reduction_type in ("max", "min") and red.dtype.is_floating_point


def _accumulator_type(dtype: torch.dtype) -> str:
    if dtype in LOW_PRECISION or dtype == torch.float32:
        return "float"
    if dtype == torch.float64:
        return "double"
    return "int64_t" if dtype != torch.bool else "bool"


def _from_storage(raw: str, dtype: torch.dtype) -> str:
    if dtype == torch.bfloat16:
        return f"ember_bf16_to_float({raw})"
    if dtype == torch.float16:
        return f"ember_half_to_float({raw})"
    if dtype == torch.bool:
        return f"({raw} != 0)"
    return raw


def _to_storage(value: str, dtype: torch.dtype, value_dtype: torch.dtype, rounded: bool = False) -> str:
    """``rounded``: the value is a bf16/fp16 number already (KernelPrinter.holds_rounded)."""
    if dtype == torch.bfloat16:
        return f"ember_bf16_bits({value})" if rounded else f"ember_float_to_bf16({value})"
    if dtype == torch.float16:
        return f"ember_float_to_half({value})"
    if dtype == torch.bool:
        return f"static_cast<uint8_t>({value} != 0)" if value_dtype != torch.bool else f"static_cast<uint8_t>({value})"
    return value


def _literal(value: object, dtype: torch.dtype) -> str:
    ctype = compute_type(dtype)
    if dtype == torch.bool:
        return "true" if value else "false"
    if dtype.is_floating_point:
        v = float(value)
        if math.isnan(v):
            return f"static_cast<{ctype}>(NAN)"
        if math.isinf(v):
            return f"static_cast<{ctype}>({'-' if v < 0 else ''}INFINITY)"
        text = repr(v)
        return f"{text}f" if ctype == "float" else text
    v = int(value)
    if dtype == torch.int64:
        return f"INT64_C({v})" if v != -(1 << 63) else "std::numeric_limits<int64_t>::min()"
    return f"static_cast<{ctype}>({v})"


def _register_value(result: str, dtype: torch.dtype) -> str:
    """A reduction's result as its fused consumers read it: fp16/bf16 results rounded, as eager's
    reduction outputs are (the same as a store then a load would give)."""
    if dtype in LOW_PRECISION:
        return _cast(result, torch.float32, dtype)
    return f"static_cast<{compute_type(dtype)}>({result})"


def _cast(value: str, src: torch.dtype, dst: torch.dtype, skip_rounding: bool = False) -> str:
    """``skip_rounding``: the value is already a number of the low-precision dtype rounded to
    (``src`` if that is bf16/fp16, else ``dst``; see KernelPrinter.holds_rounded)."""
    if src in LOW_PRECISION and dst != src and not skip_rounding:
        # the value is a bf16/fp16 tensor in eager: round it before it changes type
        value = f"ember_round_{'bf16' if src == torch.bfloat16 else 'half'}({value})"
    if dst == torch.bool:
        return f"({value} != 0)"
    if dst in LOW_PRECISION and src not in LOW_PRECISION and skip_rounding:
        return f"static_cast<float>({value})"
    if dst == torch.bfloat16:
        return f"ember_round_bf16(static_cast<float>({value}))"
    if dst == torch.float16:
        return f"ember_round_half(static_cast<float>({value}))"
    return f"static_cast<{compute_type(dst)}>({value})"


# signbit as copysign: g++ 12 -O3 crashes (ICE in extract_insn) vectorizing std::signbit of a bf16 load
_UNARY_FLOAT = {
    "exp": "exp{F}({0})", "exp2": "exp2{F}({0})", "expm1": "expm1{F}({0})", "log": "log{F}({0})",
    "log1p": "log1p{F}({0})", "log2": "log2{F}({0})", "log10": "log10{F}({0})", "sqrt": "ember::sqrt({0})",
    "rsqrt": "({T}(1) / ember::sqrt({0}))", "reciprocal": "({T}(1) / {0})", "sin": "sin{F}({0})",
    "cos": "cos{F}({0})", "tan": "tan{F}({0})", "asin": "asin{F}({0})", "acos": "acos{F}({0})",
    "atan": "atan{F}({0})", "sinh": "sinh{F}({0})", "cosh": "cosh{F}({0})", "tanh": "tanh{F}({0})",
    "asinh": "asinh{F}({0})", "acosh": "acosh{F}({0})", "atanh": "atanh{F}({0})", "erf": "erf{F}({0})",
    "erfc": "erfc{F}({0})", "erfinv": "static_cast<{T}>(ember_erfinv({0}))", "lgamma": "ember::lgamma({0})",
    "sigmoid": "({T}(1) / ({T}(1) + exp{F}(-{0})))", "floor": "ember::floor({0})", "ceil": "ember::ceil({0})",
    "round": "ember::nearbyint({0})", "trunc": "ember::trunc({0})", "abs": "ember::abs({0})", "neg": "(-{0})",
    "sign": "ember_sign({0})", "signbit": "(ember::copysign({T}(1), {0}) < {T}(0))", "isnan": "({0} != {0})",
    "isinf": "ember::isinf({0})", "isfinite": "ember::isfinite({0})", "logical_not": "!({0})",
}
_UNARY_INT = {
    "abs": "({0} < 0 ? static_cast<{T}>(-{0}) : {0})", "neg": "static_cast<{T}>(-{0})", "sign": "ember_sign({0})",
    "signbit": "({0} < 0)", "isnan": "false", "isinf": "false", "isfinite": "true", "logical_not": "!({0})",
    "bitwise_not": "static_cast<{T}>(~{0})", "floor": "{0}", "ceil": "{0}", "round": "{0}", "trunc": "{0}",
}
_BINARY_COMMON = {
    "add": "({0} + {1})", "sub": "({0} - {1})", "mul": "({0} * {1})", "div": "({0} / {1})",
    "maximum": "ember_max({0}, {1})", "minimum": "ember_min({0}, {1})",
    "eq": "({0} == {1})", "ne": "({0} != {1})", "lt": "({0} < {1})", "le": "({0} <= {1})", "gt": "({0} > {1})",
    "ge": "({0} >= {1})", "logical_and": "(({0} != 0) && ({1} != 0))", "logical_or": "(({0} != 0) || ({1} != 0))",
    "logical_xor": "(({0} != 0) != ({1} != 0))",
}
_BINARY_FLOAT = {
    "floor_divide": "ember_floordiv_float({0}, {1})", "remainder": "ember_remainder_float({0}, {1})",
    "fmod": "ember::fmod({0}, {1})", "pow": "pow{F}({0}, {1})", "atan2": "atan2{F}({0}, {1})",
    "hypot": "hypot{F}({0}, {1})", "copysign": "ember::copysign({0}, {1})",
}
_BINARY_INT = {
    "floor_divide": "ember_floordiv_int({0}, {1})", "remainder": "ember_remainder_int({0}, {1})",
    "fmod": "ember_fmod_int({0}, {1})", "pow": "ember_pow_int({0}, {1})",
    "bitwise_and": "({0} & {1})", "bitwise_or": "({0} | {1})", "bitwise_xor": "({0} ^ {1})",
    "bitwise_left_shift": "ember_shl({0}, {1})", "bitwise_right_shift": "ember_shr({0}, {1})",
}
_BOOL_OPS = {"add": "({0} || {1})", "mul": "({0} && {1})", "maximum": "({0} || {1})", "minimum": "({0} && {1})",
             "bitwise_and": "({0} && {1})", "bitwise_or": "({0} || {1})", "bitwise_xor": "({0} != {1})",
             "bitwise_not": "!({0})", "abs": "{0}"}


def render_op(node: Op, args: list[str], inline_exp: bool = False) -> str:
    """C++ for one elementwise op on already-computed operands (``inline_exp``: a float exp
    through the prelude's ember_expf, see INLINE_EXPF)."""
    name = node.op
    if name == "where":
        return f"({args[0]} ? {args[1]} : {args[2]})"
    if name == "philox_uniform":   # (seed, counter) -> float in [0, 1), see lower/lower_indexing.py
        return f"ember_philox_uniform({args[0]}, {args[1]})"
    if name == "check_index":      # (index, size, code, reported) -> index; see lower/lower_indexing.py
        return f"ember_check_index({args[0]}, {args[1]}, {args[2]}, {args[3]}, ember_error)"
    operand_dtype = node.args[0].dtype if node.args else node.dtype
    T = compute_type(operand_dtype)
    is_float = operand_dtype.is_floating_point
    if operand_dtype == torch.bool and name in _BOOL_OPS:
        template = _BOOL_OPS[name]
    elif name in _BINARY_COMMON:
        template = _BINARY_COMMON[name]
        if name == "div" and not is_float:
            template = "(static_cast<double>({0}) / static_cast<double>({1}))"
    elif len(args) == 2:
        template = (_BINARY_FLOAT if is_float else _BINARY_INT).get(name)
    else:
        template = (_UNARY_FLOAT if is_float else _UNARY_INT).get(name)
        if template is None and not is_float and name in _UNARY_FLOAT:
            # e.g. exp of an int tensor is computed in float by torch's decomposition; be safe
            template = _UNARY_FLOAT[name].replace("{0}", "static_cast<double>({0})").replace("{F}", "").replace(
                "{T}", "double")
    if template is None:
        raise CompileError(f"no C++ rendering for {name} on {operand_dtype}", stage="codegen", op=name)
    if T == "float" and inline_exp and name == "exp":
        template = "ember_expf({0})"
    return template.format(*args, T=T, F="f" if T == "float" else "")
