"""requires_grad of compiled outputs, and the gradients through them, against eager's: every op
whose derivative is zero (its output still requires grad) or that eager marks non-differentiable,
returned directly and as each kind of view (returned views are rebuilt from another output of the
compiled graph).  Backpropagating from such an output alone gives eager's zeros, not an error."""
from __future__ import annotations

import itertools

import pytest
import torch
from training_util import compile_strict, reset_kinds


@pytest.fixture(autouse=True)
def _fresh_kinds():
    reset_kinds()
    yield


ZERO_DERIVATIVE = {
    "sign": torch.sign, "sgn": torch.sgn, "round": torch.round, "floor": torch.floor, "ceil": torch.ceil,
    "trunc": torch.trunc, "round_decimals": lambda x: torch.round(x, decimals=1),
    "heaviside": lambda x: torch.heaviside(x, torch.tensor(0.5)),
}
NON_DIFFERENTIABLE = {
    "gt": lambda x: x > 0, "argmax": lambda x: x.argmax(-1, keepdim=True), "detach": lambda x: x.detach() * 2,
    "layer_norm_mean": lambda x: torch.native_layer_norm(x, (8,), None, None, 1e-5)[1],
}
VIEWS = {
    "direct": lambda y: y, "split_last": lambda y: y.split(2, 0)[-1], "slice": lambda y: y[1:, ::2],
    "transpose": lambda y: y.t(), "reshape": lambda y: y.reshape(-1), "unbind": lambda y: y.unbind(0)[1],
    "select": lambda y: y[2],
}


def _program(op, view):
    def program(x):
        return view(op(1.5 - x)), torch.sigmoid(x)     # a second output that surely requires grad
    return program


@pytest.mark.parametrize("op,view", list(itertools.product(sorted({**ZERO_DERIVATIVE, **NON_DIFFERENTIABLE}),
                                                           sorted(VIEWS))))
def test_output_requires_grad_and_gradient(op, view):
    fn = {**ZERO_DERIVATIVE, **NON_DIFFERENTIABLE}[op]
    if op == "argmax" and view == "split_last":
        pytest.skip("argmax's output has one column")
    program = _program(fn, VIEWS[view])
    base = torch.randn(4, 8)
    x_eager, x_compiled = base.clone().requires_grad_(), base.clone().requires_grad_()
    expected, actual = program(x_eager), compile_strict(program)(x_compiled)
    for e, a in zip(expected, actual):
        assert a.requires_grad == e.requires_grad, f"requires_grad {a.requires_grad}, eager {e.requires_grad}"
        assert a.shape == e.shape and a.dtype == e.dtype
        torch.testing.assert_close(a, e)
    if not expected[0].requires_grad:
        return
    # the zero-derivative output alone: eager's zero gradient, or eager's error (heaviside has no
    # derivative formula)
    try:
        (e_grad,) = torch.autograd.grad(expected[0].sum(), x_eager)
    except RuntimeError:
        with pytest.raises(RuntimeError):
            torch.autograd.grad(actual[0].sum(), x_compiled)
        return
    (a_grad,) = torch.autograd.grad(actual[0].sum(), x_compiled)
    torch.testing.assert_close(a_grad, e_grad)
