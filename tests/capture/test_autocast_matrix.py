"""Autocast: every op of PyTorch's CPU autocast lists, the neutral list, models, nesting, guards.

Each case runs eagerly under autocast and compiled under the same autocast, and compares
dtypes and values; the op lists come from torch's own autocast test lists so that a new
torch with a changed policy fails here instead of silently computing in another dtype.
"""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.testing._internal.autocast_test_lists import AutocastCPUTestLists

import ember
from ember.capture import autocast as A

BACKENDS = ["eager", "ember"]


def _compile(fn, backend):
    return ember.compile(fn, backend=backend)


def _flat(value):
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _flat(v)]
    return []


def _assert_same(expected, actual, exact=True):
    expected, actual = _flat(expected), _flat(actual)
    assert len(expected) == len(actual)
    for e, a in zip(expected, actual):
        assert e.dtype == a.dtype, (e.dtype, a.dtype)
        assert e.shape == a.shape
        if exact:
            torch.testing.assert_close(a, e, rtol=0, atol=0, equal_nan=True)
        else:
            torch.testing.assert_close(a.float(), e.float(), rtol=2e-2, atol=2e-2, equal_nan=True)


def _breaks(compiled):
    return [e.break_reason for e in compiled._ember_captured.events if e.break_reason]


def _cpu_lists():
    torch.manual_seed(0)
    lists = AutocastCPUTestLists(torch.device("cpu"))
    cases = []
    for name, args, *rest in lists.torch_16 + lists.nn_16:
        kwargs = rest[0] if rest else {}
        cases.append((name, args, kwargs, torch.bfloat16))
    for name, args, *rest in lists.torch_fp32 + lists.nn_fp32:
        kwargs = rest[0] if rest else {}
        cases.append((name, args, kwargs, torch.float32))
    for name, args, *_ in lists.torch_need_autocast_promote:
        cases.append((name, args, {}, torch.float32))
    for name, args, _, out_type in lists.torch_expect_builtin_promote:
        cases.append((name, args, {}, out_type))
    return cases


CPU_CASES = _cpu_lists()


def _op(name):
    for owner in (torch, F, torch._C._nn):
        fn = getattr(owner, name, None)
        if fn is not None:
            return fn
    raise AttributeError(name)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", CPU_CASES, ids=[c[0] for c in CPU_CASES])
def test_cpu_autocast_list_op(case, backend):
    """Every op of torch's CPU autocast test lists: compiled under autocast == eager under autocast."""
    name, args, kwargs, out_type = case
    op = _op(name)

    def f(*tensors):
        return op(*tensors, **kwargs)

    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = f(*args)
        compiled = _compile(f, backend)
        actual = compiled(*args)
    assert _flat(expected)[0].dtype == out_type
    _assert_same(expected, actual, exact=backend == "eager")
    # the policy capture predicts is the one eager applied
    if name not in ("_native_multi_head_attention", "conv_tbc"):
        assert not _breaks(compiled), _breaks(compiled)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_policy_table_covers_the_dispatcher(device):
    """Each op registered for Autocast{CPU,CUDA} is in capture's table (else capture breaks the graph there)."""
    key = A._KEYS[device]
    registered = {n.split("::")[1].split(".")[0] for n in torch._C._dispatch_get_registrations_for_dispatch_key(key)}
    # torch 2.11 also registers _cudnn_rnn (nn.LSTM/GRU on cuDNN): capture breaks the graph there
    missing = sorted(n for n in registered if n not in A.POLICIES[device] and n != "_cudnn_rnn")
    assert not missing, missing


def test_policy_entry_not_registered_in_this_torch_is_not_applied(monkeypatch):
    """Policies move between releases (rms_norm is fp32 on CUDA in 2.13, not registered in 2.11):
    an entry for an op this torch does not register must not cast."""
    monkeypatch.setitem(A.POLICIES["cpu"], "relu", A.LOWER)
    assert A.classify("relu", "cpu") == A.NEUTRAL


