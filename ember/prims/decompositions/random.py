"""Random ops on the Philox prim.  Each call of the compiled graph draws one fresh seed
from torch's default generator (an Extern at runtime), so masks differ per call and are
reproducible under torch.manual_seed; each random op in the graph uses its own range of
Philox counters (offset)."""
from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch

from ember.prims import ops
from ember.prims import primitives as P
from ember.prims.registry import register
from ember.prims.values import Value, current, emit_with_meta

F = torch.nn.functional


def draw_seed() -> int:
    """Runs in the wrapper, once per call: a seed from torch's default CPU generator."""
    return int(torch.randint(0, 2**62, (), dtype=torch.int64).item())


def draw_seed_on(device: torch.device) -> torch.Tensor:
    """The seed as a 0-dim tensor drawn by the device's own generator, for graphs replayed as a
    CUDA graph (mode="reduce-overhead"): a host number would be recorded once and replayed
    forever, while torch's CUDA generator gives a recorded draw fresh state on every replay."""
    return torch.randint(0, 2**62, (), dtype=torch.int64, device=device)


def seeds_on_device(graph: Any, device: torch.device) -> bool:
    """Make every host seed draw of a prim graph a draw on ``device``; True if there was one."""
    from ember.graph import TensorMeta
    found = False
    for node in graph.call_nodes():
        if node.target is draw_seed:
            node.target = draw_seed_on
            node.args = (device,)
            node.meta = TensorMeta((), (), torch.int64, device)
            found = True
    return found


def _uniform(shape: Sequence[Any], dtype: torch.dtype, device: Any) -> Value:
    emitter = current()
    if emitter.seed is None:
        emitter.seed = emit_with_meta(draw_seed, None, (), {}, pytype=int)
    offset = emitter.rng_offset
    numel = ops.prod_sizes(tuple(shape))
    emitter.rng_offset = offset + numel
    return ops.emit(P.philox_rand, tuple(shape), emitter.seed, offset, dtype, torch.device(device))


@register(F.dropout, torch.dropout, inplace_kw="inplace")
def dropout(x: Value, p: float = 0.5, training: bool = True, inplace: bool = False) -> Value:
    if not training or p == 0:
        return x
    if p == 1:
        return ops.full_like(x, 0)
    keep = ops.gt(_uniform(x.shape, torch.float32, x.device), p)
    return ops.cast(ops.where(keep, ops.upcast(x) * (1.0 / (1.0 - p)), 0.0), x.dtype)


@register(torch.rand)
def rand(*size: Any, dtype: torch.dtype | None = None, device: Any = None, generator: Any = None,
         layout: Any = None, pin_memory: bool = False, requires_grad: bool = False) -> Value:
    shape = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)) else size
    return ops.cast(_uniform(shape, torch.float32, device or "cpu"), dtype or torch.get_default_dtype())


@register(torch.rand_like)
def rand_like(x: Value, *, dtype: torch.dtype | None = None, device: Any = None, layout: Any = None,
              pin_memory: bool = False, requires_grad: bool = False, memory_format: Any = None) -> Value:
    return ops.cast(_uniform(x.shape, torch.float32, device or x.device), dtype or x.dtype)


def _normal(shape: Sequence[Any], device: Any) -> Value:
    # Box-Muller from two independent uniforms; 1 - u keeps the log finite
    u1 = _uniform(shape, torch.float32, device)
    u2 = _uniform(shape, torch.float32, device)
    radius = ops.sqrt(ops.log(1.0 - u1) * -2.0)
    return radius * ops.cos(u2 * (2.0 * math.pi))


@register(torch.randn)
def randn(*size: Any, dtype: torch.dtype | None = None, device: Any = None, generator: Any = None,
          layout: Any = None, pin_memory: bool = False, requires_grad: bool = False) -> Value:
    shape = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)) else size
    return ops.cast(_normal(shape, device or "cpu"), dtype or torch.get_default_dtype())


@register(torch.randn_like)
def randn_like(x: Value, *, dtype: torch.dtype | None = None, device: Any = None, layout: Any = None,
               pin_memory: bool = False, requires_grad: bool = False, memory_format: Any = None) -> Value:
    return ops.cast(_normal(x.shape, device or x.device), dtype or x.dtype)
