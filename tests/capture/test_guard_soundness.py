"""Soundness of the cached-call fast paths: every change the graph depends on is seen.

Guards and placeholder fetches read modules' ``__dict__['_parameters'][name]`` (and
``_buffers``, ``_modules``) instead of ``Module.__getattr__``, index Sequential/ModuleList
through ``_modules``, and check tensors in one expression.  Each test changes the program
state in a way a wrong shortcut would miss, then compares with eager.
"""
import collections

import torch
import torch.nn.functional as F
from torch import nn

from .test_functions import assert_same


def n_compiles(captured):
    return sum(1 for e in captured.events if e.graph is not None)


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("shift", torch.randn(4))

    def forward(self, x):
        return self.lin(x) + self.shift


def check(captured, model, *args):
    expected = model(*args)
    actual = captured(*args)
    assert_same(actual, expected)
    if isinstance(expected, torch.Tensor):
        assert actual.dtype == expected.dtype and actual.requires_grad == expected.requires_grad
    return actual


def check_cached(captured, model, *args):
    """check, then again: the entry just compiled must hold (its sources read what capture read)."""
    check(captured, model, *args)
    compiles = n_compiles(captured)
    check(captured, model, *args)
    assert n_compiles(captured) == compiles


# ----------------------------------------------------------------- parameters and buffers
def test_parameter_replaced_same_and_new_shape(compile_fn):
    model, x = Net(), torch.randn(2, 4)
    captured = compile_fn(model)
    check(captured, model, x)
    model.lin.weight = nn.Parameter(torch.randn(4, 4))      # same metadata, new object: fetched anew
    check(captured, model, x)
    assert n_compiles(captured) == 1
    model.lin.weight = nn.Parameter(torch.randn(4, 4).t())  # new strides
    check(captured, model, x)
    assert n_compiles(captured) == 2
    model.lin.weight = nn.Parameter(torch.randn(3, 4))      # new shape
    model.lin.bias = nn.Parameter(torch.randn(3))
    model.shift = torch.randn(3)
    check(captured, model, x)
    assert n_compiles(captured) == 3


def test_parameter_set_to_none(compile_fn):
    model, x = Net(), torch.randn(2, 4)
    captured = compile_fn(model)
    check(captured, model, x)
    model.lin.bias = None
    check(captured, model, x)
    assert n_compiles(captured) == 2


def test_requires_grad_flip_is_seen(compile_fn):
    model, x = Net(), torch.randn(2, 4)
    captured = compile_fn(model)
    assert check(captured, model, x).requires_grad
    for p in model.parameters():
        p.requires_grad_(False)
    assert not check(captured, model, x).requires_grad
    assert n_compiles(captured) == 2


def test_module_to_dtype_is_seen(compile_fn):
    # Module.to() keeps the Parameter objects and swaps their .data: identity alone would miss it
    model = Net()
    captured = compile_fn(model)
    check(captured, model, torch.randn(2, 4))
    weight = model.lin.weight
    model.to(torch.float64)
    assert model.lin.weight is weight
    out = check(captured, model, torch.randn(2, 4, dtype=torch.float64))
    assert out.dtype is torch.float64


def test_parameter_data_swap_keeps_identity(compile_fn):
    model, x = Net(), torch.randn(2, 4)
    captured = compile_fn(model)
    check(captured, model, x)
    with torch.no_grad():
        model.lin.weight.data = torch.randn(2, 4)
        model.lin.bias.data = torch.randn(2)
        model.shift.data = torch.randn(2)
    check(captured, model, x)
    assert n_compiles(captured) == 2


def test_buffer_metadata_changed_in_place(compile_fn):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.register_buffer("table", torch.randn(3, 3))

        def forward(self, x):
            return x @ self.table

    model, x = M(), torch.randn(2, 3)
    captured = compile_fn(model)
    check(captured, model, x)
    model.table.t_()                      # same object, same shape, transposed strides
    check(captured, model, x)
    assert n_compiles(captured) == 2
    model.table.resize_(3, 2)
    check(captured, model, x)
    assert n_compiles(captured) == 3


