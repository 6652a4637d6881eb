"""scaled_dot_product_attention: an Extern, in training on the CPU the one eager's backward uses.

Eager's CPU attention runs a flash kernel that returns the log-sum-exp of each row beside the
output, and its backward reads both (no recomputation).  Ember calls that op directly when the
step will be differentiated, so the backward (autodiff/extern_rules.py) is eager's own kernel on
the saved output and log-sum-exp: 143 ms against ~210 ms for a nanoGPT block's attention forward
and backward written out in matmuls and softmax (2-core CPU, B8 H8 T256 D64).  Elsewhere (no grad,
CUDA, a mask, dropout) it stays F.scaled_dot_product_attention as the user called it.
"""
from __future__ import annotations

import inspect
from typing import Any

import torch
import torch.nn.functional as F

from ember.prims import ops
from ember.prims.registry import differentiated, register
from ember.prims.values import is_tensor

CPU_FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
_FLASH_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


# F.scaled_dot_product_attention's parameters (a C function: inspect cannot read them)
def sdpa_signature(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,  # noqa: E704
                   enable_gqa=False): ...


_SIGNATURE = inspect.signature(sdpa_signature)


@register(F.scaled_dot_product_attention)
def scaled_dot_product_attention(*args: Any, **kwargs: Any) -> Any:
    call = _SIGNATURE.bind(*args, **kwargs)
    call.apply_defaults()
    q, k, v = call.arguments["query"], call.arguments["key"], call.arguments["value"]
    if _cpu_flash_for_training(q, k, v, call.arguments):
        out, _ = ops.extern(CPU_FLASH, q, k, v, 0.0, bool(call.arguments["is_causal"]),
                            scale=call.arguments["scale"])
        return out
    return ops.extern(F.scaled_dot_product_attention, *args, **kwargs)


def _cpu_flash_for_training(q: Any, k: Any, v: Any, arguments: dict) -> bool:
    tensors = (q, k, v)
    return all(is_tensor(t) and t.ndim == 4 and t.device.type == "cpu" and t.dtype == q.dtype for t in tensors) and \
        q.dtype in _FLASH_DTYPES and differentiated() and \
        arguments["attn_mask"] is None and arguments["dropout_p"] == 0 and not arguments["enable_gqa"] and \
        q.shape[-1] == k.shape[-1] == v.shape[-1] and isinstance(arguments["is_causal"], bool)
