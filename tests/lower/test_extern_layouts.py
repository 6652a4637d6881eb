"""Extern arguments get the layouts eager would hand them: SDPA masks with a unit-stride last dim
(or no mask at all when it is provably all-True), convolution inputs in eager's (channels-last)
memory format, and graph outputs with eager's strides."""
import re

import torch
import torch.nn as nn
import torch.nn.functional as F

import ember
from ember.backend import compile_graph

B, H, T, D = 2, 2, 8, 16


def compile_recording(fn):
    """ember-compile fn; returns (compiled fn, list of the generated wrapper sources)."""
    sources = []

    def backend(graph, example_inputs):
        compiled = compile_graph(graph, example_inputs)
        sources.append(compiled.source.split("# ---- kernels")[0])
        return compiled
    return ember.compile(fn, backend=backend), sources


def sdpa_call(source):
    return next(line for line in source.splitlines() if "scaled_dot_product_attention(" in line)


def qkv():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(B, H, T, D, generator=g) for _ in range(3)]


def test_all_true_index_mask_is_dropped():
    def f(q, k, v):
        positions = torch.arange(T) + 0          # HF's bidirectional mask: q_idx >= 0
        mask = (positions[None, None, :, None] >= 0).expand(B, 1, T, T)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    compiled, sources = compile_recording(f)
    inputs = qkv()
    torch.testing.assert_close(compiled(*inputs), f(*inputs))
    assert "attn_mask=None" in sdpa_call(sources[0]), sources[0]


def test_expanded_mask_gets_unit_stride_last_dim():
    def f(q, k, v, keep):
        mask = (keep[:, None, :, None] > -100.0).expand(B, 1, T, T)   # not provable: reads an input
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    compiled, sources = compile_recording(f)
    inputs = qkv() + [torch.randn(B, T)]
    torch.testing.assert_close(compiled(*inputs), f(*inputs))
    call = sdpa_call(sources[0])
    mask_arg = re.search(r"attn_mask=([^,)]+)", call).group(1)
    assert "as_strided" not in mask_arg and mask_arg != "None", call
    assert f"{mask_arg} = torch.empty_strided(({B}, 1, {T}, {T}), ({T * T}, {T * T}, {T}, 1)" in sources[0]


def test_partial_index_mask_is_kept():
    def f(q, k, v):
        positions = torch.arange(T)
        mask = (positions[None, None, None, :] <= positions[None, None, :, None]).expand(B, 1, T, T)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    compiled, sources = compile_recording(f)
    inputs = qkv()
    torch.testing.assert_close(compiled(*inputs), f(*inputs))
    assert "attn_mask=None" not in sdpa_call(sources[0])


class ConvNeXtBlock(nn.Module):
    """timm's ConvNeXt block: conv_dw -> NHWC layer_norm + MLP -> back to NCHW + residual."""

    def __init__(self, c=8):
        super().__init__()
        self.conv_dw = nn.Conv2d(c, c, 7, padding=3, groups=c)
        self.norm = nn.LayerNorm(c)
        self.fc1, self.fc2 = nn.Linear(c, 4 * c), nn.Linear(4 * c, c)
        self.next_conv = nn.Conv2d(c, c, 7, padding=3, groups=c)

    def forward(self, x):
        shortcut = x
        x = self.conv_dw(x).permute(0, 2, 3, 1)
        x = self.fc2(F.gelu(self.fc1(self.norm(x))))
        x = x.permute(0, 3, 1, 2) + shortcut
        return self.next_conv(x), x, x * 2


def test_permuted_layer_norm_block_keeps_eager_layouts():
    torch.manual_seed(0)
    model = ConvNeXtBlock().eval()
    x = torch.randn(2, 8, 6, 6)
    compiled, sources = compile_recording(model)
    with torch.no_grad():
        expected, actual = model(x), compiled(x)
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e)
        assert a.stride() == e.stride()
    # the residual sum reaching the second conv is allocated channels-last, as in eager
    assert expected[1].stride() == (288, 1, 48, 8)
    source = sources[0]
    convs = [line for line in source.splitlines() if "_extern_conv2d(" in line]
    residual = convs[1].split("_extern_conv2d(")[1].split(",")[0]
    assert f"{residual} = torch.empty_strided((2, 8, 6, 6), (288, 1, 48, 8)" in source, source
    # its channels-last result is predicted (the meta device says contiguous): no re-layout copy
    assert ".stride() != (288, 1, 48, 8)" in source.split(convs[1])[1].split("\n")[1], source


def test_fused_attention_output_is_planned_in_the_dim_order_of_q(monkeypatch):
    """Where SDPA runs fused kernels (CUDA), its output is planned dense in q's dim order: head
    views of one (B, T, 3, H, D) projection give a (B, T, H, D)-ordered output, as cuDNN, flash
    and memory-efficient attention write it (planned contiguous, each layer paid a copy).  The
    CPU stands in here; its kernel's other layout is fixed up by the wrapper, so results stay
    eager's either way."""
    from ember.lower import lowering
    monkeypatch.setattr(lowering, "FUSED_ATTENTION_DEVICES", {"cpu"})
    monkeypatch.setattr(lowering, "_LAYOUT_PROBED_EXTERNS", set())     # the CPU's own probe finds it too

    def f(x, w):
        q, k, v = (x @ w).view(B, T, 3, H, D).permute(2, 0, 3, 1, 4)
        return F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, T, H * D).sin()
    compiled, sources = compile_recording(f)
    g = torch.Generator().manual_seed(0)
    inputs = (torch.randn(B, T, H * D, generator=g), torch.randn(H * D, 3 * H * D, generator=g))
    torch.testing.assert_close(compiled(*inputs), f(*inputs))
    planned = re.search(r"scaled_dot_product_attention_out\.stride\(\) != (\([^)]*\))", sources[0])
    assert planned and planned.group(1) == f"({T * H * D}, {D}, {H * D}, 1)", sources[0]
