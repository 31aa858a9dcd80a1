"""`minicomp bench`: every selected model, dtype, batch and backend in one run."""

from __future__ import annotations

import argparse
import datetime
import gc
import importlib.metadata
import os
import platform
import subprocess
import sys
import time
from dataclasses import asdict

import torch

from minicomp.bench import measure, report, suite
from minicomp.bench.options import (
    BACKEND_NAMES,
    CPU_DEFAULTS,
    CUDA_DEFAULTS,
    DTYPE_NAMES,
    Settings,
    add_arguments,
    batches,
    names,
)
from minicomp.bench.rows import RowWriter, clean

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def dtype_unsupported(dtype: str, device: str) -> str | None:
    """Why `device` cannot run `dtype`, or None."""
    if device == "cuda" and dtype == "bfloat16" and not torch.cuda.is_bf16_supported():
        return "this GPU has no bfloat16"
    return None


class Progress:
    """A one-line progress bar on stderr: cells done of all, the cell now running, time spent.
    Redrawn in place on a terminal; elsewhere one line per cell."""

    WIDTH = 24

    def __init__(self, total: int, enabled: bool, stream=None):
        self.total, self.done, self.enabled = total, 0, enabled
        self.stream = stream or sys.stderr
        self.start = time.perf_counter()
        self.tty = enabled and getattr(self.stream, "isatty", lambda: False)()

    def show(self, what: str) -> None:
        """Show the cell now starting."""
        if not self.enabled:
            return
        filled = round(self.WIDTH * self.done / max(self.total, 1))
        bar = "#" * filled + "." * (self.WIDTH - filled)
        elapsed = time.perf_counter() - self.start
        line = f"bench [{bar}] {self.done}/{self.total} {elapsed:.0f}s  {what}"
        self.stream.write(("\r\x1b[2K" + line[:160]) if self.tty else line + "\n")
        self.stream.flush()

    def step(self) -> None:
        """One more cell done."""
        self.done += 1

    def close(self) -> None:
        """End the bar with a final count."""
        if self.enabled:
            self.show("done")
            if self.tty:
                self.stream.write("\n")
                self.stream.flush()


def _meta(settings: Settings) -> dict:
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            capture_output=True,
            text=True,
            check=False,
            cwd=os.path.dirname(os.path.abspath(__file__)),
        ).stdout.strip()
    except OSError:
        commit = ""

    def version(name: str) -> str | None:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None

    if settings.device == "cuda":
        device_name = torch.cuda.get_device_name()
    else:
        device_name = platform.processor() or platform.machine()
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit or None,
        "device": settings.device,
        "device_name": device_name,
        "threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "versions": {n: version(n) for n in ("torch", "transformers", "minicomp", "hidet")},
        "settings": asdict(settings),
        "tolerances": {name: measure.tolerance(d) for name, d in DTYPES.items()},
        "tolerance_rule": "max|out - eager| / max|eager| <= tolerance (same dtype)",
        "memory_method": "cuda-max-allocated" if settings.device == "cuda" else "rss-sampled",
        "latency": "median ms of `repeats` calls after `warmup` calls; "
        + ("CUDA events around each call" if settings.device == "cuda" else "perf_counter"),
    }


def _speedups(rows: list[dict]) -> None:
    times = {r["backend"]: r["latency_ms"] for r in rows if r["passed"]}
    for r in rows:
        if r["latency_ms"] is None or not r["passed"]:
            continue
        for base, key in (("eager", "speedup_vs_eager"), ("inductor", "speedup_vs_inductor")):
            if times.get(base):
                r[key] = times[base] / r["latency_ms"]


def _reference_first(backends: list[str]) -> list[str]:
    """The backends with eager and inductor first: the others' speedups are then known the
    moment each is measured."""
    first = [b for b in ("eager", "inductor") if b in backends]
    return first + [b for b in backends if b not in first]


def measure_config(
    spec, settings: Settings, dtype: str, batch: int, progress: Progress, on_row=None
) -> list:
    """Every selected backend on one model configuration; eager runs first as the reference.
    `on_row(row)` receives each row as soon as it is measured (its speedups filled in)."""
    fields = {
        "model": spec.name,
        "family": spec.family,
        "size": settings.size,
        "dtype": dtype,
        "batch": batch,
        "device": settings.device,
    }
    emit = on_row or (lambda row: None)
    label = f"{spec.name} {dtype} b{batch}"
    progress.show(f"{label}: building")
    try:
        built = spec.build(settings.size, DTYPES[dtype], batch, settings.device)
        with torch.no_grad():
            expected = built.model(*built.inputs)
    except Exception as err:  # every cell of the configuration says why
        rows = []
        for backend in settings.backends:
            row = {**fields, "seq": None, "image": None, **measure.empty_row(backend)}
            row["error"] = f"building the model: {type(err).__name__}: {err}"[:600]
            rows.append(row)
            emit(row)
            progress.step()
        return rows
    rows = []
    shape = {"seq": built.shape.get("seq"), "image": built.shape.get("image")}
    for name in _reference_first(settings.backends):
        backend = measure.BACKENDS[name]
        progress.show(f"{label}: {name}")
        if backend.missing():
            row = measure.empty_row(name)
            row["status"], row["error"] = "error", backend.missing()
        else:
            row = measure.measure(
                backend,
                built.model,
                built.inputs,
                expected,
                device=settings.device,
                repeats=settings.repeats,
                warmup=settings.warmup,
                options=settings.options,
                warm=settings.warm,
            )
        rows.append({**fields, **shape, **row})
        _speedups(rows)
        emit(rows[-1])
        progress.step()
    del built, expected
    gc.collect()
    if settings.device == "cuda":
        torch.cuda.empty_cache()
    return rows


