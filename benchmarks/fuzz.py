"""Long differential fuzzing run: random straight-line programs, ember.compile against eager.

    python benchmarks/fuzz.py --n 10000 --seed 0 [--jobs 2] [--out fuzz_failures]

Programs come from tests/fuzz/program_generator.py (seeds seed .. seed+n-1) and are checked by
tests/fuzz/check.py.  Prints the count of each outcome (ok, mismatch, compile_error, fallback,
error_mismatch, crash, timeout) and writes each failing program, reduced by statement deletion,
to --out/<status>_<seed>.py with the original program and the failure in comments.

Fallbacks of graphs with complex tensors are expected (ember runs them eagerly with one warning)
and counted as ok_complex_fallback.
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import signal
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "fuzz"))


def _timeout(signum, frame):  # noqa: ARG001
    raise TimeoutError("program took too long")


def run_seed(args: tuple[int, str, int, bool]) -> tuple[int, str, str]:
    """Check one seed (in a worker); failing programs are reduced and written to out_dir."""
    seed, out_dir, time_limit, reduce = args
    import ember
    from check import Outcome, check_program, expected_fallback
    from program_generator import generate
    from reducer import reduce_program

    program = generate(seed)
    ember.reset()
    signal.signal(signal.SIGALRM, _timeout)
    signal.alarm(time_limit)
    try:
        outcome = check_program(program)
    except TimeoutError as error:
        outcome = Outcome("timeout", str(error))
    except Exception as error:  # noqa: BLE001 (a checker crash is a finding too)
        outcome = Outcome("crash", f"{type(error).__name__}: {error}")
    finally:
        signal.alarm(0)
    status = outcome.status
    if expected_fallback(program, outcome):
        return seed, "ok_complex_fallback", ""
    if outcome.ok:
        return seed, status, ""
    reduced = program
    if reduce and status not in ("timeout", "crash"):
        signal.alarm(time_limit * 4)
        try:
            reduced = reduce_program(program, outcome)
        except Exception:  # noqa: BLE001
            reduced = program
        finally:
            signal.alarm(0)
    path = os.path.join(out_dir, f"{status}_{seed}.py")
    with open(path, "w") as f:
        f.write(f"# {status}: {outcome.detail}\n# reduced:\n{reduced}\n")
        f.write("# original:\n" + "\n".join("# " + line for line in str(program).splitlines()) + "\n")
    return seed, status, outcome.detail.splitlines()[0][:200] if outcome.detail else ""


def _init_worker() -> None:
    import torch
    torch.set_num_threads(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1000, help="number of programs")
    parser.add_argument("--seed", type=int, default=0, help="first seed")
    parser.add_argument("--jobs", type=int, default=1, help="worker processes")
    parser.add_argument("--out", default="fuzz_failures", help="directory for failing programs")
    parser.add_argument("--time-limit", type=int, default=120, help="seconds per program")
    parser.add_argument("--no-reduce", action="store_true", help="write failing programs unreduced")
    args = parser.parse_args()

    os.makedirs(args.out, exist_ok=True)
    os.environ.setdefault("EMBER_CACHE_DIR", tempfile.mkdtemp(prefix="ember-fuzz-"))
    work = [(seed, args.out, args.time_limit, not args.no_reduce) for seed in range(args.seed, args.seed + args.n)]
    counts: dict[str, int] = {}
    start = time.time()
    with multiprocessing.get_context("fork").Pool(args.jobs, initializer=_init_worker, maxtasksperchild=200) as pool:
        for done, (seed, status, detail) in enumerate(pool.imap_unordered(run_seed, work, chunksize=4), 1):
            counts[status] = counts.get(status, 0) + 1
            if not status.startswith("ok"):
                print(f"seed {seed}: {status}: {detail}", flush=True)
            if done % 500 == 0:
                print(f"[{done}/{args.n} in {time.time() - start:.0f}s] {counts}", flush=True)
    print(f"\n{args.n} programs (seeds {args.seed}..{args.seed + args.n - 1}) in {time.time() - start:.0f}s")
    for status in sorted(counts):
        print(f"  {status:22s} {counts[status]}")
    failing = sum(v for k, v in counts.items() if not k.startswith("ok"))
    print(f"failing programs written to {args.out}/ ({failing})")


if __name__ == "__main__":
    main()
