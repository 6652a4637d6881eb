"""zeros_like / ones_like / full_like / empty_like keep eager's layout: the input's strides when it
is dense (preserve_format, the default), contiguous when it is not (a strided slice, an expanded
tensor) or when asked, channels-last when asked.  Values and strides against eager."""
from __future__ import annotations

import pytest
import torch

import ember

INPUTS = {
    "contiguous": lambda: torch.randn(3, 4),
    "transposed": lambda: torch.randn(3, 4).t(),
    "strided": lambda: torch.randn(4, 6)[:, ::2],
    "expanded": lambda: torch.randn(3, 1).expand(3, 4),
    "permuted_4d": lambda: torch.randn(2, 3, 4, 5).permute(0, 2, 3, 1),
    "channels_last": lambda: torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last),
}
CREATIONS = {
    "zeros_like": lambda x: torch.zeros_like(x),
    "ones_like_float64": lambda x: torch.ones_like(x, dtype=torch.float64),
    "full_like": lambda x: torch.full_like(x, 2.5),
    "empty_like_filled": lambda x: torch.empty_like(x).fill_(3),
    "zeros_like_contiguous": lambda x: torch.zeros_like(x, memory_format=torch.contiguous_format),
    "ones_like_plus_x": lambda x: torch.ones_like(x) + x,
}


@pytest.mark.parametrize("create", CREATIONS, ids=str)
@pytest.mark.parametrize("layout", INPUTS, ids=str)
def test_like_keeps_eagers_strides(layout, create):
    x = INPUTS[layout]()
    fn = CREATIONS[create]
    got, expected = _compiled_output(fn, x), fn(x)
    assert torch.equal(got, expected)
    assert got.stride() == expected.stride()


def _compiled_output(fn, x):
    """fn(x) through ember, asserting it ran as one graph of generated kernels (not eagerly)."""
    report = ember.explain(fn, x)
    assert report.graph_count == 1 and report.break_count == 0 and report.kernel_count >= 1, str(report)
    assert not getattr(report.compiled[0], "eager_reason", None), str(report)
    return report.output


@pytest.mark.parametrize("layout", ["permuted_4d", "channels_last", "contiguous_4d"])
def test_like_channels_last_when_asked(layout):
    x = torch.randn(2, 3, 4, 5) if layout == "contiguous_4d" else INPUTS[layout]()

    def fn(x):
        return torch.zeros_like(x, memory_format=torch.channels_last) + 1
    got, expected = _compiled_output(fn, x), fn(x)
    assert torch.equal(got, expected)
    assert got.stride() == expected.stride()
