"""Autocast in capture: its state while tracing, the guard on it, and eager's per-op casts.

Eager autocast casts the tensor arguments of some ops inside the dispatcher: matmul,
convolution, linear, attention... to the autocast dtype ("lower precision"), losses and
linear algebra to float32, cat/stack (CPU) to the widest floating dtype among their
arguments.  Capture records those casts as explicit ``Tensor.to`` nodes in front of the
op, so the graph says what eager computes, and the compiled graph runs with autocast
*off* (``run_without_autocast``): a live autocast would otherwise cast the graph's ops
again and their metadata would lie.

Which ops autocast touches comes from the dispatcher (an op registered for the
``AutocastCPU`` / ``AutocastCUDA`` key); each registered op must be in the policy tables
below, and an op that could reach registered ops through a C++ decomposition
(CompositeImplicitAutograd) or Python code must be on the neutral list, checked against
eager by tests/capture/test_autocast_matrix.py.  Anything else under autocast is a graph
break: eager runs it, which is always right.
"""
from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch

from ..errors import Unsupported
from ..graph import target_name
from . import values as V

LOWER = "lower_precision_fp"     # eligible tensors -> the autocast dtype
FP32 = "fp32"                    # eligible tensors -> float32
FP32_OPT_DTYPE = "fp32_set_opt_dtype"  # no dtype= given: compute in float32 (first argument cast)
PROMOTE = "promote"              # eligible tensors -> widest of (autocast dtype, their dtypes)
BANNED = "banned"                # eager raises under autocast
NEUTRAL = "neutral"              # autocast does not change the op
UNKNOWN = "unknown"

DEVICES = ("cpu", "cuda")
_KEYS = {"cpu": "AutocastCPU", "cuda": "AutocastCUDA"}

# ------------------------------------------------------------------ policies (PyTorch's autocast_mode.cpp)
_CPU_LOWER = """conv1d conv2d conv3d bmm mm linalg_vecdot baddbmm addmm addbmm linear _convolution matmul
    conv_tbc mkldnn_rnn_layer conv_transpose1d conv_transpose2d conv_transpose3d prelu
    scaled_dot_product_attention _native_multi_head_attention _addmm_activation"""
_CPU_FP32 = """avg_pool3d binary_cross_entropy grid_sampler polar prod quantile nanquantile stft cdist trace
    view_as_complex cholesky cholesky_inverse cholesky_solve inverse lu_solve orgqr ormqr pinverse max_pool3d
    max_unpool2d max_unpool3d adaptive_avg_pool3d reflection_pad1d reflection_pad2d replication_pad1d
    replication_pad2d replication_pad3d mse_loss cosine_embedding_loss nll_loss nll_loss2d hinge_embedding_loss
    poisson_nll_loss smooth_l1_loss cross_entropy_loss l1_loss huber_loss margin_ranking_loss soft_margin_loss
    triplet_margin_loss multi_margin_loss ctc_loss kl_div multilabel_margin_loss binary_cross_entropy_with_logits
    fft_fft fft_ifft fft_fft2 fft_ifft2 fft_fftn fft_ifftn fft_rfft fft_irfft fft_rfft2 fft_irfft2 fft_rfftn
    fft_irfftn fft_hfft fft_ihfft linalg_cond linalg_matrix_rank linalg_solve linalg_cholesky linalg_svdvals
    linalg_eigvals linalg_eigvalsh linalg_inv linalg_householder_product linalg_tensorinv linalg_tensorsolve
    fake_quantize_per_tensor_affine geqrf _lu_with_info qr svd triangular_solve fractional_max_pool2d
    fractional_max_pool3d adaptive_max_pool3d multilabel_margin_loss_forward linalg_qr linalg_cholesky_ex
    linalg_svd linalg_eig linalg_eigh linalg_lstsq linalg_inv_ex grid_sampler_2d grid_sampler_3d
    _grid_sampler_2d_cpu_fallback cross_entropy"""
