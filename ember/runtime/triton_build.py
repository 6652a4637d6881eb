"""Build, cache and launch generated Triton kernels.

    launchers = build(module_source, kernels)      # name -> (launch(*tensors), buffer names)

* The generated module is written to ``<kernel_cache_dir>/triton/<hash>.py``
  (keyed by sha256 of the source and the Triton version) and imported from
  there, so a person can read exactly what runs and a warm process reuses it.
  A cached file is imported only if it holds exactly the source (else rewritten,
  atomically: never a half-written or foreign module).
* On a GPU every kernel is compiled ahead of the first call with
  ``triton.compile`` in a thread pool (ptxas and LLVM run outside the GIL);
  Triton's own disk cache (``TRITON_CACHE_DIR``) keeps the binaries, so a warm
  process only loads them.
* The launcher bypasses Triton's Python dispatch (argument specialization,
  cache lookup, grid evaluation): grid, function handle and metadata are bound
  once, and a call is one call into Triton's C launcher on the current stream.
  Pointers are specialized as 16-byte aligned (what lets Triton emit 128-bit
  loads); inputs are checked at run time and a misaligned one takes a variant
  compiled without that assumption.
* CPU tensors (CI), or any tensors under ``TRITON_INTERPRET=1``, run through
  Triton's interpreter with ``kernel[grid](*args)``.  The mode is decided per
  compile, never by when ``triton`` happened to be imported: the module is loaded
  once per mode, its kernels wrapped in ``InterpretedFunction`` and ``libm``
  bound to the numpy namespace, and while an interpreted kernel runs, calls of
  Triton's own ``@jit`` helpers (``tl.sum``, ``tl.rand``, ...) that were decorated
  without the interpreter are interpreted too (``interpreter_scope``).  Nothing
  here sets ``TRITON_INTERPRET``, so other code in the process never sees it.
"""
from __future__ import annotations

import concurrent.futures
import hashlib
import inspect
import os
import tempfile
import threading
import time
from collections.abc import Callable
from typing import Any

from ember import config
from ember.debug.logs import log
from ember.errors import CompileError
from ember.runtime import triton_worker

# statistics for benchmarks and tests
stats = {"kernels_compiled": 0, "compile_seconds": 0.0, "modules_written": 0, "module_cache_hits": 0}

_modules: dict[str, Any] = {}
_lock = threading.Lock()


def interpreted() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _triton_version() -> str:
    import triton
    return triton.__version__


def module_path(source: str) -> str:
    key = hashlib.sha256(f"{source}\0{_triton_version()}".encode()).hexdigest()
    return os.path.join(config.kernel_cache_dir(), "triton", key[:2], f"kernels_{key[:24]}.py")


def load_module(source: str, interpret: bool | None = None) -> Any:
    """Write the source into the kernel cache (once) and import it (once per mode)."""
    if interpret is None:
        interpret = interpreted()
    path = module_path(source)
    key = f"{path}:interpret" if interpret else path
    with _lock:
        if key in _modules:
            return _modules[key]
        _write_module(source, path)
        module = triton_worker.module_from_source(source, path, "_interp" if interpret else "")
        if interpret:
            _to_interpreted(module)
        _modules[key] = module
        return module


def _write_module(source: str, path: str) -> None:
    """The source at ``path`` in the kernel cache, written unless it holds exactly that already."""
    if _holds(path, source):
        stats["module_cache_hits"] += 1
        return
    # missing, or not what ember wrote (truncated, edited): rewrite
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".tmp", dir=os.path.dirname(path))
    with os.fdopen(fd, "w") as f:
        f.write(source)
    os.replace(tmp, path)          # concurrent processes never see half a file
    stats["modules_written"] += 1


def _holds(path: str, source: str) -> bool:
    """Does the cached module file hold exactly this source?  (We have the source in hand, so the
    check is a comparison, not a hash.)"""
    try:
        with open(path) as f:
            return f.read() == source
    except (OSError, UnicodeDecodeError):
        return False


