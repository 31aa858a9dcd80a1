"""The results page: benchmarks/results/README.md, the tables a user reads first, made from the
staged GPU runs' committed JSON Lines files (`<stage>-<device>-<date>-<commit>.jsonl`).

    python -m minicomp.bench.stages report [--results benchmarks/results]

Per run (device, date, commit): the headline ratios, then per stage its table: the checks'
outcome, each kernel against its library and Inductor, each model's speed-up over eager and
over Inductor with compile times, each training step. Rehearsals (the CPU's `emu` runs) are
left out unless asked for: their numbers time an emulator.
"""

from __future__ import annotations

import glob
import math
import os
from collections import defaultdict

from minicomp.bench.rows import read_rows
from minicomp.bench.stages import STAGES

PAGE = "README.md"
HOW = """\
Each run comes from the staged GPU validation, one command of a GPU machine per stage:

    bash benchmarks/gpu_run.sh check     # device facts, CUDA tests, compute-sanitizer
    bash benchmarks/gpu_run.sh kernels   # matmul, attention, conv vs cuBLAS, SDPA, cuDNN, Inductor
    bash benchmarks/gpu_run.sh models    # the model suite vs eager and Inductor
    bash benchmarks/gpu_run.sh train     # a training step vs eager and Inductor

Each writes `<stage>-<device>-<date>-<commit>.jsonl` (one row per measurement, appended as it
is measured) and a log; commit them here and run
`python -m minicomp.bench.stages report` to remake this page. `--rehearse` runs any stage on
the CPU (the emulator, tiny shapes), as CI does on every commit.
"""


def load_runs(results_dir: str, include_rehearsals: bool = False) -> dict[str, dict]:
    """tag -> {"facts": first facts row, stage: [rows]} for every stage file found."""
    runs: dict[str, dict] = defaultdict(dict)
    for path in sorted(glob.glob(os.path.join(results_dir, "*.jsonl"))):
        rows = read_rows(path)
        if not rows or rows[0].get("kind") != "facts" or rows[0].get("stage") not in STAGES:
            continue  # a test report or another benchmark's file
        facts = rows[0]
        if facts.get("rehearsal") and not include_rehearsals:
            continue
        stem = os.path.basename(path).removesuffix(".jsonl")
        tag = stem.removeprefix(facts["stage"] + "-")
        runs[tag].setdefault("facts", facts)
        runs[tag][facts["stage"]] = rows[1:]
    return dict(runs)


def _num(value, fmt: str, suffix: str = "") -> str:
    return "-" if value is None else format(value, fmt) + suffix


def geomean(values) -> float | None:
    values = [v for v in values if isinstance(v, (int, float)) and v > 0]
    return math.exp(sum(map(math.log, values)) / len(values)) if values else None


def _table(head: list[str], rows: list[list[str]]) -> list[str]:
    out = ["| " + " | ".join(head) + " |", "|" + "|".join("---" for _ in head) + "|"]
    return out + ["| " + " | ".join(r) + " |" for r in rows]


def _best(row: dict) -> str | None:
    timed = [k.removesuffix("_s") for k in row if k.startswith("mc") and k.endswith("_s")]
    timed = [k for k in timed if not k.endswith(("compile", "tune")) and k[2:].isdigit()]
    return min(timed, key=lambda k: row[f"{k}_s"]) if timed else None


