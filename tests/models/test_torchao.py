"""Models quantized with torchao's `quantize_`, compiled by minicomp and compared with torchao in
eager: what its tensor subclasses trace to (dequantization, `_int_mm`, rescales) must compile
without falling back."""

import pytest
import torch
from helpers import check_compiled

import minicomp
from minicomp.ir.graph import FusedOp

torchao = pytest.importorskip("torchao")
quantization = pytest.importorskip("torchao.quantization")

CONFIGS = {
    "int8-weight-only": lambda: quantization.Int8WeightOnlyConfig(),
    "int8-dynamic-activation-int8-weight": lambda: (
        quantization.Int8DynamicActivationInt8WeightConfig()
    ),
    "float8-weight-only": lambda: quantization.Float8WeightOnlyConfig(),
    "int4-weight-only-intx": lambda: quantization.IntxWeightOnlyConfig(
        weight_dtype=torch.int4, granularity=quantization.PerGroup(32)
    ),
}


def _device(target: str) -> str:
    return "cuda" if target == "cuda" else "cpu"


def quantized_mlp(config: str, target: str) -> torch.nn.Module:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512), torch.nn.SiLU(), torch.nn.Linear(512, 128)
    ).to(torch.bfloat16)
    quantization.quantize_(model.eval(), CONFIGS[config]())
    return model.to("cuda") if target == "cuda" else model


@pytest.mark.parametrize("rows", [1, 16])
@pytest.mark.parametrize("config", list(CONFIGS))
def test_quantized_mlp_matches_torchao(config, rows, target):
    model = quantized_mlp(config, target)
    x = torch.randn(rows, 256, generator=torch.Generator().manual_seed(rows)).to(torch.bfloat16)
    with torch.no_grad():
        # One bf16 rounding of the largest output apart at most: the products sum in f32 in
        # another order than ATen's.
        out = check_compiled(model, x, target=target, rtol=1e-2, atol=1e-2)
    assert out.dtype == torch.bfloat16


def test_int8_weight_only_reads_the_int8_weight_on_the_cpu():
    model = quantized_mlp("int8-weight-only", "cpu")
    with torch.no_grad():
        report = minicomp.explain(model, torch.randn(4, 256).to(torch.bfloat16))
    assert set(report.fallbacks.get(k) for k in report.fallbacks if k.startswith("mm")) == {
        "ATen by design on cpu: int8 weight-only GEMM"
    }


def test_float8_weight_only_is_one_kernel_per_linear_on_the_cuda_targets(target):
    if target == "cpu":
        pytest.skip("on the cpu target the product is a BLAS call over the dequantized weight")
    model = quantized_mlp("float8-weight-only", target)
    with torch.no_grad():
        report = minicomp.explain(
            model,
            torch.randn(4, 256).to(torch.bfloat16).to(_device(target)),
            options={"target": target},
        )
    # The e4m3 weight is widened and scaled inside the matmul template's operand loads.
    assert report.aten_call_count == 0
    assert len(report.fused_groups) == 2, report.fused_groups


@pytest.mark.parametrize("config", list(CONFIGS))
def test_dequantization_runs_inside_the_matmul_on_the_cuda_targets(config, target):
    """No kernel writes a weight out (dequantized, or transposed as an int8 copy): the weight
    is read in its stored type by the matmul template's operand loads; no ATen call but
    zero-copy views."""
    if target == "cpu":
        pytest.skip("on the cpu target products are ATen calls (BLAS, int8 GEMM) by design")
    model = quantized_mlp(config, target)
    with torch.no_grad():
        report = minicomp.explain(
            model,
            torch.randn(16, 256).to(torch.bfloat16).to(_device(target)),
            options={"target": target},
        )
    assert set(report.fallbacks.values()) <= {"a view of its input's memory"}, report.fallbacks
    weights = {(512, 256), (256, 512), (128, 512), (512, 128)}
    written = [
        (v.name, v.shape)
        for r in report.records
        for n in r.graph.nodes
        if isinstance(n, FusedOp)
        for v in n.outputs
    ]
    assert not [w for w in written if w[1] in weights], written
    products = [k.attrs.template for r in report.records for k in r.kernels]
    assert sum(1 for t in products if t and t.startswith("matmul_tc")) == 2, products
