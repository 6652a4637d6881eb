"""CPU policy for the Externs of a Schedule: bias adds into the GEMM, bf16/fp16 matrix products
computed in float32.

In: a Schedule about to be compiled for the CPU.  Out: the same Schedule, where

* a float32/float64 ``mm`` whose only reader is a kernel that does nothing but add a bias row
  (a linear layer feeding attention: ``q, k, v = c_attn(x).split(...)``) becomes one ``addmm``
  writing that kernel's buffer, and the kernel is gone (``fuse_bias_into_matmuls``).  Decomposition
  leaves bias adds as prims so that they fuse into what follows (GELU, a residual, a norm); when
  nothing follows, the kernel re-read and re-wrote the whole product (the 2048 x 1536 QKV
  projection of benchmarks/cpu_blocks.py's block: 1.4-3.3 ms a call, a fresh 12 MB buffer) where
  the GEMM adds the bias while it writes its output (beta = 1), as eager's linear does;
* a backward's ``mm`` whose product is returned only transposed (a weight gradient: the VJP of
  ``x @ W.t()`` computes ``x.t() @ g``, a [in, out] product returned as the [out, in] gradient,
  column-major) computes the transposed product itself, ``g.t() @ x``, row-major, as eager's
  linear backward does (``transpose_returned_products``): autograd's AccumulateGrad copied each
  column-major gradient into the parameter's row-major layout (4 copies of 1-4 MB a nanoGPT
  block's step), and the GEMM takes as long either way;
* causal self-attention of 128 to 767 tokens runs as blocks of 64 queries, each block against
  only the keys it sees (``causal_attention_by_query_blocks``).  Eager's CPU flash kernel took as
  long for causal attention as for full attention at these lengths (B8 H8 T256 D64: 22.6 ms
  either way, 17.6 ms in blocks; T512: 43.2 against 31.8 ms; from 768 tokens on it splits its
  work itself and blocks gain nothing);
* a training graph's causal CPU flash attention of the lengths in CAUSAL_TRAINING_LENGTHS (none by
  default, see there; float32): its forward in query blocks as above (keeping the log-sum-exp), its
  backward as the causal square's diagonal blocks plus the squares below them, each size one
  batched call (``causal_flash_backward_by_halves``): B8 H8 T256 D64 on 2 quiet threads, forward
  21.9 -> 17.4 ms, backward 50.2 -> 42.4 ms;
* the function of each large bf16/fp16 matrix product (linear, mm, addmm, bmm, baddbmm, matmul)
  is replaced by one that converts its operands to float32, calls the same torch function, and
  rounds the result to the operands' dtype once.

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

import dataclasses
import functools
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F

from ember.graph import tree_leaves, tree_map
from ember.lower import ir
from ember.lower.scheduler import BufferPlan, ExternCall, FusedKernel, Schedule
from ember.symbolic import hint_of, is_symbolic

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
    """Fuse lone bias adds into their GEMMs and replace the function of each large low-precision
    matrix product (see the module docstring)."""
    fuse_bias_into_matmuls(sched)
    split_causal_attention(sched)
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
    transpose_returned_products(sched)


def transpose_returned_products(sched: Schedule) -> None:
    """A backward's ``mm(a, b)`` that only the caller reads, as its transpose (the module
    docstring) -> ``mm(b.t(), a.t()).t()``: the product's buffer column-major, its returned
    transpose row-major.  Static 2-d float products only; the numbers are the same products
    summed by the same GEMM, only with the operands' roles swapped."""
    if not sched.program.extra.get("backward", False):
        return
    read = set()
    for step in sched.steps:
        read |= set(step.reads) if isinstance(step, FusedKernel) else set(step.node.reads())
    for step in sched.externs:
        node = step.node
        if _unwrapped(node.fn) is not torch.mm or len(step.outputs) != 1 or node.kwargs or len(node.args) != 2:
            continue
        name = step.outputs[0].name
        plan = sched.buffers.get(name)
        if name in read or plan is None or plan.kind != "extern" or len(plan.shape) != 2 or \
                not _row_major(plan) or plan.dtype not in (torch.float32, torch.float64, *LOW_PRECISION):
            continue
        rows, cols = plan.shape
        views = [i for i, out in enumerate(sched.program.outputs)
                 if (isinstance(out, ir.OutputView) and out.base == name) or (isinstance(out, str) and out == name)]
        if not views or not all(_is_transpose(sched.program.outputs[i], rows, cols) for i in views):
            continue
        node.fn = _transposed_product(node.fn)
        stride = (1, rows)
        sched.buffers[name] = dataclasses.replace(plan, stride=stride)
        step.outputs[0] = dataclasses.replace(step.outputs[0], stride=stride)
        if isinstance(sched.program.nodes.get(name), ir.ExternOutput):
            sched.program.nodes[name] = step.outputs[0]
        for i in views:
            sched.program.outputs[i] = dataclasses.replace(sched.program.outputs[i], stride=(rows, 1))


