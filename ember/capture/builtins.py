"""Python builtins and container methods evaluated on Values.

Builtins with a handler here work on symbolic values (``len(x.shape)``,
``isinstance(t, torch.Tensor)``, ``zip(self.layers, xs)``); others are called
for real when every argument is a Python constant (``call_builtin_pure``).
"""
from __future__ import annotations

import collections
import operator
import types
from collections.abc import Callable
from typing import Any

import torch

from ..errors import Unsupported
from . import modules, objects, operations, tensor_ops
from . import values as V
from .sources import AttrSource
from .operations import (MAX_LAZY_ITEMS, get_item, get_iter, is_same, python_result, set_item, truthiness, unpack,
                         user_error)


def constants(tx: Any, args: list[V.Value], kwargs: dict[str, V.Value], what: str) -> tuple[list, dict]:
    try:
        return [a.as_python() for a in args], {k: v.as_python() for k, v in kwargs.items()}
    except Unsupported:
        raise tx.unsupported(f"{what} on symbolic values") from None


def call_builtin_pure(tx: Any, fn: Callable, args: list[V.Value], kwargs: dict[str, V.Value]) -> V.Value:
    """Call fn for real on Python constants (math.*, str methods, torch.finfo ...)."""
    name = getattr(fn, "__qualname__", repr(fn))
    python_args, python_kwargs = constants(tx, args, kwargs, name)
    try:
        result = fn(*python_args, **python_kwargs)
    except Exception as error:
        raise tx.unsupported(f"{name} raised {type(error).__name__}: {error}") from None
    return python_result(result)


def real_object(tx: Any, value: V.Value) -> Any:
    """The real object behind a Value whose identity is known (for pure queries like inspect.signature)."""
    if isinstance(value, V.BoundMethodValue):
        return types.MethodType(real_object(tx, value.func), real_object(tx, value.self_value))
    if isinstance(value, V.ObjectValue):
        return value.obj
    try:
        return value.as_python()
    except Unsupported:
        raise tx.unsupported(f"{value.describe()} passed to a Python library query") from None


def call_pure_query(tx: Any, fn: Callable, args: list[V.Value], kwargs: dict[str, V.Value]) -> V.Value:
    """Library functions that only inspect their arguments (inspect.signature, ...): run for real."""
    python_args = [real_object(tx, a) for a in args]
    python_kwargs = {k: real_object(tx, v) for k, v in kwargs.items()}
    try:
        result = fn(*python_args, **python_kwargs)
    except Exception as error:
        raise tx.unsupported(f"{getattr(fn, '__qualname__', fn)} raised {type(error).__name__}: {error}") from None
    return python_result(result)


def operator_on_values(tx: Any, fn: Callable, args: list[V.Value], kwargs: dict[str, V.Value]) -> V.Value:
    if fn is operator.getitem:
        return get_item(tx, *args)
    if fn is operator.setitem:
        set_item(tx, *args)
        return V.NONE
    if fn is operator.not_:
        return V.ConstantValue(not truthiness(tx, args[0]))
    if fn is operator.truth:
        return V.ConstantValue(truthiness(tx, args[0]))
    if fn is operator.is_:
        return V.ConstantValue(is_same(tx, *args))
    if fn is operator.contains:
        return V.ConstantValue(operations.contains(tx, args[0], args[1]))
    for symbol, op in operations.BINARY_OPERATORS.items():
        if op is fn:
            return operations.binary_op(tx, symbol, *args)
    for symbol, op in operations.COMPARE_OPERATORS.items():
        if op is fn:
            return operations.compare(tx, symbol, *args)
    return call_builtin_pure(tx, fn, args, kwargs)


# ---------------------------------------------------------------- builtins
def _len(tx, args, kwargs):
    (value,) = args
    if isinstance(value, V.SetValue):
        return V.ConstantValue(len(value.items) + len(value.objects))
    if isinstance(value, (V.TupleValue, V.ListValue, V.DictValue)):
        return V.ConstantValue(len(value.items))
    if isinstance(value, V.TensorValue):
        if not value.meta.shape:
            raise tx.unsupported("len() of a 0-d tensor")
        tx.session.pin_sizes(value, (0,))
        return V.ConstantValue(value.meta.shape[0])
    if isinstance(value, V.ModuleValue):
        return V.ConstantValue(modules.module_len(tx, value))
    if objects.is_object_like(value):
        return V.ConstantValue(objects.length(tx, value))
    return call_builtin_pure(tx, len, args, kwargs)


