"""Symbolic values on the interpreter's stack.

Everything the captured code touches is one of these.  Python values that are
known exactly (ints, strings, functions, modules, classes...) are carried as
the real object; tensors are a graph Node plus its TensorMeta; containers hold
Values so that a list may mix tensors and ints.  ``source`` says where a value
read from outside the frame came from (for guards and for replaying mutation).
"""
from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch

from ..errors import Unsupported
from ..graph import Node, TensorMeta
from .sources import Source


class Value:
    source: Source | None = None

    def python_type(self) -> type:
        raise Unsupported(f"type() of {type(self).__name__}")

    def as_python(self) -> Any:
        """The exact Python value; raises Unsupported when it is symbolic."""
        raise Unsupported(f"{self.describe()} is not a Python constant here")

    def is_python_constant(self) -> bool:
        try:
            self.as_python()
            return True
        except Unsupported:
            return False

    def describe(self) -> str:
        return type(self).__name__


class NullValue(Value):
    """The NULL that CALL conventions push below a callable."""


NULL = NullValue()


class ConstantValue(Value):
    """An immutable Python value known exactly (int, float, str, None, dtype, Size...)."""

    def __init__(self, value: Any, source: Source | None = None) -> None:
        self.value = value
        self.source = source

    def python_type(self) -> type:
        return type(self.value)

    def as_python(self) -> Any:
        return self.value

    def describe(self) -> str:
        return repr(self.value)


class SizeValue(ConstantValue):
    """A tensor size, or arithmetic on sizes, under dynamic shapes (``x.shape[0] * 2``).

    Passed to a torch op it is a graph value (``node()``: ``sym_size`` and ``operator`` nodes that
    the prims conversion evaluates on symbolic sizes); used as a Python int (``.value``: a loop
    count, a print) it pins the sizes it came from, through ``pin`` (guards once compiled)."""

    def __init__(self, hint: int, pin: Callable[[], None], make_node: Callable[[], Node]) -> None:
        self._hint = hint
        self._pin: Callable[[], None] | None = pin
        self._make_node = make_node
        self._node: Node | None = None
        self.source = None

    @property
    def value(self) -> int:   # type: ignore[override]
        if self._pin is not None:
            self._pin()
            self._pin = None
        return self._hint

    @property
    def hint(self) -> int:
        """The size seen at capture, for meta computations only (never a decision of the program)."""
        return self._hint

    def pin(self) -> None:
        self.value  # noqa: B018 - pins

    def node(self) -> Node:
        if self._node is None:
            self._node = self._make_node()
        return self._node

    def python_type(self) -> type:
        return int

    def describe(self) -> str:
        return f"a tensor size ({self._hint} here)"


class SliceValue(ConstantValue):
    """A slice with a tensor size among its bounds (``w[: x.shape[-1]]``) under dynamic shapes:
    given to a torch op, its bounds stay graph values; used as a Python slice it pins them."""

    def __init__(self, parts: list[Value]) -> None:
        self.parts = parts
        self.source = None

    @property
    def value(self) -> slice:   # type: ignore[override]
        return slice(*[p.as_python() for p in self.parts])

    def graph_arg(self, convert: Callable[[Value], Any]) -> slice:
        return slice(*[convert(p) for p in self.parts])

    def hint(self) -> slice:
        return slice(*[p.hint if isinstance(p, SizeValue) else p.as_python() for p in self.parts])

    def python_type(self) -> type:
        return slice

    def describe(self) -> str:
        return repr(self.hint())


class TensorValue(Value):
    def __init__(self, node: Node, meta: TensorMeta, source: Source | None = None,
                 python_cls: type = torch.Tensor) -> None:
        self.node = node
        self.meta = meta
        self.source = source
        self.python_cls = python_cls

    def python_type(self) -> type:
        return self.python_cls

    def describe(self) -> str:
        return f"Tensor {self.node.name}: {self.meta}"


