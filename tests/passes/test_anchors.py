"""Matrix products become compute ops on the CUDA targets and stay ATen calls on the CPU."""

import pytest
import torch
from helpers import check_compiled

import minicomp
from minicomp.ir.graph import ExternOp, FusedOp

DTYPES = [torch.float32, torch.float16, torch.bfloat16]
TOLERANCE = {torch.float32: (1e-4, 1e-4), torch.float16: (2e-3, 2e-3), torch.bfloat16: (2e-2, 2e-2)}


def _explain(fn, *args, target):
    torch._dynamo.reset()
    return minicomp.explain(fn, *args, options={"target": target})


def _check(fn, *args, target, dtype):
    rtol, atol = TOLERANCE[dtype]
    check_compiled(fn, *args, target=target, rtol=rtol, atol=atol, reference_dtype=torch.float64)


@pytest.mark.parametrize("dtype", DTYPES)
def test_linear_with_activation(target, dtype):
    def fn(x, w, b):
        return torch.nn.functional.gelu(torch.nn.functional.linear(x, w, b))

    _check(
        fn,
        torch.randn(6, 24, dtype=dtype),
        torch.randn(40, 24, dtype=dtype),
        torch.randn(40, dtype=dtype),
        target=target,
        dtype=dtype,
    )


@pytest.mark.parametrize("dtype", DTYPES)
def test_products_with_scales_and_transposes(target, dtype):
    def fn(a, b, bias, c, d, e):
        x = torch.addmm(bias, a.t(), b, beta=0.5, alpha=2.0)
        y = torch.baddbmm(e, c, d.transpose(1, 2), beta=0.0, alpha=-1.5)
        return x, torch.bmm(c, d.transpose(1, 2)) + y, torch.mm(a.t(), b)

    a, b = torch.randn(17, 9, dtype=dtype), torch.randn(17, 11, dtype=dtype)
    bias = torch.randn(1, 11, dtype=dtype)
    c, d = torch.randn(3, 5, 7, dtype=dtype), torch.randn(3, 6, 7, dtype=dtype)
    e = torch.full((3, 5, 6), float("nan"), dtype=dtype)  # beta=0 ignores even NaN
    _check(fn, a, b, bias, c, d, e, target=target, dtype=dtype)


def test_cuda_targets_fuse_the_product_with_its_epilogue(target):
    x, w, b = torch.randn(4, 8), torch.randn(16, 8), torch.randn(16)

    def fn(x, w, b):
        return torch.relu(torch.nn.functional.linear(x, w, b)) * 3

    with torch.no_grad():
        report = _explain(fn, x, w, b, target=target)
    (record,) = report.records
    nodes = record.graph.nodes
    externs = [n.name for n in nodes if isinstance(n, ExternOp)]
    if target == "cpu":
        assert any("addmm" in name for name in externs)
        return
    assert not externs
    (group,) = [n for n in nodes if isinstance(n, FusedOp)]
    assert any("addmm" in m for m in group.members) and any("relu" in m for m in group.members)
