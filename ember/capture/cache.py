"""CapturedFunction: the cache of compiled entries in front of a user function.

Cache policy: entries are kept **per CapturedFunction** (one compiled object),
most recent first, at most ``cache_size_limit`` (``ember.config.cache_size_limit``
by default).  Each entry is a generated guard function, the backend's compiled
graph and a generated epilogue that rebuilds the return value and replays
Python-side mutation.  A frame that hit a graph break is cached as an *eager*
entry under the guards collected up to the break, so it is not re-captured on
every call.

Thread safety: hits read ``self.entries`` without a lock (the list is replaced, never
changed in place); a miss takes the function's lock, looks at the entries again
(another thread may have compiled them meanwhile) and captures at most once.

User errors: a frame whose capture fails runs eagerly, so eager raises its own
exception; ember's frames are cut from its traceback (EMBER_LOGS=all keeps them).
"""
from __future__ import annotations

import dataclasses
import os
import threading
import time
import traceback
import warnings
import weakref
from collections.abc import Callable
from typing import Any

import torch

from .. import config
from ..debug.logs import CHANNELS, enabled, log
from ..errors import CompileError, Unsupported
from ..graph import Graph
from ..runtime.gc_pause import full_collections_deferred
from ..symbolic import STORAGE_OFFSET, size_access
from . import breaks
from .autocast import run_without_autocast
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
    frame: str = ""            # the function (or continuation) the graph was captured from


@dataclasses.dataclass
class CacheEntry:
    guard: Callable            # guard(L, G) -> tuple of placeholder values | index of failed check
    guard_texts: list[str]
    compiled: Callable | None  # None: run the frame eagerly (graph break)
    epilogue: Callable | None  # epilogue(L, G, outputs) -> the user's return value
    guard_source: str = ""
    # device types whose autocast was on when the entry was captured (guarded): the graph holds
    # explicit casts and must run with those autocasts off, or they would cast again
    autocast_devices: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # a backend's CompiledGraph exposes its generated function: call that, one frame fewer
        self._call = getattr(self.compiled, "call", self.compiled)

    def run(self, inputs: tuple) -> Any:
        if self.autocast_devices:
            return run_without_autocast(self.autocast_devices, self._call, inputs)
        return self._call(*inputs)

    def failed_guard(self, result: int, L: dict | None = None) -> str:
        """The text of the check that failed; with the call's locals, only the part of a
        compound check (a dynamic tensor's dim, sizes, strides, offset) that is false for them."""
        if not 0 <= result < len(self.guard_texts):
            return "evaluating a guard raised an exception"
        text = self.guard_texts[result]
        if L is not None:
            for part in _conjuncts(text):
                try:
                    holds = eval(part, {"torch": torch}, {"L": L})   # noqa: S307 - our own guard text
                except Exception:  # noqa: BLE001 - a part that does not evaluate alone: the whole text
                    return text
                if not holds:
                    return part
        return text


def _conjuncts(text: str) -> list[str]:
    """``a and b and c`` split at its top-level ``and``s (not inside brackets or strings)."""
    parts, depth, quote, start, i = [], 0, None, 0, 0
    while i < len(text):
        c = text[i]
        if quote:
            quote = None if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif depth == 0 and text.startswith(" and ", i):
            parts.append(text[start:i])
            start = i = i + len(" and ")
            continue
        i += 1
    return parts + [text[start:]]


_ALL: weakref.WeakSet[CapturedFunction] = weakref.WeakSet()