class TupleValue(Value):
    """A tuple, a namedtuple (``cls``) or a torch structseq (``cls`` + ``fields``)."""

    def __init__(self, items: list[Value], source: Source | None = None, cls: type = tuple,
                 fields: tuple[str, ...] = ()) -> None:
        self.items = list(items)
        self.source = source
        self.cls = cls
        self.fields = fields or tuple(getattr(cls, "_fields", ()))

    def python_type(self) -> type:
        return self.cls

    def as_python(self) -> Any:
        values = [v.as_python() for v in self.items]
        if self.cls is tuple:
            return tuple(values)
        if hasattr(self.cls, "_make"):
            return self.cls._make(values)
        return self.cls(values)


class ListValue(Value):
    def __init__(self, items: list[Value], source: Source | None = None) -> None:
        self.items = list(items)
        self.source = source
        self.mutated = False

    def python_type(self) -> type:
        return list

    def as_python(self) -> Any:
        return [v.as_python() for v in self.items]


class DictValue(Value):
    """A dict whose keys are Python constants (str, int, ...)."""

    def __init__(self, items: dict[Any, Value], source: Source | None = None, cls: type = dict) -> None:
        self.items = dict(items)
        self.source = source
        self.cls = cls
        self.mutated = False

    def python_type(self) -> type:
        return self.cls

    def as_python(self) -> Any:
        return self.cls((k, v.as_python()) for k, v in self.items.items())


class SetValue(Value):
    """A set of Python constants, plus tensors compared by identity (``objects``: a memo of
    parameters seen, as ``Module.named_parameters`` keeps one)."""

    def __init__(self, items: list[Any], source: Source | None = None) -> None:
        self.items = set(items)
        self.source = source
        self.objects: list[Value] = []

    def python_type(self) -> type:
        return set

    def as_python(self) -> Any:
        if self.objects:
            raise Unsupported("a set holding tensors is not a Python constant")
        return set(self.items)


class ObjectValue(Value):
    """A Python object known by identity: function, class, Python module, builtin, user object."""

    def __init__(self, obj: Any, source: Source | None = None) -> None:
        self.obj = obj
        self.source = source

    def python_type(self) -> type:
        return type(self.obj)

    def as_python(self) -> Any:
        if isinstance(self.obj, (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType,
                                 torch.dtype, torch.device)) or callable(self.obj):
            return self.obj
        return super().as_python()

    def describe(self) -> str:
        return f"{type(self.obj).__name__} {getattr(self.obj, '__qualname__', '')}".strip()


class ModuleValue(ObjectValue):
    """An nn.Module instance (guarded by id and .training)."""


class FreshModuleValue(ModuleValue):
    """A parameterless torch.nn module the frame creates (``loss_fct = nn.CrossEntropyLoss()``, as
    Hugging Face models do): made at capture from constant arguments, so its attributes are those
    constants (no source, no guards); where it escapes the frame the epilogue makes a new one from
    the same arguments, as each eager call does (capture/modules.py ``create_module``)."""

    def __init__(self, obj: Any, args: list, kwargs: dict) -> None:
        super().__init__(obj, None)
        self.args, self.kwargs = args, kwargs


class UserObjectValue(ObjectValue):
    """An instance of a user class passed in: guarded by type; attributes guarded as read."""


class CellValue(Value):
    """A closure cell created inside the trace."""

    def __init__(self, contents: Value | None = None) -> None:
        self.contents = contents


class RealCell:
    """A real closure cell (of a function outside the trace, or handed to a continuation): its
    contents are read through a guarded source; ``cell_source`` names the cell object itself when it
    is an argument of the frame (a continuation's ``__cell_x``), else the cell is bound by identity."""

    def __init__(self, cell: Any, name: str, cell_source: Source | None = None) -> None:
        self.cell = cell
        self.name = name
        self.cell_source = cell_source


class FunctionValue(Value):
    """A function created inside the trace by MAKE_FUNCTION (a closure or lambda)."""

    def __init__(self, code: types.CodeType, globals_dict: dict, name: str, defaults: tuple = (),
                 kwdefaults: dict | None = None, closure: tuple = ()) -> None:
        self.code = code
        self.globals = globals_dict
        self.name = name
        self.defaults = defaults            # tuple of Values
        self.kwdefaults = kwdefaults or {}  # name -> Value
        self.closure = closure              # tuple of CellValue

    def python_type(self) -> type:
        return types.FunctionType

    def describe(self) -> str:
        return f"function {self.name}"


