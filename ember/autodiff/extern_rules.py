"""VJP rules for Externs: the torch callables a prim graph calls eagerly (matmul, convolution,
pooling, attention, anything without a decomposition).

Each rule follows the contract of ``rules.py``: ``rule(grad, out, *args, **kwargs)`` returns one
entry per positional argument.  The backward is itself made of prims (fused by the scheduler)
and Externs (``ops.extern(torch.mm, ...)``, ``torch.ops.aten.convolution_backward``).

A callable without a rule is differentiated by ``autograd_vjp``: one Extern that re-runs the
callable under eager autograd inside the backward program.  ``rule_for(target)`` picks the rule
or that fallback.  Re-running is exact only for deterministic callables: ``rerun_is_exact`` says
which ones draw random numbers (the joint builder refuses to differentiate those).
"""
from __future__ import annotations

import functools
import inspect
import itertools
import math
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch

from ember.autodiff.rules import EXTERN_RULES, extern_vjp_rule, needs_input_grad
from ember.errors import CompileError
from ember.graph import TensorMeta, contiguous_strides, dense_strides_like, target_name, tree_leaves, tree_map
from ember.prims import ops
from ember.prims import primitives as P
from ember.prims.decompositions import attention
from ember.prims.values import Value, emit_with_meta, is_tensor
from ember.symbolic import hint_of

F = torch.nn.functional
T = torch.Tensor
aten = torch.ops.aten


# ------------------------------------------------------------------ binding arguments
class _Call:
    """The forward call's arguments bound to parameter names (kwargs and defaults included),
    and which of them are positional: only those receive gradients (the rule contract)."""

    def __init__(self, signature: inspect.Signature, args: tuple, kwargs: dict) -> None:
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        self.values = bound.arguments
        self.positional = list(signature.parameters)[:len(args)]

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

    def needs(self, name: str) -> bool:
        """Does argument `name` get a gradient: a positional floating tensor someone needs."""
        value = self.values.get(name)
        if name not in self.positional or not _differentiable(value):
            return False
        return needs_input_grad(self.positional.index(name))

    def result(self, **grads: Value | None) -> tuple:
        return tuple(grads.get(name) if self.needs(name) else None for name in self.positional)


def _differentiable(value: Any) -> bool:
    return is_tensor(value) and (value.dtype.is_floating_point or value.dtype.is_complex)


@functools.cache
def _signature(stub: Callable) -> inspect.Signature:
    """The parameters of a torch callable, read from a stub with the same signature (builtins
    such as F.conv2d have none that inspect can read)."""
    return inspect.signature(stub)


def _binary(input, other): ...  # noqa: E704  (mm, bmm, matmul; names as the builder's kwargs see them)


def _unique(*targets: Any) -> list[Any]:
    """Aliases (F.conv2d is torch.conv2d) are registered once."""
    seen: list[Any] = []
    for target in targets:
        if target is not None and all(target is not s for s in seen):
            seen.append(target)
    return seen


# ------------------------------------------------------------------------- helpers
def _t(x: Value) -> Value:
    return ops.transpose(x, -2, -1)


def _matmul(a: Value, b: Value) -> Value:
    if a.ndim == 2 and b.ndim == 2:
        return ops.extern(torch.mm, a, b)
    if a.ndim == 3 and b.ndim == 3 and a.shape[0] == b.shape[0]:
        return ops.extern(torch.bmm, a, b)
    return ops.extern(torch.matmul, a, b)


def _product_laid_out_like(product: Callable[[Value, Value], Value], left: Value, right: Value,
                           operand: Value) -> Value:
    """``left @ right``, the gradient of ``operand``, in ``operand``'s memory order: computed as
    ``(right^T @ left^T)^T`` when ``operand`` is a transposed view (its rows have unit stride),
    which costs the GEMM nothing.  Whoever reads the gradient the way the operand was laid out
    (the transpose's own gradient, the assembly of a q/k/v gradient) then reads it contiguously:
    nanoGPT's dk from ``q @ k.transpose(-2, -1)`` was read at a 1 KiB stride."""
    if _transposed_view(operand):
        return _t(product(_t(right), _t(left)))
    return product(left, right)


def _transposed_view(x: Value) -> bool:
    if not is_tensor(x) or x.ndim < 2:
        return False
    rows, columns = (hint_of(n) for n in x.shape[-2:])
    row_stride, column_stride = (hint_of(s) for s in x.meta.stride[-2:])
    return rows > 1 and columns > 1 and row_stride == 1 and column_stride != 1


def _sum_to(x: Value, shape: Sequence[Any]) -> Value:
    """Reduce a broadcast gradient back to an operand's shape."""
    shape = tuple(shape)
    if tuple(x.shape) == shape:
        return x
    lead = x.ndim - len(shape)
    dims = list(range(lead)) + [lead + i for i, size in enumerate(shape) if size == 1 and x.shape[lead + i] != 1]
    if dims:
        x = ops.sum(x, dims)
    return ops.reshape(x, shape)


def _scaled(x: Value, factor: Any) -> Value:
    return x if isinstance(factor, (int, float)) and factor == 1 else x * factor


def _as_dtype(x: Value | None, like: Value) -> Value | None:
    return None if x is None else ops.cast(x, like.dtype)


def _fallback(target: Any, grad: Any, out: Any, args: tuple, kwargs: dict) -> tuple:
    return autograd_vjp(target)(grad, out, *args, **kwargs)


# ------------------------------------------------------------------------ matmuls
def _product_vjp(product: Any) -> Callable[..., tuple]:
    """mm / bmm: d(a @ b) = grad @ b^T for a, a^T @ grad for b."""
    def rule(grad: Value, out: Value, *args: Any, **kwargs: Any) -> tuple:
        call = _Call(_signature(_binary), args, _binary_kwargs(kwargs))
        a, b = call["input"], call["other"]
        multiply = functools.partial(ops.extern, product)
        return call.result(input=_product_laid_out_like(multiply, grad, _t(b), a) if call.needs("input") else None,
                           other=_product_laid_out_like(multiply, _t(a), grad, b) if call.needs("other") else None)
    rule.__name__ = f"{product.__name__}_vjp"
    return rule


