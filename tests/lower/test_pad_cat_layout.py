"""F.pad and torch.cat keep channels-last inputs channels-last, as eager's constant_pad_nd and cat
do (the inputs' suggested memory format): values and strides of padded, cropped, unchanged and
concatenated tensors, returned and read by a convolution, in the default CPU configuration.
(torch.stack of channels-last tensors still comes out contiguous where eager's is not.)"""
from __future__ import annotations

import pytest
import torch
from torch import nn

import ember


@pytest.mark.parametrize("pad", [(1, 2, 0, 1), (0, 0, 0, 0), (-1, 1, 2, -2), (1, 1)])
@pytest.mark.parametrize("channels_last", [True, False], ids=["channels_last", "contiguous"])
def test_pad_keeps_eagers_memory_format(pad, channels_last):
    torch.manual_seed(0)
    conv1, conv2 = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 4, 1)

    def fn(x):
        y = nn.functional.pad(torch.relu(conv1(x)), pad)
        return conv2(y), y, nn.functional.pad(x, pad, value=1.5)
    x = torch.randn(2, 3, 10, 10)
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    with torch.no_grad():
        got, expected = _compiled_outputs(fn, x), fn(x)
    for a, e in zip(got, expected):
        torch.testing.assert_close(a, e)
        assert a.stride() == e.stride()


@pytest.mark.parametrize("dim", [0, 1, 2, 3])
def test_cat_keeps_a_common_channels_last_format(dim):
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 8, 3, padding=1)

    def fn(x, z):
        y = torch.relu(conv(x))
        return torch.cat([y, y * 2], dim), torch.cat([x, x + 1], dim), torch.cat([y, z], dim)
    x = torch.randn(2, 3, 10, 10).to(memory_format=torch.channels_last)
    z = torch.randn(2, 8, 10, 10)       # contiguous: a mixed cat is contiguous
    with torch.no_grad():
        got, expected = _compiled_outputs(fn, x, z), fn(x, z)
    for a, e in zip(got, expected):
        torch.testing.assert_close(a, e)
        assert a.stride() == e.stride()


def _compiled_outputs(fn, *args):
    """fn(*args) through ember, asserting it ran as one graph of generated kernels (not eagerly)."""
    report = ember.explain(fn, *args)
    assert report.graph_count == 1 and report.break_count == 0 and report.kernel_count >= 1, str(report)
    assert not getattr(report.compiled[0], "eager_reason", None), str(report)
    return report.output
