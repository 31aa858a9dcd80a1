"""benchmarks/lens.py's rows: a case of the kernel benchmark estimated on a GPU description,
its template named, written as the JSON the GPU kernels stage reads back."""

import math

import pytest
import torch

from minicomp.bench.kernels import conv, matmul
from minicomp.bench.lens import estimate_case, predictions, summary, table, write


def test_a_matmul_case_is_estimated_by_its_template(tmp_path):
    # On an H100 the product compiles as the cuda target builds it there: sm_90a, the Hopper
    # matmul (the [K, N] B read MN-major).
    case = matmul.case(96, 80, 64, torch.float16, "cpu")
    row = estimate_case(case, "h100")
    assert not row.error
    assert [k.template for k in row.kernels] == ["matmul_hopper"]
    k = row.kernels[0]
    assert 0 < k.roofline_us <= k.time_us < math.inf and 0 < row.fraction <= 1
    # The problem's roofline counts only useful flops (96x80x64 pads to whole tiles), at the
    # H100's wgmma rate.
    useful = 2 * 96 * 80 * 64 / 989e12 * 1e6
    bytes_bound = (96 * 64 + 64 * 80 + 96 * 80) * 2 / 3350e9 * 1e6
    assert row.problem_roofline_us == pytest.approx(max(useful, bytes_bound))
    assert 0 < row.problem_fraction <= 1
    # TMA boxes cover the operands; C is stored along its rows from the staging rows.
    assert 0.9 <= k.sector_efficiency <= 1.0 and k.spill_bytes == 0
    text = table([row])
    assert case.label in text and "matmul_hopper" in text
    assert "geomean fraction of roofline" in summary([row])
    path = tmp_path / "lens.json"
    write([row], str(path), {"device": "h100"})
    assert predictions(str(path)) == {case.label: row.time_us}


def test_an_int8_case_is_estimated_on_integer_tensor_cores():
    """torch._int_mm (B a transposed [N, K], as torchao passes it) on matmul_tc's m16n8k32:
    its roofline is the flops at twice the f16 mma rate; its reference is exact."""
    case = matmul.case(128, 96, 256, torch.int8, "cpu")
    a, b = case.make()
    assert a.dtype == b.dtype == torch.int8 and b.stride() == (1, 256)
    assert torch.equal(case.reference(a, b), torch._int_mm(a, b).long())
    row = estimate_case(case, "h100")
    assert not row.error and [k.template for k in row.kernels] == ["matmul_tc"]
    useful = 2 * 128 * 96 * 256 / (2 * 660e12) * 1e6
    bytes_bound = ((128 + 96) * 256 + 4 * 128 * 96) / 3350e9 * 1e6
    assert row.problem_roofline_us == pytest.approx(max(useful, bytes_bound))
    (k,) = row.kernels
    assert k.sector_efficiency == 1.0 and k.bank_conflict_factor < 1.1 and k.spill_bytes == 0
    assert [c.label for c in matmul.gpu_cases(dtypes=(torch.int8,))] == [
        "16x4096x4096 int8",
        "4096x4096x4096 int8",
    ]


def test_a_float8_case_is_estimated_on_float8_tensor_cores():
    """torch._scaled_mm of e4m3fn (B a transposed [N, K], per-tensor scales, bf16 out) on
    matmul_tc's float8 m16n8k32 (the Hopper matmul takes no scales yet): its problem's
    roofline, the output's bf16 bytes at this size; its reference the dequantized product."""
    fp8 = torch.float8_e4m3fn
    case = matmul.case(128, 96, 256, fp8, "cpu")
    a, b, sa, sb = case.make()
    assert a.dtype == b.dtype == fp8 and b.stride() == (1, 256)
    want = case.reference(a, b, sa, sb)
    got = case.fn(a, b, sa, sb).float()
    assert (got - want).abs().max() <= 2**-8 * want.abs().max()
    row = estimate_case(case, "h100")
    assert not row.error and [k.template for k in row.kernels] == ["matmul_tc"]
    useful = 2 * 128 * 96 * 256 / (2 * 989e12) * 1e6
    bytes_bound = ((128 + 96) * 256 + 2 * 128 * 96) / 3350e9 * 1e6
    assert row.problem_roofline_us == pytest.approx(max(useful, bytes_bound))
    (k,) = row.kernels
    assert k.sector_efficiency == 1.0 and k.spill_bytes == 0
    assert [c.label for c in matmul.gpu_cases(dtypes=(fp8,))] == [
        "16x4096x4096 float8_e4m3fn",
        "4096x4096x4096 float8_e4m3fn",
    ]


def test_the_tensor_core_matmul_stages_its_tiles_without_bank_conflicts():
    """The cp.async stores and ldmatrix reads of matmul_tc's padded rows: two rows' chunks in
    one 8-lane phase (row-major chunk order) made this x1.41."""
    case = matmul.case(256, 256, 256, torch.float16, "cpu")
    (k,) = estimate_case(case, "h100", options={"arch": "sm_90"}).kernels  # not sm_90a
    # Split in 2 inside the kernel: its tile counters' atomics are one lane's 4 bytes of a
    # sector, all else whole sectors.
    assert k.template == "matmul_tc" and 0.99 < k.sector_efficiency <= 1.0
    assert k.bank_conflict_factor < 1.1


def test_a_case_that_fails_is_a_row_that_says_why():
    case = conv.case((8, 16, 9, 3, 2, 1), 2, torch.float16, "cpu")
    broken = case.__class__(**{**case.__dict__, "make": lambda: (torch.zeros(1),)})
    row = estimate_case(broken, "h100")
    assert row.error and not row.kernels
    assert "error" in table([row]) and "1 failed" in summary([row])


def test_the_kernels_stage_puts_predictions_beside_measurements(tmp_path):
    from minicomp.bench.lens import compare, comparison_summary, device_key, latest_predictions

    assert device_key("NVIDIA H100 80GB HBM3") == "h100" and device_key("Tesla T4") is None
    case = matmul.case(96, 80, 64, torch.float16, "cpu")
    row = estimate_case(case, "h100")
    write([row], str(tmp_path / "lens-h100-2026-11-25.json"), {"device": "h100"})
    write([], str(tmp_path / "lens-h100-2026-11-26-before.json"), {"device": "h100"})
    source, predicted = latest_predictions(str(tmp_path), "h100")
    assert source.endswith("lens-h100-2026-11-25.json") and case.label in predicted
    measured = {"case": case.label, "mc0_s": 3 * row.time_us * 1e-6}
    other = {"case": "not estimated", "mc0_s": 1e-5}
    compare(measured, predicted)
    compare(other, predicted)
    assert measured["mc0_measured_over_predicted"] == pytest.approx(3.0)
    assert "mc0_predicted_s" not in other
    assert "geomean 3.00" in comparison_summary([measured, other], source)
    assert "no prediction" in comparison_summary([other], "")
