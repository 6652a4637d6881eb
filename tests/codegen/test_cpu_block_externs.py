"""The Externs of a transformer block on the CPU (issue #13): a bias add with nothing fused after
it goes into the GEMM (codegen/cpp_externs.py fuse_bias_into_matmuls), and ``.contiguous()`` of
attention's output transposed back is no copy (lower/lowering.py _clone).  Results equal eager's."""
from __future__ import annotations

import pytest
import torch
from torch.nn import functional as F

import ember
from ember.codegen import cpp, cpp_externs
from models import SdpaCausalAttention as Attention


@pytest.fixture
def schedules(monkeypatch) -> list:
    """The Schedule of every CPU compile, after the Extern policy ran."""
    seen = []
    apply = cpp_externs.apply_matmul_policy

    def recording(sched):
        apply(sched)
        seen.append(sched)
    monkeypatch.setattr(cpp, "apply_matmul_policy", recording)
    return seen


def extern_names(sched) -> list[str]:
    return [getattr(step.node.fn, "__name__", "?") for step in sched.externs]


def test_attention_block_bias_in_gemm_and_no_copy(schedules):
    torch.manual_seed(0)
    model, x = Attention().eval(), torch.randn(2, 16, 64)
    with torch.no_grad():
        expected = model(x)
        actual = ember.compile(model)(x)
    torch.testing.assert_close(actual, expected)
    (sched,) = schedules
    # both biases have nothing to fuse with (QKV goes to attention, the projection is returned):
    # addmm for both, and no kernel copies attention's output
    assert extern_names(sched) == ["addmm", "scaled_dot_product_attention", "addmm"], extern_names(sched)
    assert not sched.kernels


@pytest.mark.parametrize("bias_first", [False, True])
def test_linear_alone_is_one_addmm(schedules, bias_first):
    fn = (lambda x, w, b: b + x @ w.t()) if bias_first else (lambda x, w, b: F.linear(x, w, b))
    torch.manual_seed(0)
    x, w, b = torch.randn(15, 24) if bias_first else torch.randn(3, 5, 24), torch.randn(40, 24), torch.randn(40)
    with torch.no_grad():
        torch.testing.assert_close(ember.compile(fn)(x, w, b), fn(x, w, b))
    (sched,) = schedules
    assert not sched.kernels and extern_names(sched) == ["addmm"]


def test_bias_add_with_more_fused_keeps_mm(schedules):
    """A GELU after the bias: the kernel runs anyway, the bias add is free there."""
    fn = lambda x, w, b: F.gelu(F.linear(x, w, b))
    torch.manual_seed(0)
    x, w, b = torch.randn(3, 5, 24), torch.randn(40, 24), torch.randn(40)
    with torch.no_grad():
        torch.testing.assert_close(ember.compile(fn)(x, w, b), fn(x, w, b))
    (sched,) = schedules
    assert extern_names(sched) == ["mm"] and len(sched.kernels) == 1


def test_product_read_twice_keeps_mm(schedules):
    """The plain product is needed as well: no addmm (it would lose it)."""
    def fn(x, w, b):
        product = x @ w
        return product + b, product.sum()
    torch.manual_seed(0)
    x, w, b = torch.randn(16, 24), torch.randn(24, 40), torch.randn(40)
    with torch.no_grad():
        actual = ember.compile(fn)(x, w, b)
    for got, want in zip(actual, fn(x, w, b)):
        torch.testing.assert_close(got, want)
    assert all("addmm" not in extern_names(sched) for sched in schedules)


def test_bias_of_other_shape_keeps_mm(schedules):
    """A bias per row (a column vector) is not addmm's row bias."""
    fn = lambda x, w, b: x @ w + b[:, None]
    torch.manual_seed(0)
    x, w, b = torch.randn(16, 24), torch.randn(24, 40), torch.randn(16)
    with torch.no_grad():
        torch.testing.assert_close(ember.compile(fn)(x, w, b), fn(x, w, b))
    (sched,) = schedules
    assert "addmm" not in extern_names(sched)


def test_contiguous_copy_of_attention_output_returned(schedules):
    """The no-copy view of attention's output is returned with eager's (contiguous) strides."""
    fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v).transpose(1, 2).contiguous()
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 4, 16, 8).transpose(1, 2).contiguous().transpose(1, 2) for _ in range(3))
    with torch.no_grad():
        expected = fn(q, k, v)
        actual = ember.compile(fn)(q, k, v)
    torch.testing.assert_close(actual, expected)
    assert actual.stride() == expected.stride()
    assert all(not sched.kernels for sched in schedules)   # (a Schedule without kernels builds no C++)


def attention(q, k, v):
    return F.scaled_dot_product_attention(q, k, v, is_causal=True)


def then_scaled(fn):
    """``fn`` and a kernel after it: the CPU backend builds no C++, nor applies the Extern policy,
    for a graph without kernels."""
    return lambda q, k, v: fn(q, k, v) * 2


def heads(batch: int, length: int, dtype: torch.dtype = torch.float32) -> list[torch.Tensor]:
    """q, k, v as head views of one (B, T, 3 * H * D) projection, as a GPT block makes them."""
    qkv = torch.randn(batch, length, 3 * 4 * 16, dtype=dtype)
    return [t.view(batch, length, 4, 16).transpose(1, 2) for t in qkv.split(4 * 16, dim=2)]


@pytest.mark.parametrize("length", [128, 200, 256])
def test_causal_attention_in_query_blocks(schedules, length):
    torch.manual_seed(0)
    q, k, v = heads(2, length)
    fn = then_scaled(attention)
    with torch.no_grad():
        expected = fn(q, k, v)
        actual = ember.compile(fn)(q, k, v)
    torch.testing.assert_close(actual, expected)
    (sched,) = schedules
    assert extern_names(sched) == ["causal_attention_by_query_blocks"]


