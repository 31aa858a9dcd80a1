"""Column reductions: the lanes of a block along a contiguous output axis, the reduced axis
across the threads' private loops.

A reduction whose reduced axis is strided in memory while an output axis is contiguous (a
vector-matrix product `out[n] = sum_k a[k] * b[k, n]` over a row-major b, split-K's sum of
partials `out[m, n] = sum_s p[s, m, n]`, a softmax over dim 0) would, with the lanes along
the reduced axis (cuda.py's block and warp rows), have every lane read its own 32-byte
sector. Here the lanes run along that output axis instead, the "column" axis C:

- a block of BLOCK threads is `lanes` threads along C times `slices = BLOCK / lanes` along
  the reduction. Thread (tx, ty) of a block takes VEC consecutive columns, from
  `c = tile * lanes * VEC + tx * VEC`, and folds every `slices`-th reduced index from ty into
  VEC private accumulators (the elements unrolled), so a warp reads whole sectors: rows of
  `lanes * VEC` consecutive elements, one 16-byte vector a lane where the access allows
  (VectorPlanner: the same aligned-or-scalar choice as the vectorised injective kernels);
- the slices of a column then meet: with fewer than 32 lanes a warp holds several slices of
  the same columns, which a `shfl_xor_sync` butterfly combines first; one partial per warp
  (or per slice, with 32 lanes or more) goes through a `__shared__` array, a barrier, and
  every thread folds the partials of its columns in the same order, so all of them hold the
  same result for the later stages and the stores (a barrier follows when the array is
  written again). argmax/argmin fold (value, index) pairs, ties to the smaller index;
- one block per tile of `lanes * VEC` columns of one row of the other outer axes, looping
  over the grid beyond MAX_GRID blocks. Scalar row stores are done by slice 0, vectorised
  along C; stores over the reduced axis (softmax's output) by every slice.

When: `plan_columns` counts, for the reads of the reduce stages and the stores inside the
reduced loops, the bytes a warp would scatter (reads that depend on the lanes' axis without
being contiguous along it) with the lanes along the innermost reduced axis and with them
along each static outer axis; the column scheme is taken when some outer axis scatters fewer.
VEC is 16 bytes over the widest element accessed along C, halved until it divides C.
`lanes`, a power of two, is at least a sector's worth of the narrowest such element and at
least BLOCK over the reduced length (no idle slices), at most C / VEC; among those, the
count whose blocks spread most evenly over the GPU's multiprocessors (`options.sm_count`,
else SMS: the fraction of the last round of blocks that is full), then the most lanes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from minicomp.ir.compute import TensorElement
from minicomp.ir.expr import (
    Call,
    Dim,
    Expr,
    Load,
    Var,
    cast,
    const,
    dim_expr,
    eq,
    logical_and,
    prod,
)
from minicomp.ir.functor import collect, substitute
from minicomp.ir.graph import FusedOp, ReduceStage, StoreStage
from minicomp.ir.stmt import Assign, Declare, DeclareArray, Evaluate, For, If, Stmt, Store, seq
from minicomp.ir.types import PointerType, i32, i64
from minicomp.schedule.common import Strides, arg_better, combine, offset, unconditional_elements
from minicomp.schedule.cuda_parts import (
    BLOCK,
    MAX_LOAD_BYTES,
    MAX_VEC,
    VECTOR_BYTES,
    WARP,
    WARP_DELTAS,
    WARPS,
    VectorAccess,
    VectorPlanner,
    ceil_div,
    clamp_grid,
    grid_stride,
    is_unit,
    launch_index,
    loops_over_grid,
    pair_better,
    shared_slots,
    sync_threads,
    unravel,
    unrolled,
)

# The multiprocessors a column reduction spreads its blocks over when the options name no
# `sm_count` (an H100's, the lens's default GPU).
SMS = 132
# Bytes of a global memory sector: a warp's row of columns should fill at least one.
SECTOR = 32


@dataclass(frozen=True)
class ColumnPlan:
    """The lanes along outer axis `axis`: `lanes` threads of a block take `vec` consecutive
    columns each; the block's other threads are `slices` of the reduction."""

    axis: int
    vec: int
    lanes: int

    @property
    def slices(self) -> int:
        return BLOCK // self.lanes

    @property
    def width(self) -> int:
        """Columns a block covers."""
        return self.lanes * self.vec


