"""Training steps on CPU: eager vs ember vs torch.compile (Inductor, the comparison peer).

    python3 benchmarks/train_cpu.py [--iters 20] [--size small|full] [--compilers eager,ember,inductor]
                                    [--blocks pointwise,nanogpt] [--no-memory]

A step is forward + backward (no optimizer): parameter .grads set to None, out = model(x),
out.backward(fixed random gradient); x requires grad, as an activation inside a network does.

Blocks:
  pointwise  layer_norm (weight, bias) -> gelu(h) * sigmoid(h) -> RMS norm (weight) -> softmax(-1)
             x [16, 256, 1024] (full) or [8, 128, 512] (small)
  nanogpt    one nanoGPT block (LayerNorm, causal SDPA attention, GELU MLP, residuals)
             B8 T256 C512 (full) or B4 T128 C256 (small)

Printed per block and compiler: median step time (ms; the compilers take turns step by step, so
that load from other processes slows them alike) and the speedup over eager (the ratio of the medians,
and the paired speedup: the median over rounds of eager's step over this compiler's), compile time
(the first step: capture + compile + build, with empty kernel caches unless --warm), whether the first step's output and gradients match
eager (rtol/atol 1e-3), and the peak memory of the steps.  Timings are taken in this one process.
Peak memory: each compiler runs again in its own subprocess, which compiles and warms up, resets
the kernel's resident-set high-water mark (/proc/self/clear_refs, "5"), runs the steps and reads
VmHWM: the peak RSS during steps, and its increase over the RSS before them (tensors freed to
the OS: the subprocess fixes glibc's mmap threshold at 128 KiB so that every large tensor is
returned when freed; small cached allocations may not show).  Not a torch
allocator statistic: CPU torch has none.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import torch
from torch import nn
from torch.nn import functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

SIZES = {
    "pointwise": {"small": (8, 128, 512), "full": (16, 256, 1024)},
    "nanogpt": {"small": (4, 128, 256, 4), "full": (8, 256, 512, 8)},      # B, T, C, heads
}


# ------------------------------------------------------------------ blocks
class PointwiseBlock(nn.Module):
    def __init__(self, dim: int) -> None:
        super().__init__()
        self.ln_weight = nn.Parameter(torch.randn(dim) * 0.1 + 1)
        self.ln_bias = nn.Parameter(torch.randn(dim) * 0.1)
        self.rms_weight = nn.Parameter(torch.randn(dim) * 0.1 + 1)
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.layer_norm(x, (self.dim,), self.ln_weight, self.ln_bias)
        h = F.gelu(h) * torch.sigmoid(h)
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * self.rms_weight
        return torch.softmax(h, dim=-1)


class NanoGPTBlock(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.ln_1 = nn.LayerNorm(dim)
        self.c_attn = nn.Linear(dim, 3 * dim)
        self.attn_proj = nn.Linear(dim, dim)
        self.ln_2 = nn.LayerNorm(dim)
        self.c_fc = nn.Linear(dim, 4 * dim)
        self.mlp_proj = nn.Linear(4 * dim, dim)
        self.heads = heads

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        B, T, C = x.shape
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.heads, C // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.attn_proj(y.transpose(1, 2).contiguous().view(B, T, C))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.ln_1(x))
        return x + self.mlp_proj(F.gelu(self.c_fc(self.ln_2(x))))


def make_block(name: str, size: str) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """(model, input x, gradient of the output), deterministic."""
    torch.manual_seed(0)
    if name == "pointwise":
        shape = SIZES[name][size]
        model = PointwiseBlock(shape[-1])
    else:
        B, T, C, heads = SIZES[name][size]
        shape = (B, T, C)
        model = NanoGPTBlock(C, heads)
    x = torch.randn(shape)
    grad = torch.randn(shape)
    return model, x, grad


# ------------------------------------------------------------------ compilers
def compile_with(compiler: str, model: nn.Module) -> nn.Module:
    if compiler == "eager":
        return model
    if compiler == "ember":
        import ember
        return ember.compile(model)
    if compiler == "inductor":
        return torch.compile(model)
    raise ValueError(f"unknown compiler {compiler!r}")


def train_step(model: nn.Module, x: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    for p in model.parameters():
        p.grad = None
    x.grad = None
    out = model(x)
    out.backward(grad)
    return out


def results_of(model: nn.Module, x: torch.Tensor, out: torch.Tensor) -> list[torch.Tensor]:
    return [out.detach(), x.grad] + [p.grad for p in model.parameters()]


def matches(actual: list[torch.Tensor], expected: list[torch.Tensor]) -> str:
    for i, (a, e) in enumerate(zip(actual, expected)):
        if a is None or e is None:
            if a is not e:
                return f"tensor {i}: None vs not None"
            continue
        try:
            torch.testing.assert_close(a, e, rtol=1e-3, atol=1e-3)
        except AssertionError as exc:
            return f"tensor {i}: {str(exc).splitlines()[1] if len(str(exc).splitlines()) > 1 else exc}"
    return "ok"


def explain_ember(model: nn.Module) -> str:
    """How many graphs ran compiled (kinds), when ember's CompiledGraph says it."""
    captured = getattr(model, "_ember_captured", None)
    kinds = []
    for entry in getattr(captured, "entries", []) or []:
        kinds.append(getattr(getattr(entry, "compiled", None), "kind", "?"))
    return ",".join(kinds)


