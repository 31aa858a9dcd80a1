"""Fuzzer finding 2b1680e9: mismatch on cpu, cuda-emu.

Found by `python -m minicomp.fuzz` (seed 10) and shrunk to this program.
"""

import pytest
import torch

from minicomp.fuzz.check import check_against_eager

# The fuzzer's CI run takes a finding that matches this for this one, not a new one.
SIGNATURE = {
    "status": "mismatch",
    "pattern": "output stride",
    "targets": ["cpu", "cuda-emu"],
    "ops": ["floor_divide"],
}
# What was wrong, in words (fixed: the test passes).
REASON = (
    "a // b with b a 0-d tensor returns a contiguous result for a permuted a; eager keeps a's "
    "layout (a // 2 does)"
)


def fn(a, b):
    v0 = a // b
    return (v0,)


def make_inputs():
    gen = torch.Generator()
    a = torch.randn(2, 2, 1, generator=gen.manual_seed(47525)).permute(2, 1, 0)
    b = torch.randint(0, 2, (), generator=gen.manual_seed(7919)).bool()
    return a, b


@pytest.mark.parametrize("target", ["cpu", "cuda-emu"])
def test_fuzz_2b1680e9(target):
    check_against_eager(fn, make_inputs, target=target, dynamic=False, backward=False)
