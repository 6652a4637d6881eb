"""``ember.explain``: compile a function once, run it, and report what capture and the backend made.

    report = ember.explain(model, x)
    print(report)             # graphs, ops per graph, kernels, graph breaks with file:line, guards
    report.graph_breaks[0].reason, report.graph_breaks[0].location

What goes in: a function, bound method or nn.Module and its call arguments.  What
comes out: an ``ExplainReport`` built from the ``CaptureEvent``s of that one call.
"""
from __future__ import annotations

import dataclasses
from typing import Any

from ember.graph import Graph, target_name

MAX_PRINTED_GUARDS = 12


@dataclasses.dataclass
class GraphBreak:
    """Where capture stopped a graph, and why."""

    reason: str
    location: str  # "file.py:line" of the user's code
    frame: str = ""  # the function that was split there (a continuation's name ends in .resume_at_LINE)

    def __str__(self) -> str:
        text = f"{self.location}: {self.reason}" if self.location else self.reason
        return f"{text} (in {self.frame})" if self.frame else text


@dataclasses.dataclass
class ExplainReport:
    graph_count: int
    graph_breaks: list[GraphBreak]
    ops_per_graph: list[int]  # call nodes of each torch-level graph
    kernel_count: int  # summed over graphs from compiled.stats (0 when the backend reports none)
    extern_count: int
    guards: list[str]
    graphs: list[Graph]
    recompile_reasons: list[str] = dataclasses.field(default_factory=list)
    graph_frames: list[str] = dataclasses.field(default_factory=list)  # where each graph was captured
    compiled: list[Any] = dataclasses.field(default_factory=list, repr=False)  # one per graph
    output: Any = dataclasses.field(default=None, repr=False)  # what the call returned

    @property
    def break_count(self) -> int:
        return len(self.graph_breaks)

    def __str__(self) -> str:
        plural = lambda n, word: f"{n} {word}{'' if n == 1 else 's'}"
        counts = [plural(self.graph_count, "graph"), plural(self.break_count, "graph break"),
                  plural(self.kernel_count, "kernel"), plural(self.extern_count, "extern")]
        lines = ["ember.explain: " + ", ".join(counts)]
        for index, (ops, compiled) in enumerate(zip(self.ops_per_graph, self.compiled)):
            stats = getattr(compiled, "stats", None) or {}
            detail = (f", {stats.get('kernel_count', 0)} kernels, {stats.get('extern_count', 0)} externs"
                      if stats else "")
            if getattr(compiled, "eager_reason", None):   # an eager graph: say why, not just "0 kernels"
                detail += f", runs op by op ({compiled.eager_reason})"
            runner = _cuda_graph_runner(compiled)
            if runner is not None:
                detail += f", {runner.describe()}"
            frame = f" ({self.graph_frames[index]})" if index < len(self.graph_frames) else ""
            lines.append(f"  graph {index}{frame}: {plural(ops, 'op')}{detail}: {_op_names(self.graphs[index])}")
        if self.graph_breaks:
            lines.append("Graph breaks:")
            lines += [f"  {i + 1}. {brk}" for i, brk in enumerate(self.graph_breaks)]
        if self.recompile_reasons:
            lines.append("Recompiles:")
            lines += [f"  - {reason}" for reason in self.recompile_reasons]
        lines.append(f"Guards ({len(self.guards)}):")
        lines += [f"  {_one_line(guard)}" for guard in self.guards[:MAX_PRINTED_GUARDS]]
        if len(self.guards) > MAX_PRINTED_GUARDS:  # a module has a few per submodule: keep the summary short
            lines.append(f"  ... {len(self.guards) - MAX_PRINTED_GUARDS} more in report.guards")
        return "\n".join(lines)


def _cuda_graph_runner(compiled: Any) -> Any:
    """mode="reduce-overhead": the CUDA-graph runner of a compiled graph (or of a training forward)."""
    call = getattr(compiled, "call", None)
    call = getattr(call, "forward", call)
    return call if hasattr(call, "describe") and hasattr(call, "recordings") else None


def _op_names(graph: Graph, limit: int = 12) -> str:
    """The graph's ops in order, repeats folded: 'linear, relu x2, add'."""
    names: list[list] = []
    for node in graph.call_nodes():
        name = target_name(node.target)
        if names and names[-1][0] == name:
            names[-1][1] += 1
        else:
            names.append([name, 1])
    parts = [name if count == 1 else f"{name} x{count}" for name, count in names[:limit]]
    return ", ".join(parts) + (f", ... ({len(names) - limit} more)" if len(names) > limit else "")


def _one_line(text: str, width: int = 160) -> str:
    """A guard as one short line (module reprs inside guard texts span many lines)."""
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def report_from_events(events: list[Any], output: Any = None) -> ExplainReport:
    """Summarise ``CapturedFunction.events`` (a list of ``CaptureEvent``)."""
    graphs: list[Graph] = []
    frames: list[str] = []
    compiled_list: list[Any] = []
    breaks: list[GraphBreak] = []
    guards: list[str] = []
    recompiles: list[str] = []
    kernels = externs = 0
    for event in events:
        # a graph with no op (a frame that only returns its inputs, the part after a graph break
        # that only rebuilds the result) computes nothing: not counted, as Dynamo does not compile it
        if getattr(event, "graph", None) is not None and any(True for _ in event.graph.call_nodes()):
            graphs.append(event.graph)
            frames.append(getattr(event, "frame", ""))
            compiled_list.append(event.compiled)
            stats = getattr(event.compiled, "stats", None) or {}
            kernels += int(stats.get("kernel_count", 0))
            externs += int(stats.get("extern_count", 0))
        if getattr(event, "break_reason", None):
            breaks.append(GraphBreak(str(event.break_reason), str(event.break_location or ""),
                                     getattr(event, "frame", "")))
        for guard in getattr(event, "guards", None) or ():
            if str(guard) not in guards:
                guards.append(str(guard))
        if getattr(event, "recompile_reason", None):
            recompiles.append(str(event.recompile_reason))
    return ExplainReport(
        graph_count=len(graphs),
        graph_breaks=breaks,
        ops_per_graph=[sum(1 for _ in graph.call_nodes()) for graph in graphs],
        kernel_count=kernels,
        extern_count=externs,
        guards=guards,
        graphs=graphs,
        recompile_reasons=recompiles,
        graph_frames=frames,
        compiled=compiled_list,
        output=output,
    )


def explain(model_or_fn: Any, *args: Any, **kwargs: Any) -> ExplainReport:
    """Compile ``model_or_fn`` with fresh caches and the "ember" backend, call it once, report.

    ``args``/``kwargs`` are the call's arguments (all of them belong to the function).
    Use ``explain_with(backend=...)`` to pick another backend.
    """
    return explain_with()(model_or_fn, *args, **kwargs)


def explain_with(*, backend: Any = "ember", mode: str | None = None, options: dict | None = None) -> Any:
    """``explain`` with a chosen backend: ``explain_with(backend="eager")(fn, *args)``."""
    from ember.api import CompiledModule, capture_function

    def run(model_or_fn: Any, *args: Any, **kwargs: Any) -> ExplainReport:
        if isinstance(model_or_fn, CompiledModule):
            model_or_fn = model_or_fn._orig_mod
        target = getattr(model_or_fn, "_orig_fn", model_or_fn)  # an ember.compile'd function
        captured = capture_function(target, backend=backend, mode=mode, options=options)
        captured.reset()  # fresh caches: every graph of this call shows up in the events
        output = captured(*args, **kwargs)
        return report_from_events(list(captured.events), output)

    return run
