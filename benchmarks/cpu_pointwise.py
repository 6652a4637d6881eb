"""ember vs eager vs torch.compile (Inductor CPU, the comparison peer) on two CPU blocks.

    python3 benchmarks/cpu_pointwise.py [--quick]

Blocks: (1) 10 chained elementwise ops (gelu, tanh, mul, add, ...) on a 4M-element
tensor; (2) a nanoGPT-style transformer block (layer_norm, linear, sdpa, gelu,
residuals): graphs built by hand at torch level and compiled with
ember.backend.compile_graph; (3) the bench zoo's nanoGPT model (../shared/bench/models.py,
4 layers) through the whole pipeline, ember.compile(model) vs torch.compile(model).  Cold compile = fresh EMBER_CACHE_DIR /
TORCHINDUCTOR_CACHE_DIR; warm = same cache, new compile in the same process.
"""
from __future__ import annotations

import argparse
import os
import tempfile
import time

import torch
import torch.nn.functional as F

from ember.graph import Graph, Node, TensorMeta, tree_map


class Recorder:
    """Builds a torch-level Graph by calling functions on meta tensors (shapes only)."""

    def __init__(self) -> None:
        self.graph = Graph()

    def input(self, name: str, example: torch.Tensor) -> Node:
        return self.graph.placeholder(name, TensorMeta.of(example))

    def __call__(self, fn, *args, **kwargs) -> Node:
        meta_of = lambda v: v.meta.to_meta_tensor() if isinstance(v, Node) else v
        out = fn(*tree_map(meta_of, args), **tree_map(meta_of, kwargs))
        meta = tuple(TensorMeta.of(o) for o in out) if isinstance(out, (tuple, list)) else TensorMeta.of(out)
        meta = tree_map(lambda m: TensorMeta(m.shape, m.stride, m.dtype, torch.device("cpu"), False,
                                             m.storage_offset), meta)
        return self.graph.call(fn, args, kwargs, meta=meta)


def pointwise_fn(x):
    y = F.gelu(x)
    y = torch.tanh(y) * 1.5
    y = y + x
    y = torch.sigmoid(y) * x
    y = torch.exp(-y.abs())
    y = y * 0.5 + 0.25
    return (y,)


def pointwise_graph(x):
    r = Recorder()
    xn = r.input("x", x)
    y = r(F.gelu, xn)
    y = r(torch.mul, r(torch.tanh, y), 1.5)
    y = r(torch.add, y, xn)
    y = r(torch.mul, r(torch.sigmoid, y), xn)
    y = r(torch.exp, r(torch.neg, r(torch.abs, y)))
    y = r(torch.add, r(torch.mul, y, 0.5), 0.25)
    r.graph.output([y])
    return r.graph


B, T, C, H = 4, 128, 384, 6


def block_params():
    g = torch.Generator().manual_seed(0)
    p = lambda *s: torch.randn(*s, generator=g) * 0.02
    return [torch.ones(C), torch.zeros(C), p(3 * C, C), torch.zeros(3 * C), p(C, C), torch.zeros(C),
            torch.ones(C), torch.zeros(C), p(4 * C, C), torch.zeros(4 * C), p(C, 4 * C), torch.zeros(C)]