def test_causal_attention_in_query_blocks_bf16(schedules):
    torch.manual_seed(0)
    q, k, v = heads(2, 256, torch.bfloat16)
    fn = then_scaled(attention)
    with torch.no_grad():
        expected = fn(q, k, v)
        actual = ember.compile(fn)(q, k, v)
    torch.testing.assert_close(actual.float(), expected.float(), rtol=8e-3, atol=1.6e-2)    # a bf16 ulp
    (sched,) = schedules
    assert extern_names(sched) == ["causal_attention_by_query_blocks"]


@pytest.mark.parametrize("case", ["short", "long", "not_causal", "mask", "cross"])
def test_other_attention_keeps_eager_call(schedules, case):
    torch.manual_seed(0)
    length = {"short": 64, "long": 768}.get(case, 128)
    q, k, v = heads(1, length)
    if case == "not_causal":
        fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v)
    elif case == "mask":
        mask = torch.rand(length, length) > 0.3
        fn = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    elif case == "cross":   # fewer queries than keys: the causal mask is top-left aligned
        q = q[:, :, :100]
        fn = attention
    else:
        fn = attention
    fn = then_scaled(fn)
    with torch.no_grad():
        torch.testing.assert_close(ember.compile(fn)(q, k, v), fn(q, k, v))
    (sched,) = schedules
    assert extern_names(sched) == ["scaled_dot_product_attention"]


def test_query_blocks_function():
    """The output has the flash kernel's (B, L, H, D) layout; other arguments go to eager."""
    torch.manual_seed(0)
    q, k, v = heads(2, 130)
    with torch.no_grad():
        out = cpp_externs.causal_attention_by_query_blocks(q, k, v, is_causal=True)
        expected = attention(q, k, v)
        torch.testing.assert_close(out, expected)
        assert out.stride() == expected.stride() == (130 * 4 * 16, 16, 4 * 16, 1)
        full = cpp_externs.causal_attention_by_query_blocks(q, k, v, scale=0.3)
        torch.testing.assert_close(full, F.scaled_dot_product_attention(q, k, v, scale=0.3))


def test_fewer_head_pairs_than_threads_keep_eager_call(schedules, monkeypatch):
    """Each block's call shares out its (batch, head) pairs: with fewer than threads, one call."""
    monkeypatch.setattr(torch, "get_num_threads", lambda: 16)
    torch.manual_seed(0)
    q, k, v = heads(2, 256)
    fn = then_scaled(attention)
    with torch.no_grad():
        torch.testing.assert_close(ember.compile(fn)(q, k, v), fn(q, k, v))
    (sched,) = schedules
    assert extern_names(sched) == ["scaled_dot_product_attention"]


class MLP(torch.nn.Module):
    def __init__(self, dim: int = 32) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(dim, 4 * dim)
        self.proj = torch.nn.Linear(4 * dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(F.gelu(self.fc(x)))


def test_weight_gradients_row_major(schedules):
    """A training backward computes each weight gradient as eager's linear backward does
    (``g.t() @ x``, row-major), not ``x.t() @ g`` returned transposed (autograd's AccumulateGrad
    would copy it): the gradients equal eager's and have the parameters' strides, and each is
    returned straight from its product."""
    torch.manual_seed(0)
    model, x = MLP(), torch.randn(4, 24, 32, requires_grad=True)
    reference = MLP()
    reference.load_state_dict(model.state_dict())
    x_ref = x.detach().clone().requires_grad_(True)
    grad = torch.randn(4, 24, 32)
    reference(x_ref).backward(grad)
    ember.compile(model)(x).backward(grad)
    torch.testing.assert_close(x.grad, x_ref.grad)
    for (name, p), p_ref in zip(model.named_parameters(), reference.parameters()):
        torch.testing.assert_close(p.grad, p_ref.grad, msg=name)
        assert p.grad.stride() == p.stride(), name
    backward = schedules[-1]
    # the two weight gradients leave the backward row-major, as products of their own (computed
    # in the weight's order by the VJP, or transposed here by transpose_returned_products)
    weights = {tuple(p.shape) for name, p in model.named_parameters() if name.endswith("weight")}
    returned = [_returned_stride(backward, out) for out in backward.program.outputs]
    row_major = [(shape, stride) for shape, stride in returned if shape in weights]
    assert len(row_major) == 2 and all(stride == (shape[1], 1) for shape, stride in row_major), returned
    products = [o.name for step in backward.externs for o in step.outputs]
    assert all((out if isinstance(out, str) else out.base) in products for out in backward.program.outputs
               if _returned_stride(backward, out)[0] in weights), backward.program.outputs


def _returned_stride(sched, out) -> tuple[tuple, tuple]:
    """(shape, strides) of a program output: a buffer's name or a view of one."""
    if isinstance(out, str):
        plan = sched.buffers[out]
        return tuple(plan.shape), tuple(plan.stride)
    return tuple(getattr(out, "shape", ())), tuple(getattr(out, "stride", ()))


def test_product_read_by_a_kernel_keeps_its_layout(schedules):
    """Only a product that nothing but the caller reads is transposed; an inference graph's
    transposed product is returned with eager's strides."""
    fn = lambda a, b: (a @ b).t()
    torch.manual_seed(0)
    a, b = torch.randn(16, 24), torch.randn(24, 40)
    with torch.no_grad():
        out = ember.compile(fn)(a, b)
    torch.testing.assert_close(out, fn(a, b))
    assert out.stride() == fn(a, b).stride()
    assert all("mm_transposed" not in extern_names(sched) for sched in schedules)
