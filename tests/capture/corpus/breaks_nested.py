"""Breaks inside called user functions, methods, closures and submodules: the caller breaks at the call,
the callee is captured on its own. Pieces: [caller before, callee before, callee after, caller after]."""
import contextlib

import torch
from torch import nn

from . import call, program, randn


def _noisy_sin(t):
    a = t.sin()
    print("in helper", tuple(t.shape))
    return a * 3


@program(call(randn(3)), call(randn(4)), call(randn(2, 2)), graphs=4, breaks=2)
def print_inside_called_function(x):
    y = x * 2
    z = _noisy_sin(y)
    return z + 1


def _max_abs(t):
    m = t.abs().max()
    return m.item()


@program(call(randn(3)), call(randn(5)), call(randn(1)), graphs=3, breaks=2)
def item_inside_called_function(x):
    # pieces: [x + 1], [abs, max], [] (the callee returns the number), [y / s]
    y = x + 1
    s = _max_abs(y)
    return y / s


class Scaler:
    def __init__(self, k):
        self.k = k

    def apply(self, t):
        u = t * self.k
        print("scaling by", self.k)
        return u - 1


@program(call(randn(3), 2.0), call(randn(3), 3.0), call(randn(2), -1.0), graphs=4, breaks=2)
def print_inside_method(x, k):
    y = x.exp()
    out = Scaler(k).apply(y)
    return out.sum()


def _level2(t):
    u = t + 2
    print("deepest")
    return u * 2


def _level1(t):
    v = t.cos()
    w = _level2(v)
    return w - 1


@program(call(randn(3)), call(randn(4)), call(randn(2)), graphs=6, breaks=3)
def print_two_calls_deep(x):
    # pieces: [f: x*3], [_level1: cos], [_level2: +2], [_level2: *2], [_level1: -1], [f: relu]
    y = x * 3
    z = _level1(y)
    return z.relu()


# a function made inside the frame runs natively at the break (it is not compiled on its own)
@program(call(randn(3), True), call(randn(3), False), call(randn(4), True), graphs=2, breaks=1)
def print_inside_closure(x, loud):
    scale = x.shape[0]

    def shout(t):
        u = t * scale
        if loud:
            print("loud", scale)
        return u + 1

    y = x.abs()
    return shout(y) * 2


class Branchy(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(3, 3)

    def forward(self, x):
        h = self.fc(x)
        if h.mean() > 0:
            return h.relu()
        return h.tanh()


class Outer(nn.Module):
    def __init__(self):
        super().__init__()
        self.pre = nn.Linear(3, 3)
        self.inner = Branchy()

    def forward(self, x):
        return self.inner(self.pre(x)) * 2


@program(call(randn(2, 3)), call(randn(4, 3)), call(randn(1, 3)), graphs=4, breaks=2, factory=True)
def data_dependent_branch_in_submodule():
    # pieces: [pre], [fc, mean, gt], [relu or tanh], [* 2]
    return Outer()


def _log_and_double(t, log):
    log.append(t.shape[0])
    print("logged", len(log))
    return t * 2


@program(call(randn(3), []), call(randn(2), [1]), call(randn(4), [1, 2]), graphs=3, breaks=2)
def break_in_callee_that_mutates_a_list(x, log):
    # pieces: [x - 1], [] (the callee does no tensor work before its print), [t * 2], [+ len(log)]
    y = x - 1
    z = _log_and_double(y, log)
    return z + len(log)


@program(call(randn(3)), call(randn(4)), call(randn(2)), graphs=2, breaks=1)
def print_inside_no_grad_helper(x):
    @torch.no_grad()
    def frozen(t):
        a = t * 2
        print("frozen", torch.is_grad_enabled())
        return a + 1

    y = x.sigmoid()
    return frozen(y) - y


def _frozen_global(t):
    a = t * 2
    print("global frozen", torch.is_grad_enabled())
    return a + 1


@program(call(randn(3, requires_grad=True)), call(randn(4, requires_grad=True)), call(randn(2)), graphs=4, breaks=2)
def print_inside_no_grad_decorated_global(x):
    # pieces: [x * 2], [t * 2] and [a + 1] (the callee compiled on its own, under no_grad), [w + y]
    frozen = torch.no_grad()(_frozen_global)
    y = x * 2
    w = frozen(y)
    return w + y, w.requires_grad, torch.is_grad_enabled()


@contextlib.contextmanager
def _logged_block(log, name):
    log.append(f"open {name}")
    try:
        yield name.upper()
    finally:
        log.append(f"close {name}")


@program(call(randn(3), []), call(randn(2), ["a"]), call(randn(4), []), graphs=0, breaks=1)
def print_inside_contextmanager_block(x, log):
    # the generator behind the with-block cannot be handed to a continuation: the frame runs eagerly
    z = x - 1
    with _logged_block(log, "p") as label:
        y = z * 2
        print("inside", len(log), label)
    return y + 1, log
