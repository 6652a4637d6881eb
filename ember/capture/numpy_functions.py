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
from . import values as V
from .numpy_ops import (UFUNCS, apply_ufunc, as_array, assign, binary_op, cast, check_writable, compare,
                        constant, full, record, result, stand_in, unary_op, user_error)
from .numpy_values import TORCH_DTYPE, NdarrayValue, NumpyMethodValue, numpy_device, torch_dtype

_NO_VALUE = np._NoValue


def _reject(tx: Any, name: str, **arguments: Any) -> None:
    """NumPy arguments that capture does not implement: a graph break unless left at their default."""
    for key, value in arguments.items():
        if value is not None and value is not _NO_VALUE and not (isinstance(value, V.ConstantValue)
                                                                  and value.value is None):
            raise tx.unsupported(f"np.{name}({key}=...) inside a compiled function")


def _dtype(tx: Any, value: Any) -> np.dtype | None:
    python = constant(tx, value, "dtype")
    return None if python is None else np.dtype(python)


def _axes(tx: Any, array: NdarrayValue, axis: Any) -> tuple[int, ...]:
    """``axis`` (None, an int or a tuple) as sorted non-negative dims; NumPy's own errors."""
    axis = constant(tx, axis, "axis")
    if axis is None:
        return tuple(range(array.ndim))
    axes = axis if isinstance(axis, tuple) else (axis,)
    try:
        normalized = tuple(sorted(np.lib.array_utils.normalize_axis_tuple(axes, array.ndim)))
    except (np.exceptions.AxisError, TypeError, ValueError) as error:
        raise user_error(tx, str(error)) from None
    return normalized


def _axis(tx: Any, array: NdarrayValue, axis: Any) -> int:
    axis = constant(tx, axis, "axis")
    try:
        return np.lib.array_utils.normalize_axis_index(operator.index(axis), array.ndim)
    except (np.exceptions.AxisError, TypeError) as error:
        raise user_error(tx, str(error)) from None


def _probe(tx: Any, fn: Callable, *args: Any, **kwargs: Any) -> np.dtype:
    """Result dtype of the real NumPy function on stand-ins (and NumPy's own argument errors)."""
    try:
        with np.errstate(all="ignore"):
            return np.asarray(fn(*args, **kwargs)).dtype
    except (TypeError, ValueError, np.exceptions.AxisError) as error:
        raise user_error(tx, f"{getattr(fn, '__name__', fn)}: {error}") from None


def _keep(tx: Any, tensor: V.TensorValue, reduced: tuple[int, ...], keepdims: bool) -> V.TensorValue:
    """Reinsert reduced dims as size 1 (for torch ops that have no keepdim)."""
    if not keepdims:
        return tensor
    for dim in reduced:
        tensor = record(tx, torch.unsqueeze, tensor, dim)
    return tensor


# ---------------------------------------------------------------- reductions
def _reduction(name: str) -> Callable:
    np_fn = getattr(np, name)

    def handler(tx: Any, a: V.Value, axis: Any = None, dtype: Any = None, out: Any = None,
                keepdims: Any = False, initial: Any = _NO_VALUE, where: Any = _NO_VALUE) -> V.Value:
        _reject(tx, name, out=out, initial=initial, where=where)
        a = as_array(tx, a)
        keepdims = bool(constant(tx, keepdims, "keepdims"))
        requested = _dtype(tx, dtype)
        axes = _axes(tx, a, axis)
        out_dtype = _probe(tx, np_fn, stand_in(a), axis=constant(tx, axis, "axis"), dtype=requested,
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
                initial: Any = _NO_VALUE, where: Any = _NO_VALUE) -> V.Value:
        _reject(tx, name, out=out, initial=initial, where=where)
        a = as_array(tx, a)
        keepdims = bool(constant(tx, keepdims, "keepdims"))
        axes = _axes(tx, a, axis)
        if any(a.shape[d] == 0 for d in axes) or (not a.ndim and 0 in a.shape):
            raise user_error(tx, f"zero-size array to reduction operation {name}")
        if not axes:
            return result(record(tx, torch.clone, a.tensor))
        return result(record(tx, torch_fn, a.tensor, list(axes), keepdims))
    handler.__name__ = name
    return handler


