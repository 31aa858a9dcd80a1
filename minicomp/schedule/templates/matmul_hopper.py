"""A Hopper (sm_90a) matmul: C[M, N] = A[M, K] @ B[N, K]^T with f16, bf16 or float8
(e4m3fn, e5m2; A and B of one type, without scales) operands summed in f32 by warpgroup MMA,
fed by TMA through a ring of shared-memory stages, written to C in f16, bf16 or f32.

A block is C consumer warpgroups (threads 0 to 128C - 1) and one producer warp after them
(warpgroups are four consecutive warps from a multiple of 128 threads, so the producer comes
last and the block needs no idle warpgroup). It computes BM x BN tiles of C, BM = 64C: the
consumer warpgroup `wg` owns rows 64wg to 64wg + 63 of the tile as one m64nBNk16 accumulator
(BN / 2 f32 a thread). The grid is persistent: block b computes tiles b, b + grid, ... (tile
t at row tile t % tiles_m, column tile t // tiles_m, so that the blocks running together
share B's tiles), with a ring of STAGES stages that runs on across its tiles.

Stage s holds A's BM x KS and B's BN x KS box of one K step (KS = 64 16-bit or 128 float8
elements), each row 128 bytes under TMA's 128-byte swizzle (the layout wgmma's descriptors
take with swizzle=128), in the dynamic shared memory: A's stages from byte 0, B's after
them, every box at a multiple of 1024 bytes. Two mbarriers a stage order the ring. Step `it`
(counted over the block's tiles) uses stage it % STAGES in round it // STAGES:

    producer (one thread)                consumers (every thread)
    wait empty[s], parity round % 2 ^ 1  wait full[s], parity round % 2
    expect_tx(full[s], stage bytes)      fence; 4 mma_async (32 bytes of K each); commit
    tma_load A box, B box -> full[s]     wait_group(1): the step before has retired
                                         arrive empty[stage of the step before]

so one group of mma's is in flight while the next stage's data is awaited, and a stage goes
back to the producer only after the wait that retired the mma's reading it. `empty` expects
one arrival from each consumer thread, `full` the producer's and the stage's bytes. The first
round's empty waits pass at once (the phase before the first). After a tile's last step the
consumers wait for every group, release the last stage and store their accumulators to C,
guarded at C's edges, while the producer already loads the next tile's stages. TMA fills the
boxes' rows and K columns past A's and B's edges with zeros, so a partial tile or K step needs
no other care.

Element i of lane l of warp w is at row 16w + l / 4 + 8 (i / 2 % 2), column
8 (i / 4) + 2 (l % 4) + i % 2 of its warpgroup's 64 rows, so a store straight from the fragment
(what the script kernel, `kernel`, does) covers 8 rows by a few bytes each. The compiler's template
(`instantiate`) stores through shared memory instead, for whole sectors: each consumer warp has
staging rows of its own after the ring (16 rows of CHUNK = 32 f32, padded as matmul_tc's
`staging_pad`: no bank conflicts); a chunk of its 16 x BN part goes there as 8-byte pairs, then
its lanes store it along the rows, lane l on column l, one row a store: 64 bytes of an f16 C,
two whole sectors. The warp's lanes meet at an mbarrier of its own (32 arrivals) once the chunk
is written and once it is read, before the next overwrites it: the DSL has no __syncwarp, and a
warp's lanes must not read each other's shared writes unordered.

TMA needs A's and B's rows 16-byte aligned (K a multiple of 8, of 16 for float8) and their
data 16-byte aligned; the launch checks it (`matmul_hopper`).

As the compiler's template (`instantiate`), it also computes batches of products (tile t is
product t // tiles of C; each operand's batch variables its map's outer dimensions), reads a
symbolic M from the launch, and takes 16-bit MN-major operands (a row-major [K, N] B, a [K, M]
A): TMA copies them in boxes of KS rows of K by 64 columns (one 128-byte swizzle span), BM / 64
or BN / 64 of them a stage, which is wgmma's MN-major layout under that swizzle (spans of 64
rows, K rows each: a warpgroup's 64 rows of A are span wg), read with its transpose flag.
"""

import functools
from dataclasses import dataclass

from minicomp.backends.cuda.arch import WGMMA_ARCH
from minicomp.backends.cuda.sm_count import H100_SMS
from minicomp.ir import types as T
from minicomp.ir.expr import Dim, Var, as_expr, cast, maximum, minimum, prod
from minicomp.ir.func import Function
from minicomp.schedule.templates.base import Template, finish
from minicomp.schedule.templates.fragments import Names
from minicomp.schedule.templates.matmul_simt import assumed_sizes
from minicomp.schedule.templates.matmul_tc import staging_pad
from minicomp.schedule.templates.problem import ceil_div, needs_check, unravel
from minicomp.script.cluster import (
    cluster_ctarank,
    cluster_sync,
    fence_mbarrier_init,
    mbarrier_arrive_cluster,
)
from minicomp.script.function import script
from minicomp.script.hopper import (
    mbarrier_arrive,
    mbarrier_arrive_expect_tx,
    mbarrier_init,
    mbarrier_wait,
)
from minicomp.script.lang import (
    attrs,
    blockIdx,
    dim,
    dynamic_shared_tensor,
    gridDim,
    macro,
    register_tensor,
    shared_tensor,
    store_vec,
    syncthreads,
    threadIdx,
    unroll,
)
from minicomp.script.tma import tma_load
from minicomp.script.types import ScalarType, f32, i32, tensor_map, u64
from minicomp.script.wgmma import (
    wgmma_commit_group,
    wgmma_fence,
    wgmma_mma_async,
    wgmma_wait_group,
)

