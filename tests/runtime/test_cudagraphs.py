"""mode="reduce-overhead": CUDA graphs, differential against eager on every call.

Each test calls the compiled function repeatedly with new input values and checks outputs, mutated
inputs, buffers and gradients against eager, and that the calls were in fact replayed
(runtime.cudagraphs.counters).  On a CUDA device they record real CUDA graphs.  Without one (CI)
the runner's bookkeeping runs on the CPU against an emulated recording: capture runs the call once
and restores what it read, replay runs it again and writes the results into the recorded outputs
(the memory a real replay writes), and an expired output is listed instead of raising on reads.
"""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import ember
from ember.debug.explain import explain_with
from ember.runtime import cudagraphs

CUDA = torch.cuda.is_available()
DEV = "cuda" if CUDA else "cpu"
_expired: list = []


@pytest.fixture(autouse=True, params=["shared pool", "worst-case pool"])
def emulate_on_cpu(request, monkeypatch):
    """On the CPU: the emulated recording below.  "worst-case pool" (CPU only) also takes every
    later recording's outputs to lie in each earlier recording's scratch, and an emulated replay
    writes garbage over them, as a real replay writes its scratch: what the runner lets a replay
    overwrite, the tests see."""
    _expired.clear()
    if CUDA:
        if request.param == "worst-case pool":
            pytest.skip("CPU emulation only")
        yield
        return
    recorded: list[list[torch.Tensor]] = []     # per emulated recording, its pool outputs
    worst_case = request.param == "worst-case pool"

    def capture(device, run, inputs):
        saved = [x.clone() if isinstance(x, torch.Tensor) else None for x in inputs]
        outputs = run()
        for x, before in zip(inputs, saved):
            if before is not None and not torch.equal(x, before):   # a copy would bump x's version
                x.copy_(before)
        storages = {x.untyped_storage().data_ptr() for x in inputs if isinstance(x, torch.Tensor)}
        # replay() reruns the call on ``inputs``: an input that is another recording's output (a
        # saved activation) is kept as that output itself, not as the caller's view of it, whose
        # reference would count as autograd still holding the memory (a real recording keeps none)
        owners = {(o.data_ptr(), o.dtype, tuple(o.shape), o.stride()): o for outs in recorded for o in outs}
        for position, x in enumerate(inputs):
            if isinstance(x, torch.Tensor):
                inputs[position] = owners.get((x.data_ptr(), x.dtype, tuple(x.shape), x.stride()), x)
        index = len(recorded)
        recorded.append([o for o in outputs if isinstance(o, torch.Tensor)
                         and o.untyped_storage().data_ptr() not in storages])

        def replay():
            if worst_case:
                for later in recorded[index + 1:]:
                    for tensor in later:
                        tensor.detach().fill_(float("nan") if tensor.is_floating_point() else 77)
            for old, new in zip(outputs, run()):
                if isinstance(old, torch.Tensor) and old.untyped_storage().data_ptr() != new.untyped_storage().data_ptr():
                    old.copy_(new)
        return outputs, replay

    monkeypatch.setattr(cudagraphs, "DEVICE_TYPE", "cpu")
    monkeypatch.setattr(cudagraphs, "capture", capture)
    monkeypatch.setattr(cudagraphs, "mark_overwritten", _expired.append)
    monkeypatch.setattr(cudagraphs, "pool_segments", lambda device: [(0, 1 << 64)] if worst_case else [])
    yield


def assert_overwritten(tensor):
    if CUDA:
        with pytest.raises(RuntimeError, match="overwritten"):
            tensor + 1
    else:
        assert any(t is tensor for t in _expired)


def ro(fn, **kwargs):
    return ember.compile(fn, mode="reduce-overhead", **kwargs)


def close(actual, expected, tol=1e-5):
    torch.testing.assert_close(actual, expected, rtol=tol, atol=tol)


class MLP(nn.Module):
    def __init__(self, width=64, depth=3):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))
        self.norm = nn.LayerNorm(width)

    def forward(self, x):
        for layer in self.layers:
            x = torch.nn.functional.gelu(layer(x))
        return self.norm(x)


# ---------------------------------------------------------------------- inference
def test_repeated_calls_with_new_values_replay_one_recording():
    model = MLP().to(DEV)
    compiled = ro(model)
    with torch.no_grad():
        for _ in range(6):
            x = torch.randn(16, 64, device=DEV)
            close(compiled(x).clone(), model(x))
    assert cudagraphs.counters["recorded"] == 1
    assert cudagraphs.counters["replayed"] == 5


