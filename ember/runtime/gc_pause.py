"""Full garbage collections deferred while ember compiles.

A compile makes hundreds of thousands of long-lived objects (graph nodes, index expressions,
loop IR) while the heap grows, and CPython's default third threshold (10) has the collector walk
that whole heap again and again: 12-15% of a training step's Python-side compile (capture to
Triton source, this CPU).  For the duration of a compile the threshold of full (generation 2)
collections is raised; generations 0 and 1 keep collecting, and garbage without cycles is still
freed by reference counting the moment it dies.  The full collection comes soon after the
compile: its counter is then past the restored threshold.  Reentrant (the backward compiles
inside a training step's call, a graph break's continuation inside its frame's) and shared by
threads: the outermost compile restores the threshold.  (PyTorch's Dynamo does the same.)
"""
from __future__ import annotations

import contextlib
import gc
import threading
from collections.abc import Iterator

DEFERRED_THRESHOLD = 1_000_000      # generation 1 collections between full ones while compiling

_lock = threading.Lock()
_depth = 0
_restore_to: int | None = None


@contextlib.contextmanager
def full_collections_deferred() -> Iterator[None]:
    global _depth, _restore_to
    with _lock:
        if _depth == 0:
            first, second, third = gc.get_threshold()
            if third < DEFERRED_THRESHOLD:
                _restore_to = third
                gc.set_threshold(first, second, DEFERRED_THRESHOLD)
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _restore_to is not None:
                first, second, third = gc.get_threshold()
                if third == DEFERRED_THRESHOLD:     # unless the program set its own meanwhile
                    gc.set_threshold(first, second, _restore_to)
                _restore_to = None
