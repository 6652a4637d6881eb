"""no_grad / enable_grad / set_grad_enabled / autocast blocks and user context managers."""
import contextlib

import torch

from . import call, program, randn


@program(call(randn(3), randn(3, requires_grad=True)), call(randn(2), randn(2, requires_grad=True)),
         call(randn(3), randn(3)), graphs=1, breaks=0)
def no_grad_block(x, w):
    with torch.no_grad():
        frozen = x * w
    return frozen + x * w, frozen.requires_grad


@program(call(randn(3, requires_grad=True)), call(randn(4, requires_grad=True)), call(randn(2)), graphs=1, breaks=0)
def enable_grad_inside_no_grad(x):
    with torch.no_grad():
        a = x * 2
        with torch.enable_grad():
            b = x * 3
    return a, b, torch.is_grad_enabled()


@program(call(randn(3, requires_grad=True), True), call(randn(3, requires_grad=True), False),
         call(randn(2, requires_grad=True), True), graphs=1, breaks=0)
def set_grad_enabled_flag(x, train):
    with torch.set_grad_enabled(train):
        y = x.sin() * 2
    return y, y.requires_grad


@program(call(randn(4, 8), randn(8, 3)), call(randn(2, 8), randn(8, 3)), call(randn(3, 8), randn(8, 5)),
         graphs=1, breaks=0)
def autocast_cpu_bfloat16(a, b):
    with torch.autocast("cpu", dtype=torch.bfloat16):
        c = a @ b
        d = torch.relu(c)
    return d.float() + 1, c.dtype


@program(call(randn(3, requires_grad=True)), call(randn(2, requires_grad=True)), call(randn(4)), graphs=1, breaks=0)
def no_grad_decorator_on_helper(x):
    @torch.no_grad()
    def frozen(t):
        return t * 10

    return frozen(x) + x, frozen(x).requires_grad


def _double(t):
    return t * 2, torch.is_grad_enabled()


@program(call(randn(3, requires_grad=True)), call(randn(2, requires_grad=True)), call(randn(4)), graphs=1, breaks=0)
def grad_mode_decorators_called_in_other_modes(x):
    @torch.enable_grad()
    def tracked(t, k=3):
        return t * k, torch.is_grad_enabled()

    frozen = torch.no_grad()(_double)
    with torch.no_grad():
        a, mode_a = tracked(x, k=4)       # enable_grad inside no_grad
    b, mode_b = frozen(x)
    c, mode_c = frozen(a)
    return a, b, c, (mode_a, mode_b, mode_c), a.requires_grad, b.requires_grad, torch.is_grad_enabled()


class Recorder:
    def __init__(self):
        self.events = []

    def __enter__(self):
        self.events.append("enter")
        return self

    def __exit__(self, *exc):
        self.events.append("exit")
        return False


@program(call(randn(3)), call(randn(2)), call(randn(5)), graphs=1, breaks=0)
def user_context_manager_class(x):
    rec = Recorder()
    with rec as r:
        y = x * 2
        r.events.append(y.shape[0])
    return y, rec.events


@contextlib.contextmanager
def _scaled(values):
    values.append("start")
    yield 2.0
    values.append("end")


@program(call(randn(3)), call(randn(4)), call(randn(1)), graphs=1, breaks=0)
def contextlib_contextmanager(x):
    log = []
    with _scaled(log) as k:
        y = x * k
    return y, log


@contextlib.contextmanager
def _tracked(log, name, scale=1.0):
    log.append(f"open {name}")
    try:
        yield {"scale": scale, "name": name}
    finally:
        log.append(f"close {name}")


@program(call(randn(3), []), call(randn(2), ["old"]), call(randn(4), []), graphs=1, breaks=0)
def contextmanager_with_try_finally_nested_and_returning(x, log):
    with _tracked(log, "outer", scale=2.0) as outer, _tracked(log, "inner") as inner:
        y = x * outer["scale"] + inner["scale"]
        log.append(len(log))
    with _tracked(log, "early"):
        return y, outer["name"], len(log)


@contextlib.contextmanager
def _no_yield():
    if False:
        yield


@program(call(randn(3)), call(randn(2)), call(randn(1)), graphs=1, breaks=0, raises=(1, 2),
         before=lambda i, f: f.__globals__.__setitem__("_CM_RAISES", i > 0))
def contextmanager_that_does_not_yield(x):
    y = x + 1
    if _CM_RAISES:
        with _no_yield():   # RuntimeError: generator didn't yield (the frame runs eagerly)
            y = y * 2
    return y


_CM_RAISES = False


@program(call(randn(3, requires_grad=True)), call(randn(3, requires_grad=True)), call(randn(2, requires_grad=True)),
         graphs=1, breaks=0)
def inference_style_no_grad_nested_with_autocast(x):
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        y = torch.mm(x[None], x[:, None])
    return y.float(), y.requires_grad, y.dtype
