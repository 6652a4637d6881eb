"""Capture: the bytecode-level frontend (symbolic interpretation of CPython 3.11/3.12).

    captured = compile_function(fn, backend=lambda graph, example_inputs: graph.as_callable())
    captured(*args)          # guards -> compiled graph, or capture on a miss
    captured.events          # one CaptureEvent per compile attempt (read by ember.explain)

Files, by layer (``IMPORT_LAYERS`` below, lowest first): sources.py, values.py,
guards.py (where values come from, the Value classes, guard sets); autocast.py,
tensor_ops.py (torch semantics); objects.py, modules.py, numpy_*.py (what Python
objects, nn.Modules and NumPy arrays mean); session.py (graph, guards, wrapping,
epilogue); operations.py, builtins.py, inline.py, calls.py (dispatch: operations on
Values, builtins, argument binding, and ``calls.call``, the one module that knows
every kind of callee); breaks.py, resume.py, interpreter.py (graph breaks and the
bytecode loop); frame.py (root frame + binder), cache.py (entries, per-function
lock, user errors).
"""
from .cache import CacheEntry, CapturedFunction, CaptureEvent, compile_function, reset

# Import order, lowest first.  A module imports, at top level only (never inside a function),
# modules on lower lines or earlier on its own line (tests/capture/test_import_order.py checks it).
# The modules below calls.py run Python code through the translator they are handed
# (``tx.call``, ``tx.inline_code``), never by importing calls.py or interpreter.py.
IMPORT_LAYERS = (
    "sources resume",                         # sources of values; continuation bytecode
    "values guards",                          # Value classes; guard sets
    "autocast tensor_ops",                    # torch semantics: autocast state, recording torch ops
    "objects modules numpy_values numpy_ops numpy_shapes numpy_functions",  # Python objects, nn.Module, NumPy
    "session",                                # one capture: graph, guards, wrapping, epilogue
    "operations builtins inline calls",       # dispatch: operations on Values, builtins, binding, call()
    "breaks interpreter",                     # graph breaks; the bytecode interpreter
    "frame cache",                            # the root frame; cache entries and compile_function
)

__all__ = ["CacheEntry", "CaptureEvent", "CapturedFunction", "IMPORT_LAYERS", "compile_function", "reset"]
