"""What operations mean on Values: attributes, items, operators, iteration, truth.

The interpreter calls these with the translator ``tx`` (for the session, the
current line and inlining).  Python values known exactly are computed with
Python itself; tensors are recorded through ``tensor_ops``; anything else is
Unsupported with a reason.  Instances of Python classes go to objects.py, which is
handed the generic operation to apply to what their dunder methods return;
properties run through ``tx.call`` (calls.py sits above this module).
"""
from __future__ import annotations

import inspect
import operator
import types
from typing import Any

import torch

from ..errors import Unsupported
from . import autocast, modules, objects, tensor_ops
from . import values as V
from . import numpy_functions, numpy_ops  # numpy
from .numpy_values import NdarrayValue  # numpy
from .session import is_library_module
from .sources import AttrSource, ItemSource


def user_error(session: Any, reason: str, exception: BaseException | None = None) -> Unsupported:
    """The user's Python raises here in eager (IndexError, KeyError, AttributeError).
    ``exception``: the exception itself, when capture evaluated the operation exactly as eager
    does (the traced code's own handlers may catch it: interpreter.py)."""
    error = Unsupported(reason, session.current_line())
    error.eager_may_raise = True
    error.python_exception = exception
    return error

BINARY_OPERATORS = {
    "+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv, "//": operator.floordiv,
    "%": operator.mod, "**": operator.pow, "@": operator.matmul, "&": operator.and_, "|": operator.or_,
    "^": operator.xor, "<<": operator.lshift, ">>": operator.rshift,
    "+=": operator.iadd, "-=": operator.isub, "*=": operator.imul, "/=": operator.itruediv,
    "//=": operator.ifloordiv, "%=": operator.imod, "**=": operator.ipow, "@=": operator.imatmul,
    "&=": operator.iand, "|=": operator.ior, "^=": operator.ixor, "<<=": operator.ilshift,
    ">>=": operator.irshift,
}
COMPARE_OPERATORS = {"<": operator.lt, "<=": operator.le, "==": operator.eq, "!=": operator.ne,
                     ">": operator.gt, ">=": operator.ge}
UNARY_OPERATORS = {"neg": operator.neg, "pos": operator.pos, "invert": operator.invert}


def constant_value(tx: Any, value: Any) -> V.Value:
    if type(value) is tuple:
        return V.TupleValue([constant_value(tx, v) for v in value])
    if isinstance(value, frozenset):
        return V.ConstantValue(value)
    return V.ConstantValue(value)  # code objects too: immutable


def python_result(value: Any) -> V.Value:
    """Wrap the result of a Python computation on constants (no source, no guard)."""
    if type(value) is tuple:
        return V.TupleValue([python_result(v) for v in value])
    if type(value) is list:
        return V.ListValue([python_result(v) for v in value])
    if type(value) is dict:
        return V.DictValue({k: python_result(v) for k, v in value.items()})
    if isinstance(value, torch.Tensor):
        raise Unsupported("a Python computation produced a tensor outside the graph")
    if isinstance(value, (types.FunctionType, types.ModuleType, type, types.BuiltinFunctionType)):
        return V.ObjectValue(value)
    return V.ConstantValue(value)


# ---------------------------------------------------------------- truth and identity
def truthiness(tx: Any, value: V.Value) -> bool:
    if isinstance(value, V.TensorValue):
        raise tx.unsupported("data-dependent branch on a tensor value (`if tensor:` / bool(tensor))",
                             "branch on tensor metadata, or use torch.where")
    if isinstance(value, (V.TupleValue, V.ListValue)):
        return bool(value.items)
    if isinstance(value, V.SetValue):
        return bool(value.items) or bool(value.objects)
    if isinstance(value, V.DictValue):
        return bool(value.items)
    if isinstance(value, V.ConstantValue):
        return bool(value.value)
    if objects.is_object_like(value):
        return objects.truthiness(tx, value, truthiness)
    if isinstance(value, V.ModuleValue):
        if hasattr(type(value.obj), "__len__"):
            return bool(len(value.obj))
        return True
    if isinstance(value, (V.ObjectValue, V.FunctionValue, V.BoundMethodValue, V.DataclassValue)):
        obj = getattr(value, "obj", None)
        if obj is not None and (hasattr(type(obj), "__bool__") or hasattr(type(obj), "__len__")) \
                and not isinstance(obj, (type, types.FunctionType, types.ModuleType)):
            raise tx.unsupported(f"truth value of {value.describe()}")
        return True
    raise tx.unsupported(f"truth value of {value.describe()}")


