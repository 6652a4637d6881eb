"""scaled_dot_product_attention: an Extern; in training, the kernels eager's backward uses.

Eager's fused attention kernels return the log-sum-exp of each row beside the output (and, with
dropout, the Philox state of the mask), and their backward ops read both: no recomputation.
When the step will be differentiated, ember calls those forward ops directly and the backward
(autodiff/extern_rules.py) is eager's own backward op on the saved output and log-sum-exp:
- CPU: the flash kernel.  143 ms against ~210 ms for a nanoGPT block's attention forward and
  backward written out in matmuls and softmax (2-core CPU, B8 H8 T256 D64).
- CUDA: the kernel eager's dispatcher picks for these tensors (flash, cuDNN or memory-efficient),
  unmasked or with a bool mask (made once per graph into the additive bias eager's front end
  makes of it).  Before, the backward ran the forward kernel again for its log-sum-exp, and
  GPT-2's attention backward took 0.47 ms of host time per layer (H100 host).
Attention with dropout that no fused kernel takes is written out in prims (softmax, Philox
dropout, two matmul Externs), so that the backward sees the forward's dropout mask.  Elsewhere
(no grad; a float mask without dropout; symbolic sizes) it stays F.scaled_dot_product_attention
as the user called it.
"""
from __future__ import annotations

import inspect
import math
from typing import Any

import torch
import torch.nn.functional as F

from ember.prims import ops
from ember.prims.registry import differentiated, register
from ember.prims.values import Value, constant_tensor, current, is_tensor
from ember.symbolic import is_symbolic

CPU_FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
CUDA_FLASH = torch.ops.aten._scaled_dot_product_flash_attention.default
CUDA_CUDNN = torch.ops.aten._scaled_dot_product_cudnn_attention.default
CUDA_EFFICIENT = torch.ops.aten._scaled_dot_product_efficient_attention.default
_FLASH_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# devices whose training graphs call the fused forward op eager's dispatcher picks (tests add "cpu")
FUSED_TRAINING_DEVICES = {"cuda"}
_BIAS_ALIGNMENT = 16


# F.scaled_dot_product_attention's parameters (a C function: inspect cannot read them)
def sdpa_signature(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,  # noqa: E704
                   enable_gqa=False): ...


_SIGNATURE = inspect.signature(sdpa_signature)


@register(F.scaled_dot_product_attention)
def scaled_dot_product_attention(*args: Any, **kwargs: Any) -> Any:
    call = _SIGNATURE.bind(*args, **kwargs)
    call.apply_defaults()
    arguments = call.arguments
    q, k, v = arguments["query"], arguments["key"], arguments["value"]
    mask, dropout_p, is_causal, scale = (arguments[name] for name in ("attn_mask", "dropout_p", "is_causal", "scale"))
    if _cpu_flash_for_training(q, k, v, arguments):
        out, _ = ops.extern(CPU_FLASH, q, k, v, 0.0, bool(is_causal), scale=scale)
        return out
    if not differentiated():
        return ops.extern(F.scaled_dot_product_attention, *args, **kwargs)
    if all_true(mask):
        # built from constants and True everywhere (HF's bidirectional mask without padding): no
        # mask, so that eager's kernels for unmasked attention run (lowering drops it elsewhere)
        arguments = {**arguments, "attn_mask": None}
        mask = None
    backend = _fused_training_backend(q, k, v, arguments)
    if backend is not None:
        return _fused_attention(backend, q, k, v, mask, float(dropout_p), is_causal, scale)
    if isinstance(dropout_p, (int, float)) and dropout_p != 0 and not arguments["enable_gqa"] and \
            isinstance(is_causal, bool) and all(is_tensor(t) for t in (q, k, v)):
        return _attention_with_dropout(q, k, v, mask, float(dropout_p), is_causal, scale)
    return ops.extern(F.scaled_dot_product_attention, *args, **kwargs)


