"""`python -m minicomp.fuzz`: fuzz for a while, print progress, a summary and the findings'
minimal programs; optionally save them as regression tests."""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import signal
import sys
import tempfile
import time

import torch

from minicomp.fuzz.check import PASS
from minicomp.fuzz.printer import program_source
from minicomp.fuzz.program import Case, InputSpec, Program, Ref, Step
from minicomp.fuzz.regression import DEFAULT_FOLDER, known_signatures, save, short_hash
from minicomp.fuzz.session import Finding, Report, Session
from minicomp.fuzz.worker import Worker

TARGETS = ("cpu", "cuda-emu")
# `a + 1`: a setup that fails this (minicomp not importable, no compiler) would fail every case.
SMOKE = Program(
    (InputSpec("a", (3,), torch.float32, seed=1),), (Step("v0", "add", (Ref("a"), 1)),), ("v0",)
)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line's options."""
    parser = argparse.ArgumentParser(
        prog="python -m minicomp.fuzz",
        description="Differential fuzzing of minicomp against eager PyTorch.",
    )
    parser.add_argument("--seconds", type=float, default=60.0, help="start no program after this")
    parser.add_argument("--programs", type=int, default=None, help="stop after this many programs")
    parser.add_argument("--targets", default=",".join(TARGETS), help="comma list (cpu,cuda-emu)")
    parser.add_argument("--seed", type=int, default=None, help="first seed (default: from time)")
    parser.add_argument("--out", default=None, help="folder for findings.jsonl and programs")
    parser.add_argument(
        "--save-regressions", action="store_true", help="save findings as xfail pytest files"
    )
    parser.add_argument(
        "--regressions", default=DEFAULT_FOLDER, help="where regression tests live (and are saved)"
    )
    parser.add_argument(
        "--shrink-seconds", type=float, default=180.0, help="time to shrink one finding"
    )
    parser.add_argument(
        "--timeout", type=float, default=300.0, help="seconds one case may take: longer is a hang"
    )
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    args = parser.parse_args(argv)
    args.targets = tuple(t.strip() for t in args.targets.split(",") if t.strip())
    if args.seed is None:
        args.seed = int(time.time()) % 1_000_000 * 1000
    return args


def finding_text(finding: Finding) -> str:
    """A finding as the report prints it: what, where, and the minimal program."""
    case, outcome = finding.case, finding.outcome
    lines = [
        f"== {outcome.status}: {outcome.pattern}",
        f"   targets {', '.join(finding.targets)}; dynamic={case.dynamic}, "
        f"backward={case.backward}; found by seed {finding.found.seed} on {finding.found.target}"
        + (f"; seen {finding.repeats} more times" if finding.repeats else ""),
        *(
            ["   also with backend='aot_eager': a Dynamo or AOTAutograd bug"]
            if finding.in_pytorch
            else []
        ),
        *("   " + line for line in outcome.message.splitlines()[:12]),
        "",
        program_source(case.program),
    ]
    return "\n".join(lines)


def summary(report: Report) -> str:
    """The summary lines of a run."""
    statuses = ", ".join(f"{n} {s}" for s, n in report.statuses.most_common())
    by_status: dict[str, int] = {}
    for finding in report.findings:
        by_status[finding.outcome.status] = by_status.get(finding.outcome.status, 0) + 1
    kinds = ", ".join(f"{n} {s}" for s, n in sorted(by_status.items()))
    lines = [
        f"fuzz: {report.programs} programs, {report.cases} cases in {report.seconds:.0f} s "
        f"(seeds up to {report.last_seed})",
        f"  outcomes: {statuses or 'none'}",
        f"  new findings: {len(report.findings)}" + (f" ({kinds})" if kinds else ""),
    ]
    if report.known:
        known = ", ".join(f"{n}x {p}" for p, n in report.known.most_common())
        lines.append(f"  known findings seen again: {known}")
    return "\n".join(lines)


