"""Calling a Value: inline Python code, record torch ops, fold pure Python calls.

Dispatch, in order: functions created in the trace and user Python functions
are inlined; ``torch.*`` / ``torch.nn.functional.*`` / ``torch.Tensor`` methods
and operators on tensors are recorded; builtins are evaluated symbolically
(``builtins.py``); nn.Modules go through ``modules.py``; dataclasses and
namedtuples are built as Values; anything else is Unsupported.

This is the top of the dispatch layer (``IMPORT_LAYERS`` in __init__.py): the one
module that imports every kind of callee's module.  The modules below it call
Python code through ``tx.call`` (the translator delegates to ``call`` here).
"""
from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
import inspect
import logging
import math
import operator
import os
import sys
import types
import warnings
from typing import Any

import torch

from ..errors import Unsupported
from . import autocast, builtins, modules, objects, operations, tensor_ops
from . import values as V
from . import numpy_functions  # numpy
from .builtins import BUILTIN_HANDLERS, call_builtin_pure, constants
from .inline import bind_arguments, inline_function_value, inline_real_function
from .objects import InstanceValue

# torch functions that only read global state: evaluated now (their state is guarded or constant)
_TORCH_PURE_QUERIES = {torch.is_grad_enabled, torch.is_tensor, torch.is_floating_point,
                       torch.is_complex, torch.finfo, torch.iinfo, torch.Size, torch.device,
                       torch.promote_types, torch.result_type, torch.can_cast}
_GRAD_MODE_CLASSES = (torch.no_grad, torch.enable_grad, torch.set_grad_enabled)
CO_GENERATOR_LIKE = inspect.CO_GENERATOR | inspect.CO_COROUTINE | inspect.CO_ITERABLE_COROUTINE | \
    inspect.CO_ASYNC_GENERATOR


def _compile_state_queries() -> dict[Any, Any]:
    """``torch.compiler.is_compiling()`` and friends: constants while capturing.

    Library code checks them to pick a traceable path (no data-dependent checks, no
    ContextVar); capture answers like a graph-capturing compiler, and the answers
    never change between calls, so they need no guard."""
    answers: dict[Any, Any] = {}
    # torch.jit's / torch.fx's Python-level tracing queries are inlined like user code; only their
    # C-level leaves and the compiler-state queries are answered here.
    for owner, name, answer in [
        ("torch.compiler", "is_compiling", True), ("torch.compiler", "is_dynamo_compiling", True),
        ("torch.compiler", "is_exporting", False), ("torch._utils", "is_compiling", True),
        ("torch._jit_internal", "is_scripting", False), ("torch._C", "_get_tracing_state", None),
        ("torch._C", "_is_tracing", False),
        # nn.Transformer*/MultiheadAttention's fused inference kernels have no meta kernel in every
        # torch version: capture takes their composite path, the same math, fusible
        ("torch.backends.mha", "get_fastpath_enabled", False),
    ]:
        module = sys.modules.get(owner)
        fn = getattr(module, name, None) if module is not None else None
        if fn is not None:
            answers[fn] = answer
    return answers


_COMPILE_STATE_QUERIES = _compile_state_queries()
# torch global state that may change between calls: evaluated now and guarded
_GUARDED_TORCH_QUERIES = {fn for fn in (
    getattr(torch, "get_default_dtype", None), getattr(torch, "is_autocast_enabled", None),
    getattr(torch, "get_autocast_dtype", None), getattr(torch, "is_inference_mode_enabled", None),
    getattr(torch, "is_autocast_cache_enabled", None), getattr(torch, "get_autocast_gpu_dtype", None),
    getattr(torch, "get_autocast_cpu_dtype", None)) if fn is not None}
_MODULE_CALL_ENTRIES = {torch.nn.Module.__call__, torch.nn.Module._call_impl,
                        getattr(torch.nn.Module, "_wrapped_call_impl", torch.nn.Module._call_impl)}
