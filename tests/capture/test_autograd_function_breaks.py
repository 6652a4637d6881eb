"""A user's torch.autograd.Function runs eagerly between two compiled graphs, with its own backward:
a straight-through estimator's gradient is its backward's (identity), not round's derivative
(zero), which differentiating its forward would give.  The graph break names the Function, and
fullgraph=True refuses it with that name.  Values and gradients equal eager's, in training and
under no_grad, for the classic form (forward(ctx, ...)) and the setup_context form."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import ember
from ember.errors import CompileError


class RoundSTE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, scale):
        return torch.round(x * scale) / scale

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class ScaledSquare(torch.autograd.Function):     # the setup_context form
    @staticmethod
    def forward(x, factor):
        return x * x * factor

    @staticmethod
    def setup_context(ctx, inputs, output):
        x, factor = inputs
        ctx.save_for_backward(x)
        ctx.factor = factor

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return grad * 2 * x * ctx.factor, None


class Quantized(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(8, 16), nn.Linear(16, 4)

    def forward(self, x):
        h = RoundSTE.apply(torch.tanh(self.a(x)), 4.0)
        return self.b(ScaledSquare.apply(h, 0.5)).sum(-1)


def _steps(model, x, steps=2):
    outputs, grads = [], []
    for _ in range(steps):
        model.zero_grad(set_to_none=True)
        out = model(x)
        out.square().sum().backward()
        outputs.append(out.detach())
        grads.append([p.grad.clone() for p in model.parameters()])
    return outputs, grads


def test_training_through_custom_functions_equals_eager():
    torch.manual_seed(0)
    eager = Quantized()
    compiled_model = Quantized()
    compiled_model.load_state_dict(eager.state_dict())
    compiled = ember.compile(compiled_model)
    x = torch.randn(6, 8)
    (out_e, grads_e), (out_c, grads_c) = _steps(eager, x), _steps(compiled, x)
    for a, e in zip(out_c, out_e):
        torch.testing.assert_close(a, e)
    for step_c, step_e in zip(grads_c, grads_e):
        for a, e in zip(step_c, step_e):
            torch.testing.assert_close(a, e)
    assert any(g.abs().sum() > 0 for g in grads_c[0][:2]), "the STE passed no gradient to the first layer"


def test_the_break_names_the_function_and_fullgraph_refuses_it():
    model = Quantized()
    report = ember.explain(model, torch.randn(2, 8))
    # the code around the two Functions is compiled: a graph before them, one after
    assert (report.graph_count, report.break_count, report.kernel_count) == (2, 2, 2), str(report)
    assert "RoundSTE.apply" in str(report) and "ScaledSquare.apply" in str(report), str(report)
    with pytest.raises(CompileError, match="RoundSTE"):
        ember.compile(model, fullgraph=True)(torch.randn(2, 8))


def test_under_no_grad():
    model = Quantized().eval()
    x = torch.randn(3, 8)
    with torch.no_grad():
        torch.testing.assert_close(ember.compile(model)(x), model(x))
