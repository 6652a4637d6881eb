"""NumPy array creation and shape functions inside a capture (``np.zeros``, ``np.arange``,
``np.reshape``, ``np.stack``, ``np.sort`` ...), recorded as torch ops.

Handlers take NumPy's own signatures (see ``numpy_functions.py``, which registers
them); arrays are created on the device NumPy code runs on (``numpy_device``),
with NumPy's default dtypes (float64 for ``np.zeros``/``np.ones``/``np.eye``/
``np.linspace``, int64 or float64 for ``np.arange`` from its arguments).
"""
from __future__ import annotations

import inspect
import math
import operator
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from . import values as V
from .numpy_ops import (as_array, axes_arg, axis_arg, cast, constant, dtype_arg, full, record, reject, result,
                        shape_arg, user_error)
from .numpy_values import NdarrayValue, numpy_device, torch_dtype


# ---------------------------------------------------------------- creation
def _factory(fill: Any) -> Callable:
    def handler(tx: Any, shape: Any, dtype: Any = float, order: Any = "C", *, device: Any = None,
                like: Any = None) -> V.Value:
        reject(tx, "zeros", device=device, like=like)
        dtype = dtype_arg(tx, dtype) or np.dtype(np.float64)
        return result(full(tx, shape_arg(tx, shape), fill, dtype), scalar=False)
    return handler


def full_(tx: Any, shape: Any, fill_value: Any, dtype: Any = None, order: Any = "C", *, device: Any = None,
          like: Any = None) -> V.Value:
    reject(tx, "full", device=device, like=like)
    shape = shape_arg(tx, shape)
    requested = dtype_arg(tx, dtype)
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
        reject(tx, "zeros_like", device=device)
        a = as_array(tx, a)
        shape = a.shape if constant(tx, shape, "shape") is None else shape_arg(tx, shape)
        return result(full(tx, shape, fill, dtype_arg(tx, dtype) or a.dtype), scalar=False)
    return handler


def full_like(tx: Any, a: V.Value, fill_value: Any, dtype: Any = None, order: Any = "K", subok: Any = True,
              shape: Any = None, *, device: Any = None) -> V.Value:
    reject(tx, "full_like", device=device)
    a = as_array(tx, a)
    shape = a.shape if constant(tx, shape, "shape") is None else shape_arg(tx, shape)
    return full_(tx, V.ConstantValue(shape), fill_value, dtype=V.ConstantValue(dtype_arg(tx, dtype) or a.dtype))


def arange(tx: Any, *args: V.Value, dtype: Any = None, device: Any = None, like: Any = None,
           **kwargs: V.Value) -> V.Value:
    reject(tx, "arange", device=device, like=like)
    python_args = [constant(tx, a, "arange") for a in args]
    python_kwargs = {k: constant(tx, v, "arange") for k, v in kwargs.items()}
    requested = dtype_arg(tx, dtype)
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
    reject(tx, "linspace", device=device)
    start, stop = constant(tx, start, "linspace"), constant(tx, stop, "linspace")
    num, endpoint = operator.index(constant(tx, num, "num")), bool(constant(tx, endpoint, "endpoint"))
    if constant(tx, retstep, "retstep") or constant(tx, axis, "axis") != 0:
        raise tx.unsupported("np.linspace(retstep=True / axis=...)")
    if not all(isinstance(v, (int, float)) for v in (start, stop)) or num < 0:
        raise tx.unsupported("np.linspace with array or non-Python-number bounds")
    requested = dtype_arg(tx, dtype) or np.dtype(np.float64)
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
    reject(tx, "eye", device=device, like=like)
    rows = operator.index(constant(tx, N, "N"))
    columns = rows if constant(tx, M, "M") is None else operator.index(constant(tx, M, "M"))
    k = operator.index(constant(tx, k, "k"))
    device_ = numpy_device(tx.session)
    row = record(tx, torch.arange, rows, device=device_)
    column = record(tx, torch.arange, columns, device=device_)
    diagonal = record(tx, torch.eq, record(tx, torch.unsqueeze, record(tx, torch.add, row, k), 1),
                      record(tx, torch.unsqueeze, column, 0))
    return result(cast(tx, diagonal, dtype_arg(tx, dtype) or np.dtype(np.float64)), scalar=False)


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
    reject(tx, "array", like=like)
    if constant(tx, ndmin, "ndmin"):
        raise tx.unsupported("np.array(ndmin=...)")
    requested = dtype_arg(tx, dtype)
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
    reject(tx, "asarray", device=device, like=like)
    if isinstance(a, NdarrayValue) and (dtype is None or dtype_arg(tx, dtype) == a.dtype) \
            and not constant(tx, copy, "copy"):
        return NdarrayValue(a.tensor, a.source) if a.scalar else a
    return array(tx, a, dtype=dtype)


