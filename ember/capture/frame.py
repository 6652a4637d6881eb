"""The root frame: how a call of the compiled object becomes locals ``L`` and a capture.

``FrameSpec`` describes what was compiled (a function, a bound method or an
nn.Module) and generates a *binder*: a function with the same signature as the
user's, returning ``locals()``, so that argument binding costs one native call.
``capture_frame`` runs the interpreter over the root and returns the session.
"""
from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

import torch

from ..errors import Unsupported
from . import values as V
from .interpreter import CO_VARARGS, CO_VARKEYWORDS, InstructionTranslator
from .modules import call_module
from .session import CaptureSession
from .sources import LocalSource
from .values import RealCell


class FrameSpec:
    def __init__(self, fn: Any) -> None:
        self.module: torch.nn.Module | None = None
        self.bound_self: Any = None
        if isinstance(fn, torch.nn.Module):
            self.module = fn
            forward = type(fn).forward
            if not isinstance(forward, types.FunctionType):
                raise TypeError(f"{type(fn).__name__}.forward is not a Python function")
            self.function = forward
            self.bound_self = fn
        elif isinstance(fn, types.MethodType):
            self.function = fn.__func__
            self.bound_self = fn.__self__
        elif isinstance(fn, types.FunctionType):
            self.function = fn
        elif callable(fn) and isinstance(getattr(type(fn), "__call__", None), types.FunctionType):
            self.function = type(fn).__call__
            self.bound_self = fn
        elif callable(fn):
            self.function = _calling(fn)   # a builtin (torch.pow, F.gelu): captured as one call of it
        else:
            raise TypeError(f"ember cannot compile {fn!r}: not a Python function, method or nn.Module")
        if not isinstance(self.function, types.FunctionType):
            raise TypeError(f"ember cannot compile {fn!r}")
        self.target = fn
        self.code: types.CodeType = self.function.__code__
        self.globals: dict = self.function.__globals__
        # a bound self of a function with no named positional parameters lands in its *args
        # (transformers 5.24 wraps every model's forward in ``def wrapped_func(*args, **kwargs)``)
        self.self_in_varargs = (self.bound_self is not None and self.code.co_argcount == 0
                                and bool(self.code.co_flags & CO_VARARGS))
        named_self = self.bound_self is not None and not self.self_in_varargs
        self.self_name = self.code.co_varnames[0] if named_self else None
        self.binder = self._make_binder()

    @property
    def name(self) -> str:
        if self.module is not None:
            return f"{type(self.module).__name__}.forward"
        return self.function.__qualname__

    def _make_binder(self) -> Callable[..., dict]:
        """``def bind(<the user's parameters>): return locals()`` with the user's defaults."""
        code = self.code
        names = list(code.co_varnames)
        n_positional = code.co_argcount
        positional = names[:n_positional]
        kwonly = names[n_positional:n_positional + code.co_kwonlyargcount]
        index = n_positional + code.co_kwonlyargcount
        varargs = varkw = None
        if code.co_flags & CO_VARARGS:
            varargs = names[index]
            index += 1
        if code.co_flags & CO_VARKEYWORDS:
            varkw = names[index]
        parts = list(positional)
        if code.co_posonlyargcount:
            parts.insert(code.co_posonlyargcount, "/")
        if varargs:
            parts.append("*" + varargs)
        elif kwonly:
            parts.append("*")
        parts += kwonly
        if varkw:
            parts.append("**" + varkw)
        if self.self_name is not None:
            parts.pop(0)
            if parts and parts[0] == "/":
                parts.pop(0)
        source = f"def bind({', '.join(parts)}):\n    return locals()\n"
        namespace: dict[str, Any] = {}
        exec(compile(source, f"<ember binder for {self.name}>", "exec"), namespace)
        binder = namespace["bind"]
        binder.__defaults__ = self.function.__defaults__
        binder.__kwdefaults__ = self.function.__kwdefaults__
        return binder

    def bind(self, args: tuple, kwargs: dict) -> dict[str, Any]:
        if self.self_in_varargs:
            return self.binder(self.bound_self, *args, **kwargs)
        L = self.binder(*args, **kwargs)
        if self.self_name is not None:
            L[self.self_name] = self.bound_self
        return L

    def call_eagerly(self, args: tuple, kwargs: dict) -> Any:
        return self.target(*args, **kwargs)


def _calling(fn: Any) -> types.FunctionType:
    """A Python function that calls ``fn`` (a builtin or C callable), for capture to start from."""
    def call(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)
    call.__qualname__ = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__
    return call


class RootContext:
    """Stands in for a translator when the root is a module call (no bytecode of our own yet): the
    same ``call`` / ``inline_code`` way back up for the modules below calls.py."""

    depth = -1
    cells: dict = {}
    active_contexts: list = []

    def __init__(self, session: CaptureSession, code: types.CodeType) -> None:
        self.session = session
        self.code = code

    def unsupported(self, reason: str, hint: str = "") -> Unsupported:
        return Unsupported(reason, self.session.current_line(), hint)

    # the same ways back up to the dispatcher as a translator's (they use only .session and .depth)
    call = InstructionTranslator.call
    inline_code = InstructionTranslator.inline_code


def capture_frame(spec: FrameSpec, L: dict[str, Any], session: CaptureSession) -> V.Value:
    """Interpret the root with the real argument values; returns the result Value."""
    local_values = {name: session.wrap(value, LocalSource(name)) for name, value in L.items()}
    if spec.module is None or not (spec.module._forward_pre_hooks or spec.module._forward_hooks):
        session.root_code = spec.code  # a graph break can resume this frame (hooks would run after it)
    if spec.module is not None:
        args, kwargs = _module_call_arguments(spec.code, local_values)
        module, args = args[0], args[1:]       # the forward's self: named, or the first of its *args
        root = RootContext(session, spec.code)
        return call_module(root, module, args, kwargs)
    cells = {name: RealCell(cell, name)
             for name, cell in zip(spec.code.co_freevars, spec.function.__closure__ or ())}
    translator = InstructionTranslator(session, spec.code, spec.globals, local_values, cells,
                                       function_name=spec.name)
    # a continuation entered inside `with no_grad():` gets that block's __exit__ as an argument
    translator.active_contexts = [v.manager for v in local_values.values() if isinstance(v, V.ContextExitValue)]
    return translator.run()


def _module_call_arguments(code: types.CodeType, local_values: dict[str, V.Value]) -> tuple[list, dict]:
    """Turn the bound forward() locals back into call arguments, self first (hooks see them as
    args/kwargs)."""
    names = code.co_varnames
    n_positional = code.co_argcount
    args: list[V.Value] = [local_values[n] for n in names[:n_positional]]
    kwargs: dict[str, V.Value] = {n: local_values[n] for n in names[n_positional:n_positional + code.co_kwonlyargcount]}
    index = n_positional + code.co_kwonlyargcount
    if code.co_flags & CO_VARARGS:
        args += list(local_values[names[index]].items)
        index += 1
    if code.co_flags & CO_VARKEYWORDS:
        kwargs.update(local_values[names[index]].items)
    return args, kwargs
