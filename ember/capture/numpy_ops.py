"""NumPy semantics on NdarrayValues: ufuncs, operators, attributes, indexing, in-place updates.

Every operation asks NumPy itself for its dtypes (``ufunc.resolve_dtypes`` and the
same call on tiny stand-in arrays of the operands' dtypes and ranks) and records
torch ops that compute in exactly those dtypes: operands are cast to the ufunc's
loop dtype first (``int_array / int_array`` divides in float64, ``int_array < 0.5``
compares in float64), the torch op runs, and its result is cast to NumPy's output
dtype.  Shapes and broadcasting come from the recorded torch ops (their meta run),
which follow the same rules as NumPy's.  Anything NumPy would reject is left to
eager NumPy (an Unsupported that marks "eager may raise"); anything without a
faithful torch equivalent is Unsupported: a graph break, never a different answer.
"""
from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from ..errors import Unsupported
from . import tensor_ops
from . import values as V
from .numpy_values import TORCH_DTYPE, NdarrayValue, numpy_device, torch_dtype


def user_error(tx: Any, reason: str) -> Unsupported:
    """NumPy raises here in eager: run the frame eagerly and let it."""
    error = Unsupported(reason, tx.session.current_line())
    error.eager_may_raise = True
    return error


def _graph_value(value: Any) -> V.Value:
    if isinstance(value, V.Value):
        return value
    if isinstance(value, list):
        return V.ListValue([_graph_value(v) for v in value])
    if isinstance(value, tuple):
        return V.TupleValue([_graph_value(v) for v in value])
    return V.ConstantValue(value)


def record(tx: Any, target: Callable, *args: Any, **kwargs: Any) -> V.Value:
    """Record a torch call; arguments are Values or Python constants."""
    return tensor_ops.record_call(tx.session, target, [_graph_value(a) for a in args],
                                  {k: _graph_value(v) for k, v in kwargs.items()})


def result(tensor: V.Value, scalar: bool = True) -> NdarrayValue:
    """An ndarray result; a 0-d one is a NumPy scalar unless ``scalar=False`` (as NumPy returns)."""
    if not isinstance(tensor, V.TensorValue):
        raise Unsupported("a NumPy operation that produces no array")
    return NdarrayValue(tensor, None, scalar)


def constant(tx: Any, value: Any, what: str) -> Any:
    if not isinstance(value, V.Value):
        return value
    if isinstance(value, NdarrayValue):
        raise tx.unsupported(f"{what}: an array where NumPy needs a Python value here (data-dependent)")
    try:
        return value.as_python()
    except Unsupported:
        raise tx.unsupported(f"{what}: {value.describe()} is not a constant") from None


def cast(tx: Any, value: NdarrayValue | V.TensorValue, dtype: np.dtype) -> V.TensorValue:
    tensor = value.tensor if isinstance(value, NdarrayValue) else value
    target = torch_dtype(dtype)
    if tensor.meta.dtype == target:
        return tensor
    return record(tx, torch.Tensor.to, tensor, target)


def full(tx: Any, shape: tuple, fill: Any, dtype: np.dtype) -> V.TensorValue:
    """A constant tensor of NumPy dtype ``dtype`` on the device the NumPy code runs on."""
    fill = np.array(fill, dtype=dtype).item()  # NumPy's conversion of the Python value (bool(2) ...)
    return record(tx, torch.full, tuple(shape), fill, dtype=torch_dtype(dtype), device=numpy_device(tx.session))


def as_array(tx: Any, value: V.Value) -> NdarrayValue:
    """An array operand: an NdarrayValue, or a constant (NumPy scalar, Python number, nested list)."""
    if isinstance(value, NdarrayValue):
        return value
    if isinstance(value, V.TensorValue):
        raise tx.unsupported("a torch tensor where NumPy expects an array (mixing torch and NumPy)")
    python = constant(tx, value, "array operand")
    array = np.asarray(python)
    if array.dtype not in TORCH_DTYPE:
        raise tx.unsupported(f"a NumPy constant of dtype {array.dtype}")
    if array.ndim == 0:
        return result(full(tx, (), array.item(), array.dtype), scalar=isinstance(python, np.generic))
    tensor = record(tx, torch.tensor, array.tolist(), dtype=torch_dtype(array.dtype),
                    device=numpy_device(tx.session))
    return result(tensor, scalar=False)