def test_storage_offset_of_input_is_guarded(compile_fn):
    """A backend may rebuild views of inputs from placeholder meta (as_strided with the
    storage offset); an input with another offset but equal shape and strides must recompile."""
    from ember import capture

    def offset_backend(graph, example_inputs):
        placeholders = [n for n in graph.nodes if n.op == "placeholder"]
        meta = placeholders[0].meta
        return lambda x: (x.as_strided(meta.shape, meta.stride, meta.storage_offset),)

    def f(x):
        return x

    captured = capture.compile_function(f, backend=offset_backend)
    base = torch.arange(10.0)
    torch.testing.assert_close(captured(base[1:5]), base[1:5])
    torch.testing.assert_close(captured(base[3:7]), base[3:7])
    assert n_compiles(captured) == 2


# ----------------------------------------------------------------- where an attribute lives
def test_parameter_moved_to_instance_dict(compile_fn):
    model, x = Net(), torch.randn(2, 4)
    captured = compile_fn(model)
    check(captured, model, x)
    del model.lin.weight                  # as weight_norm / parametrize-style code does
    model.lin.weight = torch.randn(4, 4)  # a plain tensor: an instance attribute now
    assert "weight" in model.lin.__dict__
    check(captured, model, x)


def test_instance_attribute_shadowing_a_parameter(compile_fn):
    model, x = Net(), torch.randn(2, 4)
    captured = compile_fn(model)
    check(captured, model, x)
    object.__setattr__(model.lin, "weight", nn.Parameter(torch.randn(4, 4)))  # bypasses Module.__setattr__
    assert "weight" in model.lin._parameters
    check(captured, model, x)


def test_parameter_shadowing_a_buffer(compile_fn):
    model, x = Net(), torch.randn(2, 4)
    captured = compile_fn(model)
    check(captured, model, x)
    model._parameters["shift"] = nn.Parameter(torch.randn(4))  # __getattr__ reads _parameters first
    assert "shift" in model._buffers
    check(captured, model, x)


def test_class_attribute_shadows_a_buffer(compile_fn):
    class M(nn.Module):
        scale = 2.0  # Python finds this before Module.__getattr__ ever looks at _buffers

        def __init__(self):
            super().__init__()
            self.register_buffer("scale_buf", torch.tensor(3.0))
            self._buffers["scale"] = torch.tensor(5.0)

        def forward(self, x):
            return x * self.scale + self.scale_buf

    model, x = M(), torch.randn(3)
    captured = compile_fn(model)
    check(captured, model, x)
    check(captured, model, x)


