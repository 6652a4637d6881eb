"""Max pooling's generated gradient against eager's on the GPU (a diagnosis, not a test): the
48-pooling graph of tests/prims/test_max_pool.py::test_gradients_match_eager, each window's
mismatches printed with their positions, then the first mismatching window compiled alone.

    EMBER_GENERATED_MAX_POOL=cpu,cuda python benchmarks/gpu_max_pool_check.py [--out DIR]
"""
import argparse
import os
import sys

import torch
import torch.nn.functional as F

import ember
from ember.backend import compile_graph

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tests", "prims"))
from test_max_pool import _configs  # noqa: E402


EMBER_FIRST = False


def run(configs, xs, dtype, out_dir, tag):
    def fn(*xs):
        return [F.max_pool2d(x, k, s, p, d, ceil_mode=c) for x, (k, s, p, d, c) in zip(xs, configs)]
    graphs = []

    def backend(graph, example_inputs):
        compiled = compile_graph(graph, example_inputs, options={"fallback": "error"})
        graphs.append(compiled)
        return compiled
    xs_e = [x.float().requires_grad_() for x in xs]
    xs_c = [x.clone().requires_grad_() for x in xs]
    outs_e, outs_c = fn(*xs_e), ember.compile(fn, backend=backend)(*xs_c)
    grads = [torch.randn_like(o).to(dtype) for o in outs_e]
    if EMBER_FIRST:
        grads_c = torch.autograd.grad(outs_c, xs_c, grads)
        grads_e = torch.autograd.grad(outs_e, xs_e, [g.float() for g in grads])
    else:
        grads_e = torch.autograd.grad(outs_e, xs_e, [g.float() for g in grads])
        grads_c = torch.autograd.grad(outs_c, xs_c, grads)
    bad = []
    for i, (window, a, e, g_c, g_e) in enumerate(zip(configs, outs_c, outs_e, grads_c, grads_e)):
        values_equal = torch.equal(a, e.to(dtype))
        diff = (g_c.float() - g_e.to(dtype).float()).abs()
        n = int((diff > 0).sum())
        if n or not values_equal:
            where = (diff > 0).nonzero().tolist()[:6]
            print(f"{tag} {dtype} window {window}: values equal {values_equal}, {n} gradient mismatches, "
                  f"max diff {diff.max().item():.3g}, at {where}", flush=True)
            for pos in where[:3]:
                print("    ember", g_c[tuple(pos)].item(), "eager", g_e[tuple(pos)].item(), flush=True)
            bad.append(i)
    if out_dir and graphs:
        with open(os.path.join(out_dir, f"maxpool-{tag}-{str(dtype)[6:]}.py"), "w") as f:
            f.write(graphs[0].source + "\n# ======== backward\n" + graphs[0].call.backward_compiled.source)
    print(f"{tag} {dtype}: {len(bad)} of {len(configs)} windows differ", flush=True)
    return bad


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.environ.get("OUT"))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--subsets", default="all", help="'all', or ';'-separated lists of window numbers")
    parser.add_argument("--ember-first", action="store_true", help="ember's backward runs before eager's")
    args = parser.parse_args()
    global EMBER_FIRST
    EMBER_FIRST = args.ember_first
    from ember import config
    config.generated_max_pool_devices = {"cpu", "cuda"}
    every = _configs((9, 8))
    subsets = [list(range(len(every)))] if args.subsets == "all" else \
        [[int(i) for i in part.split(",")] for part in args.subsets.split(";")]
    for subset in subsets:
        configs = [every[i] for i in subset]
        for dtype in (torch.float32,) if len(subsets) > 1 else (torch.float32, torch.bfloat16):
            torch.manual_seed(1)
            xs = [torch.randn(2, 3, 9, 8).to(args.device, dtype) for _ in every][:len(configs)]
            tag = f"n{len(configs)}"
            bad = run(configs, xs, dtype, args.out if len(subsets) == 1 else None, tag)
            if len(subsets) == 1:
                for i in bad[:2]:
                    run([configs[i]], [xs[i]], dtype, args.out, f"alone{subset[i]}")


if __name__ == "__main__":
    main()
