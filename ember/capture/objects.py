"""Instances of ordinary Python classes: their Values, attributes and protocols.

``InstanceValue`` is an object created inside the trace (``Output(x=...)``, a
``ModelOutput``, a small helper class): its ``__dict__`` is a dict of Values
and, for ``dict`` / ``OrderedDict`` subclasses, its mapping items are a
DictValue.  Python methods (``__init__``, ``__post_init__``, ``__setattr__``,
``__getitem__``, properties...) are inlined like any Python code (through
``tx.call``: this module sits below calls.py); the C methods they reach
(``object.__setattr__``, ``super().__setitem__``, ``self.keys()``) and
``cls(...)`` itself are in builtins.py (``call_base_method``, ``instantiate``).
When such an object is returned, the epilogue rebuilds it without re-running
``__init__`` (``cls.__new__`` + items + ``__dict__``), so what the user gets
equals what eager code built.

Objects from outside the frame that subclass ``dict`` (registries, configs) are
read through their C methods with a guard per key read (``dict_get_from_outside``).
"""
from __future__ import annotations

import abc
import collections
import contextlib
import functools
import inspect
import types
import typing
from collections.abc import Callable
from typing import Any

from . import values as V
from .sources import Source, index_code, index_key

DICT_BASES = (dict, collections.OrderedDict)
_PLAIN_NEW = {object.__new__, dict.__new__, collections.OrderedDict.__new__}
_READ_ONLY_DICT_METHODS = {"get", "keys", "values", "items", "__getitem__", "__contains__", "__len__",
                           "__iter__", "copy"}
_MISSING = object()
_HEAP_TYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: set for classes written in Python
_ALLOWED_C_BASES = {object, dict, collections.OrderedDict, typing.Generic}
_PLAIN_METACLASSES = {type, abc.ABCMeta, type(typing.Protocol)}
MISSING_VALUE = V.ConstantValue(_MISSING)


class InstanceValue(V.Value):
    """An instance of a Python class built inside the trace."""

    def __init__(self, cls: type) -> None:
        self.cls = cls
        self.attrs: dict[str, V.Value] = {}
        self.dict_items = V.DictValue({}) if issubclass(cls, DICT_BASES) else None

    def python_type(self) -> type:
        return self.cls

    def describe(self) -> str:
        return f"{self.cls.__name__} instance"


class GeneratorContextValue(V.Value):
    """What a ``@contextlib.contextmanager`` function returns, called in the trace: the generator it
    runs (lazily, as eager does).  Only a with-statement drives it (``__enter__``: next(); ``__exit__``:
    next() must finish it), so a try/finally around its yield runs when eager runs it; its attributes,
    returning it or a graph break while it lives are not captured (the frame runs eagerly)."""

    def __init__(self, generator: V.GeneratorValue) -> None:
        self.generator = generator
        self.entered = False

    def python_type(self) -> type:
        return contextlib._GeneratorContextManager

    def describe(self) -> str:
        return f"contextmanager of {self.generator.describe()}"


class PartialValue(V.Value):
    """``functools.partial(func, *args, **keywords)`` built inside the trace."""

    def __init__(self, func: V.Value, args: list[V.Value], keywords: dict[str, V.Value]) -> None:
        self.func = func
        self.args = list(args)
        self.keywords = dict(keywords)

    def python_type(self) -> type:
        return functools.partial

    def describe(self) -> str:
        return f"functools.partial of {self.func.describe()}"


def make_partial(tx: Any, args: list[V.Value], kwargs: dict[str, V.Value]) -> PartialValue:
    if not args:
        raise tx.unsupported("functools.partial() without a function")
    func, rest = args[0], args[1:]
    if isinstance(func, PartialValue):  # partial(partial(f, a), b) flattens, as functools does
        return PartialValue(func.func, func.args + list(rest), {**func.keywords, **kwargs})
    return PartialValue(func, list(rest), kwargs)


def call_partial(tx: Any, partial: PartialValue, args: list[V.Value], kwargs: dict[str, V.Value]) -> V.Value:
    return tx.call(partial.func, partial.args + list(args), {**partial.keywords, **kwargs})


