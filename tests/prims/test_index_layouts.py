"""Advanced indexing (``x[idx]``) lays its result out as eager's aten::index does: a TensorIterator
over the result whose operands are the source (its kept dims) and the index tensors, so a
transposed or channels-last x keeps its order of the kept dims (``x.t()[idx]`` is not
contiguous in eager).  ember's index prim made every such result contiguous (fuzzer seeds 5011,
15527).  Every index pattern below over every layout, values and strides against eager, and the
graph compiled."""
from __future__ import annotations

import pytest
import torch

import ember


def _layouts():
    torch.manual_seed(0)
    return {
        "contiguous": torch.randn(4, 5, 6),
        "transposed": torch.randn(4, 6, 5).transpose(1, 2),
        "permuted": torch.randn(6, 4, 5).permute(1, 2, 0),
        "channels_last": torch.randn(4, 5, 6, 3).to(memory_format=torch.channels_last),
        "sliced": torch.randn(4, 5, 12)[..., ::2],
    }


I, J = torch.tensor([0, -1, 2]), torch.tensor([[1, 0], [3, 3]])
PATTERNS = {
    "x[i]": lambda x: x[I],
    "x[:, i]": lambda x: x[:, I],
    "x[..., i]": lambda x: x[..., I],
    "x[j]": lambda x: x[J],
    "x[:, j]": lambda x: x[:, J],
    "x[i, i]": lambda x: x[I, I],
    "x[:, i, i]": lambda x: x[:, I, I],
    "x[i, :, i] (not adjacent)": lambda x: x[I, :, I],
    "x[[0, 2]]": lambda x: x[[0, 2]],
    "x[i, 1:]": lambda x: x[I, 1:],
    "x[1:, None, i]": lambda x: x[1:, None, I],
    "x[strided index]": lambda x: x[torch.tensor([[0, 1], [2, 3]]).t()],
    "x[j, i2] (broadcast)": lambda x: x[J, torch.tensor([1, 0])],
    "x[col, :, i] (broadcast, not adjacent)": lambda x: x[torch.tensor([[0], [2]]), :, I],
    "x[i] * 2": lambda x: x[I] * 2,
}


@pytest.mark.parametrize("layout", list(_layouts()))
def test_advanced_index_results_have_eagers_strides(layout):
    x = _layouts()[layout]

    def program(x):
        return [pattern(x) for pattern in PATTERNS.values()]
    report = ember.explain(program, x)
    assert report.graph_count == 1 and report.break_count == 0, str(report)
    assert not getattr(report.compiled[0], "eager_reason", None), str(report)
    for name, got, expected in zip(PATTERNS, report.output, program(x)):
        torch.testing.assert_close(got, expected, rtol=0, atol=0, msg=name)
        assert got.stride() == expected.stride(), (name, got.stride(), expected.stride())


def test_index_of_a_transposed_input_trains_as_eager():
    """The gradient flows back through the re-laid-out result (an index_put of the incoming grad)."""
    x = torch.randn(6, 5).t()
    xe, xc = x.clone().requires_grad_(), x.clone().requires_grad_()

    def fn(x):
        y = x[torch.tensor([4, 0, 4])]
        return y * torch.arange(y.numel()).reshape(y.shape)
    expected = fn(xe)
    actual = ember.compile(fn, options={"fallback": "error"})(xc)
    assert actual.stride() == expected.stride()
    expected.sum().backward()
    actual.sum().backward()
    torch.testing.assert_close(actual, expected)
    torch.testing.assert_close(xc.grad, xe.grad)
