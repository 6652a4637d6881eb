"""Kernels with the same code: generate_triton keys them by same_code_key, computed once per
text of ``_numbered_text`` (the kernel without comments, its name and its local names).  The
text must never join kernels whose keys differ, nor change which kernels are aliased."""
import pytest

pytest.importorskip("triton")
import torch

from ember.codegen import triton as triton_codegen
from ember.codegen.triton import _numbered_text
from ember.graph import TensorMeta
from ember.lower.builder import PrimGraphBuilder
from ember.lower.lowering import lower_graph
from ember.lower.scheduler import schedule

KERNEL = """@triton.jit
def kernel3(in_add_12, out_mul_12):
    # 2 fused ops: add_12, mul_12
    XBLOCK: tl.constexpr = 512
    xindex = tl.program_id(0) * XBLOCK + tl.arange(0, XBLOCK)
    var_12_mean = tl.load(in_add_12 + (xindex))  # a trailing comment
    tl.store(out_mul_12 + (xindex), var_12_mean * 2.0)
"""


def renamed(source: str, **names: str) -> str:
    for old, new in names.items():
        source = source.replace(old, new)
    return source


def test_kernels_that_differ_in_names_and_comments_have_one_text():
    other = renamed(KERNEL, kernel3="kernel9", add_12="add_40", mul_12="mul_40", var_12="var_40",
                    **{"# a trailing comment": "# another"})
    assert _numbered_text(KERNEL) is not None
    assert _numbered_text(other) == _numbered_text(KERNEL)


def test_a_different_global_or_constant_gives_another_text():
    assert _numbered_text(renamed(KERNEL, **{"2.0": "3.0"})) != _numbered_text(KERNEL)
    assert _numbered_text(renamed(KERNEL, **{"tl.arange": "tl.zeros"})) != _numbered_text(KERNEL)


def test_no_text_where_plain_text_cannot_tell_tokens_apart():
    assert _numbered_text(KERNEL.replace("2.0", '"#2"')) is None                    # a string literal
    split = KERNEL.replace("tl.store(out_mul_12 + (xindex), ", "tl.store(out_mul_12 + (xindex),\n        ")
    assert _numbered_text(split) is None                                            # one statement, two lines
    assert _numbered_text(KERNEL.replace("out_mul_12):", "out_mul_12=None):")) is None


def test_a_keyword_before_a_colon_is_not_a_local_name():
    source = KERNEL.replace("    tl.store(", "    if xindex:\n        pass\n    else: y = 1\n    tl.store(")
    assert "else" in _numbered_text(source)


def layer(b, x, shape):
    """softmax, a pattern whose kernel repeats per layer with other names."""
    m = b.broadcast(b.amax(x, (1,)), shape, (0,))
    e = b.exp(b.sub(x, m))
    return b.div(e, b.broadcast(b.sum(e, (1,)), shape, (0,)))


def test_the_aliases_equal_those_of_same_code_key_alone(monkeypatch):
    b = PrimGraphBuilder()
    x, w = b.input("x", torch.randn(16, 16)), b.input("w", torch.randn(16, 16))
    meta = TensorMeta.of(torch.empty(16, 16))
    h = x
    for _ in range(3):
        h = b.graph.call(torch.mm, (layer(b, h, (16, 16)), w), meta=meta)
    graph = b.build([layer(b, h, (16, 16))])
    with_text, _ = triton_codegen.generate_triton(schedule(lower_graph(graph)), interpret=False)
    monkeypatch.setattr(triton_codegen, "_code_key", lambda kernel, keys: triton_codegen.same_code_key(kernel))
    keyed_alone, _ = triton_codegen.generate_triton(schedule(lower_graph(graph)), interpret=False)
    assert with_text == keyed_alone
    assert with_text.count("# the same code as kernel0") == 3
