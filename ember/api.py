"""The public entry points: ``compile``, the backend registry, modes and options, ``reset``.

``ember.compile`` mirrors ``torch.compile`` so that switching is a one-word change:

    fast = ember.compile(model)                  # an nn.Module wrapper (CompiledModule)
    fast = ember.compile(fn, fullgraph=True)     # a functools.wraps wrapper
    @ember.compile                                # decorator, with or without arguments
    def f(x): ...

What goes in: a function, bound method, ``functools.partial`` or ``nn.Module``, plus
settings, validated once into a ``CompileOptions``.  What comes out: a callable whose
first call captures graphs (``ember.capture``) and hands each one to the chosen backend
(``backend(graph, example_inputs) -> compiled``).  A graph the backend cannot compile
runs eagerly with one warning (``resolve_backend``: the only place that decides it),
unless ``fullgraph=True`` or ``options={"fallback": "error"}``.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib.util
import os
import sys
import types
import warnings
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ClassVar

import torch
from torch import nn

from ember.debug import logs as _logs  # noqa: F401  (imported here: a bad EMBER_LOGS fails at import ember)
from ember.errors import CompileError
from ember.graph import Graph

Backend = Callable[[Graph, list], Callable[..., tuple]]

# None and "default" mean the same; the ember backend reads the mode from CompileOptions.mode.
VALID_MODES: tuple[str | None, ...] = (None, "default", "reduce-overhead", "max-autotune",
                                       "max-autotune-no-cudagraphs")
FALLBACKS = ("eager", "error")
CPU_BACKENDS = ("cpp", "triton")


@dataclasses.dataclass(frozen=True)
class CompileOptions:
    """Every setting of one ``ember.compile`` call, validated once here and read by the stage each
    field belongs to (docs/contracts.md section 3).

    The keys of ``compile(options={...})`` are the fields listed in ``OPTION_KEYS``; the others are
    ``compile``'s own keyword arguments.
    """

    backend: str | Callable[..., Any] = "ember"  # api: which backend compiles each captured graph
    mode: str = "default"           # runtime: "reduce-overhead" (CUDA graphs), "max-autotune" ...
    dynamic: bool | None = None     # capture and prims: symbolic sizes (None: decide)
    fullgraph: bool = False         # capture: a graph break raises; api: a compile failure raises
    fallback: str = "eager"         # api: a graph that cannot compile runs eagerly with one warning,
                                    # or "error": raises CompileError
    cpu_backend: str = "cpp"        # backend: CPU tensors through C++ or Triton's interpreter

    OPTION_KEYS: ClassVar[tuple[str, ...]] = ("fallback", "cpu_backend")

    @classmethod
    def from_compile(cls, *, backend: str | Callable[..., Any] = "ember", mode: str | None = None,
                     dynamic: bool | None = None, fullgraph: bool = False,
                     options: dict | CompileOptions | None = None) -> CompileOptions:
        """Validate ``compile``'s arguments: an unknown mode, option key or value is a ValueError
        that lists the valid ones."""
        if mode not in VALID_MODES:
            raise ValueError(f"unknown mode {mode!r}; valid modes: {', '.join(repr(m) for m in VALID_MODES)}")
        if dynamic not in (None, True, False):
            raise ValueError(f"dynamic must be None, True or False, got {dynamic!r}")
        if isinstance(options, CompileOptions):
            options = {key: getattr(options, key) for key in cls.OPTION_KEYS}
        if options is not None and not isinstance(options, dict):
            raise TypeError(f"options must be a dict, got {type(options).__name__}")
        options = dict(options or {})
        unknown = sorted(set(options) - set(cls.OPTION_KEYS), key=str)
        if unknown:
            raise ValueError(f"unknown ember.compile option(s) {', '.join(map(repr, unknown))}; valid options: "
                             f"{', '.join(cls.OPTION_KEYS)} (mode, dynamic, fullgraph and backend are "
                             f"keyword arguments of ember.compile)")
        fallback = options.get("fallback", default_fallback())
        if fallback not in FALLBACKS:
            raise ValueError(f"options['fallback'] must be one of {FALLBACKS}, got {fallback!r}")
        cpu_backend = options.get("cpu_backend", "cpp")
        if cpu_backend not in CPU_BACKENDS:
            raise ValueError(f"options['cpu_backend'] must be one of {CPU_BACKENDS}, got {cpu_backend!r}")
        return cls(backend=backend, mode="default" if mode is None else mode, dynamic=dynamic,
                   fullgraph=bool(fullgraph), fallback=fallback, cpu_backend=cpu_backend)

    @classmethod
    def from_options(cls, options: dict | CompileOptions | None) -> CompileOptions:
        """From a plain ``options`` dict (tests and scripts that call a backend directly)."""
        if isinstance(options, CompileOptions):
            return options
        options = dict(options or {})
        own = {key: options.pop(key) for key in ("mode", "dynamic", "fullgraph") if key in options}
        return cls.from_compile(**own, options=options)


def default_fallback() -> str:
    """``fallback`` when the options do not say: EMBER_FALLBACK=error makes every failure raise
    (a test suite that must see compile failures), else "eager"."""
    value = os.environ.get("EMBER_FALLBACK", "") or "eager"
    if value not in FALLBACKS:
        raise ValueError(f"EMBER_FALLBACK must be one of {FALLBACKS}, got {value!r}")
    return value

# ------------------------------------------------------------------ backends
_BACKENDS: dict[str, Callable[..., Any]] = {}

# Backends that take (graph, example_inputs, options): they get the call's CompileOptions.
# Plain registered backends take only (graph, example_inputs), as the contract says.
_BACKENDS_WITH_OPTIONS: set[str] = set()


def register_backend(name: str, fn: Backend | None = None) -> Any:
    """Register ``fn(graph, example_inputs) -> compiled`` under ``name``.

    Usable directly or as a decorator (``@register_backend("mine")``).
    """
    if fn is None:
        return lambda f: register_backend(name, f)
    if not callable(fn):
        raise TypeError(f"backend {name!r} must be callable, got {type(fn).__name__}")
    _BACKENDS[name] = fn
    _BACKENDS_WITH_OPTIONS.discard(name)
    return fn


def list_backends() -> list[str]:
    """Names accepted by ``ember.compile(..., backend=name)``."""
    return sorted(_BACKENDS)


def _eager_backend(graph: Graph, example_inputs: list) -> Callable[..., tuple]:
    """Runs the captured graph as the Python it prints as: capture only, no codegen."""
    return graph.as_callable()


def ember_backend_available() -> bool:
    """True once ember/backend.py exists (the full compiler); until then "ember" runs eagerly."""
    return importlib.util.find_spec("ember.backend") is not None


def _ember_backend(graph: Graph, example_inputs: list, options: CompileOptions | None = None
                   ) -> Callable[..., tuple]:
    """The full compiler: prims -> loop IR -> fused kernels (ember.backend.compile_graph)."""
    if not ember_backend_available():
        return _eager_backend(graph, example_inputs)
    from ember.backend import compile_graph  # imported lazily: it pulls in codegen and runtime

    return compile_graph(graph, example_inputs, options)


register_backend("eager", _eager_backend)
register_backend("ember", _ember_backend)
_BACKENDS_WITH_OPTIONS.add("ember")
# backends that compile graphs with symbolic sizes (placeholders' extra["symbolic_meta"]) and
# resolve their size_is markers into guards
_DYNAMIC_BACKENDS = {"ember"}


def mark_dynamic(tensor: torch.Tensor, dims: int | Sequence[int]) -> None:
    """Compile ``tensor``'s dims ``dims`` with symbolic sizes from its first compile on (as
    Dynamo's ``mark_dynamic``), when it is an argument of a compiled function."""
    tensor._ember_dynamic_dims = set(getattr(tensor, "_ember_dynamic_dims", ())) | set(_dims(tensor, dims))


