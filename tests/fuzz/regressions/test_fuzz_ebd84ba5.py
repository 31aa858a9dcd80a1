"""Fuzzer finding ebd84ba5: mismatch on cpu, cuda-emu.

Found by `python -m minicomp.fuzz` (seed 8430, under an earlier op table) and shrunk to this
program.
"""

import pytest
import torch

from minicomp.fuzz.check import check_against_eager

# The fuzzer's CI run takes a finding that matches this for this one, not a new one.
SIGNATURE = {
    "status": "mismatch",
    "pattern": "output values",
    "targets": ["cpu", "cuda-emu"],
    "ops": ["vector_norm"],
}
# What was wrong, in words (fixed: the test passes).
REASON = (
    "vector_norm with ord=3 of an empty tensor was -inf (the largest |x| of no elements, max's "
    "identity, taken as an infinite scale); eager gives 0"
)


def fn(a):
    v0 = torch.linalg.vector_norm(a, ord=3, dim=(0, 1))
    return (v0,)


def make_inputs():
    gen = torch.Generator()
    a = torch.randn(0, 1, generator=gen.manual_seed(23547))
    return (a,)


@pytest.mark.parametrize("target", ["cpu", "cuda-emu"])
def test_fuzz_ebd84ba5(target):
    check_against_eager(fn, make_inputs, target=target, dynamic=False, backward=False)
