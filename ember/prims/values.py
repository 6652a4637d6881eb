"""Values of the prim graph under construction, and `emit`, which appends one node.

Decompositions never touch Nodes: they receive `Value`s (a node of the new graph plus
its meta) and Python constants, call helpers from `ops`, and return Values.  `emit`
computes each new node's meta with the prim's meta rule (or, for an Extern, by running
the torch callable on meta-device tensors).
"""
from __future__ import annotations

import contextlib
import dataclasses
import operator
from collections.abc import Callable, Iterator
from typing import Any

import torch

from ember.errors import CompileError
from ember.graph import Graph, Node, TensorMeta, target_name, tree_leaves, tree_map
from ember.prims.primitives import Prim
from ember.symbolic import hint_of, is_symbolic


class Value:
    """A tensor (meta is a TensorMeta) or a runtime Python scalar (meta is None) of the new graph."""

    __slots__ = ("alias", "meta", "node", "pytype")

    def __init__(self, node: Node, meta: TensorMeta | None, pytype: type | None = None) -> None:
        self.node = node
        self.meta = meta
        self.alias: Any = None  # set by functionalization: where this value lives (for in-place ops)
        self.pytype = pytype    # for runtime scalars: int / float / bool

    @property
    def is_tensor(self) -> bool:
        return isinstance(self.meta, TensorMeta)

    @property
    def shape(self) -> tuple:
        return self.meta.shape

    @property
    def dtype(self) -> torch.dtype:
        return self.meta.dtype

    @property
    def device(self) -> torch.device:
        return self.meta.device

    @property
    def ndim(self) -> int:
        return len(self.meta.shape)

    def numel(self) -> Any:
        return self.meta.numel()

    def __repr__(self) -> str:
        return f"Value({self.node.name}: {self.meta})"

    # Arithmetic reads like math inside decompositions: `(x - mean) * rstd`.
    def __add__(self, other: Any) -> Value: return _ops().add(self, other)
    def __radd__(self, other: Any) -> Value: return _ops().add(other, self)
    def __sub__(self, other: Any) -> Value: return _ops().sub(self, other)
    def __rsub__(self, other: Any) -> Value: return _ops().sub(other, self)
    def __mul__(self, other: Any) -> Value: return _ops().mul(self, other)
    def __rmul__(self, other: Any) -> Value: return _ops().mul(other, self)
    def __truediv__(self, other: Any) -> Value: return _ops().div(self, other)
    def __rtruediv__(self, other: Any) -> Value: return _ops().div(other, self)
    def __neg__(self) -> Value: return _ops().neg(self)
    def __pow__(self, other: Any) -> Value: return _ops().pow(self, other)


def _ops() -> Any:
    from ember.prims import ops
    return ops


def is_tensor(value: Any) -> bool:
    return isinstance(value, Value) and value.is_tensor


@dataclasses.dataclass
class Emitter:
    """State of one to_primitives run: the graph being built and per-graph services."""

    graph: Graph
    source_line: str | None = None
    # set by functionalization: mutate(value, new_value) records an in-place update
    mutate_hook: Callable[[Value, Value], None] | None = None
    seed: Value | None = None      # one fresh RNG seed per graph call (random.py)
    rng_offset: Any = 0            # Philox counter already used by earlier random ops
    log: list[Node] = dataclasses.field(default_factory=list)
    memo: dict = dataclasses.field(default_factory=dict)   # values a decomposition makes once per graph
    extern_metas: dict = dataclasses.field(default_factory=dict)   # extern_meta's results


_ACTIVE: list[Emitter] = []


@contextlib.contextmanager
def building(emitter: Emitter) -> Iterator[Emitter]:
    _ACTIVE.append(emitter)
    try:
        yield emitter
    finally:
        _ACTIVE.pop()


def current() -> Emitter:
    assert _ACTIVE, "prims ops used outside of to_primitives"
    return _ACTIVE[-1]


def _node_of(value: Any) -> Any:
    return value.node if isinstance(value, Value) else value


def _meta_of(value: Any) -> Any:
    if isinstance(value, Value):
        return value.meta if value.is_tensor else (value.pytype or float)(1)
    return value


def emit(target: Any, *args: Any, **kwargs: Any) -> Any:
    """Append `target(*args, **kwargs)` to the graph; returns a Value (or a tuple of them)."""
    if isinstance(target, Prim):
        meta = target.infer_meta(*tree_map(_meta_of, args), **tree_map(_meta_of, kwargs))
    else:
        meta = extern_meta(target, args, kwargs)
    return emit_with_meta(target, meta, args, kwargs)


