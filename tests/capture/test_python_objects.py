"""Python patterns of real model code (Hugging Face style), each as a small hand-written function.

Every test checks: one graph, no break, output equal to eager (types included), and
where the pattern reads outside state, that changing it recompiles (guard soundness).
"""
import collections
import contextlib
import dataclasses
import enum
import functools
import inspect
from collections.abc import MutableMapping

import torch
from torch import nn

from .test_functions import assert_same as assert_same_values


def assert_same(actual, expected):
    """assert_same, plus plain objects compared by type and __dict__ (and dict items for mappings)."""
    if hasattr(expected, "__dict__") and not isinstance(expected, (torch.Tensor, type, enum.Enum)) \
            and type(expected).__eq__ is object.__eq__:
        assert type(actual) is type(expected)
        assert_same_values(dict(vars(actual)), dict(vars(expected)))
        if isinstance(expected, dict):
            assert_same_values(dict(actual), dict(expected))
    elif isinstance(expected, (tuple, list)) and type(expected) in (tuple, list):
        assert type(actual) is type(expected) and len(actual) == len(expected)
        for a, e in zip(actual, expected):
            assert_same(a, e)
    else:
        assert_same_values(actual, expected)


def captured_once(compile_fn, fn, *args, **kwargs):
    captured = compile_fn(fn)
    expected = fn(*args, **kwargs)
    actual = captured(*args, **kwargs)
    assert_same(actual, expected)
    assert [e.break_reason for e in captured.events] == [None]
    assert_same(captured(*args, **kwargs), expected)
    assert len(captured.events) == 1, "second call must hit the cache"
    return captured, actual


# ---------------------------------------------------------------- ModelOutput-like (OrderedDict dataclass)
class Output(collections.OrderedDict):
    """Mimics transformers.utils.ModelOutput: a dataclass whose non-None fields are also dict items."""

    def __post_init__(self):
        class_fields = dataclasses.fields(self)
        for field in class_fields:
            v = self.__dict__.get(field.name)
            if v is not None:
                self[field.name] = v

    def __getitem__(self, k):
        if isinstance(k, str):
            return dict(self.items())[k]
        return self.to_tuple()[k]

    def __setattr__(self, name, value):
        if name in {f.name for f in dataclasses.fields(self)} and value is not None:
            super().__setitem__(name, value)
        super().__setattr__(name, value)

    def __setitem__(self, key, value):
        super().__setitem__(key, value)
        super().__setattr__(key, value)

    def to_tuple(self):
        return tuple(self[k] for k in self.keys())


@dataclasses.dataclass
class LMOutput(Output):
    loss: torch.Tensor | None = None
    logits: torch.Tensor | None = None
    hidden: tuple | None = None


def test_model_output_dataclass_ordered_dict(compile_fn):
    def f(x):
        out = LMOutput(logits=x * 2, hidden=(x,))
        first = out[0] + out["logits"] + out.logits
        return LMOutput(logits=first, hidden=out.hidden), len(out), "loss" in out

    _, (out, n, has_loss) = captured_once(compile_fn, f, torch.randn(3))
    assert type(out) is LMOutput and list(out.keys()) == ["logits", "hidden"] and out.loss is None
    assert n == 2 and has_loss is False


class _RenamingMeta(type):
    """transformers 5.24's ModelOutput metaclass: wraps each subclass's __init__ as it is set."""

    def __setattr__(cls, name, value):
        if name == "__init__":
            init = value

            @functools.wraps(init)
            def __init__(self, *args, **kwargs):
                if "old_logits" in kwargs:
                    kwargs["logits"] = kwargs.pop("old_logits")
                init(self, *args, **kwargs)
            value = __init__
        super().__setattr__(name, value)


class MetaOutput(Output, metaclass=_RenamingMeta):
    pass


@dataclasses.dataclass
class MetaLMOutput(MetaOutput):
    logits: torch.Tensor | None = None
    hidden: tuple | None = None


def test_model_output_with_a_metaclass_that_wraps_init(compile_fn):
    def f(x):
        out = MetaLMOutput(old_logits=x * 2, hidden=(x,))
        return MetaLMOutput(logits=out[0] + out.logits, hidden=out.hidden)

    _, out = captured_once(compile_fn, f, torch.randn(3))
    assert type(out) is MetaLMOutput and list(out.keys()) == ["logits", "hidden"]


class _CountingMeta(type):
    calls = 0

    def __call__(cls, *args, **kwargs):
        _CountingMeta.calls += 1
        return super().__call__(*args, **kwargs)


class Counted(metaclass=_CountingMeta):
    def __init__(self, value):
        self.value = value


def test_a_metaclass_call_runs_natively(compile_fn):
    """A metaclass with __call__ decides how instances are made: not traced, and its effect happens
    once per call, as in eager."""
    def f(x):
        return Counted(x + 1).value * 2

    compiled = compile_fn(f)
    x = torch.randn(3)
    before = _CountingMeta.calls
    for _ in range(2):
        assert_same(compiled(x), f(x))
    assert _CountingMeta.calls - before == 4


