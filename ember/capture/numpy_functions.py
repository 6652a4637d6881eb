"""``np.*`` functions and ndarray methods inside a capture, recorded as torch ops.

``FUNCTIONS`` maps each supported NumPy callable to a handler written with
NumPy's own signature (``axis``, ``keepdims``, ``dtype``; ``out=`` is never
supported), so Python binds the user's arguments exactly as NumPy would.  A
handler reads shapes and dtypes from the NdarrayValues, asks NumPy for the
result dtype on tiny stand-in arrays where the rule is not obvious, and records
torch ops (``numpy_ops.record``).  ``METHODS`` maps ndarray methods onto the
same handlers.  Any other NumPy callable is Unsupported (a graph break).

``wants_call``/``call`` are the entry from ``calls.call``: NumPy callables, methods
of ndarrays, ``len``/``abs``/``operator.*`` on ndarrays, ``torch.from_numpy`` and
``tensor.numpy()`` (the bridges between the two worlds).
"""
from __future__ import annotations

import inspect
import math
import operator
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ..errors import Unsupported
from . import numpy_shapes as shapes
from . import values as V
from .numpy_ops import (
    NO_VALUE,
    UFUNCS,
    apply_ufunc,
    as_array,
    assign,
    axes_arg,
    axis_arg,
    OPERATOR_UFUNCS,
    no_torch_mix,
    cast,
    check_writable,
    compare,
    constant,
    dtype_arg,
    full,
    probe_dtype,
    record,
    reject,
    result,
    stand_in,
    swap_last,
    unary_op,
    user_error,
)
from .numpy_values import TORCH_DTYPE, NdarrayValue, NumpyMethodValue, numpy_device


# ---------------------------------------------------------------- reductions
def _reduction(name: str) -> Callable:
    np_fn = getattr(np, name)

    def handler(tx: Any, a: V.Value, axis: Any = None, dtype: Any = None, out: Any = None,
                keepdims: Any = False, initial: Any = NO_VALUE, where: Any = NO_VALUE) -> V.Value:
        reject(tx, name, out=out, initial=initial, where=where)
        a = as_array(tx, a)
        keepdims = bool(constant(tx, keepdims, "keepdims"))
        requested = dtype_arg(tx, dtype)
        axes = axes_arg(tx, a, axis)
        out_dtype = probe_dtype(tx, np_fn, stand_in(a), axis=constant(tx, axis, "axis"), dtype=requested,
                           keepdims=keepdims)
        if not axes and a.ndim:  # axis=(): no reduction
            return result(cast(tx, record(tx, torch.clone, a.tensor), out_dtype))
        if name == "sum":
            tensor = record(tx, torch.sum, cast(tx, a, out_dtype), list(axes), keepdims)
        elif name == "mean":
            tensor = record(tx, torch.mean, cast(tx, a, out_dtype), list(axes), keepdims)
        else:  # prod: one dim at a time
            tensor = cast(tx, a, out_dtype)
            for dim in sorted(axes, reverse=True):
                tensor = record(tx, torch.prod, tensor, dim, keepdims)
        return result(tensor)
    handler.__name__ = name
    return handler


def _extremum(name: str, torch_fn: Callable) -> Callable:
    def handler(tx: Any, a: V.Value, axis: Any = None, out: Any = None, keepdims: Any = False,
                initial: Any = NO_VALUE, where: Any = NO_VALUE) -> V.Value:
        reject(tx, name, out=out, initial=initial, where=where)
        a = as_array(tx, a)
        keepdims = bool(constant(tx, keepdims, "keepdims"))
        axes = axes_arg(tx, a, axis)
        if any(a.shape[d] == 0 for d in axes) or (not a.ndim and 0 in a.shape):
            raise user_error(tx, f"zero-size array to reduction operation {name}")
        if not axes:
            return result(record(tx, torch.clone, a.tensor))
        return result(record(tx, torch_fn, a.tensor, list(axes), keepdims))
    handler.__name__ = name
    return handler


def _logical_reduction(name: str, torch_fn: Callable) -> Callable:
    def handler(tx: Any, a: V.Value, axis: Any = None, out: Any = None, keepdims: Any = False,
                where: Any = NO_VALUE) -> V.Value:
        reject(tx, name, out=out, where=where)
        a = as_array(tx, a)
        keepdims = bool(constant(tx, keepdims, "keepdims"))
        axes = axes_arg(tx, a, axis)
        tensor = record(tx, torch.ne, a.tensor, 0) if a.dtype != np.bool_ else a.tensor
        if not axes:
            return result(record(tx, torch.clone, tensor))
        return result(record(tx, torch_fn, tensor, tuple(axes), keepdims))
    handler.__name__ = name
    return handler