# library functions that only look at their (identity-known) arguments: evaluated for real
_PURE_LIBRARY_QUERIES = {inspect.signature, inspect.getfullargspec, inspect.isclass, inspect.isfunction,
                         inspect.ismethod, inspect.isroutine, inspect.iscoroutinefunction,
                         inspect.isgeneratorfunction, inspect.isabstract, inspect.getmro}
# torch.overrides' "does an argument override __torch_function__?" checks (library code asks them
# before its fast paths); answered from the arguments' types, which guards pin
_TORCH_FUNCTION_QUERIES = {torch._C._has_torch_function, torch._C._has_torch_function_unary,
                           torch._C._has_torch_function_variadic}
# torch functions written in Python that are inlined rather than recorded as one node: their
# result mixes tensors and None (need_weights=False) or is a Python value (shape checks)
_INLINED_TORCH_FUNCTIONS = {getattr(torch.nn.functional, name) for name in (
    "multi_head_attention_forward", "_mha_shape_check", "_canonical_mask", "_none_or_dtype",
    "_in_projection_packed", "_in_projection", "_check_key_padding_mask") if hasattr(torch.nn.functional, name)}
# calls whose only effect is outside the tensors (a message): replayed after the graph, in order
_LOG_FUNCTIONS = {getattr(logging, n) for n in ("debug", "info", "warning", "error", "critical", "exception", "log")}
_LOGGER_METHODS = {getattr(logging.Logger, n) for n in ("debug", "info", "warning", "error", "critical",
                                                         "exception", "log")}
# torch._check(cond, message_fn) and friends: library asserts on Python conditions
_TORCH_CHECKS = {getattr(torch, name) for name in ("_check", "_check_with", "_check_index", "_check_value",
                                                   "_check_type", "_check_not_implemented") if hasattr(torch, name)}
_ENVIRON_GET = type(os.environ).get  # Mapping.get: try self[key] except KeyError
_UNSAFE_TORCH = {torch.seed, torch.set_default_dtype, torch.set_grad_enabled,
                 torch.use_deterministic_algorithms}


def call(tx: Any, callee: V.Value, args: list[V.Value], kwargs: dict[str, V.Value]) -> V.Value:
    session = tx.session
    if numpy_functions.wants_call(callee, args):  # numpy
        return numpy_functions.call(tx, callee, args, kwargs)
    if isinstance(callee, V.FunctionValue):
        return inline_function_value(tx, callee, args, kwargs)
    if isinstance(callee, V.BoundMethodValue):
        return call(tx, callee.func, [callee.self_value] + args, kwargs)
    if isinstance(callee, V.TensorMethodValue):
        return tensor_ops.call_tensor_method(session, callee.name, callee.self_value, args, kwargs)
    if isinstance(callee, V.ContainerMethodValue):
        return builtins.call_container_method(tx, callee.self_value, callee.name, args, kwargs)
    if isinstance(callee, V.ContextExitValue):
        if isinstance(callee.manager, objects.GeneratorContextValue) and \
                not all(operations.is_none(tx, a) for a in args):
            raise tx.unsupported("__exit__ of a @contextmanager with an exception")
        operations.exit_context(tx, callee.manager)
        return V.NONE
    if isinstance(callee, V.ModuleValue):
        return modules.call_module(tx, callee, args, kwargs)
    if isinstance(callee, objects.PartialValue):
        return objects.call_partial(tx, callee, args, kwargs)
    if isinstance(callee, InstanceValue):
        call_method = inspect.getattr_static(callee.cls, "__call__", None)
        if isinstance(call_method, types.FunctionType):
            return inline_real_function(tx, call_method, [callee] + args, kwargs)
        raise tx.unsupported(f"calling {callee.describe()}")
    if isinstance(callee, V.ObjectValue) and isinstance(callee.obj, functools._lru_cache_wrapper):
        result = _call_memoized(tx, callee.obj, args, kwargs)      # e.g. logger.warning_once(...)
        if result is not None:
            return result
    if isinstance(callee, V.UserObjectValue):
        call_method = getattr(type(callee.obj), "__call__", None)
        if isinstance(call_method, types.FunctionType):
            return inline_real_function(tx, call_method, [callee] + args, kwargs)
        raise tx.unsupported(f"calling {callee.describe()}")
    if isinstance(callee, V.ObjectValue):
        return _call_object(tx, callee.obj, args, kwargs)
    if isinstance(callee, V.GradModeValue):
        return _decorate_with_grad_mode(tx, callee, args, kwargs)
    if isinstance(callee, V.GradModeFunctionValue):
        return _call_in_grad_mode(tx, callee, args, kwargs)
    raise tx.unsupported(f"calling {callee.describe()}")