_CPU_PROMOTE = "stack cat index_copy concat concatenate"

_CUDA_LOWER = """_convolution conv1d conv2d conv3d conv_tbc conv_transpose1d conv_transpose2d conv_transpose3d
    convolution cudnn_convolution cudnn_convolution_transpose prelu addmm addmv addr matmul einsum mm mv
    linalg_vecdot linear addbmm baddbmm bmm chain_matmul linalg_multi_dot _thnn_fused_lstm_cell
    _thnn_fused_gru_cell lstm_cell gru_cell rnn_tanh_cell rnn_relu_cell _scaled_dot_product_flash_attention
    scaled_dot_product_attention"""
_CUDA_FP32 = """acos asin cosh erfinv exp expm1 log log10 log2 log1p reciprocal rsqrt sinh tan pow softplus
    layer_norm native_layer_norm group_norm frobenius_norm nuclear_norm cosine_similarity poisson_nll_loss
    cosine_embedding_loss nll_loss nll_loss2d hinge_embedding_loss kl_div l1_loss smooth_l1_loss huber_loss
    mse_loss margin_ranking_loss multilabel_margin_loss soft_margin_loss triplet_margin_loss multi_margin_loss
    binary_cross_entropy_with_logits dist pdist cdist renorm logsumexp upsample_nearest1d upsample_nearest2d
    upsample_nearest3d _upsample_nearest_exact1d _upsample_nearest_exact2d _upsample_nearest_exact3d
    upsample_linear1d upsample_bilinear2d _upsample_bilinear2d_aa upsample_trilinear3d upsample_bicubic2d
    _upsample_bicubic2d_aa rms_norm norm"""
_CUDA_FP32_OPT_DTYPE = """prod softmax log_softmax cumprod cumsum linalg_vector_norm linalg_matrix_norm sum"""
_CUDA_PROMOTE = "addcdiv addcmul atan2 bilinear cross dot vdot grid_sampler index_put tensordot scatter_add"
_CUDA_BANNED = "binary_cross_entropy"

POLICIES: dict[str, dict[str, str]] = {
    "cpu": {**{n: LOWER for n in _CPU_LOWER.split()}, **{n: FP32 for n in _CPU_FP32.split()},
            **{n: PROMOTE for n in _CPU_PROMOTE.split()}},
    "cuda": {**{n: LOWER for n in _CUDA_LOWER.split()}, **{n: FP32 for n in _CUDA_FP32.split()},
             **{n: FP32_OPT_DTYPE for n in _CUDA_FP32_OPT_DTYPE.split()},
             **{n: PROMOTE for n in _CUDA_PROMOTE.split()}, **{n: BANNED for n in _CUDA_BANNED.split()}},
}

# Python functions and C++ composite ops whose decomposition reaches no op that autocast
# changes (checked against eager, op by op, in tests/capture/test_autocast_matrix.py).
_NEUTRAL_COMMON = """to type_as reshape view_as reshape_as expand_as flatten unflatten contiguous split chunk
    unsafe_split tensor_split hsplit vsplit squeeze unsqueeze index getitem index_put_ setitem narrow select
    movedim moveaxis swapaxes swapdims transpose t permute where relu relu6 silu mish hardswish hardsigmoid
    elu selu celu leaky_relu hardtanh gelu glu logsigmoid softsign tanhshrink softshrink hardshrink threshold
    sigmoid tanh dropout dropout1d dropout2d dropout3d alpha_dropout feature_alpha_dropout feature_dropout
    batch_norm instance_norm embedding pad max_pool1d max_pool2d avg_pool1d avg_pool2d adaptive_avg_pool1d
    adaptive_avg_pool2d adaptive_max_pool1d adaptive_max_pool2d pixel_shuffle pixel_unshuffle one_hot
    clone detach float half bfloat16 double int long bool repeat tile expand broadcast_to masked_fill
    fill_ zero_ copy_ add sub mul div true_divide floor_divide remainder neg positive abs bitwise_not
    bitwise_and bitwise_or bitwise_xor lt le eq ne gt ge maximum minimum clamp clip flip roll
    new_zeros new_ones new_full new_empty zeros_like ones_like full_like empty_like rand_like randn_like
    rsub mean std var var_mean std_mean amax amin max min argmax argmin all any"""
