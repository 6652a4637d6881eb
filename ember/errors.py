"""Exceptions ember raises to users, and the internal signal for graph breaks."""
from __future__ import annotations


class CompileError(RuntimeError):
    """ember could not compile something.

    Names the stage ("capture", "prims", "lower", "codegen", "runtime"), the op or
    construct, and the user's source line, and says what to do.
    """

    def __init__(self, message: str, *, stage: str = "", op: str = "", source_line: str = "",
                 hint: str = "") -> None:
        self.stage = stage
        self.op = op
        self.source_line = source_line
        self.hint = hint
        parts = [message]
        if source_line:
            parts.append(f"  at {source_line}")
        if stage:
            parts.append(f"  (stage: {stage}{', op: ' + op if op else ''})")
        if hint:
            parts.append(f"  hint: {hint}")
        super().__init__("\n".join(parts))


class Unsupported(Exception):
    """Raised inside capture when a construct cannot be captured (a graph break).

    Carries the reason and the user's "file.py:line"; capture turns it into a
    recorded break (run eagerly) or, with fullgraph=True, a CompileError.
    """

    def __init__(self, reason: str, source_line: str = "", hint: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.source_line = source_line
        self.hint = hint
        # the exception eager raises here, when capture evaluated the operation itself (a list
        # index out of range, a raise statement): a try/except of the traced code can catch it
        self.python_exception: BaseException | None = None
