"""functools.lru_cache functions and methods called with Python constants, as Hugging Face's
``logger.warning_once(f"...")`` inside a model's loss property: eager runs the body once per
argument tuple and returns the cached value after, so capture runs it once and keeps a constant
result, where it used to break the graph at each such call (GPT-2 with labels: 3 breaks).  Tensor
arguments or non-constant results still break the graph; results and side effects against eager."""
from __future__ import annotations

import functools
import logging

import torch

import ember

CALLS: list[tuple] = []


class Logger:
    @functools.lru_cache(None)
    def warning_once(self, message):
        CALLS.append(message)


LOG = Logger()


@functools.lru_cache(None)
def width(name, scale=1):
    CALLS.append(name)
    return len(name) * scale


def test_memoized_method_and_function_with_constants_are_one_graph():
    def fn(x, kind="mean"):
        LOG.warning_once(f"loss type {kind} is unknown")
        return x * width("abc", scale=2) + 1
    CALLS.clear()
    LOG.warning_once.cache_clear()
    width.cache_clear()
    x = torch.randn(4)
    report = ember.explain(fn, x)
    assert report.graph_count == 1 and report.break_count == 0, str(report)
    compiled = ember.compile(fn, options={"fallback": "error"})
    for _ in range(3):
        torch.testing.assert_close(compiled(x), x * 6 + 1)
    # eager would have run each body once for these arguments: so did capture
    assert CALLS == ["loss type mean is unknown", "abc"]


def test_memoized_call_with_a_tensor_breaks_the_graph():
    @functools.lru_cache(None)
    def norm_of(t):
        return float(t.norm())

    def fn(x):
        return x * norm_of(x)
    x = torch.randn(3)
    assert ember.explain(fn, x).break_count >= 1
    torch.testing.assert_close(ember.compile(fn)(x), fn(x))


def test_a_real_logger_warning_once_style_call(caplog):
    logger = logging.getLogger("ember.test.memoized")
    once = functools.lru_cache(None)(lambda message: logger.warning(message))

    def fn(x):
        once("only once")
        return x + 1
    report = ember.explain(fn, torch.ones(2))     # compiled (the explain call logs it once)
    assert report.graph_count == 1 and report.break_count == 0, str(report)
    once.cache_clear()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="ember.test.memoized"):
        compiled = ember.compile(fn)
        for _ in range(3):
            compiled(torch.ones(2))
    assert [r.getMessage() for r in caplog.records].count("only once") == 1


def test_a_bounded_cache_breaks_the_graph():
    """lru_cache(maxsize=1) runs its body again after an eviction in eager: not a constant."""
    @functools.lru_cache(maxsize=1)
    def bounded(name):
        CALLS.append(name)
        return len(name)

    def fn(x, name):
        return x * bounded(name)
    x = torch.randn(2)
    assert ember.explain(fn, x, "ab").break_count >= 1
    torch.testing.assert_close(ember.compile(fn)(x, "abc"), x * 3)
