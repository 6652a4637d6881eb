"""Full garbage collections are deferred while ember compiles (runtime/gc_pause.py) and the
program's thresholds come back after, however the compiles nest or fail."""
from __future__ import annotations

import gc

import pytest
import torch

import ember
from ember.runtime import gc_pause


@pytest.fixture(autouse=True)
def default_thresholds():
    before = gc.get_threshold()
    gc.set_threshold(700, 10, 10)
    yield
    gc.set_threshold(*before)


def test_nested_compiles_restore_the_threshold_once():
    with gc_pause.full_collections_deferred():
        assert gc.get_threshold() == (700, 10, gc_pause.DEFERRED_THRESHOLD)
        with gc_pause.full_collections_deferred():
            pass
        assert gc.get_threshold()[2] == gc_pause.DEFERRED_THRESHOLD     # the outer compile goes on
    assert gc.get_threshold() == (700, 10, 10)


def test_a_failed_compile_restores_it():
    with pytest.raises(ValueError):
        with gc_pause.full_collections_deferred():
            raise ValueError
    assert gc.get_threshold() == (700, 10, 10)


def test_a_threshold_the_program_sets_meanwhile_is_kept():
    with gc_pause.full_collections_deferred():
        gc.set_threshold(500, 5, 20)
    assert gc.get_threshold() == (500, 5, 20)


def test_capture_and_backend_run_deferred():
    seen = []

    def backend(graph, example_inputs):
        seen.append(gc.get_threshold()[2])
        return graph.as_callable()
    ember.compile(lambda x: x.sin() + 1, backend=backend)(torch.randn(3))
    assert seen == [gc_pause.DEFERRED_THRESHOLD]
    assert gc.get_threshold() == (700, 10, 10)
