"""The C++ generator's float exp where its argument may be far below zero (cpp.py INLINE_EXPF: a
masked value or one minus a row's max) goes through cpp_prelude.py's ``ember_expf``, vectorized on
every input (libmvec's expf goes lane by lane on -inf and below about -87, as in a causal softmax);
other exps keep libmvec's.  Both equal eager's exp over the whole float range: overflow, denormal
results, infinities and NaN."""
from __future__ import annotations

import pytest
import torch

from ember.codegen import cpp
from recording import compile_recording


def whole_range(dtype: torch.dtype) -> torch.Tensor:
    specials = [float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 88.72283, 88.7229, -87.33, -103.9, -104.5]
    return torch.cat([torch.linspace(-120, 95, 200_000), torch.tensor(specials)]).to(dtype)


def exp_and_sigmoid(t):
    return torch.exp(t), torch.sigmoid(t)


def shifted_exp(t):                          # exp(x - max): the softmax form, far below zero
    return torch.exp(t - t.amax(-1, keepdim=True)), torch.exp(t.masked_fill(t < -100, float("-inf")))


def causal_softmax(scores):
    mask = torch.ones(scores.shape[-2:], dtype=torch.bool).tril()
    return torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)


def kernels_of(source: str) -> str:
    return source.split("// kernel0")[-1]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_exp_and_sigmoid_over_the_whole_range(dtype):
    x = whole_range(dtype)
    compiled, sources = compile_recording(exp_and_sigmoid)
    for actual, expected in zip(compiled(x), exp_and_sigmoid(x)):
        torch.testing.assert_close(actual, expected, equal_nan=True)
    assert "ember_expf(" not in kernels_of(sources[0])          # plain exps keep libmvec's


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_shifted_and_masked_exp_over_the_whole_range(dtype):
    x = whole_range(dtype)[:-10].reshape(-1, 50)   # no NaN: a NaN row max makes the whole row NaN
    x[3, 7], x[5, :] = float("nan"), float("-inf")
    compiled, sources = compile_recording(shifted_exp)
    for actual, expected in zip(compiled(x), shifted_exp(x)):
        torch.testing.assert_close(actual, expected, equal_nan=True)
    assert ("ember_expf(" in kernels_of("".join(sources))) == (dtype != torch.float64)


def test_exp_within_two_ulp_of_eager_on_normal_results():
    x = torch.linspace(-87, 88.7, 1_000_001)
    masked = lambda t: torch.exp(t.masked_fill(t < -1000, float("-inf")))   # the form that uses ember_expf
    compiled, sources = compile_recording(masked)
    actual, expected = compiled(x), torch.exp(x)
    assert "ember_expf(" in kernels_of(sources[0])
    ulp = (actual.double() - expected.double()).abs() / torch.finfo(torch.float32).eps / expected.double()
    assert ulp.max().item() <= 2


def test_causal_softmax_matches_eager():
    torch.manual_seed(0)
    scores = torch.randn(2, 3, 67, 67) * 30      # odd rows; logits far below the row max too
    compiled, sources = compile_recording(causal_softmax)
    torch.testing.assert_close(compiled(scores), causal_softmax(scores))
    assert "ember_expf(" in sources[0]


def test_libmvec_form_still_available(monkeypatch):
    monkeypatch.setattr(cpp, "INLINE_EXPF", False)
    x = whole_range(torch.float32)[:-10].reshape(-1, 50)
    compiled, sources = compile_recording(shifted_exp)
    for actual, expected in zip(compiled(x), shifted_exp(x)):
        torch.testing.assert_close(actual, expected, equal_nan=True)
    assert "ember_expf(" not in kernels_of(sources[0])
