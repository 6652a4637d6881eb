"""Values a pass over a row needs but that do not change along it are computed once before the
pass's loops (cpp.KernelPrinter.emit_row_invariants): above all an embedding's gathered row index
and its bounds check, which g++ cannot hoist itself (a call that may record an error) and which
kept the loop from vectorizing.  Results, and the IndexError of a bad index, stay eager's."""
from __future__ import annotations

import re

import pytest
import torch
from torch.nn import functional as F

from recording import compile_recording


def embed_and_norm(idx, wte, wpe, w, b):
    x = wte[idx] + wpe[torch.arange(idx.shape[1])]
    return F.layer_norm(x, (x.shape[-1],), w, b)


def inputs(vocab=50, positions=16, dim=24):
    g = torch.Generator().manual_seed(0)
    return [torch.randint(0, vocab, (2, positions), generator=g), torch.randn(vocab, dim, generator=g),
            torch.randn(positions, dim, generator=g), torch.randn(dim, generator=g), torch.randn(dim, generator=g)]


def test_bounds_checks_before_the_loops():
    args = inputs()
    compiled, sources = compile_recording(embed_and_norm)
    torch.testing.assert_close(compiled(*args), embed_and_norm(*args))
    kernel = sources[0].split("# ---- kernels")[-1]
    body = kernel[kernel.index('extern "C" void kernel'):]
    first_loop = body.index("#pragma omp simd")
    checks = [m.start() for m in re.finditer(r"ember_check_index\(", body)]
    assert len(checks) == 2 and all(position < first_loop for position in checks), body


def test_bad_index_still_raises():
    args = inputs()
    compiled, _ = compile_recording(embed_and_norm)
    compiled(*args)
    args[0] = args[0].clone()
    args[0][1, 3] = 50
    with pytest.raises(IndexError):
        compiled(*args)


def test_empty_rows_hoist_nothing():
    """A row of no elements: a hoisted load would read past the end of an empty buffer."""
    def gather_sum(table, idx, scale):
        return (table[idx] * scale[idx].unsqueeze(-1)).sum(-1)
    table, scale = torch.randn(5, 0), torch.randn(5)
    idx = torch.tensor([[0, 4], [2, 1]])
    compiled, _ = compile_recording(gather_sum)
    torch.testing.assert_close(compiled(table, idx, scale), gather_sum(table, idx, scale))