def is_array_like(value: V.Value) -> bool:
    return isinstance(value, NdarrayValue)


def stand_in(value: NdarrayValue) -> np.ndarray:
    """A tiny real array of the same dtype and rank: NumPy's dtype and argument checks run on it."""
    return np.ones((1,) * value.ndim, dtype=value.dtype)


# ---------------------------------------------------------------- NumPy arguments
NO_VALUE = np._NoValue


def reject(tx: Any, name: str, **arguments: Any) -> None:
    """NumPy arguments that capture does not implement: a graph break unless left at their default."""
    for key, value in arguments.items():
        if value is not None and value is not NO_VALUE and not (isinstance(value, V.ConstantValue)
                                                                  and value.value is None):
            raise tx.unsupported(f"np.{name}({key}=...) inside a compiled function")


def dtype_arg(tx: Any, value: Any) -> np.dtype | None:
    python = constant(tx, value, "dtype")
    return None if python is None else np.dtype(python)


def axes_arg(tx: Any, array: NdarrayValue, axis: Any) -> tuple[int, ...]:
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


def axis_arg(tx: Any, array: NdarrayValue, axis: Any) -> int:
    axis = constant(tx, axis, "axis")
    try:
        return np.lib.array_utils.normalize_axis_index(operator.index(axis), array.ndim)
    except (np.exceptions.AxisError, TypeError) as error:
        raise user_error(tx, str(error)) from None


def probe_dtype(tx: Any, fn: Callable, *args: Any, **kwargs: Any) -> np.dtype:
    """Result dtype of the real NumPy function on stand-ins (and NumPy's own argument errors)."""
    try:
        with np.errstate(all="ignore"):
            return np.asarray(fn(*args, **kwargs)).dtype
    except (TypeError, ValueError, np.exceptions.AxisError) as error:
        raise user_error(tx, f"{getattr(fn, '__name__', fn)}: {error}") from None


def shape_arg(tx: Any, shape: Any) -> tuple[int, ...]:
    python = constant(tx, shape, "shape")
    try:
        return tuple(operator.index(s) for s in python) if isinstance(python, (tuple, list)) else \
            (operator.index(python),)
    except TypeError as error:
        raise user_error(tx, str(error)) from None


# ---------------------------------------------------------------- ufuncs
def _sign(tx: Any, x: V.TensorValue) -> V.Value:
    if not x.meta.dtype.is_floating_point:
        return record(tx, torch.sign, x)
    return record(tx, torch.where, record(tx, torch.isnan, x), x, record(tx, torch.sign, x))


def _positive(tx: Any, x: V.TensorValue) -> V.Value:
    return record(tx, torch.clone, x)


def _torch(fn: Callable) -> Callable:
    return lambda tx, *tensors: record(tx, fn, *tensors)


