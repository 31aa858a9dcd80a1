"""What a compiled graph tells the user: the verbose line and its counts, TORCH_LOGS artifacts,
TORCH_TRACE events, the debug directory, and fallback warnings at the user's line."""

import json
import logging
import os
import re
import sys

import pytest
import torch
import torch._dynamo
from helpers_python import run_python

from minicomp import compiler, config
from minicomp.dynamo import diagnostics
from minicomp.dynamo.backend import FallbackWarning, KernelFallbackWarning, recording


def matmul_then_pointwise(x, w):
    # On cpu the product stays an ATen call by design; the rest is one kernel.
    return (x @ w).sin().relu() + 1


INPUTS = (torch.randn(8, 4), torch.randn(4, 3))


class Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []

    def emit(self, record):
        self.records.append(record)


@pytest.fixture
def minicomp_log():
    handler = Lines()
    logging.getLogger("minicomp").addHandler(handler)
    yield handler.records
    logging.getLogger("minicomp").removeHandler(handler)


def _run(fn=matmul_then_pointwise, args=INPUTS, **options):
    torch._dynamo.reset()
    out = torch.compile(fn, backend="minicomp", options={"target": "cpu", **options})(*args)
    torch._dynamo.reset()
    return out


def test_verbose_1_logs_one_info_line_with_the_aten_calls_counted(minicomp_log, tmp_path):
    # A cache of its own: another test may have kept this graph in the session's cache.
    with config.patch(graph_cache=True, cache_dir=str(tmp_path)):
        _run(verbose=1)
        _run(verbose=1)  # the second time from the graph cache: the same counts
    lines = [r for r in minicomp_log if "inference graph" in r.getMessage()]
    assert [r.levelno for r in lines] == [logging.INFO, logging.INFO]
    first, second = (r.getMessage().splitlines() for r in lines)
    assert re.search(r"inference graph \S+: 4 ATen ops -> 1 kernels, 1 ATen calls$", first[0])
    assert first[1:] == ["  extern mm.default: ATen by design on cpu: BLAS GEMM"]
    assert second[0].endswith("1 ATen calls (from the graph cache)")
    assert second[1:] == first[1:]


def test_not_logged_by_default(minicomp_log):
    _run()
    assert not [r for r in minicomp_log if r.levelno < logging.WARNING]


def test_verbose_2_logs_every_artifact(minicomp_log):
    _run(verbose=2)
    names = {r.name.rsplit(".__", 1)[-1] for r in minicomp_log if ".__" in r.name}
    # Nothing is tuned on the cpu target: no minicomp_tuning.
    assert names == {
        "minicomp_" + a for a in ("passes", "fusion", "fallbacks", "kernels", "source")
    }


def test_an_artifact_named_in_set_logs_is_logged_alone(minicomp_log):
    torch._logging.set_logs(modules={"minicomp_fallbacks": True})
    try:
        _run()
    finally:
        torch._logging.set_logs()
    (record,) = [r for r in minicomp_log if ".__" in r.name]
    assert record.name.endswith("__minicomp_fallbacks")
    assert "mm.default: ATen by design on cpu: BLAS GEMM" in record.getMessage()


def test_torch_logs_and_torch_trace_in_a_fresh_interpreter(tmp_path):
    code = (
        "import torch\n"
        "f = torch.compile(lambda x, w: (x @ w).sin().relu() + 1, backend='minicomp')\n"
        "w = torch.randn(4, 3, requires_grad=True)\n"
        "f(torch.randn(8, 4), w).sum().backward()\n"
    )
    trace = tmp_path / "trace"
    artifacts = "minicomp_fusion,minicomp_fallbacks,minicomp_passes,minicomp_kernels"
    proc = run_python(code, tmp_path, TORCH_LOGS="+minicomp," + artifacts, TORCH_TRACE=str(trace))
    assert proc.returncode == 0, proc.stderr[-3000:]
    for name in artifacts.split(","):
        assert f"[__{name}]" in proc.stderr
    assert "[__minicomp_source]" not in proc.stderr
    assert re.search(r"forward graph 0/0: \d+ ATen ops -> 1 kernels, \d+ ATen calls", proc.stderr)
    assert "backward graph 0/0" in proc.stderr
    assert "graph IR after fuse" in proc.stderr

    events = _trace_events(trace)
    names = [e["artifact"]["name"] for e, _ in events]
    for name in ("graph_ir", "fused_groups", "aten_calls", "kernel_source", "compile_summary"):
        assert names.count("minicomp_" + name) == 2, name  # the forward and backward graphs
    summaries = [json.loads(p) for e, p in events if e["artifact"]["name"].endswith("summary")]
    assert [s["kind"] for s in summaries] == ["forward", "backward"]
    assert summaries[0]["aten_calls"]["mm.default"] == "ATen by design on cpu: BLAS GEMM"
    assert {"passes", "schedule", "build"} <= set(summaries[0]["times_ms"])
    # Attached to the frame Dynamo compiled, as tlparse groups them.
    assert all((e["frame_id"], e["frame_compile_id"]) == (0, 0) for e, _ in events)
    sources = [p for e, p in events if e["artifact"]["name"] == "minicomp_kernel_source"]
    assert "_sin_relu_add(" in sources[0]


