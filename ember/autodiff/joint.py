"""The joint graph: the forward prim graph followed by its backward, in one Graph.

    joint = build_joint(prim_graph)

The forward nodes are copied unchanged.  A tangent placeholder (the incoming gradient) is
added for every differentiable output, and the VJP rules (rules.py) emit, in reverse order of
the forward nodes, the gradient of every value that needs one.  The outputs of the joint graph
are the forward outputs followed by one gradient per input that requires grad.

What differentiates: placeholders whose meta requires grad, and every floating-point value
computed from one, except through ``prims.detach`` (x.detach(), ops under no_grad; see
prims/convert.py ``_gradient_boundary``).  Write-backs of mutated inputs (BatchNorm running
stats) are not differentiable outputs: eager updates them outside autograd.
"""
from __future__ import annotations

import dataclasses
import operator
from typing import Any

from ember.autodiff import rules
from ember.autodiff.extern_rules import autograd_vjp, rerun_is_exact, rule_for
from ember.autodiff.patterns import pattern_vjp
from ember.autodiff import prim_rules  # noqa: F401  (fills the registry)
from ember.errors import CompileError
from ember.graph import Graph, Node, TensorMeta, ancestors, contiguous_strides, target_name
from ember.symbolic import known_equal, known_equal_sizes
from ember.prims import ops
from ember.prims import primitives as P
from ember.prims.primitives import Prim
from ember.prims.values import Emitter, Value, building, emit


@dataclasses.dataclass
class Joint:
    graph: Graph
    primals: list[Node]               # the forward placeholders, in order
    tangents: list[Node]              # one per differentiable output
    differentiable_outputs: list[int]  # forward output positions that get a tangent
    num_forward_outputs: int
    grad_inputs: list[int]            # placeholder positions that get a gradient (joint outputs after the forward's)
    # for each of grad_inputs: the tangents (indices into `tangents`) it is reached from; when autograd
    # hands none of them, eager leaves that input's .grad alone (None), not zeros
    grad_sources: list[frozenset[int]] = dataclasses.field(default_factory=list)


def differentiable_meta(meta: Any) -> bool:
    return isinstance(meta, TensorMeta) and (meta.dtype.is_floating_point or meta.dtype.is_complex)


def needs_grad(graph: Graph) -> dict[Node, bool]:
    """Which values of a prim graph depend differentiably on an input that requires grad."""
    needs: dict[Node, bool] = {}
    for node in graph.nodes:
        if node.op == "placeholder":
            needs[node] = differentiable_meta(node.meta) and node.meta.requires_grad
        elif node.op == "call":
            if node.target is P.detach:
                needs[node] = False
            elif node.target is operator.getitem:
                needs[node] = needs.get(node.args[0], False) and differentiable_meta(node.meta)
            else:
                metas = node.meta if isinstance(node.meta, tuple) else (node.meta,)
                needs[node] = any(differentiable_meta(m) for m in metas) and \
                    any(needs.get(i, False) for i in node.inputs())
    return needs


def differentiable_outputs(graph: Graph, needs: dict[Node, bool]) -> list[int]:
    """Output positions that autograd sees as differentiable: not write-backs of mutated inputs,
    not outputs the wrapper replaces by an input (or a view of one), and needing grad."""
    mutated = {o for _, o in graph.extra.get("mutated_inputs", [])}
    replaced = set(graph.extra.get("output_aliases", {})) | \
        {i for i, s in graph.extra.get("output_sources", {}).items() if s[0] in ("input", "input_view", "output")}
    eager_requires = _eager_requires_grad(graph)
    return [i for i, value in enumerate(graph.outputs)
            if i not in mutated and i not in replaced and isinstance(value, Node) and
            eager_requires.get(i, needs.get(value, False)) and differentiable_meta(value.meta)]


def _eager_requires_grad(graph: Graph) -> dict[int, bool]:
    """Whether eager's user outputs require grad (capture's metas): eager marks some outputs
    non-differentiable (layer_norm's mean and rstd), and others require grad with a zero gradient
    (x.sign())."""
    torch_graph = graph.extra.get("_torch_graph")
    if torch_graph is None:
        return {}
    requires = {i: value.meta.requires_grad for i, value in enumerate(torch_graph.outputs)
                if isinstance(value, Node) and isinstance(value.meta, TensorMeta)}
    # an output returned as a view of another (x.sign().split(2)[-1]): when that base is an extra
    # output of the prim graph, it requires grad as its views do (the views are made of it)
    view_requires: dict[int, bool] = {}
    for index, source in graph.extra.get("output_sources", {}).items():
        if source[0] == "view" and index in requires and source[1] not in requires:
            view_requires[source[1]] = view_requires.get(source[1], False) or requires[index]
    return {**requires, **view_requires}