def _to_interpreted(module: Any) -> None:
    """Kernels and helpers of a loaded module as interpreter functions, libm as numpy."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    from ember.runtime import triton_math
    for attr, value in list(vars(module).items()):
        if isinstance(value, JITFunction):
            setattr(module, attr, InterpretedFunction(value.fn))
    module.libm = triton_math.numpy_libm()
    # device_assert is a no-op in the interpreter (no debug option): raise eager's CPU exception
    module._ember_check_index = _interpreted_check_index
    module._ember_check_index_masked = _interpreted_check_index


def _interpreted_check_index(index: Any, size: Any, code: Any, reported: Any, mask: Any = None) -> Any:
    """The interpreter's ``_ember_check_index``: raise eager's exception for the first bad index."""
    import numpy as np

    def data(value: Any) -> Any:
        value = getattr(value, "value", value)           # tl.constexpr
        handle = getattr(value, "handle", None)
        return np.asarray(handle.data if handle is not None else value)
    size_value, code_value = int(data(size)), int(data(code))
    values, written = np.broadcast_arrays(data(index), data(reported))
    bad = (values < 0) | (values >= size_value)
    if mask is not None:
        bad, in_block = np.broadcast_arrays(bad, data(mask).astype(bool))
        bad = bad & in_block
        written = np.broadcast_to(written, bad.shape)
    if bad.any():
        from ember.lower.lower_indexing import index_error
        error = index_error(int(written[bad].flat[0]), size_value, code_value)
        error.ember_index_error = True                     # found again under the interpreter's wrapping
        raise error
    return index


_scope_lock = threading.RLock()
_scope_depth = 0
_saved_jit_call: list[Any] = []


class interpreter_scope:
    """While an interpreted kernel runs: Triton's library ``@jit`` functions (tl.sum, tl.rand ...)
    decorated when TRITON_INTERPRET was unset are called through the interpreter.

    Outside the interpreter a JITFunction call always raises, so the patch only turns that
    error into the interpreted call; it is removed again when the outermost scope exits."""

    def __enter__(self) -> None:
        global _scope_depth
        _scope_lock.acquire()
        if _scope_depth == 0:
            from triton.runtime.jit import JITFunction
            _saved_jit_call[:] = [JITFunction.__dict__.get("__call__")]
            JITFunction.__call__ = _interpret_jit_call
            _saved_language[:] = _snapshot_language()
        _scope_depth += 1

    def __exit__(self, *exc: object) -> None:
        global _scope_depth
        try:
            _scope_depth -= 1
            if _scope_depth == 0:
                from triton.runtime.jit import JITFunction
                saved = _saved_jit_call.pop()
                if saved is not None:
                    JITFunction.__call__ = saved
                else:
                    del JITFunction.__call__
                _restore_language(_saved_language)
        finally:
            _scope_lock.release()


_saved_language: list[tuple[Any, dict]] = []


def _language_namespaces() -> list[Any]:
    import triton.language as tl
    return [tl, tl.core, tl.math, tl.standard, tl.core.tensor, tl.core.dtype,
            getattr(tl.core, "tensor_descriptor_base", tl.core.tensor)]


def _snapshot_language() -> list[tuple[Any, dict]]:
    return [(namespace, dict(vars(namespace))) for namespace in _language_namespaces()]


def _restore_language(snapshot: list[tuple[Any, dict]]) -> None:
    """Undo the interpreter's patches of triton.language.  Triton 3.6 patches the language
    namespaces for every device-function call (``InterpretedFunction.__call__``) and never
    restores them, after which kernels compiled for the GPU in this process fail to build."""
    for namespace, saved in snapshot:
        current = vars(namespace)     # names the interpreter added stay: its rewritten functions use them
        for name, value in saved.items():
            if current.get(name, _MISSING) is not value:
                setattr(namespace, name, value)


_MISSING = object()
_interpreted_jit: dict[int, tuple[Any, Any]] = {}


def _interpret_jit_call(self: Any, *args: Any, **kwargs: Any) -> Any:
    entry = _interpreted_jit.get(id(self))
    if entry is None or entry[0] is not self:
        from triton.runtime.interpreter import InterpretedFunction
        entry = _interpreted_jit[id(self)] = (self, InterpretedFunction(self.fn))
    return entry[1](*args, **kwargs)


def build(source: str, kernels: list, buffer_kinds: dict[str, str],
          interpret: bool | None = None) -> dict[str, tuple[Callable, list[str]]]:
    """Launchers for every kernel of a generated module (compiled in parallel on a GPU).

    ``interpret``: run in Triton's interpreter (default: whether TRITON_INTERPRET is set)."""
    if interpret is None:
        interpret = interpreted()
    module = load_module(source, interpret)
    if interpret:
        return {k.name: (_interpreter_launcher(getattr(module, k.name), k), k.arguments) for k in kernels}
    start = time.perf_counter()
    workers = max(1, min(len(kernels), os.cpu_count() or 1, 16))
    # aliases of one function (kernels with the same code) share one binary
    distinct = {}
    for kernel in kernels:
        distinct.setdefault((id(getattr(module, kernel.name)), tuple(kernel.aligned)), kernel)
    _precompile_in_processes(source, list(distinct.values()))
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        binaries = dict(zip(distinct, pool.map(lambda k: _warm_launcher(_compile(getattr(module, k.name), k, k.aligned)),
                                               distinct.values())))
    stats["compile_seconds"] += time.perf_counter() - start
    stats["kernels_compiled"] += len(distinct)
    launchers = {}
    for kernel in kernels:
        binary = binaries[(id(getattr(module, kernel.name)), tuple(kernel.aligned))]
        checked = [i for i, (name, ok) in enumerate(zip(kernel.arguments, kernel.aligned))
                   if ok and buffer_kinds.get(name) in ("input", "extern")]
        fallback = _LazyUnaligned(getattr(module, kernel.name), kernel)
        launchers[kernel.name] = (_fast_launcher(binary, kernel, checked, fallback), kernel.arguments)
    return launchers


