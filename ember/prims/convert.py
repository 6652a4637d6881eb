"""to_primitives: torch-level Graph -> prim-level Graph (docs/contracts.md §4).

Walks the torch-level graph once.  Each call is decomposed through the table in
registry.py (decompositions emit prims via `ops`), or becomes an Extern: the torch
callable itself, made functional, whose meta comes from the meta device.
Functionalization (functionalize.py) tracks views and in-place updates on the way.
"""
from __future__ import annotations

import dataclasses
import inspect
import operator
import re
from typing import Any

import torch

from ember.errors import CompileError
from ember.graph import (Graph, Node, TensorMeta, dense_strides_like, is_dense, size_check, size_is, sym_size,
                         target_name, tree_leaves, tree_map)
from ember.symbolic import SymInt, hint_of, is_symbolic
from ember.prims import functionalize as F
from ember.prims import ops
from ember.prims.extern_shapes import hint_meta_tensor, symbolic_output_meta
from ember.prims import primitives
from ember.prims.primitives import Prim
from ember.prims.registry import decomposing_differentiated, lookup
from ember.prims.values import (Emitter, Value, _meta_of, building, concrete_int, concrete_meta_tensor, concrete_numbers,
                                emit, emit_with_meta, is_tensor, meta_call, metas_of)


P_detach = primitives.detach


COMPARE = {"<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge, "==": operator.eq,
           "!=": operator.ne}
SIZE_ARITHMETIC = {operator.add, operator.sub, operator.mul, operator.floordiv, operator.mod, operator.iadd,
                   operator.isub, operator.imul, operator.ifloordiv, operator.imod}


def _metas(meta: Any) -> tuple:
    return meta if isinstance(meta, tuple) else (meta,)


def _mutates_first_argument(node: Node) -> bool:
    """An in-place op on its first argument (``x.add_(1)``, ``x[i] = v``, ``F.relu(x, inplace=True)``)."""
    name = target_name(node.target)
    return bool(node.args) and isinstance(node.args[0], Node) and (
        (name.endswith("_") and not name.endswith("__")) or name in ("setitem", "__setitem__") or
        node.target in _SETITEM or bool(node.kwargs.get("inplace")) or name.startswith("__i"))


def to_primitives(graph: Graph, input_metas: list | None = None) -> Graph:
    """A new graph computing the same outputs with Prims and functional Externs only.
    ``input_metas`` replace the placeholders' metas (symbolic sizes: dynamic shapes)."""
    from ember.prims import decompositions  # noqa: F401  (fills the table)
    return _Converter(graph, input_metas).run()


