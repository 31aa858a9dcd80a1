"""A profile: the lens's estimate of every launch a recording session counted, on one device,
as a table like Nsight Compute's summary (what `minicomp profile` and `minicomp explain`
print). NVRTC builds each launch's source for the device's architecture for registers, shared
memory and spills and, with cuobjdump installed, SASS instruction classes.
"""

from __future__ import annotations

import functools
import json
import math
from dataclasses import dataclass

from minicomp import config
from minicomp.backends.cuda.arch import device_build_arch
from minicomp.backends.cuda.intrinsics_wgmma import feature_arch
from minicomp.ir.func import Module
from minicomp.lens.counts import KernelCounts, l2_resident, scratch_positions
from minicomp.lens.devices import Device
from minicomp.lens.estimate import ASSUMPTIONS, GraphEstimate, KernelEstimate, estimate
from minicomp.lens.session import LensSession

LENS_OPTIONS = {"target": "cuda-emu", "lens": True}
"""What profiling sets: the kernels run in the emulator, counted."""


def lens_options(device: Device) -> dict:
    """LENS_OPTIONS for estimating on `device`: the graph compiled as the cuda target would
    compile it on that GPU (its SM count, and its architecture as the cuda target builds for
    it: an H100's as sm_90a, so products take the Hopper templates there too)."""
    return {**LENS_OPTIONS, "lens_device": device.key, "arch": device_build_arch(device.arch)}


@dataclass(frozen=True)
class Profile:
    """The estimate of every launch a run made, in launch order, on one device."""

    graph: GraphEstimate
    sass: dict[str, dict[str, int]]
    """Instruction classes of each kernel's SASS (empty without cuobjdump)."""
    problems: tuple[str, ...] = ()

    @property
    def device(self) -> Device:
        return self.graph.device

    def by_time(self) -> list[KernelEstimate]:
        """The launches, slowest first."""
        return sorted(self.graph.kernels, key=lambda k: -k.time)

    def as_dict(self) -> dict:
        """The profile as plain data (what --json prints)."""
        g = self.graph
        return {
            "device": self.device.key,
            "device_description": self.device.describe(),
            "time_us": g.time * 1e6,
            "roofline_time_us": g.roofline_time * 1e6,
            "launch_overhead_us": g.overhead * 1e6,
            "kernels": [
                {**k.as_dict(), "sass": self.sass.get(k.kernel, {})} for k in self.by_time()
            ],
            "assumptions": list(ASSUMPTIONS),
            "problems": list(self.problems),
        }

    def __str__(self) -> str:
        g = self.graph
        kernels = self.by_time()
        total = sum(k.time for k in kernels)
        head = (
            f"minicomp profile: {len(kernels)} launches on {self.device.name} "
            f"({self.device.arch}), estimated {_us(g.time)} us ({_us(total)} in kernels, "
            f"{_us(g.overhead)} launch overhead); roofline {_us(g.roofline_time)} us"
        )
        header = (
            "kernel",
            "grid x block",
            "time us",
            "share",
            "bound",
            "roofline",
            "DRAM MB",
            "sectors",
            "banks",
            "occupancy",
            "regs",
            "spill",
        )
        rows = [header]
        for k in kernels:
            c = k.counts
            occ = k.occupancy
            rows.append(
                (
                    k.kernel,
                    f"{_dims(c.grid)} x {_dims(c.block)}",
                    _us(k.time),
                    f"{k.time / total:.0%}" if total and not math.isinf(k.time) else "-",
                    k.bound,
                    f"{k.fraction_of_roofline:.0%}",
                    f"{c.dram_bytes / 1e6:.2f}",
                    f"{c.sector_efficiency:.2f}",
                    f"x{c.bank_conflict_factor:.2f}",
                    f"{occ.blocks_per_sm}/SM {occ.fraction:.0%}",
                    "-" if k.resources is None else str(k.resources.registers),
                    str(k.spill_bytes),
                )
            )
        widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
        lines = [head, ""]
        for r in rows:
            cells = [r[0].ljust(widths[0])] + [v.rjust(w) for v, w in zip(r[1:], widths[1:])]
            lines.append("  ".join(cells).rstrip())
        notes = [f"  {k.kernel}: {note}" for k in kernels for note in k.notes]
        if notes:
            lines += ["", "notes:", *dict.fromkeys(notes)]
        lines += ["", f"device: {self.device.describe()}", "assumptions:"]
        lines += [f"  - {a}" for a in ASSUMPTIONS]
        lines += [f"  ! {p}" for p in self.problems]
        return "\n".join(lines)

    def json(self) -> str:
        return json.dumps(self.as_dict(), indent=2)


def _us(seconds: float) -> str:
    return "inf" if math.isinf(seconds) else f"{seconds * 1e6:.2f}"


def _dims(d: tuple[int, ...]) -> str:
    used = [str(x) for x in d]
    while len(used) > 1 and used[-1] == "1":
        used.pop()
    return ",".join(used)


def profile_session(session: LensSession, device: Device) -> Profile:
    """The profile of a recording session's launches on `device`."""
    problems: list[str] = []
    estimates = []
    sass: dict[str, dict[str, int]] = {}
    cache_dir = config.resolve().cache_dir
    before = None
    # The kernels of each source (a graph's module): a launch's source compiles as a whole.
    modules: dict[str, dict] = {}
    for launch in session.launches:
        modules.setdefault(launch.source, {})[launch.function.name] = launch.function
    for launch in session.launches:
        name = launch.function.name
        # sm_90a for a source using wgmma on an sm_90 device, as the cuda target builds it:
        # also for a kernel without wgmma beside one with it (attention_hopper_bwd's pre).
        functions = tuple(modules[launch.source].values())
        arch = feature_arch(device.arch, Module(name, functions))
        resources, classes = _compiled(launch.source, arch, cache_dir, problems)
        in_l2 = l2_resident(launch.sample, before, device.l2_bytes)
        scratch = scratch_positions(launch.function)
        counts = KernelCounts.from_sample(launch.sample, in_l2, scratch)
        estimates.append(estimate(counts, device, resources.get(name)))
        before = launch.sample
        if name in classes:
            sass[name] = classes[name]
    return Profile(GraphEstimate(tuple(estimates), device), sass, tuple(dict.fromkeys(problems)))


def _compiled(source: str, arch: str, cache_dir: str, problems: list[str]) -> tuple[dict, dict]:
    try:
        return _build(source, arch, cache_dir)
    except Exception as err:  # noqa: BLE001 - a profile without resources is still a profile
        problems.append(f"no NVRTC resources or SASS ({type(err).__name__}: {err})"[:300])
        return {}, {}


@functools.lru_cache(maxsize=64)
def _build(source: str, arch: str, cache_dir: str) -> tuple[dict, dict]:
    """Each kernel's ptxas resources and SASS instruction classes for `source` on `arch`."""
    from minicomp.backends.cuda import nvrtc, sass

    binary = nvrtc.compile_cuda(source, arch=arch, cache_dir=cache_dir)
    try:
        text = sass.disassemble(binary.cubin)
    except sass.SassUnavailableError:
        return dict(binary.resources), {}
    classes = {k: sass.instruction_classes(sass.full_opcode_counts(v)) for k, v in text.items()}
    return dict(binary.resources), classes
