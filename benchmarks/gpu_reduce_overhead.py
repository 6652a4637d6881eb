"""mode="reduce-overhead" on the GPU: per-step time of small, launch-bound models (not a test).

    python3 benchmarks/gpu_reduce_overhead.py [--dtype bfloat16] [--inductor] [--out results.json]

For a 4-layer MLP (batch 32, width 512) and a small pre-norm transformer block, in inference and
as a training step (forward, backward, AdamW), each variant runs in this one process:
eager, ember (default mode), ember reduce-overhead and, with --inductor, torch.compile's
default and reduce-overhead modes.  Times are medians of CUDA-event-timed steps after warm-up;
ratios are over eager.  Also reported: the max error against eager of the first inference, the
calls replayed as CUDA graphs, and peak memory per training step.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import ember  # noqa: E402
from ember.runtime import cudagraphs  # noqa: E402


class MLP(nn.Module):
    def __init__(self, width=512, depth=4):
        super().__init__()
        self.layers = nn.ModuleList(nn.Linear(width, width) for _ in range(depth))

    def forward(self, x):
        for layer in self.layers[:-1]:
            x = torch.relu(layer(x))
        return self.layers[-1](x)


class Block(nn.Module):
    def __init__(self, width=256, heads=4):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.fc1, self.fc2 = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).split(c, dim=-1)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.fc2(torch.nn.functional.gelu(self.fc1(self.norm2(x))))


CASES = {
    "mlp4": (MLP, lambda dtype: torch.randn(32, 512, device="cuda", dtype=dtype)),
    "block": (Block, lambda dtype: torch.randn(4, 64, 256, device="cuda", dtype=dtype)),
}


def make(variant, model):
    if variant == "eager":
        return model
    if variant.startswith("ember"):
        return ember.compile(model, mode="reduce-overhead" if variant.endswith("-ro") else None)
    return torch.compile(model, mode="reduce-overhead" if variant.endswith("-ro") else None)


def timed(step, iters=200, warmup=20):
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for start, end in events:
        start.record()
        step()
        end.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in events)


def run_case(name, variant, dtype, train):
    torch.manual_seed(0)
    build, inputs = CASES[name]
    model = build().to("cuda", dtype)
    reference = copy.deepcopy(model)
    model.train(train)
    reference.train(train)
    x = inputs(dtype)
    start = time.perf_counter()
    compiled = make(variant, model)
    before = dict(cudagraphs.counters)
    if train:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)

        def step():
            ember.cudagraph_mark_step_begin() if variant.startswith("ember") else None
            compiled(x).float().square().mean().backward()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        step()
        torch.cuda.synchronize()
        first_s = time.perf_counter() - start
        error = None
    else:
        with torch.no_grad():
            out = compiled(x).clone()
            torch.cuda.synchronize()
            first_s = time.perf_counter() - start
            error = (out.float() - reference(x).float()).abs().max().item()

        def step():
            with torch.no_grad():
                compiled(x)
    torch.cuda.reset_peak_memory_stats()
    median_ms = timed(step)
    replayed = cudagraphs.counters["replayed"] - before["replayed"]
    return {"case": name, "variant": variant, "train": train, "ms": median_ms, "first_call_s": first_s,
            "max_error": error, "replayed": replayed, "peak_mb": torch.cuda.max_memory_allocated() / 2**20}


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--inductor", action="store_true")
    parser.add_argument("--cases", default="mlp4,block")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    variants = ["eager", "ember", "ember-ro"] + (["inductor", "inductor-ro"] if args.inductor else [])
    results = []
    for name in args.cases.split(","):
        for train in (False, True):
            eager_ms = None
            for variant in variants:
                try:
                    r = run_case(name, variant, dtype, train)
                except Exception as exc:  # noqa: BLE001 - report and go on
                    r = {"case": name, "variant": variant, "train": train, "error": f"{type(exc).__name__}: {exc}"}
                if variant == "eager":
                    eager_ms = r.get("ms")
                if "ms" in r and eager_ms:
                    r["speedup"] = eager_ms / r["ms"]
                results.append(r)
                print(json.dumps(r), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)


if __name__ == "__main__":
    main()
