"""LLM-style decoding with a KV cache that grows one token per step, under dynamic shapes.

A small GPT decoder (pre-norm blocks, causal self-attention over a key/value cache, MLP): each step
takes the new token's hidden state and every layer's cache, and returns the next hidden state and
the caches grown by one position.  ``ember.compile(step)`` with the default ``dynamic=None``
compiles once static, then once with the cache length symbolic, for all 200 steps.  Reported:
compiles, max error against eager over the loop, and the per-token time of the dynamic entry
against a compile specialised to one cache length (``dynamic=False``) and against eager, timed at
a few cache lengths in one process.

    python benchmarks/decode_loop.py --device cuda --dtype bfloat16
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

import ember
from dynamic_shapes import per_call, sync   # the same timing loop (benchmarks/ is on sys.path)


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc, self.out = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x, k_cache, v_cache):
        B, T, C = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
        q = q.view(B, T, self.heads, C // self.heads).transpose(1, 2)
        k = torch.cat([k_cache, k.view(B, T, self.heads, C // self.heads).transpose(1, 2)], dim=2)
        v = torch.cat([v_cache, v.view(B, T, self.heads, C // self.heads).transpose(1, 2)], dim=2)
        y = F.scaled_dot_product_attention(q, k, v)      # one new query attends to every cached key
        x = x + self.proj(y.transpose(1, 2).reshape(B, T, C))
        x = x + self.out(F.gelu(self.fc(self.ln2(x))))
        return x, k, v


class Decoder(nn.Module):
    def __init__(self, dim: int = 512, heads: int = 8, layers: int = 6) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)

    def forward(self, x, caches):
        new = []
        for block, (k, v) in zip(self.blocks, caches):
            x, k, v = block(x, k, v)
            new.append((k, v))
        return self.ln(x), new


def empty_caches(model: Decoder, length: int, device: str, dtype: torch.dtype) -> list:
    block = model.blocks[0]
    dim = block.qkv.in_features
    shape = (1, block.heads, length, dim // block.heads)
    return [(torch.randn(shape, device=device, dtype=dtype) * 0.5, torch.randn(shape, device=device, dtype=dtype))
            for _ in model.blocks]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--prompt", type=int, default=16, help="cache length before the first step")
    parser.add_argument("--rounds", type=int, default=15, help="timing rounds per cache length")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    device, dtype = args.device, getattr(torch, args.dtype)
    torch.manual_seed(0)
    model = Decoder().to(device, dtype).eval()
    compiled = ember.compile(model)
    dim = model.blocks[0].qkv.in_features
    worst, started = 0.0, time.perf_counter()
    with torch.no_grad():
        caches = empty_caches(model, args.prompt, device, dtype)
        x = torch.randn(1, 1, dim, device=device, dtype=dtype)
        for _ in range(args.steps):
            expected, _ = model(x, caches)
            x_next, caches = compiled(x, caches)
            worst = max(worst, (x_next.float() - expected.float()).abs().max().item())
            x = x_next
        sync(device)
        loop_seconds = time.perf_counter() - started
        compiles = len(compiled._ember_captured.events) if hasattr(compiled, "_ember_captured") else None
        print(f"{args.steps} decode steps from a cache of {args.prompt}: {compiles} compiles, "
              f"max |ember - eager| {worst:.3g}, loop {loop_seconds:.1f}s (compiles included)")
        rows = []
        for length in (args.prompt + args.steps // 2, args.prompt + args.steps):
            caches = empty_caches(model, length, device, dtype)
            static = ember.compile(model, dynamic=False)
            static(x, caches)
            # host-bound steps on a shared VM: many short rounds, static and dynamic back to back in
            # alternating order, and the median of the per-round ratios
            times: dict[str, list[float]] = {"eager": [], "static": [], "dynamic": []}
            ratios = []
            for round_ in range(args.rounds):
                order = [("static", static), ("dynamic", compiled)][::1 if round_ % 2 else -1]
                for name, fn in [("eager", model), *order]:
                    times[name].append(per_call(fn, (x, caches), device, seconds=0.1))
                ratios.append(times["dynamic"][-1] / times["static"][-1])
            best = {k: min(v) * 1e6 for k, v in times.items()}
            row = {"cache": length, "device": device, "dtype": args.dtype, "compiles": compiles,
                   "max_error": worst, "eager_us": best["eager"], "static_us": best["static"],
                   "dynamic_us": best["dynamic"], "dynamic_over_static": statistics.median(ratios),
                   "rounds": args.rounds}
            rows.append(row)
            print(f"  cache {length}: eager {best['eager']:.1f} us/token, static {best['static']:.1f}, "
                  f"dynamic {best['dynamic']:.1f}: dynamic/static {row['dynamic_over_static']:.3f} (median of "
                  f"{args.rounds} paired rounds), "
                  f"eager/dynamic {best['eager'] / best['dynamic']:.2f}")
    if args.json:
        with open(args.json, "a") as handle:
            for row in rows:
                handle.write(json.dumps(row) + "\n")


if __name__ == "__main__":
    main()
