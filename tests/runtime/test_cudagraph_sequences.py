"""mode="reduce-overhead" under random sequences of calls, against an eager twin (a seeded fuzzer).

Each seed builds a small model (Linear layers, a BatchNorm whose running stats the forward writes,
a call counter the forward writes with outputs that are views, or an input and a buffer the forward
writes in place; for some seeds a graph break) and runs a random sequence of actions on the compiled model and
on an eager copy: training steps with and without zero_grad, gradient accumulation, two forwards
before one backward, no_grad calls, optimizer steps, cudagraph_mark_step_begin, batches passed as
new tensors or written into the same tensor, and new batch sizes.  After every action outputs,
gradients, parameters and buffers must equal eager's (then eager's state is copied in place into
the compiled model, so that float differences do not grow over the steps).  Outputs kept from
earlier calls must either
still hold their values or have been marked overwritten (reading one then raises on CUDA): never
silently changed.  The CPU emulation of test_cudagraphs.py runs it without a GPU, its "worst-case
pool" writing garbage over every later recording's memory on a replay.

    EMBER_CUDAGRAPH_SEEDS=200 pytest tests/runtime/test_cudagraph_sequences.py    # a longer run
"""
from __future__ import annotations

import copy
import os
import random

import pytest
import torch
from torch import nn
from test_cudagraphs import DEV, _expired, emulate_on_cpu, ro  # noqa: F401 - the fixture applies here

import ember
from ember.runtime import cudagraphs

SEEDS = range(int(os.environ.get("EMBER_CUDAGRAPH_SEEDS", "32")))
ACTIONS = ["train", "train", "accumulate", "two_forwards", "no_grad", "optimizer_step", "mark_step",
           "keep", "resize"]


class Net(nn.Module):
    def __init__(self, graph_break: bool):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(12, 16), nn.Linear(16, 12)
        self.norm = nn.BatchNorm1d(16)
        self.graph_break = graph_break

    def forward(self, x):
        h = torch.relu(self.norm(self.fc1(x)))
        if self.graph_break:
            print("", end="")       # a graph break: two graphs, each replayed
        return self.fc2(h) * 0.5, h.sum(dim=1)


class CountingNet(nn.Module):
    """Module state the forward writes (a call counter), an in-place op on an intermediate, and
    outputs that are views: of another output, and of an intermediate."""

    def __init__(self, graph_break: bool):
        super().__init__()
        self.fc = nn.Linear(12, 12)
        self.register_buffer("calls", torch.zeros(()))
        self.graph_break = graph_break

    def forward(self, x):
        self.calls += 1
        h = self.fc(x)
        h.mul_(torch.sigmoid(h))
        if self.graph_break:
            print("", end="")
        out = h + x * (self.calls % 3)
        return out, out[:, :5], h[:, :2]       # after a break, h[:, :2] views the first graph's output


class InputWritingNet(nn.Module):
    """A forward that writes its input in place and keeps a running average in a buffer."""

    def __init__(self, graph_break: bool):
        super().__init__()
        self.fc = nn.Linear(12, 12)
        self.register_buffer("average", torch.zeros(12))
        self.graph_break = graph_break

    def forward(self, x):
        x.mul_(0.5)
        with torch.no_grad():
            self.average.mul_(0.9).add_(x.mean(dim=0), alpha=0.1)
        x = x.clone()       # what autograd saves is not the input the next call writes (eager raises)
        y = torch.tanh(self.fc(x))
        if self.graph_break:
            print("", end="")
        return y + self.average, (y * x).sum(dim=1)


class Twin:
    """One side of the comparison: a model, the callable to run it, its optimizer and batch."""

    def __init__(self, model: nn.Module, run, batch: torch.Tensor) -> None:
        self.model, self.run = model, run
        self.optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
        self.batch = batch.clone()
        self.last_outputs: list[torch.Tensor] = []

    def feed(self, values: torch.Tensor, in_place: bool) -> None:
        if in_place and self.batch.shape == values.shape:
            self.batch.copy_(values)        # the same tensor, new values: read in place
        else:
            self.batch = values.clone()     # a new tensor at another address

    def loss(self) -> tuple[torch.Tensor, tuple]:
        outputs = self.run(self.batch)
        self.last_outputs = list(outputs)
        out, side = outputs[:2]
        return out.square().mean() + side.sin().mean(), outputs


