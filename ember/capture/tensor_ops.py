"""Recording torch calls on symbolic tensors as graph nodes.

A call with a TensorValue among its arguments becomes ``graph.call(target, ...)``
with the target the user called (``torch.add``, ``torch.Tensor.view``,
``F.linear``, ``operator.getitem``).  Its output metadata comes from running the
same call on meta-device tensors; the device is fixed up afterwards since meta
tensors lose it.  A call whose meta run fails or returns a Python value is
data-dependent or unknown: Unsupported (a graph break).
"""
from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from ..errors import Unsupported
from ..graph import (
    TensorMeta,
    channels_last_strides,
    contiguous_strides,
    elementwise_strides,
    stacked_at_end_strides,
    target_name,
)
from . import autocast
from . import values as V
from .sources import AttrSource

# torch callables that make tensors from Python values alone
FACTORY_NAMES = {"zeros", "ones", "empty", "full", "arange", "rand", "randn", "randint", "randperm", "tensor",
                 "as_tensor", "linspace", "logspace", "eye", "empty_strided", "normal", "scalar_tensor",
                 "zeros_like", "ones_like", "empty_like", "full_like", "rand_like", "randn_like",
                 "randint_like", "tril_indices", "triu_indices", "bernoulli"}

# ops that draw from the default random generator
RANDOM_OP_NAMES = {"rand", "randn", "randint", "randperm", "rand_like", "randn_like", "randint_like", "normal",
                   "bernoulli", "multinomial", "poisson", "dropout", "dropout1d", "dropout2d", "dropout3d",
                   "alpha_dropout", "feature_alpha_dropout", "feature_dropout", "rrelu", "uniform_", "normal_",
                   "bernoulli_", "random_", "exponential_", "geometric_", "cauchy_", "log_normal_",
                   "native_dropout", "gumbel_softmax", "fractional_max_pool2d", "fractional_max_pool3d"}

# answered from metadata, no node
DATA_DEPENDENT_METHODS = {"item", "tolist", "numpy", "__bool__", "__int__", "__float__", "__index__",
                          "data_ptr", "nonzero", "unique", "masked_select", "__array__", "backward",
                          "register_hook", "retain_grad", "storage", "untyped_storage", "equal"}

IN_PLACE_OPERATORS = {operator.iadd, operator.isub, operator.imul, operator.itruediv, operator.ifloordiv,
                      operator.imod, operator.ipow, operator.imatmul, operator.iand, operator.ior,
                      operator.ixor, operator.ilshift, operator.irshift, operator.setitem}


def contains_tensor(value: Any) -> bool:
    if isinstance(value, V.TensorValue):
        return True
    if isinstance(value, (V.TupleValue, V.ListValue)):
        return any(contains_tensor(v) for v in value.items)
    if isinstance(value, V.DictValue):
        return any(contains_tensor(v) for v in value.items.values())
    if isinstance(value, (list, tuple)):
        return any(contains_tensor(v) for v in value)
    if isinstance(value, dict):
        return any(contains_tensor(v) for v in value.values())
    return False


def to_graph_arg(value: V.Value) -> Any:
    """Value -> graph argument: Node for tensors, Python constants otherwise."""
    if isinstance(value, V.TensorValue):
        return value.node
    if isinstance(value, V.TupleValue):
        return tuple(to_graph_arg(v) for v in value.items)
    if isinstance(value, V.ListValue):
        return [to_graph_arg(v) for v in value.items]
    if isinstance(value, V.DictValue):
        return {k: to_graph_arg(v) for k, v in value.items.items()}
    if isinstance(value, V.SizeValue):     # dynamic shapes: the size as a graph value, not pinned
        return value.node()
    if isinstance(value, V.SliceValue):
        return value.graph_arg(to_graph_arg)
    if isinstance(value, V.ConstantValue):
        return value.value
    if isinstance(value, V.ObjectValue) and isinstance(value.obj, (torch.dtype, torch.device)):
        return value.obj
    if isinstance(value, V.SetValue):
        return value.as_python()
    raise Unsupported(f"passing {value.describe()} to a torch operation")


