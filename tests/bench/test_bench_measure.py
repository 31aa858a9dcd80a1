"""One bench cell: the error measure, failures kept per cell, timing and memory meters."""

import math
import time

import pytest
import torch

from minicomp.backends.cpu import compiler
from minicomp.bench import measure
from minicomp.bench.options import BACKEND_NAMES


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        return torch.softmax(torch.relu(self.fc(x)) * 3, dim=-1)


def _cell(backend, model=None, dtype=torch.float32, **kwargs):
    torch.manual_seed(0)
    model = (model or Tiny()).to(dtype).eval()
    x = torch.randn(2, 8, dtype=dtype)
    with torch.no_grad():
        expected = model(x)
    return measure.measure(
        backend, model, (x,), expected, device="cpu", repeats=3, warmup=1, **kwargs
    )


def test_relative_error_is_relative_to_the_output_scale():
    e = torch.tensor([100.0, -50.0, 1.0])
    assert measure.relative_error(e + torch.tensor([0.0, 0.0, 1.0]), e) == pytest.approx(0.01)
    assert measure.relative_error(e.clone(), e) == 0.0
    assert measure.relative_error(e[:2], e) == math.inf  # wrong shape
    special = torch.tensor([float("nan"), float("inf"), 2.0])
    assert measure.relative_error(special.clone(), special) == 0.0
    assert measure.relative_error(torch.tensor([1.0, float("inf"), 2.0]), special) == math.inf
    assert measure.relative_error(-special, special) == math.inf  # -inf is not inf
    half = torch.tensor([1.0, 2.0], dtype=torch.float16)
    assert measure.relative_error(half + 0.5, half) == pytest.approx(0.25)


def test_tolerances_grow_as_the_dtype_gets_coarser():
    t = measure.tolerance
    assert t(torch.float32) < t(torch.float16) < t(torch.bfloat16) <= 0.05
    assert t(torch.float64) == t(torch.float32)


def test_backend_registry_matches_the_option_names():
    assert tuple(measure.BACKENDS) == BACKEND_NAMES
    assert measure.BACKENDS["eager"].missing() is None
    assert "not installed" in measure.Backend("x", None, "none", "no_such_pkg").missing()


def test_eager_cell_has_every_measurement():
    row = _cell(measure.BACKENDS["eager"])
    assert set(row) == set(measure.empty_row("eager"))
    assert row["status"] == "pass" and row["passed"] and row["error"] is None
    assert row["max_rel_err"] == 0.0 and row["repeats"] == 3
    assert 0 < row["latency_ms_min"] <= row["latency_ms"] <= row["latency_ms_max"]
    # A (2, 8) input: the linear's output, relu's, the product, softmax's: 4 tensors of
    # 2x4 floats, at most all live at once.
    assert row["memory_method"] == "cpu-tensors" and 32 <= row["peak_mem_bytes"] <= 4 * 32
    assert row["compile_s_cold"] is None and row["kernel_count"] is None


def test_a_wrong_answer_is_a_mismatch_and_a_crash_an_error():
    def off_by_a_bit(model, cache_dir, options):
        return lambda x: model(x) * 1.01

    row = _cell(measure.Backend("wrong", off_by_a_bit, "none"))
    assert row["status"] == "mismatch" and row["passed"] is False
    assert row["max_rel_err"] == pytest.approx(0.01, rel=1e-3)
    assert row["latency_ms"] is not None  # still timed: the table shows both

    def crashes(model, cache_dir, options):
        def run(x):
            raise RuntimeError("no kernel for you")

        return run

    row = _cell(measure.Backend("broken", crashes, "none"))
    assert row["status"] == "error" and row["passed"] is False
    assert row["error"] == "RuntimeError: no kernel for you" and row["latency_ms"] is None


def test_minicomp_cell_compiles_cold_then_warm_in_a_private_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("MINICOMP_CACHE_DIR", str(tmp_path / "user-cache"))
    compiler.reset_cache_stats()
    row = _cell(measure.BACKENDS["minicomp-ss0"])
    stats = compiler.cache_stats()
    # Cold: the library is built (nothing in memory or on disk); warm: it is read from disk.
    assert stats.misses >= 1 and stats.disk_hits >= 1 and stats.memory_hits == 0
    assert row["status"] == "pass", row["error"]
    assert row["max_rel_err"] <= 1e-6
    assert row["compile_s_cold"] > 0 and row["compile_s_warm"] > 0
    assert row["graphs"] == 1 and row["kernel_count"] >= 1
    assert row["fallback_ops"] == {"addmm.default": "ATen by design on cpu: BLAS GEMM"}
    assert row["aten_calls"] == 1
    assert not (tmp_path / "user-cache").exists()


def test_cpu_memory_counts_what_a_backend_keeps_and_what_a_call_allocates():
    mib = 1024 * 1024

    def keeper(model, cache_dir, options):
        kept = torch.zeros(2 * mib // 4)  # like a compiled plan's workspace, kept between calls

        def run(x):
            scratch = torch.ones(4 * mib // 4)  # freed before the call returns
            return model(x) + kept[0] * scratch[0]

        return run

    row = _cell(measure.Backend("keeper", keeper, "none"))
    assert row["memory_method"] == "cpu-tensors"
    assert 6 * mib <= row["peak_mem_bytes"] < 6 * mib + 1024


def test_call_peak_bytes_follows_allocations_and_frees():
    def call(n):
        a = torch.ones(n)  # n floats
        b = torch.ones(n)
        del a
        c = torch.ones(2 * n)
        return b.sum() + c.sum()

    peak = measure.call_peak_bytes(call, (1024 * 1024,))
    # b and c at once (a was freed first), and the two sums' scalars
    assert 3 * 4 * 1024 * 1024 <= peak <= 3 * 4 * 1024 * 1024 + 64


def test_time_call_measures_one_call():
    ms = measure.time_call(lambda: time.sleep(0.01), (), "cpu")
    assert 9.0 <= ms < 1000


def test_minicomp_options_reach_the_compile_and_warm_false_compiles_once(tmp_path):
    from minicomp.dynamo.backend import recording

    records = []
    with recording(records):
        row = _cell(measure.BACKENDS["minicomp-ss0"], options={"target": "cuda-emu"}, warm=False)
    assert row["status"] == "pass" and row["kernel_count"] > 0
    assert row["compile_s_cold"] > 0 and row["compile_s_warm"] is None
    assert {r.target for r in records} == {"cuda-emu"} and len(records) == 1