def is_none(tx: Any, value: V.Value) -> bool:
    return isinstance(value, V.ConstantValue) and value.value is None


def is_same(tx: Any, left: V.Value, right: V.Value) -> bool:
    if left is right:
        return True
    if isinstance(left, V.ConstantValue) and isinstance(right, V.ConstantValue):
        return left.value is right.value
    if isinstance(left, V.ObjectValue) and isinstance(right, V.ObjectValue):
        return left.obj is right.obj
    if isinstance(left, V.TensorValue) and isinstance(right, V.TensorValue):
        if left.node is right.node:
            return True
        if left.node.op == "placeholder" and right.node.op == "placeholder":
            # two inputs that were different objects here must stay different for this answer
            tx.session.guards.require_distinct(left.source, right.source)
        return False
    # different kinds of Values are different objects (None is only ever a ConstantValue)
    return False


# ---------------------------------------------------------------- operators
def binary_op(tx: Any, symbol: str, left: V.Value, right: V.Value) -> V.Value:
    if isinstance(left, NdarrayValue) or isinstance(right, NdarrayValue):  # numpy
        return numpy_functions.binary_op(tx, symbol, left, right)
    fn = BINARY_OPERATORS[symbol]
    if objects.has_python_operators(left) or objects.has_python_operators(right):
        result = objects.binary_operator(tx, symbol, left, right, _OPERATOR_HELPERS)
        if result is objects.NO_RESULT:
            raise user_error(tx.session, f"unsupported operand types for {symbol}: "
                                         f"{left.describe()} and {right.describe()} (TypeError)")
        return result
    if isinstance(left, V.TensorValue) or isinstance(right, V.TensorValue):
        if symbol.endswith("=") and not isinstance(left, V.TensorValue):
            fn = BINARY_OPERATORS[symbol[:-1]]
        return tensor_ops.record_call(tx.session, fn, [left, right], {})
    if isinstance(left, V.ListValue) and symbol == "+=":
        list_target(tx, left).items.extend(unpack(tx, right))
        return left
    if isinstance(left, (V.TupleValue, V.ListValue)) and isinstance(right, (V.TupleValue, V.ListValue)) \
            and symbol in ("+", "+=") and type(left) is type(right):
        return type(left)(left.items + right.items) if isinstance(left, V.ListValue) else V.TupleValue(
            left.items + right.items)
    if isinstance(left, (V.TupleValue, V.ListValue)) and symbol in ("*", "*=") and \
            isinstance(right, V.ConstantValue):
        items = left.items * right.value
        return V.ListValue(items) if isinstance(left, V.ListValue) else V.TupleValue(items)
    if symbol in ("|", "&", "-", "^") and isinstance(left, (V.ListValue, V.SetValue)) and \
            isinstance(right, (V.ListValue, V.SetValue)):  # set algebra on keys() views and sets
        return V.SetValue(fn(set(_set_items(tx, left)), set(_set_items(tx, right))))
    if isinstance(left, V.DictValue) and isinstance(right, V.DictValue) and symbol == "|":
        return V.DictValue({**left.items, **right.items})
    if symbol.rstrip("=") in SIZE_ARITHMETIC:      # dynamic shapes: x.shape[0] * 2 stays a size
        size = tx.session.size_arithmetic(fn, left, right)
        if size is not None:
            return size
    return python_result(fn(_constant(tx, left, symbol), _constant(tx, right, symbol)))


SIZE_ARITHMETIC = {"+", "-", "*", "//", "%"}


def _set_items(tx: Any, value: V.Value) -> list:
    if isinstance(value, V.SetValue):
        return list(value.items)
    return [_constant(tx, v, "set operation") for v in value.items]


def _constant(tx: Any, value: V.Value, what: str) -> Any:
    try:
        return value.as_python()
    except Unsupported:
        raise tx.unsupported(f"operator {what} on {value.describe()}") from None