def mark_static(tensor: torch.Tensor, dims: int | Sequence[int] | None = None) -> None:
    """Never compile these dims of ``tensor`` (all when ``dims`` is None) with symbolic sizes."""
    chosen = range(tensor.dim()) if dims is None else _dims(tensor, dims)
    tensor._ember_static_dims = set(getattr(tensor, "_ember_static_dims", ())) | set(chosen)


def _dims(tensor: torch.Tensor, dims: int | Sequence[int]) -> list[int]:
    dims = [dims] if isinstance(dims, int) else list(dims)
    for dim in dims:
        if not -tensor.dim() <= dim < tensor.dim():
            raise IndexError(f"dim {dim} is out of range for a tensor with {tensor.dim()} dims")
    return [dim % tensor.dim() for dim in dims]


def resolve_backend(backend: str | Callable[..., Any], options: CompileOptions | dict | None = None) -> Backend:
    """The two-argument backend callable that capture calls for each graph.

    Adds what every backend gets for free: the ``CompileOptions`` passed on to the
    ember backend, and the fallback policy, in this one place: a graph whose
    compilation fails runs eagerly with one warning (naming the user's line, the
    stage and the reason), unless ``fullgraph=True`` or ``fallback="error"``, which
    raise ``CompileError``.
    """
    settings = options if isinstance(options, CompileOptions) else CompileOptions.from_options(options)
    if isinstance(backend, str):
        if backend not in _BACKENDS:
            raise ValueError(f"unknown backend {backend!r}; registered backends: {list_backends()}")
        name, raw = backend, _BACKENDS[backend]
        if name in _BACKENDS_WITH_OPTIONS:
            raw = functools.partial(raw, options=settings)
    elif callable(backend):
        name, raw = getattr(backend, "__name__", type(backend).__name__), backend
    else:
        raise TypeError(f"backend must be a name or a callable, got {type(backend).__name__}")
    must_raise = settings.fullgraph or settings.fallback == "error"

    def compile_one_graph(graph: Graph, example_inputs: list) -> Callable[..., tuple]:
        try:
            return raw(graph, example_inputs)
        except Exception as exc:
            error = exc if isinstance(exc, CompileError) else CompileError(
                f"backend {name!r} failed: {type(exc).__name__}: {exc}", stage="backend",
                source_line=_first_source_line(graph))
            if must_raise:
                if error is exc:
                    raise
                raise error from exc
            message = _fallback_message(name, error, graph)
            if message not in _warned_fallbacks:      # once per line and reason (recompiles repeat them)
                _warned_fallbacks.add(message)
                _warn_at_user_line(message, error.source_line or _first_source_line(graph))
            return _eager_backend(graph, example_inputs)

    compile_one_graph.backend_name = name  # type: ignore[attr-defined]
    compile_one_graph.options = settings  # type: ignore[attr-defined]
    # dynamic shapes: a graph with size symbols goes to the raw backend (a failure recompiles with
    # static sizes instead of running eagerly), and only to backends that compile size symbols
    compile_one_graph.raw_backend = raw  # type: ignore[attr-defined]
    compile_one_graph.supports_dynamic = name in _DYNAMIC_BACKENDS  # type: ignore[attr-defined]
    return compile_one_graph