UFUNCS: dict[np.ufunc, Callable] = {
    np.add: _torch(torch.add), np.subtract: _torch(torch.sub), np.multiply: _torch(torch.mul),
    np.true_divide: _torch(torch.div), np.floor_divide: _torch(torch.floor_divide),
    np.remainder: _torch(torch.remainder), np.fmod: _torch(torch.fmod), np.power: _torch(torch.pow),
    np.float_power: _torch(torch.pow), np.maximum: _torch(torch.maximum), np.minimum: _torch(torch.minimum),
    np.fmax: _torch(torch.fmax), np.fmin: _torch(torch.fmin), np.arctan2: _torch(torch.atan2),
    np.hypot: _torch(torch.hypot), np.copysign: _torch(torch.copysign), np.logaddexp: _torch(torch.logaddexp),
    np.logaddexp2: _torch(torch.logaddexp2), np.heaviside: _torch(torch.heaviside),
    np.logical_and: _torch(torch.logical_and), np.logical_or: _torch(torch.logical_or),
    np.logical_xor: _torch(torch.logical_xor), np.bitwise_and: _torch(torch.bitwise_and),
    np.bitwise_or: _torch(torch.bitwise_or), np.bitwise_xor: _torch(torch.bitwise_xor),
    np.left_shift: _torch(torch.bitwise_left_shift), np.right_shift: _torch(torch.bitwise_right_shift),
    np.equal: _torch(torch.eq), np.not_equal: _torch(torch.ne), np.less: _torch(torch.lt),
    np.less_equal: _torch(torch.le), np.greater: _torch(torch.gt), np.greater_equal: _torch(torch.ge),
    np.negative: _torch(torch.neg), np.positive: _positive, np.absolute: _torch(torch.abs),
    np.fabs: _torch(torch.abs), np.sqrt: _torch(torch.sqrt), np.square: _torch(torch.square),
    np.reciprocal: _torch(torch.reciprocal), np.exp: _torch(torch.exp), np.exp2: _torch(torch.exp2),
    np.expm1: _torch(torch.expm1), np.log: _torch(torch.log), np.log2: _torch(torch.log2),
    np.log10: _torch(torch.log10), np.log1p: _torch(torch.log1p), np.sin: _torch(torch.sin),
    np.cos: _torch(torch.cos), np.tan: _torch(torch.tan), np.arcsin: _torch(torch.asin),
    np.arccos: _torch(torch.acos), np.arctan: _torch(torch.atan), np.sinh: _torch(torch.sinh),
    np.cosh: _torch(torch.cosh), np.tanh: _torch(torch.tanh), np.arcsinh: _torch(torch.asinh),
    np.arccosh: _torch(torch.acosh), np.arctanh: _torch(torch.atanh), np.floor: _torch(torch.floor),
    np.ceil: _torch(torch.ceil), np.trunc: _torch(torch.trunc), np.rint: _torch(torch.round),
    np.sign: _sign, np.signbit: _torch(torch.signbit), np.isnan: _torch(torch.isnan),
    np.isinf: _torch(torch.isinf), np.isfinite: _torch(torch.isfinite),
    np.logical_not: _torch(torch.logical_not), np.invert: _torch(torch.bitwise_not),
    np.deg2rad: _torch(torch.deg2rad), np.rad2deg: _torch(torch.rad2deg),
}
# integer loops where torch's op would compute something else (torch.reciprocal of ints is a float)
_FLOAT_ONLY = {np.reciprocal, np.float_power}
_IDENTITY_ON_BOOL = {np.absolute, np.fabs, np.floor, np.ceil, np.trunc, np.rint, np.positive}
_WEAK_SCALARS = (int, float)


def apply_ufunc(tx: Any, ufunc: np.ufunc, operands: list[V.Value], dtype: Any = None) -> V.Value:
    """``ufunc(*operands)`` with NumPy's dtypes (see the module docstring)."""
    handler = UFUNCS.get(ufunc)
    if handler is None:
        raise tx.unsupported(f"NumPy ufunc np.{ufunc.__name__}")
    if len(operands) != ufunc.nin:
        raise user_error(tx, f"np.{ufunc.__name__} takes {ufunc.nin} arguments")
    if not any(isinstance(o, NdarrayValue) for o in operands):
        values = [constant(tx, o, f"np.{ufunc.__name__}") for o in operands]
        if not any(isinstance(v, (list, tuple)) for v in values):  # scalars only: NumPy computes it now
            with np.errstate(all="ignore"):
                folded = ufunc(*values, dtype=dtype) if dtype is not None else ufunc(*values)
            return V.ConstantValue(folded)
    resolution: list[Any] = []
    stand_ins: list[Any] = []
    arrays: list[NdarrayValue | None] = []
    for operand in operands:
        if isinstance(operand, V.ConstantValue) and type(operand.value) in _WEAK_SCALARS:
            resolution.append(type(operand.value))  # NEP 50: Python int/float adapt to the array
            stand_ins.append(operand.value)
            arrays.append(None)
        else:
            array = as_array(tx, operand)
            resolution.append(array.dtype)
            stand_ins.append(stand_in(array))
            arrays.append(array)
    out_dtype = None if dtype is None else np.dtype(constant(tx, dtype, "dtype="))
    try:
        loop = ufunc.resolve_dtypes(tuple(resolution) + (out_dtype,) + (None,) * (ufunc.nout - 1))
        with np.errstate(all="ignore"):
            probe = ufunc(*stand_ins, dtype=out_dtype) if out_dtype is not None else ufunc(*stand_ins)
    except (TypeError, ValueError, OverflowError) as error:
        raise user_error(tx, f"np.{ufunc.__name__}: {error}") from None
    if ufunc.nout != 1:
        raise tx.unsupported(f"np.{ufunc.__name__} with {ufunc.nout} outputs")
    if ufunc in _FLOAT_ONLY and not np.issubdtype(loop[0], np.floating):
        raise tx.unsupported(f"np.{ufunc.__name__} on integers")
    tensors = []
    for operand, array, loop_dtype in zip(operands, arrays, loop[:ufunc.nin]):
        if array is None:
            tensors.append(full(tx, (), operand.value, loop_dtype))
        else:
            tensors.append(cast(tx, array, loop_dtype))
    if ufunc in _IDENTITY_ON_BOOL and loop[0] == np.bool_:
        handler = _positive  # torch has no bool kernels for these; on booleans they change nothing
    output = handler(tx, *tensors)
    if not isinstance(output, V.TensorValue):
        raise tx.unsupported(f"np.{ufunc.__name__} produced no tensor")
    return result(cast(tx, output, np.asarray(probe).dtype))