class _Converter:
    def __init__(self, graph: Graph, input_metas: list | None = None) -> None:
        self.graph = graph
        self.input_metas = input_metas
        self.new = Graph()
        self.emitter = Emitter(self.new, mutate_hook=self._mutate)
        self.env: dict[Node, Any] = {}
        self.roots: list[F.Root] = []  # placeholder roots, by placeholder index
        self.output_nodes: set[Node] = set()  # nodes already returned as some root's buffer
        self.grad_enabled = torch.is_grad_enabled()  # the grad mode at entry (guarded by capture)
        self.entry_grad_enabled = self.grad_enabled

    # ----------------------------------------------------------------- driving
    def run(self) -> Graph:
        with building(self.emitter):
            for node in self.graph.nodes:
                if node.op == "placeholder":
                    self._placeholder(node)
                elif node.op == "call":
                    self.emitter.source_line = node.source_line
                    self.env[node] = self._gradient_boundary(node, self._call(node))
                elif node.op == "output":
                    self._output(node)
        self.new.extra.update({k: v for k, v in self.graph.extra.items() if k not in self.new.extra})
        # the wrapper runs this when inputs alias in a way the prim graph cannot reproduce
        self.new.extra["_torch_graph"] = self.graph
        # write-backs re-derive views that may end up unused
        self.new.eliminate_dead_code(lambda node: False)
        return self.new

    def _placeholder(self, node: Node) -> None:
        index = len(self.roots)
        meta = node.meta
        if self.input_metas is not None and isinstance(self.input_metas[index], TensorMeta):
            meta = self.input_metas[index]
        placeholder = self.new.placeholder(node.name, meta)
        placeholder.extra = dict(node.extra)
        if isinstance(meta, TensorMeta):
            alias = F.new_root(Value(placeholder, meta), placeholder_index=index)
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
        if node.target is sym_size:     # dynamic shapes: a size as a value (an int or a SymInt)
            tensor, dim = self._resolve(node.args)
            return tensor.shape[dim]
        if node.target is size_check:   # the captured code compared sizes: a guard on the relation
            left, op, right, expected = self._resolve(node.args)
            if COMPARE[op](left, right) != expected:
                raise CompileError(f"sizes {left} {op} {right} is not {expected} as capture saw", stage="prims")
            return None
        if node.target in SIZE_ARITHMETIC and node.meta is None:   # arithmetic on sizes
            args = self._resolve(node.args)
            if all(isinstance(a, (int, SymInt)) and not isinstance(a, bool) for a in args):
                return node.target(*args)
        if node.target is size_is:      # a size the captured Python code used as a plain int
            tensor, dim, size = self._resolve(node.args)
            actual = tensor.shape[dim]
            if is_symbolic(actual):
                actual.env.decide(actual, "==", size, f"{node.source_line or 'capture'}: used as a Python int")
            elif actual != size:
                raise CompileError(f"size {actual} of {node.args[0].name} dim {dim} is not the {size} capture saw",
                                   stage="prims")
            return None
        if node.target is operator.getitem and isinstance(node.args[0], Node):
            container = self.env[node.args[0]]
            if isinstance(container, (tuple, list)) and isinstance(node.args[1], (int, slice)):
                # an element of split/chunk/unbind/max(dim): the very object, alias and all
                return container[node.args[1]]
        args, kwargs = self._resolve(node.args), self._resolve(node.kwargs)
        if "input" in kwargs and node.target is not torch.Tensor.index_put:  # F.relu(input=x)
            args = (kwargs.pop("input"),) + tuple(args)
        decomposition = lookup(node.target)
        if decomposition is None:
            return self._extern(node, args, kwargs)
        mutates = decomposition.mutates_self(args, kwargs) and is_tensor(args[0])
        if mutates and is_tensor(args[0]):
            _check_partial_overlap(args[0], args[1:], kwargs)
        elif node.target in _SETITEM and len(args) == 3 and is_tensor(args[0]) and is_tensor(args[2]):
            _check_setitem_overlap(args[0], args[1], args[2])
        self.emitter.log = []
        with decomposing_differentiated(self._differentiated(node)):
            result = decomposition.fn(*args, **kwargs)
        if not decomposition.view:
            self._take_eager_layout(node, result)
        if mutates:
            _check_inplace_result(args[0], result)
            F.write(args[0].alias, result)
            return args[0].alias
        view_of = args[0] if decomposition.view and is_tensor(args[0]) else None
        return self._wrap_result(node.target, args, kwargs, result, view_of)

    def _gradient_boundary(self, node: Node, result: Any) -> Any:
        """Keep eager's autograd boundaries in the prim graph, which autodiff reads.

        A float result that does not require grad although an input does (``x.detach()``, an op
        under ``no_grad``) becomes a ``prims.detach`` view: no gradient flows through it.  What
        autodiff cannot reproduce (a tensor that starts requiring grad inside the graph, an
        in-place update under no_grad of a tensor that requires grad) is recorded in
        ``graph.extra["grad_unsafe"]``: such a graph then runs eagerly when gradients are needed."""
        if node.target is torch._C._set_grad_enabled:
            self.grad_enabled = bool(node.args[0])
            return result
        if not self.entry_grad_enabled:
            return result           # nothing is differentiated (enable_grad regions run eagerly)
        outputs = [m for m in _metas(node.meta) if isinstance(m, TensorMeta)]
        if not outputs:
            return result
        inputs_require = any(m.requires_grad for n in node.inputs() for m in _metas(n.meta)
                             if isinstance(m, TensorMeta))
        outputs_require = any(m.requires_grad for m in outputs)
        mutates = _mutates_first_argument(node)
        if outputs_require and (not inputs_require or (mutates and not self.grad_enabled) or
                                (mutates and not _metas(node.args[0].meta)[0].requires_grad)):
            self.new.extra.setdefault("grad_unsafe", f"{target_name(node.target)} at {node.source_line or '?'} "
                                      "changes which tensors require grad")
        if not inputs_require or outputs_require:
            return result
        return tree_map(lambda r: self._detached(r) if isinstance(r, F.Alias) and r.cached.dtype.is_floating_point
                        else r, result)

    def _differentiated(self, node: Node) -> bool:
        return self.entry_grad_enabled and self.grad_enabled and any(
            m.requires_grad for n in node.inputs() for m in _metas(n.meta) if isinstance(m, TensorMeta))

    def _detached(self, alias: F.Alias) -> F.Alias:
        value = emit(P_detach, F.resolve(alias))
        return alias.extended((F.ViewStep(P_detach, ()),), value)

    def _take_eager_layout(self, node: Node, result: Any) -> None:
        """A decomposed op's fresh result gets the strides eager gives it (node.meta, from the
        capture's meta-tensor run) when those are dense: lower/ allocates its buffer that way, so
        Externs (convolution) and graph outputs see eager's memory format (e.g. the NHWC tensor
        that eager's layer_norm-on-a-permuted-view produces)."""
        meta = node.meta
        if not (isinstance(result, Value) and result.is_tensor and isinstance(meta, TensorMeta)):
            return
        target = result.node.target
        if result.node not in self.emitter.log:
            return
        if target is node.target:       # the decomposition called the op itself (F.pad's reflect mode)
            result.meta = result.node.meta = _in_captured_layout(result.meta, meta)
            return
        if not isinstance(target, Prim) or target.kind not in ("elementwise", "reduction"):
            return
        current = result.meta
        if any(is_symbolic(v) for v in current.shape + current.stride):
            # dynamic shapes: capture's metas hold the hints; eager's dim order, with our sizes
            if tuple(hint_of(v) for v in current.shape) != tuple(meta.shape) or meta.dtype != current.dtype or \
                    not _dense(meta) or tuple(hint_of(v) for v in current.stride) == tuple(meta.stride):
                return
            new_meta = dataclasses.replace(current, stride=dense_strides_like(current.shape, meta.shape, meta.stride))
            result.meta = new_meta
            result.node.meta = new_meta
            return
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

    def _wrap_result(self, target: Any, args: tuple, kwargs: dict, result: Any, view_of: Value | None) -> Any:
        """Aliases for a decomposition's result: views of args[0] (view decompositions), the
        argument itself where eager returns the same object (x.contiguous(), x.to(x.dtype)), or
        new roots."""
        by_node: dict[Node, Value] = {}
        for v in tree_leaves((args, kwargs)):
            # the first argument wins: a no-op view (split(2, 1)[-1] of a size-2 dim) shares its
            # base's node, and x.type_as(that view) is x itself, not the view (fuzz seed 3739)
            if is_tensor(v) and v.alias is not None:
                by_node.setdefault(v.node, v)
        passthrough = [r for r in tree_leaves(result) if is_tensor(r) and r.node in by_node]
        eager_kinds = _eager_alias_kinds(target, args, kwargs, result) if passthrough else {}
        emitted = set(self.emitter.log)

        tensor_args = [v for v in tree_leaves((args, kwargs)) if is_tensor(v)]
        symbolic_args = any(is_symbolic(s) for v in tensor_args for s in v.shape)
        eager_views: list[Any] = []      # eager's result on the arguments' original layouts (lazily)

        def eager_view_meta(position: int, base: Value) -> TensorMeta | None:
            """Eager's strides over base's root storage for result leaf `position`, if that leaf is
            a view of base in eager (else None)."""
            for stand_in in (hint_meta_tensor, TensorMeta.to_meta_tensor):
                # symbolic sizes: first at the hints; a view there is redone with the sizes
                # specialised (guarded), as its strides must be exact
                if len(eager_views) < 1 + (stand_in is TensorMeta.to_meta_tensor):
                    originals = {id(v): stand_in(F.original_meta(v.alias)) for v in tensor_args if v.alias}
                    try:
                        out, given = meta_call(target, args, kwargs, to_meta=lambda v: originals.get(id(v)),
                                               size_value=hint_of if stand_in is hint_meta_tensor else None)
                    except Exception:
                        out, given = None, []
                    eager_views.append((tree_leaves(out), given))
                leaves, given = eager_views[-1]
                leaf = leaves[position] if position < len(leaves) else None
                meta = next((m for v, m in zip(tensor_args, given) if v is base), None)
                if not isinstance(leaf, torch.Tensor) or meta is None or not _shares_storage(leaf, meta):
                    return None
                if stand_in is TensorMeta.to_meta_tensor or not symbolic_args:
                    return dataclasses.replace(TensorMeta.of(leaf), device=base.device, requires_grad=False)
            return None

        positions = {id(r): k for k, r in enumerate(tree_leaves(result))}

        def wrap(r: Any) -> Any:
            if isinstance(r, (tuple, list)):
                return type(r)(wrap(item) for item in r)
            if not is_tensor(r):
                return r
            source = by_node.get(r.node)
            if source is not None:
                kind = eager_kinds.get(id(r), "view" if view_of is not None else "copy")
                if kind == "same":
                    return source.alias
                if kind == "view":
                    return source.alias.extended((), r)
                return F.new_root(r)    # copy semantics: later writes to either stay apart
            if view_of is not None:
                steps = F.view_chain(view_of.node, r.node, emitted, F.original_meta(view_of.alias))
                if steps is not None:
                    return view_of.alias.extended(steps, r)
                meta = eager_view_meta(positions[id(r)], view_of)
                if meta is not None:
                    root = view_of.alias.root
                    step = F.OpaqueView(meta) if meta.dtype != view_of.dtype else \
                        F.StorageView(meta, root.original.meta)
                    return F.Alias(root, (step,), r, root.version)
            elif r.node in emitted and r.node.target in F.VIEW_PRIMS:
                # a view prim chain out of a non-view decomposition (broadcast_tensors, atleast_2d):
                # a view only where eager's result shares the argument's memory
                for base in tensor_args:
                    steps = F.view_chain(base.node, r.node, emitted, F.original_meta(base.alias)) \
                        if base.alias is not None else None
                    if steps is not None and eager_view_meta(positions[id(r)], base) is not None:
                        return base.alias.extended(steps, r)
            return F.new_root(r)
        return wrap(result)

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
        inplace_method = name.endswith("_") and not name.endswith("__") and bool(args) and is_tensor(args[0])
        if inplace_method and name.rsplit(".", 1)[-1] in _METADATA_INPLACE:
            raise F.RunEagerly(f"{name} changes the tensor's shape or strides in place")
        functional = _functional_variant(target)
        if (functional is not None or inplace_method or _binds_inplace(target, args, kwargs)) and \
                args and is_tensor(args[0]):
            _check_partial_overlap(args[0], args[1:], kwargs)
        if functional is not None and is_tensor(args[0]):
            result = emit(functional, *args, **kwargs)
            _check_inplace_result(args[0], result)
            F.write(args[0].alias, result)
            return args[0].alias
        if (inplace_method or _binds_inplace(target, args, kwargs)) and is_tensor(args[0]):
            # Tensor.foo_ without Tensor.foo, or F.foo(x, inplace=True) without a decomposition
            result = emit(_CloneThenApply(target), *args, **kwargs)
            _check_inplace_result(args[0], result)
            F.write(args[0].alias, result)
            return args[0].alias
        if isinstance(target, Prim):      # a prim-level graph (hand-built): prims are functional
            return self._wrap(emit(target, *args, **kwargs))
        symbolic = symbolic_output_meta(target, args, kwargs, _meta_of, _device(args, kwargs))
        if symbolic is not None:      # dynamic shapes: a fresh result, its sizes as expressions
            return self._wrap(emit_with_meta(target, _in_captured_layout(symbolic, node.meta), args, kwargs))
        out, arg_tensors = meta_call(target, args, kwargs)
        views = _shared_storage(out, arg_tensors)
        if not views:
            metas = _in_captured_layout(metas_of(out, _device(args, kwargs)), node.meta)
            return self._wrap(emit_with_meta(target, metas, args, kwargs))
        return self._extern_views(target, args, kwargs, out, views)

    def _extern_views(self, target: Any, args: tuple, kwargs: dict, out: Any,
                      views: dict[int, tuple[int, bool]]) -> Any:
        """An Extern whose results share memory with its arguments in eager (diagonal, unfold,
        as_strided, tensor_split, x.view(dtype)): each such result becomes a view of the argument's
        root through its strides over the root's storage, so writes reach the root and reads see
        the root's later updates."""
        tensor_args = [v for v in tree_leaves((args, kwargs)) if is_tensor(v)]
        # the views' strides over the roots' original storage (eager's), not the current layout
        original = {id(v): F.original_meta(v.alias).to_meta_tensor() for v in tensor_args if v.alias is not None}
        out_on_original, _ = meta_call(target, args, kwargs,
                                       to_meta=lambda v: original.get(id(v)) if id(v) in original else None)
        leaves, original_leaves = tree_leaves(out), tree_leaves(out_on_original)
        needs_extern = any(isinstance(o, torch.Tensor) and (id(o) not in views or o.dtype != self._arg_dtype(
            tensor_args, views[id(o)])) for o in leaves)
        emitted = emit_with_meta(target, metas_of(out, _device(args, kwargs)), args, kwargs) if needs_extern else None
        emitted_leaves = tree_leaves(emitted) if emitted is not None else [None] * len(leaves)
        wrapped = []
        for leaf, on_original, value in zip(leaves, original_leaves, emitted_leaves):
            if not isinstance(leaf, torch.Tensor):
                wrapped.append(leaf)
                continue
            if id(leaf) not in views:
                wrapped.append(F.new_root(value))
                continue
            position, same = views[id(leaf)]
            base = tensor_args[position]
            if same:
                wrapped.append(base.alias)
                continue
            if base.alias is None:
                raise F.RunEagerly(f"{target_name(target)} returns a view this compiler does not model")
            view_meta = dataclasses.replace(TensorMeta.of(on_original), device=base.device, requires_grad=False)
            if leaf.dtype != base.dtype:     # a bit-cast: the Extern's copy, valid until the root changes
                wrapped.append(F.Alias(base.alias.root, (F.OpaqueView(view_meta),), value, base.alias.root.version))
                continue
            alias = F.storage_view(base.alias, view_meta, None)
            alias.cached = alias.steps[0].apply(alias.root.current)
            wrapped.append(alias)
        return _rebuild(out, wrapped)

    @staticmethod
    def _arg_dtype(tensor_args: list[Value], view: tuple[int, bool]) -> torch.dtype:
        return tensor_args[view[0]].dtype

    # ----------------------------------------------------------------- outputs
    def _output(self, node: Node) -> None:
        """Outputs: the user's, then the new values of mutated inputs, then hidden bases.

        Each user output is returned as eager returns it (graph.extra, read by the wrapper):
          output_aliases  {i: p}  a view of input p (its layout is in output_sources);
          output_sources  {i: ("input", p)}   the input tensor p itself (x.contiguous());
                          {i: ("input_view", p, shape, stride, offset)}  p.as_strided(...) after
                                              the write-backs (offset: in p's storage);
                          {i: ("output", j)}  the same tensor object as output j;
                          {i: ("view", j)}    a view of output j (j may be a hidden base): eager's
                                              outputs that share one intermediate's memory."""
        outputs: list[Any] = []
        aliases: dict[int, int] = {}
        sources: dict[int, tuple[str, int]] = {}
        first_index: dict[int, int] = {}          # id(Alias) -> first output index returning it
        pending_views: list[tuple[int, F.Alias]] = []
        for index, item in enumerate(node.args[0]):
            if isinstance(item, Node):
                item = self.env[item]
            if not isinstance(item, F.Alias):
                outputs.append(item.node if isinstance(item, Value) else item)
                continue
            if any(isinstance(step, F.OpaqueView) for step in item.steps):
                raise F.RunEagerly("a bit-cast view of a tensor is returned")
            if id(item) in first_index:
                sources[index] = ("output", first_index[id(item)])
                outputs.append(outputs[first_index[id(item)]])
                continue
            first_index[id(item)] = index
            root = item.root
            if root.placeholder_index is not None:
                if item is root.identity:
                    sources[index] = ("input", root.placeholder_index)
                    outputs.append(root.original.node)
                else:
                    # the wrapper returns input.as_strided(...) (after the write-backs): no kernel here
                    meta = F.original_meta(item)
                    aliases[index] = root.placeholder_index
                    sources[index] = ("input_view", root.placeholder_index, tuple(meta.shape), tuple(meta.stride),
                                      meta.storage_offset)
                    outputs.append(None)
                continue
            if item is not root.identity:
                pending_views.append((index, item))
                outputs.append(None)      # the wrapper makes it: a view of its root's output
            else:
                outputs.append(self._root_output(root).node)
        mutated: list[tuple[int, int]] = []
        for placeholder_index, root in enumerate(self.roots):
            if root is not None and root.version > 0 and root.current.node is not root.original.node:
                meta = root.original.meta
                if _overlaps_itself(meta):
                    # an expanded input written in place: eager's fill_ writes each location once,
                    # a write-back copy_ would raise; other ops raise in eager. Only eager is exact.
                    raise F.RunEagerly("an input whose elements overlap in memory is written in place")
                mutated.append((placeholder_index, len(outputs)))
                outputs.append(root.current.node)
        base_of_root: dict[int, int] = {}
        for index, item in enumerate(node.args[0]):
            item = self.env[item] if isinstance(item, Node) else item
            if isinstance(item, F.Alias) and item is item.root.identity and index not in sources and \
                    item.root.placeholder_index is None:
                base_of_root.setdefault(id(item.root), index)
        for index, item in pending_views:
            base = base_of_root.get(id(item.root))
            if base is None:            # the root is not returned itself: a hidden output holds it
                base = base_of_root[id(item.root)] = len(outputs)
                outputs.append(self._root_output(item.root).node)
            meta = F.original_meta(item)
            offset = meta.storage_offset - item.root.original.meta.storage_offset
            sources[index] = ("view", base, tuple(meta.shape), tuple(meta.stride), offset)
        self.new.output(outputs)
        self.new.extra["num_user_outputs"] = len(node.args[0])
        self.new.extra["mutated_inputs"] = mutated
        self.new.extra["output_aliases"] = aliases
        self.new.extra["output_sources"] = sources
        # views made by the wrapper that eager detached (a view of a value computed under no_grad)
        self.new.extra["detached_outputs"] = [
            index for index, item in enumerate(node.args[0])
            if isinstance(item, Node) and isinstance(self.env[item], F.Alias) and
            any(isinstance(step, F.ViewStep) and step.prim is P_detach for step in self.env[item].steps)]
        self.new.extra["_argument_inputs"] = [i for i, p in enumerate(self.new.placeholders)
                                              if _is_argument(p.extra.get("source"))]

    def _root_output(self, root: F.Root) -> Value:
        """An intermediate's final value as a fresh output buffer laid out as eager's tensor (views
        of it are rebuilt from these strides)."""
        value = F.resolve(root.identity)
        original = root.original.meta
        if value.node in self.output_nodes or F.is_view_of_placeholder(value.node) or (
                tuple(value.meta.stride) != tuple(original.stride) and _dense(original)):
            value = ops.clone(value)  # a buffer of its own (its value may be an input's)
            if _dense(original) and tuple(value.meta.shape) == tuple(original.shape):
                value = ops.relaid(value, original.stride)
        self.output_nodes.add(value.node)
        return value


