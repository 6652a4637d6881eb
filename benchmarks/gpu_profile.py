"""Where does a zoo model's time go under ember vs eager?  (GPU diagnosis, not a test.)

    python benchmarks/gpu_profile.py --bench .bench --models bert_base,convnext_tiny --out $OUT

For each model (full size, bf16, inference): compile time split, then a torch.profiler
table of the top CUDA kernels for eager and for ember, and ember's generated code.
"""
from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys
import time

import torch


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bench", default=".bench")
    parser.add_argument("--models", default="bert_base")
    parser.add_argument("--out", default="/tmp/ember_profile")
    parser.add_argument("--dtype", default="bfloat16")
    args = parser.parse_args()
    sys.path.insert(0, os.path.abspath(args.bench))
    import models as zoo

    import ember
    from ember.debug import logs

    os.makedirs(args.out, exist_ok=True)
    dtype = getattr(torch, args.dtype)
    for name in args.models.split(","):
        spec = zoo.MODELS[name]
        bench = spec.build(batch_size=spec.infer_bs, seq_len=spec.seq_len or 512, size="full", device="cuda")
        model = bench.model.to(dtype).eval()
        inputs = bench.example_inputs
        cast = lambda t: t.to(dtype) if torch.is_tensor(t) and t.is_floating_point() else t  # noqa: E731
        call_args, call_kwargs = ((), {k: cast(v) for k, v in inputs.items()}) if isinstance(inputs, dict) \
            else (tuple(cast(v) for v in inputs), {})
        compiled = ember.compile(model)
        code_path = os.path.join(args.out, f"{name}_code.txt")
        with open(code_path, "w") as code_file:
            logs.set_logs("output_code,prim_graph")
            real_stderr = sys.stderr
            sys.stderr = code_file
            profiler = cProfile.Profile()
            start = time.perf_counter()
            with torch.no_grad():
                profiler.runcall(compiled, *call_args, **call_kwargs)
            torch.cuda.synchronize()
            compile_s = time.perf_counter() - start
            sys.stderr = real_stderr
            logs.set_logs("")
        print(f"==== {name}: first compiled call {compile_s:.1f} s")
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(25)
        for label, fn in (("eager", model), ("ember", compiled)):
            with torch.no_grad():
                for _ in range(3):
                    fn(*call_args, **call_kwargs)
                torch.cuda.synchronize()
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                    for _ in range(5):
                        fn(*call_args, **call_kwargs)
                    torch.cuda.synchronize()
            print(f"---- {name} {label}")
            print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=18, max_name_column_width=90))


if __name__ == "__main__":
    main()
