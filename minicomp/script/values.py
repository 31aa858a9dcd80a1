"""What names and expressions of a script stand for while it is parsed: tensors, effects,
and the bindings of names."""

from __future__ import annotations

from dataclasses import dataclass

from minicomp.ir import expr as E
from minicomp.ir import stmt as S
from minicomp.ir.expr import Dim, Expr, StringLiteral, Var  # noqa: F401 - printf's format
from minicomp.ir.types import DataType, fits, i64
from minicomp.script.errors import Issue


@dataclass(frozen=True)
class TensorRef:
    """A tensor of a script: a pointer variable, a row-major shape, and an element offset (a
    view such as `a[i]` of a matrix starts at row i)."""

    name: str
    var: Var
    shape: tuple[Dim, ...]
    offset: Dim = 0

    @property
    def dtype(self) -> DataType:
        return self.var.type.elem

    @property
    def scope(self) -> str:
        return self.var.type.space

    def index(self, indices: tuple) -> tuple[Dim, tuple[Dim, ...]]:
        """(flat element offset, remaining shape) of `indices` (ints or int expressions)."""
        if len(indices) > len(self.shape):
            raise Issue(
                f"too many indices for {self.name}: {len(indices)} given, it has "
                f"{len(self.shape)} dimensions"
            )
        strides = row_major_strides(self.shape)
        flat: Dim = self.offset
        for d, (i, extent, stride) in enumerate(zip(indices, self.shape, strides)):
            if isinstance(i, int | float):
                if isinstance(i, bool) or not isinstance(i, int):
                    raise Issue(f"index {d} of {self.name} is {i!r}, not an integer")
                if isinstance(extent, int) and extent >= 0 and not 0 <= i < extent:
                    raise Issue(
                        f"index {i} is out of bounds for dimension {d} of {self.name} "
                        f"(size {extent})"
                    )
            elif not isinstance(i, Expr) or not i.dtype.is_integer:
                what = f"a {i.dtype} value" if isinstance(i, Expr) else repr(i)
                raise Issue(f"index {d} of {self.name} is {what}, not an integer")
            flat = add(flat, mul(i, stride))
        return flat, self.shape[len(indices) :]


def row_major_strides(shape: tuple[Dim, ...]) -> tuple[Dim, ...]:
    """The element strides of a contiguous row-major tensor."""
    strides: list[Dim] = [1]
    for extent in reversed(shape[1:]):
        strides.append(mul(strides[-1], extent))
    return tuple(reversed(strides))


def as_index(d: Dim) -> Expr:
    """An index or size as an i64 expression."""
    if isinstance(d, Expr):
        return E.cast(d, i64)
    if not fits(d, i64):
        raise Issue(f"the index {d} does not fit a 64-bit integer")
    return E.const(d, i64)


def add(a: Dim, b: Dim) -> Dim:
    """a + b over ints or i64 expressions."""
    if isinstance(a, int) and isinstance(b, int):
        return a + b
    return E.binary("add", as_index(a), as_index(b))


def mul(a: Dim, b: Dim) -> Dim:
    """a * b over ints or i64 expressions."""
    if isinstance(a, int) and isinstance(b, int):
        return a * b
    return E.binary("mul", as_index(a), as_index(b))


@dataclass(frozen=True)
class Effect:
    """A call made for its effect (a barrier, printf, a device function returning nothing):
    a statement, and no value."""

    stmt: S.Stmt
    what: str


@dataclass
class Binding:
    """What a local name of a script stands for.

    kind: "var" (an IR variable; `block` is where it is declared), "loop" (a loop variable),
    "alias" (an expression such as a task index), "tensor" (a TensorRef), "const" (a
    compile-time value), or "gone" (a loop variable after its loop; `note` says why).
    """

    kind: str
    value: object
    block: object = None
    note: str = ""
