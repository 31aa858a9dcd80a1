"""A tensor-core matmul template: f16 or bf16 operands summed in f32 by mma.sync m16n8k16,
8-bit integers (i8, u8: _int_mm's) summed in i32 by mma.sync m16n8k32, or float8 (e4m3fn,
e5m2: _scaled_mm's) summed in f32 by mma.sync m16n8k32 where the architecture has it (sm_89
and newer; MatmulProblem.arch), handled as the 8-bit integers are but for the sums.

A block computes a BM x BN tile of C (one batch at a time, batches along gridDim.z) with
(BM / WM) x (BN / WN) warps, each owning a WM x WN part as (WM / 16) x (WN / 8) mma tiles of
accumulators in registers. K advances by BK through STAGES shared buffers: the copy of
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
eight rows an ldmatrix reads over all banks. ldmatrix.trans cannot transpose bytes: an 8-bit
operand staged "mn" (a [K, N] row-major B) is read into its fragments element by element, 24
shared loads a lane for each m16n8k32 of a 16 x 8 tile where "k" takes one ldmatrix (a
constant weight is copied K-major at compile time instead: constant_operand_layouts). An
operand reaches shared memory one of three ways:

- async: a plain strided read of an input (problem.PlainOperand): 16-byte cp.async copies,
  zero-filled past the matrix's edge. They need 16-byte aligned sources: the leading stride
  a multiple of 16 bytes (checked at compile time when static) and the batch's base address
  aligned, checked at run time once per batch (a uniform flag); where it fails, the block
  loads the same elements synchronously through the prologue macro.
- gather: a read whose chunks of 8 k are 16-byte runs of an input, or zero
  (problem.GatheredOperand: a convolution's window on a channels-last input): a cp.async
  a chunk from an offset computed for it, zero-filled outside the window (and past the run's
  limit, where it has one: passes/graph/small_channels.py); element by element from the
  same offsets where the buffer's base is not 16-byte aligned.
- regs: anything else (a fused prologue, or a leading stride of no whole chunks): the
  prologue macro loads the step's elements into registers before the mma's, and they are
  stored to shared memory after them, in the operand's narrow type.

The epilogue goes through shared memory: each warp stages 16 rows of its tile at a time (f32,
each lane's accumulator pairs as 8-byte stores into rows padded so that no two of a phase
share a bank: `staging_pad`) and its lanes apply the epilogue macro along the rows, so that
stores are coalesced and the epilogue's code exists WM / 16 times, not once per accumulator
(ptxas time). Stores are guarded where the tiling has partial tiles. Shared memory is
dynamic, up to MAX_SHARED: the stages one after the other, and the staging rows over the
start of them (the epilogue runs once every copy has landed and every warp is past its last
mma).

K may be split inside the kernel (TcConfig.splits = S > 1), for products of fewer tiles than
SMs: S consecutive blocks compute one tile, block `part` over chunk `part` of K (ceil(steps /
S) steps, the last chunk shorter). Each writes its f32 accumulators to the partials scratch
(LaunchAttrs.scratch, S partials a tile, each warp's rows of the tile row-major: its
accumulator pairs are 8-byte stores filling whole sectors), fences (threadfence), and its
thread 0 adds 1 to the tile's counter. The block that reads S - 1 back is the last: every
other partial is written and visible; it fences again, sets the counter back to 0 (which the
plan allocated zero once: a replayed launch finds it so) and runs the epilogue, whose loop
along the staged rows adds each element's S partials in the order of the chunks (its own
from the staging rows: the same sum, bit for bit, whichever block comes last), reading the
others coalesced, one element at a time: no partial is held in registers beside the
accumulators. No block waits for another, so blocks may run in any order, or one after
another (the emulator). `level0_splits` chooses S by `product_work`, the level-0 model the
split-K pass also weighs its own split in two kernels with (passes/graph/split_k.py).

`instantiate` builds the kernel in steps: each operand's copies (`_operand_copy`: tiles.py's
cp.async or register copies), the warps' mma step (`_warp_mma`), the epilogue (`_store_tile`)
and a split's round trip (`_split`) as fragments, then the pipeline calling them (`_kernel`).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from minicomp.backends.cuda.arch import float8_mma_unpacks, has_float8_mma
from minicomp.ir import types as T
from minicomp.ir.expr import Dim, Var
from minicomp.ir.func import Function
from minicomp.ir.types import PointerType
from minicomp.schedule.templates import tiles
from minicomp.schedule.templates.base import (
    MAX_DYNAMIC_SHARED,
    Template,
    WarpTiled,
    finish,
    search_space,
)
from minicomp.schedule.templates.fragments import expression
from minicomp.schedule.templates.matmul_simt import assumed_sizes, fitting_sizes
from minicomp.schedule.templates.problem import (
    BlockTile,
    MatmulProblem,
    ceil_div,
    grouped_tiles,
    launch_grid,
    needs_check,
    operand_element,
    register_copy,
)
from minicomp.script.function import script
from minicomp.script.lang import (
    Macro,
    atomic_add,
    attrs,
    blockIdx,
    cp_async_commit,
    cp_async_wait,
    cp_async_wait_all,
    dynamic_shared_tensor,
    gridDim,
    is_aligned,
    ldmatrix_x2,
    ldmatrix_x2_trans,
    ldmatrix_x4,
    ldmatrix_x4_trans,
    macro,
    mma_sync_m16n8k16,
    mma_sync_m16n8k32,
    register_tensor,
    shared_tensor,
    store_vec,
    syncthreads,
    threadfence,
    threadIdx,
    unroll,
)
from minicomp.script.mma import FP8_MMA_TYPES, INT8_MMA_TYPES, MMA_TYPES
from minicomp.script.types import f32, i32, i64
from minicomp.script.values import TensorRef

NAME = "matmul_tc"
MAX_SHARED = MAX_DYNAMIC_SHARED
# mma.sync flops an SM computes while its shared memory serves a byte (H100: about 2500 a
# clock against 128 bytes; A100: 2050 against 128).
MMA_FLOPS_PER_SHARED_BYTE = 20
# The level-0 model's prices of memory traffic, in mma flops of one SM for a byte the GPU
# moves, times its SM count: its mma.sync rate over its DRAM and its L2 bandwidth (an H100's
# 660 TFLOP/s over 3.35 TB/s, 200, and over ~10 TB/s, 66; an A100's 312 over 2.0 and ~7.2,
# 156 and 43).
FLOPS_PER_DRAM_BYTE = 200
FLOPS_PER_L2_BYTE = 66
# The most chunks of K the kernel splits a product into (the last block of a tile adds
# splits - 1 partials to its own, unrolled).
MAX_SPLITS = 8
# Names of the in-kernel split's scratch parameters (LaunchAttrs.scratch): the f32 partials
# and a counter a tile.
PARTIALS = "splitk_partials"
COUNTERS = "splitk_counters"


@dataclass(frozen=True)
class TcConfig(BlockTile, WarpTiled):
    """Block tile bm x bn x bk, warp tile wm x wn, `stages` shared buffers; K in `splits`
    chunks, a block each, inside the kernel (1: a block walks all of K; see the module doc)."""

    wm: int
    wn: int
    stages: int
    splits: int = 1

    @property
    def warps(self) -> int:
        return self.parts(self.wm, self.wn)

    def __str__(self) -> str:
        split = f"_k{self.splits}" if self.splits > 1 else ""
        return f"{BlockTile.__str__(self)}_w{self.wm}x{self.wn}_s{self.stages}{split}"


@dataclass(frozen=True)
class Mma:
    """The mma.sync instruction of a problem's operand types: K of one instruction, the
    operands' bytes an element, the accumulator type, each lane's A and B elements."""

    k: int
    elem_bytes: int
    acc: T.DataType
    a_elems: int
    b_elems: int

    @property
    def chunk(self) -> int:
        """Operand elements in a 16-byte chunk (a cp.async, an ldmatrix row, a row's pad)."""
        return tiles.chunk_elems(self.elem_bytes)


HALF_MMA = Mma(16, 2, T.f32, 8, 4)  # m16n8k16, f16 or bf16
INT8_MMA = Mma(32, 1, T.i32, 16, 8)  # m16n8k32, i8 or u8
FP8_MMA = Mma(32, 1, T.f32, 16, 8)  # m16n8k32, float8 e4m3fn or e5m2 (sm_89+)


def mma_of(problem: MatmulProblem) -> Mma:
    """The instruction computing `problem` (which `applies`)."""
    if problem.acc_dtype == T.i32:
        return INT8_MMA
    return FP8_MMA if problem.a_dtype in FP8_MMA_TYPES else HALF_MMA


@dataclass(frozen=True)
class _Operand:
    """How one operand reaches shared memory: mode "async" or "regs", and its layout."""

    mode: str
    layout: str


def _operand(problem: MatmulProblem, side: str) -> _Operand:
    plain = problem.plain_a if side == "a" else problem.plain_b
    major = problem.a_major if side == "a" else problem.b_major
    if plain is not None and plain.ld_multiple_of(mma_of(problem).chunk) is not False:
        return _Operand("async", plain.contiguous)
    if (problem.gather_a if side == "a" else problem.gather_b) is not None:
        return _Operand("gather", "k")
    return _Operand("regs", major)


def staging_pad(wn: int) -> int:
    """Elements of padding after each f32 row of a warp's staging rows (wn wide). A lane of
    mma group g (lane // 4) and quad t (lane % 4) stores its accumulator pairs as 8 bytes at
    row g (or g + 8), column 2t (+ 8 j): a 16-lane phase then spans rows g..g+3 at 8 words
    each, and rows 8 or 24 words apart (mod the 32 banks) put them on all 32 banks; at 4
    apart (wn + 4, the old padding) two rows shared half their banks, a 2-way conflict."""
    return next(p for p in range(0, 32, 2) if (wn + p) % 32 in (8, 24))


def _tile_elems(rows: int, bk: int, layout: str, pad: int) -> int:
    """Shared elements of one stage of an operand tile of `rows` x bk, rows padded by `pad`."""
    return rows * (bk + pad) if layout == "k" else bk * (rows + pad)


def shared_bytes(problem: MatmulProblem, cfg: TcConfig) -> int:
    a, b, mma = _operand(problem, "a"), _operand(problem, "b"), mma_of(problem)
    elems = _tile_elems(cfg.bm, cfg.bk, a.layout, mma.chunk)
    elems += _tile_elems(cfg.bn, cfg.bk, b.layout, mma.chunk)
    staging = cfg.warps * 16 * (cfg.wn + staging_pad(cfg.wn)) * 4
    return max(cfg.stages * elems * mma.elem_bytes, staging)


def valid(problem: MatmulProblem, cfg: TcConfig) -> bool:
    """Whether `cfg` is a consistent tiling within the block limits."""
    mma = mma_of(problem)
    if cfg.bm % cfg.wm or cfg.bn % cfg.wn or cfg.wm % 16 or cfg.wn % 8 or cfg.bk % mma.k:
        return False
    if not 2 <= cfg.stages <= 5 or not 1 <= cfg.warps <= 8:
        return False
    accumulators = cfg.wm * cfg.wn // 32  # f32 registers a thread holds (more spill)
    if accumulators > 128:
        return False
    if accumulators > 32 and _unpacks_float8(problem):
        return False  # sm_90's unpacked float8 fragments: w64x32 takes 255 registers, w64x64 spills
    if accumulators > 64 and "regs" in (_operand(problem, "a").mode, _operand(problem, "b").mode):
        return False  # a tile held in registers across the mma's spills beside 128 of them
    for rows in (cfg.bm, cfg.bn):
        if rows * cfg.bk // mma.chunk < cfg.threads:  # every thread copies at least a chunk
            return False
    if cfg.splits > 1 and not _splittable(problem, cfg):
        return False
    return shared_bytes(problem, cfg) <= MAX_SHARED


def _splittable(problem: MatmulProblem, cfg: TcConfig) -> bool:
    """Whether `problem` can be computed in cfg.splits chunks of K inside the kernel: f32
    sums (the partials are f32: f16, bf16 or float8 operands), static sizes (the scratch
    memory is sized at compile time), at most MAX_SPLITS chunks, none of them empty."""
    sizes = problem.static_sizes()
    return (
        mma_of(problem).acc == T.f32
        and sizes is not None
        and cfg.splits <= MAX_SPLITS
        and chunks_fill(ceil_div(sizes[3], cfg.bk), cfg.splits)
    )


def chunks_fill(steps: int, splits: int) -> bool:
    """Whether `splits` chunks of ceil(steps / splits) steps each have a step to compute."""
    return 1 <= splits <= steps and (splits - 1) * -(-steps // splits) < steps


_LEVEL1 = (
    TcConfig(256, 128, 32, 64, 64, 3),
    TcConfig(128, 256, 32, 64, 64, 3),
    TcConfig(128, 128, 32, 64, 64, 3),
    TcConfig(128, 128, 32, 64, 32, 3),
    # N of 64 (ResNet's early convolutions): four 64x64 warps down M. A 128 x 64 tile of
    # 64x32 warps moves 1.4 times the shared-memory bytes a flop (step_cost).
    TcConfig(256, 64, 32, 64, 64, 3),
    TcConfig(128, 64, 32, 64, 32, 3),
    TcConfig(64, 128, 32, 32, 32, 3),
    TcConfig(64, 64, 32, 32, 32, 4),
    TcConfig(32, 64, 32, 16, 32, 4),
    TcConfig(32, 32, 32, 16, 32, 3),
)
# The same tilings for 8-bit integers (and float8): K steps of 64, the same 64 bytes of a row.
_INT8_LEVEL1 = tuple(TcConfig(c.bm, c.bn, 2 * c.bk, c.wm, c.wn, c.stages) for c in _LEVEL1)


def level1(problem: MatmulProblem) -> tuple[TcConfig, ...]:
    """The level-1 tilings for `problem`'s operand types (not all valid for it)."""
    return _INT8_LEVEL1 if mma_of(problem).elem_bytes == 1 else _LEVEL1


def space(problem: MatmulProblem, level: int) -> list[TcConfig]:
    """The configs to try: level 1 a handful, level 2 every valid tiling of a grid of
    choices (level 0: the heuristic's alone)."""
    sizes, warp_m, warp_n = (32, 64, 128, 256), (16, 32, 64), (8, 16, 32, 64)
    steps = tuple(k * mma_of(problem).k for k in (1, 2, 4))
    grid = itertools.product(sizes, sizes, steps, warp_m, warp_n, (2, 3, 4))
    return search_space(problem, level, heuristic, valid, level1(problem), TcConfig, grid)


def heuristic(problem: MatmulProblem) -> TcConfig:
    """The config used without measuring: `level0_tile` of the level-1 space, with K split
    inside the kernel where `level0_splits` finds that pays. So large products get 256x128
    or 128x256 blocks of eight 64x64 warps, 64 columns over many rows (ResNet's first
    stage) 256x64 blocks of four, a grid just short of two waves of small tiles gives way to
    one wave of large ones, and a product of fewer large tiles than SMs (1024 x 1024 x 1024)
    takes twice the blocks of them, each over half of K."""
    configs = space(problem, 1)
    batch, m, n = assumed_sizes(problem)
    splits = 1
    sizes = problem.static_sizes()
    if sizes is not None:
        out_size = problem.out_dtypes[0].nbytes if problem.out_dtypes else 2
        splits = level0_splits(batch, m, n, sizes[3], problem.sms, input_bytes(problem), out_size)
    if splits > 1:
        config = dataclasses.replace(
            level0_tile(configs, splits * batch, m, n, problem.sms)[0], splits=splits
        )
        if valid(problem, config):
            return config
    return level0_tile(configs, batch, m, n, problem.sms)[0]


def level0_tile(
    configs: Sequence[TcConfig], batch: int, m: int, n: int, sms: int
) -> tuple[TcConfig, float]:
    """Of `configs`, the one for `batch` m x n products on `sms` SMs: of the tiles that fit
    the matrix (matmul_simt.fitting_sizes), the one whose busiest SM has the least work, its
    blocks' flops weighted by `step_cost`; the largest tile of those as good. With that work,
    in multiply-adds per element of K: ceil(blocks / sms) * bm * bn * step_cost."""
    by_tile = {(c.bm, c.bn): c for c in reversed(configs)}
    tiles = sorted(by_tile, key=lambda t: -t[0] * t[1])

    def busiest_sm(tile: tuple[int, int]) -> float:
        rounds = -(-batch * ceil_div(m, tile[0]) * ceil_div(n, tile[1]) // sms)
        return rounds * tile[0] * tile[1] * step_cost(by_tile[tile])

    best = min(fitting_sizes(m, n, tiles), key=busiest_sm)
    return by_tile[best], busiest_sm(best)


def tile_work(batch: int, m: int, n: int, sms: int) -> float:
    """`level0_tile`'s work for `batch` m x n products on `sms` SMs whose operands the kernel
    copies with cp.async (plain or gathered: every level-1 tiling is valid for them): the
    busiest SM's multiply-adds per element of K, the compute term of `product_work`."""
    return level0_tile(_LEVEL1, batch, m, n, sms)[1]


def product_work(
    batch: int,
    m: int,
    n: int,
    k: int,
    sms: int,
    *,
    operand_bytes: int,
    out_size: int,
    splits: int = 1,
) -> float:
    """The level-0 model of `batch` m x n x k products (16-bit operands, f32 sums) on `sms`
    SMs, K in `splits` chunks inside the kernel, in mma flops of one SM (`tile_work`'s unit).
    The main loop takes the longest of
    - the busiest SM's mma work at `level0_tile`'s tile for splits x batch products;
    - the bytes DRAM moves: `operand_bytes` (what the product reads) and the output
      (`out_size` bytes an element), at FLOPS_PER_DRAM_BYTE; partials stay in L2;
    - the bytes L2 moves: every block's operand tiles (bm + bn rows of its chunk of K), and
      the output, or for a split the f32 partials every block writes, at FLOPS_PER_L2_BYTE.
    A split then waits for the last block of each tile, which reads the other splits - 1
    partials and stores the tile: the busiest SM's ceil(tiles / SMs) such blocks at one SM's
    share of L2 bandwidth (twice the even share, as the lens assumes: FLOPS_PER_L2_BYTE / 2
    a byte). So 1568 x 512 x 2048 (52 tiles of 128 x 128) splits in 2, not in 4 or 5 with 128
    x 256 tiles, whose main loops are shorter but whose last blocks each read 3 or 4 partials
    of 128 KiB alone. The split-K pass weighs its own split (two kernels) with this model
    (passes/graph/split_k.py)."""
    cfg, work = level0_tile(_LEVEL1, splits * batch, m, n, sms)
    compute = 2 * work * -(-k // splits)
    out = batch * m * n * out_size
    tiles = batch * ceil_div(m, cfg.bm) * ceil_div(n, cfg.bn)
    dram = (operand_bytes + out) * FLOPS_PER_DRAM_BYTE / sms
    l2 = tiles * (cfg.bm + cfg.bn) * k * 2
    if splits == 1:
        return max(compute, dram, (l2 + out) * FLOPS_PER_L2_BYTE / sms)
    partials = splits * batch * m * n * 4
    main = max(compute, dram, (l2 + partials) * FLOPS_PER_L2_BYTE / sms)
    last = cfg.bm * cfg.bn * ((splits - 1) * 4 + out_size)
    return main + -(-tiles // sms) * last * FLOPS_PER_L2_BYTE / 2


def split_candidates(batch: int, m: int, n: int, k: int, sms: int) -> range:
    """The counts of in-kernel chunks `level0_splits` weighs: none (range(2, 2)) for a product
    with as many 128 x 128 tiles as SMs, else up to two blocks an SM and MAX_SPLITS, each
    chunk at least two K steps of 32."""
    tiles = batch * ceil_div(m, 128) * ceil_div(n, 128)
    if not 1 <= tiles < sms:
        return range(2, 2)
    most = min(MAX_SPLITS, 2 * sms // tiles, ceil_div(k, 64))
    return range(2, max(2, most + 1))


def level0_splits(
    batch: int, m: int, n: int, k: int, sms: int, operand_bytes: int, out_size: int
) -> int:
    """How many chunks of K the kernel splits `batch` m x n x k products into at level 0:
    the count with the least `product_work`, 1 (whole) unless a split is less."""
    best, least = (
        1,
        product_work(batch, m, n, k, sms, operand_bytes=operand_bytes, out_size=out_size),
    )
    for s in split_candidates(batch, m, n, k, sms):
        if not chunks_fill(ceil_div(k, 32), s):
            continue
        t = product_work(
            batch, m, n, k, sms, operand_bytes=operand_bytes, out_size=out_size, splits=s
        )
        if t < least:
            best, least = s, t
    return best


def input_bytes(problem: MatmulProblem) -> int:
    """The bytes of the tensors `problem` reads (its inputs' storage; static sizes)."""
    total = 0
    for v in problem.op.inputs:
        strides = problem.layouts[v.name]
        if all(isinstance(d, int) for d in (*v.shape, *strides)) and all(v.shape):
            elements = 1 + sum((d - 1) * s for d, s in zip(v.shape, strides))
            total += elements * v.dtype.nbytes
    return total


def step_cost(cfg: TcConfig) -> float:
    """A K step's time per mma flop, relative to the tensor cores' rate: 1, or more where its
    shared-memory traffic (each warp's fragments, the block's stores of both operand tiles)
    takes longer. A 64x64 warp tile reads 4 KiB of fragments per 128 KFLOP, about what shared
    memory serves while the tensor cores compute them; a 64x32 one 1.5 times that."""
    # A K slice 16 deep: each warp reads 32 * (wm + wn) bytes of fragments, the block stores
    # 32 * (bm + bn) bytes of operands, and the mma's compute 32 * bm * bn flops.
    shared_bytes = cfg.warps * (cfg.wm + cfg.wn) + cfg.bm + cfg.bn
    return max(1.0, MMA_FLOPS_PER_SHARED_BYTE * shared_bytes / (cfg.bm * cfg.bn))


def _unpacks_float8(problem: MatmulProblem) -> bool:
    """Whether `problem`'s mma is the float8 one on an architecture that runs it as two f16
    mma's (sm_90: arch.float8_mma_unpacks), holding the fragments unpacked to f16 as well."""
    return mma_of(problem) is FP8_MMA and float8_mma_unpacks(problem.arch)


def applies(problem: MatmulProblem) -> bool:
    """f16 x f16 or bf16 x bf16 operands accumulated in f32, 8-bit integers (i8 or u8, each
    operand either) in i32, or float8 (e4m3fn or e5m2, each operand either) in f32 where the
    problem's architecture has the float8 mma (elsewhere the SIMT template computes them)."""
    a, b = problem.a_dtype, problem.b_dtype
    if problem.acc_dtype == T.i32:
        return a in INT8_MMA_TYPES and b in INT8_MMA_TYPES
    if a in FP8_MMA_TYPES or b in FP8_MMA_TYPES:
        fp8 = a in FP8_MMA_TYPES and b in FP8_MMA_TYPES and problem.acc_dtype == T.f32
        return fp8 and has_float8_mma(problem.arch)
    return problem.acc_dtype == T.f32 and a == b and a in MMA_TYPES


def instantiate(problem: MatmulProblem, cfg: TcConfig) -> Function:
    """The kernel computing `problem` with tiling `cfg` (named after the fused group)."""
    names = tiles.Names()
    a, b = _operand_copy(problem, cfg, "a", names), _operand_copy(problem, cfg, "b", names)
    mma = _warp_mma(cfg, mma_of(problem), a.k_major, b.k_major, names)
    split = _split(problem, cfg, names) if cfg.splits > 1 else None
    store = _store_tile(problem, cfg, names, split)
    kernel = _kernel(problem, cfg, a, b, mma, store, split)
    gathered = problem.gather_a is not None or problem.gather_b is not None
    scalar_fragments = mma_of(problem).elem_bytes == 1 and not (a.k_major and b.k_major)
    if _unpacks_float8(problem):
        # Left to itself, ptxas holds some float8 tilings (eight 32x32 warps) to 128 registers
        # on sm_90 and spills the unpacked fragments; one block an SM lets it take them.
        return finish(kernel, problem.name, f"{NAME}[{cfg}]", min_blocks=1)
    if scalar_fragments and cfg.threads == 128 and cfg.wm * cfg.wn == 32 * 32:
        # 8-bit fragments loaded byte by byte from rows of K keep addresses live: left to
        # itself, ptxas holds a tiling of four 32x32 warps to 72 registers on sm_89 (seven
        # blocks an SM) and spills; four blocks an SM let it take what it needs.
        return finish(kernel, problem.name, f"{NAME}[{cfg}]", min_blocks=4)
    if gathered and cfg.threads <= 64:
        # Left to itself, ptxas holds a two-warp tiling of a gathered window to 96 registers
        # and spills (sm_80, sm_90); promising one block an SM lets it take what it needs (a
        # block of 64 threads still fits many times). Larger tilings keep ptxas's choice.
        return finish(kernel, problem.name, f"{NAME}[{cfg}]", min_blocks=1)
    if gathered and cfg.threads == 128 and cfg.wm * cfg.wn == 32 * 32:
        # Likewise, ptxas holds a 64 x 64 tiling of four 32x32 warps to 96 registers on sm_80
        # and spills; four blocks an SM (what an A100's shared memory fits of it) give it 128.
        return finish(kernel, problem.name, f"{NAME}[{cfg}]", min_blocks=4)
    if cfg.threads <= 128 and cfg.wm * cfg.wn // 32 >= 64:
        # 64 accumulators a thread in a block of four warps: left to itself, ptxas aims at four
        # blocks an SM (128 registers on sm_90) and spills a few bytes once the epilogue costs
        # registers (a fused gelu); two blocks an SM let it take 160-175 without spilling.
        return finish(kernel, problem.name, f"{NAME}[{cfg}]", min_blocks=2)
    return finish(kernel, problem.name, f"{NAME}[{cfg}]")


@dataclass(frozen=True)
class _Copy:
    """How the kernel moves one operand's tiles to shared memory (see the module doc).

    `shape` is its shared buffer's (stages, rows, row length). Async: `issue(dst, base, fast,
    bz, mn0, k0)` starts the cp.async of step k0's tile into stage view `dst`, from the operand
    at `base` (`base_of(bz)`, a batch's offset in `ref`), element by element where not `fast`.
    Regs: `issue(regs, bz, mn0, k0)` loads the tile into register tensor `regs` (of shape
    `regs`), and `stage(regs, dst)` stores it.
    """

    is_async: bool
    k_major: bool
    shape: tuple[int, int, int]
    issue: Macro
    stage: Macro | None = None
    regs: tuple[int, int] | None = None
    ref: TensorRef | None = None
    ld: Dim = 0
    base_of: Macro | None = None


def _operand_copy(problem: MatmulProblem, cfg: TcConfig, side: str, names: tiles.Names) -> _Copy:
    """The copies of operand `side` ("a" or "b"): cp.async where it is a plain strided read,
    else through registers; guarded where a size is not a multiple of the tile."""
    op, mma = _operand(problem, side), mma_of(problem)
    mn, size = (cfg.bm, problem.m) if side == "a" else (cfg.bn, problem.n)
    k_major = op.layout == "k"
    rows, cols = (mn, cfg.bk) if k_major else (cfg.bk, mn)
    shape = (cfg.stages, rows, cols + mma.chunk)
    if op.mode == "regs":
        regs = register_copy(
            problem, side, mn, cfg.bk, cfg.threads, names, width=mma.chunk, narrow=True
        )
        return _Copy(False, k_major, shape, regs.load, regs.store, regs.regs)
    if op.mode == "gather":
        return _gather_copy(problem, cfg, side, names, shape)
    plain = problem.plain_a if side == "a" else problem.plain_b
    # Any partial tile zero-fills along both dimensions.
    guarded = needs_check(size, mn) or needs_check(problem.k, cfg.bk)
    extents = (size, problem.k) if k_major else (problem.k, size)
    rows_ext, cols_ext = extents if guarded else (None, None)
    matrix = tiles.Matrix(
        plain.ref, plain.ld, rows_ext, cols_ext, wide=tiles.wide_offsets(plain.ref)
    )
    element = operand_element(problem, side, k_major, mn, cfg.bk, narrow=True)
    tile = tiles.Tile(
        rows, cols, cfg.threads, mma.chunk, phase_columns=True, elem_bytes=mma.elem_bytes
    )
    copy = tiles.async_copy(names, side, tile, (matrix,), element)

    def issue(dst, base, fast, bz, mn0, k0):
        row0, col0 = (mn0, k0) if k_major else (k0, mn0)
        return copy.fn(dst, (0,), (base,), row0, col0, fast, True, bz)

    base_of = plain.batch_offset_macro()
    return _Copy(True, k_major, shape, macro(issue), ref=plain.ref, ld=plain.ld, base_of=base_of)


def _gather_copy(
    problem: MatmulProblem, cfg: TcConfig, side: str, names: tiles.Names, shape
) -> _Copy:
    """The cp.async copies of a gathered operand (problem.GatheredOperand): one offset and
    guard a 16-byte chunk, rows of M or N in shared memory; its base is the buffer's, aligned
    or not (then element by element from the same offsets)."""
    mn, size = (cfg.bm, problem.m) if side == "a" else (cfg.bn, problem.n)
    gathered = problem.gather_a if side == "a" else problem.gather_b
    check_mn, check_k = needs_check(size, mn), needs_check(problem.k, cfg.bk)
    source = problem.gather_source(side, check_mn=check_mn, check_k=check_k)
    tile = tiles.Tile(mn, cfg.bk, cfg.threads, phase_columns=True)
    count = problem.gather_count(side)
    copy = tiles.gather_copy(names, side, tile, gathered.ref, source, count)

    def issue(dst, base, fast, bz, mn0, k0):
        return copy.fn(dst, mn0, k0, fast, bz)

    @macro
    def base_of(b):
        return 0

    return _Copy(True, True, shape, macro(issue), ref=gathered.ref, ld=0, base_of=base_of)


def _warp_mma(cfg: TcConfig, mma: Mma, a_k: bool, b_k: bool, names: tiles.Names) -> Macro:
    """Macro `mma(a, b, a_frag, b_frag, acc, warp_m, warp_n, lane)`: acc += this warp's part of
    one K step, its fragments loaded by ldmatrix from stage views a and b (element by element
    for an 8-bit operand staged as rows of K)."""
    BK, WM, WN, MK = cfg.bk, cfg.wm, cfg.wn, mma.k
    MI, NI = WM // 16, WN // 8
    INT8 = mma.elem_bytes == 1  # 8-bit operands, integers or float8: m16n8k32
    # 16 bytes of K an ldmatrix row: 8 halves, or 16 bytes.
    CH = mma.chunk
    A_SCALAR, B_SCALAR = INT8 and not a_k, INT8 and not b_k

    def step(a, b, a_frag, b_frag, acc, warp_m, warp_n, lane):
        @script
        def warp_mma():
            g = lane // 4
            t = lane % 4
            for kk in unroll(range(0, BK, MK)):
                for i in unroll(range(MI)):
                    if a_k:
                        # Lanes 0-15 name rows 0-15 at k, lanes 16-31 the same 16 bytes on.
                        row = warp_m + i * 16 + lane % 16
                        ldmatrix_x4(a_frag[i], a[row, kk + lane // 16 * CH])
                    elif A_SCALAR:
                        # The m16n8k32 A layout, from rows of K.
                        for e in unroll(range(16)):
                            kr = kk + t * 4 + e % 4 + e // 8 * 16
                            a_frag[i, e] = a[kr, warp_m + i * 16 + g + e // 4 % 2 * 8]
                    else:
                        # Rows of K: matrix j (lanes 8j..) is rows k + j // 2 * 8 at column
                        # m + j % 2 * 8.
                        kr = kk + lane % 8 + lane // 16 * 8
                        col = warp_m + i * 16 + lane // 8 % 2 * 8
                        ldmatrix_x4_trans(a_frag[i], a[kr, col])
                if B_SCALAR:
                    # The m16n8k32 B layout, from rows of K: one n-tile's fragment at a time,
                    # used by the MI mma's at once (fewer registers live).
                    for j in unroll(range(NI)):
                        for e in unroll(range(8)):
                            kr = kk + t * 4 + e % 4 + e // 4 * 16
                            b_frag[j, e] = b[kr, warp_n + j * 8 + g]
                        for i in unroll(range(MI)):
                            mma_sync_m16n8k32(acc[i, j], a_frag[i], b_frag[j], acc[i, j])
                else:
                    if NI % 2 == 0:
                        for j in unroll(range(0, NI, 2)):
                            # Two n-tiles at once: lanes 16-31 name the next 8 columns.
                            if b_k:
                                row = warp_n + j * 8 + lane // 16 * 8 + lane % 8
                                ldmatrix_x4(b_frag[j, 0], b[row, kk + lane // 8 % 2 * CH])
                            else:
                                col = warp_n + j * 8 + lane // 16 * 8
                                ldmatrix_x4_trans(b_frag[j, 0], b[kk + lane % 16, col])
                    else:
                        for j in unroll(range(NI)):
                            if b_k:
                                row = warp_n + j * 8 + lane % 8
                                ldmatrix_x2(b_frag[j], b[row, kk + lane // 8 % 2 * CH])
                            else:
                                ldmatrix_x2_trans(b_frag[j], b[kk + lane % 16, warp_n + j * 8])
                    for i in unroll(range(MI)):
                        for j in unroll(range(NI)):
                            if INT8:
                                mma_sync_m16n8k32(acc[i, j], a_frag[i], b_frag[j], acc[i, j])
                            else:
                                mma_sync_m16n8k16(acc[i, j], a_frag[i], b_frag[j], acc[i, j])

        return warp_mma

    return names.fragment("mma", step)


def _store_tile(
    problem: MatmulProblem, cfg: TcConfig, names: tiles.Names, split: _Split | None = None
) -> Macro:
    """Macro `store(acc, rows, bz, row0, col0, lane, at, part)`: the epilogue of this warp's
    tile (rows row0..., columns col0... of C), 16 rows at a time through its staging rows
    `rows`, its lanes along the rows (coalesced), one element an iteration. With `split`, an
    element is the sum of the tile's partials (`split.total`: this warp's part of the first
    at `at`, this block's own, chunk `part`, from the staging rows); without, `at` and `part`
    are unused."""
    MI, NI, WN = cfg.wm // 16, cfg.wn // 8, cfg.wn
    ACC = mma_of(problem).acc
    SPLIT = split is not None
    total = split.total if SPLIT else None
    store_c = problem.store_c(
        check_m=needs_check(problem.m, cfg.bm), check_n=needs_check(problem.n, cfg.bn)
    )

    def store(acc, rows, bz, row0, col0, lane, at, part):
        @script
        def store_tile():
            g = lane // 4
            tq = lane % 4
            pair = register_tensor(ACC, 2)
            summed = register_tensor(ACC, 1)
            for i in unroll(range(MI)):
                for j in unroll(range(NI)):
                    for h in unroll(range(2)):
                        # Each pair of columns as one 8-byte store (staging_pad: no conflicts).
                        pair[0] = acc[i, j, 2 * h]
                        pair[1] = acc[i, j, 2 * h + 1]
                        store_vec(rows[g + h * 8, j * 8 + tq * 2], pair)
                syncthreads()
                for idx in range(lane, 16 * WN, 32):
                    r = idx // WN
                    c = idx % WN
                    if SPLIT:
                        total(summed, rows[r, c], at + i * 16 * WN + idx, part)
                        store_c(bz, row0 + i * 16 + r, col0 + c, summed[0])
                    else:
                        store_c(bz, row0 + i * 16 + r, col0 + c, rows[r, c])
                syncthreads()

        return store_tile

    return names.fragment("c", store)


@dataclass(frozen=True)
class _Split:
    """The in-kernel split of K (cfg.splits > 1): the scratch parameters; `at(tile, warp)`,
    the offset of a warp's part of `tile`'s first partial; `gather(acc, arrived, at, tile,
    part, lane)`, which stores this block's partial (chunk `part`) and counts it, `arrived[0]`
    then splits - 1 in the last block only (which resets the count); and `total(out, mine,
    at, part)`, `out[0]` = the sum in the chunks' order of the partials' element at offset
    `at` of the first, `mine` (this block's) for chunk `part` (see the module doc)."""

    params: tuple[Var, Var]
    scratch: tuple[tuple[str, int, bool], ...]
    at: Macro
    gather: Macro
    total: Macro


def _split(problem: MatmulProblem, cfg: TcConfig, names: tiles.Names) -> _Split:
    """The split-K scratch and the partials' round trip of `problem` in cfg.splits chunks."""
    S, MI, NI, WN = cfg.splits, cfg.wm // 16, cfg.wn // 8, cfg.wn
    b, m, n, _ = problem.static_sizes()
    TILES = b * ceil_div(m, cfg.bm) * ceil_div(n, cfg.bn)
    TILE_ELEMS = cfg.bm * cfg.bn
    WARP_ELEMS = cfg.wm * cfg.wn
    partials = Var(PARTIALS, PointerType(T.f32))
    counters = Var(COUNTERS, PointerType(T.i32))
    P = TensorRef(PARTIALS, partials, (TILES * S * TILE_ELEMS,))
    C = TensorRef(COUNTERS, counters, (TILES,))
    scratch = ((PARTIALS, TILES * S * TILE_ELEMS, False), (COUNTERS, TILES, True))

    def at(tile, warp):
        @script
        def split_at() -> i64:
            return i64(tile) * (S * TILE_ELEMS) + warp * WARP_ELEMS

        return split_at

    def gather(acc, arrived, at, tile, part, lane):
        @script
        def split_gather():
            # A warp's part of a partial is its rows of the tile, row-major (wm x wn): the
            # epilogue's staging order, which the last block reads coalesced. The accumulator
            # pairs are 8-byte stores, each 32-byte sector whole.
            mine = at + part * TILE_ELEMS + lane // 4 * WN + lane % 4 * 2
            pair = register_tensor(f32, 2)
            for i in unroll(range(MI)):
                for j in unroll(range(NI)):
                    for h in unroll(range(2)):
                        pair[0] = acc[i, j, 2 * h]
                        pair[1] = acc[i, j, 2 * h + 1]
                        store_vec(P[mine + (i * 16 + h * 8) * WN + j * 8], pair)
            # Every write of the block is visible to the grid before the count says so.
            threadfence()
            syncthreads()
            if threadIdx.x == 0:
                arrived[0] = atomic_add(C[tile], 1)
            syncthreads()
            if arrived[0] == S - 1:
                # The others' partials are visible to this block's reads.
                threadfence()
                if threadIdx.x == 0:
                    C[tile] = 0  # every chunk has counted: ready for the next launch

        return split_gather

    def total(out, mine, at, part):
        @script
        def split_total():
            # The sum in the order of the chunks whichever block is last: the same bits on
            # every run. An element at a time, in the epilogue's loop: no partial is held in
            # registers beside the accumulators (held there, 32 at a time, they spilled).
            out[0] = P[at] if part > 0 else mine
            for q in unroll(range(1, S)):
                out[0] += P[at + q * TILE_ELEMS] if q != part else mine

        return split_total

    return _Split(
        (partials, counters),
        scratch,
        expression(at),
        names.fragment("split", gather),
        names.fragment("sum", total),
    )


def _kernel(
    problem: MatmulProblem, cfg: TcConfig, a: _Copy, b: _Copy, mma, store, split: _Split | None
) -> Function:
    """The script kernel: the K loop's pipeline over the operand copies, the warps' mma steps
    and the epilogue (see the module doc); with `split`, the block's chunk of K and the
    partials' round trip before the epilogue."""
    BM, BN, BK, WM, WN, STAGES = cfg.bm, cfg.bn, cfg.bk, cfg.wm, cfg.wn, cfg.stages
    A_DT, B_DT, MMA = problem.a_dtype, problem.b_dtype, mma_of(problem)
    ACC, CHUNK, A_ELEMS, B_ELEMS = MMA.acc, MMA.chunk, MMA.a_elems, MMA.b_elems
    WARPS_N, WARPS, THREADS = BN // WN, cfg.warps, cfg.threads
    MI, NI = WM // 16, WN // 8
    STAGING_ROW = WN + staging_pad(WN)
    row0, col0 = grouped_tiles(problem, BM, BN)
    STEPS = ceil_div(problem.k, BK)
    B = problem.batch
    GRID = launch_grid(problem, BM, BN)
    S = cfg.splits
    SPLIT = split is not None
    SPAN = -(-STEPS // S) if SPLIT else STEPS  # steps of a chunk of K
    TILES = GRID[0]
    params, SCRATCH = problem.params, ()
    if SPLIT:
        SCRATCH = split.scratch
        GRID = (GRID[0] * S, GRID[1], GRID[2])
        sig = problem.sig
        params = (*sig.inputs, *sig.outputs, *split.params, *sig.symbols)
        gather, split_at = split.gather, split.at
    A_ASYNC, B_ASYNC = a.is_async, b.is_async
    STAGED = not (A_ASYNC and B_ASYNC)
    A_SHAPE, B_SHAPE = a.shape, b.shape
    A_REGS, B_REGS = a.regs, b.regs
    A_G, B_G, LDA, LDB = a.ref, b.ref, a.ld, b.ld
    a_base, b_base = a.base_of, b.base_of
    issue_a, issue_b, stage_a, stage_b = a.issue, b.issue, a.stage, b.stage

    @script(params=params)
    def matmul_tc():
        attrs.grid_dim = GRID
        attrs.block_dim = THREADS
        attrs.scratch = SCRATCH
        attrs.block_group = S
        tid = threadIdx.x
        lane = tid % 32
        warp_m = tid // 32 // WARPS_N * WM
        warp_n = tid // 32 % WARPS_N * WN
        # 32-bit: the rasterisation divides by a run-time row count, a library call in 64-bit.
        pid = blockIdx.x
        if SPLIT:
            # The S blocks of a tile are consecutive: chunk `part` of K is theirs.
            part = blockIdx.x % S
            pid = blockIdx.x // S
            first = part * SPAN
            steps = min(STEPS - first, SPAN)
            arrived = shared_tensor(i32, 1)
        m0 = row0(pid)
        n0 = col0(pid)
        a_s = dynamic_shared_tensor(A_DT, A_SHAPE)
        b_s = dynamic_shared_tensor(B_DT, B_SHAPE)
        c_s = dynamic_shared_tensor(ACC, (WARPS, 16, STAGING_ROW), at=0)
        a_frag = register_tensor(A_DT, (MI, A_ELEMS))
        b_frag = register_tensor(B_DT, (NI, B_ELEMS))
        acc = register_tensor(ACC, (MI, NI, 4))
        if not A_ASYNC:
            a_r = register_tensor(A_DT, A_REGS)
        if not B_ASYNC:
            b_r = register_tensor(B_DT, B_REGS)
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
                        acc[i, j, e] = 0
            # Iteration `it` issues step `it` into buffer it % STAGES (which step it - STAGES,
            # computed one iteration earlier, used) and computes step it - (STAGES - 1).
            # (Whole, the loop's bounds are constants, which the index simplifier uses.)
            for it in range((steps if SPLIT else STEPS) + STAGES - 1):
                cp_async_wait(STAGES - 2)
                syncthreads()
                st = it % STAGES
                if it < (steps if SPLIT else STEPS):
                    k0 = ((first + it) if SPLIT else it) * BK
                    if A_ASYNC:
                        issue_a(a_s[st], a_off, a_fast, bz, m0, k0)
                    else:
                        issue_a(a_r, bz, m0, k0)
                    if B_ASYNC:
                        issue_b(b_s[st], b_off, b_fast, bz, n0, k0)
                    else:
                        issue_b(b_r, bz, n0, k0)
                if it >= STAGES - 1:
                    ld = (it + 1) % STAGES
                    mma(a_s[ld], b_s[ld], a_frag, b_frag, acc, warp_m, warp_n, lane)
                # The registers' tiles go to shared memory after the mma's, which hid the
                # latency of their loads.
                if STAGED and it < (steps if SPLIT else STEPS):
                    if not A_ASYNC:
                        stage_a(a_r, a_s[st])
                    if not B_ASYNC:
                        stage_b(b_r, b_s[st])
                cp_async_commit()
            # The next batch writes the buffers again.
            cp_async_wait_all()
            syncthreads()
            if SPLIT:
                tile = i32(bz) * TILES + pid
                at = split_at(tile, tid // 32)
                gather(acc, arrived, at, tile, part, lane)
                if arrived[0] == S - 1:  # the last block: it sums the tile's partials
                    store(acc, c_s[tid // 32], bz, m0 + warp_m, n0 + warp_n, lane, at, part)
            else:
                store(acc, c_s[tid // 32], bz, m0 + warp_m, n0 + warp_n, lane, 0, 0)
            bz += gridDim.z

    return matmul_tc.ir


TEMPLATE = Template(NAME, space, heuristic, instantiate, applies)
