"""Fuzzer finding a1c6d46d: mismatch on cpu, cuda-emu.

Found by `python -m minicomp.fuzz` (seed 20520) and shrunk to this program.
"""

import pytest
import torch

from minicomp.fuzz.check import check_against_eager

# The fuzzer's CI run takes a finding that matches this for this one, not a new one.
SIGNATURE = {
    "status": "mismatch",
    "pattern": "input values",
    "targets": ["cpu", "cuda-emu"],
    "ops": ["mul_"],
}
# Why the test fails: what is wrong, in words.
REASON = (
    "PyTorch, not minicomp (aot_eager too): a.mul_(-2) of a 0-d float64 input whose result is "
    "unused is lost; a float32 or 1-d input keeps it"
)


def fn(a, b):
    a.mul_(-2)
    return (b,)


def make_inputs():
    gen = torch.Generator()
    a = torch.randn((), dtype=torch.float64, generator=gen.manual_seed(37979))
    b = torch.randn(1, generator=gen.manual_seed(7921))
    return a, b


@pytest.mark.xfail(strict=True, raises=AssertionError, reason=REASON)
@pytest.mark.parametrize("target", ["cpu", "cuda-emu"])
def test_fuzz_a1c6d46d(target):
    check_against_eager(fn, make_inputs, target=target, dynamic=False, backward=False)
