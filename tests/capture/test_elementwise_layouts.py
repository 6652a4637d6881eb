"""Binary elementwise ops give the result eager's layout when one operand is permuted, sliced or
channels-last and the other is 0-d or broadcast.  Capture takes result metadata from the meta
device, whose kernels for logical_and/or/xor, copysign and floor_divide lay such results out
contiguously where eager's CPU and CUDA kernels follow the permuted operand (and so does div with
a rounding_mode); capture corrects those with TensorIterator's rule (graph.elementwise_strides),
in which a lower-rank operand orders the trailing dims.  A number raised to a tensor is
contiguous in eager whatever the exponent's layout; the meta kernel follows the exponent.  Every
op, layout, partner and operand order is compared with eager: values and strides, and the graph
must be compiled."""
from __future__ import annotations

import operator

import pytest
import torch

import ember

OPS = {
    # the meta device differs from eager for these
    "logical_and": torch.logical_and, "logical_or": torch.logical_or, "logical_xor": torch.logical_xor,
    "copysign": torch.copysign, "floor_divide": torch.floor_divide, "//": operator.floordiv,
    "Tensor.logical_or": torch.Tensor.logical_or, "Tensor.copysign": torch.Tensor.copysign,
    "div_floor": lambda a, b: torch.div(a, b, rounding_mode="floor"),
    "Tensor.div_trunc": lambda a, b: a.div(b, rounding_mode="trunc"),
    # and agrees for these
    "add": torch.add, "mul": torch.mul, "maximum": torch.maximum, "eq": torch.eq,
    "atan2": torch.atan2, "remainder": torch.remainder,
}


def _layouts():
    return {
        "transposed": torch.randn(33, 2).t(),
        "permuted": torch.randn(4, 3, 5).permute(2, 0, 1),
        "channels_last": torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last),
        "sliced": torch.randn(6, 8)[:, ::2],
    }


def _partners(x):
    return [torch.tensor(1.5, dtype=torch.float64), torch.tensor(2), torch.tensor(True),
            torch.randn((1,) * (x.ndim - 1) + (x.shape[-1],)), torch.randn(x.shape[:-1] + (1,)),
            torch.randn(x.shape),
            # lower rank, aligned to the trailing dims: its strides order those dims
            torch.randn(x.shape[1:]), torch.randn(x.shape[-1])]


@pytest.mark.parametrize("layout", ["transposed", "permuted", "channels_last", "sliced"])
@pytest.mark.parametrize("op", list(OPS))
def test_result_layout_is_eagers(op, layout):
    torch.manual_seed(0)
    fn, x = OPS[op], _layouts()[layout]
    pairs = []
    for y in _partners(x):
        for a, b in ((x, y), (y, x)):
            try:
                fn(a, b)
            except RuntimeError:         # eager rejects it (bool floor_divide): nothing to compare
                continue
            pairs.append((a, b))
    flat = [t for pair in pairs for t in pair]

    def program(*tensors):
        return [fn(tensors[i], tensors[i + 1]) for i in range(0, len(tensors), 2)]
    report = ember.explain(program, *flat)
    assert report.graph_count == 1 and report.break_count == 0 and report.kernel_count >= 1, str(report)
    assert not getattr(report.compiled[0], "eager_reason", None), str(report)
    for (a, b), got, expected in zip(pairs, report.output, program(*flat)):
        where = f"{op}({'x' if a is x else tuple(a.shape)}, {'x' if b is x else tuple(b.shape)})"
        torch.testing.assert_close(got, expected, equal_nan=True, msg=where)
        assert got.stride() == expected.stride(), where


POWERS = {
    "1 ** x": lambda x: 1 ** x, "2 ** x": lambda x: 2 ** x, "-1 ** x": lambda x: -1 ** x,
    "torch.pow(1.5, x)": lambda x: torch.pow(1.5, x), "x.__rpow__(3)": lambda x: x.__rpow__(3),
    "True ** x": lambda x: True ** x,
    # a tensor base follows the tensor's layout, as any elementwise op
    "x ** 2": lambda x: x ** 2, "torch.pow(x, x)": lambda x: torch.pow(x, x),
}


@pytest.mark.parametrize("layout", ["transposed", "permuted", "channels_last", "sliced"])
def test_number_to_a_tensor_power_is_contiguous(layout):
    """Eager's pow(Scalar, Tensor) fills a fresh contiguous tensor whatever the exponent's layout
    (the meta kernel says otherwise); ``x ** n`` keeps x's layout."""
    x = _layouts()[layout]
    xs = [x, (x * 3).round().to(torch.int64) if x.ndim else x]

    def program(a, b):
        return [power(t) for power in POWERS.values() for t in (a, b)]
    report = ember.explain(program, *xs)
    assert report.graph_count == 1 and report.break_count == 0 and report.kernel_count >= 1, str(report)
    assert not getattr(report.compiled[0], "eager_reason", None), str(report)
    names = [f"{name} ({t.dtype})" for name in POWERS for t in xs]
    for name, got, expected in zip(names, report.output, program(*xs)):
        torch.testing.assert_close(got, expected, equal_nan=True, msg=name)
        assert got.stride() == expected.stride(), name