def _arg_extremum(name: str, torch_fn: Callable) -> Callable:
    def handler(tx: Any, a: V.Value, axis: Any = None, out: Any = None, *, keepdims: Any = False) -> V.Value:
        reject(tx, name, out=out)
        a = as_array(tx, a)
        keepdims = bool(constant(tx, keepdims, "keepdims"))
        if 0 in a.shape:
            raise user_error(tx, f"attempt to get {name} of an empty sequence")
        tensor = a.tensor if a.dtype != np.bool_ else cast(tx, a, np.dtype(np.uint8))
        if constant(tx, axis, "axis") is None:
            flat = record(tx, torch.argmax if name == "argmax" else torch.argmin, tensor)
            if keepdims:
                flat = record(tx, torch.reshape, flat, (1,) * a.ndim)
            return result(flat)
        return result(record(tx, torch_fn, tensor, axis_arg(tx, a, axis), keepdims))
    handler.__name__ = name
    return handler


def _variance(name: str) -> Callable:
    def handler(tx: Any, a: V.Value, axis: Any = None, dtype: Any = None, out: Any = None, ddof: Any = 0,
                keepdims: Any = False, *, where: Any = NO_VALUE, mean: Any = NO_VALUE,
                correction: Any = NO_VALUE) -> V.Value:
        reject(tx, name, out=out, where=where, mean=mean, correction=correction)
        a = as_array(tx, a)
        keepdims = bool(constant(tx, keepdims, "keepdims"))
        axes = axes_arg(tx, a, axis)
        ddof = constant(tx, ddof, "ddof")
        out_dtype = probe_dtype(tx, getattr(np, name), stand_in(a), axis=constant(tx, axis, "axis"),
                           dtype=dtype_arg(tx, dtype), keepdims=keepdims)
        if not axes and a.ndim:
            return result(full(tx, a.shape, 0.0, out_dtype))
        fn = torch.var if name == "var" else torch.std
        return result(record(tx, fn, cast(tx, a, out_dtype), list(axes), correction=ddof, keepdim=keepdims))
    handler.__name__ = name
    return handler


def _cumulative(name: str, torch_fn: Callable) -> Callable:
    def handler(tx: Any, a: V.Value, axis: Any = None, dtype: Any = None, out: Any = None) -> V.Value:
        reject(tx, name, out=out)
        a = as_array(tx, a)
        out_dtype = probe_dtype(tx, getattr(np, name), stand_in(a), axis=constant(tx, axis, "axis"),
                           dtype=dtype_arg(tx, dtype))
        tensor = cast(tx, a, out_dtype)
        if constant(tx, axis, "axis") is None:
            tensor, dim = record(tx, torch.reshape, tensor, (-1,)), 0
        else:
            dim = axis_arg(tx, a, axis)
        return result(record(tx, torch_fn, tensor, dim), scalar=False)
    handler.__name__ = name
    return handler


def count_nonzero(tx: Any, a: V.Value, axis: Any = None, *, keepdims: Any = False) -> V.Value:
    a = as_array(tx, a)
    nonzero = NdarrayValue(record(tx, torch.ne, a.tensor, 0))
    return FUNCTIONS[np.sum](tx, nonzero, axis=axis, keepdims=keepdims)


def ptp(tx: Any, a: V.Value, axis: Any = None, out: Any = None, keepdims: Any = False) -> V.Value:
    reject(tx, "ptp", out=out)
    high = FUNCTIONS[np.max](tx, a, axis=axis, keepdims=keepdims)
    low = FUNCTIONS[np.min](tx, a, axis=axis, keepdims=keepdims)
    return apply_ufunc(tx, np.subtract, [high, low])


