"""Fuzzer finding fc063808: mismatch on cpu, cuda-emu.

Found by `python -m minicomp.fuzz` (seed 2168) and shrunk to this program.
"""

import pytest
import torch

from minicomp.fuzz.check import check_against_eager

# The fuzzer's CI run takes a finding that matches this for this one, not a new one.
SIGNATURE = {
    "status": "mismatch",
    "pattern": "output values",
    "targets": ["cpu", "cuda-emu"],
    "ops": ["flatten", "unbind"],
}
# What was wrong, in words (fixed: the test passes).
REASON = (
    "dynamic=True: flatten/reshape of an input with a storage offset (a[:, 1::2]) reads from "
    "offset 0"
)


def fn(a):
    v0 = a.unbind(3)[0]
    v1 = v0.flatten(1, 2)
    return (v1,)


def make_inputs():
    gen = torch.Generator()
    a = torch.randint(-4, 5, (1, 1, 4, 1), dtype=torch.int32, generator=gen.manual_seed(44429))[
        ::3, :, 1::2
    ]
    return (a,)


@pytest.mark.parametrize("target", ["cpu", "cuda-emu"])
def test_fuzz_fc063808(target):
    check_against_eager(fn, make_inputs, target=target, dynamic=True, backward=False)