def _isinstance(tx, args, kwargs):
    value, classes = args
    classes = classes.as_python()
    if isinstance(value, V.TensorValue):
        return V.ConstantValue(issubclass(value.python_cls, classes))
    if isinstance(value, V.ObjectValue):
        return V.ConstantValue(isinstance(value.obj, classes))
    if isinstance(value, V.FunctionValue):
        return V.ConstantValue(issubclass(types.FunctionType, classes))
    return V.ConstantValue(issubclass(value.python_type(), classes))


def _type(tx, args, kwargs):
    if len(args) != 1:
        raise tx.unsupported("type() with 3 arguments")
    value = args[0]
    if isinstance(value, V.ObjectValue):
        return V.ObjectValue(type(value.obj))
    return V.ObjectValue(value.python_type())


def _range(tx, args, kwargs):
    return V.ConstantValue(range(*constants(tx, args, kwargs, "range")[0]))


def _is_lazy(value: V.Value) -> bool:
    return isinstance(value, V.LazyIteratorValue)


def _enumerate(tx, args, kwargs):
    start = (args[1] if len(args) > 1 else kwargs.get("start", V.ConstantValue(0))).as_python()
    if _is_lazy(args[0]):  # a generator: each item is computed when the consumer asks for it
        iterator, count = args[0], iter(range(start, start + MAX_LAZY_ITEMS))

        def produce():
            item = iterator.next_item()
            return None if item is None else V.TupleValue([V.ConstantValue(next(count)), item])
        return V.LazyIteratorValue(produce)
    return V.IteratorValue([V.TupleValue([V.ConstantValue(i + start), item])
                            for i, item in enumerate(unpack(tx, args[0]))])


def _zip(tx, args, kwargs):
    strict = kwargs.get("strict") is not None and kwargs["strict"].as_python()
    # zip calls iter() on each argument first: an object whose __iter__ is a generator is lazy too
    args = [a if isinstance(a, (V.TupleValue, V.ListValue)) else get_iter(tx, a) for a in args]
    if any(_is_lazy(a) for a in args):
        if strict:
            raise tx.unsupported("zip(strict=True) over a generator")
        iterators = [get_iter(tx, a) for a in args]

        def produce():
            row = []
            for iterator in iterators:  # as zip does: stop at the first exhausted one
                item = iterator.next_item()
                if item is None:
                    return None
                row.append(item)
            return V.TupleValue(row)
        return V.LazyIteratorValue(produce)
    if strict:
        lists = [unpack(tx, a) for a in args]
        if len({len(x) for x in lists}) > 1:
            raise tx.unsupported("zip(strict=True) with different lengths")
    columns = [unpack(tx, a) for a in args]
    return V.IteratorValue([V.TupleValue(list(row)) for row in zip(*columns)])


def _reversed(tx, args, kwargs):
    if _is_lazy(args[0]):
        raise user_error(tx.session, "reversed() of a generator (TypeError)")
    return V.IteratorValue(list(reversed(unpack(tx, args[0]))))


def _iter(tx, args, kwargs):
    return get_iter(tx, args[0])


def _next(tx, args, kwargs):
    iterator = args[0]
    if not isinstance(iterator, V.IteratorValue):
        raise tx.unsupported(f"next() on {iterator.describe()}")
    item = iterator.next_item()
    if item is None:
        if len(args) > 1:
            return args[1]
        raise tx.unsupported("next() on an exhausted iterator (StopIteration)")
    return item


def _list(tx, args, kwargs):
    return V.ListValue(unpack(tx, args[0]) if args else [])


def _tuple(tx, args, kwargs):
    return V.TupleValue(unpack(tx, args[0]) if args else [])


def _dict(tx, args, kwargs):
    items: dict[Any, V.Value] = {}
    if args:
        source = args[0]
        if isinstance(source, V.DictValue):
            items.update(source.items)
        else:
            for pair in unpack(tx, source):
                key, value = unpack(tx, pair)
                items[key.as_python()] = value
    items.update(kwargs)
    return V.DictValue(items)


def _set(tx, args, kwargs):
    return V.SetValue([v.as_python() for v in unpack(tx, args[0])] if args else [])


