"""try/except in captured code: an exception that capture raises exactly as eager would (an index
out of range, a missing key, a raise statement) goes to the frame's own handler, so the frame stays
one graph.  Every case runs eagerly and compiled over calls with changed inputs (other lengths,
other keys: the guards make a new entry) and compares outputs, printed text and mutated inputs;
then the graph and break counts of the first call."""
import collections.abc

import pytest
import torch

import ember

from .test_continuations import check as check_calls
from .test_continuations import t


def check(fn, *calls, graphs, breaks):
    """test_continuations' check, and the graph really compiled (not run eagerly by the backend)."""
    report = check_calls(fn, *calls, graphs=graphs, breaks=breaks)
    assert report.kernel_count > 0, str(report)
    return report


def test_index_error_ends_a_loop():
    def fn(x, items):
        total = x
        i = 0
        try:
            while True:
                total = total * items[i]
                i += 1
        except IndexError:
            pass
        return total + i

    check(fn, (t(3), [1.5, 2.0, 0.5]), (t(3), [2.0]), (t(2, 2), []), graphs=1, breaks=0)


def test_key_error_and_the_exception_object():
    def fn(x, table):
        try:
            scale = table["scale"]
        except KeyError as error:
            scale = len(str(error))
        return x * scale

    check(fn, (t(4), {"scale": 3.0}), (t(4), {"shift": 1.0}), graphs=1, breaks=0)


def test_raise_caught_by_the_same_frame_and_by_a_caller():
    def check_positive(value):
        if value <= 0:
            raise ValueError(f"{value} is not positive")
        return value

    def fn(x, value):
        try:
            y = x * check_positive(value)
        except ValueError as error:
            y = x - len(error.args[0])
        try:
            raise KeyError("k")
        except LookupError:
            y = y + 1
        return y

    check(fn, (t(3), 2.0), (t(3), -1.0), graphs=1, breaks=0)


def test_unmatched_handlers_reraise_to_the_outer_one():
    def fn(x, items, key):
        try:
            try:
                value = items[key]
            except IndexError:
                value = -1.0
        except KeyError:
            value = -2.0
        try:
            try:
                raise TypeError("inner")
            except TypeError:
                raise
        except TypeError as error:
            value = value + len(str(error))
        return x * value

    check(fn, (t(2), {"a": 2.0}, "a"), (t(2), {"a": 2.0}, "b"), (t(2), [1.0, 3.0], 5), graphs=1, breaks=0)


def test_raise_from():
    def fn(x):
        try:
            try:
                raise KeyError("k")
            except KeyError as inner:
                raise RuntimeError("outer") from inner
        except RuntimeError as error:
            return x * len(str(error.__cause__))

    check(fn, (t(3),), graphs=1, breaks=0)


class Layers(collections.abc.Sequence):
    """Like transformers 5.24's per-layer config list: a Sequence whose __iter__ is the generator
    of collections.abc (a try/except IndexError around a yield)."""

    def __init__(self, scales):
        self.scales = list(scales)

    def __getitem__(self, index):
        return self.scales[index]

    def __len__(self):
        return len(self.scales)

    def __eq__(self, other):            # the check compares the inputs after the calls
        return type(other) is Layers and other.scales == self.scales


LAYERS = Layers([0.5, 2.0, 3.0])


def test_iterating_a_sequence_subclass():
    def fn(x, layers):
        for scale in LAYERS:
            x = x * scale
        doubled = [scale * 2 for scale in layers]
        for name, scale in zip(["a", "b", "c"], layers):     # zip and list() iterate it too
            x = x + scale * len(name)
        return x + doubled[-1], doubled, 2.0 in layers, list(layers), tuple(zip(layers, LAYERS))

    check(fn, (t(3), Layers([1.0, 2.0])), (t(3), Layers([4.0])), graphs=1, breaks=0)


def test_a_generator_with_try_except_around_its_yield():
    def pairs(items):
        i = 0
        try:
            while True:
                yield items[i], items[i + 1]
                i += 2
        except IndexError:
            return

    def fn(x, items):
        for a, b in pairs(items):
            x = x * a + b
        return x

    check(fn, (t(3), [1.0, 2.0, 3.0, 4.0]), (t(3), [1.0, 2.0, 3.0]), graphs=1, breaks=0)


def test_a_generator_with_finally_still_breaks():
    events = []

    def ticking(n):
        try:
            for i in range(n):
                yield i
        finally:
            events.append("closed")

    def fn(x):
        for i in ticking(3):
            x = x + i
        return x

    expected = fn(t(2, value=1))
    compiled = ember.compile(fn)
    torch.testing.assert_close(compiled(t(2, value=1)), expected)
    assert events.count("closed") == 2
    report = ember.explain(fn, t(2))
    assert report.break_count >= 1


def test_an_uncaught_exception_is_eagers():
    def fn(x, items):
        try:
            value = items[5]
        except KeyError:
            value = 0.0
        return x * value

    with pytest.raises(IndexError):
        fn(t(2), [1.0])
    with pytest.raises(IndexError):
        ember.compile(fn)(t(2), [1.0])


def test_handlers_inside_a_no_grad_block():
    def fn(x, items):
        with torch.no_grad():
            try:
                y = x * items[3]
            except IndexError:
                y = x * 2
        return y + x

    check(fn, (t(3), [1.0]), (t(3), [1.0, 2.0, 3.0, 4.0]), graphs=1, breaks=0)
