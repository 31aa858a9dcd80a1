"""The pieces CUDA auto-scheduled kernels are built from: launch sizes, launch indices,
barriers, shuffles, grid-stride loops, unravelled indices and vector accesses."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from minicomp.ir.expr import (
    Call,
    Const,
    Dim,
    Expr,
    Load,
    Var,
    binary,
    cast,
    const,
    dim_expr,
    eq,
    logical_and,
    maximum,
    minimum,
    ne,
    prod,
)
from minicomp.ir.functor import collect
from minicomp.ir.stmt import Assign, Declare, DeclareArray, Evaluate, For, Stmt, While, seq
from minicomp.ir.types import DataType, PointerType, boolean, i32, i64
from minicomp.schedule.common import Strides, arg_better, offset

# Threads per block of every kernel.
BLOCK = 256
WARP = 32
WARPS = BLOCK // WARP
# Rows at least this long (or of symbolic length) get a block each; shorter ones a warp.
LARGE_ROW = 1024
# The largest gridDim.x; longer domains loop over the grid.
MAX_GRID = 2**31 - 1
# The widest vector store of an injective kernel, and the most elements a thread takes.
VECTOR_BYTES = 16
MAX_VEC = 8
# An input twice as wide as the widest output still loads as vectors (two 16-byte accesses).
MAX_LOAD_BYTES = 2 * VECTOR_BYTES
# Shuffle deltas of a warp-wide tree, and of the tree over the WARPS partials.
WARP_DELTAS = tuple(WARP >> k for k in range(1, 6))
PARTIAL_DELTAS = tuple(d for d in WARP_DELTAS if d < WARPS)


def launch_index(name: str) -> Expr:
    """A launch index intrinsic (i32), widened to i64."""
    return cast(Call(name, (), i32), i64)


def sync_threads() -> Stmt:
    return Evaluate(Call("syncthreads", (), i32))


def shuffled(name: str, v: Expr, arg: int) -> Expr:
    """A warp shuffle of `v`; bool and narrow ints travel as i32 (CUDA has no such overload)."""
    dt = v.dtype
    carrier = i32 if dt.is_bool or (dt.is_integer and dt.nbytes < 4) else dt
    return cast(Call(name, (cast(v, carrier), const(arg, i32)), carrier), dt)


def ceil_div(n: Dim, d: int) -> Dim:
    if isinstance(n, int):
        return -(-n // d)
    return (dim_expr(n) + (d - 1)) // d


def clamp_grid(blocks: Dim) -> Dim:
    """A block count clamped to [1, MAX_GRID] (a zero-block launch is invalid)."""
    if isinstance(blocks, int):
        return min(max(blocks, 1), MAX_GRID)
    return minimum(maximum(blocks, const(1)), const(MAX_GRID))


def loops_over_grid(rows: Dim, per_block: int) -> bool:
    """Whether a grid with one thread group per row needs a grid-stride loop over rows."""
    return not isinstance(rows, int) or ceil_div(rows, per_block) > MAX_GRID


def is_unit(x: Dim) -> bool:
    return isinstance(x, int) and x == 1


def unravel(flat: Expr, vars_: Sequence[Var], extents: Sequence[Dim]) -> list[Stmt]:
    """Declarations giving each variable its row-major coordinate of `flat` (unit dims skipped;
    the caller substitutes 0 for their variables)."""
    kept = [(v, x) for v, x in zip(vars_, extents) if not is_unit(x)]
    out: list[Stmt] = []
    for k, (v, x) in enumerate(kept):
        below = prod(x2 for _, x2 in kept[k + 1 :])
        e = flat if is_unit(below) else flat // dim_expr(below)
        if k > 0:
            e = e % dim_expr(x)
        out.append(Declare(v, e))
    return out


def vector_offset(
    indices: Sequence[Expr], strides: Strides, var: Var, vec: int
) -> tuple[Expr, list[Expr]] | None:
    """The offset (at `var`) of an access at `indices` that reads VEC consecutive elements
    as `var` runs over `var + k`, k < VEC (`var` a multiple of VEC), starting a multiple of
    VEC elements into the buffer; with the conditions on symbolic strides left to check at
    run time. None when the access is not such a vector.

    That needs one index to be `var` itself, with stride 1, no other index mentioning it,
    and the other terms of the offset multiples of VEC."""
    along = [d for d, e in enumerate(indices) if e == var]
    if len(along) != 1 or not is_unit(strides[along[0]]):
        return None
    checks: list[Expr] = []
    for d, (e, st) in enumerate(zip(indices, strides)):
        if d == along[0] or isinstance(e, Const) and e.value == 0:
            continue
        if var in collect(e, Var):
            return None
        if isinstance(st, int):
            step = st * e.value if isinstance(e, Const) else st
            if step % vec:
                return None
        else:
            checks.append(eq(dim_expr(st) % vec, 0))
    return offset(indices, strides), checks


def grid_stride(var: Var, start: Expr, step: Expr, limit: Expr, body: Stmt) -> Stmt:
    """`for (var = start; var < limit; var += step) body` as a declaration and a while loop."""
    return seq(Declare(var, start), While(var < limit, seq(body, Assign(var, var + step))))


def shared_slots(parts: Sequence[DataType]) -> list[tuple[DataType, int]]:
    """Each partial's shared-array key: its type, and how many earlier partials of the stage
    have that type (so (i64, 0) and (i64, 1) for an int64 argmax's value and index)."""
    return [(dt, parts[:k].count(dt)) for k, dt in enumerate(parts)]


def pair_better(kind: str, ov: Expr, oi: Expr, bv: Expr, bi: Expr) -> Expr:
    """Whether pair (ov, oi) beats (bv, bi) in argmax/argmin: a better value, or the same
    value (NaN counting as equal to NaN) at a smaller index."""
    same = eq(ov, bv)
    if ov.dtype.is_float:
        same = binary("or", same, binary("and", ne(ov, ov), ne(bv, bv)))
    return binary("or", arg_better(kind, ov, bv), binary("and", same, oi < bi))


@dataclass(frozen=True)
class VectorAccess:
    """A buffer accessed VEC elements at a time: register `reg[k]` is element `first + k`;
    `aligned` is the kernel-uniform flag saying whether the vector access may be used."""

    buf: Var
    first: Expr
    reg: Var
    aligned: Var


def unrolled(k: Var, vec: int, body: Stmt) -> Stmt:
    return For(k, const(vec), body, "unroll")


class VectorPlanner:
    """Decides which accesses of a vectorised kernel are vectors; declares their register
    arrays and alignment flags (`head`, the kernel's first statements)."""

    def __init__(self, var: Var, vec: int):
        self.var, self.vec = var, vec
        self.head: list[Stmt] = []
        self.flags: dict[Expr, Var] = {}
        self.names: set[str] = set()

    def fresh(self, base: str) -> str:
        name, n = base, 1
        while name in self.names:
            name, n = f"{base}_{n}", n + 1
        self.names.add(name)
        return name

    def plan(self, buf: Var, dt: DataType, indices, strides: Strides) -> VectorAccess | None:
        """The vector access of `buf` at `indices` (elements of type `dt`), or None."""
        found = vector_offset(indices, strides, self.var, self.vec)
        if found is None:
            return None
        first, checks = found
        nbytes = min(self.vec * dt.nbytes, VECTOR_BYTES)
        aligned = Call("is_aligned", (Load(buf, const(0)), const(nbytes, i32)), boolean)
        cond = logical_and(aligned, *checks)
        flag = self.flags.get(cond)
        if flag is None:
            flag = self.flags[cond] = Var(self.fresh(f"aligned_{buf.name}"), boolean)
            self.head.append(Declare(flag, cond))
        reg = Var(self.fresh(f"reg_{buf.name}"), PointerType(dt, "local"))
        self.head.append(DeclareArray(reg, dt, self.vec, "local"))
        return VectorAccess(buf, first, reg, flag)