def _in_captured_layout(meta: Any, captured: Any) -> Any:
    """An Extern's result laid out as capture recorded it: the Extern runs eager's op, which lays out
    its result as eager does, and capture's meta holds the corrections where the meta kernels differ
    (capture/tensor_ops.py _eager_layout: roll or replicate padding of a channels-last input)."""
    if not (isinstance(meta, TensorMeta) and isinstance(captured, TensorMeta) and _dense(captured)):
        return meta
    if any(is_symbolic(v) for v in (*meta.shape, *meta.stride)):
        return meta     # dynamic shapes: comparing a symbolic size with capture's hint would guard on it
    if tuple(meta.shape) != tuple(captured.shape) or meta.dtype != captured.dtype:
        return meta
    return dataclasses.replace(meta, stride=tuple(captured.stride))


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


# in-place methods that change a tensor's shape, strides or storage rather than its values
_METADATA_INPLACE = {"resize_", "resize_as_", "set_", "as_strided_", "squeeze_", "unsqueeze_", "t_",
                     "transpose_", "swapdims_", "swapaxes_", "unsafe_split_", "share_memory_"}


def _device(args: tuple, kwargs: dict) -> torch.device:
    devices = [v.device for v in tree_leaves((args, kwargs)) if is_tensor(v)]
    return devices[0] if devices else torch.device(kwargs.get("device") or "cpu")