def headline(run: dict) -> list[str]:
    """The figures asked for first: matmul f16 against cuBLAS, attention against SDPA, and the
    model suite's geomean over eager and over Inductor."""
    lines = []
    cases = [r for r in run.get("kernels", []) if r.get("kind") == "case"]
    for family, dtype, library in (
        ("matmul", "float16", "cuBLAS"),
        ("attention", None, "SDPA"),
        ("conv", "float16", "cuDNN"),
    ):
        ratios = []
        for r in cases:
            if r.get("family") == family and (dtype is None or r.get("dtype") == dtype):
                best = _best(r)
                ratios.append(r.get(f"{best}_vs_library") if best else None)
        g = geomean(ratios)
        if g:
            what = f"{family} {dtype or ''}".strip()
            lines.append(f"- {what}: {g:.0%} of {library} (geomean of {len(ratios)} cases)")
    models = [r for r in run.get("models", []) if r.get("kind") == "model"]
    for backend in sorted({r["backend"] for r in models if r["backend"].startswith("minicomp")}):
        mine = [r for r in models if r["backend"] == backend]
        over_eager = geomean(r.get("speedup_vs_eager") for r in mine)
        over_inductor = geomean(r.get("speedup_vs_inductor") for r in mine)
        if over_eager or over_inductor:
            lines.append(
                f"- model suite ({backend}): {_num(over_eager, '.2f', 'x')} over eager, "
                f"{_num(over_inductor, '.2f', 'x')} over Inductor (geomean of {len(mine)})"
            )
    return lines


def check_section(rows: list[dict]) -> list[str]:
    out = []
    for r in rows:
        if r.get("kind") == "tests":
            counts = ", ".join(f"{n} {k}" for k, n in r.get("counts", {}).items())
            late = " (timed out)" if r.get("timed_out") else ""
            out.append(f"- tests on `{r.get('target')}`: {counts or 'none'}{late}")
            for file, why in r.get("files_skipped", {}).items():
                out.append(f"  - skipped `{file}`: {why}")
        elif r.get("kind") == "test-failure":
            first = (r.get("message") or "").strip().splitlines()[-1:] or [""]
            out.append(f"  - FAILED `{r['nodeid']}`: {first[0][:160]}")
        elif r.get("kind") == "sanitizer":
            verdict = "ok" if r.get("ok") else "PROBLEMS"
            errors = "" if r.get("errors") is None else f", {r['errors']} errors"
            out.append(f"- {r['tool']}: {verdict}{errors}")
            for name, problem in r.get("workload_problems", {}).items():
                out.append(f"  - {name}: {problem[:160]}")
    return out


def kernels_section(rows: list[dict]) -> list[str]:
    out = []
    peaks = next((r for r in rows if r.get("kind") == "peaks"), None)
    if peaks:
        shown = ", ".join(
            f"{k.removesuffix('_tflops')} {v:.0f} TFLOP/s"
            for k, v in peaks.items()
            if "tflops" in k
        )
        out.append(f"Measured peaks: {shown}, copy {_num(peaks.get('copy_gbs'), '.0f')} GB/s.")
        out.append("")
    head = ["case", "library", "mc0", "mc1", "Inductor", "best/library", "best/Inductor"]
    head += ["of peak", "SASS", "check"]
    body = []
    for r in rows:
        if r.get("kind") != "case":
            continue
        best = _best(r)
        wrong = [k.removesuffix("_wrong") for k in r if k.endswith("_wrong")]
        errors = [k.removesuffix("_error") for k in r if k.endswith("_error")]
        sass = "-"
        if best and f"{best}_sass_ok" in r:
            sass = "ok" if r[f"{best}_sass_ok"] else "lacks " + ",".join(r[f"{best}_sass_missing"])
        library = _num(r.get("library_tflops"), ".1f")
        if r.get("sdpa_backend"):
            library += f" ({r['sdpa_backend']})"
        body.append(
            [
                r["case"],
                library,
                _num(r.get("mc0_tflops"), ".1f"),
                _num(r.get("mc1_tflops"), ".1f"),
                _num(r.get("inductor_tflops"), ".1f"),
                _num(r.get(f"{best}_vs_library") if best else None, ".2f", "x"),
                _num(r.get(f"{best}_vs_inductor") if best else None, ".2f", "x"),
                _num(r.get(f"{best}_roofline") if best else None, ".0%"),
                sass,
                ("WRONG " + ",".join(wrong))
                if wrong
                else ("error " + ",".join(errors) if errors else "ok"),
            ]
        )
    if body:
        out.append("TFLOP/s; best = the faster of minicomp's search spaces 0 and 1.")
        out.append("")
        out += _table(head, body)
    return out


