"""Symbolic sizes: PyTorch's sympy expressions as IR expressions, and their evaluation."""

from __future__ import annotations

from typing import Any

import sympy

from minicomp.ir.expr import Dim, Expr, binary, call, cast, const, maximum, minimum, size_var
from minicomp.ir.types import f64, i64

# PyTorch's float-to-int rounding functions, by the C math function each matches.
_TO_INT = {"TruncToInt": "trunc", "FloorToInt": "floor", "CeilToInt": "ceil"}


def from_sympy(e: Any) -> Dim | float:
    """A sympy size expression (or SymInt, or int) as an int or an i64 IR expression; a
    float-valued one (a SymFloat such as `4 / n`) as a float or an f64 expression."""
    node = getattr(e, "node", None)
    if node is not None and hasattr(node, "expr"):
        e = node.expr
    if isinstance(e, (int, float)):
        return e
    if isinstance(e, sympy.Integer):
        return int(e)
    if isinstance(e, (sympy.Float, sympy.Rational)):
        return float(e)
    if isinstance(e, sympy.Symbol):
        return size_var(e.name)
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
    raise NotImplementedError(f"symbolic size {e} ({name}) is not supported")


def _e(d: Dim) -> Expr:
    return d if isinstance(d, Expr) else const(d)


def _float(d: Dim | float) -> Expr:
    return cast(_e(d), f64) if isinstance(d, Expr) else const(float(d), f64)


def _fold(args, op):
    out = args[0]
    for a in args[1:]:
        if isinstance(out, int) and isinstance(a, int):
            out = {"add": out + a, "mul": out * a, "max": max(out, a), "min": min(out, a)}[op]
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
