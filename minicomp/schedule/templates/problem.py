"""A fused matrix product as a template sees it: sizes, kernel parameters, and its prologue and
epilogue as script macros.

A Contraction (minicomp.ir.contraction) names the loop variables of each side: batch B,
rows M (read by operand a), columns N (read by b) and the reduced K, each side possibly several
variables. A template works on flat coordinates instead, `b < B`, `m < M`, `n < N`, `k < K`,
where M is the product of the extents of the M variables (row-major), and so on. The macros
turn flat coordinates back into the group's variables (idiv/imod), substitute them into the
operand expressions (the prologue fusion inlined), and lower tensor elements to strided loads
of the kernel's buffers:

    load_a(b, m, k)        the value of operand a, 0 outside [0, M) x [0, K)
    load_b(b, k, n)        the value of operand b, 0 outside [0, K) x [0, N)
    store_c(b, m, n, acc)  the epilogue's stores for accumulator value `acc`, skipped outside
                           [0, M) x [0, N)

A template asks for a macro with the guards its tiling needs (none where a static size is a
multiple of the tile) and, for tensor cores, the operand in its narrow type: an operand that is
a widening cast of f16/bf16 (or of i8/u8 to the i32 of an integer product) is loaded without
the cast.

`plain_a` / `plain_b` describe an operand that is a bare strided read of one input buffer (no
computation besides a widening cast) with unit stride along K ("k": rows of M or N are
contiguous runs of K) or along M / N ("mn"); a tensor-core template copies such an operand
to shared memory with cp.async instead of computing it in registers. Its indices may be any
affine functions of the loop variables (sums of integer multiples of variables and constants,
such as the `s * CHUNK + kk` of a split-K partial, passes/graph/split_k.py): each variable's
stride in the buffer is the sum of its coefficient times the buffer's stride over the indices.
An index `v // c` or `v % c` (a flattened view's) counts too: where the quotient's stride is c
times the remainder's, v is linear (a [b, s, d] input's b and s folded into M); a batch
variable otherwise becomes two, the quotient and the remainder, each with its stride
(`PlainOperand.batch`: per-head products over a [b, s, h, d] view, b and h strided apart).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping
from dataclasses import dataclass

from minicomp.backends.cuda.sm_count import H100_SMS
from minicomp.ir import types as T
from minicomp.ir.compute import TensorElement
from minicomp.ir.contraction import Axis, Contraction, strip_widening
from minicomp.ir.expr import (
    Binary,
    Cast,
    Const,
    Dim,
    Expr,
    Select,
    Unary,
    Var,
    as_expr,
    binary,
    cast,
    const,
    dim_expr,
    logical_and,
    maximum,
    minimum,
    prod,
    select,
    unary,
)
from minicomp.ir.functor import collect, substitute
from minicomp.ir.graph import FusedOp
from minicomp.ir.printer import expr_str
from minicomp.ir.simplify import simplify_expr
from minicomp.ir.stmt import If, Stmt, Store, seq
from minicomp.schedule.common import KernelSignature, Strides, lower_accesses, offset, signature
from minicomp.schedule.templates.base import DEFAULT_ARCH
from minicomp.schedule.templates.fragments import Names, expression
from minicomp.schedule.templates.tiles import CHUNK, CHUNK_BYTES, Tile, load_regs, store_regs
from minicomp.script.function import script
from minicomp.script.lang import Macro, macro
from minicomp.script.types import i64
from minicomp.script.values import TensorRef

# Accumulator types the templates compute in (i32: products of 8-bit integers, _int_mm's).
ACC_TYPES = (T.f32, T.f64, T.i32)
# Rows of tiles rasterised together (blocks running at once share A and B tiles in L2).
GROUP_M = 8
# The largest gridDim.z; a kernel loops over more batches.
MAX_GRID_Z = 65535


def is_unit(x: Dim) -> bool:
    return isinstance(x, int) and x == 1


def ceil_div(n: Dim, d: int) -> Dim:
    """ceil(n / d) for a size (int, or i64 expression)."""
    if isinstance(n, int):
        return -(-n // d)
    return (dim_expr(n) + (d - 1)) // d


def needs_check(size: Dim, tile: int) -> bool:
    """Whether a tiling of `size` by `tile` has partial tiles (always for symbolic sizes)."""
    return not isinstance(size, int) or size == 0 or size % tile != 0


def launch_grid(problem: MatmulProblem, bm: int, bn: int) -> tuple[Dim, Dim, Dim]:
    """The grid of a bm x bn tiling: every tile along x (at least one block), batches along z
    (at most MAX_GRID_Z; the kernel loops over the rest)."""
    tiles = prod((ceil_div(problem.m, bm), ceil_div(problem.n, bn)))
    x = max(tiles, 1) if isinstance(tiles, int) else maximum(tiles, 1)
    b = problem.batch
    if isinstance(b, int):
        z: Dim = min(max(b, 1), MAX_GRID_Z)
    else:
        z = minimum(maximum(b, 1), MAX_GRID_Z)
    return x, 1, z


def grouped_tiles(problem: MatmulProblem, bm: int, bn: int) -> tuple[Macro, Macro]:
    """Macros `row0(pid)` and `col0(pid)`: the first row and column of C of the bm x bn tile
    block pid computes. Tiles are rasterised GROUP_M rows of tiles at a time, column by
    column, so that the blocks running together share their A and B tiles in L2."""
    TILES_M, TILES_N = ceil_div(problem.m, bm), ceil_div(problem.n, bn)
    GROUP = GROUP_M

    def origin(pid, ROW):
        @script
        def tile_origin() -> i64:
            # (max(.., 1): an empty C has no tiles, and its one block stores nothing)
            width = GROUP * max(TILES_N, 1)
            first = pid // width * GROUP
            rows = max(min(TILES_M - first, GROUP), 1)
            if ROW:
                return (first + pid % width % rows) * bm
            return pid % width // rows * bn

        return tile_origin

    return expression(lambda pid: origin(pid, True)), expression(lambda pid: origin(pid, False))


def _index(x) -> Expr:
    """A coordinate a script passes (an int, or an integer IR expression) as i64."""
    return cast(as_expr(x, T.i64), T.i64)


def unravel(flat: Expr, axes: tuple[Axis, ...]) -> dict[Var, Expr]:
    """Each variable's row-major coordinate of the flat index `flat` (0 for unit extents)."""
    kept = [(v, x) for v, x in axes if not is_unit(x)]
    out: dict[Var, Expr] = {v: const(0) for v, x in axes if is_unit(x)}
    for i, (v, x) in enumerate(kept):
        below = prod(x2 for _, x2 in kept[i + 1 :])
        e = flat if is_unit(below) else flat // dim_expr(below)
        out[v] = e % dim_expr(x) if i > 0 else e
    return out


