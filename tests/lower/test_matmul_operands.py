"""A matmul operand that ATen would copy before its GEMM (batch dims that do not fold into one
stride, or a matrix with no unit stride) is copied by a fused kernel instead, laid out so that
cuBLAS / MKL read it in place.  Every layout of the operands is walked: the result must equal
eager's, and the compiled call must make no ATen copy (ATen's strided copy runs ~6x slower than
a fused copy kernel on the H100: nanoGPT's attention made 50 per training step)."""
import itertools

import pytest
import torch

import ember
from ember.lower.lowering import _matmul_operand_copy

ATEN_COPIES = {"aten::copy_", "aten::clone", "aten::contiguous", "aten::_reshape_copy"}
PRODUCTS = {"aten::matmul", "aten::bmm", "aten::mm"}     # not addmm: it copies its bias into the result


def _aten_copies(fn, *args):
    """The ATen copies made inside matrix products while ``fn`` runs."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        fn(*args)
    return [event.name for event in profile.events() if event.name in ATEN_COPIES and _inside_product(event)]


def _inside_product(event) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if parent.name in PRODUCTS:
            return True
        parent = parent.cpu_parent
    return False


def _laid_out(shape, order, generator):
    """A tensor of ``shape`` whose memory holds its dims in ``order`` (slowest first)."""
    base = torch.randn([shape[d] for d in order], generator=generator)
    return base.permute([order.index(d) for d in range(len(shape))])


def _every_layout(shape, generator):
    return [_laid_out(shape, list(order), generator) for order in itertools.permutations(range(len(shape)))]


def _check(fn, operands):
    compiled = ember.compile(fn)
    with torch.no_grad():
        expected = fn(operands)
        got = compiled(operands)
        copies = _aten_copies(compiled, operands)
    for e, g in zip(expected, got):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)
    assert copies == [], f"the compiled call made ATen copies: {copies}"


def _products(operands):
    return lambda operands: [a @ b for a, b in zip(operands[0::2], operands[1::2])]


def test_batched_operands_in_every_layout():
    """(2, 3, 4, 5) @ (2, 3, 5, 6): each operand in each of its 24 dim orders, the other contiguous."""
    g = torch.Generator().manual_seed(0)
    lefts, rights = _every_layout((2, 3, 4, 5), g), _every_layout((2, 3, 5, 6), g)
    operands = []
    for left in lefts:
        operands += [left, torch.randn(2, 3, 5, 6, generator=g)]
    for right in rights:
        operands += [torch.randn(2, 3, 4, 5, generator=g), right]
    _check(_products(operands), operands)


def test_bmm_operands_in_every_layout():
    """(On the CPU, bmm takes any strides without an ATen copy: equality is what this checks here.)"""
    g = torch.Generator().manual_seed(1)
    operands = []
    for left, right in itertools.product(_every_layout((3, 4, 5), g), _every_layout((3, 5, 6), g)):
        operands += [left, right]
    _check(lambda ops: [torch.bmm(a, b) for a, b in zip(ops[0::2], ops[1::2])], operands)


def test_folded_operand_in_every_layout():
    """(2, 3, 5) @ (5, 6) folds into one (6, 5) @ (5, 6) product when the first operand's rows fold,
    else runs as a bmm; (2, 3, 4, 5) @ (5, 6) head views neither fold nor batch without a copy."""
    g = torch.Generator().manual_seed(2)
    operands = []
    for left in _every_layout((2, 3, 5), g) + _every_layout((2, 3, 4, 5), g):
        for right in _every_layout((5, 6), g):
            operands += [left, right]
    _check(_products(operands), operands)


def test_head_views_of_a_projection_train_like_eager():
    """nanoGPT's attention: q, k, v are head views of one (B, T, 3C) projection; forward and
    backward equal eager's and make no ATen copy."""
    torch.manual_seed(0)
    B, T, H, D = 2, 16, 4, 8
    C = H * D
    projection = torch.nn.Linear(C, 3 * C)
    mask = torch.tril(torch.ones(T, T, dtype=torch.bool))

    def attention(x):
        q, k, v = projection(x).split(C, dim=2)
        q, k, v = (t.view(B, T, H, D).transpose(1, 2) for t in (q, k, v))
        weights = ((q @ k.transpose(-2, -1)) * D ** -0.5).masked_fill(~mask, float("-inf")).softmax(-1)
        return (weights @ v).transpose(1, 2).reshape(B, T, C)

    compiled = ember.compile(attention)
    x = torch.randn(B, T, C, requires_grad=True)
    out_grad = torch.randn(B, T, C)
    expected = torch.autograd.grad(attention(x), (x, *projection.parameters()), out_grad)
    compiled(x)      # compiles forward and backward outside the profile
    got = torch.autograd.grad(compiled(x), (x, *projection.parameters()), out_grad)
    for e, g in zip(expected, got):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)
    copies = _aten_copies(lambda: torch.autograd.grad(compiled(x), (x,), out_grad))
    assert copies == [], f"the compiled step made ATen copies: {copies}"


@pytest.mark.parametrize("shape, strides, position, other, copied", [
    ((2, 3, 4, 5), (60, 20, 5, 1), 0, (2, 3, 5, 6), None),             # contiguous
    ((2, 3, 4, 5), (60, 20, 1, 4), 0, (2, 3, 5, 6), None),             # transposed matrix
    ((2, 3, 4, 5), (180, 5, 45, 1), 0, (2, 3, 5, 6), (60, 20, 5, 1)),  # head view: batch does not fold
    ((2, 3, 5, 4), (180, 5, 1, 45), 1, (2, 3, 4, 5), (60, 20, 1, 5)),  # k^T of a head view: order kept
    ((2, 3, 4, 5), (60, 20, 5, 1), 0, (3, 5, 6), None),                # broadcast batch: ATen's expand
    ((2, 3, 5), (5, 10, 1), 0, (5, 6), None),                          # rows do not fold: bmm reads it
    ((2, 3, 4, 5), (180, 5, 45, 1), 0, (5, 6), (60, 20, 5, 1)),        # neither mm nor bmm reads it
    ((3, 4, 5), (1, 3, 12), 0, (3, 5, 6), (20, 1, 4)),                 # no unit stride: copied transposed
    ((2, 3, 5), (15, 5, 1), 0, (5, 6), None),
    ((5, 6), (1, 5), 1, (2, 3, 5), None),                              # 2-D operand: mm reads it
])
def test_matmul_operand_rule(shape, strides, position, other, copied):
    assert _matmul_operand_copy(shape, strides, position, other) == copied
