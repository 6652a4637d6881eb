"""The scheduler: which loop nodes get a buffer, which are fused into which kernel.

Input: a LoopProgram (lower/ir.py).  Output: a ``Schedule`` = an ordered list of
``FusedKernel`` and ``ExternCall`` steps plus a ``BufferPlan`` per buffer.

How fusion is decided, in order:
1. Buffers are forced for graph inputs/outputs, Extern inputs and outputs.
   Every other Pointwise node is *inlined*: its body is substituted into each
   consumer's Load (so chains of elementwise ops become one expression).
2. The remaining "schedulable" nodes (materialized Pointwise + Reductions) are
   grouped in program order.  A kernel is a loop nest ``for outer: [steps]``
   where each step is either an inner loop (``for inner: reductions + stores``)
   or a few stores done once per outer iteration.  A node joins a kernel when
   its iteration space fits (pointwise [outer] or [outer+inner]; reduction with
   kept dims = outer and reduced dims = inner) and everything it reads from that
   kernel is read at the same row it is produced.  So softmax, layer_norm and
   several reductions over one input (horizontal fusion) are each one kernel.
   A node joins no kernel that runs before an Extern (its output would live
   through the Extern), except a reduction with a small output (``_place``).
3. A Reduction stays in a register when every consumer is in its kernel;
   otherwise it is stored.
4. Intermediate buffers whose last reader has run are reused for later
   buffers of the same numel and dtype.
5. A backward places each node at its first user, and where its recomputed
   forward values would be stored early and read block by block much later, it
   copies each block's recomputation to run at that block's backward, from the
   block's input (``_recompute_cuts``, ``_cloned_program``).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

from ember.graph import is_dense
from ember.graph import tree_leaves as _tree_leaves
from ember.lower import ir
from ember.symbolic import hint_of, known_equal, known_equal_sizes
from ember.lower.ir import Expr, Index, Load, Var


@dataclasses.dataclass
class BufferPlan:
    """Where a tensor lives.  ``allocation`` names the storage (shared when reused)."""

    name: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    dtype: torch.dtype
    kind: str                     # "input" | "intermediate" | "output" | "extern"
    storage_offset: int = 0
    input_position: int | None = None
    allocation: str = ""


@dataclasses.dataclass
class KernelReduction:
    name: str
    reduction_type: str
    body: Expr                    # over the kernel's outer + inner vars
    dtype: torch.dtype
    correction: float = 0.0


@dataclasses.dataclass
class KernelStore:
    buffer: str
    index: tuple[Index, ...]      # logical index into the buffer, in kernel vars
    body: Expr


@dataclasses.dataclass
class LoopStep:
    """``inner`` True: one loop over the kernel's inner vars; False: once per outer iteration."""

    inner: bool
    reductions: list[KernelReduction] = dataclasses.field(default_factory=list)
    stores: list[KernelStore] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class FusedKernel:
    name: str
    outer_vars: tuple[Var, ...]
    inner_vars: tuple[Var, ...]
    steps: list[LoopStep]
    reads: list[str]              # materialized buffers read
    writes: list[str]             # buffers stored
    local_reductions: list[str]   # reductions kept in registers (Loads of them are not memory reads)
    bytes_accessed: int
    flops: int
    fused_ops: list[str]          # descriptions of the prim ops inside, for comments

    @property
    def outer_numel(self) -> int:
        return math.prod(v.size for v in self.outer_vars)

    @property
    def inner_numel(self) -> int:
        return math.prod(v.size for v in self.inner_vars)


@dataclasses.dataclass
class ExternCall:
    node: ir.Extern
    outputs: list[ir.ExternOutput]


Step = FusedKernel | ExternCall


@dataclasses.dataclass
class Schedule:
    program: ir.LoopProgram
    steps: list[Step]
    buffers: dict[str, BufferPlan]

    @property
    def kernels(self) -> list[FusedKernel]:
        return [s for s in self.steps if isinstance(s, FusedKernel)]

    @property
    def externs(self) -> list[ExternCall]:
        return [s for s in self.steps if isinstance(s, ExternCall)]


# ======================================================================= driver
def schedule(program: ir.LoopProgram, row_arrays: bool = True) -> Schedule:
    """Decide buffers and fusion groups for a LoopProgram.  ``row_arrays``: the code generator
    keeps values a multi-pass kernel reuses in per-thread row arrays (C++: cpp_rows.py; Triton
    has none)."""
    return _Scheduler(_rounded_where_read_rounded(program), row_arrays=row_arrays).run()


_NARROW_FLOATS = (torch.bfloat16, torch.float16)


def _rounded_where_read_rounded(program: ir.LoopProgram) -> ir.LoopProgram:
    """A float32 value whose only reader rounds it to bf16 or fp16, element for element, is
    computed by that reader: whichever of the two is stored is then stored rounded.  bf16 graphs
    compute in float32 and round where eager rounds (a ReLU's or hardswish's result, their
    gradients); the scheduler stored the value before its rounding, twice the bytes written and
    read by every later kernel.  The values are the same: the reader rounded what it loaded.
    Forward programs only: in a backward the merged nodes hid the recomputation cuts of
    ``_recompute_cuts`` (the pointwise blocks' backward peak went from 12.6 to 19 activations)."""
    if program.extra.get("backward", False):
        return program
    users = program.users()
    returned = program.returned_buffers()
    nodes = dict(program.nodes)
    for name, node in program.nodes.items():
        readers = users[name]
        if not isinstance(node, ir.Pointwise) or node.dtype != torch.float32 or name in returned or \
                len(readers) != 1:
            continue
        reader = nodes[readers[0]]
        body = reader.body if isinstance(reader, ir.Pointwise) else None
        if not (isinstance(body, ir.Cast) and body.dtype in _NARROW_FLOATS and isinstance(body.arg, Load) and
                body.arg.buffer == name and reader.shape == node.shape and
                body.arg.index == tuple(ir.index(v) for v in reader.vars)):
            continue
        computed = ir.substitute(nodes[name].body, {v: ir.index(w) for v, w in zip(node.vars, reader.vars)})
        nodes[reader.name] = dataclasses.replace(reader, body=ir.Cast(computed, body.dtype),
                                                 source=f"{node.source}, {reader.source}".strip(", "))
        del nodes[name]     # the reader keeps its own layout: Extern views of it were made for that one
    if len(nodes) == len(program.nodes):
        return program
    return dataclasses.replace(program, nodes=nodes)


@dataclasses.dataclass
class _Group:
    """A kernel being built: its loop split and members in program order."""

    outer: tuple[int, ...]
    inner: tuple[int, ...]
    members: list[str]


