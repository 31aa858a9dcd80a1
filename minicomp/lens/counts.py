"""A launch's counts for the whole grid, from a counted emulator launch of a sample of its
blocks: each sampled block stands for blocks / sampled of the grid's, and thread-level counts
of warp instructions (mma, ldmatrix, cp.async) become warp-level."""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass

from minicomp.backends.cuda.emu import LaunchSample
from minicomp.ir.func import Function

WARP = 32
MMA_FLOPS = 2 * 16 * 8 * 16
"""The floating-point operations of one m16n8k16 tensor-core instruction. An int8 m16n8k32
counts as one mma too: twice the operations, at twice the f16 rate on every GPU of the
device table, so the same tensor-core time (its operations are reported at half). A float8
m16n8k32 counts as two: sm_90 runs it as two f16 m16n8k16 (sm_89 would run it as one QMMA, at
twice the f16 rate; no device of the table is an sm_89)."""


@dataclass(frozen=True)
class KernelCounts:
    """What one launch of a kernel asks of the GPU, for its whole grid (estimated from a
    sample of blocks: `sampled` of `blocks`). Requests are warp instructions; sectors are 32
    bytes; thread-level operation counts are per thread, summed."""

    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    dynamic_smem: int
    blocks: int
    sampled: int
    global_loads: float
    global_load_sectors: float
    global_load_bytes: float
    global_stores: float
    global_store_sectors: float
    global_store_bytes: float
    shared_loads: float
    shared_stores: float
    shared_wavefronts: float
    shared_ideal_wavefronts: float
    ldmatrix: float
    cp_async: float
    mma: float
    barriers: float
    atomics: float
    flops: float
    fp_instructions: float
    int_instructions: float
    int64_instructions: float
    int_divides: float
    special: float
    conversions: float
    address_instructions: float
    """Integer work in load and store indices (not priced: see estimate.ASSUMPTIONS)."""
    dram_bytes: float
    """Bytes between DRAM and L2: the distinct sectors the sample touched in each tensor
    argument, scaled to the grid, at most the tensor's bytes (L2 keeps what blocks share);
    reads of an argument L2 holds already (`from_sample`'s `in_l2`) are not counted."""
    minimum_bytes: float
    """The bytes the kernel must move: the DRAM bytes it would move if each sector carried only
    bytes it asked for (each tensor it reads once, each it writes once, at most)."""
    wgmma: float = 0.0
    """Warpgroup MMA work in m16n8k16 equivalents (an m64nNk16 is N / 2 of them), priced at
    the device's wgmma rate, apart from `mma`'s mma.sync."""
    wgmma_instructions: float = 0.0
    """Warp instructions of wgmma_mma_async (4 an mma_async: one a warp of the warpgroup)."""

    @property
    def threads_per_block(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]

    @property
    def sector_bytes(self) -> float:
        """Bytes moved between the SMs and L2: every sector of every global request."""
        return 32 * (self.global_load_sectors + self.global_store_sectors)

    @property
    def sector_efficiency(self) -> float:
        """Bytes the lanes asked for over the bytes of the sectors that carried them (1 is
        perfectly coalesced; a broadcast counts as used)."""
        if not self.sector_bytes:
            return 1.0
        asked = self.global_load_bytes + self.global_store_bytes
        return min(1.0, asked / self.sector_bytes)

    @property
    def bank_conflict_factor(self) -> float:
        """Shared-memory wavefronts over the conflict-free ideal (1 means no bank conflicts)."""
        if not self.shared_ideal_wavefronts:
            return 1.0
        return self.shared_wavefronts / self.shared_ideal_wavefronts

    @property
    def mma_flops(self) -> float:
        return self.mma * MMA_FLOPS

    @property
    def wgmma_flops(self) -> float:
        return self.wgmma * MMA_FLOPS

    @classmethod
    def from_sample(
        cls, sample: LaunchSample, in_l2: Collection[int] = (), scratch: Collection[int] = ()
    ) -> KernelCounts:
        """The grid's counts from a counted launch's sample. The arguments at positions
        `in_l2` are in L2 when the launch starts (`l2_resident`): their reads cost no DRAM
        bytes, neither in `dram_bytes` nor in `minimum_bytes`. Those at positions `scratch`
        are memory the launch writes before it reads it (`scratch_positions`: an in-kernel
        split-K's partials): their reads are L2's too, and their writes, which L2 writes
        back to DRAM sooner or later, are DRAM bytes but not part of `minimum_bytes` (the
        kernel's choice, not its problem's)."""
        c = sample.counters
        n = max(1, len(sample.sampled))
        scale = sample.blocks / n

        def grid(name: str) -> float:
            return c[name] * scale

        def warp(name: str) -> float:
            return c[name] * scale / WARP

        def dram(sectors: tuple[int, ...], skip: Collection[int] = ()) -> float:
            return sum(
                min(b, 32 * n * scale)
                for i, (b, n) in enumerate(zip(sample.arg_bytes, sectors))
                if i not in skip
            )

        read = dram(sample.read_sectors, {*in_l2, *scratch})
        written = dram(sample.written_sectors)
        needed = dram(sample.written_sectors, scratch)  # written, scratch memory aside

        return cls(
            kernel=sample.kernel,
            grid=sample.grid,
            block=sample.block,
            dynamic_smem=sample.shared_bytes,
            blocks=sample.blocks,
            sampled=len(sample.sampled),
            global_loads=grid("global_loads"),
            global_load_sectors=grid("global_load_sectors"),
            global_load_bytes=grid("global_load_bytes"),
            global_stores=grid("global_stores"),
            global_store_sectors=grid("global_store_sectors"),
            global_store_bytes=grid("global_store_bytes"),
            shared_loads=grid("shared_loads"),
            shared_stores=grid("shared_stores"),
            shared_wavefronts=grid("shared_wavefronts"),
            shared_ideal_wavefronts=grid("shared_ideal_wavefronts"),
            ldmatrix=warp("ldmatrix"),
            cp_async=warp("cp_async"),
            mma=warp("mma"),
            barriers=c["barriers"] * scale / math.prod(sample.block),
            atomics=grid("atomics"),
            flops=grid("flops"),
            fp_instructions=grid("fp_instructions"),
            int_instructions=grid("int_instructions"),
            int64_instructions=grid("int64_instructions"),
            int_divides=grid("int_divides"),
            special=grid("special"),
            conversions=grid("conversions"),
            address_instructions=grid("address_instructions"),
            dram_bytes=read + written,
            minimum_bytes=read * _efficiency(c, "load") + needed * _efficiency(c, "store"),
            wgmma=warp("wgmma"),
            wgmma_instructions=warp("wgmma_instructions"),
        )


