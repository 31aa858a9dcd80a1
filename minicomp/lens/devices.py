"""The GPUs the lens estimates for: each one's SM count, clock, memory bandwidths and per-SM
instruction rates, from NVIDIA's public datasheets and architecture whitepapers.

Every rate is a peak (what the datasheet promises, not what a benchmark sustains); the
estimate decides how much of it a kernel reaches. The few numbers NVIDIA does not publish
(L2 bandwidth on Hopper, what the mma.sync instruction reaches on Hopper, launch overheads) are
assumptions, marked so where they are set.

Sources, cited by name below:
- "A100 whitepaper": NVIDIA A100 Tensor Core GPU Architecture (2020), its tables of GPU
  features and of the A100 SM.
- "A100 datasheet": NVIDIA A100 Tensor Core GPU datasheet (the 80GB SXM4 column).
- "H100 whitepaper": NVIDIA H100 Tensor Core GPU Architecture (2022), Table 3 ("Comparison
  of NVIDIA Data Center GPUs", H100 SXM5 column).
- "H100 datasheet", "H200 datasheet": NVIDIA H100 / H200 Tensor Core GPU datasheets (SXM).
- "Programming Guide": CUDA C++ Programming Guide, "Arithmetic Instructions" (results per
  clock cycle per multiprocessor, by compute capability).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from minicomp.backends.cuda import arch

MIB = 1024 * 1024


@dataclass(frozen=True)
class Device:
    """One GPU model as the roofline estimate sees it."""

    name: str
    """What NVIDIA calls it ("H100 SXM")."""
    key: str
    """The short name users pick it by ("h100")."""
    arch: str
    """The compute capability its code is compiled for ("sm_90")."""
    sms: int
    clock_ghz: float
    """The boost clock that the datasheet's FP32 rate assumes."""
    dram_gbps: float
    """Peak DRAM bandwidth, GB/s (1e9 bytes a second)."""
    l2_gbps: float
    """L2 bandwidth, GB/s: an estimate on every device (see each entry)."""
    l2_bytes: int
    fp32_lanes_per_sm: int
    """FP32 FMA/add/mul results per clock per SM (one per lane)."""
    int32_lanes_per_sm: int
    sfu_lanes_per_sm: int
    """Special-function (MUFU: rcp, rsqrt, ex2, lg2, sin, cos) results per clock per SM."""
    mma_sync_tflops_f16: float
    """Dense f16/bf16 tensor-core TFLOP/s with the Ampere-style mma.sync instruction, the one
    minicomp's templates emit (below `tensor_tflops_f16` on Hopper, whose peak needs wgmma)."""
    tensor_tflops_f16: float
    """Dense f16/bf16 tensor-core peak TFLOP/s (the datasheet's number without sparsity)."""
    wgmma_tflops_f16: float = 0.0
    """Dense f16/bf16 TFLOP/s with Hopper's warpgroup MMA (wgmma), 0 where the architecture has
    none."""
    shared_wavefronts_per_sm_per_clock: float = 1.0
    """Shared-memory wavefronts an SM serves a clock: one is 32 banks x 4 bytes = 128 bytes."""
    launch_overhead_us: float = 2.5
    """The cost of one plain kernel launch, microseconds (an assumption: launch latency as
    commonly measured, a few microseconds)."""
    graph_launch_overhead_us: float = 1.0
    """The cost of one kernel node when a CUDA graph replays, microseconds (an assumption)."""

    @property
    def limits(self) -> arch.ArchLimits:
        """What its architecture allows a kernel (shared memory, registers, threads, blocks)."""
        return arch.limits(self.arch)

    def _per_second(self, lanes_per_sm: float) -> float:
        return self.sms * lanes_per_sm * self.clock_ghz * 1e9

    @property
    def fp32_per_second(self) -> float:
        """FP32 FMA/add/mul thread-instructions a second (an FMA counts once)."""
        return self._per_second(self.fp32_lanes_per_sm)

    @property
    def int32_per_second(self) -> float:
        """32-bit integer thread-instructions a second."""
        return self._per_second(self.int32_lanes_per_sm)

    @property
    def sfu_per_second(self) -> float:
        """Special-function (MUFU) thread-instructions a second."""
        return self._per_second(self.sfu_lanes_per_sm)

    @property
    def shared_bytes_per_second(self) -> float:
        """Shared-memory bytes a second, every wavefront moving 128 bytes."""
        return self._per_second(self.shared_wavefronts_per_sm_per_clock * 128)

    def _wgmma(self) -> str:
        return f", {self.wgmma_tflops_f16:g} by wgmma" if self.wgmma_tflops_f16 else ""

    def describe(self) -> str:
        """Its main numbers on one line, for an estimate's printed assumptions."""
        return (
            f"{self.name} ({self.arch}): {self.sms} SMs at {self.clock_ghz:g} GHz, "
            f"DRAM {self.dram_gbps:g} GB/s, L2 {self.l2_bytes // MIB} MiB at ~{self.l2_gbps:g} "
            f"GB/s, FP32 {self.fp32_per_second * 2 / 1e12:.1f} TFLOP/s, tensor f16 "
            f"{self.tensor_tflops_f16:g} TFLOP/s dense ({self.mma_sync_tflops_f16:g} by "
            f"mma.sync{self._wgmma()}), launch {self.launch_overhead_us:g} us "
            f"({self.graph_launch_overhead_us:g} in a graph)"
        )