# ------------------------------------------------------------------ memory (one subprocess per compiler)
def rss_mb(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return float("nan")


def memory_worker(block: str, size: str, compiler: str, iters: int) -> None:
    """In a fresh process: compile, warm up, reset the RSS high-water mark, run steps, report."""
    model, x, grad = make_block(block, size)
    x.requires_grad_(True)
    compiled = compile_with(compiler, model)
    for _ in range(3):
        train_step(compiled, x, grad)
    before = rss_mb("VmRSS")
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")              # resets VmHWM to the current RSS
        reset = True
    except OSError:
        reset = False
    for _ in range(max(3, iters // 4)):
        train_step(compiled, x, grad)
    print(json.dumps({"rss_before_mb": before, "peak_rss_mb": rss_mb("VmHWM"), "hwm_reset": reset}))


def measure_memory(block: str, size: str, compiler: str, iters: int) -> dict:
    cmd = [sys.executable, os.path.abspath(__file__), "--memory-worker", f"{block}:{size}:{compiler}",
           "--iters", str(iters)]
    # a fixed mmap threshold: glibc otherwise raises it after the first free of a large block and
    # keeps later tensors in the heap, so the RSS would not fall when they are freed
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="131072")
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1200, env=env)
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else "failed"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------ main
def run_block(block: str, size: str, compilers: list[str], iters: int, memory: bool) -> None:
    base, x, grad = make_block(block, size)
    x.requires_grad_(True)
    print(f"\n## {block} ({size}: {tuple(x.shape)}), {torch.get_num_threads()} threads, {iters} iters")
    reference = copy.deepcopy(base)
    expected = [t.clone() if t is not None else None
                for t in results_of(reference, x, train_step(reference, x, grad))]
    variants = {}
    for compiler in compilers:
        model = copy.deepcopy(base)
        compiled = compile_with(compiler, model)
        start = time.perf_counter()
        out = train_step(compiled, x, grad)
        compile_s = time.perf_counter() - start
        verdict = matches(results_of(model, x, out), expected)
        variants[compiler] = {"model": compiled, "compile_s": compile_s, "verdict": verdict}
    step_ms, paired = time_interleaved({name: v["model"] for name, v in variants.items()}, x, grad, iters)
    print("| compiler | median step ms | speedup vs eager | paired speedup | compile s (first step) | matches eager | "
          "peak RSS in steps MB (increase) | graphs |")
    print("|---|---|---|---|---|---|---|---|")
    for compiler, v in variants.items():
        ms = step_ms[compiler]
        mem = measure_memory(block, size, compiler, iters) if memory else {}
        mem_text = (f"{mem['peak_rss_mb']:.0f} (+{mem['peak_rss_mb'] - mem['rss_before_mb']:.0f})"
                    if "peak_rss_mb" in mem else mem.get("error", "-"))
        graphs = explain_ember(v["model"]) if compiler == "ember" else ""
        print(f"| {compiler} | {ms:.2f} | {step_ms['eager'] / ms:.2f}x | {paired[compiler]:.3f}x | "
              f"{v['compile_s']:.2f} | {v['verdict']} | {mem_text} | {graphs} |", flush=True)


def time_interleaved(models: dict[str, nn.Module], x: torch.Tensor, grad: torch.Tensor, iters: int
                     ) -> tuple[dict[str, float], dict[str, float]]:
    """Median milliseconds per step of each model, the models taking turns step by step, so that
    a busy machine slows them alike (after 2 warm-up steps each); and the paired speedup: the
    median over the rounds of eager's step time over the model's in the same round (steadier than
    the ratio of the medians where other processes come and go; "eager" must be one of them)."""
    for model in models.values():
        for _ in range(2):
            train_step(model, x, grad)
    times: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(iters):
        for name, model in models.items():
            start = time.perf_counter()
            train_step(model, x, grad)
            times[name].append(time.perf_counter() - start)
    paired = {name: statistics.median(e / t for e, t in zip(times["eager"], steps)) for name, steps in times.items()}
    return {name: statistics.median(t) * 1e3 for name, t in times.items()}, paired


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--iters", type=int, default=20)
    parser.add_argument("--size", choices=["small", "full"], default="full")
    parser.add_argument("--compilers", default="eager,ember,inductor")
    parser.add_argument("--blocks", default="pointwise,nanogpt")
    parser.add_argument("--no-memory", action="store_true", help="skip the per-compiler memory subprocesses")
    parser.add_argument("--warm", action="store_true",
                        help="keep the kernel caches (default: fresh ember and Inductor cache directories, "
                             "so that the compile time is a cold compile)")
    parser.add_argument("--memory-worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not args.warm and not args.memory_worker:
        # set before the first compile; the memory subprocesses inherit them (and find them warm)
        os.environ["EMBER_CACHE_DIR"] = tempfile.mkdtemp(prefix="ember-train-bench-")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="inductor-train-bench-")
    if args.memory_worker:
        block, size, compiler = args.memory_worker.split(":")
        memory_worker(block, size, compiler, args.iters)
        return
    # eager first: the baseline of every ratio and the reference of every gradient
    compilers = ["eager"] + [c for c in args.compilers.split(",") if c != "eager"]
    for block in args.blocks.split(","):
        run_block(block, args.size, compilers, args.iters, memory=not args.no_memory)


if __name__ == "__main__":
    main()