# ---------------------------------------------------------------- elementwise functions that are not ufuncs
def where(tx: Any, condition: V.Value, x: Any = NO_VALUE, y: Any = NO_VALUE) -> V.Value:
    if x is NO_VALUE or y is NO_VALUE:
        raise tx.unsupported("np.where(condition) with one argument (its shape depends on the data)")
    condition = as_array(tx, condition)
    mask = condition.tensor if condition.dtype == np.bool_ else record(tx, torch.ne, condition.tensor, 0)
    operands = [x, y]
    stand_ins = [o.value if isinstance(o, V.ConstantValue) and type(o.value) in (int, float, bool)
                 else stand_in(as_array(tx, o)) for o in operands]
    out_dtype = probe_dtype(tx, np.where, np.ones((1,) * condition.ndim, bool), *stand_ins)
    tensors = [full(tx, (), o.value, out_dtype) if isinstance(o, V.ConstantValue) and
               type(o.value) in (int, float, bool) else cast(tx, as_array(tx, o), out_dtype) for o in operands]
    return result(record(tx, torch.where, mask, *tensors))


def clip(tx: Any, a: V.Value, a_min: Any = NO_VALUE, a_max: Any = NO_VALUE, out: Any = None, *,
         min: Any = NO_VALUE, max: Any = NO_VALUE, **kwargs: Any) -> V.Value:
    reject(tx, "clip", out=out, **kwargs)
    low = a_min if a_min is not NO_VALUE else min
    high = a_max if a_max is not NO_VALUE else max
    value = as_array(tx, a)
    if low is not NO_VALUE and not (isinstance(low, V.ConstantValue) and low.value is None):
        value = apply_ufunc(tx, np.maximum, [value, low])
    if high is not NO_VALUE and not (isinstance(high, V.ConstantValue) and high.value is None):
        value = apply_ufunc(tx, np.minimum, [value, high])
    return value


def round_(tx: Any, a: V.Value, decimals: Any = 0, out: Any = None) -> V.Value:
    reject(tx, "round", out=out)
    a = as_array(tx, a)
    decimals = constant(tx, decimals, "decimals")
    if not np.issubdtype(a.dtype, np.floating):
        if decimals >= 0:
            return result(record(tx, torch.clone, a.tensor))
        raise tx.unsupported("np.round of integers to negative decimals")
    return result(record(tx, torch.round, a.tensor, decimals=decimals))


# ---------------------------------------------------------------- linear algebra
def matmul(tx: Any, a: V.Value, b: V.Value, out: Any = None, **kwargs: Any) -> V.Value:
    reject(tx, "matmul", out=out, **kwargs)
    a, b = as_array(tx, a), as_array(tx, b)
    out_dtype = probe_dtype(tx, np.matmul, stand_in(a), stand_in(b))
    if out_dtype == np.bool_:
        raise tx.unsupported("np.matmul of boolean arrays")
    return result(record(tx, torch.matmul, cast(tx, a, out_dtype), cast(tx, b, out_dtype)))


def dot(tx: Any, a: V.Value, b: V.Value, out: Any = None) -> V.Value:
    reject(tx, "dot", out=out)
    a, b = as_array(tx, a), as_array(tx, b)
    if a.ndim == 0 or b.ndim == 0:
        return apply_ufunc(tx, np.multiply, [a, b])
    if a.ndim > 2 or b.ndim > 2:
        raise tx.unsupported("np.dot of arrays with more than 2 dimensions")
    return matmul(tx, a, b)


def outer(tx: Any, a: V.Value, b: V.Value, out: Any = None) -> V.Value:
    reject(tx, "outer", out=out)
    a, b = shapes.ravel(tx, a), shapes.ravel(tx, b)
    return apply_ufunc(tx, np.multiply, [shapes.expand_dims(tx, a, 1), shapes.expand_dims(tx, b, 0)])


def einsum(tx: Any, subscripts: Any, *operands: V.Value, out: Any = None, dtype: Any = None,
           order: Any = "K", casting: Any = "safe", optimize: Any = False) -> V.Value:
    reject(tx, "einsum", out=out, dtype=dtype)
    subscripts = constant(tx, subscripts, "einsum subscripts")
    if not isinstance(subscripts, str):
        raise tx.unsupported("np.einsum in the interleaved (operand, sublist) form")
    arrays = [as_array(tx, o) for o in operands]
    out_dtype = probe_dtype(tx, np.einsum, subscripts, *[np.ones([1] * a.ndim, a.dtype) for a in arrays])
    if out_dtype == np.bool_:
        raise tx.unsupported("np.einsum of boolean arrays")
    return result(record(tx, torch.einsum, subscripts, *[cast(tx, a, out_dtype) for a in arrays]))


