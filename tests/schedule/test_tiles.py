"""The templates' tile copies (schedule/templates/tiles.py) and fragments (fragments.py):
each copy path moves a tile crossing the matrix's edges, in a checked emulator build that
fails on any access outside the tensors, so a guarded copy is shown never to read or write
out of bounds; and the fragments' locals stay apart."""

import pytest
import torch

from minicomp.backends.cuda.codegen import render_module
from minicomp.backends.cuda.emu import OutOfBoundsError, build_emulated
from minicomp.ir import expr as E
from minicomp.ir import types as T
from minicomp.ir.func import Module
from minicomp.schedule.templates import tiles
from minicomp.schedule.templates.base import finish
from minicomp.schedule.templates.fragments import Names, expression
from minicomp.script import (
    attrs,
    blockIdx,
    cp_async_commit,
    cp_async_wait_all,
    dynamic_shared_tensor,
    f16,
    i64,
    register_tensor,
    script,
    syncthreads,
    threadIdx,
)
from minicomp.script.lang import macro
from minicomp.script.values import TensorRef

# A 40 x 72 matrix in 32 x 64 tiles: the last row and column of tiles cross its edges.
M, N, BM, BN, THREADS = 40, 72, 32, 64, 128
GM, GN = -(-M // BM), -(-N // BN)
PADDED = (GM * BM, GN * BN)


def _buffers():
    x, y = E.Var("x", T.PointerType(T.f16)), E.Var("y", T.PointerType(T.f16))
    flag = E.Var("flag", T.i32)
    return x, y, flag, TensorRef("x", x, (M * N,)), TensorRef("y", y, (PADDED[0] * PADDED[1],))


@macro
def _plain(s, r, c):
    """Element (r, c) of shared tile s."""
    flat, _ = s.index((r, c))
    return E.Load(s.var, E.cast(flat, T.i64))


@macro
def _transposed(s, r, c):
    """Element (r, c) of the tile stored transposed in s."""
    flat, _ = s.index((c, r))
    return E.Load(s.var, E.cast(flat, T.i64))


def _kernel(name: str, copy_in, copy_out=None, read=_plain):
    """A kernel whose block copies tile (blockIdx.x, blockIdx.y) of x with `copy_in(s, m0,
    n0, fast)` into shared s (`fast` the kernel's flag), then writes it to the same tile of y
    (padded to whole tiles) with `copy_out(s, m0, n0, fast)`, or element by element as
    `read(s, r, c)` gives them."""
    x, y, flag, _, Y = _buffers()
    WRITE = copy_out is None

    @script(params=(x, y, flag))
    def kernel():
        attrs.grid_dim = (GM, GN, 1)
        attrs.block_dim = THREADS
        s = dynamic_shared_tensor(f16, (2 * BM, BN + tiles.PAD))
        m0 = blockIdx.x * BM
        n0 = blockIdx.y * BN
        copy_in(s, m0, n0, flag != 0)
        cp_async_commit()
        cp_async_wait_all()
        syncthreads()
        if WRITE:
            for e in range(threadIdx.x, BM * BN, THREADS):
                Y[i64(m0 + e // BN) * PADDED[1] + n0 + e % BN] = read(s, e // BN, e % BN)
        else:
            copy_out(s, m0, n0, flag != 0)

    return finish(kernel.ir, name, name)


def _guarded_load(ctx, row, col):
    """x at (row, col), 0 outside it."""
    inside = E.logical_and(row < M, col < N)
    index = E.cast(row, T.i64) * N + E.cast(col, T.i64)
    return E.select(inside, E.Load(_buffers()[0], index), E.const(0, T.f16))


def _async(guarded: bool, element: bool, rows_apart: bool = False):
    """copy_in through async_copy, guarded or not, falling back to strided reads or to an
    element macro."""
    X = _buffers()[3]
    tile = tiles.Tile(BM, BN, THREADS, rows_apart=rows_apart)
    ext = (M, N) if guarded else (None, None)
    src = tiles.Matrix(X, N, *ext, wide=tiles.wide_offsets(X))
    copy = tiles.async_copy(Names(), "x", tile, (src,), macro(_guarded_load) if element else None)

    @macro
    def copy_in(s, m0, n0, fast):
        return copy.fn(s, (0,), (E.const(0, T.i64),), m0, n0, fast, True, 0)

    return copy_in


def _regs(width: int, transposed: bool):
    """copy_in through load_regs (the element macro guards the edges) and store_regs."""
    names = Names()
    tile = tiles.Tile(BM, BN, THREADS, width)
    fill = tiles.load_regs(names, "a", tile, macro(_guarded_load))
    store = tiles.store_regs(names, "a", tile, transposed)
    REGS = tile.regs_shape

    def build(s, m0, n0):
        @script
        def copy_in():
            regs = register_tensor(f16, REGS)
            fill(regs, 0, m0, n0)
            store(regs, s)

        return copy_in

    fragment = names.fragment("in", build)

    @macro
    def copy_in(s, m0, n0, fast):
        return fragment.fn(s, m0, n0)

    return copy_in


def _store_rows():
    """copy_out through store_rows: rows past M skipped, vector stores where `fast`."""
    Y = _buffers()[4]
    out = tiles.Matrix(Y, PADDED[1], rows=M)
    tile = tiles.Tile(BM, BN, THREADS, rows_apart=True)
    store = tiles.store_rows(Names(), "y", tile, out)

    @macro
    def copy_out(s, m0, n0, fast):
        return store.fn(s, E.cast(n0, T.i64), m0, fast)

    return copy_out


def _cases():
    return {
        "guarded": _kernel("guarded", _async(True, False)),
        "guarded_rows_apart": _kernel("guarded_rows_apart", _async(True, False, True)),
        "guarded_element": _kernel("guarded_element", _async(True, True)),
        "unguarded": _kernel("unguarded", _async(False, False)),
        "regs": _kernel("regs", _regs(8, False)),
        "regs_transposed": _kernel("regs_transposed", _regs(1, True), read=_transposed),
        "store_rows": _kernel("store_rows", _async(True, False), _store_rows()),
        "two_rows": _two_rows_kernel(),
    }


# Rows-only guards (attention's K and V): the matrix is x as R rows of BN elements, copied
# twice (two matrices sharing a tile's rows) into the halves of the shared tile.
R = M * N // BN


def _two_rows_kernel():
    """Kernel two_rows: tile i of the R x BN matrix (x), with `flag` saying whether the
    guard is decided at run time (by the tile's position) or always applied; y gets both
    copies, tile after tile."""
    x, y, flag, X, _ = _buffers()
    Y = TensorRef("y", y, (GM * 2 * BM * BN,))
    src = tiles.Matrix(X, BN, rows=R)
    tile = tiles.Tile(BM, BN, THREADS, rows_apart=True)
    copy = tiles.async_copy(Names(), "kv", tile, (src, src))
    TILES = -(-R // BM)

    @script(params=(x, y, flag))
    def two_rows():
        attrs.grid_dim = TILES
        attrs.block_dim = THREADS
        s = dynamic_shared_tensor(f16, (2 * BM, BN + tiles.PAD))
        m0 = blockIdx.x * BM
        partial = flag == 0 or m0 + BM > R
        copy(s, (0, BM), (i64(0), i64(0)), m0, 0, True, partial)
        cp_async_commit()
        cp_async_wait_all()
        syncthreads()
        for e in range(threadIdx.x, 2 * BM * BN, THREADS):
            Y[i64(blockIdx.x) * (2 * BM * BN) + e] = s[e // BN, e % BN]

    return finish(two_rows.ir, "two_rows", "two_rows")


@pytest.fixture(scope="module")
def module(tmp_path_factory):
    """Every case's kernel in one checked emulator build."""
    kernels = _cases()
    source = render_module(Module("tiles", tuple(kernels.values())))
    cache = str(tmp_path_factory.mktemp("tiles"))
    return build_emulated(source, list(kernels.values()), cache_dir=cache, checks=True)


SHARED = 2 * BM * (BN + tiles.PAD) * 2


def _run(module, name: str, fast: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(y, x padded with zeros to whole tiles) after kernel `name` ran on a random x."""
    x = torch.randn(M * N, dtype=torch.float16)
    y = torch.full((PADDED[0] * PADDED[1],), float("nan"), dtype=torch.float16)
    module.launch(name, (GM, GN, 1), (THREADS, 1, 1), (x, y, int(fast)), shared_bytes=SHARED)
    expected = torch.zeros(PADDED, dtype=torch.float16)
    expected[:M, :N] = x.view(M, N)
    return y.view(PADDED), expected


@pytest.mark.parametrize("fast", [True, False], ids=["cp_async", "elements"])
@pytest.mark.parametrize("case", ["guarded", "guarded_rows_apart", "guarded_element"])
def test_guarded_copies_zero_fill_and_stay_inside(module, case, fast):
    y, expected = _run(module, case, fast)
    torch.testing.assert_close(y, expected, rtol=0, atol=0)


@pytest.mark.parametrize("case", ["regs", "regs_transposed"])
def test_register_copies(module, case):
    y, expected = _run(module, case, True)
    torch.testing.assert_close(y, expected, rtol=0, atol=0)


@pytest.mark.parametrize("at_run_time", [True, False], ids=["run_time", "always"])
def test_two_matrices_guarded_along_rows(module, at_run_time):
    """Both copies of a tile land in their halves; rows past R are zero whether the guard is
    decided at run time (only the last tile) or always applied."""
    tiles_ = -(-R // BM)
    x = torch.randn(M * N, dtype=torch.float16)
    y = torch.full((tiles_ * 2 * BM * BN,), float("nan"), dtype=torch.float16)
    module.launch("two_rows", (tiles_, 1, 1), (THREADS, 1, 1), (x, y, int(at_run_time)), SHARED)
    rows = torch.zeros(tiles_ * BM, BN, dtype=torch.float16)
    rows[:R] = x.view(R, BN)
    expected = rows.view(tiles_, 1, BM, BN).expand(tiles_, 2, BM, BN).flatten()
    torch.testing.assert_close(y, expected, rtol=0, atol=0)


@pytest.mark.parametrize("fast", [True, False], ids=["vectors", "elements"])
def test_store_rows_skips_rows_past_the_edge(module, fast):
    y, expected = _run(module, "store_rows", fast)
    expected[M:] = float("nan")  # never written
    torch.testing.assert_close(y, expected, rtol=0, atol=0, equal_nan=True)


def test_an_unguarded_partial_tile_is_caught(module):
    """The checked build catches a copy without guards reading past the matrix (what the
    other tests rely on)."""
    with pytest.raises(OutOfBoundsError):
        _run(module, "unguarded", True)


def test_expansions_get_their_own_names():
    """Two expansions of one fragment in a kernel, and the kernel's own locals, never share a
    variable; a kernel that declares one twice is refused."""
    names = Names()

    def body(out, i):
        @script
        def set_one():
            j = i + 1
            out[j] = 0.0

        return set_one

    set_one = names.fragment("t", body)
    y = E.Var("y", T.PointerType(T.f32))
    Y = TensorRef("y", y, (8,))

    @script(params=(y,))
    def k():
        attrs.grid_dim = 1
        attrs.block_dim = 1
        i = threadIdx.x
        set_one(Y, i)
        set_one(Y, i + 2)

    text = str(finish(k.ir, "k", "k"))
    assert "i: i32" in text and "j_t: i32" in text and "j_t2: i32" in text

    set_again = Names().fragment("t", body)  # a kernel's own Names: j becomes j_t again

    @script(params=(y,))
    def twice():
        attrs.grid_dim = 1
        attrs.block_dim = 1
        j_t = threadIdx.x
        set_again(Y, j_t)

    with pytest.raises(ValueError, match="declared twice"):
        finish(twice.ir, "twice", "twice")


def test_a_local_hiding_an_argument_is_refused():
    names = Names()
    i = E.Var("i", T.i32)

    def body(v):
        @script
        def shadow():
            i = v + 1  # noqa: F841 - the fragment's local, named like the value it reads
            syncthreads()

        return shadow

    with pytest.raises(ValueError, match="hides a value"):
        names.splice(body(i), "t")


def test_expression_inlines_its_locals():
    def square_plus_one(v):
        @script
        def value() -> i64:
            sq = v * v
            return sq + 1

        return value

    f = expression(square_plus_one)
    n = E.Var("n", T.i64)
    assert str(f.fn(n)) == str(n * n + 1)
