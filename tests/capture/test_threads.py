"""Concurrent calls of one compiled function: one capture per guard set, every result right."""
from __future__ import annotations

import threading
import time

import torch

import ember


def _run_threads(target, count):
    barrier = threading.Barrier(count)
    errors = []

    def worker(index):
        try:
            barrier.wait()
            target(index)
        except Exception as error:  # noqa: BLE001 - reported below
            errors.append(error)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors, errors


def _slow_counting_backend(counter):
    def backend(graph, example_inputs):
        with counter["lock"]:
            counter["compiles"] += 1
        time.sleep(0.05)  # widen the window in which other threads arrive
        return graph.as_callable()
    return backend


def test_concurrent_first_calls_compile_once():
    counter = {"compiles": 0, "lock": threading.Lock()}

    def f(x):
        return (x * 2).sin() + 1

    compiled = ember.compile(f, backend=_slow_counting_backend(counter))
    x = torch.randn(16)
    results = {}

    def call(index):
        results[index] = compiled(x)

    _run_threads(call, 8)
    assert counter["compiles"] == 1
    assert len(compiled._ember_captured.entries) == 1
    for result in results.values():
        torch.testing.assert_close(result, f(x))


def test_concurrent_calls_with_two_shapes_compile_twice():
    counter = {"compiles": 0, "lock": threading.Lock()}

    def f(x):
        return x.cos() * 3

    compiled = ember.compile(f, backend=_slow_counting_backend(counter))
    inputs = [torch.randn(4), torch.randn(5)]
    results = {}

    def call(index):
        x = inputs[index % 2]
        results[index] = (x, compiled(x))

    _run_threads(call, 8)
    assert counter["compiles"] == 2
    assert len(compiled._ember_captured.entries) == 2
    for x, result in results.values():
        torch.testing.assert_close(result, f(x))


def test_concurrent_calls_with_the_ember_backend():
    def f(x, y):
        return torch.relu(x @ y) + x.sum()

    compiled = ember.compile(f)
    x, y = torch.randn(8, 8), torch.randn(8, 8)
    results = {}

    def call(index):
        for _ in range(3):
            results[index] = compiled(x, y)

    _run_threads(call, 4)
    assert len(compiled._ember_captured.entries) == 1
    for result in results.values():
        torch.testing.assert_close(result, f(x, y))


def test_concurrent_graph_breaks_cache_one_eager_entry():
    def f(x):
        print_free = x * 2
        if print_free.sum() > 0:  # data-dependent: runs eagerly
            return print_free + 1
        return print_free - 1

    compiled = ember.compile(f, backend="eager")
    x = torch.ones(3)
    _run_threads(lambda index: compiled(x), 6)
    assert len(compiled._ember_captured.entries) == 1


def test_recursive_call_during_eager_run_does_not_deadlock():
    compiled = None

    def f(x, depth):
        if x.sum() > 0 and depth > 0:  # a break: the frame runs eagerly and calls itself again
            return compiled(x - 1, depth - 1)
        return x

    compiled = ember.compile(f, backend="eager")
    torch.testing.assert_close(compiled(torch.full((2,), 3.0), 2), torch.full((2,), 1.0))
