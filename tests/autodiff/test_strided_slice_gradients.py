"""Gradients of strided slices (x[a:b:step]: zeros put after each element, reshaped and padded),
against eager, walking starts, ends and steps on one and two dims; the backward stays one kernel
that writes the gradient (no intermediate of the input's size)."""
from __future__ import annotations

import re

import pytest
import torch
from recording import compile_keeping

SLICES = [
    (slice(None, None, 2),), (slice(1, None, 2),), (slice(1, 8, 3),), (slice(-5, None, 2),),
    (slice(None, -1, 4),), (slice(2, 3, 5),), (slice(0, 11, 11),),
    (slice(None), slice(None, None, 2)), (slice(1, None, 3), slice(2, None, 2)),
]


@pytest.mark.parametrize("index", SLICES, ids=lambda s: str(s).replace(" ", ""))
def test_strided_slice_gradient_matches_eager(index):
    def fn(x):
        return (x[index] * 2).sin()

    torch.manual_seed(0)
    x = torch.randn(11, 7)
    compiled, graphs = compile_keeping(fn, {"fallback": "error"})
    x_e, x_c = x.clone().requires_grad_(), x.clone().requires_grad_()
    out_e, out_c = fn(x_e), compiled(x_c)
    grad = torch.randn_like(out_e)
    (g_e,) = torch.autograd.grad(out_e, x_e, grad)
    (g_c,) = torch.autograd.grad(out_c, x_c, grad)
    torch.testing.assert_close(out_c, out_e)
    torch.testing.assert_close(g_c, g_e)
    backward = graphs[0].call.backward_compiled.source.split("# ---- kernels")[0]
    # one kernel writes the input's gradient; nothing else is allocated
    assert backward.count("torch.empty_strided(") == 1 and len(re.findall(r"^\s+kernel\d+\(", backward, re.MULTILINE)) == 1, \
        backward