def _cpu_flash_for_training(q: Any, k: Any, v: Any, arguments: dict) -> bool:
    tensors = (q, k, v)
    return all(is_tensor(t) and t.ndim == 4 and t.device.type == "cpu" and t.dtype == q.dtype for t in tensors) and \
        q.dtype in _FLASH_DTYPES and differentiated() and \
        arguments["attn_mask"] is None and arguments["dropout_p"] == 0 and not arguments["enable_gqa"] and \
        q.shape[-1] == k.shape[-1] == v.shape[-1] and isinstance(arguments["is_causal"], bool)


def all_true(mask: Any) -> bool:
    """A bool mask computed from constants only whose every element is True."""
    if not is_tensor(mask) or mask.dtype != torch.bool:
        return False
    value = constant_tensor(mask)
    return value is not None and bool(value.all())


# ------------------------------------------------------------------ fused kernels (CUDA)
def _fused_training_backend(q: Any, k: Any, v: Any, arguments: dict) -> str | None:
    """"flash", "cudnn" or "efficient": the fused kernel eager would run for this differentiated
    call, where ember calls it directly; None where it does not (the caller's other paths).
    Static sizes only (the choice depends on them), head dims a multiple of 8 with unit stride
    (what eager's front end hands over unchanged), no mask or a bool mask (a float mask may need
    its own gradient, which cuDNN does not give)."""
    mask, dropout_p, is_causal = arguments["attn_mask"], arguments["dropout_p"], arguments["is_causal"]
    tensors = (q, k, v)
    if not all(is_tensor(t) and t.ndim == 4 and t.device.type in FUSED_TRAINING_DEVICES and t.dtype == q.dtype
               for t in tensors) or arguments["enable_gqa"] or not isinstance(is_causal, bool) or \
            not isinstance(dropout_p, (int, float)) or is_symbolic(arguments["scale"]) or \
            isinstance(arguments["scale"], Value):
        return None
    if any(is_symbolic(s) for t in tensors for s in (*t.shape, *t.meta.stride)):
        return None
    if q.shape[-1] != k.shape[-1] or q.shape[-1] != v.shape[-1] or q.shape[-1] % 8 or \
            any(t.meta.stride[-1] != 1 for t in tensors):
        return None
    if mask is not None and not (is_tensor(mask) and mask.dtype == torch.bool and mask.ndim <= 4 and
                                 not any(is_symbolic(s) for s in mask.shape)):
        return None
    return eager_fused_choice(q, k, v, mask, float(dropout_p), is_causal, arguments["scale"])


_CHOICES = {int(torch.nn.attention.SDPBackend.FLASH_ATTENTION): "flash",
            int(torch.nn.attention.SDPBackend.CUDNN_ATTENTION): "cudnn",
            int(torch.nn.attention.SDPBackend.EFFICIENT_ATTENTION): "efficient"}


def eager_fused_choice(q: Any, k: Any, v: Any, mask: Any, dropout_p: float, is_causal: bool, scale: Any) -> str | None:
    """Ask eager's dispatcher, on empty tensors of these sizes, strides and dtypes on the device
    (it reads nothing else), which kernel it runs for inputs that require grad."""
    def stand_in(value: Any, requires_grad: bool) -> torch.Tensor:
        meta = value.meta
        return torch.empty_strided(meta.shape, meta.stride, dtype=meta.dtype, device=meta.device) \
            .requires_grad_(requires_grad)
    try:
        choice = torch.ops.aten._fused_sdp_choice(
            stand_in(q, True), stand_in(k, True), stand_in(v, True),
            None if mask is None else stand_in(mask, False), dropout_p, is_causal, scale=scale)
    except RuntimeError:
        return None
    backend = _CHOICES.get(int(choice))
    return None if backend == "flash" and mask is not None else backend


