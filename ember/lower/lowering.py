"""Prim graph -> LoopProgram (lower/ir.py).

One loop node per prim that computes something (elementwise -> Pointwise,
reduction -> Reduction, anything that is not a lowerable Prim -> Extern);
views produce no node at all: they are index maps applied when a consumer
loads through them.  Nothing is decided about fusion here (lower/scheduler.py).
"""
from __future__ import annotations

import dataclasses
import math
import operator
from collections.abc import Callable
from typing import Any

import torch

from ember.errors import CompileError
from ember.graph import Graph, Node, TensorMeta, dense_in_order, dense_strides_like, is_dense, tree_leaves, tree_map
from ember.lower import ir, lower_indexing
from ember.lower.ir import Cast, Const, Expr, Index, IndexValue, Load, Op
from ember.symbolic import as_size, hint_of, is_symbolic
from ember.prims.ops import rounded_to
from ember.prims.primitives import BINARY, UNARY, Prim, is_prim

Loader = Callable[[tuple[Index, ...]], Expr]


class TensorValue:
    """A tensor during lowering: its shape/dtype and how to load element ``idx``."""

    __slots__ = ("dtype", "loader", "node_name", "shape")

    def __init__(self, shape: tuple[int, ...], dtype: torch.dtype, loader: Loader, node_name: str | None = None):
        self.shape = tuple(as_size(s) for s in shape)
        self.dtype = dtype
        self.loader = loader
        self.node_name = node_name  # set when this value *is* a loop node (not a view of one)

    def load(self, idx: tuple[Index, ...]) -> Expr:
        return self.loader(tuple(idx))


def lower_graph(graph: Graph, example_inputs: list | None = None) -> ir.LoopProgram:
    """Translate a prim-level graph into loop nodes (one per computing prim).

    ``example_inputs`` describe placeholders without a tensor meta: real values, or input specs
    (a TensorMeta, or the type of a runtime scalar)."""
    return _Lowering(graph, example_inputs).run()


