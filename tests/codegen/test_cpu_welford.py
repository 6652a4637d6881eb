"""One-pass Welford variance in the C++ code generator (``KernelPrinter.emit_welford_lanes``):
var / std / var_mean / layer_norm / batch-norm statistics per row in one pass, 16 lanes of running
(mean, M2) over values shifted by the row's first one, combined after the loop.  Compared with
eager in float64, on rows where a float32 sum of squares cannot work (mean 1e4, standard deviation
1e-2), and on the edges (tails, several reduced dims, empty rows, inf and NaN, float64, bf16).  The
generated source is checked for the form, so that a plan that silently stops firing fails here."""
from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

from ember.codegen import cpp
from recording import compile_recording

WELFORD = "ember_welford_lanes<"


def large_mean(*shape, dtype=torch.float32):
    """Values 1e4 + N(0, 1e-2^2), rounded to ``dtype``: float32's spacing there is 1e-3."""
    return (1e4 + 1e-2 * torch.randn(*shape, dtype=torch.float64)).to(dtype)


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    return ((actual.double() - expected).abs() / expected.abs()).max().item()


def test_sum_of_squares_would_fail_here():
    """The data is a real test: E[x^2] - E[x]^2 in float32 is off by far more than the variance."""
    x = large_mean(8, 4096)
    naive = (x * x).mean(-1) - x.mean(-1) ** 2
    assert relative_error(naive, torch.var(x.double(), -1, correction=0)) > 1.0


@pytest.mark.parametrize("size", [4096, 1000, 37])      # whole blocks of 16; a tail; mostly tail
def test_variance_of_large_mean_rows(size):
    torch.manual_seed(0)
    x = large_mean(16, size)
    reference = x.double()
    compiled, sources = compile_recording(lambda t: torch.var_mean(t, -1))
    var, mean = compiled(x)
    assert WELFORD in sources[0]
    assert relative_error(var, torch.var(reference, -1)) < 1e-5      # 2.5e-7 seen; two-pass 2e-3
    assert (mean.double() - reference.mean(-1)).abs().max().item() < 2e-3     # float32's spacing at 1e4: 1e-3
    compiled_std, _ = compile_recording(lambda t: torch.std(t, -1, correction=0))
    assert relative_error(compiled_std(x), torch.std(reference, -1, correction=0)) < 1e-5


def test_welford_at_least_as_accurate_as_two_pass(monkeypatch):
    torch.manual_seed(0)
    x = large_mean(32, 2048)
    expected = torch.var(x.double(), -1)
    one_pass, sources = compile_recording(lambda t: torch.var(t, -1))
    error = relative_error(one_pass(x), expected)
    monkeypatch.setattr(cpp, "WELFORD_LANES", 0)
    two_pass, two_pass_sources = compile_recording(lambda t: torch.var(t, -1))
    two_pass_error = relative_error(two_pass(x), expected)
    assert WELFORD in sources[0] and WELFORD not in two_pass_sources[0]
    assert error <= two_pass_error and error < 1e-5, (error, two_pass_error)


def test_layer_norm_of_large_mean_rows(monkeypatch):
    """The normalized values depend on the mean to 1e-3 / 1e-2: a float32 mean is within half of
    float32's spacing at 1e4 (5e-4), which moves them by up to 0.05.  Seen: 0.044 (the two-pass
    form 0.064, eager in float32 0.108)."""
    torch.manual_seed(0)
    x = large_mean(8, 1024)
    expected = F.layer_norm(x.double(), (1024,), eps=1e-12)
    compiled, sources = compile_recording(lambda t: F.layer_norm(t, (1024,), eps=1e-12))
    error = (compiled(x).double() - expected).abs().max().item()
    monkeypatch.setattr(cpp, "WELFORD_LANES", 0)
    two_pass, _ = compile_recording(lambda t: F.layer_norm(t, (1024,), eps=1e-12))
    assert WELFORD in sources[0]
    assert error < 0.055 and error <= (two_pass(x).double() - expected).abs().max().item()


CASES = [
    ("var-odd", lambda: (torch.randn(7, 333),), lambda t: torch.var(t, -1), {}),
    ("var-two-dims", lambda: (torch.randn(5, 6, 50),), lambda t: torch.var(t, (1, 2), keepdim=True), {}),
    ("var-middle-dim", lambda: (torch.randn(4, 40, 3),), lambda t: torch.var(t, 1, correction=0), {}),
    ("std-correction-2", lambda: (torch.randn(6, 21),), lambda t: torch.std(t, -1, correction=2), {}),
    ("var-mean-fp64", lambda: (torch.randn(5, 77, dtype=torch.float64),), lambda t: torch.var_mean(t, -1), {}),
    ("var-bf16", lambda: (torch.randn(5, 300, dtype=torch.bfloat16),), lambda t: torch.var(t, -1),
     {"rtol": 1.6e-2, "atol": 1e-5}),
    ("layer-norm-tail", lambda: (torch.randn(3, 9, 70), torch.randn(70), torch.randn(70)),
     lambda t, w, b: F.layer_norm(t, (70,), w, b), {}),
    ("batch-norm-train", lambda: (torch.randn(4, 6, 5, 7) * 3 + 2,),
     lambda t: F.batch_norm(t, None, None, training=True), {}),
    ("short-rows", lambda: (torch.randn(10, 3),), lambda t: torch.var_mean(t, -1), {}),
    ("one-element", lambda: (torch.randn(10, 1),), lambda t: torch.var_mean(t, -1, correction=0), {}),
]


@pytest.mark.parametrize("name, make, fn, tolerances", CASES, ids=[c[0] for c in CASES])
def test_welford_matches_eager(name, make, fn, tolerances):
    torch.manual_seed(0)
    args = make()
    compiled, sources = compile_recording(fn)
    torch.testing.assert_close(compiled(*args), fn(*args), equal_nan=True, **tolerances)
    assert any(WELFORD in s for s in sources)


def test_inf_nan_and_empty_rows():
    """A row holding inf: mean inf (or NaN for both signs), variance NaN, as eager; NaN propagates;
    an empty row: NaN both."""
    x = torch.randn(6, 40)
    x[0, 0] = float("inf")          # the shift itself is inf
    x[1, 17] = float("inf")
    x[2, 3], x[2, 30] = float("inf"), float("-inf")
    x[3, 39] = float("nan")
    x[4, 0] = float("-inf")
    compiled, sources = compile_recording(lambda t: torch.var_mean(t, -1))
    torch.testing.assert_close(compiled(x), torch.var_mean(x, -1), equal_nan=True)
    assert WELFORD in sources[0]
    empty = torch.randn(3, 0)
    compiled_empty, _ = compile_recording(lambda t: torch.var_mean(t, -1))
    torch.testing.assert_close(compiled_empty(empty), torch.var_mean(empty, -1), equal_nan=True)