class CapturedFunction:
    def __init__(self, fn: Any, backend: Callable, fullgraph: bool = False,
                 cache_size_limit: int | None = None, parent: CapturedFunction | None = None) -> None:
        self.spec = FrameSpec(fn)
        self.backend = backend
        self.fullgraph = fullgraph
        self._cache_size_limit = cache_size_limit
        self.entries: list[CacheEntry] = []   # replaced, never mutated in place (lock-free hits)
        # continuations and callees compiled at graph breaks report to, and are owned by, the
        # function the user compiled
        self.events: list[CaptureEvent] = parent.events if parent is not None else []
        self.registry = parent.registry if parent is not None else breaks.BreakRegistry(self._compile_part)
        self._warned_limit = False
        self._lock = threading.RLock()  # re-entrant: an eager run may call this function again
        self.description = ""  # a continuation: its Python form (resume.describe), for the graph_breaks log
        # dynamic shapes (options.dynamic: None = automatic, True, False); only backends that compile
        # symbolic sizes get them (``supports_dynamic``)
        options = getattr(backend, "options", None)
        self.dynamic = getattr(options, "dynamic", None)
        self.supports_dynamic = bool(getattr(backend, "supports_dynamic", False))
        # argument dims (or STORAGE_OFFSET) seen with more than one value
        self._dynamic_dims: dict[str, set[int | str]] = {}
        self._seen_shapes: dict[str, tuple[tuple[int, ...], int]] = {}   # (shape, storage offset) first seen
        self._static_only = False                        # a dynamic compile failed: static from now on
        self._warned_bind = False
        _ALL.add(self)

    def _compile_part(self, fn: Any) -> CapturedFunction:
        return CapturedFunction(fn, self.backend, False, self._cache_size_limit, parent=self)

    @property
    def cache_size_limit(self) -> int:
        return self._cache_size_limit if self._cache_size_limit is not None else config.cache_size_limit

    def reset(self) -> None:
        """Drop compiled entries and events; the next call captures again."""
        self.entries = []
        self.events.clear()
        self.registry.clear()
        self._warned_limit = False

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        try:
            result = self._call(args, kwargs)
            # a graph break's runner hands back the continuation to call: called here, not inside the
            # runner, so a loop that breaks in every iteration does not nest one frame per iteration
            while type(result) is breaks.TailCall:
                result = result.function._call(result.args, {})
            return result
        except Exception as error:
            # the user's own error (eager raised it, or the compiled code did): show the user's
            # frames, not ember's 40-120 lines of interpreter internals
            if not isinstance(error, CompileError) and not _keep_ember_frames():
                error.__traceback__ = _without_ember_frames(error.__traceback__)
            raise

    def _call(self, args: tuple, kwargs: dict) -> Any:
        """One call: guards, then the compiled entry, or a capture (a TailCall when the entry ends in a
        graph break: the rest of the frame, for ``__call__`` to run)."""
        spec = self.spec
        try:
            L = spec.bind(args, kwargs)
        except TypeError as error:
            result = spec.call_eagerly(args, kwargs)  # the same error eager raises
            self._bind_failed(error)                  # eager did not raise: ember's own failure
            return result
        G = spec.globals
        failures: list[tuple[CacheEntry, int]] = []
        for entry in self.entries:
            result = entry.guard(L, G)
            if type(result) is tuple:
                if entry.compiled is None:
                    return spec.call_eagerly(args, kwargs)
                return entry.epilogue(L, G, entry.run(result))
            failures.append((entry, result))
        return self._miss(L, args, kwargs, failures)

    def _bind_failed(self, error: TypeError) -> None:
        """Arguments eager accepts that ember's binder rejected: never silently eager."""
        message = (f"ember could not bind the arguments of {self.spec.name} ({error}); "
                   f"the call ran eagerly")
        if self.fullgraph:
            raise CompileError(message, stage="capture", hint="report this as an ember bug")
        if not self._warned_bind:
            self._warned_bind = True
            warnings.warn(f"{message}, and calls like it will run eagerly too", stacklevel=4)

    # ------------------------------------------------------------------ misses
    def _miss(self, L: dict, args: tuple, kwargs: dict, failures: list[tuple[CacheEntry, int]]) -> Any:
        with self._lock:
            entry, inputs = self._entry_compiled_meanwhile(L, failures)
            if entry is None:
                entry, inputs = self._compile_or_give_up(L, failures)
        # run outside the lock: other threads' hits and misses need not wait for this call
        if entry is None:
            return self.spec.call_eagerly(args, kwargs)
        if isinstance(entry, _EagerThenFail):
            self.spec.call_eagerly(args, kwargs)  # raises the user's error, as eager does
            raise entry.error
        return self._run_entry(entry, L, args, kwargs, inputs)

    def _entry_compiled_meanwhile(self, L: dict, failures: list) -> tuple[CacheEntry | None, tuple]:
        """An entry another thread added while this one waited for the lock, if it matches."""
        known = {id(entry) for entry, _ in failures}
        for entry in self.entries:
            if id(entry) in known:
                continue
            result = entry.guard(L, self.spec.globals)
            if type(result) is tuple:
                return entry, result
            failures.append((entry, result))
        return None, ()

    def _compile_or_give_up(self, L: dict, failures: list) -> tuple[Any, tuple]:
        reason = None
        if failures:
            entry, result = failures[0]
            reason = f"{self.spec.name}: guard failed: {entry.failed_guard(result, L)}"
            log("recompiles", reason)
        if len(self.entries) >= self.cache_size_limit:
            if not self._warned_limit:
                self._warned_limit = True
                warnings.warn(f"ember: {self.spec.name} hit the cache size limit ({self.cache_size_limit}); "
                              f"running it eagerly from now on. The guard that kept failing: "
                              f"{failures[0][0].failed_guard(failures[0][1]) if failures else '?'}",
                              stacklevel=5)
            return None, ()
        return self._capture(L, reason)

    def _run_entry(self, entry: CacheEntry, L: dict, args: tuple, kwargs: dict, inputs: tuple) -> Any:
        if entry.compiled is None:
            return self.spec.call_eagerly(args, kwargs)
        return entry.epilogue(L, self.spec.globals, entry.run(inputs))

    def _dynamic_dims_for(self, L: dict) -> dict[str, set[int | str]]:
        """The argument dims to capture as size symbols: with ``dynamic=None`` those whose size
        changed since the first capture ("automatic dynamic"), with ``dynamic=True`` all, plus
        ``ember.mark_dynamic`` and minus ``ember.mark_static`` dims."""
        if self.dynamic is False or not self.supports_dynamic or self._static_only:
            return {}
        dims: dict[str, set[int | str]] = {}
        for source, value in _argument_tensors(L):
            seen = self._seen_shapes.setdefault(source, (tuple(value.shape), value.storage_offset()))
            wanted = set(range(value.dim())) if self.dynamic is True else set(self._dynamic_dims.get(source, ()))
            if len(seen[0]) == value.dim():
                wanted |= {d for d, (before, now) in enumerate(zip(seen[0], value.shape)) if before != now}
            if seen[1] != value.storage_offset():
                wanted.add(STORAGE_OFFSET)     # ``data[i]``: the offset is a kernel argument, not a guard
            wanted |= set(getattr(value, "_ember_dynamic_dims", ()))
            wanted -= set(getattr(value, "_ember_static_dims", ()))
            if wanted:
                dims[source] = wanted
                self._dynamic_dims[source] = wanted
        return dims

    @full_collections_deferred()
    def _capture(self, L: dict, recompile_reason: str | None) -> tuple[CacheEntry | None, tuple]:
        """Capture and compile one entry (added to the cache); None: run this call eagerly."""
        dynamic_dims = self._dynamic_dims_for(L)
        if not dynamic_dims:
            return self._capture_with(L, recompile_reason, {})
        try:
            return self._capture_with(L, recompile_reason, dynamic_dims)
        except _StaticOnly as why:
            log("dynamic", f"{self.spec.name}: compiled with static sizes: {why}")
            self._static_only = True
            return self._capture_with(L, recompile_reason, {})

    def _capture_with(self, L: dict, recompile_reason: str | None, dynamic_dims: dict[str, set[int | str]]
                      ) -> tuple[CacheEntry | None, tuple]:
        started = time.perf_counter()
        session = CaptureSession(self.spec.globals)
        session.make_dynamic(dynamic_dims)
        failure: Unsupported | None = None
        try:
            result_value = capture_frame(self.spec, L, session)
            session.add_no_alias_guard()
            epilogue = session.finalize(result_value)
        except Unsupported as error:
            failure = error
        except CompileError:
            raise
        except Exception as error:  # a bug in capture: never let it change the program's result
            if self.fullgraph:
                raise CompileError(f"capture failed: {type(error).__name__}: {error}", stage="capture",
                                   source_line=session.current_line() if session else "") from error
            failure = Unsupported(f"internal capture error {type(error).__name__}: {error}",
                                  session.current_line() if session else "")
            failure.cacheable = False
        if failure is not None:  # outside the except block: an eager error must not chain to it
            stop = None
            if not self.fullgraph and getattr(failure, "cacheable", True) \
                    and not getattr(failure, "eager_may_raise", False):
                stop = breaks.break_point(session)
            if stop is not None:
                split = self._capture_until(L, stop, failure, recompile_reason, started, dynamic_dims)
                if split is not None:
                    return split
            return self._graph_break(session, failure, recompile_reason, started), ()
        return self._add_entry(session, epilogue, recompile_reason, started)

    def _capture_until(self, L: dict, stop: tuple[int, int], failure: Unsupported, recompile_reason: str | None,
                       started: float, dynamic_dims: dict[str, set[int | str]]) -> tuple[CacheEntry, tuple] | None:
        """Capture again up to the instruction that broke the graph; the entry runs the graph so far,
        that instruction natively and the rest of the frame as a compiled continuation.
        None: the frame cannot be split there (it then runs eagerly)."""
        session = CaptureSession(self.spec.globals)
        session.make_dynamic(dynamic_dims)
        session.stop_at = stop
        try:
            capture_frame(self.spec, L, session)
            return None            # did not reach the same point again
        except breaks.StopCapture as signal:
            translator = signal.translator
        except Exception:
            return None
        location = failure.source_line or ""
        try:
            frame = self.registry.frame_of(self.spec.function)
            runner = breaks.plan(session, translator, frame, self.registry, failure.reason, location)
            session.add_no_alias_guard()
        except Unsupported as error:
            log("graph_breaks", f"{self.spec.name}: cannot split the frame at {location}: {error.reason}")
            return None
        log("graph_breaks", f"{self.spec.name}: {failure.reason} at {location}\n{runner.source}\n" +
            "\n\n".join(runner.continuations))
        return self._add_entry(session, runner.function, recompile_reason, started, failure)

    def _add_entry(self, session: CaptureSession, epilogue: Callable, recompile_reason: str | None,
                   started: float, failure: Unsupported | None = None) -> tuple[CacheEntry, tuple]:
        """Compile the session's graph and put it in front of the cache."""
        graph = session.graph
        if enabled("graph"):
            log("graph", f"{self.spec.name}\n{graph}")
        autocast_devices = session.autocast.entry_enabled_devices()
        has_work = failure is None or _has_work(graph)
        if session.shape_env is not None:
            compiled = self._compile_dynamic(session, graph, autocast_devices)
        elif not has_work:
            compiled = _no_graph   # the part before a graph break computes nothing
        elif session.needs_eager_autograd():
            compiled = _eager_graph(graph, "an enable_grad() region computes tensors that require grad")
        elif session.mixes_devices():
            compiled = _eager_graph(graph, "tensors on more than one device")
        elif autocast_devices:  # the backend may run ops while compiling (autotuning, checks)
            compiled = run_without_autocast(autocast_devices, self.backend, (graph, list(session.example_inputs)))
        else:
            compiled = self.backend(graph, list(session.example_inputs))
        # after compiling: the guards include what compiling assumed about symbolic sizes
        guard_fn, guard_source = session.guards.build(session.placeholder_sources)
        texts = session.guards.texts()
        if enabled("guards"):
            log("guards", f"{self.spec.name}\n" + "\n".join(texts))
        entry = CacheEntry(guard_fn, texts, compiled, epilogue, guard_source, autocast_devices)
        self.entries = [entry] + self.entries
        self.events.append(CaptureEvent(graph if has_work else None, compiled, texts,
                                        failure.reason if failure else None,
                                        (failure.source_line or None) if failure else None,
                                        recompile_reason, time.perf_counter() - started, self.spec.name))
        return entry, tuple(session.example_inputs)

    def _compile_dynamic(self, session: CaptureSession, graph: Graph, autocast_devices: tuple) -> Any:
        """Compile a graph with size symbols; any reason it cannot be (training, a backend failure)
        is ``_StaticOnly``: the frame is then captured again with static sizes."""
        env = session.shape_env
        if session.needs_eager_autograd() or session.mixes_devices():
            raise _StaticOnly("the graph runs op by op")
        raw = getattr(self.backend, "raw_backend", self.backend)
        try:
            if autocast_devices:
                compiled = run_without_autocast(autocast_devices, raw, (graph, list(session.example_inputs)))
            else:
                compiled = raw(graph, list(session.example_inputs))
        except Exception as error:  # noqa: BLE001 - static sizes are always a correct answer
            if enabled("dynamic"):
                cause = error.__cause__ or error
                log("dynamic", "".join(traceback.format_exception(type(cause), cause, cause.__traceback__)[-12:]))
            raise _StaticOnly(f"{type(error).__name__}: {error}") from error
        if getattr(compiled, "kind", None) == "eager":
            raise _StaticOnly(getattr(compiled, "eager_reason", "the backend ran the graph eagerly"))
        for guard in env.guards:
            session.guards.add_size_relation(guard, env.sources)
        env.frozen = True     # a later size decision (a lazy compile, an allocation) raises, never goes unchecked
        if enabled("dynamic"):
            symbols = ", ".join(f"{symbol} = {size_access(source.name(), dim)}" for symbol, (source, dim)
                                in env.sources.items())
            log("dynamic", f"{self.spec.name}: sizes {symbols}; guards: " +
                ("; ".join(f"{g} ({g.reason})" for g in env.guards) or "none") +
                ("".join(f"\n  pinned {why}" for why in env.specialized)))
        return compiled

    def _graph_break(self, session: Any, error: Unsupported, recompile_reason: str | None,
                     started: float) -> CacheEntry | None:
        """Record a break; the returned eager entry (None: not cached) runs the frame natively."""
        location = error.source_line or None
        if self.fullgraph:
            failure = CompileError(f"cannot capture {self.spec.name}: {error.reason}", stage="capture",
                                   op=error.reason, source_line=error.source_line,
                                   hint=error.hint or "remove fullgraph=True to run this frame eagerly")
            if getattr(error, "eager_may_raise", False):
                return _EagerThenFail(failure)  # a user error: eager's own exception is the answer
            raise failure
        log("graph_breaks", f"{self.spec.name}: {error.reason} at {location}")
        texts: list[str] = []
        entry = None
        if session is not None and getattr(error, "cacheable", True):
            # the decision to run eagerly depends only on what was guarded before the break
            guard_fn, guard_source = session.guards.build([])
            texts = session.guards.texts()
            entry = CacheEntry(guard_fn, texts, None, None, guard_source)
            self.entries = [entry] + self.entries
        self.events.append(CaptureEvent(None, None, texts, error.reason, location, recompile_reason,
                                        time.perf_counter() - started, self.spec.name))
        return entry