def test_an_output_kept_across_calls_raises_when_read():
    model = MLP().to(DEV)
    compiled = ro(model)
    with torch.no_grad():
        for _ in range(3):
            compiled(torch.randn(8, 64, device=DEV))
        first = compiled(torch.randn(8, 64, device=DEV))
        kept = first.clone()
        second = compiled(torch.randn(8, 64, device=DEV))
        assert not torch.equal(kept, second)
        assert_overwritten(first)


def test_mark_step_begin_expires_outputs():
    compiled = ro(lambda x: x.sin() * 2)
    x = torch.randn(32, device=DEV)
    for _ in range(3):
        out = compiled(x)
    ember.cudagraph_mark_step_begin()
    assert_overwritten(out)


def test_mutated_input_is_written_back():
    def f(x, y):
        x.add_(y)
        return x * 2

    compiled = ro(f)
    for _ in range(5):
        x, y = torch.randn(64, device=DEV), torch.randn(64, device=DEV)
        x_eager = x.clone()
        expected = f(x_eager, y)
        out = compiled(x, y)
        close(x, x_eager)
        close(out, expected)
    assert cudagraphs.counters["replayed"] >= 3


def test_written_arguments_that_share_memory():
    def f(x, y):
        x.add_(1)
        return y * 2

    compiled = ro(f)
    for step in range(6):
        z = torch.arange(8.0, device=DEV)
        z_eager = z.clone()
        # separate tensors first (recorded), then overlapping views of one tensor
        x, y = (z[:4], z[2:6]) if step >= 3 else (z[:4], z[4:])
        xe, ye = (z_eager[:4], z_eager[2:6]) if step >= 3 else (z_eager[:4], z_eager[4:])
        close(compiled(x, y).clone(), f(xe, ye))
        close(z, z_eager)


def test_output_that_is_the_input_is_the_callers_tensor():
    compiled = ro(lambda x: x.mul_(2))
    for _ in range(4):
        x = torch.randn(16, device=DEV)
        expected = x * 2
        out = compiled(x)
        assert out is x
        close(x, expected)


def test_buffer_updates_accumulate_like_eager():
    class Counter(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("total", torch.zeros(8))

        def forward(self, x):
            self.total += x.sum(0)
            return x * self.total

    eager = Counter().to(DEV)
    compiled_module = copy.deepcopy(eager)
    compiled = ro(compiled_module)
    for _ in range(6):
        x = torch.randn(4, 8, device=DEV)
        close(compiled(x).clone(), eager(x))
        close(compiled_module.total, eager.total)


def test_state_fed_back_as_input():
    weight = torch.randn(32, 32, device=DEV) * 0.1

    def cell(x, h):
        return torch.tanh(x @ weight + h @ weight)

    compiled = ro(cell)
    h_eager = h = torch.zeros(4, 32, device=DEV)
    for _ in range(8):
        x = torch.randn(4, 32, device=DEV)
        h = compiled(x, h)
        h_eager = cell(x, h_eager)
        close(h, h_eager)


def test_python_scalar_arguments_are_part_of_the_layout():
    def f(x, scale):
        return x * scale + 1

    compiled = ro(f)
    x = torch.randn(64, device=DEV)
    for scale in [2.0, 3.0, 2.0, 3.0, 2.0, 5.0]:
        close(compiled(x, scale).clone(), f(x, scale))


@pytest.mark.parametrize("dynamic", [None, True])
def test_changing_sizes(dynamic):
    model = MLP().to(DEV)
    compiled = ro(model, dynamic=dynamic)
    with torch.no_grad():
        for batch in [8, 16, 8, 16, 8, 32, 1, 32, 32, 16]:
            x = torch.randn(batch, 64, device=DEV)
            close(compiled(x).clone(), model(x))


@pytest.mark.skipif(not CUDA, reason="the CPU emulation records CPU tensors")
def test_cpu_input_runs_plain_launches():
    def f(x, s):
        return x * s

    compiled = ro(f)
    for _ in range(4):
        x, s = torch.randn(16, device=DEV), torch.randn(())
        close(compiled(x, s), f(x, s))
    assert cudagraphs.counters["replayed"] == 0


def test_graph_break_both_graphs_replayed():
    def f(x):
        y = torch.relu(x) + 1
        print("break")
        return y.cos()

    compiled = ro(f)
    for _ in range(5):
        x = torch.randn(64, device=DEV)
        close(compiled(x).clone(), f(x))
    assert cudagraphs.counters["recorded"] == 2


def test_random_ops_differ_between_calls():
    compiled = ro(lambda x: torch.nn.functional.dropout(x, 0.5, training=True))
    x = torch.ones(4096, device=DEV)
    masks = [(compiled(x) != 0).clone() for _ in range(5)]
    assert cudagraphs.counters["replayed"] == 4     # calls 2-5: the masks come from replays
    assert not torch.equal(masks[-1], masks[-2])
    for mask in masks:
        assert 0.4 < mask.float().mean().item() < 0.6


# ---------------------------------------------------------------------- training
def _train(model, compiled, steps, make_batch, accumulate=1, set_to_none=True):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses = []
    for step in range(steps):
        x, target = make_batch(step)
        loss = torch.nn.functional.mse_loss(compiled(x), target)
        loss.backward()
        losses.append(loss.item())
        if (step + 1) % accumulate == 0:
            optimizer.step()
            optimizer.zero_grad(set_to_none=set_to_none)
    return losses


def _batch(step):
    gen = torch.Generator(device="cpu").manual_seed(step)
    return (torch.randn(16, 64, generator=gen).to(DEV), torch.randn(16, 64, generator=gen).to(DEV))


@pytest.mark.parametrize("accumulate,set_to_none", [(1, True), (2, True), (3, False)])
def test_training_steps_match_eager(accumulate, set_to_none):
    eager = MLP().to(DEV)
    model = copy.deepcopy(eager)
    compiled = ro(model)
    expected = _train(eager, eager, 7, _batch, accumulate, set_to_none)
    actual = _train(model, compiled, 7, _batch, accumulate, set_to_none)
    close(torch.tensor(actual), torch.tensor(expected), 1e-4)
    for p, q in zip(model.parameters(), eager.parameters()):
        close(p, q, 1e-4)
    assert cudagraphs.counters["replayed"] >= 6


def test_two_forwards_before_one_backward():
    eager = MLP().to(DEV)
    model = copy.deepcopy(eager)
    compiled = ro(model)
    for step in range(5):
        a, b = _batch(step)
        (compiled(a).square().mean() + compiled(b).square().mean()).backward()
        (eager(a).square().mean() + eager(b).square().mean()).backward()
        for p, q in zip(model.parameters(), eager.parameters()):
            close(p.grad, q.grad, 1e-4)


def test_batchnorm_training_updates_running_stats():
    def net():
        return nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                             nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8)).to(DEV)
    eager = net()
    model = copy.deepcopy(eager)
    compiled = ro(model)
    optimizer_e = torch.optim.SGD(eager.parameters(), lr=0.1)
    optimizer_c = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(5):
        x = torch.randn(4, 3, 8, 8, device=DEV)
        for m, fn, opt in ((eager, eager, optimizer_e), (model, compiled, optimizer_c)):
            loss = fn(x).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
        for a, b in zip(model.state_dict().values(), eager.state_dict().values()):
            close(a.float(), b.float(), 1e-4)


