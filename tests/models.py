"""Shared model fixtures: small plain-PyTorch models that every stage's tests can use.

Each ``make_<name>(batch=..., seed=0)`` returns ``(model, example_inputs)`` (a tuple of
positional arguments), deterministic for a seed and small enough for a 2-core CPU CI.
The models use only ``torch.nn`` and ``torch.nn.functional``, written the way their
well-known originals are (nanoGPT, torchvision ResNet, Hugging Face BERT) so that
capture and the compiler see the same op patterns as in the real thing.

    from models import MODEL_MAKERS, make_nanogpt
    model, inputs = make_nanogpt()
    out = model(*inputs)
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import torch
from torch import nn
from torch.nn import functional as F


# ------------------------------------------------------------------ MLP
class MLP(nn.Module):
    """Linear -> ReLU, four layers deep (the bench harness's mlp4, small)."""

    def __init__(self, in_features: int = 32, hidden: int = 64, out_features: int = 10, depth: int = 4) -> None:
        super().__init__()
        widths = [in_features] + [hidden] * (depth - 1) + [out_features]
        self.layers = nn.ModuleList(nn.Linear(a, b) for a, b in itertools.pairwise(widths))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers[:-1]:
            x = F.relu(layer(x))
        return self.layers[-1](x)


# ------------------------------------------------------------------ nanoGPT
class CausalSelfAttention(nn.Module):
    """nanoGPT's attention with the explicit (non-flash) path: matmul, masked_fill, softmax."""

    def __init__(self, n_embd: int, n_head: int, block_size: int) -> None:
        super().__init__()
        assert n_embd % n_head == 0
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.n_head = n_head
        self.n_embd = n_embd
        self.register_buffer("bias", torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class SdpaCausalAttention(nn.Module):
    """nanoGPT's attention through F.scaled_dot_product_attention(is_causal=True) (the flash path)."""

    def __init__(self, dim: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.c_attn = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.heads = heads

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).contiguous().view(B, T, C))


class GPTBlock(nn.Module):
    def __init__(self, n_embd: int, n_head: int, block_size: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, block_size)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class NanoGPT(nn.Module):
    """Token + position embedding, n_layer blocks, final LayerNorm, lm head (tied weights)."""

    def __init__(self, vocab_size: int = 96, block_size: int = 32, n_layer: int = 6, n_head: int = 4,
                 n_embd: int = 32) -> None:
        super().__init__()
        self.block_size = block_size
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.h = nn.ModuleList(GPTBlock(n_embd, n_head, block_size) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.wte.weight = self.lm_head.weight  # weight tying, as in GPT-2

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        _, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


# ------------------------------------------------------------------ ResNet
class BasicBlock(nn.Module):
    """torchvision's BasicBlock: conv-bn-relu-conv-bn + (downsampled) identity, relu."""

    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1, downsample: nn.Module | None = None) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample = downsample
        self.stride = stride

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)


class SmallResNet(nn.Module):
    """Stem (conv/bn/relu/maxpool), three BasicBlocks (the last downsamples), avgpool, fc."""

    def __init__(self, num_classes: int = 10, width: int = 8) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(kernel_size=3, stride=2, padding=1)
        downsample = nn.Sequential(nn.Conv2d(width, 2 * width, 1, stride=2, bias=False), nn.BatchNorm2d(2 * width))
        self.layer1 = nn.Sequential(BasicBlock(width, width), BasicBlock(width, width))
        self.layer2 = nn.Sequential(BasicBlock(width, 2 * width, stride=2, downsample=downsample))
        self.avgpool = nn.AdaptiveAvgPool2d((1, 1))
        self.fc = nn.Linear(2 * width, num_classes)
        for m in self.modules():  # torchvision's init
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer2(self.layer1(x))
        x = torch.flatten(self.avgpool(x), 1)
        return self.fc(x)


