"""Fuzzer finding 65299c88: mismatch on cpu, cuda-emu.

Found by `python -m minicomp.fuzz` (seed 2099) and shrunk to this program.
"""

import pytest
import torch

from minicomp.fuzz.check import check_against_eager

# The fuzzer's CI run takes a finding that matches this for this one, not a new one.
SIGNATURE = {
    "status": "mismatch",
    "pattern": "output values",
    "targets": ["cpu", "cuda-emu"],
    "ops": ["chunk"],
}
# What was wrong, in words (fixed: the test passes).
REASON = (
    "dynamic=True: x.chunk(3, dim=0)[-1] returns the first chunk, not the last (the view's storage "
    "offset is lost)"
)


def fn(a):
    v0 = a.chunk(3, dim=0)[-1]
    return (v0,)


def make_inputs():
    gen = torch.Generator()
    a = torch.randint(-4, 5, (2, 1), dtype=torch.int32, generator=gen.manual_seed(36636))
    return (a,)


@pytest.mark.parametrize("target", ["cpu", "cuda-emu"])
def test_fuzz_65299c88(target):
    check_against_eager(fn, make_inputs, target=target, dynamic=True, backward=False)