_NEUTRAL_BY_DEVICE = {
    "cpu": """softmax log_softmax softmin layer_norm group_norm rms_norm normalize sum cumsum pow square exp log
        rsqrt reciprocal logsumexp interpolate upsample_nearest2d upsample_bilinear2d norm""",
    # CUDA kernels may call ops that CUDA autocast changes (trace_cuda is diagonal().sum(), and sum
    # is fp32 there), so on CUDA only the names listed here are neutral, besides the table
    "cuda": """sin cos atan sqrt erf erfc floor ceil round trunc frac sign sgn signbit exp2 log_sigmoid isnan
        isinf isfinite nan_to_num logical_and logical_or logical_not logical_xor lerp fmod fmin fmax hypot
        logaddexp logaddexp2 xlogy sinc deg2rad rad2deg heaviside copysign nextafter lgamma digamma erfinv_
        clamp_min clamp_max sort argsort topk kthvalue cummax cummin gather scatter scatter_reduce index_select
        index_add index_fill index_copy take take_along_dim masked_scatter tril triu diagonal diag_embed cat
        stack hstack vstack dstack concat concatenate unbind split_with_sizes repeat_interleave unfold
        as_strided select_scatter slice_scatter diagonal_scatter narrow_copy constant_pad_nd native_dropout
        native_batch_norm max_pool2d_with_indices max_pool3d avg_pool3d adaptive_avg_pool3d
        adaptive_max_pool3d rot90 view nansum arange zeros ones full empty rand randn randint randperm
        normal bernoulli zeros_like ones_like empty_like full_like floor_divide remainder __lshift__
        __rshift__ sub_ add_ mul_ div_ copy_ clamp_ relu_ gelu_ silu_ sigmoid_ tanh_ masked_fill_ index_put
        fill_ zero_ neg_ abs_ hardtanh_ leaky_relu_ elu_ hardswish_ hardsigmoid_ mish_ lt_ gt_ le_ ge_ eq_ ne_
        where_""",
}
# neutral names whose decomposition depends on an argument: (position, keyword, values that are NOT neutral);
# F.pad(mode="reflect") reaches reflection_pad (fp32 on CPU), "circular" reaches cat (promote),
# F.interpolate(mode="area") reaches adaptive_avg_pool3d, x.norm(p="nuc") reaches svd
_NEUTRAL_UNLESS = {"pad": (2, "mode", {"reflect", "replicate", "circular"}),
                   "interpolate": (3, "mode", {"area"}), "norm": (1, "p", {"nuc"})}
NEUTRAL_NAMES = {device: set(_NEUTRAL_COMMON.split()) | set(_NEUTRAL_BY_DEVICE[device].split())
                 for device in DEVICES}

_DUNDER = {"add": "add", "sub": "sub", "mul": "mul", "truediv": "div", "floordiv": "floor_divide",
           "mod": "remainder", "pow": "pow", "matmul": "matmul", "and": "bitwise_and", "or": "bitwise_or",
           "xor": "bitwise_xor", "lshift": "__lshift__", "rshift": "__rshift__", "neg": "neg",
           "pos": "positive", "invert": "bitwise_not", "abs": "abs", "lt": "lt", "le": "le", "eq": "eq",
           "ne": "ne", "gt": "gt", "ge": "ge", "getitem": "getitem", "setitem": "setitem", "and_": "bitwise_and",
           "or_": "bitwise_or"}