class _Scheduler:
    def __init__(self, program: ir.LoopProgram, keep: frozenset[str] = frozenset(), cloned: bool = False,
                 row_arrays: bool = True):
        self.program = program
        self.row_arrays = row_arrays
        self.nodes = program.nodes
        self.users = program.users()
        self.keep = keep                     # stored and never recomputed: the inputs of cloned recomputations
        self.cloned = cloned                 # the program's recomputations were cloned once already
        self.forced = self._forced_buffers() | keep
        # memos of the expansion; _set_forced drops the entries that a change of forced reaches
        self.inlined: dict[str, Expr] = {}   # node name -> body with inlinable loads expanded
        self.deps: dict[str, set[str]] = {}  # node name -> buffers its expanded body loads
        self.expanded_loads: dict[Load, Expr] = {}   # a Load -> what it expands to (many bodies share it)
        # (node name, outer vars, inner vars) -> the expanded body in those kernel vars: _fits
        # tries a node against several groups and _build_kernel builds the chosen one again
        self.kernel_bodies: dict[tuple[str, tuple[Var, ...], tuple[Var, ...]], Expr] = {}
        # one per mapping of loop vars: nodes of one shape share their vars (x0, x1, ...), so the
        # same mapping substitutes the same inlined producers into consumer after consumer
        self.substitutions: dict[tuple[tuple[Var, Index], ...], ir.Substitution] = {}
        self.expensive: dict[Expr, bool] = {}     # _is_expensive of expanded bodies
        self.dominator_tree: tuple[dict[str, str | None], dict[str, int]] | None = None   # _dominators
        self.view_bases = {v.name for node in self.nodes.values() if isinstance(node, ir.Extern)
                           for v in _tree_leaves((node.args, node.kwargs)) if isinstance(v, ir.BufferView)}
        self.order = self._placement_order()

    def _placement_order(self) -> list[str]:
        """The order in which nodes are placed into kernels.  A backward places each computed
        node just before its first user: it recomputes forward values from saved ones, and lowered
        in program order the whole recomputation comes first, each value placed before any kernel
        that frees memory, so the memory rules of ``_place`` could not keep it out of the first
        kernel (the pointwise model's first backward kernel stored 35 activations, every block's
        recomputed values, read block by block much later).  Placed at its first user, a value
        the backward reads late is placed after the kernels that free memory before it.
        Elsewhere program order (a forward's values are made near their uses already)."""
        if not self.program.extra.get("backward", False):
            return list(self.nodes)
        order: list[str] = []
        done: set[str] = set()

        def emit(name: str) -> None:
            stack = [(name, False)]
            while stack:
                current, expanded = stack.pop()
                if current in done:
                    continue
                if expanded:
                    done.add(current)
                    order.append(current)
                    continue
                stack.append((current, True))
                for dep in sorted(self.nodes[current].reads(), key=position.__getitem__, reverse=True):
                    if dep not in done:
                        stack.append((dep, False))

        position = {name: i for i, name in enumerate(self.nodes)}
        for name, node in self.nodes.items():
            if isinstance(node, (ir.Pointwise, ir.Reduction)) and self.users[name]:
                continue        # placed with its first user
            emit(name)
        return order

    def _forced_buffers(self) -> set[str]:
        forced = {name for name, node in self.nodes.items()
                  if isinstance(node, (ir.InputBuffer, ir.ExternOutput))}
        forced |= self.program.returned_buffers()
        for node in self.nodes.values():
            if isinstance(node, ir.Extern):
                forced |= node.reads()
        return forced | self._compared_with_their_extremum()

    def _compared_with_their_extremum(self) -> set[str]:
        """Computed values compared with a max or min of themselves (the gradient mask of amax:
        ``eq(x, amax(x))``): stored once and read by both, as eager does.  Recomputed, the
        reduction and the comparison may compute them with different code: g++ vectorizes each
        pass of a row kernel on its own (libmvec's SIMD expf in one, glibc's scalar expf or
        another SIMD width in the other), so no element equalled the maximum and the gradient of
        ``exp(x).amax()`` was 0 / 0 = NaN on the CPU."""
        extremum_inputs: dict[str, set[str]] = {}
        for name, node in self.nodes.items():
            if isinstance(node, ir.Reduction) and node.reduction_type in _EXTREMA:
                extremum_inputs[name] = set(ir.load_buffers(node.body))
        if not extremum_inputs:
            return set()
        compared: set[str] = set()
        for node in self.nodes.values():
            if not isinstance(node, ir.Pointwise):
                continue
            for op in ir.walk(node.body):
                if isinstance(op, ir.Op) and op.op in _COMPARISONS and len(op.args) == 2:
                    sides = [set(ir.load_buffers(arg)) for arg in op.args]
                    for reduction, values in extremum_inputs.items():
                        for this, other in (sides, sides[::-1]):
                            if reduction in other:
                                compared |= values & this
        return {name for name in compared if isinstance(self.nodes.get(name), ir.Pointwise)}

    def is_inlined(self, name: str) -> bool:
        node = self.nodes[name]
        return isinstance(node, ir.Pointwise) and name not in self.forced

    # ------------------------------------------------------------ inlining
    def expanded_body(self, name: str) -> Expr:
        """The node's body with every inlined producer substituted in (memoized)."""
        if name not in self.inlined:
            node = self.nodes[name]
            self.inlined[name] = ir.map_expr(node.body, self._expand_load)
        return self.inlined[name]

    def _expand_load(self, node: Expr, args: tuple[Expr, ...]) -> Expr:
        if isinstance(node, Load):
            expanded = self.expanded_loads.get(node)
            if expanded is None:
                expanded = self.expanded_loads[node] = self._expand_one_load(node)
            return expanded
        return ir.replace_children(node, args)

    def _expand_one_load(self, node: Load) -> Expr:
        idx = tuple(_expand_indirect(i, self) for i in node.index)
        if self.is_inlined(node.buffer):
            producer = self.nodes[node.buffer]
            return self._substitute(self.expanded_body(node.buffer), dict(zip(producer.vars, idx)))
        return Load(node.buffer, idx, node.dtype) if idx != node.index else node

    def _substitute(self, body: Expr, mapping: dict[Var, Index]) -> Expr:
        """ir.substitute, sharing its work with earlier substitutions by the same mapping."""
        return self._substitution(mapping)(body)

    def _substitution(self, mapping: dict[Var, Index]) -> ir.Substitution:
        key = tuple(mapping.items())
        substitution = self.substitutions.get(key)
        if substitution is None:
            substitution = self.substitutions[key] = ir.Substitution(mapping)
        return substitution

    # ------------------------------------------------------------ grouping
    def run(self) -> Schedule:
        groups, where, _ = self._group()
        shared = self._expensive_shared_pointwise(groups, where)
        if shared:
            # store them once instead of recomputing them in every kernel that reads them
            self._set_forced(self.forced | shared)
            groups, where, releases = self._group()
            long_lived = self._long_lived(shared, where, releases) - self.keep
            if long_lived:
                if not self.cloned:
                    plan = self._recompute_cuts(long_lived, releases)
                    program = self._cloned_program(plan) if plan else None
                    if program is not None:
                        keep = frozenset(cut for _, cut in plan if isinstance(self.nodes[cut], ir.Pointwise))
                        # once: a plan without Pointwise cuts would clone the clone again, forever
                        return _Scheduler(program, keep, cloned=True, row_arrays=self.row_arrays).run()
                self._set_forced(self.forced - long_lived)
                groups, where, _ = self._group()
            unread = self._read_in_own_kernel_only(shared - long_lived, groups, where)
            if unread:
                self._set_forced(self.forced - unread)
                groups, where, _ = self._group()
            free = self._recomputed_for_free(shared - long_lived - unread, where)
            if free:
                self._set_forced(self.forced - free)
                groups, where, _ = self._group()
        local = self._local_reductions(groups, where)
        extern_outputs: dict[str, list[ir.ExternOutput]] = {}     # extern name -> its outputs, in program order
        for node in self.nodes.values():
            if isinstance(node, ir.ExternOutput):
                extern_outputs.setdefault(node.extern, []).append(node)
        steps = [self._build_kernel(g, i, local) if isinstance(g, _Group) else
                 ExternCall(g, extern_outputs.get(g.name, [])) for i, g in enumerate(groups)]
        steps = [s for s in steps if not isinstance(s, FusedKernel) or s.steps]
        for i, step in enumerate(s for s in steps if isinstance(s, FusedKernel)):
            step.name = f"kernel{i}"
        buffers = self._plan_buffers(steps, local)
        for step in steps:
            if isinstance(step, FusedKernel):
                step.outer_vars = _outer_vars_in_memory_order(step, buffers)
        return Schedule(self.program, steps, buffers)

    def _set_forced(self, forced: set[str]) -> None:
        """Change which nodes are stored.  The memoized expansions that consulted a node whose
        inlining changes are dropped; the others stay valid (recomputing all of them after each
        change was a third of a GPT-2 training step's scheduling)."""
        stale = self._expansions_reaching(self.forced ^ forced)
        self.forced = forced
        self.inlined = {name: body for name, body in self.inlined.items() if name not in stale}
        self.deps = {name: deps for name, deps in self.deps.items() if name not in stale}
        self.kernel_bodies = {key: body for key, body in self.kernel_bodies.items() if key[0] not in stale}
        self.expanded_loads.clear()

    def _expansions_reaching(self, changed: set[str]) -> set[str]:
        """The memoized nodes whose expansion (under the current forced set) reads a node in
        ``changed``, directly or through inlined producers."""
        reaches: dict[str, bool] = {}

        def visit(name: str) -> bool:
            if name not in reaches:
                reaches[name] = any(dep in changed or self.is_inlined(dep) and visit(dep)
                                    for dep in self.nodes[name].reads())
            return reaches[name]
        memoized = set(self.inlined) | set(self.deps) | {name for name, _, _ in self.kernel_bodies}
        return {name for name in memoized if visit(name)}

    def _long_lived(self, shared: set[str], where: dict[str, int], releases: _Releases) -> set[str]:
        """Materialized shared values to recompute after all: those no kernel reads any more (their
        readers read a later stored value instead), and those whose buffer would stay alive across
        a kernel that frees at least as many bytes.  A backward recomputes its forward's values near
        their uses; a value stored by the first kernel that needs it and read again by much later
        ones lived through the whole backward (the pointwise model's recomputed blocks).  The second
        kind in backward programs only: elsewhere recomputing keeps the value's inputs alive instead
        (a 6-layer nanoGPT's inference peak went from 512 to 768 KiB)."""
        backward = self.program.extra.get("backward", False)
        out = set()
        for name in shared:
            last = releases.last_read.get(name)
            if last is None:
                out.add(name)
                continue
            nbytes = _nbytes_of(self.nodes[name])
            if not backward or not any(where[name] <= at < last and freed >= nbytes
                                       for at, freed in releases.freed.items()):
                continue
            if self._recomputed_from_one_input(name) or \
                    self._bytes_kept_by_recomputing(name, last, releases, shared) < nbytes:
                out.add(name)
        return out

    def _recomputed_from_one_input(self, name: str) -> bool:
        """A forward value the backward recomputes from one saved input: ``_recompute_cuts`` can
        recompute it near its readers, from a cut, instead of keeping it alive."""
        idom, _ = self._dominators()
        root = name
        while idom.get(root) is not None:
            root = idom[root]
        return root != name and isinstance(self.nodes[root], ir.InputBuffer)

    def _bytes_kept_by_recomputing(self, name: str, last: int, releases: _Releases, shared: set[str]) -> int:
        """Bytes that recomputing ``name`` in each of its readers, up to group ``last``, would keep
        alive longer than storing it: the buffers it is computed from that die earlier otherwise.
        A ResNet backward's masked gradient at a block boundary, relu_mask(y) * (g1 + g2), was
        recomputed in each reader; that kept its inputs alive instead of itself, and the next
        block's gradient chain grew by one more recomputed block, read again by every reader
        (ResNet-50's generated backward kernels moved a fifth more bytes than they need).  Inputs
        that are ``shared`` values themselves are not counted: they may be recomputed in turn, and
        their own inputs may live that long anyway (the pointwise model's blocks)."""
        return sum(_nbytes_of(self.nodes[dep]) for dep in self._deps(name)
                   if dep not in shared and releases.last_read.get(dep, -1) < last)

    def _read_in_own_kernel_only(self, stored: set[str], groups: list, where: dict[str, int]) -> set[str]:
        """Shared values that every reader reads in the kernel computing them: stored for nothing
        (a pointwise block's backward stored 15 activations that only its own kernel read).  In a
        kernel with inner loops the C++ backend keeps such a value in a row array for the row's
        later passes (cpp_rows.private_buffers); Triton kernels have no row arrays and wrote them
        to memory that no one read (MobileNetV3's forward: hardswish's 14 intermediates in each
        squeeze-excite mean's kernel, 1.2 GB a step), so there they are recomputed instead."""
        positions: dict[str, set[int]] = {}
        for name, pos in where.items():
            reads = self.nodes[name].reads() if isinstance(self.nodes[name], ir.Extern) else self._deps(name)
            for dep in reads:
                positions.setdefault(dep, set()).add(pos)
        return {name for name in stored if name in where and not (self.row_arrays and groups[where[name]].inner)
                and positions.get(name, set()) <= {where[name]}}

    def _recomputed_for_free(self, stored: set[str], where: dict[str, int]) -> set[str]:
        """Shared values that each kernel reading them could recompute from buffers it loads
        anyway: on the GPU (Triton: no row arrays) a few arithmetic ops, a sigmoid or an erf cost
        nothing next to a store and a load per reader.  Llama's SiLU backward stored a float32
        sigmoid (46 MB a layer) for a second kernel that loads the sigmoid's input already."""
        if self.row_arrays:     # C++: transcendental functions cost more than the loads they save
            return set()
        loads: dict[int, set[str]] = {}
        for name, pos in where.items():
            if not isinstance(self.nodes[name], ir.Extern):
                loads.setdefault(pos, set()).update(self._deps(name))
        out = set()
        for name in stored:
            if name not in where or not _fewer_ops(self.expanded_body(name), EXPENSIVE_OPS):
                continue
            inputs = self._deps(name)
            readers = {pos for pos, loaded in loads.items() if name in loaded} - {where[name]}
            if readers and all(inputs <= loads[pos] - {name} for pos in readers):
                out.add(name)
        return out

    def _recompute_cuts(self, long_lived: set[str], releases: _Releases) -> list[tuple[list[str], str]]:
        """Where a backward recomputes its long-lived values from: [(values, cut)].  Stored by the
        first kernel that needs them and read again block by block much later, they lived through
        the backward (the pointwise model: its first backward kernel computes every block's chain
        to reach the last block's input, and stored 35 activations that the blocks' backwards read);
        recomputed from their own inputs instead, those inputs lived as long in turn.  Here the
        long-lived values recomputed from one input are split by the dominator tree
        (``_dominators``) into the sets that later kernels read one after another (a block's
        backward each: the values under one child of a node, read last in a span of kernels that
        no other child's values are read in); each set is recomputed from the smallest value on the
        dominator chain between the split and the set (an input, or a block's input: every path
        from the program's input to the block's values passes through it), the cut, which is stored
        (``_cloned_program``).  Backward programs only (a forward makes its values near their
        uses), and only values that split so (one set: recomputing all from the input could cost
        the whole chain again)."""
        if not self.program.extra.get("backward", False):
            return []
        idom, depth = self._dominators()
        self.idom, self.depth = idom, depth
        by_root: dict[str, list[str]] = {}
        for name in long_lived:
            root = name
            while idom.get(root) is not None:
                root = idom[root]
            # recomputed from one input (not a gradient: those mix the tangents in)
            if root != name and isinstance(self.nodes[root], ir.InputBuffer):
                by_root.setdefault(root, []).append(name)
        last = {name: releases.last_read.get(name, -1) for name in long_lived}
        sets: list[tuple[list[str], str]] = []      # (values, the node their chain is split at)

        def split(values: list[str], top: str) -> None:
            lca = values[0]
            for name in values[1:]:
                lca = _common_dominator(lca, name, idom, depth)
            parts: dict[str, list[str]] = {}
            for name in values:
                child = name
                while child != lca and idom[child] != lca:
                    child = idom[child]
                parts.setdefault(child, []).append(name)
            spans = sorted((min(last[n] for n in part), max(last[n] for n in part)) for part in parts.values())
            if len(parts) > 1 and all(a[1] < b[0] for a, b in zip(spans, spans[1:])):
                for child, part in parts.items():
                    split(part, lca) if child != lca else sets.append((part, top))
            else:
                sets.append((values, top))

        for root, values in by_root.items():
            before = len(sets)
            split(values, root)
            if len(sets) == before + 1:
                del sets[before:]
        plan: list[tuple[list[str], str]] = []
        for values, top in sets:
            lca = values[0]
            for name in values[1:]:
                lca = _common_dominator(lca, name, idom, depth)
            # the smallest value on the chain from the set up to the split (an input costs nothing)
            chain = [lca]
            while chain[-1] != top:
                chain.append(idom[chain[-1]])
            inputs = [n for n in chain if isinstance(self.nodes[n], ir.InputBuffer)]
            cut = inputs[0] if inputs else min(
                (n for n in chain if isinstance(self.nodes[n], ir.Pointwise)), key=lambda n: _nbytes_of(self.nodes[n]),
                default=None)
            if cut is not None:
                plan.append(([n for n in values if n != cut], cut))
        return [(values, cut) for values, cut in plan if values]

    def _cloned_program(self, plan: list[tuple[list[str], str]]) -> ir.LoopProgram | None:
        """The program with each set's recomputation copied: the nodes between the cut and the set
        get copies that their other readers (the gradients, anything that computes no cut) read,
        placed before the first of them.  The first kernel still computes the
        originals for the next block; the copies are placed, and stored where several kernels read
        them, at the block's backward.  None where the copy would not be well-formed."""
        idom, depth = self.idom, self.depth
        # the recomputation's early part: what computes a cut (a later block's input) reads the originals
        early: set[str] = set()
        stack = [cut for _, cut in plan if isinstance(self.nodes[cut], ir.Pointwise)]
        while stack:
            name = stack.pop()
            if name not in early:
                early.add(name)
                stack.extend(self.nodes[name].reads())
        renames: dict[str, str] = {}
        insert_before: dict[str, list[str]] = {}      # first late reader -> originals to copy before it
        late_readers: set[str] = set()
        position = {name: i for i, name in enumerate(self.nodes)}
        for index, (values, cut) in enumerate(plan):
            region: set[str] = set(values)
            stack = list(values)
            while stack:
                for dep in self.nodes[stack.pop()].reads():
                    if dep in region or dep == cut or not _dominated_by(dep, cut, idom, depth):
                        continue
                    region.add(dep)
                    stack.append(dep)
            if any(not isinstance(self.nodes[n], ir.Pointwise) or n in renames for n in region):
                return None
            readers = {u for n in region for u in self.users[n] if u not in region and u not in early}
            if not readers or any(not isinstance(self.nodes[u], (ir.Pointwise, ir.Reduction)) for u in readers):
                return None
            for n in region:
                renames[n] = f"{n}_re{index}"
            late_readers |= readers
            first = min(readers, key=position.__getitem__)
            insert_before.setdefault(first, []).extend(sorted(region, key=position.__getitem__))
        if set(renames.values()) & set(self.nodes):
            return None

        def rename_loads(body: Expr, names: dict[str, str]) -> Expr:
            def visit(node: Expr, args: tuple[Expr, ...]) -> Expr:
                if isinstance(node, Load) and node.buffer in names:
                    return Load(names[node.buffer], node.index, node.dtype)
                return ir.replace_children(node, args)
            return ir.map_expr(body, visit)

        nodes: dict[str, ir.LoopNode] = {}
        for name, node in self.nodes.items():
            for original in insert_before.get(name, ()):
                copy = self.nodes[original]
                nodes[renames[original]] = dataclasses.replace(
                    copy, name=renames[original], body=rename_loads(copy.body, renames))
            if name in late_readers:
                node = dataclasses.replace(node, body=rename_loads(node.body, renames))
            nodes[name] = node
        seen: set[str] = set()
        for name, node in nodes.items():
            if not node.reads() <= seen:
                return None
            seen.add(name)
        # a copy is stored in its original's layout: MobileNetV3's recomputed batch-norm outputs
        # were stored NCHW from channels-last inputs, 612 us against a 120 us floor
        layouts = self.program.extra.get("layouts", {})
        cloned_layouts = {**layouts, **{renames[n]: layouts[n] for n in renames if n in layouts}}
        return dataclasses.replace(self.program, nodes=nodes, extra={**self.program.extra, "layouts": cloned_layouts})

    def _dominators(self) -> tuple[dict[str, str | None], dict[str, int]]:
        """Immediate dominators of the computed nodes in the graph of their full-size reads (a read
        of a smaller buffer, a weight or a per-row statistic, is not a path): a node's dominator is
        the nearest node that every such path from an input, reduction or Extern to it passes
        through.  Those sources and nodes without full-size reads have none (None); nodes computed
        from smaller buffers only (a weight broadcast to the full size) are no path either.
        Computed once: it depends on the program alone, not on which nodes are stored."""
        if self.dominator_tree is not None:
            return self.dominator_tree
        idom: dict[str, str | None] = {}
        depth: dict[str, int] = {}
        small: set[str] = set()       # computed from smaller buffers only (a broadcast weight)
        for name, node in self.nodes.items():
            dom = None
            if isinstance(node, ir.Pointwise):
                size = hint_of(node.numel())
                preds = [d for d in node.reads()
                         if d in depth and d not in small and hint_of(self.nodes[d].numel()) >= size]
                if not preds:
                    small.add(name)
                else:
                    dom = preds[0]
                    for pred in preds[1:]:
                        dom = _common_dominator(dom, pred, idom, depth)
                        if dom is None:
                            break
            idom[name] = dom
            depth[name] = 0 if dom is None else depth[dom] + 1
        self.dominator_tree = idom, depth
        return self.dominator_tree

    def _group(self) -> tuple[list[_Group | ir.Extern], dict[str, int], _Releases]:
        groups: list[_Group | ir.Extern] = []
        where: dict[str, int] = {}          # schedulable/extern name -> position in groups
        last_extern = -1
        releases = _Releases(self)
        for name in self.order:
            node = self.nodes[name]
            if isinstance(node, ir.Extern):
                where[name] = last_extern = len(groups)
                groups.append(node)
                releases.placed(name, where)
            elif isinstance(node, (ir.Pointwise, ir.Reduction)) and not self.is_inlined(name):
                self._place(name, groups, where, last_extern, releases)
                releases.placed(name, where)
        return groups, where, releases

    def _expensive_shared_pointwise(self, groups: list, where: dict[str, int]) -> set[str]:
        """Inlined Pointwise nodes recomputed in more than one kernel whose bodies are expensive.

        Cheap bodies (a few loads and arithmetic) are recomputed: a store plus a load per
        consumer costs as much memory traffic.  Expensive ones (transcendental functions,
        many ops or loads) are materialized once."""
        kernels_using: dict[str, set[int]] = {}
        for name, pos in where.items():
            if isinstance(self.nodes[name], ir.Extern):
                continue
            for producer in self._inlined_producers(name):
                kernels_using.setdefault(producer, set()).add(pos)
        candidates = {name for name, positions in kernels_using.items()
                      if len(positions) > 1 and self._is_expensive(name)}
        # the most downstream ones: a producer read only through a stored candidate stays inlined there
        chosen: set[str] = set()
        for name in reversed(list(self.nodes)):
            if name in candidates and not all(user in chosen for user in self.users[name]):
                chosen.add(name)
        return chosen

    def _is_expensive(self, name: str) -> bool:
        """Expensive to recompute: a transcendental function, EXPENSIVE_OPS ops, or EXPENSIVE_LOADS
        buffers loaded, counting those at least 1/SMALL_LOAD_RATIO of the value's size (a
        per-channel weight or statistic is a few cached bytes beside the activation: counted, a
        BatchNorm backward's ``gamma * relu_mask(y) * (g1 + g2)`` was stored and read back, and its
        four channel sums took two passes instead of one)."""
        body = self.expanded_body(name)
        expensive = self.expensive.get(body)
        if expensive is None:
            numel = hint_of(self.nodes[name].numel())
            large = [b for b in ir.load_buffers(body)
                     if hint_of(self.nodes[b].numel()) * SMALL_LOAD_RATIO >= numel]
            expensive = self.expensive[body] = _is_expensive(body) or len(large) >= EXPENSIVE_LOADS
        return expensive

    def _inlined_producers(self, name: str) -> set[str]:
        out: set[str] = set()
        stack = [name]
        while stack:
            for dep in self.nodes[stack.pop()].reads():
                if dep not in out and self.is_inlined(dep):
                    out.add(dep)
                    stack.append(dep)
        return out

    def _deps(self, name: str) -> set[str]:
        """Buffers the node's expanded body loads: its reads, each inlined producer replaced by that
        producer's own (memoized; no expanded bodies built: substituting them took seconds)."""
        if name not in self.deps:
            out: set[str] = set()
            for dep in self.nodes[name].reads():
                out |= self._deps(dep) if self.is_inlined(dep) else {dep}
            self.deps[name] = out
        return self.deps[name]

    def _producer_position(self, dep: str, where: dict[str, int]) -> int:
        node = self.nodes[dep]
        if isinstance(node, ir.ExternOutput):
            return where[node.extern]
        return where.get(dep, -1)          # inputs: -1

    def _place(self, name: str, groups: list, where: dict[str, int], last_extern: int,
               releases: _Releases) -> None:
        node = self.nodes[name]
        deps = self._deps(name)
        earliest = max((self._producer_position(d, where) for d in deps), default=-1)
        # Nor before a kernel that frees at least as many bytes as this node stores: run after it,
        # the node's buffer takes memory that was just freed; hoisted before it, both are alive at
        # once.  In a backward without Externs (the pointwise model), every row kernel's nodes
        # were hoisted into the first row kernel, which then stored the inputs of every column
        # reduction (parameter gradients) of every block at once: 2.6x eager's peak.
        barrier = max(last_extern, releases.last_release_of(_nbytes_of(node)))
        # A node joins no kernel that runs before an Extern (a new kernel at the end is always
        # valid).  Otherwise a node whose inputs are ready early (a value the backward recomputes
        # from saved inputs) is hoisted across any number of convolutions and matmuls, and its
        # output lives through all of them: that doubled a ResNet backward's peak memory.
        # Exception: a reduction whose output is much smaller than what it reads (BatchNorm's
        # per-channel sums) still joins an earlier kernel that reads or produces one of its inputs:
        # that saves a whole read of the big input, and keeping the small result alive costs little.
        # The cost of the rule: any other such fusion across an Extern is given up (one more read).
        # (heuristics, any answer correct: symbolic sizes decide them at their hints)
        may_cross = isinstance(node, ir.Reduction) and hint_of(math.prod(node.reduction_shape)) >= SMALL_OUTPUT_RATIO
        for pos in range(len(groups) - 1, max(earliest, 0) - 1, -1):
            group = groups[pos]
            if not isinstance(group, _Group):
                continue
            if pos < barrier and not (may_cross and self._touches(group, node, deps)):
                continue
            if self._fits(group, node, deps, where, pos):
                group.members.append(name)
                where[name] = pos
                return
        if isinstance(node, ir.Reduction):
            groups.append(_Group(node.shape, node.reduction_shape, [name]))
        else:
            groups.append(_Group(node.shape, (), [name]))
        where[name] = len(groups) - 1

    def _touches(self, group: _Group, node: ir.Reduction, deps: set[str]) -> bool:
        """Does the group produce or read a big buffer that the reduction reads (one whose read is
        worth sharing: not a per-channel weight)?"""
        big = {d for d in deps if hint_of(self.nodes[d].numel()) >= hint_of(math.prod(node.shape)) * SMALL_OUTPUT_RATIO}
        return bool(big) and any(m in big or self._deps(m) & big for m in group.members)

    def _fits(self, group: _Group, node: ir.LoopNode, deps: set[str], where: dict[str, int], pos: int) -> bool:
        # shapes are compared as provably equal (known_equal): a fusion decision never adds a guard
        outer, inner = group.outer, group.inner
        if isinstance(node, ir.Reduction):
            if not inner:
                # a pointwise-only kernel can become a reduction kernel when its stores split exactly
                if any(not known_equal_sizes(self.nodes[m].shape, node.shape + node.reduction_shape) and
                       not known_equal_sizes(self.nodes[m].shape, node.shape) for m in group.members):
                    return False
                if not known_equal_sizes(node.shape + node.reduction_shape, outer) and not known_equal_sizes(node.shape, outer):
                    return False
                new_outer, new_inner = node.shape, node.reduction_shape
            elif not (known_equal_sizes(node.shape, outer) and known_equal_sizes(node.reduction_shape, inner)):
                return False
            else:
                new_outer, new_inner = outer, inner
        else:
            if known_equal_sizes(node.shape, outer) or (inner and known_equal_sizes(node.shape, outer + inner)) or \
                    (inner and _equal_but_unit_dims(node.shape, outer)) or \
                    not inner and known_equal(math.prod(node.shape), math.prod(outer)) and len(node.shape) and \
                    all(not isinstance(self.nodes[m], ir.Reduction) for m in group.members) and \
                    len(group.members) and (self._flat_compatible(node.shape, outer) or
                                            all(map(self._row_major, (node.name, *group.members)))):
                new_outer, new_inner = outer, inner
            else:
                return False
        # everything read from this group must be read at the row (and position) it is produced
        trial = _Group(new_outer, new_inner, group.members)
        produced = {m for m in group.members}
        outer_vars, inner_vars = _kernel_vars(trial)
        # (a size-1 var is 0: an epilogue reads a [1, 768] sum as [768])
        units = {v: ir.const_index(0) for v in outer_vars + inner_vars if _single(v)}
        for buffer, index in self._loads_in_kernel(node, produced, outer_vars, inner_vars):
            produced_at = self._kernel_index(self.nodes[buffer], outer_vars, inner_vars)
            if index != produced_at and (not units or tuple(i.substitute(units) for i in index) !=
                                         tuple(i.substitute(units) for i in produced_at)):
                return False
        group.outer, group.inner = new_outer, new_inner
        return True

    def _loads_in_kernel(self, node: ir.LoopNode, buffers: set[str], outer_vars: tuple[Var, ...],
                         inner_vars: tuple[Var, ...]) -> list[tuple[str, tuple[Index, ...]]]:
        """(buffer, index) of the node's loads of ``buffers`` in a kernel's vars: the loads of its
        kernel body, without building that body for every group _fits tries.  Substitution maps
        each load to one load with substituted indices (the buffers stay), unless an index holds
        a gathered value (loads inside it may be simplified away): then from the built body."""
        body = self.expanded_body(node.name)
        if buffers.isdisjoint(ir.load_buffers(body)):
            return []
        if ir.has_indirect(body):
            return [(ld.buffer, ld.index) for ld in ir.loads(self._kernel_body(node, outer_vars, inner_vars))
                    if ld.buffer in buffers]
        substitution = self._substitution(self._kernel_mapping(node, outer_vars, inner_vars))
        return [(ld.buffer, tuple(substitution.index(i) for i in ld.index)) for ld in ir.loads(body)
                if ld.buffer in buffers]

    @staticmethod
    def _flat_compatible(shape: tuple[int, ...], outer: tuple[int, ...]) -> bool:
        """Whether each dim of ``shape`` is a run of consecutive loops of ``outer``: every boundary
        between its dims (a suffix product) is one between the loops.  A node indexed by the flat
        loop index is then division-free and keeps its dims' order, whatever its layout."""
        kernel_boundaries = _suffix_products(outer)
        return all(any(known_equal(p, q) for q in kernel_boundaries) for p in _suffix_products(shape))

    def _row_major(self, name: str) -> bool:
        """Whether the node is stored row-major (its flat index is its memory order).  A node joins
        a kernel of another shape by flat index only if it is, or if its dims line up with the
        loops (``_flat_compatible``): nanoGPT's k^T operand copy, stored as (8, 12, 64, 512) with
        strides (.., 1, 64), fused with the q copy's (8, 12, 512, 64) loop, strode 128 bytes between
        lanes for its loads and stores (69 us against 13 us alone)."""
        node = self.nodes[name]
        strides = [self.program.extra.get("layouts", {}).get(name)]
        strides += [s for out, s in zip(self.program.outputs, self.program.output_strides) if out == name]
        dense = _contiguous(node.shape)
        return all(s is None or all(known_equal(a, b) for size, a, b in zip(node.shape, s, dense) if not _is_one(size))
                   for s in strides)

    # ------------------------------------------------------------ kernel vars
    def _kernel_index(self, node: ir.LoopNode, outer_vars: tuple[Var, ...], inner_vars: tuple[Var, ...]) -> tuple[Index, ...]:
        """The node's own (kept) index expressed in kernel vars."""
        return _map_shape(node.shape, outer_vars, inner_vars)

    def _kernel_body(self, node: ir.LoopNode, outer_vars: tuple[Var, ...], inner_vars: tuple[Var, ...]) -> Expr:
        key = (node.name, outer_vars, inner_vars)
        body = self.kernel_bodies.get(key)
        if body is None:
            body = self.kernel_bodies[key] = self._substituted_body(node, outer_vars, inner_vars)
        return body

    def _substituted_body(self, node: ir.LoopNode, outer_vars: tuple[Var, ...], inner_vars: tuple[Var, ...]) -> Expr:
        return self._substitute(self.expanded_body(node.name), self._kernel_mapping(node, outer_vars, inner_vars))

    @staticmethod
    def _kernel_mapping(node: ir.LoopNode, outer_vars: tuple[Var, ...],
                        inner_vars: tuple[Var, ...]) -> dict[Var, Index]:
        """The node's loop vars in a kernel's vars."""
        if isinstance(node, ir.Reduction):
            mapping = dict(zip(node.vars, _map_shape(node.shape, outer_vars, ())))
            mapping.update(zip(node.reduction_vars, _map_shape(node.reduction_shape, inner_vars, ())))
        else:
            mapping = dict(zip(node.vars, _map_shape(node.shape, outer_vars, inner_vars)))
        return mapping

    # ------------------------------------------------------------ registers vs buffers
    def _local_reductions(self, groups: list, where: dict[str, int]) -> set[str]:
        consumers: dict[str, set[int]] = {}
        for name, pos in where.items():
            if isinstance(self.nodes[name], ir.Extern):
                continue
            for dep in self._deps(name):
                consumers.setdefault(dep, set()).add(pos)
        local = set()
        for name, pos in where.items():
            node = self.nodes[name]
            if isinstance(node, ir.Reduction) and name not in self.forced and consumers.get(name, set()) <= {pos}:
                local.add(name)
        return local

    def _build_kernel(self, group: _Group, position: int, local: set[str]) -> FusedKernel:
        outer_vars, inner_vars = _kernel_vars(group)
        steps: list[LoopStep] = []
        pending: list[KernelStore] = []
        reduced_in_step: dict[str, int] = {}
        reads: dict[str, None] = {}
        writes: list[str] = []
        flops = 0
        fused: list[str] = []
        for name in self._epilogues_late(group, inner_vars):
            node = self.nodes[name]
            body = self._kernel_body(node, outer_vars, inner_vars)
            for ld in ir.loads(body):
                if ld.buffer not in local:
                    reads[ld.buffer] = None
            fused.extend(self._fused_sources(name))
            depends_on = {ld.buffer for ld in ir.loads(body)}
            last_needed = max((reduced_in_step[d] for d in depends_on if d in reduced_in_step), default=-1)
            is_inner = self._is_inner(node, group, inner_vars)
            if isinstance(node, ir.Reduction) or is_inner:
                step = steps[-1] if steps and steps[-1].inner and last_needed < len(steps) - 1 else None
                if step is None:
                    _flush(steps, pending)
                    step = LoopStep(True)
                    steps.append(step)
            else:
                _flush(steps, pending)
                step = steps[-1] if steps and not steps[-1].inner else None
                if step is None:
                    step = LoopStep(False)
                    steps.append(step)
            if step.inner:
                # a value stored earlier in this same loop is used directly, not reloaded: printers
                # may emit a step's reductions before its stores, and recomputing it is CSE'd away
                body = _reuse_stored_values(body, step)
            iterations = math.prod(group.outer) * (math.prod(group.inner) if is_inner else 1)
            flops += ir.count_ops(body) * iterations
            if isinstance(node, ir.Reduction):
                step.reductions.append(KernelReduction(name, node.reduction_type, body, node.dtype, node.correction))
                reduced_in_step[name] = steps.index(step)
                if name not in local:
                    # stored once per row after this loop ends (deferred so later reductions can share the loop)
                    index = self._kernel_index(node, outer_vars, ())
                    pending.append(KernelStore(name, index, Load(name, index, node.dtype)))
                    writes.append(name)
            else:
                index = self._kernel_index(node, outer_vars, inner_vars if is_inner else ())
                step.stores.append(KernelStore(name, index, body))
                writes.append(name)
        _flush(steps, pending)
        read_list = [r for r in reads if r not in writes]
        nbytes = sum(self._nbytes(b) for b in read_list) + sum(self._nbytes(b) for b in writes)
        return FusedKernel(f"kernel{position}", outer_vars, inner_vars, _merge_outer_steps(steps), read_list, writes,
                           sorted(n for n in group.members if n in local), nbytes, flops, list(dict.fromkeys(fused)))

    @staticmethod
    def _is_inner(node: ir.LoopNode, group: _Group, inner_vars: tuple[Var, ...]) -> bool:
        """Does the node run inside the kernel's inner loop (a reduction, or a pointwise node over
        rows and columns), not once per row after it?"""
        return isinstance(node, ir.Reduction) or (
            bool(inner_vars) and node.shape != group.outer and not _equal_but_unit_dims(node.shape, group.outer))

    def _epilogues_late(self, group: _Group, inner_vars: tuple[Var, ...]) -> list[str]:
        """The group's members, each once-per-row step (a sum cast to the weight's dtype) moved
        after the loop nodes that follow it up to the first member that reads it: the reductions
        around it then share one pass over their inputs instead of one pass each."""
        if not inner_vars:
            return group.members
        order: list[str] = []
        waiting: list[str] = []
        for name in group.members:
            node = self.nodes[name]
            if not self._is_inner(node, group, inner_vars):
                waiting.append(name)
                continue
            if waiting and not set(waiting).isdisjoint(ir.load_buffers(self.expanded_body(name))):
                order += waiting
                waiting = []
            order.append(name)
        return order + waiting

    def _fused_sources(self, name: str) -> list[str]:
        """Descriptions of the node and every inlined producer, for the kernel comment."""
        out: list[str] = []
        seen: set[str] = set()

        def visit(n: str) -> None:
            if n in seen:
                return
            seen.add(n)
            node = self.nodes[n]
            for dep in sorted(node.reads()):
                if self.is_inlined(dep):
                    visit(dep)
            if getattr(node, "source", ""):
                out.append(node.source)
        visit(name)
        return out

    def _nbytes(self, name: str) -> int:
        node = self.nodes[name]
        if isinstance(node, ir.InputBuffer) and node.alias_of:
            node = self.nodes[node.alias_of]
        return node.numel() * node.dtype.itemsize

    # ------------------------------------------------------------ buffers
    def _plan_buffers(self, steps: list[Step], local: set[str]) -> dict[str, BufferPlan]:
        # a buffer returned twice (a forward output also saved) takes the strides of the position
        # that names them (a saved position leaves them free: None)
        outputs: dict[str, int] = {}
        for i, out in enumerate(self.program.outputs):
            if isinstance(out, str) and (out not in outputs or self.program.output_strides[outputs[out]] is None):
                outputs[out] = i
        plans: dict[str, BufferPlan] = {}
        for name, node in self.nodes.items():
            if isinstance(node, ir.InputBuffer):
                plans[name] = BufferPlan(name, node.shape, node.stride, node.dtype, "input", node.storage_offset,
                                         node.position, node.alias_of or name)
            elif isinstance(node, ir.ExternOutput):
                plans[name] = BufferPlan(name, node.shape, node.stride, node.dtype, "extern", node.storage_offset,
                                         allocation=name)
        last_use: dict[str, int] = {}
        for i, step in enumerate(steps):
            reads = step.reads if isinstance(step, FusedKernel) else step.node.reads()
            for name in step.writes if isinstance(step, FusedKernel) else ():
                last_use.setdefault(name, i)     # never read: dead once written
            for r in reads:
                last_use[r] = i
        # the base of an output view is returned (as a view): its storage is never handed on
        returned = {out.base for out in self.program.outputs if isinstance(out, ir.OutputView)}
        free: dict[tuple[int, torch.dtype], list[str]] = {}
        # eager's strides for computed nodes (lowering records the dense non-contiguous ones)
        layouts = self.program.extra.get("layouts", {})
        for i, step in enumerate(steps):
            if isinstance(step, FusedKernel):
                for name in step.writes:
                    node = self.nodes[name]
                    layout = layouts.get(name) or _contiguous(node.shape)
                    if name in outputs:
                        stride = self.program.output_strides[outputs[name]]
                        if stride is None or not is_dense(node.shape, stride) or name in self.view_bases:
                            # an Extern views it with strides that lowering derived for this layout
                            stride = layout
                        plans[name] = BufferPlan(name, node.shape, tuple(stride), node.dtype, "output", allocation=name)
                        continue
                    key = (node.numel(), node.dtype)
                    allocation = free[key].pop() if free.get(key) else name
                    plans[name] = BufferPlan(name, node.shape, tuple(layout), node.dtype, "intermediate",
                                             allocation=allocation)
            # buffers whose last reader was this step can be reused by later steps
            for name, last in last_use.items():
                plan = plans.get(name)
                if last == i and plan is not None and plan.kind == "intermediate" and name not in returned:
                    free.setdefault((math.prod(plan.shape), plan.dtype), []).append(plan.allocation)
        return plans


