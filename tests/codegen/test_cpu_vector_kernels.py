"""Kernels on ember's own vector types (cpp.VECTOR_TYPES, issue #13): the innermost contiguous loop
of pointwise kernels and row passes (sum/max/min) printed on ember::Vec with a masked tail,
compared with eager; loops that do not fit keep the scalar form; bf16/fp16 round the same."""
from __future__ import annotations

import functools

import pytest
import torch
from torch.nn import functional as F

from ember.codegen import cpp
from ember.runtime import cpp_build
from recording import compile_recording


def kernels(sources: list[str]) -> str:
    return "".join(source.split("# ---- kernels")[-1].split("namespace ember")[-1] for source in sources)


def pointwise_chain(x, w):
    h = F.gelu(x) * torch.sigmoid(x) + torch.tanh(x * w)
    return torch.exp(-h.abs()) + torch.log(h.abs() + 1) + torch.maximum(h, w) - torch.rsqrt(h * h + 1)


def row_passes(x):
    return torch.softmax(x, -1), x.amin(-1), x.sum(-1), torch.log_softmax(x * 2, -1)


@pytest.fixture
def vector_types(monkeypatch):
    monkeypatch.setattr(cpp, "VECTOR_TYPES", True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(5, 67), (3, 1000), (1, 7), (4, 16)])
def test_pointwise_matches_eager(vector_types, dtype, shape):
    torch.manual_seed(0)
    x, w = torch.randn(shape).to(dtype) * 3, torch.randn(shape[-1]).to(dtype)
    x.view(-1)[1] = float("nan")
    compiled, sources = compile_recording(pointwise_chain)
    tolerance = {} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
    torch.testing.assert_close(compiled(x, w), pointwise_chain(x, w), equal_nan=True, **tolerance)
    assert "ember::vec_load" in kernels(sources)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(6, 67), (3, 1024), (2, 5)])
def test_row_passes_match_eager_with_nan_and_inf(vector_types, dtype, shape):
    torch.manual_seed(1)
    x = torch.randn(shape).to(dtype) * 10
    x[0, -1] = float("nan")                  # in the tail (or the only block)
    x[1, 0] = float("inf")
    x[-1, :] = -float("inf") if shape[0] > 2 else x[-1, :]
    compiled, sources = compile_recording(row_passes)
    for actual, expected in zip(compiled(x), row_passes(x)):
        tolerance = {} if dtype == torch.float32 else {"atol": 2e-2, "rtol": 2e-2}
        torch.testing.assert_close(actual, expected, equal_nan=True, **tolerance)
    assert "ember::vec_max(" in kernels(sources) and "ember::vec_min(" in kernels(sources)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_low_precision_rounding_is_the_scalar_forms(monkeypatch, dtype):
    """Without transcendental calls (whose libraries may differ) the vector and scalar forms give
    the same bits: the same roundings to bf16/fp16 at the same places."""
    def chain(x, y):
        h = (x * y + 1).float() * 0.3
        return torch.maximum(h.to(dtype) + x, y), (x - y).sum(-1), torch.maximum(x, y).amax(-1)
    torch.manual_seed(2)
    x, y = torch.randn(9, 300).to(dtype), torch.randn(9, 300).to(dtype)
    results = {}
    for flag in (False, True):
        monkeypatch.setattr(cpp, "VECTOR_TYPES", flag)
        compiled, sources = compile_recording(chain)
        results[flag] = compiled(x, y)
        assert ("ember::vec_" in kernels(sources)) == flag
    for scalar, vector in zip(results[False], results[True]):
        if scalar.dim() > 1:
            assert torch.equal(scalar, vector)
        else:                                     # sums: another order of the additions
            torch.testing.assert_close(scalar, vector, atol=5e-2, rtol=1e-2)


def test_what_does_not_fit_stays_scalar(vector_types):
    """Integers, float64, a strided (transposed) read and a gathered one keep the scalar loop."""
    torch.manual_seed(3)
    cases = [
        (lambda a: (a * 3 + 1) // 2, (torch.randint(-50, 50, (4, 33)),)),
        (lambda a: torch.exp(a) + 1, (torch.randn(4, 33, dtype=torch.float64),)),
        (lambda a: torch.tanh(a + a.t()), (torch.randn(33, 33),)),
        (lambda a, i: torch.exp(a[i]), (torch.randn(10, 8), torch.randint(0, 10, (6,)))),
    ]
    for fn, args in cases:
        compiled, sources = compile_recording(fn)
        torch.testing.assert_close(compiled(*args), fn(*args))
        if fn is cases[3][0]:
            continue          # (the gathered rows are contiguous inside: that may vectorize)
        assert "ember::vec_" not in kernels(sources), fn


def test_default_uses_them_only_without_libmvec(monkeypatch):
    """VECTOR_TYPES None: loops calling exp/log/erf/tanh/sigmoid get both forms, the vector one
    under #ifndef EMBER_USE_LIBMVEC; a loop without such calls keeps the scalar form alone."""
    monkeypatch.setattr(cpp, "VECTOR_TYPES", None)
    x = torch.randn(7, 45)
    for flags in (cpp_build.compile_flags(), tuple(f for f in cpp_build.compile_flags() if f != "-DEMBER_USE_LIBMVEC")):
        monkeypatch.setattr(cpp_build, "compile_flags", functools.lru_cache(None)(lambda flags=flags: flags))
        compiled, sources = compile_recording(lambda t: F.gelu(t) + torch.erf(t))
        torch.testing.assert_close(compiled(x), F.gelu(x) + torch.erf(x))
        assert "#ifndef EMBER_USE_LIBMVEC" in kernels(sources) and "erff(" in kernels(sources)
        plain, plain_sources = compile_recording(lambda t: t * 2 + 1)
        torch.testing.assert_close(plain(x), x * 2 + 1)
        assert "ember::vec_" not in kernels(plain_sources)