def _interpreter_launcher(fn: Any, kernel: Any) -> Callable:
    runner = fn[kernel.grid]
    grid_of = _grid_function(kernel)

    def launch(*args: Any) -> None:
        with interpreter_scope():
            try:
                (runner if grid_of is None else fn[grid_of(*args)])(*args)
            except Exception as exc:
                raise _index_error_inside(exc) or exc   # eager's IndexError, not InterpreterError
    launch.takes_tensors = True
    launch.scalar_arguments = frozenset(getattr(kernel, "scalars", ()))
    launch.size_arguments = tuple(getattr(kernel, "size_args", ()))
    launch.kernel = kernel
    return launch


def _grid_function(kernel: Any) -> Callable[..., tuple[int, int, int]] | None:
    """Dynamic shapes: the grid from the launch arguments (pointers, then the size symbols)."""
    if getattr(kernel, "grid_code", None) is None:
        return None
    names = ", ".join([f"_pointer{i}" for i in range(len(kernel.arguments))] + list(kernel.size_args))
    scope: dict[str, Any] = {}
    exec(f"def grid({names}):\n    return ({kernel.grid_code}, 1, 1)\n", scope)  # noqa: S102
    return scope["grid"]


def _index_error_inside(error: BaseException | None) -> BaseException | None:
    while error is not None:
        if getattr(error, "ember_index_error", False):
            return error.with_traceback(None)
        error = error.__cause__ or error.__context__
    return None


def kernel_spec(kernel: Any) -> triton_worker.KernelSpec:
    return triton_worker.KernelSpec(kernel.name, tuple(kernel.signature.items()), tuple(kernel.aligned),
                                    kernel.config.num_warps, kernel.config.kind == "looped",
                                    bool(getattr(kernel, "checks_indices", False)))


def _compile(fn: Any, kernel: Any, aligned: list[bool], target: Any = None) -> Any:
    """``target``: a ``triton.backends.compiler.GPUTarget``; default the current device.  Tests name
    one to check that kernels build for a GPU on a machine without one."""
    import triton
    target = target or triton.runtime.driver.active.get_current_target()
    try:
        binary, note = triton_worker.compile_kernel(fn, kernel_spec(kernel), target, tuple(aligned))
    except Exception as exc:
        raise CompileError(f"Triton failed to compile {kernel.name}: {type(exc).__name__}: {exc}",
                           stage="runtime", op=kernel.name) from exc
    if note:
        log("output_code", f"{kernel.name}: {note}")
    return binary


_process_pool: Any = None
PROCESS_MIN_KERNELS = 4       # fewer compile about as fast in threads as workers start (~0.3 s)


def _compile_workers() -> Any:
    """The compile worker processes (spawned: each imports torch, seconds; never the user's
    script: runtime/worker_processes.py), or None."""
    global _process_pool
    if config.compile_processes <= 1:
        return None
    with _lock:
        if _process_pool is None:
            from ember.runtime.worker_processes import process_pool
            _process_pool = process_pool(config.compile_processes)
    return _process_pool


