"""mm/addmm/bmm with rows that are not 16-byte aligned are computed zero-padded (fast cuBLAS
kernels) and sliced back: same values, eager's output layout.  Padding is for CUDA only; here it
is switched on for the CPU so that both code generators are checked against eager."""
import pytest
import torch

import ember
from ember.backend import compile_graph
from ember.lower import lowering
from recording import compile_recording


@pytest.fixture(autouse=True)
def pad_on_cpu(monkeypatch):
    monkeypatch.setattr(lowering, "PAD_MATMUL_DEVICES", {"cpu", "cuda"})
    monkeypatch.setattr(lowering, "PAD_MATMUL_MIN_FLOPS", 0)


def lm_head(x, wte):
    return torch.nn.functional.linear(x, wte)           # mm against the transposed embedding


def conv1d(x, w, b):
    return torch.addmm(b, x, w) * 2                      # GPT-2's Conv1D, then a consumer


def batched(a, b):
    return torch.bmm(a, b).relu()


def shared_weight(a, w):
    return torch.bmm(a, w.expand(a.shape[0], -1, -1))       # one weight broadcast over the batch


CASES = [
    (shared_weight, lambda: (torch.randn(3, 4, 8), torch.randn(1, 8, 9))),
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
