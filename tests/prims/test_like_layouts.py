"""zeros_like / ones_like / full_like / empty_like keep eager's layout (empty_like's, preserve_format,
the default): the input's strides when it is dense, dense strides in the input's order of dims when
it is not (a strided slice of a transposed tensor stays transposed; a slice of a contiguous one, an
expanded tensor, come out contiguous), contiguous or channels-last when asked.  So do x.clone(),
x.to(copy=True) and out-of-place index_put, all empty_like's.  Values and strides against eager."""
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
    # not dense, and not in contiguous order: eager's infer_dense_strides keeps the order
    "transposed_sliced": lambda: torch.randn(5, 10).t()[::2],
    "permuted_sliced": lambda: torch.randn(3, 4, 5).permute(2, 0, 1)[:, 1:],
    "channels_last_sliced": lambda: torch.randn(2, 3, 4, 10).to(memory_format=torch.channels_last)[..., ::2],
}
CREATIONS = {
    "zeros_like": lambda x: torch.zeros_like(x),
    "ones_like_float64": lambda x: torch.ones_like(x, dtype=torch.float64),
    "full_like": lambda x: torch.full_like(x, 2.5),
    "empty_like_filled": lambda x: torch.empty_like(x).fill_(3),
    "zeros_like_contiguous": lambda x: torch.zeros_like(x, memory_format=torch.contiguous_format),
    "ones_like_plus_x": lambda x: torch.ones_like(x) + x,
    "clone": lambda x: x.clone() * 1,
    "to_copy": lambda x: x.to(copy=True),
    "index_put": lambda x: torch.index_put(x, (torch.tensor([1]),), torch.tensor(3.0)),
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
