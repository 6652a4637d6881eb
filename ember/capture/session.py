"""State of one capture: the graph being built, guards, inputs and side effects.

One CaptureSession lives for one compile attempt and is shared by every
inlined frame.  It turns real objects read from outside the frame into Values
(``wrap``), adding guards and graph placeholders as it goes, and at the end
turns the returned Value plus recorded Python-side mutations into graph outputs
and a generated "epilogue" that rebuilds the user's return value.
"""
from __future__ import annotations

import dataclasses
import enum
import functools
import types
from collections.abc import Callable
from typing import Any

import torch

from ..errors import Unsupported
from ..graph import Graph, TensorMeta, size_check, size_is, sym_size, tree_leaves
from ..symbolic import STORAGE_OFFSET, ShapeEnv, is_symbolic, symbolic_shape
from . import autocast, objects
from . import numpy_values  # numpy
from . import values as V
from .guards import CodeNamespace, GuardSet, add_tensor_guard, add_value_guard
from .sources import AttrSource, ItemSource, Source

# Python modules whose attributes are library code: reading them is not guarded.
LIBRARY_MODULE_ROOTS = {"torch", "math", "operator", "builtins", "functools", "itertools", "collections",
                        "typing", "numbers", "dataclasses", "warnings", "enum", "abc", "types", "inspect"}
LIBRARY_MODULE_ROOTS.add("numpy")  # numpy

_SCALAR_TYPES = (bool, int, float, complex, str, bytes, type(None), type(Ellipsis))
_TORCH_CONSTANT_TYPES = (torch.dtype, torch.device, torch.Size, torch.memory_format, torch.layout)


