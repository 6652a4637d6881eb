"""Statement-deletion reducer for failing fuzz programs.

Deletes returned values and statements one at a time while the program still fails the same way
(same status and the same kind of difference), until no single deletion keeps it failing; then
drops the inputs nothing reads.
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable

from check import Outcome, check_program
from program_generator import Program


def failure_kind(outcome: Outcome) -> str:
    """The status plus what differed (aliasing, dtype, values ...), so that reducing keeps the bug."""
    detail = outcome.detail.split(": ", 1)[-1].split("\n")[0][:60]
    for word in ("aliasing", "dtype", "shape", "values", "requires_grad", "input a", "structure"):
        if word in detail:
            return f"{outcome.status}/{word}"
    return outcome.status


def _split(source: str) -> tuple[str, list[str], list[str]]:
    lines = source.rstrip("\n").split("\n")
    header, body, ret = lines[0], lines[1:-1], lines[-1]
    outputs = [o.strip() for o in ret.strip()[len("return ("):-1].split(",") if o.strip()]
    return header, body, outputs


def _join(header: str, body: list[str], outputs: list[str]) -> str:
    return "\n".join([header, *body, f"    return ({', '.join(outputs)},)"]) + "\n"


def reduce_program(program: Program, failure: Outcome,
                   check: Callable[[Program], Outcome] = check_program, budget: int = 60) -> Program:
    """The smallest program found (within `budget` checks) that fails the same way."""
    import ember
    kind = failure_kind(failure)
    header, body, outputs = _split(program.source)

    def fails(candidate: Program) -> bool:
        nonlocal budget
        if budget <= 0:
            return False
        budget -= 1
        ember.reset()
        try:
            return failure_kind(check(candidate)) == kind
        except Exception:  # noqa: BLE001 (a candidate that breaks the checker is not a reduction)
            return False

    def fails_with(body: list[str], outputs: list[str]) -> bool:
        return bool(outputs) and fails(dataclasses.replace(program, source=_join(header, body, outputs)))

    progress = True
    while progress:
        progress = False
        for i in reversed(range(len(outputs))):
            if len(outputs) > 1 and fails_with(body, outputs[:i] + outputs[i + 1:]):
                outputs = outputs[:i] + outputs[i + 1:]
                progress = True
        for i in reversed(range(len(body))):
            if fails_with(body[:i] + body[i + 1:], outputs):
                body = body[:i] + body[i + 1:]
                progress = True
    reduced = dataclasses.replace(program, source=_join(header, body, outputs))
    pruned = _drop_unused_inputs(reduced)
    return pruned if pruned is not reduced and fails(pruned) else reduced


def _drop_unused_inputs(program: Program) -> Program:
    _, body, outputs = _split(program.source)
    text = "\n".join(body + outputs)
    used = [i for i in range(len(program.inputs)) if re.search(rf"\ba{i}\b", text)]
    if len(used) == len(program.inputs):
        return program
    renames = {f"a{old}": f"a{new}" for new, old in enumerate(used)}

    def rename(line: str) -> str:
        return re.sub(r"\ba\d+\b", lambda m: renames.get(m.group(0), m.group(0)), line)
    header = f"def program({', '.join(renames[f'a{i}'] for i in used)}):"
    source = _join(header, [rename(line) for line in body], [rename(o) for o in outputs])
    return dataclasses.replace(program, source=source, inputs=[program.inputs[i] for i in used])