def _logical_reduction(name: str, torch_fn: Callable) -> Callable:
    def handler(tx: Any, a: V.Value, axis: Any = None, out: Any = None, keepdims: Any = False,
                where: Any = _NO_VALUE) -> V.Value:
        _reject(tx, name, out=out, where=where)
        a = as_array(tx, a)
        keepdims = bool(constant(tx, keepdims, "keepdims"))
        axes = _axes(tx, a, axis)
        tensor = record(tx, torch.ne, a.tensor, 0) if a.dtype != np.bool_ else a.tensor
        if not axes:
            return result(record(tx, torch.clone, tensor))
        return result(record(tx, torch_fn, tensor, tuple(axes), keepdims))
    handler.__name__ = name
    return handler


def _arg_extremum(name: str, torch_fn: Callable) -> Callable:
    def handler(tx: Any, a: V.Value, axis: Any = None, out: Any = None, *, keepdims: Any = False) -> V.Value:
        _reject(tx, name, out=out)
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
        return result(record(tx, torch_fn, tensor, _axis(tx, a, axis), keepdims))
    handler.__name__ = name
    return handler


def _variance(name: str) -> Callable:
    def handler(tx: Any, a: V.Value, axis: Any = None, dtype: Any = None, out: Any = None, ddof: Any = 0,
                keepdims: Any = False, *, where: Any = _NO_VALUE, mean: Any = _NO_VALUE,
                correction: Any = _NO_VALUE) -> V.Value:
        _reject(tx, name, out=out, where=where, mean=mean, correction=correction)
        a = as_array(tx, a)
        keepdims = bool(constant(tx, keepdims, "keepdims"))
        axes = _axes(tx, a, axis)
        ddof = constant(tx, ddof, "ddof")
        out_dtype = _probe(tx, getattr(np, name), stand_in(a), axis=constant(tx, axis, "axis"),
                           dtype=_dtype(tx, dtype), keepdims=keepdims)
        if not axes and a.ndim:
            return result(full(tx, a.shape, 0.0, out_dtype))
        fn = torch.var if name == "var" else torch.std
        return result(record(tx, fn, cast(tx, a, out_dtype), list(axes), correction=ddof, keepdim=keepdims))
    handler.__name__ = name
    return handler


def _cumulative(name: str, torch_fn: Callable) -> Callable:
    def handler(tx: Any, a: V.Value, axis: Any = None, dtype: Any = None, out: Any = None) -> V.Value:
        _reject(tx, name, out=out)
        a = as_array(tx, a)
        out_dtype = _probe(tx, getattr(np, name), stand_in(a), axis=constant(tx, axis, "axis"),
                           dtype=_dtype(tx, dtype))
        tensor = cast(tx, a, out_dtype)
        if constant(tx, axis, "axis") is None:
            tensor, dim = record(tx, torch.reshape, tensor, (-1,)), 0
        else:
            dim = _axis(tx, a, axis)
        return result(record(tx, torch_fn, tensor, dim), scalar=False)
    handler.__name__ = name
    return handler


def count_nonzero(tx: Any, a: V.Value, axis: Any = None, *, keepdims: Any = False) -> V.Value:
    a = as_array(tx, a)
    nonzero = NdarrayValue(record(tx, torch.ne, a.tensor, 0))
    return FUNCTIONS[np.sum](tx, nonzero, axis=axis, keepdims=keepdims)


def ptp(tx: Any, a: V.Value, axis: Any = None, out: Any = None, keepdims: Any = False) -> V.Value:
    _reject(tx, "ptp", out=out)
    high = FUNCTIONS[np.max](tx, a, axis=axis, keepdims=keepdims)
    low = FUNCTIONS[np.min](tx, a, axis=axis, keepdims=keepdims)
    return apply_ufunc(tx, np.subtract, [high, low])


# ---------------------------------------------------------------- elementwise functions that are not ufuncs
def where(tx: Any, condition: V.Value, x: Any = _NO_VALUE, y: Any = _NO_VALUE) -> V.Value:
    if x is _NO_VALUE or y is _NO_VALUE:
        raise tx.unsupported("np.where(condition) with one argument (its shape depends on the data)")
    condition = as_array(tx, condition)
    mask = condition.tensor if condition.dtype == np.bool_ else record(tx, torch.ne, condition.tensor, 0)
    operands = [x, y]
    stand_ins = [o.value if isinstance(o, V.ConstantValue) and type(o.value) in (int, float, bool)
                 else stand_in(as_array(tx, o)) for o in operands]
    out_dtype = _probe(tx, np.where, np.ones((1,) * condition.ndim, bool), *stand_ins)
    tensors = [full(tx, (), o.value, out_dtype) if isinstance(o, V.ConstantValue) and
               type(o.value) in (int, float, bool) else cast(tx, as_array(tx, o), out_dtype) for o in operands]
    return result(record(tx, torch.where, mask, *tensors))