def build_joint(prim_graph: Graph) -> Joint:
    graph, mapping = prim_graph.copy()
    needs = needs_grad(graph)
    primals = graph.placeholders
    outputs = list(graph.outputs)
    diff_outputs = differentiable_outputs(graph, needs)
    emitter = Emitter(graph)
    grads: dict[Node, Any] = {}
    tangents = []
    with building(emitter):
        for position in diff_outputs:
            node = outputs[position]
            meta = dataclasses.replace(node.meta, stride=contiguous_strides(node.meta.shape), storage_offset=0,
                                       requires_grad=False)
            tangent = graph.placeholder(f"tangent_{position}", meta)
            tangents.append(tangent)
            _accumulate(grads, node, Value(tangent, meta))
        forward_nodes = [n for n in graph.nodes if n.op == "call"]
        for node in reversed(forward_nodes):
            grad = grads.pop(node, None)
            if grad is None or not needs.get(node, False):
                continue
            emitter.source_line = node.source_line
            pattern = pattern_vjp(node, grad)
            if pattern is not None:     # softmax, log_softmax: from their output, as eager
                _accumulate_input(grads, pattern[0], pattern[1], needs, node)
                continue
            _backpropagate(graph, node, grad, grads, needs)
        grad_inputs = [i for i, p in enumerate(primals) if needs[p]]
        used = _ancestors([outputs[i] for i in diff_outputs])
        input_grads = []
        for i in grad_inputs:
            grad = grads.get(primals[i])
            if grad is None and primals[i] in used:
                # reached only through ops whose derivative is zero (sign, round): eager's grad is zeros
                meta = primals[i].meta
                grad = ops.full(meta.shape, 0, meta.dtype, meta.device)
            input_grads.append(None if grad is None else _exact_meta(grad, primals[i].meta).node)
    forward_outputs = outputs
    graph.output_node.args = ((*forward_outputs, *input_grads),)
    for value in input_grads:
        if isinstance(value, Node):
            value.users[graph.output_node] = None
    graph.eliminate_dead_code(lambda node: False)
    reached = [_ancestors([outputs[i]]) for i in diff_outputs]
    grad_sources = [frozenset(k for k, ancestors in enumerate(reached) if primals[i] in ancestors)
                    for i in grad_inputs]
    return Joint(graph, primals, tangents, diff_outputs, len(forward_outputs), grad_inputs, grad_sources)


def _ancestors(values: list[Node]) -> set[Node]:
    """Values these depend on, not through prims.detach (eager's autograd does not see past it)."""
    return ancestors(values, follow=lambda node: node.target is not P.detach)


def _accumulate(grads: dict[Node, Any], node: Node, grad: Any) -> None:
    if grad is None:
        return
    previous = grads.get(node)
    if previous is None:
        grads[node] = grad
    elif isinstance(previous, list):         # a multi-output node: one slot per element
        index, value = grad
        previous[index] = value if previous[index] is None else _sum(previous[index], value)
    else:
        grads[node] = _sum(previous, grad)


def _sum(a: Value, b: Value) -> Value:
    return _joined_pads(a, b) or ops.add(a, b)


