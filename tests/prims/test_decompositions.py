"""Differential tests of decompositions and functionalization on hand-built torch-level graphs."""
from __future__ import annotations

import operator
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import check, clone_inputs, graph_of, run_with_contract

from ember.prims import is_prim, to_primitives

F = torch.nn.functional
T = torch.Tensor


def call(g, target, *args, **kwargs):
    return g.call(target, args, kwargs)


@pytest.mark.parametrize("other", [2, 2.5, True, "int_tensor", "double_scalar_tensor"])
def test_add_type_promotion(other):
    x = torch.randn(3, 4)
    if other == "int_tensor":
        check(lambda g, a, b: call(g, torch.add, a, b, alpha=2), x, torch.arange(4, dtype=torch.int32))
    elif other == "double_scalar_tensor":
        check(lambda g, a, b: call(g, operator.mul, a, b), x, torch.tensor(1.5, dtype=torch.float64))
    else:
        check(lambda g, a: call(g, operator.add, a, other), x)


def test_int_true_division_and_comparisons():
    a, b = torch.arange(6).reshape(2, 3), torch.tensor([1, 2, 4])
    check(lambda g, x, y: (call(g, operator.truediv, x, y), call(g, torch.lt, x, 2.5),
                           call(g, torch.div, x, y, rounding_mode="trunc")), a - 3, b)


@pytest.mark.parametrize("fn,kwargs", [
    (F.gelu, {}), (F.gelu, {"approximate": "tanh"}), (F.silu, {}), (F.softplus, {"beta": 2, "threshold": 1}),
    (F.hardswish, {}), (F.hardsigmoid, {}), (F.leaky_relu, {"negative_slope": 0.2}), (F.elu, {}),
    (F.relu6, {}), (F.mish, {}), (torch.sigmoid, {}), (torch.tanh, {}),
])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_activations(fn, kwargs, dtype):
    check(lambda g, x: call(g, fn, x, **kwargs), torch.randn(4, 8).to(dtype) * 4)


@pytest.mark.parametrize("dtype", [None, torch.float64])
def test_softmax_dtype(dtype):
    x = torch.randn(3, 5, dtype=torch.bfloat16)
    check(lambda g, a: (call(g, F.softmax, a, -1, dtype=dtype), call(g, F.log_softmax, a, 0, dtype=dtype)), x)