def partial_attr(tx: Any, partial: PartialValue, name: str) -> V.Value:
    if name == "func":
        return partial.func
    if name == "args":
        return V.TupleValue(partial.args)
    if name == "keywords":
        return V.DictValue(partial.keywords)
    raise tx.unsupported(f"attribute {name!r} of functools.partial")


def can_instantiate(cls: type) -> bool:
    """Classes whose construction capture can follow: plain ``__new__``, an ordinary metaclass, and no
    C base class other than object / dict / OrderedDict holding state we cannot model."""
    if not _builds_like_type(type(cls)) or cls.__new__ not in _PLAIN_NEW:
        return False
    return all(base in _ALLOWED_C_BASES or base.__flags__ & _HEAP_TYPE for base in cls.__mro__)


# what a metaclass would have to define to change how instances are made or looked up
_INSTANCE_HOOKS = ("__call__", "__getattribute__", "__getattr__", "__instancecheck__", "__subclasscheck__")


def _builds_like_type(metaclass: type) -> bool:
    """A metaclass that makes instances as ``type`` does: a plain one, or one that customizes only
    class creation or writes to the class (transformers 5.24's ModelOutput metaclass renames the
    keywords of each subclass's ``__init__`` as it is set: its instances are ordinary)."""
    if metaclass in _PLAIN_METACLASSES:
        return True
    return issubclass(metaclass, type) and not any(
        name in vars(base) for base in metaclass.__mro__ if base not in _PLAIN_METACLASSES and base is not object
        for name in _INSTANCE_HOOKS)


# ---------------------------------------------------------------- attributes
def get_attr(tx: Any, obj: InstanceValue, name: str) -> V.Value:
    cls = obj.cls
    if name == "__class__":
        return V.ObjectValue(cls)
    if name == "__dict__":
        view = V.DictValue({})
        view.items = obj.attrs  # the same dict: writes through __dict__ are writes to the object
        return view
    try:
        static = inspect.getattr_static(cls, name)
    except AttributeError:
        static = _MISSING
    if isinstance(static, property):
        if static.fget is None:
            raise tx.unsupported(f"unreadable property {name!r}")
        return tx.call(V.ObjectValue(static.fget), [obj], {})
    if name in obj.attrs:
        return obj.attrs[name]
    if isinstance(static, functools.cached_property):
        value = tx.call(V.ObjectValue(static.func), [obj], {})
        obj.attrs[name] = value
        return value
    if static is not _MISSING:
        return bind_class_attribute(tx, static, obj, cls)
    getattr_hook = inspect.getattr_static(cls, "__getattr__", None)
    if isinstance(getattr_hook, types.FunctionType):
        return tx.call(V.ObjectValue(getattr_hook), [obj, V.ConstantValue(name)], {})
    raise tx.unsupported(f"{cls.__name__} object has no attribute {name!r}")


def bind_class_attribute(tx: Any, static: Any, self_value: V.Value, cls: type) -> V.Value:
    """What ``instance.name`` gives for a class attribute ``static`` (no instance attribute shadowing it)."""
    if isinstance(static, types.FunctionType):
        return V.BoundMethodValue(V.ObjectValue(static), self_value)
    if isinstance(static, staticmethod):
        return V.ObjectValue(static.__func__)
    if isinstance(static, classmethod):
        return V.BoundMethodValue(V.ObjectValue(static.__func__), V.ObjectValue(cls))
    if isinstance(static, (types.MethodDescriptorType, types.WrapperDescriptorType)):
        return V.BoundMethodValue(V.ObjectValue(static), self_value)
    if isinstance(static, (property, functools.cached_property)) or hasattr(type(static), "__get__") \
            and not isinstance(static, type):
        raise tx.unsupported(f"descriptor {type(static).__name__} {getattr(static, '__name__', '')!r}")
    return tx.session.wrap(static, None)


def set_attr(tx: Any, obj: InstanceValue, name: str, value: V.Value) -> None:
    setattr_method = inspect.getattr_static(obj.cls, "__setattr__")
    if isinstance(setattr_method, types.FunctionType):
        tx.call(V.ObjectValue(setattr_method), [obj, V.ConstantValue(name), value], {})
        return
    if setattr_method is not object.__setattr__:
        raise tx.unsupported(f"{obj.cls.__name__}.__setattr__ is not Python code")
    object_setattr(tx, obj, name, value)


