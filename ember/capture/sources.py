"""Sources: where a value the captured frame reads comes from.

A Source is a small expression tree rooted at the frame's locals (``L['x']``),
its globals (``G['scale']``) or a constant object bound by identity (a closure
cell, another module's globals dict).  Guards and placeholder fetches are
generated from sources, so every source can print two ways:

* ``name()``: the readable form used in guard texts and ``node.extra["source"]``
  (``L['self'].layers[0].weight``);
* ``access(parent_code, namespace)``: one step of generated code, given the code
  that evaluates the parent (so generated guards compute each prefix once).
"""
from __future__ import annotations

from typing import Any, Protocol


class Namespace(Protocol):
    def bind(self, value: Any, hint: str) -> str: ...


class Source:
    parent: Source | None = None

    def access(self, parent_code: str, namespace: Namespace) -> str:
        raise NotImplementedError

    def name(self) -> str:
        parent = self.parent.name() if self.parent is not None else ""
        return self.access(parent, _READABLE)

    def key(self) -> str:
        """Identity of the source for de-duplication (readable name + bound ids)."""
        return self.name()

    def code(self, namespace: Namespace) -> str:
        """Generated code evaluating the whole source from L and G."""
        parent = self.parent.code(namespace) if self.parent is not None else ""
        return self.access(parent, namespace)

    def __repr__(self) -> str:
        return self.name()


class LocalSource(Source):
    def __init__(self, local_name: str) -> None:
        self.local_name = local_name

    def access(self, parent_code: str, namespace: Namespace) -> str:
        return f"L[{self.local_name!r}]"


class GlobalSource(Source):
    """A name in the root frame's globals dict (``G``)."""

    def __init__(self, global_name: str) -> None:
        self.global_name = global_name

    def access(self, parent_code: str, namespace: Namespace) -> str:
        return f"G[{self.global_name!r}]"


class ConstSource(Source):
    """An object fixed by identity (a closure cell, a foreign globals dict)."""

    def __init__(self, value: Any, hint: str) -> None:
        self.value = value
        self.hint = hint

    def access(self, parent_code: str, namespace: Namespace) -> str:
        return namespace.bind(self.value, self.hint)

    def key(self) -> str:
        return f"{self.hint}#{id(self.value)}"


class AttrSource(Source):
    def __init__(self, parent: Source, attr: str) -> None:
        self.parent = parent
        self.attr = attr

    def access(self, parent_code: str, namespace: Namespace) -> str:
        return f"{parent_code}.{self.attr}"

    def key(self) -> str:
        return f"{self.parent.key()}.{self.attr}"


def _is_literal(value: Any) -> bool:
    if isinstance(value, tuple):
        return all(_is_literal(v) for v in value)
    return value is None or type(value) in (bool, int, str, bytes) or (type(value) is float and value == value
                                                                        and abs(value) != float("inf"))


def index_code(index: Any, namespace: Namespace) -> str:
    """A subscript in generated code: the literal itself, or a bound name for any other key
    (a class, an enum, a function: their repr is not Python)."""
    return repr(index) if _is_literal(index) else namespace.bind(index, "key")


def index_key(index: Any) -> str:
    return repr(index) if _is_literal(index) else f"{type(index).__name__}#{id(index)}"


class ItemSource(Source):
    def __init__(self, parent: Source, index: Any) -> None:
        self.parent = parent
        self.index = index

    def access(self, parent_code: str, namespace: Namespace) -> str:
        return f"{parent_code}[{index_code(self.index, namespace)}]"

    def key(self) -> str:
        return f"{self.parent.key()}[{index_key(self.index)}]"


class ModuleDictSource(Source):
    """``module.__dict__``: fetched once per module per call, then its stores are read from it."""

    def __init__(self, module: Source) -> None:
        self.parent = module

    def access(self, parent_code: str, namespace: Namespace) -> str:
        return f"{parent_code}.__dict__"

    def key(self) -> str:
        return f"{self.parent.key()}.__dict__"


class ModuleStoreSource(Source):
    """``module.name`` read from the dict ``nn.Module.__getattr__`` would read it from:
    ``module.__dict__['_parameters']['name']`` (or ``_buffers``, ``_modules``).

    A plain attribute read of a parameter runs ``Module.__getattr__`` in Python
    (a microsecond); the dict reads are ~20x cheaper.  Capture uses this source only
    where it is equivalent (see ``modules._wrap_attr``): the module's class is guarded
    by identity, does not override ``__getattr__`` / ``__getattribute__`` nor define
    ``name``, and a guard checks that ``name`` is not in an earlier place.  Prints and
    de-duplicates as the attribute (or item) it stands for.
    """

    def __init__(self, module: Source, store: str, attr: str, readable: str | None = None) -> None:
        self.module = module
        self.parent = ModuleDictSource(module)
        self.store = store
        self.attr = attr
        self.readable = readable if readable is not None else f".{attr}"

    def access(self, parent_code: str, namespace: Namespace) -> str:
        return f"{parent_code}[{self.store!r}][{self.attr!r}]"

    def name(self) -> str:
        return f"{self.module.name()}{self.readable}"

    def key(self) -> str:
        return f"{self.module.key()}{self.readable}"


class ModuleValuesSource(Source):
    """``tuple(seq._modules.values())``: a Sequential's children by position, built once per
    call so that ``seq[i]`` costs a tuple index instead of ``Sequential.__getitem__``."""

    def __init__(self, parent: Source) -> None:
        self.parent = parent

    def access(self, parent_code: str, namespace: Namespace) -> str:
        return f"tuple({parent_code}._modules.values())"

    def name(self) -> str:  # items print as ``seq[i]``
        return self.parent.name()

    def key(self) -> str:
        return f"{self.parent.key()}#children"


def global_source(name: str, globals_dict: dict, root_globals: dict) -> Source:
    """``G['name']`` for the root frame's module, else the foreign dict bound by identity."""
    if globals_dict is root_globals:
        return GlobalSource(name)
    module_name = str(globals_dict.get("__name__", "module")).replace(".", "_")
    return ItemSource(ConstSource(globals_dict, f"G_{module_name}"), name)


def cell_source(cell: Any, var_name: str) -> Source:
    return AttrSource(ConstSource(cell, f"cell_{var_name}"), "cell_contents")


class _ReadableNamespace:
    def bind(self, value: Any, hint: str) -> str:
        return hint


_READABLE = _ReadableNamespace()