class CaptureSession:
    def __init__(self, root_globals: dict) -> None:
        self.graph = Graph()
        self.guards = GuardSet()
        self.root_globals = root_globals
        self.example_inputs: list[Any] = []
        self.placeholder_sources: list[Source] = []
        self.grad_enabled = torch.is_grad_enabled()
        # set while a @contextmanager function makes its generator: its frame may hold try/finally
        # blocks, since only a with-statement drives it to the end (calls._generator_context)
        self.generator_handlers_allowed = False
        # id(object) -> (Value, first source): one Value per outside object, so aliasing is kept
        self._wrapped: dict[int, tuple[V.Value, Source]] = {}
        self._keepalive: list[Any] = []
        self.mutated_inputs: set[int] = set()          # ids of placeholder nodes written in place
        self.input_tensors: dict[Any, torch.Tensor] = {}  # placeholder node -> the real tensor
        self.attr_mutations: dict[int, tuple[V.Value, dict[str, V.Value]]] = {}
        self.mutable_containers: list[V.Value] = []  # sourced lists/dicts (replayed if mutated)
        self.line_stack: list[Any] = []                # interpreters, innermost last (for file:line)
        self.entry_grad_enabled = self.grad_enabled
        self.guards.add(None, "torch.is_grad_enabled() is {grad}", grad=self.grad_enabled)
        # factories and Python-scalar promotion (int tensor * 1.5) follow the default dtype
        self.guards.add(None, "torch.get_default_dtype() is {dtype}", dtype=torch.get_default_dtype())
        self.autocast = autocast.AutocastState(self.guards)
        # graph breaks (breaks.py): the code of the frame being compiled, its translator once it runs,
        # and where a second capture stops: (instruction offset, visit count)
        self.seeded_in_graph = False   # torch.manual_seed replayed after the graph: later random ops break
        # globals and closure cells of outside functions assigned in the trace: key -> (Source, Value)
        self.stored_outside: dict[tuple[int, str], tuple[Source, V.Value]] = {}
        # Python calls with no value in the graph (warnings.warn, logging), replayed after it in order
        self.replayed_calls: list[tuple[Any, list[V.Value], dict[str, V.Value]]] = []
        self.root_code: types.CodeType | None = None
        self.root_translator: Any = None
        self.stop_at: tuple[int, int] | None = None
        # dynamic shapes: input dims (or STORAGE_OFFSET) captured as size symbols (source name -> dims),
        # and their env
        self.dynamic_dims: dict[str, set[int | str]] = {}
        self.shape_env: ShapeEnv | None = None

    def make_dynamic(self, dynamic_dims: dict[str, set[int | str]]) -> None:
        """Capture these input dims as size symbols (ember/symbolic.py) instead of their sizes."""
        self.dynamic_dims = {name: set(dims) for name, dims in dynamic_dims.items() if dims}
        self.shape_env = ShapeEnv() if self.dynamic_dims else None

    def size_values(self, value: V.TensorValue) -> V.Value:
        """``x.shape`` / ``x.size()``: a torch.Size constant, or under dynamic shapes a torch.Size
        of sizes that each pin only themselves, when the program uses them."""
        shape = value.meta.shape
        if self.shape_env is None:
            return V.ConstantValue(torch.Size(shape))
        return V.TupleValue([self.size_value(value, dim) for dim in range(len(shape))], None, torch.Size)

    def size_value(self, value: V.TensorValue, dim: int) -> V.Value:
        if self.shape_env is None:
            return V.ConstantValue(value.meta.shape[dim])
        line = self.current_line()
        return V.SizeValue(value.meta.shape[dim], lambda: self.pin_sizes(value, (dim,)),
                           lambda: self.graph.call(sym_size, (value.node, dim), {}, None, "sym_size", line))

    def size_arithmetic(self, fn: Any, left: V.Value, right: V.Value) -> V.Value | None:
        """``fn(left, right)`` (+ - * // %) of sizes and ints, kept symbolic; None: not such a pair."""
        sizes = [v for v in (left, right) if isinstance(v, V.SizeValue)]
        others = [v for v in (left, right) if not isinstance(v, V.SizeValue)]
        if not sizes or any(not (isinstance(v, V.ConstantValue) and type(v.value) is int) for v in others):
            return None
        hint = fn(*(v.hint if isinstance(v, V.SizeValue) else v.value for v in (left, right)))
        if type(hint) is not int:
            return None
        args = lambda: tuple(v.node() if isinstance(v, V.SizeValue) else v.value for v in (left, right))  # noqa: E731
        line = self.current_line()

        def pin() -> None:
            for v in sizes:
                v.pin()
        return V.SizeValue(hint, pin, lambda: self.graph.call(fn, args(), {}, None, "size", line))

    def size_comparison(self, symbol: str, fn: Any, left: V.Value, right: V.Value) -> V.Value | None:
        """A comparison of sizes: the answer at capture, kept as a ``size_check`` marker (a guard on
        the relation, not on the sizes); None: not such a pair."""
        if not (isinstance(left, V.SizeValue) or isinstance(right, V.SizeValue)):
            return None
        if any(not isinstance(v, V.SizeValue) and not (isinstance(v, V.ConstantValue) and type(v.value) is int)
               for v in (left, right)):
            return None
        hints = [v.hint if isinstance(v, V.SizeValue) else v.value for v in (left, right)]
        result = bool(fn(*hints))
        args = [v.node() if isinstance(v, V.SizeValue) else v.value for v in (left, right)]
        self.graph.call(size_check, (args[0], symbol, args[1], result), {}, None, "size_check", self.current_line())
        return V.ConstantValue(result)

    def pin_sizes(self, value: V.TensorValue, dims: Any = None) -> None:
        """The trace uses these sizes of ``value`` as Python ints (``x.shape[0]``, ``len(x)``): under
        dynamic shapes each becomes a ``size_is`` marker, which the prims conversion turns into a
        guard on the symbolic size.  Nothing to do in a static capture."""
        if self.shape_env is None:
            return
        for dim in range(value.meta.ndim) if dims is None else dims:
            self.graph.call(size_is, (value.node, dim, value.meta.shape[dim]), {}, None, "size_is",
                            self.current_line())

    def mixes_devices(self) -> bool:
        """Tensors on a device other than the one a backend compiles for (CUDA when an input is on
        CUDA, else CPU; CPU 0-dim inputs mix with either), e.g. ``x.new_zeros(3, device="cuda")``
        with CPU inputs or ``.cpu()`` in a CUDA graph: such a graph runs op by op, each op on
        eager's device."""
        inputs = {node.meta.device.type for node in self.graph.placeholders if isinstance(node.meta, TensorMeta)}
        target = "cuda" if "cuda" in inputs else "cpu"
        for node in self.graph.nodes:
            metas = node.meta if isinstance(node.meta, tuple) else (node.meta,)
            for meta in metas:
                if not isinstance(meta, TensorMeta) or meta.device.type == target:
                    continue
                if node.op == "placeholder" and meta.device.type == "cpu" and meta.ndim == 0:
                    continue
                return True
        return False

    def needs_eager_autograd(self) -> bool:
        """A graph entered with grad off that computes tensors requiring grad (an enable_grad()
        region): the backend has no autodiff yet and looks only at the grad mode at entry, so
        such a graph runs op by op, where autograd records exactly what eager records."""
        if self.entry_grad_enabled:
            return False  # the backend sees grad on and inputs requiring grad: eager graph
        last = self.graph.nodes[-1] if self.graph.nodes else None
        outputs = {id(n) for n in tree_leaves(last.args)} if last is not None and last.op == "output" else set()
        for node in self.graph.call_nodes():
            metas = node.meta if isinstance(node.meta, tuple) else (node.meta,)
            if not any(isinstance(m, TensorMeta) and m.requires_grad for m in metas):
                continue
            # under no_grad a view of a parameter still requires grad (``gamma.reshape(1, -1, 1, 1)``,
            # eager too) but records nothing: only a graph output shows that flag
            if node.extra.get("grad_enabled", True) or id(node) in outputs:
                return True
        return False

    # ------------------------------------------------------------- locations
    def current_line(self) -> str:
        """file:line of the innermost frame outside torch's own code (the user's line)."""
        fallback = ""
        for interp in reversed(self.line_stack):
            location = interp.location()
            fallback = fallback or location
            if "/torch/" not in interp.code.co_filename:
                return location
        return fallback

    # ------------------------------------------------------------- wrapping
    def wrap(self, value: Any, source: Source | None) -> V.Value:
        """A Value for a real object; with a source, guard what the trace may depend on."""
        if source is None:
            return self._wrap_unguarded(value)
        if not isinstance(value, _SCALAR_TYPES):
            seen = self._wrapped.get(id(value))
            if seen is not None:
                existing, first_source = seen
                if first_source.key() != source.key():
                    self.guards.add(source, "{v} is {o}", other=first_source)
                return existing
        wrapped = self._wrap_new(value, source)
        if not isinstance(value, _SCALAR_TYPES):
            self._wrapped[id(value)] = (wrapped, source)
            self._keepalive.append(value)
        return wrapped

    def _wrap_new(self, value: Any, source: Source) -> V.Value:
        guards = self.guards
        if numpy_values.is_numpy_object(value):  # numpy
            return numpy_values.wrap_numpy_object(self, value, source)
        if isinstance(value, _SCALAR_TYPES):
            add_value_guard(guards, source, value)
            return V.ConstantValue(value, source)
        if isinstance(value, torch.Tensor):
            return self._placeholder(value, source)
        if isinstance(value, _TORCH_CONSTANT_TYPES):
            guards.add(source, "{v} == {value}", value=value)
            return V.ConstantValue(value, source)
        if isinstance(value, enum.Enum):
            guards.add(source, "{v} is {value}", value=value)
            return V.ConstantValue(value, source)
        if isinstance(value, torch.autocast):  # e.g. the instance in @torch.autocast(...)'s closure
            guards.add(source, "{v} is {obj}", obj=value)
            return autocast.from_real(value)
        if isinstance(value, torch.nn.Module):
            # the exact class too: ``__class__`` can be reassigned, and capture inlined this class's
            # forward and read its parameters straight from their dicts (modules.py)
            guards.add(source, "{v} is {module} and type({v}) is {cls}", module=value, cls=type(value))
            guards.add(source, "{v}.training is {training}", training=value.training)
            return V.ModuleValue(value, source)
        if type(value) is tuple or (isinstance(value, tuple) and hasattr(type(value), "_fields")):
            guards.add(source, "type({v}) is {cls} and len({v}) == {n}", cls=type(value), n=len(value))
            items = [self.wrap(v, ItemSource(source, i)) for i, v in enumerate(value)]
            return V.TupleValue(items, source, type(value))
        if type(value) is list:
            guards.add(source, "type({v}) is list and len({v}) == {n}", n=len(value))
            result = V.ListValue([self.wrap(v, ItemSource(source, i)) for i, v in enumerate(value)], source)
            self.mutable_containers.append(result)
            return result
        if type(value) is dict and all(isinstance(k, (str, int)) for k in value):
            guards.add(source, "type({v}) is dict and list({v}) == {keys}", keys=list(value))
            items = {k: self.wrap(v, ItemSource(source, k)) for k, v in value.items()}
            result = V.DictValue(items, source)
            self.mutable_containers.append(result)
            return result
        if isinstance(value, (set, frozenset)) and all(isinstance(k, _SCALAR_TYPES) for k in value):
            guards.add(source, "{v} == {value}", value=set(value))
            return V.SetValue(list(value), source)
        bound = _bound_method_value(self, value, source)
        if bound is not None:
            return bound
        if isinstance(value, types.MethodType):
            guards.add(source, "{v}.__func__ is {fn}", fn=value.__func__)
            return V.BoundMethodValue(self.wrap(value.__func__, AttrSource(source, "__func__")),
                                      self.wrap(value.__self__, AttrSource(source, "__self__")))
        if isinstance(value, types.CodeType):  # immutable: its attributes are constants once identity is known
            guards.add(source, "{v} is {code}", code=value)
            return V.ConstantValue(value)
        if isinstance(value, (types.FunctionType, types.BuiltinFunctionType, types.ModuleType, type,
                              types.MethodWrapperType, types.WrapperDescriptorType,
                              types.MethodDescriptorType)) or callable(value) and is_library_value(value):
            guards.add(source, "{v} is {obj}", obj=value)
            return V.ObjectValue(value, source)
        guards.add(source, "type({v}) is {cls}", cls=type(value))
        return V.UserObjectValue(value, source)

    def _wrap_unguarded(self, value: Any) -> V.Value:
        """Values that come from library code or constants folded by the interpreter."""
        if isinstance(value, _SCALAR_TYPES + _TORCH_CONSTANT_TYPES) or isinstance(value, enum.Enum):
            return V.ConstantValue(value)
        if isinstance(value, torch.Tensor):
            raise Unsupported("a tensor reached from an unguarded place (e.g. a library module attribute)")
        if isinstance(value, torch.nn.Module):
            raise Unsupported("an nn.Module reached from an unguarded place")
        if type(value) in (tuple, list) or (isinstance(value, tuple) and hasattr(type(value), "_fields")):
            items = [self._wrap_unguarded(v) for v in value]
            return V.ListValue(items) if type(value) is list else V.TupleValue(items, None, type(value))
        if type(value) is dict:
            return V.DictValue({k: self._wrap_unguarded(v) for k, v in value.items()})
        if isinstance(value, (set, frozenset)):
            return V.SetValue(list(value))
        return V.ObjectValue(value)

    def _placeholder(self, tensor: torch.Tensor, source: Source) -> V.TensorValue:
        if type(tensor) not in (torch.Tensor, torch.nn.Parameter, getattr(torch.nn, "Buffer", torch.Tensor)) and \
                not isinstance(tensor, torch.nn.Parameter):
            raise Unsupported(f"tensor subclass {type(tensor).__name__} as input")
        meta = TensorMeta.of(tensor)
        symbolic = offset = None
        wanted = self.dynamic_dims.get(source.name(), ()) if self.shape_env is not None else ()
        if wanted:
            symbolic = symbolic_shape(tuple(tensor.shape), tuple(tensor.stride()), self.shape_env,
                                      sorted(d for d in wanted if d != STORAGE_OFFSET), lambda dim: (source, dim))
            if STORAGE_OFFSET in wanted:   # any offset, 0 included: a view data[i] of a changing i
                offset = self.shape_env.symbol(tensor.storage_offset(), (source, STORAGE_OFFSET), lower=0)
        add_tensor_guard(self.guards, source, tensor, symbolic, symbolic_offset=offset is not None)
        for dim, size in enumerate(symbolic[0] if symbolic is not None else ()):
            first_source, first_dim = self.shape_env.symbol_source(size) if is_symbolic(size) else (source, dim)
            if (first_source.key(), first_dim) != (source.key(), dim):   # a duck-sized symbol: sizes stay equal
                self.guards.add(source, "{v}.shape[%d] == {o}.shape[%d]" % (dim, first_dim), other=first_source)
        node = self.graph.placeholder(_placeholder_name(source), meta)
        node.extra["source"] = source.name()
        if symbolic is not None or offset is not None:
            shape, stride = symbolic if symbolic is not None else (meta.shape, meta.stride)
            node.extra["symbolic_meta"] = dataclasses.replace(
                meta, shape=shape, stride=stride, storage_offset=offset if offset is not None else meta.storage_offset)
        self.input_tensors[node] = tensor
        self.example_inputs.append(tensor)
        self.placeholder_sources.append(source)
        python_cls = torch.nn.Parameter if isinstance(tensor, torch.nn.Parameter) else torch.Tensor
        return V.TensorValue(node, meta, source, python_cls)

    # ------------------------------------------------------------- mutation
    def record_setattr(self, target: V.Value, name: str, value: V.Value) -> None:
        if target.source is None or not isinstance(target, (V.ModuleValue, V.UserObjectValue)):
            raise Unsupported(f"setting attribute {name!r} on {target.describe()}")
        if isinstance(target, V.ModuleValue) and name == "training":
            raise Unsupported("changing .training inside the compiled region")
        entry = self.attr_mutations.setdefault(id(target), (target, {}))
        entry[1][name] = value

    def store_outside(self, key: tuple[int, str], source: Source, value: V.Value) -> None:
        self.stored_outside.pop(key, None)   # re-inserted last: written back in the order of the last stores
        self.stored_outside[key] = (source, value)

    def pending_attr(self, target: V.Value, name: str) -> V.Value | None:
        entry = self.attr_mutations.get(id(target))
        return entry[1].get(name) if entry is not None else None

    def add_no_alias_guard(self) -> None:
        """Graphs that write to inputs were traced with distinct tensors; keep them distinct."""
        if len(self.placeholder_sources) > 1 and self.mutated_inputs:
            self.guards.distinct_sources = list(self.placeholder_sources)

    # ------------------------------------------------------------- outputs
    def finalize(self, result: V.Value) -> Callable:
        """Add graph outputs and generate ``epilogue(L, G, outs)`` that rebuilds the result."""
        builder = EpilogueBuilder(self)
        statements = builder.mutation_statements()
        expression = builder.expr(result)
        self.graph.output(builder.outputs)
        return builder.function("epilogue", builder.grad_mode_statements() + builder.rebuilt + statements +
                                [f"return {expression}"])


