"""Run-time size evaluation (ir.symbols): size expressions compiled to Python."""

import random

import pytest

from minicomp.ir import expr as E
from minicomp.ir.symbols import compile_dims, evaluate_dim, free_symbols, python_source

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
