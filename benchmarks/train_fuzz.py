"""Training fuzz over a seed range, outside pytest: the random programs of
tests/fuzz/test_training_fuzz.py (outputs and gradients against eager, two calls each).

    python benchmarks/train_fuzz.py --seed 20000 --n 200 [--static]

--static compiles with static sizes and the backward built in a thread (as on CUDA); the default
is dynamic=True, as most of the CI seeds.  Prints each failure (seed, error, program) and the count
of each outcome (ok, skip: a program eager cannot differentiate or whose outputs need no grad).
"""
from __future__ import annotations

import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(ROOT, "tests", "fuzz"), os.path.join(ROOT, "tests")]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--n", type=int, default=100)
    parser.add_argument("--static", action="store_true")
    args = parser.parse_args()
    import _pytest.outcomes
    from test_training_fuzz import check_gradients

    from ember import config
    if args.static:
        config.compile_backward_early = "always"
    counts: dict[str, int] = {}
    for seed in range(args.seed, args.seed + args.n):
        try:
            check_gradients(seed, dynamic=None if args.static else True)
            status = "ok"
        except _pytest.outcomes.Skipped:
            status = "skip"
        except Exception as exc:  # noqa: BLE001 - every failure is reported, the run goes on
            status = "fail"
            print(f"seed {seed} ({'static' if args.static else 'dynamic'}): {type(exc).__name__}: {exc}", flush=True)
        counts[status] = counts.get(status, 0) + 1
    print("static" if args.static else "dynamic", f"seeds {args.seed}..{args.seed + args.n - 1}:", counts, flush=True)


if __name__ == "__main__":
    main()