def _is_in_place(target: Any, kwargs: dict) -> bool:
    if target in IN_PLACE_OPERATORS:
        return True
    if getattr(target, "__module__", None) in ("_operator", "operator"):  # operator.and_ / or_ are not in place
        return False
    name = target_name(target)
    if name.endswith("_") and not name.endswith("__"):
        return True
    return kwargs.get("inplace") is True


def _device_of_output(target: Any, args: tuple, kwargs: dict, inputs: list[V.TensorValue]) -> torch.device:
    """Meta tensors lose the device; recover it from the call."""
    requested = kwargs.get("device")
    name = target_name(target)
    if name in ("to", "cuda", "cpu", "new_empty", "new_zeros", "new_ones", "new_full", "new_tensor", "type_as"):
        if name == "cpu":
            return torch.device("cpu")
        if name == "cuda":
            index = args[1] if len(args) > 1 else kwargs.get("device")
            return torch.device("cuda", index) if isinstance(index, int) else torch.device(index or "cuda")
        for arg in list(args[1:]) + list(kwargs.values()):
            if isinstance(arg, torch.device):
                requested = arg
            elif isinstance(arg, str):
                try:
                    requested = torch.device(arg)
                except RuntimeError:
                    pass
            elif isinstance(arg, V.TensorValue) and name in ("to", "type_as"):
                requested = arg.meta.device
    if requested is not None:
        device = torch.device(requested) if not isinstance(requested, int) else torch.device("cuda", requested)
        if device.type == "cuda" and device.index is None and torch.cuda.is_available():
            device = torch.device("cuda", torch.cuda.current_device())
        return device
    if inputs:
        non_cpu = [t.meta.device for t in inputs if t.meta.device.type != "cpu" or t.meta.ndim > 0]
        return non_cpu[0] if non_cpu else inputs[0].meta.device
    get_default = getattr(torch, "get_default_device", None)
    return get_default() if get_default is not None else torch.device("cpu")


def _meta_tensor(value: V.TensorValue) -> torch.Tensor:
    meta = value.meta
    tensor = meta.to_meta_tensor()
    if meta.requires_grad:
        tensor.requires_grad_()
        # intermediate results are not leaves: in-place ops on them are legal
        if value.node.op != "placeholder" and meta.is_contiguous():
            with torch.enable_grad():   # whatever the caller's grad mode: the value requires grad
                tensor = tensor * 1
    return tensor


