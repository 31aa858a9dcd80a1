"""Fuzzer finding 04a83717: mismatch on cpu, cuda-emu.

Found by `python -m minicomp.fuzz` (seed 4653) and shrunk to this program.
"""

import pytest
import torch

from minicomp.fuzz.check import check_against_eager

# The fuzzer's CI run takes a finding that matches this for this one, not a new one.
SIGNATURE = {
    "status": "mismatch",
    "pattern": "output values",
    "targets": ["cpu", "cuda-emu"],
    "ops": ["flatten", "select"],
}
# What was wrong, in words (fixed: the test passes).
REASON = (
    "dynamic=True: x.select(3, -1).flatten(1, 2) reads from offset 0 instead of the view's storage "
    "offset (as in fc063808)"
)


def fn(a):
    v0 = a.select(3, -1)
    v1 = v0.flatten(1, 2)
    return (v1,)


def make_inputs():
    gen = torch.Generator()
    a = torch.randint(-4, 5, (1, 1, 2, 2), generator=gen.manual_seed(30959))
    return (a,)


@pytest.mark.parametrize("target", ["cpu", "cuda-emu"])
def test_fuzz_04a83717(target):
    check_against_eager(fn, make_inputs, target=target, dynamic=True, backward=False)