# ---------------------------------------------------------------- operators
OPERATOR_UFUNCS = {"+": np.add, "-": np.subtract, "*": np.multiply, "/": np.true_divide,
                    "//": np.floor_divide, "%": np.remainder, "**": np.power, "&": np.bitwise_and,
                    "|": np.bitwise_or, "^": np.bitwise_xor, "<<": np.left_shift, ">>": np.right_shift}
_COMPARE_UFUNCS = {"<": np.less, "<=": np.less_equal, "==": np.equal, "!=": np.not_equal, ">": np.greater,
                   ">=": np.greater_equal}
_UNARY_UFUNCS = {"neg": np.negative, "pos": np.positive, "invert": np.invert}


def no_torch_mix(tx: Any, *values: V.Value) -> None:
    if any(isinstance(v, V.TensorValue) for v in values):
        raise tx.unsupported("an operator between a torch tensor and a NumPy array")


def compare(tx: Any, symbol: str, left: V.Value, right: V.Value) -> V.Value:
    no_torch_mix(tx, left, right)
    return apply_ufunc(tx, _COMPARE_UFUNCS[symbol], [left, right])


def unary_op(tx: Any, name: str, value: V.Value) -> V.Value:
    return apply_ufunc(tx, _UNARY_UFUNCS[name], [value])


def assign(tx: Any, target: NdarrayValue, value: V.Value, casting: str) -> NdarrayValue:
    """``target[...] = value`` (``a += b`` with NumPy's same_kind rule, ``a.sort()``, ``a.fill(v)``)."""
    check_writable(tx, target)
    value = as_array(tx, value)
    if not np.can_cast(value.dtype, target.dtype, casting):
        raise user_error(tx, f"cannot cast {value.dtype} to {target.dtype} with casting rule {casting!r}")
    if casting == "same_kind" and value.shape != target.shape:
        raise user_error(tx, f"non-broadcastable output operand with shape {target.shape}")
    record(tx, torch.Tensor.copy_, target.tensor, cast(tx, value, target.dtype))
    return target


def check_writable(tx: Any, target: NdarrayValue) -> None:
    if numpy_device(tx.session).type != "cpu":
        # the GPU copy of an input is not the caller's array: a write would be lost
        raise tx.unsupported("writing to a NumPy array while NumPy code runs on the GPU")


# ---------------------------------------------------------------- attributes and methods
def swap_last(ndim: int) -> tuple[int, ...]:
    if ndim < 2:
        raise Unsupported("matrix transpose of an array with fewer than 2 dimensions")
    return tuple(range(ndim - 2)) + (ndim - 1, ndim - 2)