def clip(tx: Any, a: V.Value, a_min: Any = _NO_VALUE, a_max: Any = _NO_VALUE, out: Any = None, *,
         min: Any = _NO_VALUE, max: Any = _NO_VALUE, **kwargs: Any) -> V.Value:
    _reject(tx, "clip", out=out, **kwargs)
    low = a_min if a_min is not _NO_VALUE else min
    high = a_max if a_max is not _NO_VALUE else max
    value = as_array(tx, a)
    if low is not _NO_VALUE and not (isinstance(low, V.ConstantValue) and low.value is None):
        value = apply_ufunc(tx, np.maximum, [value, low])
    if high is not _NO_VALUE and not (isinstance(high, V.ConstantValue) and high.value is None):
        value = apply_ufunc(tx, np.minimum, [value, high])
    return value


def round_(tx: Any, a: V.Value, decimals: Any = 0, out: Any = None) -> V.Value:
    _reject(tx, "round", out=out)
    a = as_array(tx, a)
    decimals = constant(tx, decimals, "decimals")
    if not np.issubdtype(a.dtype, np.floating):
        if decimals >= 0:
            return result(record(tx, torch.clone, a.tensor))
        raise tx.unsupported("np.round of integers to negative decimals")
    return result(record(tx, torch.round, a.tensor, decimals=decimals))


# ---------------------------------------------------------------- linear algebra
def matmul(tx: Any, a: V.Value, b: V.Value, out: Any = None, **kwargs: Any) -> V.Value:
    _reject(tx, "matmul", out=out, **kwargs)
    a, b = as_array(tx, a), as_array(tx, b)
    out_dtype = _probe(tx, np.matmul, stand_in(a), stand_in(b))
    if out_dtype == np.bool_:
        raise tx.unsupported("np.matmul of boolean arrays")
    return result(record(tx, torch.matmul, cast(tx, a, out_dtype), cast(tx, b, out_dtype)))


def dot(tx: Any, a: V.Value, b: V.Value, out: Any = None) -> V.Value:
    _reject(tx, "dot", out=out)
    a, b = as_array(tx, a), as_array(tx, b)
    if a.ndim == 0 or b.ndim == 0:
        return apply_ufunc(tx, np.multiply, [a, b])
    if a.ndim > 2 or b.ndim > 2:
        raise tx.unsupported("np.dot of arrays with more than 2 dimensions")
    return matmul(tx, a, b)


def outer(tx: Any, a: V.Value, b: V.Value, out: Any = None) -> V.Value:
    _reject(tx, "outer", out=out)
    a, b = ravel(tx, a), ravel(tx, b)
    return apply_ufunc(tx, np.multiply, [expand_dims(tx, a, 1), expand_dims(tx, b, 0)])


def einsum(tx: Any, subscripts: Any, *operands: V.Value, out: Any = None, dtype: Any = None,
           order: Any = "K", casting: Any = "safe", optimize: Any = False) -> V.Value:
    _reject(tx, "einsum", out=out, dtype=dtype)
    subscripts = constant(tx, subscripts, "einsum subscripts")
    if not isinstance(subscripts, str):
        raise tx.unsupported("np.einsum in the interleaved (operand, sublist) form")
    arrays = [as_array(tx, o) for o in operands]
    out_dtype = _probe(tx, np.einsum, subscripts, *[np.ones([1] * a.ndim, a.dtype) for a in arrays])
    if out_dtype == np.bool_:
        raise tx.unsupported("np.einsum of boolean arrays")
    return result(record(tx, torch.einsum, subscripts, *[cast(tx, a, out_dtype) for a in arrays]))


def norm(tx: Any, x: V.Value, ord: Any = None, axis: Any = None, keepdims: Any = False) -> V.Value:
    """np.linalg.norm: vector norms over one axis (or a flattened array) and the Frobenius norm."""
    x = as_array(tx, x)
    order = constant(tx, ord, "ord")
    keepdims = bool(constant(tx, keepdims, "keepdims"))
    axis_value = constant(tx, axis, "axis")
    out_dtype = _probe(tx, np.linalg.norm, stand_in(x), ord=order, axis=axis_value, keepdims=keepdims)
    x = NdarrayValue(cast(tx, x, out_dtype))
    if axis_value is None:
        if order is not None and not (x.ndim == 2 and order == "fro") and not (x.ndim == 1):
            raise tx.unsupported(f"np.linalg.norm(ord={order!r}) of a matrix")
        axes = tuple(range(x.ndim))
    else:
        axes = _axes(tx, x, axis_value)
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