def _autograd_function_class(fn: Any, args: list[V.Value]) -> type | None:
    """The user's autograd.Function subclass when this calls its ``apply`` (bound, or the function
    with the class first, as a classmethod loaded from the class is called here), else None."""
    apply = torch.autograd.Function.apply.__func__
    if isinstance(fn, types.MethodType) and fn.__func__ is apply and isinstance(fn.__self__, type):
        return fn.__self__
    if fn is apply and args and isinstance(args[0], V.ObjectValue) and isinstance(args[0].obj, type):
        return args[0].obj
    return None


def _decorate_with_grad_mode(tx: Any, manager: V.GradModeValue, args: list[V.Value],
                             kwargs: dict[str, V.Value]) -> V.Value:
    """``torch.no_grad()(func)``: the decorator form of the grad-mode managers (generator functions
    and classes get other wrappers in torch: not captured)."""
    if len(args) != 1 or kwargs or manager.previous is not None:
        raise tx.unsupported(f"calling {manager.describe()}")
    func = args[0]
    if isinstance(func, V.FunctionValue):
        plain = not func.code.co_flags & CO_GENERATOR_LIKE
    elif isinstance(func, V.ObjectValue):
        plain = isinstance(func.obj, types.FunctionType) and not func.obj.__code__.co_flags & CO_GENERATOR_LIKE
    else:
        plain = False
    if not plain:
        raise tx.unsupported(f"grad-mode decorator on {func.describe()}")
    return V.GradModeFunctionValue(manager.enabled, func)


def _call_in_grad_mode(tx: Any, wrapper: V.GradModeFunctionValue, args: list[V.Value],
                       kwargs: dict[str, V.Value]) -> V.Value:
    """As torch's decorator does: ``with <a fresh manager>: return func(*args, **kwargs)``.  A break
    inside leaves the block to the caller's frame, which exits its open blocks (interpreter.run)."""
    manager = V.GradModeValue(wrapper.enabled)
    operations.enter_grad_mode(tx, manager)
    tx.active_contexts.append(manager)
    result = call(tx, wrapper.func, args, kwargs)
    operations.exit_grad_mode(tx, manager)
    return result


