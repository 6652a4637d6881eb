"""Passes over rows split across threads (``KernelPrinter.splits_rows``): a reduction kernel with
fewer rows than torch.get_num_threads() threads (or a last round of rows leaving threads idle)
runs its rows one after another, each pass an OpenMP loop over the row's elements (off by
default: cpp.SPLIT_ROWS).  Compared with
eager at sizes that take the split form and at sizes that do not; the source is checked for the
form."""
from __future__ import annotations

import pytest
import torch

from ember.codegen import cpp
from recording import compile_recording

SPLIT = "is split over the threads instead"
LONG = cpp.PARALLEL_THRESHOLD + 17       # rows long enough to split, and not a multiple of 16

FUNCTIONS = {
    "sum": lambda t: t.sum(-1),
    "mean": lambda t: t.mean(-1),
    "amax": lambda t: t.amax(-1),
    "var": lambda t: torch.var(t, -1),
    "var_mean": lambda t: torch.var_mean(t, -1, correction=0),
    "argmax": lambda t: t.argmax(-1),
    "softmax": lambda t: torch.softmax(t, -1),
    "sum-two-dims": lambda t: t.sum((1, 2)),
}


@pytest.fixture
def two_threads(monkeypatch):
    monkeypatch.setattr(cpp, "SPLIT_ROWS", True)      # off by default (slower where measured)
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)


@pytest.mark.parametrize("rows, splits", [(1, True), (3, True), (4, False), (5, False)])
@pytest.mark.parametrize("name", list(FUNCTIONS))
def test_split_rows_match_eager(two_threads, name, rows, splits):
    torch.manual_seed(0)
    fn = FUNCTIONS[name]
    x = torch.randn(rows, 3, LONG // 3 + 1) if name == "sum-two-dims" else torch.randn(rows, LONG) * 2 + 1
    compiled, sources = compile_recording(fn)
    expected = fn(x)
    actual = compiled(x)
    if name == "argmax":
        assert torch.equal(actual, expected)
    else:
        torch.testing.assert_close(actual, expected, rtol=2e-5, atol=1e-5)
    assert (SPLIT in sources[0]) == splits


def test_split_off_gives_close_values(two_threads, monkeypatch):
    x = torch.randn(3, LONG)
    compiled, sources = compile_recording(lambda t: torch.softmax(t, -1))
    split = compiled(x)
    monkeypatch.setattr(cpp, "SPLIT_ROWS", False)
    plain, plain_sources = compile_recording(lambda t: torch.softmax(t, -1))
    torch.testing.assert_close(split, plain(x))
    assert SPLIT in sources[0] and SPLIT not in plain_sources[0]
