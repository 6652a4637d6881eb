"""Programs the fuzzer (tests/fuzz) found miscompiled in the code generators, through ember.compile
on the C++ path and the Triton interpreter path, compared with eager (values bit for bit, dtypes)."""
from __future__ import annotations

import warnings

import pytest
import torch

import ember
from ember.api import CompileFallbackWarning

BACKENDS = [{"fallback": "error"}, {"fallback": "error", "cpu_backend": "triton"}]


def assert_same_as_eager(fn, *args, options):
    expected = fn(*[a.clone() for a in args])
    with warnings.catch_warnings():
        warnings.simplefilter("error", CompileFallbackWarning)      # no eager fallback either
        actual = ember.compile(fn, options=options)(*[a.clone() for a in args])
    for a, e in zip(actual, expected):
        assert a.dtype == e.dtype and a.shape == e.shape
        torch.testing.assert_close(a, e, rtol=0, atol=0, equal_nan=True)
        # signed zeros and infinities must match too
        assert torch.equal(torch.signbit(a), torch.signbit(e))


@pytest.mark.parametrize("options", BACKENDS, ids=["cpp", "triton"])
def test_float_to_int_to_float_keeps_positive_zero(options):
    """fuzz seed 5167: g++ folded (double)(int)x into trunc(x) (-0.0 for x in (-1, 0)), so
    x / x.int() gave -inf where eager's integer 0 divides to +inf."""
    def f(a0):
        return (a0 / a0.to(torch.int32), a0.to(torch.int64).to(a0.dtype))
    for dtype in (torch.float64, torch.float32):
        assert_same_as_eager(f, torch.tensor([-0.3, 0.3, -1.5, -0.0, 2.7], dtype=dtype), options=options)


@pytest.mark.parametrize("options", BACKENDS, ids=["cpp", "triton"])
def test_gathered_index_read_only_as_a_branch_condition(options):
    """fuzz seed 1076: an index_select index used only in cat's branch condition (both branches
    read the same 0-d input) was missing from the kernel's arguments: g++ failed.  (Triton's
    interpreter rejected minimum's `|` of two compares of 0-d loads until minimum became nested
    wheres.)"""
    def f(a0):
        v0 = torch.stack([a0, a0])
        return (torch.minimum(a0, v0).index_select(0, torch.tensor([1, 0, 1])),)
    assert_same_as_eager(f, torch.tensor(0.5), options=options)
    assert_same_as_eager(f, torch.tensor(-2.0, dtype=torch.bfloat16), options=options)