_GRAD_MODE_MANAGERS = (torch.no_grad, torch.enable_grad, torch.set_grad_enabled)


def _bound_method_value(session: CaptureSession, value: Any, source: Source) -> V.Value | None:
    """Methods bound to a real object, as a graph break hands them to a continuation: ``x.add`` of a
    tensor, ``xs.append`` of a list, the ``__exit__`` of a grad-mode block."""
    owner = getattr(value, "__self__", None)
    if isinstance(value, types.BuiltinMethodType) and isinstance(owner, (torch.Tensor, list, dict)):
        session.guards.add(source, "type({v}) is {cls} and {v}.__name__ == {name}", cls=type(value),
                           name=value.__name__)
        owner_value = session.wrap(owner, AttrSource(source, "__self__"))
        if isinstance(owner_value, V.TensorValue):
            return V.TensorMethodValue(value.__name__, owner_value)
        return V.ContainerMethodValue(value.__name__, owner_value)
    if isinstance(value, types.MethodType) and isinstance(owner, _GRAD_MODE_MANAGERS) \
            and value.__func__.__name__ == "__exit__":
        enabled = owner.mode if isinstance(owner, torch.set_grad_enabled) else isinstance(owner, torch.enable_grad)
        session.guards.add(source, "type({v}.__self__) is {cls} and {v}.__func__.__name__ == '__exit__' "
                                   "and {v}.__self__.prev is {prev}", cls=type(owner), prev=owner.prev)
        if isinstance(owner, torch.set_grad_enabled):
            session.guards.add(source, "{v}.__self__.mode is {mode}", mode=owner.mode)
        manager = V.GradModeValue(enabled)
        manager.previous = bool(owner.prev)
        return V.ContextExitValue(manager)
    if isinstance(value, types.MethodType) and isinstance(owner, torch.autocast) \
            and value.__func__.__name__ == "__exit__":
        session.guards.add(source, "type({v}.__self__) is {cls} and {v}.__func__.__name__ == '__exit__' and "
                                   "({v}.__self__.device, {v}.__self__.fast_dtype, {v}.__self__._enabled, "
                                   "{v}.__self__._cache_enabled, {v}.__self__.prev, {v}.__self__.prev_fastdtype, "
                                   "{v}.__self__.prev_cache_enabled) == {state}", cls=type(owner),
                           state=(owner.device, owner.fast_dtype, owner._enabled, owner._cache_enabled, owner.prev,
                                  owner.prev_fastdtype, owner.prev_cache_enabled))
        return V.ContextExitValue(autocast.from_real_exit(session.autocast, value))
    return None


