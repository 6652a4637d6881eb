"""NumPy arrays inside a capture: ndarrays as graph tensors that keep NumPy's semantics.

An ndarray read from outside the frame becomes a graph placeholder fed by
``torch.from_numpy`` (on CPU it shares the array's memory, so in-place writes
reach the caller's array), guarded by exact type, dtype, shape, strides and
writeability.  Inside the trace it is an ``NdarrayValue``: a TensorValue plus
the flag "this is an ndarray (or a NumPy scalar)", so operators and ``np.*``
calls on it follow NumPy (``numpy_ops.py``, ``numpy_functions.py``), never
torch's promotion rules.  At the end an ndarray result becomes an ndarray again
(``epilogue_expression``): ``tensor.numpy()``, or a NumPy scalar of the same
dtype where NumPy returns one (reductions, 0-d ufunc results, ``a[i, j]``).

Under ``with torch.device("cuda"):`` around the call (PyTorch 2.1's way to run
NumPy code on the GPU) the arrays are copied to the GPU when fetched, the graph
runs there, and results come back to the host as ndarrays.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ..errors import Unsupported
from ..graph import TensorMeta
from . import values as V
from .sources import Source
from .tensor_ops import guard_default_device

# NumPy dtypes that have a torch dtype of the same meaning (uint16/32/64 have too few torch kernels)
_DTYPES = [np.bool_, np.uint8, np.int8, np.int16, np.int32, np.int64, np.float16, np.float32, np.float64]
TORCH_DTYPE: dict[np.dtype, torch.dtype] = {
    np.dtype(t): torch.from_numpy(np.zeros(1, dtype=t)).dtype for t in _DTYPES}
NUMPY_DTYPE: dict[torch.dtype, np.dtype] = {v: k for k, v in TORCH_DTYPE.items()}


def torch_dtype(dtype: np.dtype) -> torch.dtype:
    dtype = np.dtype(dtype)
    if dtype not in TORCH_DTYPE:
        raise Unsupported(f"NumPy dtype {dtype} inside a compiled function")
    return TORCH_DTYPE[dtype]


class NdarrayValue(V.Value):
    """An ndarray (``scalar=False``) or a NumPy scalar such as np.float64 (``scalar=True``).

    ``tensor`` holds the data as a graph tensor; ``source`` is set only for arrays read from
    outside the frame (returning one unchanged returns the caller's object)."""

    def __init__(self, tensor: V.TensorValue, source: Source | None = None, scalar: bool = False) -> None:
        self.tensor = tensor
        self.source = source
        self.scalar = scalar and tensor.meta.ndim == 0

    @property
    def meta(self) -> TensorMeta:
        return self.tensor.meta

    @property
    def dtype(self) -> np.dtype:
        return NUMPY_DTYPE[self.tensor.meta.dtype]

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.tensor.meta.shape)

    @property
    def ndim(self) -> int:
        return self.tensor.meta.ndim

    def python_type(self) -> type:
        return self.dtype.type if self.scalar else np.ndarray

    def describe(self) -> str:
        kind = "NumPy scalar" if self.scalar else "ndarray"
        return f"{kind} {self.tensor.node.name}: {self.dtype}{list(self.shape)}"


class NumpyMethodValue(V.Value):
    """``a.sum`` before it is called: a method name plus the array."""

    def __init__(self, name: str, self_value: NdarrayValue) -> None:
        self.name = name
        self.self_value = self_value


class FromNumpySource(Source):
    """``torch.from_numpy(<array>)`` (then ``.to(device)`` when the NumPy code runs on a GPU):
    what the guard function fetches for an ndarray placeholder."""

    def __init__(self, parent: Source, device: torch.device) -> None:
        self.parent = parent
        self.device = device

    def access(self, parent_code: str, namespace: Any) -> str:
        code = f"{namespace.bind(torch.from_numpy, 'from_numpy')}({parent_code})"
        if self.device.type != "cpu":
            code += f".to({namespace.bind(self.device, 'device')})"
        return code

    def key(self) -> str:
        return f"from_numpy({self.parent.key()})@{self.device}"


# ---------------------------------------------------------------- the device NumPy code runs on
def numpy_device(session: Any) -> torch.device:
    """CPU, or the default device when ``with torch.device("cuda"):`` is active (guarded)."""
    device = getattr(session, "numpy_device", None)
    if device is None:
        guard_default_device(session)
        device = torch.device("cpu")
        if torch._C._is_torch_function_mode_enabled() and hasattr(torch, "get_default_device"):
            default = torch.get_default_device()
            if default.type == "cuda":
                index = default.index if default.index is not None else torch.cuda.current_device()
                device = torch.device("cuda", index)
        session.numpy_device = device
    return device


# ---------------------------------------------------------------- values from outside the frame
def is_numpy_object(value: Any) -> bool:
    return isinstance(value, (np.ndarray, np.generic))


def wrap_numpy_object(session: Any, value: Any, source: Source) -> V.Value:
    """A guarded Value for an ndarray (a placeholder) or a NumPy scalar (a constant)."""
    if isinstance(value, np.generic):
        if type(value) not in {np.dtype(t).type for t in _DTYPES} or np.isnan(value):
            raise Unsupported(f"NumPy scalar {type(value).__name__} {value!r} as an input")
        session.guards.add(source, "type({v}) is {cls} and {v} == {value}", cls=type(value), value=value)
        return V.ConstantValue(value, source)
    if type(value) is not np.ndarray:
        raise Unsupported(f"ndarray subclass {type(value).__name__} as input")
    if value.dtype not in TORCH_DTYPE:
        raise Unsupported(f"ndarray of dtype {value.dtype} as input")
    if not value.flags.writeable:
        raise Unsupported("a read-only ndarray as input (torch.from_numpy needs a writeable array)")
    if any(s < 0 or s % value.itemsize for s in value.strides):
        raise Unsupported("an ndarray with negative or unaligned strides as input")
    session.guards.add(source, "type({v}) is {cls} and {v}.dtype == {dtype} and {v}.shape == {shape} and "
                       "{v}.strides == {strides} and {v}.flags.writeable",
                       cls=np.ndarray, dtype=value.dtype, shape=value.shape, strides=value.strides)
    device = numpy_device(session)
    tensor = torch.from_numpy(value)
    if device.type != "cpu":
        tensor = tensor.to(device)
    fetch = FromNumpySource(source, device)
    meta = TensorMeta.of(tensor)
    name = "".join(c if c.isalnum() else "_" for c in source.name().lower()).strip("_") or "array"
    node = session.graph.placeholder(name, meta)
    node.extra["source"] = fetch.name()
    session.example_inputs.append(tensor)
    session.placeholder_sources.append(fetch)
    return NdarrayValue(V.TensorValue(node, meta, fetch), source)


# ---------------------------------------------------------------- results
def _to_numpy(tensor: torch.Tensor) -> np.ndarray:
    return tensor.numpy(force=True)


def _to_numpy_scalar(tensor: torch.Tensor) -> np.generic:
    return tensor.numpy(force=True)[()]


def epilogue_expression(builder: Any, value: NdarrayValue) -> str:
    """Code that rebuilds an ndarray result from the graph's output tensor."""
    tensor = value.tensor
    if value.source is not None and tensor.node.op == "placeholder":
        return value.source.code(builder.namespace)  # the caller's own array, unchanged
    inner = builder.expr(tensor)
    convert = _to_numpy_scalar if value.scalar else _to_numpy
    return f"{builder.namespace.bind(convert, convert.__name__.lstrip('_'))}({inner})"
