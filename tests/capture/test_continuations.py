"""Graph breaks that split a frame: the graph so far, the instruction natively, a compiled continuation.

Every case runs eagerly and compiled over several calls with changed inputs and compares outputs,
printed text, mutated inputs and Python state, then checks the graph and break counts of the first
call (``ember.explain``): graphs holding at least one op, and break events.
"""
import contextlib
import copy
import io

import pytest
import torch

import ember

from .test_functions import assert_same


def run_both(fn, args):
    eager_args, compiled_args = copy.deepcopy(args), copy.deepcopy(args)
    eager_out, compiled_out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(eager_out):
        expected = fn(*eager_args)
    compiled = ember.compile(fn)
    with contextlib.redirect_stdout(compiled_out):
        got = compiled(*compiled_args)
    return expected, got, eager_args, compiled_args, eager_out.getvalue(), compiled_out.getvalue()


def check(fn, *calls, graphs, breaks):
    compiled = ember.compile(fn)
    for args in calls:
        eager_args, compiled_args = copy.deepcopy(args), copy.deepcopy(args)
        eager_text, compiled_text = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(eager_text):
            expected = fn(*eager_args)
        with contextlib.redirect_stdout(compiled_text):
            got = compiled(*compiled_args)
        assert compiled_text.getvalue() == eager_text.getvalue()
        assert_same(got, expected)
        assert_same(compiled_args, eager_args)   # inputs mutated alike
    with contextlib.redirect_stdout(io.StringIO()):
        report = ember.explain(fn, *copy.deepcopy(calls[0]))
    assert (report.graph_count, report.break_count) == (graphs, breaks), str(report)
    return report


def t(*shape, value=None):
    if value is not None:
        return torch.full(shape, float(value))
    return torch.randn(*shape)


# ------------------------------------------------------------------ where the break is
def test_print_in_the_middle():
    def fn(x):
        y = x.sin() * 2
        print("y has", y.shape)
        return y.cos() + 1
    check(fn, (t(4),), (t(5),), (t(2, 3),), graphs=2, breaks=1)


def test_print_first_is_one_graph():
    def fn(x):
        print("start")
        return x.relu() + 1
    check(fn, (t(4),), (t(4),), graphs=1, breaks=1)


def test_two_prints():
    def fn(x):
        a = x + 1
        print("a")
        b = a * 2
        print("b", b.shape[0])
        return b - a
    check(fn, (t(3),), (t(4),), graphs=3, breaks=2)


def test_item_feeds_later_ops():
    def fn(x):
        s = (x * 2).sum().item()
        return x * s + 1
    check(fn, (t(3, value=1),), (t(3, value=2),), graphs=2, breaks=1)


@pytest.mark.parametrize("op", ["if", "if_not", "while", "and", "or", "not", "ternary"])
def test_data_dependent_branches(op):
    def fn(x):
        y = x * 2
        if op == "if":
            if y.sum() > 0:
                y = y + 1
            else:
                y = y - 1
        elif op == "if_not":
            if not (y.sum() > 0):
                y = y - 10
        elif op == "while":
            while y.abs().sum() < 100:
                y = y * 2
        elif op == "and":
            z = (y.sum() > 0) and (y.mean() < 10)
            y = y + int(z)
        elif op == "or":
            z = (y.sum() > 0) or (y.mean() < -10)
            y = y + int(z)
        elif op == "not":
            z = not (y > 0).all()
            y = y * (2 if z else 3)
        else:
            y = y + 1 if y.max() > 1 else y - 1
        return y.cos()
    calls = [(t(4, value=1),), (t(4, value=-1),), (t(4, value=3),), (t(4, value=1),)]
    compiled = ember.compile(fn)
    for args in calls:
        assert_same(compiled(*copy.deepcopy(args)), fn(*args))


def test_branch_continuations_are_kept_for_both_sides():
    def fn(x):
        y = x * 3
        if y.sum() > 0:
            return y + 1
        return y - 1
    compiled = ember.compile(fn)
    for sign in (1, -1, 1, -1):
        x = t(4, value=sign)
        assert_same(compiled(x), fn(x))
    captured = compiled._ember_captured
    # the prefix once, and each side once: later calls hit the cache
    assert sum(event.graph is not None for event in captured.events) == 3