def _meta_args(value: Any, inputs: list[V.TensorValue], tensors: bool = True) -> Any:
    """The argument for the meta run; its tensor arguments appended to ``inputs``.  ``tensors``
    False: no meta tensors made (None in their place), the cached result is used."""
    if isinstance(value, V.TensorValue):
        inputs.append(value)
        return _meta_tensor(value) if tensors else None
    if isinstance(value, V.SizeValue):   # the meta run is at the sizes seen (not a decision: no pin)
        return value.hint
    if isinstance(value, V.SliceValue):
        return value.hint()
    if isinstance(value, V.TupleValue):
        return tuple(_meta_args(v, inputs, tensors) for v in value.items)
    if isinstance(value, V.ListValue):
        return [_meta_args(v, inputs, tensors) for v in value.items]
    if isinstance(value, V.DictValue):
        return {k: _meta_args(v, inputs, tensors) for k, v in value.items.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(_meta_args(v, inputs, tensors) for v in value)
    if isinstance(value, dict):
        return {k: _meta_args(v, inputs, tensors) for k, v in value.items()}
    return to_graph_arg(value) if isinstance(value, V.Value) else value


def _sanitize_device_args(target: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Make the meta run stay on meta: device arguments become 'meta'."""
    name = target_name(target)
    if "device" in kwargs:
        kwargs = dict(kwargs, device="meta")
    if name in ("to",):
        new_args = []
        for a in args:
            if isinstance(a, torch.device) or (isinstance(a, str) and a.split(":")[0] in ("cpu", "cuda", "meta")):
                a = "meta"
            new_args.append(a)
        args = tuple(new_args)
        if "device" in kwargs:
            kwargs["device"] = "meta"
    return args, kwargs


def record_call(session: Any, target: Callable, args: list[V.Value], kwargs: dict[str, V.Value],
                name: str | None = None) -> V.Value:
    """Record ``target(*args, **kwargs)`` on symbolic tensors and return its symbolic result."""
    line = session.current_line()
    op_name = target_name(target)
    if op_name in DATA_DEPENDENT_METHODS:
        raise Unsupported(f"data-dependent operation {op_name}() on a tensor", line,
                          "keep the value as a tensor, or move this outside the compiled function")
    if "out" in kwargs:
        return _record_with_out(session, target, args, kwargs, line, op_name)
    if session.seeded_in_graph and op_name.rsplit(".", 1)[-1] in RANDOM_OP_NAMES:
        raise Unsupported(f"random op {op_name} after torch.manual_seed in the same graph", line,
                          "the seed is set after the graph (calls.py _manual_seed)")
    if session.autocast.any_enabled():  # eager's autocast casts, as explicit nodes
        args, kwargs = autocast.apply_casts(session, target, list(args), dict(kwargs),
                                            lambda value, dtype: _record_cast(session, value, dtype))
    return _record(session, target, args, kwargs, name, line, op_name)


def _record_with_out(session: Any, target: Callable, args: list[V.Value], kwargs: dict[str, V.Value], line: str,
                     op_name: str) -> V.Value:
    """``torch.add(a, b, out=t)`` as the functional op, then ``t.copy_(result)``; returns ``t``, as eager.

    Only where eager writes exactly the result into ``t``: ``t`` an input tensor that no argument is
    computed from (no overlap), no autograd involved (eager refuses out= then), and the result of
    ``t``'s shape, dtype and device (no resize, no cast)."""
    out = kwargs["out"]
    refused = Unsupported(f"{op_name}(out=...) inside a compiled function", line)
    if not isinstance(out, V.TensorValue) or out.node.op != "placeholder" or out.meta.requires_grad:
        raise refused
    result = record_call(session, target, args, {k: v for k, v in kwargs.items() if k != "out"})
    if not isinstance(result, V.TensorValue) or result.meta.requires_grad:
        refused.eager_may_raise = True  # "functions with out=... arguments don't support automatic differentiation"
        raise refused
    if (result.meta.shape, result.meta.dtype, result.meta.device) != (out.meta.shape, out.meta.dtype,
                                                                       out.meta.device):
        raise refused
    session.pin_sizes(result)      # the check above compared sizes
    session.pin_sizes(out)
    if _reads(result.node, out.node):
        raise refused
    return record_call(session, torch.Tensor.copy_, [out, result], {})


def _reads(node: Any, target: Any) -> bool:
    """Whether ``node`` is computed from ``target`` (through any chain of ops)."""
    seen, stack = set(), [node]
    while stack:
        current = stack.pop()
        if current is target:
            return True
        if current in seen:
            continue
        seen.add(current)
        stack.extend(current.inputs())
    return False


def _record_cast(session: Any, value: V.TensorValue, dtype: torch.dtype) -> V.Value:
    return _record(session, torch.Tensor.to, [value, V.ConstantValue(dtype)], {}, None, session.current_line(), "to")


def _record(session: Any, target: Callable, args: list[V.Value], kwargs: dict[str, V.Value],
            name: str | None, line: str, op_name: str) -> V.Value:
    graph_args = tuple(to_graph_arg(a) for a in args)
    graph_kwargs = {k: to_graph_arg(v) for k, v in kwargs.items()}
    cache_key = _meta_cache_key(target, args, kwargs, session.grad_enabled)
    cached = _META_CACHE.get(cache_key) if cache_key is not None else None
    # a cache hit makes no meta tensors (a training graph's intermediate that requires grad costs
    # a meta multiplication each: most of capture's time)
    tensors = cached is None or op_name in ("cpu", "cuda")
    inputs: list[V.TensorValue] = []
    meta_args = tuple(_meta_args(a, inputs, tensors) for a in args)
    meta_kwargs = {k: _meta_args(v, inputs, tensors) for k, v in kwargs.items()}
    if op_name in ("cpu", "cuda"):
        meta_result = meta_args[0]  # same shape and strides, only the device changes
    elif cached is not None:
        meta_result = cached  # repeated layers: the same op on the same metadata
    else:
        meta_args, meta_kwargs = _sanitize_device_args(target, meta_args, meta_kwargs)
        if not inputs and "device" not in meta_kwargs:
            meta_kwargs["device"] = "meta"
        try:
            with torch.set_grad_enabled(session.grad_enabled):
                meta_result = target(*meta_args, **meta_kwargs)
        except Exception as error:  # a user error (shapes, dtypes), a missing meta kernel, or data needed
            failure = Unsupported(f"{op_name} could not be evaluated on meta tensors "
                                  f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''})",
                                  line, "this op is data-dependent or has no meta kernel")
            failure.eager_may_raise = True  # run eagerly: eager raises the user's error itself
            raise failure from None
    if cache_key is not None and cached is None and (isinstance(meta_result, torch.Tensor) or isinstance(
            meta_result, (tuple, list)) and all(isinstance(t, torch.Tensor) for t in meta_result)):
        if len(_META_CACHE) > 4096:
            _META_CACHE.clear()
        _META_CACHE[cache_key] = meta_result
    device = _device_of_output(target, graph_args, graph_kwargs, inputs)
    if not inputs and graph_kwargs.get("device") is None:
        guard_default_device(session)
    _check_devices(op_name, inputs, device, line)
    in_place = _is_in_place(target, graph_kwargs)

    if isinstance(meta_result, torch.Tensor):
        meta = _eager_layout(target, args, graph_kwargs, inputs, _fix_meta(meta_result, device))
        if in_place and args and isinstance(args[0], V.TensorValue):
            self_value = args[0]
            if meta.shape != self_value.meta.shape or meta.stride != self_value.meta.stride \
                    or meta.dtype != self_value.meta.dtype:
                raise Unsupported(f"in-place {op_name} that changes the tensor's metadata", line)
            node = session.graph.call(target, graph_args, graph_kwargs, meta, name, line)
            _note_mutation(session, self_value)
            return self_value
        node = session.graph.call(target, graph_args, graph_kwargs, meta, name, line)
        if meta.requires_grad and not session.grad_enabled:
            node.extra["grad_enabled"] = False   # a view under no_grad (session.needs_eager_autograd)
        return V.TensorValue(node, meta)
    if meta_result is None:
        if in_place and args and isinstance(args[0], V.TensorValue):
            _note_mutation(session, args[0])
        session.graph.call(target, graph_args, graph_kwargs, None, name, line)
        return V.NONE
    if isinstance(meta_result, (tuple, list)) and meta_result and \
            all(isinstance(t, torch.Tensor) for t in meta_result):
        metas = tuple(_fix_meta(t, device) for t in meta_result)
        node = session.graph.call(target, graph_args, graph_kwargs, metas, name, line)
        items: list[V.Value] = []
        for i, meta in enumerate(metas):
            item = session.graph.call(operator.getitem, (node, i), {}, meta, f"{node.name}_{i}", line)
            items.append(V.TensorValue(item, meta))
        if isinstance(meta_result, list):
            return V.ListValue(items)
        cls = type(meta_result)
        fields = _structseq_fields(meta_result) if cls is not tuple else ()
        return V.TupleValue(items, None, cls, fields)
    raise Unsupported(f"{op_name} returns a Python value that depends on tensor data", line,
                      "keep the computation in tensors")