def block_fn(x, ln1w, ln1b, wqkv, bqkv, wo, bo, ln2w, ln2b, w1, b1, w2, b2):
    h = F.layer_norm(x, (C,), ln1w, ln1b)
    qkv = F.linear(h, wqkv, bqkv)
    q, k, v = qkv.split(C, dim=2)
    q = q.reshape(B, T, H, C // H).transpose(1, 2)
    k = k.reshape(B, T, H, C // H).transpose(1, 2)
    v = v.reshape(B, T, H, C // H).transpose(1, 2)
    a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    a = a.transpose(1, 2).reshape(B, T, C)
    x = x + F.linear(a, wo, bo)
    h = F.layer_norm(x, (C,), ln2w, ln2b)
    x = x + F.linear(F.gelu(F.linear(h, w1, b1)), w2, b2)
    return (x,)


def block_graph(inputs):
    r = Recorder()
    names = ["x", "ln1w", "ln1b", "wqkv", "bqkv", "wo", "bo", "ln2w", "ln2b", "w1", "b1", "w2", "b2"]
    x, ln1w, ln1b, wqkv, bqkv, wo, bo, ln2w, ln2b, w1, b1, w2, b2 = [r.input(n, v) for n, v in zip(names, inputs)]
    h = r(F.layer_norm, x, (C,), ln1w, ln1b)
    qkv = r(F.linear, h, wqkv, bqkv)
    heads = []
    for i in range(3):
        part = r(torch.narrow, qkv, 2, i * C, C)
        heads.append(r(torch.transpose, r(torch.reshape, part, (B, T, H, C // H)), 1, 2))
    a = r(F.scaled_dot_product_attention, *heads, is_causal=True)
    a = r(torch.reshape, r(torch.transpose, a, 1, 2), (B, T, C))
    x = r(torch.add, x, r(F.linear, a, wo, bo))
    h = r(F.layer_norm, x, (C,), ln2w, ln2b)
    x = r(torch.add, x, r(F.linear, r(F.gelu, r(F.linear, h, w1, b1)), w2, b2))
    r.graph.output([x])
    return r.graph


def bench(fn, inputs, repeat: int) -> float:
    for _ in range(3):
        fn(*inputs)
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn(*inputs)
        times.append(time.perf_counter() - start)
    times.sort()
    return times[len(times) // 2] * 1e3


def ember_compile(graph, inputs):
    from ember.backend import compile_graph
    start = time.perf_counter()
    compiled = compile_graph(graph, inputs)
    return compiled, time.perf_counter() - start


def inductor_compile(fn, inputs):
    import torch._dynamo
    torch._dynamo.reset()
    compiled = torch.compile(fn)
    start = time.perf_counter()
    compiled(*inputs)
    return compiled, time.perf_counter() - start


def run_case(name, fn, graph, inputs, repeat):
    os.environ["EMBER_CACHE_DIR"] = tempfile.mkdtemp(prefix="ember-bench-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor-bench-")
    from ember.runtime import cpp_build
    cpp_build.compile_flags.cache_clear()
    ember_fn, ember_cold = ember_compile(graph, inputs)
    _, ember_warm = ember_compile(graph, inputs)
    ind_fn, ind_cold = inductor_compile(fn, inputs)
    _, ind_warm = inductor_compile(fn, inputs)
    expected = fn(*inputs)[0]
    torch.testing.assert_close(ember_fn(*inputs)[0], expected, rtol=1e-4, atol=1e-4)
    eager_ms = bench(fn, inputs, repeat)
    ember_ms = bench(ember_fn, inputs, repeat)
    ind_ms = bench(ind_fn, inputs, repeat)
    print(f"| {name} | {eager_ms:.2f} | {ember_ms:.2f} ({eager_ms / ember_ms:.2f}x) | {ind_ms:.2f} "
          f"({eager_ms / ind_ms:.2f}x) | {ember_cold:.2f} / {ember_warm:.3f} | {ind_cold:.2f} / {ind_warm:.2f} | "
          f"{ember_fn.stats['kernel_count']}k+{ember_fn.stats['extern_count']}e |", flush=True)


def run_model_case(name, model, inputs, repeat):
    """A whole nn.Module through the full pipeline: ember.compile (capture) vs torch.compile."""
    import ember
    from ember.runtime import cpp_build
    os.environ["EMBER_CACHE_DIR"] = tempfile.mkdtemp(prefix="ember-bench-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor-bench-")
    cpp_build.compile_flags.cache_clear()
    ember.reset()
    ember_fn = ember.compile(model)
    ember_cold = first_call_seconds(ember_fn, inputs)        # capture + compile + g++
    ember.reset()
    ember_warm = first_call_seconds(ember.compile(model), inputs)
    ind_fn, ind_cold = inductor_compile(model, inputs)
    _, ind_warm = inductor_compile(model, inputs)
    expected = model(*inputs)
    error = ((ember_fn(*inputs) - expected).abs().max() / expected.abs().max()).item()
    assert error < 1e-4, f"relative error {error}"
    eager_ms = bench(model, inputs, repeat)
    ember_ms = bench(ember_fn, inputs, repeat)
    ind_ms = bench(ind_fn, inputs, repeat)
    print(f"| {name} | {eager_ms:.2f} | {ember_ms:.2f} ({eager_ms / ember_ms:.2f}x) | {ind_ms:.2f} "
          f"({eager_ms / ind_ms:.2f}x) | {ember_cold:.2f} / {ember_warm:.3f} | {ind_cold:.2f} / {ind_warm:.2f} | "
          f"capture |", flush=True)


def first_call_seconds(compiled, inputs) -> float:
    start = time.perf_counter()
    compiled(*inputs)
    return time.perf_counter() - start


def nanogpt_model():
    """The bench zoo's nanoGPT (explicit matmul + masked softmax attention), 4 layers, d 384."""
    import sys
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "bench"))
    import models as zoo
    torch.manual_seed(0)
    model = zoo.NanoGPT(vocab=4096, block_size=256, n_layer=4, n_head=6, d=384).eval()
    return model, (torch.randint(0, 4096, (2, 128)),)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    repeat = 5 if args.quick else 30
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}")
    print("| block | eager ms | ember ms (speedup) | inductor ms (speedup) | ember cold/warm compile s | "
          "inductor cold/warm compile s | ember kernels |")
    print("|---|---|---|---|---|---|---|")
    x = torch.randn(4 * 1024 * 1024)
    run_case("pointwise x10 (4M fp32)", pointwise_fn, pointwise_graph(x), [x], repeat)
    inputs = [torch.randn(B, T, C)] + block_params()
    run_case(f"nanoGPT block (B{B} T{T} C{C})", block_fn, block_graph(inputs), inputs, repeat)
    model, model_inputs = nanogpt_model()
    with torch.no_grad():
        run_model_case("nanoGPT model, 4 layers (B2 T128 C384, vocab 4096)", model, model_inputs,
                       max(repeat // 3, 5))


if __name__ == "__main__":
    main()