def _trace_events(folder) -> list[tuple[dict, str]]:
    """minicomp's artifact events in a TORCH_TRACE folder: (metadata, payload) pairs. Each
    event is a glog-prefixed JSON line; its payload follows, each line tab-indented."""
    events = []
    for name in os.listdir(folder):
        lines = (folder / name).read_text().splitlines()
        for k, line in enumerate(lines):
            if line.startswith("\t") or '"artifact"' not in line:
                continue
            event = json.loads(line.split("] ", 1)[1])
            if not event["artifact"]["name"].startswith("minicomp_"):
                continue
            payload = []
            for more in lines[k + 1 :]:
                if not more.startswith("\t"):
                    break
                payload.append(more[1:])
            events.append((event, "\n".join(payload)))
    return events


def test_the_debug_dir_holds_every_stage(tmp_path, target):
    with config.patch(graph_cache=True):
        _run(target=target)  # kept in the graph cache; the debug dir compiles it again
        records = []
        with recording(records):
            _run(target=target, debug_dir=str(tmp_path))
    assert records[0].cache.startswith("stored"), "not linked from the graph cache"
    (run,) = os.listdir(tmp_path)
    assert re.fullmatch(rf"run-\d{{8}}-\d{{6}}-pid{os.getpid()}", run)
    (folder,) = os.listdir(tmp_path / run)
    assert re.fullmatch(r"\d{3}-inference-0_0", folder)
    path = tmp_path / run / folder
    files = {str(p.relative_to(path)) for p in path.rglob("*") if p.is_file()}
    suffix = "c" if target == "cpu" else "cu"
    fixed = {"aten_graph.py", "report.txt", "summary.json", "graph_ir.txt", f"source.{suffix}"}
    assert fixed | {"fused_groups.txt", "aten_calls.txt"} <= files
    passes = sorted(f for f in files if f.startswith("passes/"))
    assert passes[0].startswith("passes/00-") and any(f.endswith("-fuse.txt") for f in passes)
    kernels = [f for f in files if f.startswith("kernels/")]
    assert kernels and all(re.fullmatch(r"kernels/k\d+_\w+\.txt", f) for f in kernels)
    assert "mm.default" in (path / "aten_graph.py").read_text()
    summary = json.loads((path / "summary.json").read_text())
    assert summary["kind"] == "inference" and summary["compile_id"] == "0/0"
    assert summary["target"] == target and summary["aten_ops"] == 4
    assert "sin_relu" in (path / f"source.{suffix}").read_text()


def test_the_debug_dir_of_a_graph_that_runs_eagerly(tmp_path, monkeypatch):
    def fails(*args, **kwargs):
        raise RuntimeError("simulated failure")

    monkeypatch.setattr(compiler, "lower", fails)
    with pytest.warns(FallbackWarning):
        _run(debug_dir=str(tmp_path))
    (folder,) = [p for p in tmp_path.rglob("*-inference-*")]
    assert "simulated failure" in (folder / "error.txt").read_text()
    assert json.loads((folder / "summary.json").read_text())["error"]


def test_fallback_warnings_name_the_users_line(monkeypatch):
    def fails(*args, **kwargs):
        raise RuntimeError("simulated failure")

    monkeypatch.setattr(compiler, "lower", fails)
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: x + 1, backend="minicomp")
    with pytest.warns(FallbackWarning) as caught:
        compiled(torch.randn(3))
        line = sys._getframe().f_lineno - 1
    torch._dynamo.reset()
    assert (caught[0].filename, caught[0].lineno) == (__file__, line)


def test_kernel_fallback_warnings_name_the_users_line(monkeypatch, tmp_path):
    schedule = compiler.schedule_group

    def failing_schedule(op, *args, **kwargs):
        if any("sin" in member for member in op.members):
            raise RuntimeError("simulated scheduler failure")
        return schedule(op, *args, **kwargs)

    monkeypatch.setattr(compiler, "schedule_group", failing_schedule)
    for _ in range(2):  # compiled, then from the graph cache (the warning repeats)
        torch._dynamo.reset()
        compiled = torch.compile(
            lambda x: x.sin() * 2,
            backend="minicomp",
            options={"graph_cache": True, "cache_dir": str(tmp_path)},  # patched: its own
        )
        with pytest.warns(KernelFallbackWarning) as caught:
            compiled(torch.randn(8))
            line = sys._getframe().f_lineno - 1
        assert (caught[0].filename, caught[0].lineno) == (__file__, line)
    torch._dynamo.reset()


def test_wants_passes():
    assert not diagnostics.wants_passes(config.resolve())
    assert diagnostics.wants_passes(config.resolve({"verbose": 2}))
    assert diagnostics.wants_passes(config.resolve({"debug_dir": "/tmp/x"}))
    torch._logging.set_logs(modules={"minicomp_passes": True})
    try:
        assert diagnostics.wants_passes(config.resolve())
    finally:
        torch._logging.set_logs()


def test_nested_recordings_each_get_their_own_records():
    outer: list = []
    with recording(outer):
        inner: list = []
        with recording(inner):  # equal to outer (both empty) when it starts
            _run()
        _run(fn=lambda x, w: (x @ w).cos())
    assert len(inner) == 1 and len(outer) == 2
    assert outer[0] is inner[0]