def norm(tx: Any, x: V.Value, ord: Any = None, axis: Any = None, keepdims: Any = False) -> V.Value:
    """np.linalg.norm: vector norms over one axis (or a flattened array) and the Frobenius norm."""
    x = as_array(tx, x)
    order = constant(tx, ord, "ord")
    keepdims = bool(constant(tx, keepdims, "keepdims"))
    axis_value = constant(tx, axis, "axis")
    out_dtype = probe_dtype(tx, np.linalg.norm, stand_in(x), ord=order, axis=axis_value, keepdims=keepdims)
    x = NdarrayValue(cast(tx, x, out_dtype))
    if axis_value is None:
        if order is not None and not (x.ndim == 2 and order == "fro") and not (x.ndim == 1):
            raise tx.unsupported(f"np.linalg.norm(ord={order!r}) of a matrix")
        axes = tuple(range(x.ndim))
    else:
        axes = axes_arg(tx, x, axis_value)
        if len(axes) == 2 and order not in (None, "fro"):
            raise tx.unsupported(f"np.linalg.norm(ord={order!r}) of a matrix")
    if order in (None, 2, "fro"):
        total = record(tx, torch.sum, record(tx, torch.mul, x.tensor, x.tensor), list(axes), keepdims)
        return result(record(tx, torch.sqrt, total))
    magnitude = record(tx, torch.abs, x.tensor) if order != 0 else x.tensor
    if order == math.inf:
        return result(record(tx, torch.amax, magnitude, list(axes), keepdims))
    if order == -math.inf:
        return result(record(tx, torch.amin, magnitude, list(axes), keepdims))
    if order == 0:
        nonzero = cast(tx, record(tx, torch.ne, x.tensor, 0), out_dtype)
        return result(record(tx, torch.sum, nonzero, list(axes), keepdims))
    if order == 1:
        return result(record(tx, torch.sum, magnitude, list(axes), keepdims))
    if isinstance(order, (int, float)):
        powered = record(tx, torch.pow, magnitude, float(order))
        total = record(tx, torch.sum, powered, list(axes), keepdims)
        return result(record(tx, torch.pow, total, 1.0 / order))
    raise tx.unsupported(f"np.linalg.norm(ord={order!r})")


# ---------------------------------------------------------------- queries answered from metadata
def _shape_of(tx: Any, a: V.Value) -> V.Value:
    a = as_array(tx, a)
    return V.TupleValue([V.ConstantValue(s) for s in a.shape])


def _ndim_of(tx: Any, a: V.Value) -> V.Value:
    return V.ConstantValue(as_array(tx, a).ndim)


def _size_of(tx: Any, a: V.Value, axis: Any = None) -> V.Value:
    a = as_array(tx, a)
    axis = constant(tx, axis, "axis")
    return V.ConstantValue(int(np.prod(a.shape)) if axis is None else a.shape[axis])


def _dtype_query(fn: Callable) -> Callable:
    """np.result_type / np.promote_types / np.can_cast / np.issubdtype ...: arrays become stand-ins."""
    def handler(tx: Any, *args: V.Value, **kwargs: V.Value) -> V.Value:
        def real(value: V.Value) -> Any:
            return stand_in(value) if isinstance(value, NdarrayValue) else constant(tx, value, fn.__name__)
        try:
            answer = fn(*[real(a) for a in args], **{k: real(v) for k, v in kwargs.items()})
        except (TypeError, ValueError) as error:
            raise user_error(tx, str(error)) from None
        return V.ConstantValue(answer) if not isinstance(answer, tuple) else V.TupleValue(
            [V.ConstantValue(v) for v in answer])
    return handler


def _scalar_type(np_type: type) -> Callable:
    """``np.float32(x)``: a NumPy scalar from a constant, or an array cast."""
    def handler(tx: Any, value: Any = 0) -> V.Value:
        if isinstance(value, NdarrayValue):
            return result(cast(tx, value, np.dtype(np_type)), scalar=value.scalar)
        try:
            return V.ConstantValue(np_type(constant(tx, value, np_type.__name__)))
        except (TypeError, ValueError, OverflowError) as error:
            raise user_error(tx, str(error)) from None
    return handler