def _cuda_lists():
    if not torch.cuda.is_available():
        return []
    from torch.testing._internal.autocast_test_lists import AutocastTestLists
    torch.manual_seed(0)
    lists = AutocastTestLists(torch.device("cuda"))
    cases = []
    for group, module in [("torch_fp16", torch), ("torch_fp32", torch), ("nn_fp16", torch._C._nn),
                          ("nn_fp32", torch._C._nn), ("linalg_fp16", torch._C._linalg),
                          ("torch_need_autocast_promote", torch), ("torch_expect_builtin_promote", torch)]:
        for index, entry in enumerate(getattr(lists, group)):
            name, args = entry[0], entry[1]
            if isinstance(args, str):  # einsum: the list's operands do not fit its equation
                args = ("bkhd,bqhd->bqkh", torch.randn(2, 3, 4, 5, device="cuda"),
                        torch.randn(2, 6, 4, 5, device="cuda"))
            kwargs = entry[2] if len(entry) > 2 and isinstance(entry[2], dict) else {}
            if len(entry) > 2 and entry[2] is True:  # skipped on ROCm
                continue
            cases.append((f"{group}-{name}-{index}", module, name, args, kwargs))
    return cases


CUDA_CASES = _cuda_lists()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", CUDA_CASES, ids=[c[0] for c in CUDA_CASES])
def test_cuda_autocast_list_op(case, dtype):
    """torch's CUDA autocast lists: compiled (eager backend: capture's casts only) == eager."""
    _, module, name, args, kwargs = case
    op = getattr(module, name, None) or getattr(torch, name)

    def f(*tensors):
        return op(*tensors, **kwargs)

    with torch.autocast("cuda", dtype=dtype):
        compiled = _compile(f, "eager")
        try:
            expected = f(*args)
        except RuntimeError as error:  # float16 operands under bfloat16 autocast: eager refuses
            with pytest.raises(RuntimeError, match=str(error)):
                compiled(*args)
            return
        actual = compiled(*args)
    _assert_same(expected, actual)


# the neutral list: ops capture records unchanged under autocast; eager must agree
_x = torch.randn(2, 3, 8, 8)
NEUTRAL_CASES = [
    ("softmax", lambda x: F.softmax(x, -1)), ("log_softmax", lambda x: F.log_softmax(x, -1)),
    ("softmin", lambda x: F.softmin(x, -1)), ("layer_norm", lambda x: F.layer_norm(x, (8,))),
    ("group_norm", lambda x: F.group_norm(x, 3)), ("rms_norm", lambda x: F.rms_norm(x, (8,))),
    ("normalize", lambda x: F.normalize(x, dim=-1)), ("sum", lambda x: x.sum(-1)),
    ("cumsum", lambda x: x.cumsum(-1)), ("pow", lambda x: x ** 2), ("exp", torch.exp),
    ("logsumexp", lambda x: x.logsumexp(-1)), ("norm", lambda x: x.norm(dim=-1)),
    ("interpolate", lambda x: F.interpolate(x, scale_factor=2, mode="bilinear")),
    ("batch_norm", lambda x: F.batch_norm(x, torch.zeros(3), torch.ones(3))),
    ("instance_norm", lambda x: F.instance_norm(x)), ("dropout", lambda x: F.dropout(x, training=False)),
    ("gelu", F.gelu), ("silu", F.silu), ("mish", F.mish), ("hardswish", F.hardswish), ("elu", F.elu),
    ("relu", F.relu), ("leaky_relu", F.leaky_relu), ("sigmoid", torch.sigmoid), ("tanh", torch.tanh),
    ("glu", lambda x: F.glu(x, -1)), ("max_pool2d", lambda x: F.max_pool2d(x, 2)),
    ("avg_pool2d", lambda x: F.avg_pool2d(x, 2)), ("adaptive_avg_pool2d", lambda x: F.adaptive_avg_pool2d(x, 1)),
    ("pad", lambda x: F.pad(x, (1, 1))), ("flatten", lambda x: x.flatten(1)),
    ("reshape", lambda x: x.reshape(2, -1)), ("mean", lambda x: x.mean(-1)), ("var", lambda x: x.var(-1)),
    ("std", lambda x: x.std(-1)), ("amax", lambda x: x.amax(-1)), ("where", lambda x: torch.where(x > 0, x, 0.0)),
    ("clamp", lambda x: x.clamp(-1, 1)), ("masked_fill", lambda x: x.masked_fill(x > 0, 1.0)),
    ("pixel_shuffle", lambda x: F.pixel_shuffle(x.repeat(1, 4, 1, 1)[:, :4], 2)),
    ("square", torch.square), ("rdiv", lambda x: 3 / x), ("rpow", lambda x: 2 ** x), ("rsub", lambda x: 1 - x), ("softplus", F.softplus), ("cumprod_neg", lambda x: -x.cumsum(0)),
    ("interpolate_nearest", lambda x: F.interpolate(x, scale_factor=2)),
    ("embedding", lambda x: F.embedding(torch.tensor([[0, 1]]), x.flatten(0, 1).flatten(1))),
]