class _Releases:
    """Where buffers are freed, as nodes are placed in program order: a buffer is freed after the
    group of its last reader once every node that reads it (through inlined bodies) is placed."""

    def __init__(self, sched: _Scheduler) -> None:
        self.sched = sched
        self.readers_left: dict[str, int] = {}
        for name, node in sched.nodes.items():
            for dep in self._reads(name, node):
                self.readers_left[dep] = self.readers_left.get(dep, 0) + 1
        self.returned = sched.program.returned_buffers()
        self.last_read: dict[str, int] = {}
        self.freed: dict[int, int] = {}      # group position -> bytes of intermediates freed after it

    def _reads(self, name: str, node: ir.LoopNode) -> set[str]:
        if isinstance(node, ir.Extern):
            return set(node.reads())
        if isinstance(node, (ir.Pointwise, ir.Reduction)) and not self.sched.is_inlined(name):
            return self.sched._deps(name)
        return set()

    def placed(self, name: str, where: dict[str, int]) -> None:
        position = where[name]
        for dep in self._reads(name, self.sched.nodes[name]):
            self.last_read[dep] = max(self.last_read.get(dep, -1), position)
            self.readers_left[dep] -= 1
            if self.readers_left[dep] == 0 and self._releasable(dep):
                at = self.last_read[dep]
                self.freed[at] = self.freed.get(at, 0) + _nbytes_of(self.sched.nodes[dep])

    def _releasable(self, name: str) -> bool:
        node = self.sched.nodes[name]
        return not isinstance(node, ir.InputBuffer) and name not in self.returned

    def last_release_of(self, nbytes: int) -> int:
        """The latest group position after which at least ``nbytes`` are freed (-1: none)."""
        return max((at for at, freed in self.freed.items() if freed >= nbytes), default=-1)


