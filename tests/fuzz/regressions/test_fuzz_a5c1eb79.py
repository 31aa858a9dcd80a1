"""Fuzzer finding a5c1eb79: mismatch on cpu, cuda-emu.

Found by `python -m minicomp.fuzz` (seed 2395) and shrunk to this program.
"""

import pytest
import torch
import torch.nn.functional as F

from minicomp.fuzz.check import check_against_eager

# The fuzzer's CI run takes a finding that matches this for this one, not a new one.
SIGNATURE = {
    "status": "mismatch",
    "pattern": "output stride",
    "targets": ["cpu", "cuda-emu"],
    "ops": ["batch_norm_eval"],
}
# What was wrong, in words (fixed: the test passes).
REASON = (
    "batch_norm (eval) of a transposed input keeps the input's strides; eager returns a contiguous "
    "result"
)


def fn(a, b, c):
    v0 = F.batch_norm(a, b, c.abs() + 0.5, training=False)
    return (v0,)


def make_inputs():
    gen = torch.Generator()
    a = torch.randn(3, 2, generator=gen.manual_seed(58249)).t()
    b = torch.randn(3, generator=gen.manual_seed(25691))
    c = torch.randn(3, generator=gen.manual_seed(41577))
    return a, b, c


@pytest.mark.parametrize("target", ["cpu", "cuda-emu"])
def test_fuzz_a5c1eb79(target):
    check_against_eager(fn, make_inputs, target=target, dynamic=False, backward=False)
