"""What every target's scheduler shares: buffers, strided loads and stores, reduction algebra."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from minicomp.ir.compute import TensorElement
from minicomp.ir.expr import Binary, Dim, Expr, Load, Select, Var, binary, cast, const, dim_expr
from minicomp.ir.functor import Mutator, Visitor, collect
from minicomp.ir.graph import FusedOp, Value
from minicomp.ir.types import PointerType, boolean, i64

Strides = tuple


@dataclass(frozen=True)
class KernelSignature:
    """The parameters of a kernel for a fused group, in order: inputs, outputs, symbols."""

    inputs: tuple[Var, ...]
    outputs: tuple[Var, ...]
    symbols: tuple[Var, ...]

    @property
    def params(self) -> tuple[Var, ...]:
        return self.inputs + self.outputs + self.symbols


def buffer_var(v: Value, prefix: str) -> Var:
    """The pointer parameter holding value `v`."""
    return Var(f"{prefix}_{v.name}", PointerType(v.dtype))


def offset(indices: Sequence[Expr], strides: Sequence[Dim]) -> Expr:
    """The element offset of a multi-index under strides."""
    total: Expr = const(0)
    for i, s in zip(indices, strides):
        total = total + cast(i, i64) * dim_expr(s)
    return total


class _LowerAccess(Mutator):
    def __init__(self, buffers: Mapping[str, tuple[Var, Strides]]):
        super().__init__()
        self.buffers = buffers

    def visit_TensorElement(self, e: TensorElement) -> Expr:
        buf, strides = self.buffers[e.tensor.name]
        return Load(buf, offset(self.visit(e.indices), strides))


def lower_accesses(e: Expr, buffers: Mapping[str, tuple[Var, Strides]]) -> Expr:
    """`e` with tensor elements replaced by strided loads from their buffers."""
    return _LowerAccess(buffers).visit(e)


def signature(op: FusedOp, layouts: Mapping[str, Strides], loop_vars: set[Var]) -> KernelSignature:
    """The kernel parameters of a fused group: its buffers and the size symbols it uses."""
    ins = tuple(buffer_var(v, "in") for v in op.inputs)
    outs = tuple(buffer_var(v, "out") for v in op.outputs)
    pieces = [op.stages, op.outer_extents, op.inner_extents]
    pieces += [layouts[v.name] for v in op.inputs + op.outputs]
    pieces += [v.shape for v in op.inputs + op.outputs]
    found = {v for p in pieces for v in collect(p, Var)}
    found -= loop_vars
    found = {v for v in found if v.type == i64 and not v.name.startswith("acc")}
    return KernelSignature(ins, outs, tuple(sorted(found, key=lambda v: v.name)))


def combine(kind: str, acc: Expr, v: Expr) -> Expr:
    """acc ⊕ v for the reduction `kind` (max/min propagate NaN)."""
    if kind == "sum":
        return acc + v
    if kind == "prod":
        return acc * v
    if kind == "max":
        return binary("max", acc, v)
    if kind == "min":
        return binary("min", acc, v)
    if kind == "any":
        return binary("or", cast(acc, boolean), cast(v, boolean))
    if kind == "all":
        return binary("and", cast(acc, boolean), cast(v, boolean))
    raise ValueError(kind)


def arg_better(kind: str, v: Expr, best: Expr) -> Expr:
    """Whether `v` replaces `best` in argmax/argmin: strictly better, or the first NaN."""
    better = v > best if kind == "argmax" else v < best
    if v.dtype.is_float:
        better = binary("or", better, binary("and", binary("ne", v, v), binary("eq", best, best)))
    return better


def flat_index(vars_: Sequence[Var], extents: Sequence[Dim]) -> Expr:
    """The row-major flat index of loop variables over their extents."""
    total: Expr = const(0)
    for v, x in zip(vars_, extents):
        total = total * dim_expr(x) + v
    return total


class _Unconditional(Visitor):
    def __init__(self):
        super().__init__()
        self.found: dict[TensorElement, None] = {}

    def visit_TensorElement(self, e: TensorElement) -> None:
        self.found[e] = None
        self.visit(e.indices)

    def visit_Select(self, e: Select) -> None:
        self.visit(e.cond)

    def visit_Binary(self, e: Binary) -> None:
        self.visit(e.a)
        if e.op not in ("and", "or"):
            self.visit(e.b)


def unconditional_elements(exprs: Sequence[Expr]) -> list[TensorElement]:
    """The tensor elements every evaluation of `exprs` reads, in visiting order: those outside
    the branches of a select and the right operands of `and`/`or` (C evaluates those only
    sometimes, so a read there may be out of bounds when its guard is false)."""
    v = _Unconditional()
    v.visit(tuple(exprs))
    return list(v.found)
