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
mm, bmm, addmm, baddbmm and _int_mm (passes/graph/anchors.py) give this form, and so does
any other computation of the same shape, such as `(x[:, :, None] * w[None]).sum(1)`. The
product is a float one, or an i32 one (the 8-bit integer operands of _int_mm widened to the
sums' i32). `product_sides`
is the classification of the outer variables alone, which the split-K pass
(passes/graph/split_k.py) applies to a compute op before fusion.
"""

from __future__ import annotations

from collections.abc import Sequence
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


def is_widening(e: Expr) -> bool:
    """Whether `e` is a cast that keeps every value of its operand: a float to a float at
    least as wide (f16 -> f32), or an integer to a wider signed integer (i8 or u8 -> i32)."""
    if not isinstance(e, Cast):
        return False
    src, dst = e.a.dtype, e.dtype
    if src.is_float and dst.is_float:
        return src.nbytes <= dst.nbytes
    return src.is_integer and dst.kind == "int" and src.nbytes < dst.nbytes


def strip_widening(e: Expr) -> Expr:
    """`e` without the widening casts around it (`is_widening`)."""
    while is_widening(e):
        e = e.a
    return e


def _narrow(e: Expr) -> T.DataType:
    return strip_widening(e).dtype


def _uses(e: Expr) -> set[Var]:
    return set(collect(e, Var))


@dataclass(frozen=True)
class ProductSides:
    """How a sum of a product `a * b` splits its output axes: batch axes (read by both
    operands, or by neither), M axes (read only by `a`) and N axes (read only by `b`). `a` is
    the operand whose variables come first in the output's order."""

    batch: tuple[Axis, ...]
    m: tuple[Axis, ...]
    n: tuple[Axis, ...]
    a: Expr
    b: Expr

    @property
    def operand_dtypes(self) -> tuple[T.DataType, T.DataType]:
        """The types `a` and `b` hold before any widening cast."""
        return _narrow(self.a), _narrow(self.b)


def product_sides(body: Expr, outer: Sequence[Axis], inner: Sequence[Var]) -> ProductSides | None:
    """The sides of `body`, the body of a sum over `inner` computed at every point of the
    `outer` axes, when it is a contraction's product (see the module docstring); else None.

    Shared by match_contraction (a fused group) and the split-K pass (a compute op before
    fusion, its unit axes left out as fusion leaves them out), so both see the same M and N.
    """
    if not isinstance(body, Binary) or body.op != "mul":
        return None
    if not (body.dtype.is_float or body.dtype == T.i32):
        return None
    a, b = body.a, body.b
    if not (collect(a, TensorElement) and collect(b, TensorElement)):
        return None
    used_a, used_b = _uses(a), _uses(b)
    if not inner or not set(inner) <= used_a or not set(inner) <= used_b:
        return None
    batch, m, n = [], [], []
    for v, extent in outer:
        in_a, in_b = v in used_a, v in used_b
        if in_a and in_b or not in_a and not in_b:
            batch.append((v, extent))
        elif in_a:
            m.append((v, extent))
        else:
            n.append((v, extent))
    if not m or not n:
        return None  # a matrix-vector product is a reduction per row
    order = [v for v, _ in outer]
    first_m = min(order.index(v) for v, _ in m)
    first_n = min(order.index(v) for v, _ in n)
    if first_n < first_m:
        a, b, m, n = b, a, n, m
    return ProductSides(tuple(batch), tuple(m), tuple(n), a, b)


def match_contraction(op: FusedOp) -> Contraction | None:
    """The contraction `op` computes, or None when it is not one."""
    reduces = [s for s in op.stages if isinstance(s, ReduceStage)]
    stores = [s for s in op.stages if isinstance(s, StoreStage)]
    if len(reduces) != 1 or len(stores) + 1 != len(op.stages) or reduces[0].kind != "sum":
        return None
    if any(s.inner for s in stores) or not op.inner_vars:
        return None
    red = reduces[0]
    sides = product_sides(red.body, tuple(zip(op.outer_vars, op.outer_extents)), op.inner_vars)
    if sides is None:
        return None
    k = tuple(zip(op.inner_vars, op.inner_extents))
    return Contraction(
        op, sides.batch, sides.m, sides.n, k, sides.a, sides.b, red.var, tuple(stores)
    )