def emit_with_meta(target: Any, meta: Any, args: tuple, kwargs: dict, pytype: type | None = None) -> Any:
    emitter = current()
    node = emitter.graph.call(target, tree_map(_node_of, args), tree_map(_node_of, kwargs), meta,
                              source_line=emitter.source_line)
    emitter.log.append(node)
    if isinstance(meta, tuple):
        # multi-output: one operator.getitem node per element, so each has a TensorMeta
        outs = []
        for i, m in enumerate(meta):
            item = emitter.graph.call(operator.getitem, (node, i), {}, m, name=f"{node.name}_{i}",
                                      source_line=emitter.source_line)
            emitter.log.append(item)
            outs.append(Value(item, m))
        return tuple(outs)
    return Value(node, meta, pytype)


def extern_meta(target: Any, args: tuple, kwargs: dict) -> Any:
    """Meta of an Extern: run the torch callable on meta-device tensors (or, for symbolic sizes,
    a shape rule of extern_shapes.py)."""
    from ember.prims.extern_shapes import symbolic_output_meta
    symbolic = symbolic_output_meta(target, args, kwargs, _meta_of, _device_of(args, kwargs))
    if symbolic is not None:
        return symbolic
    # a model's repeated layers call each extern on the same metadata: one meta run per graph
    cache = _ACTIVE[-1].extern_metas if _ACTIVE else None
    key = _extern_key(target, args, kwargs) if cache is not None else None
    meta = cache.get(key) if key is not None else None
    if meta is None:
        out, _ = meta_call(target, args, kwargs)
        meta = metas_of(out, _device_of(args, kwargs))
        if key is not None:
            cache[key] = meta
    return meta


class _Uncacheable(Exception):
    pass


def _extern_key(target: Any, args: tuple, kwargs: dict) -> Any:
    """What an extern's meta run sees, hashable: the arguments' structure, tensor metadata, the
    types of runtime scalars and each constant with its type (1, 1.0 and True promote apart).
    None (no caching) where that takes a guess: symbolic sizes (comparing them decides guards),
    tensor constants, unhashable values."""
    try:
        key = (target, _key_of(args), _key_of(kwargs))
        hash(key)
        return key
    except (_Uncacheable, TypeError):
        return None


def _key_of(value: Any) -> Any:
    if isinstance(value, Value):
        if not value.is_tensor:
            return ("scalar", value.pytype)
        meta = value.meta
        if any(is_symbolic(s) for s in (*meta.shape, *meta.stride, meta.storage_offset)):
            raise _Uncacheable
        return ("tensor", meta)
    if isinstance(value, (tuple, list)):
        return (type(value), tuple(_key_of(v) for v in value))
    if isinstance(value, dict):
        return (dict, tuple((k, _key_of(v)) for k, v in value.items()))
    if isinstance(value, torch.Tensor) or is_symbolic(value):
        raise _Uncacheable
    return (type(value), value)


def _device_of(args: tuple, kwargs: dict) -> torch.device:
    devices = [v.device for v in tree_leaves((args, kwargs)) if is_tensor(v)]
    return devices[0] if devices else torch.device(kwargs.get("device") or "cpu")


def meta_call(target: Any, args: tuple, kwargs: dict,
              to_meta: Callable[[Value], torch.Tensor | None] | None = None,
              size_value: Callable[[Any], int] | None = None) -> tuple[Any, list[torch.Tensor]]:
    """Run the torch callable on meta-device stand-ins of its arguments.

    Returns its (meta) result and the meta tensors given for the tensor arguments, in
    tree_leaves order, so callers can see which results are (or share memory with) which
    argument: eager's aliasing.  `to_meta` may supply a tensor's stand-in (else its meta's).
    ``size_value`` gives symbolic sizes among the arguments (reshape(B, T, C)) as the numbers
    the stand-ins were made with (``hint_of``, or ``concrete_int``), so that the run does not
    specialise them."""
    given: list[torch.Tensor] = []

    def to_meta_tensor(value: Any) -> Any:
        if is_tensor(value):
            tensor = to_meta(value) if to_meta is not None else None
            tensor = value.meta.to_meta_tensor() if tensor is None else tensor
            given.append(tensor)
            return tensor
        if isinstance(value, Value):
            return (value.pytype or float)(1)
        if size_value is not None and is_symbolic(value):
            return size_value(value)
        return value

    meta_args, meta_kwargs = tree_map(to_meta_tensor, args), tree_map(to_meta_tensor, kwargs)
    try:
        with torch.no_grad():
            out = target(*meta_args, **meta_kwargs)
    except Exception as error:
        raise CompileError(f"cannot infer the output shape of {target_name(target)}: {error}",
                           stage="prims", op=target_name(target), source_line=current().source_line or "",
                           hint="the op has no meta-device kernel; it needs a decomposition") from error
    return _as_device_kernels_return(target, args, kwargs, out), given