def models_section(rows: list[dict]) -> list[str]:
    models = [r for r in rows if r.get("kind") == "model"]
    configs: dict[tuple, dict] = defaultdict(dict)
    for r in models:
        configs[(r["model"], r["dtype"], r["batch"])][r["backend"]] = r
    backends = list(dict.fromkeys(r["backend"] for r in models))
    head = ["model", "batch"] + [f"{b} ms" for b in backends]
    head += ["minicomp vs eager", "vs Inductor", "compile s (minicomp / Inductor)", "check"]
    body = []
    for (model, _dtype, batch), cells in configs.items():
        mine = next((cells[b] for b in backends if b.startswith("minicomp") and b in cells), {})
        ind = cells.get("inductor", {})
        status = ", ".join(
            f"{b}: {c['status']}" for b, c in cells.items() if c.get("status") != "pass"
        )
        body.append(
            [model, str(batch)]
            + [_num(cells.get(b, {}).get("latency_ms"), ".2f") for b in backends]
            + [
                _num(mine.get("speedup_vs_eager"), ".2f", "x"),
                _num(mine.get("speedup_vs_inductor"), ".2f", "x"),
                _num(mine.get("compile_s_cold"), ".1f")
                + " / "
                + _num(ind.get("compile_s_cold"), ".1f"),
                status or "ok",
            ]
        )
    return _table(head, body) if body else []


def train_section(rows: list[dict]) -> list[str]:
    head = ["model", "batch", "backend", "step ms", "vs eager", "vs Inductor", "first step s"]
    head += ["grad error", "check"]
    body = []
    for r in rows:
        if r.get("kind") != "train" or "backend" not in r:
            continue
        check = "ok" if r.get("passed") else (r.get("error", "")[:60] or "MISMATCH")
        body.append(
            [
                r["model"],
                str(r.get("batch")),
                r["backend"],
                _num(r.get("step_ms"), ".2f"),
                _num(r.get("speedup_vs_eager"), ".2f", "x"),
                _num(r.get("speedup_vs_inductor"), ".2f", "x"),
                _num(r.get("first_step_s"), ".1f"),
                _num(r.get("grad_rel_err"), ".1e"),
                check,
            ]
        )
    return _table(head, body) if body else []


SECTIONS = {
    "check": ("Checks", check_section),
    "kernels": ("Kernels", kernels_section),
    "models": ("Models (float16)", models_section),
    "train": ("Training step (float32)", train_section),
}


def render(runs: dict[str, dict]) -> str:
    """The page's Markdown for `runs` (see load_runs), newest first."""
    out = ["# GPU results", "", HOW]
    if not runs:
        out += ["No GPU run has been recorded yet.", ""]
        return "\n".join(out)
    order = sorted(runs, key=lambda t: (runs[t]["facts"].get("date", ""), t), reverse=True)
    for tag in order:
        run = runs[tag]
        facts = run["facts"]
        versions = facts.get("versions", {})
        out += [f"## {facts.get('device')}, {facts.get('date')}, commit {facts.get('commit')}", ""]
        out.append(
            f"torch {versions.get('torch')} (CUDA {facts.get('cuda_build')}), NVRTC "
            f"{facts.get('nvrtc')}, driver CUDA {facts.get('driver_cuda', '-')}, "
            f"{facts.get('sms', '-')} SMs; files `*-{tag}.*`."
        )
        out.append("")
        out += headline(run) + [""]
        for stage in STAGES:
            if stage not in run:
                continue
            title, section = SECTIONS[stage]
            skipped = [r for r in run[stage] if r.get("kind") == "skipped"]
            out += [f"### {title}", ""] + section(run[stage])
            if skipped:
                names = ", ".join(r["what"] for r in skipped[:8])
                more = "..." if len(skipped) > 8 else ""
                out += ["", f"Not run (time or means): {len(skipped)} items ({names}{more})."]
            out.append("")
    return "\n".join(out)


def write_page(results_dir: str, include_rehearsals: bool = False) -> str:
    """Render the page from `results_dir`'s runs into its README.md; returns the path."""
    path = os.path.join(results_dir, PAGE)
    with open(path, "w", encoding="utf-8") as f:
        f.write(render(load_runs(results_dir, include_rehearsals)))
    return path
