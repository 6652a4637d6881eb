"""OpInfo coverage: every OpInfo op with an ember decomposition, float32 and bfloat16, on three paths:

  prims-reference  to_primitives + the prims' eager reference implementations (tests/prims/test_opinfo.py)
  cpp              the full compiler, C++ kernels (tests/codegen/test_opinfo_backend.py)
  triton           the full compiler, Triton kernels; on a CPU-only machine in Triton's interpreter
                   (tests/codegen/test_opinfo_triton.py)

Prints, per path, ops / (op, dtype) cases / samples run, passed, xfailed (with the tests' reasons) and
failed, then each failing sample.  Same comparison as the tests (tests/opinfo_batch.py): torch.testing
tolerances, or no worse than eager against a float64 reference.

    python benchmarks/opinfo_coverage.py [--samples 4] [--paths prims-reference,cpp,triton]
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=4, help="samples per (op, dtype)")
    parser.add_argument("--paths", default="prims-reference,cpp,triton")
    parser.add_argument("--ops-per-batch", type=int, default=16)
    args = parser.parse_args()

    import torch
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")      # before triton is first imported
    os.environ.setdefault("EMBER_CACHE_DIR", tempfile.mkdtemp(prefix="ember-opinfo-"))
    sys.path[:0] = [os.path.join(ROOT, "tests"), os.path.join(ROOT, "tests", "prims")]
    import opinfo_batch
    import opinfo_util

    opinfos = opinfo_util.decomposed_opinfos()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    paths = {
        "prims-reference": ("tests/prims/test_opinfo.py", {}, _prims_reference_compile, "cpu"),
        "cpp": ("tests/codegen/test_opinfo_backend.py", {}, None, "cpu"),
        "triton": ("tests/codegen/test_opinfo_triton.py", {"cpu_backend": "triton"}, None, device),
    }
    for name in args.paths.split(","):
        test_file, options, compile_fn, path_device = paths[name]
        known, uncheckable = _known_failures(test_file)
        known_failure = lambda op, dtype, known=known: known.get((op, dtype)) or known.get((op, None))
        run = opinfo_batch.BatchedRun(opinfos, args.samples, args.ops_per_batch, options,
                                      skip=lambda op, dtype, u=uncheckable: op in u, device=path_device,
                                      compile_fn=compile_fn)
        cases = [(info, dtype) for info, _ in opinfos for dtype in (torch.float32, torch.bfloat16)
                 if dtype in info.supported_dtypes(path_device)]
        start = time.perf_counter()
        for info, dtype in cases:
            if opinfo_batch.op_id(info) not in uncheckable:
                run.failures(info, dtype)
        seconds = time.perf_counter() - start
        print(f"{name:16s} {opinfo_batch.summarize(run, cases, known_failure, uncheckable)}  [{seconds:.0f} s]")
        for (op, dtype), failures in sorted(run._failures.items(), key=lambda kv: kv[0][0]):
            tag = "xfail" if known_failure(op, dtype) else "FAIL"
            for key, why in failures.items():
                print(f"    {tag} {key}: {why[:160]}")
        sys.stdout.flush()


def _prims_reference_compile(graph, example_inputs, options):
    """A 'compiler' that runs the prim graph with the prims' reference implementations."""
    from harness import run_with_contract

    from ember.prims import to_primitives
    prim_graph = to_primitives(graph)
    return lambda *inputs: run_with_contract(prim_graph, list(inputs))


def _known_failures(test_file: str) -> tuple[dict, dict]:
    """KNOWN_FAILURES and UNCHECKABLE of a test module, read without running pytest."""
    path = os.path.join(ROOT, test_file)
    spec = importlib.util.spec_from_file_location(f"_coverage_{os.path.basename(path)[:-3]}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    known = getattr(module, "KNOWN_FAILURES", {})
    uncheckable = sys.modules["opinfo_batch"].UNCHECKABLE if hasattr(module, "SUITE") else None
    if uncheckable is None:   # the prims test lists them among its known failures
        uncheckable = {op: why for (op, dtype), why in known.items() if "uninitialized" in why}
    return known, uncheckable


if __name__ == "__main__":
    main()
