"""One kernel benchmark case measured under every backend: the library PyTorch calls (cuBLAS,
SDPA, cuDNN), minicomp at each search space and, for a chosen few, Inductor.

A case is a function, a way to make its inputs, and a higher-precision reference. Every
backend is compiled first (the first call's time is its compile time), checked against the
reference, and only then timed, all backends in turn each round (kernels/timing.py). The row
holds, per backend `b` (library, mc0, mc1, inductor): `b_s` (median seconds a call) with its
quartiles, `b_tflops`, `b_roofline` (the fraction of the measured device peak: the roofline
floor max(flops / peak rate, bytes / peak bandwidth) over the time), `b_rel_err` and
`b_compile_s`, or `b_error`; for minicomp also the templates it chose, the tuning time over
search space 0 and, per kernel, registers, spills and the SASS check (the tensor-core,
ldmatrix and cp.async instructions its source asked for are in the machine code).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch._dynamo

from minicomp import config
from minicomp.backends.cuda import nvrtc, sass
from minicomp.backends.cuda.intrinsics_wgmma import feature_arch
from minicomp.bench.kernels.timing import copies_beyond_l2, interleaved
from minicomp.bench.measure import first_call, relative_error
from minicomp.dynamo.backend import recording
from minicomp.ir.func import Module
from minicomp.ir.graph import ExternOp
from minicomp.targets import get_target

DTYPE_NAMES = {
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.float32: "float32",
    torch.int8: "int8",
    torch.float8_e4m3fn: "float8_e4m3fn",
}
SHORT = {
    "f16": torch.float16,
    "bf16": torch.bfloat16,
    "f32": torch.float32,
    "i8": torch.int8,
    "f8": torch.float8_e4m3fn,
}


@dataclass(frozen=True)
class Case:
    """A kernel to measure: `fn(*make())` under each backend against `reference(*inputs)`."""

    family: str  # matmul, attention, conv
    label: str  # what a table shows: "4096x4096x4096 float16"
    fields: dict  # the row's description of the case (shape, dtype, ...)
    fn: Callable
    make: Callable[[], tuple]  # one set of inputs, on the device
    reference: Callable[..., torch.Tensor]  # the exact answer, in float32 or better
    flops: float
    min_bytes: float  # each input read once and the output written once
    tolerance: float  # max |out - ref| / max |ref| that passes
    inductor: bool = False  # also time Inductor (its max-autotune compile is long)
    tier: int = 1  # priority: a stage measures every family's tier 1 before any tier 2
    describe_library: Callable[[tuple], dict] | None = None  # e.g. which SDPA kernel ran

    @property
    def dtype(self) -> str:
        return self.fields["dtype"]


@dataclass
class Env:
    """Where and how cases are measured."""

    device: str  # "cuda", or "cpu" for a rehearsal
    target: str  # minicomp's target: cuda, or cuda-emu in a rehearsal
    clock: object  # kernels.timing.GraphClock or WallClock
    cache_dir: str
    levels: tuple[int, ...] = (0, 1)
    tune_budget: int = 10
    repeat: int = 20
    inner: int = 10
    inductor_mode: str | None = "max-autotune-no-cudagraphs"  # None: never Inductor
    peaks: dict = field(default_factory=dict)  # measured: "<dtype>_tflops", "copy_gbs"
    sass_arch: str | None = None  # check minicomp's kernels' SASS for this architecture
    sass_log: Callable[[str], None] | None = None  # receives each kernel's SASS summary


def compile_minicomp(fn: Callable, level: int, env: Env) -> Callable:
    """`fn` compiled by minicomp at search space `level`, without its own CUDA graphs (the
    clock's graph replaces them), erroring instead of falling back to eager."""
    options = {
        "search_space": level,
        "tune_budget": env.tune_budget,
        "cuda_graphs": False,
        "target": env.target,
        "fallback": "error",
        "cache_dir": env.cache_dir,
        # The stage measures what tuning by timing picks; in a CPU rehearsal (cuda-emu) that
        # is the heuristic, not the lens's ranking (benchmarks/lens.py is the lens's bench).
        "cost_model": "measure",
    }
    return torch.compile(fn, backend="minicomp", options=options, dynamic=False)


def _minicomp_details(records: list, env: Env) -> dict:
    """What minicomp's compile records say about a case: templates, kernels, ATen calls, and
    per kernel the resources and SASS check when env.sass_arch is set."""
    templates, kernels, aten = set(), 0, []
    for r in records:
        kernels += len(r.kernels)
        templates |= {(k.attrs.template or "").split("[")[0] for k in r.kernels} - {""}
        if r.graph is not None:
            aten += [n.name for n in r.graph.nodes if isinstance(n, ExternOp)]
    out = {"templates": sorted(templates), "kernels": kernels, "aten_ops": aten}
    if env.sass_arch:
        out.update(_sass_details(records, env))
    return out


def _sass_details(records: list, env: Env) -> dict:
    detail, missing = [], []
    try:
        for r in records:
            if not r.source or not get_target(r.target).runs_cuda:
                continue
            # A graph using wgmma (the Hopper matmul) builds for sm_90a, as the cuda target
            # builds it on an sm_90 device.
            arch = feature_arch(env.sass_arch, Module("graph", tuple(r.kernels)))
            binary = nvrtc.compile_cuda(
                r.source,
                arch=arch,
                cache_dir=env.cache_dir,
                library=config.get("nvrtc_library"),
            )
            templates = {k.name: (k.attrs.template or "") for k in r.kernels}
            for report in sass.check_kernels(r.source, binary.cubin):
                res = binary.resources.get(report.kernel, nvrtc.KernelResources())
                entry = {
                    "kernel": report.kernel,
                    "template": templates.get(report.kernel, ""),
                    "registers": res.registers,
                    "spill_bytes": res.spill_stores + res.spill_loads,
                    "stack_bytes": res.stack_bytes,
                    "smem_bytes": res.shared_bytes,
                    "intended": list(report.intended),
                    "missing": list(report.missing),
                    **{op.lower(): n for op, n in report.counts.items() if n},
                }
                detail.append(entry)
                missing += [f"{report.kernel}:{op}" for op in report.missing]
                if env.sass_log:
                    env.sass_log(_sass_line(entry, arch))
    except Exception as err:  # the tool missing or failing is reported, not fatal
        return {"sass_error": f"{type(err).__name__}: {err}"[:300]}
    return {"sass": detail, "sass_missing": missing, "sass_ok": not missing}


def _sass_line(entry: dict, arch: str) -> str:
    skip = ("kernel", "template", "intended", "missing")
    counts = " ".join(f"{k}={v}" for k, v in entry.items() if k not in skip)
    meant = ",".join(entry["intended"]) or "nothing special"
    verdict = "ok" if not entry["missing"] else "MISSING " + ",".join(entry["missing"])
    verdict = f"meant {meant}: {verdict}"
    return f"{arch} {entry['kernel']} [{entry['template'] or '-'}] {counts} -> {verdict}"


def _compile_runners(case: Case, copies: list, expected, env: Env, row: dict) -> dict:
    """Every backend's callable, each compiled, run once and checked; failures go in `row`."""
    runners: dict[str, Callable] = {"library": case.fn}
    out, _ = first_call(case.fn, copies[0], env.device)
    row["library_rel_err"] = relative_error(out, expected)
    if case.describe_library:
        row.update(case.describe_library(copies[0]))
    first_s: dict[int, float] = {}
    for level in env.levels:
        name = f"mc{level}"
        try:
            compiled = compile_minicomp(case.fn, level, env)
            records: list = []
            with recording(records):
                out, first_s[level] = first_call(compiled, copies[0], env.device)
            row[f"{name}_compile_s"] = first_s[level]
            row[f"{name}_rel_err"] = relative_error(out, expected)
            row.update({f"{name}_{k}": v for k, v in _minicomp_details(records, env).items()})
            runners[name] = compiled
        except Exception as err:  # the row says what failed; the other backends go on
            row[f"{name}_error"] = f"{type(err).__name__}: {err}"[:400]
    for level in env.levels:
        if level and 0 in first_s and level in first_s:
            row[f"mc{level}_tune_s"] = max(0.0, first_s[level] - first_s[0])
    if case.inductor and env.inductor_mode:
        row["inductor_mode"] = env.inductor_mode
        try:
            mode = None if env.inductor_mode == "default" else env.inductor_mode
            compiled = torch.compile(case.fn, mode=mode, dynamic=False)
            out, row["inductor_compile_s"] = first_call(compiled, copies[0], env.device)
            row["inductor_rel_err"] = relative_error(out, expected)
            runners["inductor"] = compiled
        except Exception as err:
            row["inductor_error"] = f"{type(err).__name__}: {err}"[:400]
    return runners


def measure_case(case: Case, env: Env) -> dict:
    """Measure `case` under every backend; the row (see the module docstring)."""
    row: dict = {"family": case.family, "case": case.label, **case.fields}
    row.update(flops=case.flops, min_bytes=case.min_bytes, tolerance=case.tolerance)
    torch._dynamo.reset()  # a fresh code cache a case: no recompile limit is reached
    copies = copies_beyond_l2(case.make, env.device)
    expected = case.reference(*copies[0])
    try:
        runners = _compile_runners(case, copies, expected, env, row)
        for name in list(runners):
            if row.get(f"{name}_rel_err", 0.0) > case.tolerance:
                row[f"{name}_wrong"] = True
        samplers = {}
        for name, runner in runners.items():
            try:
                samplers[name] = env.clock.prepare(runner, copies, env.inner)
            except Exception as err:
                row[f"{name}_error"] = f"timing: {type(err).__name__}: {err}"[:400]
        timings = interleaved(samplers, env.repeat)
    finally:
        del copies
        if env.device == "cuda":
            torch.cuda.empty_cache()
    _fill_times(row, case, timings, env)
    return row


def _fill_times(row: dict, case: Case, timings: dict, env: Env) -> None:
    peak_flops = env.peaks.get(f"{case.dtype}_tflops")
    peak_bw = env.peaks.get("copy_gbs")
    floors = []
    if peak_flops:
        floors.append(case.flops / (peak_flops * 1e12))
    if peak_bw:
        floors.append(case.min_bytes / (peak_bw * 1e9))
    floor = max(floors) if floors else None
    for name, t in timings.items():
        row[f"{name}_s"], row[f"{name}_q1"], row[f"{name}_q3"] = t.median, t.q1, t.q3
        row[f"{name}_tflops"] = case.flops / t.median / 1e12 if t.median > 0 else None
        if floor:
            row[f"{name}_roofline"] = floor / t.median if t.median > 0 else None
    library = timings.get("library")
    for name, t in timings.items():
        if name == "library" or not library:
            continue
        row[f"{name}_vs_library"] = library.median / t.median if t.median > 0 else None
        if "inductor" in timings and name != "inductor":
            row[f"{name}_vs_inductor"] = timings["inductor"].median / t.median
    row["timed"] = sorted(timings)
    row["rounds"] = env.repeat