# ---------------------------------------------------------------- creation
def _shape(tx: Any, shape: Any) -> tuple[int, ...]:
    python = constant(tx, shape, "shape")
    try:
        return tuple(operator.index(s) for s in python) if isinstance(python, (tuple, list)) else \
            (operator.index(python),)
    except TypeError as error:
        raise user_error(tx, str(error)) from None


def _factory(fill: Any) -> Callable:
    def handler(tx: Any, shape: Any, dtype: Any = float, order: Any = "C", *, device: Any = None,
                like: Any = None) -> V.Value:
        _reject(tx, "zeros", device=device, like=like)
        dtype = _dtype(tx, dtype) or np.dtype(np.float64)
        return result(full(tx, _shape(tx, shape), fill, dtype), scalar=False)
    return handler


def full_(tx: Any, shape: Any, fill_value: Any, dtype: Any = None, order: Any = "C", *, device: Any = None,
          like: Any = None) -> V.Value:
    _reject(tx, "full", device=device, like=like)
    shape = _shape(tx, shape)
    requested = _dtype(tx, dtype)
    if isinstance(fill_value, NdarrayValue):
        out_dtype = requested or fill_value.dtype
        expanded = record(tx, torch.broadcast_to, cast(tx, fill_value, out_dtype), shape)
        return result(record(tx, torch.clone, expanded), scalar=False)
    fill = constant(tx, fill_value, "fill_value")
    out_dtype = requested or np.array(fill).dtype
    return result(full(tx, shape, fill, out_dtype), scalar=False)


def _like_factory(fill: Any) -> Callable:
    def handler(tx: Any, a: V.Value, dtype: Any = None, order: Any = "K", subok: Any = True, shape: Any = None,
                *, device: Any = None) -> V.Value:
        _reject(tx, "zeros_like", device=device)
        a = as_array(tx, a)
        shape = a.shape if constant(tx, shape, "shape") is None else _shape(tx, shape)
        return result(full(tx, shape, fill, _dtype(tx, dtype) or a.dtype), scalar=False)
    return handler


def full_like(tx: Any, a: V.Value, fill_value: Any, dtype: Any = None, order: Any = "K", subok: Any = True,
              shape: Any = None, *, device: Any = None) -> V.Value:
    _reject(tx, "full_like", device=device)
    a = as_array(tx, a)
    shape = a.shape if constant(tx, shape, "shape") is None else _shape(tx, shape)
    return full_(tx, V.ConstantValue(shape), fill_value, dtype=V.ConstantValue(_dtype(tx, dtype) or a.dtype))


def arange(tx: Any, *args: V.Value, dtype: Any = None, device: Any = None, like: Any = None,
           **kwargs: V.Value) -> V.Value:
    _reject(tx, "arange", device=device, like=like)
    python_args = [constant(tx, a, "arange") for a in args]
    python_kwargs = {k: constant(tx, v, "arange") for k, v in kwargs.items()}
    requested = _dtype(tx, dtype)
    bounds = inspect.signature(lambda start_or_stop=None, /, stop=None, step=None, *, start=None: 0).bind(
        *python_args, **python_kwargs).arguments
    start, stop, step = bounds.get("start_or_stop", bounds.get("start")), bounds.get("stop"), bounds.get("step")
    if stop is None:
        start, stop = 0, start
    step = 1 if step is None else step
    values = (start, stop, step)
    if not all(isinstance(v, (int, float, np.integer, np.floating)) for v in values) or step == 0:
        raise user_error(tx, "np.arange needs numbers and a non-zero step")
    natural = np.result_type(*[np.asarray(v) for v in values]) if any(
        isinstance(v, np.generic) for v in values) else (np.dtype(np.float64) if any(
            isinstance(v, float) for v in values) else np.dtype(np.int64))
    out_dtype = requested or natural
    length = max(0, math.ceil((stop - start) / step))
    compute = np.dtype(np.int64) if np.issubdtype(natural, np.integer) else np.dtype(np.float64)
    index = record(tx, torch.arange, length, dtype=torch_dtype(compute), device=numpy_device(tx.session))
    if (start, step) != (0, 1):
        index = record(tx, torch.add, record(tx, torch.mul, index, step), start)
    return result(cast(tx, index, out_dtype), scalar=False)