def unary_op(tx: Any, name: str, value: V.Value) -> V.Value:
    if isinstance(value, NdarrayValue):  # numpy
        return numpy_ops.unary_op(tx, name, value)
    if objects.has_python_operators(value):
        result = objects.unary_operator(tx, name, value)
        if result is objects.NO_RESULT:
            raise user_error(tx.session, f"bad operand type for unary {name}: {value.describe()} (TypeError)")
        return result
    fn = UNARY_OPERATORS[name]
    if isinstance(value, V.TensorValue):
        return tensor_ops.record_call(tx.session, fn, [value], {})
    return python_result(fn(_constant(tx, value, name)))


def compare(tx: Any, symbol: str, left: V.Value, right: V.Value) -> V.Value:
    if isinstance(left, NdarrayValue) or isinstance(right, NdarrayValue):  # numpy
        return numpy_ops.compare(tx, symbol, left, right)
    fn = COMPARE_OPERATORS[symbol]
    if objects.has_python_operators(left) or objects.has_python_operators(right):
        result = objects.compare_operator(tx, symbol, left, right, _OPERATOR_HELPERS)
        if result is objects.NO_RESULT:
            raise user_error(tx.session, f"'{symbol}' not supported between {left.describe()} and "
                                         f"{right.describe()} (TypeError)")
        return result
    if isinstance(left, V.TensorValue) or isinstance(right, V.TensorValue):
        return tensor_ops.record_call(tx.session, fn, [left, right], {})
    if symbol in ("<", "<=", ">", ">=", "==", "!="):
        answer = tx.session.size_comparison(symbol, fn, left, right)   # dynamic shapes
        if answer is not None:
            return answer
    if symbol in ("==", "!=") and not (left.is_python_constant() and right.is_python_constant()):
        equal = _containers_equal(tx, left, right)
        if equal is None:
            equal = is_same(tx, left, right)
        return V.ConstantValue(equal if symbol == "==" else not equal)
    return python_result(fn(_constant(tx, left, symbol), _constant(tx, right, symbol)))


def _containers_equal(tx: Any, left: V.Value, right: V.Value) -> bool | None:
    """== of two lists, two tuples (namedtuples too) or two dicts holding symbolic items, as CPython
    compares them: lengths (keys), then item by item, identity first; None: not such a pair."""
    kinds = {type(left), type(right)}
    if kinds == {V.TupleValue} or kinds == {V.ListValue}:
        if left.python_type().__eq__ is not right.python_type().__eq__ or \
                left.python_type().__eq__ not in (tuple.__eq__, list.__eq__):
            return None
        if len(left.items) != len(right.items):
            return False
        return all(_items_equal(tx, a, b) for a, b in zip(left.items, right.items))
    if kinds == {V.DictValue} and left.cls is dict and right.cls is dict:
        if left.items.keys() != right.items.keys():
            return False
        return all(_items_equal(tx, value, right.items[key]) for key, value in left.items.items())
    return None


def _items_equal(tx: Any, left: V.Value, right: V.Value) -> bool:
    return is_same(tx, left, right) or truthiness(tx, compare(tx, "==", left, right))


def contains(tx: Any, container: V.Value, item: V.Value) -> bool:
    if objects.is_object_like(container):
        return objects.contains(tx, container, item, contains, truthiness)
    if isinstance(container, V.DictValue):
        return _constant(tx, item, "in") in container.items
    if isinstance(container, V.SetValue):
        if isinstance(item, V.TensorValue):
            return any(is_same(tx, item, member) for member in container.objects)
        return _constant(tx, item, "in") in container.items
    if isinstance(container, (V.TupleValue, V.ListValue)):
        for element in container.items:
            if is_same(tx, element, item):
                return True
            if element.is_python_constant() and item.is_python_constant() and \
                    element.as_python() == item.as_python():
                return True
        return False
    if isinstance(container, V.ModuleValue) and isinstance(container.obj, torch.nn.ModuleDict):
        return _constant(tx, item, "in") in container.obj
    if isinstance(container, V.TensorValue):
        raise tx.unsupported("`in` on a tensor is data-dependent")
    return _constant(tx, item, "in") in _constant(tx, container, "in")


_OPERATOR_HELPERS = objects.OperatorHelpers(is_same, truthiness)


