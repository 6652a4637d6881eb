"""prims: decompose torch-level graphs to primitives (docs/contracts.md §4).

    prim_graph = ember.prims.to_primitives(torch_graph)
"""
from ember.prims.convert import to_primitives
from ember.prims.primitives import REGISTRY, Prim, is_prim

__all__ = ["REGISTRY", "Prim", "is_prim", "to_primitives"]
