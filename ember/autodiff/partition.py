"""Split a joint graph into a forward and a backward graph by a minimum cut.

The backward needs some values the forward computes.  Each one is either *saved* (kept alive
from forward to backward: costs its bytes of memory) or *recomputed* in the backward from other
saved values.  Recomputing is allowed only for cheap ops (pointwise, views, constants); matmuls,
reductions, Externs and random numbers are computed once, in the forward, and saved if the
backward reads them.  Among the choices that respect this, the cut saves the fewest bytes:

    source -> every input and every op that must run in the forward      (infinite)
    v_in -> v_out                                                       (bytes of v: saving v)
    u_out -> v_in for each use of u by v                                 (infinite)
    v_out -> sink for each forward value the backward reads              (infinite)

A minimum s-t cut crosses only ``v_in -> v_out`` edges; those v are the saved values.  Inputs
and forward outputs cost nothing to save (they are alive anyway), so a pointwise chain from
them is recomputed in the backward rather than stored: Inductor's default, "save the matmul
output, recompute the gelu".

Two refinements (``_recompute_banned``, ``_tie_break``):

* a value that an Extern of the backward reads (a GELU output feeding the weight gradient's
  matmul) is never recomputed when its recomputation runs transcendental functions per element
  or an Extern of the forward reads it too: the backward would store it anyway, in a kernel of
  its own that repeats the math (erf over the nanoGPT MLP's [2048, 2048] activation: as long as
  the forward's GELU kernel), which the forward has stored already, so recomputing it saves no
  memory traffic, only the bytes kept alive in between (Inductor's ``should_ban_recomputation``:
  "if a node must be materialized in the backwards pass, then recomputing it is never free").
  A ResNet's ReLU outputs are the case: each is the next convolution's input, which eager saves
  too; recomputed, ResNet-50's backward moved 2.7 GB more a step (H100: 14.5 -> 13.6 ms);
* among cuts that save the same bytes, the cut saves values the forward stores anyway (Extern
  inputs and outputs) before values only a kernel's registers hold, then the values closest to
  the backward (Inductor's ``dist_from_bw``): ``mm + bias`` rather than ``mm`` when both are
  stored, so the forward adds the bias inside the GEMM (an ``addmm``) and the backward does not
  add it again.  A tie-break only: it never saves one byte more.
"""
from __future__ import annotations

import collections
import dataclasses
import operator
from typing import Any

from ember import config
from ember.autodiff.joint import Joint
from ember.errors import CompileError
from ember.graph import Graph, Node, TensorMeta, ancestors, tree_map
from ember.prims import primitives as P
from ember.prims.primitives import Prim
from ember.symbolic import hint_of

INFINITE = float("inf")
_RECOMPUTABLE_KINDS = ("elementwise", "view", "creation")
# x == amax(x) (the max's gradient goes to its ties) must see the very values the forward reduced:
# a chain recomputed by another kernel may round differently, and then no element is the max.
# Integers compare the same wherever they are computed (a max pooling's index against a tap's position).
_EXACT_COMPARISONS = ("eq", "ne")


@dataclasses.dataclass
class Partition:
    forward: Graph      # primals -> forward outputs, then the saved values
    backward: Graph     # saved values, then tangents -> one gradient per grad input
    saved: list[Node]   # joint nodes saved by the forward, in the forward's output order


def partition(joint: Joint) -> Partition:
    graph = joint.graph
    tangent_set = set(joint.tangents)
    backward_only = _descendants(graph, tangent_set)
    forward_outputs = list(graph.outputs[:joint.num_forward_outputs])
    grad_outputs = list(graph.outputs[joint.num_forward_outputs:])
    primal_values = [n for n in graph.nodes if n.op != "output" and n not in backward_only and n not in tangent_set]
    read_by_backward = _read_by(backward_only, grad_outputs, set(primal_values))
    written = {joint.primals[p] for p, _ in graph.extra.get("mutated_inputs", [])}
    # the two refinements, on the H100 (benchmarks/gpu_train_ab.py, GPU kernel time per step): vit
    # 11.40 -> 10.50 ms, bert 7.68 -> 7.10, nanogpt 11.42 -> 11.07, llama 11.51 -> 11.17, gpt2
    # 17.39 -> 17.14, peak memory +145 to +335 MB (still below eager's); on the CPU the nanoGPT
    # block +1.3-2.3%, where erf/exp per element cost more than the bytes
    refine = config.partition_refine
    saved = _min_cut(primal_values, read_by_backward, forward_outputs, written, backward_only if refine else None)
    forward = _extract(graph, joint.primals, forward_outputs + saved, "forward", made_by_vjp=backward_only)
    forward.extra = dict(graph.extra)
    backward = _extract(graph, saved + joint.tangents, grad_outputs, "backward", anchors=backward_only)
    return Partition(forward, backward, saved)