# ---------------------------------------------------------------- indexing
def _index_items(tx: Any, index: V.Value) -> tuple[list[Any], bool]:
    """The index as torch indexing arguments, and whether a 0-d result is a NumPy scalar."""
    items = index.items if isinstance(index, V.TupleValue) and index.cls is tuple else [index]
    converted: list[Any] = []
    scalar = True
    for item in items:
        if isinstance(item, NdarrayValue):
            if item.dtype == np.bool_:
                if item.ndim == 0:
                    raise tx.unsupported("indexing with a 0-d boolean array")
                converted.append(item.tensor)
            elif np.issubdtype(item.dtype, np.integer):
                converted.append(cast(tx, item, np.dtype(np.int64)))
            else:
                raise user_error(tx, "arrays used as indices must be of integer (or boolean) type")
            continue
        if isinstance(item, (V.ListValue, V.TupleValue)):
            converted.append(_index_items(tx, as_array(tx, item))[0][0])
            continue
        python = constant(tx, item, "index")
        if python is None or python is Ellipsis:
            scalar = False
            converted.append(python)
        elif isinstance(python, slice):
            converted.append(slice(*[operator.index(p) if p is not None else None
                                     for p in (python.start, python.stop, python.step)]))
        elif isinstance(python, (bool, np.bool_)):
            raise tx.unsupported("indexing with a boolean scalar")
        elif isinstance(python, (int, np.integer)):
            converted.append(int(python))
        else:
            raise user_error(tx, f"only integers, slices, None, Ellipsis and arrays are valid indices, "
                                 f"not {type(python).__name__}")
    return converted, scalar


def get_item(tx: Any, value: NdarrayValue, index: V.Value) -> V.Value:
    items, scalar = _index_items(tx, index)
    for item in items:
        if isinstance(item, V.TensorValue) and item.meta.dtype == torch.bool:
            raise tx.unsupported("boolean-mask indexing (its shape depends on the data)",
                                 "use np.where(mask, x, y) to keep the shape static")
    if value.ndim == 0 and not items:
        return result(record(tx, torch.clone, value.tensor), scalar=True)
    return result(record(tx, operator.getitem, value.tensor, tuple(items)), scalar=scalar)


def set_item(tx: Any, target: NdarrayValue, index: V.Value, value: V.Value) -> None:
    check_writable(tx, target)
    if target.scalar:
        raise user_error(tx, "NumPy scalars do not support item assignment")
    items, _ = _index_items(tx, index)
    masks = [i for i in items if isinstance(i, V.TensorValue) and i.meta.dtype == torch.bool]
    if masks:
        _set_masked(tx, target, items, value)
        return
    if isinstance(value, V.ConstantValue) and type(value.value) in (bool, int, float):
        stored = full(tx, (), value.value, target.dtype)
    else:
        stored = cast(tx, as_array(tx, value), target.dtype)  # NumPy casts unsafely on assignment
    record(tx, operator.setitem, target.tensor, tuple(items), stored)


def _set_masked(tx: Any, target: NdarrayValue, items: list[Any], value: V.Value) -> None:
    """``a[mask] = scalar`` as ``where``: only a single mask over leading dims and a 0-d value."""
    if len(items) != 1:
        raise tx.unsupported("a boolean mask combined with other indices in an assignment")
    mask = items[0]
    if tuple(mask.meta.shape) != target.shape[:mask.meta.ndim]:
        raise user_error(tx, "boolean index did not match the indexed array")
    if isinstance(value, V.ConstantValue) and type(value.value) in (bool, int, float):
        stored = full(tx, (), value.value, target.dtype)
    else:
        array = as_array(tx, value)
        if array.ndim != 0:
            raise tx.unsupported("assigning an array through a boolean mask (data-dependent count)")
        stored = cast(tx, array, target.dtype)
    for _ in range(target.ndim - mask.meta.ndim):
        mask = record(tx, torch.unsqueeze, mask, -1)
    record(tx, torch.Tensor.copy_, target.tensor, record(tx, torch.where, mask, stored, target.tensor))


def get_iter(tx: Any, value: NdarrayValue) -> V.IteratorValue:
    if value.ndim == 0:
        raise user_error(tx, "iteration over a 0-d array")
    return V.IteratorValue([get_item(tx, value, V.ConstantValue(i)) for i in range(value.shape[0])])