def object_setattr(tx: Any, obj: InstanceValue, name: str, value: V.Value) -> None:
    static = inspect.getattr_static(obj.cls, name, None)
    if isinstance(static, property):
        if static.fset is None:
            raise tx.unsupported(f"can't set attribute {name!r}")
        tx.call(V.ObjectValue(static.fset), [obj, value], {})
        return
    if static is not None and hasattr(type(static), "__set__") and not isinstance(static, functools.cached_property):
        raise tx.unsupported(f"setting data descriptor {name!r} of {obj.cls.__name__}")
    obj.attrs[name] = value


# ---------------------------------------------------------------- protocols (truth, in, [], iteration)
def _python_dunder(obj: V.Value, name: str) -> types.FunctionType | None:
    method = inspect.getattr_static(obj.python_type(), name, None)
    return method if isinstance(method, types.FunctionType) else None


def _call_dunder(tx: Any, method: types.FunctionType, obj: V.Value, *args: V.Value) -> V.Value:
    return tx.call(V.ObjectValue(method), [obj, *args], {})


def _items_of(tx: Any, obj: V.Value, method: str) -> V.DictValue | None:
    if isinstance(obj, InstanceValue):
        return obj.dict_items
    if isinstance(obj, V.UserObjectValue) and isinstance(obj.obj, dict) and obj.source is not None:
        return dict_view_from_outside(tx, obj)
    return None


def is_object_like(value: V.Value) -> bool:
    """Instances of Python classes whose protocols (in, [], len, iter, bool) may be Python code."""
    return isinstance(value, (InstanceValue, V.UserObjectValue))


# The generic operation (``truth_of``, ``contains_of``...) is passed in by operations.py, which
# applies it to what a Python dunder returned (itself any Value) or to the dict items.
def truthiness(tx: Any, obj: V.Value, truth_of: Callable[[Any, V.Value], bool]) -> bool:
    for name in ("__bool__", "__len__"):
        method = _python_dunder(obj, name)
        if method is not None:
            return truth_of(tx, _call_dunder(tx, method, obj))
    cls = obj.python_type()
    if not hasattr(cls, "__bool__") and not hasattr(cls, "__len__"):
        return True
    items = _items_of(tx, obj, "__len__")
    if items is not None:
        return bool(items.items)
    raise tx.unsupported(f"truth value of {obj.describe()}")


def contains(tx: Any, obj: V.Value, item: V.Value, contains_of: Callable[[Any, V.Value, V.Value], bool],
             truth_of: Callable[[Any, V.Value], bool]) -> bool:
    method = _python_dunder(obj, "__contains__")
    if method is not None:
        return truth_of(tx, _call_dunder(tx, method, obj, item))
    if isinstance(obj, V.UserObjectValue) and isinstance(obj.obj, dict) and obj.source is not None:
        return dict_get_from_outside(tx, obj, item.as_python(), MISSING_VALUE) is not MISSING_VALUE
    items = _items_of(tx, obj, "__contains__")
    if items is not None:
        return contains_of(tx, items, item)
    raise tx.unsupported(f"`in` on {obj.describe()}")


def get_item(tx: Any, obj: V.Value, index: V.Value,
             get_item_of: Callable[[Any, V.Value, V.Value], V.Value]) -> V.Value | None:
    """obj[index]; None when a UserObjectValue has only a C __getitem__ (the caller reads it for real)."""
    method = _python_dunder(obj, "__getitem__")
    if method is not None:
        return _call_dunder(tx, method, obj, index)
    if isinstance(obj, V.UserObjectValue) and isinstance(obj.obj, dict) and obj.source is not None:
        key = index.as_python()
        found = dict_get_from_outside(tx, obj, key, MISSING_VALUE)
        if found is MISSING_VALUE:
            raise tx.unsupported(f"KeyError {key!r}")
        return found
    if isinstance(obj, InstanceValue) and obj.dict_items is not None:
        return get_item_of(tx, obj.dict_items, index)
    if isinstance(obj, V.UserObjectValue):
        return None
    raise tx.unsupported(f"indexing {obj.describe()}")


