"""Stage 1, check: is minicomp right on this GPU? The CUDA test suite on the `cuda` target and
compute-sanitizer (memcheck, racecheck, synccheck) over every kind of kernel.

The tests run as a subprocess with MINICOMP_TEST_TARGETS=cuda and MINICOMP_TEST_SELECT=targets
(only the tests that run on the target or need a GPU; the CPU ones ran in CI), each outcome
appended to `check-<tag>-tests.jsonl` as it happens (tests/conftest.py), so a timeout keeps
what ran. A test file that cannot be collected (an optional test dependency the machine lacks)
is reported as skipped with its reason and the run goes on. In a rehearsal the tests are a
small selection on `cuda-emu` and the sanitizer's stand-in runs the workloads without it.
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import subprocess
import sys
import tempfile
import time

from minicomp.backends.cuda.sass import find_tool
from minicomp.bench.rows import read_rows
from minicomp.bench.stages.stage import Stage

SANITIZER_TOOLS = ("memcheck", "racecheck", "synccheck")
# What the sanitizer part gets (three tools, each its own process); the tests get the rest.
SANITIZER_RESERVE_S = 120
# A rehearsal checks the stage's mechanics, not the ops (the suite itself runs them): two
# quick files, a plan's and an op family's.
REHEARSAL_TESTS = ("tests/runtime/test_plan.py", "tests/ops/test_creation.py")
_MISSING_MODULE = re.compile(r"No module named '([\w.]+)'")
_SANITIZER_SUMMARY = re.compile(r"ERROR SUMMARY: (\d+) error")
_SANITIZER_TEXT_CHARS = 200_000


def run(stage: Stage, tests: list[str] | None = None) -> None:
    """The check stage: the test suite, then the sanitizer."""
    paths = tests or (list(REHEARSAL_TESTS) if stage.rehearse else ["tests"])
    reserve = SANITIZER_RESERVE_S if not stage.rehearse else 30
    run_tests(stage, paths, max(30.0, stage.budget.left() - reserve))
    run_sanitizer(stage)


def _pytest_command(paths: list[str], workers: int) -> list[str]:
    cmd = [sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:cacheprovider"]
    cmd += ["--continue-on-collection-errors"]
    if workers > 1 and _importable("xdist"):
        cmd += ["-n", str(workers)]
    if _importable("pytest_timeout"):
        cmd += ["--timeout", "120"]  # one hung test must not take the stage's budget
    return cmd + paths


def _importable(module: str) -> bool:
    return importlib.util.find_spec(module) is not None


def run_tests(stage: Stage, paths: list[str], seconds: float) -> dict:
    """Run the tests in `paths` on the stage's target within `seconds`; their summary row."""
    report = stage.path("-tests.jsonl")
    workers = 1 if stage.rehearse else min(8, os.cpu_count() or 1)
    cmd = _pytest_command(paths, workers)
    # A pytest that runs this stage (the rehearsal's test) must not leak its own settings.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    env.update(
        MINICOMP_TEST_TARGETS=stage.target,
        MINICOMP_TEST_SELECT="targets",
        MINICOMP_TEST_REPORT=report,
    )
    print(f"tests: {' '.join(cmd[1:])} (target {stage.target}, {seconds:.0f} s)", flush=True)
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="minicomp-tests-cache-") as cache:
        env["MINICOMP_CACHE_DIR"] = cache  # the tests' kernels are no use to later stages
        timed_out, code, output = _run_bounded(cmd, env, seconds)
    summary = summarize_tests(read_rows(report) if os.path.exists(report) else [])
    summary.update(
        kind="tests",
        target=stage.target,
        paths=paths,
        exit_code=code,
        timed_out=timed_out,
        seconds=round(time.monotonic() - start, 1),
    )
    stage.rows.write(summary)
    for failure in summary.pop("failures"):
        stage.rows.write({"kind": "test-failure", **failure})
    print("\n".join(output.splitlines()[-30:]), flush=True)
    counts = ", ".join(f"{n} {k}" for k, n in summary["counts"].items())
    print(f"tests: {counts or 'none ran'}" + (" (TIMED OUT)" if timed_out else ""), flush=True)
    for file, why in summary["files_skipped"].items():
        print(f"  file skipped: {file}: {why}", flush=True)
    return summary