def op_name(target: Any) -> str:
    """The ATen-level name autocast knows the op by: ``operator.matmul`` -> 'matmul',
    ``Tensor.__radd__`` -> 'add', ``operator.iadd`` -> 'add_'."""
    name = target_name(target)
    is_operator = getattr(target, "__module__", None) in ("_operator", "operator")
    if name.startswith("__") and name.endswith("__"):
        core = name[2:-2]
        in_place = core.startswith("i") and core[1:] in _DUNDER
        if in_place:
            return _DUNDER[core[1:]] + "_"
        if core.startswith("r") and core[1:] in _DUNDER:
            core = core[1:]
        return _DUNDER.get(core, name)
    if is_operator:
        if name.startswith("i") and name[1:] in _DUNDER:
            return _DUNDER[name[1:]] + "_"
        return _DUNDER.get(name, name)
    return name


@functools.lru_cache(maxsize=None)
def _aten_facts(name: str) -> tuple[bool, bool, frozenset[str]]:
    """(an ATen op of this name exists, some overload is CompositeImplicitAutograd, devices whose
    autocast key has a kernel for some overload)."""
    packet = getattr(torch.ops.aten, name, None) if name.isidentifier() else None
    if packet is None:
        return False, False, frozenset()
    has_kernel = torch._C._dispatch_has_kernel_for_dispatch_key
    composite, registered = False, set()
    for overload in packet.overloads():
        full = f"aten::{name}" + ("" if overload == "default" else f".{overload}")
        try:
            composite = composite or has_kernel(full, "CompositeImplicitAutograd")
            registered.update(device for device, key in _KEYS.items() if has_kernel(full, key))
        except RuntimeError:  # TorchScript-only overloads (eq.int_list) are not dispatcher ops
            continue
    return True, composite, frozenset(registered)


# user-level names whose ATen op has another name
_ATEN_ALIASES = {"cross_entropy": "cross_entropy_loss", "concat": "cat", "concatenate": "cat"}


def classify(name: str, device: str) -> str:
    """The autocast policy of an op on a device type: one of the policies, NEUTRAL or UNKNOWN.

    A table policy applies only where this torch registers the op for the device's autocast
    key (policies move between releases; a stale entry must not cast what eager does not)."""
    exists, composite, registered = _aten_facts(_ATEN_ALIASES.get(name, name))
    if device in registered:
        return POLICIES.get(device, {}).get(name, UNKNOWN)
    if name in NEUTRAL_NAMES.get(device, ()):
        return NEUTRAL
    if device == "cpu" and exists and not composite:
        return NEUTRAL  # a CPU kernel of its own: the autocast key falls through to it
    return UNKNOWN


# ------------------------------------------------------------------ state and guards
_any_enabled = getattr(torch._C, "_is_any_autocast_enabled", None)


def entry_state() -> tuple | None:
    """The autocast state a cache entry depends on; None (the common case) when all is off."""
    if _any_enabled is not None and not _any_enabled():
        return None
    cpu, cuda = torch.is_autocast_enabled("cpu"), torch.is_autocast_enabled("cuda")
    if not cpu and not cuda:
        return None
    return (cpu, torch.get_autocast_dtype("cpu") if cpu else None,
            cuda, torch.get_autocast_dtype("cuda") if cuda else None, torch.is_autocast_cache_enabled())