def set_item(tx: Any, obj: V.Value, index: V.Value, value: V.Value) -> None:
    method = _python_dunder(obj, "__setitem__")
    if method is not None:
        _call_dunder(tx, method, obj, index, value)
        return
    if isinstance(obj, InstanceValue) and obj.dict_items is not None:
        obj.dict_items.items[index.as_python()] = value
        return
    raise tx.unsupported(f"item assignment on {obj.describe()}")


def get_iter(tx: Any, obj: V.Value, get_iter_of: Callable[[Any, V.Value], V.IteratorValue]) -> V.IteratorValue:
    method = _python_dunder(obj, "__iter__")
    if method is not None:
        return get_iter_of(tx, _call_dunder(tx, method, obj))
    items = _items_of(tx, obj, "__iter__")
    if items is not None:
        return get_iter_of(tx, items)
    raise tx.unsupported(f"iterating over {obj.describe()}")


def length(tx: Any, obj: V.Value) -> int:
    method = _python_dunder(obj, "__len__")
    if method is not None:
        return _call_dunder(tx, method, obj).as_python()
    items = _items_of(tx, obj, "__len__")
    if items is not None:
        return len(items.items)
    raise tx.unsupported(f"len() of {obj.describe()}")


# ---------------------------------------------------------------- operators (+, -, ==, <, unary -)
# Python's protocol, as CPython's binary_op1 / do_richcompare run it: the left operand's method, then
# the right operand's reflected one (first instead, when the right type is a subclass of the left type
# that overrides it); NotImplemented from both is a TypeError (binary) or identity (==, !=).
BINARY_DUNDERS = {
    "+": ("__add__", "__radd__"), "-": ("__sub__", "__rsub__"), "*": ("__mul__", "__rmul__"),
    "/": ("__truediv__", "__rtruediv__"), "//": ("__floordiv__", "__rfloordiv__"), "%": ("__mod__", "__rmod__"),
    "**": ("__pow__", "__rpow__"), "@": ("__matmul__", "__rmatmul__"), "&": ("__and__", "__rand__"),
    "|": ("__or__", "__ror__"), "^": ("__xor__", "__rxor__"), "<<": ("__lshift__", "__rlshift__"),
    ">>": ("__rshift__", "__rrshift__"),
}
COMPARE_DUNDERS = {"<": ("__lt__", "__gt__"), "<=": ("__le__", "__ge__"), "==": ("__eq__", "__eq__"),
                   "!=": ("__ne__", "__ne__"), ">": ("__gt__", "__lt__"), ">=": ("__ge__", "__le__")}
UNARY_DUNDERS = {"neg": "__neg__", "pos": "__pos__", "invert": "__invert__", "abs": "__abs__"}
# operands whose own method returns NotImplemented for an instance of a Python class
_SCALARS = (int, float, complex, bool, type(None))
_COMPARED_AS_NOT_IMPLEMENTED = _SCALARS + (str, bytes)
_BUILTIN_EQ = (tuple.__eq__, list.__eq__, dict.__eq__)
NO_RESULT = object()  # every method tried returned NotImplemented


def has_python_operators(value: V.Value) -> bool:
    """Instances of Python classes, whose operators are their (Python) dunder methods."""
    return isinstance(value, (InstanceValue, V.UserObjectValue, V.DataclassValue))


def _is_not_implemented(value: V.Value) -> bool:
    return getattr(value, "obj", None) is NotImplemented or getattr(value, "value", None) is NotImplemented


class OperatorHelpers:
    """The generic operations objects.py needs from operations.py (which sits above it)."""

    def __init__(self, same: Callable[[Any, V.Value, V.Value], bool],
                 truth_of: Callable[[Any, V.Value], bool]) -> None:
        self.same = same
        self.truth_of = truth_of


