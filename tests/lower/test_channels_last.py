"""Graphs with 2-D convolutions run channels-last on CUDA: conv inputs are copied to NHWC once,
the 4-D values computed from NHWC ones stay NHWC, outputs keep eager's layout.  Switched on for
the CPU here so both code generators are checked against eager."""
import copy
import re

import pytest
import torch
from recording import record_compiled_graphs
from torch import nn

import ember
from ember import config
from ember.backend import compile_graph
from ember.lower import lowering, scheduler


@pytest.fixture(autouse=True)
def channels_last_on_cpu(monkeypatch):
    monkeypatch.setattr(lowering, "CHANNELS_LAST_DEVICES", {"cpu", "cuda"})


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.depthwise = nn.Conv2d(8, 8, 3, padding=1, groups=8)
        self.pointwise = nn.Conv2d(8, 16, 1)
        self.head = nn.Linear(16, 5)

    def forward(self, x):
        x = torch.relu(self.bn(self.stem(x)))
        x = nn.functional.max_pool2d(x, 2)
        y = self.depthwise(x)
        y = y * torch.sigmoid(nn.functional.adaptive_avg_pool2d(y, 1))   # squeeze-excite style gate
        z = self.pointwise(y + x)
        return self.head(z.mean((2, 3))), z


@pytest.mark.parametrize("generated_pooling", [False, True], ids=["eager_pooling", "generated_pooling"])
@pytest.mark.parametrize("options", [None, {"cpu_backend": "triton"}], ids=["cpp", "triton"])
def test_conv_net_channels_last_matches_eager(options, generated_pooling, monkeypatch):
    """(generated pooling: its output, of the input's batch and channels, follows the input's
    channels-last layout as eager's does)"""
    if options:
        pytest.importorskip("triton")
    if generated_pooling:
        monkeypatch.setattr(config, "generated_max_pool_devices", {"cpu"})
    torch.manual_seed(0)
    net = Net().eval()
    x = torch.randn(2, 3, 12, 12)
    sources = []

    def backend(graph, example_inputs):
        compiled = compile_graph(graph, example_inputs, options=options)
        sources.append(compiled.source)
        return compiled
    compiled = ember.compile(net, backend=backend)
    with torch.no_grad():
        expected, out = net(x), compiled(x)
    for a, e in zip(out, expected):
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-4)
        assert a.stride() == e.stride()
    wrapper = sources[0].split("# ---- kernels")[0]
    # one copy of the image into NHWC; every 4-D intermediate NHWC (stride 1 over channels); the
    # returned conv result copied back to eager's NCHW
    assert wrapper.count("layout copy for an extern") == 1, wrapper
    allocations = re.findall(r"(\w+) = torch.empty_strided\(\((\d+), (\d+), (\d+), (\d+)\), \((\d+), (\d+),", wrapper)
    assert len(allocations) >= 4, wrapper
    for name, *_, channel_stride in allocations:
        assert (channel_stride == "1") != name.endswith("_output"), (name, wrapper)


@pytest.mark.parametrize("options", [None, {"cpu_backend": "triton"}], ids=["cpp", "triton"])
def test_training_keeps_saved_values_channels_last(options, monkeypatch):
    """A training forward saves its channels-last values as they are, and the backward is
    compiled for that layout: no copy to eager's NCHW in the forward, none back at backward
    time.  Loss, gradients and BatchNorm's running statistics equal eager's."""
    import copy

    from ember.autodiff import training
    from ember.graph import TensorMeta
    if options:
        pytest.importorskip("triton")
    torch.manual_seed(0)
    net = Net().train()
    reference = copy.deepcopy(net)
    x = torch.randn(2, 3, 12, 12)
    compiled_graphs = []

    def backend(graph, example_inputs):
        compiled_graphs.append(compile_graph(graph, example_inputs, options=options))
        return compiled_graphs[-1]
    backward_copies = []
    in_layout = training._in_layout

    def counting(value, meta):
        result = in_layout(value, meta)
        if result is not value:
            backward_copies.append(tuple(meta.shape))
        return result
    monkeypatch.setattr(training, "_in_layout", counting)
    compiled = ember.compile(net, backend=backend)

    def loss(out):
        return out[0].square().sum() + out[1].sin().sum()
    for _ in range(2):
        net.zero_grad()
        reference.zero_grad()
        expected, out = reference(x), compiled(x)
        loss(expected).backward()
        loss(out).backward()
        for a, e in zip(out, expected):
            torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-4)
            assert a.stride() == e.stride()
        for (name, p), q in zip(net.named_parameters(), reference.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-4, msg=name)
        for b, c in zip(net.buffers(), reference.buffers()):
            torch.testing.assert_close(b, c, rtol=1e-4, atol=1e-4)
    step = compiled_graphs[0].call
    assert isinstance(step, training.TrainingStep)
    saved = [m for m in step.saved_metas if isinstance(m, TensorMeta) and len(m.shape) == 4 and m.shape[1] > 1]
    assert any(m.stride[1] == 1 for m in saved), [m.stride for m in saved]
    assert backward_copies == []
    wrapper = compiled_graphs[0].source.split("# ---- kernels")[0]
    # the one 4-D value the caller gets (z) is copied back to NCHW; no saved value is
    assert wrapper.count("_output = torch.empty_strided((") == 1, wrapper


