"""Two forms of the C++ printer for a training step's pointwise kernels (codegen/cpp.py):

* a pointwise kernel's innermost loop split into ranges at the points where a comparison of its
  var or a wrap-around (``% d``) changes (``KernelPrinter.innermost_segments``): a concatenation
  (attention's q/k/v gradients assembled into one [B, T, 3C] buffer) becomes one contiguous copy
  per part instead of a gather that reads every part at every column;
* a column sum (a Linear's bias gradient) folded into the pointwise kernel before it that stores
  what it adds up, or into one that reads it (``fuse_column_sums``): per-thread partial sums,
  combined in thread order.

Each test compares with eager and asserts that the form was generated."""
from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

import ember
from ember.codegen import cpp
from models import SdpaCausalAttention

SPLIT = "ranges, on each of which every comparison"
FUSED = "column sum(s) of what this kernel stores or reads"


@pytest.fixture
def sources(monkeypatch) -> list[str]:
    """The C++ source of every CPU compile."""
    seen = []
    generate = cpp.generate_cpp

    def recording(sched, size_args=None):
        source = generate(sched, size_args)
        seen.append(source)
        return source
    monkeypatch.setattr(cpp, "generate_cpp", recording)
    return seen


def kernels_with(source: str, marker: str) -> list[str]:
    return [part for part in source.split('extern "C" void ')[1:] if marker in part]


def concat(a, b, c):
    return torch.cat([a * 2, b, c + 1], dim=-1)


def test_concatenation_split_into_contiguous_ranges(sources):
    g = torch.Generator().manual_seed(0)
    a, b, c = (torch.randn(4, 16, 512, generator=g) for _ in range(3))
    torch.testing.assert_close(ember.compile(concat)(a, b, c), concat(a, b, c), rtol=0, atol=0)
    (kernel,) = kernels_with(sources[-1], SPLIT)
    assert "% 512" not in kernel and kernel.count("#pragma omp simd") == 3, kernel


def test_negative_zero_and_nan_copied_through_ranges(sources):
    a = torch.tensor([[-0.0, float("nan"), 1.0] * 16])
    b = torch.tensor([[float("-inf"), -0.0] * 24])

    def fn(a, b):
        return torch.cat([a, b], dim=-1) * 1.0
    out = ember.compile(fn)(a, b)
    torch.testing.assert_close(out, fn(a, b), rtol=0, atol=0, equal_nan=True)
    assert torch.equal(torch.signbit(out), torch.signbit(fn(a, b)))
    assert kernels_with(sources[-1], SPLIT)


def test_short_ranges_keep_one_loop(sources):
    """Parts narrower than SEGMENT_MIN: one loop as before (and the same values)."""
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(64, 4, generator=g), torch.randn(64, 300, generator=g)

    def fn(a, b):
        return torch.cat([a, b + 1], dim=-1)
    torch.testing.assert_close(ember.compile(fn)(a, b), fn(a, b), rtol=0, atol=0)
    assert not kernels_with(sources[-1], SPLIT)


def test_padding_split_into_ranges(sources):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(8, 32, 100, generator=g)

    def fn(x):
        return F.pad(x * 3, (20, 40), value=-1.0)
    torch.testing.assert_close(ember.compile(fn)(x), fn(x), rtol=0, atol=0)
    assert kernels_with(sources[-1], SPLIT)


class MLP(torch.nn.Module):
    def __init__(self, dim: int = 128) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(dim, 4 * dim)
        self.proj = torch.nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


def wide_attention() -> SdpaCausalAttention:
    return SdpaCausalAttention(dim=128)


def train_and_compare(model_type, shape, threads: int | None = None) -> None:
    torch.manual_seed(0)
    model, reference = model_type(), model_type()
    reference.load_state_dict(model.state_dict())
    x = torch.randn(*shape, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_(True)
    grad = torch.randn(*shape)
    reference(x_ref).backward(grad)
    before = torch.get_num_threads()
    try:
        if threads is not None:
            torch.set_num_threads(threads)
        ember.compile(model)(x).backward(grad)
    finally:
        torch.set_num_threads(before)
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-4, atol=1e-4)
    for (name, p), p_ref in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, p_ref.grad, rtol=1e-4, atol=1e-4, msg=name)


@pytest.mark.parametrize("threads", [None, 1, 3])
def test_bias_gradient_folded_into_gelu_backward(sources, threads):
    train_and_compare(MLP, (4, 64, 128), threads)
    backward = sources[-1]
    (kernel,) = kernels_with(backward, FUSED)
    assert "erf" in kernel and "_part[" in kernel, kernel


def test_qkv_gradient_ranges_and_bias_gradient_in_one_kernel(sources):
    train_and_compare(wide_attention, (2, 64, 128))
    backward = sources[-1]
    assert any(SPLIT in kernel for kernel in kernels_with(backward, FUSED)), backward


def test_fused_and_separate_sums_agree(sources, monkeypatch):
    """FUSE_COLUMN_SUMS off: the sum kernels of their own, and the same gradients (to rounding)."""
    train_and_compare(MLP, (2, 32, 128))
    assert kernels_with(sources[-1], FUSED)
    monkeypatch.setattr(cpp, "FUSE_COLUMN_SUMS", False)
    ember.reset()
    train_and_compare(MLP, (2, 32, 128))
    assert not kernels_with(sources[-1], FUSED)


class ResidualMLP(torch.nn.Module):
    """The second half of a nanoGPT block: the output gradient's column sum (the projection's bias
    gradient) folds into the layer norm backward's last kernel, which reads it for the residual."""

    def __init__(self, dim: int = 128) -> None:
        super().__init__()
        self.ln = torch.nn.LayerNorm(dim)
        self.mlp = MLP(dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.mlp(self.ln(x))


def test_sum_of_an_input_folded_into_a_later_reader(sources):
    train_and_compare(ResidualMLP, (4, 64, 128))
    backward = sources[-1]
    readers = [kernel for kernel in kernels_with(backward, FUSED) if "in_tangent" in kernel.split(")")[0]]
    assert readers, backward
    assert not any(kernel.count("prims.sum") == 1 and "1 fused ops" in kernel for kernel in backward.split("// kernel")), \
        backward


class Norm(torch.nn.Module):
    def __init__(self, dim: int = 128) -> None:
        super().__init__()
        self.ln = torch.nn.LayerNorm(dim)
        with torch.no_grad():      # not the initial ones and zeros: every gradient term counts
            self.ln.weight.uniform_(0.5, 1.5)
            self.ln.bias.uniform_(-0.5, 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.ln(x * 2) * 3


@pytest.mark.parametrize("threads", [None, 1, 3])
def test_norm_weight_and_bias_gradients_folded_into_the_row_kernel(sources, threads):
    """A layer norm backward's weight and bias gradients (column sums of the output gradient and of
    it times the normalized input) fold into the row kernel that reads the one and computes the
    other: no column-tiled kernel of their own, and its stored normalized input is not stored."""
    train_and_compare(Norm, (4, 64, 128), threads)
    backward = sources[-1]
    rows = [kernel for kernel in kernels_with(backward, FUSED) if "reduction(+:" in kernel]
    assert rows and "_part[r0] +=" in rows[0], backward
    assert "column-tiled reduction" not in backward, backward