class _Lowering:
    def __init__(self, graph: Graph, example_inputs: list | None):
        self.graph = graph
        self.example_inputs = example_inputs
        self.nodes: dict[str, ir.LoopNode] = {}
        self.env: dict[Node, Any] = {}
        # buffer layouts of computed nodes that are not contiguous (eager's strides, from the prim
        # graph's metas): the scheduler allocates them so if they are materialized
        self.layouts: dict[str, tuple[int, ...]] = {}
        # copies made for Extern arguments, by their body over vars in memory order (see extern_copy)
        self.extern_copies: dict[tuple, tuple[str, tuple[int, ...]]] = {}
        # a CUDA graph with 2-D convolutions runs them channels-last (cuDNN's fast NHWC kernels,
        # e.g. for depthwise convs); 4-D values computed from channels-last ones stay channels-last
        self.channels_last = any(_is_2d_convolution(n) for n in graph.call_nodes())

    # -------------------------------------------------------------- driver
    def run(self) -> ir.LoopProgram:
        _reject_complex(self.graph)
        for position, node in enumerate(self.graph.placeholders):
            self.env[node] = self.lower_placeholder(node, position)
        for node in self.graph.call_nodes():
            try:
                self.env[node] = self.lower_call(node)
                self.record_layout(node, self.env[node])
            except CompileError:
                raise
            except Exception as exc:  # never guess: name the op and the user's line
                raise CompileError(f"cannot lower {node.name}: {type(exc).__name__}: {exc}", stage="lower",
                                   op=getattr(node.target, "qualified_name", str(node.target)),
                                   source_line=node.source_line or "") from exc
        outputs, strides = [], []
        # outputs whose layout is ours to choose (a training forward's saved tensors, read only
        # by ember's backward, which is compiled for the layout they get: see autodiff/training.py)
        free_layout = self.graph.extra.get("free_layout_outputs", ())
        for position, (value, node) in enumerate(zip(self.graph.outputs, self._output_nodes())):
            free = position in free_layout
            outputs.append(self.lower_output(value, node, free))
            meta = node.meta if isinstance(node, Node) else None
            strides.append(tuple(meta.stride) if isinstance(meta, TensorMeta) and not free else None)
        program = ir.LoopProgram(self.nodes, outputs, strides, len(self.graph.placeholders))
        program.extra["layouts"] = self.layouts
        program.extra["backward"] = bool(self.graph.extra.get("backward"))    # a training step's backward
        return program

    def record_layout(self, node: Node, value: Any) -> None:
        """Remember the strides the prim graph gives a computed node (eager's layout) when they
        are dense but not contiguous; loop nodes of other prims keep their own."""
        if isinstance(value, TensorValue):
            pairs = [(value, node.meta, node.name)]
        elif isinstance(value, (tuple, list)) and isinstance(node.meta, (tuple, list)) and \
                len(value) == len(node.meta):
            pairs = [(v, m, f"{node.name}_") for v, m in zip(value, node.meta)]
        else:
            return
        for item, meta, prefix in pairs:
            if not isinstance(item, TensorValue) or item.node_name is None or not isinstance(meta, TensorMeta):
                continue
            name = item.node_name
            loop = self.nodes.get(name)
            if not isinstance(loop, (ir.Pointwise, ir.Reduction)) or name in self.layouts or \
                    not (name == prefix or name.startswith(prefix)) or tuple(meta.shape) != loop.shape:
                continue
            stride = tuple(as_size(st) for st in meta.stride)
            # eager's strides are taken when plain ints (symbolic ones would need guards to compare);
            # the channels-last rule below holds at any size (without it, a conv net's activations
            # were contiguous between channels-last convolutions under dynamic shapes: a copy each)
            if all(isinstance(st, int) for st in meta.stride) and \
                    stride != ir.contiguous_strides(loop.shape) and is_dense(loop.shape, stride):
                self.layouts[name] = stride
            elif self.channels_last and isinstance(loop, ir.Pointwise) and self.reads_channels_last(loop):
                self.layouts[name] = _channels_last_strides(loop.shape)

    def reads_channels_last(self, loop: ir.Pointwise) -> bool:
        """Is this 4-D value computed from a channels-last buffer of its batch and channels (eager's
        rule for elementwise results, pooling and resizing: follow the input's memory format)?"""
        if len(loop.shape) != 4 or _channels_last_strides(loop.shape) == ir.contiguous_strides(loop.shape):
            return False
        for load in ir.loads(loop.body):
            source = self.nodes.get(load.buffer)
            if source is not None and len(source.shape) == 4 and source.shape[:2] == loop.shape[:2] and \
                    _is_channels_last(source.shape, _assumed_strides(source, self.layouts)):
                return True
        return False

    def _output_nodes(self) -> list[Any]:
        return list(self.graph.outputs)

    def add(self, node: ir.LoopNode) -> TensorValue:
        assert node.name not in self.nodes
        self.nodes[node.name] = node
        name, dtype = node.name, node.dtype
        return TensorValue(node.shape, dtype, lambda idx: Load(name, idx, dtype), name)

    def value(self, arg: Any) -> Any:
        return self.env[arg] if isinstance(arg, Node) else arg

    # -------------------------------------------------------------- inputs
    def lower_placeholder(self, node: Node, position: int) -> Any:
        meta = node.meta
        if not isinstance(meta, TensorMeta):
            example = self.example_inputs[position] if self.example_inputs else None
            if isinstance(example, torch.Tensor):
                example = TensorMeta.of(example)
            if isinstance(example, TensorMeta):
                meta = example
            elif isinstance(example, (int, float, bool)) or example in (int, float, bool):
                # runtime Python scalar (a value, or its type): the host passes it as a 0-dim tensor
                kind = example if isinstance(example, type) else type(example)
                dtype = torch.bool if kind is bool else torch.int64 if kind is int else torch.float64
                return self.add(ir.InputBuffer(node.name, (), dtype, (), 0, position))
            else:
                return example
        return self.add(ir.InputBuffer(node.name, tuple(meta.shape), meta.dtype, tuple(meta.stride),
                                       as_size(meta.storage_offset), position))

    # -------------------------------------------------------------- calls
    def lower_call(self, node: Node) -> Any:
        target = node.target
        if target is operator.getitem:
            container, item = self.value(node.args[0]), node.args[1]
            return container[item]
        if is_prim(target) and target.name in _LOWERINGS:
            # nested too: cat takes a list of tensors, index a list of index tensors (or None)
            return _LOWERINGS[target.name](self, node, *tree_map(self.value, tuple(node.args)),
                                           **{k: tree_map(self.value, v) for k, v in node.kwargs.items()})
        return self.lower_extern(node)

    def lower_extern(self, node: Node) -> Any:
        """Anything without a loop lowering runs eagerly: correct, just not fused."""
        name = node.name
        fn = _fn_of(node)
        to_ref = lambda v: self.extern_argument(self.env[v], node) \
            if isinstance(v, Node) and isinstance(self.env[v], TensorValue) else self.value(v)
        node_args, node_kwargs = self.drop_all_true_mask(fn, node.args, node.kwargs)
        args, kwargs = tree_map(to_ref, node_args), tree_map(to_ref, node_kwargs)
        args, kwargs = self.meet_argument_requirements(fn, node, args, kwargs)
        for leaf in tree_leaves((args, kwargs)):
            if isinstance(leaf, (TensorValue, tuple)) and not isinstance(leaf, ir.BufferRef):
                raise CompileError("extern argument is a tuple of tensors", stage="lower", op=str(node.target))
        padded = self.pad_matmul(fn, node, args)
        if padded is not None:
            args, padded_meta = padded
            self.nodes[name] = ir.Extern(name, (), torch.float32, fn, args, kwargs, source=node.source_line or "")
            out = self.add(ir.ExternOutput(f"{name}_out", padded_meta.shape, padded_meta.dtype, name, None,
                                           padded_meta.stride, 0))
            # the first M rows and N columns of the padded product, read in place
            return TensorValue(tuple(node.meta.shape), node.meta.dtype, out.load)
        self.nodes[name] = ir.Extern(name, (), torch.float32, fn, args, kwargs,
                                     source=node.source_line or "")
        meta = node.meta
        if fn in _ATTENTION and isinstance(meta, TensorMeta) and meta.device.type in FUSED_ATTENTION_DEVICES:
            meta = self.attention_output_layout(args, kwargs, meta)
        elif fn in _FUSED_ATTENTION_OPS and isinstance(meta, tuple) and meta[0].device.type in FUSED_ATTENTION_DEVICES:
            # a forward's output is dense in q's dim order; a backward's dq, dk, dv in those of its
            # arguments q, k, v (1-3)
            forward = fn in _FUSED_ATTENTION_FORWARDS
            laid_out = {0: args} if forward else {i: args[i + 1:] for i in range(3)}
            meta = tuple(self.attention_output_layout(laid_out[i], {}, m) if i in laid_out else m
                         for i, m in enumerate(meta))
        elif fn in _LAYOUT_PROBED_EXTERNS and isinstance(meta, TensorMeta) and meta.device.type == "cpu":
            meta = self.probe_output_layout(fn, args, kwargs, meta)
        if isinstance(meta, TensorMeta) and (fn in _CONVOLUTIONS or self.channels_last and _is_pooling(fn)):
            meta = self.convolution_output_layout(args, meta)
        elif isinstance(meta, (tuple, list)) and self.channels_last and _is_pooling(fn):
            # max_pool2d_with_indices: values and indices both follow the input's layout
            meta = tuple(self.convolution_output_layout(args, m) if isinstance(m, TensorMeta) else m for m in meta)
        elif isinstance(meta, (tuple, list)) and fn in _CONVOLUTION_BACKWARDS and len(args) > 1:
            # cuDNN's input and weight gradients follow a channels-last input (a wrong guess costs
            # a copy in the wrapper, never a wrong result)
            meta = tuple(self.convolution_output_layout(args[1:], m) if isinstance(m, TensorMeta) and i < 2 else m
                         for i, m in enumerate(meta))
        if isinstance(meta, TensorMeta):
            return self.add(ir.ExternOutput(f"{name}_out", tuple(meta.shape), meta.dtype, name, None,
                                            tuple(meta.stride), as_size(meta.storage_offset)))
        if isinstance(meta, (tuple, list)):
            return tuple(self.add(ir.ExternOutput(f"{name}_out{i}", tuple(m.shape), m.dtype, name, i,
                                                  tuple(m.stride), as_size(m.storage_offset)))
                         if isinstance(m, TensorMeta) else None for i, m in enumerate(meta))
        if meta is None and fn in _SCALAR_EXTERNS:
            # a Python number computed at run time (the Philox seed): kernels read it as a 0-dim tensor
            return self.add(ir.ExternOutput(f"{name}_out", (), _SCALAR_EXTERNS[fn], name, None, (), 0,
                                            scalar=True))
        raise CompileError("extern without tensor meta", stage="lower", op=str(node.target),
                           source_line=node.source_line or "")

    def probe_output_layout(self, fn: Any, args: Any, kwargs: Any, meta: TensorMeta) -> TensorMeta:
        """Run the extern once on zero tensors laid out as its real arguments will be, and keep
        the strides it really returns (the meta device gets them wrong for some CPU kernels).
        With symbolic sizes the probe runs at the hints, and a dense result's dim order is kept
        (strides as expressions of the sizes; anything else keeps the meta's layout)."""
        def real(value: Any) -> Any:
            if not isinstance(value, ir.BufferRef):
                return value
            base = self.nodes[value.name]
            shape = tuple(hint_of(v) for v in base.shape)
            strides = tuple(hint_of(v) for v in _assumed_strides(base, self.layouts))
            tensor = torch.zeros(_storage_size(shape, strides), dtype=base.dtype)
            if isinstance(value, ir.BufferView):
                stride, offset = ir.strided_layout(value.index, value.vars, base.shape,
                                                   _assumed_strides(base, self.layouts))
                return tensor.as_strided(tuple(hint_of(v) for v in value.shape), tuple(hint_of(v) for v in stride),
                                         hint_of(offset))
            return tensor.as_strided(shape, strides)
        try:
            result = fn(*tree_map(real, args), **tree_map(real, kwargs))
        except Exception:  # noqa: BLE001 - the probe is an optimization: keep the meta layout
            return meta
        hints = tuple(hint_of(v) for v in meta.shape)
        if not isinstance(result, torch.Tensor) or tuple(result.shape) != hints:
            return meta
        if any(is_symbolic(v) for v in meta.shape):
            if not is_dense(hints, tuple(result.stride())):
                return meta
            return dataclasses.replace(meta, stride=dense_strides_like(meta.shape, hints, tuple(result.stride())),
                                       storage_offset=0)
        return dataclasses.replace(meta, stride=tuple(result.stride()), storage_offset=result.storage_offset())

    def attention_output_layout(self, args: Any, kwargs: Any, meta: TensorMeta) -> TensorMeta:
        """CUDA's fused attention returns its output dense in q's dim order: cuDNN matches q's
        layout, flash and memory-efficient attention write (B, L, H, D), which is q's order when
        q is a head view of a (B, L, H * D) projection (every Hugging Face model).  The meta
        device says contiguous: a copy per layer in the wrapper.  A wrong guess costs that copy,
        never a wrong result."""
        query = args[0] if args else kwargs.get("query")
        layout = self.argument_strides(query) if isinstance(query, ir.BufferRef) else None
        if layout is None or len(meta.shape) != 4:
            return meta
        shape, strides = layout
        return dataclasses.replace(meta, stride=dense_strides_like(
            meta.shape, [hint_of(n) for n in shape], [hint_of(s) for s in strides]), storage_offset=0)

    # ---------------------------------------------------- extern argument layouts
    def argument_strides(self, ref: ir.BufferRef) -> tuple[tuple[int, ...], tuple[int, ...]] | None:
        """(shape, strides) the Extern will see for this argument (None: unknown)."""
        base = self.nodes.get(ref.name)
        if base is None:
            return None
        strides = _assumed_strides(base, self.layouts)
        if isinstance(ref, ir.BufferView):
            layout = ir.strided_layout(ref.index, ref.vars, base.shape, strides)
            return None if layout is None else (tuple(ref.shape), layout[0])
        return tuple(base.shape), tuple(strides)

    def meet_argument_requirements(self, fn: Any, node: Node, args: Any, kwargs: Any) -> tuple[Any, Any]:
        """Copy (with a fused kernel) the arguments whose layout the Extern's fast kernels reject
        (EXTERN_ARGUMENT_LAYOUTS); eager would hand them over in a layout they accept."""
        requirements = EXTERN_ARGUMENT_LAYOUTS.get(fn)
        if not requirements:
            return args, kwargs
        args, kwargs = list(args), dict(kwargs)
        for name, (position, requirement) in requirements.items():
            if name in kwargs:
                ref, source, put = kwargs[name], node.kwargs.get(name), lambda v, n=name: kwargs.__setitem__(n, v)
            elif position < len(args):
                ref, source, put = args[position], node.args[position], lambda v, i=position: args.__setitem__(i, v)
            else:
                continue
            if not isinstance(ref, ir.BufferRef) or not isinstance(source, Node):
                continue
            layout = self.argument_strides(ref)
            if layout is None:
                continue
            shape, strides = layout
            if requirement == "last_dim_unit_stride":
                if not shape or shape[-1] == 1 or strides[-1] == 1:
                    continue
                target = ir.contiguous_strides(shape)
            elif requirement == "dense" and self.channels_last and len(shape) == 4:
                if _is_channels_last(shape, strides):
                    continue
                target = _channels_last_strides(shape)
            elif requirement == "dense":
                if is_dense(shape, strides):
                    continue
                target = _dense_like(shape, strides)
            elif requirement == "matmul_operand":
                other = node.args[1 - position] if len(node.args) > 1 else None
                if not isinstance(other, Node) or not isinstance(self.env.get(other), TensorValue):
                    continue
                target = _matmul_operand_copy(shape, strides, position, tuple(self.env[other].shape))
                if target is None:
                    continue
            elif requirement.startswith("layout_of:"):
                # the layout of another argument (a fused attention backward's output gradient
                # in its output's layout, as eager's autograd hands it over)
                other = args[int(requirement.split(":")[1])]
                other_layout = self.argument_strides(other) if isinstance(other, ir.BufferRef) else None
                if other_layout is None or tuple(other_layout[1]) == tuple(strides) or \
                        tuple(other_layout[0]) != tuple(shape) or not is_dense(*other_layout):
                    continue
                target = tuple(other_layout[1])
            else:
                raise AssertionError(f"unknown argument requirement {requirement}")
            put(ir.BufferRef(self.copy_for_extern(self.env[source], node, target).node_name))
        return tuple(args), kwargs

    def pad_matmul(self, fn: Any, node: Node, args: tuple) -> tuple[tuple, TensorMeta] | None:
        """mm/addmm/bmm whose operands or output have rows that are not 16-byte aligned, computed
        on zero-padded copies: (new args, the padded product's meta), or None.

        cuBLAS runs a product with an unaligned leading dimension (an operand's or the output's
        row stride) with slow "align1" kernels.  GPT-2's LM head (vocab 50257) in bf16 training
        on an H100: the forward took 3.4 ms, the input gradient (K = 50257) 2.4 ms and the
        weight gradient (the logits' gradient read transposed: M = 50257) 2.2 ms, against about
        0.4 ms each aligned.  The dim that makes a leading dimension is padded with zeros:
          * N (the output's rows): the weight's columns; the graph reads the first N columns;
          * K, when it is an operand's contiguous dim: both operands, so the zeros add nothing;
          * M, when it is the left operand's contiguous dim: its rows; the graph reads the first M.
        Each operand copy costs its bytes, so an operand is padded only if the product does at
        least PAD_MATMUL_MIN_FLOPS_PER_COPIED flops per element copied (a GEMV never copies its
        weight).  Copies of the same elements in the same memory order are shared (extern_copy):
        the two gradient products read one padded copy of the logits' gradient."""
        meta = node.meta
        if fn not in _PADDED_MATMULS or not isinstance(meta, TensorMeta) or \
                meta.device.type not in PAD_MATMUL_DEVICES or meta.dtype not in _PAD_ALIGN:
            return None
        if meta.dtype == torch.float32 and torch.get_float32_matmul_precision() == "highest":
            # no tensor cores: cuBLAS's fp32 kernels do not care, and the copies would cost 7%
            # (the LM head's training step above: 19.4 ms against eager's 18.2 ms)
            return None
        a, b = args[-2], args[-1]
        if not isinstance(a, ir.BufferRef) or not isinstance(b, ir.BufferRef):
            return None
        layouts = self.argument_strides(a), self.argument_strides(b)
        if None in layouts:
            return None
        (a_shape, a_stride), (b_shape, b_stride) = layouts
        align = _PAD_ALIGN[meta.dtype]
        sizes = {"m": a_shape[-2], "k": a_shape[-1], "n": b_shape[-1]}
        if 2 * math.prod(hint_of(v) for v in meta.shape) * hint_of(sizes["k"]) < PAD_MATMUL_MIN_FLOPS:
            return None
        # a symbolic size is never padded (nor compared: that would add a guard)
        contiguous_dims = {"n"}        # the output's rows
        for (rows, columns), stride in ((("m", "k"), a_stride), (("k", "n"), b_stride)):
            contiguous = _contiguous_dim_of_matrix(stride)
            if contiguous is not None:
                contiguous_dims.add(columns if contiguous == -1 else rows)
        padded = {dim: -(-size // align) * align if dim in contiguous_dims and not is_symbolic(size) else size
                  for dim, size in sizes.items()}
        changed = {dim for dim in contiguous_dims if not is_symbolic(sizes[dim]) and padded[dim] != sizes[dim]}
        if not changed:
            return None
        operands = [(position, (*self.env[node.args[position]].shape[:-2], padded[rows], padded[columns]), stride)
                    for position, (rows, columns), (_, stride) in
                    zip((len(args) - 2, len(args) - 1), (("m", "k"), ("k", "n")), layouts)
                    if rows in changed or columns in changed]
        flops = 2 * math.prod(hint_of(v) for v in (*meta.shape[:-2], padded["m"], padded["n"], padded["k"]))
        if flops < PAD_MATMUL_MIN_FLOPS_PER_COPIED * sum(math.prod(map(hint_of, shape)) for _, shape, _ in operands):
            return None
        new_args = list(args)
        for position, shape, stride in operands:
            new_args[position] = self.padded_operand(self.env[node.args[position]], shape, stride, node)
        if fn is torch.addmm and isinstance(args[0], ir.BufferRef) and len(self.env[node.args[0]].shape) <= 2:
            bias = self.env[node.args[0]]
            dims = ("m", "n")[2 - len(bias.shape):]       # broadcast from the right; size-1 dims stay
            if any(dim in changed and not is_symbolic(size) and size != 1 for dim, size in zip(dims, bias.shape)):
                shape = tuple(padded[dim] if dim in changed and not is_symbolic(size) and size != 1 else size
                              for dim, size in zip(dims, bias.shape))
                new_args[0] = self.padded_operand(bias, shape, ir.contiguous_strides(bias.shape), node)
        shape = (*meta.shape[:-2], padded["m"], padded["n"])
        return tuple(new_args), dataclasses.replace(meta, shape=shape, stride=ir.contiguous_strides(shape),
                                                    storage_offset=0)

    def padded_operand(self, value: TensorValue, shape: tuple[int, ...], stride: tuple[int, ...],
                       node: Node) -> ir.BufferRef:
        """``value`` zero-padded to ``shape``, dense with its dims in the order of ``stride``
        (broadcast, stride-0, dims outermost), for an Extern."""
        vars_ = ir.make_vars("x", shape)
        idx = tuple(ir.index(v) for v in vars_)
        grown = [padded is not size and padded != size for size, padded in zip(value.shape, shape)]   # never a symbolic size
        inside = [lower_indexing.in_range(i, 0, size) for i, size, g in zip(idx, value.shape, grown) if g]
        loaded = value.load(tuple(lower_indexing.wrap_into(i, size) if g else i
                                  for i, size, g in zip(idx, value.shape, grown)))
        test = inside[0] if len(inside) == 1 else Op("logical_and", tuple(inside), torch.bool)
        body = Op("where", (test, loaded, Const(0, value.dtype)), value.dtype)
        padded = TensorValue(shape, value.dtype, lambda index: ir.substitute(body, dict(zip(vars_, index))))
        copy_stride = _dense_like(shape, tuple(s if s else 1 << 62 for s in stride))
        return self.extern_copy(padded, body, vars_, copy_stride, node, "zero padding for an aligned matmul")

    def copy_for_extern(self, value: TensorValue, node: Node, stride: tuple[int, ...],
                        description: str = "layout copy for an extern") -> TensorValue:
        """A fresh loop node holding ``value`` (the scheduler fuses the copy into its producer's kernel
        when it can), laid out with ``stride``."""
        name = f"{node.name}_input{len(self.nodes)}"
        vars_ = ir.make_vars("x", value.shape)
        body = value.load(tuple(ir.index(v) for v in vars_))
        copy = self.add(ir.Pointwise(name, value.shape, value.dtype, vars_, body, description))
        if stride != ir.contiguous_strides(value.shape):
            self.layouts[name] = stride
        return copy

    def convolution_output_layout(self, args: Any, meta: TensorMeta) -> TensorMeta:
        """cuDNN / oneDNN return a channels-last result for a channels-last input (the meta device
        says contiguous for some of them, e.g. depthwise); predicting it saves a re-layout copy."""
        if len(meta.shape) != 4 or not args or not isinstance(args[0], ir.BufferRef):
            return meta
        layout = self.argument_strides(args[0])
        if layout is None or len(layout[0]) != 4:
            return meta
        shape, strides = layout
        channels_last = _dense_like(shape, strides)
        if _is_channels_last(shape, channels_last) and not dense_in_order(shape, strides, (0, 1, 2, 3)):
            return dataclasses.replace(meta, stride=_channels_last_strides(tuple(as_size(s) for s in meta.shape)))
        return meta

    def drop_all_true_mask(self, fn: Any, args: Any, kwargs: Any) -> tuple[Any, Any]:
        """SDPA with a bool attn_mask that is True everywhere (provably, by value ranges of the
        loop IR: e.g. HF's bidirectional ``arange(n) >= 0``) is SDPA without a mask, which lets
        the flash / memory-efficient kernels run."""
        if fn not in _ATTENTION:
            return args, kwargs
        if "attn_mask" in kwargs:
            mask = kwargs["attn_mask"]
        elif len(args) > 3:
            mask = args[3]
        else:
            return args, kwargs
        value = self.env.get(mask) if isinstance(mask, Node) else None
        if not isinstance(value, TensorValue) or value.dtype != torch.bool:
            return args, kwargs
        vars_ = ir.make_vars("x", value.shape)
        if _value_range(value.load(tuple(ir.index(v) for v in vars_)), self.nodes) != (1, 1):
            return args, kwargs
        if "attn_mask" in kwargs:
            return args, {**kwargs, "attn_mask": None}
        return tuple(args[:3]) + (None,) + tuple(args[4:]), kwargs

    def extern_argument(self, value: TensorValue, node: Node) -> ir.BufferRef:
        """A loop node, or a strided view of one (no copy), or else a copy kernel's output."""
        if value.node_name is not None:
            return ir.BufferRef(value.node_name)
        vars_ = ir.make_vars("x", value.shape)
        body = value.load(tuple(ir.index(v) for v in vars_))
        base = self.nodes.get(body.buffer) if isinstance(body, Load) else None
        if base is not None and body.dtype == base.dtype and \
                ir.strided_layout(body.index, vars_, base.shape, _assumed_strides(base, self.layouts)) is not None:
            return ir.BufferView(base.name, value.shape, body.index, vars_)
        # the Extern takes any strides: lay the copy out along its reads (a transposed matmul operand)
        stride = self.strides_following_reads(body, vars_) or ir.contiguous_strides(value.shape)
        return self.extern_copy(value, body, vars_, stride, node)

    def extern_copy(self, value: TensorValue, body: Expr, vars_: tuple[ir.Var, ...], stride: tuple[int, ...],
                    node: Node, description: str = "layout copy for an extern") -> ir.BufferRef:
        """A copy of ``value`` laid out with ``stride`` for an Extern, or a view of an earlier copy
        holding the same elements in the same memory order (a matmul's gradient read as grad by
        one product and as grad^T by the other: ViT's qkv gradient was copied twice)."""
        order = sorted(range(len(vars_)), key=lambda d: (-stride[d], d))      # slowest dim first
        in_memory_order = {vars_[d]: ir.index(ir.Var(f"m{i}", vars_[d].size)) for i, d in enumerate(order)}
        key = (ir.substitute(body, in_memory_order), value.dtype)
        if key in self.extern_copies:
            base_name, base_order = self.extern_copies[key]
            index: list[Index] = [ir.const_index(0)] * len(base_order)
            for position, dim in enumerate(order):
                index[base_order[position]] = ir.index(vars_[dim])
            return ir.BufferView(base_name, value.shape, tuple(index), vars_)
        if stride == ir.contiguous_strides(value.shape) and description == "layout copy for an extern":
            copy = self.materialize(value, node)
        else:
            copy = self.copy_for_extern(value, node, stride, description)
        self.extern_copies[key] = (copy.node_name, tuple(order))
        return ir.BufferRef(copy.node_name)

    def strides_following_reads(self, body: Expr, vars_: tuple[ir.Var, ...]) -> tuple[int, ...] | None:
        """Dense strides for a copy of ``body`` whose innermost dim is the one its reads walk
        contiguously, when that is not already the last dim; else None.  A row-major copy of a
        transposed value reads with a stride and writes contiguously: ViT's qkv weight gradient
        (grad^T, gathered from the attention's dq, dk, dv) copied at 14 GB/s on an H100."""
        votes: dict[ir.Var, int] = {}
        origin = {v: ir.const_index(0) for v in vars_}
        for load in ir.loads(body):
            base = self.nodes.get(load.buffer)
            if base is None:
                continue
            strides = _assumed_strides(base, self.layouts)
            flat = ir.const_index(0)
            for idx, size, stride in zip(load.index, base.shape, strides):
                flat = flat + idx * as_size(stride) if size != 1 else flat
            start = flat.substitute(origin)
            for var in vars_:
                step = flat.substitute({**origin, var: ir.const_index(1)}) if var.size > 1 else None
                if step is not None and step.is_constant() and start.is_constant() and step.const - start.const == 1:
                    votes[var] = votes.get(var, 0) + 1
        if not votes:
            return None
        inner = max(votes, key=lambda v: (votes[v], vars_.index(v)))
        last = next((v for v in reversed(vars_) if v.size > 1), None)
        if inner is last or votes.get(last, 0) >= votes[inner]:
            return None
        shape = tuple(v.size for v in vars_)
        order = [i for i, v in enumerate(vars_) if v is not inner] + [vars_.index(inner)]
        return _dense_like(shape, tuple(len(order) - order.index(d) for d in range(len(shape))))

    def materialize(self, value: TensorValue, node: Node | None = None, name: str | None = None) -> TensorValue:
        """A value that is a loop node itself (views get a copy node the scheduler may fuse)."""
        if value.node_name is not None:
            return value
        name = name or f"{node.name if node is not None else 'view'}_input{len(self.nodes)}"
        vars_ = ir.make_vars("x", value.shape)
        body = value.load(tuple(ir.index(v) for v in vars_))
        return self.add(ir.Pointwise(name, value.shape, value.dtype, vars_, body, "view copy"))

    def lower_output(self, value: Any, node: Any, free_layout: bool = False) -> Any:
        if not isinstance(node, Node):
            return value
        value = self.env[node]
        if not isinstance(value, TensorValue):
            return value
        if f"{node.name}_output" in self.nodes:     # the same value returned twice (a forward output also saved)
            return f"{node.name}_output"
        view = self.output_view(value, node)
        if view is not None:
            return view
        if free_layout and value.node_name is not None:
            return value.node_name      # in the layout it was computed in (a convolution's channels-last)
        produced = self.nodes.get(value.node_name) if value.node_name is not None else None
        if self.channels_last and isinstance(produced, ir.ExternOutput) and isinstance(node.meta, TensorMeta) and \
                not _same_strides(produced.shape, produced.stride, tuple(node.meta.stride)):
            # an Extern's result in a layout of ember's choosing (channels-last): the caller gets eager's.
            # Only then: for channels-last inputs the meta device's conv strides are not eager's
            as_view = TensorValue(value.shape, value.dtype, value.load)     # not the node: materialize copies
            return self.materialize(as_view, name=f"{node.name}_output").node_name
        return self.materialize(value, name=f"{node.name}_output").node_name

    def output_view(self, value: TensorValue, node: Node) -> ir.OutputView | None:
        """An output that is a strided view of a computed buffer, with the strides eager gives it
        (a reshape of a matmul's result): returned as that view rather than copied."""
        meta = node.meta
        if value.node_name is not None or not isinstance(meta, TensorMeta) or not value.shape:
            return None
        vars_ = ir.make_vars("x", value.shape)
        body = value.load(tuple(ir.index(v) for v in vars_))
        base = self.nodes.get(body.buffer) if isinstance(body, Load) else None
        if base is None or isinstance(base, ir.InputBuffer) or body.dtype != base.dtype:
            return None       # views of inputs stay copies: eager's aliasing of inputs is not modelled
        layout = ir.strided_layout(body.index, vars_, base.shape, _assumed_strides(base, self.layouts))
        if layout is None:
            return None
        stride, offset = layout
        if not _same_strides(value.shape, stride, tuple(meta.stride)):
            return None
        return ir.OutputView(base.name, tuple(value.shape), tuple(meta.stride), offset)

    # -------------------------------------------------------------- helpers
    def pointwise(self, node: Node, shape: tuple[int, ...], dtype: torch.dtype,
                  body_fn: Callable[[tuple[Index, ...]], Expr]) -> TensorValue:
        vars_ = ir.make_vars("x", shape)
        body = body_fn(tuple(ir.index(v) for v in vars_))
        return self.add(ir.Pointwise(node.name, tuple(shape), dtype, vars_, body, _describe(node)))


# matmuls padded to 16-byte aligned rows (pad_matmul), where, and from what size on
_PADDED_MATMULS = {torch.mm, torch.addmm, torch.bmm}
_PAD_ALIGN = {torch.bfloat16: 8, torch.float16: 8, torch.float32: 4}
PAD_MATMUL_DEVICES = {"cuda"}
PAD_MATMUL_MIN_FLOPS = 1e9
PAD_MATMUL_MIN_FLOPS_PER_COPIED = 256     # a padded operand's copy must cost little beside the product


# Externs whose output layout follows their inputs' layouts in ways the meta device does not model
# (CPU flash attention returns a (B, T, H, D) buffer transposed when q is laid out that way).
_LAYOUT_PROBED_EXTERNS = {torch.nn.functional.scaled_dot_product_attention,
                          torch.ops.aten.scaled_dot_product_attention.default,
                          # CPU max_pool1d returns contiguous for a strided input, the meta device follows it
                          torch.nn.functional.max_pool1d, torch.max_pool1d}


_ATTENTION = {torch.nn.functional.scaled_dot_product_attention, torch.ops.aten.scaled_dot_product_attention.default}
# where SDPA runs fused kernels whose output is dense in q's dim order (attention_output_layout)
FUSED_ATTENTION_DEVICES = {"cuda"}
# eager's fused attention ops, which differentiated graphs call directly (prims/decompositions/attention.py)
_FUSED_ATTENTION_FORWARDS = {torch.ops.aten._scaled_dot_product_flash_attention.default,
                             torch.ops.aten._scaled_dot_product_cudnn_attention.default,
                             torch.ops.aten._scaled_dot_product_efficient_attention.default}
# their backward ops: where each takes its output (the output gradient comes in that layout)
_FUSED_ATTENTION_BACKWARDS = {torch.ops.aten._scaled_dot_product_flash_attention_backward.default: 4,
                              torch.ops.aten._scaled_dot_product_cudnn_attention_backward.default: 4,
                              torch.ops.aten._scaled_dot_product_efficient_attention_backward.default: 5}
_FUSED_ATTENTION_OPS = {*_FUSED_ATTENTION_FORWARDS, *_FUSED_ATTENTION_BACKWARDS}
_CONVOLUTION_BACKWARDS = {torch.ops.aten.convolution_backward, torch.ops.aten.convolution_backward.default}
# where graphs with 2-D convolutions run them (and the 4-D values around them) channels-last
CHANNELS_LAST_DEVICES = {"cuda"}
_CONVOLUTIONS = {torch.nn.functional.conv2d, torch.conv2d, torch.nn.functional.conv_transpose2d,
                 torch.conv_transpose2d, torch.convolution}

# Per-Extern argument layouts that their fast kernels need, as (position, requirement) by argument
# name; an argument that does not meet it is copied by a fused kernel before the call.
#   "last_dim_unit_stride": stride 1 in the last dim (copied contiguous).  SDPA's flash and
#       memory-efficient kernels check it for q, k, v and attn_mask and otherwise fall back to
#       the math path (fp32 matmuls + softmax), e.g. for a mask expanded from (.., L, 1).
#   "dense": non-overlapping and dense in some dim order (copied densely in the argument's own
#       stride order, so a channels-last view stays channels-last for cuDNN).
#   "matmul_operand": a layout cuBLAS reads in place once matmul has folded the batch dims into
#       one (matmul_operand_copy).  Otherwise ATen copies the operand with its generic
#       strided-copy kernel on every call: nanoGPT's q @ k^T on head views of the qkv projection,
#       50 copies of ~30 us per H100 training step where a fused copy kernel takes ~5 us.
# mm/addmm/linear take any transposed 2-D layout (cuBLAS), so they need no entry.
EXTERN_ARGUMENT_LAYOUTS: dict[Any, dict[str, tuple[int, str]]] = {
    torch.matmul: {"input": (0, "matmul_operand"), "other": (1, "matmul_operand")},
    torch.bmm: {"input": (0, "matmul_operand"), "mat2": (1, "matmul_operand")},
    **{fn: {"query": (0, "last_dim_unit_stride"), "key": (1, "last_dim_unit_stride"),
            "value": (2, "last_dim_unit_stride"), "attn_mask": (3, "last_dim_unit_stride")} for fn in _ATTENTION},
    **{fn: {"input": (0, "dense")} for fn in _CONVOLUTIONS},
    # the saved input of a convolution whose forward read a copy (an NCHW image under a
    # channels-last graph): ATen's backward picks its layout from input and weight, so an NCHW
    # input made it copy ResNet-50's (64, 64, 112, 112) output gradient to NCHW (0.4 ms) and
    # convert both back inside cuDNN (0.24 ms); the input's own copy takes 15 us
    **{fn: {"input": (1, "dense")} for fn in _CONVOLUTION_BACKWARDS},
    **{fn: {name: (i, "last_dim_unit_stride") for i, name in enumerate(("query", "key", "value"))}
       for fn in _FUSED_ATTENTION_FORWARDS},
    **{fn: {"grad_out": (0, f"layout_of:{out}"),
            **{name: (i + 1, "last_dim_unit_stride") for i, name in enumerate(("query", "key", "value"))}}
       for fn, out in _FUSED_ATTENTION_BACKWARDS.items()},
}


def _reject_complex(graph: Graph) -> None:
    """Complex tensors have no kernels here (the code generators know real dtypes only): say so
    before anything half-lowers them, so the graph runs eagerly under the fallback policy."""
    for node in [*graph.placeholders, *graph.call_nodes()]:
        metas = node.meta if isinstance(node.meta, (tuple, list)) else (node.meta,)
        if any(isinstance(m, TensorMeta) and m.dtype.is_complex for m in metas):
            raise CompileError(f"complex dtypes are not compiled ({node.name} is {_complex_dtype(metas)})",
                               stage="lower", op=getattr(node.target, "qualified_name", str(node.target)),
                               source_line=node.source_line or "")


def _complex_dtype(metas: Any) -> torch.dtype:
    return next(m.dtype for m in metas if isinstance(m, TensorMeta) and m.dtype.is_complex)


def _is_channels_last(shape: tuple[int, ...], stride: tuple[int, ...]) -> bool:
    return len(shape) == 4 and dense_in_order(shape, stride, (0, 2, 3, 1))


def _same_strides(shape: tuple[int, ...], a: tuple[int, ...], b: tuple[int, ...]) -> bool:
    """Equal layouts: strides agree wherever the size is not 1."""
    return len(a) == len(b) and all(size == 1 or x == y for size, x, y in zip(shape, a, b))


def _channels_last_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    _, c, h, w = shape
    return _dense_like(tuple(shape), (c * h * w, 1, w * c, c))


def _is_2d_convolution(node: Node) -> bool:
    """A 2-D convolution (or its backward, in a training step's backward graph) on a device
    where graphs run them channels-last."""
    fn = _fn_of(node)
    if fn in _CONVOLUTIONS:
        meta = node.meta
    elif fn in _CONVOLUTION_BACKWARDS and node.args and isinstance(node.args[0], Node):
        meta = node.args[0].meta        # the output gradient
    else:
        return False
    return isinstance(meta, TensorMeta) and meta.device.type in CHANNELS_LAST_DEVICES and len(meta.shape) == 4


def _is_pooling(fn: Any) -> bool:
    """2-D pooling Externs: on CUDA they return channels-last for a channels-last input."""
    return "pool2d" in getattr(fn, "__name__", "")


def _fn_of(node: Node) -> Any:
    return node.target.reference if isinstance(node.target, Prim) else node.target


def _matmul_operand_copy(shape: tuple, strides: tuple, position: int, other_shape: tuple) -> tuple | None:
    """None when a matmul reads this operand (``position`` 0 or 1) in place, else the strides of
    the copy it needs.  ATen reshapes a >= 3-D operand to 3-D (or, times a matrix, folds its rows
    into one mm when that is a view) and cuBLAS takes matrices whose one dim has a unit stride
    and whose other steps over it; anything else ATen copies.  The copy keeps the matrix dims'
    memory order, batch dims outermost.  Operands that ATen expands (batch shapes that differ)
    it copies anyway: left alone.  Decided on size hints: a wrong guess costs a copy, never a
    wrong result."""
    sizes, steps = tuple(hint_of(v) for v in shape), tuple(hint_of(v) for v in strides)
    if len(sizes) < 2:
        return None
    foldable_rows = len(sizes) >= 3 and len(other_shape) <= 2
    if foldable_rows and position == 1 or not foldable_rows and len(sizes) >= 3 and \
            tuple(map(hint_of, other_shape[:-2])) != sizes[:-2]:
        return None
    if _read_in_place(sizes, steps, len(sizes) - 2) or foldable_rows and _read_in_place(sizes, steps, len(sizes) - 1):
        return None
    order = sorted(range(len(sizes) - 2)) + sorted((len(sizes) - 2, len(sizes) - 1), key=lambda d: -steps[d])
    out, running = [0] * len(shape), 1
    for dim in reversed(order):
        out[dim] = running
        running = running * shape[dim]
    return tuple(out)


def _read_in_place(sizes: tuple, steps: tuple, merged: int) -> bool:
    """The first ``merged`` dims fold into one by a view, and the matrix left is one cuBLAS reads."""
    kept = [d for d in range(merged) if sizes[d] != 1]
    if not all(steps[a] == steps[b] * sizes[b] for a, b in zip(kept, kept[1:])):
        return False
    if merged == len(sizes) - 1:        # the rows were folded too: one (rows, k) matrix
        return _cublas_reads(math.prod(sizes[:-1]), sizes[-1], steps[kept[-1]] if kept else sizes[-1], steps[-1])
    return _cublas_reads(sizes[-2], sizes[-1], steps[-2], steps[-1])


def _cublas_reads(m: int, k: int, row_stride: int, column_stride: int) -> bool:
    """cuBLAS reads an (m, k) matrix in place: rows of unit stride, or columns (transposed),
    with the other stride stepping over a whole row (column)."""
    return (column_stride == 1 or k == 1) and row_stride >= max(k, 1) or \
        (row_stride == 1 or m == 1) and column_stride >= max(m, 1)


def _contiguous_dim_of_matrix(stride: tuple[int, ...]) -> int | None:
    """-1 for a row-major matrix (the last two dims of ``stride``), -2 for a column-major one."""
    last, before = stride[-1], stride[-2]
    if not is_symbolic(last) and last == 1:
        return -1
    return -2 if not is_symbolic(before) and before == 1 else None


def _dense_like(shape: tuple[int, ...], stride: tuple[int, ...]) -> tuple[int, ...]:
    """Dense strides with the dims in the order of ``stride`` (slowest first; ties keep dim order)."""
    order = sorted(range(len(shape)), key=lambda d: (-stride[d], d))
    out = [0] * len(shape)
    running = 1
    for dim in reversed(order):
        out[dim] = running
        running *= max(shape[dim], 1)
    return tuple(out)


_INT_RANGES = {dtype: (torch.iinfo(dtype).min, torch.iinfo(dtype).max)
               for dtype in (torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8)}
_EXACT_INT_BITS = {torch.float16: 11, torch.bfloat16: 8, torch.float32: 24, torch.float64: 53}
_COMPARE = {"ge": lambda a, b: (a[0] >= b[1], a[1] >= b[0]), "gt": lambda a, b: (a[0] > b[1], a[1] > b[0]),
            "le": lambda a, b: (a[1] <= b[0], a[0] <= b[1]), "lt": lambda a, b: (a[1] < b[0], a[0] < b[1]),
            "eq": lambda a, b: (a[0] == a[1] == b[0] == b[1], a[0] <= b[1] and b[0] <= a[1]),
            "ne": lambda a, b: (a[1] < b[0] or b[1] < a[0], not (a[0] == a[1] == b[0] == b[1]))}


def _value_range(expr: Expr, nodes: dict[str, ir.LoopNode], depth: int = 0) -> tuple[int, int] | None:
    """Integer bounds (lo, hi) of every value ``expr`` takes over its loop ranges (bools as 0/1), or
    None when unknown.  Only exact integer/bool arithmetic; anything else is unknown."""
    if depth > 64:
        return None
    rec = lambda e: _value_range(e, nodes, depth + 1)
    result: tuple[int, int] | None = None
    if isinstance(expr, Const):
        if isinstance(expr.value, bool) or isinstance(expr.value, int):
            result = (int(expr.value), int(expr.value))
        elif isinstance(expr.value, float) and expr.value.is_integer() and abs(expr.value) < 2 ** 24:
            result = (int(expr.value), int(expr.value))
    elif isinstance(expr, IndexValue):
        if next(ir.indirect_atoms(expr.index), None) is None:
            result = expr.index.bounds()
    elif isinstance(expr, Load):
        producer = nodes.get(expr.buffer)
        if isinstance(producer, ir.Pointwise) and len(producer.vars) == len(expr.index):
            result = rec(ir.substitute(producer.body, dict(zip(producer.vars, expr.index))))
        elif expr.dtype == torch.bool:
            result = (0, 1)
    elif isinstance(expr, Cast):
        inner = rec(expr.arg)
        if inner is not None and expr.dtype == torch.bool:
            lo, hi = inner
            result = (1, 1) if lo > 0 or hi < 0 else (0, 0) if lo == hi == 0 else (0, 1)
        elif inner is not None and not expr.arg.dtype.is_floating_point:
            result = inner   # integer -> integer / float: checked against the target's range below
    elif isinstance(expr, Op):
        ranges = [rec(a) for a in expr.args]
        if all(r is not None for r in ranges):
            op = expr.op
            if op in _COMPARE and len(ranges) == 2:
                always, maybe = _COMPARE[op](ranges[0], ranges[1])
                result = (1, 1) if always else (0, 1) if maybe else (0, 0)
            elif op in ("logical_and", "bitwise_and") and all(0 <= r[0] <= r[1] <= 1 for r in ranges):
                result = (min(r[0] for r in ranges), min(r[1] for r in ranges))
            elif op in ("logical_or", "bitwise_or") and all(0 <= r[0] <= r[1] <= 1 for r in ranges):
                result = (max(r[0] for r in ranges), max(r[1] for r in ranges))
            elif op == "logical_not" and 0 <= ranges[0][0] <= ranges[0][1] <= 1:
                result = (1 - ranges[0][1], 1 - ranges[0][0])
            elif op == "where":
                cond, a, b = ranges
                result = a if cond == (1, 1) else b if cond == (0, 0) else (min(a[0], b[0]), max(a[1], b[1]))
            elif op == "add":
                result = (ranges[0][0] + ranges[1][0], ranges[0][1] + ranges[1][1])
            elif op == "sub":
                result = (ranges[0][0] - ranges[1][1], ranges[0][1] - ranges[1][0])
            elif op == "neg":
                result = (-ranges[0][1], -ranges[0][0])
            elif op == "mul":
                products = [x * y for x in ranges[0] for y in ranges[1]]
                result = (min(products), max(products))
            elif op in ("maximum", "minimum"):
                pick = max if op == "maximum" else min
                result = (pick(ranges[0][0], ranges[1][0]), pick(ranges[0][1], ranges[1][1]))
    if result is None:
        return None
    dtype = expr.dtype
    if dtype == torch.bool:
        return result if 0 <= result[0] <= result[1] <= 1 else None
    if dtype in _INT_RANGES:
        lo, hi = _INT_RANGES[dtype]
        return result if lo <= result[0] and result[1] <= hi else None
    if dtype in _EXACT_INT_BITS:   # integers are exact in a float up to 2 ** (mantissa bits + 1)
        return result if max(abs(result[0]), abs(result[1])) <= 2 ** _EXACT_INT_BITS[dtype] else None
    return None


def _scalar_externs() -> dict[Any, torch.dtype]:
    try:
        from ember.prims.decompositions.random import draw_seed
    except ImportError:
        return {}
    return {draw_seed: torch.int64}


_SCALAR_EXTERNS = _scalar_externs()


def _storage_size(shape: tuple[int, ...], stride: tuple[int, ...]) -> int:
    if any(s == 0 for s in shape):
        return 0
    return 1 + sum((size - 1) * st for size, st in zip(shape, stride))


def _assumed_strides(node: ir.LoopNode, layouts: dict[str, tuple[int, ...]] | None = None) -> tuple[int, ...]:
    """The layout a node's buffer will have: inputs and extern results keep theirs, the scheduler
    gives every computed node its recorded layout (eager's strides) or else a contiguous buffer."""
    if isinstance(node, (ir.InputBuffer, ir.ExternOutput)):
        return node.stride
    if layouts and node.name in layouts:
        return layouts[node.name]
    return ir.contiguous_strides(node.shape)


def _describe(node: Node) -> str:
    target = getattr(node.target, "qualified_name", getattr(node.target, "__name__", str(node.target)))
    return f"{target} ({node.name})"


def _operand(value: Any, idx: tuple[Index, ...], dtype: torch.dtype) -> Expr:
    if isinstance(value, TensorValue):
        expr = value.load(idx[len(idx) - len(value.shape):] if value.shape else ())
        return expr if value.dtype == dtype else Cast(expr, dtype)
    if isinstance(value, bool) or dtype == torch.bool:
        return Const(bool(value), torch.bool)
    if is_symbolic(value):      # a size used as a number (a mean's divisor): read at run time
        return IndexValue(ir.const_index(value), dtype)
    if dtype.is_floating_point:
        return Const(float(value), dtype)
    return Const(int(value), dtype)


def _meta(node: Node) -> TensorMeta:
    assert isinstance(node.meta, TensorMeta), f"{node.name} has no tensor meta"
    return node.meta


# =============================================================== elementwise
def _elementwise(name: str):
    def lower(self: _Lowering, node: Node, *args: Any, **kwargs: Any) -> TensorValue:
        meta = _meta(node)
        tensors = [a for a in args if isinstance(a, TensorValue)]
        in_dtype = tensors[0].dtype if tensors else meta.dtype

        def body(idx: tuple[Index, ...]) -> Expr:
            value = Op(name, tuple(_operand(a, idx, in_dtype) for a in args), meta.dtype)
            if meta.dtype in (torch.float16, torch.bfloat16):
                # eager rounds every fp16/bf16 op's result; a fused consumer must see the rounded
                # value too (tanh(x) == x, floor(a * b) differ otherwise), not the fp32 one
                value = Cast(Cast(value, torch.float32), meta.dtype)
            return value
        return self.pointwise(node, meta.shape, meta.dtype, body)
    return lower


def _where(self: _Lowering, node: Node, cond: Any, a: Any, b: Any) -> TensorValue:
    meta = _meta(node)
    return self.pointwise(node, meta.shape, meta.dtype, lambda idx: Op(
        "where", (_operand(cond, idx, torch.bool), _operand(a, idx, meta.dtype), _operand(b, idx, meta.dtype)),
        meta.dtype))


def _convert(self: _Lowering, node: Node, x: Any, dtype: torch.dtype) -> TensorValue:
    meta = _meta(node)
    return self.pointwise(node, meta.shape, dtype, lambda idx: Cast(_operand(x, idx, x.dtype), dtype))


# ===================================================================== views
def _view(value: TensorValue, shape: tuple[int, ...], index_map: Callable[[tuple[Index, ...]], tuple[Index, ...]],
          dtype: torch.dtype | None = None) -> TensorValue:
    base = value
    return TensorValue(shape, dtype or value.dtype, lambda idx: base.load(index_map(idx)))


def _reshape(self: _Lowering, node: Node, x: TensorValue, shape: Any) -> TensorValue:
    new_shape = tuple(as_size(s) for s in _meta(node).shape)
    return _view(x, new_shape, lambda idx: reshape_index(idx, new_shape, x.shape))


def reshape_index(idx: tuple[Index, ...], new_shape: tuple[int, ...], old_shape: tuple[int, ...]) -> tuple[Index, ...]:
    """Map an index of the reshaped tensor to the original, group by group (no division when dims line up)."""
    if 0 in new_shape or 0 in old_shape:   # empty: no element is ever loaded (and sizes never group up)
        return tuple(ir.const_index(0) for _ in old_shape)
    out: list[Index] = []
    i = j = 0
    while i < len(new_shape) or j < len(old_shape):
        # take the smallest runs of dims on both sides with equal products
        gi, gj = [i], [j]
        pi = new_shape[i] if i < len(new_shape) else 1
        pj = old_shape[j] if j < len(old_shape) else 1
        while pi != pj:
            if pi < pj:
                i += 1
                gi.append(i)
                pi *= new_shape[i]
            else:
                j += 1
                gj.append(j)
                pj *= old_shape[j]
        # absorb trailing size-1 dims into the group
        i, j = i + 1, j + 1
        new_dims = [d for d in gi if d < len(new_shape)]
        old_dims = [d for d in gj if d < len(old_shape)]
        if len(new_dims) == 1 and len(old_dims) == 1:
            out.append(idx[new_dims[0]])
        else:
            flat = ir.linearize([idx[d] for d in new_dims], [new_shape[d] for d in new_dims])
            out.extend(ir.delinearize(flat, [old_shape[d] for d in old_dims]))
    return tuple(out[:len(old_shape)])


def _permute(self: _Lowering, node: Node, x: TensorValue, dims: Any) -> TensorValue:
    dims = [int(d) % max(len(x.shape), 1) for d in dims]
    inverse = [0] * len(dims)
    for out_pos, in_dim in enumerate(dims):
        inverse[in_dim] = out_pos
    return _view(x, tuple(x.shape[d] for d in dims), lambda idx: tuple(idx[inverse[k]] for k in range(len(dims))))


def _expand(self: _Lowering, node: Node, x: TensorValue, shape: Any) -> TensorValue:
    new_shape = tuple(as_size(s) for s in _meta(node).shape)
    lead = len(new_shape) - len(x.shape)
    return _view(x, new_shape, lambda idx: tuple(
        ir.const_index(0) if x.shape[k] == 1 and new_shape[lead + k] != 1 else idx[lead + k]
        for k in range(len(x.shape))))


def _slice(self: _Lowering, node: Node, x: TensorValue, dim: int, start: int, end: int, step: int = 1) -> TensorValue:
    new_shape = tuple(as_size(s) for s in _meta(node).shape)
    dim = dim % len(x.shape)
    return _view(x, new_shape, lambda idx: idx[:dim] + (idx[dim] * as_size(step) + as_size(start),) + idx[dim + 1:])


def _as_strided(self: _Lowering, node: Node, x: TensorValue, size: Any, stride: Any, storage_offset: int = 0) -> TensorValue:
    meta = _meta(node)
    size, stride = tuple(as_size(s) for s in meta.shape), tuple(as_size(s) for s in meta.stride)
    offset = as_size(meta.storage_offset)
    base = self.nodes.get(x.node_name) if x.node_name else None
    if isinstance(base, ir.InputBuffer) and base.alias_of is None:
        # index the input's storage directly, relative to its data pointer
        storage = self._storage_alias(base)
        delta = offset - base.storage_offset
        return _view(storage, size, lambda idx: (sum((i * s for i, s in zip(idx, stride)), ir.const_index(delta)),))
    # a computed value's storage is its buffer layout (eager's strides when recorded, else contiguous)
    layout = self.layouts.get(x.node_name) if x.node_name else None
    if layout is not None:
        order = sorted(range(len(x.shape)), key=lambda d: (-layout[d], -x.shape[d]))  # slowest first

        def storage_index(idx: tuple[Index, ...]) -> tuple[Index, ...]:
            parts = ir.delinearize(sum((i * s for i, s in zip(idx, stride)), ir.const_index(offset)),
                                   [x.shape[d] for d in order])
            out = [ir.const_index(0)] * len(x.shape)
            for d, part in zip(order, parts):
                out[d] = part
            return tuple(out)
        return _view(x, size, storage_index)
    return _view(x, size, lambda idx: ir.delinearize(
        sum((i * s for i, s in zip(idx, stride)), ir.const_index(offset)), x.shape))


def _storage_alias(self: _Lowering, base: ir.InputBuffer) -> TensorValue:
    name = f"{base.name}_storage"
    if name not in self.nodes:
        self.nodes[name] = ir.InputBuffer(name, (1 << 62,), base.dtype, (1,), base.storage_offset, base.position,
                                          alias_of=base.name)
    dtype = base.dtype
    return TensorValue((1 << 62,), dtype, lambda idx: Load(name, idx, dtype))


_Lowering._storage_alias = _storage_alias


# ================================================================ reductions
_REDUCTION_NAMES = {"sum": "sum", "prod": "prod", "amax": "max", "amin": "min"}


def _reduction(self: _Lowering, node: Node, x: TensorValue, dims: Any, reduction_type: str,
               name: str | None = None, correction: float = 0.0, dtype: torch.dtype | None = None) -> TensorValue:
    dims = tuple(sorted(int(d) % max(len(x.shape), 1) for d in dims)) if dims is not None else tuple(range(len(x.shape)))
    kept = [d for d in range(len(x.shape)) if d not in dims]
    vars_ = ir.make_vars("x", [x.shape[d] for d in kept])
    rvars = ir.make_vars("r", [x.shape[d] for d in dims])
    idx: list[Index] = [ir.const_index(0)] * len(x.shape)
    for d, v in zip(kept, vars_):
        idx[d] = ir.index(v)
    for d, v in zip(dims, rvars):
        idx[d] = ir.index(v)
    body = x.load(tuple(idx))
    return self.add(ir.Reduction(name or node.name, tuple(v.size for v in vars_), dtype or x.dtype, vars_, rvars,
                                 reduction_type, body, float(correction), _describe(node)))


def _simple_reduction(prim_name: str):
    def lower(self: _Lowering, node: Node, x: TensorValue, dims: Any) -> TensorValue:
        if dims is not None and len(tuple(dims)) == 0:
            return self.pointwise(node, x.shape, x.dtype, lambda idx: x.load(idx))
        return _reduction(self, node, x, dims, _REDUCTION_NAMES[prim_name], dtype=_meta(node).dtype)
    return lower


def _arg_reduction(kind: str):
    def lower(self: _Lowering, node: Node, x: TensorValue, dim: Any = None) -> TensorValue:
        if dim is None:
            flat = _view(x, (math.prod(x.shape),), lambda idx: ir.delinearize(idx[0], x.shape) if x.shape else ())
            return _reduction(self, node, flat, (0,), kind, dtype=torch.int64)
        if not x.shape:  # 0-dim: the answer is 0
            return self.pointwise(node, (), torch.int64, lambda idx: Const(0, torch.int64))
        return _reduction(self, node, x, (dim,), kind, dtype=torch.int64)
    return lower


def _var_mean(self: _Lowering, node: Node, x: TensorValue, dims: Any, correction: float = 0,
              whole: bool = False) -> tuple:
    var = _reduction(self, node, x, dims, "welford_var", f"{node.name}_var", correction)
    mean = _reduction(self, node, x, dims, "welford_mean", f"{node.name}_mean")
    return (var, mean)


# ================================================================= creation
def _iota(self: _Lowering, node: Node, length: int, start: int, step: int, dtype: torch.dtype, device: Any) -> TensorValue:
    return self.pointwise(node, (as_size(length),), dtype, lambda idx: IndexValue(idx[0] * as_size(step) + as_size(start), dtype)
                          if isinstance(step, int) and isinstance(start, int) else
                          Op("add", (Op("mul", (IndexValue(idx[0], dtype), Const(step, dtype)), dtype),
                                     Const(start, dtype)), dtype))


def _full(self: _Lowering, node: Node, shape: Any, value: Any, dtype: torch.dtype, device: Any,
          stride: Any = None) -> TensorValue:
    # the tensor holds the number rounded to its dtype; a Const of that dtype is read as the
    # unrounded number (a Python scalar operand is, in eager's float math): round it here
    value = rounded_to(value, dtype)
    return self.pointwise(node, tuple(_meta(node).shape), dtype, lambda idx: _operand(value, idx, dtype))


# Externs whose results are always fresh tensors (never a view of an argument)
_FRESH_RESULT_EXTERNS = {torch.mm, torch.bmm, torch.matmul, torch.addmm, torch.baddbmm, torch.nn.functional.linear,
                         *_ATTENTION, *_FUSED_ATTENTION_FORWARDS, *_CONVOLUTIONS}


def _read_only_by(value: Any, reader: Node) -> bool:
    """Is ``reader`` the one user of ``value`` and of the views between it and the Extern result
    it views?  Only then may a copy of it be the result itself: ``mm(a, b).clone()`` returned
    with the product (or a product read again later) must be a buffer of its own."""
    user = reader
    while isinstance(value, Node):
        if list(value.users) != [user]:
            return False
        viewing = value.op == "call" and isinstance(value.target, Prim) and value.target.kind == "view"
        if not viewing:
            return True              # the Extern, or the getitem picking one of its results
        value, user = value.args[0], value
    return False


def _clone(self: _Lowering, node: Node, x: TensorValue) -> TensorValue:
    """A copy, unless ``x`` already views all of a fresh Extern result in the copy's layout: then
    ``x`` itself.  CPU attention writes (B, T, H, D), so ``y.transpose(1, 2).contiguous()`` is
    eager's no-op, where the prim graph (meta device: (B, H, T, D)) asked for a copy."""
    vars_ = ir.make_vars("x", x.shape)
    body = x.load(tuple(ir.index(v) for v in vars_))
    base = self.nodes.get(body.buffer) if isinstance(body, Load) else None
    meta = node.meta
    if not isinstance(base, ir.ExternOutput) or not isinstance(meta, TensorMeta) or body.dtype != base.dtype or \
            not _read_only_by(node.args[0], node) or \
            getattr(self.nodes.get(base.extern), "fn", None) not in _FRESH_RESULT_EXTERNS or \
            any(is_symbolic(s) for s in (*x.shape, *base.shape)) or math.prod(x.shape) != math.prod(base.shape):
        return self.pointwise(node, x.shape, x.dtype, x.load)
    layout = ir.strided_layout(body.index, vars_, base.shape, base.stride)
    if layout is None or layout[1] != 0 or not _same_strides(x.shape, layout[0], tuple(meta.stride)):
        return self.pointwise(node, x.shape, x.dtype, x.load)
    return x


_LOWERINGS: dict[str, Callable[..., Any]] = {
    **{name: _elementwise(name) for name in list(UNARY) + list(BINARY)},
    "where": _where, "convert_element_type": _convert,
    "reshape": _reshape, "permute": _permute, "expand": _expand, "slice": _slice, "as_strided": _as_strided,
    "detach": lambda self, node, x: x,
    "sum": _simple_reduction("sum"), "prod": _simple_reduction("prod"),
    "amax": _simple_reduction("amax"), "amin": _simple_reduction("amin"),
    "argmax": _arg_reduction("argmax"), "argmin": _arg_reduction("argmin"), "var_mean": _var_mean,
    "iota": _iota, "full": _full, "clone": _clone,
}
_LOWERINGS.update(lower_indexing.LOWERINGS)