def linspace(tx: Any, start: Any, stop: Any, num: Any = 50, endpoint: Any = True, retstep: Any = False,
             dtype: Any = None, axis: Any = 0, *, device: Any = None) -> V.Value:
    _reject(tx, "linspace", device=device)
    start, stop = constant(tx, start, "linspace"), constant(tx, stop, "linspace")
    num, endpoint = operator.index(constant(tx, num, "num")), bool(constant(tx, endpoint, "endpoint"))
    if constant(tx, retstep, "retstep") or constant(tx, axis, "axis") != 0:
        raise tx.unsupported("np.linspace(retstep=True / axis=...)")
    if not all(isinstance(v, (int, float)) for v in (start, stop)) or num < 0:
        raise tx.unsupported("np.linspace with array or non-Python-number bounds")
    requested = _dtype(tx, dtype) or np.dtype(np.float64)
    div = num - 1 if endpoint else num
    index = record(tx, torch.arange, num, dtype=torch.float64, device=numpy_device(tx.session))
    delta = float(stop) - float(start)
    step = delta / div if div > 0 else math.nan
    if div > 0 and step == 0:
        raise tx.unsupported("np.linspace with a step that underflows to 0")
    values = record(tx, torch.mul, index, step if div > 0 else delta)
    values = record(tx, torch.add, values, float(start))
    if endpoint and num > 1:
        last = record(tx, torch.eq, index, float(num - 1))
        values = record(tx, torch.where, last, full(tx, (), float(stop), np.dtype(np.float64)), values)
    if np.issubdtype(requested, np.integer):
        values = record(tx, torch.floor, values)
    return result(cast(tx, values, requested), scalar=False)


def eye(tx: Any, N: Any, M: Any = None, k: Any = 0, dtype: Any = float, order: Any = "C", *,
        device: Any = None, like: Any = None) -> V.Value:
    _reject(tx, "eye", device=device, like=like)
    rows = operator.index(constant(tx, N, "N"))
    columns = rows if constant(tx, M, "M") is None else operator.index(constant(tx, M, "M"))
    k = operator.index(constant(tx, k, "k"))
    device_ = numpy_device(tx.session)
    row = record(tx, torch.arange, rows, device=device_)
    column = record(tx, torch.arange, columns, device=device_)
    diagonal = record(tx, torch.eq, record(tx, torch.unsqueeze, record(tx, torch.add, row, k), 1),
                      record(tx, torch.unsqueeze, column, 0))
    return result(cast(tx, diagonal, _dtype(tx, dtype) or np.dtype(np.float64)), scalar=False)


def identity(tx: Any, n: Any, dtype: Any = None, *, like: Any = None) -> V.Value:
    return eye(tx, n, dtype=dtype if dtype is not None else float, like=like)


def _discovered_dtype(tx: Any, value: V.Value) -> Any:
    """A NumPy stand-in for ``np.array(value)``'s dtype discovery (arrays as 0-d, lists as lists)."""
    if isinstance(value, NdarrayValue):
        return np.ones((), value.dtype)
    if isinstance(value, (V.ListValue, V.TupleValue)):
        return [_discovered_dtype(tx, v) for v in value.items]
    return constant(tx, value, "np.array")


def _build(tx: Any, value: V.Value, dtype: np.dtype) -> V.TensorValue:
    if isinstance(value, NdarrayValue):
        return cast(tx, value, dtype)
    if isinstance(value, (V.ListValue, V.TupleValue)) and any(
            isinstance(v, (NdarrayValue, V.ListValue, V.TupleValue)) for v in value.items):
        return record(tx, torch.stack, [_build(tx, v, dtype) for v in value.items])
    return cast(tx, as_array(tx, V.ConstantValue(np.asarray(constant(tx, value, "np.array"), dtype))), dtype)