def test_explain_says_whether_graphs_are_replayed():
    model = MLP().to(DEV)
    with torch.no_grad():
        report = explain_with(mode="reduce-overhead")(model, torch.randn(4, 64, device=DEV))
    assert "CUDA graph recorded on the 2nd call" in str(report)


# ---------------------------------------------------------------------- inputs read in place
def _copied_buffers():
    """The input buffers of every recording of every runner (copied inputs)."""
    return [len(r.buffers) for runner in list(cudagraphs._runners)
            for recordings in runner.recordings.values() for r in recordings]


def test_an_input_passed_again_is_read_in_place_and_its_new_values_seen():
    compiled = ro(lambda x, y: (x * 2 + y).sin())
    x, y = torch.randn(64, device=DEV), torch.randn(64, device=DEV)
    for step in range(6):
        x.uniform_(-step, step)         # new values at the same address: the replay must read them
        close(compiled(x, y).clone(), (x * 2 + y).sin())
    assert cudagraphs.counters["replayed"] >= 4
    assert _copied_buffers() == [0]


def test_an_input_at_new_addresses_is_copied_from_then_on():
    compiled = ro(lambda x, y: (x * 2 + y).sin())
    y = torch.randn(64, device=DEV)
    kept = []       # every x stays alive: each call's x is at a new address
    for _ in range(6):
        kept.append(torch.randn(64, device=DEV))
        close(compiled(kept[-1], y).clone(), (kept[-1] * 2 + y).sin())
    assert cudagraphs.counters["recorded"] == 1
    assert cudagraphs.counters["replayed"] == 5     # the 2nd call saw x move, and recorded at once
    assert _copied_buffers() == [1]        # x copied, y read in place


def test_an_input_written_in_place_at_one_address():
    def f(x, y):
        x.mul_(0.5).add_(y)
        return x.sum()

    compiled = ro(f)
    x, y = torch.randn(64, device=DEV), torch.randn(64, device=DEV)
    x_eager = x.clone()
    for _ in range(6):
        close(compiled(x, y).clone(), f(x_eager, y))
        close(x, x_eager)
    assert cudagraphs.counters["replayed"] >= 4
