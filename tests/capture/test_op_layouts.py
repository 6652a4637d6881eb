"""Results laid out as eager's CPU kernels lay them out, for the ops whose meta kernels say
otherwise (capture/tensor_ops.py ``_eager_layout``) and for cat/stack of one tensor: batch_norm
and group_norm (the input's suggested memory format: a permuted input gives a contiguous result,
a channels-last one a channels-last result), pixel_shuffle, channel_shuffle, roll, and F.pad's
replicate and reflect modes (channels-last stays channels-last), cat([x]) and stack([x]) (a new
tensor in cat's layout, not x's).  Found by benchmarks/stride_sweep.py (OpInfo with permuted
inputs).  Values, strides and gradients against eager; every graph compiled.  Stack at every dim
and F.pad with no positive pad are walked over layouts and tensor counts below."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import ember
from ember.backend import compile_graph


def _inputs():
    torch.manual_seed(0)
    return {
        "3d_permuted": torch.randn(4, 6, 5).transpose(1, 2).contiguous().transpose(1, 2),
        "4d_permuted": torch.randn(2, 6, 4, 5).transpose(2, 3).contiguous().transpose(2, 3),
        "channels_last": torch.randn(2, 6, 4, 5).to(memory_format=torch.channels_last),
        "contiguous": torch.randn(2, 6, 4, 5),
    }


_W, _B = torch.linspace(0.5, 1.5, 6), torch.linspace(-0.2, 0.2, 6)
OPS = {
    "batch_norm_eval": lambda x: F.batch_norm(x, torch.zeros(6), torch.ones(6), _W, _B, False),
    "batch_norm_train": lambda x: F.batch_norm(x, None, None, _W, _B, True),
    "group_norm": lambda x: F.group_norm(x, 2, _W, _B),
    "roll": lambda x: x.roll(1, 1),
    "torch_roll": lambda x: torch.roll(x, (1, 2), (1, 2)),
    "cat_one": lambda x: torch.cat([x], 1),
    "stack_one": lambda x: torch.stack([x], 1),
    "pixel_shuffle": lambda x: F.pixel_shuffle(x, 1) if x.ndim == 4 else None,
    "pixel_unshuffle_shuffle": lambda x: F.pixel_shuffle(F.pixel_unshuffle(x[..., :4, :4], 2), 2) if x.ndim == 4 else None,
    "channel_shuffle": lambda x: F.channel_shuffle(x, 2) if x.ndim == 4 else None,
    "pad_replicate": lambda x: F.pad(x, (1, 2, 1, 1), mode="replicate") if x.ndim == 4 else None,
    "pad_reflect": lambda x: F.pad(x, (1, 1, 2, 1), "reflect") if x.ndim == 4 else None,
    "pad_circular": lambda x: F.pad(x, (1, 1, 1, 1), mode="circular") if x.ndim == 4 else None,
}


@pytest.mark.parametrize("layout", list(_inputs()))
def test_results_have_eagers_strides(layout):
    x = _inputs()[layout]
    ops = {name: op for name, op in OPS.items() if op(x) is not None}

    def program(x):
        return [op(x) for op in ops.values()]
    report = ember.explain(program, x)
    assert report.graph_count == 1 and report.break_count == 0 and report.kernel_count >= 1, str(report)
    assert not getattr(report.compiled[0], "eager_reason", None), str(report)
    for name, got, expected in zip(ops, report.output, program(x)):
        torch.testing.assert_close(got, expected, msg=name)
        assert got.stride() == expected.stride(), (name, got.stride(), expected.stride())


@pytest.mark.parametrize("layout", ["3d_permuted", "channels_last"])
def test_training_batch_norm_keeps_eagers_layout_and_gradients(layout):
    """BatchNorm in train mode after a transpose (a sequence model's (N, L, C) -> (N, C, L)): the
    output is viewable as eager's is, and gradients and running statistics match."""
    x = _inputs()[layout]
    norm = torch.nn.BatchNorm1d(6) if x.ndim == 3 else torch.nn.BatchNorm2d(6)
    eager_norm, compiled_norm = norm, torch.nn.BatchNorm1d(6) if x.ndim == 3 else torch.nn.BatchNorm2d(6)
    compiled_norm.load_state_dict(eager_norm.state_dict())

    def step(module, x):
        y = module(x)
        return y, (y * torch.arange(y.numel()).reshape(y.shape)).sum()
    x_e, x_c = x.clone().requires_grad_(), x.clone().requires_grad_()
    y_e, loss_e = step(eager_norm, x_e)
    graphs = []

    def backend(graph, example_inputs):     # no eager fallback: the step must compile
        graphs.append(compile_graph(graph, example_inputs, options={"fallback": "error"}))
        return graphs[-1]
    y_c, loss_c = ember.compile(step, backend=backend)(compiled_norm, x_c)
    assert [g.kind for g in graphs] == ["autograd"], [g.kind for g in graphs]
    assert y_c.stride() == y_e.stride()
    loss_e.backward()
    loss_c.backward()
    torch.testing.assert_close(y_c, y_e)
    torch.testing.assert_close(x_c.grad, x_e.grad, rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(compiled_norm.weight.grad, eager_norm.weight.grad, rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(compiled_norm.running_mean, eager_norm.running_mean)
    torch.testing.assert_close(compiled_norm.running_var, eager_norm.running_var)


def _stack_and_pad_inputs():
    torch.manual_seed(0)
    return {
        **_inputs(),
        "2d_transposed": torch.randn(5, 3).t(),
        "3d_transposed": torch.randn(5, 4, 3).transpose(-1, -2),
        "sliced": torch.randn(4, 10)[:, ::2],
        "channels_last_sliced": torch.randn(2, 6, 4, 10).to(memory_format=torch.channels_last)[..., ::2],
        "channels_1": torch.randn(2, 1, 4, 5).to(memory_format=torch.channels_last),
    }


@pytest.mark.parametrize("layout", list(_stack_and_pad_inputs()))
def test_stack_at_every_dim_and_non_positive_pads_have_eagers_strides(layout):
    """Eager stacks below the last dim by cat along it and a view (cat's layout of the inputs:
    contiguous for transposed ones, channels-last for channels-last ones, split by the view), and
    at a new last dim by cat of the inputs unsqueezed there (contiguous for a permuted 3-D input).
    Eager's constant pad with no positive pad is a narrowed clone, in x's layout where dense.
    Stacks of the tensor with itself, with a contiguous copy (mixed layouts) and with a 1-D
    partner's broadcast; pads of zeros and negatives.  Found by the fuzzer (seeds 2577, 2642,
    4602, 7275, 7724, 8656, 9373)."""
    x = _stack_and_pad_inputs()[layout]
    other = x.contiguous() * 2
    cases = {}
    for dim in range(-x.ndim - 1, x.ndim + 1):
        cases[f"stack([x, x], {dim})"] = lambda x, y, dim=dim: torch.stack([x, x], dim)
        cases[f"stack([x, y], {dim})"] = lambda x, y, dim=dim: torch.stack([x, y], dim)
        cases[f"stack([y, x, x], {dim})"] = lambda x, y, dim=dim: torch.stack([y, x, x], dim)
    for pad in [(0, 0), (0, 0) * x.ndim, (-1, 0), (0, -1, -1, 0), (-1, -1, 0, -1), (0, 0, 1, 0)]:
        cases[f"pad {pad}"] = lambda x, y, pad=pad: F.pad(x, pad, value=1.5)

    def program(x, y):
        return [case(x, y) for case in cases.values()]
    report = ember.explain(program, x, other)
    assert report.graph_count == 1 and report.break_count == 0, str(report)
    assert not getattr(report.compiled[0], "eager_reason", None), str(report)
    for name, got, expected in zip(cases, report.output, program(x, other)):
        torch.testing.assert_close(got, expected, msg=name)
        assert got.stride() == expected.stride(), (name, got.stride(), expected.stride())