# ---------------------------------------------------------------- items
def make_slice(parts: list[V.Value]) -> V.Value:
    if any(isinstance(p, V.TensorValue) for p in parts):
        raise Unsupported("a slice with tensor bounds")
    if any(isinstance(p, V.SizeValue) for p in parts):
        return V.SliceValue(parts)
    return V.ConstantValue(slice(*[p.as_python() for p in parts]))


def get_item(tx: Any, obj: V.Value, index: V.Value) -> V.Value:
    if isinstance(obj, NdarrayValue):  # numpy
        return numpy_ops.get_item(tx, obj, index)
    if isinstance(obj, V.TensorValue):
        return tensor_ops.record_call(tx.session, operator.getitem, [obj, index], {})
    if isinstance(obj, (V.TupleValue, V.ListValue)):
        key = _constant(tx, index, "[]")
        if isinstance(key, slice):
            items = obj.items[key]
            return V.ListValue(items) if isinstance(obj, V.ListValue) else V.TupleValue(items)
        try:
            return obj.items[key]
        except (IndexError, TypeError) as error:
            raise user_error(tx.session, f"indexing: {error}", error) from None
    if isinstance(obj, V.DictValue):
        key = _constant(tx, index, "[]")
        if key not in obj.items:
            raise user_error(tx.session, f"KeyError {key!r}", KeyError(key))
        return obj.items[key]
    if isinstance(obj, V.ModuleValue):
        return modules.module_get_item(tx, obj, _constant(tx, index, "[]"))
    if isinstance(obj, V.ConstantValue):
        key = _constant(tx, index, "[]")
        if isinstance(obj.value, (str, bytes, tuple, range)):       # immutable builtins: exact here
            try:
                return python_result(obj.value[key])
            except (IndexError, TypeError) as error:
                raise user_error(tx.session, f"indexing: {error}", error) from None
        return python_result(obj.value[key])
    if objects.is_object_like(obj):
        result = objects.get_item(tx, obj, index, get_item)
        if result is not None:
            return result
    if isinstance(obj, V.UserObjectValue) and obj.source is not None:
        key = _constant(tx, index, "[]")
        return tx.session.wrap(obj.obj[key], ItemSource(obj.source, key))
    raise tx.unsupported(f"indexing {obj.describe()}")


def list_target(tx: Any, value: V.Value) -> V.ListValue:
    if not isinstance(value, V.ListValue):
        raise tx.unsupported(f"list operation on {value.describe()}")
    value.mutated = True
    return value


def set_item(tx: Any, obj: V.Value, index: V.Value, value: V.Value) -> None:
    if isinstance(obj, NdarrayValue):  # numpy
        return numpy_ops.set_item(tx, obj, index, value)
    if isinstance(obj, V.TensorValue):
        tensor_ops.record_call(tx.session, operator.setitem, [obj, index, value], {})
        return
    if objects.is_object_like(obj):
        objects.set_item(tx, obj, index, value)
        return
    key = _constant(tx, index, "[]=")
    if isinstance(obj, V.ListValue):
        list_target(tx, obj)
        if isinstance(key, slice):
            obj.items[key] = unpack(tx, value)
        else:
            obj.items[key] = value
        return
    if isinstance(obj, V.DictValue):
        obj.mutated = True
        obj.items[key] = value
        return
    raise tx.unsupported(f"item assignment on {obj.describe()}")


def delete_item(tx: Any, obj: V.Value, index: V.Value) -> None:
    key = _constant(tx, index, "del")
    if isinstance(obj, V.ListValue):
        del list_target(tx, obj).items[key]
    elif isinstance(obj, V.DictValue):
        obj.mutated = True
        del obj.items[key]
    else:
        raise tx.unsupported(f"del on {obj.describe()}")


# ---------------------------------------------------------------- iteration
MAX_LAZY_ITEMS = 100_000  # draining a generator past this: probably an infinite one


def unpack(tx: Any, value: V.Value) -> list[V.Value]:
    """The items of an iterable, materialized (everything the trace iterates is finite)."""
    if isinstance(value, (V.TupleValue, V.ListValue)):
        return list(value.items)
    if isinstance(value, V.LazyIteratorValue):
        items = []
        while (item := value.next_item()) is not None:
            items.append(item)
            if len(items) > MAX_LAZY_ITEMS:
                raise tx.unsupported(f"{value.describe()} yields more than {MAX_LAZY_ITEMS} items")
        return items
    if isinstance(value, V.IteratorValue):
        items = value.items[value.position:]
        value.position = len(value.items)
        return items
    iterator = get_iter(tx, value)
    if isinstance(iterator, V.LazyIteratorValue):     # an object whose __iter__ is a generator
        return unpack(tx, iterator)
    return iterator.items


