"""The CPU auto-scheduler: OpenMP-parallel outer loops, vectorised inner loops, row reductions."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from minicomp.ir.compute import identity
from minicomp.ir.error_flag import with_error_flag
from minicomp.ir.expr import Call, Const, Expr, Load, Var, cast, const, dim_expr, minimum
from minicomp.ir.func import Function
from minicomp.ir.functor import collect, substitute
from minicomp.ir.graph import FusedOp, ReduceStage, StoreStage
from minicomp.ir.simplify import simplify_expr
from minicomp.ir.stmt import Assign, Declare, DeclareArray, Evaluate, For, If, Stmt, Store, seq
from minicomp.ir.types import PointerType, f32, i64
from minicomp.schedule.common import (
    KernelSignature,
    Strides,
    arg_better,
    combine,
    flat_index,
    lower_accesses,
    offset,
    signature,
)

# Elements per chunk when a one-dimensional loop is split across threads.
CHUNK = 4096
# Side of the square tiles a transposing copy walks. Measured on 4096x4096 and 16x512x1024
# float transposes (one thread): 8 gave 42 and 17 ms, 16 gave 44-48 and 19-20 ms, 32 46-115
# and 22-29 ms (by the order in the tile), untiled 116 and 31 ms.
TILE = 8
# Side of the tiles of a float32 transpose that is moved through registers, a whole 64-byte
# line per row: 4096^2 took 44 ms with in-register 16x16 tiles, 50-52 with 8x8 ones (staged
# or not), against 37 for a memset of the fresh output alone (the page faults).
STAGED_TILE = 16
# Reductions over at most this many elements (a pooling window) are unrolled in each output's
# iteration, and the outputs' innermost loop is the vector loop: vector lanes across a
# reduction of 9 cost more in setting up and combining private accumulators than they save.
SMALL_REDUCTION = 16
# Reductions a parallel or vector loop may split into private accumulators (the backend
# combines float max/min with NaN-propagating helpers).
_CLAUSE = {"sum": "add", "prod": "mul", "max": "max", "min": "min"}


def _steps(index: Expr, loop_vars: list[Var]) -> list[int] | None:
    """How far `index` moves per step of each loop variable, or None where a step is not a
    constant."""
    zero = {v: const(0) for v in loop_vars}
    base = simplify_expr(substitute(index, zero))
    out = []
    for v in loop_vars:
        step = simplify_expr(substitute(index, {**zero, v: const(1)}) - base)
        if not isinstance(step, Const):
            return None
        out.append(step.value)
    return out


class CpuKernelBuilder:
    """Lowers one fused group to a C kernel function."""

    def __init__(self, op: FusedOp, layouts: Mapping[str, Strides]):
        self.op = op
        self.layouts = layouts
        loop_vars = set(op.outer_vars) | set(op.inner_vars)
        self.sig: KernelSignature = signature(op, layouts, loop_vars)
        self.out_bufs = [(p, layouts[v.name]) for v, p in zip(op.outputs, self.sig.outputs)]
        # Outputs too: a group computing an input's new value in its memory reads the input
        # through its output (passes/graph/input_mutations.py).
        buffers = zip(op.inputs + op.outputs, self.sig.inputs + self.sig.outputs)
        self.buffers = {v.name: (p, layouts[v.name]) for v, p in buffers}
        self.small = False  # whether the reduction is unrolled in each output (see reduction)

    def expr(self, e: Expr) -> Expr:
        return lower_accesses(e, self.buffers)

    def store(self, st: StoreStage) -> Stmt:
        buf, strides = self.out_bufs[st.output]
        value = cast(self.expr(st.body), self.op.outputs[st.output].dtype)
        return Store(buf, offset(st.indices, strides), value)

    def build(self) -> Function:
        op = self.op
        if op.is_reduction:
            body = self.reduction()
        else:
            loops = self.memory_order(list(zip(op.outer_vars, op.outer_extents)))
            body = seq(*(self.store(s) for s in op.stages))
            tiled = self.transpose_tiles(loops, body)
            if tiled is None:
                body = self.nest(loops, body, parallel=True)
            else:
                # The tiles' loops are parallel; each tile's own loops are in its body.
                body = self.nest(*tiled, parallel=True, vector=False)
        return Function(op.name, self.sig.params, body, "kernel")

    def transpose_tiles(self, loops: list, body: Stmt) -> tuple[list, Stmt] | None:
        """For a transpose that really moves data (a load striding across memory in the
        innermost loop), the loops over tiles and one tile's body; None for other kernels or
        symbolic or small extents. The innermost loop and the one the load walks memory along
        split into tiles, in the output's order. Where both extents are multiples of
        STAGED_TILE and such loads are float32, each of their tiles is read in order and
        transposed in registers into a local array (runtime.h's mc_transpose16_f32), and the
        tile's stores then read it in their own order, vectorised both ways. Otherwise, in a
        TILE x TILE tile the loop reading memory in order is innermost, and the lines written
        and read stay in the L1 cache (untiled, each element read touched its own line)."""
        if len(loops) < 2:
            return None
        inner, inner_extent = loops[-1]
        steps = {}
        for load in collect(body, Load):
            steps.setdefault(load.index, _steps(load.index, [v for v, _ in loops]))
        for per_loop in steps.values():
            if per_loop is None or abs(per_loop[-1]) < TILE:
                continue
            walks = [k for k, step in enumerate(per_loop[:-1]) if step == 1]
            if not walks:
                continue
            k = walks[0]
            along, along_extent = loops[k]
            if not all(isinstance(x, int) and x >= 2 * TILE for x in (along_extent, inner_extent)):
                continue
            rest = [loop for j, loop in enumerate(loops[:-1]) if j != k]
            staged = self.staged_tile(body, steps, k, (along, along_extent), loops[-1])
            if staged is not None:
                return [*rest, *staged[0]], staged[1]
            tiles, inside, mapping = [], [], {}
            for v, x in ((along, along_extent), (inner, inner_extent)):
                t, i = Var(f"{v.name}_t", i64), Var(f"{v.name}_i", i64)
                tiles.append((t, -(-x // TILE)))
                # The last tile of a ragged extent is cut short.
                inside.append((i, TILE if x % TILE == 0 else minimum(const(TILE), x - t * TILE)))
                mapping[v] = t * TILE + i
            (i_along, n_along), (i_inner, n_inner) = inside
            tile = For(i_along, dim_expr(n_along), substitute(body, mapping), "vectorize")
            return [*rest, *tiles], For(i_inner, dim_expr(n_inner), tile, "serial")
        return None

    def staged_tile(self, body: Stmt, steps: dict, k: int, along, inner):
        """(tile loops, tile body) reading the float32 loads that stride along the innermost
        loop and walk memory in order along loop `k` through transposed STAGED_TILE-square
        local arrays; None when the extents are not multiples of STAGED_TILE or no such load
        is float32."""
        (along, along_extent), (inner, inner_extent) = along, inner
        n = STAGED_TILE
        if along_extent % n or inner_extent % n:
            return None
        moved = {
            load: per_loop[-1]
            for load in collect(body, Load)
            for per_loop in [steps[load.index]]
            if load.dtype == f32 and per_loop[k] == 1 and abs(per_loop[-1]) >= n
        }
        if not moved:
            return None
        t_along, t_inner = Var(f"{along.name}_t", i64), Var(f"{inner.name}_t", i64)
        i_along, i_inner = Var(f"{along.name}_i", i64), Var(f"{inner.name}_i", i64)
        corner = {along: t_along * n, inner: t_inner * n}
        head, tiles = [], {}
        for load, stride in moved.items():
            tile = Var(f"{load.buf.name}_tile", PointerType(f32, "local"))
            start = simplify_expr(substitute(load.index, corner))
            head.append(DeclareArray(tile, f32, n * n))
            head.append(
                Evaluate(Call("transpose16_f32", (tile, load.buf, start, const(stride)), f32))
            )
            tiles[load] = Load(tile, i_along * n + i_inner)
        # The tile's element (i_along, i_inner) of each moved load is its tile's at
        # [i_along, i_inner]: replace the loads first, then the loop variables.
        inside = substitute(
            substitute(body, tiles), {along: t_along * n + i_along, inner: t_inner * n + i_inner}
        )
        loop = For(i_along, const(n), For(i_inner, const(n), inside, "vectorize"), "serial")
        return [(t_along, along_extent // n), (t_inner, inner_extent // n)], seq(*head, loop)

    def memory_order(self, loops: list[tuple[Var, object]]) -> list[tuple[Var, object]]:
        """`loops` ordered as the first output lies in memory, the smallest stride innermost
        (a permuted output is written contiguously; a copy into the layout of its input reads
        and writes in memory order). Kept as they are where a stride is not a constant."""
        st = next(s for s in self.op.stages if isinstance(s, StoreStage))
        _, strides = self.out_bufs[st.output]
        steps = _steps(offset(st.indices, strides), [v for v, _ in loops])
        if steps is None or any(step < 0 for step in steps):
            return loops
        order = sorted(range(len(loops)), key=lambda i: -steps[i])  # stable: ties keep order
        return [loops[i] for i in order]

    def nest(
        self,
        loops: Sequence[tuple[Var, object]],
        body: Stmt,
        *,
        parallel: bool,
        reductions: tuple = (),
        vector: bool = True,
    ) -> Stmt:
        """Loops around `body`: outer ones parallel (collapsed), the innermost vectorised."""
        loops = [(v, x) for v, x in loops]
        kept = []
        for v, x in loops:
            if isinstance(x, int) and x == 1:
                body = substitute(body, {v: const(0)})
            else:
                kept.append((v, x))
        if not kept:
            return body
        if len(kept) == 1 and parallel and vector:
            return self.chunked(kept[0], body, reductions)
        for k, (v, x) in enumerate(reversed(kept)):
            innermost = k == 0 and vector
            outermost = k == len(kept) - 1
            kind = "vectorize" if innermost else ("parallel" if parallel else "serial")
            # Threads and vector lanes keep private accumulators, combined at the end; the
            # clause goes on the vector loop and on the outermost (collapsed) parallel loop.
            shared = innermost or (outermost and kind == "parallel")
            body = For(v, dim_expr(x), body, kind, reductions if shared else ())
        return body

    def chunked(self, loop, body: Stmt, reductions: tuple) -> Stmt:
        """One loop split into parallel chunks of vectorised iterations."""
        v, x = loop
        if isinstance(x, int) and x <= CHUNK:
            return For(v, dim_expr(x), body, "vectorize", reductions)
        c, j = Var(f"{v.name}_c", i64), Var(f"{v.name}_j", i64)
        n = dim_expr(x)
        inner_extent = minimum(const(CHUNK), n - c * CHUNK)
        inner = For(j, inner_extent, substitute(body, {v: c * CHUNK + j}), "vectorize", reductions)
        return For(c, (n + (CHUNK - 1)) // CHUNK, inner, "parallel", reductions)

    def reduction(self) -> Stmt:
        op = self.op
        inner = list(zip(op.inner_vars, op.inner_extents))
        parallel_inner = not op.outer_vars
        extents = op.inner_extents
        self.small = (
            bool(op.outer_vars)
            and all(isinstance(x, int) for x in extents)
            and math.prod(extents) <= SMALL_REDUCTION
        )
        full = [s for s in op.stages if isinstance(s, StoreStage) and s.inner]
        reuse = self.plan_reuse(full)
        # Values kept in an output row, by their expression: later passes read them back.
        saved: dict[Expr, Expr] = {}
        stmts: list[Stmt] = []
        for st in op.stages:
            if isinstance(st, ReduceStage):
                keep = reuse.get(st)
                stmts.extend(self.reduce_stage(st, inner, parallel_inner, keep, saved))
                if keep is not None:
                    buf, strides = self.out_bufs[keep.output]
                    saved[self.expr(st.body)] = Load(buf, offset(keep.indices, strides))
        stmts.extend(self.store(s) for s in op.stages if isinstance(s, StoreStage) and not s.inner)
        if full:
            body = seq(*(self.reusing_store(s, reuse, saved) for s in full))
            stmts.append(self.inner_nest(inner, body, parallel=parallel_inner))
        outer = list(zip(op.outer_vars, op.outer_extents))
        if self.small:
            # A window per output (pooling): the outputs' loops in memory order, so that the
            # vector loop walks the output and the window's loads contiguously (the channels
            # of a channels-last pool, not its width at a stride of the channel count).
            outer = self.memory_order(outer)
        return self.nest(outer, seq(*stmts), parallel=True, vector=self.small)

    def plan_reuse(self, full: list[StoreStage]) -> dict[ReduceStage, StoreStage]:
        """Reduce stages whose (costly) element value a row store repeats.

        Such a value is written to the output row by the first pass computing it, and the
        later passes and the store read it back instead of computing it again (softmax's
        exp; an erf-GELU in front of a layer norm). Only when the output type holds the
        value exactly, so results do not change.
        """
        reuse: dict[ReduceStage, StoreStage] = {}
        stages = [s for s in self.op.stages if isinstance(s, ReduceStage)]
        for store in full:
            out_dtype = self.op.outputs[store.output].dtype
            for st in stages:
                if (
                    st not in reuse
                    and st.kind in _CLAUSE
                    and collect(st.body, Call)
                    and st.body.dtype == out_dtype
                    and st.body in _subexprs(store.body)
                ):
                    reuse[st] = store
                    break
        return reuse

    def reusing_store(self, st: StoreStage, reuse: dict, saved: dict) -> Stmt:
        """The store, reading back the values kept in its own output row."""
        stmt = self.store(st)
        own = {
            self.expr(red.body): saved[self.expr(red.body)]
            for red, store in reuse.items()
            if store is st
        }
        return stmt.replace(value=substitute(stmt.value, own)) if own else stmt

    def reduce_stage(
        self,
        st: ReduceStage,
        inner,
        parallel: bool,
        keep: StoreStage | None = None,
        saved: dict | None = None,
    ) -> list[Stmt]:
        value = substitute(self.expr(st.body), saved or {})
        if st.kind in ("argmax", "argmin"):
            best = Var(f"{st.var.name}_v", value.dtype)
            better = arg_better(st.kind, value, best)
            flat = flat_index([v for v, _ in inner], [x for _, x in inner])
            update = If(better, seq(Assign(best, value), Assign(st.var, flat)))
            kind = "max" if st.kind == "argmax" else "min"
            # The If carries two values between iterations: no vector or thread split.
            return [
                Declare(best, identity(kind, value.dtype)),
                Declare(st.var, const(0)),
                _serialize(self.inner_nest(inner, update, parallel=False)),
            ]
        acc = st.var
        acc_type = acc.dtype
        prologue: list[Stmt] = []
        if keep is not None:
            elem = Var(f"{acc.name}_e", value.dtype)
            buf, strides = self.out_bufs[keep.output]
            prologue = [Declare(elem, value), Store(buf, offset(keep.indices, strides), elem)]
            value = elem
        update = Assign(acc, cast(combine(st.kind, acc, cast(value, acc_type)), acc_type))
        clause = _CLAUSE.get(st.kind)
        reductions = ((clause, acc),) if clause else ()
        loop = self.inner_nest(
            inner,
            seq(*prologue, update),
            parallel=parallel and bool(reductions),
            reductions=reductions,
        )
        if not reductions:
            loop = _serialize(loop)
        return [Declare(acc, identity(st.kind, acc_type)), loop]

    def inner_nest(self, loops, body: Stmt, *, parallel: bool, reductions: tuple = ()) -> Stmt:
        """The loops over one output's reduced elements: unrolled when the reduction is small,
        else as `nest` makes them."""
        if not self.small:
            return self.nest(loops, body, parallel=parallel, reductions=reductions)
        for v, x in reversed(loops):
            if x == 1:
                body = substitute(body, {v: const(0)})
            else:
                body = For(v, dim_expr(x), body, "unroll")
        return body


def _subexprs(e: Expr) -> set:
    """Every distinct subexpression of `e`."""
    return set(collect(e, Expr))


def _serialize(s: Stmt) -> Stmt:
    """The same loops with no parallel or vector hints (for reductions without a safe clause)."""
    if isinstance(s, For):
        kind = "unroll" if s.kind == "unroll" else "serial"
        return s.replace(kind=kind, body=_serialize(s.body), reductions=())
    return s


def schedule_cpu(op: FusedOp, layouts: Mapping[str, Strides]) -> Function:
    """The C kernel for a fused group, given the strides of every value it touches (with the
    error flag parameter when it may divide integers by zero: ir/error_flag.py)."""
    return with_error_flag(CpuKernelBuilder(op, layouts).build())
