"""Fuzzer finding 5250963d: mismatch on cpu, cuda-emu.

Found by `python -m minicomp.fuzz` (seed 2191) and shrunk to this program.
"""

import pytest
import torch

from minicomp.fuzz.check import check_against_eager

# The fuzzer's CI run takes a finding that matches this for this one, not a new one.
# ops: masked_fill_ alone, the one op that loses the layout, whatever comes before it.
SIGNATURE = {
    "status": "mismatch",
    "pattern": "output stride",
    "targets": ["cpu", "cuda-emu"],
    "ops": ["masked_fill_"],
}
# Why the test fails: what is wrong, in words.
REASON = (
    "PyTorch, not minicomp (aot_eager too): masked_fill_ on a non-contiguous value (here the "
    "channels-last result of a != b) comes back contiguous; eager keeps its layout"
)


def fn(a, b, c):
    v0 = a != b
    v1 = v0.masked_fill_(c, 1)
    return (v1,)


def make_inputs():
    gen = torch.Generator()
    a = torch.randn(1, 2, 1, 2, generator=gen.manual_seed(58926)).to(
        memory_format=torch.channels_last
    )
    b = torch.randn(1, generator=gen.manual_seed(10013))
    c = torch.randint(0, 2, (1,), generator=gen.manual_seed(672)).bool()
    return a, b, c


@pytest.mark.xfail(strict=True, raises=AssertionError, reason=REASON)
@pytest.mark.parametrize("target", ["cpu", "cuda-emu"])
def test_fuzz_5250963d(target):
    check_against_eager(fn, make_inputs, target=target, dynamic=False, backward=False)