def start_compile_workers() -> None:
    """Start the workers in the background when a large CUDA graph starts compiling, so that they
    are up by the time its kernels are generated (its capture and lowering take seconds)."""
    _warm_triton_key_in_background()
    try:
        pool = _compile_workers()
        if pool is not None:
            for _ in range(config.compile_processes):
                pool.submit(triton_worker.ready)
    except Exception:  # noqa: BLE001 - no worker processes here: threads only
        config.compile_processes = 0


_key_warming: threading.Thread | None = None


def _warm_triton_key_in_background() -> None:
    """Triton's cache key hashes its ~500 MB libtriton.so once per process (``triton_key``,
    lru_cached; 1.3-1.6 s) at the first ``triton.compile``: hashed in a thread while the graph is
    lowered instead.  ``import triton`` here first, so that the thread imports nothing (every
    package its walk imports comes with triton): no import runs concurrently with the main
    thread's.  File reads and sha256 release the GIL; the key is the same whoever computes it."""
    global _key_warming
    with _lock:
        if _key_warming is not None:
            return
        try:
            import triton  # noqa: F401
        except Exception:  # noqa: BLE001 - an optimization only
            return
        _key_warming = threading.Thread(target=_warm_triton_key, name="ember-triton-key", daemon=True)
        _key_warming.start()


def _warm_triton_key() -> None:
    try:
        from triton.runtime.cache import triton_key
        triton_key()
    except Exception:  # noqa: BLE001 - an optimization only: the first compile computes it
        pass


def _precompile_in_processes(source: str, kernels: list, target: Any = None) -> None:
    """Compile the kernels in worker processes first: Triton's front end holds the GIL, so the
    threads below compiled one kernel at a time (ViT's training step: 97 kernels, 15 s).  The
    workers fill Triton's cache; the compiles here then load from it.  Best effort: a worker that
    fails leaves its kernel to be compiled (and its error raised) here."""
    if len(kernels) < PROCESS_MIN_KERNELS:
        return
    caches = {k: os.environ[k] for k in ("TRITON_CACHE_DIR", "EMBER_CACHE_DIR") if k in os.environ}
    try:
        pool = _compile_workers()
        if pool is None:
            return
        if target is None:
            import triton
            target = triton.runtime.driver.active.get_current_target()
        path, key = module_path(source), _cache_key()
        with _lock:
            _write_module(source, path)
        futures = [pool.submit(triton_worker.compile_in_worker, path, kernel_spec(kernel), target, key, caches)
                   for kernel in kernels]
        concurrent.futures.wait(futures)
    except Exception:  # noqa: BLE001 - no worker processes here (a sandbox, a broken pool): threads only
        config.compile_processes = 0


def _cache_key() -> str | None:
    """Triton's cache key, hashed here once (in the background since the graph began compiling):
    the workers take it instead of hashing libtriton.so each (triton_worker.use_cache_key)."""
    thread = _key_warming
    if thread is not None:
        thread.join()
    try:
        from triton.runtime.cache import triton_key
        return triton_key()
    except Exception:  # noqa: BLE001 - the workers hash it themselves
        return None


def _warm_launcher(binary: Any) -> Any:
    """Build the kernel's host launcher now, in the pool: Triton compiles one C stub per kernel
    signature with gcc on first launch, one after another in the main thread (12 s of ViT's cold
    training compile).  Best effort: the first launch builds it otherwise."""
    try:
        import triton
        triton.runtime.driver.active.launcher_cls(binary.src, binary.metadata)
    except Exception:  # noqa: BLE001 - an optimization only
        pass
    return binary


class _LazyUnaligned:
    """The same kernel compiled without the 16-byte alignment assumption (built on first need)."""

    def __init__(self, fn: Any, kernel: Any):
        self.fn, self.kernel, self.launch = fn, kernel, None

    def __call__(self, *tensors: Any) -> None:
        if self.launch is None:
            binary = _compile(self.fn, self.kernel, [False] * len(self.kernel.arguments))
            self.launch = _fast_launcher(binary, self.kernel, [], None)
        self.launch(*tensors)


def _current_stream_getter() -> Callable[[int], int]:
    import torch
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:
        return raw
    return lambda index: torch.cuda.current_stream(index).cuda_stream


