"""Fuzzer finding 878f6e30: mismatch on cuda-emu.

Found by `python -m minicomp.fuzz` (seed 20185) and shrunk to this program.
"""

import pytest
import torch

from minicomp.fuzz.check import check_against_eager

# The fuzzer's CI run takes a finding that matches this for this one, not a new one.
SIGNATURE = {
    "status": "mismatch",
    "pattern": "output values",
    "targets": ["cuda-emu"],
    "ops": ["argmax_all"],
}
# What was wrong, in words (fixed: the test passes).
REASON = (
    "cuda-emu, dynamic=True: argmax of a whole int64 tensor whose maximum is at several places "
    "returned a later one (35), not the first (10) (as argmin in f1ee86ba)"
)


def fn(a):
    v0 = a.argmax()
    return (v0,)


def make_inputs():
    gen = torch.Generator()
    a = torch.randint(-4, 5, (6, 8), generator=gen.manual_seed(22915))
    return (a,)


@pytest.mark.parametrize("target", ["cuda-emu"])
def test_fuzz_878f6e30(target):
    check_against_eager(fn, make_inputs, target=target, dynamic=True, backward=False)
