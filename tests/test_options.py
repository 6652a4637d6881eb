"""What users pass in: ``compile``'s options (CompileOptions), EMBER_LOGS names, the fallback policy
for graphs ember cannot compile, and ``functools.partial`` targets."""
from __future__ import annotations

import functools
import os
import subprocess
import sys
import warnings

import pytest
import torch
from torch import nn

import ember
import ember.backend
from ember.api import CompileFallbackWarning, CompileOptions
from ember.debug import logs


@pytest.fixture(autouse=True)
def default_fallback_policy(monkeypatch):
    """These tests check the defaults: a suite-wide EMBER_FALLBACK=error must not change them."""
    monkeypatch.delenv("EMBER_FALLBACK", raising=False)
    ember.reset()                     # forget fallback warnings given by earlier tests


# ------------------------------------------------------------------ options
@pytest.mark.parametrize("options", [{"bogus": 1}, {"fallback": "eager", "cpu_backnd": "triton"},
                                     {"mode": "max-autotune"}])
def test_unknown_option_keys_are_rejected_with_the_valid_ones(options):
    with pytest.raises(ValueError, match="valid options: fallback, cpu_backend"):
        ember.compile(lambda x: x + 1, options=options)


@pytest.mark.parametrize("options,match", [({"fallback": "never"}, "fallback"),
                                           ({"cpu_backend": "cuda"}, "cpu_backend")])
def test_bad_option_values_are_rejected(options, match):
    with pytest.raises(ValueError, match=match):
        ember.compile(lambda x: x + 1, options=options)


def test_bad_arguments_fail_where_they_were_written_also_as_a_decorator():
    with pytest.raises(ValueError, match="valid options"):
        ember.compile(options={"typo": True})
    with pytest.raises(ValueError, match="dynamic"):
        ember.compile(lambda x: x, dynamic="yes")
    with pytest.raises(TypeError, match="dict"):
        ember.compile(lambda x: x, options=[("fallback", "eager")])


def test_compile_options_defaults_and_fields():
    options = CompileOptions.from_compile()
    assert (options.backend, options.mode, options.dynamic, options.fullgraph, options.fallback,
            options.cpu_backend) == ("ember", "default", None, False, "eager", "cpp")
    options = CompileOptions.from_compile(backend="eager", mode="reduce-overhead", dynamic=True, fullgraph=True,
                                          options={"fallback": "error", "cpu_backend": "triton"})
    assert (options.backend, options.mode, options.dynamic, options.fullgraph, options.fallback,
            options.cpu_backend) == ("eager", "reduce-overhead", True, True, "error", "triton")
    assert CompileOptions.from_options(options) is options
    with pytest.raises(ValueError, match="valid options"):
        CompileOptions.from_options({"cpu_backend": "cpp", "unroll": 4})


def test_ember_fallback_environment_variable(monkeypatch):
    monkeypatch.setenv("EMBER_FALLBACK", "error")
    assert CompileOptions.from_compile().fallback == "error"
    assert CompileOptions.from_compile(options={"fallback": "eager"}).fallback == "eager"
    monkeypatch.setenv("EMBER_FALLBACK", "sometimes")
    with pytest.raises(ValueError, match="EMBER_FALLBACK"):
        CompileOptions.from_compile()


def test_every_field_reaches_its_stage(monkeypatch):
    seen = {}
    real_compile = ember.backend.compile_from_specs

    def recording_compile(graph, specs, options):
        seen["options"] = options
        return real_compile(graph, specs, options)

    monkeypatch.setattr(ember.backend, "compile_from_specs", recording_compile)
    compiled = ember.compile(lambda x: x * 2 + 1, mode="max-autotune", dynamic=False, fullgraph=True,
                             options={"cpu_backend": "triton", "fallback": "error"})
    x = torch.randn(8)
    torch.testing.assert_close(compiled(x), x * 2 + 1)
    options = seen["options"]
    assert isinstance(options, CompileOptions)
    assert (options.mode, options.dynamic, options.fullgraph, options.fallback, options.cpu_backend) == \
        ("max-autotune", False, True, "error", "triton")
    captured = compiled._ember_captured
    assert captured.fullgraph                                  # capture reads fullgraph
    assert captured.backend.options is options or captured.backend.options == options
    assert "@triton.jit" in captured.events[0].compiled.source  # the backend read cpu_backend


def test_plain_registered_backends_still_get_graph_and_example_inputs():
    calls = []

    def plain(graph, example_inputs):
        calls.append(len(example_inputs))
        return graph.as_callable()

    ember.register_backend("plain_for_options_test", plain)
    compiled = ember.compile(lambda x: x.cos(), backend="plain_for_options_test", options={"fallback": "error"})
    x = torch.randn(3)
    torch.testing.assert_close(compiled(x), x.cos())
    assert calls == [1]


# ------------------------------------------------------------------ EMBER_LOGS
@pytest.mark.parametrize("spec", ["grpah", "graph,outputcode", "all,nope"])
def test_unknown_log_names_are_rejected_with_the_valid_ones(spec):
    before = set(logs._enabled)
    with pytest.raises(ValueError, match="valid names: all, graph"):
        logs.set_logs(spec)
    assert logs._enabled == before                             # a rejected spec changes nothing


