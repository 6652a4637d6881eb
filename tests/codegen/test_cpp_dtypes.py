"""Compiled prim graphs vs eager, per dtype.  Each test compiles one graph with many outputs (one .so)."""
import math

import pytest
import torch

from ember.backend import compile_graph
from ember.lower.builder import PrimGraphBuilder

FLOAT_TOL = {torch.float32: (1e-4, 1e-5), torch.float64: (1e-9, 1e-12),
             torch.bfloat16: (1.6e-2, 1e-2), torch.float16: (2e-3, 1e-3)}


def check(graph, inputs, rtol, atol):
    compiled = compile_graph(graph, inputs)
    expected = graph.run(*inputs)
    actual = compiled(*inputs)
    assert len(actual) == len(expected)
    for i, (a, e) in enumerate(zip(actual, expected)):
        assert a.dtype == e.dtype and a.shape == e.shape, (i, a.dtype, e.dtype, a.shape, e.shape)
        torch.testing.assert_close(a, e, rtol=rtol, atol=atol, equal_nan=True, msg=lambda m, i=i: f"output {i}: {m}")
    return compiled


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_float_ops(dtype):
    torch.manual_seed(0)
    b = PrimGraphBuilder()
    xv = torch.randn(7, 33).to(dtype)
    pv = (torch.rand(7, 33) + 0.1).to(dtype)
    x, p = b.input("x", xv), b.input("p", pv)
    outs = [b.call(name, x) for name in ("exp", "tanh", "erf", "sigmoid", "sin", "cos", "abs", "neg", "floor",
                                         "ceil", "round", "trunc", "expm1", "atan", "sign", "isnan")]
    outs += [b.call(name, p) for name in ("log", "sqrt", "rsqrt", "log1p", "reciprocal", "log2", "acos")]
    outs += [b.call(name, x, p) for name in ("add", "sub", "mul", "div", "maximum", "minimum", "atan2",
                                             "floor_divide", "remainder", "fmod", "lt", "eq")]
    outs += [b.pow(p, 2.5), b.mul(x, 3.0), b.where(b.gt(x, 0.0), x, p)]
    outs += [b.sum(x, (1,)), b.amax(x, (1,)), b.amin(x, (0,)), b.argmax(x, 1), b.argmin(x, 0),
             b.sum(x, (0, 1)), b.prod(p, (1,))]
    vm = b.var_mean(x, (1,), correction=1)
    outs += [b.getitem(vm, 0), b.getitem(vm, 1)]
    outs += [b.cast(x, torch.float32), b.cast(b.mul(x, 10.0), torch.int32)]
    graph = b.build(outs)
    rtol, atol = FLOAT_TOL[dtype]
    compiled = check(graph, [xv, pv], rtol, atol)
    assert compiled.stats["extern_count"] == 0


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int16, torch.int32, torch.int64])
def test_int_ops(dtype):
    torch.manual_seed(0)
    low = 0 if dtype == torch.uint8 else -20
    xv = torch.randint(low, 20, (5, 17), dtype=dtype)
    dv = torch.randint(1, 7, (5, 17), dtype=dtype)
    if dtype != torch.uint8:
        dv = dv * (torch.randint(0, 2, (5, 17), dtype=dtype) * 2 - 1)   # negative divisors too
    b = PrimGraphBuilder()
    x, d = b.input("x", xv), b.input("d", dv)
    outs = [b.call(name, x, d) for name in ("add", "sub", "mul", "floor_divide", "remainder", "fmod", "maximum",
                                            "minimum", "bitwise_and", "bitwise_or", "bitwise_xor", "eq", "lt")]
    # prims.sum keeps the input dtype (its eager reference promotes ints to int64): sum in int64
    outs += [b.abs(x), b.mul(x, 3), b.sum(b.cast(x, torch.int64), (1,)), b.amax(x, (1,)), b.amin(x, (0,)), b.argmax(x, 1),
             b.cast(x, torch.float32), b.bitwise_not(x)]
    check(b.build(outs), [xv, dv], 0, 0)


def test_bool_ops():
    av, bv = torch.rand(9, 5) > 0.5, torch.rand(9, 5) > 0.3
    b = PrimGraphBuilder()
    a, c = b.input("a", av), b.input("c", bv)
    outs = [b.logical_and(a, c), b.logical_or(a, c), b.logical_xor(a, c), b.logical_not(a),
            b.where(a, b.cast(c, torch.float32), 2.5), b.cast(a, torch.int64), b.amax(a, (1,))]
    check(b.build(outs), [av, bv], 0, 0)


def test_integer_division_by_zero_does_not_crash():
    xv = torch.tensor([7, -7, 0, 5], dtype=torch.int32)
    zv = torch.zeros(4, dtype=torch.int32)
    b = PrimGraphBuilder()
    x, z = b.input("x", xv), b.input("z", zv)
    graph = b.build([b.floor_divide(x, z), b.remainder(x, z), b.fmod(x, z)])
    out = compile_graph(graph, [xv, zv])(xv, zv)   # torch raises here; we must simply survive
    assert all(o.shape == (4,) for o in out)


def test_float_division_semantics_match_python():
    values = [7.5, -7.5, 0.0, -0.0, 3.0, -3.0, math.inf, 1e-30]
    xv = torch.tensor([v for v in values for _ in values], dtype=torch.float64)
    yv = torch.tensor([w for _ in values for w in values], dtype=torch.float64)
    b = PrimGraphBuilder()
    x, y = b.input("x", xv), b.input("y", yv)
    check(b.build([b.floor_divide(x, y), b.remainder(x, y), b.fmod(x, y)]), [xv, yv], 0, 0)


def test_nan_propagates_through_max_min():
    xv = torch.randn(4, 6)
    xv[1, 3] = float("nan")
    xv[2, 0] = float("nan")
    b = PrimGraphBuilder()
    x = b.input("x", xv)
    graph = b.build([b.amax(x, (1,)), b.amin(x, (1,)), b.maximum(x, 0.0), b.argmax(x, 1), b.amax(x, (0, 1))])
    check(graph, [xv], 0, 0)
