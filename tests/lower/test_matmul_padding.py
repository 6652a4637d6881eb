"""mm/addmm/bmm with rows that are not 16-byte aligned are computed zero-padded (fast cuBLAS
kernels) and sliced back: same values, eager's output layout.  Padding is for CUDA only; here it
is switched on for the CPU so that both code generators are checked against eager."""
import pytest
import torch

import ember
from ember.backend import compile_graph
from ember.lower import lowering
from recording import compile_recording, record_compiled_graphs


@pytest.fixture(autouse=True)
def pad_on_cpu(monkeypatch):
    monkeypatch.setattr(lowering, "PAD_MATMUL_DEVICES", {"cpu", "cuda"})
    monkeypatch.setattr(lowering, "PAD_MATMUL_MIN_FLOPS", 0)
    monkeypatch.setattr(lowering, "PAD_MATMUL_MIN_FLOPS_PER_COPIED", 0)
    precision = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")      # fp32 products are padded for TF32 only
    yield
    torch.set_float32_matmul_precision(precision)


def lm_head(x, wte):
    return torch.nn.functional.linear(x, wte)           # mm against the transposed embedding


def conv1d(x, w, b):
    return torch.addmm(b, x, w) * 2                      # GPT-2's Conv1D, then a consumer


def batched(a, b):
    return torch.bmm(a, b).relu()


def shared_weight(a, w):
    return torch.bmm(a, w.expand(a.shape[0], -1, -1))       # one weight broadcast over the batch


def unaligned_k(x, w):
    return x @ w                                         # K = 13: both operands padded along K


def transposed_left(g, y):
    return g.t() @ y          # a column-major left operand with M = 13: its rows padded, M rows read back


def transposed_right(x, w):
    return x @ w.t()                                     # a column-major right operand with K = 13


def addmm_rows(bias, g, y):
    return torch.addmm(bias, g.t(), y)                   # M padded: an (M, N) bias too


def batched_k(a, b):
    return torch.bmm(a, b)


CASES = [
    (shared_weight, lambda: (torch.randn(3, 4, 8), torch.randn(1, 8, 9))),
    (unaligned_k, lambda: (torch.randn(6, 13), torch.randn(13, 16))),
    (transposed_left, lambda: (torch.randn(8, 13), torch.randn(8, 16))),
    (transposed_right, lambda: (torch.randn(6, 13), torch.randn(16, 13))),
    (addmm_rows, lambda: (torch.randn(13, 16), torch.randn(8, 13), torch.randn(8, 16))),
    (batched_k, lambda: (torch.randn(3, 4, 13), torch.randn(3, 13, 8))),
    (lm_head, lambda: (torch.randn(2, 5, 12), torch.randn(37, 12))),
    (conv1d, lambda: (torch.randn(6, 8), torch.randn(8, 13), torch.randn(13))),
    (batched, lambda: (torch.randn(3, 4, 8), torch.randn(3, 8, 9))),
]


@pytest.mark.parametrize("options", [None, {"cpu_backend": "triton"}], ids=["cpp", "triton"])
@pytest.mark.parametrize("fn, make", CASES, ids=[c[0].__name__ for c in CASES])
def test_padded_matmul_matches_eager(fn, make, options):
    if options:
        pytest.importorskip("triton")
    inputs = make()
    compiled, sources = compile_recording(fn, options)
    expected = fn(*inputs)
    out = compiled(*inputs)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    assert out.stride() == expected.stride()
    assert len(sources) == 1 and "zero padding" in sources[0]


def test_aligned_or_small_matmuls_are_not_padded(monkeypatch):
    from ember.graph import TensorMeta
    from ember.lower.builder import PrimGraphBuilder
    for n, min_flops in ((16, 0), (13, 1e9)):
        monkeypatch.setattr(lowering, "PAD_MATMUL_MIN_FLOPS", min_flops)
        xv, wv = torch.randn(6, 8), torch.randn(8, n)
        b = PrimGraphBuilder()
        x, w = b.input("x", xv), b.input("w", wv)
        graph = b.build([b.graph.call(torch.mm, (x, w), meta=TensorMeta.of(torch.empty(6, n)))])
        assert "zero padding" not in compile_graph(graph, [xv, wv]).source
    monkeypatch.setattr(lowering, "PAD_MATMUL_MIN_FLOPS", 0)
    compiled = compile_graph(graph, [xv, wv])
    assert "zero padding" in compiled.source
    torch.testing.assert_close(compiled(xv, wv)[0], xv @ wv)


def test_padded_matmul_output_also_saved_for_backward():
    """GPT-2's LM head in training: the padded product is both returned and read by the backward
    (two graph outputs of one value: lowering once named a copy for each and asserted)."""
    def lm_logits(x, wte):
        logits = torch.nn.functional.linear(x, wte)
        return logits, logits * logits
    x, wte = torch.randn(6, 12, requires_grad=True), torch.randn(37, 12, requires_grad=True)
    made = []

    def backend(graph, example_inputs):
        made.append(compile_graph(graph, example_inputs, options={"fallback": "error"}))
        return made[-1]
    compiled = ember.compile(lm_logits, backend=backend)
    out = compiled(x, wte)
    expected = lm_logits(x, wte)
    grads = torch.autograd.grad(out[0].sum() + out[1].sum(), (x, wte))
    expected_grads = torch.autograd.grad(expected[0].sum() + expected[1].sum(), (x, wte))
    for a, e in zip(out + grads, expected + expected_grads):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5)
    assert len(made) == 1 and made[0].kind == "autograd" and "zero padding" in made[0].source


