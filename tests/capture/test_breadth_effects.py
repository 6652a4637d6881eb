"""Python effects kept out of the graph but in the frame (issue #10): warnings.warn, logging calls
and torch.manual_seed are replayed after the graph, in order, so the frame stays one graph and
the user sees what eager shows."""
from __future__ import annotations

import logging
import warnings

import pytest
import torch

import ember
from ember.capture.session import CaptureSession

from .breadth_util import assert_one_graph, assert_same

pytestmark = pytest.mark.skipif(not hasattr(CaptureSession({}), "replayed_calls"),
                                reason="needs the epilogue's replayed_calls (lead, /tmp/coord/breadth.md)")

logger = logging.getLogger("ember.test_breadth_effects")


def test_warnings_warn_replayed_once_per_call():
    def f(x):
        y = x * 2
        if x.shape[0] > 1:
            warnings.warn(f"rows={x.shape[0]}", RuntimeWarning)
        warnings.warn("plain")
        return y + 1

    assert_one_graph(f, torch.randn(3))
    compiled = ember.compile(f, fullgraph=True)
    for x in (torch.randn(3), torch.randn(4)):
        with warnings.catch_warnings(record=True) as got:
            warnings.simplefilter("always")
            actual = compiled(x)
        with warnings.catch_warnings(record=True) as want:
            warnings.simplefilter("always")
            expected = f(x)
        assert_same(actual, expected)
        assert [(str(w.message), w.category) for w in got] == [(str(w.message), w.category) for w in want]
        assert len(got) == 2


def test_warning_turned_into_error_raises_as_eager():
    def f(x):
        warnings.warn("boom")
        return x + 1

    compiled = ember.compile(f)
    x = torch.randn(2)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(UserWarning, match="boom"):
            compiled(x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert_same(compiled(x), f(x))


def test_logging_calls_replayed_in_order(caplog):
    def f(x):
        logger.info("input %s", tuple(x.shape))
        y = x.relu()
        logging.getLogger("ember.test_breadth_effects.child").warning("rows=%d", x.shape[0])
        logger.debug("not shown at INFO")
        return y

    assert_one_graph(f, torch.randn(2, 3))
    compiled = ember.compile(f, fullgraph=True)
    for x in (torch.randn(2, 3), torch.randn(5, 3)):
        with caplog.at_level(logging.INFO, logger="ember.test_breadth_effects"):
            caplog.clear()
            actual = compiled(x)
            got = [(r.name, r.levelname, r.getMessage()) for r in caplog.records]
            caplog.clear()
            expected = f(x)
            want = [(r.name, r.levelname, r.getMessage()) for r in caplog.records]
        assert_same(actual, expected)
        assert got == want and len(got) == 2


def test_manual_seed_after_random_ops_sets_the_generator_as_eager():
    def f(x):
        noise = torch.rand(3)  # drawn in the graph (ember's own random numbers)
        torch.manual_seed(1234)
        return x + noise * 0

    assert_one_graph(f, torch.randn(3))
    compiled = ember.compile(f, fullgraph=True)
    x = torch.randn(3)
    assert_same(compiled(x), f(x))
    compiled(x)
    after_compiled = torch.rand(4)
    f(x)
    after_eager = torch.rand(4)
    assert torch.equal(after_compiled, after_eager)


def test_random_op_after_manual_seed_runs_after_the_seed():
    def f(x):
        torch.manual_seed(7)
        return x + torch.rand(2)

    compiled = ember.compile(f)
    x = torch.randn(2)
    for _ in range(2):
        actual = compiled(x)
        torch.testing.assert_close(actual, f(x), rtol=0, atol=0)  # the random op runs eagerly after the seed
    report = ember.explain(f, x)
    assert report.break_count == 1
