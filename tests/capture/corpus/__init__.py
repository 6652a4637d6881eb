"""A corpus of differential Python-feature programs for capture (issue #10: graph breaks).

Each theme module registers plain functions (or factories of nn.Modules and closures) with
``@program(...)``: the call argument sets, what to change between calls, and the counts
``ember.explain`` should report on the FIRST call once graph breaks keep compiled continuations:

- no unsupported construct: graphs=1 (0 without tensor ops), breaks=0;
- ``print`` in the middle: graphs=2, breaks=1; as the first statement: graphs=1, breaks=1;
- ``.item()``/``.tolist()``/``int(t)``/``float(t)``, ``if <tensor>``, ``while <tensor>``, ``.backward()``:
  one break each; the graph before and the graph after (branch taken on the first call) count when they hold ops;
- a break inside a called user function g: 2 breaks; graphs = non-empty pieces of
  [f before the call, g before the break, g after it, f after the call];
- a break inside a loop body run n times: n breaks; graphs = non-empty pieces.

tests/capture/test_corpus.py runs every program eagerly and compiled and compares outputs, printed
text, mutated inputs, module state and watched globals after every call.
"""
from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable

import torch

PROGRAMS: list["Program"] = []


@dataclasses.dataclass
class Call:
    args: tuple
    kwargs: dict


def call(*args: Any, **kwargs: Any) -> Call:
    return Call(args, kwargs)


@dataclasses.dataclass
class Program:
    name: str
    make: Callable[[], Any]          # a fresh target (function or nn.Module); called once per side
    calls: list[Call]
    graphs: int                      # expected on the first call, with compiled continuations
    breaks: int
    before_call: Callable[[int, Any], None] | None  # (call index, target): change globals/closures/attributes
    watch: tuple[str, ...]           # names in the defining module's globals compared after every call
    module_globals: dict
    bug: str | None                  # an ember bug: the differential check is xfail(strict=True)
    count_bug: str | None            # an ember gap in what capture keeps whole: the count check is xfail(strict=True)
    raises: frozenset[int]           # indices of the calls that raise (eagerly and compiled alike)


def program(*calls: Any, graphs: int, breaks: int, before: Callable[[int, Any], None] | None = None,
            watch: tuple[str, ...] = (), factory: bool = False, bug: str | None = None,
            count_bug: str | None = None, raises: tuple[int, ...] = ()) -> Callable:
    """Register a program. ``calls`` are ``call(...)`` objects or plain argument tuples.

    factory=True: the decorated function builds the target (an nn.Module, or a function with its own
    closure state); it is called once for the eager side and once for the compiled side, after
    ``torch.manual_seed(0)``. raises: indices of calls expected to raise (the first call must not).
    """
    assert len(calls) >= 3, "a program needs at least 3 call argument sets"
    assert 0 not in raises, "the first call is the one whose graphs are counted: it must not raise"
    normalized = [c if isinstance(c, Call) else Call(tuple(c), {}) for c in calls]

    def register(fn: Callable) -> Callable:
        theme = fn.__module__.rsplit(".", 1)[-1]
        PROGRAMS.append(Program(
            name=f"{theme}.{fn.__name__}", make=fn if factory else (lambda: fn), calls=normalized,
            graphs=graphs, breaks=breaks, before_call=before, watch=tuple(watch),
            module_globals=fn.__globals__, bug=bug, count_bug=count_bug,
            raises=frozenset(raises)))
        return fn

    return register


_generator = torch.Generator().manual_seed(20240607)


def randn(*shape: int, dtype: torch.dtype = torch.float32, requires_grad: bool = False) -> torch.Tensor:
    """Deterministic inputs (one generator for the whole corpus, drawn at import)."""
    return torch.randn(*shape, generator=_generator).to(dtype).requires_grad_(requires_grad)


def ints(*shape: int, low: int = -4, high: int = 5, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Small whole numbers: sums and products are exact, so printed values match bit for bit."""
    return torch.randint(low, high, shape, generator=_generator).to(dtype)


THEMES = (
    "control_flow", "loops", "containers", "comprehensions", "closures", "classes", "mutation", "globals_",
    "modules_", "context_managers", "exceptions_and_asserts", "strings_and_math",
    "printing", "breaks_data", "breaks_nested",  # the themes whose programs break
)


def load_all() -> list[Program]:
    """Import every theme module (importing one registers its programs)."""
    for theme in THEMES:
        importlib.import_module(f"{__name__}.{theme}")
    return PROGRAMS
