"""Fusion around Externs: a node never joins a kernel that runs before an Extern (its output would
live through the Extern), except a reduction with a small output that shares a big read."""
import torch
from test_extern_views import extern
from test_fusion import run_and_compare, softmax

from ember.lower.builder import PrimGraphBuilder
from ember.lower.scheduler import ExternCall, FusedKernel


def step_kinds(compiled) -> list[str]:
    return ["extern" if isinstance(s, ExternCall) else "kernel" for s in compiled.schedule.steps]


def kernel_writing(compiled, name: str) -> int:
    """Position in the schedule of the kernel that stores ``name``."""
    return next(i for i, s in enumerate(compiled.schedule.steps) if isinstance(s, FusedKernel) and name in s.writes)


def extern_position(compiled) -> int:
    return next(i for i, s in enumerate(compiled.schedule.steps) if isinstance(s, ExternCall))


def test_pointwise_of_inputs_after_an_extern_is_not_hoisted_before_it():
    xv, wv = torch.randn(64, 128), torch.randn(128, 32)
    b = PrimGraphBuilder()
    x, w = b.input("x", xv), b.input("w", wv)
    matmul = extern(b, torch.mm, b.exp(x), w)      # exp(x) is stored for the Extern by a kernel
    late = b.tanh(x)                               # reads only inputs, comes after the Extern
    compiled = run_and_compare(b.build([matmul, late]), [xv, wv])
    # it would fit the exp kernel, but then its output would be alive during the matmul
    assert step_kinds(compiled) == ["kernel", "extern", "kernel"], compiled.source
    assert kernel_writing(compiled, late.name) > extern_position(compiled)


def test_reduction_with_a_small_output_still_shares_a_read_across_an_extern():
    xv, wv = torch.randn(64, 128), torch.randn(128, 32)
    b = PrimGraphBuilder()
    x, w = b.input("x", xv), b.input("w", wv)
    matmul = extern(b, torch.mm, b.exp(x), w)
    row_sums = b.sum(x, (1,))                       # 64 floats from 64 * 128: fused with exp(x)'s read of x
    compiled = run_and_compare(b.build([matmul, row_sums]), [xv, wv])
    assert step_kinds(compiled) == ["kernel", "extern"], compiled.source


def test_softmax_between_externs_is_one_kernel():
    xv, wv, vv = torch.randn(16, 32), torch.randn(32, 100), torch.randn(100, 8)
    b = PrimGraphBuilder()
    x, w, v = b.input("x", xv), b.input("w", wv), b.input("v", vv)
    scores = extern(b, torch.mm, x, w)
    out = extern(b, torch.mm, softmax(b, scores, (16, 100)), v)
    compiled = run_and_compare(b.build([out]), [xv, wv, vv])
    assert step_kinds(compiled) == ["extern", "kernel", "extern"], compiled.source