def run(settings: Settings, out=None) -> dict:
    """Measure everything `settings` selects, print the table, write the JSON and the chart;
    returns the JSON document."""
    out = out or sys.stdout
    started = time.perf_counter()
    specs, skipped = [], []
    for name in settings.models:
        spec = suite.get(name)
        if spec.missing():
            skipped.append({"model": name, "reason": spec.missing()})
            print(f"skipping {name}: {spec.missing()}", file=out)
        else:
            specs.append(spec)
    configs = []
    for dtype in settings.dtypes:
        reason = dtype_unsupported(dtype, settings.device)
        if reason:
            skipped.append({"dtype": dtype, "reason": reason})
            print(f"skipping {dtype}: {reason}", file=out)
            continue
        configs += [(dtype, batch) for batch in settings.batch]
    cells = len(specs) * len(configs) * len(settings.backends)
    progress = Progress(cells, settings.progress)
    on_row = None
    if settings.jsonl:
        writer = RowWriter(settings.jsonl)
        on_row = writer.write
    rows = []
    for spec in specs:
        for dtype, batch in configs:
            rows += measure_config(spec, settings, dtype, batch, progress, on_row)
    progress.close()
    meta = _meta(settings)
    meta["duration_s"] = round(time.perf_counter() - started, 1)
    document = {"schema": report.SCHEMA, "meta": meta, "skipped": skipped, "results": _clean(rows)}
    print(report.table(rows) if rows else "nothing was measured", file=out)
    if settings.json:
        report.write_json(settings.json, document)
        print(f"results: {settings.json}", file=out)
    if settings.chart and rows:
        device = f"{settings.device} ({meta['device_name']})"
        title = f"minicomp bench, {device}, {settings.size} size: speedup over eager"
        drawer = report.write_chart(settings.chart, rows, settings.backends, title)
        print(f"chart: {settings.chart} ({drawer})", file=out)
    return document


def _clean(rows: list[dict]) -> list[dict]:
    """Rows with non-finite numbers as None, so the file is strict JSON."""

    return [clean(r) for r in rows]


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Settings from parsed arguments, with the device's defaults where none were given;
    raises ValueError on an unknown name or a bad number."""
    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise ValueError("--device cuda: no CUDA device is available")
    defaults = CUDA_DEFAULTS if device == "cuda" else CPU_DEFAULTS
    if args.backends:
        backends = names(args.backends, BACKEND_NAMES, "backend")
    else:  # the defaults leave out what is not installed; named ones say why they fail
        backends = [b for b in defaults["backends"] if measure.BACKENDS[b].missing() is None]
    settings = Settings(
        models=names(args.models, suite.SUITE, "model") if args.models else suite.model_names(),
        dtypes=names(args.dtypes, DTYPE_NAMES, "dtype") if args.dtypes else defaults["dtypes"],
        batch=batches(args.batch) if args.batch else defaults["batch"],
        backends=backends,
        device=device,
        size=args.size,
        repeats=defaults["repeats"] if args.repeats is None else args.repeats,
        warmup=defaults["warmup"] if args.warmup is None else args.warmup,
        json=args.json if args.json is not None else f"minicomp-bench-{device}.json",
        chart=args.chart if args.chart is not None else f"minicomp-bench-{device}.png",
        progress=not args.no_progress,
        jsonl=args.jsonl or None,
        warm=not args.no_warm,
    )
    if settings.repeats < 1 or settings.warmup < 0:
        raise ValueError("--repeats must be at least 1 and --warmup at least 0")
    return settings


def main(argv: list[str] | None = None) -> int:
    """Parse bench arguments and run (benchmarks/models.py); returns the exit status: 0 once
    the run is complete, failed cells included (they are results), 2 for bad arguments."""
    parser = argparse.ArgumentParser(prog="benchmarks/models.py", description=__doc__)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        settings = settings_from_args(args)
    except ValueError as err:
        parser.error(str(err))
    run(settings)
    return 0