def _joined_pads(a: Value, b: Value) -> Value | None:
    """The sum of two zero-pads that fill adjacent ranges of one dim, as one pad of their cat.
    The gradients of q, k and v split off one projection (``x.split``, ``unbind``) arrive as three
    pads of the projection's shape; added, every element read all three and rounded twice
    (nanoGPT's q/k/v gradient assembly: 23 us against a 12.6 us floor).  A cat reads each element
    once."""
    pads = [_zero_pad(v) for v in (a, b)]
    if None in pads or a.dtype != b.dtype or not known_equal_sizes(a.shape, b.shape):
        return None
    (first, first_pad), (second, second_pad) = pads
    differing = [k for k in range(a.ndim) if not (known_equal(first_pad[2 * k], second_pad[2 * k]) and
                                                  known_equal(first_pad[2 * k + 1], second_pad[2 * k + 1]))]
    if len(differing) != 1:
        return None
    k = differing[0]
    dim = a.ndim - 1 - k
    if known_equal(second_pad[2 * k] + second.meta.shape[dim], first_pad[2 * k]):
        (first, first_pad), (second, second_pad) = (second, second_pad), (first, first_pad)
    if not known_equal(first_pad[2 * k] + first.meta.shape[dim], second_pad[2 * k]):
        return None         # a gap between them (or an overlap): an add
    parts = [part for value in (first, second) for part in _cat_parts(value, dim)]
    joined = emit(P.cat, [Value(n, n.meta) for n in parts], dim)
    pad = list(first_pad)
    pad[2 * k + 1] = second_pad[2 * k + 1]
    if all(known_equal(p, 0) for p in pad):
        return joined
    return emit(P.constant_pad, joined, pad, 0.0)


def _zero_pad(value: Value) -> tuple[Node, list[Any]] | None:
    """(x, pads of every dim, last dim first) when value is a constant_pad of x with zeros that
    crops nothing."""
    node = value.node
    if node.target is not P.constant_pad or len(node.args) != 3 or \
            not isinstance(node.args[2], (int, float)) or node.args[2] != 0:
        return None
    x, pad = node.args[0], list(node.args[1])
    pad += [0] * (2 * value.ndim - len(pad))
    if not all(isinstance(p, int) and p >= 0 for p in pad):
        return None
    return x, pad


def _cat_parts(node: Node, dim: int) -> list[Node]:
    """A cat's parts along dim (so pads joined twice make one cat of three), else the node."""
    if node.target is P.cat and node.args[1] % len(node.meta.shape) == dim:
        return list(node.args[0])
    return [node]


def _backpropagate(graph: Graph, node: Node, grad: Any, grads: dict[Node, Any], needs: dict[Node, bool]) -> None:
    """Apply node's VJP rule and accumulate the gradients of its inputs."""
    if node.target is operator.getitem:
        container, index = node.args
        slots = grads.setdefault(container, [None] * len(container.meta))
        if not isinstance(slots, list):
            raise CompileError("getitem of a value with a single gradient", stage="autodiff")
        _accumulate(grads, container, (index, grad))
        return
    target = node.target
    if isinstance(target, Prim):
        rule = rules.PRIM_RULES.get(target.name)
        if rule is None:
            raise CompileError(f"no VJP rule for {target.qualified_name}", stage="autodiff",
                               op=target.qualified_name, source_line=node.source_line or "")
    else:
        if not rerun_is_exact(target, node.args, node.kwargs):
            raise CompileError(f"{target_name(target)} draws random numbers and has no VJP rule",
                               stage="autodiff", op=target_name(target), source_line=node.source_line or "")
        rule = rule_for(target)
    if any(_arg_needs(v, needs) for v in node.kwargs.values()):
        _backpropagate_keywords(graph, node, grad, grads, needs)
        return
    args = _values(node.args)
    kwargs = _values(node.kwargs)
    out = _output_values(graph, node, grad)
    if isinstance(grad, list):
        grad = tuple(grad)
    rules._NEEDS.append(tuple(_arg_needs(a, needs) for a in node.args))
    try:
        arg_grads = rule(grad, out, *args, **kwargs)
    finally:
        rules._NEEDS.pop()
    if len(arg_grads) != len(node.args):
        raise CompileError(f"VJP rule of {target_name(target)} returned {len(arg_grads)} gradients for "
                           f"{len(node.args)} arguments", stage="autodiff", op=target_name(target))
    _accumulate_inputs(grads, node.args, arg_grads, needs, node)


class _KeywordsLast:
    """``target`` with its keyword arguments passed positionally after the others, so that the
    generic autograd rule differentiates them too (rules give gradients to positional ones only)."""

    def __init__(self, target: Any, count: int, keys: tuple[str, ...]) -> None:
        self.target, self.count, self.keys = target, count, keys
        self.__name__ = target_name(target)

    def __call__(self, *values: Any) -> Any:
        return self.target(*values[:self.count], **dict(zip(self.keys, values[self.count:])))