def _efficiency(c: dict[str, int], kind: str) -> float:
    sectors = c[f"global_{kind}_sectors"]
    return min(1.0, c[f"global_{kind}_bytes"] / (32 * sectors)) if sectors else 1.0


def l2_resident(
    sample: LaunchSample, before: LaunchSample | None, l2_bytes: int
) -> tuple[int, ...]:
    """The arguments of launch `sample` (by position) whose memory the launch just `before`
    wrote, an argument of at most `l2_bytes` (the L2 cache's size): L2 still holds them when
    `sample` reads them (a split-K partial product and its final sum, a producer and its
    consumer), so their reads need no DRAM traffic."""
    if before is None:
        return ()
    written = [before.span(i) for i in before.written if before.arg_bytes[i] <= l2_bytes]
    resident = []
    for i in sample.read:
        lo, hi = sample.span(i)
        if any(lo < w_hi and w_lo < hi for w_lo, w_hi in written):
            resident.append(i)
    return tuple(resident)


def scratch_positions(function: Function) -> tuple[int, ...]:
    """The positions, among kernel `function`'s arguments, of the scratch memory it writes
    before reading (LaunchAttrs.scratch entries that are not zeroed: undefined contents at
    launch, so whatever the kernel reads of them it wrote)."""
    written = {name for name, _, zeroed in function.attrs.scratch if not zeroed}
    return tuple(i for i, p in enumerate(function.params) if p.name in written)
