"""The public API: compile (functions, decorators, nn.Module wrapper), backends, reset, explain, modes,
errors, and guard soundness seen from the user's side (a changed global, attribute, mode, dtype or
rank changes the result exactly as in eager)."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn
from torch.nn import functional as F

import ember
from ember.graph import Graph

BACKENDS = ["eager", "ember"]


def recording_backend(calls: list):
    """A custom backend that records what it receives and runs the graph eagerly."""

    def backend(graph: Graph, example_inputs: list):
        calls.append((graph, list(example_inputs)))
        return graph.as_callable()

    return backend


class Small(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(4, 3)
        self.register_buffer("offset", torch.zeros(3))
        self.scale = 2.0
        self.note = "hello"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x)) * self.scale + self.offset

    def helper(self) -> str:
        return self.note.upper()


# ------------------------------------------------------------------ compile on functions
def test_compile_function_matches_eager_and_keeps_metadata():
    def scaled_gelu(x, y):
        """docstring kept"""
        return F.gelu(x) * y + 1

    compiled = ember.compile(scaled_gelu, backend="eager")
    x, y = torch.randn(5, 6), torch.randn(6)
    torch.testing.assert_close(compiled(x, y), scaled_gelu(x, y))
    assert compiled.__name__ == "scaled_gelu" and compiled.__doc__ == "docstring kept"
    assert compiled.__wrapped__ is scaled_gelu


def test_decorator_forms():
    @ember.compile
    def bare(x):
        return x.sin() + 1

    @ember.compile()
    def empty_call(x):
        return x.cos() * 2

    @ember.compile(fullgraph=True, backend="eager")
    def with_args(x):
        return torch.tanh(x) - x

    x = torch.randn(7)
    torch.testing.assert_close(bare(x), x.sin() + 1)
    torch.testing.assert_close(empty_call(x), x.cos() * 2)
    torch.testing.assert_close(with_args(x), torch.tanh(x) - x)


def test_compile_bound_method():
    model = Small()
    compiled = ember.compile(model.forward, backend="eager")
    x = torch.randn(2, 4)
    torch.testing.assert_close(compiled(x), model(x))


def test_compile_rejects_non_callable():
    with pytest.raises(TypeError):
        ember.compile(3)


@pytest.mark.parametrize("fn, nargs", [(torch.pow, 2), (torch.nn.functional.gelu, 1), (torch.Tensor.sin, 1)],
                         ids=["torch.pow", "F.gelu", "Tensor.sin"])
def test_compile_takes_builtins(fn, nargs):
    """torch.compile(torch.pow) works; so does ember.compile: one graph calling it."""
    compiled = ember.compile(fn, options={"fallback": "error"})
    args = [torch.rand(6) + 0.5 for _ in range(nargs)]     # pow of a negative base: NaN
    for _ in range(2):
        torch.testing.assert_close(compiled(*args), fn(*args))
    report = ember.explain(fn, *args)
    assert (report.graph_count, report.break_count) == (1, 0), str(report)


# ------------------------------------------------------------------ nn.Module wrapper
def test_module_wrapper_is_a_module_with_the_originals_state():
    model = Small()
    compiled = ember.compile(model, backend="eager")
    assert isinstance(compiled, nn.Module) and isinstance(compiled, ember.CompiledModule)
    assert compiled._orig_mod is model
    assert [id(p) for p in compiled.parameters()] == [id(p) for p in model.parameters()]
    assert [n for n, _ in compiled.named_parameters()] == [n for n, _ in model.named_parameters()]
    assert [n for n, _ in compiled.named_buffers()] == [n for n, _ in model.named_buffers()]
    assert list(compiled.state_dict()) == list(model.state_dict())
    assert [n for n, _ in compiled.named_modules()] == [n for n, _ in model.named_modules()]
    assert "Linear(in_features=4" in repr(compiled)
    x = torch.randn(3, 4)
    torch.testing.assert_close(compiled(x), model(x))


def test_module_wrapper_forwards_attributes():
    model = Small()
    compiled = ember.compile(model, backend="eager")
    assert compiled.scale == 2.0 and compiled.note == "hello" and compiled.helper() == "HELLO"
    assert compiled.linear is model.linear
    compiled.scale = 3.0  # a plain attribute goes to the original
    assert model.scale == 3.0 and "scale" not in vars(compiled)
    compiled.extra = nn.Linear(1, 1)  # so does a submodule
    assert model.extra is compiled.extra
    del compiled.extra
    assert not hasattr(model, "extra")
    with pytest.raises(AttributeError):
        _ = compiled.does_not_exist


def test_module_wrapper_load_state_dict_and_to():
    model = Small()
    compiled = ember.compile(model, backend="eager")
    donor = Small()
    compiled.load_state_dict(donor.state_dict())
    torch.testing.assert_close(model.linear.weight, donor.linear.weight)
    assert compiled.to(torch.float64) is compiled
    assert model.linear.weight.dtype == torch.float64 and model.offset.dtype == torch.float64
    x = torch.randn(2, 4, dtype=torch.float64)
    torch.testing.assert_close(compiled(x), model(x))


def test_module_wrapper_inside_a_parent_module_keeps_keys():
    parent = nn.Sequential(Small())
    keys = list(parent.state_dict())
    parent[0] = ember.compile(parent[0], backend="eager")
    assert list(parent.state_dict()) == keys
    parent.load_state_dict(nn.Sequential(Small()).state_dict())


def test_train_eval_toggle_the_original():
    model = nn.Sequential(nn.Linear(4, 4), nn.Dropout(0.5))
    compiled = ember.compile(model, backend="eager")
    assert compiled.eval() is compiled
    assert not model.training and not model[1].training and not compiled.training
    compiled.train()
    assert model.training and model[1].training and compiled.training
    model.eval()  # toggling the original shows through the wrapper
    assert not compiled.training
    compiled.training = True
    assert model.training


def test_hooks_on_the_original_are_honoured():
    model = Small()
    seen = []
    model.register_forward_pre_hook(lambda mod, args: seen.append("pre"))
    model.register_forward_hook(lambda mod, args, out: out * 10)
    compiled = ember.compile(model, backend="eager")
    x = torch.randn(2, 4)
    expected = model(x)
    seen.clear()
    torch.testing.assert_close(compiled(x), expected)
    assert seen == ["pre"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradients_land_in_the_original_parameters(backend):
    model = Small()
    reference = copy.deepcopy(model)
    compiled = ember.compile(model, backend=backend)
    x = torch.randn(5, 4)
    compiled(x).pow(2).sum().backward()
    reference(x).pow(2).sum().backward()
    for p, q in zip(model.parameters(), reference.parameters()):
        assert p.grad is not None
        torch.testing.assert_close(p.grad, q.grad)


def test_compiling_a_compiled_module_wraps_the_original():
    model = Small()
    twice = ember.compile(ember.compile(model, backend="eager"), backend="eager")
    assert twice._orig_mod is model


# ------------------------------------------------------------------ backends
def test_list_and_register_backends():
    assert {"eager", "ember"} <= set(ember.list_backends())
    calls: list = []
    ember.register_backend("test_recording", recording_backend(calls))
    assert "test_recording" in ember.list_backends()

    def fn(x, y):
        return torch.mm(x, y).relu()

    compiled = ember.compile(fn, backend="test_recording")
    x, y = torch.randn(3, 4), torch.randn(4, 2)
    torch.testing.assert_close(compiled(x, y), fn(x, y))
    assert len(calls) == 1
    graph, example_inputs = calls[0]
    assert isinstance(graph, Graph)
    assert len(example_inputs) == len(graph.placeholders)
    assert any(t is x for t in example_inputs) and any(t is y for t in example_inputs)
    compiled(x, y)
    assert len(calls) == 1, "a second identical call must reuse the compiled entry"


def test_callable_backend_and_unknown_backend():
    calls: list = []
    compiled = ember.compile(lambda x: x * 3, backend=recording_backend(calls))
    torch.testing.assert_close(compiled(torch.ones(2)), torch.full((2,), 3.0))
    assert len(calls) == 1
    with pytest.raises(ValueError, match="registered backends"):
        ember.compile(lambda x: x, backend="no_such_backend")


def test_reset_drops_compiled_entries():
    calls: list = []
    compiled = ember.compile(lambda x: x + 1, backend=recording_backend(calls))
    x = torch.randn(3)
    compiled(x)
    compiled(x)
    assert len(calls) == 1
    ember.reset()
    compiled(x)
    assert len(calls) == 2


def test_backend_failure_is_a_compile_error_or_falls_back(monkeypatch):
    monkeypatch.delenv("EMBER_FALLBACK", raising=False)     # the default policy, whatever the suite sets

    def broken(graph, example_inputs):
        raise NotImplementedError("no kernels today")

    x = torch.randn(4)
    with pytest.raises(ember.CompileError, match="no kernels today"):
        ember.compile(lambda t: t.exp(), backend=broken, options={"fallback": "error"})(x)
    compiled = ember.compile(lambda t: t.exp(), backend=broken)   # the default: eager, with a warning
    with pytest.warns(UserWarning, match="fallback"):
        torch.testing.assert_close(compiled(x), x.exp())


def test_ember_backend_receives_mode_and_options(monkeypatch):
    received = []

    def fake_ember_backend(graph, example_inputs, options=None):
        received.append(options)
        return graph.as_callable()

    monkeypatch.setitem(ember.api._BACKENDS, "ember", fake_ember_backend)
    compiled = ember.compile(lambda x: x * 2, mode="max-autotune", dynamic=False, options={"cpu_backend": "cpp"})
    compiled(torch.ones(3))
    [options] = received
    assert (options.mode, options.dynamic, options.cpu_backend) == ("max-autotune", False, "cpp")


# ------------------------------------------------------------------ modes, misc
@pytest.mark.parametrize("mode", [None, "default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"])
def test_valid_modes(mode):
    compiled = ember.compile(lambda x: x.sigmoid(), mode=mode, backend="eager")
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x), x.sigmoid())


def test_unknown_mode_lists_valid_ones():
    with pytest.raises(ValueError, match="reduce-overhead"):
        ember.compile(lambda x: x, mode="fastest")
    with pytest.raises(ValueError, match="max-autotune"):
        ember.compile(mode="turbo")


def test_public_names():
    assert ember.CompileError is ember.errors.CompileError
    assert ember.config.cache_size_limit > 0
    ember.cudagraph_mark_step_begin()  # a no-op for now; the bench harness calls it


# ------------------------------------------------------------------ explain
def test_explain_small_function():
    def fn(x, y):
        return (x * y).sum(dim=0) + y.mean()

    x, y = torch.randn(3, 4), torch.randn(3, 4)
    report = ember.explain(fn, x, y)
    assert isinstance(report, ember.ExplainReport)
    assert report.graph_count == 1 and report.graph_breaks == []
    assert len(report.ops_per_graph) == 1 and report.ops_per_graph[0] >= 4
    assert report.ops_per_graph[0] == sum(1 for _ in report.graphs[0].call_nodes())
    assert isinstance(report.kernel_count, int) and isinstance(report.extern_count, int)
    assert all(isinstance(g, str) for g in report.guards)
    text = str(report)
    assert "1 graph," in text and "0 graph breaks" in text
    torch.testing.assert_close(report.output, fn(x, y))


def test_explain_module_and_backend_choice():
    model = Small()
    report = ember.explain_with(backend="eager")(model, torch.randn(2, 4))
    assert report.graph_count == 1 and report.kernel_count == 0
    compiled = ember.compile(model, backend="eager")
    assert ember.explain(compiled, torch.randn(2, 4)).graph_count == 1


def test_explain_counts_kernels_from_backend_stats():
    def backend_with_stats(graph, example_inputs):
        compiled = graph.as_callable()
        compiled.stats = {"kernel_count": 2, "extern_count": 1}
        return compiled

    report = ember.explain_with(backend=backend_with_stats)(lambda x: x.exp() + 1, torch.randn(3))
    assert (report.kernel_count, report.extern_count) == (2, 1)
    assert "2 kernels" in str(report)


def graph_break_function(x):
    y = x * 2
    print("side effect")  # a graph break: print runs natively
    return y + 1


def graph_break_line() -> str:
    import inspect

    lines, start = inspect.getsourcelines(graph_break_function)
    offset = next(i for i, line in enumerate(lines) if "print(" in line)
    return f"test_api.py:{start + offset}"


def test_explain_reports_graph_breaks_with_location():
    x = torch.randn(3)
    report = ember.explain(graph_break_function, x)
    assert len(report.graph_breaks) == 1
    assert report.graph_breaks[0].reason
    assert report.graph_breaks[0].location.endswith(graph_break_line())
    assert graph_break_line() in str(report)
    torch.testing.assert_close(report.output, x * 2 + 1)


def test_graph_break_is_partial():
    """A graph break splits the frame: the code before and after it compile as two graphs."""
    report = ember.explain(graph_break_function, torch.randn(3))
    assert report.graph_count == 2 and report.ops_per_graph == [1, 1]


def test_fullgraph_turns_a_break_into_a_compile_error():
    compiled = ember.compile(graph_break_function, fullgraph=True, backend="eager")
    with pytest.raises(ember.CompileError) as info:
        compiled(torch.randn(3))
    assert graph_break_line() in str(info.value)


def test_graph_break_without_fullgraph_still_runs():
    compiled = ember.compile(graph_break_function, backend="eager")
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x), x * 2 + 1)


# ------------------------------------------------------------------ guard soundness (user side)
SCALE = 2.0


def uses_global(x):
    return x * SCALE


@pytest.mark.parametrize("backend", BACKENDS)
def test_changed_global_changes_result(backend):
    global SCALE
    compiled = ember.compile(uses_global, backend=backend)
    x = torch.randn(4)
    torch.testing.assert_close(compiled(x), x * 2.0)
    try:
        SCALE = 5.0
        torch.testing.assert_close(compiled(x), x * 5.0)
    finally:
        SCALE = 2.0
    torch.testing.assert_close(compiled(x), x * 2.0)


class ModeDependent(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.factor = 1.5

    def forward(self, x):
        if self.training:
            return x * self.factor
        return x - self.factor


@pytest.mark.parametrize("backend", BACKENDS)
def test_changed_module_float_attribute_changes_result(backend):
    model = ModeDependent()
    compiled = ember.compile(model, backend=backend)
    x = torch.randn(4)
    torch.testing.assert_close(compiled(x), x * 1.5)
    model.factor = 4.0
    torch.testing.assert_close(compiled(x), x * 4.0)
    compiled.factor = -1.0  # through the wrapper
    torch.testing.assert_close(compiled(x), x * -1.0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_changed_training_flag_changes_result(backend):
    model = ModeDependent()
    compiled = ember.compile(model, backend=backend)
    x = torch.randn(4)
    torch.testing.assert_close(compiled(x), x * 1.5)
    compiled.eval()
    torch.testing.assert_close(compiled(x), x - 1.5)
    model.train()
    torch.testing.assert_close(compiled(x), x * 1.5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_changed_input_dtype_and_rank(backend):
    def fn(x):
        return (x * 3).softmax(dim=-1) + x.ndim

    compiled = ember.compile(fn, backend=backend)
    for x in (torch.randn(4, 5), torch.randn(4, 5, dtype=torch.float64), torch.randn(2, 4, 5),
              torch.randn(5), torch.randn(4, 5)):
        out = compiled(x)
        assert out.dtype == x.dtype and out.shape == x.shape
        torch.testing.assert_close(out, fn(x))


@pytest.mark.parametrize("backend", BACKENDS)
def test_python_scalar_argument_changes_result(backend):
    compiled = ember.compile(lambda x, k: x * k, backend=backend)
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x, 2), x * 2)
    torch.testing.assert_close(compiled(x, 3), x * 3)  # a recompile is fine; a stale answer is not