BK = 64  # K elements a stage for 16-bit operands: one 128-byte swizzle span (128 of float8)
SPAN = 128  # bytes of K a stage: the swizzle span
SWIZZLE = 128
WARPGROUP = 128
MAX_SHARED = 227 * 1024  # an H100's opt-in dynamic shared memory a block
BARRIER_BYTES = 1024  # static shared memory the barriers may take, with room to spare

CHUNK = 32  # columns of C a consumer warp stages at a time: a lane each as it stores
STAGING_ROW = CHUNK + staging_pad(CHUNK)  # f32 elements a staging row, padded (no conflicts)
STAGING_FLOATS = 4 * 16 * STAGING_ROW  # a warpgroup's staging rows: 16 rows a warp
INPUT_TYPES = (T.f16, T.bf16, T.f8e4m3fn, T.f8e5m2)
OUTPUT_TYPES = (T.f16, T.bf16, T.f32)


@dataclass(frozen=True)
class HopperConfig:
    """A block of `consumers` warpgroups (BM = 64 * consumers rows) and BN = `bn` columns, with
    `stages` stages in the ring; `cluster` = 2: clusters of two CTAs sharing `share`'s tile
    ("b": the CTAs are neighbours along M and read one B tile; "a": along N, one A tile), which
    rank 0 loads into both by TMA multicast."""

    bn: int = 128
    consumers: int = 2
    stages: int = 4
    cluster: int = 1
    share: str = "b"

    @property
    def bm(self) -> int:
        return 64 * self.consumers

    @property
    def threads(self) -> int:
        return WARPGROUP * self.consumers + 32

    @property
    def stage_bytes(self) -> int:
        return (self.bm + self.bn) * SPAN

    @property
    def ring_bytes(self) -> int:
        return self.stages * self.stage_bytes

    @property
    def shared_bytes(self) -> int:
        """The ring's stages, then each consumer warp's staging rows (see _staged_store)."""
        return self.ring_bytes + 4 * self.consumers * STAGING_FLOATS

    @property
    def name(self) -> str:
        shared = f"_c{self.cluster}{self.share}" if self.cluster > 1 else ""
        return f"{self.bm}x{self.bn}x{BK}_s{self.stages}{shared}"

    @property
    def tiles_per_unit(self) -> tuple[int, int]:
        """The tiles along M and N the CTAs of one cluster compute together."""
        if self.cluster == 1:
            return 1, 1
        return (self.cluster, 1) if self.share == "b" else (1, self.cluster)

    def check(self) -> None:
        if self.bn not in (64, 128, 192, 256) or self.consumers not in (1, 2):
            raise ValueError(
                f"matmul_hopper: no config with BN {self.bn}, {self.consumers} "
                "consumer warpgroups (BN 64, 128, 192 or 256; 1 or 2 warpgroups)"
            )
        if self.cluster not in (1, 2) or self.share not in ("a", "b"):
            raise ValueError(
                f"matmul_hopper[{self.name}]: clusters of 1 or 2 CTAs sharing operand a or b, "
                f"not {self.cluster} sharing {self.share!r}"
            )
        if self.stages < 2:
            # A stage is freed by the wait after the next step's mma's are issued, which
            # needs the next stage loaded: one stage alone would wait for itself.
            raise ValueError(
                f"matmul_hopper[{self.name}]: the ring needs 2 stages or more (one group of "
                f"mma's stays in flight), not {self.stages}"
            )
        if self.shared_bytes + BARRIER_BYTES > MAX_SHARED:
            raise ValueError(
                f"matmul_hopper[{self.name}]: {self.stages} stages of {self.stage_bytes} bytes "
                f"and the epilogue's staging rows do not fit {MAX_SHARED} bytes of shared memory"
            )


_TILES = (
    HopperConfig(bn=256, consumers=2, stages=4),
    HopperConfig(bn=128, consumers=2, stages=5),
    HopperConfig(bn=128, consumers=1, stages=6),
    HopperConfig(bn=64, consumers=1, stages=8),
)
CONFIGS = _TILES + tuple(
    HopperConfig(c.bn, c.consumers, c.stages, cluster=2, share="b") for c in _TILES
)
"""The configs offered: 128x256 (the large-shape tile: 128 accumulators a consumer thread),
128x128, 64x128 and 64x64 (more tiles for small products), each with as many stages as fit
comfortably under the shared-memory limit; and each in clusters of two CTAs along M that read
B's tile from L2 once (multicast), which halves B's L2 traffic."""


def offered_configs(sms: int) -> tuple[HopperConfig, ...]:
    """The CONFIGS a GPU of `sms` SMs can run: a cluster needs as many SMs as it has CTAs."""
    return tuple(c for c in CONFIGS if c.cluster <= sms)


