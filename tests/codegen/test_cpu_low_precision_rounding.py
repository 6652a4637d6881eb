"""bf16/fp16 kernels round a value only where it may not be a bf16/fp16 number yet
(cpp.KernelPrinter.holds_rounded): a load of a bf16 buffer, a cast to bf16, a bf16 reduction
result or a widening of any of them is one already, so casting it (or storing it) again rounds
nothing.  The bits must be the same as with every rounding printed, NaN and inf included, and
the source must show the roundings gone."""
from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from ember.codegen import cpp
from recording import compile_recording


def residual_layer_norm(x, y, w, b):
    h = x + y
    return h, F.layer_norm(h, (h.shape[-1],), w, b)


def gelu_chain(x, w):
    return (F.gelu(x * w) + x).to(torch.float32).softmax(-1).to(x.dtype)


def mixed_casts(x, y):
    a = x.float() * 2
    return a.to(x.dtype), (x.to(torch.float16) + y.to(torch.float16)), x.sum(-1).float() + 1


def special_inputs(dtype: torch.dtype) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 64, generator=g).to(dtype)
    x[0, :5] = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.0, -0.0]).to(dtype)
    y = torch.randn(6, 64, generator=g).to(dtype)
    return [x, y, (torch.randn(64, generator=g) + 1).to(dtype), torch.randn(64, generator=g).to(dtype)]


PROGRAMS = {"residual_layer_norm": (residual_layer_norm, 4), "gelu_chain": (gelu_chain, 2),
            "mixed_casts": (mixed_casts, 2)}


def run(fn, inputs):
    compiled, sources = compile_recording(fn)
    with torch.no_grad():
        out = compiled(*inputs)
    return (out if isinstance(out, tuple) else (out,)), sources


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("program", sorted(PROGRAMS))
def test_same_bits_as_rounding_everywhere(monkeypatch, program, dtype):
    fn, arity = PROGRAMS[program]
    inputs = special_inputs(dtype)[:arity]
    fewer, lean_sources = run(fn, inputs)
    monkeypatch.setattr(cpp.KernelPrinter, "holds_rounded", lambda self, expr, dtype: False)
    every, full_sources = run(fn, inputs)
    bits = {2: torch.int16, 4: torch.int32}
    for a, b in zip(fewer, every):
        assert a.dtype == b.dtype
        assert torch.equal(a.view(bits[a.itemsize]), b.view(bits[b.itemsize]))
    with torch.no_grad():
        expected = fn(*inputs)
    for a, e in zip(fewer, expected if isinstance(expected, tuple) else (expected,)):
        torch.testing.assert_close(a, e, equal_nan=True, atol=2e-2, rtol=2e-2)
    name = "bf16" if dtype == torch.bfloat16 else "half"
    kernels = lambda sources: "".join(s.split("# ---- kernels")[-1] for s in sources)
    # (the scalar ember_round_bf16 or the vector types' ember::vec_round_bf16)
    assert kernels(lean_sources).count(f"round_{name}(") < kernels(full_sources).count(f"round_{name}(")


def test_bf16_residual_source():
    """The residual add is rounded once (it was three times), loads of weights not at all, and a
    rounded value is stored by taking its bits."""
    fn, arity = PROGRAMS["residual_layer_norm"]
    _, sources = run(fn, special_inputs(torch.bfloat16)[:arity])
    kernel = sources[-1].split("# ---- kernels")[-1]
    assert "ember_round_bf16(ember_round_bf16" not in kernel
    assert "ember_bf16_bits(" in kernel


def test_round_bf16_matches_torch_on_every_rounding_case():
    """The prelude's ember_round_bf16 (kept in 32 bits) against torch's float -> bf16 -> float, for
    every upper half-word with the low half-words that decide the rounding: ties to even, carries
    into the exponent (to inf), denormals, infinities, NaN (any NaN in, a NaN out)."""
    import ctypes

    import numpy as np

    from ember.codegen.cpp_prelude import PRELUDE
    from ember.runtime import cpp_build

    source = PRELUDE + """
extern "C" void round_all(const float* __restrict__ x, float* __restrict__ y, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) y[i] = ember_round_bf16(x[i]);
}
"""
    lib = cpp_build.load(cpp_build.build(source, "round_bf16_test"))
    lib.round_all.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    high = np.arange(1 << 16, dtype=np.uint32) << 16
    low = np.array([0, 1, 0x3fff, 0x4000, 0x7fff, 0x8000, 0x8001, 0xbfff, 0xc000, 0xffff], dtype=np.uint32)
    x = (high[:, None] | low[None, :]).ravel().view(np.float32)
    y = np.empty_like(x)
    lib.round_all(x.ctypes.data, y.ctypes.data, x.size)
    expected = torch.from_numpy(x).to(torch.bfloat16).float().numpy()
    nan = np.isnan(expected)
    assert np.array_equal(np.isnan(y), nan)
    assert np.array_equal(y[~nan].view(np.uint32), expected[~nan].view(np.uint32))
