"""Compute definitions: tensors defined by an expression per element, and reductions."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from minicomp.ir.expr import Dim, Expr, ExprLike, Var, as_expr, cast, const
from minicomp.ir.node import node
from minicomp.ir.types import DataType, i64

REDUCE_KINDS = ("sum", "prod", "max", "min", "argmax", "argmin", "any", "all")


class TensorNode(Expr):
    """A tensor of the compute layer: an input placeholder or a computed tensor.

    Indexing a tensor node (`t[i, j]`) gives a TensorElement expression.
    """

    shape: tuple
    name: str

    @property
    def rank(self) -> int:
        return len(self.shape)

    def __getitem__(self, idx) -> TensorElement:
        if not isinstance(idx, tuple):
            idx = (idx,)
        if len(idx) != len(self.shape):
            raise IndexError(f"{self.name} has rank {len(self.shape)}, indexed with {len(idx)}")
        return TensorElement(self, tuple(cast(as_expr(i), i64) for i in idx))


@node
class TensorInput(TensorNode):
    """A tensor the definition reads: a graph value bound by name."""

    name: str
    shape: tuple
    type: DataType

    @property
    def dtype(self) -> DataType:
        return self.type


@node
class Compute(TensorNode):
    """A tensor whose element at `axes` is `body`."""

    name: str
    shape: tuple
    axes: tuple[Var, ...]
    body: Expr

    @property
    def dtype(self) -> DataType:
        return self.body.dtype

    @property
    def is_injective(self) -> bool:
        """True when no element needs a reduction to compute."""
        return not contains_reduce(self.body)


@node
class TensorElement(Expr):
    """One element of a tensor node."""

    tensor: TensorNode
    indices: tuple[Expr, ...]
    _references = ("tensor",)

    @property
    def dtype(self) -> DataType:
        return self.tensor.dtype


@node
class Reduce(Expr):
    """A reduction of `body` over `axes` (each ranging over its extent)."""

    kind: str
    axes: tuple[Var, ...]
    extents: tuple
    body: Expr

    def __post_init__(self):
        if self.kind not in REDUCE_KINDS:
            raise ValueError(f"unknown reduction {self.kind!r}")

    @property
    def dtype(self) -> DataType:
        if self.kind in ("argmax", "argmin"):
            return i64
        return self.body.dtype


def tensor_input(name: str, shape: Sequence[Dim], dtype: DataType) -> TensorInput:
    """A placeholder for a tensor read by a definition."""
    return TensorInput(name, tuple(shape), dtype)


def compute(name: str, shape: Sequence[Dim], fcompute: Callable[..., ExprLike]) -> Compute:
    """A tensor of `shape` whose element at indices i0, i1... is `fcompute(i0, i1, ...)`."""
    axes = tuple(Var(f"i{k}", i64) for k in range(len(shape)))
    return Compute(name, tuple(shape), axes, as_expr(fcompute(*axes)))


def reduce(kind: str, extents: Sequence[Dim], fbody: Callable[..., ExprLike]) -> Reduce:
    """The reduction `kind` of `fbody(r0, r1, ...)` over the given extents."""
    axes = tuple(Var(f"r{k}", i64) for k in range(len(extents)))
    return Reduce(kind, axes, tuple(extents), as_expr(fbody(*axes)))


def contains_reduce(e: Expr) -> bool:
    """Whether an expression holds a Reduce (not looking inside referenced tensors)."""
    from minicomp.ir.functor import collect

    return bool(collect(e, Reduce))


def inputs_of(t: TensorNode) -> list[TensorNode]:
    """The tensor nodes a definition reads directly, in first-use order."""
    from minicomp.ir.functor import collect

    if not isinstance(t, Compute):
        return []
    seen: dict[TensorNode, None] = {}
    for el in collect(t.body, TensorElement):
        seen.setdefault(el.tensor)
    return list(seen)


ShapeLike = Sequence[Dim] | tuple


def identity(kind: str, dt: DataType) -> Expr:
    """The starting value of a reduction `kind` in type `dt`."""
    if kind in ("sum", "any"):
        return const(0, dt)
    if kind in ("prod", "all"):
        return const(1, dt)
    if dt.is_float:
        lo, hi = -math.inf, math.inf
    elif dt.is_bool:
        lo, hi = 0, 1
    else:
        bits = 8 * dt.nbytes
        signed = dt.kind == "int"
        lo = -(1 << (bits - 1)) if signed else 0
        hi = (1 << (bits - 1)) - 1 if signed else (1 << bits) - 1
    return const(lo if kind in ("max", "argmax") else hi, dt)
