"""Shared values the GPU recomputes instead of storing: a value read by several kernels is
stored once when its body is expensive (a transcendental function), unless every later reader
loads the value's inputs anyway.  Llama's SiLU backward stored a float32 sigmoid of the gate (46 MB
a layer on the H100) for a second kernel that loads the gate itself."""
import copy
import re

import pytest
import torch
from torch import nn

import ember
from recording import record_compiled_graphs


class GatedMLP(nn.Module):
    def __init__(self, d: int = 32, hidden: int = 48) -> None:
        super().__init__()
        self.gate = nn.Linear(d, hidden, bias=False)
        self.up = nn.Linear(d, hidden, bias=False)
        self.down = nn.Linear(hidden, d, bias=False)

    def forward(self, x):
        return self.down(nn.functional.silu(self.gate(x)) * self.up(x))


@pytest.mark.parametrize("cpu_backend", ["triton", "cpp"])
def test_silu_backward_recomputes_the_sigmoid_on_the_gpu_path(cpu_backend, monkeypatch):
    if cpu_backend == "triton":
        pytest.importorskip("triton")
    made = record_compiled_graphs(monkeypatch)
    torch.manual_seed(0)
    net = nn.Sequential(GatedMLP(), GatedMLP()).to(torch.bfloat16)
    reference = copy.deepcopy(net)
    x = torch.randn(4, 16, 32, dtype=torch.bfloat16)
    for _ in range(2):
        net.zero_grad()
        reference.zero_grad()
        out = ember.compile(net, options={"cpu_backend": cpu_backend, "fallback": "error"})(x)
        expected = reference(x)
        out.float().square().mean().backward()
        expected.float().square().mean().backward()
        torch.testing.assert_close(out, expected, rtol=0, atol=0)
        for (name, p), q in zip(net.named_parameters(), reference.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=0, atol=0, msg=name)
    wrapper = made[0].call.backward_compiled.source.split("# ---- kernels")[0]
    stored_sigmoids = re.findall(r"(sigmoid\w*) = torch.empty_strided", wrapper)
    if cpu_backend == "triton":
        assert stored_sigmoids == [], wrapper
    else:   # C++ kernels: an exp per element costs more than the loads it saves
        assert stored_sigmoids, wrapper
