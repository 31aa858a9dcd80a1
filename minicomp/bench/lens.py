"""The performance lens over the kernel benchmark's cases: each template at its level-0 choice
on LLM and ResNet shapes (minicomp/bench/kernels/), estimated on a named GPU without one.

A case is compiled for cuda-emu with the lens and run once with only the sampled blocks of
each launch (lens.session.LensSession.sample_only: seconds, where running a 4096-cubed product
in the emulator would take hours); every launch's counts, with NVRTC's resources for the
device's architecture, give its estimate (lens/estimate.py). A row holds the case's estimated
time, the roofline time of its kernels (their issued tensor-core work or minimum bytes), the
problem's own roofline (its useful flops at the tensor-core rate, or FP32 for float32, or its
minimum bytes at DRAM speed: padding a tile wastes work the first counts as due), their ratios
to the estimate, and the efficiencies that explain a gap.

The rows are written as JSON keyed by the case's label: the GPU validation's kernels stage
(minicomp/bench/stages/kernels.py) reads them and puts each prediction beside the time it
measures for minicomp at search space 0.
"""

from __future__ import annotations

import glob
import json
import math
import os
import time
from dataclasses import asdict, dataclass, field

import torch

from minicomp.backends.cuda.arch import float8_mma_unpacks
from minicomp.bench.kernels.cases import Case
from minicomp.bench.kernels.families import FAMILIES
from minicomp.lens.devices import DEVICES, Device, get_device
from minicomp.lens.profile import LENS_OPTIONS, profile_session
from minicomp.lens.session import recording

LENS_FAMILIES = ("matmul", "attention", "conv")
"""The families with templates (memory-bound kernels are the auto-scheduler's)."""


@dataclass(frozen=True)
class KernelRow:
    """One launch of a case: its template and estimate."""

    kernel: str
    template: str
    time_us: float
    roofline_us: float
    bound: str
    sector_efficiency: float
    bank_conflict_factor: float
    occupancy: float
    registers: int | None
    spill_bytes: int

    @property
    def fraction(self) -> float:
        return self.roofline_us / self.time_us if self.time_us else 1.0


@dataclass(frozen=True)
class LensRow:
    """A case's estimate: the sum of its launches (without launch overhead)."""

    family: str
    case: str
    device: str
    kernels: list[KernelRow] = field(default_factory=list)
    seconds: float = 0.0
    error: str = ""
    problem_roofline_us: float = 0.0

    @property
    def time_us(self) -> float:
        return sum(k.time_us for k in self.kernels)

    @property
    def roofline_us(self) -> float:
        return sum(k.roofline_us for k in self.kernels)

    @property
    def fraction(self) -> float:
        t = self.time_us
        return min(1.0, self.roofline_us / t) if t and not math.isinf(t) else 0.0

    @property
    def problem_fraction(self) -> float:
        t = self.time_us
        return min(1.0, self.problem_roofline_us / t) if t and not math.isinf(t) else 0.0

    def as_dict(self) -> dict:
        """The row as plain data, with its totals."""
        out = asdict(self)
        out.update(time_us=self.time_us, roofline_us=self.roofline_us, fraction=self.fraction)
        out.update(problem_fraction=self.problem_fraction)
        return out


def problem_roofline(case: Case, device: Device) -> float:
    """Seconds `case` needs at best on `device`: its flops on tensor cores (mma.sync) for
    16-bit operands (int8: twice the f16 rate; float8: the f16 rate where mma.sync unpacks
    it to f16, sm_90, twice elsewhere) or on FP32 FMAs for float32, or its minimum bytes at
    DRAM speed."""
    if case.dtype in ("float16", "bfloat16"):
        compute = case.flops / (device.mma_sync_tflops_f16 * 1e12)
    elif case.dtype == "float8_e4m3fn":
        rate = 1 if float8_mma_unpacks(device.arch) else 2
        compute = case.flops / (rate * device.mma_sync_tflops_f16 * 1e12)
    elif case.dtype == "int8":
        compute = case.flops / (2 * device.mma_sync_tflops_f16 * 1e12)
    else:
        compute = case.flops / (2 * device.fp32_per_second)
    return max(compute, case.min_bytes / (device.dram_gbps * 1e9))


def cases(families=LENS_FAMILIES, tiers=(1,), dtypes=None) -> list[Case]:
    """The GPU benchmark's cases of `families` and `tiers`, their inputs made on the host."""
    out = []
    for name in families:
        kw = {} if dtypes is None else {"dtypes": dtypes}
        out += [c for c in FAMILIES[name].gpu_cases(device="cpu", **kw) if c.tier in tiers]
    return out