def _pow2_ceil(x: int) -> int:
    return 1 << max(0, x - 1).bit_length()


def contiguous(indices: Sequence[Expr], strides: Strides, var: Var) -> bool:
    """Whether an access moves by one element as `var` does: one index is `var` itself, with
    stride 1, and no other index mentions it."""
    along = [d for d, e in enumerate(indices) if e == var]
    if len(along) != 1 or not is_unit(strides[along[0]]):
        return False
    return not any(var in collect(e, Var) for d, e in enumerate(indices) if d != along[0])


@dataclass(frozen=True)
class _Access:
    indices: tuple[Expr, ...]
    strides: Strides
    nbytes: int
    inner: bool
    """Whether it runs inside the reduced loops (a read of a reduce stage, an inner store)."""


def _accesses(
    op: FusedOp, stages, inputs: Mapping[str, tuple[Var, Strides]], outputs
) -> list[_Access]:
    out = []
    for s in stages:
        inner = isinstance(s, ReduceStage) or s.inner
        for e in collect(s.body, TensorElement):
            out.append(_Access(e.indices, inputs[e.tensor.name][1], e.dtype.nbytes, inner))
        if isinstance(s, StoreStage):
            nbytes = op.outputs[s.output].dtype.nbytes
            out.append(_Access(s.indices, outputs[s.output][1], nbytes, s.inner))
    return out


def _scattered(accesses: Sequence[_Access], var: Var) -> int:
    """Bytes of the inner accesses that differ from lane to lane without being contiguous,
    when the lanes run along `var`."""
    return sum(
        a.nbytes
        for a in accesses
        if a.inner and var in collect(a.indices, Var) and not contiguous(a.indices, a.strides, var)
    )


