"""VJPs of prim patterns that eager differentiates as one op, written in terms of its output.

softmax decomposes into ``exp(z) / sum(exp(z))``; differentiated prim by prim, its gradient
needs ``exp(z)`` and the sum, so the partitioner saves (or recomputes from) an fp32 tensor of the
input's size.  Eager's softmax backward needs only the output ``y``:

    softmax      y = exp(z) / sum(exp(z))       dz = y * (g - sum(g * y))
    log_softmax  o = z - log(sum(exp(z)))       dz = g - exp(o) * sum(g)

Where the output is rounded to bf16/fp16 right away (the usual case), the rounded output is what
the gradient reads, as eager's: saved at half the bytes, and the same numbers eager uses.  A
nanoGPT block's attention probabilities (B, H, T, T) are the largest tensor of its step.
"""
from __future__ import annotations

from typing import Any

from ember.graph import Node, TensorMeta
from ember.prims import ops
from ember.prims import primitives as P
from ember.prims.values import Value

_LOW_PRECISION = ("float16", "bfloat16")


def pattern_vjp(node: Node, grad: Any) -> tuple[Node, Value] | None:
    """(the pattern's input z, its gradient) when ``node`` ends a softmax or log_softmax whose
    intermediates nothing else reads; else None (the prims' own rules apply)."""
    if not isinstance(grad, Value) or not isinstance(node.meta, TensorMeta) or node.target not in _ENDS:
        return None
    return _ENDS[node.target](node, grad)


def _softmax(node: Node, grad: Value) -> tuple[Node, Value] | None:
    exps, total = node.args
    dims = _sum_of(total, exps)
    if dims is None or not _is(exps, "exp") or set(exps.users) != {node, _reduction(total)}:
        return None
    y = _output(node)
    return exps.args[0], ops.mul(y, ops.sub(grad, ops.sum(ops.mul(grad, y), dims, keepdim=True)))


def _log_softmax(node: Node, grad: Value) -> tuple[Node, Value] | None:
    z, log_total = node.args
    if not _is(log_total, "expand") or len(log_total.users) != 1:
        return None
    log = _through_rounding(log_total.args[0])
    if not _is(log, "log") or len(log.users) != 1:
        return None
    total = _through_rounding(log.args[0])
    exps = _reduction_input(total)
    if exps is None or not _is(exps, "exp") or exps.args[0] is not z or len(exps.users) != 1:
        return None
    dims = _sum_of(total, exps)
    if dims is None:
        return None
    o = _output(node)
    return z, ops.sub(grad, ops.mul(ops.exp(o), ops.sum(grad, dims, keepdim=True)))


def _through_rounding(value: Any) -> Any:
    """What ``value`` rounds, when it is a float value cast to bf16/fp16 and back, each cast read
    only there (CPU log_softmax over the last dim rounds its sum and log so); else value."""
    while _is(value, "convert_element_type") and len(value.users) == 1:
        inner = value.args[0]
        if not (_is(inner, "convert_element_type") and len(inner.users) == 1 and
                str(inner.args[1]).removeprefix("torch.") in _LOW_PRECISION and
                isinstance(inner.args[0], Node) and inner.args[0].meta.dtype == value.meta.dtype):
            break
        value = inner.args[0]
    return value


def _output(node: Node) -> Value:
    """The pattern's output as the gradient reads it: its bf16/fp16 rounding when that is its only
    reader (upcast), else the fp32 value itself."""
    users = list(node.users)
    if len(users) == 1 and users[0].target is P.convert_element_type and \
            str(users[0].args[1]).removeprefix("torch.") in _LOW_PRECISION:
        return ops.upcast(Value(users[0], users[0].meta))
    return Value(node, node.meta)


def _sum_of(value: Node, exps: Node) -> tuple[int, ...] | None:
    """The reduced dims when ``value`` is sum(exps) broadcast back (reshape/expand chain, each
    read only along it); else None."""
    reduction = _reduction(value)
    if reduction is None or reduction.args[0] is not exps:
        return None
    current = value
    while current is not reduction:
        if len(current.users) != 1:
            return None
        current = current.args[0]
    if len(reduction.users) != 1:
        return None
    dims = reduction.args[1]
    return tuple(dims) if isinstance(dims, (tuple, list)) else (dims,)


def _reduction(value: Node) -> Node | None:
    current = value
    while isinstance(current, Node) and current.target in (P.reshape, P.expand):
        current = current.args[0]
    return current if isinstance(current, Node) and current.target is P.sum_ else None


def _reduction_input(value: Node) -> Node | None:
    reduction = _reduction(value)
    return reduction.args[0] if reduction is not None else None


def _is(value: Any, name: str) -> bool:
    return isinstance(value, Node) and value.target is P.get(name)


_ENDS = {P.get("div"): _softmax, P.get("sub"): _log_softmax}