# (target, argument metadata and constants, grad mode) -> meta result; only its metadata is ever read
_META_CACHE: dict[Any, Any] = {}


def _meta_cache_key(target: Any, args: list, kwargs: dict, grad_enabled: bool) -> Any:
    try:
        key = (target, tuple(_meta_key_of(a) for a in args),
               tuple(sorted((k, _meta_key_of(v)) for k, v in kwargs.items())), grad_enabled)
        hash(key)
        return key
    except (_NotCacheable, TypeError):  # unhashable constants: evaluate without the cache
        return None


class _NotCacheable(Exception):
    pass


def _meta_key_of(value: Any) -> Any:
    if isinstance(value, V.TensorValue):
        meta = value.meta
        return ("T", meta.shape, meta.stride, meta.dtype, meta.device, meta.requires_grad, meta.storage_offset,
                value.node.op == "placeholder")
    if isinstance(value, (V.TupleValue, V.ListValue)):
        return (type(value).__name__, tuple(_meta_key_of(v) for v in value.items))
    if isinstance(value, V.SizeValue):
        return ("C", int, value.hint)
    if isinstance(value, V.SliceValue):
        return ("C", slice, value.describe())
    if isinstance(value, V.ConstantValue):
        return ("C", type(value.value), value.value)
    if isinstance(value, V.ObjectValue) and isinstance(value.obj, (torch.dtype, torch.device)):
        return ("C", type(value.obj), value.obj)
    raise _NotCacheable