def _common_dominator(a: str | None, b: str | None, idom: dict[str, str | None], depth: dict[str, int]) -> str | None:
    """The nearest node that dominates both (each node dominates itself); None: no common one."""
    while a is not None and b is not None and a != b:
        if depth[a] >= depth[b]:
            a = idom[a]
        else:
            b = idom[b]
    return a if a == b else None


def _dominated_by(name: str, dom: str, idom: dict[str, str | None], depth: dict[str, int]) -> bool:
    while name is not None and depth.get(name, -1) > depth[dom]:
        name = idom[name]
    return name == dom


def _nbytes_of(node: ir.LoopNode) -> int:
    """For the memory heuristics: symbolic sizes count at their hints."""
    return hint_of(node.numel()) * node.dtype.itemsize


# ======================================================================= helpers
def _kernel_vars(group: _Group) -> tuple[tuple[Var, ...], tuple[Var, ...]]:
    return ir.make_vars("x", group.outer), ir.make_vars("r", group.inner)


def _outer_vars_in_memory_order(kernel: FusedKernel, buffers: dict[str, BufferPlan]) -> tuple[Var, ...]:
    """The kernel's outer loops reordered so the last one walks its stores' memory with the smallest
    stride.  Loop vars are in logical (NCHW) order; over channels-last buffers that order strides
    through memory, and a flattened GPU kernel's neighbouring lanes then touch far-apart addresses."""
    outer = kernel.outer_vars
    if len(outer) < 2:
        return outer
    stride_of: dict[Var, list[int]] = {v: [] for v in outer}
    for step in kernel.steps:
        for store in step.stores:
            plan = buffers.get(store.buffer)
            if plan is None:
                continue
            coefficients: dict[Var, int] = {}
            for idx, stride, size in zip(store.index, plan.stride, plan.shape):
                if known_equal(size, 1):     # only a provable 1: a decision here never adds a guard
                    continue
                for atom, coeff in idx.terms:
                    if not isinstance(atom, Var):
                        return outer          # a reshape folded into the index: keep the loop order
                    coefficients[atom] = coefficients.get(atom, 0) + coeff * stride
            for v in outer:
                # compared at the example sizes: a loop order is a speed choice, not worth a guard
                # (h*w against w guards h != 1, which a stride-2 conv's output of 1 row fails)
                stride_of[v].append(abs(hint_of(coefficients.get(v, 0))))
    if not any(stride_of[v] for v in outer):
        return outer
    # biggest stride first (outermost); stable, so equal strides keep the logical order.  A loop
    # of one iteration strides nowhere: outermost, never the innermost (vectorized) loop
    return tuple(sorted(outer, key=lambda v: (not _single(v), [-s for s in stride_of[v]])))