def test_break_inside_a_called_function_compiles_the_callee_on_its_own():
    def inner(y):
        a = y + 1
        print("inner", a.shape)
        return a * 2

    def fn(x):
        z = inner(x * 3)
        return z - 1
    check(fn, (t(3),), (t(4),), graphs=4, breaks=2)


def test_break_inside_a_submodule():
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(4, 4)

        def forward(self, x):
            h = self.lin(x)
            print("block", h.shape)
            return torch.relu(h)

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = Block()
            self.b = torch.nn.Linear(4, 4)

        def forward(self, x):
            return self.b(self.a(x * 2)) + 1
    torch.manual_seed(0)
    model = Model()
    check(model, (t(2, 4),), (t(3, 4),), graphs=4, breaks=2)


def test_break_in_a_loop():
    def fn(x):
        for i in range(3):
            x = x * 2 + i
            print("step", i)
        return x.sum()
    check(fn, (t(3),), (t(3),), graphs=4, breaks=3)


def test_break_in_a_loop_over_modules():
    layers = torch.nn.ModuleList([torch.nn.Linear(3, 3) for _ in range(3)])

    def fn(x):
        for layer in layers:
            x = layer(x).relu()
            print(x.shape)
        return x
    check(fn, (t(2, 3),), (t(4, 3),), graphs=3, breaks=3)   # after the last print: no op left


def test_break_inside_call_arguments():
    def fn(x):
        return torch.add(x * 2, torch.tensor(float(x.sum())), alpha=3)
    check(fn, (t(3),), (t(3),), graphs=2, breaks=1)


def test_break_while_a_tensor_method_waits_for_its_argument():
    def fn(x):
        return x.mul(x.sum().item()).add(1)
    check(fn, (t(3, value=2),), (t(3, value=1),), graphs=2, breaks=1)


def test_break_with_keyword_arguments_and_star_call():
    def fn(x):
        args = (x.shape, x.sum() > 0)
        print(*args, sep=" | ", end="!\n")
        return x + 1
    check(fn, (t(3),), graphs=2, breaks=1)


def test_break_inside_no_grad_block():
    def fn(x):
        with torch.no_grad():
            y = x * 2
            print("grad", torch.is_grad_enabled())
            z = y * 3
        return z + x, torch.is_grad_enabled()
    x = torch.ones(3, requires_grad=True)
    compiled = ember.compile(fn)
    out, grad_mode = compiled(x)
    expected, _ = fn(x)
    assert grad_mode and torch.is_grad_enabled()
    assert_same(out, expected)
    out.sum().backward()
    assert_same(x.grad, torch.ones(3))


def test_unbound_locals_stay_unbound():
    def fn(x, flag):
        if flag:
            late = x + 1
        print("between")
        try:
            return late * 2
        except UnboundLocalError:
            return x - 1
    check(fn, (t(3), True), (t(3), False), graphs=2, breaks=1)


def test_closure_variables_reach_the_continuation():
    scale = torch.tensor(3.0)

    def fn(x):
        y = x * scale
        print("closure")
        return y + scale
    check(fn, (t(3),), graphs=2, breaks=1)


def test_break_at_an_operator_of_a_user_class():
    class Noisy:
        def __init__(self, v):
            self.v = v

        def __add__(self, other):
            print("adding")
            return Noisy(self.v + other)

    def fn(x):
        n = Noisy(x * 2) + 1
        return n.v * 3
    check(fn, (t(3),), graphs=2, breaks=1)


def test_break_in_a_property():
    class Box:
        def __init__(self, t):
            self.t = t

        @property
        def doubled(self):
            print("property")
            return self.t * 2

    def fn(x):
        box = Box(x + 1)
        return box.doubled + 1
    check(fn, (t(3),), graphs=2, breaks=1)


# ------------------------------------------------------------------ state around the break
def test_input_mutation_before_the_break_is_visible_to_it():
    def fn(x):
        x.add_(1)
        print("sum", float(x.sum()))
        x.mul_(2)
        return x
    check(fn, (t(3, value=1),), (t(4, value=2),), graphs=2, breaks=2)


