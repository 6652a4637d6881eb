"""NumPy inside compiled functions: differential tests against NumPy itself.

Every check runs the function eagerly (real NumPy) and captured, on two sets of
inputs, and compares type (ndarray vs NumPy scalar vs Python value), dtype,
shape and values.  Most tests use the eager backend (the captured graph run op
by op); the ``ember.compile`` tests run the real CPU backend.
"""
import copy

import numpy as np
import pytest
import torch

import ember

pytestmark = pytest.mark.filterwarnings("ignore::RuntimeWarning")  # NumPy's 0/0 and sqrt(-1) notes
RNG = np.random.default_rng(0)
GLOBAL_ARRAY = np.arange(4.0)


def assert_same(actual, expected):
    if isinstance(expected, (np.ndarray, np.generic)):
        assert type(actual) is type(expected), (type(actual), type(expected))
        assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
        assert np.shape(actual) == np.shape(expected)
        if np.issubdtype(expected.dtype, np.floating):
            tolerance = {np.float16: 2e-3, np.float32: 2e-5}.get(expected.dtype.type, 1e-10)
            np.testing.assert_allclose(actual, expected, rtol=tolerance, atol=tolerance, equal_nan=True)
        else:
            np.testing.assert_array_equal(actual, expected)
    elif isinstance(expected, (tuple, list)):
        assert type(actual) is type(expected) and len(actual) == len(expected)
        for a, e in zip(actual, expected):
            assert_same(a, e)
    else:
        assert type(actual) is type(expected) and actual == expected, (actual, expected)


def captured_once(captured):
    events = [e for e in captured.events if e.graph is not None]
    breaks = [e.break_reason for e in captured.events if e.break_reason]
    assert events and not breaks, breaks
    return events


def check(compile_fn, fn, *arg_sets, graph=True):
    """Run ``fn`` on each argument tuple eagerly and captured; compare; expect graphs (no break)."""
    captured = compile_fn(fn)
    for args in arg_sets:
        expected = fn(*copy.deepcopy(args))
        actual = captured(*args)
        assert_same(actual, expected)
    if graph:
        captured_once(captured)
    return captured


def rand(*shape, dtype=np.float64):
    return RNG.standard_normal(shape).astype(dtype)


def ints(*shape, dtype=np.int64, low=-5, high=6):
    return RNG.integers(low, high, shape).astype(dtype)


# ---------------------------------------------------------------- the k-means example
def kmeans_step(X, means):
    labels = np.argmin(np.linalg.norm(X - means[:, None], axis=2), axis=0)
    return labels


def kmeans_update(X, means):
    k = means.shape[0]
    labels = np.argmin(np.linalg.norm(X - means[:, None], axis=2), axis=0)
    onehot = (labels[:, None] == np.arange(k)).astype(X.dtype)
    counts = onehot.sum(axis=0)
    new_means = onehot.T @ X / np.maximum(counts, 1)[:, None]
    return labels, new_means


def kmeans_update_stack(X, means):
    labels = np.argmin(np.linalg.norm(X - means[:, None], axis=2), axis=0)
    sums = [np.sum(np.where((labels == k)[:, None], X, 0.0), axis=0) for k in range(len(means))]
    counts = [np.count_nonzero(labels == k) for k in range(len(means))]
    return np.stack([s / max_(c) for s, c in zip(sums, counts)])


def max_(count):
    return np.maximum(count, 1)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_kmeans_step(compile_fn, dtype):
    check(compile_fn, kmeans_step, (rand(200, 8, dtype=dtype), rand(5, 8, dtype=dtype)),
          (rand(200, 8, dtype=dtype), rand(5, 8, dtype=dtype)))


def test_kmeans_updates(compile_fn):
    args = [(rand(300, 4), rand(6, 4)), (rand(300, 4), rand(6, 4))]
    check(compile_fn, kmeans_update, *args)
    check(compile_fn, kmeans_update_stack, *args)


def test_kmeans_with_the_ember_backend_is_one_graph():
    X, means = rand(500, 8), rand(16, 8)
    report = ember.explain(kmeans_update, X, means)
    assert report.graph_count == 1 and report.break_count == 0
    fast = ember.compile(kmeans_update)
    for _ in range(2):
        assert_same(fast(X, means), kmeans_update(X, means))
        X, means = rand(500, 8), rand(16, 8)
    X32, means32 = X.astype(np.float32), means.astype(np.float32)  # a new dtype: recompiled
    assert_same(fast(X32, means32), kmeans_update(X32, means32))