def get_iter(tx: Any, value: V.Value) -> V.IteratorValue:
    if isinstance(value, NdarrayValue):  # numpy
        return numpy_ops.get_iter(tx, value)
    if isinstance(value, V.IteratorValue):
        return value
    if isinstance(value, V.ListValue):  # by index over the list itself, as list iterators are: appends show
        iterator = V.IteratorValue([])
        iterator.items = value.items
        return iterator
    if isinstance(value, V.TupleValue):
        return V.IteratorValue(value.items)
    if isinstance(value, V.DictValue):
        return V.IteratorValue([python_result(k) for k in value.items])
    if isinstance(value, V.SetValue):
        if value.objects:
            raise tx.unsupported("iterating over a set of tensors (its order follows their addresses)")
        return V.IteratorValue([python_result(k) for k in value.items])
    if isinstance(value, V.TensorValue):
        if not value.meta.shape:
            raise tx.unsupported("iterating over a 0-d tensor")
        tx.session.pin_sizes(value, (0,))
        return V.IteratorValue([get_item(tx, value, V.ConstantValue(i)) for i in range(value.meta.shape[0])])
    if objects.is_object_like(value):
        return objects.get_iter(tx, value, get_iter)
    if isinstance(value, V.ModuleValue):
        return V.IteratorValue(modules.module_iter(tx, value))
    if isinstance(value, V.ConstantValue) and isinstance(value.value, range) and len(value.value) > MAX_LAZY_ITEMS:
        numbers = iter(value.value)  # a huge range that a loop leaves early: not materialized
        return V.LazyIteratorValue(lambda: python_result(next(numbers)) if numbers.__length_hint__() else None)
    if isinstance(value, V.ConstantValue) and isinstance(value.value, (range, str, tuple, bytes)):
        return V.IteratorValue([python_result(v) for v in value.value])
    if isinstance(value, V.ConstantValue) and isinstance(value.value, (frozenset, set, dict)):
        return V.IteratorValue([python_result(v) for v in value.value])
    raise tx.unsupported(f"iterating over {value.describe()}")


def format_python_value(tx: Any, value: V.Value) -> Any:
    if isinstance(value, V.TensorValue):
        raise tx.unsupported("formatting a tensor into a string (needs its data)")
    return _constant(tx, value, "format")


# ---------------------------------------------------------------- attributes
def get_attr(tx: Any, obj: V.Value, name: str) -> V.Value:
    if isinstance(obj, NdarrayValue):  # numpy
        return numpy_functions.get_attr(tx, obj, name)
    session = tx.session
    if isinstance(obj, V.TensorValue):
        return tensor_ops.tensor_attribute(session, obj, name)
    if isinstance(obj, V.ModuleValue):
        return modules.module_get_attr(tx, obj, name)
    if isinstance(obj, V.SuperValue):
        return _super_attr(tx, obj, name)
    if isinstance(obj, objects.InstanceValue):
        return objects.get_attr(tx, obj, name)
    if isinstance(obj, objects.PartialValue):
        return objects.partial_attr(tx, obj, name)
    if isinstance(obj, V.TupleValue) and name in obj.fields:
        return obj.items[obj.fields.index(name)]
    if isinstance(obj, V.DataclassValue):
        if name in obj.fields:
            return obj.fields[name]
        if name == "__class__":  # the class itself, not object.__class__ (a descriptor)
            return V.ObjectValue(obj.cls)
        return _class_attribute(tx, obj, obj.cls, name)
    if isinstance(obj, (V.TupleValue, V.ListValue, V.DictValue, V.SetValue)):
        if not hasattr(obj.python_type(), name):
            raise tx.unsupported(f"attribute {name!r} of {obj.describe()}")
        return V.ContainerMethodValue(name, obj)
    if isinstance(obj, V.ConstantValue):
        try:
            attr = getattr(obj.value, name)
        except AttributeError:
            raise user_error(tx.session, f"{type(obj.value).__name__} object has no attribute {name!r}") from None
        if callable(attr) and not isinstance(attr, type):
            return V.ContainerMethodValue(name, obj)
        return python_result(attr)
    if isinstance(obj, V.FunctionValue):
        if name in ("__name__", "__qualname__"):
            return V.ConstantValue(obj.name)
        raise tx.unsupported(f"attribute {name!r} of a local function")
    if isinstance(obj, V.BoundMethodValue) and name in ("__func__", "__self__"):
        return obj.func if name == "__func__" else obj.self_value
    if isinstance(obj, V.UserObjectValue):
        pending = session.pending_attr(obj, name)
        if pending is not None:
            return pending
        return _class_attribute(tx, obj, type(obj.obj), name, instance=obj.obj)
    if isinstance(obj, V.ObjectValue):
        return _object_attr(tx, obj, name)
    raise tx.unsupported(f"attribute {name!r} of {obj.describe()}")