class AutocastState:
    """Autocast as the traced code sees it, per device type, changed by traced with-blocks."""

    def __init__(self, guards: Any) -> None:
        self.guards = guards
        self.entry = entry_state()
        if self.entry is None and _any_enabled is not None and not _any_enabled():
            guards.add(None, "not {any_autocast}()", any_autocast=_any_enabled)  # one C call: the common case
        else:
            guards.add(None, "{state}() == {key}", state=entry_state, key=self.entry)
        self.enabled = {device: False for device in DEVICES}
        self._dtype: dict[str, torch.dtype] = {}
        self._cache_enabled: bool | None = None
        if self.entry is not None:
            cpu, cpu_dtype, cuda, cuda_dtype, cache = self.entry
            self.enabled.update(cpu=cpu, cuda=cuda)
            self._dtype.update({d: t for d, t in (("cpu", cpu_dtype), ("cuda", cuda_dtype)) if t is not None})
            self._cache_enabled = cache

    def any_enabled(self) -> bool:
        return self.enabled["cpu"] or self.enabled["cuda"]

    def entry_enabled_devices(self) -> tuple[str, ...]:
        if self.entry is None:
            return ()
        return tuple(device for device, on in (("cpu", self.entry[0]), ("cuda", self.entry[2])) if on)

    def dtype(self, device: str) -> torch.dtype:
        """The autocast dtype of a device (read from torch, and guarded, the first time)."""
        if device not in self._dtype:
            real = torch.get_autocast_dtype(device)
            self.guards.add(None, "torch.get_autocast_dtype({device}) == {dtype}", device=device, dtype=real)
            self._dtype[device] = real
        return self._dtype[device]

    def cache_enabled(self) -> bool:
        if self._cache_enabled is None:
            real = torch.is_autocast_cache_enabled()
            self.guards.add(None, "torch.is_autocast_cache_enabled() is {flag}", flag=real)
            self._cache_enabled = real
        return self._cache_enabled

    def snapshot(self) -> tuple:
        return dict(self.enabled), dict(self._dtype), self._cache_enabled

    def restore(self, snapshot: tuple) -> None:
        enabled, dtypes, cache = snapshot
        self.enabled, self._dtype, self._cache_enabled = dict(enabled), dict(dtypes), cache


def run_without_autocast(devices: tuple[str, ...], fn: Callable, args: tuple) -> Any:
    """``fn(*args)`` with autocast off on ``devices`` (the graph already holds eager's casts)."""
    previous = [(device, torch.is_autocast_enabled(device)) for device in devices]
    for device in devices:
        torch.set_autocast_enabled(device, False)
    try:
        return fn(*args)
    finally:
        for device, was in previous:
            torch.set_autocast_enabled(device, was)


# ------------------------------------------------------------------ with torch.autocast(...)
class AutocastValue(V.Value):
    """A ``torch.autocast`` object in the trace: entering it changes the traced state."""

    def __init__(self, device: str, dtype: torch.dtype, enabled: bool, cache_enabled: bool) -> None:
        super().__init__()
        self.device = device
        self.dtype = dtype
        self.enabled = enabled
        self.cache_enabled = cache_enabled
        self.previous: tuple | None = None
        # a block entered before a graph break: the real manager's __exit__, called after the graph
        # when the trace leaves the block (the graph itself does not change the global state)
        self.real_exit: Any = None

    def describe(self) -> str:
        return f"torch.autocast({self.device!r}, {self.dtype}, enabled={self.enabled})"

    def python_type(self) -> type:
        return torch.autocast


def is_autocast_class(cls: Any) -> bool:
    return isinstance(cls, type) and issubclass(cls, torch.autocast)


def make_autocast(tx: Any, cls: type, args: list[V.Value], kwargs: dict[str, V.Value]) -> AutocastValue:
    """``torch.autocast(...)`` / ``torch.amp.autocast`` / ``torch.cpu.amp.autocast(...)`` called in the
    trace: built for real (eager's validation and warnings) with defaults from the traced state."""
    state: AutocastState = tx.session.autocast
    try:
        python_args = [a.as_python() for a in args]
        python_kwargs = {k: v.as_python() for k, v in kwargs.items()}
        bound = inspect.signature(cls.__init__).bind(None, *python_args, **python_kwargs)
    except (Unsupported, TypeError) as error:
        raise tx.unsupported(f"torch.autocast arguments: {error}") from None
    arguments = dict(bound.arguments)
    arguments.pop(next(iter(arguments)))  # self
    device = arguments.get("device_type", "cpu" if "cpu" in cls.__module__ else "cuda")
    if device not in DEVICES:
        raise tx.unsupported(f"autocast on device type {device!r}")
    if cls is torch.autocast:
        if arguments.get("dtype") is None:
            arguments["dtype"] = state.dtype(device)
        if arguments.get("cache_enabled") is None:
            arguments["cache_enabled"] = state.cache_enabled()
    real = cls(**arguments)
    return from_real(real)