def _descendants(graph: Graph, roots: set[Node]) -> set[Node]:
    found = set(roots)
    for node in graph.nodes:
        if node.op == "call" and any(i in found for i in node.inputs()):
            found.add(node)
    return found - roots


def _read_by(backward_only: set[Node], grad_outputs: list[Any], primal: set[Node]) -> list[Node]:
    """Forward-computable values that the backward reads directly."""
    read: dict[Node, None] = {}
    for node in backward_only:
        for value in node.inputs():
            if value in primal:
                read[value] = None
    for value in grad_outputs:
        if isinstance(value, Node) and value in primal:
            read[value] = None
    return list(read)


def recomputable(node: Node) -> bool:
    """May the backward compute this value again?  Views cost nothing; pointwise ops and
    constants unless ``config.recompute`` is off (EMBER_RECOMPUTE=0)."""
    if node.op != "call":
        return False
    if node.target is operator.getitem:
        return recomputable(node.args[0]) if isinstance(node.args[0], Node) else False
    target = node.target
    if not isinstance(target, Prim) or target is P.as_strided:
        return False
    if target.name in _EXACT_COMPARISONS and any(
            isinstance(u.meta, TensorMeta) and u.meta.dtype.is_floating_point for u in node.inputs()):
        return False
    return target.kind == "view" or (config.recompute and target.kind in _RECOMPUTABLE_KINDS)


def _save_cost(node: Node, free: set[Node], written: set[Node]) -> float:
    if node in written:
        return INFINITE         # its value changes when the forward writes it back: never saved
    if node in free:
        return 0.0
    if isinstance(node.meta, TensorMeta):
        # at the size hints: a cost model takes no guard (the cut is exact at any size)
        return float(hint_of(node.meta.numel()) * node.meta.dtype.itemsize)
    if node.meta is None and node.op == "call" and node.target is not operator.getitem:
        return 8.0              # a Python scalar computed at run time (a seed): saved as is
    return INFINITE             # a tuple of values: save its elements instead


def _min_cut(values: list[Node], read_by_backward: list[Node], forward_outputs: list[Any],
             written: set[Node], backward_only: set[Node] | None = None) -> list[Node]:
    """``backward_only``: the backward's nodes, for the two refinements of the module docstring
    (None: bytes alone)."""
    if not read_by_backward:
        return []
    free = {v for v in forward_outputs if isinstance(v, Node)} | {v for v in values if v.op == "placeholder"}
    flow = _FlowNetwork()
    source, sink = "source", "sink"
    index = {v: i for i, v in enumerate(values)}
    banned = _long_recomputations(values)
    if backward_only is not None:
        users = _users(values, backward_only)
        banned |= _recompute_banned(values, users, backward_only)
        tie = _tie_break(values, users, backward_only)
        # integer capacities: bytes in the high digits, the tie-break below them (never outweighs a byte)
        scale = (len(values) + 1) * _TIE_RANGE
    for v in values:
        cost = _save_cost(v, free, written)
        if backward_only is not None and cost not in (0, INFINITE):
            cost = int(cost) * scale + tie[v]
        flow.edge(("in", v), ("out", v), cost)
        if not recomputable(v) or v in banned:
            flow.edge(source, ("in", v), INFINITE)
        for u in v.inputs():
            if u in index:
                flow.edge(("out", u), ("in", v), INFINITE)
    for v in read_by_backward:
        flow.edge(("out", v), sink, INFINITE)
    if flow.max_flow(source, sink) == INFINITE:
        raise CompileError("the backward reads a value that can be neither saved nor recomputed", stage="autodiff")
    reachable = flow.reachable(source)
    cut = {v for v in values if ("in", v) in reachable and ("out", v) not in reachable}
    return _needed(cut, read_by_backward, index)