def _suffix_products(shape: tuple[Any, ...]) -> list[Any]:
    """The products of each trailing run of dims: where a row-major flat index crosses a dim."""
    products, running = [], 1
    for size in reversed(shape):
        running = running * size
        products.append(running)
    return products


def _single(v: Var) -> bool:
    return _is_one(v.size)


def _is_one(size: Any) -> bool:
    return isinstance(size, int) and size == 1


def _equal_but_unit_dims(a: tuple, b: tuple) -> bool:
    """Equal shapes once their size-1 dims are dropped (provably: never a guard)."""
    return known_equal_sizes(tuple(s for s in a if not _is_one(s)), tuple(s for s in b if not _is_one(s)))


def _map_shape(shape: tuple[int, ...], outer_vars: tuple[Var, ...], inner_vars: tuple[Var, ...]) -> tuple[Index, ...]:
    """Index of a tensor of ``shape`` iterated by the kernel vars (row-major)."""
    kernel_vars = outer_vars + inner_vars
    sizes = tuple(v.size for v in kernel_vars)
    # a size-1 var is 0: a step of [1] in a kernel reducing over [1] is once per row, and its body
    # must not name the inner var (an iota read r0 outside the loop over r0: fuzz seed 401046)
    at = lambda v: ir.const_index(0) if _single(v) else ir.index(v)
    if tuple(shape) == sizes:
        return tuple(at(v) for v in kernel_vars)
    if tuple(shape) == sizes[:len(outer_vars)]:
        return tuple(at(v) for v in outer_vars)
    if _equal_but_unit_dims(shape, tuple(v.size for v in outer_vars)):
        # a reduction kernel's epilogue of another rank ([768] after sums kept as [1, 768])
        wide = iter(v for v in outer_vars if not _single(v))
        return tuple(ir.const_index(0) if _is_one(size) else ir.index(next(wide)) for size in shape)
    flat = ir.linearize([ir.index(v) for v in kernel_vars], sizes)
    return ir.delinearize(flat, shape)