class SqueezeExciteBlock(nn.Module):
    """MobileNetV3's ReLU blocks: expand, depthwise, squeeze-excite gate, project (batch norm in
    train mode throughout)."""

    def __init__(self, c: int, activation=torch.relu) -> None:
        super().__init__()
        self.expand, self.bn0 = nn.Conv2d(c, 2 * c, 1, bias=False), nn.BatchNorm2d(2 * c)
        self.depthwise, self.bn1 = nn.Conv2d(2 * c, 2 * c, 3, padding=1, groups=2 * c, bias=False), nn.BatchNorm2d(2 * c)
        self.squeeze, self.excite = nn.Conv2d(2 * c, 8, 1), nn.Conv2d(8, 2 * c, 1)
        self.project, self.bn2 = nn.Conv2d(2 * c, c, 1, bias=False), nn.BatchNorm2d(c)
        self.activation = activation

    def forward(self, x):
        y = self.activation(self.bn0(self.expand(x)))
        y = self.activation(self.bn1(self.depthwise(y)))
        gate = nn.functional.hardsigmoid(self.excite(torch.relu(self.squeeze(y.mean((2, 3), keepdim=True)))))
        return x + self.bn2(self.project(y * gate))


def test_recomputed_copies_keep_channels_last(monkeypatch):
    """The backward recomputes batch-norm outputs block by block from copies of their chain (the
    scheduler's ``_cloned_program``); the copies were stored NCHW from channels-last inputs, so
    their kernels read or wrote across the channel stride (MobileNetV3 on an H100: 612 us against a
    120 us floor)."""
    made = record_compiled_graphs(monkeypatch)
    # as before session 22: every load counted towards a recomputation's cost (batch-norm weights
    # included) and the cut saved bytes alone, so the batch-norm outputs were recomputed, stored
    # once, long-lived, and recomputed from copies; realistic blocks no longer take that path
    monkeypatch.setattr(scheduler, "SMALL_LOAD_RATIO", 2**62)
    monkeypatch.setattr(config, "partition_refine", False)
    # and before session 28, relu's gradient read its mask from the batch-norm output
    monkeypatch.setattr(config, "mask_from_output", False)
    torch.manual_seed(0)
    net = nn.Sequential(SqueezeExciteBlock(16), SqueezeExciteBlock(16)).train().to(torch.bfloat16)
    reference = copy.deepcopy(net)
    x = torch.randn(4, 16, 14, 14, dtype=torch.bfloat16)
    ember.compile(net, options={"fallback": "error"})(x).float().square().mean().backward()
    reference(x).float().square().mean().backward()
    for (name, p), q in zip(net.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad.float(), q.grad.float(), rtol=5e-2, atol=5e-2, msg=name)
    wrapper = made[0].call.backward_compiled.source.split("# ---- kernels")[0]
    copies = re.findall(r"^\s+(\w+_re\d+) = (.*)$", wrapper, re.M)
    assert copies, "the backward no longer recomputes from copies: find another case"
    for name, made_as in copies:
        strides = re.search(r"\(\d+, \d+, \d+, \d+\), (\(\d+, \d+, \d+, \d+\))", made_as)
        if strides is not None:     # a fresh buffer or a view of a reused one: channels-last strides
            assert strides.group(1).split(", ")[1] == "1", f"{name} = {made_as}"