def test_class_reassigned(compile_fn):
    class A(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(4, 4)

        def forward(self, x):
            return self.lin(x)

    class B(A):
        def forward(self, x):
            return self.lin(x) * 3

    class C(A):
        def __getattr__(self, name):  # attribute reads no longer end in Module.__getattr__
            if name == "lin":
                return nn.Identity()
            return super().__getattr__(name)

    model, x = A(), torch.randn(2, 4)
    outer = nn.Sequential(model)
    captured = compile_fn(outer)
    check(captured, outer, x)
    model.__class__ = B
    check(captured, outer, x)
    model.__class__ = C
    check(captured, outer, x)


def test_overridden_getattr_is_called_every_time(compile_fn):
    class Swapping(nn.Module):
        def __init__(self):
            super().__init__()
            self.w = nn.Parameter(torch.randn(4, 4))
            self.w2 = nn.Parameter(torch.randn(4, 4))

        def __getattr__(self, name):  # reads of "w" do not always end in _parameters["w"]
            if name == "w" and self.__dict__.get("swap"):
                return super().__getattr__("w2")
            return super().__getattr__(name)

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.s = Swapping()

        def forward(self, x):
            return x @ self.s.w

    model, x = M(), torch.randn(2, 4)
    captured = compile_fn(model)
    check(captured, model, x)
    model.s.swap = True
    check(captured, model, x)


# ----------------------------------------------------------------- containers
def test_sequential_positional_indexing_and_iteration(compile_fn):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.seq = nn.Sequential(collections.OrderedDict(
                [("first", nn.Linear(4, 4)), ("second", nn.Linear(4, 4)), ("third", nn.Tanh())]))

        def forward(self, x):
            x = self.seq[0](x) - self.seq[-1](x)
            for layer in self.seq:
                x = layer(x)
            return x

    model, x = M(), torch.randn(2, 4)
    captured = compile_fn(model)
    check_cached(captured, model, x)
    model.seq[0] = nn.Linear(4, 4)        # replaces the module under key "first"
    check_cached(captured, model, x)
    # same keys, new order: position 0 is now "second"
    model.seq._modules = collections.OrderedDict(reversed(list(model.seq._modules.items())))
    check_cached(captured, model, x)
    model.seq.append(nn.Linear(4, 4))
    check_cached(captured, model, x)
    del model.seq[1]
    check_cached(captured, model, x)


def test_module_list_index_by_key_iterate_by_position(compile_fn):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList([nn.Linear(4, 4), nn.Linear(4, 4)])

        def forward(self, x):
            y = self.layers[0](x)
            for layer in self.layers:
                y = layer(y) * 2
            return y

    model, x = M(), torch.randn(2, 4)
    captured = compile_fn(model)
    check_cached(captured, model, x)
    model.layers[1] = nn.Linear(4, 4)
    check_cached(captured, model, x)
    # ModuleList.__getitem__ reads key "0"; __iter__ walks values in dict order
    model.layers._modules = collections.OrderedDict([("1", model.layers[1]), ("0", model.layers[0])])
    check_cached(captured, model, x)
    model.layers.append(nn.Linear(4, 4))
    check_cached(captured, model, x)


def test_module_dict_item_replaced(compile_fn):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.heads = nn.ModuleDict({"a": nn.Linear(4, 4), "b": nn.Linear(4, 2)})

        def forward(self, x):
            return self.heads["a"](x).sum() + self.heads["b"](x).sum()

    model, x = M(), torch.randn(2, 4)
    captured = compile_fn(model)
    check_cached(captured, model, x)
    model.heads["a"] = nn.Linear(4, 4)
    check_cached(captured, model, x)
    model.heads["b"] = nn.Linear(4, 3)
    check_cached(captured, model, x)


def test_submodule_replaced_and_hook_added(compile_fn):
    model, x = Net(), torch.randn(2, 4)
    captured = compile_fn(model)
    check_cached(captured, model, x)
    model.lin = nn.Linear(4, 4)
    check_cached(captured, model, x)
    handle = model.lin.register_forward_hook(lambda m, args, out: out * 10)
    check_cached(captured, model, x)
    handle.remove()
    check_cached(captured, model, x)
    model.lin.eval()
    check_cached(captured, model, x)


def test_functional_on_fetched_parameters_matches(compile_fn):
    """Parameters fetched through the dicts feed the graph in placeholder order."""
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.a = nn.Linear(4, 4)
            self.b = nn.Linear(4, 4)
            self.norm = nn.LayerNorm(4)

        def forward(self, x):
            return F.gelu(self.b(self.norm(self.a(x)))) + self.a.weight.sum()

    model, x = M(), torch.randn(2, 4)
    captured = compile_fn(model)
    for _ in range(3):
        check(captured, model, x)
    with torch.no_grad():
        model.a.weight.mul_(2)            # data change, same metadata: no recompile, new values
    check(captured, model, x)
    assert n_compiles(captured) == 1


def test_hasattr_true_guard_is_the_attribute_read(compile_fn):
    """hasattr(obj, name) that was True is guarded by reading obj.name: deleting it, or a
    property that starts raising AttributeError, must still recompile."""
    class Config:
        def __init__(self):
            self.scale = 2.0

        @property
        def shift(self):
            if getattr(self, "broken", False):
                raise AttributeError("shift")
            return 1.0

    config = Config()

    def f(x):
        y = x * config.scale if hasattr(config, "scale") else x
        return y + 5 if hasattr(config, "shift") else y

    captured = compile_fn(f)
    x = torch.randn(3)
    assert_same(captured(x), f(x))
    del config.scale
    assert_same(captured(x), f(x))
    config.broken = True
    assert_same(captured(x), f(x))
    assert n_compiles(captured) == 3


def test_dict_keys_that_are_not_literals_are_guarded():
    """Keys whose repr is not Python (a class, a function, NaN) are bound names in the guard
    (they made the generated guard a SyntaxError: every OpInfo in-place call through pytree)."""
    import ember

    scale_by_type = {tuple: 2.0, list: 3.0}
    by_function = {torch.sin: 1.0}
    by_nan = {float("nan"): 5.0, (1, "a"): 7.0}

    def f(x):
        nan_key = next(iter(by_nan))
        return x * scale_by_type[tuple] + by_function[torch.sin] + by_nan[nan_key] + by_nan[(1, "a")]

    compiled = ember.compile(f)
    x = torch.randn(3)
    assert_same(compiled(x), f(x))
    scale_by_type[tuple] = 4.0
    by_nan[(1, "a")] = -1.0
    assert_same(compiled(x), f(x))
