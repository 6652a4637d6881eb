"""Unsupported constructs: fullgraph=True names this file and line; otherwise the result is still right."""
import pytest
import torch

from ember.errors import CompileError

from .test_functions import assert_same


def with_print(x):
    y = x * 2
    print("hello")  # LINE:print
    return y + 1


def with_item(x):
    scale = x.sum().item()  # LINE:item
    return x * scale


def data_dependent_branch(x):
    if x.sum() > 0:  # LINE:branch
        return x + 1
    return x - 1


def with_generator(x):
    def gen():
        yield x * 2  # LINE:gen
    return list(gen())[0]


def _halves(x):
    yield x[:2]
    yield x[2:]


def print_while_a_generator_is_suspended(x):
    total = x.sum()
    for part in _halves(x):   # a suspended generator frame cannot be handed to a continuation
        print("part")
        total = total + part.sum()
    return total


def raises_in_untaken_branch(x, flag=False):
    if flag:
        raise ValueError("never")
    return x.cos()


def _line_of(fn, tag):
    import inspect
    lines, start = inspect.getsourcelines(fn)
    for i, text in enumerate(lines):
        if f"LINE:{tag}" in text:
            return start + i
    raise AssertionError(tag)


@pytest.mark.parametrize("fn, tag, words", [
    (with_print, "print", "print"),
    (with_item, "item", "item"),
    (data_dependent_branch, "branch", "data-dependent"),
])
def test_fullgraph_raises_compile_error_with_location(compile_fn, fn, tag, words):
    captured = compile_fn(fn, fullgraph=True)
    with pytest.raises(CompileError) as info:
        captured(torch.randn(4))
    message = str(info.value)
    assert f"test_graph_breaks.py:{_line_of(fn, tag)}" in message, message
    assert words in message


@pytest.mark.parametrize("fn, graphs", [(with_print, 2), (with_item, 2), (data_dependent_branch, 2)])
def test_break_splits_the_frame_and_is_recorded(compile_fn, fn, graphs, capsys):
    captured = compile_fn(fn)
    for x in (torch.randn(4), -torch.ones(4), torch.ones(4)):
        assert_same(captured(x), fn(x))
    first = captured.events[0]
    assert first.break_reason and "test_graph_breaks.py:" in first.break_location
    compiled = [event for event in captured.events[:2] if event.graph is not None]
    assert len(compiled) == graphs, captured.events  # the graph before the break, and the continuation


def test_frame_that_cannot_be_split_runs_eagerly_and_is_cached(compile_fn):
    captured = compile_fn(print_while_a_generator_is_suspended)
    for x in (torch.randn(4), torch.ones(4)):
        assert_same(captured(x), print_while_a_generator_is_suspended(x))
    event = captured.events[0]
    assert event.graph is None and event.break_reason
    assert len(captured.events) == 1  # the eager decision is cached under its guards


def test_raise_in_untaken_branch_is_fine(compile_fn):
    captured = compile_fn(raises_in_untaken_branch, fullgraph=True)
    x = torch.randn(3)
    assert_same(captured(x), x.cos())
    with pytest.raises(ValueError, match="never"):    # the user's own exception, as eager raises it
        captured(x, flag=True)
    plain = compile_fn(raises_in_untaken_branch)
    with pytest.raises(ValueError):
        plain(x, flag=True)
