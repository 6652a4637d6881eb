"""Out-of-range indices raise as in eager, never a clamped or wrapped silent answer.

Every indexing op x (C++ kernels, Triton's interpreter) x (in range with a negative index, out of
range positive, out of range negative): the compiled function raises the exception type eager
raises, or returns eager's values.  One compiled function serves all the cases of an op (the check
runs in the kernel, per call, never baked in at compile time)."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import ember

BACKENDS = {"cpp": {"fallback": "error"}, "triton": {"fallback": "error", "cpu_backend": "triton"}}


def table():
    return torch.randn(10, 3)


def vector():
    return torch.randn(10)


def matrix():
    return torch.randn(4, 10)


def setitem(x, i):
    y = x.clone()
    y[i] = 7.0
    return y


def setitem_add(x, i):
    y = x * 2
    y[i] += torch.ones(i.shape)
    return y


# name -> (fn(data, index), make data, index values for: in range with a negative, out of range
# positive, out of range negative).  Indices index dimension 0 of a vector unless said otherwise.
OPS = {
    "embedding": (lambda w, i: F.embedding(i, w), table, None),
    "embedding_2d_ids": (lambda w, i: F.embedding(i.reshape(1, 3), w) * 2, table, None),
    "getitem": (lambda x, i: x[i] + 1, vector, None),
    "getitem_dim1": (lambda x, i: x[:, i], matrix, None),
    "getitem_two_tensors": (lambda x, i: x[i.remainder(4), i], matrix, None),
    "getitem_of_view": (lambda x, i: x.t()[i].sum(1), matrix, None),
    "index_select": (lambda x, i: torch.index_select(x, 0, i), vector, None),
    "index_select_dim1": (lambda x, i: torch.index_select(x, 1, i), matrix, None),
    "gather": (lambda x, i: torch.gather(x, 0, i), vector, None),
    "gather_dim1": (lambda x, i: torch.gather(x, 1, i.expand(4, 3)), matrix, None),
    "take_along_dim": (lambda x, i: torch.take_along_dim(x, i), vector, None),
    "take": (lambda x, i: torch.take(x, i), vector, None),
    "scatter": (lambda x, i: torch.scatter(x, 0, i, torch.ones(3)), vector, None),
    "scatter_add": (lambda x, i: torch.scatter_add(x, 0, i, torch.ones(3)), vector, None),
    "index_put": (lambda x, i: torch.index_put(x, (i,), torch.ones(3)), vector, None),
    "index_put_accumulate": (lambda x, i: torch.index_put(x, (i,), torch.ones(3), accumulate=True), vector, None),
    "setitem": (setitem, vector, None),
    "setitem_add": (setitem_add, vector, None),
    "index_add": (lambda x, i: x.index_add(0, i, torch.ones(3)), vector, None),
    "index_copy": (lambda x, i: x.index_copy(0, i, torch.ones(3)), vector, None),
    "index_fill": (lambda x, i: x.index_fill(0, i, 2.0), vector, None),
    "embedding_bag": (lambda w, i: F.embedding_bag(i, w, torch.tensor([0])), table, None),
}
CASES = {"in_range_negative": [2, -1, 0], "out_of_range_positive": [1, 12345, 2],
         "out_of_range_negative": [0, 1, -12345]}


def eager_outcome(fn, data, index):
    try:
        return fn(data.clone(), index), None
    except Exception as error:  # the exception eager raises is the expected one
        return None, error


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("op", OPS)
def test_indexing_raises_like_eager_and_is_equal_in_range(op, backend):
    fn, make, _ = OPS[op]
    torch.manual_seed(0)
    data = make()
    compiled = ember.compile(fn, options=BACKENDS[backend])
    # in range first (the compile), then each bad case, then in range again (the error record is reset)
    for case in ["in_range_negative", "out_of_range_positive", "out_of_range_negative", "in_range_negative"]:
        index = torch.tensor(CASES[case])
        expected, error = eager_outcome(fn, data, index)
        if error is None:
            torch.testing.assert_close(compiled(data.clone(), index), expected, msg=f"{op} {case}")
        else:
            with pytest.raises(type(error)) as raised:
                compiled(data.clone(), index)
            assert type(raised.value) is type(error), f"{op} {case}: {raised.value!r} vs eager {error!r}"


@pytest.mark.parametrize("backend", BACKENDS)
def test_messages_name_the_index_dimension_and_size(backend):
    compiled = ember.compile(lambda x, i: x[i] * 2, options=BACKENDS[backend])
    x = torch.randn(10)
    compiled(x, torch.tensor([0, 1]))
    for bad in ([1, 12345], [-12345, 0]):
        with pytest.raises(IndexError) as eager:
            x[torch.tensor(bad)]
        with pytest.raises(IndexError) as ours:
            compiled(x, torch.tensor(bad))
        assert str(ours.value) == str(eager.value)
    gather = ember.compile(lambda x, i: torch.gather(x, 1, i), options=BACKENDS[backend])
    with pytest.raises(RuntimeError, match="index 7 is out of bounds for dimension 1 with size 5"):
        gather(torch.randn(2, 5), torch.tensor([[0, 7], [1, 1]]))
    embedding = ember.compile(lambda w, i: F.embedding(i, w), options=BACKENDS[backend])
    with pytest.raises(IndexError, match="index out of range in self"):
        embedding(torch.randn(10, 3), torch.tensor([1, 12345]))


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_check_is_in_the_generated_kernel(backend):
    compiled = ember.compile(lambda w, i: F.embedding(i, w).sum(1), options=BACKENDS[backend])
    compiled(torch.randn(10, 3), torch.tensor([1, 2]))
    source = compiled._ember_captured.events[0].compiled.source
    assert ("ember_check_index(" if backend == "cpp" else "_ember_check_index") in source
    assert compiled._ember_captured.events[0].compiled.stats["extern_count"] == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_large_gathers_with_a_bad_index_anywhere(backend):
    # a parallel C++ loop / many Triton blocks with a masked tail: the one bad index is found
    x = torch.randn(300, 70)
    compiled = ember.compile(lambda x, i: torch.gather(x, 1, i) * 3, options=BACKENDS[backend])
    index = torch.randint(0, 70, (300, 33))
    torch.testing.assert_close(compiled(x, index), torch.gather(x, 1, index) * 3)
    index[299, 32] = 70
    with pytest.raises(RuntimeError, match="index 70 is out of bounds for dimension 1 with size 70"):
        compiled(x, index)
    index[299, 32] = 5
    torch.testing.assert_close(compiled(x, index), torch.gather(x, 1, index) * 3)


def test_triton_kernels_with_checks_build_for_an_h100(monkeypatch, tmp_path):
    """The asserting kernels compile for sm_90 with debug=True (no GPU needed)."""
    pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget

    from ember.runtime import triton_build
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))
    build = triton_build.build
    built = []

    def build_and_compile_for_gpu(source, kernels, buffer_kinds, interpret=None):
        module = triton_build.load_module(source, interpret=False)
        for kernel in kernels:
            if kernel.checks_indices:
                binary = triton_build._compile(getattr(module, kernel.name), kernel, kernel.aligned,
                                               GPUTarget("cuda", 90, 32))
                built.append("assert" in binary.asm["ttir"])
        return build(source, kernels, buffer_kinds, interpret)
    monkeypatch.setattr(triton_build, "build", build_and_compile_for_gpu)

    def f(w, i, x, g):
        return F.embedding(i, w).sum(), torch.gather(x, 1, g), x[:, i[:2]]
    args = (torch.randn(10, 3), torch.tensor([1, -1 % 10, 4]), torch.randn(5, 70), torch.randint(0, 70, (5, 9)))
    compiled = ember.compile(f, options=BACKENDS["triton"])
    for actual, expected in zip(compiled(*args), f(*args)):
        torch.testing.assert_close(actual, expected)
    assert built and all(built)


def test_threads_see_only_their_own_bad_indices():
    # the C++ error record is per calling thread: a good call never raises another thread's error,
    # and a bad call always raises (never returns the element-0 stand-in)
    import concurrent.futures
    x = torch.randn(2000, 64)
    compiled = ember.compile(lambda x, i: torch.gather(x, 1, i) * 2, options=BACKENDS["cpp"])
    good = torch.randint(0, 64, (2000, 16))
    bad = good.clone()
    bad[1999, 15] = 64
    expected = torch.gather(x, 1, good) * 2
    compiled(x, good)

    def call(n):
        if n % 2:
            try:
                compiled(x, bad)
            except RuntimeError:
                return "raised"
            return "returned"
        return "equal" if torch.equal(compiled(x, good), expected) else "wrong"

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        outcomes = list(pool.map(call, range(200)))
    assert outcomes == ["equal", "raised"] * 100
