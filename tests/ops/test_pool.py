"""Pooling lowerings (max with indices, average, adaptive average): evaluated against ATen, and
compiled on every target as native kernels."""

import pytest
import torch
import torch.nn.functional as F
from helpers import check_compiled, compile_minicomp
from helpers_lowering import FLOATS, check_lowering, make_tensor

import minicomp
from minicomp.ir.graph import ExternOp

aten = torch.ops.aten
NO_NAN = (float("inf"), float("-inf"), 0.0, -0.0, 1.0, -1.0)

# (kernel_size, stride, padding, dilation, ceil_mode)
MAX_CONFIGS = [
    ([2, 2], [], [0, 0], [1, 1], False),
    ([3, 3], [2, 2], [1, 1], [1, 1], False),
    ([3, 3], [2, 2], [1, 1], [1, 1], True),
    ([2, 3], [1, 2], [1, 0], [2, 1], True),
    ([3, 2], [2, 3], [1, 1], [2, 3], False),
    ([1, 1], [2, 1], [0, 0], [1, 1], True),
]


def _ties(shape, dtype):
    """Small integers: windows full of equal maxima (ATen takes the first)."""
    return torch.randint(-1, 2, shape).to(dtype)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("config", MAX_CONFIGS, ids=str)
def test_max_pool_values_and_indices(config, dtype):
    for x in (make_tensor((2, 3, 9, 11), dtype, special=NO_NAN), _ties((3, 10, 7), dtype)):
        check_lowering(aten.max_pool2d_with_indices.default, x, *config)


def test_max_pool_windows_of_minus_inf_never_point_into_the_padding():
    x = torch.full((1, 2, 5, 6), float("-inf"))
    x[0, 1, 4, 5] = 3.0
    (_, indices) = check_lowering(aten.max_pool2d_with_indices.default, x, [3, 3], [2, 2], [1, 1])
    assert indices.min() >= 0


def test_max_pool_nan():
    """A window holding one NaN gives NaN at the NaN's index."""
    x = make_tensor((2, 8, 8), torch.float32, special=NO_NAN)
    x[0, 2, 3] = x[1, 5, 6] = float("nan")
    check_lowering(aten.max_pool2d_with_indices.default, x, [2, 2], [2, 2])
    check_lowering(aten.max_pool2d.default, x, [3, 3], [1, 1], [1, 1])


def test_max_pool_symbolic_sizes():
    x = make_tensor((2, 3, 13, 11), torch.float32, special=NO_NAN)
    sym = {13: "h", 11: "w", 7: "oh", 6: "ow"}
    check_lowering(aten.max_pool2d_with_indices.default, x, [3, 3], [2, 2], [1, 1], sym=sym)


# (kernel_size, stride, padding, ceil_mode, count_include_pad, divisor_override)
AVG_CONFIGS = [
    ([2, 2], [], [0, 0], False, True, None),
    ([3, 3], [2, 2], [1, 1], False, True, None),
    ([3, 3], [2, 2], [1, 1], True, False, None),
    ([3, 2], [2, 2], [1, 1], True, True, None),
    ([2, 3], [1, 2], [1, 0], True, False, None),
    ([3, 3], [2, 1], [1, 1], False, True, 5),
]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("config", AVG_CONFIGS, ids=str)
def test_avg_pool(config, dtype):
    for shape in ((2, 3, 9, 11), (3, 10, 7)):
        check_lowering(aten.avg_pool2d.default, make_tensor(shape, dtype, special=False), *config)


def test_avg_pool_symbolic_sizes():
    x = make_tensor((2, 3, 13, 11), torch.float32, special=False)
    sym = {13: "h", 11: "w", 7: "oh", 6: "ow"}
    check_lowering(aten.avg_pool2d.default, x, [3, 3], [2, 2], [1, 1], True, False, sym=sym)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("size", [[4, 5], [3, 11], [9, 2], [1, 1], [5, 7]], ids=str)
def test_adaptive_avg_pool(size, dtype):
    x = make_tensor((2, 3, 9, 11), dtype, special=False)
    check_lowering(aten._adaptive_avg_pool2d.default, x, size)
    check_lowering(aten._adaptive_avg_pool2d.default, x[0], size)


def _pools(x):
    x = torch.relu(x)
    values, indices = F.max_pool2d(x, 3, 2, 1, ceil_mode=True, return_indices=True)
    avg = F.avg_pool2d(x, 3, 2, 1, count_include_pad=False)
    return values * 2, indices, avg, F.adaptive_avg_pool2d(x, (4, 3))


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
def test_pools_compile_to_kernels(target, channels_last):
    x = torch.randn(2, 8, 9, 11)
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    check_compiled(_pools, x, target=target, rtol=1e-5, atol=1e-6)
    torch._dynamo.reset()
    report = minicomp.explain(_pools, x, options={"target": target})
    externs = [n.name for r in report.records for n in r.graph.nodes if isinstance(n, ExternOp)]
    assert not externs, externs


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_pools_compiled(target, dtype):
    x = torch.randn(2, 4, 9, 11, dtype=dtype)
    check_compiled(_pools, x, target=target, rtol=1e-2, atol=1e-2, reference_dtype=torch.float64)


def test_max_pool_backward_through_aten(target):
    """Training: the forward's indices feed ATen's backward."""
    x = torch.randn(2, 3, 9, 11, requires_grad=True)

    def fn(x):
        return (F.max_pool2d(x, 3, 2, 1) * 2 + F.avg_pool2d(x, 2)[..., :1, :1]).sum()

    compiled = compile_minicomp(fn, target)
    x2 = x.detach().clone().requires_grad_()
    compiled(x2).backward()
    fn(x).backward()
    torch.testing.assert_close(x2.grad, x.grad)