def _ufunc_handler(ufunc: np.ufunc) -> Callable:
    def handler(tx: Any, *operands: V.Value, out: Any = None, where: Any = NO_VALUE, dtype: Any = None,
                casting: Any = NO_VALUE, order: Any = NO_VALUE, subok: Any = NO_VALUE,
                signature: Any = None) -> V.Value:
        reject(tx, ufunc.__name__, out=out, where=where, casting=casting, order=order, subok=subok,
                signature=signature)
        return apply_ufunc(tx, ufunc, list(operands), dtype)
    return handler


FUNCTIONS: dict[Any, Callable] = {ufunc: _ufunc_handler(ufunc) for ufunc in UFUNCS}
FUNCTIONS.update({
    np.sum: _reduction("sum"), np.mean: _reduction("mean"), np.prod: _reduction("prod"),
    np.max: _extremum("max", torch.amax), np.min: _extremum("min", torch.amin),
    np.amax: _extremum("max", torch.amax), np.amin: _extremum("min", torch.amin),
    np.argmax: _arg_extremum("argmax", torch.argmax), np.argmin: _arg_extremum("argmin", torch.argmin),
    np.any: _logical_reduction("any", torch.any), np.all: _logical_reduction("all", torch.all),
    np.var: _variance("var"), np.std: _variance("std"), np.cumsum: _cumulative("cumsum", torch.cumsum),
    np.cumprod: _cumulative("cumprod", torch.cumprod), np.count_nonzero: count_nonzero, np.ptp: ptp,
    np.where: where, np.clip: clip, np.round: round_, np.around: round_,
    np.matmul: matmul, np.dot: dot, np.outer: outer, np.einsum: einsum, np.linalg.norm: norm,
    np.zeros: shapes._factory(0), np.ones: shapes._factory(1), np.empty: shapes._factory(0), np.full: shapes.full_,
    np.zeros_like: shapes._like_factory(0), np.ones_like: shapes._like_factory(1), np.empty_like: shapes._like_factory(0),
    np.full_like: shapes.full_like, np.arange: shapes.arange, np.linspace: shapes.linspace, np.eye: shapes.eye, np.identity: shapes.identity,
    np.array: shapes.array, np.asarray: shapes.asarray, np.copy: shapes.copy,
    np.reshape: shapes.reshape, np.transpose: shapes.transpose, np.swapaxes: shapes.swapaxes, np.moveaxis: shapes.moveaxis,
    np.expand_dims: shapes.expand_dims, np.squeeze: shapes.squeeze, np.ravel: shapes.ravel, np.broadcast_to: shapes.broadcast_to,
    np.stack: shapes.stack, np.concatenate: shapes.concatenate, np.vstack: shapes.vstack, np.hstack: shapes.hstack,
    np.sort: shapes.sort, np.argsort: shapes.argsort, np.flip: shapes.flip, np.roll: shapes.roll, np.tril: shapes._triangle(torch.tril),
    np.triu: shapes._triangle(torch.triu), np.tile: shapes.tile, np.repeat: shapes.repeat,
    np.shape: _shape_of, np.ndim: _ndim_of, np.size: _size_of,
    np.result_type: _dtype_query(np.result_type), np.promote_types: _dtype_query(np.promote_types),
    np.can_cast: _dtype_query(np.can_cast), np.issubdtype: _dtype_query(np.issubdtype),
    np.dtype: _dtype_query(np.dtype), np.finfo: _dtype_query(np.finfo), np.iinfo: _dtype_query(np.iinfo),
})
FUNCTIONS.update({t: _scalar_type(t) for t in (np.float16, np.float32, np.float64, np.int8, np.int16, np.int32,
                                               np.int64, np.uint8, np.bool_)})


# ---------------------------------------------------------------- ndarray methods
def _varargs_shape(handler: Callable) -> Callable:
    """``a.reshape(2, 3)`` / ``a.transpose(1, 0)``: NumPy methods take the shape as varargs too."""
    def method(tx: Any, a: NdarrayValue, *args: V.Value, **kwargs: V.Value) -> V.Value:
        if len(args) > 1:
            args = (V.TupleValue(list(args)),)
        return handler(tx, a, *args, **kwargs)
    return method


def _sort_in_place(tx: Any, a: NdarrayValue, axis: Any = -1, kind: Any = None, order: Any = None) -> V.Value:
    check_writable(tx, a)
    assign(tx, a, shapes.sort(tx, a, axis, kind, order), "unsafe")
    return V.NONE