def _object_attr(tx: Any, obj: V.ObjectValue, name: str) -> V.Value:
    session = tx.session
    target = obj.obj
    try:
        attr = getattr(target, name)
    except AttributeError:
        raise user_error(tx.session, f"{obj.describe()} has no attribute {name!r}") from None
    if isinstance(target, types.ModuleType) and is_library_module(target):
        return session.wrap(attr, None)
    if isinstance(target, type):
        static = inspect.getattr_static(target, name)
        if isinstance(static, (staticmethod, classmethod)) or isinstance(attr, (types.FunctionType,
                                                                                types.MethodType)):
            if isinstance(attr, types.MethodType):  # classmethod bound to the class
                return V.BoundMethodValue(V.ObjectValue(attr.__func__), obj)
            return V.ObjectValue(attr)
    if obj.source is None:
        return session.wrap(attr, None)
    return session.wrap(attr, AttrSource(obj.source, name))


def _class_attribute(tx: Any, obj: V.Value, cls: type, name: str, instance: Any = None) -> V.Value:
    """Attribute of an instance: Python descriptors are inlined, data read through guarded sources."""
    try:
        static = inspect.getattr_static(cls, name)
    except AttributeError:
        static = None
    if isinstance(static, property):
        return tx.call(V.ObjectValue(static.fget), [obj], {})
    if isinstance(static, types.FunctionType):
        if instance is not None and name in getattr(instance, "__dict__", {}):
            pass
        else:
            return V.BoundMethodValue(V.ObjectValue(static), obj)
    if isinstance(static, staticmethod):
        return V.ObjectValue(static.__func__)
    if isinstance(static, classmethod):
        return V.BoundMethodValue(V.ObjectValue(static.__func__), V.ObjectValue(cls))
    if instance is None:
        if static is None:
            raise tx.unsupported(f"{cls.__name__} has no attribute {name!r}")
        return tx.session.wrap(static, None) if not callable(static) else V.ObjectValue(static)
    try:
        attr = getattr(instance, name)
    except AttributeError:
        raise user_error(tx.session, f"{type(instance).__name__} object has no attribute {name!r}") from None
    return tx.session.wrap(attr, AttrSource(obj.source, name))


def _super_attr(tx: Any, obj: V.SuperValue, name: str) -> V.Value:
    self_value = obj.self_value
    if isinstance(self_value, V.ObjectValue) and isinstance(self_value.obj, type) and \
            issubclass(self_value.obj, obj.cls):
        return _class_super_attr(tx, obj, self_value, name)
    if isinstance(self_value, (V.ObjectValue,)):
        instance_type = type(self_value.obj)
    elif isinstance(self_value, (V.DataclassValue, objects.InstanceValue)):
        instance_type = self_value.cls
    else:
        raise tx.unsupported(f"super() on {self_value.describe()}")
    mro = instance_type.__mro__
    if obj.cls not in mro:      # eager raises TypeError: super(type, obj): obj must be an instance
        raise tx.unsupported(f"super() of {obj.cls.__name__} on a {instance_type.__name__}")
    for klass in mro[mro.index(obj.cls) + 1:]:
        if name in klass.__dict__:
            attr = klass.__dict__[name]
            if isinstance(attr, types.FunctionType):
                return V.BoundMethodValue(V.ObjectValue(attr), self_value)
            if isinstance(attr, property):
                return tx.call(V.ObjectValue(attr.fget), [self_value], {})
            if isinstance(attr, (staticmethod, classmethod)):
                return objects.bind_class_attribute(tx, attr, self_value, instance_type)
            if isinstance(attr, (types.MethodDescriptorType, types.WrapperDescriptorType)) or \
                    callable(attr) and name in ("__init__", "__call__"):
                return V.BoundMethodValue(V.ObjectValue(attr), self_value)
            return tx.session.wrap(attr, None)
    raise tx.unsupported(f"super() has no attribute {name!r}")


