"""Differential tests for nn.Module capture: parameters, buffers, hooks, guards on module state."""
import copy

import torch
import torch.nn.functional as F
from torch import nn

from .test_functions import assert_same


def compiled_events(captured):
    return [e for e in captured.events if e.graph is not None]


class MLP(nn.Module):
    def __init__(self, sizes=(8, 16, 4)):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in zip(sizes, sizes[1:]))
        self.act = nn.GELU()
        self.scale = 0.5

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = self.act(x)
        return x * self.scale


class Attention(nn.Module):
    def __init__(self, dim=16, heads=2):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.norm = nn.LayerNorm(dim)
        self.drop = nn.Dropout(0.0)

    def forward(self, x, mask=None):
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm(x)).split(c, dim=-1)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / (c // self.heads) ** 0.5
        if mask is not None:
            scores = scores.masked_fill(mask, float("-inf"))
        out = self.drop(F.softmax(scores, dim=-1)) @ v
        return x + self.proj(out.transpose(1, 2).reshape(b, t, c))


class Base(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x):
        return self.lin(x)


class Child(Base):
    def forward(self, x):
        return super().forward(x) * 2 + 1


class Containers(nn.Module):
    def __init__(self):
        super().__init__()
        self.seq = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 4))
        self.blocks = nn.ModuleDict({"a": nn.Linear(4, 4), "b": nn.Tanh()})
        self.extra = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])
        self.register_buffer("offset", torch.ones(4))

    def forward(self, x):
        x = self.seq(x)
        for name, block in self.blocks.items():
            x = block(x) + (1 if name == "a" else 0)
        x = self.blocks["b"](x)
        for layer in self.extra[1:]:
            x = layer(x)
        assert len(self.extra) == 2
        return {"out": x + self.offset, "n": len(self.blocks)}


def run_both(module, *inputs, calls=2):
    from ember.capture import compile_function
    twin = copy.deepcopy(module)
    captured = compile_function(module, backend=lambda g, ex: g.as_callable())
    for _ in range(calls):
        torch.manual_seed(0)
        actual = captured(*inputs)
        torch.manual_seed(0)
        expected = twin(*inputs)
        assert_same(actual, expected)
    for (name, a), (_, b) in zip(module.state_dict().items(), twin.state_dict().items()):
        torch.testing.assert_close(a, b, msg=name)
    return captured


def test_mlp():
    captured = run_both(MLP(), torch.randn(3, 8))
    assert len(compiled_events(captured)) == 1
    sources = [n.extra["source"] for n in captured.events[0].graph.placeholders]
    assert "L['self'].layers[0].weight" in sources


def test_attention_block():
    run_both(Attention(), torch.randn(2, 5, 16))
    mask = torch.ones(5, 5, dtype=torch.bool).triu(1)
    run_both(Attention(), torch.randn(2, 5, 16), mask)


def test_super_and_containers():
    run_both(Child(), torch.randn(2, 4))
    run_both(Containers(), torch.randn(3, 4))


def test_conv_batchnorm_train_updates_running_stats():
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(), nn.Dropout(0.2))
    captured = run_both(model, torch.randn(2, 3, 6, 6), calls=3)
    assert model[1].num_batches_tracked.item() == 3
    assert len(compiled_events(captured)) == 1


def test_train_eval_toggle_and_float_attribute_are_guarded():
    model = MLP()
    from ember.capture import compile_function
    captured = compile_function(model, backend=lambda g, ex: g.as_callable())
    x = torch.randn(2, 8)
    assert_same(captured(x), model(x))
    model.scale = 3.0
    assert_same(captured(x), model(x))
    model.eval()
    assert_same(captured(x), model(x))
    model.train()
    assert_same(captured(x), model(x))
    events = compiled_events(captured)
    assert len(events) == 3
    assert "scale" in events[1].recompile_reason and "training" in events[2].recompile_reason
    bn = nn.BatchNorm1d(8)
    captured_bn = run_both(bn, torch.randn(4, 8))
    bn.eval()
    assert_same(captured_bn(x), bn(x))


def test_hooks_are_honoured_and_guarded():
    model = Base()
    from ember.capture import compile_function
    captured = compile_function(model, backend=lambda g, ex: g.as_callable())
    x = torch.randn(2, 4)
    assert_same(captured(x), model(x))
    handle = model.register_forward_pre_hook(lambda m, args: (args[0] * 10,))
    post = model.register_forward_hook(lambda m, args, out: out + 100)
    assert_same(captured(x), model(x))
    handle.remove()
    post.remove()
    assert_same(captured(x), model(x))
    assert len(compiled_events(captured)) == 2


class Counter(nn.Module):
    def __init__(self):
        super().__init__()
        self.calls = 0
        self.lin = nn.Linear(3, 3)

    def forward(self, x):
        self.calls += 1
        self.last = x.detach()
        return self.lin(x)


def test_module_attribute_assignment_is_replayed():
    model = Counter()
    from ember.capture import compile_function
    captured = compile_function(model, backend=lambda g, ex: g.as_callable())
    x = torch.randn(2, 3)
    for i in range(3):
        captured(x)
        assert model.calls == i + 1
    assert torch.equal(model.last, x)


# ---------------------------------------------------------------- forward behind an (*args, **kwargs) wrapper
def _keyword_renaming(fn):
    """transformers 5.24's deprecate_kwarg: the forward every model exposes takes (*args, **kwargs),
    so the module's self arrives as args[0]."""
    import functools

    @functools.wraps(fn)
    def wrapped_func(*args, **kwargs):
        if "old_scale" in kwargs:
            kwargs["scale"] = kwargs.pop("old_scale")
        return fn(*args, **kwargs)
    return wrapped_func


class WrappedForward(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)

    @_keyword_renaming
    def forward(self, x, scale=1.0):
        return torch.tanh(self.linear(x)) * scale


def test_a_forward_taking_self_in_its_varargs_is_captured():
    import ember
    model = WrappedForward()
    twin = copy.deepcopy(model)
    compiled = ember.compile(model, fullgraph=True)
    for kwargs in ({}, {"scale": 2.0}, {"old_scale": 3.0}):
        x = torch.randn(3, 4, requires_grad=True)
        x_twin = x.detach().clone().requires_grad_(True)
        actual, expected = compiled(x, **kwargs), twin(x_twin, **kwargs)
        assert_same(actual, expected)
        actual.sum().backward()
        expected.sum().backward()
        assert_same(x.grad, x_twin.grad)
    for p, q in zip(model.parameters(), twin.parameters()):
        torch.testing.assert_close(p.grad, q.grad)
    report = ember.explain(model, torch.randn(3, 4))
    assert (report.graph_count, report.break_count) == (1, 0) and report.kernel_count > 0, str(report)


def test_arguments_ember_cannot_bind_are_loud(monkeypatch):
    """A binder failure that eager does not share runs the call eagerly with a warning (never
    silently), and is a CompileError under fullgraph=True."""
    import warnings

    import pytest

    import ember
    from ember.errors import CompileError

    def fn(x):
        return x * 2

    def failing_binder(*args, **kwargs):
        raise TypeError("no binding")

    for fullgraph in (False, True):
        compiled = ember.compile(fn, fullgraph=fullgraph)
        monkeypatch.setattr(compiled._ember_captured.spec, "binder", failing_binder)
        x = torch.randn(3)
        if fullgraph:
            with pytest.raises(CompileError, match="could not bind"):
                compiled(x)
            continue
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert_same(compiled(x), fn(x))
            assert_same(compiled(x), fn(x))
        assert [str(w.message).count("could not bind") for w in caught] == [1]