_SETITEM = (operator.setitem, torch.Tensor.__setitem__)


def _check_setitem_overlap(target: Value, index: Any, value: Value) -> None:
    """x[1:] = x[:-1]: the written region is x[index] (basic indexing only; eager's advanced
    indexing checks differ and are left to the functional result)."""
    items = index if isinstance(index, tuple) else (index,)
    if target.alias is None or not all(i is None or i is Ellipsis or isinstance(i, (int, slice)) for i in items):
        return
    bounds = [b for i in items if isinstance(i, slice) for b in (i.start, i.stop, i.step)]
    if not all(b is None or isinstance(b, (int, SymInt)) for b in bounds):
        return
    try:
        written = _basic_index_meta(F.original_meta(target.alias), index)
    except Exception:
        return
    _check_partial_overlap(target, (value,), {}, dataclasses.replace(written, device=target.device))


def _basic_index_meta(meta: TensorMeta, index: Any) -> TensorMeta:
    """``meta[index]`` for ints, slices, None and Ellipsis.  Symbolic sizes cannot make a meta
    tensor without being pinned: the index's views are then built in a scratch graph by the
    decomposition's own code, so they take the same (guarded) decisions as the real view."""
    if not any(is_symbolic(v) for v in (*meta.shape, *meta.stride, meta.storage_offset)):
        return TensorMeta.of(meta.to_meta_tensor()[index])
    from ember.prims.decompositions.indexing import _basic_then_advanced
    scratch = Graph()
    with building(Emitter(scratch)):
        view, advanced = _basic_then_advanced(Value(scratch.placeholder("x", meta), meta), index)
    assert not advanced, index
    return view.meta