def _backpropagate_keywords(graph: Graph, node: Node, grad: Any, grads: dict[Node, Any],
                            needs: dict[Node, bool]) -> None:
    """An Extern with a keyword tensor that needs a gradient (``F.conv2d(x, w, bias=b)``)."""
    if isinstance(node.target, Prim):
        raise CompileError(f"{node.target.qualified_name} takes a tensor by keyword", stage="autodiff")
    keys = tuple(node.kwargs)
    positional = (*node.args, *node.kwargs.values())
    call = _KeywordsLast(node.target, len(node.args), keys)
    rules._NEEDS.append(tuple(_arg_needs(a, needs) for a in positional))
    try:
        arg_grads = autograd_vjp(call)(tuple(grad) if isinstance(grad, list) else grad,
                                       _output_values(graph, node, grad), *_values(positional))
    finally:
        rules._NEEDS.pop()
    _accumulate_inputs(grads, positional, arg_grads, needs, node)


def _accumulate_inputs(grads: dict[Node, Any], args: tuple, arg_grads: tuple, needs: dict[Node, bool],
                       user: Node) -> None:
    for arg, arg_grad in zip(args, arg_grads):
        if isinstance(arg, (list, tuple)) and isinstance(arg_grad, (list, tuple)):
            for item, item_grad in zip(arg, arg_grad):
                _accumulate_input(grads, item, item_grad, needs, user)
        else:
            _accumulate_input(grads, arg, arg_grad, needs, user)


def _accumulate_input(grads: dict[Node, Any], arg: Any, grad: Any, needs: dict[Node, bool], user: Node) -> None:
    if not isinstance(arg, Node) or grad is None or not needs.get(arg, False):
        return
    if not isinstance(grad, Value) or not grad.is_tensor:
        raise CompileError(f"VJP rule of {target_name(user.target)} returned {grad!r}", stage="autodiff")
    _accumulate(grads, arg, _exact_meta(grad, arg.meta))


def _exact_meta(grad: Value, meta: TensorMeta) -> Value:
    """A gradient has its input's shape and dtype (a rule may leave a broadcast or promotion)."""
    if tuple(grad.shape) != tuple(meta.shape):
        grad = sum_to(grad, tuple(meta.shape))
        if tuple(grad.shape) != tuple(meta.shape):
            raise CompileError(f"gradient of shape {tuple(grad.shape)} for a value of shape {tuple(meta.shape)}",
                               stage="autodiff")
    if grad.dtype != meta.dtype:
        grad = ops.cast(grad, meta.dtype)
    return grad


def sum_to(grad: Value, shape: tuple) -> Value:
    """Reduce a broadcast gradient to ``shape`` (leading dims, then size-1 dims), as autograd does."""
    lead = grad.ndim - len(shape)
    if lead < 0:
        return grad
    dims = list(range(lead)) + [lead + i for i, size in enumerate(shape)
                                if size == 1 and grad.shape[lead + i] != 1]
    if dims:
        grad = ops.sum(grad, dims)
    return ops.reshape(grad, shape) if tuple(grad.shape) != tuple(shape) else grad


def _arg_needs(arg: Any, needs: dict[Node, bool]) -> bool:
    if isinstance(arg, Node):
        return needs.get(arg, False)
    if isinstance(arg, (list, tuple)):
        return any(_arg_needs(a, needs) for a in arg)
    return False


def _values(value: Any) -> Any:
    if isinstance(value, Node):
        if isinstance(value.meta, TensorMeta):
            return Value(value, value.meta)
        return Value(value, None, pytype=float)
    if isinstance(value, tuple):
        return tuple(_values(v) for v in value)
    if isinstance(value, list):
        return [_values(v) for v in value]
    if isinstance(value, dict):
        return {k: _values(v) for k, v in value.items()}
    return value


def _output_values(graph: Graph, node: Node, grad: Any) -> Any:
    """The forward output as rules see it: a Value, or a tuple of Values (one getitem each)."""
    if not isinstance(node.meta, tuple):
        return Value(node, node.meta)
    items: dict[int, Node] = {u.args[1]: u for u in node.users if u.target is operator.getitem}
    values = []
    for index, meta in enumerate(node.meta):
        item = items.get(index)
        if item is None:
            item = graph.call(operator.getitem, (node, index), {}, meta, name=f"{node.name}_{index}")
        values.append(Value(item, meta) if isinstance(meta, TensorMeta) else None)
    return tuple(values)

