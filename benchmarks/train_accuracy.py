"""Training steps compiled by ember vs eager: loss and every parameter gradient over AdamW steps,
peak memory with and without recomputation, step time.

    python benchmarks/train_accuracy.py --device cuda --steps 3 [--models mlp,nanogpt,resnet,bert_layer]

Models are the test zoo's (tests/models.py: an MLP, a nanoGPT stack, a ResNet-style CNN with
BatchNorm in train mode, a BERT layer), fp32.  Each model is trained for ``--steps`` AdamW steps
by eager and by ember from the same weights; after each step the loss, every gradient and every
parameter and buffer are compared (max |a - b| / max |b|, with a floor of 1% of the largest
gradient for gradients that are zero in exact arithmetic).  Peak memory (CUDA) is measured for
eager, ember, and ember with EMBER_RECOMPUTE=0 (every value the backward reads is saved).
Prints one JSON line per model and writes them to ``--out`` if given.
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

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from models import MODEL_MAKERS  # noqa: E402

import ember  # noqa: E402
from ember import config  # noqa: E402


def relative(a: torch.Tensor, b: torch.Tensor, floor: float = 0.0) -> float:
    return ((a.double() - b.double()).abs().max() / max(b.abs().max().item(), floor, 1e-12)).item()


def train(model: torch.nn.Module, inputs: tuple, steps: int, device: str) -> tuple[list, list, list]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses, grads, states = [], [], []
    for _ in range(steps):
        optimizer.zero_grad(set_to_none=True)
        out = model(*inputs).float()
        projection = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(device)
        loss = (out * projection).sum()
        loss.backward()
        losses.append(loss.detach())
        grads.append([p.grad.detach().clone() if p.grad is not None else None for p in model.parameters()])
        optimizer.step()
        states.append([t.detach().clone() for t in model.state_dict().values()])
    return losses, grads, states


def peak_memory(model: torch.nn.Module, inputs: tuple, device: str, compile_it: bool, recompute: bool) -> float:
    if device != "cuda":
        return float("nan")
    config.recompute = recompute
    try:
        model = copy.deepcopy(model)
        runner = ember.compile(model) if compile_it else model
        for _ in range(2):      # the first call compiles; measure the second
            model.zero_grad(set_to_none=True)
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            runner(*inputs).float().sum().backward()
            torch.cuda.synchronize()
        return (torch.cuda.max_memory_allocated() - base) / 2**20
    finally:
        config.recompute = True


def step_time(runner, model, inputs, device: str, iterations: int = 20) -> float:
    def once():
        model.zero_grad(set_to_none=True)
        runner(*inputs).float().sum().backward()
    for _ in range(3):
        once()
    samples = []
    for _ in range(iterations):
        if device == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        once()
        if device == "cuda":
            torch.cuda.synchronize()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples) * 1e3


def run_model(name: str, device: str, steps: int) -> dict:
    model, inputs = MODEL_MAKERS[name]()
    model = model.to(device)
    inputs = tuple(x.to(device) for x in inputs)
    eager_model, ember_model = copy.deepcopy(model), copy.deepcopy(model)
    compiled = ember.compile(ember_model, options={"fallback": "error"})
    eager = train(eager_model, inputs, steps, device)
    start = time.perf_counter()
    ours = train(compiled, inputs, steps, device)
    first_steps_s = time.perf_counter() - start
    kinds = [getattr(e.compiled, "kind", "?") for e in compiled._ember_captured.events]
    loss_error = max(relative(a, b) for a, b in zip(ours[0], eager[0]))
    grad_error = 0.0
    for step_ours, step_eager in zip(ours[1], eager[1]):
        scale = max(g.abs().max().item() for g in step_eager if g is not None)
        for a, b in zip(step_ours, step_eager):
            if (a is None) != (b is None):
                grad_error = float("inf")
            elif a is not None:
                grad_error = max(grad_error, relative(a, b, 1e-2 * scale))
    # absolute: AdamW turns a gradient that is rounding noise in both (BERT's key bias) into a
    # step of +-lr, so parameters may differ by up to steps * lr there; the gradients are compared above
    state_error = max((a.double() - b.double()).abs().max().item() if a.is_floating_point()
                      else float(not torch.equal(a, b)) for s_o, s_e in zip(ours[2], eager[2]) for a, b in zip(s_o, s_e))
    result = {
        "model": name, "device": device, "steps": steps, "kinds": kinds,
        "loss_rel_err": loss_error, "grad_rel_err": grad_error, "state_abs_err": state_error,
        "first_steps_s": round(first_steps_s, 2),
        "eager_step_ms": round(step_time(model, model, inputs, device), 3),
        "ember_step_ms": round(step_time(compiled, ember_model, inputs, device), 3),
        "peak_mb_eager": round(peak_memory(model, inputs, device, False, True), 2),
        "peak_mb_ember": round(peak_memory(model, inputs, device, True, True), 2),
        "peak_mb_ember_no_recompute": round(peak_memory(model, inputs, device, True, False), 2),
    }
    result["speedup"] = round(result["eager_step_ms"] / result["ember_step_ms"], 3)
    result["ok"] = kinds == ["autograd"] and max(loss_error, grad_error) < 1e-4 and state_error <= 2 * steps * 1e-3
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--models", default=",".join(MODEL_MAKERS))
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    lines = []
    for name in args.models.split(","):
        try:
            result = run_model(name, args.device, args.steps)
        except Exception as exc:  # noqa: BLE001 - report and go on with the next model
            result = {"model": name, "device": args.device, "ok": False, "error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(result), flush=True)
        lines.append(result)
    if args.out:
        with open(args.out, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in lines)


if __name__ == "__main__":
    main()
