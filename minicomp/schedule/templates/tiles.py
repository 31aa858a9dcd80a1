"""Tile copies the templates share: a 2-D tile moved between global memory, registers and
shared memory by all the threads of a block, in chunks of consecutive elements.

A `Tile` is `rows` x `cols` elements, `cols` along the dimension contiguous in memory, moved
in chunks of `width` elements (16 bytes of f16/bf16 for copies and vector stores; one element
for a SIMT operand). Chunk c belongs to thread c % threads in iteration c // threads; chunks
are numbered row-major, so that consecutive threads touch consecutive addresses, except where
a row has 2 or 4 chunks of 16 bytes: there the 8 lanes a 16-byte shared access serves at once
(one phase) take one column of 8 rows, where a tile asks for it (`Tile.phase_columns`: the
cp.async copies; a register copy keeps the plain order, which costs ptxas fewer registers).
Rows padded by 16 bytes start an odd number of 16-byte bank groups apart, so those 8 chunks
hit 8 different groups, where two rows' 8 chunks would share one (a 2-way conflict); a warp
still reads the same whole rows of global memory, so coalescing does not change. Where the
threads cover
whole rows (threads a multiple of the chunks of a row) a tile may ask (`rows_apart`) that a
thread keep one column, its rows a constant apart: one base address a thread, no division in
the iterations. (The matmuls do not: with their register-staged copies ptxas then spills in
some 64-thread tilings on sm_80.)

The copies, each a macro a kernel calls as a statement:

- `async_copy`: global -> shared with 16-byte cp.async. Where a tile may cross the edge of
  its matrix (`Matrix.rows`, and `cols` if it may cross that one too, given; `partial` true
  at run time), the chunks past it are zero-filled: a chunk's bytes inside both edges are
  read, none from the matrix's base past them; with rows alone guarded, a row past the last
  reads no bytes from row 0. Where the source cannot take 16-byte copies (`fast` false at
  run time) the block copies element by element, guarded: in the chunks' own unrolled loop
  through an element macro (a matmul's, which computes the operand), or else in a compact
  loop of strided reads (the rare case kept small).
- `gather_copy`: global -> shared with 16-byte cp.async of chunks that are each a run of
  memory somewhere (its offset computed per chunk, a convolution's window), or zero-filled,
  whole or past a count of elements; element by element from the same offsets where the
  runs are not 16-byte aligned.
- `load_regs` / `store_regs`: global -> registers through an element macro (a fused
  prologue), then registers -> shared memory, transposed if asked: a copy split around the
  math that hides its latency.
- `store_rows`: shared -> global with 16-byte vector stores (rows past the matrix skipped),
  element by element where `fast` is false.

No copy reads or writes outside its matrix: every element it may touch past an edge is
guarded. Row offsets are 64-bit products unless the buffer is known to have fewer than 2**31
elements (`Matrix.wide`).

Each copy is a fragment (fragments.py): script statements written once here and expanded
inline where a kernel calls them.
"""

from __future__ import annotations

from dataclasses import dataclass

from minicomp.ir import types as T
from minicomp.ir.expr import Dim
from minicomp.schedule.templates.fragments import Names
from minicomp.script import conversions as C
from minicomp.script.function import ScriptFunction, script
from minicomp.script.lang import (
    Macro,
    cp_async,
    load_vec,
    macro,
    register_tensor,
    store_vec,
    threadIdx,
    unroll,
)
from minicomp.script.types import i32
from minicomp.script.values import TensorRef

# The bytes of a cp.async or vector chunk, and the f16/bf16 elements it holds.
CHUNK_BYTES = 16
CHUNK = 8
# Elements of padding after each shared row of an f16/bf16 tile (16 bytes): rows stay 16-byte
# aligned and the eight rows an ldmatrix reads fall in different banks.
PAD = 8


def chunk_elems(nbytes: int) -> int:
    """Elements of `nbytes` bytes in a 16-byte chunk (and in a shared row's padding): CHUNK
    and PAD for f16/bf16, 16 for 8-bit integers."""
    return CHUNK_BYTES // nbytes


