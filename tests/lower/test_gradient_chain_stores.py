"""A backward stores a gradient that several later kernels read when recomputing it would keep
its inputs alive as long: ResNet's masked residual gradient relu_mask(y) * (g_skip + g_branch),
read by a block's batch-norm sums, its input gradient and the next residual add.  Recomputed in
each reader, every block's gradient chain grew by the block before it (the last kernels of a
ResNet-like stack loaded a dozen activations; ResNet-50's generated backward moved about a fifth
more bytes than it needs).  Gradients must still equal eager's."""
import copy

import pytest
import torch
from recording import record_compiled_graphs
from torch import nn

import ember
from ember.lower.scheduler import FusedKernel


class Block(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv1, self.bn1 = nn.Conv2d(c, c, 1, bias=False), nn.BatchNorm2d(c)
        self.conv2, self.bn2 = nn.Conv2d(c, c, 1, bias=False), nn.BatchNorm2d(c)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(y)) + x)


def _kernel_bytes(compiled) -> list[int]:
    """Bytes each kernel of a compiled program moves."""
    return [step.bytes_accessed for step in compiled.schedule.steps if isinstance(step, FusedKernel)]


@pytest.mark.parametrize("cpu_backend", ["triton", "cpp"])
def test_residual_gradient_chain_is_stored_once(cpu_backend, monkeypatch):
    if cpu_backend == "triton":
        pytest.importorskip("triton")
    made = record_compiled_graphs(monkeypatch)
    torch.manual_seed(0)
    channels, blocks = 16, 6
    net = nn.Sequential(*[Block(channels) for _ in range(blocks)]).to(memory_format=torch.channels_last)
    reference = copy.deepcopy(net)
    x = torch.randn(4, channels, 8, 8).to(memory_format=torch.channels_last)
    out = ember.compile(net, options={"cpu_backend": cpu_backend, "fallback": "error"})(x)
    expected = reference(x)
    out.square().mean().backward()
    expected.square().mean().backward()
    torch.testing.assert_close(out, expected)
    for (name, p), q in zip(net.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=name)
    activation = x.numel() * x.element_size()
    moved = _kernel_bytes(made[0].call.backward_compiled)
    # a batch-norm backward kernel reads the gradient, the saved input and the ReLU output and
    # writes one gradient: about 4 activations; a recomputed chain of 6 blocks read more than 10
    assert max(moved) <= 6 * activation, [round(b / activation, 1) for b in moved]
