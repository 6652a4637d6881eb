"""GPU kernels compile in worker processes first (runtime/triton_build._precompile_in_processes):
the workers fill Triton's cache, so the compiles in this process load from it.  Checked on the CPU
by compiling for an H100 (sm_90), which Triton can do without one."""
from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("triton")

from ember import config  # noqa: E402
from ember.codegen import triton as triton_codegen  # noqa: E402
from ember.lower.builder import PrimGraphBuilder  # noqa: E402
from ember.lower.lowering import lower_graph  # noqa: E402
from ember.lower.scheduler import schedule  # noqa: E402
from ember.runtime import triton_build  # noqa: E402


def _sm90():
    from triton.backends.compiler import GPUTarget
    return GPUTarget("cuda", 90, 32)


def _kernels():
    b = PrimGraphBuilder()
    x = b.input("x", torch.randn(8, 32))
    y = b.input("y", torch.randn(8, 32))
    # a row reduction and a column reduction: two kernels
    graph = b.build([b.amax(b.exp(b.add(x, y)), (1,)), b.sum(b.tanh(x), (0,))])
    sched = schedule(lower_graph(graph, [torch.randn(8, 32), torch.randn(8, 32)]))
    return triton_codegen.generate_triton(sched, interpret=False)


def _cubins(cache_dir: str) -> list[str]:
    return [name for _, _, files in os.walk(cache_dir) for name in files if name.endswith(".cubin")]


def test_workers_fill_tritons_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path / "ember"))
    monkeypatch.setattr(config, "compile_processes", 2)
    monkeypatch.setattr(triton_build, "PROCESS_MIN_KERNELS", 2)
    source, kernels = _kernels()
    assert len(kernels) >= 2
    try:
        triton_build._precompile_in_processes(source, kernels, _sm90())
    finally:
        if triton_build._process_pool is not None:
            triton_build._process_pool.shutdown()
            triton_build._process_pool = None
    if config.compile_processes == 0:
        pytest.skip("no worker processes here")
    built = _cubins(str(tmp_path / "triton"))
    if not built:
        pytest.skip("this Triton cannot compile for sm_90 without a GPU")
    assert sorted(built) == sorted(f"{k.name}.cubin" for k in kernels)
    # the compile here finds them: no new cubin written
    module = triton_build.load_module(source, interpret=False)
    for kernel in kernels:
        triton_build._compile(getattr(module, kernel.name), kernel, kernel.aligned, _sm90())
    assert len(_cubins(str(tmp_path / "triton"))) == len(built)


def test_a_kernel_the_compiler_rejects_with_alignment_hints_is_built_without_them(tmp_path, monkeypatch):
    """Triton 3.6 fails (``PassManager::run failed``, TritonGPURemoveLayoutConversions) on some
    looped reductions with many stores when its pointer arguments are declared 16-byte aligned;
    the same kernel without the hints builds.  Simulated here: a compiler that rejects any hint."""
    import triton
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton"))
    source, kernels = _kernels()
    kernel = kernels[0]
    assert any(kernel.aligned)
    module = triton_build.load_module(source, interpret=False)
    real_compile, calls = triton.compile, []

    def picky_compile(src, target=None, options=None):
        calls.append(dict(src.attrs))
        if src.attrs:
            raise RuntimeError("PassManager::run failed")
        return real_compile(src, target=target, options=options)
    monkeypatch.setattr(triton, "compile", picky_compile)
    try:
        triton_build._compile(getattr(module, kernel.name), kernel, kernel.aligned, _sm90())
    except triton_build.CompileError as error:
        if "PassManager" in str(error):
            raise
        pytest.skip("this Triton cannot compile for sm_90 without a GPU")
    assert len(calls) == 2 and calls[0] and not calls[1]


def test_tritons_cache_key_is_hashed_in_the_background(monkeypatch):
    """Triton hashes its ~500 MB libtriton.so for the key of every compile (once per process):
    start_compile_workers has a thread do it while the graph is lowered."""
    from triton.runtime.cache import triton_key
    monkeypatch.setattr(config, "compile_processes", 0)
    monkeypatch.setattr(triton_build, "_key_warming", None)
    triton_key.cache_clear()
    triton_build.start_compile_workers()
    thread = triton_build._key_warming
    assert thread is not None and thread.daemon
    triton_build.start_compile_workers()            # one thread per process
    assert triton_build._key_warming is thread
    thread.join(60)
    assert triton_key.cache_info().currsize == 1    # the first compile finds it


def test_workers_import_triton_but_not_torch(monkeypatch):
    """A worker imports ember.runtime.triton_worker, whose package init skips the rest of ember in
    a process named ember-worker-*: importing torch took each worker 6 s on the H200 machine."""
    monkeypatch.setattr(config, "compile_processes", 2)
    monkeypatch.setattr(triton_build, "_process_pool", None)
    try:
        pool = triton_build._compile_workers()
        assert pool.submit(triton_build.triton_worker.ready).result(120) is True
    finally:
        if triton_build._process_pool is not None:
            triton_build._process_pool.shutdown()
            triton_build._process_pool = None


def test_workers_take_the_parents_cache_key(monkeypatch):
    import triton.runtime.cache as cache
    monkeypatch.setattr(cache, "triton_key", cache.triton_key)      # restored after the test
    triton_build.triton_worker.use_cache_key("parent-key")
    assert cache.triton_key() == "parent-key"
