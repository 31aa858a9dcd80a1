"""A roofline-style estimate of a kernel's time on a named device, from its counts (the emulator)
and its resources (ptxas): each unit's time is its work over its rate, the kernel takes as long
as the busiest unit, stretched by the last partial wave of blocks (an SM's own units by the
busiest SM's share of the work, DRAM and L2, which all SMs share, only where too few SMs are
busy to pull their bandwidth). Every rate and price is in
ASSUMPTIONS and in the device table (devices.py), printed with every report: a transparent
model to compare candidates and find a kernel's gap, not a simulator.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from minicomp.backends.cuda.nvrtc import KernelResources
from minicomp.lens.counts import WARP, KernelCounts
from minicomp.lens.devices import Device
from minicomp.lens.occupancy import SUB_PARTITIONS, Occupancy, occupancy

DIVIDE_INSTRUCTIONS = 20
"""Integer instructions of a division or remainder by a run-time value (ptxas's reciprocal
sequence)."""
INT64_INSTRUCTIONS = 2
"""32-bit integer instructions of one 64-bit add, compare or multiply-add."""
ISSUE_PER_SM_PER_CLOCK = 4
"""Warp instructions an SM issues a clock (one per scheduler)."""
MEMORY_SHARE_PER_SM = 2
"""How many times its even share (1 / SMs) of DRAM and L2 bandwidth one SM can pull."""
GLOBAL_UNITS = ("dram", "l2")
"""The units all SMs share; the others are each SM's own."""
SUB_PARTITION_UNITS = ("tensor", "fp32", "int", "special", "issue")
"""The units each of an SM's SUB_PARTITIONS holds a quarter of: a warp issues to, and computes
on, its own sub-partition's (shared memory is the SM's, whichever warp asks)."""

ASSUMPTIONS = (
    "DRAM traffic is the distinct sectors the sampled blocks touch, scaled to the grid, at most "
    "each tensor once (L2 keeps what blocks share: other blocks' re-reads are L2 hits); every "
    "global request's sectors cross L2, hit or miss: right for 16-byte cp.async, which bypasses "
    "L1, an overestimate for plain loads that re-read lines L1 still holds (not modelled); an "
    "atomic is a request, its sector a store's (atomics on one address, serialized at L2, are "
    "not priced); in a graph, a tensor the launch just before wrote, if no larger than L2, is "
    "read from L2 (no DRAM bytes, and none in the roofline's minimum)",
    "shared memory serves one wavefront an SM a clock; a tensor-core m16n8k16 is 4096 flops at "
    "the device's mma.sync rate, and so is an int8 m16n8k32 (twice the operations at twice the "
    "rate); a float8 m16n8k32 is two of them (sm_90 unpacks its bytes to f16); a warpgroup "
    "m64nNk16 (wgmma) is N / 2 of them at the device's wgmma rate (a float8 m64nNk32 too: twice "
    "the operations at twice the rate), and the shared memory it reads is not priced (wgmma "
    "reads its operands from shared memory without the load path's wavefronts); a TMA or bulk "
    "copy is one global request, its sectors those of the bytes it moves inside the tensor",
    f"an integer division by a run-time value costs {DIVIDE_INSTRUCTIONS} instructions (by a "
    f"constant, 2 or 3), a 64-bit integer operation {INT64_INSTRUCTIONS}, a transcendental call "
    "one special-function slot; integer work is free where the compiler folds it (constants in "
    "each unrolled copy), hoists it (unchanged in the innermost rolled loop) or puts it in an "
    "access's addressing (load, store and intrinsic indices), and counted once where the "
    "copies of an unrolled loop or a statement repeat it: the SASS classes show what remains",
    f"a warp runs on one of its SM's {SUB_PARTITIONS} sub-partitions (SMSPs), each with a "
    "quarter of the SM's tensor, FP32, integer, special-function and issue rate: an SM whose "
    f"resident warps (min(blocks an SM holds, blocks the busiest SM gets) x warps a block) are "
    f"fewer than {SUB_PARTITIONS} reaches min(warps, {SUB_PARTITIONS}) / {SUB_PARTITIONS} of "
    "them",
    "the units overlap perfectly: the kernel takes as long as the busiest; blocks spread over "
    "the SMs evenly, the busiest SM doing ceil(blocks / SMs) blocks' work (blocks resident "
    "together share their SM's units), which stretches each SM's own units; DRAM and L2 are "
    f"shared: the busy SMs pull their whole bandwidth, an SM at most {MEMORY_SHARE_PER_SM} "
    "times its even share; latency is hidden (occupancy is reported, not priced)",
    "counts come from a sample of blocks scaled to the grid; launch overhead is counted once "
    "per kernel in a graph's total",
)