_get_default_device = getattr(torch, "get_default_device", None)
_function_mode_enabled = torch._C._is_torch_function_mode_enabled


def guard_default_device(session: Any) -> None:
    """A factory without device=: torch.set_default_device() decides where it lives.  The default
    device is a torch-function mode; with no mode active (one C call) it is the CPU."""
    if not _function_mode_enabled():
        session.guards.add(None, "not {function_mode_enabled}()", function_mode_enabled=_function_mode_enabled)
    elif _get_default_device is not None:  # get_default_device() costs ~20 us: only where a mode is on
        session.guards.add(None, "{get_default_device}() == {device}", get_default_device=_get_default_device,
                           device=_get_default_device())

# ops that take tensors on several devices in eager (a copy across devices, CPU index tensors)
_CROSS_DEVICE_OPS = {"to", "copy_", "type_as", "getitem", "setitem", "index_put_", "index_put", "index",
                     "cpu", "cuda", "new_tensor", "new_empty", "new_zeros", "new_ones", "new_full"}


def _check_devices(op_name: str, inputs: list[V.TensorValue], device: torch.device, line: str) -> None:
    """Device errors eager raises (no CUDA, tensors on different devices): eager runs the frame and
    raises them itself; capture must not build a graph from them."""
    if device.type == "cuda" and not torch.cuda.is_available():
        failure = Unsupported(f"{op_name} on a CUDA device without CUDA", line)
        failure.eager_may_raise = True
        raise failure
    if op_name in _CROSS_DEVICE_OPS or len(inputs) < 2:
        return
    # CPU 0-dim tensors mix with any device in eager (they are read as scalars)
    devices = {_indexed(t.meta.device) for t in inputs if not (t.meta.device.type == "cpu" and t.meta.ndim == 0)}
    if len(devices) > 1:
        failure = Unsupported(f"{op_name} on tensors on different devices "
                              f"({', '.join(sorted(str(d) for d in devices))})", line)
        failure.eager_may_raise = True
        raise failure