def pick_config(
    m: int,
    n: int,
    sms: int = H100_SMS,
    batch: int = 1,
    *,
    k: int = 4096,
    in_bytes: int = 2,
    out_bytes: int = 2,
) -> HopperConfig:
    """The config of CONFIGS with the least `tile_time` for `batch` m x n x k products on `sms`
    SMs; of those within PICK_SLACK of it, the one computing the fewest padding rows and
    columns, then the larger tile: 128 x 256 for 4096 x 11008 (fewest operand re-reads
    through L2), in pairs sharing B's tile for 4096 x 4096 (tensor-bound then), 64 x 128 in
    pairs for 1024 x 1024 (128 blocks re-reading B's tile once a pair), 64 x 64 for a
    16-row decode product (the most blocks pulling the weight from DRAM)."""
    offered = offered_configs(sms)
    times = {c: tile_time(c, m, n, k, sms, batch, in_bytes, out_bytes) for c in offered}
    least = min(times.values())
    fitting = [c for c in offered if times[c] <= least * (1 + PICK_SLACK)]

    def padded(c: HopperConfig) -> int:  # a cluster's tiles past C's edge included
        um, un = c.tiles_per_unit
        return -(-m // (c.bm * um)) * c.bm * um * -(-n // (c.bn * un)) * c.bn * un

    return min(fitting, key=lambda c: (padded(c), -c.bm * c.bn))


def config_time(
    m: int,
    n: int,
    k: int,
    sms: int = H100_SMS,
    batch: int = 1,
    *,
    in_bytes: int = 2,
    out_bytes: int = 2,
) -> float:
    """The modelled time (`tile_time`) of the config `pick_config` chooses for `batch` m x n x k
    products on `sms` SMs: what the level-0 kernel costs, for passes weighing it."""
    c = pick_config(m, n, sms, batch, k=k, in_bytes=in_bytes, out_bytes=out_bytes)
    return tile_time(c, m, n, k, sms, batch, in_bytes, out_bytes)


def tile_time(
    c: HopperConfig, m: int, n: int, k: int, sms: int, batch: int, in_bytes: int, out_bytes: int
) -> float:
    """The level-0 model of `c`'s kernel, in wgmma flops of one SM (matmul_tc.product_work's
    unit at the wgmma rate), the longest of: the busiest SM's tiles (ceil(tiles / SMs) of BM x
    BN x K, padding included; a cluster's units on SMs / cluster slots); every tile's A and B
    panels through L2 (a cluster's shared panel once); each operand and C once through DRAM.
    The busy SMs pull at most twice their even share of L2 and DRAM (as the lens assumes), so
    a grid of few tiles also waits for memory."""
    um, un = c.tiles_per_unit
    units = batch * -(-m // (c.bm * um)) * -(-n // (c.bn * un))
    tiles = units * c.cluster  # a cluster's second tile past C's edge is computed all the same
    reach = min(1.0, 2 * min(tiles, sms) / sms)
    compute = -(-units // (sms // c.cluster)) * c.bm * c.bn * 2 * k
    # A cluster reads its shared tile from L2 once, by multicast: bm * um + bn * un rows.
    l2 = units * (c.bm * um + c.bn * un) * k * in_bytes * WGMMA_FLOPS_PER_L2_BYTE / sms
    dram_bytes = batch * ((m + n) * k * in_bytes + m * n * out_bytes)
    dram = dram_bytes * WGMMA_FLOPS_PER_DRAM_BYTE / sms
    return max(compute, l2 / reach, dram / reach)


PICK_SLACK = 0.1
"""How much longer a larger tile's modelled time may be: at 256 x 4096 x 4096 the 64 x 128
tile (128 blocks) is within it of 64 x 64 (256 blocks, two rounds) and takes half the blocks."""
# The model's prices of memory traffic, in wgmma flops of one SM for a byte the GPU moves,
# times its SM count: an H100's 989 TFLOP/s over 3.35 TB/s of DRAM and over the lens's ~10
# TB/s of L2 (lens/devices.py).
WGMMA_FLOPS_PER_DRAM_BYTE = 295
WGMMA_FLOPS_PER_L2_BYTE = 99


@functools.cache
def kernel(
    config: HopperConfig,
    in_type: T.DataType = T.f16,
    out_type: T.DataType = T.f16,
    bug: str = "",
):
    """The script kernel of `config` for `in_type` operands (f16, bf16, f8e4m3fn, f8e5m2) and
    an `out_type` C (f16, bf16 or f32): matmul_hopper(a, b, c, grid=blocks) computes
    c = a @ b.T with a persistent grid of `blocks` (at most the SMs).

    `bug` plants one, for the tests: "parity" (the producer waits for the wrong phase of a
    free stage), "early_release" (consumers free a stage as soon as they have issued its
    mma's, before the wait that retires them), "own_release" (in a cluster, each CTA's
    consumers free a stage on their own CTA only, so that rank 0 refills the shared tile
    while rank 1 may still read it).

    With `config.cluster` = 2 the grid is clusters of two CTAs (`grid` even) that compute a
    unit of two neighbouring tiles sharing one operand's tile, which rank 0's producer loads
    into both CTAs by multicast; each CTA loads its other operand itself. Rank 0's empty
    barriers expect the consumers of both CTAs (rank 1's arrive remotely), so it refills a
    stage only when both have retired its mma's; a unit's second tile past C's edge still
    takes part in the copies and barriers, and stores nothing."""
    config.check()
    if in_type not in INPUT_TYPES or out_type not in OUTPUT_TYPES:
        raise ValueError(
            f"matmul_hopper: operands are f16, bf16 or float8 and C f16, bf16 or f32, not "
            f"{in_type} and {out_type}"
        )
    dtype, out_dtype = ScalarType(in_type), ScalarType(out_type)
    BM, BN, STAGES = config.bm, config.bn, config.stages
    CONSUMERS = WARPGROUP * config.consumers
    STAGE_BYTES = config.stage_bytes
    B_AT = STAGES * BM * SPAN  # byte offset of B's stages: a multiple of 1024
    KS = SPAN // in_type.nbytes  # K elements a stage
    STEP = 32 // in_type.nbytes  # K elements an mma_async
    ACC = BN // 2
    NAME = f"matmul_hopper[{config.name}]"

    CL = config.cluster
    UM, UN = config.tiles_per_unit  # tiles along M and N of one cluster's unit of work
    SHARE_B, SHARE_A = CL > 1 and config.share == "b", CL > 1 and config.share == "a"
    # The slot's empty barrier of the CTA loading the shared tile into both (rank 0) collects
    # the consumers of both CTAs; the other CTA's, its own.
    EMPTY_COUNT = CONSUMERS * CL

    @script
    def matmul_hopper(
        a: tensor_map(dtype[dim.m, dim.k], box=(BM, KS), swizzle=SWIZZLE),
        b: tensor_map(dtype[dim.n, dim.k], box=(BN, KS), swizzle=SWIZZLE),
        c: out_dtype[dim.m, dim.n],
        m: i32,
        n: i32,
        k: i32,
        grid: i32,
    ):
        attrs.grid_dim = grid
        attrs.block_dim = CONSUMERS + 32
        attrs.min_blocks = 1
        attrs.template = NAME
        if CL > 1:
            attrs.cluster_dim = CL
            attrs.block_group = CL  # the lens samples whole clusters
        t = threadIdx.x
        rank = cluster_ctarank() if CL > 1 else 0
        a_s = dynamic_shared_tensor(dtype, (STAGES, BM, KS), at=0)
        b_s = dynamic_shared_tensor(dtype, (STAGES, BN, KS), at=B_AT)
        full = shared_tensor(u64, (STAGES,))
        empty = shared_tensor(u64, (STAGES,))
        if t == 0:
            for s in range(STAGES):
                mbarrier_init(full[s], 1)
                if CL > 1 and bug != "own_release":
                    mbarrier_init(empty[s], EMPTY_COUNT if rank == 0 else CONSUMERS)
                else:
                    mbarrier_init(empty[s], CONSUMERS)
            if CL > 1:
                fence_mbarrier_init()
        if CL > 1:
            cluster_sync()  # the other CTA's barriers are initialised
        else:
            syncthreads()
        units_m = ((m + BM - 1) // BM + UM - 1) // UM
        units = units_m * (((n + BN - 1) // BN + UN - 1) // UN)
        steps = (k + KS - 1) // KS
        it = 0  # the block's K steps so far, over its tiles: the ring's position
        unit = blockIdx.x // CL
        if t == CONSUMERS:  # the producer: one thread issues every copy
            while unit < units:
                m0 = (unit % units_m * UM + (rank if SHARE_B else 0)) * BM
                n0 = (unit // units_m * UN + (rank if SHARE_A else 0)) * BN
                for kt in range(steps):
                    s = it % STAGES
                    if bug == "parity":
                        mbarrier_wait(empty[s], it // STAGES % 2)
                    else:
                        mbarrier_wait(empty[s], it // STAGES % 2 ^ 1)
                    mbarrier_arrive_expect_tx(full[s], STAGE_BYTES)
                    if SHARE_A:
                        if rank == 0:
                            tma_load(a_s[s], a, m0, kt * KS, full[s], multicast=3)
                    else:
                        tma_load(a_s[s], a, m0, kt * KS, full[s])
                    if SHARE_B:
                        if rank == 0:
                            tma_load(b_s[s], b, n0, kt * KS, full[s], multicast=3)
                    else:
                        tma_load(b_s[s], b, n0, kt * KS, full[s])
                    it += 1
                unit += grid // CL
        elif t < CONSUMERS:
            wg = t // WARPGROUP
            w = t % WARPGROUP // 32
            lane = t % 32
            acc = register_tensor(f32, (ACC,))
            while unit < units:
                m0 = (unit % units_m * UM + (rank if SHARE_B else 0)) * BM
                n0 = (unit // units_m * UN + (rank if SHARE_A else 0)) * BN
                for i in unroll(range(ACC)):
                    acc[i] = 0.0
                for kt in range(steps):
                    s = it % STAGES
                    mbarrier_wait(full[s], it // STAGES % 2)
                    wgmma_fence()
                    for kk in unroll(range(KS // STEP)):
                        wgmma_mma_async(
                            acc, a_s[s, 64 * wg, STEP * kk], b_s[s, 0, STEP * kk], swizzle=SWIZZLE
                        )
                    wgmma_commit_group()
                    if bug == "early_release":
                        mbarrier_arrive(empty[s])
                    wgmma_wait_group(1)  # the step before has retired: free its stage
                    if kt > 0 and bug != "early_release":
                        done = (it + STAGES - 1) % STAGES
                        mbarrier_arrive(empty[done])
                        if CL > 1 and bug != "own_release":
                            if rank != 0:  # rank 0's producer refills both CTAs' stage
                                mbarrier_arrive_cluster(empty[done], 0)
                    it += 1
                wgmma_wait_group(0, acc)
                if steps > 0 and bug != "early_release":
                    done = (it + STAGES - 1) % STAGES
                    mbarrier_arrive(empty[done])
                    if CL > 1 and bug != "own_release":
                        if rank != 0:
                            mbarrier_arrive_cluster(empty[done], 0)
                row = m0 + 64 * wg + 16 * w + lane // 4
                col = n0 + 2 * (lane % 4)
                for i in unroll(range(ACC)):
                    r = row + 8 * (i // 2 % 2)
                    cc = col + 8 * (i // 4) + i % 2
                    if r < m and cc < n:
                        c[r, cc] = out_dtype(acc[i])
                unit += grid // CL
        if CL > 1:
            cluster_sync()  # no CTA leaves while the other may still signal its barriers

    return matmul_hopper


def matmul_hopper(
    a, b, out=None, config: HopperConfig | None = None, grid: int | None = None, sms=H100_SMS
):
    """out = a @ b.T by the Hopper kernel of `config` (default: `pick_config` for `sms` SMs),
    for torch tensors: a [M, K] and b [N, K] f16, bf16 or float8 (the same), out [M, N]
    contiguous in f16, bf16 or f32 (default: a new one of a's type, f16 for float8). `grid`
    is the number of persistent blocks (default: one a tile, at most `sms`; a multiple of
    the config's cluster)."""
    if a.dim() != 2 or b.dim() != 2 or a.shape[1] != b.shape[1]:
        raise ValueError(
            f"matmul_hopper: a [M, K] and b [N, K] with the same K, not {list(a.shape)} and "
            f"{list(b.shape)}"
        )
    in_type = T.from_torch(a.dtype)
    if a.dtype != b.dtype or in_type not in INPUT_TYPES:
        raise ValueError(
            f"matmul_hopper: a and b must both be float16, bfloat16, float8_e4m3fn or "
            f"float8_e5m2, not {a.dtype} and {b.dtype}"
        )
    (m, k), n = a.shape, b.shape[0]
    if out is None:
        out = a.new_empty(m, n, dtype=a.dtype if in_type.nbytes == 2 else T.to_torch(T.f16))
    out_type = T.from_torch(out.dtype)
    if tuple(out.shape) != (m, n) or not out.is_contiguous() or out_type not in OUTPUT_TYPES:
        raise ValueError(
            f"matmul_hopper: out must be a contiguous [{m}, {n}] float16, bfloat16 or float32 "
            f"tensor, not {out.dtype} {list(out.shape)} with strides {out.stride()}"
        )
    if out.numel() == 0 or k == 0:  # nothing to load: TMA has no map of an empty dimension
        return out.zero_()
    size = in_type.nbytes, out_type.nbytes
    config = config or pick_config(m, n, sms, k=k, in_bytes=size[0], out_bytes=size[1])
    um, un = config.tiles_per_unit
    units = -(-m // (config.bm * um)) * -(-n // (config.bn * un))
    cl = config.cluster
    if grid is None:
        grid = cl * min(units, sms // cl)
    if grid % cl:
        raise ValueError(
            f"matmul_hopper[{config.name}]: a grid of whole clusters of {cl}, not {grid}"
        )
    kernel(config, in_type, out_type)(a, b, out, grid=max(grid, cl))
    return out


# ---- the template: the compiler's choice for products on sm_90a ----

NAME = "matmul_hopper"
MIN_ROWS = 64
"""The fewest rows of C the template takes: one consumer warpgroup's 64-row wgmma tile. Below
it most of each mma is padding, and the product is DRAM-bound on the weight anyway, where the
lens puts matmul_tc (with its split of K) level with it (16 x 4096 x 11008: 27.9 us both,
benchmarks/results/lens-h100-2026-12-07-hopper.txt)."""
TEMPLATE_TYPES = (T.f16, T.bf16)
MAX_BATCH_DIMS = 2
"""The batch variables an operand may move along: its map's outer dimensions, under TMA's
five."""


def refusal(problem) -> str | None:
    """Why the template does not compute MatmulProblem `problem`, in a few words for explain;
    None when it does: f16 or bf16 operands summed in f32 on sm_90a, at least MIN_ROWS rows
    where M is static (a symbolic M, the tokens of a serving batch, takes the template at every
    size), and both operands plain reads with K contiguous whose rows, start and batch strides
    (static; a broadcast batch's 0 aside, at most MAX_BATCH_DIMS of them an operand) are
    multiples of 16 bytes. TMA copies memory as it is, so an operand with a
    fused prologue (a relu, a cast of A) is refused; on sm_90a fusion leaves such a prologue in
    a kernel of its own where the product is one the template takes (reads_by_tma)."""
    if problem.arch != WGMMA_ARCH:
        return f"wgmma needs {WGMMA_ARCH}, not {problem.arch}"
    a, b = problem.a_dtype, problem.b_dtype
    if problem.acc_dtype != T.f32 or a != b or a not in TEMPLATE_TYPES:
        return f"{a.short} x {b.short} operands (it takes f16 or bf16 summed in f32)"
    batch, m, n, k = problem.batch, problem.m, problem.n, problem.k
    if any(isinstance(x, int) and x == 0 for x in (batch, m, n, k)):
        return "an empty product"
    if isinstance(m, int) and m < MIN_ROWS:
        return f"M = {m} rows, fewer than a {MIN_ROWS}-row wgmma tile"
    for side, plain in (("A", problem.plain_a), ("B", problem.plain_b)):
        if plain is None:
            return f"{side} has a fused prologue or a gathered window (TMA copies memory as it is)"
        nbytes = plain.dtype.nbytes
        if plain.contiguous != "k" and nbytes != 2:
            return f"{side} is stored MN-major (wgmma reads float8 operands K-major only)"
        if not isinstance(plain.ld, int) or not isinstance(plain.base, int):
            return f"{side}'s strides are symbolic"
        if plain.ld * nbytes % 16 or plain.base * nbytes % 16:
            return (
                f"{side}'s rows start every {plain.ld * nbytes} bytes from byte "
                f"{plain.base * nbytes} (TMA needs multiples of 16)"
            )
        dims = batch_dims(plain)
        if len(dims) > MAX_BATCH_DIMS:
            return f"{side} has {len(dims)} batch dimensions (the template takes {MAX_BATCH_DIMS})"
        for _, _, stride in dims:
            if not isinstance(stride, int):
                return f"{side}'s batch strides are symbolic"
            if stride < 0 or stride * nbytes % 16:
                return (
                    f"{side}'s batch stride is {stride * nbytes} bytes (TMA needs a positive "
                    "multiple of 16)"
                )
    return None


def reads_by_tma(c) -> bool:
    """Whether the template would compute Contraction `c` (minicomp.ir.contraction) were its
    operands plain reads: f16 or bf16 summed in f32, at least MIN_ROWS rows where M is
    static. On sm_90a, fusion keeps a computing producer of such a product's operands (a
    relu, a cast of A) in a kernel of its own (passes/graph/fusion.py), since TMA copies memory
    as it is."""
    a, b = c.operand_dtypes
    if c.acc_dtype != T.f32 or a != b or a not in TEMPLATE_TYPES:
        return False
    m = prod(x for _, x in c.m)
    return not isinstance(m, int) or m >= MIN_ROWS


def applies(problem) -> bool:
    """Whether the template computes `problem` (see refusal)."""
    return refusal(problem) is None


def heuristic(problem) -> HopperConfig:
    """pick_config for the problem's size and SMs (a symbolic size counted as large)."""
    batch, m, n = assumed_sizes(problem)
    k = problem.k if isinstance(problem.k, int) else 4096
    in_bytes = problem.op.inputs[0].dtype.nbytes
    out_bytes = problem.out_dtypes[0].nbytes if problem.out_dtypes else 2
    return pick_config(m, n, problem.sms, batch, k=k, in_bytes=in_bytes, out_bytes=out_bytes)


def space(problem, level: int) -> list[HopperConfig]:
    """The heuristic's config at level 0; every config of CONFIGS above."""
    if level <= 0:
        return [heuristic(problem)]
    return list(dict.fromkeys((heuristic(problem), *offered_configs(problem.sms))))


def instantiate(problem, config: HopperConfig) -> Function:
    """The kernel of `problem` (which `applies`) with `config`: the tensor maps of A and B first
    (attrs.tensor_maps: the plan encodes them), then the group's buffers and sizes; the
    epilogue (problem.store_c) applied to each accumulator element as it is stored.

    Tile t of a block is product t // (tiles of C) of the batch; an operand's batch
    variables with a stride are its map's outer dimensions (a box of one along each), so
    a broadcast operand (stride 0) is read from one matrix, and per-head products of a
    transposed view need no copy."""
    config.check()
    M, N, K, BATCH = problem.m, problem.n, problem.k, problem.batch
    dtype = ScalarType(problem.a_dtype)
    BM, BN, STAGES = config.bm, config.bn, config.stages
    CONSUMERS = WARPGROUP * config.consumers
    STAGE_BYTES = config.stage_bytes
    B_AT = STAGES * BM * SPAN
    KS = SPAN // problem.a_dtype.nbytes
    STEP = 32 // problem.a_dtype.nbytes
    ACC = BN // 2
    CL = config.cluster
    UM, UN = config.tiles_per_unit  # the tiles along M and N of one cluster's unit of work
    SHARE_A, SHARE_B = CL > 1 and config.share == "a", CL > 1 and config.share == "b"
    # A symbolic size (the launch's M) is read at run time: the grid, the tile loop's bounds.
    UNITS = prod((BATCH, ceil_div(ceil_div(M, BM), UM), ceil_div(ceil_div(N, BN), UN)))
    SLOTS = problem.sms // CL  # clusters that fit at once
    if isinstance(UNITS, int):
        GRID = CL * min(max(UNITS, 1), SLOTS)
    else:
        GRID = CL * minimum(maximum(UNITS, 1), SLOTS)
    # A unit's second tile may lie past C's edge even where BM (BN) divides M (N).
    store_c = problem.store_c(check_m=needs_check(M, BM * UM), check_n=needs_check(N, BN * UN))
    names = Names()
    store = _staged_store(names, store_c, BN)
    WARPS = CONSUMERS // 32
    RING = config.ring_bytes  # the staging rows' byte offset: after the ring
    a, b = problem.plain_a, problem.plain_b
    load_a, A_BOX, A_STAGE = _operand_copy(names, "a", a, BM, KS, multicast=SHARE_A)
    load_b, B_BOX, B_STAGE = _operand_copy(names, "b", b, BN, KS, multicast=SHARE_B)
    A_STAGES, B_STAGES = (STAGES, *A_STAGE), (STAGES, *B_STAGE)
    A_MN, B_MN = a.contiguous == "mn", b.contiguous == "mn"
    # One product: tile t's column of tiles is t // tiles_m, never a constant. (Where C is one
    # column of tiles, a column 0 known at compile time lets ptxas hoist the epilogue's column
    # guards out of the tile loop: 128 x 256 tiles then spill.)
    BATCHED = not (isinstance(BATCH, int) and BATCH == 1)

    @script(params=problem.params)
    def matmul_hopper(
        tma_a: tensor_map(dtype, box=A_BOX, swizzle=SWIZZLE),
        tma_b: tensor_map(dtype, box=B_BOX, swizzle=SWIZZLE),
    ):
        attrs.grid_dim = GRID
        attrs.block_dim = CONSUMERS + 32
        if CL > 1:
            attrs.cluster_dim = CL
            attrs.block_group = CL  # the lens samples whole clusters
        t = threadIdx.x
        rank = cluster_ctarank() if CL > 1 else 0
        a_s = dynamic_shared_tensor(dtype, A_STAGES, at=0)
        b_s = dynamic_shared_tensor(dtype, B_STAGES, at=B_AT)
        c_s = dynamic_shared_tensor(f32, (WARPS, 16, STAGING_ROW), at=RING)
        full = shared_tensor(u64, (STAGES,))
        empty = shared_tensor(u64, (STAGES,))
        staged = shared_tensor(u64, (WARPS,))  # a consumer warp's own: its lanes meet there
        if t == 0:
            for s in range(STAGES):
                mbarrier_init(full[s], 1)
                # Rank 0's producer refills both CTAs' stage: both CTAs' consumers free it.
                mbarrier_init(empty[s], CONSUMERS * CL if rank == 0 else CONSUMERS)
            for wi in range(WARPS):
                mbarrier_init(staged[wi], 32)
            if CL > 1:
                fence_mbarrier_init()
        if CL > 1:
            cluster_sync()  # the other CTA's barriers are initialised
        else:
            syncthreads()
        units_m = ((M + BM - 1) // BM + UM - 1) // UM
        units_c = units_m * (((N + BN - 1) // BN + UN - 1) // UN)
        units = BATCH * units_c
        steps = (K + KS - 1) // KS
        it = 0  # the block's K steps so far, over its tiles: the ring's position
        unit = blockIdx.x // CL
        if t == CONSUMERS:  # the producer (see kernel())
            while unit < units:
                bz = unit // units_c
                rest = unit % units_c if BATCHED else unit  # (see BATCHED)
                m0 = (rest % units_m * UM + (rank if SHARE_B else 0)) * BM
                n0 = (rest // units_m * UN + (rank if SHARE_A else 0)) * BN
                for kt in range(steps):
                    s = it % STAGES
                    mbarrier_wait(empty[s], it // STAGES % 2 ^ 1)
                    mbarrier_arrive_expect_tx(full[s], STAGE_BYTES)
                    if not SHARE_A or rank == 0:
                        load_a(a_s, tma_a, full, s, bz, m0, kt * KS)
                    if not SHARE_B or rank == 0:
                        load_b(b_s, tma_b, full, s, bz, n0, kt * KS)
                    it += 1
                unit += gridDim.x // CL
        elif t < CONSUMERS:
            wg = t // WARPGROUP
            w = t % WARPGROUP // 32
            lane = t % 32
            acc = register_tensor(f32, (ACC,))
            while unit < units:
                bz = unit // units_c
                rest = unit % units_c if BATCHED else unit  # (see BATCHED)
                m0 = (rest % units_m * UM + (rank if SHARE_B else 0)) * BM
                n0 = (rest // units_m * UN + (rank if SHARE_A else 0)) * BN
                for i in unroll(range(ACC)):
                    acc[i] = 0.0
                for kt in range(steps):
                    s = it % STAGES
                    mbarrier_wait(full[s], it // STAGES % 2)
                    wgmma_fence()
                    for kk in unroll(range(KS // STEP)):
                        # An MN-major stage is spans of 64 rows of K rows each (see
                        # _operand_copy): the warpgroup's 64 rows of A are span wg.
                        k = STEP * kk
                        if A_MN and B_MN:
                            wgmma_mma_async(
                                acc,
                                a_s[s, wg, k, 0],
                                b_s[s, 0, k, 0],
                                swizzle=SWIZZLE,
                                trans_a=True,
                                trans_b=True,
                            )
                        elif A_MN:
                            wgmma_mma_async(
                                acc, a_s[s, wg, k, 0], b_s[s, 0, k], swizzle=SWIZZLE, trans_a=True
                            )
                        elif B_MN:
                            wgmma_mma_async(
                                acc,
                                a_s[s, 64 * wg, k],
                                b_s[s, 0, k, 0],
                                swizzle=SWIZZLE,
                                trans_b=True,
                            )
                        else:
                            wgmma_mma_async(acc, a_s[s, 64 * wg, k], b_s[s, 0, k], swizzle=SWIZZLE)
                    wgmma_commit_group()
                    wgmma_wait_group(1)
                    if kt > 0:
                        done = (it + STAGES - 1) % STAGES
                        mbarrier_arrive(empty[done])
                        if CL > 1:
                            if rank != 0:
                                mbarrier_arrive_cluster(empty[done], 0)
                    it += 1
                wgmma_wait_group(0, acc)
                done = (it + STAGES - 1) % STAGES
                mbarrier_arrive(empty[done])
                if CL > 1:
                    if rank != 0:
                        mbarrier_arrive_cluster(empty[done], 0)
                store(acc, c_s[t // 32], staged, t // 32, bz, m0 + 64 * wg + 16 * w, n0, lane)
                unit += gridDim.x // CL
        if CL > 1:
            cluster_sync()  # no CTA leaves while the other may still signal its barriers

    maps = (_map_entry("tma_a", a, M, K), _map_entry("tma_b", b, N, K))
    return finish(
        matmul_hopper.ir, problem.name, f"{NAME}[{config.name}]", min_blocks=1, tensor_maps=maps
    )


def _staged_store(names: Names, store_c, bn: int):
    """Macro `store(acc, rows, bars, warp, bz, row0, col0, lane)`: the epilogue of a consumer
    warp's 16 rows (row0...) by `bn` columns (col0...) of C, accumulator fragment `acc`, through
    its staging rows `rows` (16 x STAGING_ROW f32) CHUNK columns at a time: its lanes write
    their fragment's pairs (8-byte stores, rows padded as matmul_tc's: no bank conflicts),
    then store the chunk along its rows with `store_c`, lane l on column l, so that each store
    instruction covers CHUNK consecutive elements of a row of C (whole sectors). The lanes
    meet at the warp's own mbarrier `bars[warp]` (32 arrivals) after writing and after
    reading, two phases a chunk, so the parities waited for are 0 then 1 on every tile."""
    CHUNKS, JS = bn // CHUNK, CHUNK // 8

    def build(acc, rows, bars, warp, bz, row0, col0, lane):
        @script
        def store_tile():
            g = lane // 4
            tq = lane % 4
            pair = register_tensor(f32, 2)
            for ch in unroll(range(CHUNKS)):
                # Element 4j + 2h + e of the fragment: row g + 8h, column 8j + 2tq + e.
                for j in unroll(range(JS)):
                    for h in unroll(range(2)):
                        pair[0] = acc[4 * (JS * ch + j) + 2 * h]
                        pair[1] = acc[4 * (JS * ch + j) + 2 * h + 1]
                        store_vec(rows[g + 8 * h, 8 * j + 2 * tq], pair)
                mbarrier_arrive(bars[warp])
                mbarrier_wait(bars[warp], 0)
                for r in range(16):
                    store_c(bz, row0 + r, col0 + CHUNK * ch + lane, rows[r, lane])
                mbarrier_arrive(bars[warp])  # every lane has read the chunk: the next may land
                mbarrier_wait(bars[warp], 1)

        return store_tile

    return names.fragment("c", build)


def batch_dims(plain) -> tuple[tuple[Var, Dim, Dim], ...]:
    """(variable, extent, stride) of each batch variable plain operand `plain` moves along:
    the outer dimensions of its tensor map (a broadcast one, stride 0, is not one)."""
    return tuple(
        (v, x, s)
        for (v, x), s in zip(plain.batch, plain.batch_strides)
        if not (isinstance(x, int) and x == 1) and not (isinstance(s, int) and s == 0)
    )


def _coordinates(plain, dims) -> list:
    """Macros giving the coordinate of flat batch `bz` along each of `dims`, batch variables of
    plain operand `plain` (None for the unused ones of MAX_BATCH_DIMS)."""
    out: list = [None] * MAX_BATCH_DIMS
    for j, (v, _, _) in enumerate(dims):

        def coordinate(bz, v=v):
            flat = cast(as_expr(bz, T.i64), T.i64)
            return cast(unravel(flat, plain.batch)[v], T.i32)

        out[j] = macro(coordinate)
    return out


def _operand_copy(names: Names, tag: str, plain, rows: int, ks: int, multicast: bool = False):
    """(macro `load(ring, map, bars, s, bz, mn0, k0)`, the map's box, a stage's shape) of plain
    operand `plain` in tiles of `rows` rows (of M or N) by `ks` of K. A K-major operand is one
    box of rows x ks a stage, a stage (rows, ks); an MN-major one ([K, N] B, a transposed
    view's A) boxes of ks K rows of SPAN bytes of MN (the swizzle span), rows / 64 of them a
    stage, (rows / 64, ks, 64): wgmma's MN-major layout under a 128-byte swizzle. `load`
    copies operand tile (batch bz, mn0, k0) into stage s of `ring`, completing on `bars[s]`;
    with `multicast`, into both CTAs of a cluster of two, each completing on its own."""
    dims = batch_dims(plain)
    RANK = len(dims)
    C0, C1 = _coordinates(plain, dims)
    MN = plain.contiguous == "mn"
    WIDE = SPAN // plain.dtype.nbytes
    SPANS = rows // WIDE
    ones = (1,) * RANK
    MASK = 3 if multicast else None  # both CTAs of the cluster, or a plain load
    if multicast:
        tag += "_multicast"
    if MN:
        box, stage = (*ones, ks, WIDE), (SPANS, ks, WIDE)
    else:
        box, stage = (*ones, rows, ks), (rows, ks)

    def build(ring, tmap, bars, s, bz, mn0, k0):
        @script
        def load_operand():
            if MN:
                for j in unroll(range(SPANS)):
                    if RANK == 0:
                        tma_load(ring[s, j], tmap, k0, mn0 + WIDE * j, bars[s], multicast=MASK)
                    elif RANK == 1:
                        tma_load(
                            ring[s, j], tmap, C0(bz), k0, mn0 + WIDE * j, bars[s], multicast=MASK
                        )
                    else:
                        tma_load(
                            ring[s, j],
                            tmap,
                            C0(bz),
                            C1(bz),
                            k0,
                            mn0 + WIDE * j,
                            bars[s],
                            multicast=MASK,
                        )
            elif RANK == 0:
                tma_load(ring[s], tmap, mn0, k0, bars[s], multicast=MASK)
            elif RANK == 1:
                tma_load(ring[s], tmap, C0(bz), mn0, k0, bars[s], multicast=MASK)
            else:
                tma_load(ring[s], tmap, C0(bz), C1(bz), mn0, k0, bars[s], multicast=MASK)

        return load_operand

    return names.fragment(tag, build), box, stage


def _map_entry(name: str, plain, rows: Dim, k: Dim) -> tuple:
    """attrs.tensor_maps' entry of operand `plain` read through map `name`: rows x k (k x rows
    MN-major) below its batch dimensions (outermost first)."""
    dims = batch_dims(plain)
    inner = (k, rows) if plain.contiguous == "mn" else (rows, k)
    shape = (*(x for _, x, _ in dims), *inner)
    strides = (*(s for _, _, s in dims), plain.ld, 1)
    return (name, plain.ref.var.name, plain.base, shape, strides)


TEMPLATE = Template(NAME, space, heuristic, instantiate, applies)