@dataclasses.dataclass
class Stats:
    total: torch.Tensor
    scale: float = 1.0
    scaled: torch.Tensor = dataclasses.field(init=False)

    def __post_init__(self):
        self.scaled = self.total * self.scale


def test_dataclass_with_post_init_and_init_false(compile_fn):
    def f(x):
        return Stats(x.sum(), scale=3.0)

    captured_once(compile_fn, f, torch.randn(4))


# ---------------------------------------------------------------- plain classes, properties, cached properties
class Box:
    kind = "box"  # class-level attribute

    def __init__(self, value, factor=2):
        self.value = value
        self.factor = factor

    @property
    def doubled(self):
        return self.value * self.factor

    @functools.cached_property
    def tripled(self):
        return self.value * 3

    def __len__(self):
        return 1


def test_instance_created_in_trace(compile_fn):
    def f(x):
        box = Box(x)
        box.extra = box.doubled + box.tripled + box.tripled
        return box, box.kind, bool(box)

    _, (box, kind, truth) = captured_once(compile_fn, f, torch.randn(3))
    assert type(box) is Box and kind == "box" and truth
    assert "tripled" in box.__dict__


class Scaled(nn.Module):
    use_bias = True  # class attribute read through the module

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)

    @property
    def weight_t(self):
        return self.linear.weight.t()

    def forward(self, x):
        y = x @ self.weight_t
        if self.use_bias:
            y = y + self.linear.bias
        return y


def test_module_property_and_class_attribute_guarded(compile_fn):
    model = Scaled().eval()
    x = torch.randn(2, 4)
    captured, _ = captured_once(compile_fn, model, x)
    Scaled.use_bias = False
    try:
        assert_same(captured(x), model(x))
        assert len(captured.events) == 2, "changing a class attribute must recompile"
    finally:
        Scaled.use_bias = True


# ---------------------------------------------------------------- compile-state checks, kwargs, getattr(config)
def test_compile_state_queries_are_constants(compile_fn):
    def f(x):
        if torch.jit.is_tracing() or torch.jit.is_scripting():
            x = x * 100
        if not torch.compiler.is_compiling():
            x = x.sum()  # eager-only path (e.g. a data-dependent check)
        return x + 1

    captured = compile_fn(f)
    x = torch.randn(3)
    torch.testing.assert_close(captured(x), x + 1)
    assert captured.events[0].graph is not None


class Config:
    hidden = 4
    use_gate = False

    def __init__(self):
        self.eps = 1e-5


def test_kwargs_plumbing_and_getattr_config(compile_fn):
    config = Config()

    def inner(x, scale=1.0, **kwargs):
        if kwargs.get("shift") is not None:
            x = x + kwargs.pop("shift")
        return x * scale, kwargs

    def f(x, **kwargs):
        eps = getattr(config, "eps", 0.0)
        gate = getattr(config, "gate_value", None)
        if gate is not None or getattr(config, "use_gate", False):
            x = x * 0
        y, rest = inner(x, **kwargs)
        return y + eps, rest

    captured, _ = captured_once(compile_fn, f, torch.randn(3), scale=2.0, shift=1.0, tag="t")
    config.gate_value = 3.0
    try:
        x = torch.randn(3)
        assert_same(captured(x, scale=2.0, shift=1.0, tag="t"), f(x, scale=2.0, shift=1.0, tag="t"))
        assert len(captured.events) == 2, "a new config attribute must recompile"
    finally:
        del config.gate_value


def test_isinstance_against_many_classes(compile_fn):
    def f(x, extra):
        if isinstance(extra, (list, tuple)) and not isinstance(extra, (dict, str, Box)):
            x = x + sum(extra)
        if isinstance(x, (torch.Tensor, nn.Parameter)) and isinstance(extra, collections.abc.Sequence):
            x = x * 2
        return x

    captured_once(compile_fn, f, torch.randn(3), (1.0, 2.0))


# ---------------------------------------------------------------- registries: dict subclasses and Mapping interfaces
class Registry(dict):
    def get(self, key):
        return super().get(key) or {}


REGISTRY = Registry(a={"scale": 2.0})


class Interface(MutableMapping):
    _global_mapping = {"double": lambda x: x * 2, "square": lambda x: x * x}  # noqa: RUF012 (as in HF)

    def __init__(self):
        self._local_mapping = {}

    def __getitem__(self, key):
        if key in self._local_mapping:
            return self._local_mapping[key]
        return self._global_mapping[key]

    def __setitem__(self, key, value):
        self._local_mapping.update({key: value})

    def __delitem__(self, key):
        del self._local_mapping[key]

    def __iter__(self):
        return iter({**self._global_mapping, **self._local_mapping})

    def __len__(self):
        return len(self._global_mapping.keys() | self._local_mapping.keys())

    def lookup(self, name, default):
        if name not in self:
            raise KeyError(name)
        return super().get(name, default)


FUNCTIONS = Interface()


