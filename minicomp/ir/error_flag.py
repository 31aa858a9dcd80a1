"""The error flag: how a kernel dividing integers by a runtime value reports a zero divisor.

PyTorch raises `RuntimeError: ZeroDivisionError` for an integer division by zero; a kernel
cannot raise, and a plain C division would kill the process (SIGFPE). A kernel with such a
division takes one more parameter, ERROR_FLAG, last: the address of an int32 the plan zeroes
before its kernels run and checks after (runtime/plan.py). The division's helper gives 0 for
a zero divisor and sets that int32 to 1. The address is a u64 scalar, not a pointer, so that
it travels with the size symbols (the plan binds it by name, as it binds sizes).

Integer divisions of tensor data are the IR's `div`, `floordiv` and `mod` on integers and
calls of `fmod` on integers; `idiv` and `imod` are index arithmetic, whose divisors are
sizes and never zero where the code runs. A division by a nonzero constant needs no flag, nor
one by a size symbol (a kernel's scalar parameter): Dynamo specializes sizes 0 and 1, so a
symbol is at least 2 (the dynamic-shape `roll` takes an `fmod` by its size).
"""

from __future__ import annotations

from collections.abc import Collection

from minicomp.ir.expr import Binary, Call, Cast, Const, Expr, Var
from minicomp.ir.func import Function
from minicomp.ir.functor import collect
from minicomp.ir.types import DataType, u64

ERROR_FLAG = Var("error_flag", u64)
DIVISIONS = ("div", "floordiv", "mod")


def division_operands(e: Expr) -> tuple[Expr, Expr] | None:
    """(dividend, divisor) when `e` is an integer division of tensor data, else None."""
    if isinstance(e, Binary) and e.op in DIVISIONS and e.a.dtype.is_integer:
        return e.a, e.b
    if isinstance(e, Call) and e.name == "fmod" and e.dtype.is_integer:
        return e.args[0], e.args[1]
    return None


def may_divide_by_zero(e: Expr, sizes: Collection[Var] = ()) -> bool:
    """Whether `e` is an integer division of tensor data whose divisor is neither a nonzero
    constant nor one of the size symbols `sizes` (what the error flag reports)."""
    operands = division_operands(e)
    if operands is None:
        return False
    divisor = operands[1]
    while isinstance(divisor, Cast) and divisor.dtype.nbytes >= 4:
        divisor = divisor.a
    if isinstance(divisor, Const):
        return divisor.value == 0
    return divisor not in sizes


def size_params(f: Function) -> set[Var]:
    """The size symbols among the parameters of `f` (its scalar ones, but the flag)."""
    return {p for p in f.params if isinstance(p.type, DataType) and p != ERROR_FLAG}


def with_error_flag(f: Function) -> Function:
    """`f` with ERROR_FLAG as its last parameter when it may divide integers by zero."""
    if ERROR_FLAG in f.params:
        return f
    sizes = size_params(f)
    if not any(may_divide_by_zero(e, sizes) for e in collect(f.body, (Binary, Call))):
        return f
    return f.replace(params=(*f.params, ERROR_FLAG))
