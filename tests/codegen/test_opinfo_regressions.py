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


def test_integer_baddbmm_and_addmm_with_float_factors():
    # eager truncates beta and alpha to the integer dtype (0.2 -> 0) and keeps it; ember's product
    # by a Python float promoted the result to float32 (OpInfo sample 5 of baddbmm, int64)
    gen = torch.Generator().manual_seed(0)
    bias, left, right = (torch.randint(-5, 5, shape, generator=gen) for shape in ((2, 3, 4), (2, 3, 5), (2, 5, 4)))
    for beta, alpha in ((0.2, 0.6), (1.7, 2.6), (-1.5, 1), (0, 2.5)):
        check(torch.baddbmm, bias, left, right, beta=beta, alpha=alpha)
        check(torch.addmm, bias[0], left[0], right[0], beta=beta, alpha=alpha)


def test_fp16_and_bf16_losses_round_as_eager():
    # eager's huber_loss kernel computes each element at fp32 (the difference too) and rounds
    # once; binary_cross_entropy_with_logits is log_sigmoid's kernel, then fp16/bf16 ops.  Per-op
    # rounding gave 2 fp16 ulps (0.125 near 100) and 7e-4 (OpInfo samples past the fourth, fp16)
    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.float16, torch.bfloat16):
        x, y = (torch.randn(40, 30, generator=gen) * 20).to(dtype), (torch.randn(40, 30, generator=gen) * 20).to(dtype)
        if dtype == torch.float16:      # bf16 huber: eager rounds some steps, not all (within 1 ulp)
            check(torch.nn.functional.huber_loss, x, y, reduction="none", delta=8.7)
        logits, target = x / 10, torch.rand(40, 30, generator=gen).to(dtype)
        pos_weight = torch.rand(30, generator=gen).to(dtype) + 0.5
        check(torch.nn.functional.binary_cross_entropy_with_logits, logits, target, reduction="none")
        check(torch.nn.functional.binary_cross_entropy_with_logits, logits, target, None, None, None, "none",
              pos_weight)     # (positional: tensors become the graph's inputs)


def test_integer_dtypes_of_float_functions_scans_and_ranges():
    # found by the OpInfo backend test over int64/int32/uint8/bool: sinc and logit of integers
    # returned the integer dtype (eager: float32); cumsum(dtype=int32) returned int64; arange with
    # float bounds and an integer dtype counted and computed from the float bounds (eager truncates
    # start and step, and int64 also counts between the truncated bounds)
    for dtype in (torch.int64, torch.int32, torch.uint8, torch.bool):
        x = torch.arange(12).reshape(3, 4).remainder(3).to(dtype)
        check(torch.sinc, x)
        check(torch.logit, x)
    ints = torch.randint(0, 50, (5, 6), generator=torch.Generator().manual_seed(0), dtype=torch.int32)
    for dtype in (torch.int32, torch.int16, torch.uint8, None):
        check(torch.cumsum, ints, 1, dtype=dtype)
    for dtype in (torch.int64, torch.int32, torch.uint8):
        for bounds in ((3.1,), (-0.9, 2.1, 2.0), (2.1, -2.9, -1.0), (0.0, -8.000001, -4.0), (0, 5, 0.5)):
            if dtype == torch.int64 and bounds == (0, 5, 0.5):
                continue        # eager raises ValueError (step truncated to 0)
            check(torch.arange, *bounds, dtype=dtype)
