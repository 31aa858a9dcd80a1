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


def slices_of_a_literal():
    pair = torch.tensor([1.0, 2.0, 3.0])[:2]
    second = pair[1]
    pair[0] = 0.5
    return pair, second


def scale_first_shift_second(a, b):
    a.mul_(2)
    return b + 1


def test_aliased_outputs_can_be_written_by_another_compiled_function(target):
    # Eager's two slices are views of one base; AOTAutograd refuses aliased inputs a graph
    # writes into whose ._base differ, so the compiled outputs must share theirs too.
    a, b = compile_minicomp(slices_of_a_literal, target)()
    ea, eb = slices_of_a_literal()
    assert_same((a, b), (ea, eb))
    written = compile_minicomp(scale_first_shift_second, target)(a, b)
    assert_same(written, scale_first_shift_second(ea, eb))
    assert_same((a, b), (ea, eb))


def test_outputs_of_separate_tensors_stay_separate(target):
    def two_results(x):
        return x + 1, x * 2

    x = torch.randn(3, 4)
    a, b = compile_minicomp(two_results, target)(x)
    assert a.untyped_storage().data_ptr() != b.untyped_storage().data_ptr()


def last_chunk(x):
    return x.chunk(3, dim=0)[-1]


def last_column_flattened(x):
    return x.select(3, -1).flatten(1, 2)


def first_unbound_flattened(x):
    return x.unbind(3)[0].flatten(1, 2)


def middle_columns(x):
    return x.narrow(1, 1, 2)


def transposed_tail(x):
    return x[1:].t()


# Each view of an input with the shapes it is called at (size-1 dims as the fuzzer found).
INPUT_VIEWS = [
    (last_chunk, [(2, 1), (5, 3)]),
    (last_column_flattened, [(1, 1, 2, 2), (1, 1, 3, 3)]),
    (first_unbound_flattened, [(1, 1, 2, 1), (1, 1, 4, 1)]),
    (middle_columns, [(5, 4), (7, 6)]),
    (transposed_tail, [(5, 4), (7, 6)]),
]


@pytest.mark.parametrize("sliced", [False, True], ids=["whole", "sliced"])
@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("fn, shapes", INPUT_VIEWS, ids=[f.__name__ for f, _ in INPUT_VIEWS])
def test_a_view_of_an_input_is_that_view_of_it(fn, shapes, dynamic, sliced, target):
    """AOTAutograd rebuilds an output aliasing an input by as_strided of the input with the
    compiled output's size, stride and storage offset when the views' arguments are symbolic:
    the compiled output must be at eager's offset into the input, not at offset 0."""
    compiled = compile_minicomp(fn, target, dynamic=dynamic)
    for shape in shapes:
        # `sliced`: the input itself starts past its storage's start, with gaps in its rows.
        base = torch.randn(*shape[:-1], 2 * shape[-1] + 1)
        x, x_eager = (
            base.clone()[..., 1::2] if sliced else base.clone()[..., : shape[-1]] for _ in range(2)
        )
        out, expected = compiled(x), fn(x_eager)
        assert_same(out, expected)
        assert out.storage_offset() == expected.storage_offset()
        # A write through the output lands where eager's does.
        out.fill_(123.0)
        expected.fill_(123.0)
        assert torch.equal(x, x_eager)
