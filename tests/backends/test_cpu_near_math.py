"""Tests of backends/cpu/near_math.py (which vector loops may run near math and run again) and of
how the C renderer writes such loops."""

from minicomp.backends.cpu import render_module
from minicomp.backends.cpu.near_math import far_tests, near_calls, runs_again_safely
from minicomp.ir import expr as E
from minicomp.ir import stmt as S
from minicomp.ir.func import Function, Module
from minicomp.ir.types import PointerType, bf16, f32, f64, i64

i, j, n = E.Var("i", i64), E.Var("j", i64), E.Var("n", i64)
x, y, out = (E.Var(name, PointerType(f32)) for name in ("x", "y", "out"))
acc, t = E.Var("acc", f32), E.Var("t", f32)


def vector_loop(body: S.Stmt, reductions=()) -> S.For:
    return S.For(i, n, body, kind="vectorize", reductions=reductions)


def sin_of(buf: E.Var) -> E.Expr:
    return E.call("sin", E.Load(buf, i))


def test_near_calls_are_float32_and_half_sin_cos_erf():
    half = E.Var("h", PointerType(bf16))
    calls = [
        E.call("sin", E.Load(x, i)),
        E.call("erf", E.Load(half, i)),
        E.call("cos", E.cast(E.Load(x, i), f64)),  # float64 keeps libm
        E.call("tanh", E.Load(x, i)),  # no near version
    ]
    found = near_calls(S.Store(out, i, calls[0] + calls[1] + E.cast(calls[2], f32) + calls[3]))
    assert found == calls[:2]


def test_far_tests_of_a_statement_and_not_of_those_inside_it():
    inner = S.Store(out, i, E.call("erf", E.Load(y, i)))
    cos_test = S.If(E.call("cos", E.Load(x, i)) > 0, inner)
    chain = S.If(E.call("sin", E.Load(x, i)) > 0, inner, cos_test)
    # One test for sin and cos of the same argument; the else-if's condition is the
    # statement's own (the renderer writes the chain as one statement); the store's is not.
    assert far_tests(chain) == [("mc_trig_far_f32", E.Load(x, i))]
    assert far_tests(inner) == [("mc_erf_far_f32", E.Load(y, i))]


def test_loops_that_may_run_again():
    assert runs_again_safely(vector_loop(S.Store(out, i, sin_of(x))))
    # Its own accumulators (restored first) and locals declared inside it.
    update = S.Assign(acc, acc + sin_of(x))
    assert runs_again_safely(vector_loop(update, reductions=(("add", acc),)))
    local = S.seq(S.Declare(t, sin_of(x)), S.Assign(t, t * t), S.Store(out, i, t))
    assert runs_again_safely(vector_loop(local))
    unrolled = S.For(j, E.const(4), S.Store(out, i * 4 + j, sin_of(x)), kind="unroll")
    assert runs_again_safely(vector_loop(unrolled))


def test_loops_that_may_not():
    # Reads what it writes: a second run would read the first run's results.
    assert not runs_again_safely(vector_loop(S.Store(x, i, sin_of(x))))
    # Writes a variable of the enclosing code that is not one of its reductions.
    assert not runs_again_safely(vector_loop(S.Assign(acc, acc + sin_of(x))))
    # A vector loop inside would need a flag of its own.
    inner = S.For(j, n, S.Store(out, j, sin_of(x)), kind="vectorize")
    assert not runs_again_safely(vector_loop(inner))
    assert not runs_again_safely(vector_loop(S.Evaluate(sin_of(x))))


def render(body: S.Stmt) -> str:
    src = render_module(Module("m", (Function("k", (x, y, out, n), body),)))
    return src[src.index("void k(") :]


def test_rendered_loop_runs_again_with_exact_versions_and_restored_accumulators():
    loop = vector_loop(S.Assign(acc, acc + sin_of(x)), reductions=(("add", acc),))
    text = render(S.seq(S.Declare(acc, E.const(0.0)), loop, S.Store(out, E.const(0), acc)))
    assert text.count("#pragma omp simd") == 2
    near, again = text.split("if (far) {")
    assert "#pragma omp simd reduction(+:acc) reduction(|:far)" in near
    assert "far |= mc_trig_far_f32(x[i]);" in near
    assert "acc = acc + mc_sin_near_f32(x[i]);" in near
    assert "float acc_before = acc;" in near
    assert again.lstrip().startswith("acc = acc_before;")
    assert "acc = acc + mc_sin_f32(x[i]);" in again and "near" not in again


def test_loops_that_may_not_run_again_call_the_exact_versions():
    text = render(vector_loop(S.Store(x, i, sin_of(x) + sin_of(y))))
    assert "near" not in text and "far" not in text
    assert "mc_sin_f32(x[i]) + mc_sin_f32(y[i])" in text
    # Nor loops that are not vector loops.
    text = render(S.For(i, n, S.Store(out, i, sin_of(x))))
    assert "near" not in text
