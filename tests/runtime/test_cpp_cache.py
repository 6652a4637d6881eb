"""The disk cache: a second process loads the .so without running g++; errors name the stage."""
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from ember.backend import compile_graph
from ember.errors import CompileError
from ember.lower.builder import PrimGraphBuilder

PROGRAM = textwrap.dedent("""
    import torch
    from ember.backend import compile_graph
    from ember.lower.builder import PrimGraphBuilder
    from ember.runtime import cpp_build
    b = PrimGraphBuilder()
    x = b.input("x", torch.ones(3, 5))
    graph = b.build([b.sum(b.tanh(b.mul(x, 7.25)), (1,))])
    out = compile_graph(graph, [torch.ones(3, 5)])(torch.ones(3, 5))[0]
    assert torch.allclose(out, torch.tanh(torch.full((3, 5), 7.25)).sum(1))
    print("COMPILES", cpp_build.stats["compiles"], "HITS", cpp_build.stats["cache_hits"])
""")


def run_child(cache_dir):
    env = dict(os.environ, EMBER_CACHE_DIR=str(cache_dir))
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + os.pathsep + env.get("PYTHONPATH", "")
    result = subprocess.run([sys.executable, "-c", PROGRAM], capture_output=True, text=True, env=env, cwd=root,
                            check=False)
    assert result.returncode == 0, result.stderr
    return result.stdout.strip().splitlines()[-1]


def test_second_process_reuses_the_shared_library(tmp_path):
    assert run_child(tmp_path) == "COMPILES 1 HITS 0"
    assert run_child(tmp_path) == "COMPILES 0 HITS 1"
    cpp_files = list(tmp_path.rglob("*.cpp"))
    assert cpp_files and "kernel0" in cpp_files[0].read_text()   # readable source beside the .so


def test_internal_failure_raises_compile_error():
    # the fallback to eager is decided by ember.api.resolve_backend (tests/test_options.py), not here
    b = PrimGraphBuilder()
    x = b.input("x", torch.ones(4, dtype=torch.complex64))
    graph = b.build([b.exp(x)])
    example = [torch.ones(4, dtype=torch.complex64)]
    with pytest.raises(CompileError, match="stage"):
        compile_graph(graph, example)
    with pytest.raises(CompileError, match="stage"):
        compile_graph(graph, example, {"fallback": "eager"})


def test_inputs_requiring_grad_compile_forward_and_backward():
    b = PrimGraphBuilder()
    x = b.input("x", torch.ones(4))
    graph = b.build([b.exp(x)])
    xv = torch.ones(4, requires_grad=True)
    fn = compile_graph(graph, [xv])
    assert fn.kind == "autograd" and fn.stats["kernel_count"] == 1
    fn(xv)[0].sum().backward()
    torch.testing.assert_close(xv.grad, torch.exp(torch.ones(4)))
