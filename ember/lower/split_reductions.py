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
import math

import torch

from ember.lower import ir
from ember.lower.ir import Const, Load, Op


@dataclasses.dataclass(frozen=True)
class SplitPolicy:
    target_rows: int        # split until outer rows * chunks reaches this
    min_chunk: int          # ... keeping at least this many elements per partial row
    min_elements: int       # reductions reading fewer elements are left alone
    min_inner: int          # ... and so are rows shorter than this (a LayerNorm's 768 never splits)


# CUDA: 132 SMs on an H100; a column reduction packs 64 rows per program, so 32768 rows are
# 512+ programs even then.  CPU kernels parallelize over rows across a few cores: not split.
SPLIT_POLICIES: dict[str, SplitPolicy] = {
    "cuda": SplitPolicy(target_rows=32768, min_chunk=256, min_elements=1 << 18, min_inner=2048)}
_SPLITTABLE = ("sum", "prod", "max", "min")


def split_reductions(program: ir.LoopProgram, device_type: str) -> ir.LoopProgram:
    policy = SPLIT_POLICIES.get(device_type)
    if policy is None:
        return program
    replaced: dict[str, list[ir.LoopNode]] = {}      # node name -> the nodes that take its place
    welford_means = {(n.body, n.shape, n.reduction_shape): n for n in program.nodes.values()
                     if isinstance(n, ir.Reduction) and n.reduction_type == "welford_mean"}
    for node in program.nodes.values():
        if not isinstance(node, ir.Reduction) or node.name in replaced:
            continue
        split = _choose_split(node, policy)
        if split is None:
            continue
        if node.reduction_type in _SPLITTABLE:
            replaced[node.name] = _split_simple(node, split)
        elif node.reduction_type == "welford_var":
            mean = welford_means.get((node.body, node.shape, node.reduction_shape))
            nodes = _split_welford(node, mean, split, set(program.nodes))
            if nodes is None:
                continue
            replaced[node.name] = nodes
            if mean is not None:
                replaced[mean.name] = []        # made by _split_welford, before the variance
    if not replaced:
        return program
    nodes: dict[str, ir.LoopNode] = {}
    for name, node in program.nodes.items():
        for new in replaced.get(name, [node]):
            nodes[new.name] = new
    return dataclasses.replace(program, nodes=nodes)


# ---------------------------------------------------------------- where to split
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
    rows, inner = math.prod(node.shape), math.prod(node.reduction_shape)
    if rows * inner < policy.min_elements or inner < max(policy.min_inner, 2 * policy.min_chunk) or \
            rows >= policy.target_rows:
        return None
    wanted = min(-(-policy.target_rows // rows), inner // policy.min_chunk)
    chunks: list[int] = []      # per leading reduced dim: how much of it becomes kept
    for size in node.reduction_shape:
        if wanted <= 1:
            break
        if size <= wanted:
            chunks.append(size)
            wanted = -(-wanted // size)
            continue
        divisor = next((d for d in range(wanted, size + 1) if size % d == 0), size)
        if divisor > 4 * wanted:    # a prime-ish size: stop splitting here
            break
        chunks.append(divisor)
        wanted = 1
    if math.prod(chunks) < 2:
        return None
    # chunk dims first: the node's own kept dims vary fastest across a program's rows, so a
    # column reduction's rows stay adjacent in memory (channels-last statistics, bias gradients)
    kept = ir.make_vars("x", tuple(chunks) + node.shape)
    reduced_sizes = []
    for i, size in enumerate(node.reduction_shape):
        if i < len(chunks) and chunks[i] == size:
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
            mapping[old] = chunk_var if chunks[i] == old.size else chunk_var * (old.size // chunks[i]) + ir.index(next(rest_iter))
        else:
            mapping[old] = ir.index(next(rest_iter))
    return _Split(tuple(chunks), mapping, kept, rest)


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


def _split_welford(var: ir.Reduction, mean: ir.Reduction | None, split: _Split, taken: set[str]) -> list[ir.LoopNode] | None:
    count = math.prod(var.reduction_shape)
    if count - var.correction <= 0:
        return None     # eager's inf/nan: not worth a special case
    names = [f"{var.name}_{suffix}" for suffix in ("partial_mean", "partial_var", "split_mean")]
    if any(name in taken for name in names):
        return None
    dtype = _partial_dtype(var.dtype, "sum")
    partial_mean = _partial(var, split, names[0], "welford_mean", dtype)
    partial_var = _partial(var, split, names[1], "welford_var", dtype)     # population variance per chunk
    chunks = Const(float(split.count), dtype)

    def mean_body(load, _):
        return Op("div", (load(partial_mean), chunks), dtype)
    # the fp32 mean the variance combines with (the user's mean may be rounded to bf16)
    total_mean = _combine(var, split, names[2], "sum", dtype, mean_body)
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
