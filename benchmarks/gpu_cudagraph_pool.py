"""reduce-overhead's shared memory pool on the GPU: memory and correctness, shared against one
pool per recording (not a test).

    python3 benchmarks/gpu_cudagraph_pool.py --bench .bench [--models nanogpt,gpt2] [--steps 8]

Per zoo model (bf16, ``run.py --mode train`` sizes) and per variant (``cudagraphs.SHARE_POOL``
True / False), in this one process: eager's step and then ember reduce-overhead's step, each
``--steps`` times (zero_grad with set_to_none, forward, the zoo's loss, backward), from the same
weights.  Printed: the loss of every step and the largest parameter-gradient difference of the
last against eager's, the calls recorded / replayed / plain, and memory: the most bytes allocated
and reserved during the ember steps (torch.cuda max_memory_allocated / max_memory_reserved, after
``empty_cache``), against eager's.
"""
from __future__ import annotations

import argparse
import copy
import gc
import os
import sys

import torch

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..")
sys.path.insert(0, ROOT)

import ember  # noqa: E402
from ember.runtime import cudagraphs  # noqa: E402

MB = 2 ** 20


def call_model(call, inputs):
    return call(**inputs) if isinstance(inputs, dict) else call(*inputs)     # as the harness calls


def run_steps(model, call, loss_fn, inputs, steps):
    losses = []
    for _ in range(steps):
        model.zero_grad(set_to_none=True)
        out = call_model(call, inputs)
        loss = loss_fn(out)
        loss.backward()
        losses.append(loss.item())
        del out, loss
    torch.cuda.synchronize()
    return losses


def fresh_memory():
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bench", default=".bench")
    parser.add_argument("--models", default="nanogpt")
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    sys.path.insert(0, os.path.abspath(args.bench))
    import models as zoo
    import run as harness   # the harness's own input casting and calling convention

    for name in args.models.split(","):
        spec = zoo.MODELS[name]
        torch.manual_seed(0)
        bench = spec.build(batch_size=spec.train_bs, seq_len=spec.seq_len, size="full", device="cuda")
        base = bench.model.to(device="cuda", dtype=torch.bfloat16).train()
        inputs = harness.cast_inputs(bench.example_inputs, "cuda", torch.bfloat16)
        fresh_memory()
        eager_losses = run_steps(base, base, bench.loss_fn, inputs, args.steps)
        eager_grads = [p.grad.float() for p in base.parameters() if p.grad is not None]
        print(f"{name} eager: peak allocated {torch.cuda.max_memory_allocated() / MB:.0f} MB, "
              f"reserved {torch.cuda.max_memory_reserved() / MB:.0f} MB, losses {[round(v, 4) for v in eager_losses]}",
              flush=True)
        for shared in (True, False):
            cudagraphs.SHARE_POOL = shared
            model = copy.deepcopy(base)
            ember.reset()
            fresh_memory()
            compiled = ember.compile(model, mode="reduce-overhead")
            losses = run_steps(model, compiled, bench.loss_fn, inputs, args.steps)
            grads = [p.grad.float() for p in model.parameters() if p.grad is not None]
            worst = max(((g - e).abs().max() / e.abs().max().clamp_min(1e-6)).item()
                        for g, e in zip(grads, eager_grads))
            print(f"{name} ember-ro {'shared pool' if shared else 'pool per recording'}: "
                  f"peak allocated {torch.cuda.max_memory_allocated() / MB:.0f} MB, "
                  f"reserved {torch.cuda.max_memory_reserved() / MB:.0f} MB, {dict(cudagraphs.counters)}, "
                  f"losses {[round(v, 4) for v in losses]}, worst relative gradient difference {worst:.3g}",
                  flush=True)
            del compiled, model, grads
        del base, bench, inputs, eager_grads
        ember.reset()
        fresh_memory()


if __name__ == "__main__":
    main()