def _call_object(tx: Any, fn: Any, args: list[V.Value], kwargs: dict[str, V.Value]) -> V.Value:
    session = tx.session
    has_tensor = tensor_ops.contains_tensor(args) or tensor_ops.contains_tensor(list(kwargs.values()))
    if fn in BUILTIN_HANDLERS if _hashable(fn) else False:
        return BUILTIN_HANDLERS[fn](tx, args, kwargs)
    if _hashable(fn) and fn in _COMPILE_STATE_QUERIES:
        return V.ConstantValue(_COMPILE_STATE_QUERIES[fn])
    if fn is torch.is_grad_enabled:  # the traced grad mode (a no_grad()/enable_grad() block may be open)
        return V.ConstantValue(session.grad_enabled)
    if _hashable(fn) and fn in autocast.QUERIES:  # answered from the traced autocast state
        return autocast.answer_query(tx, fn, args, kwargs)
    if _hashable(fn) and fn in _GUARDED_TORCH_QUERIES:
        return _guarded_state_query(tx, fn, args, kwargs)
    if _hashable(fn) and fn in _MODULE_CALL_ENTRIES and args and isinstance(args[0], V.ModuleValue):
        # super().__call__(...) from a module's own __call__
        return modules.call_module_impl(tx, args[0], list(args[1:]), kwargs)
    if fn in (torch.is_floating_point, torch.is_complex) and len(args) == 1 and isinstance(args[0], V.TensorValue):
        return tensor_ops.call_tensor_method(session, fn.__name__, args[0], [], {})  # from the dtype
    if fn is torch.is_tensor and len(args) == 1:
        return V.ConstantValue(isinstance(args[0], V.TensorValue))
    if _hashable(fn) and fn in _TORCH_CHECKS:
        return _torch_check(tx, fn, args, kwargs)
    if _hashable(fn) and fn in _TORCH_FUNCTION_QUERIES:
        return _torch_function_query(tx, fn, args)
    if _hashable(fn) and fn in _PURE_LIBRARY_QUERIES:
        return builtins.call_pure_query(tx, fn, args, kwargs)
    if fn is warnings.warn or _hashable(fn) and fn in _LOG_FUNCTIONS | _LOGGER_METHODS:
        return _replay_after_graph(tx, fn, args, kwargs)
    if isinstance(fn, types.MethodType) and fn.__func__ in _LOGGER_METHODS:  # a logger from getLogger()
        return _replay_after_graph(tx, fn.__func__, [V.ObjectValue(fn.__self__)] + args, kwargs)
    if fn is logging.getLogger and all(a.is_python_constant() for a in args + list(kwargs.values())):
        # one Logger per name for the life of the process: the same object in every call
        return V.ObjectValue(call_builtin_pure_object(tx, fn, args, kwargs))
    if fn is torch.manual_seed:
        return _manual_seed(tx, args, kwargs)
    if fn is _ENVIRON_GET and args and isinstance(args[0], V.UserObjectValue) and args[0].obj is os.environ \
            and args[0].source is not None:
        return _environ_get(tx, args, kwargs)
    if fn is print:
        raise tx.unsupported("print() inside a compiled function", "print outside, or use EMBER_LOGS")
    if isinstance(fn, type):
        return _call_class(tx, fn, args, kwargs)
    if isinstance(fn, functools.partial):
        merged = {**{k: session.wrap(v, None) for k, v in fn.keywords.items()}, **kwargs}
        return call(tx, session.wrap(fn.func, None), [session.wrap(a, None) for a in fn.args] + args, merged)
    if _hashable(fn) and fn in _INLINED_TORCH_FUNCTIONS:
        return inline_real_function(tx, fn, args, kwargs)
    if _is_torch_op(fn):
        if fn in _UNSAFE_TORCH or _changes_torch_state(fn):
            raise tx.unsupported(f"{getattr(fn, '__name__', fn)} changes global torch state")
        name = getattr(fn, "__name__", "")
        if has_tensor or name in tensor_ops.FACTORY_NAMES:
            if isinstance(fn, (types.MethodDescriptorType, types.WrapperDescriptorType)) or \
                    getattr(torch.Tensor, name, None) is fn:
                self_value, *rest = args
                if isinstance(self_value, V.TensorValue):
                    return tensor_ops.call_tensor_method(session, name, self_value, rest, kwargs)
            return tensor_ops.record_call(session, fn, args, kwargs)
        return call_builtin_pure(tx, fn, args, kwargs)
    if getattr(fn, "__self__", None) is math or getattr(fn, "__module__", None) == "math":
        return call_builtin_pure(tx, fn, args, kwargs)
    if getattr(fn, "__self__", None) is operator or getattr(fn, "__module__", None) in ("_operator", "operator"):
        if has_tensor:
            return tensor_ops.record_call(session, fn, args, kwargs)
        return builtins.operator_on_values(tx, fn, args, kwargs)
    function_class = _autograd_function_class(fn, args)
    if function_class is not None:
        raise tx.unsupported(f"custom torch.autograd.Function {function_class.__qualname__}.apply",
                             "ember does not trace autograd.Function yet: the call runs eagerly, with its own "
                             "backward, between two compiled graphs")
    if isinstance(fn, types.FunctionType):
        return inline_real_function(tx, fn, args, kwargs)
    if isinstance(fn, types.MethodType) and isinstance(fn.__func__, types.FunctionType):
        return inline_real_function(tx, fn.__func__, [session.wrap(fn.__self__, None)] + args, kwargs)
    if isinstance(fn, (types.MethodDescriptorType, types.WrapperDescriptorType)):
        result = builtins.call_base_method(tx, fn, args, kwargs)
        if result is not None:
            return result
    memoized = fn.__func__ if isinstance(fn, types.MethodType) else fn
    if isinstance(memoized, functools._lru_cache_wrapper):
        result = _call_memoized(tx, fn, args, kwargs)
        if result is not None:
            return result
    raise tx.unsupported(f"call to unknown C function {getattr(fn, '__qualname__', repr(fn))}",
                         "capture only understands torch ops, builtins and Python code")