def test_known_log_names_are_accepted():
    before = ",".join(sorted(logs._enabled))
    try:
        logs.set_logs(" graph , guards ")
        assert logs.enabled("graph") and logs.enabled("guards") and not logs.enabled("output_code")
        logs.set_logs("all")
        assert all(logs.enabled(c) for c in logs.CHANNELS)
    finally:
        logs.set_logs(before)


def test_unknown_log_name_in_the_environment_fails_at_import_ember():
    env = dict(os.environ, EMBER_LOGS="graph,bogus")
    result = subprocess.run([sys.executable, "-c", "import ember"], env=env, capture_output=True,
                            text=True, check=False)
    assert result.returncode != 0 and "unknown EMBER_LOGS name(s) 'bogus'" in result.stderr


# ------------------------------------------------------------------ fallback policy
def failing_lowering(*args, **kwargs):
    raise AssertionError("lowering exploded")


def function_to_compile(x):
    y = x.sin()  # the line the fallback warning names
    return y * 2


FUNCTION_LINE = function_to_compile.__code__.co_firstlineno + 1


def test_a_graph_that_cannot_compile_runs_eagerly_with_one_warning(monkeypatch):
    monkeypatch.setattr(ember.backend, "lower_graph", failing_lowering)
    compiled = ember.compile(function_to_compile)
    x = torch.randn(5)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(3):
            torch.testing.assert_close(compiled(x), x.sin() * 2)
    fallback = [w for w in caught if issubclass(w.category, CompileFallbackWarning)]
    assert len(fallback) == 1, [str(w.message) for w in caught]
    message = str(fallback[0].message)
    assert f"test_options.py:{FUNCTION_LINE}" in message             # the user's line
    assert "stage: lower" in message and "lowering exploded" in message   # the stage and the reason
    assert "options={'fallback': 'error'}" in message                 # how to get an error instead
    assert fallback[0].filename.endswith("test_options.py") and fallback[0].lineno == FUNCTION_LINE
    y = torch.randn(2, 3)            # a new shape: a recompile, failing at the same line for the same reason
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.testing.assert_close(compiled(y), y.sin() * 2)
    assert not [w for w in caught if issubclass(w.category, CompileFallbackWarning)]   # still only once


@pytest.mark.parametrize("settings", [{"options": {"fallback": "error"}}, {"fullgraph": True}],
                         ids=["fallback_error", "fullgraph"])
def test_fallback_error_and_fullgraph_raise(monkeypatch, settings):
    monkeypatch.setattr(ember.backend, "lower_graph", failing_lowering)
    compiled = ember.compile(function_to_compile, **settings)
    with pytest.raises(ember.CompileError, match="lowering exploded") as info:
        compiled(torch.randn(5))
    assert info.value.stage == "lower"


def test_compile_graph_itself_never_falls_back(monkeypatch):
    # the policy lives in one place (ember.api.resolve_backend): the backend always raises
    monkeypatch.setattr(ember.backend, "lower_graph", failing_lowering)
    from ember.graph import Graph
    graph = Graph()
    x = graph.placeholder("x")
    graph.output((graph.call(torch.sin, (x,)),))
    with pytest.raises(ember.CompileError):
        ember.backend.compile_graph(graph, [torch.randn(3)], {"fallback": "eager"})


def test_a_failing_custom_backend_falls_back_too():
    def broken(graph, example_inputs):
        raise RuntimeError("no kernels today")

    compiled = ember.compile(lambda t: t.exp(), backend=broken)
    x = torch.randn(4)
    with pytest.warns(CompileFallbackWarning, match="no kernels today"):
        torch.testing.assert_close(compiled(x), x.exp())


# ------------------------------------------------------------------ functools.partial
def scaled(x, k, *, shift=0.0):
    return x * k + shift


class Affine(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def forward(self, x, scale=1.0):
        return self.linear(x) * scale


@pytest.mark.parametrize("make", [
    lambda: functools.partial(scaled, k=3),
    lambda: functools.partial(scaled, k=3, shift=1.5),
    lambda: functools.partial(scaled, shift=torch.ones(4)),
    lambda: functools.partial(functools.partial(scaled, k=2.0), shift=-1.0),
    lambda: functools.partial(torch.add, alpha=2),
    lambda: functools.partial(Affine().eval(), scale=0.5),
], ids=["keyword", "two_keywords", "tensor_keyword", "nested", "torch_function", "module"])
def test_functools_partial_compiles_and_matches_eager(make):
    target = make()
    x = torch.randn(4)
    args = (x,) if target.func is not scaled or "k" in target.keywords or target.args else (x, 4)
    if target.func is torch.add:
        args = (x, torch.randn(4))
    compiled = ember.compile(target, options={"fallback": "error"})
    with torch.no_grad():
        torch.testing.assert_close(compiled(*args), target(*args))
        torch.testing.assert_close(compiled(*args), target(*args))     # the cached entry
    assert ember.compile(compiled, options={"fallback": "error"})(*args).shape == target(*args).shape


def test_functools_partial_with_positional_tensor():
    weight = torch.randn(4)
    target = functools.partial(torch.mul, weight)
    compiled = ember.compile(target, options={"fallback": "error"})
    x = torch.randn(4)
    torch.testing.assert_close(compiled(x), weight * x)
    weight.add_(1)          # the bound tensor is an input of every call, never a stale constant
    torch.testing.assert_close(compiled(x), weight * x)