def _c_launch(launcher: Any) -> Callable | None:
    """Triton's C launch function, to call without its Python ``__call__`` (two scratch-buffer
    checks and a closure per launch: about 10 of 22 us per launch on an H100 host, 4 ms of a
    ResNet-50 training step's 426 launches).  Only for the ``__call__`` whose body is known
    (Triton 3.6: ``(self, gridX, gridY, gridZ, stream, function, *args)`` passing
    ``cooperative, pdl, global_scratch, profile_scratch`` before ``args``) and kernels without
    scratch memory; otherwise None (the launcher's own ``__call__``)."""
    call = getattr(type(launcher), "__call__", None)
    code = getattr(call, "__code__", None)
    if code is None or code.co_varnames[:6] != ("self", "gridX", "gridY", "gridZ", "stream", "function") or \
            code.co_argcount != 6 or not code.co_flags & inspect.CO_VARARGS:
        return None
    if getattr(launcher, "global_scratch_size", 1) or getattr(launcher, "profile_scratch_size", 1) or \
            not hasattr(launcher, "launch_cooperative_grid") or not hasattr(launcher, "launch_pdl"):
        return None
    return getattr(launcher, "launch", None)


def _hook_or_none(hook: Any) -> Any:
    """Triton's launch hook, or None when it is an empty chain (``knobs.HookChain``): the C
    launcher calls any hook that is not None, an empty chain too (two Python calls per launch,
    860 of them in a ResNet-50 training step).  A hook installed after this kernel was built is
    not called for it."""
    return None if isinstance(getattr(hook, "calls", None), list) and not hook.calls else hook


def _fast_launcher(binary: Any, kernel: Any, checked: list[int], fallback: Callable | None) -> Callable:
    """``launch(*tensors)``: one call into Triton's C launcher with everything static pre-bound."""
    import torch
    grid = kernel.grid
    binary[grid]                               # loads the module onto the current device (_init_handles)
    device = torch.cuda.current_device()
    params = [f"a{i}" for i in range(len(kernel.arguments))] + list(getattr(kernel, "size_args", ()))
    args = ", ".join(params)
    if getattr(kernel, "grid_code", None) is not None:     # dynamic shapes: the grid from the sizes
        grid = (kernel.grid_code, 1, 1)
    lines = [f"def launch({args}):"]
    if checked and fallback is not None:
        test = " or ".join(f"a{i} & 15" for i in checked)
        lines.append(f"    if {test}:")
        lines.append(f"        return fallback({args})")
    c_launch = _c_launch(binary.run)
    if os.environ.get("EMBER_TRITON_SLOW_LAUNCH"):
        lines.append(f"    runner({args})")
    elif c_launch is not None:
        lines.append(f"    c_launch({grid[0]}, {grid[1]}, {grid[2]}, get_stream({device}), function, "
                     f"cooperative, pdl, None, None, metadata, None, enter_hook, exit_hook, {args})")
    else:
        lines.append(f"    run({grid[0]}, {grid[1]}, {grid[2]}, get_stream({device}), function, metadata, "
                     f"None, enter_hook, exit_hook, {args})")
    try:
        from triton import knobs
        enter_hook, exit_hook = _hook_or_none(knobs.runtime.launch_enter_hook), \
            _hook_or_none(knobs.runtime.launch_exit_hook)
    except (ImportError, AttributeError):
        enter_hook = exit_hook = None
    scope = {"run": binary.run, "function": binary.function, "metadata": binary.packed_metadata,
             "c_launch": c_launch, "cooperative": getattr(binary.run, "launch_cooperative_grid", None),
             "pdl": getattr(binary.run, "launch_pdl", None),
             "get_stream": _current_stream_getter(), "fallback": fallback, "runner": binary[kernel.grid],
             "enter_hook": enter_hook, "exit_hook": exit_hook}
    exec(compile("\n".join(lines) + "\n", f"<ember launcher {kernel.name}>", "exec"), scope)
    launch = scope["launch"]
    # pointers as ints (``t.data_ptr()`` in the wrapper): Triton's C launcher reads an int as it is,
    # where for a tensor it calls data_ptr() and cuPointerGetAttribute (0.2-0.5 us a launch on an
    # H200 host, benchmarks/gpu_launch_args.py); capture keeps every kernel operand on the device
    launch.takes_tensors = True
    launch.takes_pointers = True
    launch.scalar_arguments = frozenset(getattr(kernel, "scalars", ()))   # passed as Python numbers
    launch.size_arguments = tuple(getattr(kernel, "size_args", ()))
    launch.kernel = kernel
    launch.binary = binary
    return launch
