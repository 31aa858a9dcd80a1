"""Stage 2, kernels: minicomp's templates against the libraries PyTorch calls.

Matmul (f16, bf16, f32; squares and LLM shapes) against cuBLAS, attention (head dims 64 and
128, causal and not, prefill and decode) against SDPA, ResNet-50's convolutions against cuDNN,
memory-bound kernels (an elementwise chain, softmax, layer norm) against eager, each at search
spaces 0 and 1 and, for a chosen few, against Inductor's max-autotune; then the host time a
call of a 50-kernel graph costs, with and without CUDA graphs. Each row measured at search
space 0 also carries the performance lens's committed prediction for this GPU
(`mc0_predicted_s`, from benchmarks/lens.py), and a last line says how far the model is off.
A row per case (minicomp/bench/kernels/cases.py says what it holds), the SASS check of every
kernel in `kernels-<tag>-sass.txt`. Cases run by tier, the families taking turns within a tier, so a
budget that runs out leaves every family's most telling cases measured.
"""

from __future__ import annotations

import itertools
import os
import time

import torch

from minicomp.bench.kernels import overhead
from minicomp.bench.kernels.cases import Case, Env, measure_case
from minicomp.bench.kernels.families import FAMILIES
from minicomp.bench.kernels.table import header, line, summary
from minicomp.bench.kernels.timing import clock_for
from minicomp.bench.lens import compare, comparison_summary, device_key, latest_predictions
from minicomp.bench.stages.facts import measure_peaks
from minicomp.bench.stages.stage import Stage

OVERHEAD_GUESS_S = 40.0  # the 50-kernel graph compiled by Inductor and by minicomp, twice
FIRST_CASE_GUESS_S = 25.0  # before any case has run: a compile at two levels and the timing
REHEARSAL_ARCH = "sm_90"  # the SASS a rehearsal checks (NVRTC needs no GPU)
# The launch-overhead graph's kernels in a rehearsal: its mechanics, not the size, whose 50
# kernels cost the emulator's build and Inductor's compile seconds on the CPU.
REHEARSAL_STEPS = 5


def ordered(cases_by_family: dict[str, list[Case]]) -> list[Case]:
    """Tier by tier; within a tier the families take turns, each in its own order."""
    out = []
    for tier in sorted({c.tier for cases in cases_by_family.values() for c in cases}):
        lists = [[c for c in cases if c.tier == tier] for cases in cases_by_family.values()]
        for group in itertools.zip_longest(*lists):
            out += [c for c in group if c is not None]
    return out


def select(stage: Stage, families: list[str]) -> list[Case]:
    """The cases of `families` for this stage: the GPU lists, or tiny ones in a rehearsal."""
    chosen = {}
    for name in families:
        module = FAMILIES[name]
        cases = module.rehearsal_cases(stage.device) if stage.rehearse else module.gpu_cases()
        chosen[name] = cases
    return ordered(chosen)


def run(stage: Stage, only: list[str] | None = None, levels=(0, 1), tune_budget: int = 10) -> None:
    """Measure the peaks, then every selected case while the budget allows."""
    families = only or list(FAMILIES)
    clock = clock_for(stage.device)
    torch.backends.cudnn.allow_tf32 = False  # f32 means f32 for every backend
    torch.backends.cuda.matmul.allow_tf32 = False
    peaks = measure_peaks(stage.device, clock)
    stage.rows.write({"kind": "peaks", "clock": clock.name, **peaks})
    print("measured peaks: " + ", ".join(f"{k} {v:.1f}" for k, v in peaks.items()), flush=True)
    arch = REHEARSAL_ARCH if stage.rehearse else _device_arch()
    sass_path = stage.path("-sass.txt")

    def sass_log(line: str) -> None:
        with open(sass_path, "a", encoding="utf-8") as f:
            f.write(line + "\n")

    env = Env(
        device=stage.device,
        target=stage.target,
        clock=clock,
        cache_dir=stage.cache_dir,
        levels=tuple(levels),
        tune_budget=tune_budget,
        repeat=3 if stage.rehearse else 20,
        inner=2 if stage.rehearse else 10,
        inductor_mode="default" if stage.rehearse else "max-autotune-no-cudagraphs",
        peaks=peaks,
        sass_arch=arch,
        sass_log=sass_log,
    )
    cases = select(stage, families)
    lens_source, predicted = _predictions(stage)
    print(header(levels), flush=True)
    spent: list[float] = []
    rows = []
    for i, case in enumerate(cases):
        guess = (sum(spent) / len(spent)) if spent else FIRST_CASE_GUESS_S
        guess *= 3 if case.inductor else 1  # max-autotune's compile is long
        if not stage.budget.allows(guess):
            for rest in cases[i:]:
                stage.skip(rest.label, "out of the stage's time budget", family=rest.family)
            break
        start = time.monotonic()
        try:
            row = measure_case(case, env)
        except Exception as err:  # a case that breaks is a result; the next one goes on
            row = {"family": case.family, "case": case.label, **case.fields}
            row["error"] = f"{type(err).__name__}: {err}"[:600]
        row["kind"], row["seconds"] = "case", round(time.monotonic() - start, 1)
        compare(row, predicted)
        stage.rows.write(row)
        rows.append(row)
        spent.append(row["seconds"] / (3 if case.inductor else 1))
        print(line(row, levels), flush=True)
        if not _device_healthy(stage):
            rest = cases[i + 1 :]
            for case in rest:
                stage.skip(case.label, "the CUDA context failed", family=case.family)
            break
    if stage.budget.allows(OVERHEAD_GUESS_S):
        calls, steps = (50, REHEARSAL_STEPS) if stage.rehearse else (1000, overhead.STEPS)
        row = overhead.measure(stage.device, stage.target, stage.cache_dir, calls, steps)
        stage.rows.write(row)
        print(
            "host time per call, "
            + row["graph"]
            + ": "
            + ", ".join(
                f"{k.removesuffix(' us')} {v:.1f} us" for k, v in row.items() if k.endswith(" us")
            ),
            flush=True,
        )
    else:
        stage.skip("launch overhead", "out of the stage's time budget")
    print(summary(rows, levels), flush=True)
    print(comparison_summary(rows, lens_source), flush=True)


def _predictions(stage: Stage) -> tuple[str, dict[str, float]]:
    """The lens's committed estimates for this GPU (benchmarks/results/lens-<key>-*.json,
    made by benchmarks/lens.py on a CPU machine), to compare with what is measured."""
    if stage.device != "cuda":
        return "", {}
    key = device_key(torch.cuda.get_device_name())
    if key is None:
        return "", {}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    return latest_predictions(os.path.join(root, "benchmarks", "results"), key)


def _device_arch() -> str:
    major, minor = torch.cuda.get_device_capability()
    return f"sm_{major}{minor}"


def _device_healthy(stage: Stage) -> bool:
    """False once the CUDA context is broken (an illegal access poisons every later call)."""
    if stage.device != "cuda":
        return True
    try:
        torch.cuda.synchronize()
        return True
    except Exception as err:
        print(f"the CUDA context failed: {err}", flush=True)
        return False
