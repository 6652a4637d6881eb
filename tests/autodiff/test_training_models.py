"""Training differential tests: whole models over 3 AdamW steps, compiled (forward and backward)
against eager PyTorch on a deep copy.

After every step: the loss, the output, every parameter's .grad, and (after optimizer.step) every
parameter and buffer (BatchNorm running stats included) equal eager's, fp32 on CPU.  The models
are compiled once: a recompile between steps fails the test.  The strict backend
(training_util.compile_strict) fails a test whose graphs ran eagerly; EMBER_TEST_ALLOW_EAGER=1
allows it.
"""
from __future__ import annotations

import copy
import math

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from training_util import (
    COMPILED_KINDS,
    assert_close,
    assert_compiled,
    clone_inputs,
    compile_strict,
    reset_kinds,
    run_training_steps,
)

STEPS = 3


@pytest.fixture(autouse=True)
def _fresh_kinds():
    reset_kinds()
    yield


def train_and_check(model: nn.Module, batches: list, loss_fn, **kwargs) -> list[float]:
    """run_training_steps plus: the backend compiled forward+backward, and compiled once."""
    graphs_after_first: list[int] = []

    def batches_counting():
        for i, batch in enumerate(batches):
            if i == 1:
                graphs_after_first.append(len(COMPILED_KINDS))
            yield batch

    losses = run_training_steps(model, batches_counting(), loss_fn, steps=STEPS, **kwargs)
    assert_compiled()
    assert len(COMPILED_KINDS) == graphs_after_first[0], \
        f"recompiled between training steps: {len(COMPILED_KINDS)} graphs, {graphs_after_first[0]} after step 0"
    assert all(math.isfinite(v) for v in losses)
    assert losses[-1] != losses[0], "the optimizer changed nothing: the test would not see wrong gradients"
    return losses


def cross_entropy_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.size(-1)), target.reshape(-1))


# ------------------------------------------------------------------ MLP
class MLP(nn.Module):
    def __init__(self, d_in: int = 16, hidden: int = 32, classes: int = 5) -> None:
        super().__init__()
        self.fc1 = nn.Linear(d_in, hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.fc3 = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.fc1(x))
        x = torch.tanh(self.fc2(x)) + x          # a residual: two consumers of one activation
        return self.fc3(x)


def test_mlp_adamw():
    model = MLP()
    batches = [(torch.randn(8, 16), torch.randint(0, 5, (8,))) for _ in range(STEPS)]
    train_and_check(model, batches, cross_entropy_loss)


# ------------------------------------------------------------------ nanoGPT
class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int, block_size: int, use_sdpa: bool) -> None:
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.n_head, self.n_embd, self.use_sdpa = n_head, n_embd, use_sdpa
        self.register_buffer("bias", torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        if self.use_sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
            att = F.softmax(att, dim=-1)
            y = att @ v
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.c_proj(y)


class GPTBlock(nn.Module):
    def __init__(self, n_embd: int, n_head: int, block_size: int, use_sdpa: bool) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, block_size, use_sdpa)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.c_proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.c_proj(F.gelu(self.c_fc(self.ln_2(x))))


