"""Triton code generator: a Schedule's FusedKernels -> one readable Python module of @triton.jit kernels.

The sibling of codegen/cpp.py; both consume the same FusedKernel steps.  How a
FusedKernel maps onto Triton programs:

* pointwise kernel (no inner vars): the outer loop nest is flattened to one
  index ``xindex`` of ``XBLOCK`` consecutive elements per program.  Loads and
  stores whose address is a contiguous run of the flattened index print as
  ``xindex`` (or ``xindex % n`` / ``xindex // n`` for broadcasts), which Triton's
  axis analysis turns into 16-byte vector accesses; other accesses unflatten
  the vars they need (``x1 = xindex // 64 % 32``).
* reduction kernel: a 2-D block ``[XBLOCK rows, RBLOCK reduced elements]``.
  *Persistent* when the reduced size fits one block (``RBLOCK >= rnumel``):
  every step of the kernel (e.g. softmax's max, sum and store) works on the same
  tile held in registers, so the row is read from memory once.  *Looped*
  otherwise: each inner step is a ``for roffset`` loop with per-lane
  accumulators reduced at the end (Welford per lane, merged with a combine
  function, for var/mean).
* kernels that differ only in names (the same block of every transformer layer)
  are printed once; the others are aliases (``kernel7 = kernel3``) and share
  the compiled binary.
* indirect indices are checked (``_ember_check_index``: ``tl.device_assert``, so those
  kernels are compiled with debug=True; the interpreter raises eager's exception);
* masks only where the block does not divide the size; int32 index math unless
  some address or size needs int64; fp32 accumulation for bf16/fp16; max/min and
  arg-reductions propagate NaN like torch.

Block sizes and ``num_warps`` come from ``choose_config``; ``TUNING`` lets
benchmarks override them.  Kernels are built and launched by
runtime/triton_build.py.
"""
from __future__ import annotations

import ast
import collections
import dataclasses
import io
import keyword
import math
import re
import tokenize

import torch

from ember import config as ember_config
from ember.codegen import triton_ops
from ember.codegen.triton_ops import LOW_PRECISION, compute_type, literal, render_op
from ember.errors import CompileError
from ember.lower import ir
from ember.lower.ir import Cast, Const, Expr, Index, IndexValue, Load, Op, Var
from ember.symbolic import as_size, hint_of, is_symbolic, known_multiple, python_code
from ember.lower.scheduler import BufferPlan, FusedKernel, KernelReduction, KernelStore, LoopStep, Schedule

# benchmark/tuning overrides: keys "pointwise_block", "pointwise_warps", "persistent_limit",
# "looped_rblock", "reduction_elements" (elements per program for persistent reductions)
TUNING: dict[str, int] = {}

PERSISTENT_LIMIT = 8192        # largest reduced size kept in one block (registers)
POINTWISE_BLOCK = 1024
LOOPED_RBLOCK = 2048
REDUCTION_ELEMENTS = 4096      # target XBLOCK * RBLOCK for persistent reductions of short rows
SYMBOLIC_ROW_BUCKET = 1024     # the shortest persistent block for rows of symbolic length
COLUMN_FEW_PROGRAMS = 132      # a column reduction in fewer programs than an H100's SMs ...
COLUMN_FEW_ELEMENTS = 16384    # ... takes tiles of up to this many elements


def _pow2(n: int) -> int:
    return 1 << max(0, (max(n, 1) - 1).bit_length())