# calls that reach an op autocast changes only for some arguments: capture must either model them
# or break; either way the result equals eager under autocast
ARGUMENT_DEPENDENT = [
    ("pad_reflect", lambda x: F.pad(x, (1, 1, 1, 1), mode="reflect")),
    ("pad_replicate", lambda x: F.pad(x, (1, 1, 1, 1), mode="replicate")),
    ("pad_circular", lambda x: F.pad(x, (1, 1, 1, 1), mode="circular")),
    ("pad_constant", lambda x: F.pad(x, (1, 1, 1, 1), mode="constant", value=2.0)),
    ("interpolate_area", lambda x: F.interpolate(x, size=(4, 4), mode="area")),
    ("interpolate_area_3d", lambda x: F.interpolate(x.unsqueeze(2), size=(1, 4, 4), mode="area")),
    ("einsum", lambda x: torch.einsum("bchw,bcwk->bchk", x, x)),
    ("tensordot", lambda x: torch.tensordot(x, x, dims=([3], [2]))),
    ("cross_entropy", lambda x: F.cross_entropy(x, torch.zeros(2, 8, 8, dtype=torch.long))),
    ("grid_sample", lambda x: F.grid_sample(x, torch.zeros(2, 4, 4, 2), align_corners=False)),
    ("fft", lambda x: torch.fft.rfft(x).abs()), ("inverse", lambda x: torch.linalg.inv(x + 4 * torch.eye(8))),
    ("cdist", lambda x: torch.cdist(x, x)), ("prod", lambda x: x.prod(-1)), ("trace", lambda x: x[0, 0].trace()),
    ("avg_pool3d", lambda x: F.avg_pool3d(x.unsqueeze(0), 2)), ("kl_div", lambda x: F.kl_div(x, x.exp())),
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name,fn", ARGUMENT_DEPENDENT, ids=[c[0] for c in ARGUMENT_DEPENDENT])
def test_cpu_argument_dependent_and_composite_ops(name, fn, dtype):
    x = _x.to(dtype)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        expected = fn(x)
        actual = _compile(lambda x: fn(x), "eager")(x)
    _assert_same(expected, actual)


@pytest.mark.parametrize("name,fn", NEUTRAL_CASES, ids=[c[0] for c in NEUTRAL_CASES])
def test_cpu_neutral_op(name, fn):
    """Eager gives bit-identical results with and without autocast, in both fp32 and bf16 inputs."""
    op = fn

    def fn(x):  # the op as a call inside a compiled function, as models use it
        return op(x)

    for dtype in (torch.float32, torch.bfloat16):
        x = _x.to(dtype)
        plain = fn(x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            under = fn(x)
            compiled = _compile(fn, "eager")
            captured = compiled(x)
        _assert_same(plain, under)
        _assert_same(under, captured)
        assert not _breaks(compiled), _breaks(compiled)


# ------------------------------------------------------------------ models
class LinearGelu(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = torch.nn.Linear(16, 32), torch.nn.Linear(32, 8)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x))).softmax(-1)


class ConvBn(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)

    def forward(self, x):
        return F.relu(self.bn(self.conv(x))).mean((2, 3))


