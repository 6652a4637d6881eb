"""to_primitives: torch-level Graph -> prim-level Graph (docs/contracts.md §4).

Walks the torch-level graph once.  Each call is decomposed through the table in
registry.py (decompositions emit prims via `ops`), or becomes an Extern: the torch
callable itself, made functional, whose meta comes from the meta device.
Functionalization (functionalize.py) tracks views and in-place updates on the way.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch

from ember.errors import CompileError
from ember.graph import Graph, Node, TensorMeta, is_dense, target_name, tree_map
from ember.prims import functionalize as F
from ember.prims import ops
from ember.prims.primitives import Prim
from ember.prims.registry import lookup
from ember.prims.values import Emitter, Value, building, emit, is_tensor


def to_primitives(graph: Graph) -> Graph:
    """A new graph computing the same outputs with Prims and functional Externs only."""
    from ember.prims import decompositions  # noqa: F401  (fills the table)
    return _Converter(graph).run()


class _Converter:
    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.new = Graph()
        self.emitter = Emitter(self.new, mutate_hook=self._mutate)
        self.env: dict[Node, Any] = {}
        self.roots: list[F.Root] = []  # placeholder roots, by placeholder index

    # ----------------------------------------------------------------- driving
    def run(self) -> Graph:
        with building(self.emitter):
            for node in self.graph.nodes:
                if node.op == "placeholder":
                    self._placeholder(node)
                elif node.op == "call":
                    self.emitter.source_line = node.source_line
                    self.env[node] = self._call(node)
                elif node.op == "output":
                    self._output(node)
        self.new.extra.update({k: v for k, v in self.graph.extra.items() if k not in self.new.extra})
        # write-backs re-derive views that may end up unused
        self.new.eliminate_dead_code(lambda node: False)
        return self.new

    def _placeholder(self, node: Node) -> None:
        placeholder = self.new.placeholder(node.name, node.meta)
        placeholder.extra = dict(node.extra)
        index = len(self.roots)
        if isinstance(node.meta, TensorMeta):
            alias = F.new_root(Value(placeholder, node.meta), placeholder_index=index)
            self.roots.append(alias.root)
            self.env[node] = alias
        else:  # a runtime Python scalar
            example = node.extra.get("example_value", node.extra.get("example", 1.0))
            self.roots.append(None)
            self.env[node] = Value(placeholder, None, pytype=type(example))

    def _resolve(self, value: Any) -> Any:
        """torch-level nodes -> current Values (Aliases re-derived after mutations)."""
        def load(v: Any) -> Any:
            if isinstance(v, Node):
                v = self.env[v]
            return tree_map(lambda a: F.resolve(a) if isinstance(a, F.Alias) else a, v)
        return tree_map(load, value)

    def _call(self, node: Node) -> Any:
        args, kwargs = self._resolve(node.args), self._resolve(node.kwargs)
        if "input" in kwargs and node.target is not torch.Tensor.index_put:  # F.relu(input=x)
            args = (kwargs.pop("input"),) + tuple(args)
        decomposition = lookup(node.target)
        if decomposition is None:
            return self._extern(node, args, kwargs)
        self.emitter.log = []
        result = decomposition.fn(*args, **kwargs)
        if not decomposition.view:
            self._take_eager_layout(node, result)
        if decomposition.mutates_self(args, kwargs) and is_tensor(args[0]):
            F.write(args[0].alias, result)
            return args[0].alias
        if decomposition.view and is_tensor(args[0]):
            return self._wrap_views(args[0], result)
        return self._wrap(result)

    def _take_eager_layout(self, node: Node, result: Any) -> None:
        """A decomposed op's fresh result gets the strides eager gives it (node.meta, from the
        capture's meta-tensor run) when those are dense: lower/ allocates its buffer that way, so
        Externs (convolution) and graph outputs see eager's memory format (e.g. the NHWC tensor
        that eager's layer_norm-on-a-permuted-view produces)."""
        meta = node.meta
        if not (isinstance(result, Value) and result.is_tensor and isinstance(meta, TensorMeta)):
            return
        target = result.node.target
        if result.node not in self.emitter.log or not isinstance(target, Prim) or \
                target.kind not in ("elementwise", "reduction"):
            return
        current = result.meta
        if tuple(meta.stride) == tuple(current.stride) or tuple(meta.shape) != tuple(current.shape) or \
                meta.dtype != current.dtype or not _dense(meta):
            return
        new_meta = dataclasses.replace(current, stride=tuple(meta.stride))
        result.meta = new_meta
        result.node.meta = new_meta

    def _wrap(self, result: Any) -> Any:
        """Results of a non-view op: each tensor is a new buffer (root)."""
        if isinstance(result, Value) and result.is_tensor:
            return F.new_root(result)
        if isinstance(result, (tuple, list)):
            return type(result)(self._wrap(r) for r in result)
        return result

    def _wrap_views(self, base: Value, result: Any) -> Any:
        if isinstance(result, (tuple, list)):
            return type(result)(self._wrap_views(base, r) for r in result)
        if not is_tensor(result):
            return result
        steps = F.view_chain(base.node, result.node, set(self.emitter.log))
        if steps is None:
            return F.new_root(result)
        return base.alias.extended(steps, result)

    def _mutate(self, target: Value, new_value: Value, base: Value | None = None) -> None:
        if base is not None and target.node is not base.node:
            steps = F.view_chain(base.node, target.node, set(self.emitter.log))
            if steps is None:
                raise CompileError("in-place update of a value that is not a view", stage="prims")
            alias = base.alias.extended(steps, target)
        else:
            alias = target.alias
        F.write(alias, new_value)

    # ----------------------------------------------------------------- externs
    def _extern(self, node: Node, args: tuple, kwargs: dict) -> Any:
        """No decomposition: call the torch op eagerly, made functional."""
        target = node.target
        name = target_name(target)
        functional = _functional_variant(target)
        if functional is not None:
            result = emit(functional, *args, **kwargs)
            F.write(args[0].alias, result)
            return args[0].alias
        if name.endswith("_") and not name.endswith("__") and args and is_tensor(args[0]):
            result = emit(_CloneThenApply(target), *args, **kwargs)
            F.write(args[0].alias, result)
            return args[0].alias
        return self._wrap(emit(target, *args, **kwargs))

    # ----------------------------------------------------------------- outputs
    def _output(self, node: Node) -> None:
        outputs: list[Any] = []
        aliases: dict[int, int] = {}
        used: set[Node] = set()
        for index, item in enumerate(node.args[0]):
            if isinstance(item, Node):
                item = self.env[item]
            if isinstance(item, F.Alias):
                if item.root.placeholder_index is not None:
                    aliases[index] = item.root.placeholder_index
                    value = F.replay_on_original(item)
                else:
                    value = F.resolve(item)
                    if F.is_view_of_placeholder(value.node) or value.node in used:
                        value = ops.clone(value)  # eager returns a fresh tensor here
                used.add(value.node)
                outputs.append(value.node)
            elif isinstance(item, Value):
                outputs.append(item.node)
            else:
                outputs.append(item)
        mutated: list[tuple[int, int]] = []
        for placeholder_index, root in enumerate(self.roots):
            if root is not None and root.version > 0 and root.current.node is not root.original.node:
                mutated.append((placeholder_index, len(outputs)))
                outputs.append(root.current.node)
        self.new.output(outputs)
        self.new.extra["num_user_outputs"] = len(node.args[0])
        self.new.extra["mutated_inputs"] = mutated
        self.new.extra["output_aliases"] = aliases


def _dense(meta: TensorMeta) -> bool:
    """Non-overlapping and dense (a permutation of a contiguous layout), with int sizes."""
    sizes, strides = tuple(meta.shape), tuple(meta.stride)
    return all(isinstance(v, int) for v in sizes + strides) and is_dense(sizes, strides)


def _functional_variant(target: Any) -> Any:
    """torch.Tensor.foo_ -> torch.Tensor.foo when both exist (for Externs)."""
    name = getattr(target, "__name__", "")
    if name.endswith("_") and not name.endswith("__") and getattr(torch.Tensor, name, None) is target:
        return getattr(torch.Tensor, name[:-1], None)
    return None


class _CloneThenApply:
    """An in-place torch op made functional for the wrapper: apply it to a copy."""

    def __init__(self, inplace_op: Any) -> None:
        self.inplace_op = inplace_op
        self.__name__ = f"functional_{target_name(inplace_op)}"

    def __call__(self, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return self.inplace_op(x.clone(), *args, **kwargs)
