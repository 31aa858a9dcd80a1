"""A register-tiled SIMT matmul template (f32, f64 or i32 accumulation, CUDA cores).

A block computes a BM x BN tile of C (one batch at a time, batches along gridDim.z), stepping
over K by BK. Each step the block's threads cooperatively load the A tile (BM x BK) and the B
tile (BK x BN) through the prologue macros into registers, store them to one of two shared
buffers (A transposed, so that both are read along M / N), and, after one barrier, compute
from it while the next step's loads are in flight:

    regs <- tile 0
    for t in steps:  smem[t % 2] <- regs; sync; regs <- tile t + 1; compute smem[t % 2]

One barrier a step is enough: buffer t % 2 is written again at step t + 2, after every thread
passed the barrier of step t + 1, hence finished computing step t.

A thread owns a TM x TN sub-tile of C in registers, as groups of V consecutive rows (columns)
V * (BM / TM) apart, so that the shared reads of a warp are 16-byte vectors without bank
conflicts; the shared rows are padded by one vector so that the transposing stores of A do not
conflict either. The cooperative loads are register copies of one-element chunks
(problem.register_copy, tiles.py), their thread mapping following the operand's contiguous
dimension in memory (consecutive threads read consecutive addresses). The epilogue macro stores
each accumulator, guarded where the tiling has partial tiles. Tiles are rasterised in groups of
GROUP_M rows of tiles, so that blocks running together share their A and B tiles in L2.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from minicomp.backends.cuda.arch import PORTABLE
from minicomp.ir import types as T
from minicomp.ir.expr import Dim, Select
from minicomp.ir.func import Function
from minicomp.ir.functor import collect
from minicomp.schedule.templates.base import Template, finish, search_space
from minicomp.schedule.templates.problem import (
    BlockTile,
    MatmulProblem,
    RegisterCopy,
    ceil_div,
    grouped_tiles,
    launch_grid,
    needs_check,
    register_copy,
)
from minicomp.schedule.templates.tiles import Names
from minicomp.script.function import script
from minicomp.script.lang import (
    attrs,
    blockIdx,
    gridDim,
    register_tensor,
    shared_tensor,
    syncthreads,
    threadIdx,
    unroll,
)
from minicomp.script.types import i64, u32

# Static shared memory a block may have (without opting in; every GPU of the table).
MAX_SHARED = PORTABLE.shared_per_block
# Loads per thread per K step the heuristic allows when operands are guarded (see heuristic).
GUARDED_LOADS = 6


@dataclass(frozen=True)
class SimtConfig(BlockTile):
    """Block tile bm x bn x bk, thread tile tm x tn."""

    tm: int
    tn: int

    @property
    def threads(self) -> int:
        return self.parts(self.tm, self.tn)

    def __str__(self) -> str:
        return f"{BlockTile.__str__(self)}_t{self.tm}x{self.tn}"


def _vector(problem: MatmulProblem) -> int:
    """Elements in a 16-byte shared-memory vector of the accumulator type."""
    return max(1, 16 // problem.acc_dtype.nbytes)


def valid(problem: MatmulProblem, cfg: SimtConfig) -> bool:
    """Whether `cfg` is a consistent tiling for `problem`'s types."""
    if cfg.bm % cfg.tm or cfg.bn % cfg.tn:
        return False
    threads = cfg.threads
    if threads % 32 or not 64 <= threads <= 512:
        return False
    if (cfg.bm * cfg.bk) % threads or (cfg.bk * cfg.bn) % threads:
        return False
    v = _vector(problem)
    if cfg.tm % min(v, cfg.tm) or cfg.tn % min(v, cfg.tn):  # whole vectors, or one short one
        return False
    smem = 2 * cfg.bk * (cfg.bm + cfg.bn + 2 * v) * problem.acc_dtype.nbytes
    regs = cfg.tm * cfg.tn * problem.acc_dtype.nbytes // 4
    return smem <= MAX_SHARED and regs <= 64


_F32_LEVEL1 = (
    SimtConfig(128, 128, 8, 8, 8),
    SimtConfig(128, 64, 8, 8, 4),
    SimtConfig(64, 128, 8, 4, 8),
    SimtConfig(64, 64, 8, 4, 4),
    SimtConfig(32, 64, 16, 4, 4),
    SimtConfig(32, 32, 16, 4, 4),
)
_F64_LEVEL1 = (
    SimtConfig(128, 64, 8, 8, 4),
    SimtConfig(64, 64, 8, 4, 4),
    SimtConfig(32, 64, 16, 4, 4),
    SimtConfig(32, 32, 16, 4, 4),
)
# Smaller steps for guarded operands, whose loads each keep index arithmetic live.
_GUARDED_LEVEL1 = (
    SimtConfig(128, 32, 8, 4, 4),
    SimtConfig(64, 32, 8, 4, 4),
    SimtConfig(32, 64, 8, 4, 4),
    SimtConfig(32, 32, 8, 2, 4),
)