def test_fp32_products_without_tf32_are_not_padded():
    torch.set_float32_matmul_precision("highest")
    compiled, sources = compile_recording(unaligned_k)
    x, w = torch.randn(6, 13), torch.randn(13, 16)
    torch.testing.assert_close(compiled(x, w), unaligned_k(x, w))
    assert "zero padding" not in sources[0]


def test_a_gemv_never_copies_its_weight(monkeypatch):
    """Padding copies an operand: not worth it where the product reads each element about once."""
    monkeypatch.setattr(lowering, "PAD_MATMUL_MIN_FLOPS_PER_COPIED", 256)
    def head(x, w):
        return x @ w
    compiled, sources = compile_recording(head)
    x, w = torch.randn(2, 16), torch.randn(16, 37)
    torch.testing.assert_close(compiled(x, w), head(x, w))
    assert "zero padding" not in sources[0]
    x = torch.randn(300, 16)        # 2 * 300 * 40 * 16 flops for the 16 * 40 elements of the copy
    torch.testing.assert_close(compiled(x, w), head(x, w))
    assert "zero padding" in sources[1]


def test_lm_head_gradients_share_one_padded_copy():
    """GPT-2's LM head backward: grad_x = g @ W (K = vocab) and grad_W = g^T @ x (M = vocab,
    g read transposed) both read the same zero-padded copy of the logits' gradient g."""
    def lm_head_logits(x, wte):
        return torch.nn.functional.linear(x, wte)
    x, wte = torch.randn(6, 12, requires_grad=True), torch.randn(37, 12, requires_grad=True)
    g = torch.randn(6, 37)
    made = []

    def backend(graph, example_inputs):
        made.append(compile_graph(graph, example_inputs, options={"fallback": "error"}))
        return made[-1]
    compiled = ember.compile(lm_head_logits, backend=backend)
    grads = torch.autograd.grad(compiled(x, wte), (x, wte), g)
    expected = torch.autograd.grad(lm_head_logits(x, wte), (x, wte), g)
    for a, e in zip(grads, expected):
        torch.testing.assert_close(a, e, rtol=1e-5, atol=1e-5)
    wrapper = made[0].call.backward_compiled.source.split("# ---- kernels")[0]
    pads = [line for line in wrapper.splitlines() if "zero padding" in line]
    # one copy of g (6, 40) read by both products, one of wte with 40 rows for grad_x
    assert len(pads) == 2, wrapper
    assert wrapper.count("(6, 40)") >= 1 and "(40, 12)" in wrapper, wrapper


PRODUCTS = {
    "mm": lambda bias, a, b: torch.mm(a, b),
    "addmm_row_bias": lambda bias, a, b: torch.addmm(bias[0], a, b),
    "addmm_full_bias": lambda bias, a, b: torch.addmm(bias, a, b),
    "bmm": lambda bias, a, b: torch.bmm(a.expand(2, -1, -1), b.expand(2, -1, -1) * 2),
}


@pytest.mark.parametrize("product", PRODUCTS)
@pytest.mark.parametrize("sizes", [(8, 8, 8), (13, 8, 8), (8, 13, 8), (8, 8, 13), (13, 13, 13)],
                         ids=lambda s: "m%dk%dn%d" % s)
def test_every_layout_and_unaligned_dim(product, sizes):
    """Every combination of row- or column-major operands with M, K or N unaligned: values and
    gradients equal eager's (whatever the padding chooses to copy)."""
    m, k, n = sizes
    fn = PRODUCTS[product]
    for a_transposed in (False, True):
        for b_transposed in (False, True):
            def program(bias, a_source, b_source):
                a = a_source.t() if a_transposed else a_source
                b = b_source.t() if b_transposed else b_source
                return fn(bias, a, b)
            inputs = [torch.randn(m, n), torch.randn((k, m) if a_transposed else (m, k)),
                      torch.randn((n, k) if b_transposed else (k, n))]
            inputs = [t.requires_grad_() for t in inputs]
            compiled = ember.compile(program, options={"fallback": "error"})
            out, expected = compiled(*inputs), program(*inputs)
            torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
            assert out.stride() == expected.stride()
            seed = torch.randn_like(expected)
            grads = torch.autograd.grad(out, inputs, seed, allow_unused=True)
            expected_grads = torch.autograd.grad(expected, inputs, seed, allow_unused=True)
            for got, want in zip(grads, expected_grads):
                if want is None:
                    assert got is None
                else:
                    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_symbolic_rows_stay_unpadded_and_unguarded(monkeypatch):
    """dynamic=True: the parameter's static vocab is padded, the symbolic batch is not (and is
    never compared: one graph serves every batch)."""
    made = record_compiled_graphs(monkeypatch)
    torch.manual_seed(0)
    head = torch.nn.Sequential(torch.nn.Linear(12, 37, bias=False), torch.nn.ReLU())
    compiled = ember.compile(head, dynamic=True, options={"fallback": "error"})
    weight = head[0].weight
    for rows in (5, 9, 13):
        x = torch.randn(rows, 12, requires_grad=True)
        g = torch.randn(rows, 37)
        out, expected = compiled(x), head(x)
        torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
        grads = torch.autograd.grad(out, (x, weight), g)
        for got, want in zip(grads, torch.autograd.grad(expected, (x, weight), g)):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    assert len(made) == 1 and made[0].kind == "autograd"
    backward = made[0].call.backward_compiled.source
    assert "zero padding" in made[0].source and "zero padding" in backward