_warned_fallbacks: set[str] = set()     # fallback warnings given (ember.reset() forgets them)


class CompileFallbackWarning(UserWarning):
    """A graph ember could not compile runs eagerly (options={"fallback": "error"} raises instead)."""


def _first_source_line(graph: Graph) -> str:
    return next((n.source_line for n in graph.nodes if getattr(n, "source_line", None)), "")


def _warn_at_user_line(message: str, source_line: str) -> None:
    """Warn as if from the user's line ("file.py:12"), not from ember's frames."""
    filename, _, line = source_line.rpartition(":")
    if filename and line.isdigit():
        warnings.warn_explicit(message, CompileFallbackWarning, filename, int(line))
    else:
        warnings.warn(message, CompileFallbackWarning, stacklevel=3)


def _fallback_message(backend_name: str, error: CompileError, graph: Graph, what: str = "this graph") -> str:
    where = error.source_line or _first_source_line(graph) or "an unknown line"
    stage = error.stage or "backend"
    reason = str(error.args[0]).split("\n")[0] if error.args else type(error).__name__
    return (f"ember: {where}: cannot compile {what} (stage: {stage}, backend {backend_name!r}): {reason}; "
            f"running it eagerly (fallback). Pass options={{'fallback': 'error'}} or fullgraph=True to get "
            f"an error instead.")


# ------------------------------------------------------------------ compile
# Every CapturedFunction made by compile()/explain(), so that reset() can drop their caches too.
_live_captures: weakref.WeakSet[Any] = weakref.WeakSet()


def _capture_module() -> Any:
    """ember.capture, or a CompileError saying it is missing (it is being written)."""
    from ember import capture

    if not hasattr(capture, "compile_function"):
        raise CompileError("ember.capture.compile_function is not available in this checkout",
                           stage="capture", hint="the bytecode interpreter has not landed yet")
    return capture


