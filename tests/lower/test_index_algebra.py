"""The index algebra's div/mod rewrites (ember/lower/ir.py) against Python's integer arithmetic:
every rewrite is checked at every point of a range, and the merged forms are checked to be the
short ones a kernel should compute."""
from __future__ import annotations

import itertools

import pytest

from ember.lower import ir

X = ir.Var("x", 100_000)


def value_at(index: ir.Index, x: int) -> int:
    folded = index.substitute({X: ir.const_index(x)})
    assert not folded.terms, folded
    return folded.const


def atoms(index: ir.Index) -> list[ir.Atom]:
    found = []
    for atom, _ in index.terms:
        found.append(atom)
        if isinstance(atom, (ir.FloorDiv, ir.ModIndex)):
            found += atoms(atom.arg)
    return found


@pytest.mark.parametrize("d, m, c, base", list(itertools.product((2, 3, 8, 64), (3, 12), (1, 5), ("x", "2x+1", "x%wide"))))
def test_quotient_wrapped_and_remainder_merge_into_one_mod(d, m, c, base):
    """c*d*((a // d) % m) + c*(a % d) == c*(a % (d*m)): a column index split into head and dim
    over a cat of heads (vit's qkv gradient: (x // 64) % 12 and x % 64 of x % 2304)."""
    x = ir.Index([(X, 1)])
    a = {"x": x, "2x+1": x * 2 + 1, "x%wide": x % (d * m * 3)}[base]
    split = (a // d) % m * (c * d) + (a % d) * c + 7
    for point in range(0, 4 * d * m * 3 + 5):
        a_value = {"x": point, "2x+1": 2 * point + 1, "x%wide": point % (d * m * 3)}[base]
        assert value_at(split, point) == c * (a_value % (d * m)) + 7, (str(split), point)
    assert not any(isinstance(atom, ir.FloorDiv) for atom in atoms(split)), str(split)
    if base != "2x+1":
        assert str(split) == (f"{c}*" if c != 1 else "") + f"((x) % {d * m}) + 7"


@pytest.mark.parametrize("k, d", [(2, 3), (3, 768), (4, 8), (1, 5)])
def test_mod_of_a_mod_by_a_multiple(k, d):
    x = ir.Index([(X, 1)])
    twice = (x % (k * d)) % d
    assert str(twice) == f"((x) % {d})"
    for point in range(0, 3 * k * d + 2):
        assert value_at(twice, point) == point % d


def test_mod_of_a_mod_by_a_non_multiple_is_kept():
    x = ir.Index([(X, 1)])
    kept = (x % 2304) % 100
    assert str(kept) == "((((x) % 2304)) % 100)"
    assert all(value_at(kept, p) == (p % 2304) % 100 for p in range(0, 5000, 7))


def test_wrapped_quotient_with_another_coefficient_is_not_merged():
    """8*((x // 8) % 3) + 2*(x % 8) is no single mod: both atoms stay."""
    x = ir.Index([(X, 1)])
    mixed = (x // 8) % 3 * 8 + (x % 8) * 2
    assert all(value_at(mixed, p) == 8 * ((p // 8) % 3) + 2 * (p % 8) for p in range(200))
    assert len(mixed.terms) == 2
