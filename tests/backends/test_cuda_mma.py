"""Tests of the tensor-core and async-copy intrinsics (mma.sync m16n8k16, ldmatrix, cp.async):
kernels built in kernel IR run in the emulator against references built from the PTX ISA's
definitions, and compile with NVRTC for sm_80 and sm_90.

The fragment layouts below are written out from the PTX ISA's tables ("Matrix Fragments for
mma.m16n8k16 with floating point type"; "Warp-level matrix load instruction: ldmatrix") in
this file, apart from the emulator's and the renderer's, and the references compute whole
matrices with numpy: a layout wrong in the kernels, here or in the emulator gives a wrong
product.
"""

import re

import numpy as np
import pytest
import torch

from minicomp.backends.cuda.codegen import CudaRenderer, device_header
from minicomp.backends.cuda.emu import EmulatorError, build_emulated
from minicomp.backends.cuda.intrinsics_mma import (
    HEADER_PATH,
    MMA_INTRINSICS,
    WARP_COLLECTIVE_INTRINSICS,
    mma_fragment,
)
from minicomp.backends.headers import inline_includes
from minicomp.ir import expr as E
from minicomp.ir import stmt as S
from minicomp.ir.c_names import C_TYPES
from minicomp.ir.func import Function, LaunchAttrs, Module
from minicomp.ir.functor import Visitor
from minicomp.ir.types import PointerType, bf16, f16, f32, i16, i32, u8

# ---- the PTX fragment layouts, written from the ISA's text (g: groupID, t: threadID_in_group)


def a_layout(g, t, i):
    """Row and column of A element a_i (i < 8) held by the lane with groupID g and
    threadID_in_group t: "row = groupID for ai where 0 <= i < 2 || 4 <= i < 6, groupID + 8
    otherwise; col = (threadID_in_group * 2) + (i & 0x1) (+ 8 for i >= 4)"."""
    row = g if (0 <= i < 2 or 4 <= i < 6) else g + 8
    col = t * 2 + (i & 1) + (8 if i >= 4 else 0)
    return row, col


def b_layout(g, t, i):
    """B element b_i (i < 4): "row = (threadID_in_group * 2) + (i & 0x1) (+ 8 for i >= 2);
    col = groupID"."""
    return t * 2 + (i & 1) + (8 if i >= 2 else 0), g


def c_layout(g, t, i):
    """C/D element c_i (i < 4): "row = groupID for i < 2, groupID + 8 for i >= 2;
    col = (threadID_in_group * 2) + (i & 0x1)"."""
    return (g if i < 2 else g + 8), t * 2 + (i & 1)