def test_norms():
    x, w, b = torch.randn(2, 6, 4), torch.randn(4), torch.randn(4)
    check(lambda g, a, w_, b_: call(g, F.layer_norm, a, (4,), w_, b_, 1e-5), x, w, b, atol=1e-5, rtol=1e-5)
    check(lambda g, a, w_: call(g, F.rms_norm, a, (4,), w_), x, w, atol=1e-5, rtol=1e-5)
    check(lambda g, a, w_, b_: call(g, F.group_norm, a, 3, w_, b_), x, torch.randn(6), torch.randn(6),
          atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("training", [True, False])
def test_batch_norm_running_stats(training):
    x, mean, var = torch.randn(4, 3, 5), torch.randn(3), torch.rand(3) + 0.5
    w, b = torch.randn(3), torch.randn(3)
    prim_graph = check(lambda g, *a: call(g, F.batch_norm, *a, training=training, momentum=0.3),
                       x, mean, var, w, b, atol=1e-5, rtol=1e-5)
    assert len(prim_graph.extra["mutated_inputs"]) == (2 if training else 0)


def test_inplace_through_view_mutates_base():
    x = torch.randn(4, 5)

    def build(g, a):
        row = call(g, operator.getitem, a, 1)
        call(g, T.add_, row, 1.0)
        col = call(g, operator.getitem, a, (slice(None), slice(1, 5, 2)))
        call(g, T.mul_, col, 2.0)
        return call(g, torch.sum, a), call(g, T.t, a)
    prim_graph = check(build, x)
    assert prim_graph.extra["mutated_inputs"] == [(0, 2)]
    assert prim_graph.extra["output_aliases"] == {1: 0}


def test_setitem_and_inplace_ops():
    x, v, idx = torch.randn(5, 4), torch.randn(4), torch.tensor([0, -1])

    def build(g, a, b, i):
        call(g, operator.setitem, a, 0, b)
        call(g, operator.setitem, a, (slice(1, 3), slice(None)), 0.5)
        call(g, operator.setitem, a, i, 7.0)
        call(g, F.relu, a, inplace=True)
        y = call(g, operator.iadd, a, 1)
        call(g, T.zero_, call(g, operator.getitem, b, slice(0, 2)))
        return call(g, T.clone, y),
    check(build, x, v, idx)


def test_copy_and_fill_and_outputs_stay_distinct():
    x, y = torch.randn(3, 4), torch.randn(4)

    def build(g, a, b):
        c = call(g, T.clone, a)
        call(g, T.copy_, a, b)
        return c, call(g, T.fill_, call(g, T.view, b, (2, 2)), 3.0), a
    prim_graph = check(build, x, y)
    assert prim_graph.extra["output_aliases"] == {1: 1}
    assert prim_graph.extra["output_sources"][2] == ("input", 0)   # `a` itself, as eager returns it
    assert prim_graph.extra["output_sources"][1] == ("input_view", 1, (2, 2), (2, 1), 0)


def test_views_and_indexing():
    x = torch.randn(2, 3, 4)
    idx = torch.tensor([2, 0, -1])

    def build(g, a, i):
        return (call(g, T.permute, a, 2, 0, 1), call(g, T.reshape, a, 6, -1), call(g, torch.flatten, a, 1),
                call(g, operator.getitem, a, (Ellipsis, None, slice(None, None, 2))),
                call(g, operator.getitem, a, (0, slice(None), i)), call(g, operator.getitem, a, (slice(None), 1, i)),
                call(g, torch.unflatten, a, -1, (2, 2)), call(g, T.expand, call(g, T.unsqueeze, a, 0), 2, -1, -1, -1),
                call(g, operator.getitem, call(g, torch.chunk, a, 2, 2), 1), call(g, T.narrow, a, 1, 1, 2),
                call(g, torch.cat, [a, a], 1), call(g, torch.stack, [a, a], -1), call(g, F.pad, a, (1, 2)),
                call(g, torch.index_select, a, 2, call(g, torch.abs, i)),
                call(g, torch.gather, a, 2, call(g, torch.zeros_like, a, dtype=torch.int64)))
    check(build, x, idx)


@pytest.mark.parametrize("dims,keepdim", [(None, False), (1, True), ((0, 2), False)])
def test_reductions(dims, keepdim):
    x = torch.randn(3, 4, 5)
    kw = {"dim": dims, "keepdim": keepdim} if dims is not None else {}
    check(lambda g, a: (call(g, torch.sum, a, **kw), call(g, torch.mean, a, **kw),
                        call(g, torch.var, a, **kw), call(g, torch.std, a, **kw, correction=0),
                        call(g, torch.amax, a, **({"dim": dims, "keepdim": keepdim} if dims else {})),
                        call(g, torch.logsumexp, a, dims if dims is not None else (0, 1, 2), keepdim)),
          x, atol=1e-5, rtol=1e-5)
    check(lambda g, a: (call(g, operator.getitem, call(g, torch.max, a, 1, keepdim), 0),
                        call(g, torch.argmin, a, None if dims is None else 1), call(g, torch.cumsum, a, 1),
                        call(g, torch.all, call(g, torch.gt, a, -3)), call(g, torch.linalg.vector_norm, a)), x)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("label_smoothing", [0.0, 0.2])
@pytest.mark.parametrize("weighted", [False, True])
def test_cross_entropy(reduction, label_smoothing, weighted):
    logits, target = torch.randn(6, 5), torch.tensor([0, 4, -100, 2, 1, 3])
    args = (logits, target) + ((torch.rand(5),) if weighted else ())
    check(lambda g, x, t, *w: call(g, F.cross_entropy, x, t, w[0] if w else None, ignore_index=-100,
                                   reduction=reduction, label_smoothing=label_smoothing),
          *args, atol=1e-5, rtol=1e-5)
    check(lambda g, x, t: call(g, F.mse_loss, x, t), logits, torch.randn(6, 5))


def test_linear_keeps_bias_add_as_prim():
    x, w, b = torch.randn(2, 3, 4), torch.randn(5, 4), torch.randn(5)
    prim_graph = check(lambda g, *a: call(g, F.relu, call(g, F.linear, *a)), x, w, b, atol=1e-5, rtol=1e-5)
    targets = [n.target for n in prim_graph.call_nodes()]
    assert torch.mm in targets and any(is_prim(t) and t.name == "add" for t in targets)


def test_creation():
    x = torch.randn(3, 3)
    check(lambda g, a: (call(g, torch.tril, a), call(g, torch.triu, a, 1), call(g, torch.arange, 1, 7, 2),
                        call(g, torch.arange, 0.0, 1.0, 0.25), call(g, torch.ones_like, a),
                        call(g, torch.full, (2, 2), 3), call(g, T.to, a, torch.float16)), x)


def test_dropout_fresh_seed_per_call_and_reproducible():
    x = torch.ones(64, 64)
    prim_graph = to_primitives(graph_of(lambda g, a: call(g, F.dropout, a, 0.25, True), x))
    torch.manual_seed(0)
    first = run_with_contract(prim_graph, clone_inputs([x]))[0]
    second = run_with_contract(prim_graph, clone_inputs([x]))[0]
    torch.manual_seed(0)
    again = run_with_contract(prim_graph, clone_inputs([x]))[0]
    assert not torch.equal(first, second) and torch.equal(first, again)
    kept = (first != 0).float().mean().item()
    assert 0.7 < kept < 0.8 and torch.allclose(first[first != 0], torch.tensor(1 / 0.75))
    identity = to_primitives(graph_of(lambda g, a: call(g, F.dropout, a, 0.5, False), x))
    assert torch.equal(run_with_contract(identity, [x.clone()])[0], x)


def test_unknown_op_is_extern_and_inplace_extern_is_functional():
    x = torch.randn(4, 4)
    prim_graph = check(lambda g, a: (call(g, torch.cumprod, a, 1), call(g, T.cumprod_, a, 0)), x)
    assert prim_graph.extra["mutated_inputs"] == [(0, 2)]