def _reduce_builtin(fn: Callable) -> Callable:
    def handler(tx, args, kwargs):
        if fn is sum:
            items = unpack(tx, args[0])
            start = args[1] if len(args) > 1 else kwargs.get("start", V.ConstantValue(0))
            if tensor_ops.contains_tensor(items + [start]) or \
                    any(objects.has_python_operators(v) for v in items + [start]):
                result = start
                for item in items:
                    result = operations.binary_op(tx, "+", result, item)
                return result
            return python_result(sum([v.as_python() for v in items], start.as_python()))
        items = unpack(tx, args[0]) if len(args) == 1 else list(args)
        if "key" in kwargs and not ops_is_none(kwargs["key"]):
            return _extreme_by_key(tx, fn, items, kwargs)
        if tensor_ops.contains_tensor(items):
            raise tx.unsupported(f"{fn.__name__}() over tensors is data-dependent", "use torch.maximum/minimum")
        extra = {k: v.as_python() for k, v in kwargs.items()}
        return python_result(fn([v.as_python() for v in items], **extra))
    return handler


def _extreme_by_key(tx, fn: Callable, items: list[V.Value], kwargs: dict[str, V.Value]) -> V.Value:
    """min/max(..., key=f): the first item whose key is smallest/largest, as the builtins pick;
    the items themselves (tensors too) are not compared."""
    if set(kwargs) - {"key", "default"}:
        raise tx.unsupported(f"{fn.__name__}() with {sorted(kwargs)}")
    if not items:
        if "default" in kwargs:
            return kwargs["default"]
        raise user_error(tx.session, f"{fn.__name__}() of an empty sequence")
    keys = _sort_keys(tx, items, kwargs["key"], f"{fn.__name__}()")
    try:
        index = fn(range(len(keys)), key=keys.__getitem__)
    except TypeError as error:
        raise user_error(tx.session, f"{fn.__name__}(): {error}") from None
    return items[index]


def _abs(tx, args, kwargs):
    if objects.has_python_operators(args[0]):
        return operations.unary_op(tx, "abs", args[0])
    if isinstance(args[0], V.TensorValue):
        return tensor_ops.record_call(tx.session, torch.abs, args, {})
    return call_builtin_pure(tx, abs, args, kwargs)


def _pow(tx, args, kwargs):
    if tensor_ops.contains_tensor(args):
        return tensor_ops.record_call(tx.session, operator.pow, args[:2], {})
    return call_builtin_pure(tx, pow, args, kwargs)


def _numeric(kind: type) -> Callable:
    def handler(tx, args, kwargs):
        if args and isinstance(args[0], V.TensorValue):
            raise tx.unsupported(f"{kind.__name__}(tensor) needs the tensor's data",
                                 "keep the value as a tensor")
        return call_builtin_pure(tx, kind, args, kwargs)
    return handler


def _bool(tx, args, kwargs):
    return V.ConstantValue(truthiness(tx, args[0]) if args else False)


def _getattr(tx, args, kwargs):
    name = args[1].as_python()
    if len(args) > 2:
        target = args[0]
        if isinstance(target, V.ObjectValue) and target.source is not None and \
                tx.session.pending_attr(target, name) is None:
            # the default is used iff the attribute is absent: that absence is guarded too
            present = _hasattr(tx, [target, args[1]], {}).as_python()
            return operations.get_attr(tx, target, name) if present else args[2]
        try:
            return operations.get_attr(tx, target, name)
        except Unsupported:
            if _has_attr(tx, target, name):
                raise
            return args[2]
    return operations.get_attr(tx, args[0], name)


def _has_attr(tx, value: V.Value, name: str) -> bool:
    if isinstance(value, V.TensorValue):
        return hasattr(torch.Tensor, name) or name in ("shape", "dtype", "device")
    if isinstance(value, V.ObjectValue):
        return hasattr(value.obj, name)
    if isinstance(value, V.DataclassValue):
        return name in value.fields or hasattr(value.cls, name)
    if isinstance(value, objects.InstanceValue):
        return name in value.attrs or hasattr(value.cls, name)
    return hasattr(value.python_type(), name)


