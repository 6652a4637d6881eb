"""Calling a Value: inline Python code, record torch ops, fold pure Python calls.

Dispatch, in order: functions created in the trace and user Python functions
are inlined; ``torch.*`` / ``torch.nn.functional.*`` / ``torch.Tensor`` methods
and operators on tensors are recorded; builtins are evaluated symbolically
(``builtins.py``); nn.Modules go through ``modules.py``; dataclasses and
namedtuples are built as Values; anything else is Unsupported.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import operator
import types
from typing import Any

import torch

from . import tensor_ops
from . import values as V
from .inline import inline_function_value, inline_real_function

# torch functions that only read global state: evaluated now (their state is guarded or constant)
_TORCH_PURE_QUERIES = {torch.is_grad_enabled, torch.is_tensor, torch.is_floating_point, torch.get_default_dtype,
                       torch.is_complex, torch.finfo, torch.iinfo, torch.Size, torch.device,
                       torch.promote_types, torch.result_type, torch.can_cast}
_GRAD_MODE_CLASSES = (torch.no_grad, torch.enable_grad, torch.set_grad_enabled)
_UNSAFE_TORCH = {torch.manual_seed, torch.seed, torch.set_default_dtype, torch.set_grad_enabled,
                 torch.use_deterministic_algorithms}


def call(tx: Any, callee: V.Value, args: list[V.Value], kwargs: dict[str, V.Value]) -> V.Value:
    session = tx.session
    if isinstance(callee, V.FunctionValue):
        return inline_function_value(tx, callee, args, kwargs)
    if isinstance(callee, V.BoundMethodValue):
        return call(tx, callee.func, [callee.self_value] + args, kwargs)
    if isinstance(callee, V.TensorMethodValue):
        return tensor_ops.call_tensor_method(session, callee.name, callee.self_value, args, kwargs)
    if isinstance(callee, V.ContainerMethodValue):
        from .builtins import call_container_method
        return call_container_method(tx, callee.self_value, callee.name, args, kwargs)
    if isinstance(callee, V.ContextExitValue):
        from .operations import exit_grad_mode
        exit_grad_mode(tx, callee.manager)
        return V.NONE
    if isinstance(callee, V.ModuleValue):
        from .modules import call_module
        return call_module(tx, callee, args, kwargs)
    if isinstance(callee, V.UserObjectValue):
        call_method = getattr(type(callee.obj), "__call__", None)
        if isinstance(call_method, types.FunctionType):
            return inline_real_function(tx, call_method, [callee] + args, kwargs)
        raise tx.unsupported(f"calling {callee.describe()}")
    if isinstance(callee, V.ObjectValue):
        return _call_object(tx, callee.obj, args, kwargs)
    raise tx.unsupported(f"calling {callee.describe()}")


def _call_object(tx: Any, fn: Any, args: list[V.Value], kwargs: dict[str, V.Value]) -> V.Value:
    session = tx.session
    has_tensor = tensor_ops.contains_tensor(args) or tensor_ops.contains_tensor(list(kwargs.values()))
    from .builtins import BUILTIN_HANDLERS, call_builtin_pure
    if fn in BUILTIN_HANDLERS if _hashable(fn) else False:
        return BUILTIN_HANDLERS[fn](tx, args, kwargs)
    if fn is print:
        raise tx.unsupported("print() inside a compiled function", "print outside, or use EMBER_LOGS")
    if isinstance(fn, type):
        return _call_class(tx, fn, args, kwargs)
    if isinstance(fn, functools.partial):
        merged = {**{k: session.wrap(v, None) for k, v in fn.keywords.items()}, **kwargs}
        return call(tx, session.wrap(fn.func, None), [session.wrap(a, None) for a in fn.args] + args, merged)
    if _is_torch_op(fn):
        if fn in _UNSAFE_TORCH:
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
        from .builtins import operator_on_values
        return operator_on_values(tx, fn, args, kwargs)
    if isinstance(fn, types.FunctionType):
        return inline_real_function(tx, fn, args, kwargs)
    if isinstance(fn, types.MethodType) and isinstance(fn.__func__, types.FunctionType):
        return inline_real_function(tx, fn.__func__, [session.wrap(fn.__self__, None)] + args, kwargs)
    raise tx.unsupported(f"call to unknown C function {getattr(fn, '__qualname__', repr(fn))}",
                         "capture only understands torch ops, builtins and Python code")


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
    from .builtins import call_builtin_pure
    if cls in _GRAD_MODE_CLASSES:
        if cls is torch.set_grad_enabled:
            enabled = args[0].as_python() if args else kwargs["mode"].as_python()
            if enabled != tx.session.grad_enabled:
                raise tx.unsupported("torch.set_grad_enabled(...) outside a with-block")
            return V.GradModeValue(bool(enabled))
        return V.GradModeValue(cls is torch.enable_grad)
    if cls is torch.autocast or (isinstance(cls, type) and issubclass(cls, torch.autocast)):
        raise tx.unsupported("torch.autocast inside a compiled function", "compile inside the autocast region")
    if cls in _TORCH_PURE_QUERIES:
        return call_builtin_pure(tx, cls, args, kwargs)
    if dataclasses.is_dataclass(cls):
        if "__post_init__" in dir(cls) or any(not f.init for f in dataclasses.fields(cls)):
            raise tx.unsupported(f"dataclass {cls.__name__} with __post_init__ or init=False fields")
        from .inline import bind_arguments
        init = cls.__init__
        defaults = tuple(tx.session.wrap(d, None) for d in (init.__defaults__ or ()))
        kwdefaults = {k: tx.session.wrap(v, None) for k, v in (init.__kwdefaults__ or {}).items()}
        bound = bind_arguments(init.__code__, cls.__name__, [V.NONE] + args, kwargs, defaults, kwdefaults)
        fields = {f.name: bound[f.name] for f in dataclasses.fields(cls)}
        return V.DataclassValue(cls, fields)
    if issubclass(cls, tuple) and hasattr(cls, "_fields"):
        from .inline import bind_arguments
        new = cls.__new__
        defaults = tuple(tx.session.wrap(d, None) for d in (new.__defaults__ or ()))
        bound = bind_arguments(new.__code__, cls.__name__, [V.NONE] + args, kwargs, defaults, {})
        return V.TupleValue([bound[f] for f in cls._fields], None, cls)
    if issubclass(cls, torch.nn.Module):
        raise tx.unsupported(f"creating module {cls.__name__} inside a compiled function")
    if issubclass(cls, BaseException):
        raise tx.unsupported(f"creating exception {cls.__name__}")
    raise tx.unsupported(f"creating an instance of {cls.__qualname__}")