def _needed(cut: set[Node], read_by_backward: list[Node], index: dict[Node, int]) -> list[Node]:
    """The cut's values that the backward reads, directly or through its recomputations, in
    forward order.  The cut also crosses free values nothing reads (a forward output downstream of
    a matmul): saving one would keep, say, a language model's logits alive until the backward
    after the caller dropped them."""
    needed = ancestors(read_by_backward, follow=lambda v: v not in cut)
    return sorted(needed & cut, key=index.__getitem__)


def _users(values: list[Node], backward_only: set[Node]) -> dict[Node, list[Node]]:
    """Readers of each forward value among the forward values and the backward's nodes."""
    users: dict[Node, list[Node]] = {v: [] for v in values}
    for node in (*values, *backward_only):
        for value in node.inputs():
            if value in users:
                users[value].append(node)
    return users


def _is_extern(node: Node) -> bool:
    return node.op == "call" and node.target is not operator.getitem and not isinstance(node.target, Prim)


def _is_view(node: Node) -> bool:
    return node.op == "call" and (node.target is operator.getitem or
                                  isinstance(node.target, Prim) and node.target.kind == "view")


def _read_by_extern(v: Node, users: dict[Node, list[Node]], side: set[Node] | None) -> bool:
    """Does an Extern read ``v``, directly or through views (only Externs in ``side`` when given)?"""
    stack, seen = [v], set()
    while stack:
        for user in users.get(stack.pop(), ()):
            if user in seen:
                continue
            seen.add(user)
            if _is_extern(user) and (side is None or user in side):
                return True
            if _is_view(user):
                stack.append(user)
    return False


# the most values of its own size that recomputing one value may read (_long_recomputations)
RECOMPUTE_MAX_READS = 4


def _long_recomputations(values: list[Node]) -> set[Node]:
    """Recomputable values whose recomputation would read more than RECOMPUTE_MAX_READS
    values of their size: they are computed once, in the forward (and saved if the backward
    needs them).  A pre-norm transformer's residual stream ``x_k = x_0 + attn_1 + mlp_1 + ...``
    is the case: recomputed, each layer norm's backward rebuilt x_k from all 2k branch outputs
    (nanoGPT's last one read 22 tensors; bytes quadratic in depth), where eager saves x_k."""
    reads: dict[Node, frozenset[Node]] = {}
    long: set[Node] = set()
    for v in values:
        if not recomputable(v) or not isinstance(v.meta, TensorMeta):
            continue
        numel = hint_of(v.meta.numel())
        read: set[Node] = set()
        for u in v.inputs():
            if not isinstance(u.meta, TensorMeta) or hint_of(u.meta.numel()) != numel:
                continue            # a broadcast weight, a row statistic: small beside v
            read |= reads.get(u, {u})
        if len(read) > RECOMPUTE_MAX_READS:
            long.add(v)
        else:
            reads[v] = frozenset(read)
    return long


# elementwise prims that call a libm function per element (lower/scheduler.py's _TRANSCENDENTAL)
_TRANSCENDENTAL = frozenset({
    "exp", "exp2", "expm1", "log", "log1p", "log2", "log10", "sin", "cos", "tan", "asin", "acos", "atan",
    "sinh", "cosh", "tanh", "asinh", "acosh", "atanh", "erf", "erfc", "erfinv", "lgamma", "sigmoid", "pow",
    "atan2", "hypot"})


def _recompute_banned(values: list[Node], users: dict[Node, list[Node]], backward_only: set[Node]) -> set[Node]:
    """Recomputable values that a backward Extern reads and that are stored anyway: a forward
    Extern reads them too, or their recomputation calls a transcendental function per element
    (module docstring).  The recomputation is the chain of recomputable ops of the value's size
    that ends at it (one pass in graph order)."""
    transcendental_chain: dict[Node, bool] = {}
    for v in values:
        if not recomputable(v) or not isinstance(v.meta, TensorMeta):
            continue
        numel = hint_of(v.meta.numel())
        transcendental_chain[v] = (isinstance(v.target, Prim) and v.target.name in _TRANSCENDENTAL) or any(
            transcendental_chain.get(u, False) and hint_of(u.meta.numel()) == numel for u in v.inputs())
    forward = set(values)
    return {v for v, chain in transcendental_chain.items()
            if not _is_view(v) and _read_by_extern(v, users, backward_only)
            and (chain or _read_by_extern(v, users, forward))}


