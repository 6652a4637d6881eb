"""Triton-path bugs the OpInfo differential tests found, as small graphs (Triton's interpreter on
the CPU, chosen by ember for CPU tensors: no TRITON_INTERPRET)."""
from __future__ import annotations

import os

import pytest

if os.environ.get("EMBER_TRITON_TEST_DEVICE", "cpu") != "cpu":
    pytest.skip("CPU tensors through the interpreter only", allow_module_level=True)
# no TRITON_INTERPRET: ember interprets CPU tensors' kernels by itself (it would leak into other tests)
triton = pytest.importorskip("triton")
import torch
from test_opinfo_regressions import check

OPTIONS = {"cpu_backend": "triton"}


@pytest.mark.parametrize("op", [torch.logical_and, torch.logical_or, torch.logical_xor])
def test_logical_op_with_a_0d_operand(op):
    # the interpreter typed `(scalar != 0)` as float, and `&` with a bool block raised
    x = torch.tensor([0.0, 1.0, 0.0, 2.0, -1.0])
    for y in (torch.tensor(0.0), torch.tensor(3.0)):
        check(op, x, y, options=OPTIONS)
        check(op, y, x, options=OPTIONS)


def test_reduction_over_a_size_one_dim():
    # the tile was a scalar load (the size-1 r var drops out of the address): tl.sum(scalar, 1) failed
    x, w, b = torch.randn(1), torch.randn(1), torch.randn(1)
    check(torch.nn.functional.layer_norm, x, (1,), w, b, options=OPTIONS)


def test_remainder_of_a_scalar_by_a_block():
    # libm.fmod(scalar, block) came back typed as a scalar
    check(torch.remainder, torch.tensor(5.0), torch.tensor([1.5, -2.0, 3.0, -0.7]), options=OPTIONS)


def test_lgamma_at_its_poles():
    check(torch.lgamma, torch.tensor([0.0, -1.0, -2.0, 0.5, 3.0]), options=OPTIONS)


def test_float64_to_bfloat16_cast():
    # the bf16 rounding helper bitcast float64 bits as if they were fp32
    check(torch.arange, -1, 2, 0.7, dtype=torch.bfloat16, options=OPTIONS)


@pytest.mark.parametrize("op", [torch.maximum, torch.minimum])
def test_maximum_minimum_of_0d_operands(op):
    # `(a < b) | (a != a)` of two 0-d loads: the interpreter typed both compares as float and the
    # | raised (training fuzz seeds 253 and 360 with cpu_backend="triton")
    for a, b in ((torch.tensor(1.5, dtype=torch.float64), torch.tensor(-2.0)), (torch.tensor(float("nan")), torch.tensor(1.0)),
                 (torch.tensor(1.0), torch.tensor(float("nan")))):
        check(op, a, b, options=OPTIONS)
        check(op, a, b.expand(3).contiguous(), options=OPTIONS)


def test_guarded_load_at_a_size_one_dim_in_a_backward():
    """The backward of a cat and a bfloat16 copy of a (2, 1) input pads each tangent back to its
    input's extent; at the size-1 dim the pad's bound check is a compare of two constants, and its
    & with the block mask made Triton's interpreter reject the load ('mask has unsupported dtype';
    training fuzz with cpu_backend="triton", seed 693).  Gradients equal eager's."""
    import ember

    def program(a):
        v = a[:, ::2]
        return v.sum((0, 1), keepdim=True).chunk(2, 0)[0], a.bfloat16(), torch.cat([v, a], dim=-2)

    a = torch.randn(2, 1)
    leaves = [a.clone().requires_grad_(True) for _ in range(2)]
    compiled = ember.compile(program, options={"cpu_backend": "triton", "fallback": "error"})
    outputs = [program(leaves[0]), compiled(leaves[1])]
    for out, leaf in zip(outputs, leaves):
        weights = [torch.full(o.shape, 0.5 + i).to(o.dtype) for i, o in enumerate(out)]
        sum((o * w).sum().float() for o, w in zip(out, weights)).backward()
    torch.testing.assert_close(outputs[1], outputs[0])
    torch.testing.assert_close(leaves[1].grad, leaves[0].grad)


@pytest.mark.parametrize("shape, expanded", [((1,), (4,)), ((3, 1), (3, 6)), ((1, 5), (4, 5))])
def test_reductions_over_an_expanded_input(shape, expanded):
    """A reduction over a dim the input is expanded along (stride 0) loads one element per row:
    the loaded value must be broadcast over the tile before it is reduced (a scalar load reduced
    along axis 1 failed: 'axis 1 out of bounds for shape []', training fuzz with
    cpu_backend="triton", seed 116)."""
    import ember

    def program(a):
        return (a.sum(-1, dtype=torch.float64), a.amax(-1), torch.softmax(a, -1),
                torch.var_mean(a, -1, correction=0), a.sum())

    a = torch.randn(shape).expand(expanded)
    got = ember.compile(program, options={"cpu_backend": "triton", "fallback": "error"})(a)
    torch.testing.assert_close(got, program(a))
