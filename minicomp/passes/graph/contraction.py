"""Recognising a fused group that is a (batched) matrix product, with its prologue and epilogue.

A fused group is a contraction when its loop nest is one sum over inner variables K of a
product `a * b`, followed by stores of expressions of the sum (the epilogue), where `a` reads
the outer variables M and `b` the outer variables N (both may read batch variables B, and both
read every K variable):

    for B, M, N:
        acc = sum over K: a(B, M, K) * b(B, K, N)
        out[...] = epilogue(B, M, N, acc)

`a` and `b` are whatever fusion inlined (a transpose, a cast, an activation of the operand:
the prologue); they are computed at the template's global loads, the epilogue at its stores.
mm, bmm, addmm and baddbmm (passes/graph/anchors.py) give this form, and so does any other
computation of the same shape, such as `(x[:, :, None] * w[None]).sum(1)`.
"""

from __future__ import annotations

from dataclasses import dataclass

from minicomp.ir import types as T
from minicomp.ir.compute import TensorElement
from minicomp.ir.expr import Binary, Cast, Dim, Expr, Var
from minicomp.ir.functor import collect
from minicomp.ir.graph import FusedOp, ReduceStage, StoreStage

Axis = tuple[Var, Dim]


@dataclass(frozen=True)
class Contraction:
    """The parts of a fused matrix product (see the module docstring)."""

    op: FusedOp
    batch: tuple[Axis, ...]
    m: tuple[Axis, ...]
    n: tuple[Axis, ...]
    k: tuple[Axis, ...]
    a: Expr
    b: Expr
    acc: Var
    epilogue: tuple[StoreStage, ...]

    @property
    def acc_dtype(self) -> T.DataType:
        return self.acc.type

    @property
    def operand_dtypes(self) -> tuple[T.DataType, T.DataType]:
        """The types `a` and `b` hold before any widening cast (f16 for an f16 matmul)."""
        return _narrow(self.a), _narrow(self.b)


def _narrow(e: Expr) -> T.DataType:
    while isinstance(e, Cast) and e.a.dtype.is_float and e.a.dtype.nbytes <= e.dtype.nbytes:
        e = e.a
    return e.dtype


def _uses(e: Expr) -> set[Var]:
    return set(collect(e, Var))


def match_contraction(op: FusedOp) -> Contraction | None:
    """The contraction `op` computes, or None when it is not one."""
    reduces = [s for s in op.stages if isinstance(s, ReduceStage)]
    stores = [s for s in op.stages if isinstance(s, StoreStage)]
    if len(reduces) != 1 or len(stores) + 1 != len(op.stages) or reduces[0].kind != "sum":
        return None
    if any(s.inner for s in stores) or not op.inner_vars:
        return None
    red = reduces[0]
    body = red.body
    if not isinstance(body, Binary) or body.op != "mul" or not body.dtype.is_float:
        return None
    a, b = body.a, body.b
    if not (collect(a, TensorElement) and collect(b, TensorElement)):
        return None
    used_a, used_b = _uses(a), _uses(b)
    inner = set(op.inner_vars)
    if not inner <= used_a or not inner <= used_b:
        return None
    batch, m, n = [], [], []
    for v, extent in zip(op.outer_vars, op.outer_extents):
        in_a, in_b = v in used_a, v in used_b
        if in_a and in_b or not in_a and not in_b:
            batch.append((v, extent))
        elif in_a:
            m.append((v, extent))
        else:
            n.append((v, extent))
    if not m or not n:
        return None  # a matrix-vector product is a reduction per row
    # `a` is the operand whose variables come first in the output's order.
    first_m = min((op.outer_vars.index(v) for v, _ in m), default=len(op.outer_vars))
    first_n = min((op.outer_vars.index(v) for v, _ in n), default=len(op.outer_vars))
    if first_n < first_m:
        a, b, m, n = b, a, n, m
    k = tuple(zip(op.inner_vars, op.inner_extents))
    return Contraction(op, tuple(batch), tuple(m), tuple(n), k, a, b, red.var, tuple(stores))
