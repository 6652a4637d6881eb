"""Errors eager raises reach the user as eager raises them: same type, same message, a short
traceback that ends at the user's line, ember's frames cut (EMBER_LOGS=all keeps them)."""
from __future__ import annotations

import os
import traceback

import pytest
import torch
import torch.nn.functional as F

import ember
from ember.debug import logs

BACKENDS = ["eager", "ember"]
EMBER_DIR = os.path.dirname(os.path.abspath(ember.__file__)) + os.sep


def shape_mismatch(a, b):
    return a + b.repeat(2)[:4]


def dtype_mismatch(a, b):
    return torch.mm(a.long(), b)


def index_out_of_range(a, b):
    return a[5] + b


def bad_view(a, b):
    return a.view(7) * b


def tuple_index(a, b):
    pair = (a, b)
    return pair[3]


def matmul_shapes(a, b):
    return (a * 2) @ b.reshape(1, 3)


def cat_dims(a, b):
    return torch.cat([a, b.reshape(3, 1)])


def after_some_work(a, b):
    c = a.sin() * b
    d = c.exp()
    return d.reshape(2, 2)


layer = torch.nn.Linear(5, 2)


def linear_shapes(a, b):
    return F.gelu(layer(a))


def missing_argument(a, b):
    return torch.add(a)


CASES = [shape_mismatch, dtype_mismatch, index_out_of_range, bad_view, tuple_index, matmul_shapes, cat_dims,
         after_some_work, linear_shapes, missing_argument]


def _raise_and_keep(fn, *args):
    try:
        fn(*args)
    except Exception as error:  # noqa: BLE001
        return error
    raise AssertionError(f"{fn.__name__} did not raise")


def _user_line(error: BaseException) -> traceback.FrameSummary:
    """The innermost frame in this test file: where the user's code failed."""
    frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename == __file__]
    return frames[-1]


@pytest.mark.parametrize("fullgraph", [False, True])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fn", CASES, ids=[f.__name__ for f in CASES])
def test_eager_error_reaches_the_user(fn, backend, fullgraph):
    a, b = torch.randn(3), torch.randn(3)
    expected = _raise_and_keep(fn, a, b)
    compiled = ember.compile(fn, backend=backend, fullgraph=fullgraph)
    for _ in range(2):  # the capture call and a cached call
        error = _raise_and_keep(compiled, a, b)
        assert type(error) is type(expected)
        assert str(error) == str(expected)
        # the traceback ends at the user's failing line, as eager's does
        assert _user_line(error).lineno == _user_line(expected).lineno
        assert _user_line(error).name == fn.__name__
        ember_frames = [f for f in traceback.extract_tb(error.__traceback__) if f.filename.startswith(EMBER_DIR)]
        assert len(ember_frames) <= 1, ember_frames  # at most ember.compile's wrapper
        assert error.__context__ is None and error.__cause__ is None
        eager_lines = len("".join(traceback.format_exception(expected)).splitlines())
        lines = len("".join(traceback.format_exception(error)).splitlines())
        assert lines <= eager_lines + 4, "".join(traceback.format_exception(error))


def test_ember_logs_all_keeps_the_frames():
    a, b = torch.randn(3), torch.randn(3)
    saved = set(logs._enabled)
    logs.set_logs("all")
    try:
        error = _raise_and_keep(ember.compile(shape_mismatch, backend="eager"), a, b)
    finally:
        logs._enabled.clear()
        logs._enabled.update(saved)
    assert len([f for f in traceback.extract_tb(error.__traceback__) if f.filename.startswith(EMBER_DIR)]) > 2


def test_traceback_length_measured():
    """Before: 47 lines for a shape mismatch (chained through capture's internals); now eager's + 3
    (the frame of ember.compile's wrapper function)."""
    a, b = torch.randn(3), torch.randn(4)
    f = ember.compile(lambda a, b: a + b)
    error = _raise_and_keep(f, a, b)
    lines = len("".join(traceback.format_exception(error)).splitlines())
    eager = len("".join(traceback.format_exception(_raise_and_keep(lambda a, b: a + b, a, b))).splitlines())
    assert lines <= eager + 3, (lines, eager)


def test_module_user_error():
    model = torch.nn.Sequential(torch.nn.Linear(5, 3), torch.nn.ReLU())
    x = torch.randn(2, 4)
    expected = _raise_and_keep(model, x)
    error = _raise_and_keep(ember.compile(model), x)
    assert type(error) is type(expected) and str(error) == str(expected)
