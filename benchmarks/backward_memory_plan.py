"""The planned peak memory of a compiled training backward, on the CPU.

    python benchmarks/backward_memory_plan.py [--model pointwise|nanogpt|resnet|bert_layer]
                                              [--batch 4] [--seq 128] [--dim 1024] [--dtype bfloat16]
                                              [--bench .bench] [--show]

Compiles one training step of the model (forward, then the backward graph is lowered and
scheduled, as TrainingStep.backward does) and prints the most bytes of buffers the backward makes
that are alive at once: intermediates, Extern results and the gradients it returns, following the
wrapper's ``del``s (``buffer_releases``) and the plan's storage reuse.  Its inputs (saved tensors,
tangents) are not counted.  No allocator is involved: this is the plan, the same for the C++ and
Triton backends (the scheduler is shared), so CPU runs predict the GPU's backward schedule.

Also printed: the number of kernels and Externs, the step at the peak and the activation-sized
buffers alive there.  ``--show`` prints the schedule (``describe``).

Models: ``pointwise`` is the bench zoo's (``.bench/models.py``, ``build_pointwise``: 4 blocks of
LayerNorm/GELU/bias chains/RMSNorm/softmax, d = --dim); ``nanogpt``, ``resnet`` and
``bert_layer`` are tests/models.py's small models (--batch, --seq; --dim unused).
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys
from collections import Counter

import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tests"))

import ember  # noqa: E402
from ember.backend import compile_graph  # noqa: E402
from ember.debug.memory_plan import live_bytes  # noqa: E402
from ember.graph import TensorMeta  # noqa: E402
from ember.lower.lowering import lower_graph  # noqa: E402
from ember.lower.scheduler import Schedule, describe, schedule  # noqa: E402


def build(name: str, batch: int, seq: int, dim: int, bench: str):
    """(model, inputs) for one training step."""
    if name == "pointwise":
        # the bench zoo's models.py, under another name than tests/models.py
        spec = importlib.util.spec_from_file_location("bench_models", os.path.join(bench, "models.py"))
        zoo = sys.modules["bench_models"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(zoo)
        if dim != 1024:
            torch.manual_seed(0)
            return zoo.PointwiseHeavy(dim, 4), (torch.randn(batch, seq, dim),)
        b = zoo.build_pointwise(batch, seq_len=seq, size="full", device="cpu")
        return b.model, tuple(b.example_inputs)
    import models as test_models   # tests/models.py
    if name == "nanogpt":
        return test_models.make_nanogpt(batch=batch, seq=seq)
    if name == "resnet":
        return test_models.make_resnet(batch=batch, size=seq)
    if name == "bert_layer":
        return test_models.make_bert_layer(batch=batch, seq=seq)
    raise SystemExit(f"unknown model {name}")


def backward_schedule(model: torch.nn.Module, inputs: tuple) -> Schedule:
    compiled = []

    def backend(graph, example_inputs):
        c = compile_graph(graph, example_inputs, {"fallback": "error"})
        compiled.append(c)
        return c

    fn = ember.compile(model, backend=backend, options={"fallback": "error"})
    fn(*inputs)
    step = compiled[0].call
    graph = step.backward_graph
    graph.extra["backward"] = True     # as TrainingStep.compile_backward: the scheduler's memory rules
    specs = [p.meta if isinstance(p.meta, TensorMeta) else int for p in graph.placeholders]
    return schedule(lower_graph(graph, specs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default="pointwise")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--seq", type=int, default=128, help="sequence length (resnet: image size)")
    parser.add_argument("--dim", type=int, default=1024, help="pointwise: model width")
    parser.add_argument("--dtype", default="bfloat16", help="pointwise: parameter and input dtype")
    parser.add_argument("--bench", default=os.path.join(ROOT, ".bench"))
    parser.add_argument("--show", action="store_true", help="print the schedule")
    args = parser.parse_args()
    model, inputs = build(args.model, args.batch, args.seq, args.dim, args.bench)
    if args.model == "pointwise":
        dtype = getattr(torch, args.dtype)
        model = model.to(dtype)
        inputs = tuple(t.to(dtype) for t in inputs)
    sched = backward_schedule(model, inputs)
    live, names = live_bytes(sched)
    peak = max(live)
    at = live.index(peak)
    nodes = sched.program.nodes
    biggest = max((n.numel() * n.dtype.itemsize for n in nodes.values() if hasattr(n, "numel")), default=1)
    big = Counter((tuple(nodes[n].shape), str(nodes[n].dtype).replace("torch.", ""))
                  for n in names[at] if nodes[n].numel() * nodes[n].dtype.itemsize * 4 >= biggest)
    print(f"{args.model}: backward kernels {len(sched.kernels)}, externs {len(sched.externs)}")
    print(f"planned backward peak {peak / 1e6:.2f} MB at step {at} of {len(sched.steps)} "
          f"({sum(big.values())} large buffers live: {dict(big)})")
    if args.show:
        print(describe(sched))
        print("live MB per step:", " ".join(f"{b / 1e6:.1f}" for b in live))


if __name__ == "__main__":
    main()