def array(tx: Any, object: V.Value, dtype: Any = None, *, copy: Any = True, order: Any = "K",
          subok: Any = False, ndmin: Any = 0, like: Any = None) -> V.Value:
    _reject(tx, "array", like=like)
    if constant(tx, ndmin, "ndmin"):
        raise tx.unsupported("np.array(ndmin=...)")
    requested = _dtype(tx, dtype)
    try:
        out_dtype = requested or np.asarray(_discovered_dtype(tx, object)).dtype
    except ValueError as error:
        raise user_error(tx, f"np.array: {error}") from None
    if isinstance(object, NdarrayValue):
        copy = constant(tx, copy, "copy")
        if not copy and out_dtype == object.dtype:
            return object
        return result(record(tx, torch.clone, cast(tx, object, out_dtype)), scalar=False)
    return result(_build(tx, object, out_dtype), scalar=False)


def asarray(tx: Any, a: V.Value, dtype: Any = None, order: Any = None, *, device: Any = None,
            copy: Any = None, like: Any = None) -> V.Value:
    _reject(tx, "asarray", device=device, like=like)
    if isinstance(a, NdarrayValue) and (dtype is None or _dtype(tx, dtype) == a.dtype) \
            and not constant(tx, copy, "copy"):
        return NdarrayValue(a.tensor, a.source) if a.scalar else a
    return array(tx, a, dtype=dtype)


def copy(tx: Any, a: V.Value, order: Any = "K", subok: Any = False) -> V.Value:
    a = as_array(tx, a)
    return result(record(tx, torch.clone, a.tensor), scalar=False)


def astype(tx: Any, a: NdarrayValue, dtype: Any, order: Any = "K", casting: Any = "unsafe",
           subok: Any = True, copy: Any = True) -> V.Value:
    target = _dtype(tx, dtype)
    if target == a.dtype and not constant(tx, copy, "copy"):
        return a
    tensor = cast(tx, a, target)
    if tensor is a.tensor:
        tensor = record(tx, torch.clone, tensor)
    return result(tensor, scalar=a.scalar)


# ---------------------------------------------------------------- shapes
def reshape(tx: Any, a: V.Value, shape: Any = None, order: Any = "C", *, newshape: Any = None,
            copy: Any = None) -> V.Value:
    a = as_array(tx, a)
    if constant(tx, order, "order") != "C":
        raise tx.unsupported("reshape(order=...) other than 'C'")
    new = _shape(tx, shape if shape is not None else newshape)
    return result(record(tx, torch.reshape, a.tensor, new), scalar=False)


def transpose(tx: Any, a: V.Value, axes: Any = None) -> V.Value:
    a = as_array(tx, a)
    axes = constant(tx, axes, "axes")
    order = tuple(range(a.ndim))[::-1] if axes is None else tuple(axes)
    if sorted(np.lib.array_utils.normalize_axis_tuple(order, a.ndim)) != list(range(a.ndim)):
        raise user_error(tx, "axes don't match array")
    return result(record(tx, torch.permute, a.tensor, order), scalar=False)


def swapaxes(tx: Any, a: V.Value, axis1: Any, axis2: Any) -> V.Value:
    a = as_array(tx, a)
    return result(record(tx, torch.transpose, a.tensor, _axis(tx, a, axis1), _axis(tx, a, axis2)), scalar=False)


def moveaxis(tx: Any, a: V.Value, source: Any, destination: Any) -> V.Value:
    a = as_array(tx, a)
    return result(record(tx, torch.movedim, a.tensor, constant(tx, source, "source"),
                         constant(tx, destination, "destination")), scalar=False)


def expand_dims(tx: Any, a: V.Value, axis: Any) -> V.Value:
    a = as_array(tx, a)
    axis = constant(tx, axis, "axis")
    axes = axis if isinstance(axis, tuple) else (axis,)
    try:
        positions = sorted(np.lib.array_utils.normalize_axis_tuple(axes, a.ndim + len(axes)))
    except (np.exceptions.AxisError, ValueError) as error:
        raise user_error(tx, str(error)) from None
    tensor = a.tensor
    for position in positions:
        tensor = record(tx, torch.unsqueeze, tensor, position)
    return result(tensor, scalar=False)


def squeeze(tx: Any, a: V.Value, axis: Any = None) -> V.Value:
    a = as_array(tx, a)
    if constant(tx, axis, "axis") is None:
        axes = tuple(d for d, size in enumerate(a.shape) if size == 1)
    else:
        axes = _axes(tx, a, axis)
        if any(a.shape[d] != 1 for d in axes):
            raise user_error(tx, "cannot select an axis to squeeze out which has size not equal to one")
    if not axes:
        return result(record(tx, torch.reshape, a.tensor, a.shape), scalar=False)
    return result(record(tx, torch.squeeze, a.tensor, axes), scalar=False)


