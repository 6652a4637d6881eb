"""Peak memory of a compiled backward, measured from its Schedule (no timing, no allocator).

The backward recomputes cheap values (BatchNorm+ReLU outputs, ReLU masks) from saved ones.  Each
recomputation must run near its first use: when they all ran at the start of the backward, a
ResNet's backward held every layer's activations at once and peaked at twice eager's memory.
"""
from __future__ import annotations

import copy

import torch
from torch import nn
from training_util import assert_same_grads

import ember
from ember.backend import compile_graph
from ember.codegen.wrapper import buffer_releases
from ember.graph import TensorMeta
from ember.lower.lowering import lower_graph
from ember.lower.scheduler import ExternCall, Schedule, schedule

COMPILED: list = []


def _recording_backend(graph, example_inputs):
    compiled = compile_graph(graph, example_inputs, {"fallback": "error"})
    COMPILED.append(compiled)
    return compiled


ember.register_backend("ember_recording_memory", _recording_backend)


def peak_live_bytes(sched: Schedule) -> int:
    """The most bytes of buffers the program makes (intermediates, Extern results, outputs) that
    are alive at once, following the wrapper's ``del``s (``buffer_releases``) and the plan's
    storage reuse.  Inputs are not counted: the saved values live through the backward anyway."""
    releases = buffer_releases(sched)
    released_at = {name: position for position, names in releases.items() for name in names}
    made_at: dict[str, int] = {}
    for position, step in enumerate(sched.steps):
        names = [o.name for o in step.outputs] if isinstance(step, ExternCall) else step.writes
        for name in names:
            made_at.setdefault(name, position)
    end = len(sched.steps)
    storages: dict[str, list[int]] = {}      # allocation -> [bytes, first step, last step]
    for name, plan in sched.buffers.items():
        node = sched.program.nodes[name]
        if plan.kind == "input" or name not in made_at or getattr(node, "scalar", False):
            continue
        storage = storages.setdefault(plan.allocation, [0, end, -1])
        if plan.allocation == name:
            storage[0] = node.numel() * node.dtype.itemsize
        storage[1] = min(storage[1], made_at[name])
        storage[2] = max(storage[2], released_at.get(name, end))
    live = [0] * (end + 1)
    for nbytes, first, last in storages.values():
        for position in range(first, last + 1):
            live[position] += nbytes
    return max(live)


def backward_schedule(compiled) -> Schedule:
    """The Schedule of an autograd CompiledGraph's backward, lowered from the same metadata
    that TrainingStep.backward compiles it from."""
    step = compiled.call
    graph = step.backward_graph
    specs = [p.meta if isinstance(p.meta, TensorMeta) else int for p in graph.placeholders]
    return schedule(lower_graph(graph, specs))


class ConvBnReluStack(nn.Module):
    def __init__(self, layers: int, width: int) -> None:
        super().__init__()
        self.stem = nn.Conv2d(3, width, 3, padding=1, bias=False)
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.BatchNorm2d(width), nn.ReLU(), nn.Conv2d(width, width, 3, padding=1, bias=False))
            for _ in range(layers))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return x.mean()


def test_recomputed_activations_live_near_their_use():
    torch.manual_seed(0)
    layers, batch, width, size = 8, 2, 8, 16
    model = ConvBnReluStack(layers, width).train()
    x = torch.randn(batch, 3, size, size)
    model_c = copy.deepcopy(model)
    COMPILED.clear()
    compiled = ember.compile(model_c, backend="ember_recording_memory", options={"fallback": "error"})
    compiled(x).backward()
    model(x).backward()
    assert_same_grads(model_c, model, "conv+bn+relu stack")
    assert [c.kind for c in COMPILED] == ["autograd"]
    peak = peak_live_bytes(backward_schedule(COMPILED[0]))
    activation = batch * width * size * size * 4
    # A layer's backward needs a handful of activation-sized buffers at once (its recomputed
    # BatchNorm output, ReLU output and mask, the incoming and outgoing gradients, BatchNorm terms),
    # whatever the depth: about 6 here.  Recomputing every layer's ReLU output and mask at the start
    # of the backward costs more than 2 activations per layer (18 here).
    assert peak <= 8 * activation, f"backward peak {peak} bytes = {peak / activation:.1f} activations"
