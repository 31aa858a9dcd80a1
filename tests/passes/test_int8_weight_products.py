"""Weight-only int8 products on the cpu target: `mm(x, w_i8.t().to(x.dtype))` with few rows is
ATen's `_weight_int8pack_mm` over the int8 weight, and still computes what eager does."""

import pytest
import torch
from helpers import check_compiled

import minicomp

INT8_GEMM = "ATen by design on cpu: int8 weight-only GEMM"


def int8_linear(x, w_i8, scale, bias):
    """What torchao's int8 weight-only linear traces to."""
    return torch.mm(x, w_i8.t().to(x.dtype)) * scale + bias


def inputs(rows, k, n, dtype):
    g = torch.Generator().manual_seed(rows * 7 + k)
    x = torch.randn(rows, k, generator=g).to(dtype)
    w = torch.randint(-128, 128, (n, k), dtype=torch.int8, generator=g)
    scale = (torch.rand(n, generator=g) / 64).to(dtype)
    bias = torch.randn(n, generator=g).to(dtype)
    return x, w, scale, bias


def reasons(fn, *args) -> dict[str, str]:
    report = minicomp.explain(fn, *args, options={"target": "cpu", "fallback": "error"})
    return report.fallbacks


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("rows", [1, 16])
def test_few_rows_run_the_int8_kernel(rows, dtype):
    args = inputs(rows, 256, 96, dtype)
    assert reasons(int8_linear, *args).get("mm.default") == INT8_GEMM
    # The kernel sums in f32 and rounds once, as ATen's GEMM does for half types.
    tol = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-5}[dtype]
    check_compiled(int8_linear, *args, target="cpu", rtol=tol, atol=tol)


@pytest.mark.parametrize(
    "rows, k", [(64, 256), (4, 40)], ids=["many rows", "K not a multiple of 32"]
)
def test_other_products_dequantize_as_before(rows, k):
    args = inputs(rows, k, 48, torch.bfloat16)
    assert reasons(int8_linear, *args).get("mm.default") != INT8_GEMM
    check_compiled(int8_linear, *args, target="cpu", rtol=1e-2, atol=1e-2)


def test_a_weight_read_another_way_is_left_alone():
    # The weight as it is ([K, N], no transpose): not the layout the int8 kernel takes.
    def untransposed(x, w_i8):
        return torch.mm(x, w_i8.to(x.dtype))

    x = torch.randn(4, 64).to(torch.bfloat16)
    w = torch.randint(-128, 128, (64, 32), dtype=torch.int8)
    assert reasons(untransposed, x, w).get("mm.default") != INT8_GEMM
    check_compiled(untransposed, x, w, target="cpu", rtol=1e-2, atol=1e-2)


def test_activations_read_transposed_are_left_to_the_dequantizing_path():
    # The int8 kernel reads x row-major; a transposed x stays on the path that handles any layout.
    x_t, w, scale, bias = inputs(64, 16, 48, torch.bfloat16)  # x_t.t() is 16 x 64, column-major
    args = (x_t.t(), torch.randint(-128, 128, (48, 64), dtype=torch.int8), scale, bias)
    assert reasons(int8_linear, *args).get("mm.default") != INT8_GEMM
    check_compiled(int8_linear, *args, target="cpu", rtol=1e-2, atol=1e-2)