@dataclass(frozen=True)
class KernelEstimate:
    """One launch's estimated time on `device` and what explains it."""

    kernel: str
    device: Device
    counts: KernelCounts
    times: dict[str, float]
    """Seconds each unit needs: dram, l2, shared, tensor, fp32, int, special, issue."""
    occupancy: Occupancy
    sub_partitions: int
    """Of an SM's SUB_PARTITIONS, how many have a warp of the kernel (see `estimate`)."""
    waves: float
    """Rounds of resident blocks the grid needs: blocks / (SMs x blocks an SM holds)."""
    roofline_time: float
    """Seconds the kernel needs at best: its minimum bytes at DRAM speed, or its flops at the
    peak of the instructions it uses, whichever is longer."""
    resources: KernelResources | None = None
    notes: tuple[str, ...] = field(default=())

    @property
    def bound(self) -> str:
        """The unit the kernel waits for."""
        stretched = self.stretched
        return max(stretched, key=lambda k: stretched[k])

    @property
    def tail_efficiency(self) -> float:
        """The average SM's work over the busiest SM's (1 when the blocks divide evenly)."""
        per_sm = self.counts.blocks / self.device.sms
        return per_sm / math.ceil(per_sm) if per_sm else 1.0

    @property
    def memory_reach(self) -> float:
        """The fraction of DRAM and L2 bandwidth the SMs that have work can pull."""
        return min(1.0, MEMORY_SHARE_PER_SM * self.tail_efficiency)

    @property
    def time(self) -> float:
        """Estimated seconds of one launch (without launch overhead)."""
        if self.occupancy.blocks_per_sm == 0:
            return math.inf
        return max(self.stretched.values())

    @property
    def stretched(self) -> dict[str, float]:
        """Each unit's seconds once the grid's spread over the SMs is counted."""
        return {
            unit: t / (self.memory_reach if unit in GLOBAL_UNITS else self.tail_efficiency)
            for unit, t in self.times.items()
        }

    @property
    def fraction_of_roofline(self) -> float:
        """The roofline time over the estimated time: 1 means the kernel is at its bound."""
        if not self.time or math.isinf(self.time):
            return 0.0 if self.time else 1.0
        return min(1.0, self.roofline_time / self.time)

    @property
    def spill_bytes(self) -> int:
        r = self.resources
        return 0 if r is None else r.spill_stores + r.spill_loads

    def as_dict(self) -> dict:
        """The estimate as plain data (for --json)."""
        c = self.counts
        return {
            "kernel": self.kernel,
            "device": self.device.key,
            "time_us": None if math.isinf(self.time) else self.time * 1e6,
            "bound": self.bound,
            "fraction_of_roofline": self.fraction_of_roofline,
            "roofline_time_us": self.roofline_time * 1e6,
            "times_us": {k: v * 1e6 for k, v in self.times.items()},
            "grid": list(c.grid),
            "block": list(c.block),
            "blocks_sampled": c.sampled,
            "occupancy": {
                "blocks_per_sm": self.occupancy.blocks_per_sm,
                "warps_per_sm": self.occupancy.warps_per_sm,
                "fraction": self.occupancy.fraction,
                "limiter": self.occupancy.limiter,
            },
            "sub_partitions": self.sub_partitions,
            "waves": self.waves,
            "tail_efficiency": self.tail_efficiency,
            "sector_efficiency": c.sector_efficiency,
            "bank_conflict_factor": c.bank_conflict_factor,
            "minimum_bytes": c.minimum_bytes,
            "dram_bytes": c.dram_bytes,
            "sector_bytes": c.sector_bytes,
            "flops": c.flops + c.mma_flops + c.wgmma_flops,
            "registers": None if self.resources is None else self.resources.registers,
            "spill_bytes": self.spill_bytes,
            "notes": list(self.notes),
        }