def _call_memoized(tx: Any, fn: Any, args: list[V.Value], kwargs: dict[str, V.Value]) -> V.Value | None:
    """A functools.lru_cache(None) / functools.cache function (or method, as Hugging Face's
    ``logger.warning_once``) called with Python constants, or any lru_cache function of no
    arguments (torch.fx's tracing-warning helper): its value for those arguments is fixed after
    the first call, and eager runs its body at most once for them too, so run it now and keep a
    constant result.  None where a bounded cache could evict the entry, or the arguments or the
    result are not constants (the caller breaks the graph)."""
    def python(value: V.Value) -> Any:     # an object (the logger of a bound method) as itself
        return value.obj if isinstance(value, V.ObjectValue) else value.as_python()
    maxsize = getattr(fn, "__func__", fn).cache_parameters().get("maxsize")
    if maxsize is not None and (maxsize < 1 or args or kwargs or isinstance(fn, types.MethodType)):
        # a bounded cache runs the body again after an eviction (eager's side effects again); a
        # function of no arguments has one entry, which nothing evicts
        return None
    try:
        python_args = [python(a) for a in args]
        python_kwargs = {k: python(v) for k, v in kwargs.items()}
        hash((tuple(python_args), tuple(python_kwargs.items())))
    except (Unsupported, TypeError):
        return None
    try:
        result = fn(*python_args, **python_kwargs)
    except Exception:  # noqa: BLE001 - eager raises it at this call: run the frame eagerly
        return None
    if result is None or type(result) in (bool, int, float, str):
        return V.ConstantValue(result)
    return None


_STATE_CHANGING_NAMES = {"autocast_increment_nesting", "autocast_decrement_nesting", "clear_autocast_cache",
                         "manual_seed", "seed", "use_deterministic_algorithms"}


def _changes_torch_state(fn: Any) -> bool:
    """torch.set_autocast_enabled, torch.set_default_device, torch._C._set_grad_enabled ...: run at
    capture they would change the state once, not on every call, so the frame runs eagerly."""
    name = getattr(fn, "__name__", "") or ""
    return name.startswith(("set_", "_set_")) or name in _STATE_CHANGING_NAMES


def _torch_function_query(tx: Any, fn: Any, args: list[V.Value]) -> V.Value:
    """``has_torch_function(args)`` and its unary/variadic forms: False for plain tensors and
    Parameters (tensor subclasses are refused as inputs) when no TorchFunctionMode is active.
    An active mode makes eager take the override path: not captured."""
    values = operations.unpack(tx, args[0]) if fn is torch._C._has_torch_function else list(args)
    for value in values:
        if isinstance(value, V.TensorValue):
            if value.python_cls not in (torch.Tensor, torch.nn.Parameter):
                raise tx.unsupported(f"has_torch_function on a {value.python_cls.__name__}")
        elif isinstance(value, V.ObjectValue):
            if getattr(type(value.obj), "__torch_function__", torch._C._disabled_torch_function_impl) \
                    is not torch._C._disabled_torch_function_impl:
                raise tx.unsupported(f"has_torch_function on {value.describe()}")
        elif not isinstance(value, (V.ConstantValue, V.TupleValue, V.ListValue, V.DictValue)):
            raise tx.unsupported(f"has_torch_function on {value.describe()}")
    mode_enabled = torch._C._is_torch_function_mode_enabled
    if mode_enabled():
        raise tx.unsupported("a TorchFunctionMode is active")
    tx.session.guards.add(None, "not {mode_enabled}()", mode_enabled=mode_enabled)
    return V.ConstantValue(False)


