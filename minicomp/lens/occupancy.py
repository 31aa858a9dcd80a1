"""Occupancy: how many blocks of a kernel an SM holds at once, and what stops it holding more.

The rules are those of CUDA's occupancy calculator (`cudaOccMaxActiveBlocksPerMultiprocessor`
in the toolkit's cuda_occupancy.h) for compute capabilities 8.x and 9.0, with the default
shared-memory carveout (all of `ArchLimits.shared_per_sm` for shared memory):

- threads: a block takes its threads rounded up to whole warps, and an SM holds
  `threads_per_sm / 32` warps;
- blocks: at most `blocks_per_sm` blocks an SM;
- registers: a warp is given `registers_per_thread * 32` registers rounded up to 256; the
  register file is split among 4 sub-partitions, each holding as many whole warps as fit in its
  quarter, so an SM holds `4 * floor(registers_per_sm / 4 / per_warp)` warps of the kernel
  (which also keeps a block within the calculator's per-block check of 64K registers, made
  with its warps rounded up to a multiple of 4);
- shared memory: a block also takes 1 KiB the system reserves (sm_80 and newer), all rounded
  up to 128 bytes; a block may have at most `shared_per_block_optin` plus that reserve.

Block-barrier limits (Hopper's per-SM named barriers) are not modelled.
"""

from __future__ import annotations

from dataclasses import dataclass

from minicomp.backends.cuda.arch import KIB, ArchLimits

WARP = 32
REGISTER_GRANULE = 256
"""Registers are allocated to a warp in multiples of this."""
SUB_PARTITIONS = 4
SHARED_GRANULE = 128
"""Shared memory is allocated to a block in multiples of this many bytes."""
SHARED_RESERVED_PER_BLOCK = 1 * KIB
"""Shared memory the CUDA driver reserves for each block on sm_80 and newer."""

LIMITERS = ("threads", "blocks", "registers", "shared memory")
"""What can limit occupancy; when several give the same count the first is named, since
relieving a later one would not raise occupancy."""


@dataclass(frozen=True)
class Occupancy:
    """How full a kernel keeps an SM: its resident blocks and warps, and what limits them."""

    blocks_per_sm: int
    warps_per_sm: int
    max_warps_per_sm: int
    limiter: str
    """One of LIMITERS: the resource that allows no more blocks (or, with 0 blocks, none)."""

    @property
    def fraction(self) -> float:
        """Resident warps over the most an SM can hold (0.0 to 1.0)."""
        return self.warps_per_sm / self.max_warps_per_sm

    def __str__(self) -> str:
        if self.blocks_per_sm == 0:
            return f"0 blocks/SM: a block does not fit, limited by {self.limiter}"
        return (
            f"{self.blocks_per_sm} blocks/SM ({self.warps_per_sm} of {self.max_warps_per_sm} "
            f"warps, {self.fraction:.0%}), limited by {self.limiter}"
        )


def _ceil_to(x: int, granule: int) -> int:
    return -(-x // granule) * granule


def _blocks_by_registers(limits: ArchLimits, warps_per_block: int, registers: int) -> int:
    if registers == 0:  # unknown: no register limit
        return limits.blocks_per_sm
    if registers > limits.registers_per_thread:
        return 0
    per_warp = _ceil_to(registers * WARP, REGISTER_GRANULE)
    warps_per_sub_partition = limits.registers_per_sm // SUB_PARTITIONS // per_warp
    return warps_per_sub_partition * SUB_PARTITIONS // warps_per_block


def _blocks_by_shared(limits: ArchLimits, shared_bytes: int) -> int:
    allocated = _ceil_to(shared_bytes + SHARED_RESERVED_PER_BLOCK, SHARED_GRANULE)
    if allocated > limits.shared_per_block_optin + SHARED_RESERVED_PER_BLOCK:
        return 0
    return limits.shared_per_sm // allocated


def occupancy(
    limits: ArchLimits,
    *,
    threads_per_block: int,
    registers_per_thread: int,
    shared_bytes_per_block: int,
) -> Occupancy:
    """The occupancy of a kernel on an SM of `limits`: blocks of `threads_per_block` threads,
    each thread using `registers_per_thread` registers (0 when unknown: no register limit) and
    each block `shared_bytes_per_block` bytes of shared memory, static and dynamic together."""
    if threads_per_block < 1 or registers_per_thread < 0 or shared_bytes_per_block < 0:
        raise ValueError(
            f"need threads_per_block >= 1 and no negative resources; got {threads_per_block} "
            f"threads, {registers_per_thread} registers, {shared_bytes_per_block} bytes"
        )
    max_warps = limits.threads_per_sm // WARP
    warps_per_block = -(-threads_per_block // WARP)
    fits = threads_per_block <= limits.threads_per_block
    by_limiter = {
        "threads": max_warps // warps_per_block if fits else 0,
        "blocks": limits.blocks_per_sm,
        "registers": _blocks_by_registers(limits, warps_per_block, registers_per_thread),
        "shared memory": _blocks_by_shared(limits, shared_bytes_per_block),
    }
    blocks = min(by_limiter.values())
    limiter = next(name for name in LIMITERS if by_limiter[name] == blocks)
    return Occupancy(blocks, blocks * warps_per_block, max_warps, limiter)