def _fill(tx: Any, a: NdarrayValue, value: V.Value) -> V.Value:
    check_writable(tx, a)
    stored = full(tx, a.shape, constant(tx, value, "fill"), a.dtype) if not isinstance(value, NdarrayValue) \
        else record(tx, torch.broadcast_to, cast(tx, value, a.dtype), a.shape)
    record(tx, torch.Tensor.copy_, a.tensor, stored)
    return V.NONE


def _data_dependent(name: str) -> Callable:
    def method(tx: Any, a: NdarrayValue, *args: Any, **kwargs: Any) -> V.Value:
        raise tx.unsupported(f"ndarray.{name}() needs the array's data",
                             "move it outside the compiled function")
    return method


METHODS: dict[str, Callable] = {
    name: FUNCTIONS[getattr(np, name)] for name in (
        "sum", "mean", "prod", "max", "min", "argmax", "argmin", "any", "all", "var", "std", "cumsum",
        "cumprod", "clip", "round", "dot", "argsort", "swapaxes", "squeeze", "ravel", "copy", "repeat")}
METHODS.update({
    "reshape": _varargs_shape(shapes.reshape), "transpose": _varargs_shape(shapes.transpose),
    "astype": shapes.astype, "flatten": shapes.flatten, "sort": _sort_in_place, "fill": _fill, "ptp": ptp,
    "item": _data_dependent("item"), "tolist": _data_dependent("tolist"), "nonzero": _data_dependent("nonzero"),
    "__array__": _data_dependent("__array__"),
})


# ---------------------------------------------------------------- operators and attributes on arrays (from operations)
def binary_op(tx: Any, symbol: str, left: V.Value, right: V.Value) -> V.Value:
    no_torch_mix(tx, left, right)
    in_place = symbol.endswith("=") and symbol[:-1] in OPERATOR_UFUNCS | {"@": None}
    base = symbol[:-1] if in_place else symbol
    if base == "@":
        value = matmul(tx, left, right)
    else:
        value = apply_ufunc(tx, OPERATOR_UFUNCS[base], [left, right])
    if in_place and isinstance(left, NdarrayValue) and not left.scalar:
        return assign(tx, left, value, "same_kind")
    return value


def get_attr(tx: Any, value: NdarrayValue, name: str) -> V.Value:
    simple = {"shape": lambda: value.shape, "ndim": lambda: value.ndim, "dtype": lambda: value.dtype,
              "size": lambda: int(np.prod(value.shape)), "itemsize": lambda: value.dtype.itemsize,
              "nbytes": lambda: int(np.prod(value.shape)) * value.dtype.itemsize}
    if name in simple:
        python = simple[name]()
        if isinstance(python, tuple):
            return V.TupleValue([V.ConstantValue(v) for v in python])
        return V.ConstantValue(python)
    if name in ("T", "mT"):
        return shapes.transpose(tx, value) if name == "T" else shapes.transpose(tx, value, swap_last(value.ndim))
    if name == "real" and not np.issubdtype(value.dtype, np.complexfloating):
        return value
    if name in METHODS:
        return NumpyMethodValue(name, value)
    raise tx.unsupported(f"ndarray attribute .{name}")


# ---------------------------------------------------------------- the entry from calls.call
_ARRAY_BUILTINS = {len, abs, operator.neg}
_BRIDGES = {torch.from_numpy, torch.as_tensor, torch.asarray, torch.tensor}
_OPERATOR_SYMBOLS = {operator.add: "+", operator.sub: "-", operator.mul: "*", operator.truediv: "/",
                     operator.floordiv: "//", operator.mod: "%", operator.pow: "**", operator.matmul: "@",
                     operator.and_: "&", operator.or_: "|", operator.xor: "^", operator.iadd: "+=",
                     operator.isub: "-=", operator.imul: "*=", operator.itruediv: "/="}
_OPERATOR_COMPARES = {operator.lt: "<", operator.le: "<=", operator.eq: "==", operator.ne: "!=",
                      operator.gt: ">", operator.ge: ">="}


def _is_numpy_callable(obj: Any) -> bool:
    if isinstance(obj, np.ufunc):
        return True
    module = getattr(obj, "__module__", None)
    return isinstance(module, str) and (module == "numpy" or module.startswith("numpy."))