def test_dict_subclass_registry_is_guarded_per_key(compile_fn):
    def f(x):
        scale = REGISTRY.get("a").get("scale", 1.0)
        missing = REGISTRY.get("zzz")
        return x * scale, missing

    captured, _ = captured_once(compile_fn, f, torch.randn(3))
    REGISTRY["unrelated"] = {}  # another key: no recompile needed
    captured(torch.randn(3))
    assert len(captured.events) == 1
    REGISTRY["a"] = {"scale": 5.0}
    try:
        x = torch.randn(3)
        assert_same(captured(x), f(x))
        assert len(captured.events) == 2
    finally:
        REGISTRY["a"] = {"scale": 2.0}
        del REGISTRY["unrelated"]


def test_mutable_mapping_interface(compile_fn):
    def f(x):
        fn = FUNCTIONS.lookup("square", None)
        return fn(x) + len(FUNCTIONS)

    captured, _ = captured_once(compile_fn, f, torch.randn(3))
    FUNCTIONS["square"] = lambda x: x + 100  # a local override
    try:
        x = torch.randn(3)
        assert_same(captured(x), f(x))
        assert len(captured.events) == 2
    finally:
        del FUNCTIONS["square"]


# ---------------------------------------------------------------- inspect, partial, enums, with-blocks, super().__call__
class Chunked(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)

    def chunk(self, x):
        return self.proj(x)

    def forward(self, x):
        n_args = len(inspect.signature(self.chunk).parameters)
        assert n_args == 1
        return functools.partial(self.chunk)(x)


def test_inspect_signature_and_partial(compile_fn):
    captured_once(compile_fn, Chunked().eval(), torch.randn(2, 4))


def scaled_add(x, y, alpha=1.0):
    return x + alpha * y


ADD_TWICE = functools.partial(scaled_add, alpha=2.0)


def test_partial_from_outside_and_inside(compile_fn):
    def f(x, y):
        inner = functools.partial(scaled_add, y=y)
        return ADD_TWICE(x, y) + inner(x, alpha=3.0)

    captured_once(compile_fn, f, torch.randn(3), torch.randn(3))


class Mode(enum.Enum):
    SUM = "sum"
    MEAN = "mean"


def test_enums(compile_fn):
    def f(x, mode):
        mode = Mode(mode) if isinstance(mode, str) else mode
        if mode is Mode.SUM:
            return x.sum()
        return x.mean()

    captured, _ = captured_once(compile_fn, f, torch.randn(3), "sum")
    x = torch.randn(3)
    assert_same(captured(x, Mode.MEAN), f(x, Mode.MEAN))


class Tracker:
    def __init__(self, factor):
        self.factor = factor

    def __enter__(self):
        return self.factor

    def __exit__(self, *exc):
        return False


def test_python_context_managers(compile_fn):
    def f(x):
        with contextlib.nullcontext():
            x = x + 1
        with Tracker(3.0) as factor:
            x = x * factor
        return x

    captured_once(compile_fn, f, torch.randn(3))


class CheckpointingLayer(nn.Module):
    """Mimics transformers' GradientCheckpointingLayer: __call__ overridden, then super().__call__."""

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(4, 4)

    def __call__(self, *args, **kwargs):
        if self.training and kwargs.get("use_cache"):
            kwargs["use_cache"] = False
        return super().__call__(*args, **kwargs)

    def forward(self, x, use_cache=False):
        return self.linear(x)


def test_module_call_override_with_super_call(compile_fn):
    captured_once(compile_fn, CheckpointingLayer().eval(), torch.randn(2, 4), use_cache=True)


def test_global_torch_state_queries_are_guarded(compile_fn):
    def f(x):
        return x + torch.zeros(3, dtype=torch.get_default_dtype()).to(x.dtype)

    captured = compile_fn(f)
    x = torch.randn(3)
    captured(x)
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        captured(x)
        assert len(captured.events) == 2, "a changed default dtype must recompile"
    finally:
        torch.set_default_dtype(old)


def test_operator_and_on_tensors_is_not_in_place(compile_fn):
    def f(a, b):
        result = a.new_ones((), dtype=torch.bool)
        result = result & (a > 0)
        return result | (b > 0)

    captured_once(compile_fn, f, torch.randn(3), torch.randn(3))


def test_getattr_default_on_constants(compile_fn):
    def f(x, cache=None):
        if cache is not None and getattr(cache, "is_compileable", False):
            x = x * 2
        return x + getattr(None, "missing", 1.0)

    captured_once(compile_fn, f, torch.randn(3))


def test_tracing_queries_are_inlined_not_special_cased():
    """Library code asks torch.jit / torch.fx whether it is being traced; capture evaluates those
    Python helpers like user code (answering only their C-level leaves) and never breaks on them."""
    import torch.fx  # noqa: F401  (makes torch.fx._symbolic_trace importable)
    import ember

    def fn(x):
        if torch.jit.is_tracing() or torch.jit.is_scripting() or torch.fx._symbolic_trace.is_fx_tracing():
            return x - 1
        return x + 1

    x = torch.randn(3)
    compiled = ember.compile(fn, fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(x), fn(x))