def _operand_method(tx: Any, value: V.Value, name: str, other: V.Value, compare: bool,
                    helpers: OperatorHelpers) -> Any:
    """``value.name(other)``: its result Value, or NO_RESULT for NotImplemented (or no such method)."""
    if not has_python_operators(value):
        if isinstance(value, V.ConstantValue) and \
                type(value.value) in (_COMPARED_AS_NOT_IMPLEMENTED if compare else _SCALARS):
            return NO_RESULT
        if compare and isinstance(value, (V.TupleValue, V.ListValue, V.DictValue)) and \
                value.python_type().__eq__ in _BUILTIN_EQ:
            return NO_RESULT  # list/tuple/dict compare only with their own kind
        raise tx.unsupported(f"operator {name} between {value.describe()} and {other.describe()}")
    cls = value.python_type()
    method = inspect.getattr_static(cls, name, _MISSING)
    if method is _MISSING:
        return NO_RESULT
    if isinstance(method, types.FunctionType):
        result = tx.call(V.ObjectValue(method), [value, other], {})
        return NO_RESULT if _is_not_implemented(result) else result
    if method is object.__eq__:  # the default: identity, else NotImplemented
        return V.ConstantValue(True) if helpers.same(tx, value, other) else NO_RESULT
    if method is object.__ne__:  # the default: the inverse of __eq__, unless that is NotImplemented
        equal = _operand_method(tx, value, "__eq__", other, compare, helpers)
        return equal if equal is NO_RESULT else V.ConstantValue(not helpers.truth_of(tx, equal))
    if method in (object.__lt__, object.__le__, object.__gt__, object.__ge__):
        return NO_RESULT
    raise tx.unsupported(f"{cls.__name__}.{name} is not Python code")


def _dispatch(tx: Any, forward: str, reflected: str, left: V.Value, right: V.Value, compare: bool,
              helpers: OperatorHelpers) -> Any:
    left_type, right_type = left.python_type(), right.python_type()
    different = left_type is not right_type
    reflected_first = different and has_python_operators(right) and issubclass(right_type, left_type) and (
        compare or inspect.getattr_static(right_type, reflected, None)
        is not inspect.getattr_static(left_type, reflected, None))
    if reflected_first:
        result = _operand_method(tx, right, reflected, left, compare, helpers)
        if result is not NO_RESULT:
            return result
    result = _operand_method(tx, left, forward, right, compare, helpers)
    if result is not NO_RESULT:
        return result
    if not reflected_first and (different or compare):  # comparisons try the reflected one on equal types too
        return _operand_method(tx, right, reflected, left, compare, helpers)
    return NO_RESULT


def binary_operator(tx: Any, symbol: str, left: V.Value, right: V.Value, helpers: OperatorHelpers) -> Any:
    """``left <symbol> right`` where a side is an instance of a Python class (``+=``: ``__iadd__`` first).
    NO_RESULT: NotImplemented from every side (eager raises TypeError)."""
    if symbol.endswith("=") and symbol[:-1] in BINARY_DUNDERS:
        symbol = symbol[:-1]
        inplace = "__i" + BINARY_DUNDERS[symbol][0][2:]
        if has_python_operators(left):
            result = _operand_method(tx, left, inplace, right, False, helpers)
            if result is not NO_RESULT:
                return result
    forward, reflected = BINARY_DUNDERS[symbol]
    return _dispatch(tx, forward, reflected, left, right, False, helpers)


def compare_operator(tx: Any, symbol: str, left: V.Value, right: V.Value, helpers: OperatorHelpers) -> V.Value:
    """``left <symbol> right`` (==, <, ...) where a side is an instance of a Python class; NO_RESULT:
    NotImplemented everywhere (== and != then compare identity, the others raise TypeError)."""
    forward, reflected = COMPARE_DUNDERS[symbol]
    result = _dispatch(tx, forward, reflected, left, right, True, helpers)
    if result is NO_RESULT and symbol in ("==", "!="):
        return V.ConstantValue(helpers.same(tx, left, right) == (symbol == "=="))
    return result


def unary_operator(tx: Any, name: str, value: V.Value) -> Any:
    """``-value``, ``+value``, ``~value``, ``abs(value)``; NO_RESULT: no such method (TypeError)."""
    method = inspect.getattr_static(value.python_type(), UNARY_DUNDERS[name], _MISSING)
    if method is _MISSING:
        return NO_RESULT
    if not isinstance(method, types.FunctionType):
        raise tx.unsupported(f"{value.python_type().__name__}.{UNARY_DUNDERS[name]} is not Python code")
    return tx.call(V.ObjectValue(method), [value], {})


