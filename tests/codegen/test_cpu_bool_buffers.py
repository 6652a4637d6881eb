"""bool tensors are read and written by C++ kernels as bytes (cpp.POINTER_TYPE): g++ has no
vector type for loads of C++ bool, so a loop reading a mask (a causal softmax) ran scalar.  The
values must stay eager's: a loaded byte is true when nonzero, a stored bool is 0 or 1."""
from __future__ import annotations

import torch

from recording import compile_recording


def causal_softmax(scores, mask):
    return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)


def bool_outputs(x, mask):
    positive = x > 0
    return positive, positive & mask, mask | (x < -1), torch.where(mask, x, -x).gt(0.5)


def kernels_of(sources: list[str]) -> str:
    return "".join(source.split("# ---- kernels")[-1] for source in sources)


def test_mask_read_as_bytes():
    scores = torch.randn(2, 3, 64, 64)
    mask = torch.ones(64, 64, dtype=torch.bool).tril()
    compiled, sources = compile_recording(causal_softmax)
    torch.testing.assert_close(compiled(scores, mask), causal_softmax(scores, mask))
    kernels = kernels_of(sources)
    assert "const uint8_t* __restrict__ in_mask" in kernels
    assert "const bool*" not in kernels


def test_bool_results_are_zero_or_one():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 33, generator=g)
    mask = torch.rand(5, 33, generator=g) > 0.5
    compiled, sources = compile_recording(bool_outputs)
    for actual, expected in zip(compiled(x, mask), bool_outputs(x, mask)):
        assert actual.dtype == torch.bool
        assert torch.equal(actual.view(torch.uint8), expected.view(torch.uint8))
    assert "bool*" not in kernels_of(sources)


def test_bool_reductions_and_casts():
    g = torch.Generator().manual_seed(1)
    mask = torch.rand(4, 50, generator=g) > 0.3
    fn = lambda m: (m.any(-1), m.all(-1), m.sum(-1), m.float().mean(-1), (~m).to(torch.int32))
    compiled, _ = compile_recording(fn)
    for actual, expected in zip(compiled(mask), fn(mask)):
        assert actual.dtype == expected.dtype
        torch.testing.assert_close(actual, expected)
