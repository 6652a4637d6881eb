"""nn.Module semantics: attribute lookup, containers and ``Module.__call__``.

A module is guarded by identity and ``.training`` when first wrapped.  Its
parameters and buffers become placeholders through their sources
(``L['self'].fc.weight``); submodules are ModuleValues; Python attributes are
guarded by value.  Calling a module runs the forward pre-hooks, inlines
``forward`` and runs the forward hooks, as ``Module.__call__`` does; the hook
dicts are guarded so that adding a hook later recompiles.
"""
from __future__ import annotations

import inspect
import types
from typing import Any

import torch
from torch import nn

from ..errors import Unsupported
from . import values as V
from .sources import AttrSource, ItemSource, ModuleStoreSource, ModuleValuesSource

_module_module = inspect.getmodule(nn.Module)
_GLOBAL_HOOK_NAMES = ("_global_forward_pre_hooks", "_global_forward_hooks", "_global_backward_hooks",
                      "_global_backward_pre_hooks")


def module_get_attr(tx: Any, value: V.ModuleValue, name: str) -> V.Value:
    session = tx.session
    module = value.obj
    pending = session.pending_attr(value, name)
    if pending is not None:
        return pending
    if name == "training":  # guarded when the module was wrapped
        return V.ConstantValue(module.training)
    try:
        static = inspect.getattr_static(type(module), name)
        has_static = True
    except AttributeError:
        static, has_static = None, False
    instance_dict = module.__dict__
    # Python's order: data descriptors of the class, the instance dict, other class
    # attributes, and only then ``Module.__getattr__`` (parameters, buffers, submodules)
    if isinstance(static, property):
        return tx.call(V.ObjectValue(static.fget), [value], {})
    if has_static and _is_data_descriptor(static):
        return _wrap_attr(tx, value, name, getattr(module, name))
    if name in instance_dict:
        return _wrap_attr(tx, value, name, instance_dict[name])
    if isinstance(static, types.FunctionType):
        return V.BoundMethodValue(V.ObjectValue(static), value)
    if isinstance(static, staticmethod):
        return V.ObjectValue(static.__func__)
    if isinstance(static, classmethod):
        return V.BoundMethodValue(V.ObjectValue(static.__func__), V.ObjectValue(type(module)))
    if has_static:
        return _wrap_attr(tx, value, name, getattr(module, name))
    if not plain_getattr(type(module)):
        # the class's own __getattr__/__getattribute__ decides (the guard calls it too)
        try:
            attr = getattr(module, name)
        except AttributeError:
            raise tx.unsupported(f"{type(module).__name__} has no attribute {name!r}") from None
        return _wrap_attr(tx, value, name, attr)
    for store in _STORES:
        if name in instance_dict.get(store, {}):
            return _wrap_attr(tx, value, name, instance_dict[store][name], store)
    raise tx.unsupported(f"{type(module).__name__} has no attribute {name!r}")


_STORES = ("_parameters", "_buffers", "_modules")  # the order of nn.Module.__getattr__


def _is_data_descriptor(static: Any) -> bool:
    return hasattr(type(static), "__set__") or hasattr(type(static), "__delete__")


def plain_getattr(cls: type) -> bool:
    """Attribute reads of ``cls`` instances end in ``nn.Module.__getattr__`` unchanged."""
    return getattr(cls, "__getattr__", None) is _MODULE_GETATTR and cls.__getattribute__ is _OBJECT_GETATTRIBUTE


_MODULE_GETATTR = nn.Module.__getattr__
_OBJECT_GETATTRIBUTE = object.__getattribute__


_CONTAINERS = (nn.ModuleList, nn.ModuleDict, nn.Sequential, nn.ParameterList, nn.ParameterDict)


def create_module(tx: Any, cls: type, args: list[V.Value], kwargs: dict[str, V.Value]) -> V.Value:
    """``nn.CrossEntropyLoss(ignore_index=-100)`` inside the frame: a torch.nn module without
    parameters or buffers, from Python constants, is made now (its constructor only stores them)
    and called like any module.  Anything else (a user's module class, whose constructor may do
    anything; parameters, which eager initializes randomly at every call; tensor arguments) breaks
    the graph."""
    what = f"creating module {cls.__name__} inside a compiled function"
    if not (cls.__module__ or "").startswith("torch.nn.modules.") or issubclass(cls, _CONTAINERS):
        raise tx.unsupported(what)
    try:
        python_args = [a.as_python() for a in args]
        python_kwargs = {k: v.as_python() for k, v in kwargs.items()}
    except Unsupported:
        raise tx.unsupported(f"{what}, from values that are not Python constants") from None
    if any(isinstance(v, torch.Tensor) for v in (*python_args, *python_kwargs.values())):
        raise tx.unsupported(f"{what}, from tensors")
    try:
        module = cls(*python_args, **python_kwargs)
    except Exception as error:  # noqa: BLE001 - eager raises it at this line: run the frame eagerly
        raise tx.unsupported(f"{what}: {type(error).__name__}: {error}") from None
    if any(True for _ in module.parameters()) or any(b is not None for b in module.buffers()) or \
            any(True for _ in module.children()):
        raise tx.unsupported(f"{what} (it has parameters, buffers or submodules)")
    tx.session._keepalive.append(module)
    return V.FreshModuleValue(module, python_args, python_kwargs)