def space(problem: MatmulProblem, level: int) -> list[SimtConfig]:
    """The configs to try: level 1 a handful, level 2 every valid tiling of a grid of
    choices (level 0: the heuristic's alone). Guarded operands keep to what fits_guarded
    allows."""
    guarded = _guarded(problem)
    first = _F64_LEVEL1 if problem.acc_dtype.nbytes == 8 else _F32_LEVEL1
    if guarded:
        first += _GUARDED_LEVEL1
    grid = itertools.product((32, 64, 128), (32, 64, 128), (8, 16, 32), (2, 4, 8), (2, 4, 8))
    configs = search_space(problem, level, heuristic, valid, first, SimtConfig, grid)
    if guarded and level > 0:
        configs = [c for c in configs if fits_guarded(c)] or configs
    return configs


def fits_guarded(cfg: SimtConfig) -> bool:
    """Whether `cfg` suits guarded operands (a convolution's window, which clamps and selects
    at every load): each prefetched element's index arithmetic stays live beside the
    accumulators, and with 8x8 per thread, or 12 and more loads per thread per step, the
    kernel runs out of registers and spills (NVRTC, sm_80/sm_90). So at most 32 accumulators
    and GUARDED_LOADS loads."""
    return cfg.tm * cfg.tn <= 32 and (cfg.bm + cfg.bn) * cfg.bk <= GUARDED_LOADS * cfg.threads


def _assumed(d: Dim) -> int:
    """A size for the heuristic's arithmetic: symbolic sizes count as large."""
    return d if isinstance(d, int) else 4096