_TIE_RANGE = 4096        # a value's tie-break lies in [0, _TIE_RANGE)
_MAX_DISTANCE = _TIE_RANGE - 3


def _tie_break(values: list[Node], users: dict[Node, list[Node]], backward_only: set[Node]) -> dict[Node, int]:
    """Per value, a cost below one byte among cuts of equal bytes (module docstring).  A value the
    forward stores anyway: one plus its distance to the nearest backward node in ops other than
    views (so a base is saved rather than its views).  Any other value: the top of the range, the
    same for all of them, so that among those the cut stays where the flow puts it (the one nearest
    the inputs): saving the bf16 RMS factor instead of the mean square it comes from raised the
    per-block recomputing backward's planned peak of tests/autodiff/test_backward_memory.py from
    12.6 to 17 activations)."""
    distance: dict[Node, int] = {}
    for v in reversed(values):
        near = [0 if u in backward_only else distance.get(u, _MAX_DISTANCE) + (0 if _is_view(u) else 1)
                for u in users[v]]
        distance[v] = min(_MAX_DISTANCE - 1, min(near, default=_MAX_DISTANCE))
    forward = set(values)
    tie = {}
    for v in values:
        stored = not recomputable(v) or _read_by_extern(v, users, forward)
        tie[v] = 1 + distance[v] if stored else _TIE_RANGE - 1
    return tie


class _FlowNetwork:
    """Dinic's maximum flow over hashable vertices."""

    def __init__(self) -> None:
        self.adjacent: dict[Any, list[int]] = collections.defaultdict(list)
        self.to: list[Any] = []
        self.capacity: list[float] = []

    def edge(self, u: Any, v: Any, capacity: float) -> None:
        self.adjacent[u].append(len(self.to))
        self.to.append(v)
        self.capacity.append(capacity)
        self.adjacent[v].append(len(self.to))
        self.to.append(u)
        self.capacity.append(0)         # integers: exact at any byte count

    def _levels(self, source: Any, sink: Any) -> dict[Any, int] | None:
        level = {source: 0}
        queue = collections.deque([source])
        while queue:
            u = queue.popleft()
            for e in self.adjacent[u]:
                v = self.to[e]
                if self.capacity[e] > 0 and v not in level:
                    level[v] = level[u] + 1
                    queue.append(v)
        return level if sink in level else None

    def max_flow(self, source: Any, sink: Any) -> float:
        total = 0
        while True:
            level = self._levels(source, sink)
            if level is None:
                return total
            cursor = {u: 0 for u in level}
            while True:
                pushed = self._augment(source, sink, level, cursor)
                if pushed == 0:
                    break
                if pushed == INFINITE:
                    return INFINITE
                total += pushed

    def _augment(self, source: Any, sink: Any, level: dict[Any, int], cursor: dict[Any, int]) -> float:
        """One blocking-flow path (iterative DFS), returning what it pushed."""
        path: list[int] = []
        u = source
        while True:
            if u == sink:
                pushed = min(self.capacity[e] for e in path)
                if pushed == INFINITE:
                    return INFINITE
                for e in path:
                    self.capacity[e] -= pushed
                    self.capacity[e ^ 1] += pushed
                return pushed
            edges = self.adjacent[u]
            advanced = False
            while cursor[u] < len(edges):
                e = edges[cursor[u]]
                v = self.to[e]
                if self.capacity[e] > 0 and level.get(v, -1) == level[u] + 1:
                    path.append(e)
                    u = v
                    advanced = True
                    break
                cursor[u] += 1
            if advanced:
                continue
            if not path:
                return 0.0
            level[u] = -1               # dead end: never enter it again in this phase
            e = path.pop()
            u = self.to[e ^ 1]
            cursor[u] += 1

    def reachable(self, source: Any) -> set[Any]:
        seen = {source}
        stack = [source]
        while stack:
            u = stack.pop()
            for e in self.adjacent[u]:
                v = self.to[e]
                if self.capacity[e] > 0 and v not in seen:
                    seen.add(v)
                    stack.append(v)
        return seen


