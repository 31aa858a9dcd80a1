"""Size expressions with rounding, logarithms, true divisions and conditions (PyTorch's
RoundToInt, RoundDecimal, OpaqueUnaryFn_log2, TruncToInt, relations) compile with
dynamic=True, in kernels and in what the plan computes itself (views, checks, outputs)."""

import math

import pytest
import torch
from helpers import assert_same, compile_minicomp
from torch._dynamo.utils import counters


def rounded_third(x):
    return x[: round(x.shape[0] / 3)] * 2


def scaled_by_rounded_ratio(x):
    return x * round(x.shape[0] / 3, 2)


def first_log2_rows(x):
    return x[: int(math.log2(x.shape[0]))] + 1


def zeros_of_ceil_third(x):
    return x.new_zeros(math.ceil(x.shape[0] / 3)) + x.sum()


def truncated_third_and_size(x):
    return x + 1, int(x.shape[0] / 3)


def checked_ratio(x):
    torch._check(x.shape[0] / 3 > 1)
    return x * 2


@pytest.mark.parametrize(
    "fn",
    [
        rounded_third,
        scaled_by_rounded_ratio,
        first_log2_rows,
        zeros_of_ceil_third,
        truncated_third_and_size,
        checked_ratio,
    ],
)
def test_size_functions(fn, target):
    torch.manual_seed(0)
    compiled = compile_minicomp(fn, target, dynamic=True)
    counters.clear()
    for n in (7, 10, 17, 32):
        x = torch.randn(n, 3)
        assert_same(compiled(x), fn(x), rtol=1e-6, atol=1e-6)
    assert counters["stats"]["unique_graphs"] == 1, "the frame was compiled more than once"