def ldmatrix_reference(rows: np.ndarray, num: int, trans: bool) -> np.ndarray:
    """What each lane receives from ldmatrix .x{num}: rows[a] is the 8-element row at the
    address lane a gave; "each thread loads fragments of a row, a group of four threads loads an
    entire row" (lane l: row l / 4, elements 2 * (l % 4) and +1), and .trans loads the matrix
    column-major (lane l: column l / 4, rows 2 * (l % 4) and +1)."""
    out = np.zeros((32, 2 * num), dtype=rows.dtype)
    for lane in range(32):
        for m in range(num):
            matrix = rows[8 * m : 8 * m + 8]  # row r's address came from lane 8m + r
            for j in range(2):
                if trans:
                    out[lane, 2 * m + j] = matrix[2 * (lane % 4) + j, lane // 4]
                else:
                    out[lane, 2 * m + j] = matrix[lane // 4, 2 * (lane % 4) + j]
    return out


# ---- building kernels


def _tid() -> E.Expr:
    return E.Call("thread_idx_x", (), i32)


def _call(name: str, *args) -> S.Stmt:
    return S.Evaluate(E.Call(name, tuple(_i(a) for a in args), i32))


def _i(x) -> E.Expr:
    return E.const(x, i32) if isinstance(x, int) else x


def _store(buf: E.Var, index, value) -> S.Stmt:
    return S.Store(buf, _i(index), value)


def _load(buf: E.Var, index) -> E.Expr:
    return E.Load(buf, _i(index))


def _ptr(name: str, dt, space: str = "global") -> E.Var:
    return E.Var(name, PointerType(dt, space))


def _kernel(name, params, body, threads, grid=(1, 1, 1)) -> Function:
    attrs = LaunchAttrs(grid_dim=grid, block_dim=(threads, 1, 1))
    return Function(name, tuple(params), S.seq(*body), attrs=attrs)


def _lane_ids():
    lane = E.Var("lane", i32)
    return lane, lane // 4, lane % 4, S.Declare(lane, _tid() % 32)


def mma_tiles_kernel(kind, k_tiles: int, warps: int = 2) -> Function:
    """Each warp computes D = A @ B + C for its own problem (A 16xK row-major, B Kx8
    row-major, C and D 16x8 f32), loading fragments from global memory by the layouts above,
    K / 16 mma steps accumulating in place (d is c)."""
    K = 16 * k_tiles
    A, B = _ptr("A", kind), _ptr("B", kind)
    C, D = _ptr("C", f32), _ptr("D", f32)
    lane, g, t, declare_lane = _lane_ids()
    tile = E.Var("tile", i32)
    a, b, acc = (
        _ptr("a_frag", kind, "local"),
        _ptr("b_frag", kind, "local"),
        _ptr("acc", f32, "local"),
    )
    kt = E.Var("kt", i32)
    loads = []
    for i in range(8):
        row, col = a_layout(g, t, i)
        loads.append(_store(a, i, _load(A, tile * (16 * K) + row * K + kt * 16 + col)))
    for i in range(4):
        row, col = b_layout(g, t, i)
        loads.append(_store(b, i, _load(B, tile * (K * 8) + (kt * 16 + row) * 8 + col)))
    step = S.seq(*loads, _call("mma_sync_m16n8k16", acc, 0, a, 0, b, 0, acc, 0))
    body = [
        declare_lane,
        S.Declare(tile, E.Call("block_idx_x", (), i32) * warps + _tid() // 32),
        S.DeclareArray(a, kind, 8),
        S.DeclareArray(b, kind, 4),
        S.DeclareArray(acc, f32, 4),
    ]
    for i in range(4):
        row, col = c_layout(g, t, i)
        body.append(_store(acc, i, _load(C, tile * 128 + row * 8 + col)))
    body.append(S.For(kt, E.const(k_tiles, i32), step))
    for i in range(4):
        row, col = c_layout(g, t, i)
        body.append(_store(D, tile * 128 + row * 8 + col, _load(acc, i)))
    name = f"mma_{kind.short}_k{K}"
    return _kernel(name, (A, B, C, D), body, 32 * warps, grid=(2, 1, 1))


LD_STRIDE = 24  # elements of a shared row: 48 bytes, so every 8-element chunk is 16-aligned
LD_ROWS = 40


def ldmatrix_kernel(num: int, trans: bool, overwrite: bool = False) -> Function:
    """Copies a LD_ROWS x 24 int16 matrix to shared memory, then ldmatrix .x{num} with the row
    address of each lane at element offs[lane]; lane l stores its 2 * num elements at
    out[l * 2 * num ...]. With `overwrite`, lane 31 (the last to reach the ldmatrix, the first
    to leave it in the emulator) then zeroes the whole tile: the warp's load is one
    instruction, done for every lane before any lane's next store."""
    src, offs, out = _ptr("src", i16), _ptr("offs", i32), _ptr("out", i16)
    tile, frag = _ptr("tile", i16, "shared"), _ptr("frag", i16, "local")
    lane, _, _, declare_lane = _lane_ids()
    j, idx = E.Var("j", i32), E.Var("idx", i32)
    total = LD_ROWS * LD_STRIDE
    fill = S.For(
        j,
        E.const(total // 32, i32),
        S.seq(S.Declare(idx, j * 32 + lane), _store(tile, idx, _load(src, idx))),
    )
    name = f"ldmatrix_x{num}{'_trans' if trans else ''}"
    body = [
        declare_lane,
        S.DeclareArray(tile, i16, total, "shared"),
        S.DeclareArray(frag, i16, 8),
        fill,
        _call("syncthreads"),
        _call(name, frag, 0, tile, _load(offs, lane)),
    ]
    if overwrite:
        zero = S.For(j, E.const(total, i32), _store(tile, j, E.const(0, i16)))
        body.append(S.If(E.eq(lane, E.const(31, i32)), zero))
        name += "_then_overwrite"
    body += [_store(out, lane * (2 * num) + k, _load(frag, k)) for k in range(2 * num)]
    return _kernel(f"ld_{name}", (src, offs, out), body, 32)


def pipeline_kernel(kind) -> Function:
    """D = A @ B + C (A 16x32, B 32x8 row-major) the way a tensor-core matmul runs: cp.async
    copies both K-halves into shared memory as two commit groups, then for each half
    wait_group, barrier, ldmatrix.x4 of A, ldmatrix.x2.trans of B, and mma in place."""
    A, B, C, D = _ptr("A", kind), _ptr("B", kind), _ptr("C", f32), _ptr("D", f32)
    As, Bs = _ptr("As", kind, "shared"), _ptr("Bs", kind, "shared")
    a, b, acc = (
        _ptr("a_frag", kind, "local"),
        _ptr("b_frag", kind, "local"),
        _ptr("acc", f32, "local"),
    )
    lane, g, t, declare_lane = _lane_ids()
    body = [
        declare_lane,
        S.DeclareArray(As, kind, 2 * 16 * LD_STRIDE, "shared"),
        S.DeclareArray(Bs, kind, 2 * 16 * 8, "shared"),
        S.DeclareArray(a, kind, 8),
        S.DeclareArray(b, kind, 4),
        S.DeclareArray(acc, f32, 4),
    ]
    for stage in range(2):
        # A: 16 rows of 16 elements (two 16-byte chunks) a stage: lane l copies row l / 2,
        # chunk l % 2. B: 16 rows of one chunk: lanes 0-15.
        row, half = lane // 2, lane % 2
        a_dst = stage * 16 * LD_STRIDE + row * LD_STRIDE + half * 8
        body.append(_call("cp_async_16", As, a_dst, A, row * 32 + stage * 16 + half * 8))
        b_copy = _call("cp_async_16", Bs, stage * 128 + lane * 8, B, (stage * 16 + lane) * 8)
        body += [S.If(E.binary("lt", lane, E.const(16, i32)), b_copy), _call("cp_async_commit")]
    for i in range(4):
        row, col = c_layout(g, t, i)
        body.append(_store(acc, i, _load(C, row * 8 + col)))
    for stage in range(2):
        a_row = stage * 16 * LD_STRIDE + (lane % 16) * LD_STRIDE + (lane // 16) * 8
        body += [
            _call("cp_async_wait", 1 - stage),
            _call("syncthreads"),
            _call("ldmatrix_x4", a, 0, As, a_row),
            _call("ldmatrix_x2_trans", b, 0, Bs, stage * 128 + (lane % 16) * 8),
            _call("mma_sync_m16n8k16", acc, 0, a, 0, b, 0, acc, 0),
        ]
    for i in range(4):
        row, col = c_layout(g, t, i)
        body.append(_store(D, row * 8 + col, _load(acc, i)))
    return _kernel(f"pipeline_{kind.short}", (A, B, C, D), body, 32)


ASYNC_BYTES = 896 + 32 * 28  # whole copies of 16, 8, 4 bytes a lane, then zero-filled ones


def async_copy_kernel() -> Function:
    """Byte copies by cp.async of every size, whole and zero-filled, in two commit groups:
    lane l copies 16 bytes at 16l, 8 at 512 + 8l, 4 at 768 + 4l, then the same sizes reading
    only nbytes[3l + k] bytes at 896 + ..., and finally the shared buffer goes to out."""
    src, nbytes, out = _ptr("src", u8), _ptr("nbytes", i32), _ptr("out", u8)
    buf = _ptr("buf", u8, "shared")
    lane, _, _, declare_lane = _lane_ids()
    j = E.Var("j", i32)
    copies = [
        _call("cp_async_16", buf, lane * 16, src, lane * 16),
        _call("cp_async_8", buf, 512 + lane * 8, src, 512 + lane * 8),
        _call("cp_async_commit"),
        _call("cp_async_4", buf, 768 + lane * 4, src, 768 + lane * 4),
    ]
    base = 896
    for k, size in enumerate((16, 8, 4)):
        at = base + lane * size
        copies.append(_call(f"cp_async_{size}", buf, at, src, at, _load(nbytes, lane * 3 + k)))
        base += 32 * size
    body = [
        declare_lane,
        S.DeclareArray(buf, u8, ASYNC_BYTES, "shared"),
        *copies,
        _call("cp_async_commit"),
        _call("cp_async_wait", 1),
        _call("cp_async_wait_all"),
        _call("syncthreads"),
        S.For(
            j,
            E.const(ASYNC_BYTES // 32, i32),
            _store(out, j * 32 + lane, _load(buf, j * 32 + lane)),
        ),
    ]
    return _kernel("async_copies", (src, nbytes, out), body, 32)


def divergent_kernels() -> list[Function]:
    """Kernels PTX leaves undefined: lanes of a warp at different collectives."""
    x = _ptr("x", f16)
    a, acc = _ptr("a_frag", f16, "local"), _ptr("acc", f32, "local")
    tile = _ptr("tile", f16, "shared")
    lane, _, _, declare_lane = _lane_ids()
    first_half = E.binary("lt", lane, E.const(16, i32))
    setup = [
        declare_lane,
        S.DeclareArray(a, f16, 8),
        S.DeclareArray(acc, f32, 4),
        S.DeclareArray(tile, f16, 64, "shared"),
        *(_store(a, i, _load(x, i)) for i in range(8)),
        *(_store(acc, i, E.const(0.0, f32)) for i in range(4)),
    ]
    mma = _call("mma_sync_m16n8k16", acc, 0, a, 0, a, 0, acc, 0)
    ld = _call("ldmatrix_x1", a, 0, tile, (lane % 8) * 8)
    shuffle = _store(x, lane, E.Call("shfl_xor_sync", (_load(x, lane), E.const(1, i32)), f16))
    return [
        _kernel("mma_vs_ldmatrix", (x,), [*setup, S.If(first_half, mma, ld)], 32),
        _kernel("mma_vs_shuffle", (x,), [*setup, S.If(first_half, mma, shuffle)], 32),
        _kernel("mma_only", (x,), [*setup, mma], 32),
    ]


def misaligned_kernels() -> list[Function]:
    x, out = _ptr("x", f16), _ptr("out", f16)
    tile, frag = _ptr("tile", f16, "shared"), _ptr("frag", f16, "local")
    lane, _, _, declare_lane = _lane_ids()
    setup = [declare_lane, S.DeclareArray(tile, f16, 256, "shared"), S.DeclareArray(frag, f16, 8)]
    # Lane 3's row starts 2 bytes into a 16-byte chunk; lane 8 is ignored by .x1.
    odd_row = lane * 8 + E.select(E.eq(lane, 3), E.const(1, i32), E.const(0, i32))
    return [
        _kernel(
            "ldmatrix_misaligned",
            (x, out),
            [*setup, _call("ldmatrix_x1", frag, 0, tile, odd_row)],
            32,
        ),
        _kernel(
            "cp_async_misaligned",
            (x, out),
            [*setup, _call("cp_async_16", tile, lane * 8 + 4, x, lane * 8)],
            32,
        ),
    ]


def test_modules() -> dict[str, Module]:
    """Every kernel of these tests, by module (each module one emulator build)."""
    mma = [mma_tiles_kernel(kind, kt) for kind in (f16, bf16) for kt in (1, 3)]
    ld = [ldmatrix_kernel(num, trans) for num in (1, 2, 4) for trans in (False, True)]
    ld.append(ldmatrix_kernel(4, False, overwrite=True))
    return {
        "mma": Module("mma", tuple(mma)),
        "ldmatrix": Module("ldmatrix", tuple(ld)),
        "pipeline": Module("pipeline", (pipeline_kernel(f16), pipeline_kernel(bf16))),
        "async": Module("async", (async_copy_kernel(),)),
        "divergent": Module("divergent", tuple(divergent_kernels())),
        "misaligned": Module("misaligned", tuple(misaligned_kernels())),
    }


test_modules.__test__ = False  # a builder, not a test


class _Collectives(Visitor):
    def __init__(self):
        super().__init__()
        self.found = False

    def visit_Call(self, c: E.Call) -> None:
        self.found |= c.name in WARP_COLLECTIVE_INTRINSICS or c.name in (
            "syncthreads",
            "shfl_xor_sync",
        )
        self.visit(c.args)


def _needs_fibers(f: Function) -> bool:
    finder = _Collectives()
    finder.visit(f.body)
    return finder.found


def _param_type(v: E.Var) -> str:
    t = v.type
    return C_TYPES[t.elem.short] + "*" if isinstance(t, PointerType) else C_TYPES[t.short]


def render(module: Module) -> str:
    return CudaRenderer().render_module(module)


def build(module: Module, cache_dir: str, *, fibers: bool | None = None):
    """The module in the emulator."""
    kernels = [
        (k.name, [_param_type(p) for p in k.params], _needs_fibers(k) if fibers is None else fibers)
        for k in module.functions
    ]
    return build_emulated(render(module), kernels, cache_dir=cache_dir)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("mma_cache"))


@pytest.fixture(scope="module")
def modules():
    return test_modules()


@pytest.fixture(scope="module")
def mma_module(modules, cache_dir):
    return build(modules["mma"], cache_dir)


# ---- the layouts themselves


@pytest.mark.parametrize(
    "operand, layout, count, shape",
    [("a", a_layout, 8, (16, 16)), ("b", b_layout, 4, (16, 8)), ("c", c_layout, 4, (16, 8))],
)
def test_layouts_cover_each_element_once(operand, layout, count, shape):
    seen = np.zeros(shape, dtype=int)
    for lane in range(32):
        for i in range(count):
            row, col = layout(lane >> 2, lane % 4, i)
            seen[row, col] += 1
            assert mma_fragment(operand, lane, i) == (row, col)
    assert (seen == 1).all()
    with pytest.raises(ValueError):
        mma_fragment(operand, 0, count)


# ---- mma


def _half(kind) -> torch.dtype:
    return torch.float16 if kind == f16 else torch.bfloat16


def _run_mma(m, kind, K, A, B, C):
    D = torch.full((4, 16, 8), float("nan"))
    m.launch(f"mma_{kind.short}_k{K}", 2, 64, [A, B, C, D])
    return D


@pytest.mark.parametrize("K", [16, 48])
@pytest.mark.parametrize("kind", [f16, bf16], ids=["f16", "bf16"])
def test_mma_exact_on_small_integers(mma_module, kind, K):
    """Small integers multiply and add exactly in any order and rounding, so D must equal the
    float64 product bit for bit: any misplaced fragment element shows."""
    gen = torch.Generator().manual_seed(K)
    A = torch.randint(-8, 9, (4, 16, K), generator=gen).to(_half(kind))
    B = torch.randint(-8, 9, (4, K, 8), generator=gen).to(_half(kind))
    C = torch.randint(-100, 101, (4, 16, 8), generator=gen).float()
    D = _run_mma(mma_module, kind, K, A, B, C)
    expected = A.double() @ B.double() + C.double()
    assert torch.equal(D.double(), expected)


def _sequential_f32(A: np.ndarray, B: np.ndarray, C: np.ndarray) -> np.ndarray:
    """C + sum over k of A[:, k] * B[k, :], in float32, k in order, rounding after each step:
    the summation the emulator documents (the products are exact in float32)."""
    acc = C.astype(np.float32)
    for k in range(A.shape[-1]):
        product = A[..., :, k, None].astype(np.float32) * B[..., None, k, :].astype(np.float32)
        acc = (acc + product).astype(np.float32)
    return acc


@pytest.mark.parametrize("K", [16, 48])
@pytest.mark.parametrize("kind", [f16, bf16], ids=["f16", "bf16"])
def test_mma_random_against_float64(mma_module, kind, K):
    gen = torch.Generator().manual_seed(100 + K)
    A = torch.randn(4, 16, K, generator=gen).to(_half(kind))
    B = torch.randn(4, K, 8, generator=gen).to(_half(kind))
    C = torch.randn(4, 16, 8, generator=gen) * 4
    D = _run_mma(mma_module, kind, K, A, B, C).double()
    A64, B64, C64 = A.double(), B.double(), C.double()
    expected = A64 @ B64 + C64
    # The products are exact; the K additions each round by at most 2^-24 of a partial sum,
    # which is at most sum |terms|, so |error| <= K * 2^-24 * sum |terms|. Twice that also
    # covers hardware that truncates instead of rounding to nearest (the PTX ISA only promises
    # "at least single precision", in an unspecified order).
    magnitude = A64.abs() @ B64.abs() + C64.abs()
    bound = 2 * K * 2.0**-24 * magnitude
    assert ((D - expected).abs() <= bound).all()
    assert ((D - expected).abs() > 0).any()  # rounding happened: the bound did some work
    # The emulator's documented order, bit for bit.
    assert np.array_equal(
        D.float().numpy(), _sequential_f32(A.float().numpy(), B.float().numpy(), C.numpy())
    )


def test_mma_special_values(mma_module):
    """Subnormal f16 inputs are exact, an infinity propagates and inf * 0 gives NaN."""
    A = torch.zeros(4, 16, 16, dtype=torch.float16)
    B = torch.zeros(4, 16, 8, dtype=torch.float16)
    tiny = torch.tensor(2.0**-24, dtype=torch.float16)  # the smallest subnormal
    A[0, 3, 5] = tiny
    B[0, 5, 2] = 1024.0  # tiny * 1024 = 2^-14 exactly
    A[1, 0, 0] = float("inf")
    B[1, 0, 1] = 2.0  # row 0 col 1: inf; col 0 has B[0, 0] = 0: inf * 0 = NaN
    C = torch.zeros(4, 16, 8)
    D = _run_mma(mma_module, f16, 16, A, B, C)
    assert D[0, 3, 2] == 2.0**-14 and D[0].count_nonzero() == 1
    assert D[1, 0, 1] == float("inf") and D[1, 0, 0].isnan()
    assert torch.equal(D[2:], torch.zeros(2, 16, 8))


# ---- ldmatrix


@pytest.fixture(scope="module")
def ld_module(modules, cache_dir):
    return build(modules["ldmatrix"], cache_dir)


@pytest.mark.parametrize(
    "num, trans, suffix",
    [
        *((n, t, "_trans" if t else "") for n in (1, 2, 4) for t in (False, True)),
        (4, False, "_then_overwrite"),
    ],
)
def test_ldmatrix(ld_module, num, trans, suffix):
    gen = torch.Generator().manual_seed(7 * num + trans)
    src = torch.randint(-(2**15), 2**15, (LD_ROWS, LD_STRIDE), generator=gen, dtype=torch.int16)
    # Every lane names any row and 16-byte chunk (not a contiguous matrix); lanes past 8 * num
    # are ignored, so they name rows of their own whose values must not appear.
    rows = torch.randint(0, 32, (32,), generator=gen)
    rows[8 * num :] = 32 + torch.arange(32 - 8 * num) % 8
    chunks = torch.randint(0, 3, (32,), generator=gen)
    offs = (rows * LD_STRIDE + chunks * 8).to(torch.int32)
    out = torch.zeros(32 * 2 * num, dtype=torch.int16)
    name = f"ld_ldmatrix_x{num}{suffix}"
    ld_module.launch(name, 1, 32, [src.reshape(-1), offs, out])
    flat = src.reshape(-1).numpy()
    given = np.stack([flat[o : o + 8] for o in offs.tolist()])  # the row each lane names
    expected = ldmatrix_reference(given, num, trans)
    assert np.array_equal(out.numpy().reshape(32, 2 * num), expected)


# ---- cp.async + ldmatrix + mma, as a tensor-core matmul runs


@pytest.mark.parametrize("kind", [f16, bf16], ids=["f16", "bf16"])
def test_async_copy_ldmatrix_mma_pipeline(modules, cache_dir, kind):
    m = build(modules["pipeline"], cache_dir)
    gen = torch.Generator().manual_seed(11)
    A = torch.randn(16, 32, generator=gen).to(_half(kind))
    B = torch.randn(32, 8, generator=gen).to(_half(kind))
    C = torch.randn(16, 8, generator=gen)
    D = torch.full((16, 8), float("nan"))
    m.launch(f"pipeline_{kind.short}", 1, 32, [A, B, C, D])
    expected = _sequential_f32(A.float().numpy(), B.float().numpy(), C.numpy())
    assert np.array_equal(D.numpy(), expected)
    error = (D.double() - (A.double() @ B.double() + C.double())).abs()
    assert (error <= 2 * 32 * 2.0**-24 * (A.double().abs() @ B.double().abs() + C.abs())).all()


def test_async_copies_with_zero_fill(modules, cache_dir):
    m = build(modules["async"], cache_dir)
    gen = torch.Generator().manual_seed(3)
    src = torch.randint(1, 256, (ASYNC_BYTES,), generator=gen, dtype=torch.uint8)
    sizes = torch.tensor([16, 8, 4] * 32)
    nbytes = (torch.rand(96, generator=gen) * (sizes + 1)).floor().to(torch.int32)
    nbytes[:3] = torch.tensor([0, 0, 0])  # nothing read
    nbytes[3:6] = sizes[3:6]  # everything read
    out = torch.zeros(ASYNC_BYTES, dtype=torch.uint8)
    m.launch("async_copies", 1, 32, [src, nbytes, out])
    expected = src.clone()
    base = 896
    for k, size in enumerate((16, 8, 4)):
        for lane in range(32):
            at = base + lane * size
            expected[at + int(nbytes[lane * 3 + k]) : at + size] = 0
        base += 32 * size
    assert torch.equal(out, expected)


# ---- what PTX leaves undefined fails in the emulator


def test_mma_needs_a_full_warp(mma_module):
    A, B = torch.zeros(4, 16, 16, dtype=torch.float16), torch.zeros(4, 16, 8, dtype=torch.float16)
    C, D = torch.zeros(4, 16, 8), torch.zeros(4, 16, 8)
    with pytest.raises(EmulatorError, match="needs a full warp.*has 16 threads"):
        mma_module.launch("mma_f16_k16", 1, 48, [A, B, C, D])


@pytest.mark.parametrize(
    "name, message",
    [
        ("mma_vs_ldmatrix", r"different warp instructions \((mma.sync.m16n8k16.f16|ldmatrix.x1) "),
        ("mma_vs_shuffle", "different warp instructions.*a shuffle or __syncwarp"),
    ],
)
def test_divergent_collectives_raise(modules, cache_dir, name, message):
    m = build(modules["divergent"], cache_dir)
    with pytest.raises(EmulatorError, match=message):
        m.launch(name, 1, 32, [torch.zeros(64, dtype=torch.float16)])


def test_mma_without_fibers_is_an_error(modules, cache_dir):
    m = build(modules["divergent"], cache_dir, fibers=False)
    with pytest.raises(EmulatorError, match="without fibers"):
        m.launch("mma_only", 1, 32, [torch.zeros(64, dtype=torch.float16)])


@pytest.mark.parametrize("name", ["ldmatrix_misaligned", "cp_async_misaligned"])
def test_misaligned_addresses_raise(modules, cache_dir, name):
    m = build(modules["misaligned"], cache_dir)
    x, out = torch.zeros(512, dtype=torch.float16), torch.zeros(512, dtype=torch.float16)
    with pytest.raises(EmulatorError, match="misaligned 16-byte"):
        m.launch(name, 1, 32, [x, out])


# ---- rendering


def test_rendered_calls(modules):
    source = render(modules["pipeline"])
    assert "mc_mma_m16n8k16_f16(&acc[0], &a_frag[0], &b_frag[0], &acc[0]);" in source
    assert "mc_mma_m16n8k16_bf16(" in source
    assert re.search(r"mc_ldmatrix_x4\(&a_frag\[0\], &As\[", source)
    assert re.search(r"mc_ldmatrix_x2_trans\(&b_frag\[0\], &Bs\[", source)
    assert "mc_cp_async_wait<1>();" in source and "mc_cp_async_wait<0>();" in source
    assert "mc_cp_async_commit();" in source and "mc_cp_async_cg16(&As[" in source
    async_source = render(modules["async"])
    for helper in ("cg16", "ca8", "ca4"):
        assert f"mc_cp_async_{helper}(&buf[" in async_source
        assert f"mc_cp_async_{helper}_zfill(&buf[" in async_source
    assert "mc_cp_async_wait_all();" in async_source
    # Inline PTX only inside the header's functions (mma.h's, device.h's conversions).
    assert "asm" not in source.replace(device_header(), "")


def _render_call(name, *args):
    body = S.Evaluate(E.Call(name, tuple(args), i32))
    return CudaRenderer().render_module(Module("m", (Function("k", (), body),)))


def test_bad_operands_are_refused():
    a16, b16 = _ptr("a", f16, "local"), _ptr("b", f16, "local")
    abf = _ptr("abf", bf16, "local")
    acc, acc16 = _ptr("acc", f32, "local"), _ptr("acc16", f16, "local")
    g16, s16, s32 = _ptr("g", f16), _ptr("s", f16, "shared"), _ptr("s32", f32, "shared")
    zero = E.const(0, i32)
    bad = [
        ("mma_sync_m16n8k16", (acc, zero, a16, zero, abf, zero, acc, zero), "f16 by f16"),
        ("mma_sync_m16n8k16", (acc16, zero, a16, zero, b16, zero, acc, zero), "f32 arrays"),
        ("mma_sync_m16n8k16", (acc, zero, a16, zero, b16, zero, acc), "takes"),
        ("ldmatrix_x4", (a16, zero, g16, zero), "shared memory"),
        ("ldmatrix_x4", (acc, zero, s32, zero), "16-bit"),
        ("ldmatrix_x2_trans", (abf, zero, s16, zero), "from f16 to bf16"),
        ("cp_async_16", (g16, zero, s16, zero), "shared memory"),
        ("cp_async_8", (s16, zero, a16, zero), "global memory"),
        ("cp_async_4", (s32, zero, g16, zero), "from f16 to f32"),
        ("cp_async_wait", (E.Var("n", i32),), "constant count"),
        ("cp_async_wait", (E.const(-1, i32),), "of -1 groups"),
        ("cp_async_commit", (zero,), "no arguments"),
    ]
    for name, args, message in bad:
        with pytest.raises(ValueError, match=message):
            _render_call(name, *args)
    assert "mc_mma_m16n8k16_bf16(&acc[0], &abf[0], &abf[0], &acc[0])" in _render_call(
        "mma_sync_m16n8k16", acc, zero, abf, zero, abf, zero, acc, zero
    )


def test_every_intrinsic_and_helper_is_exercised(modules):
    """Each intrinsic renders, and the test kernels call every helper of mma.h, so the emulator
    builds above prove emu_mma.h defines them all."""
    for name in MMA_INTRINSICS:
        assert callable(getattr(CudaRenderer, f"intrinsic_{name}", None)), name
    with open(HEADER_PATH, encoding="utf-8") as f:
        device = f.read()
    helpers = set(re.findall(r"MC_DEVICE \w+ (mc_\w+)\(", device))
    helpers |= {f"mc_ldmatrix_x{n}{s}" for n in (1, 2, 4) for s in ("", "_trans")}
    helpers |= {f"mc_cp_async_{h}{z}" for h in ("ca4", "ca8", "cg16") for z in ("", "_zfill")}
    helpers |= {"mc_mma_m16n8k16_f16", "mc_mma_m16n8k16_bf16", "mc_cp_async_wait"}
    helpers -= {"mc_pack_u16x2", "mc_unpack_u16x2", "mc_shared_address"}
    # The 8-bit integer helpers' kernels are tests/script/test_script_mma_int8.py's.
    helpers -= {"mc_pack_u8x4", "mc_unpack_u8x4"}
    kernels = "".join(render(m).replace(inline_includes(HEADER_PATH), "") for m in modules.values())
    for helper in sorted(helpers):
        assert re.search(rf"\b{helper}\b", kernels), helper


# ---- NVRTC


def _nvrtc():
    from minicomp.backends.cuda import nvrtc

    try:
        nvrtc.nvrtc_version()
    except nvrtc.NvrtcUnavailableError as err:  # pragma: no cover - depends on the machine
        pytest.skip(f"NVRTC unavailable: {err}")
    return nvrtc


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_every_kernel_compiles_with_nvrtc(modules, arch, tmp_path):
    nvrtc = _nvrtc()
    for name, module in modules.items():
        binary = nvrtc.compile_cuda(render(module), arch=arch, name=name, cache_dir=str(tmp_path))
        assert binary.cubin[:4] == b"\x7fELF"
        assert sorted(binary.resources) == sorted(f.name for f in module.functions)
        for kernel, usage in binary.resources.items():
            assert usage.registers > 0, (kernel, binary.log)
            assert usage.spill_stores == 0 and usage.spill_loads == 0, (kernel, usage)
        lowered = binary.log.lower()
        assert "error" not in lowered and "warning" not in lowered, binary.log
        for instruction in ("mma.sync", "ldmatrix.sync", "cp.async"):
            assert instruction not in lowered, binary.log


def test_older_architectures_have_no_mma(modules, tmp_path):
    """Below sm_80 the helpers are not defined, so a kernel using one fails to compile."""
    nvrtc = _nvrtc()
    from minicomp.backends.errors import CompileError

    if "sm_75" not in nvrtc.supported_archs():
        pytest.skip("this NVRTC cannot target sm_75")
    with pytest.raises(CompileError, match="mc_mma_m16n8k16_f16"):
        nvrtc.compile_cuda(render(modules["mma"]), arch="sm_75", cache_dir=str(tmp_path))


def test_emulator_finds_the_warp_collectives(modules, cache_dir):
    """Kernels passed as IR get fibers for mma and ldmatrix."""
    assert WARP_COLLECTIVE_INTRINSICS == {
        "mma_sync_m16n8k16",
        "mma_sync_m16n8k32",
        *(f"ldmatrix_x{n}{s}" for n in (1, 2, 4) for s in ("", "_trans")),
    }
    kernel = modules["divergent"].function("mma_only")
    m = build_emulated(render(Module("m", (kernel,))), [kernel], cache_dir=cache_dir)
    assert m.specs["mma_only"].sync
