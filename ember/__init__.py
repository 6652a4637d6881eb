"""ember: a just-in-time compiler for PyTorch programs.

    import ember
    fast = ember.compile(model)          # same call signature, same parameters
    print(ember.explain(model, x))       # graphs, graph breaks, kernels, guards

See README.md for usage and docs/design.md for the pipeline.
"""
from __future__ import annotations

import sys as _sys


def _in_compile_worker() -> bool:
    """A kernel-compiling worker process (runtime/worker_processes.py) needs only
    ember.runtime.triton_worker, which imports no torch: importing the rest (torch) took 6 s per
    worker on the H200 machine."""
    multiprocessing = _sys.modules.get("multiprocessing")
    if multiprocessing is None:
        return False
    from ember.runtime.worker_processes import NAME_PREFIX
    return multiprocessing.current_process().name.startswith(NAME_PREFIX)


if not _in_compile_worker():
    from ember import config
    from ember.api import (
        CompiledModule,
        compile,
        cudagraph_mark_step_begin,
        list_backends,
        mark_dynamic,
        mark_static,
        register_backend,
        reset,
    )
    from ember.debug.explain import ExplainReport, GraphBreak, explain, explain_with
    from ember.errors import CompileError
    from ember.graph import Graph

__version__ = "0.1.0"

__all__ = [
    "CompileError",
    "CompiledModule",
    "ExplainReport",
    "Graph",
    "GraphBreak",
    "compile",
    "config",
    "cudagraph_mark_step_begin",
    "explain",
    "explain_with",
    "list_backends",
    "mark_dynamic",
    "mark_static",
    "register_backend",
    "reset",
]
