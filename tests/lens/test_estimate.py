"""The roofline estimate from a counted launch: a copy is DRAM-bound near its roofline, a
strided gather moves 8x the DRAM it needs, bank conflicts and partial waves show where the time
goes, a block that cannot fit does not launch."""

import dataclasses
import math

import pytest
import torch

from minicomp.backends.cuda.emu import build_emulated
from minicomp.backends.cuda.nvrtc import KernelResources
from minicomp.ir import stmt as S
from minicomp.ir.expr import Var
from minicomp.ir.func import Function, LaunchAttrs
from minicomp.ir.types import PointerType, f32, i32
from minicomp.lens.counts import KernelCounts, l2_resident, scratch_positions
from minicomp.lens.devices import get_device
from minicomp.lens.estimate import ASSUMPTIONS, estimate

KERNELS = r"""
extern "C" __global__ void copy(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i];
}
extern "C" __global__ void gather32(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = x[i * 32];
}
extern "C" __global__ void column_sums(const float* x, float* y, int n) {
    __shared__ float t[32][32];
    for (int r = 0; r < 32; r++) t[r][threadIdx.x] = x[(blockIdx.x * 32 + r) * 32 + threadIdx.x];
    __syncthreads();
    float s = 0;
    for (int c = 0; c < 32; c++) s += t[threadIdx.x][c];  // a row per lane: 32-way conflicts
    y[blockIdx.x * 32 + threadIdx.x] = s;
}
extern "C" __global__ void through_scratch(const float* x, float* parts, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    parts[i] = 2.0f * x[i];
    __syncthreads();
    y[i] = parts[i ^ 1] + 1.0f;  // a neighbour's part: written before it is read
}
"""
SIGNATURES = [
    ("copy", "const float*, float*, int"),
    ("gather32", "const float*, float*, int"),
    ("column_sums", "const float*, float*, int", True),
    ("through_scratch", "const float*, float*, float*, int", True),
]
H100 = get_device("h100")


@pytest.fixture(scope="module")
def lens(tmp_path_factory):
    return build_emulated(
        KERNELS, SIGNATURES, cache_dir=str(tmp_path_factory.mktemp("c")), lens=True
    )


def counts(lens, name, grid, block, args):
    return KernelCounts.from_sample(lens.launch_counted(name, grid, block, args, sample_only=True))