def capture_function(fn: Callable[..., Any], *, backend: str | Callable[..., Any] = "ember",
                     mode: str | None = None, dynamic: bool | None = None, fullgraph: bool = False,
                     options: dict | None = None) -> Any:
    """A ``CapturedFunction`` for ``fn`` (function, bound method or nn.Module)."""
    settings = CompileOptions.from_compile(backend=backend, mode=mode, dynamic=dynamic, fullgraph=fullgraph,
                                           options=options)
    captured = _capture_module().compile_function(
        fn, backend=resolve_backend(backend, settings), fullgraph=settings.fullgraph)
    _live_captures.add(captured)
    return captured


def compile(model_or_fn: Any = None, *, backend: str | Callable[..., Any] = "ember", mode: str | None = None,
            dynamic: bool | None = None, fullgraph: bool = False, options: dict | None = None) -> Any:
    """Compile a function or nn.Module, like ``torch.compile``.

    backend   a registered name (``ember.list_backends()``) or ``fn(graph, example_inputs)``;
    mode      None/"default", "reduce-overhead" (CUDA graphs), "max-autotune",
              "max-autotune-no-cudagraphs"; the ember backend reads it from ``CompileOptions.mode``;
    dynamic   None (decide), True or False (``CompileOptions.dynamic``);
    fullgraph True: a graph break or a graph that cannot compile is a CompileError naming
              file:line and the reason;
    options   ``{"fallback": "eager" | "error", "cpu_backend": "cpp" | "triton"}`` (CompileOptions);
              unknown keys are a ValueError.
    """
    # validated now, not at the first call: a typo fails where it was written
    CompileOptions.from_compile(backend=backend, mode=mode, dynamic=dynamic, fullgraph=fullgraph, options=options)
    settings = {"backend": backend, "mode": mode, "dynamic": dynamic, "fullgraph": fullgraph, "options": options}
    if model_or_fn is None:  # @ember.compile(...) with arguments
        return lambda target: compile(target, **settings)
    if isinstance(model_or_fn, CompiledModule):
        model_or_fn = model_or_fn._orig_mod  # compiling twice compiles the original once
    elif hasattr(model_or_fn, "_ember_captured"):
        model_or_fn = model_or_fn._orig_fn
    if isinstance(model_or_fn, functools.partial):
        return _compile_partial(model_or_fn, settings)
    if isinstance(model_or_fn, nn.Module):
        return CompiledModule(model_or_fn, capture_function(model_or_fn, **settings))
    if not callable(model_or_fn):
        raise TypeError(f"ember.compile expects a function or nn.Module, got {type(model_or_fn).__name__}")
    captured = capture_function(model_or_fn, **settings)

    @functools.wraps(model_or_fn)
    def compiled_function(*args: Any, **kwargs: Any) -> Any:
        return captured(*args, **kwargs)

    compiled_function._ember_captured = captured  # type: ignore[attr-defined]
    compiled_function._orig_fn = model_or_fn  # type: ignore[attr-defined]
    return compiled_function


def _compile_partial(partial: functools.partial, settings: dict) -> Callable[..., Any]:
    """``functools.partial(f, *bound, **bound_kw)``: compile ``f`` and pass the bound arguments on
    every call, so capture sees them as ordinary arguments (tensors as inputs, the rest guarded)."""
    func = partial.func
    if isinstance(func, (types.BuiltinFunctionType, types.BuiltinMethodType)):   # partial(torch.add, ...)
        builtin = func

        def func(*args: Any, **kwargs: Any) -> Any:
            return builtin(*args, **kwargs)
    inner = compile(func, **settings)
    bound_args, bound_kwargs = partial.args, dict(partial.keywords)

    def compiled_partial(*args: Any, **kwargs: Any) -> Any:
        return inner(*bound_args, *args, **{**bound_kwargs, **kwargs})

    functools.update_wrapper(compiled_partial, partial.func, updated=())  # no __dict__ copy (a module's)
    compiled_partial._ember_captured = getattr(inner, "_ember_captured", None)  # type: ignore[attr-defined]
    compiled_partial._orig_fn = partial  # type: ignore[attr-defined]
    return compiled_partial


# ------------------------------------------------------------------ module wrapper
# Attributes that live on the wrapper itself; every other setattr goes to the original.
_WRAPPER_ATTRS = frozenset({"_orig_mod", "_ember_captured"})