def _binary_kwargs(kwargs: dict) -> dict:
    """torch.mm's second operand is `mat2`, matmul's `other`."""
    return {("other" if k == "mat2" else k): v for k, v in kwargs.items()}


mm_vjp = extern_vjp_rule(*_unique(torch.mm, T.mm))(_product_vjp(torch.mm))
bmm_vjp = extern_vjp_rule(*_unique(torch.bmm, T.bmm))(_product_vjp(torch.bmm))


def _matmul_grads(grad: Value, a: Value, b: Value, need_a: bool, need_b: bool) -> tuple:
    """torch.matmul's gradients for every shape case: 1-D operands are promoted to matrices the
    way matmul reads them, batch dims broadcast (and their gradients are summed back)."""
    a2 = ops.unsqueeze(a, 0) if a.ndim == 1 else a
    b2 = ops.unsqueeze(b, -1) if b.ndim == 1 else b
    batch = ops.broadcast_shapes(tuple(a2.shape[:-2]), tuple(b2.shape[:-2]))
    g2 = ops.reshape(grad, tuple(batch) + (a2.shape[-2], b2.shape[-1]))
    grad_a = ops.reshape(_sum_to(_product_laid_out_like(_matmul, g2, _t(b2), a2), a2.shape), a.shape) \
        if need_a else None
    grad_b = ops.reshape(_sum_to(_product_laid_out_like(_matmul, _t(a2), g2, b2), b2.shape), b.shape) \
        if need_b else None
    return grad_a, grad_b


@extern_vjp_rule(*_unique(torch.matmul, T.matmul, T.__matmul__))
def matmul_vjp(grad: Value, out: Value, *args: Any, **kwargs: Any) -> tuple:
    call = _Call(_signature(_binary), args, kwargs)
    grad_a, grad_b = _matmul_grads(grad, call["input"], call["other"], call.needs("input"), call.needs("other"))
    return call.result(input=grad_a, other=grad_b)


def _linear(input, weight, bias=None): ...  # noqa: E704  (F.linear's signature)


@extern_vjp_rule(F.linear)
def linear_vjp(grad: Value, out: Value, *args: Any, **kwargs: Any) -> tuple:
    call = _Call(_signature(_linear), args, kwargs)
    x, weight, bias = call["input"], call["weight"], call["bias"]
    if weight.ndim != 2:
        return _fallback(F.linear, grad, out, args, kwargs)
    g2 = ops.reshape(grad, (-1, weight.shape[0]))       # out = x @ weight.T (+ bias), batch folded
    grad_x = ops.reshape(ops.extern(torch.mm, g2, weight), x.shape) if call.needs("input") else None
    grad_w = ops.extern(torch.mm, _t(g2), ops.reshape(x, (-1, weight.shape[1]))) if call.needs("weight") else None
    grad_b = _as_dtype(_sum_to(grad, bias.shape), bias) if call.needs("bias") else None
    return call.result(input=grad_x, weight=grad_w, bias=grad_b)


def _addmm(input, mat1, mat2, *, beta=1, alpha=1): ...  # noqa: E704


@extern_vjp_rule(*_unique(torch.addmm, T.addmm, torch.baddbmm, T.baddbmm))
def addmm_vjp(grad: Value, out: Value, *args: Any, **kwargs: Any) -> tuple:
    """addmm / baddbmm: beta * input + alpha * (mat1 @ mat2), input broadcast to the product."""
    call = _Call(_signature(_addmm), args, kwargs)
    m1, m2, alpha, beta = call["mat1"], call["mat2"], call["alpha"], call["beta"]
    product = torch.mm if m1.ndim == 2 else torch.bmm
    return call.result(
        input=_sum_to(_scaled(grad, beta), call["input"].shape) if call.needs("input") else None,
        mat1=_scaled(ops.extern(product, grad, _t(m2)), alpha) if call.needs("mat1") else None,
        mat2=_scaled(ops.extern(product, _t(m1), grad), alpha) if call.needs("mat2") else None)


@extern_vjp_rule(*_unique(torch.addbmm, T.addbmm))
def addbmm_vjp(grad: Value, out: Value, *args: Any, **kwargs: Any) -> tuple:
    """addbmm: beta * input + alpha * sum_b(batch1[b] @ batch2[b]); each batch sees the same grad."""
    call = _Call(_signature(_addmm), args, kwargs)
    b1, b2, alpha, beta = call["mat1"], call["mat2"], call["alpha"], call["beta"]
    grads = ops.expand_to(grad, (b1.shape[0],) + tuple(grad.shape))
    return call.result(
        input=_sum_to(_scaled(grad, beta), call["input"].shape) if call.needs("input") else None,
        mat1=_scaled(ops.extern(torch.bmm, grads, _t(b2)), alpha) if call.needs("mat1") else None,
        mat2=_scaled(ops.extern(torch.bmm, _t(b1), grads), alpha) if call.needs("mat2") else None)


# -------------------------------------------------------------------- convolutions
def _conv(input, weight, bias=None, stride=1, padding=0, dilation=1, groups=1): ...  # noqa: E704


def _conv_transpose(input, weight, bias=None, stride=1, padding=0, output_padding=0, groups=1,  # noqa: E704
                    dilation=1): ...


def _ints(value: Any, n: int) -> list[Any]:
    return list(value) if isinstance(value, (tuple, list)) else [value] * n