def _fused_attention(backend: str, q: Any, k: Any, v: Any, mask: Any, dropout_p: float, is_causal: bool,
                     scale: Any) -> Any:
    if backend == "flash":
        return ops.extern(CUDA_FLASH, q, k, v, dropout_p, is_causal, False, scale=scale)[0]
    bias = None if mask is None else _attention_bias_once(mask, q, k)
    if backend == "cudnn":
        return ops.extern(CUDA_CUDNN, q, k, v, bias, True, dropout_p, is_causal, False, scale=scale)[0]
    return ops.extern(CUDA_EFFICIENT, q, k, v, bias, True, dropout_p, is_causal, scale=scale)[0]


def _attention_bias_once(mask: Any, q: Any, k: Any) -> Any:
    """One bias per mask and shape in a graph: the layers of a model share their mask."""
    key = ("attention_bias", mask.node, q.dtype, tuple(q.shape[:3]), k.shape[2])
    memo = current().memo
    if key not in memo:
        memo[key] = ops.extern(attention_bias, mask, q.dtype, *q.shape[:3], k.shape[2])
    return memo[key]


def attention_bias(mask: torch.Tensor, dtype: torch.dtype, batch: int, heads: int, length: int,
                   source: int) -> torch.Tensor:
    """A mask as eager's SDPA front end hands it to the fused kernels: a bool mask becomes an
    additive bias (0 where kept, -inf where masked), the key dim padded to an aligned row
    stride (the padding sliced off again), expanded to (B, H, L, S)."""
    if mask.dtype == torch.bool:
        mask = torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill_(mask.logical_not(), -math.inf)
    width = mask.shape[-1]
    if width % _BIAS_ALIGNMENT or mask.stride(-1) != 1:
        padded = torch.zeros((*mask.shape[:-1], -(-width // _BIAS_ALIGNMENT) * _BIAS_ALIGNMENT),
                             dtype=mask.dtype, device=mask.device)
        padded[..., :width] = mask
        mask = padded[..., :width]
    return mask.expand(batch, heads, length, source)


# --------------------------------------------------------------- dropout, written out
def _attention_with_dropout(q: Any, k: Any, v: Any, mask: Any, dropout_p: float, is_causal: bool,
                            scale: Any) -> Any:
    """softmax(Q K^T * scale + mask), dropped out by the Philox prim, times V (in fp32, as eager's
    math kernel does for reduced precision): differentiated like any prims, with the same mask
    in the backward."""
    from ember.prims.decompositions.random import dropout
    qf, kf, vf = ops.upcast(q), ops.upcast(k), ops.upcast(v)
    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    probs = dropout(attention_probabilities(qf, kf, mask, is_causal, scale), dropout_p)
    return ops.cast(_matmul(probs, vf), q.dtype)


def attention_probabilities(q: Any, k: Any, mask: Any, is_causal: bool, scale: Any) -> Any:
    """softmax(Q K^T * scale + mask) in q's dtype; a fully masked row has probabilities 0 (as
    eager's safe softmax), not NaN."""
    scores = _matmul(q, ops.transpose(k, -2, -1))
    if not (isinstance(scale, (int, float)) and scale == 1):
        scores = scores * scale
    if is_causal:
        length, source = q.shape[-2], k.shape[-2]
        rows = ops.reshape(ops.iota(length, 0, 1, torch.int64, q.device), (length, 1))
        cols = ops.reshape(ops.iota(source, 0, 1, torch.int64, q.device), (1, source))
        scores = ops.where(ops.le(cols, rows), scores, -math.inf)
    if is_tensor(mask):
        scores = ops.where(mask, scores, -math.inf) if mask.dtype == torch.bool else scores + ops.upcast(mask)
    largest = ops.amax(scores, -1, keepdim=True)
    largest = ops.where(ops.isinf(largest), 0.0, largest)
    exps = ops.exp(scores - largest)
    total = ops.sum(exps, -1, keepdim=True)
    return ops.where(ops.eq(total, 0), 0.0, exps / total)


def _matmul(a: Any, b: Any) -> Any:
    if a.ndim == 3 and b.ndim == 3 and a.shape[0] == b.shape[0]:
        return ops.extern(torch.bmm, a, b)
    return ops.extern(torch.matmul, a, b)