def from_real(real: Any) -> AutocastValue:
    return AutocastValue(real.device, real.fast_dtype, bool(real._enabled), bool(real._cache_enabled))


def enter_block(tx: Any, manager: AutocastValue) -> None:
    state: AutocastState = tx.session.autocast
    manager.previous = state.snapshot()
    state.dtype(manager.device)  # known (and guarded) before the block changes it
    state.enabled[manager.device] = manager.enabled
    state._dtype[manager.device] = manager.dtype
    state._cache_enabled = manager.cache_enabled


def exit_block(tx: Any, manager: AutocastValue) -> None:
    if manager.previous is not None:
        tx.session.autocast.restore(manager.previous)
        manager.previous = None
    if manager.real_exit is not None:
        tx.session.replayed_calls.append((manager.real_exit, [V.NONE, V.NONE, V.NONE], {}))
        manager.real_exit = None


def from_real_exit(state: AutocastState, exit_method: Any) -> AutocastValue:
    """The ``__exit__`` of a real autocast block a continuation starts inside: the block's state is the
    current one, and the state before it is what the real manager will restore."""
    real = exit_method.__self__
    manager = from_real(real)
    enabled, dtypes, cache = state.snapshot()
    enabled[real.device] = bool(real.prev)
    dtypes[real.device] = real.prev_fastdtype
    manager.previous = (enabled, dtypes, bool(real.prev_cache_enabled))
    manager.real_exit = exit_method
    return manager


def enter_real_block(device: str, dtype: torch.dtype, enabled: bool, cache_enabled: bool) -> Any:
    """A real autocast block entered at a graph break; the continuation's ``with`` exit calls the
    returned ``__exit__``."""
    manager = torch.autocast(device, dtype=dtype, enabled=enabled, cache_enabled=cache_enabled)
    manager.__enter__()
    return manager.__exit__


# ------------------------------------------------------------------ queries in the trace
def _query_device(args: list, kwargs: dict, default: str) -> str:
    if args:
        return args[0]
    return kwargs.get("device_type", default)


QUERIES: dict[Any, Callable] = {}


def _register_queries() -> None:
    def enabled(state, args, kwargs):
        return state.enabled.get(_query_device(args, kwargs, "cuda"), False)
    table = {
        "is_autocast_enabled": enabled,
        "get_autocast_dtype": lambda state, args, kwargs: state.dtype(_query_device(args, kwargs, "cuda")),
        "is_autocast_cpu_enabled": lambda state, args, kwargs: state.enabled["cpu"],
        "get_autocast_cpu_dtype": lambda state, args, kwargs: state.dtype("cpu"),
        "get_autocast_gpu_dtype": lambda state, args, kwargs: state.dtype("cuda"),
        "is_autocast_cache_enabled": lambda state, args, kwargs: state.cache_enabled(),
    }
    for name, answer in table.items():
        fn = getattr(torch, name, None)
        if fn is not None:
            QUERIES[fn] = answer


_register_queries()


def answer_query(tx: Any, fn: Any, args: list[V.Value], kwargs: dict[str, V.Value]) -> V.Value:
    python_args = [a.as_python() for a in args]
    python_kwargs = {k: v.as_python() for k, v in kwargs.items()}
    return V.ConstantValue(QUERIES[fn](tx.session.autocast, python_args, python_kwargs))


# ------------------------------------------------------------------ casts in front of an op
def _tensors(value: Any, out: list) -> None:
    if isinstance(value, V.TensorValue):
        out.append(value)
    elif isinstance(value, (V.TupleValue, V.ListValue)):
        for item in value.items:
            _tensors(item, out)