def test_views_keep_aliasing_across_the_break():
    def fn(x):
        y = x.clone()
        v = y[0]
        w = x[1]
        print("break")
        v.add_(1)
        w.mul_(3)
        return y
    check(fn, (t(3, 2),), graphs=2, breaks=1)


def test_python_state_mutated_before_the_break():
    def fn(x, log):
        log.append(x.shape[0])
        print("log is", log)
        log.append("after")
        return x + len(log)
    check(fn, (t(3), []), (t(4), [1]), graphs=1, breaks=1)   # nothing to compute before the print


def test_one_object_stays_one_object():
    def fn(x):
        items = [x + 1]
        alias = items
        print("aliased")
        alias.append(x * 2)
        return items
    check(fn, (t(3),), graphs=2, breaks=1)


def test_global_changed_between_calls():
    check_global_changes()


FACTOR = 2.0


def _uses_global(x):
    y = x * FACTOR
    print("factor", FACTOR)
    return y + FACTOR


def check_global_changes():
    global FACTOR
    compiled = ember.compile(_uses_global)
    for value in (2.0, 3.0, 2.0):
        FACTOR = value
        x = t(3)
        assert_same(compiled(x), _uses_global(x))
    FACTOR = 2.0


# ------------------------------------------------------------------ training across a break
def test_gradients_flow_through_a_break():
    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 4)

    def fn(x):
        h = torch.tanh(lin(x))
        print("h", h.shape)
        return (h * h).sum()
    x = t(3, 4).requires_grad_()
    x2 = x.detach().clone().requires_grad_()
    loss = ember.compile(fn)(x)
    loss.backward()
    x_grad, w_grad = x.grad.clone(), lin.weight.grad.clone()
    lin.zero_grad()
    fn(x2).backward()
    assert_same(x_grad, x2.grad)
    assert_same(w_grad, lin.weight.grad)


def test_backward_inside_the_compiled_function():
    torch.manual_seed(0)
    w = torch.randn(3, requires_grad=True)

    def step(x):
        loss = (x * w).sin().sum()
        loss.backward()
        return loss.detach() * 2
    out = ember.compile(step)(t(3, value=1))
    grad = w.grad.clone()
    w.grad = None
    expected = step(t(3, value=1))
    assert_same(out, expected)
    assert_same(grad, w.grad)


# ------------------------------------------------------------------ fullgraph and logs
def test_fullgraph_still_raises():
    def fn(x):
        print("no")
        return x
    with pytest.raises(ember.CompileError, match="print"):
        ember.compile(fn, fullgraph=True)(t(3))


def test_log_shows_the_runner(capsys, monkeypatch):
    from ember.debug import logs

    def fn(x):
        y = x + 1
        print("visible")
        return y
    monkeypatch.setattr(logs, "enabled", lambda channel: True)
    seen = []
    monkeypatch.setattr("ember.capture.cache.log", lambda channel, text: seen.append(text))
    ember.compile(fn)(t(3))
    text = "\n".join(seen)
    assert "def resume_after_graph" in text and "fn_resume_at_" in text
    assert "test_continuations.py:" in text


def test_long_frame_resumes_past_extended_jumps():
    """A continuation far into a long function: the prologue's jump needs EXTENDED_ARG."""
    lines = ["def long_fn(x):"] + [f"    x = x + {i}" for i in range(300)] + \
            ["    print('far')", "    return x * 2"]
    namespace = {}
    exec("\n".join(lines), namespace)
    check(namespace["long_fn"], (t(3),), graphs=2, breaks=1)


def test_while_loop_breaking_every_iteration_does_not_nest_frames():
    def fn(x):
        n = 0
        while x.sum() < 2000:   # ~2000 iterations, each a break: deeper than the recursion limit
            x = x + 1
            n += 1
        return x, n
    compiled = ember.compile(fn)
    assert_same(compiled(torch.zeros(1)), fn(torch.zeros(1)))


def test_frame_with_cell_variables_shares_cells_with_its_closures():
    def fn(x):
        y = x + 1

        def bump():
            nonlocal y
            print("bumping")
            y = y * 10
            return y.sum()
        total = bump()
        return y + total, bump() + 1
    check(fn, (t(3),), (t(4),), graphs=4, breaks=3)   # the second bump() is a real function by then: compiled


