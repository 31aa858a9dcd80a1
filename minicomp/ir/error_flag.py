"""The error flag: how a kernel reports what eager PyTorch raises for, after the kernel.

PyTorch raises `RuntimeError: ZeroDivisionError` for an integer division by zero and an
IndexError for an index tensor holding a value out of range; a kernel cannot raise, a plain C
division by zero would kill the process (SIGFPE) and an unchecked index reads out of bounds.
A kernel that may do either takes one more parameter, ERROR_FLAG, last: the address of an
int32 the plan zeroes before its kernels run and checks after (runtime/plan.py). The
division's helper gives 0 for a zero divisor, the index check gives index 0 for one out of
range, and each stores its code (ERRORS) in that int32. The address is a u64 scalar, not a
pointer, so that it travels with the size symbols (the plan binds it by name, as it binds
sizes).

Integer divisions of tensor data are the IR's `div`, `floordiv` and `mod` on integers and
calls of `fmod` on integers; `idiv` and `imod` are index arithmetic, whose divisors are
sizes and never zero where the code runs. A division by a nonzero constant needs no flag, nor
one by a size symbol (a kernel's scalar parameter): Dynamo specializes sizes 0 and 1, so a
symbol is at least 2 (the dynamic-shape `roll` takes an `fmod` by its size).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from minicomp.ir.expr import Binary, Call, Cast, Const, Expr, Var, as_expr, cast
from minicomp.ir.func import Function
from minicomp.ir.functor import collect
from minicomp.ir.types import DataType, i64, u64

ERROR_FLAG = Var("error_flag", u64)
DIVISIONS = ("div", "floordiv", "mod")

DIVISION_BY_ZERO = 1
INDEX_OUT_OF_RANGE = 2  # index_select, embedding, advanced indexing: eager's IndexError
GATHER_OUT_OF_RANGE = 3  # gather: eager's RuntimeError
ERRORS: dict[int, tuple[type[Exception], str]] = {
    DIVISION_BY_ZERO: (RuntimeError, "ZeroDivisionError"),
    INDEX_OUT_OF_RANGE: (IndexError, "index out of range in self"),
    GATHER_OUT_OF_RANGE: (RuntimeError, "index out of bounds for its dimension in gather"),
}
"""What the plan raises for each code a kernel stores in the flag, as eager's error."""

CHECKED_INDEX = "checked_index"


def checked_index(index: Expr, size: Any, code: int = INDEX_OUT_OF_RANGE) -> Expr:
    """`index` read from a tensor, where 0 <= index < size holds; else 0, with `code` stored
    in the kernel's error flag (what makes the plan raise ERRORS[code])."""
    size = cast(as_expr(size), i64)
    return Call(CHECKED_INDEX, (cast(index, i64), size, Const(code, i64)), i64)


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


def may_set_error(e: Expr, sizes: Collection[Var] = ()) -> bool:
    """Whether `e` may store a code in the error flag (a division, an index check)."""
    return isinstance(e, Call) and e.name == CHECKED_INDEX or may_divide_by_zero(e, sizes)


def with_error_flag(f: Function) -> Function:
    """`f` with ERROR_FLAG as its last parameter when it may divide integers by zero or read
    an index out of range."""
    if ERROR_FLAG in f.params:
        return f
    sizes = size_params(f)
    if not any(may_set_error(e, sizes) for e in collect(f.body, (Binary, Call))):
        return f
    return f.replace(params=(*f.params, ERROR_FLAG))
