"""Outputs have eager's strides where PyTorch's fake tensors lay them out otherwise: pointwise
ops whose fake implementations compose others (copysign, floor division), index, batch norm,
and decompositions that change the layout (roll, masked_fill); values computed from such a
result follow."""

import random

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_same, clone_inputs, compile_minicomp

from minicomp.dynamo.eager_strides import tensor_iterator_strides

aten = torch.ops.aten


def _random_layout(shape, rng):
    """A tensor of `shape` stored in a random dimension order, sometimes strided."""
    order = list(range(len(shape)))
    rng.shuffle(order)
    stored = [shape[d] for d in order]
    if rng.random() < 0.25:
        t = torch.randn([2 * d for d in stored])[tuple(slice(None, None, 2) for _ in stored)]
    else:
        t = torch.randn(stored)
    return t.permute([order.index(d) for d in range(len(shape))])


def _broadcastable(shape, rng):
    kept = shape[len(shape) - rng.randint(0, len(shape)) :]
    return [1 if rng.random() < 0.3 else d for d in kept]


POINTWISE = {
    "add": lambda a, b: (aten.add.Tensor(a, b), [a, b]),
    "copysign": lambda a, b: (aten.copysign.Tensor(a, b), [a, b]),
    "div_floor": lambda a, b: (aten.div.Tensor_mode(a, b, rounding_mode="floor"), [a, b]),
    "where": lambda a, b: (aten.where.self(a > 0, a, b), [a > 0, a, b]),
    "addcmul": lambda a, b: (aten.addcmul.default(a, b, a), [a, b, a]),
    "abs": lambda a, b: (aten.abs.default(a), [a]),
}


@pytest.mark.parametrize("name", sorted(POINTWISE))
def test_tensor_iterator_strides_are_eagers(name):
    rng = random.Random(name)
    for _ in range(200):
        shape = [rng.choice([1, 1, 2, 3]) for _ in range(rng.randint(1, 5))]
        a = _random_layout(shape, rng)
        b = (
            _random_layout(_broadcastable(shape, rng), rng)
            if rng.random() < 0.8
            else torch.tensor(0.5)
        )
        if rng.random() < 0.5:
            a, b = b, a
        try:
            out, inputs = POINTWISE[name](a, b)
        except RuntimeError:
            continue  # not broadcastable that way round
        want = list(out.stride())
        assert tensor_iterator_strides(out.shape, inputs) == want, [
            (tuple(t.shape), t.stride()) for t in inputs
        ]


CASES = {
    # Fake copysign is where(signbit(b), -|a|, |a|): row-major once b broadcasts a to 5-d.
    "copysign_broadcast": (
        lambda a, b: torch.copysign(a, b),
        lambda: (torch.randn(1, 2, 3, 2).permute(0, 2, 3, 1), torch.randn(1, 1, 1, 1, 1)),
    ),
    "floor_divide_by_0d": (
        lambda a, b: a // b,
        lambda: (torch.randn(2, 3, 4).permute(2, 1, 0), torch.tensor(1.5)),
    ),
    # Downstream of a corrected result: eager's relu keeps the division's layout.
    "after_floor_divide": (
        lambda a, b: ((a // b).relu() + 1,),
        lambda: (torch.randn(2, 3, 4).permute(2, 1, 0), torch.tensor(1.5)),
    ),
    "index_permuted": (
        lambda a, i: a[:, i],
        lambda: (torch.randn(3, 1, 4).permute(2, 0, 1), torch.tensor([0, 2, 1, 0, 2])),
    ),
    "index_permuted_uint8": (
        lambda a, i: a[:, i],
        lambda: (
            torch.randint(0, 9, (1, 2, 1), dtype=torch.uint8).permute(2, 0, 1),
            torch.tensor([0, 0]),
        ),
    ),
    "batch_norm_eval_transposed": (
        lambda a, m, v: F.batch_norm(a, m, v.abs() + 0.5, training=False),
        lambda: (torch.randn(5, 3).t(), torch.randn(5), torch.randn(5)),
    ),
    "batch_norm_eval_channels_last": (
        lambda a, m, v: F.batch_norm(a, m, v.abs() + 0.5, training=False),
        lambda: (
            torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last),
            torch.randn(3),
            torch.randn(3),
        ),
    ),
    # roll decomposes to index_select (row-major); eager's kernel is empty_like(self).
    "roll_channels_last": (
        lambda a: a.roll(2, 2),
        lambda: (torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last),),
    ),
    "roll_transposed": (lambda a: a.roll(1, 0), lambda: (torch.randn(4, 3).t(),)),
    # masked_fill decomposes to a where laid out like self; eager's result is contiguous.
    "masked_fill_transposed": (
        lambda a, m: a.masked_fill(m, 0.0),
        lambda: (torch.randn(4, 3).t(), torch.randn(4) > 0),
    ),
}


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("case", sorted(CASES))
def test_outputs_have_eagers_strides(case, dynamic, target):
    fn, make_inputs = CASES[case]
    compiled = compile_minicomp(fn, target, dynamic=dynamic)
    inputs = make_inputs()
    assert_same(compiled(*clone_inputs(inputs)), fn(*inputs))
