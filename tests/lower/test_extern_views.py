"""Extern arguments that are views are passed as strided views (no copy kernel) when their
index map is affine in the base buffer's layout, and copied otherwise."""
import torch
import torch.nn.functional as F
from test_fusion import run_and_compare

from ember.graph import TensorMeta
from ember.lower import ir
from ember.lower.builder import PrimGraphBuilder
from ember.lower.lowering import reshape_index


def extern(b, fn, *args, **kwargs):
    meta_of = lambda v: v.meta.to_meta_tensor() if hasattr(v, "meta") else v
    out = fn(*[meta_of(a) for a in args], **kwargs)
    meta = TensorMeta(tuple(out.shape), tuple(out.stride()), out.dtype, torch.device("cpu"))
    return b.graph.call(fn, args, kwargs, meta=meta)


def test_reshape_composed_with_its_inverse_is_affine():
    x0, x1 = ir.make_vars("x", (512, 384))
    idx = reshape_index((ir.index(x0), ir.index(x1)), (512, 384), (4, 128, 384))
    assert ir.strided_layout(idx, (x0, x1), (4, 128, 384), (49152, 384, 1)) == ((384, 1), 0)
    # the same view of a base whose middle dims are transposed is not strided: it needs a copy
    assert ir.strided_layout(idx, (x0, x1), (4, 128, 384), (49152, 1, 128)) is None
    # transposed weight of F.linear
    assert ir.strided_layout((ir.index(x1), ir.index(x0)), (x0, x1), (384, 512), (512, 1)) == ((1, 512), 0)


def test_flattened_spatial_dims_recombine_into_one_stride():
    """(h, w) of a channels-last (N, H, W, C) buffer flattened into one dim, and transposed:
    c + 384 (p % 56) + 21504 ((p // 56) % 56) + 1204224 (p // 3136) is c + 384 p."""
    c, p = ir.make_vars("x", (384, 64 * 56 * 56))
    n_h_w = ir.delinearize(ir.index(p), (64, 56, 56))
    idx = (n_h_w[0], n_h_w[1], n_h_w[2], ir.index(c))
    assert ir.strided_layout(idx, (c, p), (64, 56, 56, 384), ir.contiguous_strides((64, 56, 56, 384))) == \
        ((1, 384), 0)
    # the other spelling of the middle digit, (p % 3136) // 56, is the same atom
    assert (ir.index(p) % 3136) // 56 == (ir.index(p) // 56) % 56


def test_weight_gradient_of_a_channels_last_activation_reads_it_as_a_view():
    """ConvNeXt's Linear on (N, H, W, C): the weight gradient is grad.T @ x over the (N*H*W) rows,
    and x.T flattened is a strided view; it was copied (0.7 ms a layer on an H100)."""
    xv, gv = torch.randn(2, 3, 5, 8), torch.randn(2 * 3 * 5, 4)
    b = PrimGraphBuilder()
    x, g = b.input("x", xv), b.input("g", gv)
    rows = b.reshape(x, (30, 8))
    out = extern(b, torch.mm, b.permute(rows, (1, 0)), g)
    compiled = run_and_compare(b.build([out]), [xv, gv])
    assert "view copy" not in compiled.source and compiled.stats["kernel_count"] == 0, compiled.source


def test_a_copy_for_an_extern_is_laid_out_along_its_reads():
    """A matmul operand that is no view (heads merged, then transposed: ViT's qkv weight gradient)
    is copied with its innermost dim the one the reads walk (head_dim), so the copy reads and writes
    contiguously; the matmul takes the copy transposed."""
    batch, heads, tokens, dim = 2, 3, 5, 4
    av, bv, xv = torch.randn(batch, heads, tokens, dim), torch.randn(batch, heads, tokens, dim), torch.randn(10, 7)
    b = PrimGraphBuilder()
    a, bb, x = b.input("a", av), b.input("b", bv), b.input("x", xv)
    merged = b.reshape(b.permute(b.add(b.exp(a), bb), (0, 2, 1, 3)), (batch * tokens, heads * dim))
    compiled = run_and_compare(b.build([extern(b, torch.mm, b.permute(merged, (1, 0)), x)]), [av, bv, xv])
    assert "torch.empty_strided((12, 10), (1, 12)" in compiled.source, compiled.source