def _indexed(device: torch.device) -> torch.device:
    """``cuda`` is the current CUDA device: ``cuda`` and ``cuda:0`` are one device to eager."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def _note_mutation(session: Any, value: V.TensorValue) -> None:
    base = value.node
    if base.op == "placeholder":
        session.mutated_inputs.add(id(base))
    else:
        session.mutated_inputs.add(-1)  # a view of something may be an input; be conservative


def _eager_layout(target: Callable, args: list[V.Value], kwargs: dict[str, Any], inputs: list[V.TensorValue],
                  meta: TensorMeta) -> TensorMeta:
    """The result's strides as eager's kernels lay it out, where the meta kernels differ.  Found by
    comparing the meta device with the CPU for permuted, sliced and channels-last inputs
    (benchmarks/stride_sweep.py and session 26's scans); CUDA is assumed to follow the CPU only
    where the rule is TensorIterator's or a composite op's."""
    if "out" in kwargs:
        return meta
    if target in _CONVOLUTIONS:
        return _convolution_layout(inputs, meta)
    if target in _TENSOR_ITERATOR_OPS or (target in _ROUNDING_DIVISIONS and kwargs.get("rounding_mode") is not None):
        return _tensor_iterator_layout(inputs, meta)
    if _is_scalar_base_pow(target, args):
        # eager's pow(Scalar, Tensor) fills a fresh contiguous tensor; the meta kernel follows the exponent
        return dataclasses.replace(meta, stride=contiguous_strides(meta.shape))
    if meta.device.type == "cpu" and inputs and _suggests_format(target, args, kwargs):
        return _suggested_format_layout(inputs[0].meta, meta)
    if target is torch.stack and inputs and meta.ndim == inputs[0].meta.ndim + 1:
        return _stack_layout(args, kwargs, inputs, meta)
    return meta


_CONVOLUTIONS = {F.conv2d, torch.conv2d, F.conv_transpose2d, torch.conv_transpose2d}


def _convolution_layout(inputs: list[V.TensorValue], meta: TensorMeta) -> TensorMeta:
    """Eager's 2-D convolutions (oneDNN, cuDNN) return channels-last when the input or the weight
    is channels-last; the meta device always says contiguous."""
    if meta.ndim != 4 or not any(t.meta.ndim == 4 and _channels_last(t.meta) for t in inputs[:2]):
        return meta
    n, c, h, w = meta.shape
    return dataclasses.replace(meta, stride=(h * w * c, 1, w * c, c))


# Binary ops whose meta kernels lay out a result other than eager's CPU and CUDA kernels when an
# operand is broadcast and another permuted (logical_and(0-d, x.t()) is contiguous on meta, x.t()'s
# layout in eager): 108 of 672 op/layout/operand cases of every binary elementwise op.  div is one
# only with a rounding_mode (found by the fuzzer, seeds 1605, 2570, 6151).
_TENSOR_ITERATOR_OPS = {
    torch.logical_and, torch.logical_or, torch.logical_xor, torch.copysign, torch.floor_divide,
    torch.Tensor.logical_and, torch.Tensor.logical_or, torch.Tensor.logical_xor, torch.Tensor.copysign,
    torch.Tensor.floor_divide, torch.Tensor.__floordiv__, torch.Tensor.__rfloordiv__, operator.floordiv,
}
_ROUNDING_DIVISIONS = {torch.div, torch.divide, torch.Tensor.div, torch.Tensor.divide}


def _tensor_iterator_layout(inputs: list[V.TensorValue], meta: TensorMeta) -> TensorMeta:
    """The result's strides as eager's TensorIterator chooses them (graph.elementwise_strides)."""
    sizes = tuple(meta.shape) + tuple(s for t in inputs for s in (*t.meta.shape, *t.meta.stride))
    if not all(isinstance(s, int) for s in sizes):
        return meta
    return dataclasses.replace(meta, stride=tuple(elementwise_strides(meta.shape, [t.meta for t in inputs])))


def _stack_layout(args: list[V.Value], kwargs: dict[str, Any], inputs: list[V.TensorValue],
                  meta: TensorMeta) -> TensorMeta:
    """Eager's stack at a new last dim (graph.stacked_at_end_strides); the meta kernel follows a
    permuted input.  (Below the last dim eager cats the inputs and splits a dim by a view: the meta
    device agrees.)"""
    dim = kwargs.get("dim", args[1] if len(args) > 1 else 0)
    dim = getattr(dim, "value", dim)
    if not isinstance(dim, int) or dim not in (-1, meta.ndim - 1):
        return meta
    strides = stacked_at_end_strides(meta.shape, [t.meta for t in inputs])
    return meta if strides is None else dataclasses.replace(meta, stride=strides)


def _is_scalar_base_pow(target: Callable, args: list[V.Value]) -> bool:
    """A number raised to a tensor: ``2 ** x``, ``torch.pow(2, x)``, ``x.__rpow__(2)``."""
    if target in (torch.pow, operator.pow) and len(args) == 2:
        base, exponent = args
    elif target is torch.Tensor.__rpow__ and len(args) == 2:
        exponent, base = args
    else:
        return False
    return isinstance(exponent, V.TensorValue) and not isinstance(base, V.TensorValue)


# Ops whose CPU kernels allocate the result in the input's suggested memory format (channels-last
# stays channels-last, any other layout becomes contiguous), where the meta kernels keep a permuted
# layout (batch_norm) or make a channels-last input contiguous (the rest).
_SUGGESTED_FORMAT_OPS = {
    F.batch_norm, torch.batch_norm, F.group_norm, torch.group_norm, F.pixel_shuffle, torch.pixel_shuffle,
    F.channel_shuffle, torch.channel_shuffle, torch.roll, torch.Tensor.roll,
}


def _suggests_format(target: Callable, args: list[V.Value], kwargs: dict[str, Any]) -> bool:
    if target in _SUGGESTED_FORMAT_OPS:
        return True
    if target is F.pad:     # F.pad(x, pad, mode="constant", value=None): the replicate and reflect kernels
        mode = kwargs.get("mode", args[2] if len(args) > 2 else "constant")
        return getattr(mode, "value", mode) in ("replicate", "reflect")
    return False


def _suggested_format_layout(input_meta: TensorMeta, meta: TensorMeta) -> TensorMeta:
    sizes = tuple(meta.shape) + tuple(input_meta.shape) + tuple(input_meta.stride)
    if not all(isinstance(s, int) for s in sizes):
        return meta
    if meta.ndim == 4 and input_meta.ndim == 4 and _channels_last(input_meta):
        return dataclasses.replace(meta, stride=channels_last_strides(meta.shape))
    if meta.ndim == 5:        # channels_last_3d: not compared with eager; the meta kernel's answer stays
        return meta
    return dataclasses.replace(meta, stride=contiguous_strides(meta.shape))


def _channels_last(meta: TensorMeta) -> bool:
    """``suggest_memory_format() == channels_last`` for dense 4-D tensors that are not also contiguous."""
    probe = torch.empty_strided(meta.shape, meta.stride, device="meta")
    return probe.is_contiguous(memory_format=torch.channels_last) and not probe.is_contiguous()


def _fix_meta(tensor: torch.Tensor, device: torch.device) -> TensorMeta:
    meta = TensorMeta.of(tensor)
    return TensorMeta(meta.shape, meta.stride, meta.dtype, device, meta.requires_grad, meta.storage_offset)


def _structseq_fields(result: Any) -> tuple[str, ...]:
    fields = []
    for i, item in enumerate(result):
        for name in dir(result):
            if not name.startswith("_") and name not in ("count", "index", "n_fields", "n_sequence_fields",
                                                          "n_unnamed_fields") and getattr(result, name) is item:
                fields.append(name)
                break
        else:
            fields.append(f"_{i}")
    return tuple(fields)


# ------------------------------------------------------------------ metadata
def tensor_attribute(session: Any, value: V.TensorValue, name: str) -> V.Value:
    """``x.shape``, ``x.dtype`` ... from metadata; ``x.T`` and friends as nodes."""
    meta = value.meta
    simple = {
        "shape": lambda: torch.Size(meta.shape), "dtype": lambda: meta.dtype, "device": lambda: meta.device,
        "ndim": lambda: meta.ndim, "is_cuda": lambda: meta.device.type == "cuda",
        "is_cpu": lambda: meta.device.type == "cpu", "requires_grad": lambda: meta.requires_grad,
        "is_leaf": lambda: value.node.op == "placeholder" or not meta.requires_grad,
        "layout": lambda: torch.strided, "is_sparse": lambda: False, "is_quantized": lambda: False,
        "is_meta": lambda: False, "is_nested": lambda: False, "itemsize": lambda: meta.to_meta_tensor().itemsize,
    }
    if name == "shape":
        return session.size_values(value)
    if name in simple:
        return V.ConstantValue(simple[name]())
    if name == "T":
        return record_call(session, torch.Tensor.permute, [value, V.ConstantValue(tuple(range(meta.ndim))[::-1])],
                           {})
    if name in ("mT", "mH"):
        return record_call(session, torch.Tensor.transpose, [value, V.ConstantValue(-2), V.ConstantValue(-1)], {})
    if name in ("real", "imag"):
        return record_call(session, getattr(torch, name), [value], {})
    if name == "grad" and value.source is not None and value.node in session.input_tensors:
        # an input's .grad (after a backward that was a graph break): an input itself, guarded
        return session.wrap(session.input_tensors[value.node].grad, AttrSource(value.source, "grad"))
    if name in ("grad", "data", "grad_fn", "_base", "names"):
        raise Unsupported(f"tensor attribute .{name}", session.current_line())
    attr = getattr(torch.Tensor, name, None)
    if attr is None:
        raise Unsupported(f"unknown tensor attribute .{name}", session.current_line())
    return V.TensorMethodValue(name, value)


METADATA_METHODS = {"size", "stride", "dim", "ndimension", "numel", "nelement", "is_contiguous",
                    "is_floating_point", "is_complex", "element_size", "is_signed", "get_device",
                    "storage_offset", "__len__", "type"}
# tensor methods whose results depend on sizes: __len__ on the first, the others (stride(d)
# multiplies the sizes of the faster dims) on all
SIZE_QUERIES = {"stride", "numel", "nelement", "__len__", "is_contiguous"}


def call_tensor_method(session: Any, name: str, self_value: V.TensorValue, args: list[V.Value],
                       kwargs: dict[str, V.Value]) -> V.Value:
    meta = self_value.meta
    # only metadata queries read their arguments as Python values here (a size passed to view()
    # must stay a graph value under dynamic shapes)
    constant_args = [a.as_python() for a in args] \
        if name in METADATA_METHODS and not contains_tensor(args) else None
    if constant_args is not None and not kwargs:
        if name == "size":     # under dynamic shapes, sizes pin themselves when used (session.size_value)
            if not constant_args:
                return session.size_values(self_value)
            return session.size_value(self_value, constant_args[0] % max(meta.ndim, 1))
        if name in SIZE_QUERIES:     # the sizes they reveal become Python ints (pinned if symbolic)
            session.pin_sizes(self_value, (0,) if name == "__len__" else None)
        if name == "stride":
            return V.ConstantValue(meta.stride if not constant_args else meta.stride[constant_args[0]])
        if name in ("dim", "ndimension"):
            return V.ConstantValue(meta.ndim)
        if name in ("numel", "nelement"):
            return V.ConstantValue(meta.numel())
        if name == "is_contiguous" and not constant_args:
            return V.ConstantValue(meta.to_meta_tensor().is_contiguous())
        if name in ("is_floating_point", "is_complex", "element_size", "is_signed"):
            return V.ConstantValue(getattr(meta.to_meta_tensor(), name)())
        if name == "get_device":
            return V.ConstantValue(meta.device.index if meta.device.type == "cuda" else -1)
        if name == "storage_offset":
            return V.ConstantValue(meta.storage_offset)
        if name == "__len__":
            return V.ConstantValue(meta.shape[0])
        if name == "type" and not constant_args:
            return V.ConstantValue(meta.to_meta_tensor().type().replace("torch.meta", "torch").replace(
                "torch.", "torch.cuda." if meta.device.type == "cuda" else "torch.", 1))
    if name == "requires_grad_":
        raise Unsupported("requires_grad_() inside a compiled function", session.current_line())
    target = getattr(torch.Tensor, name)
    return record_call(session, target, [self_value] + list(args), kwargs, name)
