"""Fuzzer finding af88aeef: mismatch on cpu, cuda-emu.

Found by `python -m minicomp.fuzz` (seed 2309) and shrunk to this program.
"""

import pytest
import torch

from minicomp.fuzz.check import check_against_eager

# The fuzzer's CI run takes a finding that matches this for this one, not a new one.
SIGNATURE = {
    "status": "mismatch",
    "pattern": "output stride",
    "targets": ["cpu", "cuda-emu"],
    "ops": ["copysign"],
}
# What was wrong, in words (fixed: the test passes).
REASON = (
    "copysign broadcasting a permuted 4-d tensor to 5 dims returns a contiguous result; eager "
    "keeps the input's layout (add, mul, atan2 do)"
)


def fn(a, b):
    v0 = torch.copysign(a, b)
    return (v0,)


def make_inputs():
    gen = torch.Generator()
    a = torch.randn(1, 2, 1, 2, generator=gen.manual_seed(9345)).permute(0, 2, 3, 1)
    b = torch.randn(1, 1, 1, 1, 1, generator=gen.manual_seed(34055))
    return a, b


@pytest.mark.parametrize("target", ["cpu", "cuda-emu"])
def test_fuzz_af88aeef(target):
    check_against_eager(fn, make_inputs, target=target, dynamic=False, backward=False)
