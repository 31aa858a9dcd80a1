"""Fuzzer finding a6b180d1: mismatch on cpu, cuda-emu.

Found by `python -m minicomp.fuzz` (seed 6354) and shrunk to this program.
"""

import pytest
import torch

from minicomp.fuzz.check import check_against_eager

# The fuzzer's CI run takes a finding that matches this for this one, not a new one.
SIGNATURE = {
    "status": "mismatch",
    "pattern": "output stride",
    "targets": ["cpu", "cuda-emu"],
    "ops": ["roll"],
}
# What was wrong, in words (fixed: the test passes).
REASON = "roll of a channels-last input returns a contiguous result; eager keeps channels-last"


def fn(a):
    v0 = a.roll(2, 2)
    return (v0,)


def make_inputs():
    gen = torch.Generator()
    a = torch.randn(1, 2, 4, 1, generator=gen.manual_seed(5260)).to(
        memory_format=torch.channels_last
    )
    return (a,)


@pytest.mark.parametrize("target", ["cpu", "cuda-emu"])
def test_fuzz_a6b180d1(target):
    check_against_eager(fn, make_inputs, target=target, dynamic=False, backward=False)
