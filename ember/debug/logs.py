"""EMBER_LOGS=graph,guards,recompiles,graph_breaks,output_code prints what each stage made.

Unknown names are rejected (ValueError at import, or from ``set_logs``).

    from ember.debug.logs import log, enabled
    if enabled("graph"): log("graph", str(graph))
"""
from __future__ import annotations

import os
import sys

CHANNELS = ("graph", "prim_graph", "guards", "recompiles", "graph_breaks", "output_code", "dynamic", "cudagraphs")

_enabled: set[str] = set()


def set_logs(spec: str | None) -> None:
    """Enable channels from a comma list ('all' enables every channel).

    An unknown name is a ValueError listing the valid ones (a typo must not silently log nothing)."""
    names = [name.strip() for name in (spec or "").split(",") if name.strip()]
    unknown = [name for name in names if name != "all" and name not in CHANNELS]
    if unknown:
        raise ValueError(f"unknown EMBER_LOGS name(s) {', '.join(map(repr, unknown))}; "
                         f"valid names: all, {', '.join(CHANNELS)}")
    _enabled.clear()
    for name in names:
        if name == "all":
            _enabled.update(CHANNELS)
        else:
            _enabled.add(name)


def enabled(channel: str) -> bool:
    return channel in _enabled


def log(channel: str, text: str) -> None:
    if channel in _enabled:
        print(f"[ember:{channel}]\n{text.rstrip()}\n", file=sys.stderr)


set_logs(os.environ.get("EMBER_LOGS"))
