"""`minicomp bench`: every selected model, dtype, batch and backend in one run.

Per model configuration, each backend is compiled, checked and warmed up in turn, then all
are timed together in rounds (measure.time_rounds): each round calls every backend once, in
an order that rotates, so a load spike falls on all of them alike and the speed-up of a round
compares calls made moments apart.
"""

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
import torch._dynamo
from tqdm import tqdm

from minicomp.bench import chart, machine, measure, report, suite
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
    """A tqdm bar on stderr: steps done of all (a backend prepared, a configuration's timing
    rounds) and the step now running. Shown only when enabled and stderr is a terminal: a
    log file or a pipe gets the table, not redraws."""

    def __init__(self, total: int = 0, enabled: bool = False, stream=None):
        stream = stream or sys.stderr
        shown = enabled and getattr(stream, "isatty", lambda: False)()
        self.bar = tqdm(
            total=total, desc="bench", unit="step", file=stream, disable=not shown,
            dynamic_ncols=True, leave=False,
        )  # fmt: skip

    def show(self, what: str) -> None:
        """Show the step now starting."""
        self.bar.set_postfix_str(what[:70], refresh=True)

    def step(self) -> None:
        """One more step done."""
        self.bar.update(1)

    def close(self) -> None:
        """Take the bar down (the table follows)."""
        self.bar.close()


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
    packages = ("torch", "transformers", "torchvision", "minicomp", "hidet")
    return {
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "commit": commit or None,
        "device": settings.device,
        "device_name": device_name,
        "threads": torch.get_num_threads(),
        "cores": machine.usable_cores(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "versions": {n: version(n) for n in packages},
        "settings": asdict(settings),
        "tolerances": {name: measure.tolerance(d) for name, d in DTYPES.items()},
        "tolerance_rule": "max|out - eager| / max|eager| <= tolerance (same dtype)",
        "memory_method": "cuda-max-allocated" if settings.device == "cuda" else "cpu-tensors",
        "latency": "median ms over `repeats` rounds after `warmup` calls, each round calling "
        "every backend once in rotating order; "
        + ("CUDA events around each call" if settings.device == "cuda" else "perf_counter"),
        "speedup": "median of the per-round ratios (reference ms / backend ms in one round), "
        "with their quartiles and extremes; noisy when (q3 - q1) / median > max_spread",
    }


def _reference_first(backends: list[str]) -> list[str]:
    """The backends with eager and inductor first: the references are ready before the
    others, and their rows lead each configuration."""
    first = [b for b in ("eager", "inductor") if b in backends]
    return first + [b for b in backends if b not in first]


def measure_config(
    spec, settings: Settings, dtype: str, batch: int, progress: Progress | None = None,
    on_row=None,
) -> list:  # fmt: skip
    """Every selected backend on one model configuration: each prepared in turn (compiled,
    checked against eager, warmed up, weighed), then all timed in interleaved rounds.
    `on_row(row)` receives each row once the configuration is measured."""
    progress = progress or Progress()
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
    backends = _reference_first(settings.backends)
    progress.show(f"{label}: building")
    try:
        built = spec.build(settings.size, DTYPES[dtype], batch, settings.device)
        with torch.no_grad():
            expected = built.model(*built.inputs)
    except Exception as err:  # every cell of the configuration says why
        rows = []
        for backend in backends:
            row = {**fields, "seq": None, "image": None, **measure.empty_row(backend)}
            row["error"] = f"building the model: {type(err).__name__}: {err}"[:600]
            rows.append(row)
            emit(row)
        progress.bar.update(progress_steps(settings))
        return rows
    shape = {"seq": built.shape.get("seq"), "image": built.shape.get("image")}
    torch._dynamo.reset()
    try:
        rows = _prepare_and_time(built, expected, backends, settings, progress, label)
    finally:  # the compiled callables go with Dynamo's caches
        del built, expected
        torch._dynamo.reset()
        gc.collect()
        if settings.device == "cuda":
            torch.cuda.empty_cache()
    rows = [{**fields, **shape, **row} for row in rows]
    for row in rows:
        emit(row)
    return rows


def _prepare_and_time(built, expected, backends, settings, progress, label) -> list[dict]:
    """The rows of every backend on one built model: each prepared in turn (measure.prepared),
    then all timed in interleaved rounds."""

    started: list[str] = []

    def starting(what: str) -> None:  # the step before this one is done
        if started:
            progress.step()
        started.append(what)
        progress.show(f"{label}: {what}")

    runnable = [measure.BACKENDS[n] for n in backends if not measure.BACKENDS[n].missing()]
    model = measure.Model(built.model, built.inputs, expected)
    # Every backend's warm compile stays in Dynamo's cache until all are timed: one entry per
    # backend on the model's code, which Dynamo's default limit (8) would cap, running any
    # further backend eagerly without a word.
    limit = max(torch._dynamo.config.recompile_limit, len(backends) + 1)
    with (
        torch._dynamo.config.patch(recompile_limit=limit),
        measure.prepared(
            runnable, model, device=settings.device, warmup=settings.warmup,
            options=settings.options, warm=settings.warm, on_backend=starting,
        ) as cells,
    ):  # fmt: skip
        if started:
            progress.step()
        fns = {name: cell.fn for name, cell in cells.items() if cell.fn is not None}
        progress.show(f"{label}: {settings.repeats} rounds of {', '.join(fns)}")
        with torch.no_grad():
            samples, errors = measure.time_rounds(
                fns, built.inputs, settings.repeats, settings.device
            )
        progress.step()
        del fns
    rows = []
    for name in backends:
        if name in cells:
            rows.append(cells[name].row)
        else:
            row = measure.empty_row(name)
            row["status"], row["error"] = "error", measure.BACKENDS[name].missing()
            rows.append(row)
    measure.record_timings(rows, samples, errors, settings.max_spread)
    return rows


def progress_steps(settings: Settings) -> int:
    """Progress steps per model configuration: each backend's cold compile (when a warm one
    follows), each backend's turn, the timing rounds."""
    cold = sum(measure.BACKENDS[b].cache != "none" for b in settings.backends)
    return len(settings.backends) + (cold if settings.warm else 0) + 1


def run(settings: Settings, out=None) -> dict:
    """Measure everything `settings` selects, print the table, write the JSON and the chart;
    returns the JSON document."""
    out = out or sys.stdout
    started = time.perf_counter()
    cores = machine.usable_cores()
    load_start = machine.load_average()
    if settings.threads:
        machine.set_threads(settings.threads)
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
    steps = len(specs) * len(configs) * progress_steps(settings)
    progress = Progress(steps, settings.progress)
    on_row = None
    if settings.jsonl:
        writer = RowWriter(settings.jsonl)
        on_row = writer.write
    rows = []
    for spec in specs:
        for dtype, batch in configs:
            rows += measure_config(spec, settings, dtype, batch, progress, on_row)
    progress.close()
    load_end = machine.load_average()
    meta = _meta(settings)
    meta["duration_s"] = round(time.perf_counter() - started, 1)
    meta["load_average"] = {"start": load_start, "end": load_end}
    meta["warnings"] = [
        w
        for w in (
            machine.load_warning(load_start, cores, "before the run"),
            machine.load_warning(load_end, cores, "at its end (its own threads included)"),
        )
        if w
    ]
    document = {"schema": report.SCHEMA, "meta": meta, "skipped": skipped, "results": _clean(rows)}
    if rows:
        print("\n".join(report.preamble(meta)), file=out)
        print("", file=out)
        print(report.table(rows, settings.max_spread), file=out)
    else:
        print("nothing was measured", file=out)
    if settings.json:
        report.write_json(settings.json, document)
        print(f"results: {settings.json}", file=out)
    if settings.chart and rows:
        _write_chart(settings, meta, rows, out)
    return document


def _write_chart(settings: Settings, meta: dict, rows: list[dict], out) -> None:
    reason = chart.missing()
    if reason:
        print(reason, file=out)
        return
    threads = f", {report.plural(meta['threads'], 'thread')}" if settings.device == "cpu" else ""
    title = (
        f"minicomp bench: {settings.device} ({meta['device_name']}{threads}), "
        f"{settings.size} models, {settings.repeats} rounds"
    )
    chart.write(settings.chart, rows, settings.backends, title)
    print(f"chart: {settings.chart}", file=out)


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
        threads=args.threads or (machine.usable_cores() if device == "cpu" else None),
        max_spread=args.max_spread,
    )
    if settings.repeats < 1 or settings.warmup < 0:
        raise ValueError("--repeats must be at least 1 and --warmup at least 0")
    if args.threads is not None and args.threads < 1:
        raise ValueError("--threads must be at least 1")
    if settings.max_spread <= 0:
        raise ValueError("--max-spread must be positive")
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
