"""Codegen stays linear in the size of a fused body with shared sub-expressions.

Exprs are hash-consed (lower/ir.py ``_Interned``): structural equality is identity, so the
printers' CSE dicts and the scheduler never compare a DAG as a tree (which is exponential:
the zoo's "pointwise" model took 46-160 s in generate_triton before)."""
import time

import pytest
import torch

from ember.lower.lowering import lower_graph
from ember.lower.scheduler import schedule
from ember.codegen.cpp import generate_cpp
from ember.lower import ir
from ember.lower.builder import PrimGraphBuilder

DEPTH = 60


def shared_chain(depth: int) -> ir.Expr:
    x0 = ir.Var("x0", 8)
    y: ir.Expr = ir.Load("a", (ir.index(x0),), torch.float32)
    for k in range(depth):
        # y is used twice: as a tree the expression has 2**depth leaves
        y = ir.Op("add", (y, ir.Op("mul", (y, ir.Const(0.5 + k, torch.float32)), torch.float32)), torch.float32)
    return y


def test_equal_structure_is_the_same_object():
    a, b = shared_chain(DEPTH), shared_chain(DEPTH)
    assert a is b and a == b and hash(a) == hash(b)
    assert ir.Const(1, torch.float32) is not ir.Const(1.0, torch.float32)
    assert ir.Const(-0.0, torch.float32) is not ir.Const(0.0, torch.float32)
    assert ir.Const(float("nan"), torch.float32) is ir.Const(float("nan"), torch.float32)
    assert ir.Op(op="neg", args=(a,), dtype=torch.float32) is ir.Op("neg", (b,), torch.float32)


def test_equality_of_deep_shared_dags_does_not_recurse(monkeypatch):
    calls = 0
    original = ir.Op.__eq__

    def counting(self, other):
        nonlocal calls
        calls += 1
        return original(self, other)

    monkeypatch.setattr(ir.Op, "__eq__", counting)
    a = shared_chain(DEPTH)
    b = shared_chain(DEPTH)
    assert a == b and not (a == ir.Op("neg", (b,), torch.float32))
    assert {a: 1}[b] == 1
    assert calls < 50 * DEPTH


def _deep_graph():
    xv = torch.randn(4, 16)
    b = PrimGraphBuilder()
    y = x = b.input("x", xv)
    for k in range(DEPTH):
        y = b.add(y, b.mul(y, 0.5 + k))        # every level read twice
    s = b.broadcast(b.sum(y, (1,)), (4, 16), (0,))
    out = b.div(b.exp(b.sub(y, s)), b.add(x, 2.0))
    return b.build([out]), [xv]


def test_deep_shared_dag_prints_fast_cpp():
    graph, inputs = _deep_graph()
    start = time.perf_counter()
    source = generate_cpp(schedule(lower_graph(graph, inputs)))
    assert time.perf_counter() - start < 5.0     # was exponential: never finished
    assert source


def test_deep_shared_dag_prints_fast_triton():
    pytest.importorskip("triton")
    from ember.codegen.triton import generate_triton
    graph, inputs = _deep_graph()
    start = time.perf_counter()
    source, kernels = generate_triton(schedule(lower_graph(graph, inputs)), interpret=True)
    assert time.perf_counter() - start < 5.0
    assert kernels