def estimate_case(case: Case, device: str = "h100", options: dict | None = None) -> LensRow:
    """`case` compiled at search space 0 for cuda-emu with the lens, its launches sampled and
    estimated on `device`."""
    target = get_device(device)
    start = time.monotonic()
    torch._dynamo.reset()
    opts = {"search_space": 0, **(options or {}), **LENS_OPTIONS}
    try:
        compiled = torch.compile(case.fn, backend="minicomp", options=opts)
        with recording(sample_only=True) as session:
            compiled(*case.make())
        estimates = profile_session(session, target).graph.kernels
    except Exception as err:  # noqa: BLE001 - a case that breaks is a row that says why
        return LensRow(case.family, case.label, device, error=f"{type(err).__name__}: {err}"[:400])
    finally:
        torch._dynamo.reset()
    kernels = []
    for launch, k in zip(session.launches, estimates):
        template = launch.function.attrs.template or "auto-scheduled"
        kernels.append(_kernel_row(k, template.split("[")[0]))
    seconds = time.monotonic() - start
    best = problem_roofline(case, target) * 1e6
    return LensRow(case.family, case.label, device, kernels, seconds, problem_roofline_us=best)


def _kernel_row(k, template: str) -> KernelRow:
    """The table row of kernel estimate `k`, made by `template`."""
    return KernelRow(
        kernel=k.kernel,
        template=template,
        time_us=k.time * 1e6,
        roofline_us=k.roofline_time * 1e6,
        bound=k.bound,
        sector_efficiency=k.counts.sector_efficiency,
        bank_conflict_factor=k.counts.bank_conflict_factor,
        occupancy=k.occupancy.fraction,
        registers=None if k.resources is None else k.resources.registers,
        spill_bytes=k.spill_bytes,
    )


def estimate_hopper(case: Case, device: str = "h100", configs=None) -> LensRow:
    """The Hopper matmul (schedule/templates/matmul_hopper.py: TMA, wgmma, persistent tiles) on
    `case`'s 16-bit product, launched directly with B stored K-major ([N, K]; the kernel is not
    in the compiler's search space yet), counted at each of `configs` (default: all it offers)
    and estimated on `device`: the row of the fastest, its problem roofline the flops at the
    device's wgmma rate (the mma.sync rate's for the other rows)."""
    from minicomp import config as minicomp_config
    from minicomp.schedule.templates import matmul_hopper as hopper

    target = get_device(device)
    m, n, k = (case.fields[d] for d in "mnk")
    start = time.monotonic()
    best = None
    for cfg in configs or hopper.CONFIGS:
        a, b = case.make()[:2]
        b = b.t().contiguous()  # [N, K]: wgmma's K-major B
        try:
            with minicomp_config.patch(**LENS_OPTIONS), recording(sample_only=True) as session:
                hopper.matmul_hopper(a, b, config=cfg)
            (k_est,) = profile_session(session, target).graph.kernels
        except Exception as err:  # noqa: BLE001 - a case that breaks is a row that says why
            return LensRow(case.family, case.label, device, error=f"{type(err).__name__}: {err}")
        if best is None or k_est.time < best[1].time:
            best = (cfg, k_est)
    cfg, k_est = best
    row = _kernel_row(k_est, f"matmul_hopper[{cfg.name}]")
    rate = target.wgmma_tflops_f16 or target.tensor_tflops_f16
    best_us = max(case.flops / (rate * 1e12), case.min_bytes / (target.dram_gbps * 1e9)) * 1e6
    seconds = time.monotonic() - start
    return LensRow(case.family, case.label, device, [row], seconds, problem_roofline_us=best_us)


def estimate_hopper_attention(case: Case, device: str = "h100") -> LensRow:
    """`case`, an attention, compiled for sm_90a, where the compiler picks the Hopper attention
    (schedule/templates/attention_hopper.py: TMA, wgmma for both products) for what it takes,
    estimated on `device` as estimate_case does; its problem roofline the flops at the
    device's wgmma rate."""
    row = estimate_case(case, device, options={"arch": "sm_90a"})
    if row.error:
        return row
    target = get_device(device)
    rate = target.wgmma_tflops_f16 or target.tensor_tflops_f16
    best_us = max(case.flops / (rate * 1e12), case.min_bytes / (target.dram_gbps * 1e9)) * 1e6
    return LensRow(row.family, row.case, device, row.kernels, row.seconds, "", best_us)


HEADER = (
    "case",
    "kernels",
    "est us",
    "roofline us",
    "fraction",
    "problem %",
    "bound",
    "sectors",
    "banks",
    "occupancy",
    "regs",
    "spill",
)


