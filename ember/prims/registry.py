"""The decomposition table: torch callable -> function that emits prims for it.

    @register(torch.add, torch.Tensor.add, operator.add, torch.Tensor.__add__)
    def add(x, other, *, alpha=1): ...

A decomposition receives `Value`s (for tensors) and Python constants exactly as the
torch call received them, and returns Values (or Python values).  Flags:
  view=True        the result aliases args[0] in eager (functionalization tracks it);
  inplace=True     the target mutates args[0]; the function returns its new value;
  inplace_kw="inplace"  the target mutates args[0] when that argument is true.
In-place spellings (`Tensor.add_`, `operator.iadd`, `Tensor.__iadd__`, `torch.relu_`) are
derived from the out-of-place entries by `derive_inplace_variants`.
"""
from __future__ import annotations

import dataclasses
import inspect
import operator
from collections.abc import Callable
from typing import Any

import torch


@dataclasses.dataclass
class Decomposition:
    fn: Callable[..., Any]
    view: bool = False
    inplace: bool = False
    inplace_kw: str | None = None

    def mutates_self(self, args: tuple, kwargs: dict) -> bool:
        if self.inplace:
            return True
        if self.inplace_kw is None:
            return False
        try:
            bound = inspect.signature(self.fn).bind(*args, **kwargs)
        except TypeError:
            return False
        return bool(bound.arguments.get(self.inplace_kw, False))


DECOMPOSITIONS: dict[Any, Decomposition] = {}

# Whether the torch call being decomposed will be differentiated (grad mode on at the graph's
# entry and in the region, an input that requires grad): set by prims/convert.py around each
# decomposition.  The prim Values' own metas do not say so (computed values never require grad).
_differentiated = [False]


def differentiated() -> bool:
    """Does the backward read this call's inputs (decompositions that save what it needs)?"""
    return _differentiated[0]


class decomposing_differentiated:
    """``with decomposing_differentiated(flag):`` around one decomposition call."""

    def __init__(self, flag: bool) -> None:
        self.flag = flag

    def __enter__(self) -> None:
        self.previous, _differentiated[0] = _differentiated[0], self.flag

    def __exit__(self, *exc: Any) -> None:
        _differentiated[0] = self.previous


def register(*targets: Any, view: bool = False, inplace: bool = False,
             inplace_kw: str | None = None) -> Callable[[Callable], Callable]:
    def decorator(fn: Callable) -> Callable:
        for target in targets:
            if target is None:  # an alias this torch version lacks
                continue
            DECOMPOSITIONS[target] = Decomposition(fn, view, inplace, inplace_kw)
        return fn
    return decorator


def lookup(target: Any) -> Decomposition | None:
    try:
        return DECOMPOSITIONS.get(target)
    except TypeError:  # unhashable target
        return None


_OPERATOR_INPLACE = {
    "iadd": "add", "isub": "sub", "imul": "mul", "itruediv": "truediv", "ifloordiv": "floordiv",
    "imod": "mod", "ipow": "pow", "iand": "and_", "ior": "or_", "ixor": "xor", "ilshift": "lshift",
    "irshift": "rshift", "imatmul": "matmul",
}


def derive_inplace_variants() -> None:
    """Tensor.foo_ / torch.foo_ / operator.ifoo / Tensor.__ifoo__ from their out-of-place entry."""
    for name in dir(torch.Tensor):
        if name.endswith("_") and not name.endswith("__"):
            inplace_target = getattr(torch.Tensor, name)
            functional = getattr(torch.Tensor, name[:-1], None)
            _derive(inplace_target, functional)
        if name.startswith("__i") and name.endswith("__"):
            functional = getattr(torch.Tensor, "__" + name[3:], None)
            _derive(getattr(torch.Tensor, name), functional)
    for name in dir(torch):
        if name.endswith("_") and not name.startswith("_"):
            _derive(getattr(torch, name), getattr(torch, name[:-1], None))
    for inplace_name, functional_name in _OPERATOR_INPLACE.items():
        _derive(getattr(operator, inplace_name), getattr(operator, functional_name))


def _derive(inplace_target: Any, functional: Any) -> None:
    base = lookup(functional) if functional is not None else None
    if base is None or lookup(inplace_target) is not None or base.view:
        return
    DECOMPOSITIONS[inplace_target] = Decomposition(base.fn, inplace=True)
