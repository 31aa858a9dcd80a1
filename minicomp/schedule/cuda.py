"""The CUDA auto-scheduler: grid-stride elementwise kernels, block- and warp-per-row reductions.

Every kernel is one-dimensional: `block_dim` is (threads, 1, 1) and `grid_dim` (blocks, 1, 1),
the block count an int for static sizes or an i64 expression over the kernel's size params.
Launch indices are i32 intrinsics, widened to i64 before any index arithmetic.

Injective groups: the outer domain is flattened; thread `t` of block `b` handles flat index
`b * BLOCK + t`, unravelled into the outer variables with idiv/imod. When the block count is
static and fits gridDim.x the kernel is one guarded step (`if flat < numel`); otherwise the
grid is capped at MAX_GRID and a grid-stride loop covers the rest.

Vectorised injective groups: VEC = 16 bytes / the widest output element (at most MAX_VEC).
When the innermost non-unit outer dim is static and a multiple of VEC, and at least one
output is stored along it with stride 1 (its other strides multiples of VEC), each thread
takes VEC consecutive elements: flat index `f` of the same grid scheme (over numel / VEC)
covers elements `f * VEC + k`, k < VEC, which share every outer coordinate but the
innermost, `base + k`; the unravel runs once per thread. Reads of an input whose index along
the innermost dim is that variable itself, with stride 1, and that every element evaluates
(not under a select branch or the right side of && / ||), become one vector load into a
local register array before the elements (`load_vec`); the elements are computed in an
unrolled loop into a register array per vectorised output, written by one vector store
after it (`store_vec`); other reads and stores stay scalar, per element. An element's
expression sees the innermost variable as `chunk * VEC + k`, simplified knowing 0 <= k <
VEC: a division or remainder by a divisor of VEC (pixels of 4 channels in a row of them)
splits into the chunk's part, shared by the copies of the loop, and k's, a constant in each.
A vector access is 2 to 16 bytes (32 for an input twice as wide as the widest output: two
16-byte accesses) and must be aligned to its size (16 at most): since the thread's first
element is at a multiple of VEC elements from the buffer's start, that holds for every
thread exactly when the buffer's base pointer is aligned, and symbolic strides of the other
dims are multiples of VEC. The kernel tests that once per buffer at its start
(`is_aligned`, a uniform flag) and copies between a misaligned buffer and its register array
element by element instead, so a view with a storage offset stays correct at the cost of
scalar accesses to that buffer only; the grid and the elements each thread takes are the
same either way.

Reduction groups (ReduceStages over the inner loops, then row stores) whose reduced axis is
strided in memory while an output axis is contiguous (a vector-matrix product, split-K's sum
of partials, a softmax over dim 0) put their lanes along that output axis: cuda_columns.py.
The others keep their lanes along the reduced axis, by inner extent:
- large (>= LARGE_ROW) or symbolic: one row per block of BLOCK threads. Each thread folds a
  strided slice of the row into a private accumulator, then a block reduction: a warp
  `shfl_down_sync` tree, lane 0 of each warp writes a `__shared__` array of WARPS partials,
  syncthreads, warp 0 reduces the partials, thread 0 broadcasts through slot 0, syncthreads;
  another syncthreads follows the read when the array is written again later (a next stage
  of the same type, or the next row of a grid-stride row loop).
- static and small: one row per warp (WARPS rows per block), a `shfl_xor_sync` butterfly
  so every lane holds the result; no shared memory and no barrier.
Later stages (softmax's sum after its max) and the row stores follow in the same kernel,
reading the broadcast accumulators; scalar row stores are written by one thread.
argmax/argmin reduce (value, index) pairs (NaN first, ties to the smaller index); the value and
the index travel through shared arrays of their own, even when both are int64.
Long reductions over few rows (a full `x.sum()`, or 2 rows of 2^22) arrive already split in
two by the graph pass passes/graph/split_reductions.py (CUDA targets only): a partial group
of R * C rows of CHUNK >= 2048 elements (a block each) and a final group reducing each row's
C partials; this scheduler always reduces a row within one block or warp.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from minicomp.ir.compute import TensorElement, identity
from minicomp.ir.error_flag import with_error_flag
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
    prod,
)
from minicomp.ir.func import Function, LaunchAttrs
from minicomp.ir.functor import substitute
from minicomp.ir.graph import FusedOp, ReduceStage, StoreStage
from minicomp.ir.simplify import simplify_expr
from minicomp.ir.stmt import (
    Assign,
    Declare,
    DeclareArray,
    Evaluate,
    For,
    If,
    Stmt,
    Store,
    seq,
)
from minicomp.ir.types import DataType, PointerType, i32, i64
from minicomp.schedule.common import (
    KernelSignature,
    Strides,
    arg_better,
    combine,
    lower_accesses,
    offset,
    signature,
    unconditional_elements,
)
from minicomp.schedule.cuda_columns import SMS, ColumnReduction, plan_columns
from minicomp.schedule.cuda_parts import (
    BLOCK,
    LARGE_ROW,
    MAX_GRID,
    MAX_LOAD_BYTES,
    MAX_VEC,
    PARTIAL_DELTAS,
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
    shuffled,
    sync_threads,
    unravel,
    unrolled,
)


class CudaKernelBuilder:
    """Lowers one fused group to a CUDA kernel function."""

    def __init__(self, op: FusedOp, layouts: Mapping[str, Strides], sms: int = SMS):
        self.op = op
        self.sms = sms
        loop_vars = set(op.outer_vars) | set(op.inner_vars)
        self.sig: KernelSignature = signature(op, layouts, loop_vars)
        self.out_bufs = [(p, layouts[v.name]) for v, p in zip(op.outputs, self.sig.outputs)]
        # Outputs too: a group computing an input's new value in its memory reads the input
        # through its output (passes/graph/input_mutations.py).
        buffers = zip(op.inputs + op.outputs, self.sig.inputs + self.sig.outputs)
        self.buffers = {v.name: (p, layouts[v.name]) for v, p in buffers}
        loops = zip(op.outer_vars + op.inner_vars, op.outer_extents + op.inner_extents)
        self.stages = substitute(op.stages, {v: const(0) for v, x in loops if is_unit(x)})
        self.reduces = [s for s in self.stages if isinstance(s, ReduceStage)]
        self.tid, self.lane, self.warp = Var("tid", i64), Var("lane", i64), Var("warp", i64)
        self.row = Var("row", i64)

    def expr(self, e: Expr) -> Expr:
        return lower_accesses(e, self.buffers)

    def store(self, st: StoreStage) -> Stmt:
        buf, strides = self.out_bufs[st.output]
        value = cast(self.expr(st.body), self.op.outputs[st.output].dtype)
        return Store(buf, offset(st.indices, strides), value)

    def build(self) -> Function:
        if self.op.is_reduction:
            body, grid, block = self.reduction()
        else:
            body, grid, block = self.injective()
        attrs = LaunchAttrs(grid_dim=(grid, 1, 1), block_dim=(block, 1, 1))
        return Function(self.op.name, self.sig.params, body, "kernel", attrs=attrs)

    # ---- injective groups ----

    def injective(self) -> tuple[Stmt, Dim, int]:
        vectorised = self.vector_injective()
        if vectorised is not None:
            return vectorised
        op = self.op
        flat = Var("flat", i64)
        body = seq(
            *unravel(flat, op.outer_vars, op.outer_extents),
            *(self.store(s) for s in self.stages),
        )
        return self.flat_loop(flat, prod(op.outer_extents), body)

    def flat_loop(self, flat: Var, numel: Dim, body: Stmt) -> tuple[Stmt, Dim, int]:
        """`body` for each flat index in [0, numel) this thread takes, and the launch."""
        first = launch_index("block_idx_x") * BLOCK + launch_index("thread_idx_x")
        blocks = ceil_div(numel, BLOCK)
        if isinstance(blocks, int) and blocks <= MAX_GRID:
            guarded = body if numel % BLOCK == 0 and numel > 0 else If(flat < numel, body)
            return seq(Declare(flat, first), guarded), clamp_grid(blocks), BLOCK
        step = launch_index("grid_dim_x") * BLOCK
        return grid_stride(flat, first, step, dim_expr(numel), body), clamp_grid(blocks), BLOCK

    # ---- vectorised injective groups ----

    def vector_width(self) -> tuple[int, int] | None:
        """(position of the innermost non-unit outer dim, VEC) where the vector scheme fits."""
        op = self.op
        dims = [d for d, x in enumerate(op.outer_extents) if not is_unit(x)]
        if not dims:
            return None
        vec = min(MAX_VEC, VECTOR_BYTES // max(v.dtype.nbytes for v in op.outputs))
        extent = op.outer_extents[dims[-1]]
        if vec < 2 or not isinstance(extent, int) or extent % vec:
            return None
        return dims[-1], vec

    def vector_injective(self) -> tuple[Stmt, Dim, int] | None:
        """The vectorised kernel (see the module docstring), or None where it does not fit."""
        found = self.vector_width()
        if found is None:
            return None
        pos, vec = found
        op = self.op
        var = op.outer_vars[pos]
        planner = VectorPlanner(var, vec)
        stores = []
        for st in self.stages:
            buf, strides = self.out_bufs[st.output]
            stores.append(planner.plan(buf, op.outputs[st.output].dtype, st.indices, strides))
        if not any(stores):
            return None
        loads = self.vector_loads(planner)
        k = Var("vk", i64)
        lanes = const(vec, i32)
        # Element k: vector reads come from the registers, the rest see the variable at
        # chunk * VEC + k, simplified knowing 0 <= k < VEC ((8c + k) // 4 is 2c + k // 4).
        chunks = op.outer_extents[pos] // vec
        chunk = Var(f"{var.name}_vec", i64)  # (not declared where there is one chunk: 0)
        shifted: dict = {e: Load(a.reg, k) for e, a in loads.items()}
        shifted[var] = chunk * vec + k if chunks != 1 else k
        bounds = self.outer_bounds()
        bounds.update({chunk: (0, chunks - 1), k: (0, vec - 1)})

        def element(e: Expr) -> Expr:
            return simplify_expr(substitute(e, shifted), bounds)

        elements = []
        for st, vector in zip(self.stages, stores):
            value = cast(self.expr(element(st.body)), op.outputs[st.output].dtype)
            if vector is None:
                buf, strides = self.out_bufs[st.output]
                index = element(offset(st.indices, strides))
                elements.append(Store(buf, index, value))
            else:
                elements.append(Store(vector.reg, k, value))
        body: list[Stmt] = list(self.vector_unravel(pos, vec))
        for a in loads.values():
            vector_load = Evaluate(Call("load_vec", (a.reg, Load(a.buf, a.first), lanes), i32))
            scalar = unrolled(k, vec, Store(a.reg, k, Load(a.buf, a.first + k)))
            body.append(If(a.aligned, vector_load, scalar))
        body.append(unrolled(k, vec, seq(*elements)))
        for a in filter(None, stores):
            vector_store = Evaluate(Call("store_vec", (a.buf, a.first, a.reg, lanes), i32))
            scalar = unrolled(k, vec, Store(a.buf, a.first + k, Load(a.reg, k)))
            body.append(If(a.aligned, vector_store, scalar))
        extents = list(op.outer_extents)
        extents[pos] //= vec
        loop, grid, block = self.flat_loop(Var("flat", i64), prod(extents), seq(*body))
        return seq(*planner.head, loop), grid, block

    def outer_bounds(self) -> dict[Var, tuple]:
        """(0, extent - 1) of each outer variable of static extent, (0, None) of the others:
        the coordinates the unravel of a flat index gives."""
        op = self.op
        return {
            v: (0, x - 1 if isinstance(x, int) else None)
            for v, x in zip(op.outer_vars, op.outer_extents)
        }

    def vector_loads(self, planner: VectorPlanner) -> dict[TensorElement, VectorAccess]:
        """The reads done as vector loads: those every element evaluates (a read under a
        guard may be out of bounds for some elements), at most two 16-byte accesses wide."""
        loads = {}
        for e in unconditional_elements([st.body for st in self.stages]):
            if e.dtype.nbytes * planner.vec <= MAX_LOAD_BYTES:
                buf, strides = self.buffers[e.tensor.name]
                indices = tuple(self.expr(i) for i in e.indices)
                access = planner.plan(buf, e.dtype, indices, strides)
                if access is not None:
                    loads[e] = access
        return loads

    def vector_unravel(self, pos: int, vec: int) -> list[Stmt]:
        """Declarations of the outer variables at the thread's first element: `flat` counts
        vectors, so the innermost variable is its coordinate times VEC."""
        op = self.op
        var = op.outer_vars[pos]
        extents = list(op.outer_extents)
        extents[pos] //= vec
        chunk = Var(f"{var.name}_vec", i64)
        vars_ = list(op.outer_vars)
        vars_[pos] = chunk
        out = unravel(Var("flat", i64), vars_, extents)
        return [*out, Declare(var, chunk * vec if extents[pos] != 1 else const(0))]

    # ---- reduction groups ----

    def reduction(self) -> tuple[Stmt, Dim, int]:
        columns = plan_columns(self.op, self.stages, self.buffers, self.out_bufs, self.sms)
        if columns is not None:
            return ColumnReduction(self, columns).build()
        n = prod(self.op.inner_extents)
        if isinstance(n, int) and n < LARGE_ROW:
            return self.warp_rows(n)
        return self.block_rows(n)

    def rows_loop(self, first: Expr, step: Expr, per_block: int, body: Stmt) -> tuple[Stmt, Dim]:
        """`body` for each row this thread's group takes, and the block count."""
        rows = prod(self.op.outer_extents)
        row = self.row
        blocks = ceil_div(rows, per_block)
        if not loops_over_grid(rows, per_block):
            exact = rows % per_block == 0 and rows > 0
            return seq(Declare(row, first), body if exact else If(row < rows, body)), clamp_grid(
                blocks
            )
        return grid_stride(row, first, step, dim_expr(rows), body), clamp_grid(blocks)

    def block_rows(self, n: Dim) -> tuple[Stmt, Dim, int]:
        """One row per block: strided partials, then shared-memory block reductions."""
        op = self.op
        # A stage's partials each get an array of their own, even two of one type (an int64
        # argmax's value and index); stages share arrays, one after another, by (type, slot).
        slots = [shared_slots(self.parts(st)) for st in self.reduces]
        smem: dict[tuple[DataType, int], Var] = {}
        for keys in slots:
            for dt, k in keys:
                name = f"smem_{dt.short}" + (f"_{k}" if k else "")
                smem.setdefault((dt, k), Var(name, PointerType(dt, "shared")))
        looping = loops_over_grid(prod(op.outer_extents), 1)
        stmts: list[Stmt] = list(unravel(self.row, op.outer_vars, op.outer_extents))
        for k, st in enumerate(self.reduces):
            later = {key for keys in slots[k + 1 :] for key in keys}
            reuse = looping or bool(later & set(slots[k]))
            stmts += self.block_stage(k, st, n, [smem[key] for key in slots[k]], reuse)
        stmts += self.row_stores(self.tid, BLOCK, n)
        first, step = launch_index("block_idx_x"), launch_index("grid_dim_x")
        loop, grid = self.rows_loop(first, step, 1, seq(*stmts))
        head = [DeclareArray(v, dt, WARPS, "shared") for (dt, _), v in smem.items()]
        head += [
            Declare(self.tid, launch_index("thread_idx_x")),
            Declare(self.lane, self.tid % WARP),
            Declare(self.warp, self.tid // WARP),
        ]
        return seq(*head, loop), grid, BLOCK

    def warp_rows(self, n: int) -> tuple[Stmt, Dim, int]:
        """One row per warp: strided partials, then a butterfly every lane ends with."""
        op = self.op
        rows = prod(op.outer_extents)
        per_block = min(WARPS, rows) if isinstance(rows, int) and rows > 0 else WARPS
        stmts: list[Stmt] = list(unravel(self.row, op.outer_vars, op.outer_extents))
        for k, st in enumerate(self.reduces):
            stmts += self.warp_stage(k, st, n)
        stmts += self.row_stores(self.lane, WARP, n)
        first = launch_index("block_idx_x") * per_block + self.warp
        step = launch_index("grid_dim_x") * per_block
        loop, grid = self.rows_loop(first, step, per_block, seq(*stmts))
        head = [
            Declare(self.tid, launch_index("thread_idx_x")),
            Declare(self.lane, self.tid % WARP),
            Declare(self.warp, self.tid // WARP),
        ]
        return seq(*head, loop), grid, per_block * WARP

    def row_stores(self, rank: Var, width: int, n: Dim) -> list[Stmt]:
        """Scalar row stores (by the group's first thread), then the strided full-row stores."""
        out: list[Stmt] = []
        scalar = [self.store(s) for s in self.stages if isinstance(s, StoreStage) and not s.inner]
        if scalar:
            out.append(If(eq(rank, 0), seq(*scalar)))
        full = [self.store(s) for s in self.stages if isinstance(s, StoreStage) and s.inner]
        if full:
            out.append(self.strided(len(self.reduces), rank, width, n, lambda j: seq(*full)))
        return out

    def strided(self, k: int, start: Expr, width: int, n: Dim, body: Callable[[Var], Stmt]) -> Stmt:
        """`body(j)` for j = start, start + width, ... < n, with the inner variables of j."""
        op = self.op
        j = Var(f"j{k}", i64)
        inner = seq(*unravel(j, op.inner_vars, op.inner_extents), body(j))
        if not isinstance(n, int):
            return grid_stride(j, start, const(width), dim_expr(n), inner)
        it = Var(f"it{k}", i64)
        guarded = inner if n % width == 0 else If(j < n, inner)
        return For(it, const(ceil_div(n, width)), seq(Declare(j, start + it * width), guarded))

    # ---- one reduce stage ----

    def parts(self, st: ReduceStage) -> tuple[DataType, ...]:
        """The types a stage's partial results travel in (value and index for argmax)."""
        if st.kind in ("argmax", "argmin"):
            return (self.expr(st.body).dtype, i64)
        return (st.var.dtype,)

    def accumulate(self, k: int, st: ReduceStage, accs: tuple[Var, ...], start, width, n):
        """Declarations of a thread's accumulators, and the loop folding its slice into them."""
        value = self.expr(st.body)
        if st.kind in ("argmax", "argmin"):
            best, index = accs
            kind = "max" if st.kind == "argmax" else "min"

            elem = Var(f"{best.name}_e", value.dtype)

            def update(j: Var) -> Stmt:
                better = arg_better(st.kind, elem, best)
                return seq(
                    Declare(elem, value), If(better, seq(Assign(best, elem), Assign(index, j)))
                )

            decls = [Declare(best, identity(kind, best.dtype)), Declare(index, const(0))]
        else:
            (acc,) = accs
            acc_type = acc.dtype

            def update(j: Var) -> Stmt:
                return Assign(acc, cast(combine(st.kind, acc, cast(value, acc_type)), acc_type))

            decls = [Declare(acc, identity(st.kind, acc_type))]
        return [*decls, self.strided(k, start, width, n, update)]

    def combine_step(self, st: ReduceStage, accs, others, shuffle: str, delta: int) -> list[Stmt]:
        """Fold in the accumulators of the lane `delta` away (down or across)."""
        if st.kind in ("argmax", "argmin"):
            (bv, bi), (ov, oi) = accs, others
            take = pair_better(st.kind, ov, oi, bv, bi)
            return [
                Assign(ov, shuffled(shuffle, bv, delta)),
                Assign(oi, shuffled(shuffle, bi, delta)),
                If(take, seq(Assign(bv, ov), Assign(bi, oi))),
            ]
        (acc,), (other,) = accs, others
        # The shuffle gets a statement of its own: inside the combine it could sit behind a
        # short-circuit (any/all are `||`/`&&`), and lanes skipping it break the warp.
        return [
            Assign(other, shuffled(shuffle, acc, delta)),
            Assign(acc, cast(combine(st.kind, acc, other), acc.dtype)),
        ]

    def stage_vars(self, st: ReduceStage, suffix: str) -> tuple[tuple[Var, ...], tuple[Var, ...]]:
        """A stage's accumulators (named after `st.var` + suffix) and its shuffle temporaries."""
        name = st.var.name
        if st.kind in ("argmax", "argmin"):
            vt, _ = self.parts(st)
            index = Var(f"{name}{suffix}", i64) if suffix else st.var
            accs = (Var(f"{name}_v", vt), index)
            others = (Var(f"{name}_ov", vt), Var(f"{name}_oi", i64))
        else:
            acc = Var(f"{name}{suffix}", st.var.dtype) if suffix else st.var
            accs, others = (acc,), (Var(f"{acc.name}_o", st.var.dtype),)
        return accs, others

    def warp_stage(self, k: int, st: ReduceStage, n: int) -> list[Stmt]:
        accs, others = self.stage_vars(st, "")
        out = self.accumulate(k, st, accs, self.lane, WARP, n)
        out += [Declare(v) for v in others]
        for d in WARP_DELTAS:
            out += self.combine_step(st, accs, others, "shfl_xor_sync", d)
        return out

    def block_stage(self, k: int, st: ReduceStage, n: Dim, arrays, reuse: bool) -> list[Stmt]:
        """A block reduction of stage `st` through `arrays`, one `__shared__` array of WARPS
        per accumulator (distinct arrays: a value and an index share no slot)."""
        accs, others = self.stage_vars(st, "_t")
        out = self.accumulate(k, st, accs, self.tid, BLOCK, n)
        out += [Declare(v) for v in others]
        for d in WARP_DELTAS:
            out += self.combine_step(st, accs, others, "shfl_down_sync", d)
        partials = seq(*(Store(a, self.warp, v) for a, v in zip(arrays, accs)))
        out.append(If(eq(self.lane, 0), partials))
        out.append(sync_threads())
        idents = self.identities(st, accs)
        first_warp = [
            If(
                self.lane < WARPS,
                seq(*(Assign(v, Load(a, self.lane)) for a, v in zip(arrays, accs))),
                seq(*(Assign(v, e) for v, e in zip(accs, idents))),
            )
        ]
        for d in PARTIAL_DELTAS:
            first_warp += self.combine_step(st, accs, others, "shfl_down_sync", d)
        result = accs[-1]
        first_warp.append(If(eq(self.lane, 0), Store(arrays[-1], const(0), result)))
        out.append(If(eq(self.warp, 0), seq(*first_warp)))
        out.append(sync_threads())
        out.append(Declare(st.var, Load(arrays[-1], const(0))))
        if reuse:
            out.append(sync_threads())
        return out

    def identities(self, st: ReduceStage, accs: tuple[Var, ...]) -> tuple[Expr, ...]:
        if st.kind in ("argmax", "argmin"):
            kind = "max" if st.kind == "argmax" else "min"
            return (identity(kind, accs[0].dtype), const(0))
        return (identity(st.kind, accs[0].dtype),)


def schedule_cuda(
    op: FusedOp, layouts: Mapping[str, Strides], choose=None, options=None
) -> Function:
    """The CUDA kernel for a fused group, given the strides of every value it touches: a
    template's (minicomp.schedule.templates: matrix products) where one applies, else the
    auto-scheduler's. `choose` picks a template's config (tune.chooser.make_chooser; None:
    its heuristic); `options` (minicomp.config.Options) say whether tensor cores may be used.
    A kernel that may divide integers by zero takes the error flag (ir/error_flag.py)."""
    kernel = None
    if op.is_reduction:
        from minicomp.schedule.templates import schedule_contraction

        kernel = schedule_contraction(op, layouts, options, choose)
    if kernel is None:
        sms = options.sm_count if options is not None and options.sm_count else SMS
        kernel = CudaKernelBuilder(op, layouts, sms).build()
    return with_error_flag(kernel)