def test_a_large_copy_is_dram_bound_at_its_roofline(lens):
    n = 1 << 22
    c = counts(lens, "copy", n // 256, 256, [torch.empty(n), torch.empty(n), n])
    assert c.dram_bytes == c.minimum_bytes == 8 * n  # scaled from 8 of 16384 blocks
    e = estimate(c, H100)
    assert e.bound == "dram"
    assert e.time == pytest.approx(8 * n / 3350e9)  # 16384 blocks: every SM pulls its share
    assert e.fraction_of_roofline > 0.95 and not e.notes


def test_a_strided_gather_moves_eight_times_the_bytes_it_needs(lens):
    n = 1 << 20
    c = counts(lens, "gather32", n // 256, 256, [torch.empty(32 * n), torch.empty(n), n])
    assert c.sector_efficiency < 0.25
    # x: a sector for every 4 bytes used; y: written whole.
    assert c.dram_bytes == pytest.approx(32 * n + 4 * n)
    assert c.minimum_bytes == pytest.approx(8 * n)
    e = estimate(c, H100)
    assert e.fraction_of_roofline == pytest.approx(8 / 36, rel=0.05)
    assert any("sectors" in note for note in e.notes)


def test_bank_conflicts_and_resources_show_in_the_estimate(lens):
    blocks = 4 * 132
    c = counts(
        lens, "column_sums", blocks, 32, [torch.randn(blocks * 1024), torch.empty(blocks * 32), 0]
    )
    assert c.bank_conflict_factor == pytest.approx((32 + 32 * 32) / (32 + 32))
    e = estimate(c, H100, KernelResources(registers=32, shared_bytes=4096))
    assert any("bank conflicts" in note for note in e.notes)
    assert e.bound == "shared" and e.times["shared"] > 3 * e.times["dram"]
    assert e.occupancy.blocks_per_sm == 32 and e.waves == pytest.approx(4 / 32)
    assert e.tail_efficiency == 1  # 4 blocks on every SM


def test_a_grid_smaller_than_the_gpu_uses_only_some_sms(lens):
    """16 blocks on 132 SMs: their own units work at 16/132 of the GPU's rate, and they pull
    twice their share of DRAM bandwidth; with 100 blocks they pull all of it."""
    n = 16 * 256
    c = counts(lens, "copy", 16, 256, [torch.empty(n), torch.empty(n), n])
    e = estimate(c, H100)
    assert e.tail_efficiency == pytest.approx(16 / 132)
    assert e.stretched["dram"] == pytest.approx(e.times["dram"] * 132 / 32)
    assert e.stretched["issue"] == pytest.approx(e.times["issue"] * 132 / 16)
    assert e.time == max(e.stretched.values())
    n = 100 * 256
    e = estimate(counts(lens, "copy", 100, 256, [torch.empty(n), torch.empty(n), n]), H100)
    assert e.bound == "dram" and e.stretched["dram"] == e.times["dram"]


def test_a_block_that_does_not_fit_does_not_launch(lens):
    c = counts(lens, "copy", 4, 1024, [torch.empty(4096), torch.empty(4096), 4096])
    e = estimate(c, H100, KernelResources(registers=255))  # 32 warps of 255 registers
    assert e.occupancy.blocks_per_sm == 0 and math.isinf(e.time)
    assert e.fraction_of_roofline == 0 and "does not launch" in e.notes[0]
    assert e.as_dict()["time_us"] is None


def test_fewer_than_four_warps_an_sm_leave_sub_partitions_idle(lens):
    """A warp runs on one of its SM's four sub-partitions: one block of one warp on each SM
    gets a quarter of the SM's FP32 and issue rate, four warps (one block of four, or two
    resident blocks of two) all of it."""
    n = 132 * 32
    c = counts(lens, "copy", 132, 32, [torch.empty(n), torch.empty(n), n])
    c = dataclasses.replace(c, fp_instructions=1e9)
    regs = KernelResources(registers=32)
    one = estimate(c, H100, regs)
    assert one.sub_partitions == 1
    assert any("1 of 4 SM sub-partitions" in note for note in one.notes)
    four = estimate(dataclasses.replace(c, block=(128, 1, 1)), H100, regs)
    assert four.sub_partitions == 4 and not any("sub-partitions" in x for x in four.notes)
    assert one.times["fp32"] == pytest.approx(4 * four.times["fp32"])
    assert one.times["issue"] == pytest.approx(4 * four.times["issue"])
    assert one.times["dram"] == four.times["dram"]  # not an SM's unit
    pair = dataclasses.replace(c, block=(64, 1, 1))
    assert estimate(pair, H100, regs).sub_partitions == 2
    # Twice the blocks: two resident on every SM, four warps.
    two = estimate(dataclasses.replace(pair, blocks=264, grid=(264, 1, 1)), H100, regs)
    assert two.sub_partitions == 4
    # Unless registers let an SM hold only one of them at a time.
    alone = estimate(dataclasses.replace(pair, blocks=264), H100, KernelResources(registers=255))
    assert alone.occupancy.blocks_per_sm >= 1
    assert alone.sub_partitions == min(4, 2 * alone.occupancy.blocks_per_sm)


def test_a_tensor_the_launch_before_wrote_is_read_from_l2(lens):
    """A consumer reading what its producer just wrote (a split-K partial and its final sum)
    finds it in L2 when it fits: only the consumer's own output costs DRAM bytes."""
    n = 1 << 20
    x, y, z = torch.empty(n), torch.empty(n), torch.empty(n)
    grid = n // 256
    first = lens.launch_counted("copy", grid, 256, [x, y, n], sample_only=True)
    second = lens.launch_counted("copy", grid, 256, [y, z, n], sample_only=True)
    assert l2_resident(second, first, H100.l2_bytes) == (0,)
    assert l2_resident(second, None, H100.l2_bytes) == ()
    assert l2_resident(second, first, l2_bytes=4 * n - 1) == ()  # y does not fit
    assert l2_resident(first, second, H100.l2_bytes) == ()  # x was not written
    cold, warm = KernelCounts.from_sample(second), KernelCounts.from_sample(second, (0,))
    assert cold.dram_bytes == cold.minimum_bytes == 8 * n
    assert warm.dram_bytes == warm.minimum_bytes == 4 * n
    assert warm.sector_bytes == cold.sector_bytes  # every request still crosses L2
    # A view of part of what was written is in L2 too.
    third = lens.launch_counted("copy", 16, 256, [y[4096:], z, 4096], sample_only=True)
    assert l2_resident(third, first, H100.l2_bytes) == (0,)


def test_scratch_memory_is_read_from_l2_and_is_no_part_of_the_minimum(lens):
    """A kernel's scratch (an in-kernel split-K's partials) holds only what the launch wrote:
    its reads are L2's, its writes DRAM's in the end, and neither is the problem's."""
    n = 1 << 20
    args = [torch.randn(n), torch.empty(n), torch.empty(n), n]
    sample = lens.launch_counted("through_scratch", n // 256, 256, args, sample_only=True)
    plain = KernelCounts.from_sample(sample)
    assert plain.dram_bytes == plain.minimum_bytes == 16 * n  # x, parts twice, y
    counted = KernelCounts.from_sample(sample, scratch=(1,))
    assert counted.dram_bytes == 12 * n  # x read, parts and y written
    assert counted.minimum_bytes == 8 * n  # x and y
    assert counted.sector_bytes == plain.sector_bytes
    # Which parameters are scratch: those the launcher gives undefined memory (not zeroed).
    x, parts, y = (Var(name, PointerType(f32)) for name in ("x", "parts", "y"))
    count = Var("count", PointerType(i32))
    attrs = LaunchAttrs(scratch=(("parts", n, False), ("count", 8, True)))
    kernel = Function("k", (x, parts, count, y), S.Seq(()), attrs=attrs)
    assert scratch_positions(kernel) == (1,)


def test_the_assumptions_are_spelled_out():
    assert len(ASSUMPTIONS) >= 4 and all(isinstance(a, str) and a for a in ASSUMPTIONS)
