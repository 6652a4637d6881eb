"""EMBER_LOGS=graph,guards,recompiles,graph_breaks,output_code prints what each stage made.

    from ember.debug.logs import log, enabled
    if enabled("graph"): log("graph", str(graph))
"""
from __future__ import annotations

import os
import sys

CHANNELS = ("graph", "prim_graph", "guards", "recompiles", "graph_breaks", "output_code")

_enabled: set[str] = set()


def set_logs(spec: str | None) -> None:
    """Enable channels from a comma list ('all' enables every channel)."""
    _enabled.clear()
    for name in (spec or "").split(","):
        name = name.strip()
        if name == "all":
            _enabled.update(CHANNELS)
        elif name:
            _enabled.add(name)


def enabled(channel: str) -> bool:
    return channel in _enabled


def log(channel: str, text: str) -> None:
    if channel in _enabled:
        print(f"[ember:{channel}]\n{text.rstrip()}\n", file=sys.stderr)


set_logs(os.environ.get("EMBER_LOGS"))
