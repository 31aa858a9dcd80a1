"""Fuzzer finding 5ac6be8e: mismatch on cuda-emu.

Found by `python -m minicomp.fuzz` (seed 6131) and shrunk to this program.
"""

import pytest
import torch

from minicomp.fuzz.check import check_against_eager

# The fuzzer's CI run takes a finding that matches this for this one, not a new one.
SIGNATURE = {
    "status": "mismatch",
    "pattern": "output values",
    "targets": ["cuda-emu"],
    "ops": ["min_indices"],
}
# What was wrong, in words (fixed: the test passes).
REASON = (
    "cuda-emu, dynamic=True: min(dim=0).indices over int64 columns returned 0 where the minimum is "
    "at 1 (as argmin in f1ee86ba: value and index shared one shared array)"
)


def fn(a):
    v0 = a.min(dim=0, keepdim=True).indices
    return (v0,)


def make_inputs():
    gen = torch.Generator()
    a = torch.randint(0, 5, (2, 2), generator=gen.manual_seed(50500))
    return (a,)


@pytest.mark.parametrize("target", ["cuda-emu"])
def test_fuzz_5ac6be8e(target):
    check_against_eager(fn, make_inputs, target=target, dynamic=True, backward=False)