def _wrap_attr(tx: Any, value: V.ModuleValue, name: str, attr: Any, store: str | None = None) -> V.Value:
    """Wrap ``module.name``.  Found in a store (``_parameters``...) of a module whose class reads
    attributes the standard way, the source reads that dict directly: the module's exact class is
    guarded (``wrap``), the class defines no ``name`` (checked above) and ``nn.Module`` keeps a name
    in one place only (``__setattr__``/``register_*`` move it), so ``module._parameters['w']`` is
    ``module.w`` -- and raises (the guard fails) when ``w`` has moved elsewhere."""
    if isinstance(value, V.FreshModuleValue):      # made by the frame from constants: constants
        return tx.session.wrap(attr, None)
    if value.source is None:
        raise tx.unsupported("attribute of a module without a source")
    if store is not None and plain_getattr(type(value.obj)):
        source = ModuleStoreSource(value.source, store, name)
        # what Python would find before ``__getattr__`` reaches this store: an instance attribute
        # (``object.__setattr__``, ``__dict__`` writes) or the name in an earlier store
        literal = repr(name).replace("{", "{{").replace("}", "}}")
        checks = [f"{literal} not in {{v}}"] + [f"{literal} not in {{v}}[{s!r}]" for s in _STORES[:_STORES.index(store)]]
        tx.session.guards.add(source.parent, " and ".join(checks))
    else:
        source = AttrSource(value.source, name)
    return tx.session.wrap(attr, source)


def fast_container(module: Any) -> type | None:
    """The container base (ModuleList, Sequential, ModuleDict) whose ``__len__``/``__getitem__``/
    ``__iter__`` this module uses unchanged, so guards may read its ``_modules`` directly."""
    cls = type(module)
    for base in (nn.ModuleList, nn.Sequential, nn.ModuleDict):
        if isinstance(module, base):
            if plain_getattr(cls) and all(getattr(cls, m) is getattr(base, m)
                                          for m in ("__getitem__", "__len__", "__iter__")):
                return base
            return None
    return None


def _guard_length(tx: Any, value: V.ModuleValue) -> int:
    length = len(value.obj)
    if fast_container(value.obj) is not None:  # their __len__ is len(self._modules)
        tx.session.guards.add(value.source, "len({v}._modules) == {n}", n=length)
    else:
        tx.session.guards.add(value.source, "len({v}) == {n}", n=length)
    return length


def module_len(tx: Any, value: V.ModuleValue) -> int:
    if not hasattr(type(value.obj), "__len__"):
        raise tx.unsupported(f"len() of {type(value.obj).__name__}")
    return _guard_length(tx, value)


def module_iter(tx: Any, value: V.ModuleValue) -> list[V.Value]:
    module = value.obj
    if isinstance(module, (nn.ModuleList, nn.Sequential, nn.ParameterList)):
        length = _guard_length(tx, value)
        if fast_container(module) is not None and value.source is not None:
            # both iterate ``self._modules.values()``: by position, whatever the keys
            children = ModuleValuesSource(value.source)
            return [tx.session.wrap(child, ItemSource(children, i))
                    for i, child in enumerate(module._modules.values())]
        return [module_get_item(tx, value, i) for i in range(length)]
    if isinstance(module, (nn.ModuleDict, nn.ParameterDict)):
        if fast_container(module) is not None:
            tx.session.guards.add(value.source, "list({v}._modules) == {keys}", keys=list(module.keys()))
        else:
            tx.session.guards.add(value.source, "list({v}.keys()) == {keys}", keys=list(module.keys()))
        return [V.ConstantValue(k) for k in module.keys()]
    raise tx.unsupported(f"iterating over {type(module).__name__}")