def make_function(code: types.CodeType, globals_dict: dict, defaults: tuple, kwdefaults: dict,
                  closure: tuple) -> types.FunctionType:
    function = types.FunctionType(code, globals_dict, code.co_name, defaults or None, closure or None)
    function.__kwdefaults__ = kwdefaults or None
    function.__qualname__ = code.co_qualname
    return function


def grad_mode_exit(enabled: bool, previous: bool) -> Any:
    """The ``__exit__`` of a grad-mode block still open at a graph break (``with no_grad():`` and the
    like), for the continuation's ``with`` exit: it restores ``previous``, the mode before the block.
    Making it does not change the mode; the runner sets the mode of the break itself."""
    manager = torch.set_grad_enabled.__new__(torch.set_grad_enabled)
    manager.mode, manager.prev = enabled, previous
    return manager.__exit__


def grad_mode_decorator(builder: "EpilogueBuilder", enabled: bool) -> str:
    """``torch.enable_grad()`` / ``torch.no_grad()``, the decorator a GradModeFunctionValue is made with."""
    manager = torch.enable_grad if enabled else torch.no_grad
    return f"{builder.namespace.bind(manager, manager.__name__)}()"


def is_library_value(value: Any) -> bool:
    module = getattr(value, "__module__", None) or ""
    return module.split(".")[0] in LIBRARY_MODULE_ROOTS