def blocks(problem: MatmulProblem, bm: int, bn: int) -> int:
    """Blocks a bm x bn tiling launches (symbolic sizes taken as large)."""
    b, m, n = (_assumed(d) for d in (problem.batch, problem.m, problem.n))
    return b * -(-m // bm) * -(-n // bn)


def assumed_sizes(problem: MatmulProblem) -> tuple[int, int, int]:
    """(batch, M, N) of `problem` for the heuristics' arithmetic (symbolic sizes as large)."""
    return _assumed(problem.batch), _assumed(problem.m), _assumed(problem.n)


def fitting_tiles(problem: MatmulProblem, tiles: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Those of (bm, bn) `tiles` that fit `problem`'s matrix (`fitting_sizes`)."""
    return fitting_sizes(_assumed(problem.m), _assumed(problem.n), tiles)


def fitting_sizes(m: int, n: int, tiles: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Those of (bm, bn) `tiles` that pad an m x n matrix at most a third (256-row tiles on 128
    rows compute as much padding as product), or no more than the smallest tiles do (the
    smallest if none)."""
    least_m, least_n = min(t[0] for t in tiles), min(t[1] for t in tiles)

    def padded(size: int, tile: int) -> int:
        return -(-size // tile) * tile

    def fits(size: int, tile: int, least: int) -> bool:
        return padded(size, tile) <= max(4 * size / 3, padded(size, least))

    fitting = [(bm, bn) for bm, bn in tiles if fits(m, bm, least_m) and fits(n, bn, least_n)]
    return fitting or tiles[-1:]


def pick_tile(problem: MatmulProblem, tiles: list[tuple[int, int]]) -> tuple[int, int]:
    """Of (bm, bn) tiles ordered largest first: the first fitting one (`fitting_tiles`) that
    launches a block for each of the GPU's SMs (`problem.sms`); else the one launching the
    most blocks."""
    fitting = fitting_tiles(problem, tiles)
    for bm, bn in fitting:
        if blocks(problem, bm, bn) >= problem.sms:
            return bm, bn
    return max(fitting, key=lambda t: (blocks(problem, *t), -t[0] * t[1]))


def heuristic(problem: MatmulProblem) -> SimtConfig:
    """The config used without measuring: 128x128x8 tiles with 8x8 per thread for large
    problems, smaller tiles when M or N is small or there would be too few blocks (of the
    level-1 space, so guarded operands get what fits_guarded allows)."""
    configs = space(problem, 1)
    by_tile = {(c.bm, c.bn): c for c in reversed(configs)}
    tiles = sorted(by_tile, key=lambda t: -t[0] * t[1])
    return by_tile[pick_tile(problem, tiles)]


def _guarded(problem: MatmulProblem) -> bool:
    """Whether an operand's loads are guarded (a Select: padding, a clamped window)."""
    c = problem.contraction
    return bool(collect(c.a, Select) or collect(c.b, Select))


def instantiate(problem: MatmulProblem, cfg: SimtConfig) -> Function:
    """The kernel computing `problem` with tiling `cfg` (named after the fused group)."""
    names = Names()
    threads = cfg.threads
    a = register_copy(problem, "a", cfg.bm, cfg.bk, threads, names, width=1, rows_of_k=True)
    b = register_copy(problem, "b", cfg.bn, cfg.bk, threads, names, width=1, rows_of_k=True)
    kernel = _kernel(problem, cfg, a, b)
    template = f"{NAME}[{cfg}]"
    if _guarded(problem):
        # Guarded loads leave ptxas near an occupancy step, where it spills (4-12 bytes at
        # 80-168 registers on sm_80) rather than give up a block per SM; one block is enough.
        return finish(kernel, problem.name, template, min_blocks=1)
    return finish(kernel, problem.name, template)


def _kernel(problem: MatmulProblem, cfg: SimtConfig, a: RegisterCopy, b: RegisterCopy):
    """The script kernel: the K loop over the operands' register copies (two shared buffers),
    each thread's TM x TN outer products, the epilogue (see the module doc)."""
    BM, BN, BK, TM, TN = cfg.bm, cfg.bn, cfg.bk, cfg.tm, cfg.tn
    dt = problem.acc_dtype
    # i32 products (8-bit integers: _int_mm) multiply and sum in u32: unsigned arithmetic
    # wraps modulo 2^32 by C's definition, as eager's int32 does, where a signed overflow is
    # undefined behaviour. The epilogue gets the sum back as i32, the same bits.
    WRAP = dt == T.i32
    sum_dt = T.u32 if WRAP else dt
    V = _vector(problem)
    VM, VN = min(V, TM), min(V, TN)
    TX, TY = BN // TN, BM // TM
    THREADS = TX * TY
    SM, SN = TY * VM, TX * VN  # distance between a thread's row (column) groups
    PAD = V
    M, N, K, B = problem.m, problem.n, problem.k, problem.batch
    row0, col0 = grouped_tiles(problem, BM, BN)
    STEPS = ceil_div(K, BK)
    GRID = launch_grid(problem, BM, BN)
    store_c = problem.store_c(check_m=needs_check(M, BM), check_n=needs_check(N, BN))
    A_REGS, B_REGS = a.regs, b.regs
    load_a, load_b, store_a, store_b = a.load, b.load, a.store, b.store

    @script(params=problem.params)
    def matmul_simt():
        attrs.grid_dim = GRID
        attrs.block_dim = THREADS
        tid = threadIdx.x
        ty = tid // TX
        tx = tid % TX
        pid = i64(blockIdx.x)
        m0 = row0(pid)
        n0 = col0(pid)
        a_s = shared_tensor(dt, (2, BK, BM + PAD))
        b_s = shared_tensor(dt, (2, BK, BN + PAD))
        a_r = register_tensor(dt, A_REGS)
        b_r = register_tensor(dt, B_REGS)
        a_f = register_tensor(dt, (TM,))
        b_f = register_tensor(dt, (TN,))
        acc = register_tensor(sum_dt, (TM, TN))
        bz = i64(blockIdx.z)
        while bz < B:
            for i in unroll(range(TM)):
                for j in unroll(range(TN)):
                    acc[i, j] = 0
            # Registers <- tile 0.
            load_a(a_r, bz, m0, 0)
            load_b(b_r, bz, n0, 0)
            for t in range(STEPS):
                buf = t % 2
                store_a(a_r, a_s[buf])
                store_b(b_r, b_s[buf])
                syncthreads()
                if t + 1 < STEPS:
                    k0 = (t + 1) * BK
                    load_a(a_r, bz, m0, k0)
                    load_b(b_r, bz, n0, k0)
                for kk in unroll(range(BK)):
                    for i in unroll(range(TM)):
                        a_f[i] = a_s[buf, kk, i // VM * SM + ty * VM + i % VM]
                    for j in unroll(range(TN)):
                        b_f[j] = b_s[buf, kk, j // VN * SN + tx * VN + j % VN]
                    for i in unroll(range(TM)):
                        for j in unroll(range(TN)):
                            if WRAP:
                                acc[i, j] += u32(a_f[i]) * u32(b_f[j])
                            else:
                                acc[i, j] += a_f[i] * b_f[j]
            for i in unroll(range(TM)):
                for j in unroll(range(TN)):
                    m = m0 + i // VM * SM + ty * VM + i % VM
                    n = n0 + j // VN * SN + tx * VN + j % VN
                    store_c(bz, m, n, acc[i, j])
            # The next batch writes the shared buffers again.
            syncthreads()
            bz += gridDim.z

    return matmul_simt.ir


NAME = "matmul_simt"


TEMPLATE = Template(NAME, space, heuristic, instantiate)