# ------------------------------------------------------------------ BERT
class BertLayer(nn.Module):
    """One Hugging Face BertLayer (eager attention): q/k/v Linear, mask add, softmax, dropout(0),
    output dense + LayerNorm residual, intermediate GELU, output dense + LayerNorm residual."""

    def __init__(self, hidden: int = 32, heads: int = 4, intermediate: int = 64, eps: float = 1e-12) -> None:
        super().__init__()
        self.num_attention_heads = heads
        self.attention_head_size = hidden // heads
        self.all_head_size = heads * self.attention_head_size
        self.query = nn.Linear(hidden, self.all_head_size)
        self.key = nn.Linear(hidden, self.all_head_size)
        self.value = nn.Linear(hidden, self.all_head_size)
        self.attention_dropout = nn.Dropout(0.0)
        self.attention_output_dense = nn.Linear(hidden, hidden)
        self.attention_output_norm = nn.LayerNorm(hidden, eps=eps)
        self.intermediate_dense = nn.Linear(hidden, intermediate)
        self.output_dense = nn.Linear(intermediate, hidden)
        self.output_dropout = nn.Dropout(0.0)
        self.output_norm = nn.LayerNorm(hidden, eps=eps)

    def transpose_for_scores(self, x: torch.Tensor) -> torch.Tensor:
        new_shape = x.size()[:-1] + (self.num_attention_heads, self.attention_head_size)
        return x.view(new_shape).permute(0, 2, 1, 3)

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        query = self.transpose_for_scores(self.query(hidden_states))
        key = self.transpose_for_scores(self.key(hidden_states))
        value = self.transpose_for_scores(self.value(hidden_states))
        scores = torch.matmul(query, key.transpose(-1, -2)) / math.sqrt(self.attention_head_size)
        scores = scores + attention_mask  # [B, 1, 1, T] additive mask: 0 keep, large negative drop
        probs = self.attention_dropout(nn.functional.softmax(scores, dim=-1))
        context = torch.matmul(probs, value).permute(0, 2, 1, 3).contiguous()
        context = context.view(context.size()[:-2] + (self.all_head_size,))
        attention_out = self.attention_output_norm(self.attention_output_dense(context) + hidden_states)
        intermediate = F.gelu(self.intermediate_dense(attention_out))
        layer_out = self.output_dropout(self.output_dense(intermediate))
        return self.output_norm(layer_out + attention_out)


# ------------------------------------------------------------------ makers
def make_mlp(batch: int = 8, seed: int = 0) -> tuple[nn.Module, tuple]:
    torch.manual_seed(seed)
    model = MLP()
    return model, (torch.randn(batch, 32),)


def make_nanogpt(batch: int = 2, seq: int = 16, seed: int = 0) -> tuple[nn.Module, tuple]:
    torch.manual_seed(seed)
    model = NanoGPT()
    return model, (torch.randint(0, 96, (batch, seq)),)


def make_resnet(batch: int = 2, size: int = 32, seed: int = 0) -> tuple[nn.Module, tuple]:
    torch.manual_seed(seed)
    model = SmallResNet()
    return model, (torch.randn(batch, 3, size, size),)


def make_bert_layer(batch: int = 2, seq: int = 16, seed: int = 0) -> tuple[nn.Module, tuple]:
    torch.manual_seed(seed)
    model = BertLayer()
    hidden = torch.randn(batch, seq, 32)
    keep = torch.ones(batch, seq)
    keep[:, seq - 3:] = 0  # padding at the end of every sequence
    mask = (1.0 - keep)[:, None, None, :] * torch.finfo(torch.float32).min
    return model, (hidden, mask)


def make_gpt_block(batch: int = 2, seq: int = 16, n_embd: int = 32, n_head: int = 4,
                   seed: int = 0) -> tuple[nn.Module, tuple]:
    """One nanoGPT transformer block on float input (the demo's workload)."""
    torch.manual_seed(seed)
    model = GPTBlock(n_embd=n_embd, n_head=n_head, block_size=seq)
    return model, (torch.randn(batch, seq, n_embd),)


MODEL_MAKERS: dict[str, Callable[..., tuple[nn.Module, tuple]]] = {
    "mlp": make_mlp,
    "nanogpt": make_nanogpt,
    "resnet": make_resnet,
    "bert_layer": make_bert_layer,
}
