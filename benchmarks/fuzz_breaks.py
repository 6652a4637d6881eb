"""Long graph-break fuzzing run: random programs of tests/fuzz/break_programs.py checked against eager.

    python benchmarks/fuzz_breaks.py --n 2000 --start 0 [--backend eager|ember|mixed] [--out fuzz_break_failures]

A parent process runs the seeds in a worker process (in-process checks, faulthandler on); when the
worker dies (a segfault from wrong bytecode, or a hang past --timeout seconds per program) the seed is
recorded as a crash and a new worker goes on with the next seed.  Every failing program is written to
OUT/seed<N>_<status>.txt with its source, inputs and the difference; a summary is printed at the end.
Statuses: wrong_result (ember returned, printed or mutated something else: the worst), ember_error
(ember raised where eager did not, or raised another error), crash, hang, generator_error (a bug of
the generator: eager raised something other than the programs' ValueError).
"""
from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "fuzz"))


def backend_for(seed: int, backend: str) -> str:
    if backend == "mixed":
        return "ember" if seed % 8 == 3 else "eager"
    return backend


def worker(args: argparse.Namespace) -> None:
    import faulthandler
    import warnings

    from break_programs import check_program, generate

    import ember
    faulthandler.enable()
    warnings.simplefilter("ignore")
    for seed in range(args.start, args.start + args.n):
        print(json.dumps({"start": seed}), flush=True)
        faulthandler.dump_traceback_later(args.timeout, exit=True)
        program = generate(seed)
        began = time.time()
        try:
            outcome = check_program(program, backend=backend_for(seed, args.backend))
            status, detail = outcome.status, outcome.detail
        except BaseException as error:  # noqa: BLE001 (the checker itself failed: report it)
            status, detail = "checker_error", f"{type(error).__name__}: {error}"
        faulthandler.cancel_dump_traceback_later()
        print(json.dumps({"seed": seed, "status": status, "detail": detail, "seconds": time.time() - began,
                          "program": str(program)}), flush=True)
        if seed % 50 == 49:
            ember.reset()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2000)
    parser.add_argument("--start", type=int, default=0)
    parser.add_argument("--backend", default="mixed", choices=["eager", "ember", "mixed"])
    parser.add_argument("--out", default=os.path.join(ROOT, "fuzz_break_failures"))
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per program before 'hang'")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    os.makedirs(args.out, exist_ok=True)
    counts: collections.Counter = collections.Counter()
    failures: list[tuple[int, str, str]] = []
    start, end = args.start, args.start + args.n
    began = time.time()
    while start < end:
        command = [sys.executable, os.path.abspath(__file__), "--worker", "--n", str(end - start), "--start",
                   str(start), "--backend", args.backend, "--timeout", str(args.timeout)]
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT)
        current = None
        for line in process.stdout:
            try:
                record = json.loads(line)
            except ValueError:
                continue   # a program's own output cannot reach here (redirected), but be safe
            if "start" in record:
                current = record["start"]
                continue
            current = None
            seed, status = record["seed"], record["status"]
            counts[status] += 1
            start = seed + 1
            if status != "ok":
                failures.append((seed, status, record["detail"].splitlines()[0][:160]))
                with open(os.path.join(args.out, f"seed{seed}_{status}.txt"), "w") as f:
                    f.write(f"{status}: {record['detail']}\n\n{record['program']}")
                print(f"seed {seed}: {status}: {record['detail'][:300]}", flush=True)
            done = sum(counts.values())
            if done % 50 == 0:
                print(f"[{done} programs, {time.time() - began:.0f}s] {dict(counts)}", flush=True)
        process.wait()
        stderr = process.stderr.read()
        if current is not None:   # the worker died inside a program
            from break_programs import generate
            status = "hang" if "Timeout" in stderr else "crash"
            counts[status] += 1
            failures.append((current, status, f"worker exit {process.returncode}"))
            with open(os.path.join(args.out, f"seed{current}_{status}.txt"), "w") as f:
                f.write(f"{status}: worker exit {process.returncode}\n{stderr[-4000:]}\n\n{generate(current)}")
            print(f"seed {current}: {status} (exit {process.returncode})", flush=True)
            start = current + 1
        elif process.returncode != 0:
            print(f"worker failed outside a program (exit {process.returncode}):\n{stderr[-2000:]}", flush=True)
            break
    print(f"\n{sum(counts.values())} programs in {time.time() - began:.0f}s: {dict(counts)}")
    for seed, status, detail in failures:
        print(f"  seed {seed}: {status}: {detail}")


if __name__ == "__main__":
    main()