def _hasattr(tx, args, kwargs):
    value, name = args[0], args[1].as_python()
    if isinstance(value, V.ObjectValue) and (value.source is not None or isinstance(value, V.UserObjectValue)):
        pending = tx.session.pending_attr(value, name)
        if pending is not None:
            return V.ConstantValue(True)
        present = hasattr(value.obj, name)
        if value.source is not None:
            if present and isinstance(name, str) and name.isidentifier():
                # reading the attribute in the guard proves it present (an AttributeError fails the
                # guard), and the read is shared with the guards on its value that usually follow:
                # half the cost of hasattr() then getattr() on classes with Python attribute hooks
                tx.session.guards.add(AttrSource(value.source, name), "{v} is {v}")
            else:
                tx.session.guards.add(value.source, "hasattr({v}, {name}) is {present}", name=name, present=present)
        return V.ConstantValue(present)
    return V.ConstantValue(_has_attr(tx, value, name))


def _setattr(tx, args, kwargs):
    operations.set_attr(tx, args[0], args[1].as_python(), args[2])
    return V.NONE


def _callable(tx, args, kwargs):
    value = args[0]
    if isinstance(value, (V.FunctionValue, V.BoundMethodValue, V.ModuleValue, V.TensorMethodValue,
                          V.ContainerMethodValue, V.GradModeValue, V.GradModeFunctionValue)):
        return V.ConstantValue(True)
    if isinstance(value, objects.InstanceValue):
        return V.ConstantValue(callable(value.cls))
    if isinstance(value, objects.PartialValue):
        return V.ConstantValue(True)
    if isinstance(value, V.ObjectValue):
        return V.ConstantValue(callable(value.obj))
    return V.ConstantValue(False)


def _super(tx, args, kwargs):
    if args:
        return V.SuperValue(args[0].as_python(), args[1])
    cell = tx.cells.get("__class__")
    if cell is None:
        raise tx.unsupported("super() outside a method")
    cls = cell.cell.cell_contents if isinstance(cell, V.RealCell) else cell.contents.as_python()
    first = tx.code.co_varnames[0]
    self_value = tx.locals.get(first)
    if self_value is None and first in tx.cells:
        self_value = tx.cells[first].contents
    return V.SuperValue(cls, self_value)


def _map(tx, args, kwargs):
    if any(_is_lazy(a) for a in args[1:]):
        rows = _zip(tx, args[1:], {})

        def produce():
            row = rows.next_item()
            return None if row is None else tx.call(args[0], list(row.items), {})
        return V.LazyIteratorValue(produce)
    columns = [unpack(tx, a) for a in args[1:]]
    return V.IteratorValue([tx.call(args[0], list(row), {}) for row in zip(*columns)])


def _filter(tx, args, kwargs):
    if _is_lazy(args[1]):
        iterator = args[1]

        def produce():
            while (item := iterator.next_item()) is not None:
                keep = item if ops_is_none(args[0]) else tx.call(args[0], [item], {})
                if truthiness(tx, keep):
                    return item
            return None
        return V.LazyIteratorValue(produce)
    items = unpack(tx, args[1])
    if isinstance(args[0], V.ConstantValue) and args[0].value is None:
        return V.IteratorValue([v for v in items if truthiness(tx, v)])
    return V.IteratorValue([v for v in items if truthiness(tx, tx.call(args[0], [v], {}))])


def _sort_keys(tx, items: list[V.Value], key: V.Value | None, what: str) -> list[Any]:
    """The Python key of each item: the item itself, or ``key(item)`` called through the translator
    (a user function runs once per item, in order, as eager runs it).  Keys must be Python constants:
    the order is then decided now, and the items themselves (tensors too) are only moved."""
    if key is None or ops_is_none(key):
        keys = items
    else:
        keys = [tx.call(key, [item], {}) for item in items]
    try:
        return [k.as_python() for k in keys]
    except Unsupported:
        raise tx.unsupported(f"{what} on keys that are not Python constants") from None


def _sorted_order(tx, keys: list[Any], reverse: bool, what: str) -> list[int]:
    """Indices in sorted order: stable, as sorted() is (reverse keeps equal keys in their order)."""
    try:
        return sorted(range(len(keys)), key=keys.__getitem__, reverse=reverse)
    except TypeError as error:  # eager raises it: the frame runs eagerly
        raise user_error(tx.session, f"{what}: {error}") from None


def _sort_items(tx, items: list[V.Value], kwargs: dict[str, V.Value], what: str) -> list[V.Value]:
    if set(kwargs) - {"key", "reverse"}:
        raise tx.unsupported(f"{what} with {sorted(kwargs)}")
    reverse = kwargs.get("reverse", V.ConstantValue(False))
    if not reverse.is_python_constant():
        raise tx.unsupported(f"{what} with a symbolic reverse=")
    keys = _sort_keys(tx, items, kwargs.get("key"), what)
    return [items[i] for i in _sorted_order(tx, keys, bool(reverse.as_python()), what)]