def ravel(tx: Any, a: V.Value, order: Any = "C") -> V.Value:
    a = as_array(tx, a)
    if constant(tx, order, "order") != "C":
        raise tx.unsupported("ravel(order=...) other than 'C'")
    return result(record(tx, torch.reshape, a.tensor, (-1,)), scalar=False)


def flatten(tx: Any, a: NdarrayValue, order: Any = "C") -> V.Value:
    flat = ravel(tx, a, order)
    return result(record(tx, torch.clone, flat.tensor), scalar=False)


def broadcast_to(tx: Any, array: V.Value, shape: Any, subok: Any = False) -> V.Value:
    a = as_array(tx, array)
    return result(record(tx, torch.broadcast_to, a.tensor, _shape(tx, shape)), scalar=False)


def _joined(tx: Any, arrays: V.Value, dtype: Any, what: str) -> list[V.TensorValue]:
    items = [as_array(tx, a) for a in _sequence(tx, arrays, what)]
    if not items:
        raise user_error(tx, f"np.{what} needs at least one array")
    out_dtype = _dtype(tx, dtype) or np.result_type(*[a.dtype for a in items])
    return [cast(tx, a, out_dtype) for a in items]


def _sequence(tx: Any, value: V.Value, what: str) -> list[V.Value]:
    if isinstance(value, (V.ListValue, V.TupleValue)):
        return list(value.items)
    raise tx.unsupported(f"np.{what} of {value.describe()} (a list or tuple of arrays is supported)")


def stack(tx: Any, arrays: V.Value, axis: Any = 0, out: Any = None, *, dtype: Any = None,
          casting: Any = "same_kind") -> V.Value:
    _reject(tx, "stack", out=out)
    tensors = _joined(tx, arrays, dtype, "stack")
    ndim = tensors[0].meta.ndim + 1
    axis = np.lib.array_utils.normalize_axis_index(operator.index(constant(tx, axis, "axis")), ndim)
    return result(record(tx, torch.stack, tensors, axis), scalar=False)


def concatenate(tx: Any, arrays: V.Value, axis: Any = 0, out: Any = None, *, dtype: Any = None,
                casting: Any = "same_kind") -> V.Value:
    _reject(tx, "concatenate", out=out)
    tensors = _joined(tx, arrays, dtype, "concatenate")
    axis = constant(tx, axis, "axis")
    if axis is None:
        tensors = [record(tx, torch.reshape, t, (-1,)) for t in tensors]
        axis = 0
    if any(t.meta.ndim == 0 for t in tensors):
        raise user_error(tx, "zero-dimensional arrays cannot be concatenated")
    axis = np.lib.array_utils.normalize_axis_index(operator.index(axis), tensors[0].meta.ndim)
    return result(record(tx, torch.cat, tensors, axis), scalar=False)


def vstack(tx: Any, tup: V.Value, *, dtype: Any = None, casting: Any = "same_kind") -> V.Value:
    tensors = [t if t.meta.ndim >= 2 else record(tx, torch.reshape, t, (1, -1))
               for t in _joined(tx, tup, dtype, "vstack")]
    return result(record(tx, torch.cat, tensors, 0), scalar=False)


def hstack(tx: Any, tup: V.Value, *, dtype: Any = None, casting: Any = "same_kind") -> V.Value:
    tensors = [t if t.meta.ndim >= 1 else record(tx, torch.reshape, t, (1,))
               for t in _joined(tx, tup, dtype, "hstack")]
    return result(record(tx, torch.cat, tensors, 0 if tensors[0].meta.ndim == 1 else 1), scalar=False)


def _sorted(tx: Any, a: V.Value, axis: Any, kind: Any, order: Any, stable: Any) -> tuple[NdarrayValue, Any]:
    _reject(tx, "sort", order=order)
    a = as_array(tx, a)
    if constant(tx, axis, "axis") is None:
        return a, record(tx, torch.sort, record(tx, torch.reshape, a.tensor, (-1,)), dim=0, stable=True)
    if a.ndim == 0:
        raise user_error(tx, "sort of a 0-d array")
    return a, record(tx, torch.sort, a.tensor, dim=_axis(tx, a, axis), stable=True)


def sort(tx: Any, a: V.Value, axis: Any = -1, kind: Any = None, order: Any = None, *,
         stable: Any = None) -> V.Value:
    _, sorted_ = _sorted(tx, a, axis, kind, order, stable)
    return result(sorted_.items[0], scalar=False)