def _dim_add(a: Dim, b: Dim) -> Dim:
    return a + b if isinstance(a, int) and isinstance(b, int) else dim_expr(a) + dim_expr(b)


def _dim_mul(a: Dim, b: Dim) -> Dim:
    return a * b if isinstance(a, int) and isinstance(b, int) else dim_expr(a) * dim_expr(b)


@dataclass(frozen=True)
class PlainOperand:
    """An operand that is exactly a strided read of one input buffer.

    `ref` is the buffer as a one-dimensional script tensor (its storage), `contiguous` the
    dimension with unit stride ("k", or "mn": along M for a, N for b), `ld` the stride of the
    other one, `batch` the batch variables (the contraction's, one split in two where the
    operand reads it as a quotient and a remainder, see the module doc), `batch_strides` the
    stride of each and `base` the element offset of constant indices. Element (b, mn, k) is
    at `batch_offset(b) + mn * ld + k` ("k") or `batch_offset(b) + k * ld + mn` ("mn").
    """

    ref: TensorRef
    contiguous: str
    ld: Dim
    batch: tuple[Axis, ...]
    batch_strides: tuple[Dim, ...]
    base: Dim

    @property
    def dtype(self) -> T.DataType:
        return self.ref.dtype

    def batch_offset(self, b) -> Expr:
        """The element offset of batch `b` (a flat batch coordinate)."""
        coords = unravel(_index(b), self.batch)
        total: Expr = dim_expr(self.base)
        for (v, _), s in zip(self.batch, self.batch_strides):
            if not (isinstance(s, int) and s == 0):
                total = total + coords[v] * dim_expr(s)
        return total

    def ld_multiple_of(self, elems: int) -> bool | None:
        """Whether `ld` is a multiple of `elems`: True/False when static, None when symbolic."""
        return self.ld % elems == 0 if isinstance(self.ld, int) else None

    def batch_offset_macro(self) -> Macro:
        """`batch_offset(b)` as a script macro."""

        @macro
        def batch_offset(b):
            return self.batch_offset(b)

        return batch_offset


@dataclass(frozen=True)
class GatheredOperand:
    """An operand read in runs: each chunk of CHUNK consecutive k (from a multiple of CHUNK),
    at any (b, mn), is either CHUNK consecutive elements of one input buffer, 16-byte aligned,
    or all zero. Such is the window of a convolution on a channels-last input, K ordered
    (r, s, c) with C % CHUNK == 0: a chunk is 8 channels of one input pixel, and the window's
    guard depends on the pixel alone.

    `ref` is the buffer as a one-dimensional script tensor, `element` the tensor element the
    operand reads (at the group's variables) and `inside` the guard around it (None: none).
    `limit` (None: none) bounds the innermost K variable from a guard `inner < limit`: a
    chunk reads only its elements below it and the rest is zero-filled (a padded run of a
    convolution over few channels, passes/graph/small_channels.py).
    """

    ref: TensorRef
    element: TensorElement
    inside: Expr | None
    strides: tuple[Dim, ...]
    limit: int | None = None