class HardswishSqueezeExcite(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        self.conv, self.bn = nn.Conv2d(c, 2 * c, 1, bias=False), nn.BatchNorm2d(2 * c)
        self.squeeze, self.excite = nn.Conv2d(2 * c, 8, 1), nn.Conv2d(8, 2 * c, 1)
        self.project = nn.Conv2d(2 * c, c, 1, bias=False)

    def forward(self, x):
        y = nn.functional.hardswish(self.bn(self.conv(x)))
        gate = nn.functional.hardsigmoid(self.excite(torch.relu(self.squeeze(y.mean((2, 3), keepdim=True)))))
        return x + self.project(y * gate)


def test_triton_kernels_store_nothing_only_they_read(monkeypatch):
    """The squeeze-excite mean's kernel computes hardswish's intermediates (shared with the gate's
    kernel at first, so marked to be stored once) and, once the gate's kernel read only the
    hardswish result, still stored all 14 of them: float32, read by no one (MobileNetV3 on an
    H100: 1.2 GB a forward).  A bf16 block's forward now allocates no float32 activation."""
    pytest.importorskip("triton")
    made = record_compiled_graphs(monkeypatch)
    torch.manual_seed(0)
    net = HardswishSqueezeExcite(16).train().to(torch.bfloat16)
    reference = copy.deepcopy(net)
    x = torch.randn(4, 16, 14, 14, dtype=torch.bfloat16)
    out = ember.compile(net, options={"fallback": "error", "cpu_backend": "triton"})(x)
    out.float().square().mean().backward()
    expected = reference(x)
    expected.float().square().mean().backward()
    torch.testing.assert_close(out, expected, rtol=5e-2, atol=5e-2)
    for (name, p), q in zip(net.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad.float(), q.grad.float(), rtol=5e-2, atol=5e-2, msg=name)
    wrapper = made[0].source.split("# ---- kernels")[0]
    activations = re.findall(r"(\w+) = torch.empty_strided\(\(4, 32, 14, 14\), [^)]*\), dtype=torch.float32", wrapper)
    assert not activations, wrapper


@pytest.mark.parametrize("options", [None, {"cpu_backend": "triton"}], ids=["cpp", "triton"])
def test_values_rounded_by_their_only_reader_are_stored_rounded(options, monkeypatch):
    """bf16 graphs compute in float32 and round where eager rounds; a value whose one reader
    rounds it (the ReLU of a batch norm computed in float32) was stored before the rounding, as
    float32: twice the bytes, written here and read by every later kernel."""
    if options:
        pytest.importorskip("triton")
    made = record_compiled_graphs(monkeypatch)
    torch.manual_seed(0)
    net = nn.Sequential(SqueezeExciteBlock(16), SqueezeExciteBlock(16)).train().to(torch.bfloat16)
    reference = copy.deepcopy(net)
    x = torch.randn(4, 16, 14, 14, dtype=torch.bfloat16)
    out = ember.compile(net, options={"fallback": "error", **(options or {})})(x)
    torch.testing.assert_close(out, reference(x), rtol=0.1, atol=0.1)      # two bf16 blocks: a few ulps
    wrapper = made[0].source.split("# ---- kernels")[0]
    assert not re.findall(r"= torch.empty_strided\(\(4, 32, 14, 14\), [^)]*\), dtype=torch.float32", wrapper), wrapper


def test_convolution_backward_reads_a_channels_last_input(monkeypatch):
    """The stem's weight gradient reads the saved image, which the graph got NCHW: the backward
    hands cuDNN a channels-last copy of it, as the forward did.  Given the NCHW image, ATen's
    convolution_backward chose NCHW and copied the (64, 64, 112, 112) output gradient to it
    (0.4 ms of ResNet-50's H100 step)."""
    made = record_compiled_graphs(monkeypatch)
    torch.manual_seed(0)
    net = Net().train()
    reference = copy.deepcopy(net)
    x = torch.randn(2, 3, 12, 12)
    out = ember.compile(net, options={"fallback": "error"})(x)
    expected = reference(x)
    (out[0].square().sum() + out[1].sin().sum()).backward()
    (expected[0].square().sum() + expected[1].sin().sum()).backward()
    for (name, p), q in zip(net.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-4, msg=name)
    wrapper = made[0].call.backward_compiled.source.split("# ---- kernels")[0]
    calls = re.findall(r"_extern_convolution_backward\w*\((\w+), (\w+),", wrapper)
    assert len(calls) == 3, wrapper
    stem_input = calls[-1][1]
    assert stem_input != "x", wrapper
    assert re.search(rf"\(x\b[^\n]*\b{stem_input}\b[^\n]*# layout copy for an extern", wrapper), wrapper


@pytest.mark.parametrize("resize", [
    lambda y: nn.functional.pad(y, (1, 2, 0, 1)),        # (constant_pad's meta was contiguous)
    lambda y: nn.functional.interpolate(y, scale_factor=2, mode="nearest"),
    lambda y: y[:, :, 1:, :-1] * 2,
], ids=["pad", "nearest_upsample", "cropped"])
def test_resized_values_follow_a_channels_last_input(resize):
    """A 4-D value of another height and width computed from a channels-last convolution output
    is channels-last too (eager's memory-format rule), so the next convolution reads it without a
    layout copy and the returned value has eager's strides."""
    torch.manual_seed(0)
    conv1, conv2 = nn.Conv2d(3, 8, 3, padding=1), nn.Conv2d(8, 4, 1)

    def fn(x):      # (the CPU's meta convolution says NCHW where its kernel returns NHWC: no 4-D conv output)
        y = resize(torch.relu(conv1(x)))
        return conv2(y).mean((2, 3)), y
    x = torch.randn(2, 3, 10, 10).to(memory_format=torch.channels_last)
    sources = []

    def backend(graph, example_inputs):
        compiled = compile_graph(graph, example_inputs)
        sources.append(compiled.source)
        return compiled
    with torch.no_grad():
        expected, out = fn(x), ember.compile(fn, backend=backend)(x)
    for a, e in zip(out, expected):
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-4)
        assert a.stride() == e.stride()
    wrapper = sources[0].split("# ---- kernels")[0]
    assert re.search(r"^\s+kernel\d+\(", wrapper, re.MULTILINE), wrapper     # compiled, not run eagerly
    assert "layout copy for an extern" not in wrapper