def _sorted(tx, args, kwargs):
    if len(args) != 1:
        raise tx.unsupported("sorted() takes one positional argument")
    return V.ListValue(_sort_items(tx, unpack(tx, args[0]), kwargs, "sorted()"))


def ops_is_none(value: V.Value) -> bool:
    return isinstance(value, V.ConstantValue) and value.value is None


def _any_all(want: bool) -> Callable:
    """any() / all(): stop at the first deciding item, as eager does (a generator is not run further)."""
    def handler(tx, args, kwargs):
        iterator = get_iter(tx, args[0])
        while (item := iterator.next_item()) is not None:
            if truthiness(tx, item) == want:
                return V.ConstantValue(want)
        return V.ConstantValue(not want)
    return handler


def _vars(tx, args, kwargs):
    """vars(obj) of an object built in the trace: its ``__dict__`` itself (writes go through to the
    object, as eager's do).  Objects passed in may have attribute writes pending: not captured."""
    if len(args) != 1 or kwargs:
        raise tx.unsupported("vars() without an object (the caller's locals)")
    value = args[0]
    if isinstance(value, objects.InstanceValue):
        return objects.get_attr(tx, value, "__dict__")
    if isinstance(value, V.DataclassValue):
        view = V.DictValue({})
        view.items = value.fields  # the same dict, as for an InstanceValue's __dict__
        return view
    raise tx.unsupported(f"vars() of {value.describe()}")


def _id(tx, args, kwargs):
    raise tx.unsupported("id() inside a compiled function")


BUILTIN_HANDLERS: dict[Any, Callable] = {
    len: _len, isinstance: _isinstance, type: _type, range: _range, enumerate: _enumerate, zip: _zip,
    reversed: _reversed, iter: _iter, next: _next, list: _list, tuple: _tuple, dict: _dict, set: _set,
    frozenset: lambda tx, a, k: V.ConstantValue(frozenset(v.as_python() for v in unpack(tx, a[0]))),
    min: _reduce_builtin(min), max: _reduce_builtin(max), sum: _reduce_builtin(sum),
    any: _any_all(True), all: _any_all(False),
    abs: _abs, pow: _pow, int: _numeric(int), float: _numeric(float), complex: _numeric(complex), bool: _bool,
    getattr: _getattr, hasattr: _hasattr, setattr: _setattr, callable: _callable, super: _super, map: _map,
    filter: _filter, sorted: _sorted, id: _id, vars: _vars,
    issubclass: lambda tx, a, k: call_builtin_pure(tx, issubclass, a, k),
}


# ---------------------------------------------------------------- container methods
def call_container_method(tx: Any, obj: V.Value, name: str, args: list[V.Value],
                          kwargs: dict[str, V.Value]) -> V.Value:
    if isinstance(obj, V.ListValue):
        return _list_method(tx, obj, name, args, kwargs)
    if isinstance(obj, V.DictValue):
        return _dict_method(tx, obj, name, args, kwargs)
    if isinstance(obj, V.TupleValue) and name in ("index", "count", "_asdict", "_replace"):
        if name == "_asdict":
            return V.DictValue(dict(zip(obj.fields, obj.items)))
        if name == "_replace":
            items = list(obj.items)
            for key, value in kwargs.items():
                items[obj.fields.index(key)] = value
            return V.TupleValue(items, None, obj.cls)
        return python_result(getattr(obj.as_python(), name)(*[a.as_python() for a in args]))
    if isinstance(obj, V.SetValue):
        if name in ("add", "discard", "remove") and args and isinstance(args[0], V.TensorValue):
            return _set_tensor_member(tx, obj, name, args[0])
        if name in ("add", "discard", "update", "remove", "clear"):
            if obj.source is not None:
                raise tx.unsupported("mutating a set argument")
            getattr(obj.items, name)(*[a.as_python() for a in args])
            return V.NONE
        return python_result(getattr(obj.items, name)(*[a.as_python() for a in args]))
    if isinstance(obj, V.ConstantValue):
        # ", ".join(str(d) for d in x.shape): the generator's items, as the method would iterate them
        args = [V.TupleValue(unpack(tx, a)) if isinstance(a, V.LazyIteratorValue) else a for a in args]
        return call_builtin_pure(tx, getattr(obj.value, name), args, kwargs)
    raise tx.unsupported(f"method {name} of {obj.describe()}")


