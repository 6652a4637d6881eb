"""Inlining a Python function call: bind arguments, set up cells, run its bytecode."""
from __future__ import annotations

import types
from typing import Any

import torch

from ..errors import Unsupported
from . import values as V

CO_VARARGS = 0x04
CO_VARKEYWORDS = 0x08


def bind_arguments(code: types.CodeType, name: str, args: list[V.Value], kwargs: dict[str, V.Value],
                   defaults: tuple, kwdefaults: dict) -> dict[str, V.Value]:
    """Python's argument binding, over Values (defaults are already Values)."""
    n_positional = code.co_argcount
    n_posonly = code.co_posonlyargcount
    n_kwonly = code.co_kwonlyargcount
    names = code.co_varnames
    positional_names = names[:n_positional]
    kwonly_names = names[n_positional:n_positional + n_kwonly]
    index = n_positional + n_kwonly
    varargs_name = varkw_name = None
    if code.co_flags & CO_VARARGS:
        varargs_name = names[index]
        index += 1
    if code.co_flags & CO_VARKEYWORDS:
        varkw_name = names[index]

    bound: dict[str, V.Value] = {}
    for param, value in zip(positional_names, args):
        bound[param] = value
    extra = list(args[n_positional:])
    if extra and varargs_name is None:
        raise Unsupported(f"{name}() takes {n_positional} positional arguments but {len(args)} were given")
    if varargs_name is not None:
        bound[varargs_name] = V.TupleValue(extra)
    extra_kwargs: dict[str, V.Value] = {}
    for key, value in kwargs.items():
        if key in kwonly_names or (key in positional_names[n_posonly:]):
            if key in bound:
                raise Unsupported(f"{name}() got multiple values for argument {key!r}")
            bound[key] = value
        elif varkw_name is not None:
            extra_kwargs[key] = value
        else:
            raise Unsupported(f"{name}() got an unexpected keyword argument {key!r}")
    if varkw_name is not None:
        bound[varkw_name] = V.DictValue(extra_kwargs)
    first_default = n_positional - len(defaults)
    for i, param in enumerate(positional_names):
        if param not in bound:
            if i < first_default:
                raise Unsupported(f"{name}() missing required argument {param!r}")
            bound[param] = defaults[i - first_default]
    for param in kwonly_names:
        if param not in bound:
            if param not in kwdefaults:
                raise Unsupported(f"{name}() missing keyword-only argument {param!r}")
            bound[param] = kwdefaults[param]
    return bound


def inline_real_function(tx: Any, fn: types.FunctionType, args: list[V.Value], kwargs: dict[str, V.Value],
                         fn_value: V.Value | None = None) -> V.Value:
    """Inline a function object that exists outside the trace (guarded by identity)."""
    session = tx.session
    defaults = tuple(session.wrap(d, None) if not _needs_guard(d) else _unsupported_default(fn)
                     for d in (fn.__defaults__ or ()))
    kwdefaults = {k: session.wrap(v, None) if not _needs_guard(v) else _unsupported_default(fn)
                  for k, v in (fn.__kwdefaults__ or {}).items()}
    cells: dict[str, Any] = {}
    for var_name, cell in zip(fn.__code__.co_freevars, fn.__closure__ or ()):
        cells[var_name] = V.RealCell(cell, var_name)
    return run_code(tx, fn.__code__, fn.__globals__, args, kwargs, defaults, kwdefaults, cells, fn.__qualname__)


def inline_function_value(tx: Any, fn: V.FunctionValue, args: list[V.Value], kwargs: dict[str, V.Value]) -> V.Value:
    """Inline a function created inside the trace (lambda, closure, 3.11 comprehension)."""
    cells = dict(zip(fn.code.co_freevars, fn.closure))
    return run_code(tx, fn.code, fn.globals, args, kwargs, fn.defaults, fn.kwdefaults, cells, fn.name)


def run_code(tx: Any, code: types.CodeType, globals_dict: dict, args: list[V.Value], kwargs: dict[str, V.Value],
             defaults: tuple, kwdefaults: dict, cells: dict[str, Any], name: str) -> V.Value:
    local_values = bind_arguments(code, name, args, kwargs, defaults, kwdefaults)
    return tx.inline_code(code, globals_dict, local_values, cells, name)  # the translator runs it one level down


def _needs_guard(value: Any) -> bool:
    return isinstance(value, (torch.Tensor, torch.nn.Module, list, dict))


def _unsupported_default(fn: Any) -> V.Value:
    raise Unsupported(f"mutable or tensor default argument of {fn.__qualname__}")
