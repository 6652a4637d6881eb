"""Peak memory of compiled training, against eager PyTorch.

Two measurements:

* ``peak_live_bytes(schedule)``: the most bytes of buffers a compiled program makes that are alive
  at once, from its Schedule and the wrapper's ``del``s (no allocator).  Used for the backward alone.
* ``step_peak_bytes(fn)``: the peak of the CPU allocator's live bytes during one training step
  (forward, loss, backward), relative to the bytes live when the step starts, from the profiler's
  allocation and free events (``profile_memory=True``).  The model's parameters and the input are
  allocated before the step and not counted; everything the step allocates is, for eager and
  ember alike: saved activations, intermediates, workspaces of the Externs (convolutions, mm),
  gradients.  This is the CPU counterpart of ``torch.cuda.max_memory_allocated`` around a step.
  Eager frees each op's saved tensors as the backward passes it; so does ember's compiled
  backward: ctx lets go of them, the backward takes them in one list it empties and ``del``s each
  after its last reader.  (Before, every saved tensor lived until the whole backward returned:
  a ResNet's stem backward ran beside every layer's saved activations, 1.06x eager's peak.)

The backward recomputes cheap values (BatchNorm+ReLU outputs, ReLU masks, a pointwise model's
whole blocks) from saved ones.  Each recomputation must run near its first use: when they all ran
at the start of the backward, a ResNet's backward held every layer's activations at once and
peaked at twice eager's memory; when the scheduler fused every row-wise step of a backward
without Externs into one kernel, that kernel stored the inputs of every block's parameter
gradients at once (2.6x eager).
"""
from __future__ import annotations

import copy
import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from models import make_bert_layer, make_resnet
from torch.profiler import ProfilerActivity, profile
from training_util import assert_same_grads

import ember
from ember.backend import compile_graph
from ember.debug.memory_plan import live_bytes
from ember.graph import TensorMeta
from ember.lower.lowering import lower_graph
from ember.lower.scheduler import Schedule, schedule

COMPILED: list = []


def _recording_backend(graph, example_inputs):
    compiled = compile_graph(graph, example_inputs, {"fallback": "error"})
    COMPILED.append(compiled)
    return compiled


ember.register_backend("ember_recording_memory", _recording_backend)


def peak_live_bytes(sched: Schedule) -> int:
    """The most bytes of buffers the program makes that are alive at once (inputs not counted)."""
    return max(live_bytes(sched)[0])


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


# ------------------------------------------------------------------ whole training step vs eager


def step_peak_bytes(step, tmp_path: Path) -> int:
    """Peak bytes the CPU allocator holds during ``step()`` beyond what it held before."""
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        step()
    trace = tmp_path / "trace.json"
    prof.export_chrome_trace(str(trace))
    events = [e for e in json.loads(trace.read_text())["traceEvents"] if e.get("name") == "[memory]"]
    events.sort(key=lambda e: (e["ts"], e["args"]["Ev Idx"]))
    live = peak = 0
    for event in events:
        live += event["args"]["Bytes"]
        peak = max(peak, live)
    return peak


class PointwiseBlock(nn.Module):
    """The benchmark zoo's "pointwise" block: LayerNorm -> GELU -> bias/scale chains ->
    SiLU*sigmoid -> RMSNorm -> softmax, all row-wise (no matmul)."""

    def __init__(self, d: int) -> None:
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.b1 = nn.Parameter(0.1 * torch.randn(d))
        self.s1 = nn.Parameter(1.0 + 0.1 * torch.randn(d))
        self.b2 = nn.Parameter(0.1 * torch.randn(d))
        self.b3 = nn.Parameter(0.1 * torch.randn(d))
        self.rms_w = nn.Parameter(1.0 + 0.1 * torch.randn(d))
        self.b4 = nn.Parameter(0.1 * torch.randn(d))
        self.temp = 1.0 / math.sqrt(d) * 8.0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.ln(x)
        h = F.gelu(h + self.b1)
        h = h * self.s1 + self.b2
        h = F.silu(h) * torch.sigmoid(h + self.b3)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * self.rms_w
        p = torch.softmax(h * self.temp, dim=-1)
        return x + h + p * self.b4