def _check_partial_overlap(target: Value, args: tuple, kwargs: dict, written: TensorMeta | None = None) -> None:
    """x[1:].add_(x[:-1]): eager raises when an in-place op reads memory that overlaps what it
    writes without being the same view (at::assert_no_partial_overlap), and for overlaps it cannot
    classify it runs element by element.  Either way only eager reproduces it: run the graph so."""
    if target.alias is None:
        return
    written = written or F.original_meta(target.alias)
    for value in tree_leaves((args, kwargs)):
        if not is_tensor(value) or value.alias is None or value.alias.root is not target.alias.root or \
                value.alias is target.alias:
            continue
        read = F.original_meta(value.alias)
        same = (tuple(read.shape), tuple(read.stride), read.storage_offset) == \
            (tuple(written.shape), tuple(written.stride), written.storage_offset)
        if not same and F.memory_overlaps(written, read):
            raise F.RunEagerly("an in-place op reads memory that partially overlaps what it writes")


def _check_inplace_result(target: Value, result: Any) -> None:
    """Eager rejects an in-place op whose result does not fit `target` (x_int.add_(0.5), a
    broadcast that would grow x): run the graph eagerly so the user gets eager's error."""
    if not is_tensor(result):
        return
    if not torch.can_cast(result.dtype, target.dtype):
        raise F.RunEagerly(f"in-place result of dtype {result.dtype} cannot be cast to {target.dtype}")
    shape = tuple(target.shape)
    if len(result.shape) > len(shape) or any(
            r != t and r != 1 for r, t in zip(reversed(tuple(result.shape)), reversed(shape))):
        raise F.RunEagerly(f"in-place result of shape {tuple(result.shape)} does not fit {shape}")