class MatmulProblem:
    """A matched contraction with the buffers and sizes of its kernel (see the module doc).

    `sms` is the SM count of the GPU it compiles for, which the heuristics fill with blocks
    (matmul_simt.pick_tile). It is not part of the signature: tuning records are keyed by the
    architecture beside it, which stands for the device (its bandwidth and clocks are not in
    the key either), and a record holds the config that measured fastest on the device it was
    tuned on, still a valid candidate on one with another SM count. The level-0 heuristic,
    which does depend on it, is never recorded. `arch` is the architecture it compiles for,
    which decides the instructions a template may use (matmul_tc's float8 mma needs sm_89);
    the records' key has it beside the signature too."""

    def __init__(
        self,
        c: Contraction,
        layouts: Mapping[str, Strides],
        sms: int = H100_SMS,
        arch: str = DEFAULT_ARCH,
    ):
        op = c.op
        self.sms = sms
        self.arch = arch
        self.contraction = c
        self.op = op
        self.layouts = layouts
        loop_vars = set(op.outer_vars) | set(op.inner_vars)
        self.sig: KernelSignature = signature(op, layouts, loop_vars)
        self.buffers = {v.name: (p, layouts[v.name]) for v, p in zip(op.inputs, self.sig.inputs)}
        self.out_bufs = [(p, layouts[v.name]) for v, p in zip(op.outputs, self.sig.outputs)]
        self.batch = prod(x for _, x in c.batch)
        self.m = prod(x for _, x in c.m)
        self.n = prod(x for _, x in c.n)
        self.k = prod(x for _, x in c.k)
        self.acc_dtype: T.DataType = c.acc_dtype
        self.a_dtype, self.b_dtype = c.operand_dtypes
        self.out_dtypes = tuple(v.dtype for v in op.outputs)
        self.k_axes: tuple[Axis, ...] = c.k
        self.k_axes = self._k_order()
        self.plain_a = self._plain(c.a, c.m)
        self.plain_b = self._plain(c.b, c.n)
        self.gather_a = None if self.plain_a else self._gathered(c.a)
        self.gather_b = None if self.plain_b else self._gathered(c.b)
        self.a_major = self._major(c.a, c.m)
        self.b_major = self._major(c.b, c.n)

    @classmethod
    def from_contraction(
        cls,
        c: Contraction,
        layouts: Mapping[str, Strides],
        sms: int = H100_SMS,
        arch: str = DEFAULT_ARCH,
    ):
        """The problem of contraction `c` on a GPU of `sms` SMs and architecture `arch`, or
        None when no template computes it (an accumulator other than f32/f64/i32, or a
        product computed in another type)."""
        body_dtype = T.promote(c.a.dtype, c.b.dtype)
        if c.acc_dtype not in ACC_TYPES or body_dtype != c.acc_dtype:
            return None
        if c.a.dtype != c.acc_dtype or c.b.dtype != c.acc_dtype:
            return None
        return cls(c, layouts, sms, arch)

    @property
    def params(self) -> tuple[Var, ...]:
        """The kernel's IR parameters: inputs, outputs, then size symbols (the plan's order)."""
        return self.sig.params

    @property
    def name(self) -> str:
        return self.op.name

    # ---- macros ----

    def load_a(self, *, narrow: bool = False, check_m: bool = True, check_k: bool = True):
        """Macro `load_a(b, m, k)`: operand a at flat coordinates (in its narrow type when
        `narrow`), 0 where a checked coordinate is out of range."""
        c = self.contraction
        return self._load("load_a", c.a, c.m, narrow, check_m, check_k, self.m, order="mk")

    def load_b(self, *, narrow: bool = False, check_k: bool = True, check_n: bool = True):
        """Macro `load_b(b, k, n)`: operand b at flat coordinates (see load_a)."""
        c = self.contraction
        return self._load("load_b", c.b, c.n, narrow, check_n, check_k, self.n, order="kn")

    def _load(self, name, e, side, narrow, check_side, check_k, extent, order) -> Macro:
        c = self.contraction
        value = strip_widening(e) if narrow else e

        def load(b, x, y):
            mn, k = (x, y) if order == "mk" else (y, x)
            mn, k = _index(mn), _index(k)
            mapping = unravel(_index(b), c.batch) | unravel(mn, side) | unravel(k, self.k_axes)
            loaded = lower_accesses(substitute(value, mapping), self.buffers)
            conds = []
            if check_side:
                conds.append(mn < dim_expr(extent))
            if check_k:
                conds.append(k < dim_expr(self.k))
            if not conds:
                return loaded
            return select(logical_and(*conds), loaded, const(0, loaded.dtype))

        load.__name__ = name
        return macro(load)

    def store_c(self, *, check_m: bool = True, check_n: bool = True) -> Macro:
        """Macro `store_c(b, m, n, acc)`: the epilogue's stores for accumulator value `acc` at
        flat coordinates, skipped where a checked coordinate is out of range."""
        c = self.contraction

        def store_c(b, m, n, acc) -> Stmt:
            m, n = _index(m), _index(n)
            mapping: dict = unravel(_index(b), c.batch) | unravel(m, c.m) | unravel(n, c.n)
            mapping[c.acc] = cast(as_expr(acc, c.acc_dtype), c.acc_dtype)
            stores = []
            for st in c.epilogue:
                buf, strides = self.out_bufs[st.output]
                body = lower_accesses(substitute(st.body, mapping), self.buffers)
                index = offset(substitute(st.indices, mapping), strides)
                stores.append(Store(buf, index, cast(body, self.out_dtypes[st.output])))
            conds = []
            if check_m:
                conds.append(m < dim_expr(self.m))
            if check_n:
                conds.append(n < dim_expr(self.n))
            body = seq(*stores)
            return If(logical_and(*conds), body) if conds else body

        return macro(store_c)

    # ---- operand analysis ----

    def _plain(self, e: Expr, side: tuple[Axis, ...]) -> PlainOperand | None:
        """The PlainOperand of operand expression `e`, or None when it computes something or
        has no unit stride along K or its own side."""
        c = self.contraction
        el = strip_widening(e)
        if not isinstance(el, TensorElement) or el.tensor.name not in self.buffers:
            return None
        buf, strides = self.buffers[el.tensor.name]
        indices, parts = _split_indices(el.indices)
        coeff = _strides_of(indices, strides)
        if coeff is None:
            return None
        coeff, base = coeff
        batch = _joined(coeff, parts, c.batch)
        if batch is None:
            return None
        loop_vars = {v for v, _ in batch + side + self.k_axes}
        if not set(coeff) <= loop_vars:
            return None  # a size symbol, or a variable of the other side
        along_side, along_k = flat_stride(side, coeff), flat_stride(self.k_axes, coeff)
        if along_side is None or along_k is None:
            return None
        if along_k == 1:
            contiguous, ld = "k", along_side
        elif along_side == 1:
            contiguous, ld = "mn", along_k
        else:
            return None
        value = next(v for v in self.op.inputs if v.name == el.tensor.name)
        extent: Dim = 1
        for size, stride in zip(value.shape, strides):
            extent = _dim_add(extent, _dim_mul(_dim_add(size, -1), stride))
        if isinstance(extent, int) and extent * value.dtype.nbytes < CHUNK_BYTES:
            return None  # too small for 16-byte copies; the register path handles it
        ref = TensorRef(value.name, buf, (extent,))
        batch_strides = tuple(coeff.get(v, 0) for v, _ in batch)
        return PlainOperand(ref, contiguous, ld, batch, batch_strides, base)

    def _k_order(self) -> tuple[Axis, ...]:
        """The order of the K variables that flat K follows: the contraction's, unless its
        innermost variable has unit stride in neither operand where another one has in one
        (a convolution on a channels-last input, K = (c, r, s)): that one then goes last, the
        others by decreasing stride in the other operand where it reads them all at affine
        indices (K = (r, s, c): both operands read runs of K). Kept where the other operand
        would stop being plain."""
        c = self.contraction
        kept = [(v, x) for v, x in c.k if not is_unit(x)]
        if len(kept) < 2:
            return c.k
        along = {"a": _k_strides(c.a, self), "b": _k_strides(c.b, self)}
        if any(s.get(kept[-1][0]) == 1 for s in along.values()):
            return c.k
        for side, other in (("a", "b"), ("b", "a")):
            units = [ax for ax in kept if along[side].get(ax[0]) == 1]
            if not units:
                continue
            rest = [ax for ax in kept if ax != units[0]]
            if all(isinstance(along[other].get(v), int) for v, _ in rest):
                rest.sort(key=lambda ax: -along[other][ax[0]])
            order = (*rest, units[0], *((v, x) for v, x in c.k if is_unit(x)))
            if self._keeps_plain(other, order):
                return order
        return c.k

    def _keeps_plain(self, side: str, order: tuple[Axis, ...]) -> bool:
        """Whether operand `side`, plain in the contraction's K order, stays plain in `order`."""
        c = self.contraction
        e, axes = (c.a, c.m) if side == "a" else (c.b, c.n)
        saved, self.k_axes = self.k_axes, c.k
        before = self._plain(e, axes)
        self.k_axes = order
        after = self._plain(e, axes)
        self.k_axes = saved
        return before is None or after is not None

    def _gathered(self, e: Expr) -> GatheredOperand | None:
        """The GatheredOperand of operand expression `e` (see that class), or None."""
        el, inside = strip_widening(e), None
        if isinstance(el, Select) and isinstance(el.b, Const) and el.b.value == 0:
            el, inside = el.a, el.cond
        if not isinstance(el, TensorElement) or el.tensor.name not in self.buffers:
            return None
        if el.dtype.nbytes * CHUNK != 16 or collect(el.indices, TensorElement):
            return None
        if inside is not None:
            # The offset is used only where the guard holds: a padded window's clamps go.
            c = self.contraction
            bounds = {v: (0, x - 1) for v, x in c.batch + c.m + c.n + c.k if isinstance(x, int)}
            inside = simplify_expr(inside, bounds)
            indices = tuple(simplify_expr(i, bounds, assuming=inside) for i in el.indices)
            el = el.replace(indices=indices)
        kept = [(v, x) for v, x in self.k_axes if not is_unit(x)]
        if not kept or not isinstance(kept[-1][1], int) or kept[-1][1] % CHUNK:
            return None
        inner = kept[-1][0]
        limit, inside = _run_limit(inside, inner)
        if inside is not None and (collect(inside, TensorElement) or inner in collect(inside, Var)):
            return None
        buf, strides = self.buffers[el.tensor.name]
        along = 0
        for index, stride in zip(el.indices, strides):
            if not isinstance(stride, int):
                return None
            form = _affine(index)
            if form is None:
                # Any value, at a stride that keeps runs aligned, and not along the run.
                if inner in collect(index, Var) or stride % CHUNK:
                    return None
                continue
            terms, base = form
            along += terms.pop(inner, 0) * stride
            if (base * stride) % CHUNK or any((k * stride) % CHUNK for k in terms.values()):
                return None
        if along != 1:
            return None
        value = next(v for v in self.op.inputs if v.name == el.tensor.name)
        extent: Dim = 1
        for size, stride in zip(value.shape, strides):
            extent = _dim_add(extent, _dim_mul(_dim_add(size, -1), stride))
        ref = TensorRef(value.name, buf, (extent,))
        return GatheredOperand(ref, el, inside, tuple(strides), limit)

    def gather_source(self, side: str, *, check_mn: bool = True, check_k: bool = True) -> Macro:
        """Macro `source(b, mn, k)` of a gathered operand (`gather_a` / `gather_b`): the element
        offset in its buffer of the run of chunk (b, mn, k), k a multiple of CHUNK, or -1 where
        the chunk is zero (outside the guard, or a checked coordinate out of range)."""
        c = self.contraction
        g = self.gather_a if side == "a" else self.gather_b
        if g is None:
            raise ValueError(f"operand {side} is not gathered")
        axes, extent = (c.m, self.m) if side == "a" else (c.n, self.n)

        outer = {v for v, _ in c.batch + axes}
        form = _strides_of(g.element.indices, g.strides)

        def source(b, mn, k):
            mn, k = _index(mn), _index(k)
            mapping = unravel(_index(b), c.batch) | unravel(mn, axes) | unravel(k, self.k_axes)
            if form is None:
                at = offset(substitute(g.element.indices, mapping), g.strides)
            else:
                # The (b, mn) part first, then the k part: a compiler computes the first once
                # for the whole K loop.
                at = _split_sum(form[0], form[1], mapping, outer)
            conds = []
            if check_mn:
                conds.append(mn < dim_expr(extent))
            if check_k:
                conds.append(k < dim_expr(self.k))
            if g.inside is not None:
                conds.extend(_split_comparison(t, mapping, outer) for t in _conjuncts(g.inside))
            out = select(logical_and(*conds), at, const(-1, T.i64)) if conds else at
            # 32-bit arithmetic (half the instructions of 64-bit) where every value fits.
            narrow = _narrow(out) if self._small(g) else None
            return out if narrow is None else narrow

        return macro(source)

    def gather_count(self, side: str) -> Macro | None:
        """Macro `count(b, mn, k)` of a gathered operand with a `limit`: how many of the
        CHUNK elements of chunk (b, mn, k) to read (k a multiple of CHUNK), the rest
        zero-filled; None where the operand has no limit (every chunk is read whole)."""
        g = self.gather_a if side == "a" else self.gather_b
        if g is None or g.limit is None:
            return None
        inner = _innermost(self.k_axes)
        limit = g.limit

        def count(b, mn, k):
            j = unravel(_index(k), self.k_axes)[inner]
            return cast(minimum(maximum(const(limit, T.i64) - j, 0), CHUNK), T.i32)

        return macro(count)

    def _small(self, g: GatheredOperand) -> bool:
        """Whether the offsets and coordinates of gathered operand `g`, and the flat
        coordinates of tiles past the edges, stay well inside 32 bits (static sizes)."""
        sizes = (self.batch, self.m, self.n, self.k, *g.ref.shape)
        return all(isinstance(d, int) and 2 * d < 2**31 for d in sizes)

    def _major(self, e: Expr, side: tuple[Axis, ...]) -> str:
        """Which dimension of operand `e` is contiguous in memory ("k" or "mn"), judged by
        the first element it reads along the innermost K variable (at an affine index); "k"
        when unclear."""
        k_var = _innermost(self.k_axes)
        side_var = _innermost(side)
        for el in collect(e, TensorElement):
            if el.tensor.name not in self.buffers:
                continue
            _, strides = self.buffers[el.tensor.name]
            along, _ = _strides_of(el.indices, strides, skip_others=True) or ({}, 0)
            if along.get(k_var) == 1:
                return "k"
            if along.get(side_var) == 1:
                return "mn"
        return "k"

    # ---- identity for the tuning database ----

    def signature(self) -> str:
        """A stable description of the problem: sizes, types, strides, operand forms, and a
        fingerprint of the fused prologue and epilogue (names of values replaced by their
        position in the kernel's parameters)."""
        op = self.op
        sizes = ",".join(_dim_text(d) for d in (self.batch, self.m, self.n, self.k))
        types = "/".join(t.short for t in (self.a_dtype, self.b_dtype, self.acc_dtype))
        outs = "/".join(t.short for t in self.out_dtypes)
        strides = ";".join(
            ",".join(_dim_text(s) for s in self.layouts[v.name]) for v in op.inputs + op.outputs
        )
        forms = "/".join(
            _plain_text(p, g)
            for p, g in ((self.plain_a, self.gather_a), (self.plain_b, self.gather_b))
        )
        return (
            f"bmnk={sizes} types={types}->{outs} strides={strides} plain={forms} "
            f"fused={self.fingerprint()}"
        )

    def fingerprint(self) -> str:
        """A short hash of the prologue and epilogue expressions."""
        c = self.contraction
        parts = [expr_str(c.a), expr_str(c.b)]
        for st in c.epilogue:
            parts.append(f"{st.output}[{','.join(expr_str(i) for i in st.indices)}]")
            parts.append(expr_str(st.body))
        text = "\n".join(parts)
        names = [v.name for v in (*self.op.inputs, *self.op.outputs)]
        if names:
            renames = {n: f"v{i}" for i, n in enumerate(names)}
            pattern = r"\b(" + "|".join(re.escape(n) for n in sorted(names, key=len)[::-1]) + r")\b"
            text = re.sub(pattern, lambda m: renames[m.group(1)], text)
        return hashlib.sha256(text.encode()).hexdigest()[:12]

    def static_sizes(self) -> tuple[int, int, int, int] | None:
        """(B, M, N, K) when all are static."""
        dims = (self.batch, self.m, self.n, self.k)
        return dims if all(isinstance(d, int) for d in dims) else None


