"""count_ops: a kernel's lens build counts the operations its IR performs, per thread, as it
runs: checked by running hand-built kernels in a counted emulator build."""

import pytest
import torch

from minicomp.backends.cuda.codegen import render_module
from minicomp.backends.cuda.emu import build_emulated
from minicomp.ir import stmt as S
from minicomp.ir import types as T
from minicomp.ir.expr import Binary, Call, Cast, Const, Load, Var
from minicomp.ir.func import Function, Module
from minicomp.passes.kernel.count_ops import count_ops

x, y = Var("x", T.PointerType(T.f32)), Var("y", T.PointerType(T.f32))
n, k = Var("n", T.i64), Var("k", T.i64)
i = Var("i", T.i64)


def axpy_divide_exp() -> Function:
    """One thread: for i < n, y[i] = 2 * x[i] + y[i] (a fused multiply-add), then
    y[i] = exp(y[i]) + i / k (an integer division by a run-time value, a conversion)."""
    fma = Binary("add", Binary("mul", Const(2.0, T.f32), Load(x, i)), Load(y, i))
    quotient = Cast(Binary("idiv", i, k), T.f32)
    body = S.Seq(
        (
            S.Store(y, i, fma),
            S.Store(y, i, Binary("add", Call("exp", (Load(y, i),), T.f32), quotient)),
        )
    )
    return Function("axpy_divide_exp", (x, y, n, k), S.For(i, n, body))


@pytest.fixture(scope="module")
def counted(tmp_path_factory):
    fn = count_ops(axpy_divide_exp())
    source = render_module(Module("m", (fn,)))
    assert "mc_lens_ops(" in source
    return build_emulated(source, [fn], cache_dir=str(tmp_path_factory.mktemp("c")), lens=True)


def test_each_iteration_counts_its_operations(counted):
    xs, ys = torch.randn(10), torch.randn(10)
    expected = torch.exp(2 * xs + ys) + torch.arange(10).div(3, rounding_mode="trunc")
    c = counted.launch_counted("axpy_divide_exp", 1, 1, [xs, ys, 10, 3]).counters
    torch.testing.assert_close(ys, expected)
    assert c["flops"] == 10 * 3  # the multiply-add is two, the outer add one
    assert c["fp_instructions"] == 10 * 2  # the multiply-add is one instruction
    assert c["int_divides"] == 10 and c["special"] == 10
    assert c["int64_instructions"] == 10 * 2  # the loop's increment and test
    assert c["int_instructions"] == 0


def test_a_division_by_a_power_of_two_is_not_a_divide():
    fn = Function(
        "halve",
        (y, n),
        S.Store(y, Const(0, T.i64), Cast(Binary("idiv", n, Const(8, T.i64)), T.f32)),
    )
    counted = count_ops(fn)
    call = counted.body.body[0].expr
    assert call.name == "lens_ops"
    flops, fp, i32, i64, divides, special, conversions, address = (a.value for a in call.args)
    assert (divides, i64, flops) == (0, 1, 0)


def test_a_kernel_without_operations_gets_no_calls():
    fn = Function("store_zero", (y,), S.Store(y, Const(0, T.i64), Const(0.0, T.f32)))
    assert "lens_ops" not in repr(count_ops(fn))


def _calls(fn: Function) -> list[tuple[int, ...]]:
    """The counts of every lens_ops call of `count_ops(fn)`, in order (equal calls too)."""
    found = []

    def walk(node):
        if isinstance(node, S.Evaluate) and node.expr.name == "lens_ops":
            found.append(tuple(a.value for a in node.expr.args))
        children = node if isinstance(node, tuple) else getattr(node, "children", tuple)()
        for child in children:
            walk(child)

    walk(count_ops(fn).body)
    return found


def test_a_division_by_another_constant_is_a_multiply_and_shift():
    fn = Function(
        "third",
        (y, n),
        S.Store(y, Const(0, T.i64), Cast(Binary("idiv", n, Const(3, T.i64)), T.f32)),
    )
    (counts,) = _calls(fn)
    flops, fp, i32, i64, divides, special, conversions, address = counts
    assert (divides, i64) == (0, 2)


def test_integer_work_of_unrolled_loops_folds_into_constants():
    t = Var("t", T.i64)
    j = Var("j", T.i64)
    body = S.Seq(
        (
            S.Declare(t, Binary("add", Binary("mul", j, Const(3, T.i64)), Const(1, T.i64))),
            S.Store(y, t, Const(1.0, T.f32)),
        )
    )
    unrolled = Function("fold", (y,), S.For(j, Const(4, T.i64), body, kind="unroll"))
    rolled = Function("fold", (y,), S.For(j, Var("m", T.i64), body))
    assert sum(c[3] for c in _calls(unrolled)) == 0
    # Rolled, the two operations run every iteration, with the loop's increment and test.
    assert sum(c[3] for c in _calls(rolled)) == 2 + 2


