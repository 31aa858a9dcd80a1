"""Simplify the index arithmetic of a kernel using the ranges of its loop variables."""

from __future__ import annotations

from minicomp.ir.expr import Const, Expr, Load, Var, binary
from minicomp.ir.func import Function
from minicomp.ir.functor import Mutator
from minicomp.ir.node import Node
from minicomp.ir.simplify import simplify_expr
from minicomp.ir.stmt import For, Store


class _IndexSimplifier(Mutator):
    """Rewrites load and store offsets, knowing 0 <= var < extent inside each loop."""

    def __init__(self):
        super().__init__()
        self.bounds: dict[Var, tuple] = {}

    def visit(self, n):
        # Loop bounds change what an index simplifies to, so nothing is memoised.
        if isinstance(n, Node):
            return self._dispatch(type(n))(self, n)
        return self.visit_tuple(n) if isinstance(n, tuple) else n

    def visit_For(self, s: For) -> For:
        extent = self.visit(s.extent)
        hi = extent.value - 1 if isinstance(extent, Const) else binary("sub", extent, 1)
        self.bounds[s.var] = (0, hi)
        body = self.visit(s.body)
        del self.bounds[s.var]
        if body is s.body and extent is s.extent:
            return s
        return s.replace(extent=extent, body=body)

    def visit_Load(self, e: Load) -> Expr:
        index = simplify_expr(self.visit(e.index), self.bounds)
        return e if index is e.index else Load(e.buf, index)

    def visit_Store(self, s: Store) -> Store:
        index = simplify_expr(self.visit(s.index), self.bounds)
        value = self.visit(s.value)
        if index is s.index and value is s.value:
            return s
        return Store(s.buf, index, value)


def simplify_indices(fn: Function) -> Function:
    """`fn` with every load and store offset simplified under its loops' bounds."""
    body = _IndexSimplifier().visit(fn.body)
    return fn if body is fn.body else fn.replace(body=body)
