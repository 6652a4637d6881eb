"""Split reductions: a reduction with few output rows and a long reduced range becomes two.

    y[c] = sum over (n, h, w) of x[n, c, h, w]          64 rows of 802816 elements
 ->  partial[n, s, c] = sum over (h', w) of x[n, c, 14 s + h', w]      (64 * 8 * 64 rows of 1568)
     y[c] = sum over (n, s) of partial[n, s, c]

A GPU kernel runs one program per row (or per block of 64 rows when the reduced dim is strided),
so the first form keeps one or a few of the 132 SMs busy: BatchNorm's statistics in training
took 7 ms for a 100 MB activation.  The split form has thousands of rows, and the second stage is
small.  The reduced range is split along its leading dims (``r = s * chunk + j``), so every index
stays affine.

Types: ``sum``, ``prod``, ``max`` and ``min`` reduce their partials again (fp16/bf16 partials are
kept in fp32).  A ``welford_var``/``welford_mean`` pair is combined from per-chunk means and
population variances: with S chunks of equal count,
    mean = sum_s(mean_s) / S
    var  = sum_s(var_s + (mean_s - mean)^2) / S * N / (N - correction).
``argmax``/``argmin`` are left alone.

Which devices split, and from what size on, is the device's policy (``SPLIT_POLICIES``).
"""
from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any

import sympy

import torch

from ember.lower import ir
from ember.lower.ir import Const, IndexValue, Load, Op
from ember.symbolic import SymInt, hint_of, is_symbolic, known_equal


@dataclasses.dataclass(frozen=True)
class SplitPolicy:
    target_rows: int        # split until outer rows * chunks reaches this
    min_chunk: int          # ... keeping at least this many elements per partial row
    min_elements: int       # reductions reading fewer elements are left alone
    min_inner: int          # ... and so are rows shorter than this (a LayerNorm's 768 never splits)
    min_column_chunk: int | None = None     # min_chunk of a column reduction (reading across rows)


# CUDA: 132 SMs on an H100; a column reduction packs 64 rows per program, so 32768 rows are
# 512+ programs even then.  Its chunks may be shorter: the bias gradient of a (4096, 768)
# activation in chunks of 256 rows was 192 programs, at 45% of the bandwidth that 768 programs of
# 64 rows reach.  CPU kernels parallelize over rows across a few cores: not split.
SPLIT_POLICIES: dict[str, SplitPolicy] = {
    "cuda": SplitPolicy(target_rows=32768, min_chunk=256, min_elements=1 << 18, min_inner=2048,
                        min_column_chunk=64)}
_SPLITTABLE = ("sum", "prod", "max", "min")


def split_reductions(program: ir.LoopProgram, device_type: str) -> ir.LoopProgram:
    policy = SPLIT_POLICIES.get(device_type)
    if policy is None:
        return program
    replaced: dict[str, list[ir.LoopNode]] = {}      # node name -> the nodes that take its place
    means_of = _welford_pairs(program)
    paired_means = {mean.name for mean in means_of.values()}
    for node in program.nodes.values():
        if not isinstance(node, ir.Reduction) or node.name in replaced:
            continue
        split = _choose_split(node, policy)
        if split is None:
            continue
        if node.reduction_type in _SPLITTABLE:
            replaced[node.name] = _split_simple(node, split)
        elif node.reduction_type == "welford_var":
            mean = means_of.get(node.name)
            nodes = _split_welford(node, mean, split, set(program.nodes))
            if nodes is None:
                continue
            replaced[node.name] = nodes
            if mean is not None:
                replaced[mean.name] = []        # made by _split_welford, before the variance
        elif node.reduction_type == "welford_mean" and node.name not in paired_means:
            replaced[node.name] = _split_mean(node, split)
    if not replaced:
        return program
    nodes: dict[str, ir.LoopNode] = {}
    for name, node in program.nodes.items():
        for new in replaced.get(name, [node]):
            nodes[new.name] = new
    return dataclasses.replace(program, nodes=nodes)


def _welford_pairs(program: ir.LoopProgram) -> dict[str, ir.Reduction]:
    """Each ``welford_var`` -> the ``welford_mean`` of the same values that follows it (a var_mean's
    two results; ``x_var`` pairs with ``x_mean`` first).  One mean pairs with at most one variance:
    two var_means of one tensor (corrections 0 and 1) are two pairs."""
    waiting: dict[tuple, list[ir.Reduction]] = {}
    pairs: dict[str, ir.Reduction] = {}
    for node in program.nodes.values():
        if not isinstance(node, ir.Reduction) or node.reduction_type not in ("welford_var", "welford_mean"):
            continue
        key = (node.body, node.shape, node.reduction_shape)
        if node.reduction_type == "welford_var":
            waiting.setdefault(key, []).append(node)
            continue
        candidates = waiting.get(key)
        if candidates:
            named = [var for var in candidates if var.name.removesuffix("_var") == node.name.removesuffix("_mean")]
            var = (named or candidates)[0]
            candidates.remove(var)
            pairs[var.name] = node
    return pairs


