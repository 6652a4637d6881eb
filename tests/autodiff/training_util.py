"""Shared helpers for the training tests: a strict backend and eager-vs-compiled comparisons.

    model_c = compile_strict(copy.deepcopy(model))     # raises if any graph ran eagerly
    run_training_steps(model, model_c, batches, loss_fn, steps=3)

Strictness: the "ember_strict" backend asks ``ember.backend.compile_graph`` for a graph with
``fallback="error"`` and fails when the result says it runs eagerly (``.kind == "eager"``), so a
training test cannot pass by silently running the captured graph eagerly.  Set
``EMBER_TEST_ALLOW_EAGER=1`` to allow eager graphs (develop the tests before autodiff lands).

Every graph the strict backend compiles is recorded in ``COMPILED_KINDS`` ("autograd", "kernels",
"eager"), so a test can also assert that it compiled what it meant to.
"""
from __future__ import annotations

import copy
import os
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch

import ember

STRICT = os.environ.get("EMBER_TEST_ALLOW_EAGER") != "1"

RTOL, ATOL = 1e-4, 1e-5          # fp32 on CPU
BF16_RTOL, BF16_ATOL = 2e-2, 2e-2
ADAM_EPS = 1e-5

# kinds of the graphs compiled by the strict backend since the last reset_kinds()
COMPILED_KINDS: list[str] = []


def strict_backend(graph: Any, example_inputs: list) -> Any:
    from ember.backend import compile_graph  # lazily: it pulls in codegen and runtime

    compiled = compile_graph(graph, example_inputs, {"fallback": "error"})
    kind = getattr(compiled, "kind", "eager")
    COMPILED_KINDS.append(kind)
    if STRICT and kind == "eager":
        raise AssertionError(f"ran eagerly: {getattr(compiled, 'eager_reason', '?')}")
    return compiled


ember.register_backend("ember_strict", strict_backend)


def reset_kinds() -> None:
    COMPILED_KINDS.clear()


def compile_strict(model_or_fn: Any, **kwargs: Any) -> Any:
    """ember.compile through the strict backend.  fallback="error" as well: otherwise the API would
    catch the strict backend's AssertionError and run the graph eagerly with a warning."""
    return ember.compile(model_or_fn, backend="ember_strict", options={"fallback": "error"}, **kwargs)


def compile_plain(model_or_fn: Any, **kwargs: Any) -> Any:
    """The ordinary "ember" backend (may run eagerly): for cases designed to run eagerly."""
    return ember.compile(model_or_fn, backend="ember", **kwargs)


def assert_compiled(expect_autograd: bool = True) -> None:
    """At least one graph was captured, and (strictly) one of them compiled forward and backward."""
    assert COMPILED_KINDS, "no graph reached the backend (nothing was captured)"
    if STRICT and expect_autograd:
        assert "autograd" in COMPILED_KINDS, f"no graph compiled with autograd: {COMPILED_KINDS}"


# ------------------------------------------------------------------ comparisons
def assert_close(actual: Any, expected: Any, what: str, rtol: float = RTOL, atol: float = ATOL) -> None:
    """Tensors (or nested tuples/lists of them, or None) equal within tolerance, same dtype/shape."""
    if expected is None or actual is None:
        assert actual is None and expected is None, f"{what}: {actual is None=} but {expected is None=}"
        return
    if isinstance(expected, (tuple, list)):
        assert isinstance(actual, (tuple, list)) and len(actual) == len(expected), f"{what}: structure differs"
        for i, (a, e) in enumerate(zip(actual, expected)):
            assert_close(a, e, f"{what}[{i}]", rtol, atol)
        return
    if not isinstance(expected, torch.Tensor):
        assert actual == expected, f"{what}: {actual!r} != {expected!r}"
        return
    assert isinstance(actual, torch.Tensor), f"{what}: got {type(actual).__name__}"
    assert actual.requires_grad == expected.requires_grad, \
        f"{what}: requires_grad {actual.requires_grad} (eager: {expected.requires_grad})"
    torch.testing.assert_close(actual.detach(), expected.detach(), rtol=rtol, atol=atol,
                               msg=lambda m: f"{what}: {m}")