def test_lambda_live_across_the_break():
    def fn(x, k):
        scale = lambda v: v * k  # noqa: E731
        print("lambda kept")
        return scale(x) + 1
    check(fn, (t(3), 2.0), (t(3), 3.0), graphs=1, breaks=1)


# ------------------------------------------------------------------ exceptions at the break
def _fails(k):
    if k > 3:
        raise ValueError(f"too big: {k}")
    return k


def test_exception_of_the_native_step_reaches_the_frames_handler():
    def fn(x, n):
        y = x * 2
        try:
            k = _fails(int(n))   # a break (int of a tensor) inside try, then a user function that raises
            out = y + k
        except ValueError as err:
            out = y - len(str(err))
        finally:
            print("finally runs once")
        return out
    check(fn, (t(3), torch.tensor(1)), (t(3), torch.tensor(5)), (t(3), torch.tensor(2)), graphs=2, breaks=2)


def test_exception_inside_no_grad_block_restores_grad_mode():
    def fn(x):
        with torch.no_grad():
            y = x * 2
            int(y.sum())      # a break inside the block
            _fails(int(y.sum()))
        return y
    compiled = ember.compile(fn)
    x = torch.full((3,), 1.0, requires_grad=True)
    with pytest.raises(ValueError, match="too big"):
        compiled(x)
    assert torch.is_grad_enabled()
    assert_same(compiled(x * 0), fn(x * 0))


def test_exception_inside_a_python_context_manager_reaches_its_exit():
    class Recorder:
        def __init__(self):
            self.log = []

        def __enter__(self):
            self.log.append("enter")
            return self

        def __exit__(self, kind, value, tb):
            self.log.append(f"exit {kind.__name__ if kind else None}")
            return True   # swallow

    def fn(x, n):
        rec = Recorder()
        y = x + 1
        with rec:
            y = y * 2
            _fails(int(n))
            y = y + 100
        return y, rec.log
    check(fn, (t(3), torch.tensor(1)), (t(3), torch.tensor(7)), graphs=2, breaks=1)


def test_second_break_inside_a_no_grad_block_keeps_the_mode():
    def fn(x):
        with torch.no_grad():
            y = x * 2
            a = int(y.sum())          # a break: the continuation starts inside the block
            b = int((y * 3).sum())    # a second break in that continuation, still inside
            modes = torch.is_grad_enabled()
        return y * a + b, modes, torch.is_grad_enabled()
    x = torch.full((3,), 1.0, requires_grad=True)
    compiled = ember.compile(fn)
    for _ in range(2):
        got = compiled(x)
        assert torch.is_grad_enabled()
        expected = fn(x)
        assert got[1:] == expected[1:]
        assert_same(got[0], expected[0])


GRAD_BLOCKS = {"no_grad": torch.no_grad, "enable_grad": torch.enable_grad,
               "set_false": lambda: torch.set_grad_enabled(False), "set_true": lambda: torch.set_grad_enabled(True)}
BREAKS = {
    "print": lambda t: print("mode", torch.is_grad_enabled()),
    "item": lambda t: t.sum().item(),
    "branch": lambda t: print("positive") if (t > -10).all() else None,
}


@pytest.mark.parametrize("outer", GRAD_BLOCKS)
@pytest.mark.parametrize("inner", GRAD_BLOCKS)
@pytest.mark.parametrize("where", ["inner", "after_inner", "both"])
@pytest.mark.parametrize("kind", BREAKS)
@pytest.mark.parametrize("entry_grad", [True, False])
def test_nested_grad_blocks_around_a_break(outer, inner, where, kind, entry_grad):
    """Every pair of nested grad-mode blocks, with a break inside the inner one, between the two exits, or
    both: the mode of every op (seen as requires_grad) and the mode after each exit are eager's."""
    make_outer, make_inner, breaking = GRAD_BLOCKS[outer], GRAD_BLOCKS[inner], BREAKS[kind]

    def fn(x):
        modes = []
        with make_outer():
            a = x * 2
            with make_inner():
                b = x * 3
                if where in ("inner", "both"):
                    breaking(b)
                c = b + a
                modes.append(torch.is_grad_enabled())
            modes.append(torch.is_grad_enabled())
            if where in ("after_inner", "both"):
                breaking(c)
            d = c * x
            modes.append(torch.is_grad_enabled())
        return a, b, c, d, d + x, modes, torch.is_grad_enabled()

    compiled = ember.compile(fn)
    with torch.set_grad_enabled(entry_grad):
        for value in (1.0, 2.0):
            x = torch.full((3,), value, requires_grad=True)
            with contextlib.redirect_stdout(io.StringIO()) as eager_text:
                expected = fn(x)
            with contextlib.redirect_stdout(io.StringIO()) as compiled_text:
                got = compiled(x)
            assert torch.is_grad_enabled() == entry_grad
            assert compiled_text.getvalue() == eager_text.getvalue()
            assert got[5:] == expected[5:]
            assert [t.requires_grad for t in got[:5]] == [t.requires_grad for t in expected[:5]]
            for g, e in zip(got[:5], expected[:5]):
                assert_same(g.detach(), e.detach())