def _neutral_for_these_arguments(name: str, args: list, kwargs: dict) -> bool:
    condition = _NEUTRAL_UNLESS.get(name)
    if condition is None:
        return True
    position, keyword, not_neutral = condition
    value = kwargs.get(keyword, args[position] if len(args) > position else None)
    if value is None:
        return True
    if not isinstance(value, V.ConstantValue):
        return False
    return value.value not in not_neutral


def _has_dtype_argument(args: list, kwargs: dict) -> bool:
    dtype = kwargs.get("dtype")
    if dtype is not None and not (isinstance(dtype, V.ConstantValue) and dtype.value is None):
        return True
    return any(isinstance(a, V.ConstantValue) and isinstance(a.value, torch.dtype) for a in args)


def apply_casts(session: Any, target: Any, args: list, kwargs: dict,
                record: Callable) -> tuple[list, dict]:
    """Eager's autocast casts for ``target(*args, **kwargs)``, recorded with ``record`` (a cast
    recorder: ``record(value, dtype) -> value``)."""
    state: AutocastState = session.autocast
    tensors: list[V.TensorValue] = []
    for value in list(args) + list(kwargs.values()):
        _tensors(value, tensors)
    active = sorted({t.meta.device.type for t in tensors if state.enabled.get(t.meta.device.type, False)})
    if not active:
        return args, kwargs
    line = session.current_line()
    name = op_name(target)
    if len(active) > 1:
        raise Unsupported(f"{name} under autocast with tensors on {' and '.join(active)}", line)
    device = active[0]
    if name == "div" and (target_name(target) in ("__rtruediv__", "__rdiv__") or
                          (args and not isinstance(args[0], V.TensorValue))):
        name = "reciprocal"  # `2 / x` is Tensor.__rdiv__: x.reciprocal() * 2 (fp32 under CUDA autocast)
    policy = classify(name, device)
    if policy == NEUTRAL and _neutral_for_these_arguments(name, args, kwargs):
        return args, kwargs
    if policy in (UNKNOWN, BANNED, NEUTRAL):  # NEUTRAL here: not for these arguments
        raise Unsupported(f"{name} under {device} autocast: capture does not model what autocast does to it",
                          line, "eager runs this frame")

    def eligible(t: V.TensorValue) -> bool:
        dtype = t.meta.dtype
        return t.meta.device.type == device and dtype.is_floating_point and dtype is not torch.float64

    if policy == FP32_OPT_DTYPE:
        first = args[0] if args else None
        if _has_dtype_argument(args, kwargs) or not isinstance(first, V.TensorValue) or not eligible(first):
            return args, kwargs
        return [record(first, torch.float32)] + list(args[1:]), kwargs
    if policy == LOWER:
        to = state.dtype(device)
    elif policy == FP32:
        to = torch.float32
    else:  # PROMOTE, as at::autocast::prioritize: float32 wins, else all must be the autocast dtype
        lower = to = state.dtype(device)
        for t in tensors:
            if not eligible(t):
                continue
            if to == torch.float32 or t.meta.dtype == torch.float32:
                to = torch.float32
            elif t.meta.dtype != lower:  # e.g. a float16 tensor under bfloat16 autocast: eager raises
                error = Unsupported(f"{name} under autocast mixes {t.meta.dtype} with {lower}", line)
                error.eager_may_raise = True
                raise error

    def cast(value: Any) -> Any:
        if isinstance(value, V.TensorValue):
            return record(value, to) if eligible(value) and value.meta.dtype != to else value
        if isinstance(value, V.TupleValue):
            return V.TupleValue([cast(v) for v in value.items], None, value.cls)
        if isinstance(value, V.ListValue):
            return V.ListValue([cast(v) for v in value.items])
        return value

    return [cast(a) for a in args], {k: cast(v) for k, v in kwargs.items()}
