"""What does a graph break cost?  The same model with and without a break in the middle of forward.

    python benchmarks/graph_break_speed.py            # CUDA in bf16 when available, else CPU fp32
    python benchmarks/graph_break_speed.py --steps 50 --train

Variants of one 8-block MLP-mixer-like model (Linear, GELU, LayerNorm, residual):
  plain   no break                      -> ember: 1 graph
  print   print(..., file=sink) after block 4           -> 2 graphs, 1 break
  item    `if h.abs().max().item() > 1e4:` after block 4 (an .item()-driven branch; syncs the GPU)
Prints per variant: graphs/breaks (ember.explain), eager ms, ember ms, ember/eager speedup, the time
relative to ember's plain variant, and the max error against eager.  Ratios come from one run.
Then the host cost of a break: microseconds per call of a 3-op function on 16 elements, with and
without a print in the middle (guards of two entries, the runner, the continuation call).
"""
from __future__ import annotations

import argparse
import io
import time

import torch

import ember


class Block(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, 4 * width)
        self.down = torch.nn.Linear(4 * width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class Model(torch.nn.Module):
    def __init__(self, width: int, depth: int, variant: str) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block(width) for _ in range(depth))
        self.variant = variant
        self.sink = io.StringIO()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        half = len(self.blocks) // 2
        for block in self.blocks[:half]:
            x = block(x)
        if self.variant == "print":
            print("activation", tuple(x.shape), file=self.sink)
        elif self.variant == "item":
            if x.abs().max().item() > 1e4:
                x = x.clamp(-1e4, 1e4)
        for block in self.blocks[half:]:
            x = block(x)
        return x


def timed(fn, x, steps: int, train: bool, device: str) -> float:
    def step():
        out = fn(x)
        if train:
            out.float().square().mean().backward()
        return out
    for _ in range(3):
        step()
    if device == "cuda":
        torch.cuda.synchronize()
    times = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        if device == "cuda":
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    times.sort()
    return times[len(times) // 2] * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=8192)
    parser.add_argument("--train", action="store_true")
    args = parser.parse_args()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    tokens = args.tokens if device == "cuda" else args.tokens // 16
    torch.manual_seed(0)
    x = torch.randn(tokens, args.width, device=device, dtype=dtype, requires_grad=args.train)
    base = Model(args.width, args.depth, "plain").to(device, dtype)
    print(f"device={device} dtype={dtype} tokens={tokens} width={args.width} depth={args.depth} "
          f"{'train' if args.train else 'inference'}")
    plain_ms = None
    for variant in ("plain", "print", "item"):
        model = Model(args.width, args.depth, variant).to(device, dtype)
        model.load_state_dict(base.state_dict())
        context = torch.enable_grad() if args.train else torch.no_grad()
        with context:
            report = ember.explain(model, x)
            compiled = ember.compile(model)
            error = (compiled(x).float() - model(x).float()).abs().max().item()
            eager_ms = timed(model, x, args.steps, args.train, device)
            ember_ms = timed(compiled, x, args.steps, args.train, device)
        plain_ms = plain_ms or ember_ms
        print(f"{variant:6s} graphs={report.graph_count} breaks={report.break_count} eager={eager_ms:8.3f} ms "
              f"ember={ember_ms:8.3f} ms speedup={eager_ms / ember_ms:5.2f}x vs_plain={ember_ms / plain_ms:5.3f} "
              f"max_err={error:.3g}", flush=True)
    host_cost(device)


def host_cost(device: str, calls: int = 2000) -> None:
    sink = io.StringIO()

    def plain(x):
        y = x.sin() * 2
        return y.cos() + 1

    def with_break(x):
        y = x.sin() * 2
        print("y", file=sink)
        return y.cos() + 1
    x = torch.randn(16, device=device)
    for fn in (plain, with_break):
        compiled = ember.compile(fn)
        per_call = []
        for run in (compiled, fn):
            for _ in range(20):
                run(x)
            start = time.perf_counter()
            for _ in range(calls):
                run(x)
            if device == "cuda":
                torch.cuda.synchronize()
            per_call.append((time.perf_counter() - start) / calls * 1e6)
        print(f"host cost {fn.__name__:10s}: ember {per_call[0]:6.1f} us/call, eager {per_call[1]:6.1f} us/call")


if __name__ == "__main__":
    main()
