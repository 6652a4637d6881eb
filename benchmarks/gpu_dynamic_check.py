"""Dynamic shapes on the GPU: zoo models and conv-net pieces with a symbolic batch, against eager.

    python3 benchmarks/gpu_dynamic_check.py [--cases a,b] [--out DIR]

Each case runs in its own process (an illegal memory access poisons the CUDA context), with
CUDA_LAUNCH_BLOCKING=1 so that an error names the kernel that faulted, and
EMBER_DYNAMIC_CONV_CUDA=1 so that graphs with convolutions get size symbols.  A case compiles its
model with ``dynamic=True`` and ``fallback="error"``, calls it with several batch sizes, compares
each output with eager (bf16: relative L2 error) and writes its logs (graph breaks, dynamic
decisions, the generated code) to ``DIR/<case>.log``.  A second mode, ``--explain``, prints
``ember.explain`` for the zoo models at full size (static), to see what each compiled.
Needs .bench/models.py (``bash benchmarks/gpu_zoo.sh prepare``) for the zoo cases.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

import torch
from torch import nn

BATCHES = (4, 6, 3, 8, 5)


class Residual(nn.Module):
    """A ResNet bottleneck's shape: 1x1, 3x3, 1x1 convolutions with BatchNorm and a skip."""

    def __init__(self):
        super().__init__()
        self.a = nn.Conv2d(3, 16, 1)
        self.b = nn.Sequential(nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                               nn.Conv2d(16, 16, 1), nn.BatchNorm2d(16))

    def forward(self, x):
        h = self.a(x)
        return torch.relu(self.b(h) + h)


def _pieces():
    return {
        "conv_bn_relu": lambda: nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU()),
        "conv_stride2": lambda: nn.Sequential(nn.Conv2d(3, 16, 7, stride=2, padding=3), nn.ReLU()),
        "maxpool": lambda: nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.MaxPool2d(3, 2, 1)),
        "avgpool_linear": lambda: nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.AdaptiveAvgPool2d(1),
                                                nn.Flatten(), nn.Linear(16, 10)),
        "depthwise": lambda: nn.Sequential(nn.Conv2d(3, 16, 1), nn.Conv2d(16, 16, 3, padding=1, groups=16),
                                           nn.Hardswish()),
        "residual": Residual,
    }


def _zoo(name: str, batch: int, size: str):
    sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", ".bench"))
    import models
    build = {"resnet50": models.build_resnet50, "mobilenet": models.build_mobilenet_v3_large,
             "vit": models.build_vit_base, "convnext": models.build_convnext_tiny}[name]
    return build(batch, size=size, device="cuda")


def run_case(case: str, size: str) -> int:
    import ember
    dtype = torch.bfloat16
    if case in _pieces():
        model, img = _pieces()[case](), 32
    else:
        model, img = _zoo(case, 2, size).model, (224 if size == "full" else 64)
    model = model.cuda().to(dtype).eval()
    compiled = ember.compile(model, dynamic=True, options={"fallback": "error"})
    worst = 0.0
    with torch.no_grad():
        for batch in BATCHES:
            x = torch.randn(batch, 3, img, img, device="cuda", dtype=dtype)
            want = model(x).float()
            got = compiled(x).float()
            torch.cuda.synchronize()
            err = ((got - want).norm() / want.norm().clamp_min(1e-6)).item()
            worst = max(worst, err)
            print(f"{case} batch {batch}: rel L2 {err:.2e}", flush=True)
    events = compiled._ember_captured.events if hasattr(compiled, "_ember_captured") else []
    print(f"{case}: {len(events)} compile events, worst rel L2 {worst:.2e}: {'OK' if worst < 2e-2 else 'WRONG'}")
    return 0 if worst < 2e-2 else 1


def explain(names: list[str]) -> None:
    import ember
    for name in names:
        bench = _zoo(name, 8, "full")
        model = bench.model.to(torch.bfloat16).eval()
        x = bench.example_inputs[0].to(torch.bfloat16)
        started = time.perf_counter()
        with torch.no_grad():
            print(f"==== {name}\n{ember.explain(model, x)}", flush=True)
        print(f"{name}: explain took {time.perf_counter() - started:.1f} s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--cases", default="conv_bn_relu,conv_stride2,maxpool,avgpool_linear,depthwise,residual,"
                                           "resnet50,mobilenet,vit,convnext")
    parser.add_argument("--size", default="tiny", choices=["tiny", "full"])
    parser.add_argument("--out", default=os.environ.get("OUT", "/tmp/gpu_dynamic_check"))
    parser.add_argument("--explain", default=None, help="comma list of zoo models: print ember.explain")
    parser.add_argument("--_case", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args._case:
        sys.exit(run_case(args._case, args.size))
    if args.explain:
        explain(args.explain.split(","))
        return
    os.makedirs(args.out, exist_ok=True)
    env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1", EMBER_DYNAMIC_CONV_CUDA="1",
               EMBER_LOGS="graph_breaks,recompiles,dynamic,output_code")
    for case in args.cases.split(","):
        log_path = os.path.join(args.out, f"{case}.log")
        with open(log_path, "w") as log:
            started = time.perf_counter()
            code = subprocess.call([sys.executable, __file__, "--_case", case, "--size", args.size],
                                   stdout=log, stderr=subprocess.STDOUT, env=env, timeout=300)
        with open(log_path) as log:
            lines = log.read().splitlines()
        verdict = [line for line in lines if line.startswith(f"{case}:")] or \
            [line for line in lines if "Error" in line][-3:] or lines[-3:]
        print(f"{case} (exit {code}, {time.perf_counter() - started:.0f} s): " + " | ".join(verdict), flush=True)


if __name__ == "__main__":
    main()
