"""ember.compile through a backend that keeps each compiled graph's generated source."""
from __future__ import annotations

from typing import Any

import ember
from ember.backend import compile_graph


def compile_recording(fn: Any, options: dict | None = None) -> tuple[Any, list[str]]:
    """ember.compile(fn) with the backend's own defaults (C++ on the CPU) or ``options``; the
    list fills with the source of every graph it compiles."""
    sources: list[str] = []

    def backend(graph, example_inputs):
        compiled = compile_graph(graph, example_inputs, options)
        sources.append(compiled.source)
        return compiled
    return ember.compile(fn, backend=backend), sources


def compile_keeping(fn: Any, options: dict | None = None) -> tuple[Any, list]:
    """ember.compile(fn) whose list fills with every CompiledGraph it compiles (its kind, its
    callable, its schedule), for tests that inspect what was compiled."""
    graphs: list = []

    def backend(graph, example_inputs):
        compiled = compile_graph(graph, example_inputs, options)
        graphs.append(compiled)
        return compiled
    return ember.compile(fn, backend=backend), graphs


def record_compiled_graphs(monkeypatch: Any) -> list:
    """A list that fills with every CompiledGraph the default backend builds in this test (through
    ``backend.compile_from_specs``: dynamic shapes and options as ``ember.compile`` gives them)."""
    from ember import backend
    graphs: list = []
    compile_from_specs = backend.compile_from_specs

    def recording(graph, specs, options):
        graphs.append(compile_from_specs(graph, specs, options))
        return graphs[-1]
    monkeypatch.setattr(backend, "compile_from_specs", recording)
    return graphs