def module_get_item(tx: Any, value: V.ModuleValue, index: Any) -> V.Value:
    module = value.obj
    if isinstance(index, slice):
        length = _guard_length(tx, value)
        return V.ListValue([module_get_item(tx, value, i) for i in range(length)[index]])
    if isinstance(module, (nn.ModuleList, nn.Sequential, nn.ParameterList)) and isinstance(index, int):
        length = _guard_length(tx, value)
        if not -length <= index < length:
            raise tx.unsupported(f"index {index} out of range for {type(module).__name__}")
        index = index % length
    elif not isinstance(module, (nn.ModuleDict, nn.ParameterDict)):
        raise tx.unsupported(f"indexing {type(module).__name__}")
    try:
        item = module[index]
    except (KeyError, IndexError) as error:
        raise tx.unsupported(f"indexing {type(module).__name__}: {error!r}") from None
    return tx.session.wrap(item, _item_source(value, index))


def _item_source(value: V.ModuleValue, index: Any) -> Any:
    """``container[index]`` as its ``__getitem__`` reads it (index already normalized, length guarded)."""
    base = fast_container(value.obj)
    if base is nn.ModuleList and type(index) is int:     # self._modules[str(idx)]
        return ModuleStoreSource(value.source, "_modules", str(index), readable=f"[{index!r}]")
    if base is nn.Sequential and type(index) is int:     # positional over self._modules.values()
        return ItemSource(ModuleValuesSource(value.source), index)
    if base is nn.ModuleDict and type(index) is str:     # self._modules[key]
        return ModuleStoreSource(value.source, "_modules", index, readable=f"[{index!r}]")
    return ItemSource(value.source, index)


# ---------------------------------------------------------------- calling
def _guard_hooks(tx: Any, value: V.ModuleValue) -> None:
    session = tx.session
    module = value.obj
    global_hooks = [getattr(_module_module, n, {}) for n in _GLOBAL_HOOK_NAMES]
    if any(global_hooks):
        raise tx.unsupported("global nn.Module hooks are registered")
    session.guards.add(None, " and ".join(f"not {{m}}.{n}" for n in _GLOBAL_HOOK_NAMES), m=_module_module)
    if isinstance(value, V.FreshModuleValue):       # made by this call: no hooks
        return
    if module._backward_hooks or module._backward_pre_hooks:
        raise tx.unsupported(f"backward hooks on {type(module).__name__}")
    dict_names = ("_forward_pre_hooks", "_forward_hooks", "_backward_hooks", "_backward_pre_hooks")
    empty = [n for n in dict_names if not getattr(module, n)]
    if empty:
        session.guards.add(value.source, " and ".join(f"not {{v}}.{n}" for n in empty))
    for name in dict_names:
        hooks = getattr(module, name)
        if hooks:
            session.guards.add(value.source, f"list({{v}}.{name}.values()) == {{hooks}}", hooks=list(hooks.values()))


def call_module(tx: Any, value: V.ModuleValue, args: list[V.Value], kwargs: dict[str, V.Value]) -> V.Value:
    module = value.obj
    if value.source is None and not isinstance(value, V.FreshModuleValue):
        raise tx.unsupported("calling a module without a source")
    call_method = type(module).__call__
    if call_method is not nn.Module.__call__:
        if isinstance(call_method, types.FunctionType):
            return tx.call(V.ObjectValue(call_method), [value] + args, kwargs)
        raise tx.unsupported(f"{type(module).__name__}.__call__ is not Python code")
    return call_module_impl(tx, value, args, kwargs)


def call_module_impl(tx: Any, value: V.ModuleValue, args: list[V.Value], kwargs: dict[str, V.Value]) -> V.Value:
    """What ``nn.Module.__call__`` does: forward pre-hooks, forward, forward hooks."""
    module = value.obj
    if value.source is None and not isinstance(value, V.FreshModuleValue):
        raise tx.unsupported("calling a module without a source")
    _guard_hooks(tx, value)
    for hook_id, hook in module._forward_pre_hooks.items():
        with_kwargs = hook_id in module._forward_pre_hooks_with_kwargs
        hook_args = [value, V.TupleValue(args)] + ([V.DictValue(kwargs)] if with_kwargs else [])
        result = tx.call(V.ObjectValue(hook), hook_args, {})
        if not (isinstance(result, V.ConstantValue) and result.value is None):
            if with_kwargs:
                new_args, new_kwargs = result.items
                args, kwargs = list(new_args.items), dict(new_kwargs.items)
            else:
                args = list(result.items) if isinstance(result, V.TupleValue) else [result]
    forward = module_get_attr(tx, value, "forward")
    output = tx.call(forward, args, kwargs)
    for hook_id, hook in module._forward_hooks.items():
        with_kwargs = hook_id in module._forward_hooks_with_kwargs
        hook_args = [value, V.TupleValue(args)] + ([V.DictValue(kwargs)] if with_kwargs else []) + [output]
        result = tx.call(V.ObjectValue(hook), hook_args, {})
        if not (isinstance(result, V.ConstantValue) and result.value is None):
            output = result
    return output


def is_module(obj: Any) -> bool:
    return isinstance(obj, torch.nn.Module)
