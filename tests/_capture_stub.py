"""TEMPORARY STUB of ``ember.capture`` for the API tests -- delete once ember/capture/ lands.

conftest.py installs it only while ``ember.capture.compile_function`` does not exist.
It is NOT the design (capture is a bytecode interpreter): it records the torch calls
of one real run with a TorchFunctionMode, on every call, so it is trivially sound
(it never reuses a stale trace) and never graph-breaks.  A backend compiles each
distinct graph once; replaying the compiled graph produces the returned values and
the side effects (the traced run works on clones and restored state).
"""
from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree

from ember.graph import Graph, TensorMeta


@dataclasses.dataclass
class CaptureEvent:
    graph: Graph | None
    compiled: Any
    guards: list[str]
    break_reason: str | None = None
    break_location: str | None = None
    recompile_reason: str | None = None


# Tensor dunders recorded as the operator functions the contract names
_DUNDERS: dict[Any, tuple[Callable, bool]] = {}
for _name in ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "matmul", "and", "or", "xor"):
    _op = getattr(operator, _name + "_" if _name in ("and", "or") else _name)
    _DUNDERS[getattr(torch.Tensor, f"__{_name}__")] = (_op, False)
    if hasattr(torch.Tensor, f"__r{_name}__"):
        _DUNDERS[getattr(torch.Tensor, f"__r{_name}__")] = (_op, True)
for _name in ("neg", "getitem", "setitem", "lt", "le", "gt", "ge", "eq", "ne", "invert", "iadd", "isub", "imul"):
    _DUNDERS[getattr(torch.Tensor, f"__{_name}__")] = (getattr(operator, _name), False)


class _Recorder(TorchFunctionMode):
    def __init__(self, graph: Graph, node_of: dict[int, Any], inputs: list[Any]) -> None:
        super().__init__()
        self.graph, self.node_of, self.inputs = graph, node_of, inputs
        self.keep_alive: list[Any] = []  # so that ids of traced tensors are never reused

    def to_arg(self, value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            if id(value) not in self.node_of:  # a tensor from outside the trace: a new input
                self.node_of[id(value)] = self.graph.placeholder(f"input{len(self.inputs)}", TensorMeta.of(value))
                self.inputs.append(value)
                self.keep_alive.append(value)
            return self.node_of[id(value)]
        if isinstance(value, (tuple, list)):
            return type(value)(self.to_arg(v) for v in value)
        if isinstance(value, dict):
            return {k: self.to_arg(v) for k, v in value.items()}
        return value

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        tensors_out = [r for r in pytree.tree_leaves(result) if isinstance(r, torch.Tensor)]
        if not tensors_out:
            return result  # shapes, dtypes, Python scalars: constants of this trace
        target, swap = _DUNDERS.get(func, (func, False))
        call_args = self.to_arg(tuple(reversed(args)) if swap else tuple(args))
        meta = (TensorMeta.of(result) if isinstance(result, torch.Tensor)
                else tuple(TensorMeta.of(r) for r in tensors_out))
        node = self.graph.call(target, call_args, self.to_arg(kwargs), meta=meta)
        self.keep_alive.append(result)
        if isinstance(result, torch.Tensor):
            self.node_of[id(result)] = node  # in-place ops return self: later reads see the new node
        else:
            for index, item in enumerate(result):
                if isinstance(item, torch.Tensor):
                    self.node_of[id(item)] = self.graph.call(operator.getitem, (node, index),
                                                             meta=TensorMeta.of(item))
        return result


def _module_of(fn: Any) -> nn.Module | None:
    if isinstance(fn, nn.Module):
        return fn
    owner = getattr(fn, "__self__", None)
    return owner if isinstance(owner, nn.Module) else None


class CapturedFunction:
    def __init__(self, fn: Any, backend: Callable, fullgraph: bool = False) -> None:
        self.fn, self.backend, self.fullgraph = fn, backend, fullgraph
        self.events: list[CaptureEvent] = []
        self._compiled: dict[str, Any] = {}

    def reset(self) -> None:
        self.events.clear()
        self._compiled.clear()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        graph, inputs, out_spec, out_leaves = self._trace(args, kwargs)
        source = str(graph) + repr([TensorMeta.of(t) if isinstance(t, torch.Tensor) else t for t in inputs])
        if source not in self._compiled:
            compiled = self.backend(graph, list(inputs))
            reason = "new trace" if self._compiled else None
            self._compiled[source] = compiled
            self.events.append(CaptureEvent(graph, compiled, ["<stub: retraces every call>"],
                                            recompile_reason=reason))
        outputs = iter(self._compiled[source](*inputs))
        leaves = [next(outputs) if kind == "tensor" else value for kind, value in out_leaves]
        return pytree.tree_unflatten(leaves, out_spec)

    def _trace(self, args: tuple, kwargs: dict) -> tuple[Graph, list[Any], Any, list[tuple[str, Any]]]:
        graph = Graph()
        node_of: dict[int, Any] = {}
        inputs: list[Any] = []
        # arguments become placeholders first; the trace runs on clones so the user's stay untouched
        flat, spec = pytree.tree_flatten((args, kwargs))
        traced_flat = []
        for value in flat:
            if isinstance(value, torch.Tensor):
                clone = value.detach().clone().requires_grad_(value.requires_grad)
                node_of[id(clone)] = graph.placeholder(f"arg{len(inputs)}", TensorMeta.of(value))
                inputs.append(value)
                traced_flat.append(clone)
            else:
                traced_flat.append(value)
        traced_args, traced_kwargs = pytree.tree_unflatten(traced_flat, spec)
        module = _module_of(self.fn)
        saved = {}
        if module is not None:  # restore buffers (BatchNorm stats) after the trace; the replay updates them
            saved = {name: t.detach().clone() for name, t in module.state_dict(keep_vars=True).items()}
        recorder = _Recorder(graph, node_of, inputs)
        try:
            with torch.no_grad(), recorder:
                result = self.fn(*traced_args, **traced_kwargs)
        finally:
            if module is not None:
                with torch.no_grad():
                    for name, tensor in module.state_dict(keep_vars=True).items():
                        tensor.copy_(saved[name])
        out_flat, out_spec = pytree.tree_flatten(result)
        outputs, out_leaves = [], []
        for value in out_flat:
            if isinstance(value, torch.Tensor):
                outputs.append(recorder.to_arg(value))
                out_leaves.append(("tensor", None))
            else:
                out_leaves.append(("constant", value))
        graph.output(outputs)
        return graph, inputs, out_spec, out_leaves


def compile_function(fn: Any, *, backend: Callable, fullgraph: bool = False,
                     cache_size_limit: int | None = None) -> CapturedFunction:
    return CapturedFunction(fn, backend, fullgraph)


def reset() -> None:
    pass