def make_pointwise() -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    return nn.Sequential(PointwiseBlock(256), PointwiseBlock(256)), (torch.randn(2, 128, 256),)


def _step_peaks(model: nn.Module, inputs: tuple, tmp_path: Path) -> tuple[int, int]:
    """(eager, ember) peak bytes of a warm training step, after checking ember's gradients."""
    model_c = copy.deepcopy(model)
    COMPILED.clear()
    compiled = ember.compile(model_c, backend="ember_recording_memory", options={"fallback": "error"})

    def step(module):
        return lambda: module(*inputs).pow(2).mean().backward()

    step(compiled)()
    step(model)()
    assert [c.kind for c in COMPILED] == ["autograd"]
    assert_same_grads(model_c, model, type(model).__name__)
    peaks = []
    for module, m in ((model, model), (compiled, model_c)):
        for p in m.parameters():
            p.grad = None
        peaks.append(step_peak_bytes(step(module), tmp_path))
    return peaks[0], peaks[1]


def test_pointwise_backward_recomputes_each_block_near_its_backward():
    """The backward recomputes every block from the saved input and per-row statistics (bf16, as
    the bench zoo's pointwise model trains).  Block k's backward needs block k's input, which the
    backward's first kernel computes through blocks 0..k-1.  Before, the values of every block's
    chain that some later kernel read were stored by that first kernel and lived until their
    block's backward: 22 fp32 activations at once here, 35 bf16 and fp32 activations at the zoo's
    size (``benchmarks/backward_memory_plan.py``: 53.5 MB).  Now the first kernel stores each
    block's input and each block's backward recomputes its values from it, from a copy of the
    recomputation (the scheduler's ``_cloned_program``): 12.6 here, 28.4 MB at the zoo's size."""
    torch.manual_seed(0)
    batch, seq, d = 2, 64, 128
    model = nn.Sequential(*(PointwiseBlock(d) for _ in range(3))).to(torch.bfloat16)
    x = torch.randn(batch, seq, d).to(torch.bfloat16)
    model_c = copy.deepcopy(model)
    COMPILED.clear()
    compiled = ember.compile(model_c, backend="ember_recording_memory", options={"fallback": "error"})
    compiled(x).float().pow(2).mean().backward()
    model(x).float().pow(2).mean().backward()
    assert_same_grads(model_c, model, "bf16 pointwise blocks", rtol=5e-2, atol=5e-2)
    assert [c.kind for c in COMPILED] == ["autograd"]
    peak = peak_live_bytes(backward_schedule(COMPILED[0]))
    activation = batch * seq * d * 4
    assert peak <= 15 * activation, f"backward peak {peak} bytes = {peak / activation:.1f} fp32 activations"


def test_pointwise_training_step_peak_at_most_eager(tmp_path):
    # Before: the backward's one row kernel stored ~56 activations (every block's recomputed
    # forward and parameter-gradient inputs), 2.6x eager's peak.  Now about 0.7x.
    eager, compiled = _step_peaks(*make_pointwise(), tmp_path)
    assert compiled <= eager, f"ember {compiled} bytes, eager {eager} bytes ({compiled / eager:.2f}x)"


def test_bert_layer_training_step_peak_near_eager(tmp_path):
    """Within 1.10x of eager (the known excess is asserted so it cannot grow unnoticed): 1.16x while
    saved tensors lived through the whole backward, 1.04x since they are freed after their last
    reader.  What is left: the attention saves softmax's x - max(x) (its VJP reads exp(x - max),
    not the output), so the forward holds the scores, x - max and the probabilities at once."""
    eager, compiled = _step_peaks(*make_bert_layer(batch=4, seq=128), tmp_path)
    assert compiled <= 1.10 * eager, f"ember {compiled} bytes, eager {eager} bytes ({compiled / eager:.2f}x)"