def _reuse_stored_values(body: Expr, step: LoopStep) -> Expr:
    stored = {(store.buffer, store.index): store.body for store in step.stores}
    if not stored:
        return body

    def replace(node: Expr, args: tuple[Expr, ...]) -> Expr:
        if isinstance(node, Load):
            value = stored.get((node.buffer, node.index))
            if value is None or value.dtype != node.dtype:
                return node
            if node.dtype in _ROUNDED_ON_STORE:   # what the load would see: the rounded value
                return ir.Cast(ir.Cast(value, torch.float32), node.dtype)
            return value
        return ir.replace_children(node, args)
    return ir.map_expr(body, replace)


_ROUNDED_ON_STORE = (torch.float16, torch.bfloat16)


def _flush(steps: list[LoopStep], pending: list[KernelStore]) -> None:
    if pending:
        steps.append(LoopStep(False, stores=list(pending)))
        pending.clear()


def _merge_outer_steps(steps: list[LoopStep]) -> list[LoopStep]:
    out: list[LoopStep] = []
    for step in steps:
        if not step.reductions and not step.stores:
            continue
        if out and not step.inner and not out[-1].inner:
            out[-1].stores.extend(step.stores)
        else:
            out.append(step)
    return out


_contiguous = ir.contiguous_strides


