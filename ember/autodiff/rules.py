"""The vector-Jacobian rules: for each primitive (and each Extern callable), how the gradient
of its output becomes gradients of its inputs.

    @vjp_rule("mul")
    def mul_vjp(grad, out, a, b):
        return grad * b, grad * a

A rule is called while the joint graph is being built (inside ``ember.prims.values.building``),
so it emits prims with the ``ember.prims.ops`` helpers, exactly as decompositions do:

    rule(grad, out, *args, **kwargs) -> tuple with one entry per positional argument

* ``args``/``kwargs`` are the forward node's arguments: ``Value``s for tensors (their ``meta``
  is the forward meta), Python constants otherwise (a list argument, e.g. ``cat``'s tensors,
  stays a list of Values).
* ``out`` is the forward output (a ``Value``; a tuple of Values for multi-output prims such as
  ``var_mean``), so rules can reuse it (``exp``: ``grad * out``).
* ``grad`` is the gradient of ``out``: a ``Value`` of out's shape and dtype; for multi-output
  prims a tuple with ``None`` where that output gets no gradient.
* The result has one entry per positional argument: ``None`` for arguments that get no
  gradient (constants, integer/bool tensors, indices), a Value of exactly that argument's shape
  and dtype otherwise, or a list (same length, entries Value/None) for a list argument.
  Keyword tensor arguments never receive gradients (no prim takes one).
* Rules are written in primitives so the backward is fused like the forward; an Extern's rule
  may emit Externs (``ops.extern(torch.ops.aten.convolution_backward, ...)``).

Rules for prims live in ``prim_rules.py``, rules for Externs in ``extern_rules.py``; a callable
without a rule is differentiated by ``extern_rules.autograd_vjp`` (eager autograd inside the
backward program).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

PRIM_RULES: dict[str, Callable[..., tuple]] = {}
EXTERN_RULES: dict[Any, Callable[..., tuple]] = {}


def vjp_rule(*prim_names: str) -> Callable[[Callable[..., tuple]], Callable[..., tuple]]:
    """Register a rule for prims by name (``"add"``, ``"reshape"``)."""
    def register(fn: Callable[..., tuple]) -> Callable[..., tuple]:
        for name in prim_names:
            assert name not in PRIM_RULES, f"VJP rule for {name} registered twice"
            PRIM_RULES[name] = fn
        return fn
    return register


def extern_vjp_rule(*callables: Any) -> Callable[[Callable[..., tuple]], Callable[..., tuple]]:
    """Register a rule for Extern callables (``torch.mm``, ``F.linear``)."""
    def register(fn: Callable[..., tuple]) -> Callable[..., tuple]:
        for target in callables:
            assert target not in EXTERN_RULES, f"VJP rule for {target} registered twice"
            EXTERN_RULES[target] = fn
        return fn
    return register


# Which positional arguments of the node being differentiated need a gradient (set by the joint
# graph builder around each rule call): rules whose gradients cost an Extern each (convolution,
# matmul) skip the ones nobody needs.
_NEEDS: list[tuple[bool, ...]] = []


def needs_input_grad(position: int) -> bool:
    """Does positional argument ``position`` of the node being differentiated need a gradient?"""
    return not _NEEDS or position >= len(_NEEDS[-1]) or _NEEDS[-1][position]