class Attention(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(16, 48)
        self.proj = torch.nn.Linear(16, 16)
        self.norm = torch.nn.LayerNorm(16)

    def forward(self, x):
        q, k, v = self.qkv(self.norm(x)).view(2, 5, 3, 2, 8).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return x + self.proj(y.transpose(1, 2).reshape(2, 5, 16))


MODELS = [("linear_gelu", LinearGelu, (4, 16)), ("conv_bn", ConvBn, (2, 3, 8, 8)),
          ("attention", Attention, (2, 5, 16))]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name,cls,shape", MODELS, ids=[m[0] for m in MODELS])
def test_model_under_outer_autocast(name, cls, shape, backend):
    torch.manual_seed(0)
    model = cls().eval()
    x = torch.randn(shape)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        expected = model(x)
        compiled = ember.compile(model, backend=backend)
        actual = compiled(x)
        again = compiled(x)
    _assert_same(expected, actual, exact=backend == "eager")
    _assert_same(expected, again, exact=backend == "eager")
    assert not _breaks(compiled), _breaks(compiled)


def _module_breaks(compiled):
    return [e.break_reason for e in compiled._ember_captured.events if e.break_reason]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name,cls,shape", MODELS, ids=[m[0] for m in MODELS])
def test_model_with_inner_autocast(name, cls, shape, backend):
    torch.manual_seed(0)
    model = cls().eval()
    x = torch.randn(shape)

    def f(x):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = model(x)
        return y.float() * 2

    with torch.no_grad():
        expected = f(x)
        compiled = ember.compile(f, backend=backend)
        actual = compiled(x)
    _assert_same(expected, actual, exact=backend == "eager")
    assert not _module_breaks(compiled), _module_breaks(compiled)


# ------------------------------------------------------------------ spellings and nesting
lin = torch.nn.Linear(8, 8)


def inner_with(x):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return lin(x)


def inner_amp(x):
    with torch.amp.autocast("cpu"):
        return lin(x) @ x.t()


def inner_cpu_amp(x):
    with torch.cpu.amp.autocast():  # deprecated spelling (FutureWarning), still used
        return lin(x)


def inner_nested(x):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        a = lin(x)
        with torch.autocast("cpu", enabled=False):
            b = lin(x)             # fp32 again
            c = a @ b.t() if a.dtype == b.dtype else a.float() @ b.t()
        d = torch.cat([a, b])      # promote: widest
    return a, b, c, d, lin(x)


def inner_fp16(x):
    with torch.autocast("cpu", dtype=torch.float16):
        return lin(x), torch.is_autocast_enabled("cpu"), torch.get_autocast_dtype("cpu")


@torch.autocast("cpu", dtype=torch.bfloat16)
def decorated(x):
    return lin(x) + 1


def calls_decorated(x):
    return decorated(x) * 2


def mixed_fp64(x):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return lin(x), x.double() @ x.double().t(), F.mse_loss(lin(x), x)


SPELLINGS = [inner_with, inner_amp, inner_cpu_amp, inner_nested, inner_fp16, decorated, calls_decorated,
             mixed_fp64]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn", SPELLINGS, ids=[f.__name__ for f in SPELLINGS])
def test_autocast_spellings(fn, backend):
    x = torch.randn(4, 8)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        expected = fn(x)
        compiled = ember.compile(fn, backend=backend)
        actual = compiled(x)
    if isinstance(expected, tuple):
        assert [type(e) for e in expected] == [type(a) for a in actual]
        assert [e for e in expected if not isinstance(e, torch.Tensor)] == \
            [a for a in actual if not isinstance(a, torch.Tensor)]
    _assert_same(expected, actual, exact=backend == "eager")
    assert not _breaks(compiled), _breaks(compiled)
    assert not torch.is_autocast_enabled("cpu")


def test_enabled_false_inside_outer_autocast():
    def f(x):
        with torch.autocast("cpu", enabled=False):
            return lin(x)
    x = torch.randn(4, 8)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        expected = f(x)
        actual = ember.compile(f)(x)
        assert torch.is_autocast_enabled("cpu")
    _assert_same(expected, actual)
    assert expected.dtype == torch.float32


# ------------------------------------------------------------------ guards
def _linear_sum(x):
    return F.gelu(lin(x)).sum(-1)


@pytest.mark.parametrize("backend", BACKENDS)
def test_compiled_outside_then_called_inside(backend):
    x = torch.randn(4, 8)
    with torch.no_grad():
        compiled = ember.compile(_linear_sum, backend=backend)
        assert compiled(x).dtype == torch.float32
        with torch.autocast("cpu", dtype=torch.bfloat16):
            expected, actual = _linear_sum(x), compiled(x)
        _assert_same(expected, actual, exact=backend == "eager")
        with torch.autocast("cpu", dtype=torch.float16):
            expected, actual = _linear_sum(x), compiled(x)
        _assert_same(expected, actual, exact=backend == "eager")
        assert compiled(x).dtype == torch.float32


@pytest.mark.parametrize("backend", BACKENDS)
def test_compiled_inside_then_called_outside(backend):
    x = torch.randn(4, 8)
    with torch.no_grad():
        compiled = ember.compile(_linear_sum, backend=backend)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            assert compiled(x).dtype == torch.bfloat16
        expected, actual = _linear_sum(x), compiled(x)
        _assert_same(expected, actual, exact=backend == "eager")
        assert actual.dtype == torch.float32


def test_default_dtype_is_guarded():
    def f(x):
        return x * 1.5 + torch.ones(2)
    x = torch.arange(2)
    compiled = ember.compile(f)
    assert compiled(x).dtype == torch.float32
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        expected, actual = f(x), compiled(x)
    finally:
        torch.set_default_dtype(previous)
    assert expected.dtype == actual.dtype == torch.float64
    _assert_same(expected, actual)


def test_autocast_dtype_default_read_inside_is_guarded():
    """`torch.autocast("cpu")` with no dtype takes the current autocast dtype: guarded."""
    def f(x):
        with torch.autocast("cpu"):
            return lin(x)
    x = torch.randn(4, 8)
    with torch.no_grad():
        compiled = ember.compile(f)
        assert compiled(x).dtype == torch.bfloat16
        previous = torch.get_autocast_dtype("cpu")
        torch.set_autocast_dtype("cpu", torch.float16)
        try:
            assert compiled(x).dtype == f(x).dtype == torch.float16
        finally:
            torch.set_autocast_dtype("cpu", previous)


def test_autocast_guard_is_cheap():
    import time
    guard = A.entry_state
    start = time.perf_counter()
    for _ in range(10000):
        guard()
    assert (time.perf_counter() - start) / 10000 < 5e-6


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_cuda_autocast_models(dtype):
    for name, cls, shape in MODELS:
        torch.manual_seed(0)
        model = cls().cuda().eval()
        x = torch.randn(shape, device="cuda")

        def f(x):
            y = model(x)
            return y, y.sum(), y.softmax(-1), torch.exp(y), 3 / y, 2 ** y, 1 - y, y / 3, y ** 2

        with torch.no_grad(), torch.autocast("cuda", dtype=dtype):
            expected = f(x)
            actual = ember.compile(f)(x)
        _assert_same(expected, actual, exact=False)


def test_autocast_setters_inside_break_the_graph():
    """Calling the state setters is not captured (run once at capture, they would not run again)."""
    def f(x):
        torch.set_autocast_enabled("cpu", True)
        y = lin(x)
        torch.set_autocast_enabled("cpu", False)
        return y
    x = torch.randn(4, 8)
    with torch.no_grad():
        compiled = ember.compile(f)
        for _ in range(2):
            _assert_same(f(x), compiled(x))
    assert _breaks(compiled)
    assert not torch.is_autocast_enabled("cpu")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("name,fn", NEUTRAL_CASES + ARGUMENT_DEPENDENT,
                         ids=[c[0] for c in NEUTRAL_CASES + ARGUMENT_DEPENDENT])
def test_cuda_ops_equal_eager_under_autocast(name, fn, dtype):
    """Whatever capture decides (casts, neutral, break), the result is eager's, dtype included."""
    if name in ("inverse",):
        pytest.skip("cuSOLVER")
    x = _x.cuda()
    torch.set_default_device("cuda")  # the cases build helper tensors without device=
    try:
        for input_dtype in (torch.float32, dtype):
            with torch.autocast("cuda", dtype=dtype):
                try:
                    expected = fn(x.to(input_dtype))
                except RuntimeError:
                    continue  # not supported by eager for this dtype
                compiled = _compile(lambda x: fn(x), "eager")
                actual = compiled(x.to(input_dtype))
            _assert_same(expected, actual)
    finally:
        torch.set_default_device(None)
