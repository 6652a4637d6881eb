"""What the forward saves for the backward (autodiff/partition.py), checked on compiled training
against eager PyTorch: the output, the input's gradient and every parameter's gradient equal
eager's, and the backward does not recompute what it would store anyway.

* A GELU output that the weight gradient's matmul reads is saved, not recomputed: recomputed,
  the backward ran the GELU's erf in one kernel to store it for the matmul and again in the
  GELU-gradient kernel (the nanoGPT block's MLP: two erf passes over a [2048, 2048] activation).
* A linear layer's ``mm + bias`` that attention reads is saved rather than the bare ``mm`` (the
  two cost the same bytes): the attention backward reads the saved q, k, v, and the forward adds
  the bias inside the GEMM.  Saving ``mm``, the backward added the bias again (a 12 MB pass in
  the nanoGPT block) to rebuild q, k, v.
"""
from __future__ import annotations

import copy
import math
import operator

import torch
from torch import nn
from torch.nn import functional as F
from models import SdpaCausalAttention
from recording import compile_keeping
from training_util import assert_close, assert_same_grads

from ember.autodiff.partition import RECOMPUTE_MAX_READS
from ember.graph import Node, TensorMeta
from ember.lower.lowering import lower_graph
from ember.lower.scheduler import Schedule, schedule
from ember.prims.primitives import Prim

COMPILED: list = []     # the CompiledGraphs of the last _train_once


def _train_once(model: nn.Module, x: torch.Tensor) -> None:
    """One compiled forward + backward against eager: output, x.grad and parameter grads."""
    grad = torch.randn_like(x)
    _train_once_on(model, x, lambda out: (out * grad).sum())


def _train_once_on(model: nn.Module, x: torch.Tensor, loss) -> None:
    """_train_once with the loss ``loss(output)``; x requires grad when it is floating point."""
    model_c = copy.deepcopy(model)
    compiled, graphs = compile_keeping(model_c, {"fallback": "error"})
    x_c, x_e = x.clone().requires_grad_(x.is_floating_point()), x.clone().requires_grad_(x.is_floating_point())
    out_c, out_e = compiled(x_c), model(x_e)
    loss(out_c).backward()
    loss(out_e).backward()
    assert_close(out_c, out_e, "output")
    if x.is_floating_point():
        assert_close(x_c.grad, x_e.grad, "x.grad")
    assert_same_grads(model_c, model, type(model).__name__)
    assert [c.kind for c in graphs] == ["autograd"]
    COMPILED[:] = graphs


def _backward_graph():
    return COMPILED[0].call.backward_graph


def _backward_schedule() -> Schedule:
    graph = _backward_graph()
    specs = [p.meta if isinstance(p.meta, TensorMeta) else int for p in graph.placeholders]
    return schedule(lower_graph(graph, specs))