class NanoGPT(nn.Module):
    def __init__(self, vocab: int = 64, block_size: int = 16, n_embd: int = 32, n_head: int = 4,
                 n_layer: int = 2, use_sdpa: bool = False) -> None:
        super().__init__()
        self.wte = nn.Embedding(vocab, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.blocks = nn.ModuleList(GPTBlock(n_embd, n_head, block_size, use_sdpa) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd)
        self.lm_head = nn.Linear(n_embd, vocab, bias=False)
        self.lm_head.weight = self.wte.weight         # tied: one parameter, two gradient contributions

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        T = idx.size(1)
        pos = torch.arange(0, T, dtype=torch.long, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


@pytest.mark.parametrize("use_sdpa", [False, True], ids=["matmul_softmax", "sdpa"])
def test_nanogpt_adamw(use_sdpa):
    model = NanoGPT(use_sdpa=use_sdpa)
    batches = [(torch.randint(0, 64, (2, 16)), torch.randint(0, 64, (2, 16))) for _ in range(STEPS)]
    train_and_check(model, batches, cross_entropy_loss)


# ------------------------------------------------------------------ ResNet-style CNN
class BasicBlock(nn.Module):
    def __init__(self, c_in: int, c_out: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(c_in, c_out, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(c_out)
        self.conv2 = nn.Conv2d(c_out, c_out, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(c_out)
        self.downsample = None
        if stride != 1 or c_in != c_out:
            self.downsample = nn.Sequential(nn.Conv2d(c_in, c_out, 1, stride, bias=False), nn.BatchNorm2d(c_out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x if self.downsample is None else self.downsample(x)
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + identity)


class SmallResNet(nn.Module):
    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 8, 3, 1, 1, bias=False), nn.BatchNorm2d(8), nn.ReLU())
        self.layer1 = BasicBlock(8, 8, 1)
        self.layer2 = BasicBlock(8, 16, 2)
        self.fc = nn.Linear(16, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layer2(self.layer1(self.stem(x)))
        x = F.adaptive_avg_pool2d(x, 1).flatten(1)
        return self.fc(x)


def test_resnet_batchnorm_train_adamw():
    model = SmallResNet().train()
    batches = [(torch.randn(4, 3, 12, 12), torch.randint(0, 10, (4,))) for _ in range(STEPS)]
    train_and_check(model, batches, cross_entropy_loss)
    # the running stats moved (assert_same_state compared them after every step)
    assert model.stem[1].num_batches_tracked.item() == STEPS
    assert not torch.allclose(model.stem[1].running_mean, torch.zeros(8))


# ------------------------------------------------------------------ BERT-style encoder layer
class BertLayer(nn.Module):
    """Hugging Face BERT's layer, attention by hand with Linear layers (nn.MultiheadAttention is a
    fused op), with an additive padding mask, post-LayerNorm residuals and dropout."""

    def __init__(self, hidden: int = 32, heads: int = 4, intermediate: int = 64, p: float = 0.0) -> None:
        super().__init__()
        self.heads, self.head_dim = heads, hidden // heads
        self.query = nn.Linear(hidden, hidden)
        self.key = nn.Linear(hidden, hidden)
        self.value = nn.Linear(hidden, hidden)
        self.attn_out = nn.Linear(hidden, hidden)
        self.ln_attn = nn.LayerNorm(hidden, eps=1e-12)
        self.intermediate = nn.Linear(hidden, intermediate)
        self.output = nn.Linear(intermediate, hidden)
        self.ln_out = nn.LayerNorm(hidden, eps=1e-12)
        self.p = p

    def split_heads(self, x: torch.Tensor) -> torch.Tensor:
        B, T, _ = x.shape
        return x.view(B, T, self.heads, self.head_dim).permute(0, 2, 1, 3)

    def forward(self, x: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        q, k, v = self.split_heads(self.query(x)), self.split_heads(self.key(x)), self.split_heads(self.value(x))
        scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(self.head_dim)
        scores = scores + (1.0 - attention_mask[:, None, None, :]) * torch.finfo(scores.dtype).min
        probs = F.dropout(F.softmax(scores, dim=-1), self.p, self.training)
        ctx = torch.matmul(probs, v).permute(0, 2, 1, 3).contiguous()
        ctx = ctx.view(ctx.size(0), ctx.size(1), -1)
        x = self.ln_attn(F.dropout(self.attn_out(ctx), self.p, self.training) + x)
        h = F.gelu(self.intermediate(x))
        return self.ln_out(F.dropout(self.output(h), self.p, self.training) + x)


class BertClassifier(nn.Module):
    def __init__(self, vocab: int = 50, hidden: int = 32, max_pos: int = 16, classes: int = 3, p: float = 0.0,
                 layers: int = 2) -> None:
        super().__init__()
        self.word = nn.Embedding(vocab, hidden)
        self.position = nn.Embedding(max_pos, hidden)
        self.token_type = nn.Embedding(2, hidden)
        self.ln = nn.LayerNorm(hidden, eps=1e-12)
        self.layers = nn.ModuleList(BertLayer(hidden, p=p) for _ in range(layers))
        self.pooler = nn.Linear(hidden, hidden)
        self.classifier = nn.Linear(hidden, classes)
        self.p = p

    def forward(self, ids: torch.Tensor, token_types: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(ids.size(1), device=ids.device).unsqueeze(0)
        x = self.word(ids) + self.position(pos) + self.token_type(token_types)
        x = F.dropout(self.ln(x), self.p, self.training)
        for layer in self.layers:
            x = layer(x, attention_mask)
        pooled = torch.tanh(self.pooler(x[:, 0]))
        return self.classifier(F.dropout(pooled, self.p, self.training))


def bert_batch(batch: int = 2, seq: int = 12) -> tuple:
    ids = torch.randint(0, 50, (batch, seq))
    token_types = (torch.arange(seq) >= seq // 2).long().expand(batch, seq).contiguous()
    mask = torch.ones(batch, seq)
    mask[1, seq - 3:] = 0.0                  # padding on one sequence
    return ids, token_types, mask, torch.randint(0, 3, (batch,))


def test_bert_layer_adamw_no_dropout():
    model = BertClassifier(p=0.0).train()
    batches = [bert_batch() for _ in range(STEPS)]
    train_and_check(model, batches, cross_entropy_loss)


def _ember_dropout_run(model: nn.Module, batches: list, seed: int) -> tuple[list[torch.Tensor], nn.Module]:
    """3 AdamW steps of a compiled copy of `model` with dropout, from torch.manual_seed(seed)."""
    copy_ = copy.deepcopy(model)
    compiled = compile_strict(copy_)
    opt = torch.optim.AdamW(copy_.parameters(), lr=1e-3)
    torch.manual_seed(seed)
    losses = []
    for *inputs, target in batches:
        opt.zero_grad(set_to_none=True)
        loss = cross_entropy_loss(compiled(*clone_inputs(inputs)), target)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return losses, copy_


def test_bert_layer_dropout_reproducible_under_manual_seed():
    """ember's random stream differs from eager's, so with dropout > 0 a compiled run is compared
    with another compiled run from the same seed (equal), and with one from another seed (differs)."""
    model = BertClassifier(p=0.3).train()
    batches = [bert_batch() for _ in range(STEPS)]
    losses_a, model_a = _ember_dropout_run(model, batches, seed=123)
    losses_b, model_b = _ember_dropout_run(model, batches, seed=123)
    losses_c, _ = _ember_dropout_run(model, batches, seed=456)
    assert_compiled()
    for step, (a, b) in enumerate(zip(losses_a, losses_b)):
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=lambda m, step=step: f"step {step} loss: {m}")
    for (name, pa), (_, pb) in zip(model_a.named_parameters(), model_b.named_parameters()):
        torch.testing.assert_close(pa, pb, rtol=0, atol=0, msg=lambda m, name=name: f"{name}: {m}")
    assert any(not torch.equal(a, c) for a, c in zip(losses_a, losses_c)), \
        "another seed gave the same losses: dropout is not applied (or ignores the seed)"


def test_dropout_mask_of_forward_is_used_by_backward():
    """y = dropout(x) * w: the gradient of x is w/(1-p) exactly where y kept x, 0 elsewhere; the
    fraction dropped is about p.  A backward that redrew the mask would fail this."""
    p = 0.4

    def f(x, w):
        return F.dropout(x, p, training=True) * w

    compiled = compile_strict(f)
    x = torch.randn(64, 64).abs().add_(0.1).requires_grad_(True)   # nonzero: kept <=> y != 0
    w = torch.randn(64, 64)
    y = compiled(x, w)
    (gx,) = torch.autograd.grad(y, x, torch.ones_like(y))
    kept = y != 0
    assert 0.3 < 1 - kept.float().mean().item() < 0.5, "dropped fraction far from p"
    torch.testing.assert_close(gx, torch.where(kept, w / (1 - p), torch.zeros_like(w)))
    torch.testing.assert_close(y, torch.where(kept, x.detach() * w / (1 - p), torch.zeros_like(w)))
    assert_compiled()


def test_compiled_loss_function_inside_model():
    """The loss computed inside the compiled region (one graph: model + cross_entropy)."""
    model = MLP()

    class WithLoss(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, x, target):
            return F.cross_entropy(self.inner(x), target)

    wrapped = WithLoss(model)
    batches = [(torch.randn(8, 16), torch.randint(0, 5, (8,)), None) for _ in range(STEPS)]
    train_and_check(wrapped, batches, lambda loss, _: loss)


def test_input_gradients_of_a_model():
    """Gradients w.r.t. a float model input (not only parameters) equal eager's."""
    model = NanoGPT(n_layer=1)
    x = torch.randn(2, 16, 32, requires_grad=True)

    def embed_run(m, x):
        h = x
        for block in m.blocks:
            h = block(h)
        return m.ln_f(h)

    model_c = copy.deepcopy(model)
    run_c = compile_strict(embed_run)
    out_e = embed_run(model, x)
    x_c = x.detach().clone().requires_grad_(True)
    out_c = run_c(model_c, x_c)
    weight = torch.randn_like(out_e)
    (out_e * weight).sum().backward()
    (out_c * weight).sum().backward()
    assert_close(out_c, out_e, "output")
    assert_close(x_c.grad, x.grad, "input grad")
    for (name, pc), (_, pe) in zip(model_c.named_parameters(), model.named_parameters()):
        assert_close(pc.grad, pe.grad, f"{name}.grad")
    assert_compiled()
