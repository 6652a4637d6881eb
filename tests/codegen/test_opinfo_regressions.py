"""Bugs the OpInfo differential tests found (tests/codegen/test_opinfo_*.py), each as a small graph
through the full compiler: C++ here, the Triton interpreter in test_triton_opinfo_regressions.py."""
from __future__ import annotations

import torch

from ember.backend import compile_graph
from ember.graph import Graph, TensorMeta


def one_op(fn, *inputs, **kwargs) -> Graph:
    g = Graph()
    args = [g.placeholder(f"x{i}", TensorMeta.of(x)) if isinstance(x, torch.Tensor) else x
            for i, x in enumerate(inputs)]
    g.output((g.call(fn, tuple(args), kwargs),))
    return g


def check(fn, *inputs, options=None, **kwargs) -> None:
    graph = one_op(fn, *inputs, **kwargs)
    tensors = [x for x in inputs if isinstance(x, torch.Tensor)]
    expected = fn(*inputs, **kwargs)
    actual = compile_graph(graph, tensors, options)(*tensors)[0]
    torch.testing.assert_close(actual, expected, equal_nan=True, rtol=0, atol=0)


def test_gather_read_through_a_reshape():
    # take_along_dim without dim gathers from x.reshape(-1): the Indirect index sat inside // and %
    x = torch.randn(5, 5)
    check(torch.take_along_dim, x, torch.tensor([[0, 0], [4, 4], [1, 1], [3, 3], [1, 1]]))


def test_zero_size_reshape():
    check(torch.eye, 0, dtype=torch.float32)
    check(torch.reshape, torch.randn(0, 3), (3, 0))


def test_signbit_bfloat16():
    # g++ 12 -O3 crashed (internal compiler error) vectorizing std::signbit of a bf16 load
    x = torch.tensor([-1.0, 0.0, -0.0, 2.0, float("-inf"), float("nan"), -float("nan")] * 3, dtype=torch.bfloat16)
    check(torch.signbit, x)


def test_getitem_with_a_list():
    x = torch.randn(5, 4, 3)
    check(torch.Tensor.__getitem__, x, [1, 2])        # an iota index
    check(torch.Tensor.__getitem__, x, [4, 0, 2, 2])  # a where-chain index
    check(torch.Tensor.__getitem__, x, [[0, 1], [2, 3]])  # nested: runs eagerly (not as operator.getitem)


def test_narrow_with_a_tensor_start():
    x = torch.randn(5, 6)
    check(torch.narrow, x, 1, torch.tensor(-4), 3)


def test_bf16_matmul_bias_rounds_once():
    # the bias goes into the Extern: no double rounding of the bf16 product
    torch.manual_seed(0)
    bias, a, b = (torch.randn(*s, dtype=torch.bfloat16) for s in ((4, 5, 6), (4, 5, 7), (4, 7, 6)))
    check(torch.baddbmm, bias, a, b, beta=0.5, alpha=2.0)
    check(torch.nn.functional.linear, torch.randn(3, 8, dtype=torch.bfloat16),
          torch.randn(4, 8, dtype=torch.bfloat16), torch.randn(4, dtype=torch.bfloat16))
    check(torch.addbmm, torch.randn(5, 6), torch.randn(4, 5, 7), torch.randn(4, 7, 6))
