"""Symbolic sizes: PyTorch's sympy expressions as IR expressions, and their evaluation."""

from __future__ import annotations

from typing import Any

import sympy

from minicomp.ir.expr import Dim, Expr, binary, const, maximum, minimum, size_var


def from_sympy(e: Any) -> Dim:
    """A sympy size expression (or SymInt, or int) as an int or an i64 IR expression."""
    node = getattr(e, "node", None)
    if node is not None and hasattr(node, "expr"):
        e = node.expr
    if isinstance(e, int):
        return e
    if isinstance(e, sympy.Integer):
        return int(e)
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
    if name in ("FloorDiv", "CleanDiv", "IntTrueDiv"):
        return _e(args[0]) // _e(args[1])
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