def _is_transpose(out: object, rows: int, cols: int) -> bool:
    """Is a program output the transpose of a row-major [rows, cols] buffer?"""
    return isinstance(out, ir.OutputView) and tuple(out.shape) == (cols, rows) and \
        tuple(out.stride) == (1, cols) and out.storage_offset == 0


def _unwrapped(fn: Callable) -> Callable:
    return getattr(fn, "wrapped", fn)


def _transposed_product(fn: Callable) -> Callable:
    """``fn(a, b)`` (a matrix product) computed as ``fn(b.t(), a.t()).t()``."""
    def transposed_product(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return fn(b.t(), a.t()).t()
    transposed_product.__name__ = f"{getattr(fn, '__name__', 'mm')}_transposed"
    transposed_product.wrapped = _unwrapped(fn)
    return transposed_product


def _rows(arg: ir.BufferRef, sched: Schedule) -> int:
    """Rows of a matrix product's left operand (batch dims included), at the size hints."""
    shape = arg.shape if isinstance(arg, ir.BufferView) else sched.buffers[arg.name].shape
    return math.prod(hint_of(s) for s in shape[:-1]) if len(shape) >= 2 else 1


# dtypes whose bias add may move into the GEMM: the sum is rounded once instead of twice (closer to
# the exact result, and eager's linear does the same).  bf16/fp16 linears keep their bias in the
# Extern already (prims/decompositions/linalg.py)
_BIAS_FUSED_DTYPES = (torch.float32, torch.float64)


def fuse_bias_into_matmuls(sched: Schedule) -> None:
    """``mm`` + a kernel that only adds a bias row to the product -> one ``addmm`` Extern that
    returns the kernel's buffer (module docstring).  The product must be read by that kernel
    alone, and the kernel's buffer laid out like the product (both row-major, same elements)."""
    readers: dict[str, int] = {}
    for step in sched.steps:
        for name in (step.reads if isinstance(step, FusedKernel) else step.node.reads()):
            readers[name] = readers.get(name, 0) + 1
    returned = sched.program.returned_buffers()
    producers = {output.name: step for step in sched.externs for output in step.outputs}
    for kernel in list(sched.kernels):
        found = _lone_bias_add(kernel, sched.buffers)
        if found is None:
            continue
        product, bias = found
        extern = producers.get(product)
        if extern is None or extern.node.fn is not torch.mm or len(extern.outputs) != 1 or \
                readers.get(product) != 1 or product in returned:
            continue
        _fuse(sched, extern, kernel, bias)


def _lone_bias_add(kernel: FusedKernel, buffers: dict[str, BufferPlan]) -> tuple[str, str] | None:
    """(product, bias) when the kernel only stores ``product + bias`` with the bias indexed by the
    last dim, into a buffer with the product's row-major layout; else None."""
    if kernel.inner_vars or len(kernel.steps) != 1 or len(kernel.writes) != 1:
        return None
    step = kernel.steps[0]
    if step.reductions or len(step.stores) != 1:
        return None
    store = step.stores[0]
    body = store.body
    if not (isinstance(body, ir.Op) and body.op == "add" and len(body.args) == 2 and
            all(isinstance(a, ir.Load) for a in body.args)):
        return None
    out = buffers[store.buffer]
    if out.dtype not in _BIAS_FUSED_DTYPES or not _row_major(out) or out.kind not in ("intermediate", "output"):
        return None
    for product, bias in (body.args, body.args[::-1]):
        product_plan, bias_plan = buffers.get(product.buffer), buffers.get(bias.buffer)
        if product_plan is None or bias_plan is None or product_plan.kind != "extern" or \
                not _row_major(product_plan) or len(product_plan.shape) != 2 or \
                product_plan.shape[1] != out.shape[-1] or math.prod(product_plan.shape) != math.prod(out.shape):
            continue
        if product.dtype != out.dtype or bias.dtype != out.dtype or bias_plan.dtype != out.dtype:
            continue
        # the product read where the result is stored; the bias along the result's last dim
        if _flat(product_plan, product.index) != _flat(out, store.index):
            continue
        if len(bias_plan.shape) != 1 or not _row_major(bias_plan) or bias_plan.shape[0] != out.shape[-1] or \
                tuple(bias.index) != (store.index[-1],):
            continue
        return product.buffer, bias.buffer
    return None


def _fuse(sched: Schedule, extern: ExternCall, kernel: FusedKernel, bias: str) -> None:
    result = kernel.writes[0]
    plan = sched.buffers[result]
    product = extern.outputs[0].name
    extern.node.fn = _addmm_as(plan.shape)
    extern.node.args = (ir.BufferRef(bias), *extern.node.args)
    output = ir.ExternOutput(result, plan.shape, plan.dtype, extern.node.name, None, plan.stride, 0)
    extern.outputs = [output]
    kind = "output" if plan.kind == "output" else "extern"
    sched.buffers[result] = dataclasses.replace(plan, kind=kind, allocation=result)
    del sched.buffers[product]
    sched.steps.remove(kernel)
    nodes = sched.program.nodes
    nodes[result] = output
    nodes.pop(product, None)


def _addmm_as(shape: tuple[int, ...]) -> Callable:
    """``torch.addmm(bias, a, b)`` returned as a (contiguous) tensor of ``shape``."""
    if len(shape) == 2:
        return torch.addmm

    def addmm(bias: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.addmm(bias, a, b).view(shape)
    return addmm


def _row_major(plan: BufferPlan) -> bool:
    values = (*plan.shape, *plan.stride, plan.storage_offset)
    return not any(is_symbolic(v) for v in values) and plan.storage_offset == 0 and \
        all(size == 1 or stride == expected
            for size, stride, expected in zip(plan.shape, plan.stride, ir.contiguous_strides(plan.shape)))


def _flat(plan: BufferPlan, index: tuple[ir.Index, ...]) -> ir.Index:
    flat = ir.const_index(0)
    for idx, stride, size in zip(index, plan.stride, plan.shape):
        if size != 1:
            flat = flat + idx * stride
    return flat


# causal self-attention lengths run as query blocks (module docstring), and the block size.
# Measured on the 2-core Zen dev VM, fp32 and bf16 alike; an empty range turns it off
CAUSAL_BLOCK_LENGTHS = range(128, 768)
CAUSAL_QUERY_BLOCK = 64
# F.scaled_dot_product_attention's parameters after query, key and value
_ATTENTION_OPTIONS = ("attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")


# eager's CPU flash attention ops of a training graph (prims/decompositions/attention.py,
# autodiff/extern_rules.py): forward (output, logsumexp) and backward (dq, dk, dv)
CPU_FLASH_FORWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
CPU_FLASH_BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default
# causal training attention of these lengths (a power-of-two count of CAUSAL_QUERY_BLOCKs: the
# backward's halving needs it) runs in blocks (``causal_flash_forward_by_query_blocks``,
# ``causal_flash_backward_by_halves``).  Off (empty) by default: on a quiet 2-core host the nanoGPT
# block's training step gained 1.5% with (128, 256, 512) (eager/ember 1.027 against 1.012, paired
# A/B in one process), but with other processes on its cores it lost 5-8% (0.92-0.98 against
# 1.02-1.05, five paired runs): its 4 + 3 calls and 10 copies and adds are so many more forks and
# joins of the threads, each waiting for a descheduled one
CAUSAL_TRAINING_LENGTHS: tuple[int, ...] = ()


def split_causal_attention(sched: Schedule) -> None:
    """Causal self-attention (no mask, no dropout, as many keys as queries, a length in
    CAUSAL_BLOCK_LENGTHS) -> ``causal_attention_by_query_blocks``; a training graph's CPU flash
    forward and backward of a length in CAUSAL_TRAINING_LENGTHS -> their blocked forms."""
    for step in sched.externs:
        node = step.node
        if node.fn in (CPU_FLASH_FORWARD, CPU_FLASH_BACKWARD):
            _split_causal_flash(step, sched)
            continue
        if node.fn is not F.scaled_dot_product_attention or len(node.args) < 3 or len(step.outputs) != 1:
            continue
        options = dict(zip(_ATTENTION_OPTIONS, node.args[3:])) | node.kwargs
        if options.get("is_causal") is not True or options.get("attn_mask") is not None or \
                options.get("dropout_p", 0.0) != 0.0 or options.get("enable_gqa", False):
            continue
        shapes = [_shape(arg, sched) for arg in node.args[:3]]
        if any(shape is None or len(shape) != 4 or any(is_symbolic(v) for v in shape) for shape in shapes):
            continue
        (batch, heads, queries, _), (_, _, keys, _), _ = shapes
        # each block's call shares out (batch, head) pairs: as many as threads at least (measured
        # on 2 threads only; a block has fewer query splits to share than the whole call)
        if queries == keys and queries in CAUSAL_BLOCK_LENGTHS and batch * heads >= torch.get_num_threads():
            node.fn = causal_attention_by_query_blocks


def _split_causal_flash(step: ExternCall, sched: Schedule) -> None:
    node = step.node
    forward = node.fn is CPU_FLASH_FORWARD
    tensors = 3 if forward else 6
    if len(node.args) != tensors + 2 or set(node.kwargs) - {"attn_mask", "scale"} or \
            node.kwargs.get("attn_mask") is not None or len(step.outputs) != (2 if forward else 3):
        return
    dropout_p, is_causal = node.args[tensors:]
    if dropout_p != 0.0 or is_causal is not True:
        return
    query, key = (_shape(arg, sched) for arg in (node.args[0 if forward else 1], node.args[1 if forward else 2]))
    if query is None or key is None or len(query) != 4 or len(key) != 4 or \
            any(is_symbolic(v) for v in (*query, *key)):
        return
    dtypes = {sched.buffers[arg.name].dtype for arg in node.args[:tensors] if isinstance(arg, ir.BufferRef)}
    batch, heads, length, _ = query
    if dtypes != {torch.float32} or key[2] != length or length not in CAUSAL_TRAINING_LENGTHS or \
            batch * heads < torch.get_num_threads():
        return
    node.fn = causal_flash_forward_by_query_blocks if forward else causal_flash_backward_by_halves


def _blocks(t: torch.Tensor, size: int, start: int, step: int) -> torch.Tensor | None:
    """The rows [start + i * step, start + i * step + size) of a [B, H, L, ...] tensor along L,
    for each i, as one [B * (L // step), H, size, ...] view (or None where the layout cannot:
    the batch stride must be L times the row stride, as in a [B, L, H, D] buffer)."""
    stride, length = t.stride(), t.shape[2]
    if stride[0] != length * stride[2] and t.shape[0] > 1:
        return None
    shape = (t.shape[0] * (length // step), t.shape[1], size, *t.shape[3:])
    return t.as_strided(shape, (step * stride[2], stride[1], stride[2], *stride[3:]),
                        t.storage_offset() + start * stride[2])


def causal_flash_forward_by_query_blocks(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                         dropout_p: float = 0.0, is_causal: bool = False, *,
                                         attn_mask: torch.Tensor | None = None, scale: float | None = None
                                         ) -> tuple[torch.Tensor, torch.Tensor]:
    """``_scaled_dot_product_flash_attention_for_cpu(query, key, value, is_causal=True)``: the
    output and log-sum-exp, CAUSAL_QUERY_BLOCK queries at a time against the keys up to the
    block's last query (eager's kernel reads every key at these lengths: 39 -> 30 ms for the
    B8 H8 T256 D64 forward, 1 thread).  In eager's layouts ([B, L, H, D] and [B, L, H] memory)."""
    length = query.shape[2]
    if not is_causal or attn_mask is not None or dropout_p or query.dim() != 4 or key.shape[2] != length:
        return CPU_FLASH_FORWARD(query, key, value, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)
    batch, heads, _, dim = query.shape
    out = torch.empty((batch, length, heads, value.shape[-1]), dtype=query.dtype).transpose(1, 2)
    logsumexp = torch.empty((batch, length, heads), dtype=torch.float32).permute(0, 2, 1)
    mask = _additive_causal_mask(length, query.dtype)
    for start in range(0, length, CAUSAL_QUERY_BLOCK):
        end = min(start + CAUSAL_QUERY_BLOCK, length)
        q, k, v = query[:, :, start:end], key[:, :, :end], value[:, :, :end]
        if start == 0:
            block, block_lse = CPU_FLASH_FORWARD(q, k, v, 0.0, True, scale=scale)
        else:
            block, block_lse = CPU_FLASH_FORWARD(q, k, v, 0.0, False, attn_mask=mask[start:end, :end], scale=scale)
        out[:, :, start:end] = block
        logsumexp[:, :, start:end] = block_lse
    return out, logsumexp


def causal_flash_backward_by_halves(grad_out: torch.Tensor, query: torch.Tensor, key: torch.Tensor,
                                    value: torch.Tensor, out: torch.Tensor, logsumexp: torch.Tensor,
                                    dropout_p: float = 0.0, is_causal: bool = False, *,
                                    attn_mask: torch.Tensor | None = None, scale: float | None = None
                                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``_scaled_dot_product_flash_attention_for_cpu_backward(..., is_causal=True)`` without the
    keys a query does not see.  Given the whole attention's output and log-sum-exp, each
    block of keys contributes to the gradients on its own (its probabilities are
    exp(scores - logsumexp)), so the causal square splits into its diagonal blocks of
    CAUSAL_QUERY_BLOCK (one causal call over all of them as a batch) and, for each halving,
    the lower-left squares below the diagonal (one unmasked call per size, its squares as a
    batch): 5/8 of the work at 4 blocks (86 -> 76 ms for B8 H8 T256 D64, 1 thread).  Each
    call's gradients add into the diagonal's."""
    length, block = query.shape[2], CAUSAL_QUERY_BLOCK
    tensors = (grad_out, query, key, value, out, logsumexp)
    count = length // block
    if not is_causal or attn_mask is not None or dropout_p or query.dim() != 4 or key.shape[2] != length or \
            length % block or count & (count - 1) or \
            any(_blocks(t, block, 0, block) is None for t in tensors):
        return CPU_FLASH_BACKWARD(*tensors, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)
    batch, heads = query.shape[:2]
    diagonal = [_blocks(t, block, 0, block) for t in tensors]
    grads = CPU_FLASH_BACKWARD(*diagonal, 0.0, True, scale=scale)
    whole = []
    for grad, like in zip(grads, (query, key, value)):
        stride = grad.stride()
        if stride[0] != block * stride[2]:      # not [B * count, block, H, D] memory: eager's call
            return CPU_FLASH_BACKWARD(*tensors, dropout_p, is_causal, attn_mask=attn_mask, scale=scale)
        whole.append(grad.as_strided(like.shape, (count * stride[0], *stride[1:]), grad.storage_offset()))
    size = block
    while size < length:
        # queries [size, 2 size) of each 2 size rows against keys [0, size) of them: full squares
        rows = [_blocks(t, size, size, 2 * size) for t in (grad_out, query)]
        cols = [_blocks(t, size, 0, 2 * size) for t in (key, value)]
        saved = [_blocks(t, size, size, 2 * size) for t in (out, logsumexp)]
        dq, dk, dv = CPU_FLASH_BACKWARD(*rows, *cols, *saved, 0.0, False, scale=scale)
        _blocks(whole[0], size, size, 2 * size).add_(dq)
        _blocks(whole[1], size, 0, 2 * size).add_(dk)
        _blocks(whole[2], size, 0, 2 * size).add_(dv)
        size *= 2
    return tuple(whole)


@functools.cache
def _additive_causal_mask(length: int, dtype: torch.dtype) -> torch.Tensor:
    """0 where a query sees a key, -inf elsewhere: eager's flash op adds a mask (a bool one is
    taken as 0/1 there; F.scaled_dot_product_attention converts it before the call)."""
    visible = torch.ones(length, length, dtype=torch.bool).tril()
    return torch.zeros(length, length, dtype=dtype).masked_fill(~visible, float("-inf"))


def _shape(arg: object, sched: Schedule) -> tuple | None:
    if isinstance(arg, ir.BufferView):
        return tuple(arg.shape)
    if isinstance(arg, ir.BufferRef):
        return tuple(sched.buffers[arg.name].shape)
    return None


def causal_attention_by_query_blocks(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                                     attn_mask: torch.Tensor | None = None, dropout_p: float = 0.0,
                                     is_causal: bool = False, scale: float | None = None,
                                     enable_gqa: bool = False) -> torch.Tensor:
    """``F.scaled_dot_product_attention(query, key, value, is_causal=True)`` for [B, H, L, D]
    tensors, computed CAUSAL_QUERY_BLOCK queries at a time against the keys up to the block's
    last query (the first block is itself causal, the others take their rows of the causal mask).
    The output has the flash kernel's (B, L, H, D) memory layout.  Anything else is eager's call."""
    length = query.shape[-2]
    if not is_causal or attn_mask is not None or dropout_p or enable_gqa or query.dim() != 4 or \
            key.shape[-2] != length or (torch.is_grad_enabled() and
                                        (query.requires_grad or key.requires_grad or value.requires_grad)):
        return F.scaled_dot_product_attention(query, key, value, attn_mask, dropout_p, is_causal, scale=scale,
                                              enable_gqa=enable_gqa)
    batch, heads = query.shape[:2]
    out = torch.empty((batch, length, heads, value.shape[-1]), dtype=query.dtype, device=query.device)
    out = out.transpose(1, 2)
    mask = _causal_mask(length, query.device)
    for start in range(0, length, CAUSAL_QUERY_BLOCK):
        end = min(start + CAUSAL_QUERY_BLOCK, length)
        q, k, v = query[:, :, start:end], key[:, :, :end], value[:, :, :end]
        if start == 0:
            block = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=scale)
        else:
            block = F.scaled_dot_product_attention(q, k, v, attn_mask=mask[start:end, :end], scale=scale)
        out[:, :, start:end] = block
    return out


@functools.cache
def _causal_mask(length: int, device: torch.device) -> torch.Tensor:
    return torch.ones(length, length, dtype=torch.bool, device=device).tril()