def assert_same_grads(model_c: torch.nn.Module, model_e: torch.nn.Module, what: str,
                      rtol: float = RTOL, atol: float = ATOL) -> None:
    """Every parameter's .grad equal to eager's (None where eager's is None)."""
    params_c = dict(model_c.named_parameters())
    for name, p_e in model_e.named_parameters():
        assert_close(params_c[name].grad, p_e.grad, f"{what}: {name}.grad", rtol, atol)


def assert_same_state(model_c: torch.nn.Module, model_e: torch.nn.Module, what: str,
                      rtol: float = RTOL, atol: float = ATOL) -> None:
    """Every parameter and buffer (BatchNorm running stats, num_batches_tracked) equal to eager's."""
    state_c = model_c.state_dict()
    state_e = model_e.state_dict()
    assert state_c.keys() == state_e.keys(), f"{what}: state_dict keys differ"
    for name, value in state_e.items():
        torch.testing.assert_close(state_c[name], value, rtol=rtol, atol=atol,
                                   msg=lambda m, name=name: f"{what}: {name}: {m}")


def clone_inputs(inputs: Sequence[Any]) -> list[Any]:
    """Leaf copies: same values and requires_grad, separate .grad."""
    out = []
    for x in inputs:
        if isinstance(x, torch.Tensor):
            x = x.detach().clone().requires_grad_(x.requires_grad)
        out.append(x)
    return out


def run_training_steps(model: torch.nn.Module, batches: Iterable[Sequence[Any]],
                       loss_fn: Callable[[Any, Sequence[Any]], torch.Tensor], steps: int = 3,
                       lr: float = 1e-3, rtol: float = RTOL, atol: float = ATOL,
                       compiler: Callable[[Any], Any] = compile_strict) -> list[float]:
    """AdamW steps on an eager copy and a compiled copy of `model` (compiled once); after every
    step, loss, every parameter .grad, and every parameter and buffer equal eager's.

    batches yields (inputs...) tuples; loss_fn(model_output, batch) -> scalar loss.  The model
    is called as model(*batch[0:n_inputs]) where the last entry of a batch is the target.
    Returns the eager losses."""
    model_e = model
    model_c_orig = copy.deepcopy(model)
    model_c = compiler(model_c_orig)
    # eps well above rounding noise: Adam turns a gradient that is analytically zero (the key bias of
    # attention) but 1e-9 in one run and -1e-9 in the other into updates of +lr and -lr
    opt_e = torch.optim.AdamW(model_e.parameters(), lr=lr, eps=ADAM_EPS)
    opt_c = torch.optim.AdamW(model_c_orig.parameters(), lr=lr, eps=ADAM_EPS)
    losses = []
    for step, batch in zip(range(steps), batches):
        *inputs, target = batch
        for model_, opt in ((model_e, opt_e), (model_c, opt_c)):
            opt.zero_grad(set_to_none=True)
        out_e = model_e(*clone_inputs(inputs))
        loss_e = loss_fn(out_e, target)
        loss_e.backward()
        out_c = model_c(*clone_inputs(inputs))
        loss_c = loss_fn(out_c, target)
        loss_c.backward()
        what = f"step {step}"
        assert_close(loss_c, loss_e, f"{what}: loss", rtol, atol)
        assert_close(out_c, out_e, f"{what}: output", rtol, atol)
        assert_same_grads(model_c_orig, model_e, what, rtol, atol)
        opt_e.step()
        opt_c.step()
        assert_same_state(model_c_orig, model_e, f"{what} after optimizer step", rtol, atol)
        losses.append(loss_e.item())
    return losses