# ---------------------------------------------------------------- dtype rules
def promotions(i64, i32, f32, f64, u8, i8, b):
    return (i64 * 0.5, f32 + 1.0, i64 / i64, i32 / i32, i32 + i64, u8 + i8, f32 + f64, b + b, i32 + 3,
            f32 * np.float64(2.0), f32 * np.float32(2.0), i64 < 0.5, i64 // 2, i64 % 3, -i32, ~b, ~i8,
            i64 ** 2, f32 ** 2, u8 * 2, b * 1.5, i32 & 6, f64 // 0.7, f64 % 0.7, abs(i8))


def promotion_args():
    return (ints(4, 3), ints(4, 3, dtype=np.int32), rand(4, 3, dtype=np.float32), rand(4, 3),
            ints(4, 3, dtype=np.uint8, low=0, high=9), ints(4, 3, dtype=np.int8), ints(4, 3, low=0, high=2) > 0)


def test_type_promotion(compile_fn):
    check(compile_fn, promotions, promotion_args(), promotion_args())


def test_type_promotion_is_one_graph_with_the_ember_backend():
    args = promotion_args()
    assert ember.explain(promotions, *args).graph_count == 1
    assert_same(ember.compile(promotions)(*args), promotions(*args))


def test_numpy_scalars_come_back_as_numpy_scalars(compile_fn):
    def f(a, b):
        return np.sum(a), a.max(), b.mean(), a[0, 1], np.float32(2.5) * 2, np.pi * a.min(), a.shape, a.ndim
    check(compile_fn, f, (rand(3, 4, dtype=np.float32), ints(5)), (rand(3, 4, dtype=np.float32), ints(5)))


def test_in_place_operators_follow_same_kind_casting(compile_fn):
    def f(a, b):
        a += b
        a *= 2
        b -= 1
        return a.sum() + b.sum()

    a, b = rand(3, 4), ints(3, 4)
    a2, b2 = a.copy(), b.copy()
    captured = compile_fn(f)
    assert_same(captured(a, b), f(a2, b2))
    np.testing.assert_array_equal(a, a2)  # the caller's arrays were written
    np.testing.assert_array_equal(b, b2)

    def g(a):
        a += 0.5  # int64 += float: NumPy raises; so must the compiled function
        return a

    with pytest.raises(Exception, match="same_kind|Cannot cast"):
        compile_fn(g)(ints(3))


# ---------------------------------------------------------------- reductions
REDUCTIONS = [
    lambda a: np.sum(a), lambda a: np.sum(a, axis=0), lambda a: a.sum(axis=(0, 1), keepdims=True),
    lambda a: np.sum(a, axis=-1, dtype=np.float32), lambda a: np.mean(a), lambda a: a.mean(axis=1),
    lambda a: np.mean(a, axis=0, keepdims=True), lambda a: np.std(a, axis=0), lambda a: a.var(ddof=1),
    lambda a: np.max(a, axis=1), lambda a: a.min(), lambda a: np.amax(a, axis=0, keepdims=True),
    lambda a: np.argmax(a), lambda a: np.argmin(a, axis=1), lambda a: a.argmax(axis=0, keepdims=True),
    lambda a: np.any(a > 1), lambda a: np.all(a != 0, axis=0), lambda a: a.any(axis=1, keepdims=True),
    lambda a: np.prod(a, axis=1), lambda a: np.cumsum(a), lambda a: a.cumsum(axis=1),
    lambda a: np.cumprod(a, axis=0), lambda a: np.count_nonzero(a > 0, axis=1), lambda a: np.ptp(a, axis=0),
]


@pytest.mark.parametrize("dtype", [np.float64, np.float32, np.int64, np.int32, np.bool_])
@pytest.mark.parametrize("index", range(len(REDUCTIONS)))
def test_reductions(compile_fn, index, dtype):
    reduction = REDUCTIONS[index]

    def f(a):
        return reduction(a)

    def make():
        return ints(3, 4, dtype=dtype, low=1, high=4) if dtype is not np.bool_ else ints(3, 4, low=0, high=2) > 0

    try:
        reduction(make())
    except TypeError:
        pytest.skip("NumPy itself rejects this dtype")
    check(compile_fn, f, (make(),), (make(),))


# ---------------------------------------------------------------- functions and methods
def elementwise_functions(a, b, i):
    return (np.abs(a), np.sqrt(np.abs(a)), np.exp(a), np.log(np.abs(a) + 1), np.sin(a), np.cos(a), np.tanh(a),
            np.where(a > 0, a, b), np.where(a > 0, a, 0), np.where(i, 1, 2.5), np.maximum(a, b), np.minimum(a, 0),
            np.clip(a, -0.5, 0.5), np.clip(i, 0, 2), a.clip(min=0), np.power(a, 2), np.square(b), np.round(a, 2),
            np.sign(a), np.floor(a), np.ceil(b), np.exp2(i), np.sqrt(i), np.arctan2(a, b), np.hypot(a, b),
            np.isnan(a), np.logical_and(a > 0, b > 0), np.float32(a), np.float64(2) * i)


def test_elementwise_functions(compile_fn):
    check(compile_fn, elementwise_functions, (rand(3, 4), rand(3, 4), ints(3, 4, dtype=np.int32)),
          (rand(3, 4), rand(3, 4), ints(3, 4, dtype=np.int32)))


def linear_algebra(a, b, v):
    return (np.dot(a, b), a @ b, np.matmul(a, b), np.dot(v, v), np.einsum("ij,jk->ik", a, b),
            np.einsum("ij->j", a), np.outer(v, v), np.linalg.norm(v), np.linalg.norm(a, axis=1),
            np.linalg.norm(a), np.linalg.norm(a, "fro"), np.linalg.norm(v, 1), np.linalg.norm(v, np.inf),
            np.linalg.norm(a, ord=3, axis=0, keepdims=True), a.dot(b), v @ a.T)


def test_linear_algebra(compile_fn):
    check(compile_fn, linear_algebra, (rand(3, 4), rand(4, 5), rand(4)), (rand(3, 4), rand(4, 5), rand(4)))
    check(compile_fn, linear_algebra, (ints(3, 4), ints(4, 5), ints(4)))
    check(compile_fn, linear_algebra, (rand(3, 4, dtype=np.float32), rand(4, 5), rand(4, dtype=np.float32)))


def shapes(a, v):
    return (a.T, np.transpose(a), a.transpose(1, 0), a.reshape(6, 2), a.reshape((2, -1)), np.reshape(a, (12,)),
            np.expand_dims(v, 0), np.expand_dims(a, (0, 3)), np.squeeze(a[None]), a[:, None, :].squeeze(1),
            np.stack([v, v + 1]), np.stack((a, a), axis=-1), np.concatenate([a, a]), np.concatenate([a, a], axis=1),
            np.concatenate([v, a.ravel()], axis=None), np.vstack([v, v]), np.hstack([v, v]), a.flatten(),
            np.ravel(a), np.swapaxes(a, 0, 1), np.moveaxis(a[None], 0, -1), np.broadcast_to(v, (2, 4)),
            np.sort(v), np.sort(a, axis=0), np.argsort(v), a.argsort(axis=1), np.flip(a, 0), np.roll(a, 1, 1),
            np.roll(v, -1), np.tril(a), np.triu(a, 1), np.tile(v, 2), np.repeat(v, 2), a.copy(), np.copy(v),
            np.shape(a), np.ndim(v), np.size(a), len(a), a.size, a.itemsize, a.dtype)


def test_shape_functions(compile_fn):
    check(compile_fn, shapes, (rand(3, 4), rand(4)), (rand(3, 4), rand(4)))


def creation(a):
    n = a.shape[0]
    return (np.zeros(3), np.ones((2, n)), np.zeros(n, dtype=np.int32), np.full((2, 2), 7), np.full(3, 0.5),
            np.full((2,), True), np.zeros_like(a), np.ones_like(a, dtype=np.float32), np.full_like(a, 2),
            np.empty_like(a).shape, np.arange(n), np.arange(1.0, 2.0, 0.25), np.arange(2, 11, 3),
            np.arange(5, dtype=np.float32), np.linspace(0, 1, 7), np.linspace(-1, 1, 4, endpoint=False),
            np.linspace(0, 10, 5, dtype=np.int64), np.eye(3), np.eye(2, 4, k=1, dtype=np.int32), np.identity(2),
            np.array([1, 2, 3]), np.array([[1.0, 2.0]]), np.array([a[0], a[1]]), np.array(a, dtype=np.float32),
            np.asarray(a) is a, np.asarray([1, 2], dtype=np.float32), a + np.array([1, 2, 3, 4]))


def test_creation_functions(compile_fn):
    check(compile_fn, creation, (rand(3, 4),), (rand(3, 4),))


# ---------------------------------------------------------------- indexing
def indexing(a, idx):
    return (a[0], a[1, 2], a[:, None], a[None, ..., 1], a[1:3, ::2], a[-1], a[idx], a[idx, 0], a[:, [0, 2]],
            a[..., -1], a[a.shape[0] - 1, :2])


def test_indexing(compile_fn):
    check(compile_fn, indexing, (rand(4, 5), ints(3, low=0, high=4)), (rand(4, 5), ints(3, low=0, high=4)))
    check(compile_fn, indexing, (ints(4, 5, dtype=np.int32), ints(2, low=0, high=4, dtype=np.int32)))


def test_item_assignment_writes_the_callers_array(compile_fn):
    def f(a, idx):
        a[0] = 1.5
        a[:, 1] = a[:, 2] * 2
        a[a < 0] = 0
        a[idx] = -1
        return a.sum()

    a, idx = rand(4, 3), ints(2, low=0, high=4)
    expected_array = a.copy()
    expected = f(expected_array, idx)
    captured = compile_fn(f)
    assert_same(captured(a, idx), expected)
    np.testing.assert_array_equal(a, expected_array)
    captured_once(captured)


def test_sort_in_place_and_fill(compile_fn):
    def f(a, b):
        a.sort()
        b.fill(3)
        return a[0] + b[0]

    a, b = rand(5), ints(3)
    a2, b2 = a.copy(), b.copy()
    assert_same(compile_fn(f)(a, b), f(a2, b2))
    np.testing.assert_array_equal(a, a2)
    np.testing.assert_array_equal(b, b2)


def test_boolean_mask_indexing_breaks_the_graph_but_stays_correct(compile_fn):
    def f(a):
        return a[a > 0].sum()

    captured = compile_fn(f)
    a = rand(10)
    assert_same(captured(a), f(a))
    assert any("boolean-mask" in (e.break_reason or "") for e in captured.events)


# ---------------------------------------------------------------- inputs, outputs, guards
def test_an_input_returned_unchanged_is_the_same_object(compile_fn):
    def f(a, b):
        return a, b * 2

    a, b = rand(3), rand(3)
    out = compile_fn(f)(a, b)
    assert out[0] is a


def test_guards_recompile_on_shape_dtype_and_strides(compile_fn):
    def f(a):
        return (a * 2).sum(axis=0)

    captured = compile_fn(f)
    base = rand(4, 3)
    for value in (base, rand(4, 3), rand(5, 3), base.astype(np.float32), base.T, ints(4, 3), base[:, ::2]):
        assert_same(captured(value), f(value))
    assert sum(e.graph is not None for e in captured.events) == 6  # one per new shape/dtype/layout


def test_read_only_arrays_and_subclasses_run_eagerly(compile_fn):
    def f(a):
        return a + 1

    a = rand(3)
    a.setflags(write=False)
    captured = compile_fn(f)
    assert_same(captured(a), f(a))
    masked = np.ma.masked_array(rand(3), mask=[0, 1, 0])
    result = compile_fn(f)(masked)
    assert isinstance(result, np.ma.MaskedArray)


def test_globals_closures_and_inlined_helpers(compile_fn):
    offset = np.ones(4)

    def helper(x):
        return np.exp(x) - offset

    def f(a):
        return helper(a) * GLOBAL_ARRAY + np.pi

    check(compile_fn, f, (rand(4),), (rand(4),))


def test_bridges_between_torch_and_numpy(compile_fn):
    def f(t, a):
        b = torch.from_numpy(a) * t
        return b, b.numpy() + 1, t.numpy().sum()

    t, a = torch.randn(3, dtype=torch.float64), rand(3)
    captured = compile_fn(f)
    actual, expected = captured(t, a), f(t, a)
    torch.testing.assert_close(actual[0], expected[0])
    assert_same(actual[1:], expected[1:])
    captured_once(captured)


def test_unsupported_numpy_is_a_graph_break_with_the_right_answer(compile_fn):
    def f(a):
        return np.unique(np.round(a)).size + np.median(a)

    captured = compile_fn(f)
    a = rand(10)
    assert_same(captured(a), f(a))
    assert any("not supported" in (e.break_reason or "") for e in captured.events)


def test_data_dependent_python_values_break(compile_fn):
    def f(a):
        if a.sum() > 0:
            return a * 2
        return a

    captured = compile_fn(f)
    for a in (rand(5), -np.abs(rand(5))):
        assert_same(captured(a), f(a))


def test_numpy_errors_are_raised_by_numpy(compile_fn):
    def f(a, b):
        return a + b

    with pytest.raises(ValueError, match="broadcast"):
        compile_fn(f)(rand(3), rand(4))

    def g(a):
        return a - a

    with pytest.raises(TypeError, match="boolean subtract"):
        compile_fn(g)(ints(3) > 0)


# ---------------------------------------------------------------- a walk over ufuncs x dtypes
UNARY = [np.negative, np.positive, np.absolute, np.sqrt, np.square, np.exp, np.exp2, np.expm1, np.log, np.log2,
         np.log10, np.log1p, np.sin, np.cos, np.tan, np.arcsin, np.arccos, np.arctan, np.sinh, np.cosh, np.tanh,
         np.arcsinh, np.arctanh, np.floor, np.ceil, np.trunc, np.rint, np.sign, np.signbit, np.isnan, np.isinf,
         np.isfinite, np.logical_not, np.invert, np.deg2rad, np.rad2deg, np.reciprocal, np.fabs]
BINARY = [np.add, np.subtract, np.multiply, np.true_divide, np.floor_divide, np.remainder, np.fmod, np.power,
          np.maximum, np.minimum, np.fmax, np.fmin, np.arctan2, np.hypot, np.copysign, np.logaddexp,
          np.logical_and, np.logical_or, np.logical_xor, np.bitwise_and, np.bitwise_or, np.bitwise_xor,
          np.equal, np.not_equal, np.less, np.less_equal, np.greater, np.greater_equal]
DTYPES = [np.bool_, np.uint8, np.int8, np.int16, np.int32, np.int64, np.float16, np.float32, np.float64]


def sample(dtype, nonzero=False):
    if dtype is np.bool_:
        return ints(6, low=0, high=2) > 0 if not nonzero else np.ones(6, bool)
    if np.issubdtype(dtype, np.integer):
        low = 1 if nonzero or dtype is np.uint8 else -4
        return RNG.integers(low, 5, 6).astype(dtype)
    values = RNG.uniform(-2, 2, 6).astype(dtype)
    return values if not nonzero else np.where(values == 0, 1, values).astype(dtype)


def _numpy_accepts(fn, *args):
    try:
        with np.errstate(all="ignore"):
            fn(*args)
        return True
    except TypeError:
        return False


@pytest.mark.parametrize("ufunc", UNARY, ids=lambda u: u.__name__)
def test_unary_ufuncs_over_dtypes(compile_fn, ufunc):
    def g(a):
        return ufunc(a)

    for dtype in DTYPES:
        a = sample(dtype, nonzero=ufunc is np.reciprocal)
        if not _numpy_accepts(ufunc, a):
            continue
        captured = compile_fn(g)
        with np.errstate(all="ignore"):
            assert_same(captured(a), ufunc(a))
        if not (ufunc is np.reciprocal and not np.issubdtype(dtype, np.floating)):  # integer 1/x: a break
            captured_once(captured)


@pytest.mark.parametrize("ufunc", BINARY, ids=lambda u: u.__name__)
def test_binary_ufuncs_over_dtypes(compile_fn, ufunc):
    def g(a, b):
        return ufunc(a, b), ufunc(a, 2), ufunc(1.5, b)

    divides = ufunc in (np.true_divide, np.floor_divide, np.remainder, np.fmod)
    for left in DTYPES:
        for right in (np.bool_, np.int32, np.int64, np.float32, np.float64, left):
            a, b = sample(left), sample(right, nonzero=divides or ufunc is np.power)
            if ufunc is np.power and np.issubdtype(right, np.integer):
                b = np.abs(b)  # NumPy raises on negative integer powers of integers
            if not _numpy_accepts(g, a, b):
                continue
            with np.errstate(all="ignore"):
                expected = g(a, b)
            captured = compile_fn(g)
            assert_same(captured(a, b), expected)
            captured_once(captured)


# ---------------------------------------------------------------- graph breaks and device contexts (ember backend)
def test_a_print_between_numpy_code_keeps_two_graphs(capsys):
    def f(a):
        a += 1
        b = a * 2
        print("shape", b.shape)
        return b.sum(), a

    a, a2 = np.arange(4.0), np.arange(4.0)
    fast = ember.compile(f)
    actual, expected = fast(a), f(a2)
    assert_same(actual, expected)
    assert actual[1] is a and np.array_equal(a, a2)  # the caller's array, written in place once
    assert capsys.readouterr().out == "shape (4,)\n" * 2
    report = ember.explain(f, np.arange(4.0))
    assert (report.graph_count, report.break_count) == (2, 1)


def test_under_a_device_context_the_numpy_device_is_guarded():
    def f(X, means):
        return kmeans_step(X, means), np.zeros(3)

    X, means = rand(50, 4), rand(3, 4)
    fast = ember.compile(f)
    with torch.device("cpu"):  # a TorchFunctionMode is active: the default device decides (CPU here)
        assert_same(fast(X, means), f(X, means))
    assert_same(fast(X, means), f(X, means))
