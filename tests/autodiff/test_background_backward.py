"""The backward compiling in a thread while the forward builds (autodiff/training.py BackgroundBackward).

On CUDA it is the default; ``config.compile_backward_early = "always"`` takes the same path on the
CPU, where these tests run it: gradients over several steps equal eager's, the thread's compile is
the one the first backward uses, and a backward that fails to compile in the thread runs its graph
uncompiled at the first backward with the usual warning, never at the forward.
"""
from __future__ import annotations

import copy

import pytest
import torch
from test_training_semantics import _failing_backward_compile, check_fn, leaf
from torch import nn
from training_util import compile_plain, compile_strict

from ember import config
from ember.autodiff import training


@pytest.fixture
def started(monkeypatch) -> list:
    """Turns the early compile on for CPU graphs; lists every BackgroundBackward started."""
    monkeypatch.setattr(config, "compile_backward_early", "always")
    made: list = []
    real_init = training.BackgroundBackward.__init__

    def recording_init(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        made.append(self)
    monkeypatch.setattr(training.BackgroundBackward, "__init__", recording_init)
    return made


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(16)
        self.up = nn.Linear(16, 32)
        self.down = nn.Linear(32, 16)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


def test_training_steps_match_eager(started):
    torch.manual_seed(0)
    model = Block()
    twin = copy.deepcopy(model)
    compiled = compile_strict(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    twin_optimizer = torch.optim.AdamW(twin.parameters(), lr=1e-2)
    for _ in range(3):
        x = torch.randn(4, 8, 16)
        for module, opt in ((compiled, optimizer), (twin, twin_optimizer)):
            opt.zero_grad()
            module(x).pow(2).mean().backward()
        for (name, p), q in zip(model.named_parameters(), twin.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=name)
        optimizer.step()
        twin_optimizer.step()
    assert len(started) == 1 and not started[0]._thread.is_alive()
    assert started[0]._result is not None and started[0]._error is None


def test_the_first_backward_uses_the_threads_compile(started, monkeypatch):
    calls = []
    real = training.BackgroundBackward.result
    monkeypatch.setattr(training.BackgroundBackward, "result", lambda self: calls.append(self) or real(self))
    check_fn(lambda x, w: (x @ w).tanh().sum(-1), [leaf(5, 4), leaf(4, 3)])
    assert len(started) == 1 and calls == started


def test_a_backward_that_fails_to_compile_in_the_thread_fails_at_the_backward(started, monkeypatch):
    _failing_backward_compile(monkeypatch)

    def f(x, w):
        return torch.nn.functional.gelu(x @ w).softmax(-1) * x.sum()

    with pytest.warns(UserWarning, match="cannot compile this graph's backward .*kernel compiler failed"):
        check_fn(f, [leaf(5, 4), leaf(4, 4)], compiled_fn=compile_plain(f))
    assert len(started) == 1 and started[0]._error is not None


def test_cpu_graphs_compile_their_backward_at_the_first_backward_by_default(monkeypatch):
    monkeypatch.setattr(config, "compile_backward_early", "cuda")
    made = []
    monkeypatch.setattr(training.BackgroundBackward, "__init__", lambda self, *a, **k: made.append(self))
    check_fn(lambda x: (x.sin() * 3).sum(), [leaf(6)])
    assert made == []
