"""nn.Modules: buffers and attributes mutated in forward, attributes changed between calls, containers
of submodules, train/eval."""
import torch
from torch import nn

from . import call, program, randn


class RunningNorm(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.register_buffer("mean", torch.zeros(features))
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))
        self.momentum = 0.5

    def forward(self, x):
        if self.training:
            self.mean.mul_(1 - self.momentum).add_(x.mean(0) * self.momentum)
            self.steps += 1
        return x - self.mean


@program(call(randn(4, 3)), call(randn(2, 3)), call(randn(5, 3)), graphs=1, breaks=0, factory=True)
def buffer_updated_in_forward():
    return RunningNorm(3)


class CallCounter(nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(3, 2)
        self.calls = 0
        self.shapes = []

    def forward(self, x):
        self.calls += 1
        self.shapes.append(tuple(x.shape))
        return self.linear(x) * self.calls


@program(call(randn(2, 3)), call(randn(2, 3)), call(randn(4, 3)), graphs=1, breaks=0, factory=True)
def python_attribute_mutated_in_forward():
    return CallCounter()


class Gate(nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = nn.Linear(4, 4)
        self.use_gate = True
        self.temperature = 1.0

    def forward(self, x):
        y = self.proj(x)
        if self.use_gate:
            y = y * torch.sigmoid(y / self.temperature)
        return y


def _gate_settings(index, module):
    module.use_gate, module.temperature = [(True, 1.0), (False, 1.0), (True, 2.0), (True, 2.0)][index]


@program(call(randn(2, 4)), call(randn(2, 4)), call(randn(2, 4)), call(randn(3, 4)), graphs=1, breaks=0,
         factory=True, before=_gate_settings)
def attribute_changed_between_calls():
    return Gate()


class Stack(nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList([nn.Linear(4, 4) for _ in range(3)])
        self.heads = nn.ModuleDict({"a": nn.Linear(4, 2), "b": nn.Linear(4, 1)})
        self.post = nn.Sequential(nn.ReLU(), nn.LayerNorm(4))

    def forward(self, x, head="a"):
        for i, layer in enumerate(self.layers):
            x = x + layer(x) if i % 2 == 0 else layer(x)
        return self.heads[head](self.post(x)), len(self.layers)


@program(call(randn(2, 4)), call(randn(3, 4), head="b"), call(randn(2, 4), head="a"), graphs=1, breaks=0, factory=True)
def module_list_dict_sequential():
    return Stack()


class DropNorm(nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = nn.BatchNorm1d(3)

    def forward(self, x):
        return self.bn(x) * 2


def _train_eval(index, module):
    module.train(index != 2)


@program(call(randn(4, 3)), call(randn(4, 3)), call(randn(4, 3)), call(randn(6, 3)), graphs=1, breaks=0,
         factory=True, before=_train_eval)
def batchnorm_train_then_eval():
    return DropNorm()


class Residual(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return x + self.inner(x)


class Tower(nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = nn.Sequential(*[Residual(nn.Sequential(nn.Linear(3, 3), nn.GELU())) for _ in range(2)])
        self.scale = nn.Parameter(torch.full((3,), 0.5))

    def forward(self, x):
        total = sum(p.numel() for p in self.parameters())
        return self.blocks(x) * self.scale, total


@program(call(randn(2, 3)), call(randn(5, 3)), call(randn(1, 3)), graphs=1, breaks=0, factory=True)
def nested_modules_and_parameter_iteration():
    return Tower()


class Memory(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("last", torch.zeros(2))
        self.cache = {}

    def forward(self, x, key):
        previous = self.cache.get(key)
        self.cache[key] = x.shape[0]
        self.last = x[:2].clone()
        return x.sum() + (previous or 0)


@program(call(randn(3), "a"), call(randn(4), "a"), call(randn(5), "b"), graphs=1, breaks=0, factory=True)
def buffer_reassigned_and_dict_attribute():
    return Memory()


class Hooked(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        return self.fc(x).relu()


def _scale_output(module, inputs, output):
    return output * 3


def _hooked():
    module = Hooked()
    module.fc.register_forward_hook(_scale_output)
    return module


@program(call(randn(2, 3)), call(randn(4, 3)), call(randn(1, 3)), graphs=1, breaks=0, factory=True)
def forward_hook_on_submodule():
    return _hooked()