def _string_padding(padding: str, weight: Value, dilation: list[Any], n: int) -> list[int] | None:
    """padding="valid"/"same" as numbers; None where "same" pads one side more (eager pads the input
    first then): the generic fallback handles that case."""
    if padding == "valid":
        return [0] * n
    totals = [d * (k - 1) for d, k in zip(dilation, weight.shape[2:])]
    if any(t % 2 for t in totals):
        return None
    return [t // 2 for t in totals]


def _conv_vjp(spatial: int, transposed: bool, target: Any) -> Callable[..., tuple]:
    signature = _signature(_conv_transpose if transposed else _conv)

    def rule(grad: Value, out: Value, *args: Any, **kwargs: Any) -> tuple:
        call = _Call(signature, args, kwargs)
        x, weight, bias = call["input"], call["weight"], call["bias"]
        stride, dilation = _ints(call["stride"], spatial), _ints(call["dilation"], spatial)
        padding = call["padding"]
        padding = _string_padding(padding, weight, dilation, spatial) if isinstance(padding, str) \
            else _ints(padding, spatial)
        if padding is None:
            return _fallback(target, grad, out, args, kwargs)
        output_padding = _ints(call["output_padding"], spatial) if transposed else [0] * spatial
        unbatched = x.ndim == spatial + 1
        if unbatched:
            x, grad = ops.unsqueeze(x, 0), ops.unsqueeze(grad, 0)
        mask = [call.needs("input"), call.needs("weight"), False]
        grad_x = grad_w = None
        if mask[0] or mask[1]:
            grad_x, grad_w, _ = ops.extern(aten.convolution_backward, grad, x, weight, None, stride, padding,
                                           dilation, transposed, output_padding, call["groups"], mask)
        if grad_x is not None and unbatched:
            grad_x = ops.reshape(grad_x, call["input"].shape)
        # the bias gradient is a plain reduction: a fused prim rather than part of the Extern
        grad_b = _as_dtype(ops.sum(grad, [0] + list(range(2, grad.ndim))), bias) if call.needs("bias") else None
        return call.result(input=grad_x if mask[0] else None, weight=grad_w if mask[1] else None, bias=grad_b)
    rule.__name__ = f"conv{'_transpose' if transposed else ''}{spatial}d_vjp"
    return rule


for _n, (_conv_fn, _transpose_fn) in enumerate([(F.conv1d, F.conv_transpose1d), (F.conv2d, F.conv_transpose2d),
                                               (F.conv3d, F.conv_transpose3d)], start=1):
    extern_vjp_rule(*_unique(_conv_fn, getattr(torch, f"conv{_n}d")))(_conv_vjp(_n, False, _conv_fn))
    extern_vjp_rule(*_unique(_transpose_fn, getattr(torch, f"conv_transpose{_n}d")))(
        _conv_vjp(_n, True, _transpose_fn))


# ------------------------------------------------------------------------- pooling
def _max_pool(input, kernel_size, stride=None, padding=0, dilation=1, ceil_mode=False,  # noqa: E704
              return_indices=False): ...


def _pool_stride(stride: Any, kernel: list[Any], n: int) -> list[Any]:
    return kernel if stride is None or (isinstance(stride, (tuple, list)) and not stride) else _ints(stride, n)


def _max_pool2d_vjp(target: Any, always_indices: bool) -> Callable[..., tuple]:
    def rule(grad: Any, out: Any, *args: Any, **kwargs: Any) -> tuple:
        call = _Call(_signature(_max_pool), args, kwargs)
        if not call.needs("input"):
            return call.result()
        x = call["input"]
        kernel = _ints(call["kernel_size"], 2)
        stride, padding = _pool_stride(call["stride"], kernel, 2), _ints(call["padding"], 2)
        dilation, ceil_mode = _ints(call["dilation"], 2), call["ceil_mode"]
        if always_indices or call["return_indices"]:
            grad, indices = grad[0], out[1]          # the forward's own indices
        else:                                         # recompute them (the forward kept none)
            indices = ops.extern(aten.max_pool2d_with_indices, x, kernel, stride, padding, dilation, ceil_mode)[1]
        if grad is None:
            return call.result()
        grad_x = ops.extern(aten.max_pool2d_with_indices_backward, grad, x, kernel, stride, padding, dilation,
                            ceil_mode, ops.cast(_narrowest_index(indices, x), torch.int64))
        return call.result(input=grad_x)
    return rule


def _narrowest_index(indices: Value, x: Value) -> Value:
    """The pooling's indices (flat positions in one input plane, int64 as ATen returns them) in the
    narrowest integer type that holds the plane's positions: the partitioner saves that cast
    rather than the int64 tensor (ResNet-50's max-pool indices: 103 MB saved -> 26 MB)."""
    plane = x.shape[-2] * x.shape[-1]
    if isinstance(plane, int) and plane <= torch.iinfo(torch.int16).max:
        return ops.cast(indices, torch.int16)
    return ops.cast(indices, torch.int32) if hint_of(plane) <= torch.iinfo(torch.int32).max else indices


extern_vjp_rule(*_unique(F.max_pool2d, torch.max_pool2d))(_max_pool2d_vjp(F.max_pool2d, False))
extern_vjp_rule(F.max_pool2d_with_indices)(_max_pool2d_vjp(F.max_pool2d_with_indices, True))


def _avg_pool(input, kernel_size, stride=None, padding=0, ceil_mode=False, count_include_pad=True,  # noqa: E704
              divisor_override=None): ...


def _avg_pool_vjp(n: int, backward: Any) -> Callable[..., tuple]:
    def rule(grad: Value, out: Value, *args: Any, **kwargs: Any) -> tuple:
        call = _Call(_signature(_avg_pool), args, kwargs)
        if not call.needs("input"):
            return call.result()
        kernel = _ints(call["kernel_size"], n)
        grad_x = ops.extern(backward, grad, call["input"], kernel, _pool_stride(call["stride"], kernel, n),
                            _ints(call["padding"], n), call["ceil_mode"], call["count_include_pad"],
                            call["divisor_override"])
        return call.result(input=grad_x)
    return rule


extern_vjp_rule(*_unique(F.avg_pool2d, torch._C._nn.avg_pool2d))(_avg_pool_vjp(2, aten.avg_pool2d_backward))
extern_vjp_rule(*_unique(F.avg_pool3d, torch._C._nn.avg_pool3d))(_avg_pool_vjp(3, aten.avg_pool3d_backward))


def _adaptive_pool(input, output_size): ...  # noqa: E704


def _adaptive_avg_pool_vjp(backward: Any) -> Callable[..., tuple]:
    def rule(grad: Value, out: Value, *args: Any, **kwargs: Any) -> tuple:
        call = _Call(_signature(_adaptive_pool), args, kwargs)
        grad_x = ops.extern(backward, grad, call["input"]) if call.needs("input") else None
        return call.result(input=grad_x)
    return rule


extern_vjp_rule(*_unique(F.adaptive_avg_pool2d, torch._C._nn.adaptive_avg_pool2d))(
    _adaptive_avg_pool_vjp(aten._adaptive_avg_pool2d_backward))
extern_vjp_rule(*_unique(F.adaptive_avg_pool3d, torch._C._nn.adaptive_avg_pool3d))(
    _adaptive_avg_pool_vjp(aten._adaptive_avg_pool3d_backward))


# ----------------------------------------------------------------------- embedding
def _f_embedding(input, weight, padding_idx=None, max_norm=None, norm_type=2.0,  # noqa: E704
                 scale_grad_by_freq=False, sparse=False): ...


def _torch_embedding(weight, input, padding_idx=-1, scale_grad_by_freq=False, sparse=False): ...  # noqa: E704


def _embedding_weight_grad(grad: Value, indices: Value, weight: Value, padding_idx: int | None) -> Value:
    """Rows of grad summed into the rows they were read from; the padding row gets none.
    ATen's embedding_dense_backward, as eager: an index_put with accumulate of bf16 rows took
    0.86 ms on BERT's 30522-word table, the sort-and-segment kernel 0.05 ms."""
    rows = ops.cast(indices, torch.int64)
    flat = ops.reshape(grad, (*indices.shape, weight.shape[1]))
    return ops.extern(torch.ops.aten.embedding_dense_backward.default, flat, rows, weight.shape[0],
                      -1 if padding_idx is None else padding_idx, False)


@extern_vjp_rule(F.embedding)
def embedding_vjp(grad: Value, out: Value, *args: Any, **kwargs: Any) -> tuple:
    call = _Call(_signature(_f_embedding), args, kwargs)
    weight, padding_idx = call["weight"], call["padding_idx"]
    if call["max_norm"] is not None or call["scale_grad_by_freq"] or call["sparse"] or weight.ndim != 2:
        return _fallback(F.embedding, grad, out, args, kwargs)
    if padding_idx is not None and padding_idx < 0:
        padding_idx += weight.shape[0]
    grad_w = _embedding_weight_grad(grad, call["input"], weight, padding_idx) if call.needs("weight") else None
    return call.result(weight=grad_w)


@extern_vjp_rule(torch.embedding)
def torch_embedding_vjp(grad: Value, out: Value, *args: Any, **kwargs: Any) -> tuple:
    """torch.embedding(weight, indices, padding_idx=-1, ...): -1 means no padding row here."""
    call = _Call(_signature(_torch_embedding), args, kwargs)
    weight, padding_idx = call["weight"], call["padding_idx"]
    if call["scale_grad_by_freq"] or call["sparse"] or weight.ndim != 2:
        return _fallback(torch.embedding, grad, out, args, kwargs)
    padding_idx = None if padding_idx is None or padding_idx < 0 else padding_idx
    grad_w = _embedding_weight_grad(grad, call["input"], weight, padding_idx) if call.needs("weight") else None
    return call.result(weight=grad_w)


# ------------------------------------------------------------------ views and moves
def _narrow(input, dim, start, length): ...  # noqa: E704


@extern_vjp_rule(*_unique(torch.narrow, T.narrow))
def narrow_vjp(grad: Value, out: Value, *args: Any, **kwargs: Any) -> tuple:
    """narrow with a runtime start: grad written into zeros at rows start .. start + length."""
    call = _Call(_signature(_narrow), args, kwargs)
    if not call.needs("input"):
        return call.result()
    x, length = call["input"], call["length"]
    dim = ops.normalize_dim(call["dim"], x.ndim)
    rows = ops.add(ops.iota(length, 0, 1, torch.int64, x.device), call["start"])
    rows = ops.where(ops.lt(rows, 0), ops.add(rows, x.shape[dim]), rows)   # a negative start counts from the end
    grad_x = ops.emit(P.index_put, ops.full_like(x, 0), [None] * dim + [rows], grad, False)
    return call.result(input=grad_x)


@extern_vjp_rule(T.to)
def to_vjp(grad: Value, out: Value, x: Value, *args: Any, **kwargs: Any) -> tuple:
    """A device (and dtype) transfer: the gradient goes back to x's device and dtype."""
    rest = (None,) * len(args)
    if not _differentiable(x) or not needs_input_grad(0):
        return (None, *rest)
    back = grad
    if back.device != x.device:
        back = emit_with_meta(T.to, _contiguous_meta(back.shape, back.dtype, x.device), (back, x.device), {})
    return (ops.cast(back, x.dtype), *rest)


@extern_vjp_rule(T.view)
def view_vjp(grad: Value, out: Value, x: Value, *shape: Any) -> tuple:
    """x.view(dtype) is a bitcast: eager gives it no gradient; x.view(shape) is a reshape."""
    if len(shape) == 1 and isinstance(shape[0], torch.dtype):
        return (None, None)
    grad_x = ops.reshape(grad, x.shape) if _differentiable(x) and needs_input_grad(0) else None
    return (grad_x,) + (None,) * len(shape)


# ----------------------------------------------------------------------- attention
# devices where the backward re-runs eager's fused attention and differentiates it (below)
ATEN_ATTENTION_BACKWARD_DEVICES = {"cuda"}


@extern_vjp_rule(F.scaled_dot_product_attention)
def sdpa_vjp(grad: Value, out: Value, *args: Any, **kwargs: Any) -> tuple:
    """Recompute P = softmax(Q K^T * scale + mask) in fp32 prims (plus two matmul Externs) and
    differentiate: dV = P^T dO, dS = P * (dO V^T - rowsum(dO V^T * P)), dQ = dS K * scale,
    dK = dS^T Q * scale."""
    call = _Call(_signature(attention.sdpa_signature), args, kwargs)
    if call["dropout_p"] != 0:
        raise CompileError("scaled_dot_product_attention with dropout cannot be re-run exactly for its "
                           "backward", stage="autodiff", op="scaled_dot_product_attention")
    if attention.all_true(call["attn_mask"]):
        # a mask built from constants that is True everywhere (HF's bidirectional mask without
        # padding): the forward's lowering drops it too, and the fused kernels run without one
        args, kwargs = _without_mask(args, kwargs)
        call = _Call(_signature(attention.sdpa_signature), args, kwargs)
    if call["enable_gqa"] or call["query"].device.type in ATEN_ATTENTION_BACKWARD_DEVICES:
        # CUDA: eager's fused attention kernels, forward re-run then backward (one forward more,
        # against fp32 matmuls and an (L, S) probability matrix per head here: HF GPT-2 and Llama,
        # whose causal masks are explicit, spent 5 ms of a 38 ms step in fp32 matmuls).  The
        # re-run hands the fused kernels their arguments with a unit last stride (AutogradBackward)
        return _fallback(F.scaled_dot_product_attention, grad, out, args, kwargs)
    q0, k0, v0, mask = call["query"], call["key"], call["value"], call["attn_mask"]
    q, k, v, g = ops.upcast(q0), ops.upcast(k0), ops.upcast(v0), ops.upcast(grad)
    scale = call["scale"] if call["scale"] is not None else 1.0 / math.sqrt(q.shape[-1])
    probs = attention.attention_probabilities(q, k, mask, call["is_causal"], scale)
    dp = _matmul(g, _t(v))
    ds = probs * (dp - ops.sum(dp * probs, -1, keepdim=True))
    grads = {
        "query": _scaled(_matmul(ds, k), scale) if call.needs("query") else None,
        "key": _scaled(_matmul(_t(ds), q), scale) if call.needs("key") else None,
        "value": _matmul(_t(probs), g) if call.needs("value") else None,
        "attn_mask": ds if call.needs("attn_mask") else None,
    }
    originals = {"query": q0, "key": k0, "value": v0, "attn_mask": mask}
    return call.result(**{name: None if grads[name] is None else
                          ops.cast(_sum_to(grads[name], originals[name].shape), originals[name].dtype)
                          for name in grads})


def _cpu_flash(query, key, value, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None): ...  # noqa: E704


@extern_vjp_rule(attention.CPU_FLASH)
def cpu_flash_attention_vjp(grad: Any, out: Any, *args: Any, **kwargs: Any) -> tuple:
    """Eager's CPU flash attention backward, from the forward's output and log-sum-exp (saved),
    as eager runs it (prims/decompositions/attention.py emits the forward op in training)."""
    call = _Call(_signature(_cpu_flash), args, kwargs)
    grad_out = grad[0] if isinstance(grad, (tuple, list)) else grad
    if grad_out is None or not any(call.needs(name) for name in ("query", "key", "value")):
        return call.result()
    output, logsumexp = out
    q, k, v = call["query"], call["key"], call["value"]
    dq, dk, dv = ops.extern(torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default,
                            ops.cast(grad_out, q.dtype), q, k, v, output, logsumexp, call["dropout_p"],
                            call["is_causal"], attn_mask=call["attn_mask"], scale=call["scale"])
    return call.result(query=dq, key=dk, value=dv)


# eager's CUDA attention backward ops (module names: tests stand in CPU kernels)
_FLASH_BACKWARD_OP = torch.ops.aten._scaled_dot_product_flash_attention_backward.default
_CUDNN_BACKWARD_OP = torch.ops.aten._scaled_dot_product_cudnn_attention_backward.default
_EFFICIENT_BACKWARD_OP = torch.ops.aten._scaled_dot_product_efficient_attention_backward.default


def _cuda_flash(query, key, value, dropout_p=0.0, is_causal=False, return_debug_mask=False, *,  # noqa: E704
                scale=None): ...


def _cuda_cudnn(query, key, value, attn_bias, compute_log_sumexp, dropout_p=0.0, is_causal=False,  # noqa: E704
                return_debug_mask=False, *, scale=None): ...


def _cuda_efficient(query, key, value, attn_bias, compute_log_sumexp, dropout_p=0.0, is_causal=False, *,  # noqa: E704
                    scale=None): ...


def _fused_attention_call(stub: Callable, grad: Any, out: Any, args: tuple, kwargs: dict) -> tuple:
    """(call, output gradient in the output's layout) of a fused attention forward op, or
    (call, None) when no gradient reaches q, k or v."""
    call = _Call(_signature(stub), args, kwargs)
    grad_out = grad[0] if isinstance(grad, (tuple, list)) else grad
    if grad_out is None or not any(call.needs(name) for name in ("query", "key", "value")):
        return call, None
    return call, ops.cast(grad_out, call["query"].dtype)


@extern_vjp_rule(attention.CUDA_FLASH)
def cuda_flash_attention_vjp(grad: Any, out: Any, *args: Any, **kwargs: Any) -> tuple:
    """Eager's flash backward on the forward's saved output, log-sum-exp and Philox state (the
    same dropout mask)."""
    call, grad_out = _fused_attention_call(_cuda_flash, grad, out, args, kwargs)
    if grad_out is None:
        return call.result()
    output, logsumexp, _, _, _, _, rng_state, rng_unused, _ = out
    q, k, v = call["query"], call["key"], call["value"]
    dq, dk, dv = ops.extern(_FLASH_BACKWARD_OP, grad_out, q, k, v, output, logsumexp, None, None, q.shape[2],
                            k.shape[2], call["dropout_p"], call["is_causal"], rng_state, rng_unused,
                            scale=call["scale"])
    return call.result(query=dq, key=dk, value=dv)


@extern_vjp_rule(attention.CUDA_CUDNN)
def cuda_cudnn_attention_vjp(grad: Any, out: Any, *args: Any, **kwargs: Any) -> tuple:
    """Eager's cuDNN backward on the forward's saved output, log-sum-exp and Philox seed/offset;
    the bias (a bool mask's, never differentiated) as the forward had it."""
    call, grad_out = _fused_attention_call(_cuda_cudnn, grad, out, args, kwargs)
    if grad_out is None:
        return call.result()
    output, logsumexp, _, _, _, _, seed, offset, _ = out
    q, k, v = call["query"], call["key"], call["value"]
    dq, dk, dv = ops.extern(_CUDNN_BACKWARD_OP, grad_out, q, k, v, output, logsumexp, seed, offset,
                            call["attn_bias"], None, None, q.shape[2], k.shape[2], call["dropout_p"],
                            call["is_causal"], scale=call["scale"])
    return call.result(query=dq, key=dk, value=dv)


@extern_vjp_rule(attention.CUDA_EFFICIENT)
def cuda_efficient_attention_vjp(grad: Any, out: Any, *args: Any, **kwargs: Any) -> tuple:
    """Eager's memory-efficient backward on the forward's saved output, log-sum-exp and Philox
    seed/offset."""
    call, grad_out = _fused_attention_call(_cuda_efficient, grad, out, args, kwargs)
    if grad_out is None:
        return call.result()
    output, logsumexp, seed, offset = out
    q, k, v = call["query"], call["key"], call["value"]
    dq, dk, dv, _ = ops.extern(_EFFICIENT_BACKWARD_OP, grad_out, q, k, v, call["attn_bias"], output, logsumexp,
                               seed, offset, call["dropout_p"], [True, True, True, False], call["is_causal"],
                               scale=call["scale"])
    return call.result(query=dq, key=dk, value=dv)


def _without_mask(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    if "attn_mask" in kwargs:
        return args, {**kwargs, "attn_mask": None}
    return tuple(args[:3]) + (None,) + tuple(args[4:]), kwargs


# ------------------------------------------------------------- the generic fallback
class _Slot:
    """Where the n-th Value argument goes back into the forward call's argument structure."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index

    def __repr__(self) -> str:
        return f"slot{self.index}"


_FUSED_ATTENTION = (F.scaled_dot_product_attention, torch.ops.aten.scaled_dot_product_attention.default)


class AutogradBackward:
    """Runtime helper run by the wrapper: the vector-Jacobian product of `target` by eager autograd.

    Called as ``helper(*grad_outputs, *values)``: the gradients given for some outputs of
    `target` (positions `grad_items` in its flattened outputs), then the forward's Value
    arguments (tensors and runtime scalars) in the order of their slots in `template`.
    Returns, for each slot in `wanted`, a fresh contiguous gradient of that argument."""

    def __init__(self, target: Any, template: tuple, grad_items: tuple[int, ...], wanted: tuple[int, ...]) -> None:
        self.target = target
        self.template = template            # (args, kwargs) with _Slot for each Value
        self.grad_items = grad_items
        self.wanted = wanted
        self.__name__ = f"autograd_vjp_{target_name(target)}"
        # SDPA's arguments by name (slots and constants), bound once rather than per call
        self.attention = _bind_attention(template) if target in _FUSED_ATTENTION else None

    def __call__(self, *values: Any) -> tuple[torch.Tensor, ...]:
        grads, inputs = values[:len(self.grad_items)], list(values[len(self.grad_items):])
        unit_last_stride = self.target in _FUSED_ATTENTION
        if any(isinstance(v, torch.Tensor) and v.device.type == "meta" for v in inputs):
            return tuple(torch.empty_strided(inputs[i].shape, grad_strides(self.target, inputs[i].shape, inputs[i].stride()),
                                             dtype=inputs[i].dtype, device="meta") for i in self.wanted)
        if self.attention is not None:
            direct = _fused_attention_backward(self.attention, inputs, grads, self.grad_items, self.wanted)
            if direct is not None:
                given = {v.untyped_storage().data_ptr() for v in values if isinstance(v, torch.Tensor)}
                return tuple(_fresh(g, inputs[i], given, self.target) for g, i in zip(direct, self.wanted))
        for i, value in enumerate(inputs):
            if isinstance(value, torch.Tensor):
                if unit_last_stride and value.dim() and value.stride(-1) != 1:
                    # SDPA's fused kernels reject any other (a mask expanded from (.., L, 1)) and
                    # take the math path: fp32 matmuls and the (L, S) probabilities
                    value = value.contiguous()
                # detached: the re-run records its own graph and never touches the forward's
                inputs[i] = value.detach().requires_grad_(i in self.wanted)
        with torch.enable_grad():
            args, kwargs = tree_map(lambda v: inputs[v.index] if isinstance(v, _Slot) else v, self.template)
            outputs = tree_leaves(self.target(*args, **kwargs))
        pairs = [(outputs[item], g) for item, g in zip(self.grad_items, grads)
                 if isinstance(outputs[item], torch.Tensor) and outputs[item].requires_grad]
        wanted = [inputs[i] for i in self.wanted]
        found = torch.autograd.grad([o for o, _ in pairs], wanted, [g for _, g in pairs], allow_unused=True) \
            if pairs else [None] * len(wanted)
        given = {v.untyped_storage().data_ptr() for v in values if isinstance(v, torch.Tensor)}
        return tuple(_fresh(g, x, given, self.target) for g, x in zip(found, wanted))


FUSED_BACKWARD_DEVICES = {"cuda"}
_BACKENDS = torch.nn.attention.SDPBackend
# eager's dispatcher choice and the CUDA fused ops (module names: tests stand in CPU kernels)
_SDP_CHOICE = torch.ops.aten._fused_sdp_choice
_FLASH_FORWARD = torch.ops.aten._scaled_dot_product_flash_attention
_FLASH_BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_backward
_CUDNN_FORWARD = torch.ops.aten._scaled_dot_product_cudnn_attention
_CUDNN_BACKWARD = torch.ops.aten._scaled_dot_product_cudnn_attention_backward


_EFFICIENT_FORWARD = torch.ops.aten._scaled_dot_product_efficient_attention
_EFFICIENT_BACKWARD = torch.ops.aten._scaled_dot_product_efficient_attention_backward


def _flash_grads(grad: Any, q: Any, k: Any, v: Any, bias: Any, is_causal: bool, scale: Any) -> tuple:
    out, logsumexp, cum_q, cum_k, max_q, max_k, rng_state, unused, _ = \
        _FLASH_FORWARD(q, k, v, 0.0, is_causal, False, scale=scale)
    return _FLASH_BACKWARD(_like(grad, out), q, k, v, out, logsumexp, cum_q, cum_k, max_q, max_k, 0.0, is_causal,
                           rng_state, unused, scale=scale)


def _cudnn_grads(grad: Any, q: Any, k: Any, v: Any, bias: Any, is_causal: bool, scale: Any) -> tuple:
    out, logsumexp, cum_q, cum_k, max_q, max_k, seed, offset, _ = \
        _CUDNN_FORWARD(q, k, v, bias, True, 0.0, is_causal, False, scale=scale)
    return _CUDNN_BACKWARD(_like(grad, out), q, k, v, out, logsumexp, seed, offset, bias, cum_q, cum_k, max_q, max_k,
                           0.0, is_causal, scale=scale)


def _efficient_grads(grad: Any, q: Any, k: Any, v: Any, bias: Any, is_causal: bool, scale: Any) -> tuple:
    out, logsumexp, seed, offset = _EFFICIENT_FORWARD(q, k, v, bias, True, 0.0, is_causal, scale=scale)
    dq, dk, dv, _ = _EFFICIENT_BACKWARD(_like(grad, out), q, k, v, bias, out, logsumexp, seed, offset, 0.0,
                                        [True, True, True, False], is_causal, scale=scale)
    return dq, dk, dv


# flash takes no mask: it is only called for unmasked attention
_FUSED_GRADS = {_BACKENDS.FLASH_ATTENTION.value: _flash_grads, _BACKENDS.CUDNN_ATTENTION.value: _cudnn_grads,
                _BACKENDS.EFFICIENT_ATTENTION.value: _efficient_grads}


class _BiasCache:
    """The bias of the mask seen last: the layers of one backward share one mask tensor (GPT-2's
    causal mask, computed once), so it is converted once per step, not once per layer.  The
    mask is held by a weak reference and its version counter is compared, so neither a freed
    mask whose memory comes back nor an in-place change can hand out a stale bias.  The entry is
    one tuple, replaced whole: threads never see one mask's key with another's bias."""

    def __init__(self) -> None:
        self.entry: tuple | None = None      # (weakref to the mask, key, bias)

    def get(self, mask: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        key = (mask._version, q.dtype, q.shape[:3], k.shape[2])
        entry = self.entry
        if entry is not None and entry[0]() is mask and entry[1] == key:
            return entry[2]
        bias = _attention_bias(mask, q, k)
        self.entry = (weakref.ref(mask, self._forget), key, bias)
        return bias

    def _forget(self, ref: weakref.ref) -> None:
        entry = self.entry
        if entry is not None and entry[0] is ref:      # not a newer mask's entry
            self.entry = None


def _attention_bias(mask: torch.Tensor, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    return attention.attention_bias(mask, q.dtype, q.shape[0], q.shape[1], q.shape[2], k.shape[2])


_BIASES = _BiasCache()


def _like(grad: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """The output gradient in the output's layout (what eager's autograd hands these kernels)."""
    if grad.stride() == out.stride():
        return grad
    return torch.empty_strided(out.shape, out.stride(), dtype=grad.dtype, device=grad.device).copy_(grad)


_ATTENTION_SIGNATURE = inspect.signature(attention.sdpa_signature)


def _bind_attention(template: tuple) -> dict | None:
    """SDPA's arguments by name, defaults filled in (Values as their slots); None if they do not bind."""
    try:
        call = _ATTENTION_SIGNATURE.bind(*template[0], **template[1])
    except TypeError:
        return None
    call.apply_defaults()
    return dict(call.arguments)


def _fused_attention_backward(arguments: dict | None, inputs: list[Any], grads: tuple, grad_items: tuple[int, ...],
                              wanted: tuple[int, ...]) -> list[torch.Tensor] | None:
    """dq, dk, dv (for the ``wanted`` slots) from eager's fused attention kernels called directly:
    the forward op that also returns the log-sum-exp, then its backward op.  Re-running
    F.scaled_dot_product_attention under autograd and calling torch.autograd.grad cost 0.85 ms
    of host time per layer (BERT-base: 10 ms of a 25 ms training step on an H100 host).  Only
    where eager's dispatcher itself picks flash, cuDNN or memory-efficient attention for these
    tensors, with no dropout and equal head dims that are a multiple of 8 (so its front end would
    pass them unchanged); a mask (GPT-2's and Llama's causal bool masks) goes to cuDNN or
    memory-efficient attention as the bias eager's front end makes of it.  None otherwise (the
    caller re-runs under autograd).  ``arguments``: SDPA's, bound by ``_bind_attention``."""
    if arguments is None:
        return None
    where = [arguments[name] for name in ("query", "key", "value")]     # their slots
    if not all(isinstance(slot, _Slot) for slot in where) or any(isinstance(a, _Slot) for a in (
            arguments["dropout_p"], arguments["is_causal"], arguments["scale"])):
        return None
    q, k, v = (inputs[slot.index] for slot in where)
    is_causal, scale, mask = arguments["is_causal"], arguments["scale"], arguments["attn_mask"]
    if isinstance(mask, _Slot):
        mask = inputs[mask.index]
    if not all(isinstance(t, torch.Tensor) and t.dim() == 4 and t.stride(-1) == 1 for t in (q, k, v)) or \
            q.device.type not in FUSED_BACKWARD_DEVICES or not (mask is None or _usable_mask(mask, q)) or \
            arguments["dropout_p"] != 0 or arguments["enable_gqa"] or not isinstance(is_causal, bool) or \
            q.shape[-1] != v.shape[-1] or q.shape[-1] % 8 or len(grads) != 1 or tuple(grad_items) != (0,) or \
            not isinstance(grads[0], torch.Tensor) or any(i not in {slot.index for slot in where} for i in wanted):
        return None
    # eager chose its kernel for tensors that require grad (some backends are excluded then)
    choice = _SDP_CHOICE(*(t.detach().requires_grad_() for t in (q, k, v)), mask, 0.0, is_causal, scale=scale)
    fused_grads = _FUSED_GRADS.get(choice)
    if fused_grads is None or (mask is not None and fused_grads is _flash_grads):
        return None
    bias = None if mask is None else _BIASES.get(mask, q, k)
    dq, dk, dv = fused_grads(grads[0], q, k, v, bias, is_causal, scale)
    # per slot, as autograd gives them (one slot passed as both q and k: dq + dk)
    by_slot: dict[int, torch.Tensor] = {}
    for slot, grad_of in zip(where, (dq, dk, dv)):
        by_slot[slot.index] = by_slot[slot.index] + grad_of if slot.index in by_slot else grad_of
    return [by_slot[i] for i in wanted]


def _usable_mask(mask: Any, q: torch.Tensor) -> bool:
    """A mask the direct path passes on: bool, or a bias of q's dtype, broadcastable to 4 dims."""
    return isinstance(mask, torch.Tensor) and mask.dim() <= 4 and (mask.dtype in (torch.bool, q.dtype))


def _fresh(grad: torch.Tensor | None, like: torch.Tensor, given: set[int], target: Any) -> torch.Tensor:
    """A gradient in the layout ``grad_strides`` declares, in memory of its own (autograd may
    hand back grad_outputs itself)."""
    strides = grad_strides(target, like.shape, like.stride())
    if grad is None or grad._is_zerotensor():     # autograd's storage-less zeros (sgn of a real input)
        return torch.empty_strided(like.shape, strides, dtype=like.dtype, device=like.device).zero_()
    if grad.stride() != strides and grad.numel() > 1:
        return torch.empty_strided(like.shape, strides, dtype=grad.dtype, device=grad.device).copy_(grad)
    return grad.clone() if grad.untyped_storage().data_ptr() in given else grad


def grad_strides(target: Any, shape: Sequence[Any], stride: Sequence[Any]) -> tuple:
    """The layout of the gradients an AutogradBackward returns: contiguous, except for attention,
    whose fused kernels give dq, dk, dv dense in the dim order of q, k, v (B, L, H, D when they
    are head views of one projection): making those contiguous was a copy per tensor per layer."""
    if target not in _FUSED_ATTENTION:
        return contiguous_strides(shape)
    return dense_strides_like(shape, [hint_of(n) for n in shape], [hint_of(s) for s in stride])


def _contiguous_meta(shape: Sequence[Any], dtype: torch.dtype, device: torch.device) -> TensorMeta:
    return TensorMeta(tuple(shape), contiguous_strides(shape), dtype, device)


def autograd_vjp(target: Any) -> Callable[..., tuple]:
    """The rule for a callable without one: a single Extern that re-runs `target` under eager
    autograd in the backward program (exact for deterministic targets; see rerun_is_exact)."""
    def rule(grad: Any, out: Any, *args: Any, **kwargs: Any) -> tuple:
        values: list[Value] = []

        def to_slot(v: Any) -> Any:
            if isinstance(v, Value):
                values.append(v)
                return _Slot(len(values) - 1)
            return v
        template = tree_map(to_slot, (tuple(args), dict(kwargs)))
        wanted = _wanted_slots(template[0], values)
        grad_leaves = tree_leaves(grad) if isinstance(grad, (tuple, list)) else [grad]
        grad_items = tuple(i for i, g in enumerate(grad_leaves) if isinstance(g, Value))
        if not wanted or not grad_items:
            return _per_position(args, {})
        helper = AutogradBackward(target, template, grad_items, tuple(wanted))
        metas = tuple(TensorMeta(tuple(values[i].shape), grad_strides(target, values[i].shape, values[i].meta.stride),
                                 values[i].dtype, values[i].device) for i in wanted)
        grads = emit_with_meta(helper, metas, tuple(grad_leaves[i] for i in grad_items) + tuple(values), {})
        return _per_position(args, dict(zip(wanted, grads)))
    rule.__name__ = f"autograd_vjp_{target_name(target)}"
    return rule


def _wanted_slots(args_template: tuple, values: list[Value]) -> list[int]:
    """Slots of positional floating tensor arguments (in lists too) that need a gradient."""
    wanted = []
    for position, arg in enumerate(args_template):
        if not needs_input_grad(position):
            continue
        wanted += [s.index for s in tree_leaves(arg) if isinstance(s, _Slot) and _differentiable(values[s.index])]
    return wanted


def _per_position(args: tuple, grads: dict[int, Value]) -> tuple:
    """The rule's result: per positional argument its gradient, a list for a list/tuple argument
    holding tensors, None for constants.  `grads` is keyed by slot (Value leaves in order)."""
    slots = itertools.count()
    result: list[Any] = []
    for arg in args:
        if isinstance(arg, Value):
            result.append(grads.get(next(slots)))
        elif isinstance(arg, (tuple, list)) and any(isinstance(v, Value) for v in arg):
            result.append([grads.get(next(slots)) if isinstance(v, Value) else _skip(v, slots) for v in arg])
        else:
            _skip(arg, slots)
            result.append(None)
    return tuple(result)


def _skip(value: Any, slots: Any) -> None:
    """Advance the slot counter past the Values nested in `value` (they get no gradient here)."""
    for leaf in tree_leaves(value):
        if isinstance(leaf, Value):
            next(slots)
    return None


def rule_for(target: Any) -> Callable[..., tuple]:
    """The VJP rule of an Extern callable: its own, or the eager-autograd fallback."""
    rule = EXTERN_RULES.get(target)
    return rule if rule is not None else autograd_vjp(target)


# Callables that draw random numbers: a re-run in the backward would draw different ones.
_RANDOM = {F.dropout, F.dropout1d, F.dropout2d, F.dropout3d, F.alpha_dropout, F.feature_alpha_dropout,
           torch.dropout, torch.alpha_dropout, torch.feature_dropout, torch.feature_alpha_dropout,
           torch.bernoulli, T.bernoulli, torch.rand_like, torch.randn_like, torch.randint_like, torch.rand,
           torch.randn, torch.randint, torch.randperm, torch.normal, torch.poisson, torch.multinomial,
           T.multinomial, F.rrelu, torch.rrelu, F.gumbel_softmax, T.uniform_, T.normal_, T.bernoulli_,
           T.exponential_, T.random_, T.geometric_, T.cauchy_, T.log_normal_, torch.nn.init.uniform_,
           torch.nn.init.normal_}


def rerun_is_exact(target: Any, args: tuple = (), kwargs: dict | None = None) -> bool:
    """Does re-running `target` (autograd_vjp, or a rule that recomputes the forward) give the
    forward's values?  False for callables that draw random numbers; with the call's arguments,
    also False for attention with dropout."""
    inner = getattr(target, "inplace_op", target)      # convert's functional wrapper of x.foo_()
    if any(inner is r for r in _RANDOM):
        return False
    if target is F.scaled_dot_product_attention:
        dropout = (kwargs or {}).get("dropout_p", args[4] if len(args) > 4 else 0.0)
        return dropout == 0
    return True
