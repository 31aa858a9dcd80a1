"""The devices the lens estimates for: their numbers agree with the datasheet rates they
come from, and they are found by key or name."""

import pytest

from minicomp.lens import devices


def test_rates_agree_with_the_datasheets():
    # FP32 TFLOP/s (an FMA is 2 flops): 66.9 on H100 SXM, 19.5 on A100.
    assert devices.H100.fp32_per_second * 2 / 1e12 == pytest.approx(66.9, abs=0.1)
    assert devices.A100.fp32_per_second * 2 / 1e12 == pytest.approx(19.5, abs=0.1)
    assert devices.A100.sfu_per_second == 108 * 16 * 1.41e9
    assert devices.A100.shared_bytes_per_second == 108 * 128 * 1.41e9
    for device in devices.DEVICES.values():
        assert device.mma_sync_tflops_f16 <= device.tensor_tflops_f16
        assert device.limits.name == device.arch


def test_found_by_key_or_name():
    assert devices.get_device("h100") is devices.H100
    assert devices.get_device("H200 SXM") is devices.H200
    assert devices.get_device(" A100 ") is devices.A100
    with pytest.raises(ValueError, match="known: h100, h200, a100"):
        devices.get_device("v100")


def test_describe_is_one_line_with_the_main_numbers():
    line = devices.H100.describe()
    assert "\n" not in line
    assert "132 SMs" in line and "3350 GB/s" in line and "989" in line and "sm_90" in line