def _class_super_attr(tx: Any, obj: V.SuperValue, cls_value: V.ObjectValue, name: str) -> V.Value:
    """``super().name`` in a classmethod (``super(C, cls)``): found along ``cls``'s own MRO after C,
    a classmethod bound to ``cls``, a function unbound (Hugging Face's config classes do this)."""
    mro = cls_value.obj.__mro__
    for klass in mro[mro.index(obj.cls) + 1:]:
        if name in klass.__dict__:
            attr = klass.__dict__[name]
            if isinstance(attr, classmethod):
                return V.BoundMethodValue(V.ObjectValue(attr.__func__), cls_value)
            if isinstance(attr, staticmethod):
                return V.ObjectValue(attr.__func__)
            if isinstance(attr, types.FunctionType) or callable(attr) and not hasattr(type(attr), "__get__"):
                return V.ObjectValue(attr)
            if hasattr(type(attr), "__get__") and not isinstance(attr, type):
                raise tx.unsupported(f"super().{name}: descriptor {type(attr).__name__} on a class")
            return tx.session.wrap(attr, None)
    raise tx.unsupported(f"super() has no attribute {name!r}")


def set_attr(tx: Any, obj: V.Value, name: str, value: V.Value) -> None:
    if isinstance(obj, V.DataclassValue):
        obj.fields[name] = value
        return
    if isinstance(obj, objects.InstanceValue):
        objects.set_attr(tx, obj, name, value)
        return
    if isinstance(obj, V.TensorValue):
        raise tx.unsupported(f"setting tensor attribute .{name}")
    tx.session.record_setattr(obj, name, value)


# ---------------------------------------------------------------- grad mode and autocast
def enter_context(tx: Any, manager: V.Value) -> None:
    if isinstance(manager, autocast.AutocastValue):
        autocast.enter_block(tx, manager)
    else:
        enter_grad_mode(tx, manager)


def enter_generator_context(tx: Any, manager: objects.GeneratorContextValue) -> V.Value:
    """``_GeneratorContextManager.__enter__``: the generator's first yield is the ``as`` value."""
    if manager.entered:
        raise tx.unsupported("a @contextmanager object entered twice")
    manager.entered = True
    item = manager.generator.next_item()
    if item is None:
        raise user_error(tx.session, "generator didn't yield (RuntimeError)")
    return item


def exit_context(tx: Any, manager: V.Value) -> None:
    if isinstance(manager, objects.GeneratorContextValue):  # __exit__ without an exception
        if manager.generator.next_item() is not None:
            raise user_error(tx.session, "generator didn't stop (RuntimeError)")
        return
    if isinstance(manager, autocast.AutocastValue):
        autocast.exit_block(tx, manager)
        if manager in tx.active_contexts:
            tx.active_contexts.remove(manager)
    else:
        exit_grad_mode(tx, manager)


def enter_grad_mode(tx: Any, manager: V.GradModeValue) -> None:
    session = tx.session
    manager.previous = session.grad_enabled
    if manager.enabled != session.grad_enabled:
        session.graph.call(torch._C._set_grad_enabled, (manager.enabled,), {}, None, "set_grad_enabled",
                           session.current_line())
    session.grad_enabled = manager.enabled


def exit_grad_mode(tx: Any, manager: V.GradModeValue) -> None:
    session = tx.session
    if manager.previous is None:
        return
    if manager.previous != session.grad_enabled:
        session.graph.call(torch._C._set_grad_enabled, (manager.previous,), {}, None, "set_grad_enabled",
                           session.current_line())
    session.grad_enabled = manager.previous
    manager.previous = None
    if manager in tx.active_contexts:
        tx.active_contexts.remove(manager)
