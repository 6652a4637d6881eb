"""The disk cache never loads a file ember did not write intact: a corrupted, truncated, foreign or
unrecorded .so (or a Triton module file that is not the generated source) is rebuilt, and results
stay right.  Concurrent builds of one kernel (threads, processes) never see half a file."""
from __future__ import annotations

import concurrent.futures
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

from ember.backend import compile_graph
from ember.lower.builder import PrimGraphBuilder
from ember.runtime import cpp_build, triton_build

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

CHILD = textwrap.dedent("""
    import sys, torch
    from ember.backend import compile_graph
    from ember.lower.builder import PrimGraphBuilder
    from ember.runtime import cpp_build
    scale = float(sys.argv[1])
    b = PrimGraphBuilder()
    x = b.input("x", torch.ones(3, 5))
    graph = b.build([b.sum(b.tanh(b.mul(x, scale)), (1,))])
    xv = torch.linspace(-1, 1, 15).reshape(3, 5)
    out = compile_graph(graph, [xv])(xv)[0]
    torch.testing.assert_close(out, torch.tanh(xv * scale).sum(1))
    print("COMPILES", cpp_build.stats["compiles"], "HITS", cpp_build.stats["cache_hits"])
""")


def run_child(cache_dir, scale: float = 7.25) -> str:
    env = dict(os.environ, EMBER_CACHE_DIR=str(cache_dir))
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    result = subprocess.run([sys.executable, "-c", CHILD, str(scale)], capture_output=True, text=True, env=env,
                            cwd=ROOT, check=False)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()[-1]


def the_library(cache_dir) -> str:
    [so] = [p for p in (cache_dir / "cpp").rglob("*.so")]
    return str(so)


def corrupt(path: str) -> None:
    data = bytearray(open(path, "rb").read())
    data[:4] = b"\0BAD"                     # what made dlopen say "invalid ELF header"
    data[len(data) // 2] ^= 0xFF
    open(path, "wb").write(bytes(data))


def truncate(path: str) -> None:
    os.truncate(path, os.path.getsize(path) // 3)


def foreign(path: str, other_cache) -> None:
    run_child(other_cache, scale=-3.5)       # a valid library ember built, but for another kernel
    shutil.copyfile(the_library(other_cache), path)


def unrecorded(path: str) -> None:
    os.unlink(path + ".sha256")               # a .so without ember's record of writing it


def bad_record(path: str) -> None:
    open(path + ".sha256", "w").write("0" * 64)


@pytest.mark.parametrize("damage", [corrupt, truncate, foreign, unrecorded, bad_record],
                         ids=["corrupted", "truncated", "foreign", "no_hash", "wrong_hash"])
def test_a_damaged_cached_library_is_rebuilt(tmp_path, damage):
    cache = tmp_path / "cache"
    assert run_child(cache) == "COMPILES 1 HITS 0"
    so = the_library(cache)
    if damage is foreign:
        damage(so, tmp_path / "other")
    else:
        damage(so)
    assert not cpp_build.verified(so)
    assert run_child(cache) == "COMPILES 1 HITS 0"      # rebuilt, and the result is right (checked in the child)
    assert cpp_build.verified(so)
    assert run_child(cache) == "COMPILES 0 HITS 1"      # and reused once intact again


def test_no_temporary_files_are_left_behind(tmp_path):
    run_child(tmp_path)
    names = sorted(p.name for p in (tmp_path / "cpp").rglob("*") if p.is_file())
    assert [n.rsplit(".", 1)[-1] for n in names if not n.startswith("flags_")] == ["cpp", "so", "sha256"]


def test_concurrent_processes_build_one_kernel_safely(tmp_path):
    env = dict(os.environ, EMBER_CACHE_DIR=str(tmp_path))
    env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
    children = [subprocess.Popen([sys.executable, "-c", CHILD, "2.5"], stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT) for _ in range(4)]
    for child in children:
        out, err = child.communicate(timeout=300)
        assert child.returncode == 0, err
    assert cpp_build.verified(the_library(tmp_path))


def graph_and_inputs(scale: float):
    b = PrimGraphBuilder()
    x = b.input("x", torch.ones(4, 6))
    graph = b.build([b.exp(b.mul(x, scale))])
    return graph, torch.linspace(-1, 1, 24).reshape(4, 6)


def test_concurrent_threads_build_one_kernel_safely(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    graph, xv = graph_and_inputs(0.375)

    def compile_and_run(_):
        return compile_graph(graph, [xv])(xv)[0]

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        results = list(pool.map(compile_and_run, range(8)))
    for out in results:
        torch.testing.assert_close(out, torch.exp(xv * 0.375))
    assert cpp_build.verified(the_library(tmp_path))


@pytest.mark.parametrize("damage", ["truncated", "edited"])
def test_a_damaged_triton_module_file_is_rewritten(tmp_path, monkeypatch, damage):
    pytest.importorskip("triton")
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    graph, xv = graph_and_inputs(0.625)
    out = compile_graph(graph, [xv], {"cpu_backend": "triton"})(xv)[0]
    torch.testing.assert_close(out, torch.exp(xv * 0.625))
    [module] = list((tmp_path / "triton").rglob("*.py"))
    text = module.read_text()
    module.write_text(text[: len(text) // 2] if damage == "truncated" else text.replace("0.625", "0.5"))
    triton_build._modules.clear()            # a new process: nothing imported yet
    written = triton_build.stats["modules_written"]
    out = compile_graph(graph, [xv], {"cpu_backend": "triton"})(xv)[0]
    torch.testing.assert_close(out, torch.exp(xv * 0.625))
    assert triton_build.stats["modules_written"] == written + 1 and module.read_text() == text


def test_a_foreign_flags_file_is_not_passed_to_the_compiler(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    cpp_build.compile_flags.cache_clear()
    try:
        flags = cpp_build.compile_flags()
        [marker] = list((tmp_path / "cpp").glob("flags_*.txt"))
        marker.write_text("-o /tmp/not-ember -march=native")
        cpp_build.compile_flags.cache_clear()
        assert cpp_build.compile_flags() == flags            # probed again, rewritten
        assert marker.read_text().split() == list(flags)
    finally:
        cpp_build.compile_flags.cache_clear()


def test_triton_modules_leave_no_bytecode_cache(tmp_path, monkeypatch):
    pytest.importorskip("triton")
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    graph, xv = graph_and_inputs(0.875)
    out = compile_graph(graph, [xv], {"cpu_backend": "triton"})(xv)[0]
    torch.testing.assert_close(out, torch.exp(xv * 0.875))
    assert not list((tmp_path / "triton").rglob("*.pyc"))


def test_threads_of_one_process_build_a_kernel_once(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBER_CACHE_DIR", str(tmp_path))
    graph, xv = graph_and_inputs(1.125)
    compiles = cpp_build.stats["compiles"]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        list(pool.map(lambda _: compile_graph(graph, [xv]), range(4)))
    assert cpp_build.stats["compiles"] == compiles + 1
