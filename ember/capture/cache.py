"""CapturedFunction: the cache of compiled entries in front of a user function.

Cache policy: entries are kept **per CapturedFunction** (one compiled object),
most recent first, at most ``cache_size_limit`` (``ember.config.cache_size_limit``
by default).  Each entry is a generated guard function, the backend's compiled
graph and a generated epilogue that rebuilds the return value and replays
Python-side mutation.  A frame that hit a graph break is cached as an *eager*
entry under the guards collected up to the break, so it is not re-captured on
every call.
"""
from __future__ import annotations

import dataclasses
import time
import warnings
import weakref
from collections.abc import Callable
from typing import Any

from .. import config
from ..debug.logs import enabled, log
from ..errors import CompileError, Unsupported
from ..graph import Graph
from .frame import FrameSpec, capture_frame
from .session import CaptureSession


@dataclasses.dataclass
class CaptureEvent:
    """One compile attempt, as ``ember.explain`` reads it."""

    graph: Graph | None
    compiled: Any
    guards: list[str]
    break_reason: str | None = None
    break_location: str | None = None
    recompile_reason: str | None = None
    capture_seconds: float = 0.0


@dataclasses.dataclass
class CacheEntry:
    guard: Callable            # guard(L, G) -> tuple of placeholder values | index of failed check
    guard_texts: list[str]
    compiled: Callable | None  # None: run the frame eagerly (graph break)
    epilogue: Callable | None  # epilogue(L, G, outputs) -> the user's return value
    guard_source: str = ""

    def failed_guard(self, result: int) -> str:
        if 0 <= result < len(self.guard_texts):
            return self.guard_texts[result]
        return "evaluating a guard raised an exception"


_ALL: weakref.WeakSet[CapturedFunction] = weakref.WeakSet()


class CapturedFunction:
    def __init__(self, fn: Any, backend: Callable, fullgraph: bool = False,
                 cache_size_limit: int | None = None) -> None:
        self.spec = FrameSpec(fn)
        self.backend = backend
        self.fullgraph = fullgraph
        self._cache_size_limit = cache_size_limit
        self.entries: list[CacheEntry] = []
        self.events: list[CaptureEvent] = []
        self._warned_limit = False
        _ALL.add(self)

    @property
    def cache_size_limit(self) -> int:
        return self._cache_size_limit if self._cache_size_limit is not None else config.cache_size_limit

    def reset(self) -> None:
        """Drop compiled entries and events; the next call captures again."""
        self.entries.clear()
        self.events.clear()
        self._warned_limit = False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        spec = self.spec
        try:
            L = spec.bind(args, kwargs)
        except TypeError:
            return spec.call_eagerly(args, kwargs)  # the same error eager raises
        G = spec.globals
        failures: list[tuple[CacheEntry, int]] = []
        for entry in self.entries:
            result = entry.guard(L, G)
            if type(result) is tuple:
                if entry.compiled is None:
                    return spec.call_eagerly(args, kwargs)
                return entry.epilogue(L, G, entry.compiled(*result))
            failures.append((entry, result))
        return self._miss(L, args, kwargs, failures)

    # ------------------------------------------------------------------ misses
    def _miss(self, L: dict, args: tuple, kwargs: dict, failures: list[tuple[CacheEntry, int]]) -> Any:
        reason = None
        if failures:
            entry, result = failures[0]
            reason = f"{self.spec.name}: guard failed: {entry.failed_guard(result)}"
            log("recompiles", reason)
        if len(self.entries) >= self.cache_size_limit:
            if not self._warned_limit:
                self._warned_limit = True
                warnings.warn(f"ember: {self.spec.name} hit the cache size limit ({self.cache_size_limit}); "
                              f"running it eagerly from now on. The guard that kept failing: "
                              f"{failures[0][0].failed_guard(failures[0][1]) if failures else '?'}", stacklevel=3)
            return self.spec.call_eagerly(args, kwargs)
        return self._capture_and_run(L, args, kwargs, reason)

    def _capture_and_run(self, L: dict, args: tuple, kwargs: dict, recompile_reason: str | None) -> Any:
        started = time.perf_counter()
        session = CaptureSession(self.spec.globals)
        try:
            result_value = capture_frame(self.spec, L, session)
            session.add_no_alias_guard()
            epilogue = session.finalize(result_value)
        except Unsupported as error:
            return self._graph_break(session, error, args, kwargs, recompile_reason, started)
        except CompileError:
            raise
        except Exception as error:  # a bug in capture: never let it change the program's result
            if self.fullgraph:
                raise CompileError(f"capture failed: {type(error).__name__}: {error}", stage="capture",
                                   source_line=session.current_line() if session else "") from error
            wrapped = Unsupported(f"internal capture error {type(error).__name__}: {error}",
                                  session.current_line() if session else "")
            return self._graph_break(session, wrapped, args, kwargs, recompile_reason, started, cache=False)

        graph = session.graph
        guard_fn, guard_source = session.guards.build(session.placeholder_sources)
        texts = session.guards.texts()
        if enabled("graph"):
            log("graph", f"{self.spec.name}\n{graph}")
        if enabled("guards"):
            log("guards", f"{self.spec.name}\n" + "\n".join(texts))
        compiled = self.backend(graph, list(session.example_inputs))
        entry = CacheEntry(guard_fn, texts, compiled, epilogue, guard_source)
        self.entries.insert(0, entry)
        self.events.append(CaptureEvent(graph, compiled, texts, recompile_reason=recompile_reason,
                                        capture_seconds=time.perf_counter() - started))
        outputs = compiled(*session.example_inputs)
        return epilogue(L, self.spec.globals, outputs)

    def _graph_break(self, session: Any, error: Unsupported, args: tuple, kwargs: dict,
                     recompile_reason: str | None, started: float, cache: bool = True) -> Any:
        location = error.source_line or None
        if self.fullgraph:
            raise CompileError(f"cannot capture {self.spec.name}: {error.reason}", stage="capture",
                               op=error.reason, source_line=error.source_line,
                               hint=error.hint or "remove fullgraph=True to run this frame eagerly")
        log("graph_breaks", f"{self.spec.name}: {error.reason} at {location}")
        texts: list[str] = []
        if session is not None and cache:
            # the decision to run eagerly depends only on what was guarded before the break
            guard_fn, guard_source = session.guards.build([])
            texts = session.guards.texts()
            self.entries.insert(0, CacheEntry(guard_fn, texts, None, None, guard_source))
        self.events.append(CaptureEvent(None, None, texts, error.reason, location, recompile_reason,
                                        time.perf_counter() - started))
        return self.spec.call_eagerly(args, kwargs)


def compile_function(fn: Any, *, backend: Callable, fullgraph: bool = False,
                     cache_size_limit: int | None = None) -> CapturedFunction:
    """Wrap a function, bound method or nn.Module so that calls run captured graphs."""
    return CapturedFunction(fn, backend, fullgraph, cache_size_limit)


def reset() -> None:
    """Drop every CapturedFunction's cache."""
    for captured in list(_ALL):
        captured.reset()
