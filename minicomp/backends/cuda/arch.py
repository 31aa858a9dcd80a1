"""What each CUDA architecture allows a kernel: shared memory, registers, threads and blocks.

The numbers are the CUDA C++ Programming Guide's ("Technical Specifications per Compute
Capability") for the architectures minicomp generates tensor-core code for (sm_80 and newer:
mma.sync, ldmatrix and cp.async). Templates size their tiles by `PORTABLE` (what every one of
them allows, so that a kernel compiled without knowing the GPU launches on all of them); the
emulator and the driver's fallback accept up to `LARGEST`.
"""

from __future__ import annotations

from dataclasses import dataclass

KIB = 1024


@dataclass(frozen=True)
class ArchLimits:
    """The limits of one compute capability (`name`, like "sm_90")."""

    name: str
    shared_per_block_optin: int
    """Bytes of shared memory a block may have once its kernel opts in (dynamic)."""
    shared_per_sm: int
    """Bytes of shared memory an SM has for the blocks resident on it."""
    threads_per_sm: int
    blocks_per_sm: int
    shared_per_block: int = 48 * KIB
    """Bytes a block may have without opting in (all static shared memory)."""
    registers_per_sm: int = 64 * KIB
    registers_per_thread: int = 255
    threads_per_block: int = 1024


ARCHS = {
    a.name: a
    for a in (
        ArchLimits("sm_80", 163 * KIB, 164 * KIB, threads_per_sm=2048, blocks_per_sm=32),
        ArchLimits("sm_86", 99 * KIB, 100 * KIB, threads_per_sm=1536, blocks_per_sm=16),
        ArchLimits("sm_89", 99 * KIB, 100 * KIB, threads_per_sm=1536, blocks_per_sm=24),
        ArchLimits("sm_90", 227 * KIB, 228 * KIB, threads_per_sm=2048, blocks_per_sm=32),
    )
}


def limits(arch: str) -> ArchLimits:
    """The limits of `arch` ("sm_86", or a suffixed variant such as "sm_90a")."""
    base = arch.rstrip("af")
    if base not in ARCHS:
        known = ", ".join(ARCHS)
        raise KeyError(f"no limits known for {arch!r}; known: {known}")
    return ARCHS[base]


def _combined(name: str, pick) -> ArchLimits:
    """Each limit of ARCHS combined by `pick` (min: what all allow; max: what one allows)."""
    fields = [f for f in ArchLimits.__dataclass_fields__ if f != "name"]
    return ArchLimits(name, **{f: pick(getattr(a, f) for a in ARCHS.values()) for f in fields})


PORTABLE = _combined("portable", min)
"""What every architecture of ARCHS allows (99 KiB of shared memory a block: sm_86's, sm_89's)."""
LARGEST = _combined("largest", max)
"""The most any architecture of ARCHS allows (227 KiB of shared memory a block: sm_90's)."""


WGMMA_ARCH = "sm_90a"
"""The architecture with warpgroup MMA (wgmma) and the Hopper matmul template: sm_90's
architecture-specific feature set, whose code runs on sm_90 devices only."""


def device_build_arch(arch: str) -> str:
    """What the cuda target compiles for on a device of `arch`: an sm_90 device's code as
    sm_90a (its architecture-specific features: wgmma, the Hopper templates), since a graph's
    binary runs on that device only; any other architecture as itself."""
    return WGMMA_ARCH if arch == "sm_90" else arch


FLOAT8_MMA_ARCH = 89
"""The first compute capability with float8 tensor-core mma (sm_89: mma.sync m16n8k32 of
e4m3/e5m2, PTX ISA 8.4)."""


def has_float8_mma(arch: str) -> bool:
    """Whether code for `arch` ("sm_89", "sm_90a"...) can use the float8 mma."""
    return int(arch.removeprefix("sm_").rstrip("af")) >= FLOAT8_MMA_ARCH


def float8_mma_unpacks(arch: str) -> bool:
    """Whether `arch` runs the float8 mma as f16 ones: sm_90 (Hopper, whose full float8 rate
    needs wgmma) unpacks the bytes to f16 (F2FP) and issues two HMMA.16816, at the f16 rate and
    with the unpacked fragments in registers; sm_89 has it as one QMMA."""
    return int(arch.removeprefix("sm_").rstrip("af")) // 10 == 9