def table(rows: list[LensRow]) -> str:
    """The rows as an aligned text table; the efficiencies are the worst over a case's
    kernels, the bound and registers those of its slowest kernel."""
    lines = [HEADER]
    for r in rows:
        if r.error:
            lines.append((r.case, "error: " + r.error, *[""] * (len(HEADER) - 2)))
            continue
        slowest = max(r.kernels, key=lambda k: k.time_us)
        names = sorted({k.template for k in r.kernels})
        lines.append(
            (
                r.case,
                "+".join(names),
                f"{r.time_us:.1f}",
                f"{r.roofline_us:.1f}",
                f"{r.fraction:.0%}",
                f"{r.problem_fraction:.0%}",
                slowest.bound,
                f"{min(k.sector_efficiency for k in r.kernels):.2f}",
                f"x{max(k.bank_conflict_factor for k in r.kernels):.2f}",
                f"{slowest.occupancy:.0%}",
                str(slowest.registers),
                str(max(k.spill_bytes for k in r.kernels)),
            )
        )
    widths = [max(len(x[i]) for x in lines) for i in range(len(HEADER))]
    out = []
    for x in lines:
        cells = [x[0].ljust(widths[0]), x[1].ljust(widths[1])]
        cells += [v.rjust(w) for v, w in zip(x[2:], widths[2:])]
        out.append("  ".join(cells).rstrip())
    return "\n".join(out)


def summary(rows: list[LensRow], goal: float = 0.7) -> str:
    """The geometric mean fraction of roofline and the cases under `goal`."""
    ok = [r for r in rows if not r.error and r.kernels]
    failed = [r.case for r in rows if r.error]
    if not ok:
        return f"no case estimated; {len(failed)} failed"
    geomean = math.exp(sum(math.log(max(r.fraction, 1e-9)) for r in ok) / len(ok))
    problem = math.exp(sum(math.log(max(r.problem_fraction, 1e-9)) for r in ok) / len(ok))
    under = [r.case for r in ok if r.fraction < goal]
    text = f"geomean fraction of roofline {geomean:.0%} (of the problem's {problem:.0%})"
    text += f" over {len(ok)} cases"
    text += f"; {len(under)} under {goal:.0%}" + (": " + "; ".join(under) if under else "")
    return text + (f"; {len(failed)} failed" if failed else "")


def write(rows: list[LensRow], path: str, meta: dict) -> None:
    """The rows as JSON (what the kernels stage reads), with `meta` (device, commit)."""
    data = {**meta, "cases": {r.case: r.as_dict() for r in rows}}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1)
        f.write("\n")


def predictions(path: str) -> dict[str, float]:
    """Estimated microseconds by case label from a file `write` made (empty if none)."""
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except (OSError, ValueError):
        return {}
    return {
        label: row["time_us"]
        for label, row in data.get("cases", {}).items()
        if not row.get("error") and row.get("time_us")
    }


def device_key(name: str) -> str | None:
    """The lens device describing a GPU by its CUDA name ("NVIDIA H100 80GB HBM3" -> "h100")."""
    lowered = name.lower()
    return next((key for key in DEVICES if key in lowered), None)


def latest_predictions(results_dir: str, key: str) -> tuple[str, dict[str, float]]:
    """The newest estimates committed for device `key` (lens-<key>-<date>.json, not a
    '-before' table) and their microseconds by case label; ("", {}) when there are none."""
    paths = sorted(glob.glob(os.path.join(results_dir, f"lens-{key}-*.json")))
    paths = [p for p in paths if not p.endswith("-before.json")]
    return (paths[-1], predictions(paths[-1])) if paths else ("", {})


def compare(row: dict, predicted_us: dict[str, float]) -> None:
    """Put the lens's prediction beside the time a kernels-stage row measured at search space
    0 (`mc0_s`): `mc0_predicted_s` and `mc0_measured_over_predicted`."""
    us = predicted_us.get(row.get("case", ""))
    measured = row.get("mc0_s")
    if us is None or not measured:
        return
    row["mc0_predicted_s"] = us * 1e-6
    row["mc0_measured_over_predicted"] = measured / (us * 1e-6)


def comparison_summary(rows: list[dict], source: str) -> str:
    """One line: how far measured times are from the lens's predictions."""
    ratios = sorted(r["mc0_measured_over_predicted"] for r in rows if "mc0_predicted_s" in r)
    if not ratios:
        return f"lens: no prediction matched a measured case ({source or 'no lens-*.json'})"
    geomean = math.exp(sum(math.log(x) for x in ratios) / len(ratios))
    return (
        f"lens: measured / predicted at search space 0 over {len(ratios)} cases: geomean "
        f"{geomean:.2f}, from {ratios[0]:.2f} to {ratios[-1]:.2f} (predictions: {source})"
    )