# ---------------------------------------------------------------- str(), repr(), format()
def to_string(tx: Any, value: V.Value, kind: str, spec: str = "") -> V.Value:
    """``repr(value)`` / ``str(value)`` / ``format(value, spec)`` of an instance of a Python class: its
    Python ``__repr__`` / ``__str__`` / ``__format__`` inlined.  object's defaults fall back as CPython's
    do (``__format__`` -> str, ``__str__`` -> repr); object's own repr shows an address: not captured."""
    cls = value.python_type()
    name = {"repr": "__repr__", "str": "__str__", "format": "__format__"}[kind]
    method = inspect.getattr_static(cls, name, _MISSING)
    if isinstance(method, types.FunctionType):
        result = tx.call(V.ObjectValue(method), [value] + ([V.ConstantValue(spec)] if kind == "format" else []), {})
        if not (isinstance(result, V.ConstantValue) and isinstance(result.value, str)):
            raise tx.unsupported(f"{cls.__name__}.{name} returned {result.describe()}")
        return result
    if method is object.__format__ and not spec:
        return to_string(tx, value, "str")
    if method is object.__str__:
        return to_string(tx, value, "repr")
    raise tx.unsupported(f"{kind}() of {value.describe()} ({cls.__name__}.{name} is not Python code)")


def mapping_of(tx: Any, value: V.Value, method: str) -> V.DictValue | None:
    """The DictValue holding the items of a dict-like Value (None: not dict-like)."""
    if isinstance(value, InstanceValue):
        return value.dict_items
    if isinstance(value, V.DictValue):
        return value
    if isinstance(value, V.UserObjectValue) and isinstance(value.obj, dict) and value.source is not None:
        if method not in _READ_ONLY_DICT_METHODS:
            raise tx.unsupported(f"dict.{method} on a dict subclass passed in (mutation)")
        return dict_view_from_outside(tx, value)
    return None


# ---------------------------------------------------------------- dict subclasses from outside
class DictItemSource(Source):
    """``dict.__getitem__(parent, key)``: the stored item, past any ``__getitem__`` override."""

    def __init__(self, parent: Source, index: Any) -> None:
        self.parent = parent
        self.index = index

    def access(self, parent_code: str, namespace: Any) -> str:
        return f"{namespace.bind(dict.__getitem__, 'dict_getitem')}({parent_code}, {index_code(self.index, namespace)})"

    def key(self) -> str:
        return f"{self.parent.key()}<dict>[{index_key(self.index)}]"


def dict_view_from_outside(tx: Any, value: V.UserObjectValue) -> V.DictValue:
    """All items of a dict subclass read from outside, guarded by its key list (keys()/items()/len)."""
    session = tx.session
    cached = getattr(value, "_dict_view", None)
    if cached is not None:
        return cached
    keys = list(dict.keys(value.obj))
    if not all(isinstance(k, (str, int)) for k in keys):
        raise tx.unsupported("a dict subclass with keys other than str/int")
    session.guards.add(value.source, "list({keys_of}({v})) == {keys}", keys_of=dict.keys, keys=keys)
    view = V.DictValue({k: session.wrap(dict.__getitem__(value.obj, k), DictItemSource(value.source, k))
                        for k in keys})
    value._dict_view = view
    return view


def dict_get_from_outside(tx: Any, value: V.UserObjectValue, key: Any, default: V.Value) -> V.Value:
    """``d.get(key, default)`` on an outside dict subclass: guards only the key read."""
    session = tx.session
    present = dict.__contains__(value.obj, key)
    session.guards.add(value.source, "{contains}({v}, {key}) is {present}", contains=dict.__contains__, key=key,
                       present=present)
    if not present:
        return default
    return session.wrap(dict.__getitem__(value.obj, key), DictItemSource(value.source, key))


# ---------------------------------------------------------------- epilogue
_DICT_BASE_OF: dict[type, type] = {}  # per class: its mapping base (the MRO is fixed per class)


def rebuild_instance(cls: type, items: list | None, attrs: dict) -> Any:
    """Build ``cls`` with exactly these mapping items and ``__dict__``, without calling ``__init__``."""
    obj = cls.__new__(cls)
    if items is not None:
        base = _DICT_BASE_OF.get(cls)
        if base is None:
            base = _DICT_BASE_OF[cls] = next(b for b in cls.__mro__ if b in DICT_BASES)
        for key, value in items:
            base.__setitem__(obj, key, value)
    for name, value in attrs.items():
        object.__setattr__(obj, name, value)
    return obj