def argsort(tx: Any, a: V.Value, axis: Any = -1, kind: Any = None, order: Any = None, *,
            stable: Any = None) -> V.Value:
    """Ties keep their original order (a stable sort); NumPy's default quicksort may order them
    differently, so only arrays without ties are guaranteed to match."""
    _, sorted_ = _sorted(tx, a, axis, kind, order, stable)
    return result(sorted_.items[1], scalar=False)


def flip(tx: Any, m: V.Value, axis: Any = None) -> V.Value:
    m = as_array(tx, m)
    return result(record(tx, torch.flip, m.tensor, _axes(tx, m, axis)), scalar=False)


def roll(tx: Any, a: V.Value, shift: Any, axis: Any = None) -> V.Value:
    a = as_array(tx, a)
    shift, axis = constant(tx, shift, "shift"), constant(tx, axis, "axis")
    if axis is None:
        flat = record(tx, torch.roll, record(tx, torch.reshape, a.tensor, (-1,)), shift)
        return result(record(tx, torch.reshape, flat, a.shape), scalar=False)
    return result(record(tx, torch.roll, a.tensor, shift, axis), scalar=False)


def _triangle(torch_fn: Callable) -> Callable:
    def handler(tx: Any, m: V.Value, k: Any = 0) -> V.Value:
        m = as_array(tx, m)
        if m.ndim < 2:
            raise tx.unsupported("np.tril/np.triu of a 1-d array")
        return result(record(tx, torch_fn, m.tensor, operator.index(constant(tx, k, "k"))), scalar=False)
    return handler


def tile(tx: Any, A: V.Value, reps: Any) -> V.Value:
    a = as_array(tx, A)
    reps = constant(tx, reps, "reps")
    return result(record(tx, torch.tile, a.tensor, tuple(reps) if isinstance(reps, (tuple, list)) else (reps,)),
                  scalar=False)


def repeat(tx: Any, a: V.Value, repeats: Any, axis: Any = None) -> V.Value:
    a = as_array(tx, a)
    repeats = constant(tx, repeats, "repeats")
    if not isinstance(repeats, int):
        raise tx.unsupported("np.repeat with per-element repeats")
    if constant(tx, axis, "axis") is None:
        return result(record(tx, torch.repeat_interleave, record(tx, torch.reshape, a.tensor, (-1,)), repeats),
                      scalar=False)
    return result(record(tx, torch.repeat_interleave, a.tensor, repeats, _axis(tx, a, axis)), scalar=False)


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
    def handler(tx: Any, *operands: V.Value, out: Any = None, where: Any = _NO_VALUE, dtype: Any = None,
                casting: Any = _NO_VALUE, order: Any = _NO_VALUE, subok: Any = _NO_VALUE,
                signature: Any = None) -> V.Value:
        _reject(tx, ufunc.__name__, out=out, where=where, casting=casting, order=order, subok=subok,
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
    np.zeros: _factory(0), np.ones: _factory(1), np.empty: _factory(0), np.full: full_,
    np.zeros_like: _like_factory(0), np.ones_like: _like_factory(1), np.empty_like: _like_factory(0),
    np.full_like: full_like, np.arange: arange, np.linspace: linspace, np.eye: eye, np.identity: identity,
    np.array: array, np.asarray: asarray, np.copy: copy,
    np.reshape: reshape, np.transpose: transpose, np.swapaxes: swapaxes, np.moveaxis: moveaxis,
    np.expand_dims: expand_dims, np.squeeze: squeeze, np.ravel: ravel, np.broadcast_to: broadcast_to,
    np.stack: stack, np.concatenate: concatenate, np.vstack: vstack, np.hstack: hstack,
    np.sort: sort, np.argsort: argsort, np.flip: flip, np.roll: roll, np.tril: _triangle(torch.tril),
    np.triu: _triangle(torch.triu), np.tile: tile, np.repeat: repeat,
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
    assign(tx, a, sort(tx, a, axis, kind, order), "unsafe")
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
    "reshape": _varargs_shape(reshape), "transpose": _varargs_shape(transpose),
    "astype": astype, "flatten": flatten, "sort": _sort_in_place, "fill": _fill, "ptp": ptp,
    "item": _data_dependent("item"), "tolist": _data_dependent("tolist"), "nonzero": _data_dependent("nonzero"),
    "__array__": _data_dependent("__array__"),
})


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