def test_break_inside_an_autocast_block():
    def fn(x, w):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            y = x @ w
            print("inside", torch.is_autocast_enabled("cpu"), y.dtype)
            z = y @ w
            q = (z.float() * 2) @ w
        return z, q, (x @ w).dtype, torch.is_autocast_enabled("cpu")
    torch.manual_seed(0)
    check(fn, (t(4, 4), t(4, 4)), (t(4, 4), t(4, 4)), graphs=2, breaks=1)
    assert not torch.is_autocast_enabled("cpu")


def test_explain_names_each_graph_and_break():
    def inner(y):
        a = y + 1
        print("inner")
        return a * 2

    def outer(x):
        return inner(x * 3) - 1
    with contextlib.redirect_stdout(io.StringIO()):
        text = str(ember.explain(outer, t(3)))
    assert "graph 0 (" in text and "outer): 1 op" in text and ": mul" in text
    assert "inner.resume_at_" in text and "outer.resume_at_" in text
    assert text.count("print() inside a compiled function") == 2


def test_sgd_step_inside_the_compiled_function():
    torch.manual_seed(0)
    w = torch.randn(3, requires_grad=True)
    w_eager = w.detach().clone().requires_grad_()

    def make(param):
        def step(x):
            loss = (x * param).sin().sum()
            loss.backward()       # a break; the rest reads param.grad as an input
            with torch.no_grad():
                param.sub_(0.1 * param.grad)
                param.grad.zero_()
            return loss.detach()
        return step
    compiled, eager = ember.compile(make(w)), make(w_eager)
    for i in range(3):
        x = t(3, value=i + 1)
        assert_same(compiled(x), eager(x))
        assert_same(w.detach(), w_eager.detach())
        assert_same(w.grad, w_eager.grad)


# ------------------------------------------------------------------ enum values live across a break
class _Mode(str, __import__("enum").Enum):
    FAST = "fast"
    SLOW = "slow"


class _Level(__import__("enum").IntEnum):
    LOW = 1
    HIGH = 2


def test_str_and_int_enum_locals_and_keys_across_a_break():
    """A str/int Enum member is an instance of str/int, but its repr is not Python: the runner and
    continuations must bind it, not print it (Hugging Face's deprecation decorator holds a
    str Enum local across a break; the generated runner did not parse)."""
    def fn(x, mode):
        action = _Mode.FAST
        table = {_Level.LOW: x * 2, "plain": x + 1}
        y = x.sin()
        print("break", action.value)
        scale = 3.0 if mode is _Mode.FAST else 0.5
        return y * scale + table[_Level.LOW] + table["plain"], action, _Level.HIGH

    check(fn, (t(4), _Mode.FAST), (t(5), _Mode.SLOW), graphs=2, breaks=1)


def test_a_mutated_dict_rewritten_from_its_own_entries_across_a_break():
    """The runner rewrites a mutated dict whose new contents read its old entries (Hugging Face's
    ``kwargs``): every new value is computed before any container is cleared (it was a KeyError)."""
    def fn(x, options, items):
        options["scale"] = 2.0
        items.append(items[0] * 2)
        y = x.sin() * options["t"]
        print("break")
        return y * options["scale"] + items[-1]

    check(fn, (t(4), {"t": t(4)}, [t(4)]), (t(4), {"t": t(4), "u": 1}, [t(4)]), graphs=2, breaks=1)