def _extract(graph: Graph, inputs: list[Node], outputs: list[Any], name: str,
             anchors: set[Node] | None = None, made_by_vjp: set[Node] | None = None) -> Graph:
    """The subgraph computing ``outputs`` from ``inputs`` (which become its placeholders).

    Nodes keep the joint graph's order, except with ``anchors`` (the backward-only nodes):
    those keep their order and every other node (a value the backward recomputes) is placed
    right before the first node that needs it.  In joint order every recomputed value would
    come first, before the whole backward, and live through all of it: a ResNet's backward
    then rebuilt the BatchNorm+ReLU outputs of every layer at once (peak memory doubled).

    With ``made_by_vjp`` (the backward-only nodes, for the forward graph): a forward node that
    comes after the first of them in joint order was made by a VJP rule for the backward (max
    pooling's indices); it runs right after its inputs are ready instead of at the end of the
    forward, where its inputs (the stem's activation) lived through the whole forward."""
    boundary = set(inputs)
    needed: set[Node] = set()
    stack = [v for v in outputs if isinstance(v, Node)]
    while stack:
        node = stack.pop()
        if node in needed or node in boundary:
            continue
        if node.op == "placeholder":
            raise CompileError(f"the {name} graph reads {node.name}, which it does not receive", stage="autodiff")
        needed.add(node)
        stack.extend(node.inputs())
    if anchors is None:
        order = [node for node in graph.nodes if node in needed]
        if made_by_vjp:
            order = _vjp_nodes_early(graph, order, made_by_vjp)
    else:
        order = _as_late_as_possible(graph, needed, anchors, outputs)
    new = Graph()
    mapping: dict[Node, Node] = {}
    for node in inputs:
        mapping[node] = new.placeholder(node.name, node.meta)
        mapping[node].extra = dict(node.extra)
    remap = lambda v: mapping[v] if isinstance(v, Node) else v  # noqa: E731
    for node in order:
        mapping[node] = new.call(node.target, tree_map(remap, node.args), tree_map(remap, node.kwargs),
                                 node.meta, node.name, node.source_line)
        mapping[node].extra = dict(node.extra)
    new.output([remap(v) for v in outputs])
    return new


def _vjp_nodes_early(graph: Graph, order: list[Node], made_by_vjp: set[Node]) -> list[Node]:
    """``order`` with each node that follows the first of ``made_by_vjp`` in joint order moved to
    right after the last of its inputs (in the order built so far)."""
    first_vjp = next((i for i, node in enumerate(graph.nodes) if node in made_by_vjp), None)
    if first_vjp is None:
        return order
    late = set(graph.nodes[first_vjp:])
    out = [node for node in order if node not in late]
    for node in order:
        if node not in late:
            continue
        inputs = set(node.inputs())
        at = max((i for i, other in enumerate(out) if other in inputs), default=-1)
        out.insert(at + 1, node)
    return out


def _as_late_as_possible(graph: Graph, needed: set[Node], anchors: set[Node], outputs: list[Any]) -> list[Node]:
    """``needed`` in an order where the anchors keep their joint order and each other node comes
    just before its first reader (a post-order walk from each anchor, then from the outputs)."""
    order: list[Node] = []
    emitted: set[Node] = set()

    def emit(root: Node) -> None:
        stack = [(root, iter(root.inputs()))]
        while stack:
            node, pending = stack[-1]
            for value in pending:
                if value in needed and value not in emitted and value not in anchors:
                    stack.append((value, iter(value.inputs())))
                    break
            else:
                stack.pop()
                if node not in emitted:
                    emitted.add(node)
                    order.append(node)

    for node in graph.nodes:
        if node in needed and node in anchors:
            emit(node)
    for value in outputs:
        if isinstance(value, Node) and value in needed and value not in emitted:
            emit(value)
    return order
