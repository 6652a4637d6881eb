"""Build prim-level graphs by hand (tests, benchmarks, and the code generators' own tests).

    b = PrimGraphBuilder()
    x = b.input("x", torch.randn(4, 8))
    y = b.exp(b.sub(x, b.broadcast(b.amax(x, (1,)), (4, 8), keep=(0,))))
    graph = b.build([y])

Every call records ``Graph.call(prim, args, meta=prim.infer_meta(...))``.
"""
from __future__ import annotations

from typing import Any

import torch

from ember.graph import Graph, Node, TensorMeta, tree_map
from ember.prims import primitives as P


class PrimGraphBuilder:
    def __init__(self) -> None:
        self.graph = Graph()

    def input(self, name: str, example: Any) -> Node:
        meta = TensorMeta.of(example) if isinstance(example, torch.Tensor) else None
        return self.graph.placeholder(name, meta)

    def call(self, prim: Any, *args: Any, **kwargs: Any) -> Node:
        if isinstance(prim, str):
            prim = P.get(prim)
        as_meta = lambda v: v.meta if isinstance(v, Node) else v
        meta = prim.infer_meta(*tree_map(as_meta, args), **tree_map(as_meta, kwargs))
        return self.graph.call(prim, args, kwargs, meta=meta)

    def __getattr__(self, name: str):
        if name.startswith("_") or name not in P.REGISTRY:
            raise AttributeError(name)
        return lambda *args, **kwargs: self.call(name, *args, **kwargs)

    def getitem(self, node: Node, item: int) -> Node:
        import operator
        return self.graph.call(operator.getitem, (node, item), meta=node.meta[item])

    def broadcast(self, x: Node, shape: tuple[int, ...], keep: tuple[int, ...]) -> Node:
        """Reshape x (whose dims are the ``keep`` dims of shape) to rank len(shape), then expand."""
        view_shape = tuple(s if d in keep else 1 for d, s in enumerate(shape))
        return self.call("expand", self.call("reshape", x, view_shape), tuple(shape))

    def cast(self, x: Node, dtype: torch.dtype) -> Node:
        return self.call("convert_element_type", x, dtype)

    def build(self, outputs: list[Any]) -> Graph:
        self.graph.output(outputs)
        return self.graph
