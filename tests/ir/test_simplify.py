"""The index-expression simplifier: expected forms, and agreement with direct evaluation."""

import numpy as np
import pytest

from minicomp.ir.compute import compute
from minicomp.ir.evaluate import evaluate
from minicomp.ir.expr import Var, const, size_var
from minicomp.ir.functor import substitute
from minicomp.ir.simplify import simplify_expr
from minicomp.ir.types import f32, i64
from minicomp.ops.shape import ravel, unravel

i, j, k = Var("i", i64), Var("j", i64), Var("k", i64)
s = size_var("s")
B = {i: (0, 3), j: (0, 7), k: (0, 2)}


def _grid(e):
    """Values of `e` over the box of B, by the reference evaluator (C division semantics)."""
    t = compute("t", (4, 8, 3), lambda a, b, c: substitute(e, {i: a, j: b, k: c}))
    return evaluate(t, {})


CASES = [
    ((i * 8 + j) // 8, i),
    ((i * 8 + j) % 8, j),
    ((j + i * 8) // 8 * 8 + (i * 8 + j) % 8, i * 8 + j),
    (((i * 8 + j) // 16) * 16 + (i * 8 + j) % 16, i * 8 + j),
    ((i * 16 + k * 2) // 8, i * 2),
    ((i * 16 + k * 2 + 1) % 8, k * 2 + 1),
    (((i * 8 + j) // 4) // 2, i),
    (((i * 8 + j) % 8) % 4, j % 4),
    (j // 8, const(0)),
    (j % 8, j),
    (i + 0 * j + i * 2 - 3 + 5, i * 3 + 2),
    (i * 1 - i, const(0)),
    ((i + 1) * 4 - 4, i * 4),
    (3 - i, 3 - i),
    (i < 4, const(True)),
    (i >= 4, const(False)),
    (i < 3, i < 3),
    # 0 <= dividend, but the terms 8 does not divide may be negative: values only.
    ((i * 8 - j + 8) // 8, None),
    ((i * 8 - j + 8) % 8, None),
]


FORMS = [c for c in CASES if c[1] is not None]


@pytest.mark.parametrize("case", range(len(FORMS)))
def test_expected_forms(case):
    e, expected = FORMS[case]
    assert simplify_expr(e, B) == expected, f"{e} -> {simplify_expr(e, B)}, not {expected}"


@pytest.mark.parametrize("case", range(len(CASES)))
def test_same_values_over_the_bounds(case):
    e = CASES[case][0]
    np.testing.assert_array_equal(_grid(simplify_expr(e, B)), _grid(e))


def test_without_bounds_division_stays():
    e = (i * 8 + j) // 8
    assert simplify_expr(e) is e
    assert simplify_expr((i * 8 + j) % 8, {i: (0, 3), j: (0, 8)}) == j % 8
    # A dividend that may be negative: truncation differs from floor, nothing to rewrite.
    assert simplify_expr((i * 8 - j) // 8, B) == (i * 8 - j) // 8


def test_unchanged_returns_same_object_and_leaves_floats_alone():
    x = Var("x", f32)
    e = (x + 1.0) + 2.0
    assert simplify_expr(e) is e
    e = i * 8 + j
    assert simplify_expr(e, B) is e


@pytest.mark.parametrize("mid", [(32,), (2, 16), (4, 2, 4), (8, 4), (2, 2, 2, 4)])
def test_unravel_of_ravel_is_the_axes(mid):
    shape = (4, 8)
    flat = ravel((i, j), shape)
    ks = [Var(f"k{t}", i64) for t in range(len(mid))]
    back = unravel(ravel(ks, mid), shape)
    composed = [substitute(b, dict(zip(ks, unravel(flat, mid)))) for b in back]
    assert [simplify_expr(c, B) for c in composed] == [i, j]


def test_symbolic_extents():
    bounds = {i: (0, 3), j: (0, s - 1), s: (1, None)}
    assert simplify_expr((i * s + j) // s, bounds) == i
    assert simplify_expr((i * s + j) % s, bounds) == j
    assert simplify_expr((i * s * 2 + j) % (s * 2), bounds) == j
    shape = (s, 8)
    bounds = {i: (0, s - 1), j: (0, 7), s: (1, None)}
    v = Var("v", i64)
    back = unravel(ravel((v,), (s * 8,)), shape)
    composed = [substitute(b, {v: unravel(ravel((i, j), shape), (s * 8,))[0]}) for b in back]
    assert [simplify_expr(c, bounds) for c in composed] == [i, j]


def test_launch_indices_are_non_negative_and_threads_below_1024():
    from minicomp.ir.expr import Call, cast
    from minicomp.ir.types import i32

    t = cast(Call("thread_idx_x", (), i32), i64)
    r = Var("r", i64)
    bounds = {r: (0, 3)}
    assert simplify_expr((t % 16 * 4 + r) % 4, bounds) == r
    assert simplify_expr((t // 16 * 4 + r) // 4, bounds) == t // 16
    assert simplify_expr(t % 1024, bounds) == t
    # Nothing is known of a plain i32 value.
    x = cast(Var("x", i32), i64)
    assert simplify_expr((x * 4 + r) % 4, bounds) != r


def test_a_guard_removes_the_clamps_it_makes_redundant():
    from minicomp.ir.expr import logical_and, maximum, minimum, select

    x = Var("x", i64)  # a window tap, i + j - 1 (0 <= i < 4, 0 <= j < 8): may fall outside
    tap = i + j - 1
    clamped = minimum(maximum(tap, 0), 6)
    guard = logical_and(tap >= 0, maximum(tap, 0) < 7)
    # The guard's second term knows the first; the guarded arm knows both.
    assert simplify_expr(guard, B) == logical_and(tap >= 0, tap < 7)
    e = select(guard, clamped * 512 + x, const(-1, i64))
    out = simplify_expr(e, B)
    assert out.cond == logical_and(tap >= 0, tap < 7)
    assert out.a == simplify_expr(tap * 512 + x), "the clamp should go from the guarded arm"
    # Outside the arm nothing is known: the clamps stay.
    assert simplify_expr(clamped, B) == clamped
    assert simplify_expr(clamped, B, assuming=guard) == tap
    # A max whose order the bounds prove is its larger operand.
    assert simplify_expr(maximum(i + 4, j), B) == maximum(i + 4, j)
    assert simplify_expr(maximum(i + 8, j), B) == i + 8


def test_guarded_reads_keep_their_clamps():
    """A backend may evaluate a select's other arm: a read's index stays in bounds."""
    from minicomp.ir.expr import Load, logical_and, maximum, minimum, select
    from minicomp.ir.types import PointerType

    buf = Var("buf", PointerType(f32))
    tap = i + j - 1
    read = Load(buf, minimum(maximum(tap, 0), 6))
    e = select(logical_and(tap >= 0, tap < 7), read, const(0.0, f32))
    assert simplify_expr(e, B) is e


@pytest.mark.parametrize("seed", range(3))
def test_guarded_forms_keep_their_values(seed):
    from minicomp.ir.expr import logical_and, maximum, minimum, select

    rng = np.random.default_rng(seed)
    a, b, c = (int(v) for v in rng.integers(-3, 4, size=3))
    tap = i * a + j + k * b - c
    guard = logical_and(tap >= 0, maximum(tap, 0) < 5)
    e = select(guard, minimum(maximum(tap, 0), 4) * 7 + k, maximum(tap, -2))
    np.testing.assert_array_equal(_grid(simplify_expr(e, B)), _grid(e))
    np.testing.assert_array_equal(_grid(simplify_expr(guard, B)), _grid(guard))
