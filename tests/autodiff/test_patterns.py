"""softmax and log_softmax differentiated from their output (autodiff/patterns.py), as eager:
gradients equal eager's, the pattern is (or is not) taken, and what the backward keeps is the
rounded output, not an fp32 exp(z) of the input's size."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import ember
from ember.autodiff import joint, patterns
from ember.backend import compile_graph

TAKEN: list[str] = []
COMPILED: list = []


@pytest.fixture(autouse=True)
def spy(monkeypatch):
    TAKEN.clear()
    COMPILED.clear()

    def pattern_vjp(node, grad):
        found = patterns.pattern_vjp(node, grad)
        if found is not None:
            TAKEN.append(node.target.name)
        return found
    monkeypatch.setattr(joint, "pattern_vjp", pattern_vjp)


def _backend(graph, example_inputs):
    COMPILED.append(compile_graph(graph, example_inputs, {"fallback": "error"}))
    return COMPILED[-1]


def run(fn, inputs, rtol=1e-5, atol=1e-5):
    eager_inputs = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in inputs]
    ember_inputs = [t.detach().clone().requires_grad_(t.is_floating_point()) for t in inputs]
    expected = fn(*eager_inputs)
    actual = ember.compile(fn, backend=_backend)(*ember_inputs)
    expected, actual = (expected,) if torch.is_tensor(expected) else expected, \
        (actual,) if torch.is_tensor(actual) else actual
    gen = torch.Generator().manual_seed(0)
    weights = [torch.rand(e.shape, generator=gen).to(e.dtype) for e in expected]
    sum((e * w).sum() for e, w in zip(expected, weights)).backward()
    sum((a * w).sum() for a, w in zip(actual, weights)).backward()
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e, rtol=rtol, atol=atol, equal_nan=True)
    for a, e in zip(ember_inputs, eager_inputs):
        if e.grad is not None:
            torch.testing.assert_close(a.grad, e.grad, rtol=rtol, atol=atol, equal_nan=True)


@pytest.mark.parametrize("dim", [-1, 0, 1])
@pytest.mark.parametrize("op", [torch.softmax, torch.log_softmax])
def test_softmax_and_log_softmax_over_each_dim(op, dim):
    run(lambda x: op(x * 1.5, dim), [torch.randn(3, 4, 5)])
    assert TAKEN == ["div" if op is torch.softmax else "sub"]


def test_masked_attention_probabilities():
    def attention(q, k, v):
        scores = (q @ k.transpose(-1, -2)) * 0.5
        causal = torch.ones(5, 5, dtype=torch.bool).tril()
        return F.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1) @ v
    run(attention, [torch.randn(2, 3, 5, 4), torch.randn(2, 3, 5, 4), torch.randn(2, 3, 5, 4)])
    assert TAKEN == ["div"]


def test_exp_read_elsewhere_keeps_the_prims_rules():
    # the same exp(z) feeding something else: not a softmax the pattern may replace
    def fn(x):
        shifted = x - x.amax(-1, keepdim=True).detach()
        e = shifted.exp()
        return e / e.sum(-1, keepdim=True), e * 3
    run(fn, [torch.randn(4, 6)])
    assert TAKEN == []


def test_bf16_backward_keeps_the_rounded_probabilities():
    """Eager keeps the bf16 softmax output for its backward; so does ember: no fp32 row statistics
    to recompute the probabilities from the scores (the prims' rules kept scores, max and sum)."""
    def attention(q, k, v):
        return torch.softmax(q @ k.transpose(-1, -2), dim=-1) @ v
    shape = (2, 2, 16, 8)
    inputs = [torch.randn(*shape, dtype=torch.bfloat16) for _ in range(3)]
    run(attention, inputs, rtol=2e-2, atol=2e-2)
    assert TAKEN == ["div"]
    saved = [m for m in COMPILED[0].call.saved_metas if hasattr(m, "shape")]
    square = [m for m in saved if tuple(m.shape[-2:]) == (16, 16)]
    assert square and all(m.dtype == torch.bfloat16 for m in square), saved
    assert not [m for m in saved if m.dtype == torch.float32], saved
