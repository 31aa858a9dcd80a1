"""Workspace planning (runtime.memory) and run-time size evaluation (runtime.symbols)."""

import random

import pytest

from minicomp.ir import expr as E
from minicomp.runtime.memory import ALIGN, Interval, plan_offsets
from minicomp.runtime.symbols import compile_dims, evaluate_dim, free_symbols, python_source


def _padded(n: int) -> int:
    return -(-max(n, 1) // ALIGN) * ALIGN


def assert_valid_plan(buffers: list[Interval], offsets: list[int], total: int) -> None:
    """No two buffers live at the same step share a byte; every buffer is aligned and fits."""
    assert len(offsets) == len(buffers)
    for k, (b, off) in enumerate(zip(buffers, offsets)):
        assert off % ALIGN == 0, f"buffer {k} at {off}"
        assert 0 <= off and off + b.nbytes <= total
    for k in range(len(buffers)):
        for m in range(k + 1, len(buffers)):
            p, q = buffers[k], buffers[m]
            live_together = not (p.last < q.first or q.last < p.first)
            if not live_together:
                continue
            lo_p, hi_p = offsets[k], offsets[k] + max(p.nbytes, 1)
            lo_q, hi_q = offsets[m], offsets[m] + max(q.nbytes, 1)
            assert hi_p <= lo_q or hi_q <= lo_p, (
                f"buffers {k} {p} at {lo_p} and {m} {q} at {lo_q} overlap"
            )


def _random_buffers(rng: random.Random) -> list[Interval]:
    steps = rng.randint(1, 12)
    out = []
    for _ in range(rng.randint(1, 25)):
        first = rng.randrange(steps)
        last = rng.randint(first, min(steps - 1, first + rng.randint(0, 4)))
        nbytes = rng.choice([0, 1, 4, 63, 64, 65, 100, 256, 1000, rng.randint(1, 5000)])
        out.append(Interval(nbytes, first, last))
    return out


def test_random_plans_never_overlap_live_buffers():
    rng = random.Random(1234)
    for _ in range(400):
        buffers = _random_buffers(rng)
        offsets, total = plan_offsets(buffers)
        assert_valid_plan(buffers, offsets, total)
        assert total <= sum(_padded(b.nbytes) for b in buffers)


def test_buffers_with_disjoint_lifetimes_share_memory():
    buffers = [Interval(1000, s, s) for s in range(5)]
    offsets, total = plan_offsets(buffers)
    assert_valid_plan(buffers, offsets, total)
    assert total == _padded(1000)
    assert total < sum(b.nbytes for b in buffers)


def test_a_chain_needs_two_buffers():
    # Step s reads buffer s-1 and writes buffer s: neighbours overlap, every other one not.
    buffers = [Interval(512, s, s + 1) for s in range(6)]
    offsets, total = plan_offsets(buffers)
    assert_valid_plan(buffers, offsets, total)
    assert total == 2 * 512


def test_buffers_live_together_are_all_kept():
    buffers = [Interval(100, 0, 3), Interval(200, 1, 2), Interval(50, 2, 5)]
    offsets, total = plan_offsets(buffers)
    assert_valid_plan(buffers, offsets, total)
    assert total == sum(_padded(b.nbytes) for b in buffers)


def test_sizes_are_padded_to_the_alignment():
    offsets, total = plan_offsets([Interval(1, 0, 0), Interval(1, 0, 0), Interval(0, 0, 0)])
    assert sorted(offsets) == [0, ALIGN, 2 * ALIGN]
    assert total == 3 * ALIGN


def test_no_buffers():
    assert plan_offsets([]) == ([], 0)


# --- size expressions ----------------------------------------------------------------------

SYMS = [E.size_var(n) for n in ("s0", "s1", "s2")]


def _nonneg(rng: random.Random, depth: int):
    """A random size expression that is non-negative for non-negative symbols."""
    if depth == 0 or rng.random() < 0.25:
        return rng.choice(SYMS) if rng.random() < 0.7 else E.const(rng.randint(0, 9))
    op = rng.choice(["add", "mul", "max", "min", "idiv", "imod"])
    a = _nonneg(rng, depth - 1)
    b = _nonneg(rng, depth - 1)
    if op in ("idiv", "imod"):
        b = b + 1  # a positive divisor
    return E.binary(op, a, b)


def _any(rng: random.Random, depth: int):
    """A random size expression that may go negative (Python floor semantics apply)."""
    if depth == 0 or rng.random() < 0.2:
        return _nonneg(rng, 2)
    op = rng.choice(["add", "sub", "mul", "max", "min", "floordiv", "mod", "neg"])
    a = _any(rng, depth - 1)
    if op == "neg":
        return E.Unary("neg", a)
    b = _any(rng, depth - 1)
    if op in ("floordiv", "mod"):
        b = _nonneg(rng, 2) + 1
    return E.binary(op, a, b)


def _reference(e, env: dict) -> int:
    """The value of a size expression, by its documented semantics."""
    if isinstance(e, int):
        return e
    if isinstance(e, E.Const):
        return int(e.value)
    if isinstance(e, E.Var):
        return env[e.name]
    if isinstance(e, E.Unary):
        assert e.op == "neg"
        return -_reference(e.a, env)
    a, b = _reference(e.a, env), _reference(e.b, env)
    if e.op in ("idiv", "imod"):  # C truncation
        q = abs(a) // abs(b) * (1 if (a >= 0) == (b > 0) else -1)
        return q if e.op == "idiv" else a - q * b
    if e.op == "floordiv":
        return a // b
    if e.op == "mod":
        return a % b
    return {"add": a + b, "sub": a - b, "mul": a * b, "max": max(a, b), "min": min(a, b)}[e.op]


@pytest.mark.parametrize("gen", [_nonneg, _any])
def test_compiled_dims_agree_with_python_on_random_nested_expressions(gen):
    rng = random.Random(7)
    for _ in range(60):
        dims = [gen(rng, 4) for _ in range(rng.randint(1, 4))] + [rng.randint(0, 5)]
        fn = compile_dims(dims)
        for _ in range(5):
            env = {s.name: rng.randint(0, 40) for s in SYMS}
            expected = tuple(_reference(d, env) for d in dims)
            assert fn(env) == expected, [python_source(d) for d in dims]
            assert evaluate_dim(dims[0], env) == expected[0]


def test_constant_dims_and_free_symbols():
    assert compile_dims([2, 3])({}) == (2, 3)
    assert compile_dims([])({}) == ()
    s0, s1 = SYMS[:2]
    e = E.maximum(s0 * 4, s1 // 2 + 1)
    assert compile_dims([e, 7, s0])({"s0": 3, "s1": 30}) == (16, 7, 3)
    assert free_symbols([e, 7, s0]) == {"s0", "s1"}
    assert free_symbols([1, 2]) == set()