def test_one_copy_serves_a_matmul_and_its_transposed_partner():
    """The input and weight gradients of a Linear read the same gathered gradient as g and g^T:
    one copy (in the memory order both can read), the second product takes a view of it."""
    batch, heads, tokens, dim = 2, 3, 5, 4
    av, bv = torch.randn(batch, heads, tokens, dim), torch.randn(batch, heads, tokens, dim)
    wv, xv = torch.randn(12, 6), torch.randn(10, 7)
    b = PrimGraphBuilder()
    a, bb, w, x = b.input("a", av), b.input("b", bv), b.input("w", wv), b.input("x", xv)
    merged = b.reshape(b.permute(b.add(b.exp(a), bb), (0, 2, 1, 3)), (batch * tokens, heads * dim))
    outputs = [extern(b, torch.mm, merged, w), extern(b, torch.mm, b.permute(merged, (1, 0)), x)]
    compiled = run_and_compare(b.build(outputs), [av, bv, wv, xv])
    assert compiled.stats == {"kernel_count": 1, "extern_count": 2}, compiled.source


def test_linear_weight_and_attention_heads_are_views_not_copies():
    batch, seq, heads, dim = 2, 8, 2, 16
    width = heads * dim
    xv, wv, bv = torch.randn(batch * seq, width), torch.randn(3 * width, width), torch.randn(3 * width)
    wov = torch.randn(width, width)
    b = PrimGraphBuilder()
    x, w, bias, wo = b.input("x", xv), b.input("w", wv), b.input("b", bv), b.input("wo", wov)
    # F.linear: x @ w.T + b, the transpose is a view of the input
    qkv = b.add(extern(b, torch.mm, x, b.permute(w, (1, 0))), b.broadcast(bias, (batch * seq, 3 * width), (1,)))
    qkv = b.reshape(qkv, (batch, seq, 3 * width))
    q, k, v = [b.permute(b.reshape(b.slice(qkv, 2, i * width, (i + 1) * width, 1), (batch, seq, heads, dim)),
                         (0, 2, 1, 3)) for i in range(3)]
    attention = extern(b, F.scaled_dot_product_attention, q, k, v, is_causal=True)
    merged = b.reshape(b.permute(attention, (0, 2, 1, 3)), (batch * seq, width))
    out = extern(b, torch.mm, merged, b.permute(wo, (1, 0)))
    compiled = run_and_compare(b.build([b.tanh(out)]), [xv, wv, bv, wov])
    # qkv + bias is one addmm on the CPU (codegen/cpp_externs.py: nothing else to fuse the bias
    # into); the heads, weights and attention output are strided views
    assert compiled.stats == {"kernel_count": 1, "extern_count": 3}, compiled.source
    assert "view copy" not in compiled.source
    assert "w.t()" in compiled.source        # the weight read transposed: a view, not a copy
    wrapper = compiled.source.split("# ---- kernels")[0]
    # the attention output's layout was probed: (B, T, H, D) storage, so merging heads is a view
    assert f"scaled_dot_product_attention_out.as_strided(({batch * seq}, {width}), ({width}, 1)" in wrapper


def test_non_strided_view_argument_is_copied():
    xv, wv = torch.randn(4, 6, 8), torch.randn(6, 5)
    b = PrimGraphBuilder()
    x, w = b.input("x", xv), b.input("w", wv)
    # (4, 6, 8) -> transpose -> (4, 8, 6) -> reshape (32, 6): not expressible with strides
    y = b.reshape(b.permute(x, (0, 2, 1)), (32, 6))
    compiled = run_and_compare(b.build([extern(b, torch.mm, y, w)]), [xv, wv])
    assert compiled.stats == {"kernel_count": 1, "extern_count": 1}
    # the copy is laid out along its reads: x's last dim (8) innermost
    assert "layout copy for an extern" in compiled.source and "empty_strided((32, 6), (1, 32)" in compiled.source


def test_extern_of_a_lambda_gets_a_valid_wrapper_name():
    xv = torch.randn(3, 5)
    b = PrimGraphBuilder()
    x = b.input("x", xv)
    twice = lambda t: t * 2
    y = extern(b, twice, b.permute(x, (1, 0)))
    compiled = run_and_compare(b.build([b.add(y, 1.0)]), [xv])
    assert "_extern__lambda_" in compiled.source