def plan_columns(
    op: FusedOp,
    stages: Sequence,
    inputs: Mapping[str, tuple[Var, Strides]],
    outputs: Sequence[tuple[Var, Strides]],
    sms: int = SMS,
) -> ColumnPlan | None:
    """The column scheme for a reduction group (see the module docstring), or None when the
    lanes are better along the reduced axis."""
    inner = [v for v, x in zip(op.inner_vars, op.inner_extents) if not is_unit(x)]
    if not inner:
        return None
    accesses = _accesses(op, stages, inputs, outputs)
    best: tuple[int, int] | None = None
    for pos, (v, x) in enumerate(zip(op.outer_vars, op.outer_extents)):
        if isinstance(x, int) and x > 1:
            cost = _scattered(accesses, v)
            if best is None or cost <= best[0]:
                best = (cost, pos)
    if best is None or best[0] >= _scattered(accesses, inner[-1]):
        return None
    pos = best[1]
    var, extent = op.outer_vars[pos], op.outer_extents[pos]
    along = [a.nbytes for a in accesses if contiguous(a.indices, a.strides, var)]
    vec = min(MAX_VEC, VECTOR_BYTES // max(along)) if along else 1
    while extent % vec:
        vec //= 2
    rows = prod(x for q, x in enumerate(op.outer_extents) if q != pos)
    lanes = _lanes(extent, vec, min(along, default=4), prod(op.inner_extents), rows, sms)
    return ColumnPlan(pos, vec, lanes)


def _lanes(extent: int, vec: int, narrowest: int, n: Dim, rows: Dim, sms: int) -> int:
    top = min(BLOCK, _pow2_ceil(ceil_div(extent, vec)))
    low = min(top, _pow2_ceil(ceil_div(SECTOR, vec * narrowest)))
    if isinstance(n, int):
        low = max(low, min(top, BLOCK // min(BLOCK, _pow2_ceil(n))))

    def fill(lanes: int) -> float:
        if not isinstance(rows, int):
            return 1.0
        waves = rows * ceil_div(extent, lanes * vec) / sms
        return round(waves / math.ceil(waves), 6)

    candidates = [1 << k for k in range(BLOCK.bit_length()) if low <= 1 << k <= top]
    return max(candidates, key=lambda lanes: (fill(lanes), lanes))


class ColumnReduction:
    """Lowers a reduction group to a column-reduction kernel. `builder` is the group's
    cuda.CudaKernelBuilder: its lowered stages, buffers and reduce-stage algebra."""

    def __init__(self, builder, plan: ColumnPlan):
        self.b = builder
        self.op: FusedOp = builder.op
        self.plan = plan
        self.var = self.op.outer_vars[plan.axis]
        self.extent = self.op.outer_extents[plan.axis]
        self.tx, self.ty = Var("tx", i64), Var("ty", i64)
        self.planner = VectorPlanner(self.var, plan.vec) if plan.vec > 1 else None
        # Each reduce stage's result, one variable per column of the thread.
        self.results: dict[Var, tuple[Var, ...]] = {}
        self.active: Expr | None = None if self.extent % plan.width == 0 else self.var < self.extent

    def build(self) -> tuple[Stmt, Dim, int]:
        op, p, b = self.op, self.plan, self.b
        tile = Var(f"{self.var.name}_tile", i64)
        vars_, extents = list(op.outer_vars), list(op.outer_extents)
        vars_[p.axis], extents[p.axis] = tile, ceil_div(self.extent, p.width)
        rows = prod(extents)
        looping = loops_over_grid(rows, 1)
        slots = [shared_slots(b.parts(st)) for st in b.reduces]
        groups = p.slices if p.lanes >= WARP else WARPS
        smem: dict = {}
        if p.slices > 1:
            for keys in slots:
                for dt, k in keys:
                    name = f"smem_{dt.short}" + (f"_{k}" if k else "")
                    smem.setdefault((dt, k), Var(name, PointerType(dt, "shared")))
        n = prod(op.inner_extents)
        stmts: list[Stmt] = list(unravel(b.row, vars_, extents))
        start = const(0) if is_unit(extents[p.axis]) else tile * p.width
        stmts.append(Declare(self.var, start + self.tx * p.vec))
        for k, st in enumerate(b.reduces):
            later = {key for keys in slots[k + 1 :] for key in keys}
            reuse = looping or bool(later & set(slots[k]))
            arrays = [smem[key] for key in slots[k]] if smem else []
            stmts += self.stage(k, st, n, arrays, groups, reuse)
        stmts += self.row_stores(n)
        first, step = launch_index("block_idx_x"), launch_index("grid_dim_x")
        if looping:
            loop = grid_stride(b.row, first, step, dim_expr(rows), seq(*stmts))
        elif rows > 0:
            loop = seq(Declare(b.row, first), *stmts)
        else:
            loop = seq(Declare(b.row, first), If(b.row < rows, seq(*stmts)))
        head: list[Stmt] = [
            DeclareArray(v, dt, groups * p.vec * p.lanes, "shared") for (dt, _), v in smem.items()
        ]
        head += [
            Declare(b.tid, launch_index("thread_idx_x")),
            Declare(self.tx, b.tid % p.lanes),
            Declare(self.ty, b.tid // p.lanes),
            Declare(b.lane, b.tid % WARP),
            Declare(b.warp, b.tid // WARP),
        ]
        if self.planner is not None:
            head += self.planner.head
        return seq(*head, loop), clamp_grid(rows), BLOCK

    # ---- one reduce stage ----

    def stage_vars(self, st: ReduceStage, v: int) -> tuple[tuple[Var, ...], tuple[Var, ...]]:
        """Column `v`'s accumulators of stage `st`, and its shuffle temporaries."""
        name = st.var.name
        if st.kind in ("argmax", "argmin"):
            vt, _ = self.b.parts(st)
            accs = (Var(f"{name}_v{v}", vt), Var(f"{name}_i{v}", i64))
            return accs, (Var(f"{name}_ov{v}", vt), Var(f"{name}_oi{v}", i64))
        return (Var(f"{name}_t{v}", st.var.dtype),), (Var(f"{name}_o{v}", st.var.dtype),)

    def stage(self, k: int, st: ReduceStage, n: Dim, arrays, groups: int, reuse: bool):
        vec = self.plan.vec
        pairs = [self.stage_vars(st, v) for v in range(vec)]
        accs = [a for a, _ in pairs]
        out: list[Stmt] = []
        for a in accs:
            out += [Declare(var, e) for var, e in zip(a, self.b.identities(st, a))]
        loop = self.b.strided(k, self.ty, self.plan.slices, n, lambda j: self.fold(st, accs, j))
        out.append(loop if self.active is None else If(self.active, loop))
        if self.plan.slices > 1:
            out += self.meet(k, st, pairs, arrays, groups, reuse)
        results = tuple(Var(f"{st.var.name}_{v}", st.var.dtype) for v in range(vec))
        out += [Declare(r, a[-1]) for r, a in zip(results, accs)]
        self.results[st.var] = results
        return out

    def fold(self, st: ReduceStage, accs, j: Var) -> Stmt:
        """This thread's VEC elements at reduced index `j` folded into its accumulators."""
        loads, out = self.vector_loads([st.body])
        for v, a in enumerate(accs):
            value = self.element(st.body, v, loads)
            if st.kind in ("argmax", "argmin"):
                best, index = a
                elem = Var(f"{best.name}_e", value.dtype)
                better = arg_better(st.kind, elem, best)
                out += [Declare(elem, value), If(better, seq(Assign(best, elem), Assign(index, j)))]
            else:
                (acc,) = a
                out.append(
                    Assign(acc, cast(combine(st.kind, acc, cast(value, acc.dtype)), acc.dtype))
                )
        return seq(*out)

    def meet(self, k: int, st: ReduceStage, pairs, arrays, groups: int, reuse: bool):
        """The slices of each column combined: a butterfly within warps, then partials through
        shared memory, folded by every thread in the same order."""
        p, b = self.plan, self.b
        out: list[Stmt] = [Declare(o) for _, others in pairs for o in others]
        if p.lanes < WARP:
            for d in (d for d in WARP_DELTAS if d >= p.lanes):
                for accs, others in pairs:
                    out += b.combine_step(st, accs, others, "shfl_xor_sync", d)
            group, writer = b.warp, b.lane < p.lanes
        else:
            group, writer = self.ty, None

        def slot(g: Expr, v: int) -> Expr:
            return (g * p.vec + v) * p.lanes + self.tx

        writes = seq(
            *(
                Store(arr, slot(group, v), acc)
                for v, (accs, _) in enumerate(pairs)
                for arr, acc in zip(arrays, accs)
            )
        )
        out += [writes if writer is None else If(writer, writes), sync_threads()]
        g = Var(f"g{k}", i64)
        fold: list[Stmt] = []
        for v, (accs, others) in enumerate(pairs):
            out += [Assign(acc, Load(arr, slot(const(0), v))) for arr, acc in zip(arrays, accs)]
            fold += [Assign(o, Load(arr, slot(g + 1, v))) for arr, o in zip(arrays, others)]
            if st.kind in ("argmax", "argmin"):
                (bv, bi), (ov, oi) = accs, others
                take = pair_better(st.kind, ov, oi, bv, bi)
                fold.append(If(take, seq(Assign(bv, ov), Assign(bi, oi))))
            else:
                (acc,), (o,) = accs, others
                fold.append(Assign(acc, cast(combine(st.kind, acc, o), acc.dtype)))
        out.append(For(g, const(groups - 1), seq(*fold)))
        if reuse:
            out.append(sync_threads())
        return out

    # ---- elements ----

    def vector_loads(self, bodies) -> tuple[dict, list[Stmt]]:
        """The reads of `bodies` done once for the thread's VEC columns, each mapped to what
        element v reads (a function of v), and the statements loading them: of the reads
        every element evaluates and no stage result indexes, those the columns share (a
        GEMV's vector) into a scalar, those contiguous along C as one vector."""
        loads: dict[TensorElement, VectorAccess | Var] = {}
        out: list[Stmt] = []
        vec = self.plan.vec
        staged = set(self.results)
        for e in unconditional_elements(bodies):
            used = set(collect(e.indices, Var))
            if vec == 1 or staged & used:
                continue
            if self.var not in used:
                shared = Var(self.planner.fresh(f"{e.tensor.name}_e"), e.dtype)
                out.append(Declare(shared, self.b.expr(e)))
                loads[e] = shared
                continue
            if e.dtype.nbytes * vec > MAX_LOAD_BYTES:
                continue
            buf, strides = self.b.buffers[e.tensor.name]
            indices = tuple(self.b.expr(i) for i in e.indices)
            a = self.planner.plan(buf, e.dtype, indices, strides)
            if a is None:
                continue
            loads[e] = a
            k = Var("vk", i64)
            whole = Evaluate(Call("load_vec", (a.reg, Load(a.buf, a.first), const(vec, i32)), i32))
            scalar = unrolled(k, vec, Store(a.reg, k, Load(a.buf, a.first + k)))
            out.append(If(a.aligned, whole, scalar))
        return loads, out

    def element(self, body: Expr, v: int, loads: Mapping) -> Expr:
        """`body` lowered at the thread's column `v`."""
        mapping: dict = {
            e: a if isinstance(a, Var) else Load(a.reg, const(v)) for e, a in loads.items()
        }
        if v:
            mapping[self.var] = self.var + v
        for var, results in self.results.items():
            mapping[var] = results[v]
        return self.b.expr(substitute(body, mapping))

    def row_stores(self, n: Dim) -> list[Stmt]:
        """Scalar row stores by slice 0, then the stores over the reduced axis by every slice."""
        out: list[Stmt] = []
        stages = self.b.stages
        scalar = [s for s in stages if isinstance(s, StoreStage) and not s.inner]
        if scalar:
            cond = (
                eq(self.ty, 0) if self.active is None else logical_and(eq(self.ty, 0), self.active)
            )
            out.append(If(cond, self.stores(scalar)))
        full = [s for s in stages if isinstance(s, StoreStage) and s.inner]
        if full:
            k = len(self.b.reduces)
            loop = self.b.strided(k, self.ty, self.plan.slices, n, lambda j: self.stores(full))
            out.append(loop if self.active is None else If(self.active, loop))
        return out

    def stores(self, stages: Sequence[StoreStage]) -> Stmt:
        loads, out = self.vector_loads([s.body for s in stages])
        vec = self.plan.vec
        for s in stages:
            buf, strides = self.b.out_bufs[s.output]
            dt = self.op.outputs[s.output].dtype
            a = None if self.planner is None else self.planner.plan(buf, dt, s.indices, strides)
            for v in range(vec):
                value = cast(self.element(s.body, v, loads), dt)
                if a is not None:
                    out.append(Store(a.reg, const(v), value))
                else:
                    at = substitute(s.indices, {self.var: self.var + v}) if v else s.indices
                    out.append(Store(buf, offset(at, strides), value))
            if a is not None:
                k = Var("vk", i64)
                whole = Evaluate(Call("store_vec", (a.buf, a.first, a.reg, const(vec, i32)), i32))
                scalar = unrolled(k, vec, Store(a.buf, a.first + k, Load(a.reg, k)))
                out.append(If(a.aligned, whole, scalar))
        return seq(*out)
