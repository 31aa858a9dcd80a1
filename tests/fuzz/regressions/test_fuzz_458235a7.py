"""Fuzzer finding 458235a7: error on cpu, cuda-emu.

Found by `python -m minicomp.fuzz` (seed 6880) and shrunk to this program.
"""

import pytest
import torch

from minicomp.fuzz.check import check_against_eager

# The fuzzer's CI run takes a finding that matches this for this one, not a new one.
SIGNATURE = {
    "status": "error",
    "pattern": "ZeroDivisionError: integer division or modulo by zero",
    "targets": ["cpu", "cuda-emu"],
    "ops": ["reshape"],
}
# What was wrong, in words (fixed: the test passes).
REASON = (
    "dynamic=True: reshape((22, -1, 6)) of a (1, 33, 4) bool tensor raises ZeroDivisionError in "
    "the importer's size check (ir/symbols.py evaluate_dim)"
)


def fn(a):
    v0 = a.reshape((22, -1, 6))
    return (v0,)


def make_inputs():
    gen = torch.Generator()
    a = torch.randint(0, 2, (1, 33, 4), generator=gen.manual_seed(7919)).bool()
    return (a,)


@pytest.mark.parametrize("target", ["cpu", "cuda-emu"])
def test_fuzz_458235a7(target):
    check_against_eager(fn, make_inputs, target=target, dynamic=True, backward=False)
