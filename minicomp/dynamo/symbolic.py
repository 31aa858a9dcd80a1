"""Symbolic sizes: PyTorch's sympy expressions as IR expressions, and their evaluation."""

from __future__ import annotations

from typing import Any

import sympy
from torch.utils._sympy.symbol import SymT, symbol_is_type

from minicomp.ir.expr import (
    Dim,
    Expr,
    Var,
    binary,
    call,
    cast,
    const,
    maximum,
    minimum,
    select,
    size_var,
    unary,
)
from minicomp.ir.types import boolean, f64, i64

# Symbols of float values (`.item()` of a float tensor, a float argument Dynamo traces as a
# symbol); every other symbol is an integer.
_FLOAT_SYMBOLS = (SymT.FLOAT, SymT.UNBACKED_FLOAT)
# PyTorch's float-to-int rounding functions, by the C math function each matches. Python's
# round() rounds half to even, as rint does.
_TO_INT = {"TruncToInt": "trunc", "FloorToInt": "floor", "CeilToInt": "ceil", "RoundToInt": "rint"}
# sympy relations and PyTorch's bitwise functions, by IR binary op.
_RELATIONS = {
    "GreaterThan": "ge",
    "StrictGreaterThan": "gt",
    "LessThan": "le",
    "StrictLessThan": "lt",
    "Equality": "eq",
    "Unequality": "ne",
}
_BITWISE = {
    "BitwiseFn_bitwise_and": "bitand",
    "BitwiseFn_bitwise_or": "bitor",
    "BitwiseFn_bitwise_xor": "bitxor",
    "LShift": "shl",
    "RShift": "shr",
}
# Math functions of OpaqueUnaryFn_<name> (sym_node.py's math_op_names) the IR knows.
_OPAQUE = ("sqrt", "cos", "cosh", "sin", "sinh", "tan", "tanh", "asin", "acos", "atan", "exp")
_OPAQUE += ("log", "asinh", "log2")


def from_sympy(e: Any) -> Dim | float | bool:
    """A sympy size expression (or SymInt, or int) as an int or an i64 IR expression; a
    float-valued one (a SymFloat such as `4 / n`) as a float or an f64 expression; a
    condition (a SymBool such as `u0 >= 0`) as a bool or a boolean expression."""
    node = getattr(e, "node", None)
    if node is not None and hasattr(node, "expr"):
        e = node.expr
    if isinstance(e, (bool, int, float)):
        return e
    if e is sympy.true or e is sympy.false:
        return bool(e)
    if isinstance(e, sympy.Integer):
        return int(e)
    if isinstance(e, (sympy.Float, sympy.Rational)):
        return float(e)
    if isinstance(e, sympy.Symbol):
        return Var(e.name, f64) if symbol_is_type(e, _FLOAT_SYMBOLS) else size_var(e.name)
    name = type(e).__name__
    args = [from_sympy(a) for a in e.args]
    if isinstance(e, sympy.Add):
        return _fold(args, "add")
    if isinstance(e, sympy.Mul):
        return _fold(args, "mul")
    if isinstance(e, sympy.Pow) and isinstance(e.exp, sympy.Integer) and int(e.exp) > 0:
        return _fold([args[0]] * int(e.exp), "mul")
    if name == "PowByNatural" and isinstance(args[1], int) and args[1] >= 0:
        return _fold([args[0]] * args[1], "mul") if args[1] else 1
    if name in ("IntTrueDiv", "FloatTrueDiv"):
        # True division: int / SymInt is a float, never the floor quotient.
        if all(isinstance(a, (int, float)) for a in args):
            return args[0] / args[1]
        return binary("div", _float(args[0]), _float(args[1]))
    if name == "ToFloat":
        return float(args[0]) if isinstance(args[0], (int, float)) else _float(args[0])
    if name in _TO_INT:
        return cast(call(_TO_INT[name], _float(args[0])), i64)
    if name == "TruncToFloat":
        return call("trunc", _float(args[0]))
    if name == "RoundDecimal":
        # As Inductor computes it: rint of the value scaled by 10^ndigits, scaled back.
        scale = 10.0 ** int(args[1])
        return binary("div", call("rint", binary("mul", _float(args[0]), scale)), scale)
    if name.startswith("OpaqueUnaryFn_") and name.removeprefix("OpaqueUnaryFn_") in _OPAQUE:
        return call(name.removeprefix("OpaqueUnaryFn_"), _float(args[0]))
    if name == "FloatPow":
        return binary("pow", _float(args[0]), _float(args[1]))
    if name in ("FloorDiv", "CleanDiv"):
        return _e(args[0]) // _e(args[1])
    if name == "CeilDiv":  # of sizes, which are never negative
        return (_e(args[0]) + _e(args[1]) - 1) // _e(args[1])
    if name in ("Mod", "PythonMod"):
        return _e(args[0]) % _e(args[1])
    if name == "ModularIndexing":
        return (_e(args[0]) // _e(args[1])) % _e(args[2])
    if name in ("Max",):
        return _fold(args, "max")
    if name in ("Min",):
        return _fold(args, "min")
    if name == "Abs":
        return abs(args[0]) if isinstance(args[0], (int, float)) else _abs(args[0])
    if name == "Identity":
        return args[0]
    if name in _RELATIONS:
        return binary(_RELATIONS[name], _e(args[0]), _e(args[1]))
    if name in _BITWISE:
        return binary(_BITWISE[name], _e(args[0]), _e(args[1]))
    if name in ("And", "Or"):
        return _fold([cast(_e(a), boolean) for a in args], name.lower())
    if name == "Not":
        return unary("not", cast(_e(args[0]), boolean))
    if name == "Where":
        return select(_e(args[0]), _e(args[1]), _e(args[2]))
    raise NotImplementedError(f"symbolic size {e} ({name}) is not supported")


def _e(d: Dim | float | bool) -> Expr:
    if isinstance(d, Expr):
        return d
    return const(d, f64) if isinstance(d, float) else const(d)


def _float(d: Dim | float) -> Expr:
    return cast(_e(d), f64) if isinstance(d, Expr) else const(float(d), f64)


def _abs(x: Expr) -> Expr:
    return select(x < 0, -x, x)


_PYTHON = {
    "add": lambda a, b: a + b,
    "mul": lambda a, b: a * b,
    "max": max,
    "min": min,
    "and": lambda a, b: a and b,
    "or": lambda a, b: a or b,
}


def _fold(args, op):
    out = args[0]
    for a in args[1:]:
        if not isinstance(out, Expr) and not isinstance(a, Expr):
            out = _PYTHON[op](out, a)
        elif op == "max":
            out = maximum(_e(out), _e(a))
        elif op == "min":
            out = minimum(_e(out), _e(a))
        else:
            out = binary(op, _e(out), _e(a))
    return out


def shape_of(sizes) -> tuple[Dim, ...]:
    """A torch size (of ints and SymInts) as a shape of ints and expressions."""
    return tuple(from_sympy(s) for s in sizes)