class Mlp(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(F.gelu(self.up(x)))


def test_gelu_output_read_by_weight_gradient_is_saved():
    torch.manual_seed(0)
    _train_once(Mlp(32), torch.randn(4, 16, 32))
    sched = _backward_schedule()
    with_erf = [k.name for k in sched.kernels if any("erf" in op for op in k.fused_ops)]
    # one kernel computes the GELU's gradient (it needs erf); none recomputes the GELU output
    assert len(with_erf) == 1, f"kernels running erf in the backward: {with_erf}"


class ConvReluConv(nn.Module):
    """A ResNet block's inner ReLU: its output is the second convolution's input, so both the
    forward's convolution and the backward's weight gradient read it."""

    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv1, self.bn = nn.Conv2d(c, c, 3, padding=1, bias=False), nn.BatchNorm2d(c)
        self.conv2 = nn.Conv2d(c, c, 3, padding=1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv2(torch.relu(self.bn(self.conv1(x))))


def test_relu_output_read_by_two_convolutions_is_saved():
    """Eager saves it; recomputed, the backward rebuilt it from the first convolution's output in a
    kernel of its own only to store it again for the weight gradient (1.2 GB a ResNet-50 step)."""
    torch.manual_seed(0)
    _train_once(ConvReluConv(8), torch.randn(2, 8, 12, 12))
    graph = _backward_graph()
    conv_backward = [n for n in graph.call_nodes() if "convolution_backward" in str(n.target)]
    assert len(conv_backward) == 2
    inputs = {_through_views(n.args[1]).op for n in conv_backward}
    # each convolution's input is a saved value (x, the ReLU output), not computed in the backward
    assert inputs == {"placeholder"}, [f"{_through_views(n.args[1]).target}" for n in conv_backward]


class ResidualAttention(SdpaCausalAttention):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + super().forward(x)


def _through_views(value: Node) -> Node:
    """The value a chain of views (and tuple items) starts from."""
    while value.op == "call" and (value.target is operator.getitem or
                                  isinstance(value.target, Prim) and value.target.kind == "view"):
        value = value.args[0]
    return value


def test_biased_product_read_by_attention_is_saved():
    torch.manual_seed(0)
    _train_once(ResidualAttention(32, 4), torch.randn(2, 16, 32))
    graph = _backward_graph()
    attention = [n for n in graph.call_nodes() if "attention" in str(n.target) and "backward" in str(n.target)]
    assert len(attention) == 1, [str(n.target) for n in graph.call_nodes() if not isinstance(n.target, Prim)]
    qkv = [_through_views(a) for a in attention[0].args[1:4]]
    # q, k and v are views of one saved input of the backward (the biased product), not recomputed
    assert all(v.op == "placeholder" for v in qkv), [f"{v.name}: {v.target}" for v in qkv]
    assert len(set(qkv)) == 1


class PreNormStack(nn.Module):
    """x_k = x_0 + f_1(norm(x_0)) + ... + f_k(norm(x_{k-1})): a pre-norm transformer's residual stream."""

    def __init__(self, dim: int, depth: int) -> None:
        super().__init__()
        self.norms = nn.ModuleList(nn.LayerNorm(dim) for _ in range(depth))
        self.branches = nn.ModuleList(nn.Linear(dim, dim) for _ in range(depth))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for norm, branch in zip(self.norms, self.branches):
            x = x + branch(norm(x))
        return x


def test_residual_stream_is_not_rebuilt_from_every_branch():
    """Each layer norm's backward needs x_k.  Recomputed from the saved branch outputs, the
    backward's kernels read 2, 3, ... k + 1 activations (bytes quadratic in depth); with the
    recomputation bounded (the rest saved, as eager saves x_k), no backward kernel reads more than
    a handful."""
    torch.manual_seed(0)
    depth, dim = 8, 32
    _train_once(PreNormStack(dim, depth), torch.randn(4, 8, dim))
    sched = _backward_schedule()
    activation = 4 * 8 * dim

    def activations_read(kernel) -> int:
        return sum(1 for name in kernel.reads if hint(sched.buffers[name].shape) == activation)
    most = max(activations_read(k) for k in sched.kernels)
    # a bounded recomputation, the incoming gradient and the gradient flowing on (10 at depth 8 before)
    assert most <= RECOMPUTE_MAX_READS + 2, f"a backward kernel reads {most} activations (the residual stream rebuilt)"


def hint(shape) -> int:
    return math.prod(int(n) for n in shape)


class TransposedOperand(nn.Module):
    """q @ k^T with k a plain (B, T, D) activation: k's gradient should come out (B, T, D)-ordered."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.q, self.k = nn.Linear(dim, dim), nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.q(x) @ self.k(x).transpose(-2, -1), -1) @ x


def test_gradient_of_a_transposed_operand_keeps_its_layout():
    """The gradient of ``k.transpose(-2, -1)`` is computed as ``(dS^T q)``, already in k's
    (B, T, D) order: every kernel of the backward reads it with unit stride along D."""
    torch.manual_seed(0)
    _train_once(TransposedOperand(16), torch.randn(2, 12, 16))
    graph = _backward_graph()
    shapes = [tuple(n.meta.shape) for n in graph.call_nodes() if n.target in (torch.matmul, torch.bmm)]
    # k's gradient is one (B, T, D) = (2, 12, 16) product; computed as a^T @ grad it was (B, D, T)
    assert shapes and (2, 16, 12) not in shapes, shapes


class ReluMaxPool(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 3, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.max_pool2d(torch.relu(self.conv(x)), 3, 1, 1)     # overlapping windows: gradients add


def test_max_pool_indices_are_saved_narrow():
    """The pooling's int64 indices are saved as int16 when a plane has fewer than 2**15 positions
    (ResNet-50: 103 -> 26 MB kept from forward to backward).  Ties (the ReLU's zeros, the rounded
    inputs) take eager's first index either way."""
    torch.manual_seed(0)
    _train_once(ReluMaxPool(), torch.randn(2, 3, 10, 10).round())
    saved = COMPILED[0].call.saved_metas
    integer = (torch.int16, torch.int32, torch.int64)
    indices = [m for m in saved if isinstance(m, TensorMeta) and m.dtype in integer and len(m.shape) == 4]
    assert [m.dtype for m in indices] == [torch.int16], [(m.dtype, m.shape) for m in saved if isinstance(m, TensorMeta)]


class TiedHead(nn.Module):
    """Embedding -> LayerNorm -> the embedding's matrix again: a language model's logits, a forward
    output downstream of a matmul that no gradient reads."""

    def __init__(self, vocab: int, dim: int) -> None:
        super().__init__()
        self.embed, self.norm = nn.Embedding(vocab, dim), nn.LayerNorm(dim)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.norm(self.embed(ids)) @ self.embed.weight.t()


def test_forward_output_no_gradient_reads_is_not_saved():
    """The logits cost nothing to save while the caller holds them, so the min cut may cross them;
    saved, they stayed alive until the backward after ``loss = criterion(model(x))`` dropped them
    (nanoGPT's: 412 MB in bf16).  The backward's inputs hold one logits-sized tensor: the
    incoming gradient."""
    torch.manual_seed(0)
    ids = torch.randint(0, 50, (2, 7))
    _train_once_on(TiedHead(50, 16), ids, lambda out: (out * out.detach()).sum())
    logits_sized = [p.name for p in _backward_graph().placeholders
                    if isinstance(p.meta, TensorMeta) and tuple(p.meta.shape) == (2, 7, 50)]
    assert len(logits_sized) == 1, f"the backward reads saved logits: {logits_sized}"


class PaddedTokenScale(nn.Module):
    """A mask of padding tokens (an integer comparison) that the backward reads: the gradient
    of ``h * keep`` is ``grad * keep``."""

    def __init__(self, vocab: int, dim: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        keep = (ids != 0).unsqueeze(-1)
        return torch.tanh(self.embed(ids)) * keep


def test_integer_comparison_is_recomputed_not_saved():
    """An integer comparison gives the same answer wherever it is computed, so the backward
    recomputes the mask from the token ids (an input, free to keep) instead of keeping a saved
    bool tensor; comparisons of floats stay in the forward (x == amax(x) must see its values)."""
    torch.manual_seed(0)
    ids = torch.randint(0, 5, (3, 11))
    _train_once_on(PaddedTokenScale(5, 8), ids, lambda out: out.square().sum())
    saved = [m for m in COMPILED[0].call.saved_metas if isinstance(m, TensorMeta)]
    assert not [m for m in saved if m.dtype == torch.bool], [(m.dtype, tuple(m.shape)) for m in saved]


class ReluMlp(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.layers = nn.Sequential(nn.Linear(dim, dim), nn.ReLU(), nn.Linear(dim, dim), nn.ReLU(),
                                    nn.Linear(dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


def test_relu_mask_is_read_from_the_relu_output():
    """Eager's ReLU backward reads the output (threshold_backward(grad, out, 0)), which the next
    linear layer's weight gradient saves anyway.  Differentiated prim by prim, relu's where(x <= 0,
    0, x) gradient read the mask x <= 0, and the forward stored a bool mask beside each output."""
    torch.manual_seed(0)
    _train_once(ReluMlp(16), torch.randn(8, 16))
    saved = _backward_graph().placeholders[:len(COMPILED[0].call.saved_metas)]
    dtypes = [p.meta.dtype for p in saved if isinstance(p.meta, TensorMeta)]
    assert torch.bool not in dtypes, f"saved: {[(p.name, p.meta.dtype) for p in saved]}"
