"""Helpers for prims tests: build a torch-level graph, lower it to prims, run both, compare."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from ember.graph import Graph, Node, TensorMeta, tree_map
from ember.prims import to_primitives
from ember.prims.functionalize import VIEW_PRIMS


def graph_of(fn: Callable[..., Any], *example_inputs: Any) -> Graph:
    """A torch-level graph from a function that builds it: fn(graph, *placeholders) -> outputs."""
    g = Graph()
    placeholders = [g.placeholder(f"arg{i}", TensorMeta.of(x) if isinstance(x, torch.Tensor) else None)
                    for i, x in enumerate(example_inputs)]
    outputs = fn(g, *placeholders)
    g.output(outputs if isinstance(outputs, (tuple, list)) else (outputs,))
    return g


def run_with_contract(prim_graph: Graph, inputs: Sequence[Any]) -> list[Any]:
    """Run a prim graph as the wrapper would (docs/contracts.md §4): mutates `inputs`."""
    outputs = list(prim_graph.run(*inputs))
    for placeholder_index, output_index in prim_graph.extra["mutated_inputs"]:
        inputs[placeholder_index].copy_(outputs[output_index])
    user = outputs[:prim_graph.extra["num_user_outputs"]]
    for output_index, source in sorted(prim_graph.extra.get("output_sources", {}).items()):
        if source[0] == "input":
            user[output_index] = inputs[source[1]]
        elif source[0] == "input_view":
            _, position, shape, stride, offset = source
            user[output_index] = inputs[position].as_strided(shape, stride, offset)
        elif source[0] == "output":
            user[output_index] = user[source[1]]
        else:
            _, base, shape, stride, offset = source
            user[output_index] = outputs[base].as_strided(shape, stride, outputs[base].storage_offset() + offset)
    return user


def clone_inputs(inputs: Sequence[Any]) -> list[Any]:
    return [x.clone() if isinstance(x, torch.Tensor) else x for x in inputs]


def assert_close(actual: Any, expected: Any, **tolerances: Any) -> None:
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"expected a tensor, got {type(actual)}"
        torch.testing.assert_close(actual, expected, equal_nan=True, **tolerances)
    elif isinstance(expected, (tuple, list)):
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            assert_close(a, e, **tolerances)
    else:
        assert actual == expected or (actual != actual and expected != expected), (actual, expected)


def check_metas(prim_graph: Graph, inputs: Sequence[Any]) -> None:
    """Every node's meta agrees with the tensor its reference produces (strides for views)."""
    env: dict[Node, Any] = {}
    load = lambda v: env[v] if isinstance(v, Node) else v
    for node, value in zip(prim_graph.placeholders, inputs):
        env[node] = value
    for node in prim_graph.call_nodes():
        value = node.target(*tree_map(load, node.args), **tree_map(load, node.kwargs))
        env[node] = value
        if isinstance(node.meta, TensorMeta):
            assert isinstance(value, torch.Tensor), f"{node.name}: meta says tensor, got {type(value)}"
            assert tuple(value.shape) == tuple(node.meta.shape), f"{node.name}: {value.shape} vs {node.meta}"
            assert value.dtype == node.meta.dtype, f"{node.name}: {value.dtype} vs {node.meta.dtype}"
            if node.target in VIEW_PRIMS:
                source = env[node.args[0]]
                if tuple(source.stride()) == tuple(node.args[0].meta.stride) and \
                        source.storage_offset() == node.args[0].meta.storage_offset and value.numel() > 1:
                    assert tuple(value.stride()) == tuple(node.meta.stride), \
                        f"{node.name}: strides {value.stride()} vs {node.meta.stride}"
                    assert value.storage_offset() == node.meta.storage_offset, node.name


def check(fn: Callable[..., Any], *inputs: Any, **tolerances: Any) -> Graph:
    """Differential test: eager graph vs prim graph (outputs, mutated inputs, metas)."""
    g = graph_of(fn, *inputs)
    prim_graph = to_primitives(g)
    for node in prim_graph.call_nodes():
        assert not getattr(node.target, "__name__", "").endswith("_") or node.target.__name__.startswith("_"), \
            f"in-place target left in prim graph: {node.target}"
    eager_inputs, prim_inputs = clone_inputs(inputs), clone_inputs(inputs)
    expected = list(g.run(*eager_inputs))
    actual = run_with_contract(prim_graph, prim_inputs)
    assert_close(actual, expected, **tolerances)
    assert_close(prim_inputs, eager_inputs, **tolerances)
    check_metas(prim_graph, clone_inputs(inputs))
    return prim_graph