# elementwise ops that call a libm function (tens of cycles each, vectorized or not)
_TRANSCENDENTAL = frozenset({
    "exp", "exp2", "expm1", "log", "log1p", "log2", "log10", "sin", "cos", "tan", "asin", "acos", "atan",
    "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "erf", "erfc", "erfinv", "lgamma", "sigmoid", "pow",
    "atan2", "hypot"})
EXPENSIVE_OPS = 16
# a reduction reading at least this many elements per output may fuse into a kernel before an Extern
SMALL_OUTPUT_RATIO = 32
EXPENSIVE_LOADS = 4
_EXTREMA = frozenset({"max", "min", "argmax", "argmin"})
_COMPARISONS = frozenset({"eq", "ne", "ge", "gt", "le", "lt"})
SMALL_LOAD_RATIO = 8


def _is_expensive(body: Expr) -> bool:
    """A transcendental function or EXPENSIVE_OPS ops (_Scheduler._is_expensive adds the loads)."""
    ops = 0
    for node in ir.walk(body):        # stops at the answer: a backward's bodies are large DAGs
        if isinstance(node, ir.Op):
            ops += 1
            if node.op in _TRANSCENDENTAL or ops >= EXPENSIVE_OPS:
                return True
    return False


def _fewer_ops(body: Expr, limit: int) -> bool:
    ops = 0
    for node in ir.walk(body):
        if isinstance(node, ir.Op):
            ops += 1
            if ops >= limit:
                return False
    return True


