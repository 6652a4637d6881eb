"""CPU policy for the Externs of a Schedule: bf16/fp16 matrix products computed in float32.

In: a Schedule about to be compiled for the CPU.  Out: the same Schedule, with the function of
each large bf16/fp16 matrix product (linear, mm, addmm, bmm, baddbmm, matmul) replaced by one
that converts its operands to float32, calls the same torch function, and rounds the result
to the operands' dtype once.

Why: on a CPU without native bf16/fp16 dot products (no AVX512_BF16 / AMX / AVX512_FP16)
eager's low-precision matmul is 2-5x slower than float32 sgemm on the converted operands
(F.linear of [512, 512] x [2048, 512] bf16: 223 ms against 72 ms, conversions included, on
the 2-core Zen dev VM), and it computes the same thing: products of bf16/fp16 values are exact
in float32, eager accumulates them in float32 (and adds the bias there) and rounds once.  Only
the order of the float32 additions differs, as between any two blocked GEMMs: about 1 in 10^4
results is one bf16 ulp apart.  Small products keep eager's kernel (its matrix-vector path
beats converting the whole weight: 0.24 ms against 3 ms for one row).
"""
from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from ember.graph import tree_leaves, tree_map
from ember.lower import ir
from ember.lower.scheduler import Schedule
from ember.symbolic import hint_of

LOW_PRECISION = (torch.bfloat16, torch.float16)
# rows of the (batched) left operand from which the float32 form pays for converting the weight
MIN_ROWS = 128
# the Externs rewritten -> the position of their left operand (its rows, batch dims included,
# decide whether converting pays)
_MATMULS: dict[Callable, int] = {
    F.linear: 0, torch.mm: 0, torch.matmul: 0, torch.addmm: 1, torch.bmm: 0, torch.baddbmm: 1,
}
# CPU flags of native low-precision dot products: there eager's own kernels are the fast ones
_NATIVE_FLAGS = {torch.bfloat16: ("avx512_bf16", "amx_bf16"), torch.float16: ("avx512_fp16", "amx_fp16")}


@functools.cache
def _cpu_flags() -> frozenset[str] | None:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return None     # unknown CPU: leave eager's kernels alone


def converts_to_float32(dtype: torch.dtype) -> bool:
    """Does this CPU compute ``dtype`` matrix products faster through float32?"""
    flags = _cpu_flags()
    return dtype in LOW_PRECISION and flags is not None and not flags & set(_NATIVE_FLAGS[dtype])


def in_float32(fn: Callable, dtype: torch.dtype) -> Callable:
    """``fn`` computed on float32 copies of its ``dtype`` tensor arguments, the result rounded to ``dtype``."""
    def widen(value):
        return value.float() if isinstance(value, torch.Tensor) and value.dtype == dtype else value

    def float32_product(*args, **kwargs):
        return fn(*tree_map(widen, args), **tree_map(widen, kwargs)).to(dtype)
    float32_product.__name__ = f"{getattr(fn, '__name__', 'matmul')}_in_float32"
    float32_product.wrapped = fn
    return float32_product


def apply_matmul_policy(sched: Schedule) -> None:
    """Replace the function of each large low-precision matrix product (see the module docstring)."""
    for step in sched.externs:
        node = step.node
        position = _MATMULS.get(node.fn)
        if position is None or len(step.outputs) != 1:
            continue
        refs = [v for v in tree_leaves((node.args, node.kwargs)) if isinstance(v, ir.BufferRef)]
        dtypes = {sched.buffers[ref.name].dtype for ref in refs}
        if len(dtypes) != 1 or not converts_to_float32(dtype := dtypes.pop()):
            continue
        if position >= len(node.args) or not isinstance(node.args[position], ir.BufferRef):
            continue
        if _rows(node.args[position], sched) < MIN_ROWS:
            continue
        node.fn = in_float32(node.fn, dtype)


def _rows(arg: ir.BufferRef, sched: Schedule) -> int:
    """Rows of a matrix product's left operand (batch dims included), at the size hints."""
    shape = arg.shape if isinstance(arg, ir.BufferView) else sched.buffers[arg.name].shape
    return math.prod(hint_of(s) for s in shape[:-1]) if len(shape) >= 2 else 1