def is_library_module(module: types.ModuleType) -> bool:
    return module.__name__.split(".")[0] in LIBRARY_MODULE_ROOTS


def _placeholder_name(source: Source) -> str:
    text = source.name().replace("L[", "").replace("G[", "g_").replace("]", "").replace("'", "")
    text = "".join(c if c.isalnum() else "_" for c in text.lower())
    while "__" in text:
        text = text.replace("__", "_")
    return text.strip("_") or "input"


class EpilogueBuilder:
    """Python source that turns graph outputs back into the user's objects (``epilogue(L, G, outs)``)."""

    def __init__(self, session: CaptureSession) -> None:
        self.session = session
        self.namespace = CodeNamespace()
        self.outputs: list[Any] = []
        self._output_index: dict[Any, int] = {}
        # objects built in the trace are rebuilt once, into a name: two references stay one object
        self.rebuilt: list[str] = []
        self._rebuilt_names: dict[int, str] = {}

    def function(self, name: str, body: list[str], header: str = "(L, G, outs)") -> Callable:
        text = f"def {name}{header}:\n" + "".join(f"    {line}\n" for line in body)
        exec(compile(text, f"<ember {name}>", "exec"), self.namespace.globals)
        fn = self.namespace.globals[name]
        fn.__ember_source__ = text
        return fn

    def _once(self, value: V.Value, build: Callable[[], str]) -> str:
        name = self._rebuilt_names.get(id(value))
        if name is None:
            expression = build()
            name = self._rebuilt_names[id(value)] = f"_obj{len(self._rebuilt_names)}"
            self.rebuilt.append(f"{name} = {expression}")
        return name

    def _tensor(self, value: V.TensorValue) -> str:
        if value.node.op == "placeholder" and value.source is not None:
            return value.source.code(self.namespace)
        if value.node not in self._output_index:
            self._output_index[value.node] = len(self.outputs)
            self.outputs.append(value.node)
        return f"outs[{self._output_index[value.node]}]"

    def expr(self, value: V.Value) -> str:
        if isinstance(value, numpy_values.NdarrayValue):  # numpy
            return numpy_values.epilogue_expression(self, value)
        if isinstance(value, V.TensorValue):
            return self._tensor(value)
        if isinstance(value, V.ConstantValue):
            # exact types: a str or int Enum member passes isinstance, but its repr is not Python
            if value.value is None or type(value.value) in (bool, int, str):
                return repr(value.value)
            return self.namespace.bind(value.value, "const")
        if isinstance(value, (V.ListValue, V.DictValue)) and value.source is not None:
            return value.source.code(self.namespace)
        if isinstance(value, V.TupleValue):
            inner = "".join(self.expr(v) + ", " for v in value.items)
            if value.cls is tuple:
                return f"({inner})"
            cls = self.namespace.bind(value.cls, value.cls.__name__)
            return f"{cls}._make(({inner}))" if hasattr(value.cls, "_make") else f"{cls}(({inner}))"
        if isinstance(value, (V.ListValue, V.DictValue, V.SetValue, V.DataclassValue, objects.InstanceValue)):
            return self._once(value, lambda: self._new_object(value))
        if isinstance(value, V.FunctionValue):
            return self._once(value, lambda: self._function(value))
        return self._other(value)

    def _new_object(self, value: V.Value) -> str:
        if isinstance(value, V.ListValue):
            return "[" + ", ".join(self.expr(v) for v in value.items) + "]"
        if isinstance(value, V.DictValue):
            body = ", ".join(f"{self.namespace.bind(k, 'key') if type(k) not in (str, int) else repr(k)}: "
                             f"{self.expr(v)}" for k, v in value.items.items())
            if value.cls is dict:
                return "{" + body + "}"
            return f"{self.namespace.bind(value.cls, value.cls.__name__)}({{{body}}})"
        if isinstance(value, V.SetValue):
            return f"set({self.namespace.bind(tuple(value.items), 'set_items')})"
        if isinstance(value, V.DataclassValue):
            cls = self.namespace.bind(value.cls, value.cls.__name__)
            args = ", ".join(f"{k}={self.expr(v)}" for k, v in value.fields.items())
            return f"{cls}({args})"
        return self._instance(value)

    def _other(self, value: V.Value) -> str:
        if isinstance(value, objects.PartialValue):
            partial = self.namespace.bind(functools.partial, "partial")
            args = "".join(f", {self.expr(v)}" for v in value.args)
            keywords = "".join(f", {k}={self.expr(v)}" for k, v in value.keywords.items())
            return f"{partial}({self.expr(value.func)}{args}{keywords})"
        if isinstance(value, V.BoundMethodValue):
            return f"{self.expr(value.func)}.__get__({self.expr(value.self_value)})"
        if isinstance(value, (V.TensorMethodValue, V.ContainerMethodValue)):
            return f"{self.expr(value.self_value)}.{value.name}"
        if isinstance(value, V.GradModeFunctionValue):
            return self._once(value, lambda: f"{grad_mode_decorator(self, value.enabled)}({self.expr(value.func)})")
        if isinstance(value, V.ContextExitValue) and isinstance(value.manager, V.GradModeValue):
            manager = value.manager
            make_exit = self.namespace.bind(grad_mode_exit, "grad_mode_exit")
            previous = self.session.grad_enabled if manager.previous is None else manager.previous
            return self._once(value, lambda: f"{make_exit}({manager.enabled}, {previous})")
        if isinstance(value, V.ContextExitValue) and isinstance(value.manager, autocast.AutocastValue):
            manager = value.manager
            enter = self.namespace.bind(autocast.enter_real_block, "enter_autocast")
            dtype = self.namespace.bind(manager.dtype, str(manager.dtype).replace("torch.", ""))
            return self._once(value, lambda: f"{enter}({manager.device!r}, {dtype}, {manager.enabled}, "
                                             f"{manager.cache_enabled})")
        if isinstance(value, V.FreshModuleValue):     # a new one per call, as eager makes it
            cls = self.namespace.bind(type(value.obj), type(value.obj).__name__)
            args = self.namespace.bind(tuple(value.args), "module_args")
            kwargs = self.namespace.bind(dict(value.kwargs), "module_kwargs")
            return self._once(value, lambda: f"{cls}(*{args}, **{kwargs})")
        if isinstance(value, V.ObjectValue):
            if value.source is not None:
                return value.source.code(self.namespace)
            return self.namespace.bind(value.obj, getattr(value.obj, "__name__", None) or "obj")
        raise Unsupported(f"returning or storing {value.describe()} from a compiled frame")

    def cell(self, cell: V.CellValue | V.RealCell) -> str:
        """A closure cell as a real cell object: one object per cell, shared by every closure using it."""
        if isinstance(cell, V.RealCell):
            if cell.cell_source is not None:
                return cell.cell_source.code(self.namespace)
            return self.namespace.bind(cell.cell, f"cell_{cell.name}")
        cell_type = self.namespace.bind(types.CellType, "CellType")
        return self._once(cell, lambda: f"{cell_type}({self.expr(cell.contents) if cell.contents is not None else ''})")

    def _function(self, value: V.FunctionValue) -> str:
        """A function made in the trace (a closure, a lambda), made again from its code."""
        make = self.namespace.bind(make_function, "make_function")
        defaults = "".join(self.expr(v) + ", " for v in value.defaults)
        kwdefaults = ", ".join(f"{k!r}: {self.expr(v)}" for k, v in value.kwdefaults.items())
        closure = "".join(self.cell(c) + ", " for c in value.closure)
        return (f"{make}({self.namespace.bind(value.code, value.name)}, {self.namespace.bind(value.globals, 'globals')}, "
                f"({defaults}), {{{kwdefaults}}}, ({closure}))")

    def _instance(self, value: objects.InstanceValue) -> str:
        """An object built in the trace: rebuilt without re-running __init__ (see objects.py)."""
        rebuild = self.namespace.bind(objects.rebuild_instance, "rebuild_instance")
        cls = self.namespace.bind(value.cls, value.cls.__name__)
        items = "None"
        if value.dict_items is not None:
            items = "[" + "".join(f"({self._key(k)}, {self.expr(v)}), " for k, v in value.dict_items.items.items()) + "]"
        attrs = "{" + ", ".join(f"{k!r}: {self.expr(v)}" for k, v in value.attrs.items()) + "}"
        return f"{rebuild}({cls}, {items}, {attrs})"

    def _key(self, key: Any) -> str:
        return repr(key) if type(key) in (str, int) or key is None else self.namespace.bind(key, "key")

    def grad_mode_statements(self) -> list[str]:
        """The frame leaves grad mode changed (a continuation that exits a ``with no_grad():`` begun
        before a graph break): the compiled graph does not change the global mode, this does.  A break's
        runner also rebuilds the ``__exit__`` of the blocks still open (``grad_mode_exit``), which
        leaves the mode as this sets it."""
        if self.session.grad_enabled != self.session.entry_grad_enabled:
            return [f"torch._C._set_grad_enabled({self.session.grad_enabled})"]
        return []

    def mutation_statements(self) -> list[str]:
        """The frame's effects on Python state outside the graph.  Every new value is computed
        before any state changes: a value may read the old contents of a container that is itself
        rewritten (Hugging Face passes ``kwargs`` on with ``kwargs['input_ids']`` still in it; a
        ``clear()`` first made that read a KeyError)."""
        values: list[str] = []
        writes: list[str] = []

        def new_value(expression: str) -> str:
            values.append(f"_new{len(values)} = {expression}")
            return f"_new{len(values) - 1}"

        for container in self.session.mutable_containers:
            if not getattr(container, "mutated", False):
                continue
            target = container.source.code(self.namespace)
            if isinstance(container, V.ListValue):
                items = ", ".join(self.expr(v) for v in container.items)
                writes.append(f"{target}[:] = {new_value(f'[{items}]')}")
            else:
                body = ", ".join(f"{self._key(k)}: {self.expr(v)}" for k, v in container.items.items())
                writes.append(f"_d = {target}; _d.clear(); _d.update({new_value(f'{{{body}}}')})")
        for target, attrs in self.session.attr_mutations.values():
            obj = target.source.code(self.namespace)
            for name, value in attrs.items():
                writes.append(f"{obj}.{name} = {new_value(self.expr(value))}")
        for source, value in self.session.stored_outside.values():
            writes.append(f"{source.code(self.namespace)} = {new_value(self.expr(value))}")
        statements = values + writes
        for fn, args, kwargs in self.session.replayed_calls:
            parts = [self.expr(a) for a in args] + [f"{k}={self.expr(v)}" for k, v in kwargs.items()]
            statements.append(f"{self.namespace.bind(fn, getattr(fn, '__name__', 'call'))}({', '.join(parts)})")
        return statements


@dataclasses.dataclass
class CaptureResult:
    graph: Graph
    guards: GuardSet
    example_inputs: list[Any]
    placeholder_sources: list[Source]
    epilogue: Callable
