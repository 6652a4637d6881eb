"""One buffer for terms that every reader only adds up (codegen/cpp_rows.py ``combine_stored_terms``):
the backward of train_cpu.py's pointwise block stored the three terms of the layer norm's input
gradient as three buffers, each read back only inside the same sum; the kernel stores the sum
instead.  Gradients equal eager's with the pass on and off; the pass must fire on the block."""
from __future__ import annotations

import copy

import pytest
import torch

import ember
from ember.codegen import cpp, cpp_rows
from ember.lower import scheduler
from test_cpp_row_cache import PointwiseBlock


@pytest.fixture
def backward_buffers(monkeypatch) -> list[int]:
    """Intermediate buffers of each CPU Schedule, counted after the pass ran."""
    counts: list[int] = []
    combine = cpp_rows.combine_stored_terms

    def recording(sched):
        combine(sched)
        counts.append(sum(plan.kind == "intermediate" for plan in sched.buffers.values()))
    monkeypatch.setattr(cpp, "combine_stored_terms", recording)
    return counts


def step(module, x, grad):
    inputs = x.clone().requires_grad_(True)
    out = module(inputs)
    out.backward(grad)
    return [out, inputs.grad] + [p.grad for p in module.parameters()]


@pytest.mark.parametrize("shape", [(4, 16, 96), (3, 5, 37), (2, 8, 1024)])
def test_pointwise_block_terms_combined(monkeypatch, backward_buffers, shape):
    torch.manual_seed(0)
    model = PointwiseBlock(shape[-1])
    x, grad = torch.randn(shape), torch.randn(shape)
    expected = step(copy.deepcopy(model), x, grad)
    found = {}
    for combine in (False, True):
        monkeypatch.setattr(cpp, "COMBINE_STORED_TERMS", combine)
        ember.reset()
        backward_buffers.clear()
        results = step(ember.compile(copy.deepcopy(model)), x, grad)
        for actual, wanted in zip(results, expected):
            torch.testing.assert_close(actual, wanted, rtol=1e-4, atol=1e-5)
        found[combine] = list(backward_buffers)
    # off: the recording hook does not run; on: forward and backward, the backward two buffers fewer
    assert found[False] == [] and len(found[True]) == 2


def test_pass_removes_two_buffers(monkeypatch):
    """The backward's Schedule: three terms -> one buffer.  Every load counts towards a value's cost,
    as before 0d4f7ec: since then the block recomputes the terms and stores none of them."""
    monkeypatch.setattr(scheduler, "SMALL_LOAD_RATIO", 10**9)
    schedules = []
    combine = cpp_rows.combine_stored_terms

    def recording(sched):
        before = {name for name, plan in sched.buffers.items() if plan.kind == "intermediate"}
        combine(sched)
        after = {name for name, plan in sched.buffers.items() if plan.kind == "intermediate"}
        schedules.append((before, after))
    monkeypatch.setattr(cpp, "combine_stored_terms", recording)
    torch.manual_seed(0)
    model = PointwiseBlock(64)
    x, grad = torch.randn(2, 8, 64), torch.randn(2, 8, 64)
    expected = step(copy.deepcopy(model), x, grad)
    for actual, wanted in zip(step(ember.compile(model), x, grad), expected):
        torch.testing.assert_close(actual, wanted, rtol=1e-4, atol=1e-5)
    before, after = schedules[-1]
    assert len(before - after) == 2 and after <= before, (before, after)


def test_terms_read_otherwise_stay():
    """A term also read on its own is kept: results equal eager's."""
    def fn(x):
        s = torch.softmax(x, -1)
        a, b = s * 2, torch.exp(s)
        t = a + b
        return t.sum(0), (t * x).sum(-1), a.sum(0)
    torch.manual_seed(0)
    x = torch.randn(64, 48)
    for actual, wanted in zip(ember.compile(fn)(x), fn(x)):
        torch.testing.assert_close(actual, wanted)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_terms_read_at_gathered_positions(dtype):
    """A softmax's float64 terms read back through an index tensor (``p[torch.tensor([0, -1, 0])]``):
    the gather's position loads a buffer that is no candidate, which the pass looked up as one
    (KeyError: an internal error, so the graph ran eagerly; fuzz seed 401477)."""
    def program(x):
        p = torch.softmax(x, -1, dtype=dtype)
        return p[torch.tensor([0, -1, 0])], p.sum(-1)
    x = torch.randn(2, 3, 1, 64).to(torch.bfloat16)
    compiled = ember.compile(program, options={"fallback": "error"})
    for actual, expected in zip(compiled(x), program(x)):
        torch.testing.assert_close(actual, expected)
