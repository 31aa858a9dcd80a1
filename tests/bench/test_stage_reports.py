"""What the staged GPU run makes of its rows: the tests' summary, the kernels' order and
timing, and the results page."""

import pytest

from minicomp.bench.kernels import attention, conv, matmul
from minicomp.bench.kernels.timing import Timing, interleaved
from minicomp.bench.stages import report
from minicomp.bench.stages.check import summarize_tests
from minicomp.bench.stages.kernels import ordered


def test_a_missing_optional_test_dependency_skips_its_file_with_the_reason():
    rows = [
        {"nodeid": "tests/ops/test_opinfo_sweep.py", "when": "collect", "outcome": "failed",
         "message": "E   ModuleNotFoundError: No module named 'expecttest'"},
        {"nodeid": "tests/a.py::test_x", "when": "call", "outcome": "passed"},
        {"nodeid": "tests/a.py::test_y", "when": "call", "outcome": "failed",
         "message": "def test_y():\n>   assert 1 == 2\nE   assert 1 == 2"},
        {"nodeid": "tests/a.py::test_z", "when": "setup", "outcome": "failed", "message": "boom"},
        {"nodeid": "tests/b.py", "when": "collect", "outcome": "failed",
         "message": "E   ModuleNotFoundError: No module named 'minicomp.gone'"},
    ]  # fmt: skip
    summary = summarize_tests(rows)
    assert summary["files_skipped"] == {
        "tests/ops/test_opinfo_sweep.py": "needs expecttest, which is not installed"
    }
    assert summary["counts"] == {
        "files skipped": 1, "passed": 1, "failed": 1, "errors": 1, "collection errors": 1
    }  # fmt: skip
    failed = {f["nodeid"]: f["message"] for f in summary["failures"]}
    assert set(failed) == {"tests/a.py::test_y", "tests/a.py::test_z", "tests/b.py"}
    assert failed["tests/a.py::test_y"].endswith("E   assert 1 == 2")


def test_kernel_cases_run_by_tier_with_the_families_taking_turns():
    cases = {
        "matmul": matmul.gpu_cases(),
        "attention": attention.gpu_cases(),
        "conv": conv.gpu_cases(),
    }
    order = ordered(cases)
    assert sorted(c.label for c in order) == sorted(c.label for v in cases.values() for c in v)
    tiers = [c.tier for c in order]
    assert tiers == sorted(tiers)
    assert [c.family for c in order[:3]] == ["matmul", "attention", "conv"]
    assert order[0].label == "4096x4096x4096 float16" and order[0].inductor


def test_interleaved_timing_takes_turns_and_reports_medians_and_quartiles():
    calls = []

    def sampler(name, values):
        values = iter(values)

        def sample():
            calls.append(name)
            return next(values)

        return sample

    timings = interleaved(
        {"a": sampler("a", [3.0, 1.0, 2.0, 100.0, 2.0]), "b": sampler("b", [5.0] * 5)}, 5
    )
    assert calls == ["a", "b"] * 5
    assert timings["a"].median == 2.0 and timings["b"] == Timing(5.0, 5.0, 5.0, 5)
    assert timings["a"].q1 == 2.0 and timings["a"].q3 == 3.0
    assert timings["a"].spread == pytest.approx(0.5)


def _facts(stage, rehearsal=False):
    return {
        "kind": "facts", "stage": stage, "device": "NVIDIA H100 80GB HBM3", "date": "2026-12-01",
        "commit": "abc1234", "rehearsal": rehearsal, "versions": {"torch": "2.11.0"},
    }  # fmt: skip


def _write(path, rows):
    import json

    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_the_results_page_leads_with_the_headline_ratios(tmp_path):
    tag = "h100-80gb-hbm3-2026-12-01-abc1234"
    case = {"kind": "case", "family": "matmul", "dtype": "float16", "case": "4096^3 f16"}
    _write(
        tmp_path / f"kernels-{tag}.jsonl",
        [
            _facts("kernels"),
            {**case, "mc0_s": 2.0, "mc1_s": 1.0, "mc1_vs_library": 0.5, "library_tflops": 700},
            {**case, "case": "8192^3 f16", "mc0_s": 1.0, "mc0_vs_library": 0.8},
            {**case, "family": "attention", "mc0_s": 1.0, "mc0_vs_library": 0.7},
        ],
    )
    model = {"kind": "model", "model": "gpt2", "dtype": "float16", "batch": 1, "status": "pass"}
    _write(
        tmp_path / f"models-{tag}.jsonl",
        [
            _facts("models"),
            {**model, "backend": "eager", "latency_ms": 4.0},
            {**model, "backend": "inductor", "latency_ms": 2.0, "speedup_vs_eager": 2.0},
            {
                **model,
                "backend": "minicomp-ss0",
                "latency_ms": 1.0,
                "speedup_vs_eager": 4.0,
                "speedup_vs_inductor": 2.0,
                "compile_s_cold": 3.0,
            },
        ],  # fmt: skip
    )
    _write(tmp_path / f"check-{tag}-tests.jsonl", [{"nodeid": "x", "outcome": "passed"}])
    _write(tmp_path / "kernels-emu-2026-12-01-abc1234.jsonl", [_facts("kernels", True)])
    runs = report.load_runs(str(tmp_path))
    assert list(runs) == [tag]  # the rehearsal and the test report are not runs
    page = report.render(runs)
    assert "## NVIDIA H100 80GB HBM3, 2026-12-01, commit abc1234" in page
    assert "- matmul float16: 63% of cuBLAS (geomean of 2 cases)" in page
    assert "- attention: 70% of SDPA" in page
    assert "- model suite (minicomp-ss0): 4.00x over eager, 2.00x over Inductor" in page
    assert "| 4096^3 f16 | 700.0 |" in page
    assert "| gpt2 | 1 | 4.00 | 2.00 | 1.00 | 4.00x | 2.00x | 3.0 / - | ok |" in page
    assert report.render({}).endswith("No GPU run has been recorded yet.\n")
    path = report.write_page(str(tmp_path))
    assert open(path).read() == page


def test_a_stage_bundle_stays_small_enough_to_come_back(tmp_path, monkeypatch):
    import os

    from minicomp.backends import cache
    from minicomp.bench.stages import stage as stage_module

    cache_dir = tmp_path / "cache"
    for i in range(6):  # six incompressible 100 KB cubin entries
        folder = cache.entry_dir(str(cache_dir), "cubins", f"{i:02x}" + "0" * 62)
        os.makedirs(folder)
        with open(os.path.join(folder, "kernel.cubin"), "wb") as f:
            f.write(os.urandom(100_000))
    monkeypatch.setattr(stage_module, "MAX_BUNDLE_BYTES", 250_000)
    stage = stage_module.Stage(
        "kernels", str(tmp_path / "out"), True, stage_module.Budget(10), str(cache_dir),
        str(tmp_path / "carry"), tag="x",
    )  # fmt: skip
    manifest = stage.export_cache()
    assert 1 <= manifest["cubins"] <= 2
    assert os.path.getsize(stage.path("-cache.tar.gz")) <= 250_000