class CompiledModule(nn.Module):
    """An nn.Module whose forward is the compiled ``Module.__call__`` of the original.

    It shares the original's parameter, buffer and submodule dicts, so
    ``parameters()``, ``state_dict()`` (same keys, no prefix), ``load_state_dict``,
    ``to()``, ``zero_grad()`` and gradients all act on the original module's
    tensors.  ``train()/eval()`` and ``.training`` act on the original; unknown
    attributes are read from and written to the original.  Hooks registered on
    the original run inside the compiled call (capture inlines them).
    """

    def __init__(self, module: nn.Module, captured: Any) -> None:
        super().__init__()
        object.__setattr__(self, "_orig_mod", module)
        object.__setattr__(self, "_ember_captured", captured)
        # Shared, not copied: what nn.Module's own methods walk is the original's state.
        for name in ("_parameters", "_buffers", "_non_persistent_buffers_set", "_modules"):
            object.__setattr__(self, name, getattr(module, name))

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self._ember_captured(*args, **kwargs)

    # .training is the original's (capture guards on it), never a stale copy
    @property  # type: ignore[override]
    def training(self) -> bool:
        orig = self.__dict__.get("_orig_mod")
        return orig.training if orig is not None else True

    @training.setter
    def training(self, mode: bool) -> None:
        orig = self.__dict__.get("_orig_mod")
        if orig is not None:  # nn.Module.__init__ sets training before _orig_mod exists
            orig.training = mode

    def train(self, mode: bool = True) -> CompiledModule:
        self._orig_mod.train(mode)
        return self

    def _apply(self, fn: Callable[..., Any], recurse: bool = True) -> CompiledModule:
        # to(), cuda(), half() ... run the original's own _apply (it may override it)
        self._orig_mod._apply(fn, recurse)
        return self

    def apply(self, fn: Callable[[nn.Module], None]) -> CompiledModule:
        self._orig_mod.apply(fn)
        return self

    def state_dict(self, *args: Any, **kwargs: Any) -> Any:
        return self._orig_mod.state_dict(*args, **kwargs)

    def load_state_dict(self, state_dict: Any, strict: bool = True, assign: bool = False) -> Any:
        return self._orig_mod.load_state_dict(state_dict, strict=strict, assign=assign)

    def _save_to_state_dict(self, destination: Any, prefix: str, keep_vars: bool) -> None:
        self._orig_mod._save_to_state_dict(destination, prefix, keep_vars)

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        self._orig_mod._load_from_state_dict(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name in _WRAPPER_ATTRS:
            raise AttributeError(name)
        return getattr(self._orig_mod, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _WRAPPER_ATTRS:
            object.__setattr__(self, name, value)
        else:
            setattr(self._orig_mod, name, value)

    def __delattr__(self, name: str) -> None:
        delattr(self._orig_mod, name)

    def __dir__(self) -> list[str]:
        return sorted(set(super().__dir__()) | set(dir(self._orig_mod)))

    def named_modules(self, memo: Any = None, prefix: str = "", remove_duplicate: bool = True
                      ) -> Iterator[tuple[str, nn.Module]]:
        # the original stands for itself: module names equal the original's
        return self._orig_mod.named_modules(memo, prefix, remove_duplicate)

    def __repr__(self) -> str:
        inner = repr(self._orig_mod).replace("\n", "\n  ")
        return f"CompiledModule(\n  {inner}\n)"


# ------------------------------------------------------------------ process-wide
def reset() -> None:
    """Drop every compiled entry and cache: capture's, each compiled function's, the backend's."""
    for captured in list(_live_captures):
        captured.reset()
    _warned_fallbacks.clear()
    for module_name in ("ember.capture", "ember.backend", "ember.runtime.cudagraphs"):
        module = sys.modules.get(module_name)  # a module never imported holds no cache
        reset_module = getattr(module, "reset", None)
        if callable(reset_module):
            reset_module()


def cudagraph_mark_step_begin() -> None:
    """Mark the start of a new step under mode="reduce-overhead": outputs of earlier calls are no
    longer used, so their CUDA-graph memory may be overwritten (reading one afterwards raises an
    error that says so).  Like ``torch.compiler.cudagraph_mark_step_begin``; ember also checks by
    itself what autograd still needs, so a training loop does not have to call it.
    """
    from ember.runtime import cudagraphs

    cudagraphs.mark_step_begin()
