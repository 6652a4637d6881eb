"""Strings, formatting with shapes, builtins on Python numbers, isinstance/type checks, torch.Size arithmetic."""
import math

import torch

from . import call, program, randn


@program(call(randn(2, 3)), call(randn(4, 1, dtype=torch.float64)), call(randn(5)), graphs=1, breaks=0)
def format_shapes_into_strings(x):
    label = f"{x.dim()}d:{'x'.join(str(s) for s in x.shape)}:{str(x.dtype).split('.')[-1]}"
    old = "%s-%d" % ("rows", x.shape[0])
    new = "{}/{:>3}".format(len(label), x.numel())
    return x * len(label), label, old, new


@program(call(randn(3), "relu_scale"), call(randn(3), "tanh_shift"), call(randn(3), "Relu_Shift"), graphs=1, breaks=0)
def string_methods_choose_ops(x, spec):
    act, post = spec.lower().split("_")
    y = torch.relu(x) if act.startswith("re") else torch.tanh(x)
    if post.endswith("scale"):
        y = y * 2
    return y, "-".join([act.upper(), post.title()]), spec.replace("_", " ").strip()


@program(call(randn(3), 7, 2.5), call(randn(3), -3, 0.1), call(randn(2), 10, -4.0), graphs=1, breaks=0)
def builtins_on_python_numbers(x, n, f):
    q, r = divmod(n, 3)
    k = min(n, 4) + max(abs(n), 2) + round(f) + pow(2, 3) + int(f) + q * r
    return x * k + float(n) / 2, k, round(f * 10) / 10


@program(call(randn(3), 2), call(randn(3), 2.5), call(randn(3), randn(3)), call(randn(3), [1.0, 2.0, 3.0]),
         call(randn(3), "3"), graphs=1, breaks=0)
def isinstance_and_type_checks(x, other):
    if isinstance(other, bool):
        return x
    if isinstance(other, int):
        return x * other, "int"
    if type(other) is float:
        return x + other, "float"
    if isinstance(other, torch.Tensor):
        return x - other, "tensor"
    if isinstance(other, (list, tuple)):
        return x + torch.tensor(other), "sequence"
    return x * len(other), type(other).__name__


@program(call(randn(2, 3)), call(randn(4, 5)), call(randn(1, 2, 3)), graphs=1, breaks=0)
def torch_size_arithmetic(x):
    shape = x.shape
    new_shape = shape[:-1] + (1, shape[-1])
    flat = torch.Size([math.prod(shape)])
    y = x.reshape(new_shape).expand(*shape[:-1], 2, shape[-1])
    return y.sum(-2).reshape(flat), new_shape == torch.Size(list(new_shape)), len(new_shape), shape.numel()


@program(call(randn(2, 4, 8)), call(randn(1, 3, 16)), call(randn(2, 2, 4)), graphs=1, breaks=0)
def attention_scale_from_shape(q):
    scale = 1.0 / math.sqrt(q.shape[-1])
    scores = (q @ q.transpose(-1, -2)) * scale
    return scores.softmax(-1) @ q


@program(call(randn(3), "abc"), call(randn(3), "hello"), call(randn(2), ""), graphs=1, breaks=0)
def characters_and_ord(x, word):
    codes = [ord(c) - ord("a") for c in word]
    rebuilt = "".join(chr(c + ord("a")) for c in codes)
    return x + sum(codes), rebuilt == word, word[::-1], word.count("l")


@program(call(randn(3), 0.5), call(randn(3), 2.0), call(randn(4), -1.0), graphs=1, breaks=0)
def math_on_python_floats_feeds_tensor_ops(x, p):
    eps = math.exp(-abs(p)) * math.tanh(p) + math.hypot(3, 4) + math.fabs(p) + math.radians(180)
    return x.pow(2).add(eps).log(), math.isfinite(eps), math.copysign(1.0, p)