def test_loop_invariant_integer_work_is_hoisted_out_of_the_loop():
    t = Var("t", T.i64)

    def kernel(init):
        body = S.Seq((S.Declare(t, init), S.Store(y, Binary("add", t, i), Const(1.0, T.f32))))
        return Function("hoist", (y, n, k), S.For(i, n, body))

    invariant = Binary("mul", k, Const(3, T.i64))  # depends on a parameter only
    varying = Binary("mul", i, Const(3, T.i64))
    loop_only = 2  # the increment and the test
    assert sum(c[3] for c in _calls(kernel(invariant))) == loop_only
    assert sum(c[3] for c in _calls(kernel(varying))) == loop_only + 1


def test_a_reassigned_variable_varies_where_it_is_assigned():
    acc = Var("acc", T.i64)
    body = S.Seq(
        (
            S.Assign(acc, Binary("add", acc, Const(1, T.i64))),
            S.Declare(Var("t", T.i64), Binary("mul", acc, k)),
        )
    )
    fn = Function(
        "assigned", (y, n, k), S.Seq((S.Declare(acc, Const(0, T.i64)), S.For(i, n, body)))
    )
    # the add, the multiply by acc (not hoisted: acc changes each iteration), the loop's two
    assert sum(c[3] for c in _calls(fn)) == 4


def _per_iteration(fn: Function) -> int:
    """The integer and address instructions of `count_ops(fn)`'s calls that run in an
    iteration of its outer loop, each unrolled loop's body once per copy."""

    def walk(node, times):
        if isinstance(node, S.Evaluate) and node.expr.name == "lens_ops":
            args = [a.value for a in node.expr.args]
            return times * (args[2] + args[3] + args[7])
        if isinstance(node, S.For) and node.kind == "unroll":
            times *= node.extent.value
        children = node if isinstance(node, tuple) else getattr(node, "children", tuple)()
        return sum(walk(child, times) for child in children)

    return walk(count_ops(fn).body, 1)


def test_work_the_unrolled_copies_share_counts_once():
    """Each copy of an unrolled loop computes `k * 3 + i` again; the compiler does it once."""
    j, t, u = Var("j", T.i64), Var("t", T.i64), Var("u", T.i64)
    shared = Binary("add", Binary("mul", k, Const(3, T.i64)), i)  # changes with i only

    def kernel(init_u):
        body = S.Seq(
            (
                S.Declare(t, shared),
                S.Declare(u, init_u),
                S.Store(y, Binary("add", t, u), Const(1.0, T.f32)),
            )
        )
        unrolled = S.For(j, Const(4, T.i64), body, kind="unroll")
        return Function("share", (y, n, k), S.For(i, n, unrolled))

    loop = 2  # the rolled loop's increment and test
    # u = j * 5: a constant in each copy; t: k * 3 leaves the rolled loop, + i counts once
    # for the four copies; t + u: one a copy.
    assert _per_iteration(kernel(Binary("mul", j, Const(5, T.i64)))) == loop + 1 + 4
    # u = i * j: one multiply a copy.
    assert _per_iteration(kernel(Binary("mul", i, j))) == loop + 1 + 4 + 4


def test_work_under_a_condition_of_the_copy_counts_in_each_copy():
    j, t = Var("j", T.i64), Var("t", T.i64)
    body = S.If(
        Binary("lt", j, k),
        S.Seq(
            (
                S.Declare(t, Binary("mul", i, k)),
                S.Store(y, t, Const(1.0, T.f32)),
            )
        ),
    )
    unrolled = S.For(j, Const(4, T.i64), body, kind="unroll")
    fn = Function("guarded", (y, n, k), S.For(i, n, unrolled))
    # the rolled loop's two; per copy, the test j < k (hoisted: j is a constant in each
    # copy, k does not change) and the multiply
    assert _per_iteration(fn) == 2 + 4


def test_a_subexpression_written_twice_counts_once():
    q = Binary("idiv", Binary("add", i, k), Const(3, T.i64))  # an add, a multiply-high, a shift
    both = Binary("add", Binary("mul", q, Const(7, T.i64)), q)
    fn = Function("cse", (y, n, k), S.For(i, n, S.Store(y, Const(0, T.i64), Cast(both, T.f32))))
    # the loop's two, q's three once, the multiply and the add
    assert sum(c[3] for c in _calls(fn)) == 2 + 3 + 2
