"""Grad mode per region: outputs' requires_grad / grad_fn / gradients equal eager's, and the
grad mode around the call is left as it was."""
from __future__ import annotations

import pytest
import torch

import ember

BACKENDS = ["eager", "ember"]
w = torch.randn(4, requires_grad=True)
plain = torch.randn(4)


def enable_inside(x):
    with torch.enable_grad():
        return x * w


def enable_then_more(x):
    with torch.enable_grad():
        y = (x * w).sin()
    return y * 2, x + 1


def no_grad_inside(x):
    with torch.no_grad():
        y = x * w
    return y, x * w


def set_grad_inside(x):
    with torch.set_grad_enabled(True):
        a = x * w
    with torch.set_grad_enabled(False):
        b = x * w
    return a, b


def nested(x):
    with torch.no_grad():
        with torch.enable_grad():
            a = x * w
        b = a * 2
    return a, b, a * 3


def enable_plain(x):
    with torch.enable_grad():
        return x * plain


def query_inside(x):
    with torch.enable_grad():
        on = torch.is_grad_enabled()
    return x * w, on, torch.is_grad_enabled()


@torch.no_grad()
def _decorated_no_grad(x):
    return x * w


@torch.enable_grad()
def _decorated_enable_grad(x):
    return x * w


def decorated(x):
    return _decorated_enable_grad(x), _decorated_no_grad(x), x * w


FUNCTIONS = [decorated, enable_inside, enable_then_more, no_grad_inside, set_grad_inside, nested, enable_plain,
             query_inside]
OUTER = {"no_grad": torch.no_grad, "enable_grad": torch.enable_grad, "inference": torch.inference_mode}


def _signature(value):
    items = value if isinstance(value, tuple) else (value,)
    result = []
    for item in items:
        if isinstance(item, torch.Tensor):
            result.append(("T", item.dtype, item.requires_grad, item.grad_fn is not None, item.is_leaf))
        else:
            result.append(item)
    return result


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("outer", list(OUTER))
@pytest.mark.parametrize("fn", FUNCTIONS, ids=[f.__name__ for f in FUNCTIONS])
def test_grad_mode_regions(fn, outer, backend):
    x = torch.randn(4)
    compiled = ember.compile(fn, backend=backend)
    for _ in range(2):  # the capture call and a cached call
        with OUTER[outer]():
            before = torch.is_grad_enabled()
            expected = fn(x)
            actual = compiled(x)
            assert torch.is_grad_enabled() == before
        assert _signature(actual) == _signature(expected)
        flat_e = expected if isinstance(expected, tuple) else (expected,)
        flat_a = actual if isinstance(actual, tuple) else (actual,)
        for e, a in zip(flat_e, flat_a):
            if isinstance(e, torch.Tensor):
                torch.testing.assert_close(a.detach(), e.detach())
        # gradients flow to w exactly as in eager
        grads = []
        for result in (expected, actual):
            first = result if isinstance(result, torch.Tensor) else result[0]
            if first.requires_grad:
                w.grad = None
                first.sum().backward()
                grads.append(w.grad.clone())
        if grads:
            assert len(grads) == 2
            torch.testing.assert_close(grads[0], grads[1])


def test_grad_mode_is_guarded():
    def f(x):
        return x * w
    x = torch.randn(4)
    compiled = ember.compile(f)
    with torch.no_grad():
        assert not compiled(x).requires_grad
    out = compiled(x)
    assert out.requires_grad and out.grad_fn is not None


class _LayerScale(torch.nn.Module):
    """timm's ConvNeXt block: a parameter viewed with reshape, under the caller's no_grad."""

    def __init__(self, returns_view: bool = False):
        super().__init__()
        self.gamma = torch.nn.Parameter(torch.randn(8))
        self.returns_view = returns_view

    def forward(self, x):
        scale = self.gamma.reshape(1, -1, 1, 1)     # requires grad even under no_grad, as in eager
        y = x.mul(scale) + self.gamma.view(8, 1, 1).expand(8, 2, 2)
        return (y, scale) if self.returns_view else y


@pytest.mark.parametrize("returns_view", [False, True])
def test_parameter_views_under_no_grad_are_compiled(returns_view):
    """A view of a parameter under no_grad requires grad but records nothing: the graph is still
    compiled (it ran op by op, timm's ViT and ConvNeXt were 1.00x), unless that view is an output."""
    module = _LayerScale(returns_view)
    x = torch.randn(3, 8, 2, 2)
    with torch.no_grad():
        expected = module(x)
        report = ember.explain(module, x)
        actual = ember.compile(module, options={"fallback": "error"})(x)
    expected, actual = (expected, actual) if returns_view else ((expected,), (actual,))
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e)
        assert a.requires_grad == e.requires_grad
    if not returns_view:
        assert report.kernel_count > 0, str(report)