def _set_tensor_member(tx: Any, obj: V.SetValue, name: str, tensor: V.TensorValue) -> V.Value:
    """set.add/discard/remove of a tensor: members compared by identity (tensors hash by id)."""
    if obj.source is not None:
        raise tx.unsupported("mutating a set argument")
    present = operations.contains(tx, obj, tensor)
    if name == "add" and not present:
        obj.objects.append(tensor)
    elif name in ("discard", "remove") and present:
        obj.objects[:] = [m for m in obj.objects if not is_same(tx, m, tensor)]
    elif name == "remove":
        raise user_error(tx.session, "KeyError: set.remove of a missing tensor")
    return V.NONE


def _list_method(tx: Any, obj: V.ListValue, name: str, args: list[V.Value], kwargs: dict) -> V.Value:
    items = obj.items
    if name in ("append", "extend", "insert", "pop", "remove", "clear", "reverse", "sort"):
        obj.mutated = True
    if name == "append":
        items.append(args[0])
    elif name == "extend":
        items.extend(unpack(tx, args[0]))
    elif name == "insert":
        items.insert(args[0].as_python(), args[1])
    elif name == "pop":
        return items.pop(args[0].as_python() if args else -1)
    elif name == "clear":
        items.clear()
    elif name == "reverse":
        items.reverse()
    elif name == "copy":
        return V.ListValue(list(items))
    elif name in ("index", "count", "remove", "sort"):
        if name == "sort":
            if args:
                raise user_error(tx.session, "list.sort() takes no positional arguments")
            obj.items[:] = _sort_items(tx, list(items), kwargs, "list.sort()")
            return V.NONE
        matches = [i for i, v in enumerate(items) if is_same(tx, v, args[0]) or (
            v.is_python_constant() and args[0].is_python_constant() and v.as_python() == args[0].as_python())]
        if name == "count":
            return V.ConstantValue(len(matches))
        if not matches:
            raise tx.unsupported(f"list.{name}: value not in list")
        if name == "index":
            return V.ConstantValue(matches[0])
        del items[matches[0]]
    else:
        raise tx.unsupported(f"list.{name}")
    return V.NONE


def _dict_method(tx: Any, obj: V.DictValue, name: str, args: list[V.Value], kwargs: dict) -> V.Value:
    items = obj.items
    keys = [a.as_python() for a in args[:1]]
    if name == "keys":
        return V.ListValue([python_result(k) for k in items])
    if name == "values":
        return V.ListValue(list(items.values()))
    if name == "items":
        return V.ListValue([V.TupleValue([python_result(k), v]) for k, v in items.items()])
    if name == "get":
        return items.get(keys[0], args[1] if len(args) > 1 else V.NONE)
    if name == "copy":
        return V.DictValue(dict(items), None, obj.cls)
    obj.mutated = True
    if name == "pop":
        if keys[0] in items:
            return items.pop(keys[0])
        if len(args) > 1:
            return args[1]
        raise tx.unsupported(f"KeyError {keys[0]!r}")
    if name == "setdefault":
        return items.setdefault(keys[0], args[1] if len(args) > 1 else V.NONE)
    if name == "update":
        if args:
            if isinstance(args[0], V.DictValue):
                items.update(args[0].items)
            else:
                for pair in unpack(tx, args[0]):
                    key, value = unpack(tx, pair)
                    items[key.as_python()] = value
        items.update(kwargs)
        return V.NONE
    if name == "clear":
        items.clear()
        return V.NONE
    raise tx.unsupported(f"dict.{name}")


def _pure(fn: Callable) -> Callable:
    return lambda tx, args, kwargs: call_builtin_pure(tx, fn, args, kwargs)


# builtins without side effects: evaluated for real on Python constants
def _to_string(kind: str, fn: Callable) -> Callable:
    """str(obj) / repr(obj) / format(obj, spec): a Python class's own method, inlined; else for real."""
    def handler(tx, args, kwargs):
        if len(args) in ((1, 2) if kind == "format" else (1,)) and not kwargs and \
                objects.has_python_operators(args[0]):
            spec = args[1].as_python() if len(args) > 1 else ""
            if not isinstance(spec, str):
                raise tx.unsupported("format() with a spec that is not a str")
            return objects.to_string(tx, args[0], kind, spec)
        return call_builtin_pure(tx, fn, args, kwargs)
    return handler