def _expand_indirect(idx: Index, sched: _Scheduler) -> Index:
    if next(ir.indirect_atoms(idx), None) is None:
        return idx
    terms = []
    for atom, coeff in idx.terms:
        if isinstance(atom, ir.Indirect):
            atom = ir.Indirect(ir.map_expr(atom.value, sched._expand_load), atom.size)
        elif isinstance(atom, (ir.FloorDiv, ir.ModIndex)):   # a reshape of a gather nests it
            atom = type(atom)(_expand_indirect(atom.arg, sched), atom.divisor)
        terms.append((atom, coeff))
    return Index(terms, idx.const)


def describe(sched: Schedule) -> str:
    """A short human-readable summary of the schedule (for logs and tests)."""
    lines = []
    for step in sched.steps:
        if isinstance(step, ExternCall):
            lines.append(f"extern {step.node.name}: {getattr(step.node.fn, '__name__', step.node.fn)}")
        else:
            passes = ", ".join(("loop" if s.inner else "row") + f"[{len(s.reductions)}r {len(s.stores)}s]"
                               for s in step.steps)
            lines.append(f"{step.name}: outer {[v.size for v in step.outer_vars]} inner "
                         f"{[v.size for v in step.inner_vars]} {passes} writes {step.writes}")
    return "\n".join(lines)
