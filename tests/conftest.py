"""Shared pytest setup: the `target` fixture, the import path, the `gpu` marker, the selection
and per-test report the staged GPU run uses, and the OpInfo sweep summary."""

import os
import shutil
import sys
import tempfile

import pytest
import torch

# Tests import `helpers` by name and must test this checkout's minicomp; with
# --import-mode=importlib pytest leaves sys.path alone, so say both paths explicitly.
_TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
for _path in (os.path.dirname(_TESTS_DIR), _TESTS_DIR):
    if _path not in sys.path:
        sys.path.insert(0, _path)


def pytest_configure(config):
    """Run the suite on its own cache, never the user's: MINICOMP_TEST_CACHE_DIR names one to
    keep between runs (warm, faster); by default a fresh temporary one, removed at the end.
    xdist's workers inherit the variables set here, so they share it."""
    if hasattr(config, "workerinput"):
        return
    # Script kernels run checked in the emulator: an access out of bounds fails its test with
    # the kernel, tensor, index and thread, instead of corrupting the test process.
    os.environ.setdefault("MINICOMP_EMU_CHECKS", "1")
    chosen = os.environ.get("MINICOMP_TEST_CACHE_DIR")
    config._minicomp_temp_cache = None if chosen else tempfile.mkdtemp(prefix="minicomp-tests-")
    os.environ["MINICOMP_CACHE_DIR"] = chosen or config._minicomp_temp_cache


def pytest_unconfigure(config):
    temp = getattr(config, "_minicomp_temp_cache", None)
    if temp:
        shutil.rmtree(temp, ignore_errors=True)


@pytest.fixture(autouse=True)
def _graph_cache_off_under_patches(request):
    """A test that patches minicomp (monkeypatch) compiles its graphs for real: a graph another
    test compiled unpatched would otherwise come from the graph cache. Tests of the cache
    turn it on with the graph_cache option, which wins over the environment."""
    if "monkeypatch" in request.fixturenames:
        request.getfixturevalue("monkeypatch").setenv("MINICOMP_GRAPH_CACHE", "0")
    yield


def selected_targets() -> list[str]:
    """The targets named by MINICOMP_TEST_TARGETS (comma list, default "cpu,cuda-emu";
    "cuda" runs where a GPU is present)."""
    names = os.environ.get("MINICOMP_TEST_TARGETS", "cpu,cuda-emu")
    return [name.strip() for name in names.split(",") if name.strip()]


def _target_param(name: str):
    if name == "cuda" and not torch.cuda.is_available():
        return pytest.param(name, marks=pytest.mark.skip(reason="no CUDA device"))
    return pytest.param(name)


@pytest.fixture(params=[_target_param(name) for name in selected_targets()])
def target(request):
    """The minicomp target a correctness test compiles for: cpu, cuda-emu or cuda.

    On cuda, tensors a test creates land on the GPU (the default device is cuda meanwhile).
    """
    if request.param != "cuda":
        yield request.param
        return
    previous = torch.get_default_device()
    torch.set_default_device("cuda")
    try:
        yield request.param
    finally:
        torch.set_default_device(previous)


def pytest_collection_modifyitems(config, items):
    """Skip `gpu` tests where no GPU is present. With MINICOMP_TEST_SELECT=targets (the staged
    GPU run's check) keep only the tests that run on a selected target or need a GPU."""
    skip = pytest.mark.skip(reason="no CUDA device")
    has_gpu = torch.cuda.is_available()
    selecting = os.environ.get("MINICOMP_TEST_SELECT") == "targets"
    targets = set(selected_targets())
    kept, dropped = [], []
    for item in items:
        gpu = item.get_closest_marker("gpu") is not None
        if gpu and not has_gpu:
            item.add_marker(skip)
        callspec = getattr(item, "callspec", None)
        on_target = callspec is not None and callspec.params.get("target") in targets
        (kept if gpu or on_target or not selecting else dropped).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept


# MINICOMP_TEST_REPORT names a JSON Lines file that gets one row per test outcome (and per file
# that failed or skipped collection) the moment it is known, so a run killed by a timeout
# still tells what it did. Only the controller writes: xdist forwards the workers' reports.
_REPORT = os.environ.get("MINICOMP_TEST_REPORT")
_MESSAGE_CHARS = 4000


def _write_report(report, when: str) -> None:
    if not _REPORT or os.environ.get("PYTEST_XDIST_WORKER"):
        return
    from minicomp.bench.rows import RowWriter

    text = "" if report.passed else (report.longreprtext or "")
    RowWriter(_REPORT).write(
        {
            "nodeid": report.nodeid,
            "when": when,
            "outcome": report.outcome,
            "seconds": round(getattr(report, "duration", 0.0), 3),
            "message": text[-_MESSAGE_CHARS:],
        }
    )


def pytest_collectreport(report):
    if not report.passed:
        _write_report(report, "collect")


# The OpInfo sweep records each op's outcome as user properties, which also reach the
# controller under pytest-xdist; tally them per target for one summary line.
_opinfo_outcomes: dict[str, dict[str, str]] = {}
_opinfo_fallbacks: dict[str, dict[str, str]] = {}


def pytest_runtest_logreport(report):
    if report.when == "call" or not report.passed:
        _write_report(report, report.when)
    properties = dict(report.user_properties)
    if report.when != "call" or "opinfo_op" not in properties:
        return
    if report.failed:
        status = "failed"
    elif report.skipped:
        status = "skipped"
    else:
        status = properties.get("opinfo_status", "compiled")
    op, target = properties["opinfo_op"], properties["opinfo_target"]
    _opinfo_outcomes.setdefault(target, {})[op] = status
    if properties.get("opinfo_fallbacks"):
        _opinfo_fallbacks.setdefault(target, {})[op] = properties["opinfo_fallbacks"]


_STATUS_WORDING = {
    "native": "native",
    "fallback": "fell back to ATen",
    "skipped": "skipped",
    "not captured by dynamo": "not captured by dynamo",
    "compiled": "compiled (minicomp.explain unavailable)",
    "failed": "FAILED",
}


def pytest_terminal_summary(terminalreporter):
    for target, outcomes in sorted(_opinfo_outcomes.items()):
        counts: dict[str, int] = {}
        for status in outcomes.values():
            counts[status] = counts.get(status, 0) + 1
        order = list(_STATUS_WORDING)
        ranked = sorted(counts.items(), key=lambda kv: order.index(kv[0]) if kv[0] in order else 99)
        parts = [f"{n} ops {_STATUS_WORDING.get(s, s)}" for s, n in ranked]
        terminalreporter.write_line(f"opinfo sweep [{target}]: " + ", ".join(parts))
        fallbacks = _opinfo_fallbacks.get(target, {})
        if fallbacks and terminalreporter.config.getoption("verbose") > 0:
            for op, aten_ops in sorted(fallbacks.items()):
                terminalreporter.write_line(f"  {op}: extern {aten_ops}")
        not_captured = sorted(op for op, s in outcomes.items() if s == "not captured by dynamo")
        if not_captured:
            terminalreporter.write_line(f"  not captured by dynamo: {', '.join(not_captured)}")
