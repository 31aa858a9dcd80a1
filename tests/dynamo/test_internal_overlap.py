"""In-place writes to a tensor whose elements share memory: those eager refuses raise eager's
RuntimeError, where AOTAutograd's functional graph would perform them; those eager performs
give eager's result."""

import pytest
import torch
from helpers import assert_same, clone_inputs, compile_minicomp

import minicomp


def add_into_broadcast_input(x):
    return x.expand(3, 3).add_(1)


def relu_into_broadcast_intermediate(x):
    y = x * 2
    torch.relu_(y.expand(4, 3))
    return y


def write_a_broadcast_column(x):
    y = x + 1
    y.expand(3, 3)[:, 0] = 5
    return y


def random_fill_of_a_broadcast(x):
    x.expand(2, 3).normal_()
    return x


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize(
    "fn",
    [
        add_into_broadcast_input,
        relu_into_broadcast_intermediate,
        write_a_broadcast_column,
        random_fill_of_a_broadcast,
    ],
)
def test_overlapping_in_place_write_raises_like_eager(fn, dynamic, target):
    x = torch.randn(3)
    with pytest.raises(RuntimeError, match="more than one element of the written-to"):
        fn(x.clone())
    with pytest.raises(RuntimeError) as compiled:
        compile_minicomp(fn, target, dynamic=dynamic)(x.clone())
    # Dynamo itself raises for a random fill, wrapping eager's message in its own.
    assert "more than one element of the written-to tensor" in str(compiled.value)


def test_a_write_to_a_row_of_a_broadcast_compiles(target):
    def add_to_a_row(x):
        y = x * 2
        y.expand(3, 3)[0].add_(1)  # a row of the broadcast has no repeated element
        return y + x

    x = torch.randn(3)
    assert_same(compile_minicomp(add_to_a_row, target)(*clone_inputs((x,))), add_to_a_row(x))


@pytest.mark.parametrize("write", ["fill_", "zero_"])
def test_a_write_eager_performs_on_a_broadcast_runs_eagerly_with_a_warning(write, target):
    def write_a_broadcast(x):
        y = x * 2
        getattr(y.expand(3, 3), write)(*([1.0] if write == "fill_" else []))
        return y + x

    x = torch.randn(3)
    torch._dynamo.reset()
    compiled = torch.compile(write_a_broadcast, backend="minicomp", options={"target": target})
    with pytest.warns(minicomp.FallbackWarning, match=f"{write}.* writes to a broadcast view"):
        got = compiled(*clone_inputs((x,)))
    assert_same(got, write_a_broadcast(x))