def _run_bounded(cmd: list[str], env: dict, seconds: float) -> tuple[bool, int | None, str]:
    """Run `cmd` for at most `seconds` (then its whole process group is killed); returns
    whether it timed out, its exit code and what it printed."""
    with tempfile.TemporaryFile(mode="w+") as out:
        proc = subprocess.Popen(
            cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            code, timed_out = proc.wait(timeout=seconds), False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            code, timed_out = proc.wait(), True
        out.seek(0)
        return timed_out, code, out.read()


def summarize_tests(rows: list[dict]) -> dict:
    """Counts by outcome, the files that were not collected (why), and each failure."""
    counts: dict[str, int] = {}
    files_skipped: dict[str, str] = {}
    failures = []
    for row in rows:
        outcome, when = row.get("outcome"), row.get("when")
        if when == "collect":
            message = row.get("message", "")
            missing = _MISSING_MODULE.search(message)
            if outcome == "skipped" or (missing and not missing[1].startswith("minicomp")):
                why = f"needs {missing[1]}, which is not installed" if missing else message
                files_skipped[row["nodeid"]] = why.strip().splitlines()[-1][:300]
                counts["files skipped"] = counts.get("files skipped", 0) + 1
                continue
            outcome = "collection errors"
        elif outcome == "failed" and when != "call":
            outcome = "errors"
        counts[outcome] = counts.get(outcome, 0) + 1
        if outcome in ("failed", "errors", "collection errors"):
            message = row.get("message", "").strip().splitlines()
            failures.append(
                {"nodeid": row["nodeid"], "when": when, "message": "\n".join(message[-12:])}
            )
    return {"counts": counts, "files_skipped": files_skipped, "failures": failures}


def _sanitizer_command(tool: str) -> list[str] | None:
    path = find_tool("compute-sanitizer")
    if path is None:
        return None
    return [path, "--tool", tool, "--error-exitcode", "86", "--print-limit", "20"]


def run_sanitizer(stage: Stage) -> None:
    """compute-sanitizer's memcheck, racecheck and synccheck over the workloads (sanitize.py),
    each tool one process; on a rehearsal the workloads run once per tool without it."""
    text_path = stage.path("-sanitizer.txt")
    for i, tool in enumerate(SANITIZER_TOOLS):
        share = (stage.budget.left() - 5) / (len(SANITIZER_TOOLS) - i)  # the rest, evenly
        if share < 15:
            stage.skip(f"sanitizer {tool}", "out of the stage's time budget")
            continue
        prefix = None if stage.rehearse else _sanitizer_command(tool)
        if prefix is None and not stage.rehearse:
            stage.skip(f"sanitizer {tool}", "compute-sanitizer was not found")
            continue
        with tempfile.TemporaryDirectory(prefix="minicomp-sanitize-") as scratch:
            rows_file = os.path.join(scratch, "rows.jsonl")
            cmd = [sys.executable, "-m", "minicomp.bench.stages.sanitize", "--target", stage.target]
            cmd += ["--rows", rows_file, "--cache-dir", stage.cache_dir, "--label", tool]
            env = dict(os.environ)
            # Every tensor its own allocation, so memcheck sees accesses past a tensor's end.
            env["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
            start = time.monotonic()
            timed_out, code, output = _run_bounded((prefix or []) + cmd, env, share)
            workloads = read_rows(rows_file) if os.path.exists(rows_file) else []
        match = _SANITIZER_SUMMARY.search(output)
        row = {
            "kind": "sanitizer",
            "tool": tool if prefix else f"{tool} (stand-in: no sanitizer on the CPU)",
            "errors": int(match[1]) if match else None,
            "exit_code": code,
            "timed_out": timed_out,
            "seconds": round(time.monotonic() - start, 1),
            "workloads": {w["workload"]: w["ok"] for w in workloads},
            "workload_problems": {
                w["workload"]: w.get("error") or "; ".join(w.get("problems", []))
                for w in workloads
                if not w["ok"]
            },
        }
        row["ok"] = (
            code == 0 and not timed_out and bool(workloads) and all(row["workloads"].values())
        )
        stage.rows.write(row)
        with open(text_path, "a", encoding="utf-8") as f:
            f.write(f"==== {row['tool']}: exit {code}, {row['seconds']} s ====\n")
            f.write(output[-_SANITIZER_TEXT_CHARS:] + "\n")
        verdict = "ok" if row["ok"] else "PROBLEMS"
        errors = "" if row["errors"] is None else f", {row['errors']} sanitizer errors"
        print(f"sanitizer {row['tool']}: {verdict}{errors} ({row['seconds']} s)", flush=True)
        for name, problem in row["workload_problems"].items():
            print(f"  {name}: {problem}", flush=True)