_BATCH_NORM_STATS = ("native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_no_training")


def _as_device_kernels_return(target: Any, args: tuple, kwargs: dict, out: Any) -> Any:
    """Where a meta kernel's shapes differ from the device kernel's: outside training, the CPU
    batch norm kernels return empty saved statistics, their meta kernels (C,) ones."""
    name = target_name(target)
    if name.split(".")[0] not in _BATCH_NORM_STATS or name.endswith("no_stats") or not args or \
            not is_tensor(args[0]) or args[0].meta.device.type != "cpu":
        return out
    training = False if name.startswith("_native_batch_norm_legit_no_training") else \
        kwargs.get("training", args[5] if len(args) > 5 else True)
    if training:
        return out
    empty = [o.new_empty((0,)) for o in out[1:3]]
    return (out[0], *empty, *out[3:])


def concrete_numbers(sizes: Any) -> dict[Any, int]:
    """Distinct numbers (>= 7, so no size is 0 or 1) for the size symbols in ``sizes``: enough to
    ask eager whether an op returns its input, a view of it, or a copy."""
    symbols = sorted({s for v in sizes if is_symbolic(v) for s in _sympy(v).free_symbols}, key=str)
    return {s: 7 + 4 * k for k, s in enumerate(symbols)}


def concrete_int(size: Any, numbers: dict[Any, int]) -> int:
    return size if isinstance(size, int) else int(_sympy(size).subs(numbers))


def _sympy(size: Any) -> Any:
    return getattr(size, "expr", size)      # a SymInt's expression, or one already


def concrete_meta_tensor(meta: TensorMeta, numbers: dict[Any, int] | None = None) -> torch.Tensor:
    """A meta-device stand-in with symbolic sizes replaced by ``numbers`` (by default
    ``concrete_numbers`` of its own sizes)."""
    values = [*meta.shape, *meta.stride, meta.storage_offset]
    if not any(is_symbolic(v) for v in values):
        return meta.to_meta_tensor()
    numbers = concrete_numbers(values) if numbers is None else numbers
    as_int = lambda v: concrete_int(v, numbers)  # noqa: E731
    return torch.empty(0, dtype=meta.dtype, device="meta").as_strided(
        [as_int(v) for v in meta.shape], [as_int(v) for v in meta.stride], as_int(meta.storage_offset))


def metas_of(out: Any, device: torch.device) -> Any:
    """TensorMetas (on `device`) of a meta-device result."""
    return _metas_of(out, device)


def _metas_of(out: Any, device: torch.device) -> Any:
    if isinstance(out, torch.Tensor):
        meta = TensorMeta.of(out)
        # an Extern's output is a fresh tensor in the wrapper: contiguous unless eager says otherwise
        return dataclasses.replace(meta, device=device, requires_grad=False)
    if isinstance(out, (tuple, list)):
        return tuple(_metas_of(o, device) for o in out)
    return None


class _NotConstant(Exception):
    pass


def constant_tensor(value: Value, max_elements: int = 1 << 24) -> torch.Tensor | None:
    """The value of a tensor computed from constants only (iota, full, comparisons, views), by
    the prims' reference implementations on the CPU; None where it depends on an input, an
    Extern or randomness, or where an intermediate has more than ``max_elements`` elements."""
    memo: dict[Node, Any] = {}

    def evaluate(node: Node) -> Any:
        if node in memo:
            return memo[node]
        if node.op != "call" or not isinstance(node.target, Prim) or node.target.kind == "random":
            raise _NotConstant
        metas = node.meta if isinstance(node.meta, tuple) else (node.meta,)
        if any(isinstance(m, TensorMeta) and m.numel() > max_elements for m in metas):
            raise _NotConstant
        load = lambda a: evaluate(a) if isinstance(a, Node) else _on_cpu(a)  # noqa: E731
        memo[node] = result = node.target(*tree_map(load, node.args), **tree_map(load, node.kwargs))
        return result
    try:
        result = evaluate(value.node)
    except _NotConstant:
        return None
    return result if isinstance(result, torch.Tensor) else None


def _on_cpu(value: Any) -> Any:
    if isinstance(value, torch.device) and value.type != "cpu":
        return torch.device("cpu")
    return value