class _Progress:
    """A progress line every few seconds (in place on a terminal)."""

    def __init__(self, quiet: bool, every: float = 10.0):
        self.quiet, self.every, self.last = quiet, every, 0.0
        self.tty = sys.stderr.isatty()

    def __call__(self, kind: str, value: object) -> None:
        if self.quiet and kind != "internal":
            return
        if kind == "progress":
            if time.monotonic() - self.last < self.every:
                return
            self.last = time.monotonic()
            report = value
            passed = report.statuses.get(PASS, 0)
            line = (
                f"fuzz {report.seconds:.0f}s: {report.programs} programs, {report.cases} cases, "
                f"{passed} pass, {len(report.findings)} findings, "
                f"{sum(report.known.values())} known"
            )
            sys.stderr.write(("\r\x1b[2K" + line) if self.tty else line + "\n")
        elif kind == "internal":
            line = f"fuzzer bug, {value}"
            sys.stderr.write(("\r\x1b[2K" + line + "\n") if self.tty else line + "\n")
        elif kind == "shrinking":
            case, outcome = value
            line = f"shrinking seed {case.seed} on {case.target}: {outcome.status}, "
            line += outcome.pattern
            sys.stderr.write(("\r\x1b[2K" + line) if self.tty else line + "\n")
        sys.stderr.flush()


def _write_out(folder: str, report: Report) -> None:
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "findings.jsonl"), "a") as f:
        for finding in report.findings:
            row = {
                "hash": short_hash(finding.case, finding.outcome),
                "status": finding.outcome.status,
                "pattern": finding.outcome.pattern,
                "targets": list(finding.targets),
                "dynamic": finding.case.dynamic,
                "backward": finding.case.backward,
                "seed": finding.found.seed,
                "repeats": finding.repeats,
                "in_pytorch": finding.in_pytorch,
                "message": finding.outcome.message,
                "program": program_source(finding.case.program),
            }
            f.write(json.dumps(row) + "\n")
    with open(os.path.join(folder, "summary.txt"), "a") as f:
        f.write(summary(report) + "\n")


def _broken_setup(worker: Worker, targets: tuple[str, ...]) -> str | None:
    """Why minicomp fails the smoke program on some target, or None when it passes on all."""
    for name in targets:
        outcome = worker.run(Case(SMOKE, name))
        if outcome.status != PASS:
            return f"{name}: {outcome.status}: {outcome.message}"
    return None


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """Run the fuzzer; 1 when it found something new, 2 when minicomp fails `a + 1`, else 0."""
    args = parse_args(argv)
    # Stopped (Ctrl-C, or kill from a script), it ends its worker and reports what it ran.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _interrupt)
    cache_dir = tempfile.mkdtemp(prefix="minicomp-fuzz-cache-")
    progress = _Progress(args.quiet)
    seeds = itertools.count(args.seed)
    if args.programs is not None:
        seeds = itertools.islice(seeds, args.programs)
    print(f"fuzz: seeds from {args.seed}, targets {','.join(args.targets)}", file=sys.stderr)
    try:
        with Worker(cache_dir=cache_dir, timeout=args.timeout) as worker:
            broken = _broken_setup(worker, args.targets)
            if broken is not None:
                print(f"fuzz: minicomp fails `a + 1`, not fuzzing: {broken}", file=sys.stderr)
                return 2
            session = Session(
                worker,
                args.targets,
                known=known_signatures(args.regressions),
                shrink_seconds=args.shrink_seconds,
                on_event=progress,
            )
            try:
                report = session.run(seeds, seconds=args.seconds)
            except KeyboardInterrupt:
                report = session.report
    finally:
        shutil.rmtree(cache_dir, ignore_errors=True)
    if progress.tty and not args.quiet:
        sys.stderr.write("\n")
    print(summary(report))
    for finding in report.findings:
        print()
        print(finding_text(finding))
        if args.save_regressions:
            path = save(
                finding.case,
                finding.outcome,
                finding.targets,
                args.regressions,
                seed=finding.found.seed,
                in_pytorch=finding.in_pytorch,
            )
            print(f"   saved as {path}")
    if args.out:
        _write_out(args.out, report)
    return 1 if report.findings else 0