def estimate(
    counts: KernelCounts, device: Device, resources: KernelResources | None = None
) -> KernelEstimate:
    """The estimate of one launch from its counts and (when NVRTC could build it) its
    resources: registers and static shared memory set the occupancy, and so the waves."""
    d = device
    registers = resources.registers if resources is not None else 0
    static_smem = resources.shared_bytes if resources is not None else 0
    occ = occupancy(
        d.limits,
        threads_per_block=counts.threads_per_block,
        registers_per_thread=registers,
        shared_bytes_per_block=static_smem + counts.dynamic_smem,
    )
    int_ops = (
        counts.int_instructions
        + INT64_INSTRUCTIONS * counts.int64_instructions
        + DIVIDE_INSTRUCTIONS * counts.int_divides
    )
    thread_instructions = counts.fp_instructions + int_ops + counts.special + counts.conversions
    warp_instructions = (
        thread_instructions / WARP
        + counts.global_loads
        + counts.global_stores
        + counts.shared_loads
        + counts.shared_stores
        + counts.mma
        + counts.wgmma_instructions
        + counts.barriers * math.ceil(counts.threads_per_block / WARP)
    )
    clock = d.clock_ghz * 1e9
    mma_rate = d.mma_sync_tflops_f16 * 1e12
    busy = sub_partitions_used(counts, d, occ)
    times = {
        "dram": counts.dram_bytes / (d.dram_gbps * 1e9),
        "l2": counts.sector_bytes / (d.l2_gbps * 1e9),
        "shared": counts.shared_wavefronts / (d.sms * d.shared_wavefronts_per_sm_per_clock * clock),
        "tensor": counts.mma_flops / mma_rate + _wgmma_time(counts, d),
        "fp32": (counts.fp_instructions + counts.conversions) / d.fp32_per_second,
        "int": int_ops / d.int32_per_second,
        "special": counts.special / d.sfu_per_second,
        "issue": warp_instructions / (d.sms * ISSUE_PER_SM_PER_CLOCK * clock),
    }
    for unit in SUB_PARTITION_UNITS:
        times[unit] *= SUB_PARTITIONS / busy
    roofline = max(
        counts.minimum_bytes / (d.dram_gbps * 1e9),
        times["tensor"],
        counts.flops / (2 * d.fp32_per_second),
    )
    slots = d.sms * occ.blocks_per_sm
    waves = counts.blocks / slots if slots else math.inf
    notes = []
    if occ.blocks_per_sm == 0:
        notes.append(f"does not launch on {d.name}: {occ}")
    elif occ.fraction < 0.25:
        notes.append(f"low occupancy: {occ}")
    if busy < SUB_PARTITIONS:
        notes.append(
            f"{busy} of {SUB_PARTITIONS} SM sub-partitions busy: fewer warps an SM than "
            "tensor-core and issue units"
        )
    if resources is not None and resources.spill_stores + resources.spill_loads:
        notes.append(
            f"spills {resources.spill_stores} bytes to local memory and loads "
            f"{resources.spill_loads} back"
        )
    if counts.sector_efficiency < 0.9:
        notes.append(f"global accesses use {counts.sector_efficiency:.0%} of their sectors")
    if counts.bank_conflict_factor > 1.05:
        notes.append(f"shared memory bank conflicts: x{counts.bank_conflict_factor:.2f} wavefronts")
    return KernelEstimate(
        counts.kernel, d, counts, times, occ, busy, waves, roofline, resources, tuple(notes)
    )


def _wgmma_time(counts: KernelCounts, device: Device) -> float:
    """Seconds of the launch's warpgroup MMA at the device's wgmma rate (never, where it has
    none: such a kernel does not run there)."""
    if not counts.wgmma:
        return 0.0
    if not device.wgmma_tflops_f16:
        return math.inf
    return counts.wgmma_flops / (device.wgmma_tflops_f16 * 1e12)


def sub_partitions_used(counts: KernelCounts, device: Device, occ: Occupancy) -> int:
    """How many of an SM's SUB_PARTITIONS run warps of the launch: one a resident warp, up to
    all of them. An SM holds min(the blocks that fit, the blocks the busiest SM gets) blocks at
    once; a grid of 104 blocks of 2 warps on 132 SMs keeps 2 busy on each SM it reaches."""
    warps_per_block = math.ceil(counts.threads_per_block / WARP)
    blocks = min(occ.blocks_per_sm, math.ceil(counts.blocks / device.sms))
    return max(1, min(SUB_PARTITIONS, blocks * warps_per_block))


@dataclass(frozen=True)
class GraphEstimate:
    """The estimates of a graph's launches, in launch order."""

    kernels: tuple[KernelEstimate, ...]
    device: Device

    @property
    def overhead(self) -> float:
        """Seconds of launch overhead: one CUDA-graph node a launch."""
        return len(self.kernels) * self.device.graph_launch_overhead_us * 1e-6

    @property
    def time(self) -> float:
        return sum(k.time for k in self.kernels) + self.overhead

    @property
    def roofline_time(self) -> float:
        return sum(k.roofline_time for k in self.kernels)