def call_builtin_pure_object(tx: Any, fn: Any, args: list[V.Value], kwargs: dict[str, V.Value]) -> Any:
    python_args, python_kwargs = constants(tx, args, kwargs, getattr(fn, "__name__", "call"))
    return fn(*python_args, **python_kwargs)


def _replay_after_graph(tx: Any, fn: Any, args: list[V.Value], kwargs: dict[str, V.Value]) -> V.Value:
    """warnings.warn / logging calls: the graph holds no Python effects, so the epilogue makes
    the same call, with the same arguments, after the graph (in program order among them)."""
    session = tx.session
    name = getattr(fn, "__qualname__", repr(fn))
    if not hasattr(session, "replayed_calls"):
        raise tx.unsupported(f"{name}() inside a compiled function")
    for value in list(args) + list(kwargs.values()):
        if isinstance(value, V.TensorValue) or not (value.is_python_constant() or isinstance(value, V.ObjectValue)):
            raise tx.unsupported(f"{name}() of {value.describe()}", "log Python values (shapes), not tensors")
    if fn is warnings.warn:
        _guard_warnings_not_errors(tx)
        # the epilogue's own line is the warning's location; stacklevel would point into ember
        kwargs = {k: v for k, v in kwargs.items() if k == "category"}
        args = args[:2]
    session.replayed_calls.append((fn, list(args), dict(kwargs)))
    return V.NONE


def _guard_warnings_not_errors(tx: Any) -> None:
    """A warning turned into an exception (simplefilter('error')) would be raised after the graph
    instead of where eager raises it: not captured; the filters are guarded."""
    filters = list(warnings.filters)
    if any(entry[0] == "error" for entry in filters):
        raise tx.unsupported("warnings.warn() while a warnings filter turns warnings into errors")
    tx.session.guards.add(None, "{module}.filters == {filters}", module=warnings, filters=filters)


def _manual_seed(tx: Any, args: list[V.Value], kwargs: dict[str, V.Value]) -> V.Value:
    """torch.manual_seed(n): replayed after the graph.  The graph's own random ops draw from the
    generator before that (as eager's ops before the call do); a random op after it would need
    the new seed inside the graph, so it breaks there instead (tensor_ops)."""
    seed = (args[0] if args else kwargs["seed"])
    if not seed.is_python_constant():
        raise tx.unsupported("torch.manual_seed of a value computed in the graph")
    if not hasattr(tx.session, "replayed_calls"):
        raise tx.unsupported("torch.manual_seed() inside a compiled function")
    tx.session.replayed_calls.append((torch.manual_seed, [seed], {}))
    tx.session.seeded_in_graph = True
    # eager returns the default generator
    return V.ObjectValue(torch.default_generator)


def _torch_check(tx: Any, fn: Any, args: list[V.Value], kwargs: dict[str, V.Value]) -> V.Value:
    """Passes when the condition is a true Python value; a false one raises in eager (the frame runs eagerly)."""
    condition = args[1] if fn is getattr(torch, "_check_with", None) else (args[0] if args else kwargs.get("cond"))
    if condition is None or not isinstance(condition, V.ConstantValue) or not isinstance(condition.value, bool):
        raise tx.unsupported(f"{fn.__name__} on {condition.describe() if condition else 'no condition'}")
    if not condition.value:
        raise operations.user_error(tx.session, f"{fn.__name__} fails")
    return V.NONE


