"""Guards: the conditions under which a captured graph may be reused.

Capture adds checks while it interprets (``GuardSet.add``); at the end they are
generated into ONE Python function per cache entry::

    def guard(L, G):
        try:
            v0 = L['x']
            if not (type(v0) is Tensor and v0.dtype is float32 ...): return 0
            ...
            return (v0, v3)          # the placeholder values, in order
        except Exception:
            return -1

It returns the tuple of placeholder values when every check passes, or the
index of the first failing check (``-1``: evaluating a source raised), which
names the guard in the "recompiles" log.  Each source prefix is evaluated once.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch

from ..symbolic import is_symbolic, python_code, size_access
from .sources import Source


@dataclasses.dataclass
class GuardCheck:
    source: Source | None
    template: str            # Python with {v} for the source value and {name} for consts
    consts: dict[str, Any]
    text: str                # readable form for logs and explain
    other: Source | None = None  # a second source, {o} in the template (aliasing checks)
    # size guards (dynamic shapes): {name} in the template -> the size of (source, dim), or its
    # storage offset (dim STORAGE_OFFSET)
    sizes: dict[str, tuple[Source, int | str]] = dataclasses.field(default_factory=dict)


class CodeNamespace:
    """Binds constant objects to unique global names of the generated code."""

    def __init__(self) -> None:
        self.globals: dict[str, Any] = {"torch": torch}
        self._names: dict[int, str] = {}

    def bind(self, value: Any, hint: str) -> str:
        key = id(value)
        if key not in self._names:
            base = "".join(c if c.isalnum() else "_" for c in hint).strip("_") or "c"
            name = f"_{base}"
            n = 0
            while name in self.globals:
                n += 1
                name = f"_{base}_{n}"
            self.globals[name] = value
            self._names[key] = name
        return self._names[key]


def readable_const(value: Any) -> str:
    if isinstance(value, type):
        return value.__qualname__
    if isinstance(value, (torch.dtype, torch.device)):
        return repr(value) if isinstance(value, torch.device) else str(value)
    if isinstance(value, torch.nn.Module):
        # a module's repr prints its whole subtree: quadratic in depth over a model's guards
        return f"<{type(value).__name__} at {id(value):#x}>"
    return repr(value)


class GuardSet:
    def __init__(self) -> None:
        self.checks: list[GuardCheck] = []
        self._seen: set[str] = set()
        # tensors that must be distinct objects (set when the graph writes to an input)
        self.distinct_sources: list[Source] = []

    def add(self, source: Source | None, template: str, other: Source | None = None, **consts: Any) -> None:
        readable = {k: readable_const(v) for k, v in consts.items()}
        text = template.format(v=source.name() if source is not None else "",
                               o=other.name() if other is not None else "", **readable)
        if text in self._seen:
            return
        self._seen.add(text)
        self.checks.append(GuardCheck(source, template, consts, text, other))

    def add_size_relation(self, guard: Any, sources: dict[Any, tuple[Source, int]]) -> None:
        """A relation between symbolic sizes (a ``symbolic.Guard``); ``sources`` says where each
        size symbol is read: (the tensor's source, dim)."""
        names = {symbol: f"size_{symbol}" for symbol in sources}
        template = guard.python_code(lambda symbol: "{" + names[symbol] + "}")
        sizes = {names[symbol]: sources[symbol] for symbol in guard.lhs.free_symbols | guard.rhs.free_symbols}
        text = guard.python_code(lambda symbol: size_access(sources[symbol][0].name(), sources[symbol][1]))
        if text in self._seen:
            return
        self._seen.add(text)
        self.checks.append(GuardCheck(None, template, {}, text, sizes=sizes))

    def require_distinct(self, *sources: Source) -> None:
        """These placeholder sources were different objects during capture, and the trace relied on it."""
        keys = {s.key() for s in self.distinct_sources}
        self.distinct_sources.extend(s for s in sources if s.key() not in keys)

    def texts(self) -> list[str]:
        texts = [c.text for c in self.checks]
        if self.distinct_sources:
            texts.append("no aliasing among " + ", ".join(s.name() for s in self.distinct_sources))
        return texts

    def build(self, fetch_sources: list[Source]) -> tuple[Callable, str]:
        """Generate the guard-and-fetch function; returns (function, source text)."""
        namespace = CodeNamespace()
        lines = ["def guard(L, G):", "    try:"]
        temps: dict[str, str] = {}

        def temp_for(source: Source) -> str:
            key = source.key()
            if key not in temps:
                parent = temp_for(source.parent) if source.parent is not None else ""
                name = f"v{len(temps)}"
                lines.append(f"        {name} = {source.access(parent, namespace)}")
                temps[key] = name
            return temps[key]

        for index, check in enumerate(self.checks):
            value = temp_for(check.source) if check.source is not None else ""
            other = temp_for(check.other) if check.other is not None else ""
            bound = {k: namespace.bind(v, f"{k}") for k, v in check.consts.items()}
            bound.update({name: size_access(temp_for(source), dim) for name, (source, dim) in check.sizes.items()})
            condition = check.template.format(v=value, o=other, **bound)
            lines.append(f"        if not ({condition}): return {index}")
        fetched = [temp_for(s) for s in fetch_sources]
        if self.distinct_sources:
            ids = ", ".join(f"id({temp_for(s)})" for s in self.distinct_sources)
            lines.append(f"        if len({{{ids}}}) != {len(self.distinct_sources)}: return {len(self.checks)}")
        lines.append(f"        return ({''.join(f + ', ' for f in fetched)})")
        lines.append("    except Exception:")
        lines.append("        return -1")
        text = "\n".join(lines) + "\n"
        exec(compile(text, "<ember guard>", "exec"), namespace.globals)
        fn = namespace.globals["guard"]
        fn.__ember_source__ = text
        return fn, text


def add_tensor_guard(guards: GuardSet, source: Source, tensor: torch.Tensor,
                     symbolic: tuple[tuple, tuple] | None = None, symbolic_offset: bool = False) -> None:
    """dtype, device, sizes, strides, storage offset, requires_grad and exact type (dispatch).
    ``symbolic`` (sizes, strides with size symbols: dynamic shapes): a symbolic size needs only be
    at least 2 (0 and 1 stay specialised) and strides must follow from the sizes as they did.
    ``symbolic_offset``: the storage offset is a size symbol too (any offset)."""
    device = tensor.device
    # `.is_cpu` costs a third of `.device == cpu`; guards run on every call
    if device.type == "cpu":
        device_check, consts = "{v}.is_cpu", {}
    elif device.type == "cuda":
        device_check, consts = "{v}.is_cuda and {v}.get_device() == {index}", {"index": device.index}
    else:
        device_check, consts = "{v}.device == {device}", {"device": device}
    # `.shape` is cheaper than `.size()`; the storage offset matters to views of inputs that a
    # backend rebuilds with as_strided (prim graphs' output_aliases), so it is guarded too
    # two checks, so that the "recompiles" log names the kind that failed (identity, or layout);
    # not more: every parameter of a model is checked on every call
    guards.add(source, "type({v}) is {cls} and {v}.dtype is {dtype} and " + device_check +
               " and {v}.requires_grad is {requires_grad}",
               cls=type(tensor), dtype=tensor.dtype, requires_grad=bool(tensor.requires_grad), **consts)
    offset_check = "" if symbolic_offset else " and {v}.storage_offset() == {offset}"
    offset = {} if symbolic_offset else {"offset": tensor.storage_offset()}
    if symbolic is not None:
        guards.add(source, _symbolic_layout_check(tensor, *symbolic) + offset_check, **offset)
    else:
        guards.add(source, "{v}.shape == {size} and {v}.stride() == {stride}" + offset_check,
                   size=tuple(tensor.shape), stride=tuple(tensor.stride()), **offset)


def _symbolic_layout_check(tensor: torch.Tensor, sizes: tuple, strides: tuple) -> str:
    """``{v}.dim() == 2 and {v}.shape[0] >= 2 and {v}.shape[1] == 8 and {v}.stride() == ({v}.shape[1], 1)``."""
    def size_code(value: Any) -> str:
        return python_code(value, lambda symbol: "{v}.shape[%d]" % symbol_dims[symbol])
    symbol_dims = {size.expr: dim for dim, size in enumerate(sizes) if is_symbolic(size)}
    parts = [f"{{v}}.dim() == {tensor.dim()}"]
    for dim, size in enumerate(sizes):
        parts.append(f"{{v}}.shape[{dim}] >= 2" if is_symbolic(size) else f"{{v}}.shape[{dim}] == {size}")
    # the strides of size-1 dims address nothing: free (a KV cache's batch stride grows with it)
    checked = [dim for dim, size in enumerate(sizes) if not (not is_symbolic(size) and size == 1)]
    if checked:
        actual = ", ".join(f"{{v}}.stride({dim})" for dim in checked)
        expected = ", ".join(size_code(strides[dim]) for dim in checked)
        comma = "," if len(checked) == 1 else ""
        parts.append(f"({actual}{comma}) == ({expected}{comma})")
    return " and ".join(parts)


def add_value_guard(guards: GuardSet, source: Source, value: Any) -> None:
    """Exact type and value of a Python scalar/str/None that the trace depends on."""
    if value is None or isinstance(value, bool) or value is Ellipsis:
        guards.add(source, "{v} is {value}", value=value)
    elif isinstance(value, float) and value != value:
        guards.add(source, "type({v}) is float and {v} != {v}")
    else:
        guards.add(source, "type({v}) is {cls} and {v} == {value}", cls=type(value), value=value)
