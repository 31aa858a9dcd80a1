"""Outputs that share memory in eager share it compiled: a write through one is seen through
the others, as in eager."""

import pytest
import torch
from helpers import assert_same, compile_minicomp


def view_beside_its_base(x):
    y = x + 1
    return y, y.view(-1)


def two_overlapping_slices(x):
    y = x.exp()
    return y[:, :3], y[:, 2:]


def transpose_and_row(x):
    y = x * 2
    return y.t(), y[1]


def split_pieces(x):
    return torch.split(x.sin(), 2, dim=0)


CASES = [view_beside_its_base, two_overlapping_slices, transpose_and_row, split_pieces]


def _shares_like_eager(outs, expected) -> None:
    """Writing into each output changes the other outputs exactly where eager's do."""
    for k in range(len(outs)):
        outs_before = [o.clone() for o in outs]
        eager_before = [e.clone() for e in expected]
        outs[k].fill_(123.0)
        expected[k].fill_(123.0)
        for o, ob, e, eb in zip(outs, outs_before, expected, eager_before):
            assert torch.equal(o != ob, e != eb)


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("fn", CASES)
def test_outputs_sharing_memory_in_eager_share_it_compiled(fn, dynamic, target):
    x = torch.randn(4, 5)
    expected = fn(x)
    outs = compile_minicomp(fn, target, dynamic=dynamic)(x)
    assert_same(outs, expected)
    for o, e in zip(outs, expected):
        assert o.storage_offset() == e.storage_offset()
    _shares_like_eager(list(outs), list(expected))


def test_outputs_of_separate_tensors_stay_separate(target):
    def two_results(x):
        return x + 1, x * 2

    x = torch.randn(3, 4)
    a, b = compile_minicomp(two_results, target)(x)
    assert a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr()