def _environ_get(tx: Any, args: list[V.Value], kwargs: dict[str, V.Value]) -> V.Value:
    """``os.environ.get(name, default)`` (library switches): read now, the variable's value guarded."""
    environ, rest = args[0], args[1:]
    python_args, python_kwargs = constants(tx, rest, kwargs, "os.environ.get")
    key = python_args[0]
    found = os.environ.get(key)
    tx.session.guards.add(environ.source, "{v}.get({key}) == {found}", key=key, found=found)
    if found is None:
        return rest[1] if len(rest) > 1 else kwargs.get("default", V.NONE)
    return V.ConstantValue(found)


def _guarded_state_query(tx: Any, fn: Any, args: list[V.Value], kwargs: dict[str, V.Value]) -> V.Value:
    python_args, python_kwargs = constants(tx, args, kwargs, getattr(fn, "__name__", "query"))
    result = fn(*python_args, **python_kwargs)
    tx.session.guards.add(None, "{fn}(*{args}, **{kwargs}) == {result}", fn=fn, args=tuple(python_args),
                          kwargs=python_kwargs, result=result)
    return V.ConstantValue(result)


# the default the generated dataclass __init__ gives a field with a default_factory (a private name:
# without it such fields are not built here, and the __init__ is inlined instead)
_HAS_DEFAULT_FACTORY = getattr(dataclasses, "_HAS_DEFAULT_FACTORY", None)


def _generator_context(tx: Any, args: list[V.Value], kwargs: dict[str, V.Value]) -> V.Value:
    """``_GeneratorContextManager(func, args, kwds)``: the generator made now, driven by with-statements.
    Its frame may hold try/finally around the yield: the with-statement runs it to the end (or the
    frame breaks before), so the handler never has to run at a close."""
    if len(args) != 3 or kwargs or not isinstance(args[2], V.DictValue):
        raise tx.unsupported("contextlib._GeneratorContextManager built by hand")
    func, positional, keywords = args
    session = tx.session
    session.generator_handlers_allowed = True
    try:
        generator = call(tx, func, operations.unpack(tx, positional), dict(keywords.items))
    finally:
        session.generator_handlers_allowed = False
    if not isinstance(generator, V.GeneratorValue):
        raise tx.unsupported(f"@contextmanager function returned {generator.describe()}")
    return objects.GeneratorContextValue(generator)


def _plain_exception_class(cls: type) -> bool:
    """Builtin exceptions and subclasses that add no __init__ or __new__ of their own: making one runs
    no user code."""
    return all(base.__module__ == "builtins" or not ({"__init__", "__new__"} & set(vars(base)))
               for base in cls.__mro__)


def _is_simple_dataclass(cls: type) -> bool:
    """Built as a DataclassValue from its fields: nothing but the generated __init__ runs."""
    fields = dataclasses.fields(cls)
    if _HAS_DEFAULT_FACTORY is None and any(f.default_factory is not dataclasses.MISSING for f in fields):
        return False
    return "__post_init__" not in dir(cls) and all(f.init for f in fields) and \
        cls.__setattr__ is object.__setattr__ and not issubclass(cls, dict) and \
        not any(isinstance(v, (property, functools.cached_property)) for v in vars(cls).values())


def _hashable(value: Any) -> bool:
    try:
        hash(value)
        return True
    except TypeError:
        return False


def _is_torch_op(fn: Any) -> bool:
    """torch.*, torch.nn.functional.*, torch.Tensor methods, torch._C ops; not nn.Module code."""
    if isinstance(fn, (types.MethodDescriptorType, types.WrapperDescriptorType)):
        return getattr(fn, "__objclass__", None) in (torch._C.TensorBase, torch.Tensor)
    module = getattr(fn, "__module__", None) or ""
    if isinstance(fn, types.FunctionType):
        if fn.__qualname__.startswith("Tensor.") and getattr(torch.Tensor, fn.__name__, None) is fn:
            return True
        return module.startswith("torch.nn.functional") or module in ("torch.functional", "torch")
    if isinstance(fn, types.BuiltinFunctionType) or type(fn).__name__ in ("builtin_function_or_method",
                                                                          "OpOverloadPacket"):
        return module.startswith("torch") or getattr(fn, "__self__", None) in (torch._C._nn, torch._C._VariableFunctions,
                                                                              torch._C._special, torch._C._fft,
                                                                              torch._C._linalg)
    return False


