"""A training graph's causal CPU flash attention in blocks (codegen/cpp_externs.py): the forward a
query block at a time against the keys it sees, the backward as the causal square's diagonal
blocks plus the squares below them, one batched call per size.  Outputs, log-sum-exp and
gradients equal eager's op to rounding, in eager's layouts."""
from __future__ import annotations

import pytest
import torch

import ember
from ember.codegen import cpp, cpp_externs
from models import SdpaCausalAttention as Attention

FORWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu.default
BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward.default


@pytest.fixture
def schedules(monkeypatch) -> list:
    """The Schedule of every CPU compile, with the blocked forms on for 128-512 tokens (off by
    default: cpp_externs.CAUSAL_TRAINING_LENGTHS)."""
    monkeypatch.setattr(cpp_externs, "CAUSAL_TRAINING_LENGTHS", (128, 256, 512))
    seen = []
    apply = cpp_externs.apply_matmul_policy

    def recording(sched):
        apply(sched)
        seen.append(sched)
    monkeypatch.setattr(cpp, "apply_matmul_policy", recording)
    return seen


def extern_names(sched) -> list[str]:
    return [getattr(step.node.fn, "__name__", "?") for step in sched.externs]


def qkv(batch: int, heads: int, length: int, dim: int = 16, packed: bool = True):
    """q, k, v as views of one [B, L, 3 H D] projection (as a Linear makes them), or contiguous."""
    g = torch.Generator().manual_seed(0)
    if not packed:
        return [torch.randn(batch, heads, length, dim, generator=g) for _ in range(3)]
    base = torch.randn(batch, length, 3 * heads * dim, generator=g)
    return [part.view(batch, length, heads, dim).transpose(1, 2) for part in base.split(heads * dim, dim=-1)]


@pytest.mark.parametrize("length", [128, 256, 512])
def test_forward_by_query_blocks(length):
    q, k, v = qkv(2, 2, length)
    out, lse = cpp_externs.causal_flash_forward_by_query_blocks(q, k, v, 0.0, True)
    ref_out, ref_lse = FORWARD(q, k, v, 0.0, True)
    torch.testing.assert_close(out, ref_out)
    torch.testing.assert_close(lse, ref_lse)
    assert out.stride() == ref_out.stride() and lse.stride() == ref_lse.stride()


@pytest.mark.parametrize("length", [128, 256, 512])
@pytest.mark.parametrize("packed", [True, False])
def test_backward_by_halves(length, packed):
    q, k, v = qkv(2, 3, length, packed=packed)
    out, lse = FORWARD(q, k, v, 0.0, True)
    g = torch.randn(2, length, 3, 16).transpose(1, 2)
    got = cpp_externs.causal_flash_backward_by_halves(g, q, k, v, out, lse, 0.0, True)
    expected = BACKWARD(g, q, k, v, out, lse, 0.0, True)
    for a, e in zip(got, expected):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5)
        assert a.shape == e.shape


def test_backward_other_calls_are_eagers():
    """Not causal, or a length that is no power-of-two count of blocks: eager's call itself."""
    for length, causal in ((128, False), (192, True)):
        q, k, v = qkv(1, 2, length)
        out, lse = FORWARD(q, k, v, 0.0, causal)
        g = torch.randn(1, 2, length, 16)
        got = cpp_externs.causal_flash_backward_by_halves(g, q, k, v, out, lse, 0.0, causal)
        for a, e in zip(got, BACKWARD(g, q, k, v, out, lse, 0.0, causal)):
            torch.testing.assert_close(a, e, rtol=0, atol=0)


@pytest.mark.parametrize("length, blocked", [(128, True), (256, True), (96, False)])
def test_training_step(schedules, length, blocked):
    torch.manual_seed(0)
    model, reference = Attention(), Attention()
    reference.load_state_dict(model.state_dict())
    x = torch.randn(2, length, 64, requires_grad=True)
    x_ref = x.detach().clone().requires_grad_(True)
    grad = torch.randn(2, length, 64)
    expected = reference(x_ref)
    expected.backward(grad)
    out = ember.compile(model)(x)
    out.backward(grad)
    torch.testing.assert_close(out, expected)
    torch.testing.assert_close(x.grad, x_ref.grad, rtol=1e-4, atol=1e-4)
    for (name, p), p_ref in zip(model.named_parameters(), reference.parameters()):
        # (sums over 2 x length rows: the order of the additions moves them by 1e-5)
        torch.testing.assert_close(p.grad, p_ref.grad, rtol=1e-4, atol=1e-4, msg=name)
    names = [name for sched in schedules for name in extern_names(sched)]
    split = {"causal_flash_forward_by_query_blocks", "causal_flash_backward_by_halves"}
    assert (split <= set(names)) == blocked and (not blocked) == (not split & set(names)), names


def test_off_by_default(monkeypatch):
    seen = []
    apply = cpp_externs.apply_matmul_policy
    monkeypatch.setattr(cpp, "apply_matmul_policy", lambda sched: (apply(sched), seen.append(sched)))
    model, x = Attention(), torch.randn(2, 128, 64, requires_grad=True)
    ember.compile(model)(x).sum().backward()
    names = {name for sched in seen for name in extern_names(sched)}
    assert not names & {"causal_flash_forward_by_query_blocks", "causal_flash_backward_by_halves"}, names