BUILTIN_HANDLERS.update({str: _to_string("str", str), repr: _to_string("repr", repr),
                         format: _to_string("format", format)})
for _fn in (divmod, round, chr, ord, hex, bin, oct, slice, ascii, hash, bytes):
    BUILTIN_HANDLERS.setdefault(_fn, _pure(_fn))


# ---------------------------------------------------------------- building instances of Python classes (objects.py)
def instantiate(tx: Any, cls: type, args: list[V.Value], kwargs: dict[str, V.Value]) -> objects.InstanceValue:
    instance = objects.InstanceValue(cls)
    init = cls.__init__
    if isinstance(init, types.FunctionType):
        result = tx.call(V.ObjectValue(init), [instance] + args, kwargs)
        if not (isinstance(result, V.ConstantValue) and result.value is None):
            raise tx.unsupported(f"{cls.__name__}.__init__ returned a value")
    elif init in (object.__init__,):
        if args or kwargs:
            raise tx.unsupported(f"{cls.__name__}() takes no arguments")
    elif init in (dict.__init__, collections.OrderedDict.__init__):
        _dict_update(tx, instance, args, kwargs)
    else:
        raise tx.unsupported(f"{cls.__name__}.__init__ is not Python code")
    return instance


# ---------------------------------------------------------------- C base methods called on instances (objects.py)
def call_base_method(tx: Any, fn: Any, args: list[V.Value], kwargs: dict[str, V.Value]) -> V.Value | None:
    """``object.__setattr__(self, ...)``, ``dict.__setitem__(self, ...)``, ``OrderedDict.keys(self)``...

    Returns None when ``fn`` is not a base method this module models for ``args[0]``."""
    owner = getattr(fn, "__objclass__", None)
    name = getattr(fn, "__name__", "")
    if not args or owner not in (object,) + objects.DICT_BASES:
        return None
    self_value, rest = args[0], args[1:]
    if owner is object:
        if isinstance(self_value, objects.InstanceValue):
            if name == "__setattr__":
                objects.object_setattr(tx, self_value, rest[0].as_python(), rest[1])
                return V.NONE
            if name == "__init__":
                return V.NONE
            if name == "__getattribute__":
                return objects.get_attr(tx, self_value, rest[0].as_python())
            if name == "__delattr__":
                self_value.attrs.pop(rest[0].as_python(), None)
                return V.NONE
        if name == "__init__" and isinstance(self_value, V.Value):
            return V.NONE
        return None
    if isinstance(self_value, V.UserObjectValue) and name in ("get", "__getitem__", "__contains__") \
            and isinstance(self_value.obj, dict) and self_value.source is not None:
        key = rest[0].as_python()
        default = rest[1] if len(rest) > 1 else V.NONE
        found = objects.dict_get_from_outside(tx, self_value, key, objects.MISSING_VALUE)
        if name == "__contains__":
            return V.ConstantValue(found is not objects.MISSING_VALUE)
        if found is objects.MISSING_VALUE:
            if name == "__getitem__":
                raise tx.unsupported(f"KeyError {key!r}")
            return default
        return found
    items = objects.mapping_of(tx, self_value, name)
    if items is None:
        return None
    if name == "__setitem__":
        items.items[rest[0].as_python()] = rest[1]
        return V.NONE
    if name == "__delitem__":
        key = rest[0].as_python()
        if key not in items.items:
            raise tx.unsupported(f"KeyError {key!r}")
        del items.items[key]
        return V.NONE
    if name == "__getitem__":
        return get_item(tx, items, rest[0])
    if name == "__contains__":
        return V.ConstantValue(operations.contains(tx, items, rest[0]))
    if name == "__len__":
        return V.ConstantValue(len(items.items))
    if name == "__iter__":
        return get_iter(tx, items)
    if name == "__init__":
        _dict_update(tx, self_value, rest, kwargs)
        return V.NONE
    return call_container_method(tx, items, name, list(rest), kwargs)


def _dict_update(tx: Any, target: V.Value, args: list[V.Value], kwargs: dict[str, V.Value]) -> None:
    items = objects.mapping_of(tx, target, "update")
    call_container_method(tx, items, "update", list(args), kwargs)
