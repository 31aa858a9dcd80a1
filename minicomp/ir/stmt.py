"""Statements of the kernel IR."""

from __future__ import annotations

from minicomp.ir.expr import Expr, Var
from minicomp.ir.node import Node, node
from minicomp.ir.types import DataType

FOR_KINDS = ("serial", "parallel", "vectorize", "unroll")


class Stmt(Node):
    """A statement."""

    def __repr__(self) -> str:
        from minicomp.ir.printer import stmt_str

        return stmt_str(self)


@node
class Seq(Stmt):
    """Statements run in order."""

    body: tuple[Stmt, ...]


@node
class For(Stmt):
    """`for var in range(extent)`; `kind` says how a backend may run the iterations.

    `reductions` lists (op, accumulator) pairs the iterations combine into with an
    associative op ("add", "mul", "max", "min"), so a parallel or vectorised loop may
    keep private copies and combine them (OpenMP's reduction clause).
    """

    var: Var
    extent: Expr
    body: Stmt
    kind: str = "serial"
    reductions: tuple[tuple[str, Var], ...] = ()

    def __post_init__(self):
        if self.kind not in FOR_KINDS:
            raise ValueError(f"unknown loop kind {self.kind!r}")


@node
class While(Stmt):
    """`while cond: body`."""

    cond: Expr
    body: Stmt


@node
class If(Stmt):
    """`if cond: then else: orelse`."""

    cond: Expr
    then: Stmt
    orelse: Stmt | None = None


@node
class Declare(Stmt):
    """Declare a scalar local, optionally initialised."""

    var: Var
    init: Expr | None = None


@node
class DeclareArray(Stmt):
    """Declare an array of `size` elements in `scope`; `var` points to it.

    Scopes: "local" (registers or the stack), "shared" (a block's static shared memory), and
    "dynamic": `var` points to the start of the launch's dynamic shared memory (the kernel's
    attrs.dynamic_smem bytes), `size` being how many elements the kernel may use;
    several dynamic arrays alias it at offsets their users add."""

    var: Var
    dtype: DataType
    size: int
    scope: str = "local"


@node
class Assign(Stmt):
    """Assign a new value to a declared local."""

    var: Var
    value: Expr


@node
class Store(Stmt):
    """Write `value` to element `index` of buffer `buf`."""

    buf: Var
    index: Expr
    value: Expr


@node
class Evaluate(Stmt):
    """Evaluate an expression for its effect (an intrinsic call such as a barrier)."""

    expr: Expr


@node
class Break(Stmt):
    """Leave the innermost loop."""


@node
class Continue(Stmt):
    """Go to the next iteration of the innermost loop."""


@node
class Return(Stmt):
    """Return from a device function."""

    value: Expr | None = None


@node
class Comment(Stmt):
    """A comment carried into the rendered source."""

    text: str


def seq(*stmts: Stmt) -> Stmt:
    """A sequence, flattening nested sequences; one statement stays itself."""
    flat: list[Stmt] = []
    for s in stmts:
        if isinstance(s, Seq):
            flat.extend(s.body)
        elif s is not None:
            flat.append(s)
    return flat[0] if len(flat) == 1 else Seq(tuple(flat))