def _call_class(tx: Any, cls: type, args: list[V.Value], kwargs: dict[str, V.Value]) -> V.Value:
    if issubclass(cls, BaseException) and _plain_exception_class(cls):
        # an exception to raise (or to keep): made now from constant arguments, as eager makes it
        try:
            return V.ConstantValue(cls(*[a.as_python() for a in args], **{k: v.as_python() for k, v in kwargs.items()}))
        except Unsupported:
            raise tx.unsupported(f"creating {cls.__name__} from values that are not Python constants") from None
    if cls in _GRAD_MODE_CLASSES:
        if cls is torch.set_grad_enabled:
            enabled = args[0].as_python() if args else kwargs["mode"].as_python()
            if enabled != tx.session.grad_enabled:
                raise tx.unsupported("torch.set_grad_enabled(...) outside a with-block")
            return V.GradModeValue(bool(enabled))
        return V.GradModeValue(cls is torch.enable_grad)
    if autocast.is_autocast_class(cls):
        return autocast.make_autocast(tx, cls, args, kwargs)
    if cls in _TORCH_PURE_QUERIES:
        return call_builtin_pure(tx, cls, args, kwargs)
    if cls is functools.partial:
        return objects.make_partial(tx, args, kwargs)
    if cls is contextlib._GeneratorContextManager:  # what @contextlib.contextmanager functions return
        return _generator_context(tx, args, kwargs)
    if issubclass(cls, torch.nn.Module):
        return modules.create_module(tx, cls, args, kwargs)
    if dataclasses.is_dataclass(cls) and not _is_simple_dataclass(cls) or \
            not dataclasses.is_dataclass(cls) and objects.can_instantiate(cls):
        if not objects.can_instantiate(cls):
            raise tx.unsupported(f"creating an instance of {cls.__qualname__} (custom __new__ or C base class)")
        return builtins.instantiate(tx, cls, args, kwargs)
    if dataclasses.is_dataclass(cls):
        init = cls.__init__
        defaults = tuple(tx.session.wrap(d, None) for d in (init.__defaults__ or ()))
        kwdefaults = {k: tx.session.wrap(v, None) for k, v in (init.__kwdefaults__ or {}).items()}
        bound = bind_arguments(init.__code__, cls.__name__, [V.NONE] + args, kwargs, defaults, kwdefaults)
        fields = {}
        for field in dataclasses.fields(cls):
            value = bound[field.name]
            if _HAS_DEFAULT_FACTORY is not None and getattr(value, "obj", None) is _HAS_DEFAULT_FACTORY:
                # not passed: the generated __init__ calls the factory (a fresh list per instance)
                value = call(tx, tx.session.wrap(field.default_factory, None), [], {})
            fields[field.name] = value
        return V.DataclassValue(cls, fields)
    if issubclass(cls, tuple) and hasattr(cls, "_fields"):
        new = cls.__new__
        defaults = tuple(tx.session.wrap(d, None) for d in (new.__defaults__ or ()))
        bound = bind_arguments(new.__code__, cls.__name__, [V.NONE] + args, kwargs, defaults, {})
        return V.TupleValue([bound[f] for f in cls._fields], None, cls)
    if isinstance(cls, enum.EnumMeta):  # MyEnum(value): a lookup among constant members
        return call_builtin_pure(tx, cls, args, kwargs)
    if issubclass(cls, BaseException):
        raise tx.unsupported(f"creating exception {cls.__name__}")
    raise tx.unsupported(f"creating an instance of {cls.__qualname__}")
