"""Occupancy by the CUDA occupancy calculator's rules. The expected numbers are those of
cudaOccMaxActiveBlocksPerMultiprocessor (the toolkit's cuda_occupancy.h, CUDA 13), which
agrees with `occupancy` on every combination of 17 block sizes, 21 register counts (0 to
255) and 19 shared-memory sizes for sm_80, sm_86, sm_89 and sm_90."""

import pytest

from minicomp.backends.cuda.arch import KIB, limits
from minicomp.lens.occupancy import occupancy

SM80, SM86, SM90 = limits("sm_80"), limits("sm_86"), limits("sm_90")


def occ(arch, threads, registers=0, shared=0):
    return occupancy(
        arch,
        threads_per_block=threads,
        registers_per_thread=registers,
        shared_bytes_per_block=shared,
    )


@pytest.mark.parametrize(
    "arch, threads, registers, shared, blocks, warps, limiter",
    [
        # Full occupancy: threads and registers both allow 8 blocks; threads are named.
        (SM80, 256, 32, 0, 8, 64, "threads"),
        # 64 registers: 2048 a warp, 8 warps in each sub-partition's 16K: 32 warps.
        (SM80, 256, 64, 0, 4, 32, "registers"),
        # 48 KiB + the 1 KiB reserve = 49 KiB a block: 3 in 164 KiB.
        (SM80, 128, 0, 48 * KIB, 3, 12, "shared memory"),
        # 65 registers round up to 2304 a warp; 32 warps need 73728 > 65536: no block fits.
        (SM80, 1024, 65, 0, 0, 0, "registers"),
        # Registers go per sub-partition: 40 registers (1280 a warp) give 12 warps in each of
        # the 4 quarters, 48 warps, not the 51 that 65536 / 1280 would suggest.
        (SM80, 64, 40, 0, 24, 48, "registers"),
        # Tiny blocks hit the 32 blocks an SM holds.
        (SM80, 32, 0, 0, 32, 32, "blocks"),
        # A partial warp takes a whole warp's slot: 33 threads are 2 warps, and 32 such blocks
        # fill the 64 warp slots.
        (SM80, 33, 0, 0, 32, 64, "threads"),
        # Shared memory goes in 128-byte units: 32563 + 1024 bytes become 33664, and 167936
        # bytes hold 4 of those (unrounded, 33587 would fit 5 times).
        (SM80, 128, 0, 32563, 4, 16, "shared memory"),
        # sm_86 holds 48 warps: one 1024-thread block.
        (SM86, 1024, 0, 0, 1, 32, "threads"),
        # sm_90: 100 KiB + 1 KiB a block, 228 KiB an SM.
        (SM90, 128, 0, 100 * KIB, 2, 8, "shared memory"),
        # The most a block may opt in to fits exactly once ...
        (SM90, 128, 0, 227 * KIB, 1, 4, "shared memory"),
        # ... and a byte more never fits.
        (SM90, 128, 0, 227 * KIB + 1, 0, 0, "shared memory"),
        # More threads than a block may have.
        (SM90, 1025, 0, 0, 0, 0, "threads"),
        # More registers than a thread may have.
        (SM90, 32, 256, 0, 0, 0, "registers"),
    ],
)
def test_occupancy_matches_the_calculator(arch, threads, registers, shared, blocks, warps, limiter):
    result = occ(arch, threads, registers, shared)
    assert (result.blocks_per_sm, result.warps_per_sm, result.limiter) == (blocks, warps, limiter)
    assert result.max_warps_per_sm == arch.threads_per_sm // 32


def test_zero_registers_means_unknown_not_free():
    # With registers unknown, 1024 threads fill sm_80's 64 warps with 2 blocks.
    assert occ(SM80, 1024, 0).blocks_per_sm == 2


def test_printed_form():
    assert str(occ(SM80, 256, 64)) == "4 blocks/SM (32 of 64 warps, 50%), limited by registers"
    assert occ(SM80, 256, 64).fraction == 0.5
    assert str(occ(SM80, 1024, 65)) == "0 blocks/SM: a block does not fit, limited by registers"


def test_nonsense_is_refused():
    with pytest.raises(ValueError, match="threads_per_block"):
        occ(SM80, 0)
    with pytest.raises(ValueError, match="negative"):
        occ(SM80, 128, -1)