@dataclass(frozen=True)
class Tile:
    """A rows x cols tile (cols contiguous) moved by `threads` threads in chunks of `width`
    elements (see the module doc)."""

    rows: int
    cols: int
    threads: int
    width: int = CHUNK
    rows_apart: bool = False
    """Where the threads cover whole rows, give each thread one column and rows a constant
    apart (one base address a thread) instead of computing both from the chunk index."""
    phase_columns: bool = False
    """Give the 8 lanes of a 16-byte shared access one column of 8 rows (see the module doc)."""
    elem_bytes: int = 2
    """Bytes of an element: a 16-byte chunk is 8 f16/bf16 elements, 16 of 8-bit integers."""

    @property
    def per_row(self) -> int:
        return self.cols // self.width

    @property
    def chunks(self) -> int:
        return self.rows * self.per_row

    @property
    def column_phases(self) -> bool:
        """Whether each 8 consecutive chunks are one column of 8 rows (see the module doc)."""
        sixteen_bytes = self.width * self.elem_bytes == CHUNK_BYTES
        rows_of_two_or_four = sixteen_bytes and self.per_row in (2, 4)
        return self.phase_columns and rows_of_two_or_four and self.rows % 8 == 0

    @property
    def iters(self) -> int:
        """Iterations a thread makes (its chunks, at most)."""
        return -(-self.chunks // self.threads)

    @property
    def exact(self) -> bool:
        """Whether every thread has a chunk in every iteration."""
        return self.chunks % self.threads == 0

    @property
    def whole_rows(self) -> bool:
        """Whether each iteration's chunks are whole rows, taken `rows_apart`."""
        return self.rows_apart and self.threads % self.per_row == 0

    @property
    def regs_shape(self) -> tuple[int, int]:
        """The register tensor holding a thread's chunks (`load_regs`, `store_regs`)."""
        return self.iters, self.width


@dataclass(frozen=True)
class Matrix:
    """A matrix in global memory as a copy sees it: element (row, col) of `ref` (a flat
    tensor) at `base + row * ld + col * step`, `base` given at run time. `rows` and `cols`
    are its extents where a tile may cross them (None: no tile does), the copies' guards.
    `wide`: row offsets are 64-bit products (else products in the row index's type, enough
    where the buffer has fewer than 2**31 elements: see `wide_offsets`)."""

    ref: TensorRef
    ld: Dim
    rows: Dim | None = None
    cols: Dim | None = None
    step: Dim = 1
    wide: bool = True


def wide_offsets(ref: TensorRef) -> bool:
    """Whether offsets into flat tensor `ref` may need 64 bits (its size not known to be
    below 2**31 elements)."""
    (size,) = ref.shape
    return not (isinstance(size, int) and size < 2**31)


def _each_chunk(tile: Tile, body: Macro) -> ScriptFunction:
    """`body(q, r, x)` for each chunk of `tile` this thread moves: iteration q, row r, first
    column x."""
    ITERS, THREADS, ROWS, W = tile.iters, tile.threads, tile.rows, tile.width
    PER_ROW = tile.per_row
    WHOLE = tile.whole_rows
    ROW_STEP = THREADS // PER_ROW if WHOLE else 0
    EXACT = tile.exact
    COLUMNS = tile.column_phases and not WHOLE
    SPAN = 8 * PER_ROW  # chunks of 8 rows
    # Where the threads cover whole spans, a thread keeps its column in every iteration, and
    # the code says so (what depends on the column alone is computed once, not per chunk).
    SPANS_APART = COLUMNS and THREADS % SPAN == 0
    SPAN_STEP = THREADS // SPAN * 8

    @script
    def each_chunk():
        for q in unroll(range(ITERS)):
            if WHOLE:
                r = threadIdx.x // PER_ROW + q * ROW_STEP
                x = threadIdx.x % PER_ROW * W
            elif SPANS_APART:
                r = threadIdx.x // SPAN * 8 + threadIdx.x % 8 + q * SPAN_STEP
                x = threadIdx.x % SPAN // 8 * W
            elif COLUMNS:
                c = q * THREADS + threadIdx.x
                r = c // SPAN * 8 + c % 8
                x = c % SPAN // 8 * W
            else:
                c = q * THREADS + threadIdx.x
                r = c // PER_ROW
                x = c % PER_ROW * W
            if EXACT or r < ROWS:
                body(q, r, x)

    return each_chunk


def _each_element(tile: Tile, body: Macro) -> ScriptFunction:
    """`body(r, c)` for each element of `tile` this thread moves, in a loop (not unrolled:
    the element-by-element paths are the rare ones, kept small)."""
    THREADS, COLS, SIZE = tile.threads, tile.cols, tile.rows * tile.cols

    @script
    def each_element():
        for e in range(threadIdx.x, SIZE, THREADS):
            body(e // COLS, e % COLS)

    return each_element


def _fast_or_slow(fast, fast_path: Macro, slow_path: Macro) -> ScriptFunction:
    """`fast_path()` where `fast`, else `slow_path()`."""

    @script
    def fast_or_slow():
        if fast:
            fast_path()
        else:
            slow_path()

    return fast_or_slow


def _chunks_or_elements(names: Names, tag: str, tile: Tile, fast, chunk, element):
    """The script moving this thread's chunks (`chunk(q, r, x)` builds one's script) where
    `fast`, else its elements in a loop (`element(r, c)` builds one's)."""
    chunks = names.fragment(tag, lambda: _each_chunk(tile, names.fragment(tag, chunk)))
    elements = names.fragment(tag, lambda: _each_element(tile, names.fragment(tag, element)))
    return _fast_or_slow(fast, chunks, elements)


def async_copy(
    names: Names, tag: str, tile: Tile, srcs: tuple[Matrix, ...], element: Macro | None = None
) -> Macro:
    """Macro `copy(dst, dst_rows, bases, row0, col0, fast, partial[, ctx])`: rows row0... and
    columns col0... of each matrix of `srcs` (at its run-time base, `bases[j]`) into rows
    dst_rows[j]... of shared tensor `dst`, a tile each, with 16-byte cp.async where `fast`,
    guarded where `partial` (chunks past the edges the matrices give are zero-filled). Where
    not `fast`, element by element: as `element(ctx, row, col)` gives them, chunk by chunk
    (one matrix only); without `element`, strided reads in a compact loop."""
    W = tile.width
    BYTES = CHUNK_BYTES // W
    JS = tuple(range(len(srcs)))
    REFS = tuple(m.ref for m in srcs)
    STEPS = tuple(m.step for m in srcs)
    ROWS, COLS = srcs[0].rows, srcs[0].cols
    CHECK_ROWS, CHECK_COLS = ROWS is not None, COLS is not None
    if CHECK_COLS and not CHECK_ROWS:
        raise ValueError("a copy guards the columns only with the rows")
    if element is not None and len(srcs) != 1:
        raise ValueError("an element macro computes one matrix")

    def copy_tile(dst, dst_rows, bases, row0, col0, fast, partial, ctx=None):
        def chunk(q, r, x):
            @script
            def copy_chunk():
                gr = row0 + r
                gc = col0 + x
                if CHECK_COLS and partial:
                    # The bytes of the chunk inside the matrix; the rest is zero-filled, and a
                    # chunk with none reads nothing (from the matrix's base).
                    n = i32(max(min(COLS - gc, W), 0) if gr < ROWS else 0)
                    for j in JS:
                        src = bases[j] + row_offset(j, gr) + gc if n > 0 else bases[j]
                        cp_async(dst[dst_rows[j] + r, x], REFS[j][src], 16, n * BYTES)
                elif CHECK_ROWS and partial:
                    # A row past the last is zero-filled, read from row 0 (nothing is read).
                    inside = gr < ROWS
                    for j in JS:
                        src = bases[j] + row_offset(j, gr if inside else 0) + gc
                        cp_async(dst[dst_rows[j] + r, x], REFS[j][src], 16, 16 if inside else 0)
                else:
                    for j in JS:
                        src = bases[j] + row_offset(j, gr) + gc
                        cp_async(dst[dst_rows[j] + r, x], REFS[j][src], 16)

            return copy_chunk

        if element is not None:

            def chunk_or_elements(q, r, x):
                def elements():
                    @script
                    def copy_elements():
                        for v in unroll(range(W)):
                            dst[dst_rows[0] + r, x + v] = element(ctx, row0 + r, col0 + x + v)

                    return copy_elements

                return _fast_or_slow(
                    fast,
                    names.fragment(tag, lambda: chunk(q, r, x)),
                    names.fragment(tag, elements),
                )

            return _each_chunk(tile, names.fragment(tag, chunk_or_elements))

        def strided(r, c):
            @script
            def copy_element():
                gr = row0 + r
                gc = col0 + c
                if CHECK_COLS:
                    inside = gr < ROWS and gc < COLS
                elif CHECK_ROWS:
                    inside = gr < ROWS
                else:
                    inside = True
                for j in JS:
                    src = bases[j] + row_offset(j, gr) + gc * STEPS[j]
                    dst[dst_rows[j] + r, c] = REFS[j][src] if inside else 0.0

            return copy_element

        return _chunks_or_elements(names, tag, tile, fast, chunk, strided)

    @macro
    def row_offset(j, row):
        """The offset of row `row` of matrix j from its base."""
        return _row_offset(row, srcs[j])

    return names.fragment(tag, copy_tile)


def gather_copy(
    names: Names, tag: str, tile: Tile, ref: TensorRef, source: Macro, count: Macro | None = None
) -> Macro:
    """Macro `copy(dst, row0, col0, fast, ctx)`: the tile at (row0, col0) of a matrix whose
    chunks are runs of flat tensor `ref` into shared tensor `dst`: chunk (row, col) is the
    run of 16 bytes at element offset `source(ctx, row, col)`, or zero where that is -1,
    copied with cp.async (zero-filled, reading nothing) where `fast` (the runs 16-byte
    aligned), else element by element from the same offset; with `count`, only the first
    `count(ctx, row, col)` elements of a run are read, the rest zero-filled. (One offset for
    both paths: what the compiler hoists out of a K loop for it serves both.)"""
    W = tile.width
    BYTES = CHUNK_BYTES // W
    COUNTED = count is not None

    def copy_tile(dst, row0, col0, fast, ctx):
        def chunk(q, r, x):
            @script
            def gather_chunk():
                src = source(ctx, row0 + r, col0 + x)
                if COUNTED:
                    n = count(ctx, row0 + r, col0 + x) * BYTES
                    cp_async(dst[r, x], ref[max(src, 0)], 16, n if src >= 0 else 0)
                else:
                    cp_async(dst[r, x], ref[max(src, 0)], 16, 16 if src >= 0 else 0)

            return gather_chunk

        def chunk_or_elements(q, r, x):
            def elements():
                @script
                def gather_elements():
                    src = source(ctx, row0 + r, col0 + x)
                    if COUNTED:
                        n = count(ctx, row0 + r, col0 + x) if src >= 0 else 0
                        for v in unroll(range(W)):
                            dst[r, x + v] = ref[src + v] if v < n else 0.0
                    else:
                        for v in unroll(range(W)):
                            dst[r, x + v] = ref[src + v] if src >= 0 else 0.0

                return gather_elements

            return _fast_or_slow(
                fast, names.fragment(tag, lambda: chunk(q, r, x)), names.fragment(tag, elements)
            )

        return _each_chunk(tile, names.fragment(tag, chunk_or_elements))

    return names.fragment(tag, copy_tile)


def _row_offset(row, m: Matrix):
    """row * m.ld as an i64 value: a 64-bit product where `m` is wide."""
    if m.wide:
        return C.binop("mul", C.explicit(row, T.i64), m.ld)
    return C.explicit(C.binop("mul", row, m.ld), T.i64)


def load_regs(names: Names, tag: str, tile: Tile, element: Macro) -> Macro:
    """Macro `load(regs, ctx, row0, col0)`: this thread's chunks of the tile at (row0, col0)
    into register tensor `regs` (of `tile.regs_shape`), element (row, col) being
    `element(ctx, row, col)` (which guards the matrix's edges)."""
    W = tile.width

    def load(regs, ctx, row0, col0):
        def chunk(q, r, x):
            @script
            def load_chunk():
                if W == 1:
                    regs[q, 0] = element(ctx, row0 + r, col0 + x)
                else:
                    for v in unroll(range(W)):
                        regs[q, v] = element(ctx, row0 + r, col0 + x + v)

            return load_chunk

        return _each_chunk(tile, names.fragment(tag, chunk))

    return names.fragment(tag, load)


def store_regs(names: Names, tag: str, tile: Tile, transposed: bool = False) -> Macro:
    """Macro `store(regs, dst)`: what `load_regs` put in `regs` into shared tensor `dst`, at
    the tile's (row, col), or (col, row) when `transposed` (chunks of one element only)."""
    if transposed and tile.width != 1:
        raise ValueError("a transposed store moves chunks of one element")
    W = tile.width
    T = transposed

    def store(regs, dst):
        def chunk(q, r, x):
            @script
            def store_chunk():
                if W == 1 and T:
                    dst[x, r] = regs[q, 0]
                elif W == 1:
                    dst[r, x] = regs[q, 0]
                else:
                    for v in unroll(range(W)):
                        dst[r, x + v] = regs[q, v]

            return store_chunk

        return _each_chunk(tile, names.fragment(tag, chunk))

    return names.fragment(tag, store)


def store_rows(names: Names, tag: str, tile: Tile, out: Matrix) -> Macro:
    """Macro `store(src, base, row0, fast)`: the tile in the first rows of shared tensor `src`
    into rows row0... of matrix `out` (at run-time base `base`; rows past `out.rows`
    skipped), with 16-byte vector stores where `fast`, else element by element."""
    W = tile.width
    REF, STEP, ROWS = out.ref, out.step, out.rows
    CHECK = ROWS is not None
    DT = REF.dtype

    @macro
    def row_offset(row):
        """The offset of row `row` of `out` from its base."""
        return _row_offset(row, out)

    def store(src, base, row0, fast):
        def chunk(q, r, x):
            @script
            def store_chunk():
                gr = row0 + r
                if not CHECK or gr < ROWS:
                    vec = register_tensor(DT, W)
                    load_vec(vec, src[r, x])
                    store_vec(REF[base + row_offset(gr) + x], vec)

            return store_chunk

        def element(r, c):
            @script
            def store_element():
                gr = row0 + r
                if not CHECK or gr < ROWS:
                    REF[base + row_offset(gr) + c * STEP] = src[r, c]

            return store_element

        return _chunks_or_elements(names, tag, tile, fast, chunk, element)

    return names.fragment(tag, store)