def copy(tx: Any, a: V.Value, order: Any = "K", subok: Any = False) -> V.Value:
    a = as_array(tx, a)
    return result(record(tx, torch.clone, a.tensor), scalar=False)


def astype(tx: Any, a: NdarrayValue, dtype: Any, order: Any = "K", casting: Any = "unsafe",
           subok: Any = True, copy: Any = True) -> V.Value:
    target = dtype_arg(tx, dtype)
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
    new = shape_arg(tx, shape if shape is not None else newshape)
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
    return result(record(tx, torch.transpose, a.tensor, axis_arg(tx, a, axis1), axis_arg(tx, a, axis2)), scalar=False)


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
        axes = axes_arg(tx, a, axis)
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
    return result(record(tx, torch.broadcast_to, a.tensor, shape_arg(tx, shape)), scalar=False)


def _joined(tx: Any, arrays: V.Value, dtype: Any, what: str) -> list[V.TensorValue]:
    items = [as_array(tx, a) for a in _sequence(tx, arrays, what)]
    if not items:
        raise user_error(tx, f"np.{what} needs at least one array")
    out_dtype = dtype_arg(tx, dtype) or np.result_type(*[a.dtype for a in items])
    return [cast(tx, a, out_dtype) for a in items]


def _sequence(tx: Any, value: V.Value, what: str) -> list[V.Value]:
    if isinstance(value, (V.ListValue, V.TupleValue)):
        return list(value.items)
    raise tx.unsupported(f"np.{what} of {value.describe()} (a list or tuple of arrays is supported)")


def stack(tx: Any, arrays: V.Value, axis: Any = 0, out: Any = None, *, dtype: Any = None,
          casting: Any = "same_kind") -> V.Value:
    reject(tx, "stack", out=out)
    tensors = _joined(tx, arrays, dtype, "stack")
    ndim = tensors[0].meta.ndim + 1
    axis = np.lib.array_utils.normalize_axis_index(operator.index(constant(tx, axis, "axis")), ndim)
    return result(record(tx, torch.stack, tensors, axis), scalar=False)


def concatenate(tx: Any, arrays: V.Value, axis: Any = 0, out: Any = None, *, dtype: Any = None,
                casting: Any = "same_kind") -> V.Value:
    reject(tx, "concatenate", out=out)
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
    reject(tx, "sort", order=order)
    a = as_array(tx, a)
    if constant(tx, axis, "axis") is None:
        return a, record(tx, torch.sort, record(tx, torch.reshape, a.tensor, (-1,)), dim=0, stable=True)
    if a.ndim == 0:
        raise user_error(tx, "sort of a 0-d array")
    return a, record(tx, torch.sort, a.tensor, dim=axis_arg(tx, a, axis), stable=True)


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
    return result(record(tx, torch.flip, m.tensor, axes_arg(tx, m, axis)), scalar=False)


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
    return result(record(tx, torch.repeat_interleave, a.tensor, repeats, axis_arg(tx, a, axis)), scalar=False)
