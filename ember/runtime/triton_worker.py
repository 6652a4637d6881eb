"""Compiling one generated Triton kernel: the part a compile worker process runs.

This module imports the standard library and Triton, never torch or the rest of ember: a worker
that imported ``ember.runtime.triton_build`` imported torch, which on the H200 machine took 5.6-7.6 s
per process (16 at once: the workers were up ~6 s after they were started, later than the first
kernels of a ResNet-50 or GPT-2 training step); Triton alone takes 0.2 s.  ``ember/__init__.py``
imports nothing else in a process named ``ember-worker-*`` (runtime/worker_processes.py).

    binary, note = compile_kernel(fn, KernelSpec(...), target)   # in this process (triton_build._compile)
    error = compile_in_worker(path, spec, target, key, caches)   # in a worker: fills Triton's cache
"""
from __future__ import annotations

import dataclasses
import importlib.util
import os
import sys
from typing import Any

_modules: dict[str, Any] = {}


@dataclasses.dataclass(frozen=True)
class KernelSpec:
    """What ``triton.compile`` needs of a generated kernel (plain data: it travels to workers)."""

    name: str
    signature: tuple[tuple[str, str], ...]   # argument name -> Triton type ("*fp32", "i32", ...)
    aligned: tuple[bool, ...]                 # per argument: a 16-byte aligned pointer
    num_warps: int
    looped: bool                              # a reduction with an inner loop: two pipeline stages
    checks_indices: bool = False              # device asserts of indirect indices (debug build)


def compile_kernel(fn: Any, spec: KernelSpec, target: Any, aligned: tuple[bool, ...] | None = None) -> tuple[Any, str]:
    """The compiled kernel and a note ("" or why it was built without alignment hints).
    ``aligned``: the alignment to assume instead of ``spec.aligned`` (an unaligned variant)."""
    import triton
    from triton.compiler import ASTSource
    aligned = spec.aligned if aligned is None else aligned
    attrs = {(i,): [["tt.divisibility", 16]] for i, ok in enumerate(aligned) if ok}
    options: dict[str, Any] = {"num_warps": spec.num_warps, "num_stages": 2 if spec.looped else 1}
    if spec.checks_indices:
        # tl.device_assert is compiled only with debug; debug alone would also add integer-overflow
        # checks to every add/mul (index arithmetic wraps on purpose), so those stay off
        options.update(debug=True, sanitize_overflow=False)
    signature = dict(spec.signature)
    try:
        return triton.compile(ASTSource(fn, signature, None, attrs), target=target, options=options), ""
    except Exception as exc:
        if not attrs:
            raise
        # Triton 3.6's TritonGPURemoveLayoutConversions breaks SSA dominance for some looped
        # reductions with many stores when told the pointers are 16-byte aligned (MobileNetV3's
        # hardswish + squeeze-excite mean): without the hint it builds, a little slower
        try:
            binary = triton.compile(ASTSource(fn, signature, None, {}), target=target, options=options)
        except Exception:  # noqa: BLE001 - report the first failure
            raise exc from None
        first_line = str(exc).splitlines()[0] if str(exc) else ""
        return binary, f"built without alignment hints ({type(exc).__name__}: {first_line})"


def use_cache_key(key: str | None) -> None:
    """Triton's cache key as the parent computed it: Triton hashes its ~500 MB libtriton.so for it
    once per process (1.3-1.6 s), which every worker would otherwise repeat."""
    if not key:
        return
    import triton.runtime.cache as cache
    modules = [cache] + [sys.modules[name] for name in ("triton.compiler.compiler",) if name in sys.modules]
    for module in modules:
        if getattr(module, "triton_key", None) is not None:
            module.triton_key = lambda: key


def compile_in_worker(path: str, spec: KernelSpec, target: Any, key: str | None, caches: dict[str, str]) -> str | None:
    """Compile one kernel of the generated module at ``path`` (written by the parent) into Triton's
    cache; the parent's own compile then loads it.  Returns None, or the error's text (the parent
    compiles that kernel itself and reports it).  No launcher is built here: that needs Triton's
    CUDA driver, which would give each worker a CUDA context (GPU memory) of its own."""
    os.environ.update(caches)      # the parent's caches as they are now (a harness sets them per run)
    try:
        use_cache_key(key)
        compile_kernel(getattr(_module(path), spec.name), spec, target)
    except Exception as exc:  # noqa: BLE001 - reported by the parent's own compile
        return f"{type(exc).__name__}: {exc}"
    return None


def ready() -> bool:
    """A task that only starts a worker: the process is up and Triton imported."""
    import triton  # noqa: F401
    import triton.compiler  # noqa: F401
    return "torch" not in sys.modules


def module_from_source(source: str, path: str, suffix: str = "") -> Any:
    """Run a generated module's source as the module at ``path`` (the cached file holding that source:
    Triton reads the kernels' source through inspect).  The source is compiled here, not imported:
    no __pycache__ .pyc that ember did not write."""
    name = "ember_triton_" + os.path.basename(path)[:-3] + suffix
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    exec(compile(source, path, "exec"), module.__dict__)
    return module


def _module(path: str) -> Any:
    module = _modules.get(path)
    if module is None:
        with open(path) as f:
            module = _modules[path] = module_from_source(f.read(), path)
    return module