@dataclass(frozen=True)
class BlockTile:
    """A matmul config's block tile: bm x bn of C, stepping over K by bk."""

    bm: int
    bn: int
    bk: int

    def parts(self, m: int, n: int) -> int:
        """The m x n parts of the block tile (warp or thread tiles)."""
        return (self.bm // m) * (self.bn // n)

    def __str__(self) -> str:
        return f"{self.bm}x{self.bn}x{self.bk}"


@dataclass(frozen=True)
class RegisterCopy:
    """An operand's tile copy through registers (tiles.load_regs and store_regs).

    `load(regs, bz, mn0, k0)` reads the tile of batch bz at (mn0, k0) of the operand's (M or
    N, K) into register tensor `regs` (of shape `regs`), through the prologue macro (guarded
    where a size is not a multiple of the tile); `store(regs, dst)` writes it into shared view
    `dst`.
    """

    regs: tuple[int, int]
    load: Macro
    store: Macro


def register_copy(
    problem: MatmulProblem,
    side: str,
    tile_mn: int,
    tile_k: int,
    threads: int,
    names: Names,
    *,
    width: int,
    narrow: bool = False,
    rows_of_k: bool = False,
) -> RegisterCopy:
    """The register copy of operand `side` ("a" or "b") in tile_mn x tile_k tiles, moved in
    chunks of `width` elements along the dimension contiguous in memory (the threads read
    consecutive addresses). The shared tile is laid out as memory is (rows of M or N for a
    K-major operand, else rows of K), or always as rows of K when `rows_of_k`."""
    k_major = (problem.a_major if side == "a" else problem.b_major) == "k"
    element = operand_element(problem, side, k_major, tile_mn, tile_k, narrow=narrow)
    rows, cols = (tile_mn, tile_k) if k_major else (tile_k, tile_mn)
    tile = Tile(rows, cols, threads, width)
    fill = load_regs(names, side, tile, element)

    def load_tile(regs, bz, mn0, k0):
        return fill.fn(regs, bz, *((mn0, k0) if k_major else (k0, mn0)))

    store = store_regs(names, side, tile, transposed=rows_of_k and k_major)
    return RegisterCopy(tile.regs_shape, macro(load_tile), store)


def operand_element(
    problem: MatmulProblem, side: str, k_major: bool, tile_mn: int, tile_k: int, *, narrow: bool
) -> Macro:
    """Macro `element(bz, row, col)`: operand `side` of batch bz at (row, col) of its tiles as
    memory holds them (rows of M or N when `k_major`, else rows of K), through the prologue
    macro: 0 outside the operand where a size is not a multiple of its tile."""
    size = problem.m if side == "a" else problem.n
    check_mn, check_k = needs_check(size, tile_mn), needs_check(problem.k, tile_k)
    if side == "a":
        load = problem.load_a(narrow=narrow, check_m=check_mn, check_k=check_k)
    else:
        load = problem.load_b(narrow=narrow, check_k=check_k, check_n=check_mn)

    def element(bz, row, col):
        mn, k = (row, col) if k_major else (col, row)
        return load.fn(bz, mn, k) if side == "a" else load.fn(bz, k, mn)

    return macro(element)


def _affine(e: Expr) -> tuple[dict[Var, int], int] | None:
    """`e` as (coefficient of each variable, constant) when it is a sum of integer multiples
    of variables and constants (`s * 512 + k`, `i - 1`), else None."""
    if isinstance(e, Const) and e.dtype.is_integer:
        return {}, int(e.value)
    if isinstance(e, Var) and e.dtype.is_integer:
        return {e: 1}, 0
    if isinstance(e, Cast) and e.dtype == T.i64 and e.a.dtype.is_integer:
        return _affine(e.a)  # widening an index
    if isinstance(e, Unary) and e.op == "neg":
        return _scaled(_affine(e.a), -1)
    if not isinstance(e, Binary) or e.op not in ("add", "sub", "mul"):
        return None
    a, b = _affine(e.a), _affine(e.b)
    if a is None or b is None:
        return None
    if e.op == "mul":
        if a[0] and b[0]:
            return None  # a product of variables
        return _scaled(b, a[1]) if not a[0] else _scaled(a, b[1])
    return _affine_add(a, _scaled(b, 1 if e.op == "add" else -1))


def _split_indices(indices) -> tuple[tuple[Expr, ...], dict[tuple[Var, int], tuple[Var, Var]]]:
    """`indices` with each index `v // c` and `v % c` (a flattened view's, c a constant) as a
    variable of its own, and those parts: {(v, c): (quotient, remainder)}."""
    parts: dict[tuple[Var, int], tuple[Var, Var]] = {}
    out = []
    for index in indices:
        if (
            isinstance(index, Binary)
            and index.op in ("idiv", "imod")
            and isinstance(index.a, Var)
            and isinstance(index.b, Const)
            and index.b.dtype.is_integer
            and int(index.b.value) > 0
        ):
            v, k = index.a, int(index.b.value)
            hi, lo = parts.setdefault(
                (v, k), (Var(f"{v.name}_hi{k}", v.dtype), Var(f"{v.name}_lo{k}", v.dtype))
            )
            out.append(hi if index.op == "idiv" else lo)
        else:
            out.append(index)
    return tuple(out), parts


def _joined(coeff: dict, parts: Mapping, batch: tuple[Axis, ...]) -> tuple[Axis, ...] | None:
    """Fold the parts of `_split_indices` in `coeff` (each variable's stride) back: a variable
    whose quotient by c has c times its remainder's stride is linear, the remainder's stride
    its own; a batch variable of a static extent that c divides otherwise becomes two batch
    variables, the quotient and the remainder (per-head products of a [b, s, h, d] view:
    b and h strided apart). The batch axes that result; None where a part is left over."""
    out = list(batch)
    for (v, k), (hi, lo) in parts.items():
        s_hi, s_lo = coeff.pop(hi, 0), coeff.pop(lo, 0)
        if v in coeff:
            return None  # read both whole and in parts
        if isinstance(s_hi, int) and isinstance(s_lo, int) and s_hi == k * s_lo:
            if s_lo:
                coeff[v] = s_lo
            continue
        names = [a for a, _ in out]
        if v not in names or not isinstance(out[names.index(v)][1], int):
            return None
        at, x = names.index(v), out[names.index(v)][1]
        if x % k:
            return None
        out[at : at + 1] = [(hi, x // k), (lo, k)]
        coeff[hi], coeff[lo] = s_hi, s_lo
    return tuple(out)


def _split_sum(coeff: Mapping[Var, Dim], base: Dim, mapping: Mapping[Var, Expr], outer) -> Expr:
    """sum(coeff[v] * mapping[v]) + base as an i64 expression: the terms of the variables in
    `outer` and the constant first, those of the others last."""
    order = sorted(coeff, key=lambda v: v not in outer)
    total: Expr = const(0, T.i64)
    for v in order:
        if v not in outer and isinstance(base, int) and base:
            total, base = total + base, 0
        total = total + mapping[v] * dim_expr(coeff[v])
    return total + dim_expr(base) if not (isinstance(base, int) and base == 0) else total


def _run_limit(inside: Expr | None, inner: Var) -> tuple[int | None, Expr | None]:
    """(L, the rest of guard `inside`) where one of its conjuncts is `inner < L` (or `<=`,
    L a constant), else (None, inside): a bound on the run the chunks zero-fill past."""
    if inside is None:
        return None, None
    limit, rest = None, []
    for t in _conjuncts(inside):
        bound = None
        if isinstance(t, Binary) and t.op in ("lt", "le") and t.a == inner:
            if isinstance(t.b, Const) and t.b.dtype.is_integer:
                bound = int(t.b.value) + (t.op == "le")
        if bound is None:
            rest.append(t)
        else:
            limit = bound if limit is None else min(limit, bound)
    if limit is None:
        return None, inside
    return limit, logical_and(*rest) if rest else None


def _conjuncts(e: Expr) -> list[Expr]:
    """The terms of a conjunction."""
    if isinstance(e, Binary) and e.op == "and":
        return _conjuncts(e.a) + _conjuncts(e.b)
    return [e]


def _split_comparison(e: Expr, mapping: Mapping[Var, Expr], outer) -> Expr:
    """Comparison `e` at `mapping`, as (the part of the variables not in `outer`) compared
    with (the rest, negated) when both sides are affine, so the rest is computed once for
    the K loop; else `e` at `mapping`."""
    if not (isinstance(e, Binary) and e.op in ("lt", "le", "gt", "ge")):
        return substitute(e, mapping)
    a, b = _affine(e.a), _affine(e.b)
    if a is None or b is None:
        return substitute(e, mapping)
    terms, c = _affine_add(a, _scaled(b, -1))
    inner = {v: k for v, k in terms.items() if v not in outer}
    if not inner or len(inner) == len(terms):
        return substitute(e, mapping)
    rest = {v: -k for v, k in terms.items() if v in outer}
    lhs = _split_sum(inner, 0, mapping, outer)
    rhs = _split_sum(rest, -c, mapping, outer)
    return binary(e.op, lhs, rhs)


def _affine_add(a: tuple[dict[Var, int], int], b: tuple[dict[Var, int], int]):
    """a + b of two affine forms."""
    terms = dict(a[0])
    for v, k in b[0].items():
        terms[v] = terms.get(v, 0) + k
    return {v: k for v, k in terms.items() if k}, a[1] + b[1]


def _scaled(form: tuple[dict[Var, int], int] | None, k: int):
    if form is None:
        return None
    return {v: c * k for v, c in form[0].items() if c * k}, form[1] * k


def _strides_of(indices, strides, *, skip_others: bool = False):
    """(each variable's stride in the buffer, the constant offset) of a read at affine
    `indices` of a buffer with `strides`; None when an index is not affine, unless
    `skip_others`, which leaves such indices out (a partial answer, enough for `_major`)."""
    coeff: dict[Var, Dim] = {}
    base: Dim = 0
    for index, stride in zip(indices, strides):
        form = _affine(index)
        if form is None:
            if skip_others:
                continue
            return None
        terms, const_part = form
        for v, k in terms.items():
            coeff[v] = _dim_add(coeff.get(v, 0), _dim_mul(k, stride))
        base = _dim_add(base, _dim_mul(const_part, stride))
    return {v: x for v, x in coeff.items() if not (isinstance(x, int) and x == 0)}, base


def _narrow(e: Expr) -> Expr | None:
    """Integer expression `e` computed in i32 (its every value known to fit), or None where it
    holds something other than arithmetic, comparisons and selects of variables and
    constants."""
    if isinstance(e, Const):
        return const(e.value, T.i32) if e.dtype == T.i64 else e
    if isinstance(e, Var):
        return cast(e, T.i32) if e.dtype == T.i64 else e
    if isinstance(e, Cast):
        if e.dtype == T.i64 and e.a.dtype.is_integer:
            return _narrow(e.a)
        inner = _narrow(e.a)
        return None if inner is None else cast(inner, e.dtype)
    if isinstance(e, Unary):
        inner = _narrow(e.a)
        return None if inner is None else unary(e.op, inner)
    if isinstance(e, Binary):
        a, b = _narrow(e.a), _narrow(e.b)
        return None if a is None or b is None else binary(e.op, a, b)
    if isinstance(e, Select):
        parts = [_narrow(x) for x in (e.cond, e.a, e.b)]
        return None if any(x is None for x in parts) else select(*parts)
    return None


def _k_strides(e: Expr, problem: MatmulProblem) -> dict[Var, Dim]:
    """The stride of each K variable in the first input operand `e` reads, for those it reads
    at affine indices only."""
    k_vars = {v for v, _ in problem.contraction.k}
    for el in collect(e, TensorElement):
        if el.tensor.name not in problem.buffers or not k_vars & set(collect(el.indices, Var)):
            continue
        _, strides = problem.buffers[el.tensor.name]
        along, _ = _strides_of(el.indices, strides, skip_others=True) or ({}, 0)
        elsewhere = {v for i in el.indices if _affine(i) is None for v in collect(i, Var)}
        return {v: s for v, s in along.items() if v in k_vars and v not in elsewhere}
    return {}


def _innermost(axes: tuple[Axis, ...]) -> Var | None:
    kept = [v for v, x in axes if not is_unit(x)]
    return kept[-1] if kept else None


def flat_stride(axes: tuple[Axis, ...], coeff: Mapping[Var, Dim]) -> Dim | None:
    """The stride of the flat coordinate over `axes` when the element offset is linear in it
    (each variable's stride the next one's times its extent), else None; None too when every
    extent is 1 (no stride to speak of)."""
    kept = [(v, x) for v, x in axes if not is_unit(x)]
    if not kept:
        return None
    inner = coeff.get(kept[-1][0], 0)
    expected = inner
    for i in range(len(kept) - 2, -1, -1):
        extent = kept[i + 1][1]
        if not isinstance(expected, int) or not isinstance(extent, int):
            return None
        expected *= extent
        found = coeff.get(kept[i][0], 0)
        if not isinstance(found, int) or found != expected:
            return None
    return inner


def _dim_text(d: Dim) -> str:
    return str(d) if isinstance(d, int) else expr_str(d)


def _plain_text(p: PlainOperand | None, g: GatheredOperand | None = None) -> str:
    if p is None:
        return "computed" if g is None else "gathered"
    return f"{p.contiguous}:{_dim_text(p.ld)}"


def matmul_problem(
    op: FusedOp, layouts: Mapping[str, Strides], sms: int = H100_SMS, arch: str = DEFAULT_ARCH
) -> MatmulProblem | None:
    """The MatmulProblem of fused group `op` on a GPU of `sms` SMs and architecture `arch`, or
    None when it is not a contraction a template computes."""
    from minicomp.ir.contraction import match_contraction

    c = match_contraction(op)
    return None if c is None else MatmulProblem.from_contraction(c, layouts, sms, arch)