# ---------------------------------------------------------------- where to split
def _reads_columns(node: ir.Reduction) -> bool:
    """Whether the node reads across rows: some load's last index names no reduced var (a bias
    gradient reading (n, c) as sum over n of x[n, c]), so GPU programs tile it in column blocks."""
    reduced = set(node.reduction_vars)
    return any(ld.index and reduced.isdisjoint(ld.index[-1].free_vars()) and not ld.index[-1].is_constant()
               for ld in ir.loads(node.body))


@dataclasses.dataclass
class _Split:
    chunks: tuple[int, ...]     # sizes of the new kept dims (the leading reduced dims, or parts of them)
    mapping: dict               # old reduction var -> index in the partial's vars
    partial_vars: tuple         # the partial's kept vars: one per chunk dim, then the node's own
    rest_vars: tuple            # what the partial still reduces

    @property
    def count(self) -> int:
        return math.prod(self.chunks)


def _choose_split(node: ir.Reduction, policy: SplitPolicy) -> _Split | None:
    """Decided at the sizes' hints, with no guard: any split is exact at every size.  A symbolic
    reduced dim becomes a chunk dim whole or not at all (a part of it would need a divisor of
    every size it may take), so ``(N, H, W)`` with symbolic N splits into per-image partials."""
    rows, inner = hint_of(math.prod(node.shape)), hint_of(math.prod(node.reduction_shape))
    if rows * inner < policy.min_elements or inner < max(policy.min_inner, 2 * policy.min_chunk) or \
            rows >= policy.target_rows:
        return None
    min_chunk = policy.min_chunk
    if policy.min_column_chunk is not None and _reads_columns(node):
        min_chunk = policy.min_column_chunk
    wanted = min(-(-policy.target_rows // rows), inner // min_chunk)
    chunks: list = []      # per leading reduced dim: how much of it becomes kept
    for size in node.reduction_shape:
        if wanted <= 1:
            break
        if hint_of(size) <= wanted:
            chunks.append(size)
            wanted = -(-wanted // hint_of(size))
            continue
        if is_symbolic(size):
            divisor = _symbolic_divisor(size, wanted)
            if divisor is None and hint_of(size) <= 4 * wanted:
                divisor = size      # whole, where a static size would pick itself as its divisor too
            if divisor is None:
                break
        else:
            divisor = next((d for d in range(wanted, size + 1) if size % d == 0), size)
            if divisor > 4 * wanted:    # a prime-ish size: stop splitting here
                break
        chunks.append(divisor)
        wanted = 1
    if hint_of(math.prod(chunks)) < 2:
        return None
    # chunk dims first: the node's own kept dims vary fastest across a program's rows, so a
    # column reduction's rows stay adjacent in memory (channels-last statistics, bias gradients)
    kept = ir.make_vars("x", tuple(chunks) + node.shape)
    whole = [known_equal(chunk, size) for chunk, size in zip(chunks, node.reduction_shape)]
    reduced_sizes = []
    for i, size in enumerate(node.reduction_shape):
        if i < len(chunks) and whole[i]:
            continue
        reduced_sizes.append(size // chunks[i] if i < len(chunks) else size)
    if not reduced_sizes:
        return None     # every reduced dim became a chunk dim (many tiny dims): nothing left to split off
    rest = ir.make_vars("r", reduced_sizes)
    mapping: dict = {old: ir.index(new) for old, new in zip(node.vars, kept[len(chunks):])}
    rest_iter = iter(rest)
    for i, old in enumerate(node.reduction_vars):
        if i < len(chunks):
            chunk_var = ir.index(kept[i])
            mapping[old] = chunk_var if whole[i] else chunk_var * (old.size // chunks[i]) + ir.index(next(rest_iter))
        else:
            mapping[old] = ir.index(next(rest_iter))
    return _Split(tuple(chunks), mapping, kept, rest)


def _symbolic_divisor(size: SymInt, wanted: int) -> Any:
    """A factor of a product of sizes (``B * T`` -> ``B``) that divides it at every size: the one
    nearest above ``wanted`` at the hints (within 4x), else the largest below it; None for sizes
    that are not products (``T - 1``)."""
    factors = size.expr.as_ordered_factors() if size.expr.is_Mul else [size.expr]
    proper = {sympy.Mul(*chosen) for n in range(1, len(factors))
              for chosen in itertools.combinations(factors, n)}
    options = sorted((size.env.hint(f), str(f), f) for f in proper if size.env.hint(f) >= 2)
    above = [o for o in options if wanted <= o[0] <= 4 * wanted]
    below = [o for o in options if o[0] < wanted]
    chosen = above[0] if above else below[-1] if below else None
    return None if chosen is None else SymInt.of(chosen[2], size.env)


def _partial_dtype(dtype: torch.dtype, reduction_type: str) -> torch.dtype:
    if reduction_type in ("max", "min") or not dtype.is_floating_point:
        return dtype
    return torch.float32 if dtype.itemsize < 4 else dtype


def _partial(node: ir.Reduction, split: _Split, name: str, reduction_type: str, dtype: torch.dtype) -> ir.Reduction:
    return ir.Reduction(name, split.chunks + node.shape, dtype, split.partial_vars, split.rest_vars,
                        reduction_type, ir.substitute(node.body, split.mapping), 0.0, f"{node.source} (split, stage 1)")


def _combine(node: ir.Reduction, split: _Split, name: str, reduction_type: str, dtype: torch.dtype,
             body_of) -> ir.Reduction:
    """A reduction over the chunk dims; ``body_of(load)`` builds the body from a partial's loader."""
    kept = ir.make_vars("x", node.shape)
    over = ir.make_vars("r", split.chunks)
    index = tuple(ir.index(v) for v in over + kept)
    body = body_of(lambda partial: Load(partial.name, index, partial.dtype), tuple(ir.index(v) for v in kept))
    return ir.Reduction(name, node.shape, dtype, kept, over, reduction_type, body, 0.0, f"{node.source} (split, stage 2)")


def _split_simple(node: ir.Reduction, split: _Split) -> list[ir.LoopNode]:
    dtype = _partial_dtype(node.dtype, node.reduction_type)
    partial = _partial(node, split, f"{node.name}_partial", node.reduction_type, dtype)
    final = _combine(node, split, node.name, node.reduction_type, node.dtype, lambda load, _: load(partial))
    return [partial, final]


def _split_mean(mean: ir.Reduction, split: _Split) -> list[ir.LoopNode]:
    """A mean with no variance beside it: per-chunk means (equal counts), then their mean."""
    dtype = _partial_dtype(mean.dtype, "sum")
    partial = _partial(mean, split, f"{mean.name}_partial", "welford_mean", dtype)
    chunks = _size_value(split.count, dtype)
    final = _combine(mean, split, mean.name, "sum", mean.dtype,
                     lambda load, _: Op("div", (load(partial), chunks), dtype))
    return [partial, final]


def _split_welford(var: ir.Reduction, mean: ir.Reduction | None, split: _Split, taken: set[str]) -> list[ir.LoopNode] | None:
    count = math.prod(var.reduction_shape)
    # a symbolic count is at least 2 (sizes 0 and 1 are specialised)
    if (hint_of(count) if not is_symbolic(count) else 2) - var.correction <= 0:
        return None     # eager's inf/nan: not worth a special case
    names = [f"{var.name}_{suffix}" for suffix in ("partial_mean", "partial_var", "split_mean")]
    if any(name in taken for name in names):
        return None
    dtype = _partial_dtype(var.dtype, "sum")
    partial_mean = _partial(var, split, names[0], "welford_mean", dtype)
    partial_var = _partial(var, split, names[1], "welford_var", dtype)     # population variance per chunk
    chunks = _size_value(split.count, dtype)

    def mean_body(load, _):
        return Op("div", (load(partial_mean), chunks), dtype)
    # the fp32 mean the variance combines with (the user's mean may be rounded to bf16)
    total_mean = _combine(var, split, names[2], "sum", dtype, mean_body)
    if is_symbolic(count) or is_symbolic(split.count):
        # count / (chunks * (count - correction)), computed in the kernel from the sizes
        n = _size_value(count, dtype)
        scale = Op("div", (n, Op("mul", (chunks, Op("sub", (n, Const(var.correction, dtype)), dtype)), dtype)), dtype)
    else:
        scale = Const(count / (split.count * (count - var.correction)), dtype)

    def var_body(load, kept_index):
        spread = Op("sub", (load(partial_mean), Load(total_mean.name, kept_index, dtype)), dtype)
        within = Op("add", (load(partial_var), Op("mul", (spread, spread), dtype)), dtype)
        return Op("mul", (within, scale), dtype)
    nodes: list[ir.LoopNode] = [partial_mean, partial_var, total_mean]
    if mean is not None:
        nodes.append(_combine(mean, split, mean.name, "sum", mean.dtype, mean_body))
    nodes.append(_combine(var, split, var.name, "sum", var.dtype, var_body))
    return nodes


def _size_value(size, dtype: torch.dtype) -> ir.Expr:
    """A size as a value of ``dtype`` in a kernel body: a constant, or read from the size arguments."""
    return IndexValue(ir.const_index(size), dtype) if is_symbolic(size) else Const(float(size), dtype)
