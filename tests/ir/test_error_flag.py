"""Which kernels take the error flag, and how the C and CUDA renderers spell their divisions."""

import pytest
import torch
from helpers_lowering import lower, make_tensor

from minicomp.backends.cpu.codegen import render_module as render_c
from minicomp.backends.cuda.codegen import render_module as render_cuda
from minicomp.ir import expr as E
from minicomp.ir import stmt as S
from minicomp.ir.compute import Compute
from minicomp.ir.error_flag import ERROR_FLAG, may_divide_by_zero, with_error_flag
from minicomp.ir.func import Function, Module
from minicomp.ir.functor import collect
from minicomp.ir.types import PointerType, f32, i32, i64

aten = torch.ops.aten
a_ptr, b_ptr = E.Var("a", PointerType(i32)), E.Var("b", PointerType(i32))
out = E.Var("out", PointerType(i32))
i, n = E.Var("i", i64), E.Var("n", i64)
a, b = E.Load(a_ptr, i), E.Load(b_ptr, i)


def kernel(value: E.Expr) -> Function:
    """out[i] = value for i < n."""
    body = S.For(i, n, S.Store(out, i, value))
    return Function("k", (a_ptr, b_ptr, out, n), body)


def body_of(f: Function) -> str:
    source = render_c(Module("m", (f,)))
    return source[source.index("void k(") :]


def test_a_division_by_loaded_integers_takes_the_flag_last():
    f = with_error_flag(kernel(E.binary("floordiv", a, b)))
    assert f.params == (a_ptr, b_ptr, out, n, ERROR_FLAG)
    assert body_of(f) == (
        "void k(const int32_t* __restrict__ a, const int32_t* __restrict__ b, "
        "int32_t* __restrict__ out, int64_t n, uint64_t error_flag) {\n"
        "    for (int64_t i = 0; i < n; ++i) {\n"
        "        out[i] = mc_checked_floordiv_i32(a[i], b[i], error_flag);\n"
        "    }\n"
        "}\n"
    )


@pytest.mark.parametrize(
    "value, spelled",
    [
        (E.binary("div", a, b), "mc_checked_div_i32(a[i], b[i], error_flag)"),
        (E.binary("mod", a, b), "mc_checked_mod_i32(a[i], b[i], error_flag)"),
        (E.call("fmod", a, b), "mc_checked_fmod_i32(a[i], b[i], error_flag)"),
        (E.binary("floordiv", a, E.const(0, i32)), "mc_checked_floordiv_i32(a[i], 0, error_flag)"),
    ],
)
def test_divisions_that_may_divide_by_zero(value, spelled):
    f = with_error_flag(kernel(value))
    assert f.params[-1] == ERROR_FLAG
    assert f"out[i] = {spelled};" in body_of(f)
    assert f"out[i] = {spelled};" in render_cuda(Module("m", (f,)))


@pytest.mark.parametrize(
    "value, spelled",
    [
        # Constants: the helper still computes MIN / -1 without faulting.
        (E.binary("floordiv", a, E.const(-1, i32)), "mc_floordiv_i32(a[i], -1)"),
        (E.binary("div", a, E.const(7, i32)), "mc_div_i32(a[i], 7)"),
        (E.call("fmod", a, E.const(-3, i32)), "mc_fmod_i32(a[i], -3)"),
        # A size symbol is at least 2 (Dynamo specializes 0 and 1).
        (E.call("fmod", E.cast(a, i64), n), "mc_fmod_i64((int64_t)a[i], n)"),
        (E.binary("mod", a, E.cast(n, i32)), "mc_mod_i32(a[i], (int32_t)n)"),
        # Index arithmetic and float division are not checked.
        (E.Binary("idiv", a, b), "a[i] / b[i]"),
        (E.Binary("imod", a, b), "a[i] % b[i]"),
        (E.cast(E.binary("floordiv", E.cast(a, f32), E.cast(b, f32)), i32), None),
    ],
)
def test_divisions_that_need_no_flag(value, spelled):
    f = kernel(value)
    assert with_error_flag(f) is f
    text = body_of(f)
    assert "error_flag" not in text
    if spelled is not None:
        assert f"out[i] = {spelled};" in text


def test_without_the_flag_a_runtime_divisor_still_cannot_fault():
    # A kernel the scheduler did not make (a script kernel) has no flag: a zero divisor gives 0.
    text = body_of(kernel(E.binary("div", a, b) + E.call("fmod", a, b)))
    assert "out[i] = mc_div_i32(a[i], b[i]) + mc_fmod_i32(a[i], b[i]);" in text


@pytest.mark.parametrize(
    "op, kwargs",
    [
        (aten.floor_divide.default, {}),
        (aten.remainder.Tensor, {}),
        (aten.fmod.Tensor, {}),
        (aten.div.Tensor_mode, {"rounding_mode": "trunc"}),
        (aten.div.Tensor_mode, {"rounding_mode": "floor"}),
    ],
    ids=str,
)
def test_every_integer_division_op_lowers_to_a_checked_division(op, kwargs):
    x = make_tensor((4,), torch.int16)
    y = make_tensor((4,), torch.int16, nonzero=True)
    (compute,), _ = lower(op, (x, y), kwargs, op(x, y, **kwargs))
    assert isinstance(compute, Compute)
    assert any(may_divide_by_zero(e) for e in collect(compute.body, (E.Binary, E.Call)))