H100 = Device(
    name="H100 SXM",
    key="h100",
    arch="sm_90",
    # 132 SMs, 1980 MHz boost (the clock of its 66.9 TFLOP/s FP32: 132 x 128 x 2 x 1.98 GHz):
    # H100 whitepaper. Its tensor-core rates assume 1830 MHz instead, hence 989 below.
    sms=132,
    clock_ghz=1.98,
    # 3.35 TB/s HBM3: H100 datasheet.
    dram_gbps=3350,
    # Assumption: NVIDIA publishes no L2 bandwidth for Hopper. A100's whitepaper width (5120
    # bytes a clock) at H100's clock, ~10 TB/s; microbenchmarks sustain less: a ceiling.
    l2_gbps=10_000,
    # 50 MB L2: H100 whitepaper.
    l2_bytes=50 * MIB,
    # Per SM: 128 FP32, 64 INT32 lanes, 16 SFU results a clock (4 per SM sub-partition):
    # H100 whitepaper (SM diagram) and Programming Guide (compute capability 9.0).
    fp32_lanes_per_sm=128,
    int32_lanes_per_sm=64,
    sfu_lanes_per_sm=16,
    # Assumption: Hopper runs Ampere's mma.sync (SASS HMMA) at about two thirds of the wgmma
    # (HGMMA) peak: mma.sync is issued per warp from registers and feeds the tensor cores at
    # A100's per-SM width, while the 989 TFLOP/s needs asynchronous warpgroup wgmma reading
    # shared memory. Published microbenchmarks of mma.sync on H100 land around 60-70% of peak.
    mma_sync_tflops_f16=660,
    # 989.4 TFLOP/s dense f16/bf16 (1979 with sparsity): H100 whitepaper, H100 datasheet.
    tensor_tflops_f16=989,
    # Assumption: wgmma (HGMMA) is the instruction the datasheet's peak is measured with, so it
    # reaches all of it (the estimate's other units, and the tail, decide how much a kernel
    # gets).
    wgmma_tflops_f16=989,
)

# The same GH100 configuration as H100 SXM (132 SMs, the same clocks, 50 MB L2, the same 989
# TFLOP/s dense f16: H200 datasheet, whose compute rates equal H100 SXM's; the same L2 and
# mma.sync assumptions) with 4.8 TB/s of HBM3e (141 GB): H200 datasheet.
H200 = replace(H100, name="H200 SXM", key="h200", dram_gbps=4800)

A100 = Device(
    name="A100 SXM4 80GB",
    key="a100",
    arch="sm_80",
    # 108 SMs at 1410 MHz boost: A100 whitepaper (19.5 TFLOP/s FP32 = 108 x 64 x 2 x 1.41 GHz).
    sms=108,
    clock_ghz=1.41,
    # 2039 GB/s HBM2e: A100 datasheet (80GB SXM).
    dram_gbps=2039,
    # An estimate: the A100 whitepaper's L2 read bandwidth, 5120 bytes a clock, at 1.41 GHz
    # (~7.2 TB/s); a peak that microbenchmarks do not sustain.
    l2_gbps=7_200,
    # 40 MB L2: A100 whitepaper.
    l2_bytes=40 * MIB,
    # Per SM: 64 FP32 and 64 INT32 lanes, 16 SFU results a clock: A100 whitepaper (SM
    # diagram) and Programming Guide (compute capability 8.0).
    fp32_lanes_per_sm=64,
    int32_lanes_per_sm=64,
    sfu_lanes_per_sm=16,
    # mma.sync is Ampere's own tensor-core instruction: it reaches the full peak.
    mma_sync_tflops_f16=312,
    # 312 TFLOP/s dense f16/bf16 (1024 FMA a clock per SM x 2 x 108 x 1.41 GHz): A100
    # whitepaper.
    tensor_tflops_f16=312,
)

DEVICES: dict[str, Device] = {d.key: d for d in (H100, H200, A100)}


def get_device(key_or_name: str) -> Device:
    """The device with that key ("h100") or name ("H100 SXM"), either in any case; raises
    ValueError naming the known keys."""
    wanted = key_or_name.strip().lower()
    for device in DEVICES.values():
        if wanted in (device.key, device.name.lower()):
            return device
    raise ValueError(f"unknown device {key_or_name!r}; known: {', '.join(DEVICES)}")