@pytest.mark.parametrize("make", [
    lambda: make_resnet(batch=4, size=64),
    pytest.param(lambda: make_bert_layer(batch=4, seq=128), marks=pytest.mark.xfail(
        strict=True, reason="BERT's attention saves x - max(x) beside the probabilities")),
], ids=["resnet", "bert_layer"])
def test_training_step_peak_at_most_eager(make, tmp_path):
    """The ResNet: 1.06x eager while the compiled backward held every saved tensor until it
    returned (its stem's backward ran beside every layer's saved activations), 0.96x now."""
    eager, compiled = _step_peaks(*make(), tmp_path)
    assert compiled <= eager, f"ember {compiled} bytes, eager {eager} bytes ({compiled / eager:.2f}x)"


def test_backward_releases_saved_tensors_after_their_last_reader():
    """The compiled backward takes its inputs in one list that it empties, and ``del``s every saved
    tensor and tangent that it does not return once no later step reads it; the list the
    Function passes is its only holder (ctx let go of them: ``maybe_clear_saved_tensors``)."""
    model, inputs = make_resnet(batch=2, size=32)
    COMPILED.clear()
    compiled = ember.compile(model, backend="ember_recording_memory", options={"fallback": "error"})
    compiled(*inputs).sum().backward()
    step = COMPILED[0].call
    source = step.backward_compiled.source.split("# ---- kernels")[0]
    assert "def call(boxed_inputs):" in source and "boxed_inputs.clear()" in source, source[:500]
    body = source.split("boxed_inputs.clear()")[1]
    released = set()
    for line in body.splitlines():
        if line.strip().startswith("del "):
            released |= {name.strip() for name in line.strip()[4:].split("#")[0].split(",")}
    returned = body.split("return (")[-1]
    tensors = [p.name for p in step.backward_graph.placeholders if isinstance(p.meta, TensorMeta)]
    kept = [name for name in tensors if name not in released and name not in returned]
    assert not kept, f"inputs of the backward held until it returns: {kept}"


def test_cnn_retain_graph_and_in_place_checks_with_released_saved_tensors():
    """Freeing saved tensors during the backward keeps eager's semantics: retain_graph=True keeps
    them for a second backward (the gradients accumulate), a third backward raises as eager
    does, and a saved input modified in place is reported as eager reports it."""
    model, inputs = make_resnet(batch=2, size=32)
    model_c = copy.deepcopy(model)
    compiled = ember.compile(model_c, backend="ember_recording_memory", options={"fallback": "error"})
    errors = []
    for module in (model, compiled):
        out = module(*inputs).square().mean()
        out.backward(retain_graph=True)
        out.backward()
        with pytest.raises(RuntimeError) as error:
            out.backward()
        errors.append(str(error.value))
    assert_same_grads(model_c, model, "two backwards with retain_graph")
    assert "second time" in errors[0] and "second time" in errors[1], errors

    def f(x, w):
        return (torch.sin(x) * w).sum()

    messages = []
    for fn in (f, ember.compile(f, backend="ember_recording_memory", options={"fallback": "error"})):
        x = torch.randn(5, requires_grad=True)
        w = torch.randn(5, requires_grad=True)
        out = fn(x, w)
        with torch.no_grad():
            w.mul_(2)       # w is saved for x's gradient
        with pytest.raises(RuntimeError) as error:
            out.backward()
        messages.append(str(error.value))
    assert all("modified by an inplace operation" in m for m in messages), messages


def test_forward_computes_pooling_indices_beside_the_pooling():
    """The max-pooling VJP asks the forward for the pooling's indices.  That node is made after the
    whole forward in joint order; run there, it kept the stem's activation (the largest) alive
    through every layer: 4.4 stem activations at the forward's peak, 3.5 beside the pooling.  Since
    the forward also saves the ReLU outputs that the convolutions' weight gradients read (as eager
    does): 5.4 made late, 4.9 beside the pooling."""
    model, inputs = make_resnet(batch=4, size=64)
    COMPILED.clear()
    compiled = ember.compile(model, backend="ember_recording_memory", options={"fallback": "error"})
    compiled(*inputs)
    stem_activation = 4 * 8 * 32 * 32 * 4
    peak = peak_live_bytes(COMPILED[0].schedule)
    assert peak <= 5 * stem_activation, f"forward peak {peak / stem_activation:.1f} stem activations"
