"""Evaluating size expressions at run time: compiled once to Python lambdas over the symbols."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from minicomp.ir import types as T
from minicomp.ir.expr import Binary, Cast, Const, Expr, Unary, Var
from minicomp.ir.func import Function
from minicomp.ir.functor import Functor, collect

_PY = {
    "add": "+",
    "sub": "-",
    "mul": "*",
    "idiv": "//",
    "imod": "%",
    "floordiv": "//",
    "mod": "%",
    "lt": "<",
    "le": "<=",
    "gt": ">",
    "ge": ">=",
    "eq": "==",
    "ne": "!=",
}


class _PyExpr(Functor):
    def visit_Const(self, e: Const) -> str:
        return repr(e.value)

    def visit_Var(self, e: Var) -> str:
        return f"env[{e.name!r}]"

    def visit_Binary(self, e: Binary) -> str:
        a, b = self.visit(e.a), self.visit(e.b)
        if e.op in ("max", "min"):
            return f"{e.op}({a}, {b})"
        if e.op == "idiv":  # C truncation; sizes are non-negative so floor is the same
            return f"({a} // {b})"
        return f"({a} {_PY[e.op]} {b})"

    def visit_Unary(self, e: Unary) -> str:
        if e.op != "neg":
            raise NotImplementedError(f"size expression with {e.op}")
        return f"(-{self.visit(e.a)})"

    def visit_Cast(self, e: Cast) -> str:
        return f"int({self.visit(e.a)})"


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
    """(grid, block) of `kernel` as a function of its arguments (sizes are the trailing ones)."""
    grid, block = kernel.attr("grid_dim"), kernel.attr("block_dim")
    if all(isinstance(d, int) for d in (*grid, *block)):
        fixed = (tuple(grid), tuple(block))
        return lambda args: fixed
    symbols = [p.name for p in kernel.params if isinstance(p.type, T.DataType)]
    first = len(kernel.params) - len(symbols)
    grid_fn, block_fn = compile_dims(list(grid)), compile_dims(list(block))

    def dims(args: Sequence[Any]) -> Dims:
        env = dict(zip(symbols, args[first:]))
        return grid_fn(env), block_fn(env)

    return dims
