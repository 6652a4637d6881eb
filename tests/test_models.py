"""End-to-end on the shared fixtures (tests/models.py): one graph, no breaks, and compiled == eager
over repeated calls, a changed batch size and train/eval toggling, with the "eager" backend
(capture only) and the "ember" backend (the full compiler)."""
from __future__ import annotations

import copy

import pytest
import torch
from models import MODEL_MAKERS

import ember
from ember.api import ember_backend_available

# The "ember" variants run once ember/backend.py exists (until then "ember" would only
# repeat the eager-backend runs, since the API routes it through the eager backend).
BACKENDS = [
    "eager",
    pytest.param("ember", marks=pytest.mark.skipif(not ember_backend_available(),
                                                   reason="ember/backend.py has not landed yet")),
]
MAX_RELATIVE_ERROR = 1e-4  # fp32, ember backend; the eager backend must match to the same bound


def relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """max |actual - expected| / max |expected| (float64)."""
    actual, expected = actual.double(), expected.double()
    return ((actual - expected).abs().max() / expected.abs().max().clamp_min(1e-12)).item()


def assert_close(actual: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    assert actual.shape == expected.shape and actual.dtype == expected.dtype, what
    if expected.is_floating_point():
        error = relative_error(actual, expected)
        assert error < MAX_RELATIVE_ERROR, f"{what}: relative error {error:.2e}"
    else:
        assert torch.equal(actual, expected), what


def assert_same_state(compiled_model: torch.nn.Module, eager_model: torch.nn.Module, what: str) -> None:
    for (name, ours), (_, theirs) in zip(compiled_model.state_dict().items(), eager_model.state_dict().items()):
        assert_close(ours, theirs, f"{what}: buffer/parameter {name}")


def batch_inputs(name: str, batch: int) -> tuple:
    return MODEL_MAKERS[name](batch=batch, seed=batch)[1]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(MODEL_MAKERS))
def test_explain_one_graph_no_breaks(name, backend):
    model, inputs = MODEL_MAKERS[name]()
    model.eval()
    with torch.no_grad():  # no_grad: the ember backend has no autodiff yet
        report = ember.explain_with(backend=backend)(model, *inputs)
    assert report.graph_count == 1, str(report)
    assert report.graph_breaks == [], str(report)
    assert report.ops_per_graph[0] > 0
    if backend == "ember":  # the real compiler ran (not an eager fallback)
        assert report.kernel_count > 0, str(report)
    with torch.no_grad():
        assert_close(report.output, model(*inputs), f"{name} explain output")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(MODEL_MAKERS))
def test_compiled_matches_eager_over_calls(name, backend):
    model, inputs = MODEL_MAKERS[name]()
    eager_model = copy.deepcopy(model)  # the reference runs on its own copy: BatchNorm stats diverge otherwise
    compiled = ember.compile(model, backend=backend)
    # (call, mode) steps: repeat, a new batch size, eval, back to train
    steps = [(inputs, "train"), (inputs, "train"), (batch_inputs(name, 3), "train"), (inputs, "eval"),
             (batch_inputs(name, 3), "eval"), (inputs, "train")]
    with torch.no_grad():
        for step, (args, mode) in enumerate(steps):
            compiled.train(mode == "train")
            eager_model.train(mode == "train")
            what = f"{name} step {step} ({mode}, batch {args[0].shape[0]})"
            assert_close(compiled(*args), eager_model(*args), what)
            assert_same_state(compiled, eager_model, what)  # e.g. ResNet's running_mean/var


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(MODEL_MAKERS))
def test_training_gradients_match_eager(name, backend):
    model, inputs = MODEL_MAKERS[name]()
    eager_model = copy.deepcopy(model)
    compiled = ember.compile(model, backend=backend)
    for _ in range(2):  # the second step runs the cached entry
        model.zero_grad(set_to_none=True)
        eager_model.zero_grad(set_to_none=True)
        # a fixed random projection, not out.pow(2).mean(): through a final LayerNorm (bert_layer)
        # that loss is constant and every gradient before the norm is rounding noise
        out = compiled(*inputs).float()
        projection = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
        (out * projection).sum().backward()
        (eager_model(*inputs).float() * projection).sum().backward()
        # a gradient that is zero in exact arithmetic (BERT's key bias: softmax ignores a shift)
        # is rounding noise in both: measure every error against the largest gradient's scale
        scale = max(p.grad.abs().max().item() for p in eager_model.parameters())
        for (param_name, ours), theirs in zip(model.named_parameters(), eager_model.parameters()):
            assert ours.grad is not None, f"{name}: no gradient for {param_name}"
            error = (ours.grad.double() - theirs.grad.double()).abs().max().item() / \
                max(theirs.grad.abs().max().item(), 1e-2 * scale)
            assert error < MAX_RELATIVE_ERROR, f"{name} grad {param_name}: relative error {error:.2e}"
    if backend == "ember":   # really compiled, forward and backward: not the eager graph
        kinds = [event.compiled.kind for event in compiled._ember_captured.events]
        assert kinds == ["autograd"], kinds
