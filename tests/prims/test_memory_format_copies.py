"""clone, contiguous, to and the cast methods with a memory_format give eager's layout: a
channels-last request on an NCHW tensor (x.contiguous(memory_format=torch.channels_last), CNN
code's usual conversion) came back NCHW under ember.  Every method x format x input layout
against eager: values, strides, whether the result is the input itself (eager's alias), and a
use after the conversion; gradients through them."""
from __future__ import annotations

import itertools

import pytest
import torch

import ember
from ember.backend import compile_graph
from ember.debug.explain import report_from_events

CL, CF, PF = torch.channels_last, torch.contiguous_format, torch.preserve_format
METHODS = {
    "contiguous": lambda x, f: x.contiguous(memory_format=f),
    "clone": lambda x, f: x.clone(memory_format=f),
    "to": lambda x, f: x.to(memory_format=f),
    "to_dtype": lambda x, f: x.to(torch.float64, memory_format=f),
    "to_copy": lambda x, f: x.to(torch.float32, copy=True, memory_format=f),
    "double": lambda x, f: x.double(memory_format=f),
    "float": lambda x, f: x.float(memory_format=f),
}
FORMATS = {"channels_last": CL, "contiguous_format": CF, "preserve_format": PF}


def _keeping_backend(graphs):
    """The ember backend with no eager fallback, keeping each compiled graph."""
    def backend(graph, example_inputs):
        compiled = compile_graph(graph, example_inputs, options={"fallback": "error"})
        graphs.append(compiled)
        return compiled
    return backend


def _inputs():
    torch.manual_seed(0)
    base = torch.randn(2, 3, 4, 5)
    return {"nchw": base, "channels_last": base.contiguous(memory_format=CL),
            "transposed": base.transpose(2, 3), "sliced": torch.randn(2, 3, 4, 10)[..., ::2]}


@pytest.mark.parametrize("layout", list(_inputs()))
def test_memory_format_conversions_match_eager(layout):
    x = _inputs()[layout]
    cases = [(m, f) for m, f in itertools.product(METHODS, FORMATS) if not (m == "contiguous" and f == "preserve_format")]

    def program(x):
        out = []
        for method, fmt in cases:
            y = METHODS[method](x, FORMATS[fmt])
            out += [y, y * 2]       # the converted tensor itself, and one computed from it
        return out
    report = ember.explain(program, x)
    assert report.graph_count == 1 and report.break_count == 0, str(report)
    assert not getattr(report.compiled[0], "eager_reason", None), str(report)
    expected = program(x)
    for k, (got, want) in enumerate(zip(report.output, expected)):
        what = f"{cases[k // 2]} {'result' if k % 2 == 0 else 'result * 2'}"
        torch.testing.assert_close(got, want, msg=what)
        assert got.stride() == want.stride(), (what, got.stride(), want.stride())
        if k % 2 == 0:
            assert (got.data_ptr() == x.data_ptr()) == (want.data_ptr() == x.data_ptr()), what


def test_channels_last_conversion_in_training():
    """x.contiguous(memory_format=channels_last) inside a training step: layout and gradient."""
    conv = torch.nn.Conv2d(3, 4, 3, padding=1)

    def step(x):
        y = conv(x.contiguous(memory_format=CL)).relu()
        return y, y.sum()
    x = _inputs()["nchw"]
    x_e, x_c = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_e, loss_e = step(x_e)
    graphs = []
    y_c, loss_c = ember.compile(step, backend=_keeping_backend(graphs))(x_c)
    assert [g.kind for g in graphs] == ["autograd"], [g.kind for g in graphs]
    assert y_c.stride() == y_e.stride()
    loss_e.backward()
    loss_c.backward()
    torch.testing.assert_close(x_c.grad, x_e.grad)


def test_channels_last_of_a_3d_tensor_raises_as_eager():
    with pytest.raises(RuntimeError, match="rank 4"):
        torch.randn(2, 3, 4).contiguous(memory_format=CL)
    with pytest.raises(Exception, match="rank 4"):
        ember.compile(lambda x: x.contiguous(memory_format=CL))(torch.randn(2, 3, 4))


@pytest.mark.parametrize("dynamic", [True, None], ids=["dynamic", "automatic"])
def test_contiguous_stays_an_alias_with_symbolic_sizes(dynamic):
    """x.contiguous() of a contiguous x is x itself, at symbolic sizes too: a write through it
    reaches x (a copy would lose the write); channels-last requests still convert."""
    def write_through(x):
        y = x.contiguous()
        y.add_(1)
        return y * 2

    def to_channels_last(x):
        return x.contiguous(memory_format=CL)
    compiled_write, compiled_cl = (ember.compile(f, dynamic=dynamic, options={"fallback": "error"})
                                   for f in (write_through, to_channels_last))
    for n in (6, 7, 9):      # no size equal to another dim's (duck sizing would share a symbol)
        x_e = torch.randn(n, 4)
        x_c = x_e.clone()
        torch.testing.assert_close(compiled_write(x_c), write_through(x_e))
        torch.testing.assert_close(x_c, x_e)
        image = torch.randn(n, 3, 4, 5)
        assert compiled_cl(image).stride() == to_channels_last(image).stride()
    # compiled (fallback="error": never eagerly), and at symbolic sizes: one graph with
    # dynamic=True, a static then a symbolic one with automatic dynamic shapes, not one per size
    for compiled in (compiled_write, compiled_cl):
        report = report_from_events(list(compiled._ember_captured.events))
        assert report.graph_count == (1 if dynamic else 2) and report.kernel_count >= 1, str(report)