@dataclasses.dataclass
class _EagerThenFail:
    """fullgraph=True and capture failed where eager may raise: run eagerly so that eager's
    exception reaches the user; if eager does not raise, the break is a CompileError."""

    error: CompileError


def _argument_tensors(L: dict, depth: int = 3) -> Any:
    """(source name, tensor) of the tensor arguments, also inside lists, tuples and dicts of them
    (a KV cache as a list of (k, v) pairs): the names capture gives their placeholders."""
    def walk(name: str, value: Any, level: int) -> Any:
        if isinstance(value, torch.Tensor):
            yield name, value
        elif level < depth and type(value) in (list, tuple) and len(value) <= 256:
            for index, item in enumerate(value):
                yield from walk(f"{name}[{index!r}]", item, level + 1)
        elif level < depth and type(value) is dict and len(value) <= 256:
            for key, item in value.items():
                if type(key) in (str, int):      # literal keys: an Enum member's repr is not Python
                    yield from walk(f"{name}[{key!r}]", item, level + 1)
    for local, value in L.items():
        yield from walk(f"L[{local!r}]", value, 0)


class _StaticOnly(Exception):
    """A capture with size symbols cannot be compiled as such: capture again with static sizes."""


def _has_work(graph: Graph) -> bool:
    return any(node.target is not torch._C._set_grad_enabled for node in graph.call_nodes())


