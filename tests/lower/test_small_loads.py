"""A value read by several kernels is stored once when recomputing it is expensive: a
transcendental function, many ops, or many loads.  Loads of buffers far smaller than the value (a
per-channel weight, a batch-norm statistic: a few cached bytes per row) do not count.  Counted, a
batch-norm backward stored ``weight * (g - ...)`` and read it back in a second pass for its
channel sums, on ResNet-50, MobileNetV3 and ConvNeXt (4.2 GB of a ResNet-50 step's 24)."""
import re

import pytest
import torch

import ember
from recording import record_compiled_graphs


def normalize_then_sum_and_scale(x, mean, rstd, weight, bias):
    y = (x - mean) * rstd * weight + bias       # one load of x's size, four of a row's
    return y * y.sum(0)                         # read by the column sum's kernel and the product's


@pytest.mark.parametrize("cpu_backend", ["triton", "cpp"])
def test_normalized_value_is_recomputed_not_stored(cpu_backend, monkeypatch):
    if cpu_backend == "triton":
        pytest.importorskip("triton")
    made = record_compiled_graphs(monkeypatch)
    torch.manual_seed(0)
    x = torch.randn(64, 16)
    rows = [torch.randn(16) for _ in range(4)]
    compiled = ember.compile(normalize_then_sum_and_scale, options={"cpu_backend": cpu_backend, "fallback": "error"})
    torch.testing.assert_close(compiled(x, *rows), normalize_then_sum_and_scale(x, *rows))
    wrapper = made[0].source.split("# ---- kernels")[0]
    launches = re.findall(r"^\s+(kernel\d+)\(", wrapper, re.M)
    allocations = re.findall(r"^\s+(\w+) = torch.empty_strided\(\((\d+), (\d+)\)", wrapper, re.M)
    assert len(launches) == 2, wrapper
    # the only (64, 16) buffer is the output: y is recomputed by both kernels
    assert [(a, b) for _, a, b in allocations] == [("64", "16")], wrapper