def _act(action: str, twin: Twin, rng_state: int):
    """Run one action on one side; returns the tensors to compare (detached clones)."""
    if action in ("train", "accumulate"):
        if action == "train":
            twin.model.zero_grad(set_to_none=rng_state % 2 == 0)
        loss, outs = twin.loss()
        loss.backward()
        return [loss.detach().clone(), *(o.detach().clone() for o in outs)]
    if action == "two_forwards":
        twin.model.zero_grad()
        first, _ = twin.loss()
        second, outs = twin.loss()
        (first + 2 * second).backward()
        return [first.detach().clone(), second.detach().clone()]
    if action == "no_grad":
        with torch.no_grad():
            return [o.clone() for o in twin.run(twin.batch)]
    if action == "optimizer_step":
        if any(p.grad is not None for p in twin.model.parameters()):
            twin.optimizer.step()
        return []
    raise AssertionError(action)


def _close(actual: torch.Tensor, expected: torch.Tensor, where: str) -> None:
    torch.testing.assert_close(actual, expected, rtol=1e-3, atol=1e-4, msg=lambda m: f"{where}: {m}")


def _state_names(model: nn.Module) -> list[str]:
    return [*model.state_dict(), *(f"{name}.grad" for name, _ in model.named_parameters())]


def _state(model: nn.Module) -> list[torch.Tensor]:
    grads = [p.grad if p.grad is not None else torch.zeros(0) for p in model.parameters()]
    return [*model.state_dict().values(), *grads]


@pytest.mark.parametrize("seed", SEEDS)
def test_random_call_sequences_match_eager(seed):
    rng = random.Random(seed)
    torch.manual_seed(seed)
    eager_model = [Net, Net, CountingNet, InputWritingNet][seed % 4](graph_break=seed % 3 == 2).to(DEV)
    compiled_model = copy.deepcopy(eager_model)
    dynamic = [None, True][seed % 2]
    batch = torch.randn(8, 12, device=DEV)
    eager = Twin(eager_model, eager_model, batch)
    compiled = Twin(compiled_model, ro(compiled_model, dynamic=dynamic), batch)
    kept: list[tuple[torch.Tensor, torch.Tensor, str]] = []     # (output, its values then, where)
    history: list[str] = []
    for step in range(int(os.environ.get("EMBER_CUDAGRAPH_STEPS", "24"))):
        action = rng.choice(ACTIONS)
        history.append(action)
        where = f"seed {seed}, step {step}: {action} (after {' '.join(history[:-1])})"
        if action == "mark_step":
            ember.cudagraph_mark_step_begin()
            continue
        if action == "resize":
            size = rng.choice([4, 8, 8, 16])
            values = torch.randn(size, 12, device=DEV)
            in_place = rng.random() < 0.5
            eager.feed(values, in_place)
            compiled.feed(values, in_place)
            continue
        if action == "keep":     # keep the compiled outputs of a no_grad call across later calls
            with torch.no_grad():
                outs = compiled.run(compiled.batch)
                expected = eager.run(eager.batch)
            for index, (out, ref) in enumerate(zip(outs, expected)):
                _close(out, ref, f"{where}, output {index}")
                kept.append((out, out.clone(), where))
            continue
        token = rng.randrange(1 << 16)
        expected = _act(action, eager, token)
        compiled.last_outputs = []
        actual = _act(action, compiled, token)
        for index, (a, e) in enumerate(zip(actual, expected)):
            _close(a, e, f"{where}, result {index}")
        kept += [(out, out.detach().clone(), where) for out in compiled.last_outputs]
        for name, a, e in zip(_state_names(eager.model), _state(compiled.model), _state(eager.model)):
            _close(a.float(), e.float(), f"{where}, {name}")
        with torch.no_grad():      # no drift of float differences over many steps: eager's state, in place
            for a, e in zip(compiled.model.state_dict().values(), eager.model.state_dict().values()):
                a.copy_(e)
        for out, then, origin in kept:     # never silently overwritten
            if not any(t is out for t in _expired):
                assert torch.equal(out, then), f"an output kept from {origin} changed by {where}"
    if not isinstance(eager_model, InputWritingNet):     # its training graph runs op by op (input written)
        assert cudagraphs.counters["replayed"] > 0
