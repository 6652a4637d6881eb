"""OpInfo samples as one-op torch-level graphs (shared by tests/prims and the compiler tests).

    for op in decomposed_opinfos():
        for sample in op.sample_inputs("cpu", torch.float32):
            graph, inputs = single_op_graph(op.op, sample)
            expected = graph.run(*inputs)
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ember.graph import Graph, TensorMeta, tree_map


def opinfo_db() -> list[Any]:
    from torch.testing._internal.common_methods_invocations import op_db
    return list(op_db)


def decomposed_opinfos(variants: bool = False) -> list[tuple[Any, Callable]]:
    """(OpInfo, callable) for each OpInfo whose op (or, with variants=True, method/in-place variant)
    has an entry in ember's decomposition table."""
    from ember.prims import decompositions  # noqa: F401  (fills the table)
    from ember.prims.registry import lookup
    found = []
    for info in opinfo_db():
        candidates = [info.op] + ([info.method_variant, info.inplace_variant] if variants else [])
        for fn in candidates:
            if fn is not None and lookup(fn) is not None:
                found.append((info, fn))
                break
    return found


def single_op_graph(op: Callable, sample: Any) -> tuple[Graph, list[Any]]:
    """A graph calling `op(sample.input, *sample.args, **sample.kwargs)` once.

    Every tensor (also inside lists, e.g. torch.cat's input) becomes a placeholder, in the
    order met; everything else is a constant.  Returns the graph and its input tensors."""
    g = Graph()
    inputs: list[Any] = []

    def lift(value: Any) -> Any:
        if isinstance(value, torch.Tensor):
            inputs.append(value)
            return g.placeholder(f"t{len(inputs) - 1}", TensorMeta.of(value))
        return value

    args = tree_map(lift, (sample.input,) + tuple(sample.args))
    kwargs = tree_map(lift, dict(sample.kwargs))
    out = g.call(op, args, kwargs)
    # graph outputs are a flat tuple of tensors: split tuple results (max(dim), split ...)
    result = _run_on_copies(op, sample)
    if isinstance(result, (tuple, list)):
        import operator
        g.output(tuple(g.call(operator.getitem, (out, i)) for i in range(len(result))))
    else:
        g.output((out,))
    return g, inputs


def _run_on_copies(op: Callable, sample: Any) -> Any:
    copy = lambda v: v.clone() if isinstance(v, torch.Tensor) else v
    return op(copy(sample.input), *tree_map(copy, tuple(sample.args)), **tree_map(copy, dict(sample.kwargs)))


def flatten_outputs(values: Any) -> list[Any]:
    """Tensors of a (possibly nested) op result, in order (torch.return_types included)."""
    if isinstance(values, torch.Tensor):
        return [values]
    if isinstance(values, (tuple, list)):
        return [t for v in values for t in flatten_outputs(v)]
    return [values]