@dataclasses.dataclass
class KernelConfig:
    kind: str                  # "pointwise" | "persistent" | "looped"
    xblock: int
    rblock: int
    num_warps: int
    index_type: str            # "tl.int32" | "tl.int64"

    def grid(self, xnumel: int) -> tuple[int, int, int]:
        return (max(1, -(-xnumel // self.xblock)), 1, 1)


@dataclasses.dataclass
class TritonKernel:
    """One generated kernel: its source (inside the module), launch config and arguments."""

    name: str
    source: str
    arguments: list[str]             # buffer names, in parameter order
    signature: dict[str, str]        # parameter name -> Triton type ("*fp32")
    aligned: list[bool]              # per argument: assume the pointer is 16-byte aligned
    config: KernelConfig
    grid: tuple[int, int, int]
    bytes_accessed: int
    flops: int
    scalars: list[str] = dataclasses.field(default_factory=list)   # arguments passed as Python numbers
    checks_indices: bool = False     # asserts indirect indices in range: compiled with debug=True
    size_args: list[str] = dataclasses.field(default_factory=list)  # size symbols, after the pointers
    grid_code: str | None = None     # symbolic sizes: the grid's first dim as Python over size_args


def choose_config(kernel: FusedKernel, buffers: dict[str, BufferPlan], index_type: str,
                  inner_contiguous: bool) -> KernelConfig:
    """Block shape and warps from the problem size (the 'heuristics' of the issue)."""
    xnumel, rnumel = kernel.outer_numel, kernel.inner_numel
    if is_symbolic(xnumel):     # dynamic shapes: blocks for any size (the hint is only a typical one)
        xnumel = max(hint_of(xnumel), POINTWISE_BLOCK)
    if not kernel.inner_vars:
        block = TUNING.get("pointwise_block", POINTWISE_BLOCK)
        block = min(block, _pow2(xnumel))
        warps = TUNING.get("pointwise_warps", 4 if block <= 1024 else 8)
        return KernelConfig("pointwise", max(block, 16), 1, max(1, min(warps, max(block // 128, 1))), index_type)
    limit = TUNING.get("persistent_limit", PERSISTENT_LIMIT)
    if is_symbolic(rnumel):
        # rows of any length in a size range: a persistent block for rows up to the bucket of
        # the typical row (1024, 2048, ... up to the limit; guarded: a longer row recompiles
        # with the next bucket), or a looped kernel when rows are long already.  One block as
        # long as the limit for every row made a 512-long softmax row do 16x its work.
        bucket = min(_pow2(limit), max(SYMBOLIC_ROW_BUCKET, _pow2(hint_of(rnumel))))
        if not inner_contiguous or hint_of(rnumel) > limit or not rnumel <= bucket:
            rblock = 64 if not inner_contiguous else TUNING.get("looped_rblock", LOOPED_RBLOCK)
            xblock = 64 if not inner_contiguous else 1
            return KernelConfig("looped", xblock, rblock, 8 if xblock * rblock >= 2048 else 4, index_type)
        rblock = bucket
        xblock = max(1, min(_pow2(xnumel), TUNING.get("reduction_elements", REDUCTION_ELEMENTS) // rblock, 64))
        return KernelConfig("persistent", xblock, rblock, 4 if xblock * rblock <= 2048 else 8, index_type)
    if not inner_contiguous:
        # reduced dim is strided (column sums): many rows per program, rows are the contiguous axis.
        # Few programs leave SMs idle: vit's norm-weight gradients in 384 programs of 64 columns
        # drew half the bandwidth that 768 programs do, so those take blocks of 32 columns.
        # Welford statistics (BatchNorm's, channels-last) are bound by their arithmetic rather
        # than their loads: 64 columns by 32 rows ran ResNet-50's at 0.7x the time of 32 by 64
        # (benchmarks/gpu_column_reductions.py)
        welford = any(r.reduction_type.startswith("welford") for step in kernel.steps for r in step.reductions)
        rblock = min(_pow2(rnumel), TUNING.get("column_rblock", 32 if welford else 64))
        xblock = min(_pow2(xnumel), TUNING.get("column_xblock", 64))
        if not welford and -(-hint_of(xnumel) // 64) < ember_config.column_min_programs:
            xblock = min(xblock, 32)
        if -(-hint_of(xnumel) // xblock) < COLUMN_FEW_PROGRAMS:
            # a short column reduction (the second stage of a split one) runs in a few programs,
            # each looping over its rows: longer tiles take fewer dependent passes (the stem's
            # BatchNorm statistics' second stage 10.9 -> 4.4 us)
            xblock = min(xblock, 32)
            rblock = min(_pow2(rnumel), max(rblock, TUNING.get("column_few_elements", COLUMN_FEW_ELEMENTS) // xblock))
        kind = "persistent" if rblock >= rnumel else "looped"
        warps = TUNING.get("column_warps", 4 if xblock * rblock <= 2048 else 8)
        return KernelConfig(kind, xblock, rblock, warps, index_type)
    if rnumel <= limit:
        rblock = _pow2(rnumel)
        elements = TUNING.get("reduction_elements", REDUCTION_ELEMENTS)
        xblock = max(1, min(_pow2(xnumel), elements // rblock, 64))
        total = xblock * rblock
        warps = 2 if total <= 256 else 4 if total <= 2048 else 8 if total <= 4096 else 16
        return KernelConfig("persistent", xblock, rblock, warps, index_type)
    rblock = TUNING.get("looped_rblock", LOOPED_RBLOCK)
    return KernelConfig("looped", 1, rblock, 8 if rblock >= 2048 else 4, index_type)


# a size symbol in printed code (ember/symbolic.py names them s0, s1, ...)
SIZE_SYMBOL = re.compile(r"\bs\d+\b")


# ============================================================ the module
def scalar_buffers(sched: Schedule) -> set[str]:
    """Buffers that kernels take as scalar arguments: Python numbers returned by Externs (the seed)."""
    return {name for name, node in sched.program.nodes.items()
            if isinstance(node, ir.ExternOutput) and node.scalar and name in sched.buffers}


def generate_triton(sched: Schedule, interpret: bool | None = None) -> tuple[str, list[TritonKernel]]:
    """The whole module: imports, helper prelude, one @triton.jit function per kernel.

    ``interpret``: generate for Triton's interpreter (default: whether TRITON_INTERPRET is set)."""
    token = triton_ops.INTERPRET.set(interpret)
    try:
        scalars = scalar_buffers(sched)
        kernels = [TritonKernelPrinter(k, sched.buffers, scalars).render() for k in sched.kernels]
    finally:
        triton_ops.INTERPRET.reset(token)
    first_with_code: dict[tuple, TritonKernel] = {}
    # the code part of the key (tokenizing: most of this function's time) is worth computing only
    # for kernels whose launch matches another kernel's
    launches = collections.Counter(_launch_key(kernel) for kernel in kernels)
    keys_by_text: dict[tuple, tuple] = {}
    for kernel in kernels:
        if launches[_launch_key(kernel)] == 1:
            continue                  # no other kernel can have the same code
        first = first_with_code.setdefault(_code_key(kernel, keys_by_text), kernel)
        if first is not kernel:
            kernel.source = f"{kernel.name} = {first.name}  # the same code as {first.name}\n"
            kernel.signature = first.signature        # keyed by the parameter names of first's function
    parts = ['"""Generated by ember (codegen/triton.py).  One @triton.jit function per fused kernel."""',
             "import triton", "import triton.language as tl", "",
             "from ember.runtime.triton_math import libm", triton_ops.PRELUDE]
    parts.extend(k.source for k in kernels)
    return "\n".join(parts), kernels


def same_code_key(kernel: TritonKernel) -> tuple:
    """Equal for kernels whose code differs only in names: parameters and locals are renamed in
    order of first use, comments dropped; argument types, alignment and launch config included."""
    function = ast.parse(kernel.source).body[0]
    local_names = {a.arg for a in function.args.args}
    local_names |= {n.id for n in ast.walk(function) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}
    renamed: dict[str, str] = {}
    words = []
    tokens = list(tokenize.generate_tokens(io.StringIO(kernel.source).readline))
    for i, token in enumerate(tokens):
        if token.type == tokenize.COMMENT or (i > 0 and tokens[i - 1].string == "def"):
            continue
        text = token.string
        if token.type == tokenize.NAME and text in local_names:
            text = renamed.setdefault(text, f"v{len(renamed)}")
        words.append(text)
    return (" ".join(words), *_launch_key(kernel))


def _code_key(kernel: TritonKernel, keys_by_text: dict[tuple, tuple]) -> tuple:
    """same_code_key, computed once per text of ``_numbered_text`` (a model's repeated layers
    give kernels that differ only in their parameters' names and comments)."""
    text = _numbered_text(kernel.source)
    if text is None:
        return same_code_key(kernel)
    cache_key = (text, *_launch_key(kernel))
    key = keys_by_text.get(cache_key)
    if key is None:
        key = keys_by_text[cache_key] = same_code_key(kernel)
    return key


_DEF = re.compile(r"\bdef (\w+)\(([^)]*)\)")
_COMMENT = re.compile(r"#[^\n]*")
_NAME = re.compile(r"\b[A-Za-z_]\w*")
_ASSIGNED = re.compile(r"^[ \t]*([A-Za-z_]\w*)[ \t]*(?::[^=\n]*)?=(?!=)", re.MULTILINE)   # name = / name: T =


def _numbered_text(source: str) -> str | None:
    """The source without comments and the function's name, its parameters and assigned locals
    numbered: two kernels with the same text have equal same_code_keys (the same tokens but for
    comments, the name and a renaming of local names).  None where plain text cannot tell:
    string literals (a '#' or a name inside one), statements over several lines (a keyword
    argument looks like an assignment), parameters that are not a plain list of names."""
    if "'" in source or '"' in source or "\\" in source:
        return None
    code = _COMMENT.sub("", source)
    if any(line.count("(") != line.count(")") or line.count("[") != line.count("]") or
           line.count("{") != line.count("}") for line in code.splitlines()):
        return None
    signature = _DEF.search(code)
    if signature is None:
        return None
    parameters = [p.strip() for p in signature.group(2).split(",") if p.strip()]
    if not all(p.isidentifier() for p in parameters):
        return None
    assigned = [name for name in _ASSIGNED.findall(code) if not keyword.iskeyword(name)]   # not "else: x = 1"
    local_names = dict.fromkeys(parameters + assigned)
    numbered = {name: f"\0{i}" for i, name in enumerate(local_names)}     # \0: no name can take it
    text = code[:signature.start(1)] + code[signature.end(1):]
    return _NAME.sub(lambda name: numbered.get(name.group(0), name.group(0)), text)


def _launch_key(kernel: TritonKernel) -> tuple:
    """same_code_key but the code: argument types, alignment, launch config, scalar positions."""
    return (tuple(kernel.signature.values()), tuple(kernel.aligned), repr(kernel.config), kernel.grid,
            tuple(kernel.arguments.index(s) for s in kernel.scalars))


@ir._cached_hash
@dataclasses.dataclass(frozen=True, eq=False)
class GuardedLoad(Expr):
    """A load in a branch of ``where``: the lanes where ``guard`` is false take the other branch,
    so they read nothing (a masked load).  A cat or pad kernel then reads each source only where
    it is selected, not every source everywhere at a wrapped index."""
    load: Load
    guard: Expr
    dtype: torch.dtype

    def children(self) -> tuple[Expr, ...]:
        return (self.guard,)


def guard_branch_loads(body: Expr, unguarded: set[str]) -> Expr:
    """``body`` with the loads that only a positional ``where``'s branch reads made GuardedLoads
    (the branch's arithmetic then works on 0 in the lanes the where discards).  Loads also read
    outside the branches (a relu's ``where(x > 0, x, 0)``), loads of buffers in ``unguarded``
    (registers, buffers the kernel writes) and loads at indirect indices (whose bounds checks
    must see eager's values) stay as they are."""
    shared = _loads_outside_branches(body)

    def guarded(branch: Expr, guard: Expr, done: dict[int, Expr]) -> Expr:
        if id(branch) in done:
            return done[id(branch)]
        if isinstance(branch, Load):
            out = branch
            if branch not in shared and branch.buffer not in unguarded and \
                    any(i.free_vars() for i in branch.index) and \
                    not any(next(ir.indirect_atoms(i), None) for i in branch.index):
                out = GuardedLoad(branch, guard, branch.dtype)
        elif isinstance(branch, GuardedLoad):       # a nested where's branch: read where both select it
            out = GuardedLoad(branch.load, Op("logical_and", (guard, branch.guard), torch.bool), branch.dtype)
        elif isinstance(branch, Cast) or isinstance(branch, Op) and branch.op != "check_index":
            out = ir.replace_children(branch, tuple(guarded(c, guard, done) for c in branch.children()))
        else:
            out = branch
        done[id(branch)] = out
        return out

    def rewrite(node: Expr, children: tuple[Expr, ...]) -> Expr:
        node = ir.replace_children(node, children)
        if not _is_select(node):
            return node
        condition, chosen, other = node.args
        return Op("where", (condition, guarded(chosen, condition, {}),
                            guarded(other, Op("logical_not", (condition,), torch.bool), {})), node.dtype)
    return ir.map_expr(body, rewrite)


def _is_select(node: Expr) -> bool:
    """A where whose condition depends on the element's position alone (cat, pad, a causal mask
    from iota): Triton's axis analysis sees such a mask constant over runs of elements and keeps
    16-byte vector loads.  A condition on loaded or random values (dropout, relu) would make the
    loads element-wise masked, and scalar."""
    return isinstance(node, Op) and node.op == "where" and not isinstance(node.args[0], Const) and \
        node.args[0].dtype == torch.bool and _positional(node.args[0])


def _positional(condition: Expr) -> bool:
    return all(isinstance(n, (IndexValue, Const, Cast)) or isinstance(n, Op) and n.op in _POSITIONAL_OPS
               for n in ir.walk(condition))


_POSITIONAL_OPS = frozenset({"lt", "le", "gt", "ge", "eq", "ne", "logical_and", "logical_or", "logical_not",
                             "bitwise_and", "bitwise_or", "bitwise_not", "add", "sub", "mul"})


def _loads_outside_branches(body: Expr) -> set[Load]:
    """The loads some lane of ``body`` reads whatever the wheres select (not only in a branch)."""
    found: set[Load] = set()
    seen: set[int] = set()
    stack = [body]
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, Load):
            found.add(node)
        stack.extend(node.args[:1] if _is_select(node) else node.children())
    return found


class TritonKernelPrinter:
    def __init__(self, kernel: FusedKernel, buffers: dict[str, BufferPlan], scalars: set[str] | frozenset = frozenset()):
        self.kernel = kernel
        self.buffers = buffers
        self.scalars = set(scalars) & set(kernel.reads)   # taken by value, not through a pointer
        self.lines: list[str] = []
        self.depth = 1
        self.tmp_counter = 0
        self.scopes: list[dict] = []
        self.registers: dict[str, str] = {}     # reduction name -> variable holding its [XBLOCK, 1] result
        # fp32 temporary of a bf16/fp16 conversion -> the temporary holding the converted (storage) value
        self.storage_of: dict[str, str] = {}
        self._pending_storage: str | None = None
        # the current step's bf16/fp16 stores, by the node whose value they store: each is emitted as
        # soon as that value is converted, before it is widened back to fp32 (see store_before_widening)
        self.stores_due: dict[Expr, list[KernelStore]] = {}
        self.stored_early: set[int] = set()     # id() of the step's stores already emitted
        self.written: set[str] = set()          # buffers this kernel has stored so far
        self.outer_vars = tuple(kernel.outer_vars)
        self.inner_vars = tuple(kernel.inner_vars)
        self.xnumel = kernel.outer_numel
        self.rnumel = kernel.inner_numel
        self.two_d = bool(self.inner_vars)
        self.checks_indices = False

    # ---------------------------------------------------------- decisions
    def index_type(self) -> str:
        limit = 2**31 - 1
        extents = [self.xnumel * max(self.rnumel, 1), 1]
        for name in self.arguments():
            plan = self.buffers[name]
            extents.append(sum((s - 1) * abs(st) for s, st in zip(plan.shape, plan.stride) if s > 0) + 1)
        # indices used as values (iota, Philox counters = offset + linear index) are computed in it too
        for step in self.kernel.steps:
            for body in [r.body for r in step.reductions] + [st.body for st in step.stores]:
                for node in ir.walk(body):
                    if isinstance(node, IndexValue):
                        lo, hi = node.index.bounds()
                        extents += [abs(lo) + 1, abs(hi) + 1]
        if any(is_symbolic(e) for e in extents):
            # one guard on a bound of them all (none is negative: their sum), not a guard per
            # ordering of two sizes (s1 + 1 <= s0), which other sizes fail and recompile
            return "tl.int32" if sum(extents) + 2 * 8192 < limit else "tl.int64"
        return "tl.int32" if max(extents) + 2 * 8192 < limit else "tl.int64"

    def arguments(self) -> list[str]:
        return list(self.kernel.reads) + list(self.kernel.writes)

    def inner_contiguous(self) -> bool:
        """Does the main read walk memory along the reduced dim (row reductions) or across rows?"""
        if not self.two_d:
            return True
        inner_hits = outer_hits = 0
        for step in self.kernel.steps:
            bodies = [r.body for r in step.reductions] + [s.body for s in step.stores]
            for body in bodies:
                for ld in ir.loads(body):
                    if ld.buffer not in self.buffers or ld.buffer in self.kernel.local_reductions:
                        continue
                    coeffs = dict(self.address(self.buffers[ld.buffer], ld.index).terms)
                    last_inner = next((v for v in reversed(self.inner_vars) if v.size > 1), None)
                    if last_inner is not None and coeffs.get(last_inner) == 1:
                        inner_hits += 1
                    elif last_inner in coeffs:
                        # strided along the reduced dim: a column read, whether the row index is
                        # a plain var or a div/mod of one (a bias gradient over a cat of q, k, v
                        # read 16 bytes per row as a row reduction: 0.6 TB/s on the H100)
                        outer_hits += 1
        return inner_hits >= outer_hits

    # ---------------------------------------------------------- structure
    def render(self) -> TritonKernel:
        k = self.kernel
        index_type = self.index_type()
        self.config = config = choose_config(k, self.buffers, index_type, self.inner_contiguous())
        args = self.arguments()
        params = [self.pointer(a) for a in args]
        grid = config.grid(hint_of(self.xnumel))
        head = [
            "@triton.jit",
            f"def {k.name}({', '.join(params)}):",
            f"    # {len(k.fused_ops)} fused ops: {', '.join(k.fused_ops[:12])}" + (" ..." if len(k.fused_ops) > 12 else ""),
            (f"    # loops: outer {[v.size for v in self.outer_vars]}, inner {[v.size for v in self.inner_vars]}; "
             f"bytes: {k.bytes_accessed}, flops: {k.flops}"),
            f"    # {config.kind}: XBLOCK={config.xblock}" + (f" RBLOCK={config.rblock}" if self.two_d else "")
            + f", num_warps={config.num_warps}, {config.index_type.replace('tl.', '')} indexing, grid {grid}",
        ]
        self.lines = head
        self.scopes.append({})
        if self.two_d:
            self.emit_reduction_kernel()
        else:
            self.emit_pointwise_kernel()
        size_args = sorted(set(SIZE_SYMBOL.findall("\n".join(self.lines[5:]))), key=lambda n: int(n[1:]))
        if size_args:   # dynamic shapes: the size symbols the body uses are i64 parameters after the pointers
            self.lines[1] = f"def {k.name}({', '.join(params + size_args)}):"
        source = "\n".join(self.lines) + "\n"
        signature = {self.pointer(a): triton_ops.SIGNATURE_TYPE[self.buffers[a].dtype].lstrip("*")
                     if a in self.scalars else triton_ops.SIGNATURE_TYPE[self.buffers[a].dtype] for a in args}
        # 16-byte aligned pointers (Triton vectorizes their loads); a symbolic offset only when
        # every value is aligned (no guard: unaligned kernels are merely slower)
        aligned = [a not in self.scalars and
                   known_multiple(self.buffers[a].storage_offset * self.buffers[a].dtype.itemsize, 16) for a in args]
        signature.update({name: "i64" for name in size_args})
        grid_code = None
        if is_symbolic(self.xnumel):
            grid_code = f"max(1, -(-{python_code(self.xnumel)} // {config.xblock}))"
        return TritonKernel(k.name, source, args, signature, aligned, config, grid, k.bytes_accessed, k.flops,
                            [a for a in args if a in self.scalars], self.checks_indices, size_args, grid_code)

    def pointer(self, buffer: str) -> str:
        return f"{'in' if buffer in self.kernel.reads else 'out'}_{buffer}"

    def emit(self, text: str) -> None:
        self.lines.append("    " * self.depth + text)

    def emit_numel(self, name: str, numel: Any) -> None:
        if is_symbolic(numel):     # dynamic shapes: from the size arguments
            self.emit(f"{name} = {python_code(numel)}")
        else:
            # constexpr, not a plain local: Triton 3.6's interpreter cannot take a plain int local as range()'s bound
            self.emit(f"{name}: tl.constexpr = {numel}")

    @staticmethod
    def float_size(size: Any, minus: float = 0) -> str:
        """``size - minus`` as a float divisor (never below 0: var of one element divides by 0, as eager)."""
        if is_symbolic(size):
            return f"tl.maximum({python_code(size)} - {minus!r}, 0.0)"
        return repr(float(max(size - minus, 0)))

    def new_tmp(self, hint: str = "tmp") -> str:
        self.tmp_counter += 1
        return f"{hint}{self.tmp_counter - 1}"

    # ---------------------------------------------------------- pointwise
    def emit_pointwise_kernel(self) -> None:
        c = self.config
        self.emit(f"XBLOCK: tl.constexpr = {c.xblock}")
        self.emit_numel("xnumel", self.xnumel)
        pid = "tl.program_id(0)" + (".to(tl.int64)" if c.index_type == "tl.int64" else "")
        self.emit(f"xindex = {pid} * XBLOCK + tl.arange(0, XBLOCK)")
        self.xmask = "xmask" if is_symbolic(self.xnumel) or self.xnumel % c.xblock else None
        self.rmask = None
        if self.xmask:
            self.emit("xmask = xindex < xnumel")
        for step in self._guarded_steps():
            self.expect_stores(step)
            self.emit_stores(step)

    def _guarded_steps(self) -> list[LoopStep]:
        """The kernel's steps with their branch-only loads guarded (``guard_branch_loads``), each
        body rewritten once (a var and a mean of one body stay one Welford pass)."""
        unguarded = set(self.scalars) | set(self.kernel.writes) | set(self.kernel.local_reductions)
        done: dict[int, Expr] = {}

        def guarded(body: Expr) -> Expr:
            if id(body) not in done:
                done[id(body)] = guard_branch_loads(body, unguarded)
            return done[id(body)]
        return [dataclasses.replace(step, stores=[dataclasses.replace(s, body=guarded(s.body)) for s in step.stores],
                                    reductions=[dataclasses.replace(r, body=guarded(r.body)) for r in step.reductions])
                for step in self.kernel.steps]

    # ---------------------------------------------------------- reductions
    def emit_reduction_kernel(self) -> None:
        c = self.config
        self.emit(f"XBLOCK: tl.constexpr = {c.xblock}")
        self.emit(f"RBLOCK: tl.constexpr = {c.rblock}")
        self.emit_numel("xnumel", self.xnumel)
        self.emit_numel("rnumel", self.rnumel)
        pid = "tl.program_id(0)" + (".to(tl.int64)" if c.index_type == "tl.int64" else "")
        self.emit(f"xindex = {pid} * XBLOCK + tl.arange(0, XBLOCK)[:, None]")
        self.xmask = "xmask" if is_symbolic(self.xnumel) or self.xnumel % c.xblock else None
        if self.xmask:
            self.emit("xmask = xindex < xnumel")
        self.rmask = None
        if c.kind == "persistent":
            self.emit("rindex = tl.arange(0, RBLOCK)[None, :]")
            if is_symbolic(self.rnumel) or self.rnumel != c.rblock:
                self.rmask = "rmask"
                self.emit("rmask = rindex < rnumel")
        for step in self._guarded_steps():
            self.barrier_if_rereading(step)
            if not step.inner:
                self.emit_row_stores(step)
            elif c.kind == "persistent":
                self.emit_persistent_step(step)
            else:
                self.emit_looped_step(step)

    def barrier_if_rereading(self, step: LoopStep) -> None:
        """A looped step that reloads a buffer an earlier loop stored needs the stores visible to all threads."""
        if self.config.kind != "looped" or not self.written:
            return
        bodies = [r.body for r in step.reductions] + [s.body for s in step.stores]
        if any(ld.buffer in self.written for body in bodies for ld in ir.loads(body)):
            self.emit("tl.debug_barrier()  # the loop below re-reads what an earlier loop stored")

    def emit_row_stores(self, step: LoopStep) -> None:
        self.expect_stores(step)
        self.emit_stores(step)

    def full_mask(self) -> str | None:
        masks = [m for m in (self.xmask, self.rmask) if m]
        return " & ".join(masks) if masks else None

    def tile_value(self, body: Expr, dtype: str) -> str:
        """The body over the whole [XBLOCK, RBLOCK] tile, in ``dtype`` (broadcast if it has no r dependence)."""
        if isinstance(body, Const):
            return f"tl.full([XBLOCK, RBLOCK], {literal(body.value, body.dtype)}, {dtype})"
        value = self.expr(body)
        if compute_type(body.dtype) != dtype:
            value = f"{value}.to({dtype})"
        if not self.depends_on_inner(body):
            value = f"tl.broadcast_to({value}, [XBLOCK, RBLOCK])"
        return value

    def depends_on_inner(self, body: Expr) -> bool:
        # a size-1 inner var drops out of addresses (a scalar load), and so does one whose stride
        # is 0 (an expanded input): that is no dependence
        inner = {v for v in self.inner_vars if v.size != 1}
        for node in ir.walk(body):
            if isinstance(node, ir.IndexValue):
                used = node.index.free_vars()
            elif isinstance(node, Load) and node.buffer in self.buffers and node.buffer not in self.scalars:
                used = self.address(self.buffers[node.buffer], node.index).free_vars()
            elif isinstance(node, Load):      # a reduction kept in registers
                used = set().union(*(idx.free_vars() for idx in node.index))
            else:
                continue
            if used & inner:
                return True
        return False

    def emit_persistent_step(self, step: LoopStep) -> None:
        self.expect_stores(step)
        welford: dict[Expr, list[KernelReduction]] = {}
        for red in step.reductions:
            if red.reduction_type.startswith("welford"):
                welford.setdefault(red.body, []).append(red)
                continue
            self.emit(f"# {red.reduction_type} -> {red.name}")
            rtype = red.reduction_type
            if rtype in ("argmax", "argmin"):
                value_type = compute_type(red.body.dtype)
                value = self.tile_value(red.body, value_type)
                ident = triton_ops.lowest(red.body.dtype) if rtype == "argmax" else triton_ops.highest(red.body.dtype)
                if self.rmask:
                    value = f"tl.where(rmask, {value}, {ident})"
                result = f"tl.reduce(({value}, tl.broadcast_to(rindex, [XBLOCK, RBLOCK])), 1, _ember_{rtype})[1]"
            else:
                acc = self.reduction_acc_type(red)
                value = self.tile_value(red.body, acc)
                ident = self.identity(red)
                if self.rmask:
                    value = f"tl.where(rmask, {value}, {ident})"
                result = self.reduce_call(red, value)
            self.finish(red, f"{result}[:, None]")
        for body, group in welford.items():
            base = group[0].name
            self.emit(f"# var/mean -> {', '.join(r.name for r in group)} (two passes over the tile in registers)")
            value = self.tile_value(body, "tl.float64" if body.dtype == torch.float64 else "tl.float32")
            masked = f"tl.where(rmask, {value}, 0.0)" if self.rmask else value
            self.emit(f"{base}_tile = {masked}")
            self.emit(f"{base}_mean = tl.sum({base}_tile, 1)[:, None] / {self.float_size(self.rnumel)}")
            delta = f"{base}_tile - {base}_mean"
            if self.rmask:
                delta = f"tl.where(rmask, {delta}, 0.0)"
            self.emit(f"{base}_delta = {delta}")
            self.emit(f"{base}_m2 = tl.sum({base}_delta * {base}_delta, 1)[:, None]")
            self.finish_welford(group, f"{base}_mean", f"{base}_m2")
        self.emit_stores(step)

    def emit_looped_step(self, step: LoopStep) -> None:
        accumulators = []
        welford: dict[Expr, list[KernelReduction]] = {}
        for red in step.reductions:
            if red.reduction_type.startswith("welford"):
                welford.setdefault(red.body, []).append(red)
                continue
            acc = f"{red.name}_acc"
            if red.reduction_type in ("argmax", "argmin"):
                vtype = compute_type(red.body.dtype)
                ident = triton_ops.lowest(red.body.dtype) if red.reduction_type == "argmax" else \
                    triton_ops.highest(red.body.dtype)
                self.emit(f"{acc} = tl.full([XBLOCK, RBLOCK], {ident}, {vtype})")
                start = self.rnumel if is_symbolic(self.rnumel) else max(self.rnumel, 1)
                self.emit(f"{acc}_index = tl.full([XBLOCK, RBLOCK], {start}, {self.config.index_type})")
            else:
                self.emit(f"{acc} = tl.full([XBLOCK, RBLOCK], {self.identity(red)}, {self.reduction_acc_type(red)})")
            accumulators.append((red, acc))
        for body, group in welford.items():
            base = group[0].name
            wtype = "tl.float64" if body.dtype == torch.float64 else "tl.float32"
            for part in ("mean", "m2", "count"):
                self.emit(f"{base}_{part} = tl.zeros([XBLOCK, RBLOCK], {wtype})")
        self.emit("for roffset in range(0, rnumel, RBLOCK):")
        self.depth += 1
        self.scopes.append({})
        self.emit("rindex = roffset + tl.arange(0, RBLOCK)[None, :]")
        self.rmask = None
        if is_symbolic(self.rnumel) or self.rnumel % self.config.rblock:
            self.rmask = "rmask"
            self.emit("rmask = rindex < rnumel")
        self.expect_stores(step)
        for red, acc in accumulators:
            rtype = red.reduction_type
            if rtype in ("argmax", "argmin"):
                value = self.tile_value(red.body, compute_type(red.body.dtype))
                self.emit(f"{acc}_next, {acc}_index_next = _ember_{rtype}({acc}, {acc}_index, {value}, "
                          f"tl.broadcast_to(rindex, [XBLOCK, RBLOCK]))")
                for suffix in ("", "_index"):
                    self.emit(self.masked_update(f"{acc}{suffix}", f"{acc}{suffix}_next"))
            else:
                value = self.tile_value(red.body, self.reduction_acc_type(red))
                self.emit(self.masked_update(acc, self.combine(red, acc, value)))
        for body, group in welford.items():
            base = group[0].name
            wtype = "tl.float64" if body.dtype == torch.float64 else "tl.float32"
            value = self.tile_value(body, wtype)
            self.emit(f"# Welford update of {', '.join(r.name for r in group)}")
            self.emit(f"{base}_value = {value}")
            self.emit(f"{base}_count_next = {base}_count + 1.0")
            self.emit(f"{base}_delta = {base}_value - {base}_mean")
            # every lane was updated in each earlier pass (only the last one is partial): one
            # reciprocal per pass, not a division per element
            self.emit(f"{base}_weight = tl.full([], 1.0, {wtype}) / (roffset // RBLOCK + 1)")
            self.emit(f"{base}_mean_next = {base}_mean + {base}_delta * {base}_weight")
            self.emit(f"{base}_m2_next = {base}_m2 + {base}_delta * ({base}_value - {base}_mean_next)")
            for part in ("mean", "m2", "count"):
                self.emit(self.masked_update(f"{base}_{part}", f"{base}_{part}_next"))
        self.emit_stores(step)
        self.scopes.pop()
        self.depth -= 1
        self.rmask = None
        for red, acc in accumulators:
            rtype = red.reduction_type
            if rtype in ("argmax", "argmin"):
                result = f"tl.reduce(({acc}, {acc}_index), 1, _ember_{rtype})[1]"
            else:
                result = self.reduce_call(red, acc)
            self.finish(red, f"{result}[:, None]")
        for body, group in welford.items():
            base = group[0].name
            self.emit(f"{base}_mean_all, {base}_m2_all, {base}_count_all = tl.reduce("
                      f"({base}_mean, {base}_m2, {base}_count), 1, _ember_welford_combine)")
            self.finish_welford(group, f"{base}_mean_all[:, None]", f"{base}_m2_all[:, None]")

    def masked_update(self, target: str, value: str) -> str:
        if self.rmask:
            return f"{target} = tl.where(rmask, {value}, {target})"
        return f"{target} = {value}"

    def reduction_acc_type(self, red: KernelReduction) -> str:
        if red.reduction_type in ("max", "min"):
            return compute_type(red.dtype)
        return triton_ops.accumulator_type(red.dtype)

    def identity(self, red: KernelReduction) -> str:
        rtype = red.reduction_type
        if rtype == "sum":
            return "0"
        if rtype == "prod":
            return "1"
        return triton_ops.lowest(red.dtype) if rtype == "max" else triton_ops.highest(red.dtype)

    def combine(self, red: KernelReduction, acc: str, value: str) -> str:
        rtype = red.reduction_type
        if rtype == "sum":
            return f"{acc} + {value}"
        if rtype == "prod":
            return f"{acc} * {value}"
        if red.dtype.is_floating_point:
            return f"_ember_{rtype}_nan({acc}, {value})"
        if red.dtype == torch.bool:
            return f"({acc} | {value})" if rtype == "max" else f"({acc} & {value})"
        return f"tl.{'maximum' if rtype == 'max' else 'minimum'}({acc}, {value})"

    def reduce_call(self, red: KernelReduction, value: str) -> str:
        rtype = red.reduction_type
        if rtype == "sum":
            return f"tl.sum({value}, 1)"
        if rtype == "prod":
            return f"tl.reduce({value}, 1, _ember_mul)"
        if red.dtype.is_floating_point:
            return f"tl.reduce({value}, 1, _ember_{rtype}_nan)"
        return f"tl.{rtype}({value}, 1)"

    def finish(self, red: KernelReduction, result: str) -> None:
        self.set_register(red, result)

    def set_register(self, red: KernelReduction, result: str) -> None:
        """``<name>_val``: the reduction's result as its fused consumers read it (fp16/bf16 rounded, as
        eager's reduction outputs are); a bf16/fp16 result also keeps its storage value for stores."""
        name = f"{red.name}_val"
        if red.dtype in LOW_PRECISION:
            storage = f"{red.name}_storage"
            self.emit(f"{storage} = {triton_ops.to_storage(f'({result}).to(tl.float32)', red.dtype)}")
            self.emit(f"{name} = {storage}.to(tl.float32)")
            self.storage_of[name] = storage
        else:
            self.emit(f"{name} = ({result}).to({compute_type(red.dtype)})")
        self.registers[red.name] = name

    def finish_welford(self, group: list[KernelReduction], mean: str, m2: str) -> None:
        for red in group:
            if red.reduction_type == "welford_mean":
                value = mean
            else:
                value = f"{m2} / {self.float_size(self.rnumel, red.correction)}"
            self.set_register(red, value)


    # ---------------------------------------------------------- stores and loads
    def expect_stores(self, step: LoopStep) -> None:
        self.stores_due, self.stored_early = {}, set()
        for store in step.stores:
            dtype = self.buffers[store.buffer].dtype
            if dtype in LOW_PRECISION and _exactly_low_precision(store.body) == dtype:
                self.stores_due.setdefault(_value_node(store.body), []).append(store)

    def store_before_widening(self, node: Expr, name: str) -> None:
        """Emit the stores of ``node``'s bf16/fp16 value now, before ``name`` widens it to fp32.

        Triton 3.6's TritonGPURemoveLayoutConversions reuses the layout conversion of a stored
        bf16 value for an earlier widening of that value ('operand #0 does not dominate this use',
        fixed in Triton 3.9): ``v = x.to(bf16); w = v.to(fp32); <w into another bf16 store>;
        tl.store(p, v)`` does not compile for sm90, ``tl.store(p, v)`` before ``w`` does."""
        for store in self.stores_due.pop(node, ()):
            self.emit_store(store.buffer, store.index, store.body, name)
            self.stored_early.add(id(store))

    def emit_stores(self, step: LoopStep) -> None:
        for store in step.stores:
            if not isinstance(store.body, Const):
                self.expr(store.body)       # converting the value may emit this store already
            if id(store) not in self.stored_early:
                self.emit_store(store.buffer, store.index, store.body)
        self.stores_due, self.stored_early = {}, set()

    def emit_store(self, buffer: str, index: tuple[Index, ...], body: Expr, value: str | None = None) -> None:
        """``value``: the temporary that holds ``body`` already (else it is computed here)."""
        plan = self.buffers[buffer]
        address = self.address(plan, index)
        if value is None:
            value = literal(body.value, body.dtype, typed=True) if isinstance(body, Const) else self.expr(body)
        if body.dtype != plan.dtype or plan.dtype in LOW_PRECISION:
            if plan.dtype == torch.bool and body.dtype != torch.bool:
                value = f"({value} != 0)"
            elif plan.dtype in LOW_PRECISION and value in self.storage_of and \
                    _exactly_low_precision(body) == plan.dtype:
                value = self.storage_of[value]
            elif plan.dtype in LOW_PRECISION:
                value = triton_ops.to_storage(value, plan.dtype)
            else:
                value = f"{value}.to({triton_ops.TL_TYPE[plan.dtype]})"
        # later reads of this element in the kernel reuse the value (a reload could race with the store)
        # `value` already has the storage type: reread it in the compute type (fp32), never re-round it
        reread = f"{value}.to(tl.float32)" if plan.dtype in LOW_PRECISION else \
            self.expr(Cast(body, plan.dtype)) if body.dtype != plan.dtype and not isinstance(body, Const) else value
        self.scopes[-1][("stored", buffer, address)] = reread
        self.written.add(buffer)
        offset = self.render_index(address)
        if not address.free_vars():
            offset += " + tl.zeros_like(xindex)"     # a block of values needs a block of pointers
        mask = self.mask_for(address, store=True)
        target = f"{self.pointer(buffer)} + ({offset})"
        self.emit(f"tl.store({target}, {value}{', mask=' + mask if mask else ''})")

    def index_has_inner(self, idx: Index) -> bool:
        return bool(idx.free_vars() & set(self.inner_vars))

    def mask_for(self, address: Index, store: bool = False) -> str | None:
        if not address.free_vars() and not store:
            return None                  # one element, always in bounds: a scalar load
        if not self.two_d:
            return self.xmask
        if self.index_has_inner(address):
            return self.full_mask()
        return self.xmask

    def address(self, plan: BufferPlan, index: tuple[Index, ...]) -> Index:
        flat = ir.const_index(0)
        for idx, stride, size in zip(index, plan.stride, plan.shape):
            if size != 1:
                flat = flat + idx * as_size(stride)
        return flat

    def render_load(self, node: Load, guard: str | None = None) -> str:
        """``guard``: a bool block; lanes where it is false read nothing (and get 0)."""
        plan = self.buffers[node.buffer]
        if node.buffer in self.scalars:
            # a scalar argument (the interpreter types small Python ints as int32: widen it)
            return f"{self.pointer(node.buffer)}.to({compute_type(plan.dtype)})"
        address = self.address(plan, node.index)
        offset = self.render_index(address)
        mask = self.mask_for(address)
        if offset.lstrip("-").isdigit():
            mask = guard = None          # only size-1 loop vars: one element, a scalar pointer takes no block mask
        if guard:
            # a where, not guard & mask: Triton's interpreter gives the & of a compare of two
            # constants (a pad's bound check at a size-1 dim) and a block an int64 mask it rejects
            mask = f"tl.where({guard}, {mask}, False)" if mask else guard
        ptr = self.pointer(node.buffer)
        target = ptr if offset == "0" else f"{ptr} + ({offset})"
        text = f"tl.load({target}, mask={mask}, other=0)" if mask else f"tl.load({target})"
        if plan.dtype in LOW_PRECISION:
            text += ".to(tl.float32)"
        return text

    # ---------------------------------------------------------- index printing
    def axis_of(self, var: Var) -> tuple[tuple[Var, ...], str, int] | None:
        if var in self.outer_vars:
            return self.outer_vars, "xindex", self.xnumel
        if var in self.inner_vars:
            return self.inner_vars, "rindex", self.rnumel
        return None

    def render_index(self, idx: Index) -> str:
        """Print an Index over kernel vars, folding contiguous runs of vars back into xindex / rindex."""
        var_coeffs = {a: c for a, c in idx.terms if isinstance(a, Var) and self.axis_of(a) is not None}
        parts: list[str] = []
        for axis_vars, flat, numel in ((self.outer_vars, "xindex", self.xnumel), (self.inner_vars, "rindex", self.rnumel)):
            i = len(axis_vars) - 1
            while i >= 0:
                v = axis_vars[i]
                if v.size == 1 or v not in var_coeffs:
                    i -= 1
                    continue
                coeff, span = var_coeffs[v], v.size
                k = i - 1
                while k >= 0 and (axis_vars[k].size == 1 or var_coeffs.get(axis_vars[k]) == coeff * span):
                    span *= axis_vars[k].size
                    k -= 1
                rowstride = math.prod(u.size for u in axis_vars[i + 1:])
                text = flat if rowstride == 1 else f"({flat} // {rowstride})"
                if rowstride * span < numel:
                    text = f"({text} % {span})"
                parts.append(text if coeff == 1 else f"{coeff} * {text}")
                i = k
        others = Index([(a, c) for a, c in idx.terms if a not in var_coeffs], idx.const)
        rest = others.render(self.render_atom)
        if rest != "0" or not parts:
            parts.append(rest)
        return " + ".join(parts).replace("+ -", "- ")

    def render_atom(self, atom: ir.Atom) -> str:
        if isinstance(atom, Var):
            return self.define_var(atom)
        if isinstance(atom, ir.FloorDiv):
            return f"(({self.render_index(atom.arg)}) // {atom.divisor})"
        if isinstance(atom, ir.ModIndex):
            return f"(({self.render_index(atom.arg)}) % {atom.divisor})"
        if isinstance(atom, ir.Indirect):
            return f"{self.expr(atom.value)}.to({self.config.index_type})"
        raise TypeError(atom)

    def define_var(self, var: Var) -> str:
        """``x1 = xindex // 64 % 32``, emitted once per scope where first needed."""
        axis = self.axis_of(var)
        if axis is None:
            raise CompileError(f"unbound loop variable {var}", stage="codegen", op=self.kernel.name)
        key = ("var", var)
        found = self.lookup(key)
        if found:
            return found
        axis_vars, flat, numel = axis
        position = axis_vars.index(var)
        rowstride = math.prod(u.size for u in axis_vars[position + 1:])
        text = flat if rowstride == 1 else f"{flat} // {rowstride}"
        if rowstride * var.size < numel:
            text = f"({text}) % {var.size}" if rowstride != 1 else f"{text} % {var.size}"
        self.emit(f"{var.name} = {text}")
        self.scopes[-1][key] = var.name
        return var.name

    # ---------------------------------------------------------- expressions
    def lookup(self, key) -> str | None:
        for scope in reversed(self.scopes):
            if key in scope:
                return scope[key]
        return None

    def expr(self, expr: Expr) -> str:
        """Emit temporaries for expr (CSE'd per scope) and return the name holding its value."""
        for node in ir.walk(expr):
            if self.lookup(node) is not None:
                continue
            if isinstance(node, Load) and node.buffer in self.registers:
                self.scopes[-1][node] = self.registers[node.buffer]
                continue
            if isinstance(node, Load) and node.buffer in self.written:
                # by address: an epilogue stores [768] what a later step reads as [1, 768]
                stored = self.lookup(("stored", node.buffer, self.address(self.buffers[node.buffer], node.index)))
                if stored is not None:
                    self.scopes[-1][node] = stored
                    continue
            if isinstance(node, Const):
                self.scopes[-1][node] = literal(node.value, node.dtype)
                continue
            self._pending_storage = None
            text = self.render_node(node)
            if text.isidentifier():         # a cast that changes nothing: the same temporary
                self.scopes[-1][node] = text
                continue
            name = self.new_tmp()
            if self._pending_storage is not None:
                self.storage_of[name] = self._pending_storage
                self.store_before_widening(node, name)
            self.emit(f"{name} = {text}")
            self.scopes[-1][node] = name
        return self.lookup(expr)

    def arg(self, node: Expr, all_const: bool) -> str:
        if isinstance(node, Const) and all_const:
            return literal(node.value, node.dtype, typed=True)
        return self.lookup(node)

    def render_node(self, node: Expr) -> str:
        if isinstance(node, Load):
            return self.render_load(node)
        if isinstance(node, GuardedLoad):
            return self.render_load(node.load, guard=self.lookup(node.guard))
        if isinstance(node, IndexValue):
            if node.index.is_constant() and is_symbolic(node.index.const):   # a size read at run time
                return f"tl.full([], {python_code(node.index.const)}, {compute_type(node.dtype)})"
            if node.index.is_constant():
                return literal(node.index.const, node.dtype, typed=True)
            text = f"({self.render_index(node.index)})"
            if node.dtype == torch.bool:
                return f"({text} != 0)"
            return f"{text}.to({compute_type(node.dtype)})"
        if isinstance(node, Cast):
            value = self.arg(node.arg, True)
            # loads and casts of bf16/fp16 values hold them exactly: rounding again would only add
            # conversions (and a chain of them has tripped Triton 3.6's compiler: "does not dominate")
            if _passes_through(node):
                return value
            exact = _exactly_low_precision(node.arg)
            text = triton_ops.cast(value, node.arg.dtype, node.dtype, exact == node.arg.dtype)
            widened = ".to(tl.float32)"
            if (node.dtype in LOW_PRECISION or node.arg.dtype in LOW_PRECISION) and text.endswith(widened) \
                    and text != f"{value}{widened}":
                # the converted value gets a name of its own, which stores use as is: a store of
                # x.to(bf16).to(fp32).to(bf16) made Triton 3.6 fold the round trip and reorder ops
                # ("operand #0 does not dominate this use")
                self._pending_storage = self.new_tmp()
                self.emit(f"{self._pending_storage} = {text[:-len(widened)]}")
                return f"{self._pending_storage}{widened}"
            return text
        if isinstance(node, Op) and node.op == "check_index":
            return self.render_index_check(node)
        if isinstance(node, Op):
            all_const = all(isinstance(a, Const) for a in node.args)
            args = [self.arg(a, all_const or not self.const_ok(node, a)) for a in node.args]
            return render_op(node, args)
        raise CompileError(f"cannot print {type(node).__name__}", stage="codegen")

    def render_index_check(self, node: Op) -> str:
        """check_index(index, size, code, reported): lanes outside the block's mask are not checked."""
        self.checks_indices = True
        index, reported = self.lookup(node.args[0]), self.lookup(node.args[3])
        size, code = int(node.args[1].value), int(node.args[2].value)
        mask = self.full_mask()
        if mask:
            return f"_ember_check_index_masked({index}, {size}, {code}, {reported}, {mask})"
        return f"_ember_check_index({index}, {size}, {code}, {reported})"

    @staticmethod
    def const_ok(node: Op, arg: Expr) -> bool:
        """May a Python literal stand for this constant operand (Triton then infers the right type)?"""
        if not isinstance(arg, Const):
            return True
        return node.op in ("add", "sub", "mul", "div", "eq", "ne", "lt", "le", "gt", "ge", "where") and \
            arg.dtype in (torch.float32, torch.float16, torch.bfloat16)


def _passes_through(cast: Cast) -> bool:
    """Does this conversion print as its argument's temporary?  The argument holds a value of the
    target type already: the same type, a bf16 value through fp32 and back, or an exact bf16 widened."""
    exact = _exactly_low_precision(cast.arg)
    if cast.dtype == cast.arg.dtype or (exact == cast.dtype and cast.arg.dtype == torch.float32):
        return True
    return cast.dtype == torch.float32 and exact is not None and exact == cast.arg.dtype


def _value_node(expr: Expr) -> Expr:
    """The node whose temporary holds ``expr``'s value (conversions that print as nothing skipped)."""
    while isinstance(expr, Cast) and _passes_through(expr):
        expr = expr.arg
    return expr


def _exactly_low_precision(expr: Expr) -> torch.dtype | None:
    """The bf16/fp16 type whose values ``expr`` holds exactly (as fp32), if it is known to: a load of
    such a buffer, a conversion to such a type, or a bf16/fp16 value widened to fp32."""
    if isinstance(expr, Load):
        return expr.dtype if expr.dtype in LOW_PRECISION else None
    if isinstance(expr, Cast):
        if expr.dtype in LOW_PRECISION:
            return expr.dtype if expr.arg.dtype != expr.dtype else _exactly_low_precision(expr.arg)
        if expr.dtype == torch.float32:      # widening rounds a bf16/fp16 value first (triton_ops.cast)
            return expr.arg.dtype if expr.arg.dtype in LOW_PRECISION else None
    return None


# ============================================================ build entry (backend.py calls this)
def interpret_requested() -> bool:
    """TRITON_INTERPRET is set: run even CUDA tensors' kernels in the interpreter."""
    import os
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def build_kernels(sched: Schedule, interpret: bool | None = None) -> tuple[dict[str, tuple], str]:
    """Generate, cache, compile: kernel name -> (launcher taking tensors, buffer names), plus the source.

    ``interpret``: run the kernels in Triton's interpreter (CPU tensors); default: whether
    TRITON_INTERPRET is set."""
    from ember.runtime import triton_build
    if interpret is None:
        interpret = triton_build.interpreted()
    if not sched.kernels:
        return {}, ""
    source, kernels = generate_triton(sched, interpret)
    kinds = {name: plan.kind for name, plan in sched.buffers.items()}
    launchers = triton_build.build(source, kernels, kinds, interpret)
    return launchers, f"# {triton_build.module_path(source)}\n{source}"
