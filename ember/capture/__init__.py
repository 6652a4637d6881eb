"""Capture: the bytecode-level frontend (symbolic interpretation of CPython 3.11/3.12).

    captured = compile_function(fn, backend=lambda graph, example_inputs: graph.as_callable())
    captured(*args)          # guards -> compiled graph, or capture on a miss
    captured.events          # one CaptureEvent per compile attempt (read by ember.explain)

Files: frame.py (root frame + binder), interpreter.py (bytecode), operations.py /
calls.py / builtins.py / modules.py / tensor_ops.py (meaning of operations),
session.py (graph, guards, wrapping, epilogue), guards.py, sources.py, cache.py (entries,
per-function lock, user errors), autocast.py (autocast state, guard and eager's per-op casts).
"""
from .cache import CacheEntry, CapturedFunction, CaptureEvent, compile_function, reset

__all__ = ["CacheEntry", "CaptureEvent", "CapturedFunction", "compile_function", "reset"]