def _binds_inplace(target: Any, args: tuple, kwargs: dict) -> bool:
    """Does this call pass inplace=True (by keyword or position)?"""
    if kwargs.get("inplace") is True:
        return True
    try:
        bound = inspect.signature(target).bind(*args, **kwargs)
    except (TypeError, ValueError):
        return False
    return bound.arguments.get("inplace") is True


def _shares_storage(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage()._cdata == b.untyped_storage()._cdata


def _shared_storage(out: Any, arg_tensors: list[torch.Tensor]) -> dict[int, tuple[int, bool]]:
    """id(result leaf) -> (position of the tensor argument it aliases, is it that very tensor)."""
    found: dict[int, tuple[int, bool]] = {}
    for leaf in tree_leaves(out):
        if not isinstance(leaf, torch.Tensor):
            continue
        for position, arg in enumerate(arg_tensors):
            if leaf is arg or _shares_storage(leaf, arg):
                found[id(leaf)] = (position, leaf is arg)
                break
    return found


def _eager_alias_kinds(target: Any, args: tuple, kwargs: dict, result: Any) -> dict[int, str]:
    """For result leaves that are an argument's own Value: does eager return that very tensor
    ("same"), a new view of it ("view") or a copy ("copy")?  Asked of the meta device."""
    tensor_args = [v for v in tree_leaves((args, kwargs)) if is_tensor(v)]
    device = tensor_args[0].device if tensor_args else None
    # x.to(x.device) is x itself: ask the meta device with the tensors' own device read as "meta"
    as_meta = lambda v: torch.device("meta") if _names_device(v, device) else v  # noqa: E731
    # symbolic sizes: one number per symbol across the tensors and the size arguments (expand(B, ...))
    layouts = {id(v): _eager_layout(v) for v in tensor_args}
    numbers = concrete_numbers([*(s for m in layouts.values() for s in (*m.shape, *m.stride, m.storage_offset)),
                                *tree_leaves((args, kwargs))])
    try:
        out, arg_tensors = meta_call(target, tree_map(as_meta, args), tree_map(as_meta, kwargs),
                                     to_meta=lambda v: concrete_meta_tensor(layouts[id(v)], numbers),
                                     size_value=lambda size: concrete_int(size, numbers))
    except Exception:
        return {}
    results, eager = tree_leaves(result), tree_leaves(out)
    if len(results) != len(eager):
        return {}
    kinds: dict[int, str] = {}
    for r, o in zip(results, eager):
        if not is_tensor(r) or not isinstance(o, torch.Tensor):
            continue
        for value, meta in zip(tensor_args, arg_tensors):
            if value.node is r.node:
                kinds[id(r)] = "same" if o is meta else "view" if _shares_storage(o, meta) else "copy"
                break
    return kinds


def _eager_layout(value: Value) -> TensorMeta:
    """The value's layout as eager has it: an alias's strides over its root's storage (after an
    in-place update the prim value may be laid out differently: x.add_(x) then x.t().contiguous()
    copies in eager when x.t() is not contiguous, fuzz seed 103287)."""
    if value.alias is not None:
        return dataclasses.replace(F.original_meta(value.alias), device=value.meta.device)
    return value.meta


def _overlaps_itself(meta: TensorMeta) -> bool:
    """Do two elements of this input share a memory location (expanded, overlapping as_strided)?"""
    shape, stride = tuple(meta.shape), tuple(meta.stride)
    if all(isinstance(v, int) for v in (*shape, *stride)):
        return not F.non_overlapping(shape, stride)
    return any(st == 0 and n != 1 for n, st in zip(shape, stride))   # symbolic sizes: broadcast dims


def _is_argument(source: str | None) -> bool:
    """Is a placeholder (by its capture source, e.g. "L['x'][0]") one of the call's arguments rather
    than module or global state ("L['self'].bn.running_mean", "G['w']")?  Unknown: treat as one."""
    return source is None or re.fullmatch(r"L\['[^']*'\](\[[^\]]*\])*", source) is not None


def _names_device(value: Any, device: torch.device | None) -> bool:
    """Is value a torch.device (or a device string) naming `device`?"""
    if device is None or isinstance(value, bool) or not isinstance(value, (torch.device, str)):
        return False
    try:
        named = torch.device(value)
    except (RuntimeError, TypeError):
        return False
    return named.type == device.type and (named.index is None or named.index == (device.index or 0))


def _rebuild(out: Any, leaves: list[Any]) -> Any:
    """`leaves` put back into the (flat) structure of `out`."""
    if isinstance(out, (tuple, list)):
        return type(out)(leaves) if not hasattr(out, "_fields") and type(out) in (tuple, list) else tuple(leaves)
    return leaves[0]