def wants_call(callee: V.Value, args: list[V.Value]) -> bool:
    """Whether ``calls.call`` should hand this call to NumPy capture."""
    kind = type(callee)
    if kind is NumpyMethodValue:
        return True
    if kind is V.TensorMethodValue:
        return callee.name == "numpy"
    if kind is not V.ObjectValue:
        return False
    obj = callee.obj
    if _is_numpy_callable(obj):
        return True
    if not _hashable(obj) or not any(type(a) is NdarrayValue for a in args):
        return False
    # builtins and operators that NumPy gives a meaning, and torch functions (which reject ndarrays);
    # user functions are inlined as usual and see the NdarrayValue
    return obj in _ARRAY_BUILTINS or obj in _BRIDGES or obj in _OPERATOR_SYMBOLS or obj in _OPERATOR_COMPARES \
        or _is_torch_function(obj)


def _is_torch_function(obj: Any) -> bool:
    module = getattr(obj, "__module__", None)
    return isinstance(module, str) and (module == "torch" or module.startswith("torch."))


def call(tx: Any, callee: V.Value, args: list[V.Value], kwargs: dict[str, V.Value]) -> V.Value:
    if isinstance(callee, NumpyMethodValue):
        return _bind(tx, METHODS[callee.name], f"ndarray.{callee.name}", [callee.self_value] + args, kwargs)
    if isinstance(callee, V.TensorMethodValue):  # tensor.numpy(): the same data seen as an ndarray
        tensor = callee.self_value
        if args or kwargs or tensor.meta.requires_grad or tensor.meta.device.type != "cpu" or \
                tensor.meta.dtype not in TORCH_DTYPE.values():
            raise tx.unsupported("tensor.numpy() of a tensor that is not a plain CPU tensor")
        return NdarrayValue(tensor)
    obj = callee.obj
    handler = FUNCTIONS.get(obj) if _hashable(obj) else None
    if handler is not None:
        return _bind(tx, handler, f"np.{getattr(obj, '__name__', obj)}", args, kwargs)
    if _is_numpy_callable(obj):
        raise tx.unsupported(f"NumPy function {getattr(obj, '__module__', '')}.{getattr(obj, '__name__', obj)} "
                             "is not supported inside a compiled function")
    return _call_with_arrays(tx, obj, args, kwargs)


def _call_with_arrays(tx: Any, obj: Any, args: list[V.Value], kwargs: dict[str, V.Value]) -> V.Value:
    if _hashable(obj) and obj in _BRIDGES:
        array = args[0] if args else None
        if not isinstance(array, NdarrayValue) or len(args) > 1 or kwargs:
            raise tx.unsupported(f"{obj.__name__} of an ndarray with extra arguments")
        if obj is torch.tensor:
            return record(tx, torch.clone, array.tensor)
        if numpy_device(tx.session).type != "cpu" and obj is torch.from_numpy:
            raise tx.unsupported("torch.from_numpy while NumPy code runs on the GPU")
        return array.tensor
    if obj is len and len(args) == 1:
        if args[0].ndim == 0:
            raise user_error(tx, "len() of unsized object")
        return V.ConstantValue(args[0].shape[0])
    if obj is abs and len(args) == 1:
        return unary_ufunc(tx, np.absolute, args[0])
    if _hashable(obj) and obj in _OPERATOR_SYMBOLS and len(args) == 2:
        return binary_op(tx, _OPERATOR_SYMBOLS[obj], args[0], args[1])
    if _hashable(obj) and obj in _OPERATOR_COMPARES and len(args) == 2:
        return compare(tx, _OPERATOR_COMPARES[obj], args[0], args[1])
    if obj is operator.neg and len(args) == 1:
        return unary_op(tx, "neg", args[0])
    raise tx.unsupported(f"{getattr(obj, '__qualname__', obj)} called with a NumPy array",
                         "only NumPy functions understand ndarrays inside a compiled function")


def unary_ufunc(tx: Any, ufunc: np.ufunc, value: V.Value) -> V.Value:
    return apply_ufunc(tx, ufunc, [value])


def _bind(tx: Any, handler: Callable, name: str, args: list[V.Value], kwargs: dict[str, V.Value]) -> V.Value:
    try:
        inspect.signature(handler).bind(tx, *args, **kwargs)
    except TypeError as error:
        raise user_error(tx, f"{name}: {error}") from None
    return handler(tx, *args, **kwargs)


def _hashable(value: Any) -> bool:
    try:
        hash(value)
        return True
    except TypeError:
        return False


__all__ = ["FUNCTIONS", "METHODS", "Unsupported", "call", "wants_call"]
