"""Globals read and changed between calls, globals written by the program, module constants."""
import math

import torch

from . import call, program, randn

SCALE = 2.0
MODE = "relu"
COUNTER = 0
HISTORY = []
TABLE = {"bias": 1.0}
RUNNING = torch.zeros(3)
ENABLED = True


def _set(name, values):
    def before(index, _target):
        globals()[name] = values[index]
    return before


@program(call(randn(3)), call(randn(3)), call(randn(3)), call(randn(4)), graphs=1, breaks=0,
         before=_set("SCALE", [2.0, 2.0, 5.0, -1.0]), watch=("SCALE",))
def global_scalar_changed_between_calls(x):
    return x * SCALE


@program(call(randn(3)), call(randn(3)), call(randn(3)), graphs=1, breaks=0,
         before=_set("MODE", ["relu", "tanh", "relu"]), watch=("MODE",))
def global_string_selects_branch(x):
    if MODE == "relu":
        return torch.relu(x)
    return torch.tanh(x)


@program(call(randn(3)), call(randn(3)), call(randn(2)), graphs=1, breaks=0, watch=("COUNTER",))
def global_counter_written(x):
    global COUNTER
    COUNTER += 1
    return x + COUNTER


@program(call(randn(3)), call(randn(2)), call(randn(4)), graphs=1, breaks=0, watch=("HISTORY", "TABLE"))
def global_containers_mutated(x):
    HISTORY.append(x.shape[0])
    TABLE["bias"] = TABLE["bias"] + 1
    TABLE[f"n{len(HISTORY)}"] = len(HISTORY)
    return x + TABLE["bias"] + len(HISTORY)


@program(call(randn(3)), call(randn(3)), call(randn(3)), graphs=1, breaks=0, watch=("RUNNING",))
def global_tensor_updated_in_place(x):
    RUNNING.mul_(0.9).add_(x * 0.1)
    return RUNNING + x


@program(call(randn(3)), call(randn(3)), call(randn(3)), call(randn(2)), graphs=1, breaks=0,
         before=_set("ENABLED", [True, False, True, False]), watch=("ENABLED",))
def global_flag_toggled(x):
    y = x * 2
    if ENABLED:
        y = y + 1
    return y


@program(call(randn(3)), call(randn(5)), call(randn(1)), graphs=1, breaks=0)
def math_module_constants_and_functions(x):
    angle = math.pi / 4
    factor = math.sqrt(2) * math.cos(angle) + math.log(math.e) + math.floor(2.7) + math.ceil(0.2)
    n = math.prod(x.shape) + math.gcd(12, 8)
    return x * factor + n, math.isclose(factor, 5.0), math.inf > n


@program(call(randn(3), 2), call(randn(3), 0), call(randn(2), 3), graphs=1, breaks=0,
         before=_set("TABLE", [{"bias": 1.0}, {"bias": 2.0, "extra": 3.0}, {"bias": 1.0}]), watch=("TABLE",))
def global_dict_replaced_between_calls(x, k):
    total = x * k
    for key in sorted(TABLE):
        total = total + TABLE[key]
    return total