def _no_graph(*inputs: Any) -> tuple:
    return ()


def _eager_graph(graph: Graph, reason: str) -> Callable:
    """The captured graph run op by op (autograd records it exactly as eager would)."""
    fn = graph.as_callable()
    fn.stats = {"kernel_count": 0, "extern_count": 0}
    fn.eager_reason = reason
    return fn


_EMBER_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _keep_ember_frames() -> bool:
    return all(enabled(channel) for channel in CHANNELS)  # EMBER_LOGS=all


def _without_ember_frames(tb: Any) -> Any:
    """The traceback minus frames of ember's own files and generated code (guards, epilogues)."""
    frames, last = [], None
    while tb is not None:
        last = tb
        filename = tb.tb_frame.f_code.co_filename
        if not (filename.startswith(_EMBER_DIR) or filename.startswith("<ember")):
            frames.append(tb)
        tb = tb.tb_next
    if not frames:  # raised by ember's own code: keep the innermost frame
        return last
    # relink the kept frames (tb_next is writable since Python 3.7)
    for current, following in zip(frames, frames[1:]):
        current.tb_next = following
    frames[-1].tb_next = None
    return frames[0]


def compile_function(fn: Any, *, backend: Callable, fullgraph: bool = False,
                     cache_size_limit: int | None = None) -> CapturedFunction:
    """Wrap a function, bound method or nn.Module so that calls run captured graphs."""
    return CapturedFunction(fn, backend, fullgraph, cache_size_limit)


def reset() -> None:
    """Drop every CapturedFunction's cache."""
    for captured in list(_ALL):
        captured.reset()
