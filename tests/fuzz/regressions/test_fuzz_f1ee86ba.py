"""Fuzzer finding f1ee86ba: mismatch on cuda-emu.

Found by `python -m minicomp.fuzz` (seed 1195) and shrunk to this program.
"""

import pytest
import torch

from minicomp.fuzz.check import check_against_eager

# The fuzzer's CI run takes a finding that matches this for this one, not a new one.
SIGNATURE = {
    "status": "mismatch",
    "pattern": "output values",
    "targets": ["cuda-emu"],
    "ops": ["argmin"],
}
# What was wrong, in words (fixed: the test passes).
REASON = (
    "cuda-emu, dynamic=True: argmin over an int64 row returned 0 where the minimum is at 1: the "
    "block reduction kept an int64 value and its int64 index in one shared array"
)


def fn(a):
    v0 = torch.argmin(a, dim=-1, keepdim=True)
    return (v0,)


def make_inputs():
    gen = torch.Generator()
    a = torch.randint(0, 5, (1, 2), generator=gen.manual_seed(43292))
    return (a,)


@pytest.mark.parametrize("target", ["cuda-emu"])
def test_fuzz_f1ee86ba(target):
    check_against_eager(fn, make_inputs, target=target, dynamic=True, backward=False)
