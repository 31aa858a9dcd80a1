"""Evaluating size expressions at run time: compiled once to Python lambdas over the symbols."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

from minicomp.ir import types as T
from minicomp.ir.expr import Binary, Call, Cast, Const, Expr, Select, Unary, Var
from minicomp.ir.func import Function
from minicomp.ir.functor import Functor, collect

_PY = {
    "add": "+",
    "sub": "-",
    "mul": "*",
    "floordiv": "//",
    "mod": "%",
    "pow": "**",
    "lt": "<",
    "le": "<=",
    "gt": ">",
    "ge": ">=",
    "eq": "==",
    "ne": "!=",
    "and": "and",
    "or": "or",
    "bitand": "&",
    "bitor": "|",
    "bitxor": "^",
    "shl": "<<",
    "shr": ">>",
}
# Math functions of size expressions (symbolic.py), by the Python function computing each.
_CALLS = {
    "trunc": "math.trunc",
    "floor": "math.floor",
    "ceil": "math.ceil",
    "rint": "round",  # half to even, as C's rint
    "abs": "abs",
    **{name: f"math.{name}" for name in ("sqrt", "exp", "log", "log2", "sin", "cos", "tan")},
    **{name: f"math.{name}" for name in ("sinh", "cosh", "tanh", "asin", "acos", "atan")},
    "asinh": "math.asinh",
}
_CASTS = {"float": "float", "int": "int", "uint": "int", "bool": "bool"}


class _PyExpr(Functor):
    def visit_Const(self, e: Const) -> str:
        v = e.value
        return f"float({str(v)!r})" if isinstance(v, float) and not math.isfinite(v) else repr(v)

    def visit_Var(self, e: Var) -> str:
        return f"env[{e.name!r}]"

    def visit_Binary(self, e: Binary) -> str:
        a, b = self.visit(e.a), self.visit(e.b)
        if e.op in ("max", "min"):
            return f"{e.op}({a}, {b})"
        if e.op in ("idiv", "imod") or e.op == "div" and not e.dtype.is_float:
            # C truncation; sizes are non-negative so floor is the same
            return f"({a} {'%' if e.op == 'imod' else '//'} {b})"
        if e.op == "div":
            return f"({a} / {b})"
        return f"({a} {_PY[e.op]} {b})"

    def visit_Unary(self, e: Unary) -> str:
        op = {"neg": "-", "not": "not ", "bitnot": "~"}[e.op]
        return f"({op}{self.visit(e.a)})"

    def visit_Cast(self, e: Cast) -> str:
        return f"{_CASTS[e.type.kind]}({self.visit(e.a)})"

    def visit_Call(self, e: Call) -> str:
        if e.name not in _CALLS:
            raise NotImplementedError(f"size expression calling {e.name}")
        return f"{_CALLS[e.name]}({', '.join(self.visit(a) for a in e.args)})"

    def visit_Select(self, e: Select) -> str:
        return f"({self.visit(e.a)} if {self.visit(e.cond)} else {self.visit(e.b)})"


def python_source(e: Any) -> str:
    """A size (int or expression) as Python source reading symbols from `env`."""
    return repr(e) if isinstance(e, int) else _PyExpr().visit(e)


def compile_dims(dims: Sequence[Any]) -> Callable[[dict], tuple]:
    """A function from a symbol binding to the tuple of values of `dims`."""
    if all(isinstance(d, int) for d in dims):
        const = tuple(dims)
        return lambda env: const
    src = "lambda env: (" + "".join(python_source(d) + ", " for d in dims) + ")"
    return eval(src)  # noqa: S307 - source built from our own IR


def evaluate_dim(d: Any, env: dict) -> int:
    """The value of one size under a symbol binding."""
    return d if isinstance(d, int) else compile_dims([d])(env)[0]


def free_symbols(dims: Sequence[Any]) -> set[str]:
    """The names of the symbols some sizes use."""
    return {v.name for d in dims if isinstance(d, Expr) for v in collect(d, Var)}


Dims = tuple[tuple[int, int, int], tuple[int, int, int]]


def launch_dims(kernel: Function) -> Callable[[Sequence[Any]], Dims]:
    """(grid, block) of `kernel` as a function of its arguments (sizes are the trailing ones).
    A grid that is not a multiple of the kernel's cluster (attrs.cluster_dim) is a ValueError
    naming both."""
    grid, block = kernel.attrs.grid_dim, kernel.attrs.block_dim
    if all(isinstance(d, int) for d in (*grid, *block)):
        fixed = (tuple(grid), tuple(block))
        check_cluster(kernel, fixed[0])
        return lambda args: fixed
    symbols = [p.name for p in kernel.params if isinstance(p.type, T.DataType)]
    first = len(kernel.params) - len(symbols)
    grid_fn, block_fn = compile_dims(list(grid)), compile_dims(list(block))
    cluster = kernel.attrs.cluster_dim

    def dims(args: Sequence[Any]) -> Dims:
        env = dict(zip(symbols, args[first:]))
        g = grid_fn(env)
        if cluster is not None:
            check_cluster(kernel, g)
        return g, block_fn(env)

    return dims


def check_cluster(kernel: Function, grid: Sequence[int]) -> None:
    """Refuse a launch `grid` of `kernel` that is not a whole number of its clusters (an
    empty grid launches nothing and passes)."""
    cluster = kernel.attrs.cluster_dim
    if cluster is None or 0 in grid:
        return
    if any(g % c for g, c in zip(grid, cluster)):
        raise ValueError(
            f"kernel {kernel.name}: the grid {tuple(grid)} is not a multiple of its cluster "
            f"{tuple(cluster)} (attrs.cluster_dim) along every axis"
        )
