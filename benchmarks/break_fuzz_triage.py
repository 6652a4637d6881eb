"""Triage a wrong_result of benchmarks/fuzz_breaks.py: is one compiled graph wrong, or did float
rounding grow through the program?  (A diagnosis, not a test.)

    python benchmarks/break_fuzz_triage.py SEED [SEED ...]

Runs the seed's program under ember with a backend that compiles each graph as the ember backend
does and also runs the graph op by op (``graph.as_callable()``) on clones of the same inputs.
Prints every graph output whose relative difference exceeds 1e-4, with the largest magnitude of
each input: a difference on identical inputs is a compiler bug, unless the inputs are so large that
one ulp changes the result (``sin`` of 1e6).  Nothing printed: each graph matched; the program's
difference came from rounding that its control flow or arithmetic amplified.
"""
from __future__ import annotations

import contextlib
import io
import os
import sys
import warnings

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests", "fuzz"))


def triage(seed: int) -> None:
    from break_programs import generate

    import ember
    from ember.backend import compile_graph
    program = generate(seed)
    graphs: list = []

    def backend(graph, example_inputs):
        compiled = compile_graph(graph, example_inputs)
        reference = graph.as_callable()
        index = len(graphs)
        graphs.append(graph)

        def call(*args):
            clones = [a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args]
            with torch.no_grad():
                expected = reference(*clones)
            got = compiled(*args)
            for i, (e, g) in enumerate(zip(expected, got)):
                if isinstance(e, torch.Tensor) and e.is_floating_point():
                    scale = e.double().abs().clamp(min=1)
                    worst = ((e.double() - g.detach().double()).abs() / scale).max().item()
                    if worst > 1e-4:
                        sizes = [float(t.abs().max()) for t in clones if isinstance(t, torch.Tensor) and t.numel()]
                        print(f"seed {seed}: graph {index} output {i}: relative difference {worst:.3g}; "
                              f"largest input magnitudes {sizes}\n{graph}", file=sys.stderr)
            return got
        return call
    compiled = ember.compile(program.namespace()["program"], backend=backend)
    for call_spec in program.calls:
        with contextlib.redirect_stdout(io.StringIO()):
            compiled(*call_spec.make(program.requires_grad))
    print(f"seed {seed}: {len(graphs)} graphs checked")


if __name__ == "__main__":
    warnings.simplefilter("ignore")
    for argument in sys.argv[1:]:
        triage(int(argument))
