"""A/B of ember variants on zoo training steps, by GPU kernel time as well as step time.
(GPU diagnosis, not a test.)

    python benchmarks/gpu_train_ab.py --bench .bench --models vit_base_patch16_224,bert_base \\
        --variants 'base=;refine=EMBER_PARTITION_REFINE=all' --rounds 2 --out $OUT

A variant ``eager=EMBER_AB_EAGER=1`` times the uncompiled model the same way.

Each (round, variant, model) runs in a fresh process with the variant's environment; rounds
alternate the variants' order, because on these machines whatever runs first is slower.  Per run:
the step's median time over ``--steps`` CUDA-event-timed steps, the GPU time per step (the sum of
kernel times torch.profiler records over 5 steps, which host noise does not reach), the step's peak
memory and the compile time.  Writes ``ab.jsonl`` and ``ab.md`` (medians over rounds) under --out.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

import torch


def child(name: str, steps: int) -> dict:
    from zoo_train_setup import zoo_training

    import ember

    model, bench, call_args, call_kwargs = zoo_training(name)
    # a variant with EMBER_AB_EAGER=1 runs the model eagerly: eager's step time and peak, same method
    compiled = model if os.environ.get("EMBER_AB_EAGER") == "1" else ember.compile(model)

    def step() -> None:
        model.zero_grad(set_to_none=True)
        bench.loss_fn(compiled(*call_args, **call_kwargs)).backward()

    start = time.perf_counter()
    step()
    torch.cuda.synchronize()
    compile_s = time.perf_counter() - start
    for _ in range(5):
        step()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    peak_mb = (torch.cuda.max_memory_allocated() - base) / 2**20
    times = []
    for _ in range(steps):
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        step()
        end.record()
        torch.cuda.synchronize()
        times.append(begin.elapsed_time(end))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(5):
            step()
        torch.cuda.synchronize()
    gpu_us = sum(e.self_device_time_total for e in prof.key_averages())
    return {"model": name, "compile_s": round(compile_s, 2), "step_ms": round(statistics.median(times), 3),
            "step_p10_ms": round(sorted(times)[len(times) // 10], 3), "gpu_ms": round(gpu_us / 5 / 1e3, 3),
            "peak_mb": round(peak_mb)}


def parse_variants(text: str) -> list[tuple[str, dict[str, str]]]:
    variants = []
    for part in text.split(";"):
        label, _, assignments = part.partition("=")
        env = dict(a.split("=", 1) for a in assignments.split(",") if a)
        variants.append((label.strip(), env))
    return variants


def summarize(rows: list[dict], labels: list[str]) -> str:
    models = list(dict.fromkeys(r["model"] for r in rows))
    lines = ["| model | " + " | ".join(f"{v} step ms | {v} GPU ms | {v} peak MB" for v in labels) + " |",
             "| --- |" + " --- | --- | --- |" * len(labels)]
    for m in models:
        cells = []
        for v in labels:
            mine = [r for r in rows if r["model"] == m and r["variant"] == v and "step_ms" in r]
            if not mine:
                cells += ["fail", "-", "-"]
                continue
            cells += [f"{statistics.median(r[k] for r in mine):.2f}" for k in ("step_ms", "gpu_ms")]
            cells.append(f"{max(r['peak_mb'] for r in mine)}")
        lines.append(f"| {m} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bench", default=".bench")
    parser.add_argument("--models", default="vit_base_patch16_224")
    parser.add_argument("--variants", default="base=")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--out", default="/tmp/ember_train_ab")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.path.insert(0, os.path.abspath(args.bench))
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    if args.child:
        print("AB_RESULT " + json.dumps(child(args.child, args.steps)), flush=True)
        return
    os.makedirs(args.out, exist_ok=True)
    variants = parse_variants(args.variants)
    rows = []
    with open(os.path.join(args.out, "ab.jsonl"), "w") as log:
        for round_ in range(args.rounds):
            for label, env in (variants if round_ % 2 == 0 else variants[::-1]):
                for model in args.models.split(","):
                    proc = subprocess.run(
                        [sys.executable, __file__, "--bench", args.bench, "--steps", str(args.steps), "--child", model],
                        env={**os.environ, **env}, capture_output=True, text=True)
                    found = [l for l in proc.stdout.splitlines() if l.startswith("AB_RESULT ")]
                    row = json.loads(found[-1][len("AB_RESULT "):]) if found else {
                        "model": model, "error": (proc.stderr or proc.stdout)[-2000:]}
                    row.update(variant=label, round=round_)
                    rows.append(row)
                    log.write(json.dumps(row) + "\n")
                    log.flush()
                    print(json.dumps(row)[:300], flush=True)
    table = summarize(rows, [label for label, _ in variants])
    with open(os.path.join(args.out, "ab.md"), "w") as f:
        f.write(table + "\n")
    print(table)


if __name__ == "__main__":
    main()