class BoundMethodValue(Value):
    def __init__(self, func: Value, self_value: Value) -> None:
        self.func = func
        self.self_value = self_value

    def python_type(self) -> type:
        return types.MethodType


class SuperValue(Value):
    def __init__(self, cls: type, self_value: Value) -> None:
        self.cls = cls
        self.self_value = self_value


class IteratorValue(Value):
    """An iterator over a finite, already materialized list of Values."""

    def __init__(self, items: list[Value]) -> None:
        self.items = list(items)
        self.position = 0

    def next_item(self) -> Value | None:
        if self.position >= len(self.items):
            return None
        item = self.items[self.position]
        self.position += 1
        return item


class LazyIteratorValue(IteratorValue):
    """An iterator whose items are computed only when asked for, as eager computes them: a
    generator, or zip/enumerate/map/filter over one.  ``produce`` returns the next Value, or
    None once exhausted.  It has no materialized ``items``: reading them raises Unsupported."""

    def __init__(self, produce: Any) -> None:
        self.produce = produce
        self.finished = False

    @property
    def items(self) -> list[Value]:
        raise Unsupported("the items of a lazy iterator (generator) are computed on demand")

    def next_item(self) -> Value | None:
        if self.finished:
            return None
        item = self.produce()
        if item is None:
            self.finished = True
        return item

    def describe(self) -> str:
        return "lazy iterator"


class GeneratorValue(LazyIteratorValue):
    """A generator created inside the trace: the suspended frame of a generator function (an
    InstructionTranslator), run up to its next yield by each ``next()``."""

    def __init__(self, frame: Any) -> None:
        super().__init__(self._resume)
        self.frame = frame
        self.return_value: Value = NONE   # what ``return x`` in the generator gives ``yield from``
        self.running = False

    def _resume(self) -> Value | None:
        if self.running:
            raise Unsupported("generator already executing")
        self.running = True
        try:
            return self.frame.resume()
        finally:
            self.running = False

    def describe(self) -> str:
        return f"generator {self.frame.function_name}()"


class DataclassValue(Value):
    """An instance of a dataclass built inside the trace (fields by name)."""

    def __init__(self, cls: type, fields: dict[str, Value]) -> None:
        self.cls = cls
        self.fields = dict(fields)

    def python_type(self) -> type:
        return self.cls


class TensorMethodValue(Value):
    """``x.view`` before it is called: the unbound torch.Tensor method plus self."""

    def __init__(self, name: str, self_value: TensorValue) -> None:
        self.name = name
        self.self_value = self_value


class ContainerMethodValue(Value):
    """``xs.append`` / ``d.items`` on a list, dict, tuple, set or str."""

    def __init__(self, name: str, self_value: Value) -> None:
        self.name = name
        self.self_value = self_value


class GradModeValue(Value):
    """``torch.no_grad()`` / ``enable_grad()`` / ``set_grad_enabled(b)`` as a context manager."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.previous: bool | None = None


class GradModeFunctionValue(Value):
    """``torch.no_grad()(func)`` (``@torch.no_grad()`` on a function defined in the trace): calling it
    runs ``func`` with grad mode ``enabled`` and restores the mode after."""

    def __init__(self, enabled: bool, func: Value) -> None:
        self.enabled = enabled
        self.func = func

    def python_type(self) -> type:
        return types.FunctionType

    def describe(self) -> str:
        return f"{'enable_grad' if self.enabled else 'no_grad'}-decorated {self.func.describe()}"


class ContextExitValue(Value):
    """The bound ``__exit__`` that BEFORE_WITH pushes."""

    def __init__(self, manager: GradModeValue) -> None:
        self.manager = manager


def constant(value: Any) -> ConstantValue:
    return ConstantValue(value)


NONE = ConstantValue(None)
