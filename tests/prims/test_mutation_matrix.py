"""Mutation through views, compiled (ember.compile, CPU C++ path) vs eager: every view op x in-place
ops, applied to a view of an input and of an intermediate, then reading the base, the view and
another view of the same base.  Outputs and the inputs after the call must equal eager's, over two
calls with different inputs.  Also: aliased arguments (one tensor twice, overlapping views of one
storage), setitem forms, in-place buffer updates (BatchNorm running stats), writes eager rejects.

The in-place ops of one (view, base) pair run in ONE compiled function (one g++ build), each on
its own input; a mismatch names the in-place op it came from.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch

import ember
from ember.backend import compile_graph

F = torch.nn.functional

# view ops on a (4, 6) base
VIEWS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "split": lambda t: t.split(2)[1],
    "chunk": lambda t: t.chunk(3, dim=1)[0],
    "unbind": lambda t: t.unbind(0)[2],
    "tensor_split": lambda t: t.tensor_split(3, dim=1)[1],
    "diagonal": lambda t: t.diagonal(),
    "diagonal_offset": lambda t: t.diagonal(1),
    "unfold": lambda t: t.unfold(1, 2, 2),
    "as_strided": lambda t: t.as_strided((2, 3), (6, 2), 1),
    "select": lambda t: t.select(1, 2),
    "getitem_int": lambda t: t[1],
    "getitem_slices": lambda t: t[1:, 1:5:2],
    "getitem_none": lambda t: t[..., None, 2],
    "narrow": lambda t: t.narrow(1, 1, 3),
    "transpose": lambda t: t.transpose(0, 1),
    "t": lambda t: t.t(),
    "T": lambda t: t.T,
    "permute": lambda t: t.permute(1, 0),
    "view": lambda t: t.view(2, 12),
    "reshape": lambda t: t.reshape(8, 3),
    "flatten": lambda t: t.flatten(),
    "unsqueeze": lambda t: t.unsqueeze(1),
    "squeeze": lambda t: t[None].squeeze(0),
    "unflatten": lambda t: t.unflatten(1, (2, 3)),
    "movedim": lambda t: t.movedim(0, 1),
    "view_as": lambda t: t.view_as(t),
    "detach": lambda t: t.detach(),
    "expand_size1": lambda t: t[:1].expand(1, 6),
    "view_of_view": lambda t: t.t()[1:4].diagonal(),
    "split_of_t": lambda t: t.t().split(2)[1],
}


def _setitem(v: torch.Tensor) -> None:
    v[0] = 7.0


def _setitem_mask(v: torch.Tensor) -> None:
    v[v > 0.5] = 0.25


def _iadd(v: torch.Tensor) -> None:
    v += 1


INPLACE: dict[str, Callable[[torch.Tensor], Any]] = {
    "add_": lambda v: v.add_(1),
    "mul_": lambda v: v.mul_(2),
    "copy_": lambda v: v.copy_(v * -1 + 0.5),
    "fill_": lambda v: v.fill_(3.0),
    "zero_": lambda v: v.zero_(),
    "setitem": _setitem,
    "setitem_mask": _setitem_mask,
    "iadd": _iadd,
    "clamp_": lambda v: v.clamp_(-0.5, 0.5),
    "addcmul_": lambda v: v.addcmul_(v, v, value=0.5),
    "masked_fill_": lambda v: v.masked_fill_(v > 0, -1.0),
    "silu_inplace": lambda v: F.silu(v, inplace=True),
}


def program(view: Callable, base_kind: str) -> Callable:
    """fn(*inputs): in-place op k on a view of input k (or of an intermediate made from it)."""
    ops = list(INPLACE.values())

    def fn(*xs: torch.Tensor) -> tuple:
        outs = []
        for x, op in zip(xs, ops):
            base = x if base_kind == "input" else x * 1.5
            v = view(base)
            op(v)
            outs += [base + 0, v + 0, base.flatten()[::5] + 0]
        return tuple(outs)
    return fn


class Recorder:
    """An "ember" backend that remembers whether each graph was compiled or run eagerly."""

    def __init__(self, options: dict | None = None) -> None:
        self.options = options or {}
        self.eager_reasons: list[str] = []

    def __call__(self, graph: Any, example_inputs: list) -> Any:
        compiled = compile_graph(graph, example_inputs, self.options)
        source = getattr(compiled, "source", "")
        if source.startswith("# eager"):
            self.eager_reasons.append(source.splitlines()[0])
        return compiled


def compare(fn: Callable, make_inputs: Callable[[int], list], labels: list[str] | None = None,
            options: dict | None = None, calls: int = 2, fullgraph: bool = True) -> Recorder:
    """Compile fn, call it `calls` times on fresh inputs; outputs and inputs-after must equal eager's."""
    recorder = Recorder(options)
    compiled = ember.compile(fn, backend=recorder, fullgraph=fullgraph)
    for call in range(calls):
        inputs = make_inputs(call)
        eager_inputs = [x.clone() for x in inputs]
        ember_inputs = [x.clone() for x in inputs]
        expected = fn(*eager_inputs)
        actual = compiled(*ember_inputs)
        expected = expected if isinstance(expected, tuple) else (expected,)
        actual = actual if isinstance(actual, tuple) else (actual,)
        assert len(actual) == len(expected)
        for index, (a, e) in enumerate(zip(actual, expected)):
            where = labels[index // 3] if labels else str(index)
            torch.testing.assert_close(a, e, msg=lambda m, w=where, i=index: f"call {call}, {w}, output {i}: {m}")
        for index, (a, e) in enumerate(zip(ember_inputs, eager_inputs)):
            where = labels[index] if labels else str(index)
            torch.testing.assert_close(a, e, msg=lambda m, w=where: f"call {call}, {w}, input after the call: {m}")
    return recorder


# views whose writes eager itself does element by element over overlapping memory: none here;
# the overlapping cases are tested below and must run eagerly
@pytest.mark.parametrize("base_kind", ["input", "intermediate"])
@pytest.mark.parametrize("view_name", list(VIEWS))
def test_inplace_through_view(view_name: str, base_kind: str) -> None:
    fn = program(VIEWS[view_name], base_kind)
    make = lambda call: [torch.randn(4, 6, generator=torch.Generator().manual_seed(10 * call + k))
                         for k in range(len(INPLACE))]
    recorder = compare(fn, make, labels=list(INPLACE))
    assert not recorder.eager_reasons, recorder.eager_reasons    # exact scatter: really compiled


def test_overlapping_view_write_runs_eagerly() -> None:
    """unfold with overlapping windows / as_strided with repeated elements: eager writes element by
    element; ember cannot scatter that exactly and must run the graph eagerly (same result)."""
    def fn(x: torch.Tensor, y: torch.Tensor) -> tuple:
        x.unfold(0, 2, 1).add_(1)
        y.as_strided((3, 2), (1, 1)).mul_(2)
        return x + 0, y + 0
    recorder = compare(fn, lambda call: [torch.randn(6), torch.randn(6)], calls=2)
    assert recorder.eager_reasons


def test_overlapping_view_read_is_compiled() -> None:
    def fn(x: torch.Tensor) -> tuple:
        x.add_(1)
        return (x.unfold(0, 3, 1) * 2, x.as_strided((3, 3), (1, 1), 1) + 0)
    recorder = compare(fn, lambda call: [torch.randn(6)], calls=2)
    assert not recorder.eager_reasons


def test_write_through_expand_raises_like_eager() -> None:
    def fn(x: torch.Tensor) -> torch.Tensor:
        return x.expand(3, 4).add_(1)
    with pytest.raises(RuntimeError) as eager_error:
        fn(torch.randn(1, 4))
    with pytest.raises(type(eager_error.value)):
        ember.compile(fn)(torch.randn(1, 4))


# ------------------------------------------------------------------ aliased arguments
def _aliased(fn: Callable, make_args: Callable[[torch.Tensor], tuple], size: int = 8) -> None:
    for call in range(2):
        storage = torch.randn(size, generator=torch.Generator().manual_seed(call))
        eager_storage, ember_storage = storage.clone(), storage.clone()
        compiled = ember.compile(fn)
        expected = fn(*make_args(eager_storage))
        actual = compiled(*make_args(ember_storage))
        torch.testing.assert_close(actual, expected)
        torch.testing.assert_close(ember_storage, eager_storage)


def write_a_read_b(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    a.add_(1)
    return b * 2


def write_both(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    a.mul_(2)
    b.add_(a[:2].sum())
    return a + b


ALIASED_ARGS = {
    "same_tensor_twice": lambda z: (z, z),
    "overlapping_views": lambda z: (z[:6], z[2:]),
    "disjoint_views": lambda z: (z[:4], z[4:]),
    "view_and_base": lambda z: (z[2:], z[:6].view(2, 3).flatten()),
    "strided_interleaved": lambda z: (z[::2], z[1::2]),
}


@pytest.mark.parametrize("fn", [write_a_read_b, write_both], ids=["write_a_read_b", "write_both"])
@pytest.mark.parametrize("args", list(ALIASED_ARGS))
def test_aliased_arguments(args: str, fn: Callable) -> None:
    make = ALIASED_ARGS[args]
    if args == "same_tensor_twice" or args == "view_and_base":
        def fn_same_shape(a: torch.Tensor, b: torch.Tensor, fn: Callable = fn) -> torch.Tensor:
            return fn(a, b)
        _aliased(fn_same_shape, make)
    else:
        _aliased(fn, make)


def test_aliased_then_distinct_calls() -> None:
    """The runtime aliasing check must not stick: distinct inputs afterwards are compiled results."""
    compiled = ember.compile(write_a_read_b)
    z = torch.randn(8)
    z_eager = z.clone()
    torch.testing.assert_close(compiled(z[:6], z[2:]), write_a_read_b(z_eager[:6], z_eager[2:]))
    torch.testing.assert_close(z, z_eager)
    a, b = torch.randn(6), torch.randn(6)
    a_eager, b_eager = a.clone(), b.clone()
    torch.testing.assert_close(compiled(a, b), write_a_read_b(a_eager, b_eager))
    torch.testing.assert_close(a, a_eager)


# ------------------------------------------------------------------ setitem forms and buffers
def setitem_forms(x: torch.Tensor, v: torch.Tensor, idx: torch.Tensor) -> tuple:
    x[:, 1:3] += 1
    x[x > 1.0] = v[0]
    x[idx] = v
    x.index_put_((idx,), v * 2, accumulate=True)
    x[0, ::2] = 5
    x.t()[1].copy_(v[:4])
    x.select(0, 3).masked_fill_(x[3] < 0, 9.0)
    return x.sum(1), x[1:, :2] + 0


def test_setitem_forms() -> None:
    make = lambda call: [torch.randn(4, 6, generator=torch.Generator().manual_seed(call)),
                         torch.randn(6, generator=torch.Generator().manual_seed(10 + call)),
                         torch.tensor([2, 0])]
    recorder = compare(setitem_forms, make)
    assert not recorder.eager_reasons, recorder.eager_reasons


def test_batchnorm_running_stats() -> None:
    eager_bn, ember_bn = torch.nn.BatchNorm2d(3), torch.nn.BatchNorm2d(3)
    eager_bn.train()
    ember_bn.train()
    compiled = ember.compile(ember_bn)
    for call in range(3):
        x = torch.randn(2, 3, 4, 4, generator=torch.Generator().manual_seed(call))
        torch.testing.assert_close(compiled(x.clone()), eager_bn(x.clone()))
        for name in ("running_mean", "running_var", "num_batches_tracked"):
            torch.testing.assert_close(getattr(ember_bn, name), getattr(eager_bn, name), msg=name)


def test_inplace_ops_on_intermediate_views_triton() -> None:
    """A few of the matrix's cases through the Triton wrapper (interpreter on the CPU)."""
    pytest.importorskip("triton")
    for view_name in ("split", "diagonal", "t", "as_strided"):
        fn = program(VIEWS[view_name], "intermediate")
        make = lambda call: [torch.randn(4, 6, generator=torch.Generator().manual_seed(10 * call + k))
                             for k in range(len(INPLACE))]
        compare(fn, make, labels=list(INPLACE), options={"cpu_backend": "triton"}, calls=1)


# ------------------------------------------------------------------ eager's errors and out=
def _self_overlap_add(x: torch.Tensor) -> torch.Tensor:
    x[1:].add_(x[:-1])
    return x


def _self_overlap_copy(x: torch.Tensor) -> torch.Tensor:
    x[1:].copy_(x[:-1])
    return x


def _self_overlap_setitem(x: torch.Tensor) -> torch.Tensor:
    x[1:] = x[:-1]
    return x


def _transposed_self_add(x: torch.Tensor) -> torch.Tensor:
    x.add_(x.t())
    return x


def _int_add_float(x: torch.Tensor) -> torch.Tensor:
    x.add_(0.5)
    return x


def _broadcast_grows_self(x: torch.Tensor) -> torch.Tensor:
    x.add_(torch.ones(4, 3))
    return x


def _out_is_view_of_input(a: torch.Tensor) -> torch.Tensor:
    torch.add(a, 1, out=a[:2])
    return a


EAGER_ERRORS = {
    "self_overlap_add": (_self_overlap_add, (5,), torch.float32),
    "self_overlap_copy": (_self_overlap_copy, (5,), torch.float32),
    "self_overlap_setitem": (_self_overlap_setitem, (5,), torch.float32),
    "transposed_self_add": (_transposed_self_add, (3, 3), torch.float32),
    "int_add_float": (_int_add_float, (4,), torch.int64),
    "broadcast_grows_self": (_broadcast_grows_self, (4, 1), torch.float32),
    "out_is_view_of_input": (_out_is_view_of_input, (4,), torch.float32),
}


@pytest.mark.parametrize("name", list(EAGER_ERRORS))
def test_inplace_errors_like_eager(name: str) -> None:
    """In-place ops eager rejects (partial self-overlap, a result dtype or shape that does not fit)
    raise eager's exception compiled too, and leave the input as eager leaves it."""
    fn, shape, dtype = EAGER_ERRORS[name]
    x = torch.arange(math.prod(shape), dtype=dtype).reshape(shape)
    eager_x, ember_x = x.clone(), x.clone()
    with pytest.raises(RuntimeError) as eager_error:
        fn(eager_x)
    with pytest.raises(type(eager_error.value)):
        ember.compile(fn)(ember_x)
    torch.testing.assert_close(ember_x, eager_x)


def _out_into_input(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    torch.add(a, b, out=b)
    return b * 2


def _out_into_new(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    c = torch.empty(6)
    torch.mul(a, b, out=c)
    return c


@pytest.mark.parametrize("fn", [_out_into_input, _out_into_new], ids=["out_into_input", "out_into_new"])
def test_out_argument(fn: Callable) -> None:
    """out= is a graph break in capture: the pieces around it must still get the mutation right."""
    compare(fn, lambda call: [torch.randn(6), torch.randn(6)], fullgraph=False)


def test_inplace_activation_modules() -> None:
    """nn modules built with inplace=True (timm's SiLU(inplace=True)): values and the input."""
    model = torch.nn.Sequential(
        torch.nn.Linear(8, 8), torch.nn.SiLU(inplace=True), torch.nn.Linear(8, 8), torch.nn.Hardswish(inplace=True),
        torch.nn.ReLU(inplace=True), torch.nn.Dropout(0.5, inplace=True), torch.nn.ELU(inplace=True),
        torch.nn.Mish(inplace=True), torch.nn.Hardsigmoid(inplace=True), torch.nn.SELU(inplace=True),
        torch.nn.CELU(inplace=True), torch.nn.ReLU6(inplace=True), torch.nn.LeakyReLU(inplace=True),
        torch.nn.Hardtanh(inplace=True), torch.nn.Threshold(0.1, 0.2, inplace=True),
        torch.nn.RReLU(inplace=True)).eval()
    compiled = ember.compile(model)
    for call in range(2):
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(call))
        torch.testing.assert_close(compiled(x.clone()), model(x.clone()))


def test_expanded_input_written_in_place() -> None:
    """zero_ on an expanded (stride-0) input is fine in eager; a write-back copy_ would raise."""
    def fn(x: torch.Tensor, y: torch.Tensor) -> tuple:
        x.zero_()
        return x + y, x
    for call in range(2):
        base = torch.randn(1, 3, generator=torch.Generator().manual_seed(call))
        eager_x, ember_x = base.clone().expand(4, 3), base.clone().expand(4, 3)
        y = torch.randn(4, 3)
        expected, actual = fn(eager_x, y), ember.compile(fn)(ember_x, y)
        torch.testing.assert_close(actual, expected)
        torch.testing.assert_close(ember_x, eager_x)


def _bitcast_read(x: torch.Tensor) -> torch.Tensor:
    return (x.view(torch.int32) & 0xFF).sum() + x.sum()


def _bitcast_read_after_write(x: torch.Tensor) -> torch.Tensor:
    bits = x.view(torch.int32)
    x.add_(1)
    return bits + 0


def _bitcast_write(x: torch.Tensor) -> torch.Tensor:
    x.view(torch.int32).bitwise_and_(0x7FFFFFFF)   # clears the sign bits of x
    return x * 1


def _narrow_tensor_start_write(x: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
    x.narrow(0, start, 2).mul_(3)
    return x + 0


@pytest.mark.parametrize("fn", [_bitcast_read, _bitcast_read_after_write, _bitcast_write],
                         ids=["read", "read_after_write", "write"])
def test_bitcast_views(fn: Callable) -> None:
    """x.view(dtype) shares x's bytes: reads compile; reads after a write and writes through it
    run eagerly (never a stale copy)."""
    compare(fn, lambda call: [torch.randn(8, generator=torch.Generator().manual_seed(call))])


def test_narrow_at_tensor_start() -> None:
    compare(_narrow_tensor_start_write, lambda call: [torch.randn(6), torch.tensor(call + 1)], fullgraph=False)


def _views_from_non_view_ops(a: torch.Tensor, b: torch.Tensor) -> tuple:
    a2, b2 = torch.broadcast_tensors(a, b)     # views of a and b in eager
    c = torch.atleast_2d(b)
    a.add_(1)
    b.mul_(2)
    return a2 + 0, b2 + 0, c + 0


def test_views_made_by_non_view_ops_see_later_writes() -> None:
    compare(_views_from_non_view_ops, lambda call: [torch.randn(3, 1), torch.randn(4)])
