"""A tensor-core matmul template: f16 or bf16 operands, f32 accumulation, mma.sync m16n8k16.

A block computes a BM x BN tile of C (one batch at a time, batches along gridDim.z) with
(BM / WM) x (BN / WN) warps, each owning a WM x WN part as (WM / 16) x (WN / 8) mma tiles of
f32 accumulators in registers. K advances by BK through STAGES shared buffers: the copy of
step t + STAGES - 1 is in flight while step t computes (one cp.async commit group a step, so
waiting until STAGES - 2 groups are pending leaves step t in shared memory):

    for s < STAGES - 1: issue(s); commit
    for t in steps:
        wait(STAGES - 2); sync
        issue(t + STAGES - 1)     # into the buffer step t - 1 used: every thread is past it
        compute(t)                # ldmatrix fragments, mma
        commit

Each operand is staged in the layout its memory has: "k" (rows of M / N, each a run of BK
elements of K) or "mn" (rows of K); the fragments come from either with ldmatrix, or its
.trans variant. Rows are padded by 16 bytes, which keeps them 16-byte aligned and spreads the
eight rows an ldmatrix reads over all banks. An operand reaches shared memory one of two
ways:

- async: a plain strided read of an input (problem.PlainOperand): 16-byte cp.async copies,
  zero-filled past the matrix's edge. They need 16-byte aligned sources: the leading stride
  a multiple of 8 elements (checked at compile time when static) and the batch's base address
  aligned, checked at run time once per batch (a uniform flag); where it fails, the block
  loads the same elements synchronously through the prologue macro.
- regs: anything else (a fused prologue, or a leading stride that is not a multiple of 8): the
  prologue macro loads the step's elements into registers before the mma's, and they are
  stored to shared memory after them, in the operand's narrow type.

The epilogue goes through shared memory: each warp stages 16 rows of its tile at a time (f32)
and its lanes apply the epilogue macro along the rows, so that stores are coalesced and the
epilogue's code exists WM / 16 times, not once per accumulator (ptxas time). Stores are
guarded where the tiling has partial tiles. Shared memory is dynamic (all of it one after
the other: stages, then the staging rows), up to MAX_SHARED.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from minicomp.backends.cuda.arch import PORTABLE
from minicomp.ir import types as T
from minicomp.ir.func import Function
from minicomp.schedule.templates.base import Template
from minicomp.schedule.templates.matmul_simt import pick_tile
from minicomp.schedule.templates.problem import (
    GROUP_M,
    MatmulProblem,
    ceil_div,
    launch_grid,
    needs_check,
)
from minicomp.script import (
    attrs,
    blockIdx,
    cp_async,
    cp_async_commit,
    cp_async_wait,
    cp_async_wait_all,
    dynamic_shared_tensor,
    f32,
    gridDim,
    i32,
    i64,
    is_aligned,
    ldmatrix_x2,
    ldmatrix_x2_trans,
    ldmatrix_x4,
    ldmatrix_x4_trans,
    mma_sync_m16n8k16,
    register_tensor,
    script,
    syncthreads,
    threadIdx,
    unroll,
)

NAME = "matmul_tc"
# The most dynamic shared memory a config may take: what every GPU of the limits table lets a
# block have (99 KiB on sm_86 and sm_89; a kernel does not know which GPU it will run on).
MAX_SHARED = PORTABLE.shared_per_block_optin
# Elements of padding after each shared row (16 bytes of f16/bf16), and of the f32 rows the
# epilogue stages.
PAD = 8
CPAD = 4
# 16-byte chunks hold 8 elements.
CHUNK = 8
MMA_TYPES = (T.f16, T.bf16)


@dataclass(frozen=True)
class TcConfig:
    """Block tile bm x bn x bk, warp tile wm x wn, `stages` shared buffers."""

    bm: int
    bn: int
    bk: int
    wm: int
    wn: int
    stages: int

    @property
    def warps(self) -> int:
        return (self.bm // self.wm) * (self.bn // self.wn)

    @property
    def threads(self) -> int:
        return 32 * self.warps

    def __str__(self) -> str:
        return f"{self.bm}x{self.bn}x{self.bk}_w{self.wm}x{self.wn}_s{self.stages}"


@dataclass(frozen=True)
class _Operand:
    """How one operand reaches shared memory: mode "async" or "regs", and its layout."""

    mode: str
    layout: str


def _operand(problem: MatmulProblem, side: str) -> _Operand:
    plain = problem.plain_a if side == "a" else problem.plain_b
    major = problem.a_major if side == "a" else problem.b_major
    if plain is not None and plain.ld_multiple_of(CHUNK) is not False:
        return _Operand("async", plain.contiguous)
    return _Operand("regs", major)


def _tile_elems(rows: int, bk: int, layout: str) -> int:
    """Shared elements of one stage of an operand tile of `rows` x bk."""
    return rows * (bk + PAD) if layout == "k" else bk * (rows + PAD)


def shared_bytes(problem: MatmulProblem, cfg: TcConfig) -> int:
    a, b = _operand(problem, "a"), _operand(problem, "b")
    elems = _tile_elems(cfg.bm, cfg.bk, a.layout) + _tile_elems(cfg.bn, cfg.bk, b.layout)
    staging = cfg.warps * 16 * (cfg.wn + CPAD) * 4
    return cfg.stages * elems * 2 + staging


def valid(problem: MatmulProblem, cfg: TcConfig) -> bool:
    """Whether `cfg` is a consistent tiling within the block limits."""
    if cfg.bm % cfg.wm or cfg.bn % cfg.wn or cfg.wm % 16 or cfg.wn % 8 or cfg.bk % 16:
        return False
    if not 2 <= cfg.stages <= 5 or not 1 <= cfg.warps <= 8:
        return False
    if cfg.wm * cfg.wn // 32 > 64:  # f32 accumulators a thread holds (more spill)
        return False
    for rows in (cfg.bm, cfg.bn):
        if rows * cfg.bk // CHUNK < cfg.threads:  # every thread copies at least a chunk
            return False
    return shared_bytes(problem, cfg) <= MAX_SHARED


_LEVEL1 = (
    TcConfig(128, 128, 32, 64, 32, 3),
    TcConfig(128, 64, 32, 64, 32, 3),
    TcConfig(64, 128, 32, 32, 32, 3),
    TcConfig(64, 64, 32, 32, 32, 4),
    TcConfig(32, 64, 32, 16, 32, 4),
    TcConfig(32, 32, 32, 16, 32, 3),
)


def space(problem: MatmulProblem, level: int) -> list[TcConfig]:
    """The configs to try: level 1 a handful, level 2 every valid tiling of a grid of
    choices (level 0: the heuristic's alone)."""
    if level <= 0:
        return [heuristic(problem)]
    configs = [c for c in _LEVEL1 if valid(problem, c)]
    if level >= 2:
        tiles, warp_m, warp_n = (32, 64, 128, 256), (16, 32, 64), (8, 16, 32, 64)
        grid = itertools.product(tiles, tiles, (16, 32, 64), warp_m, warp_n, (2, 3, 4))
        configs += [c for c in (TcConfig(*p) for p in grid) if valid(problem, c)]
    return list(dict.fromkeys(configs))


def heuristic(problem: MatmulProblem) -> TcConfig:
    """The config used without measuring: 128x128x32 tiles of four 64x64 warps for large
    problems, smaller tiles when M or N is small or there would be too few blocks."""
    by_tile = {(c.bm, c.bn): c for c in reversed(space(problem, 1))}
    tiles = sorted(by_tile, key=lambda t: -t[0] * t[1])
    return by_tile[pick_tile(problem, tiles)]


def applies(problem: MatmulProblem) -> bool:
    """f16 x f16 or bf16 x bf16 operands accumulated in f32."""
    return (
        problem.acc_dtype == T.f32
        and problem.a_dtype == problem.b_dtype
        and problem.a_dtype in MMA_TYPES
    )


def instantiate(problem: MatmulProblem, cfg: TcConfig) -> Function:
    """The kernel computing `problem` with tiling `cfg` (named after the fused group)."""
    BM, BN, BK, WM, WN, STAGES = cfg.bm, cfg.bn, cfg.bk, cfg.wm, cfg.wn, cfg.stages
    dt = problem.a_dtype
    WARPS_N = BN // WN
    WARPS = cfg.warps
    THREADS = cfg.threads
    MI, NI = WM // 16, WN // 8
    oa, ob = _operand(problem, "a"), _operand(problem, "b")
    A_ASYNC, B_ASYNC = oa.mode == "async", ob.mode == "async"
    A_K, B_K = oa.layout == "k", ob.layout == "k"
    A_SHAPE = (STAGES, BM, BK + PAD) if A_K else (STAGES, BK, BM + PAD)
    B_SHAPE = (STAGES, BN, BK + PAD) if B_K else (STAGES, BK, BN + PAD)
    # 16-byte chunks of a stage, per thread; chunks per shared row.
    A_CH, B_CH = BM * BK // CHUNK, BN * BK // CHUNK
    A_ITERS, B_ITERS = -(-A_CH // THREADS), -(-B_CH // THREADS)
    A_EXACT, B_EXACT = A_CH % THREADS == 0, B_CH % THREADS == 0
    A_ROW = BK // CHUNK if A_K else BM // CHUNK
    B_ROW = BK // CHUNK if B_K else BN // CHUNK
    M, N, K, B = problem.m, problem.n, problem.k, problem.batch
    TILES_M, TILES_N = ceil_div(M, BM), ceil_div(N, BN)
    STEPS = ceil_div(K, BK)
    GROUP = GROUP_M
    GRID = launch_grid(problem, BM, BN)
    check_m, check_n, check_k = needs_check(M, BM), needs_check(N, BN), needs_check(K, BK)
    A_ZFILL, B_ZFILL = check_m or check_k, check_n or check_k
    load_a = problem.load_a(narrow=True, check_m=check_m, check_k=check_k)
    load_b = problem.load_b(narrow=True, check_k=check_k, check_n=check_n)
    store_c = problem.store_c(check_m=check_m, check_n=check_n)
    pa, pb = problem.plain_a, problem.plain_b
    A_G = pa.ref if A_ASYNC else None
    B_G = pb.ref if B_ASYNC else None
    LDA = pa.ld if A_ASYNC else 0
    LDB = pb.ld if B_ASYNC else 0
    a_base = pa.batch_offset_macro() if A_ASYNC else None
    b_base = pb.batch_offset_macro() if B_ASYNC else None

    @script(params=problem.params)
    def matmul_tc():
        attrs.grid_dim = GRID
        attrs.block_dim = THREADS
        tid = threadIdx.x
        lane = tid % 32
        warp_m = tid // 32 // WARPS_N * WM
        warp_n = tid // 32 % WARPS_N * WN
        pid = i64(blockIdx.x)
        # (max(.., 1): an empty C has no tiles, and the one block stores nothing)
        width = GROUP * max(TILES_N, 1)
        first = pid // width * GROUP
        rows = max(min(TILES_M - first, GROUP), 1)
        m0 = (first + pid % width % rows) * BM
        n0 = pid % width // rows * BN
        a_s = dynamic_shared_tensor(dt, A_SHAPE)
        b_s = dynamic_shared_tensor(dt, B_SHAPE)
        c_s = dynamic_shared_tensor(f32, (WARPS, 16, WN + CPAD))
        a_frag = register_tensor(dt, (MI, 8))
        b_frag = register_tensor(dt, (NI, 4))
        acc = register_tensor(f32, (MI, NI, 4))
        if not A_ASYNC:
            a_r = register_tensor(dt, (A_ITERS, CHUNK))
        if not B_ASYNC:
            b_r = register_tensor(dt, (B_ITERS, CHUNK))
        bz = i64(blockIdx.z)
        while bz < B:
            if A_ASYNC:
                a_off = a_base(bz)
                a_fast = is_aligned(A_G[a_off], 16) and LDA % CHUNK == 0
            if B_ASYNC:
                b_off = b_base(bz)
                b_fast = is_aligned(B_G[b_off], 16) and LDB % CHUNK == 0
            for i in unroll(range(MI)):
                for j in unroll(range(NI)):
                    for e in unroll(range(4)):
                        acc[i, j, e] = 0.0
            # Iteration `it` issues step `it` into buffer it % STAGES (which step it - STAGES,
            # computed one iteration earlier, used) and computes step it - (STAGES - 1).
            for it in range(STEPS + STAGES - 1):
                cp_async_wait(STAGES - 2)
                syncthreads()
                st = it % STAGES
                if it < STEPS:
                    k0 = it * BK
                    for q in unroll(range(A_ITERS)):
                        c = q * THREADS + tid
                        if A_EXACT or c < A_CH:
                            r = c // A_ROW
                            x = c % A_ROW * CHUNK
                            if A_ASYNC and A_K:
                                if a_fast:
                                    gm = m0 + r
                                    gk = k0 + x
                                    if A_ZFILL:
                                        n_ok = i32(max(min(K - gk, CHUNK), 0) if gm < M else 0)
                                        src = a_off + gm * LDA + gk if n_ok > 0 else a_off
                                        cp_async(a_s[st, r, x], A_G[src], 16, n_ok * 2)
                                    else:
                                        cp_async(a_s[st, r, x], A_G[a_off + gm * LDA + gk], 16)
                                else:
                                    for v in unroll(range(CHUNK)):
                                        a_s[st, r, x + v] = load_a(bz, m0 + r, k0 + x + v)
                            elif A_ASYNC:
                                if a_fast:
                                    gm = m0 + x
                                    gk = k0 + r
                                    if A_ZFILL:
                                        n_ok = i32(max(min(M - gm, CHUNK), 0) if gk < K else 0)
                                        src = a_off + gk * LDA + gm if n_ok > 0 else a_off
                                        cp_async(a_s[st, r, x], A_G[src], 16, n_ok * 2)
                                    else:
                                        cp_async(a_s[st, r, x], A_G[a_off + gk * LDA + gm], 16)
                                else:
                                    for v in unroll(range(CHUNK)):
                                        a_s[st, r, x + v] = load_a(bz, m0 + x + v, k0 + r)
                            elif A_K:
                                for v in unroll(range(CHUNK)):
                                    a_r[q, v] = load_a(bz, m0 + r, k0 + x + v)
                            else:
                                for v in unroll(range(CHUNK)):
                                    a_r[q, v] = load_a(bz, m0 + x + v, k0 + r)
                    for q in unroll(range(B_ITERS)):
                        c = q * THREADS + tid
                        if B_EXACT or c < B_CH:
                            r = c // B_ROW
                            x = c % B_ROW * CHUNK
                            if B_ASYNC and B_K:
                                if b_fast:
                                    gn = n0 + r
                                    gk = k0 + x
                                    if B_ZFILL:
                                        n_ok = i32(max(min(K - gk, CHUNK), 0) if gn < N else 0)
                                        src = b_off + gn * LDB + gk if n_ok > 0 else b_off
                                        cp_async(b_s[st, r, x], B_G[src], 16, n_ok * 2)
                                    else:
                                        cp_async(b_s[st, r, x], B_G[b_off + gn * LDB + gk], 16)
                                else:
                                    for v in unroll(range(CHUNK)):
                                        b_s[st, r, x + v] = load_b(bz, k0 + x + v, n0 + r)
                            elif B_ASYNC:
                                if b_fast:
                                    gn = n0 + x
                                    gk = k0 + r
                                    if B_ZFILL:
                                        n_ok = i32(max(min(N - gn, CHUNK), 0) if gk < K else 0)
                                        src = b_off + gk * LDB + gn if n_ok > 0 else b_off
                                        cp_async(b_s[st, r, x], B_G[src], 16, n_ok * 2)
                                    else:
                                        cp_async(b_s[st, r, x], B_G[b_off + gk * LDB + gn], 16)
                                else:
                                    for v in unroll(range(CHUNK)):
                                        b_s[st, r, x + v] = load_b(bz, k0 + r, n0 + x + v)
                            elif B_K:
                                for v in unroll(range(CHUNK)):
                                    b_r[q, v] = load_b(bz, k0 + x + v, n0 + r)
                            else:
                                for v in unroll(range(CHUNK)):
                                    b_r[q, v] = load_b(bz, k0 + r, n0 + x + v)
                if it >= STAGES - 1:
                    ld = (it + 1) % STAGES
                    for kk in unroll(range(0, BK, 16)):
                        for i in unroll(range(MI)):
                            if A_K:
                                # Lanes 0-15 name rows 0-15 at k, lanes 16-31 the same at k + 8.
                                row = warp_m + i * 16 + lane % 16
                                ldmatrix_x4(a_frag[i], a_s[ld, row, kk + lane // 16 * 8])
                            else:
                                # Rows of K: matrix j (lanes 8j..) is rows k + j // 2 * 8 at
                                # column m + j % 2 * 8.
                                kr = kk + lane % 8 + lane // 16 * 8
                                col = warp_m + i * 16 + lane // 8 % 2 * 8
                                ldmatrix_x4_trans(a_frag[i], a_s[ld, kr, col])
                        if NI % 2 == 0:
                            for j in unroll(range(0, NI, 2)):
                                # Two n-tiles at once: lanes 16-31 name the next 8 columns.
                                if B_K:
                                    row = warp_n + j * 8 + lane // 16 * 8 + lane % 8
                                    kc = kk + lane // 8 % 2 * 8
                                    ldmatrix_x4(b_frag[j, 0], b_s[ld, row, kc])
                                else:
                                    col = warp_n + j * 8 + lane // 16 * 8
                                    ldmatrix_x4_trans(b_frag[j, 0], b_s[ld, kk + lane % 16, col])
                        else:
                            for j in unroll(range(NI)):
                                if B_K:
                                    row = warp_n + j * 8 + lane % 8
                                    kc = kk + lane // 8 % 2 * 8
                                    ldmatrix_x2(b_frag[j], b_s[ld, row, kc])
                                else:
                                    col = warp_n + j * 8
                                    ldmatrix_x2_trans(b_frag[j], b_s[ld, kk + lane % 16, col])
                        for i in unroll(range(MI)):
                            for j in unroll(range(NI)):
                                mma_sync_m16n8k16(acc[i, j], a_frag[i], b_frag[j], acc[i, j])
                if it < STEPS:
                    for q in unroll(range(A_ITERS)):
                        c = q * THREADS + tid
                        if not A_ASYNC and (A_EXACT or c < A_CH):
                            r = c // A_ROW
                            x = c % A_ROW * CHUNK
                            for v in unroll(range(CHUNK)):
                                a_s[st, r, x + v] = a_r[q, v]
                    for q in unroll(range(B_ITERS)):
                        c = q * THREADS + tid
                        if not B_ASYNC and (B_EXACT or c < B_CH):
                            r = c // B_ROW
                            x = c % B_ROW * CHUNK
                            for v in unroll(range(CHUNK)):
                                b_s[st, r, x + v] = b_r[q, v]
                cp_async_commit()
            # The next batch writes the buffers again.
            cp_async_wait_all()
            syncthreads()
            # Epilogue: a warp stages 16 rows of its tile at a time in shared memory, then
            # its lanes store them along the rows (coalesced), one element an iteration.
            g = lane // 4
            tq = lane % 4
            wid = tid // 32
            for i in unroll(range(MI)):
                for j in unroll(range(NI)):
                    for e in unroll(range(4)):
                        c_s[wid, g + e // 2 * 8, j * 8 + tq * 2 + e % 2] = acc[i, j, e]
                syncthreads()
                for idx in range(lane, 16 * WN, 32):
                    er = idx // WN
                    ec = idx % WN
                    store_c(bz, m0 + warp_m + i * 16 + er, n0 + warp_n + ec, c_s[wid, er, ec])
                syncthreads()
            bz += gridDim.z

    kernel = matmul_tc.ir
    launch = kernel.attrs.replace(template=f"{NAME}[{cfg}]")
    return kernel.replace(name=problem.name, attrs=launch)


TEMPLATE = Template(NAME, space, heuristic, instantiate, applies)
