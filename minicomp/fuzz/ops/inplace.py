"""In-place ops: arithmetic (add_, mul_...), activations (relu_...), fills, copy_ and
assignment into a slice; on intermediates, on inputs and on views of either."""

from __future__ import annotations

import torch

from minicomp.fuzz.ops.draw import Draw, is_bool, is_float
from minicomp.fuzz.ops.shape import draw_slice
from minicomp.fuzz.ops.table import op
from minicomp.fuzz.program import Index, Ref


def _mutable(t: torch.Tensor) -> bool:
    """Eager lets t be written in place: not a leaf that requires grad, nor a view of one,
    nor a tensor with overlapping memory (an expanded input)."""
    base = t._base if t._base is not None else t
    if base.requires_grad and base.is_leaf:
        return False
    return all(stride != 0 or size <= 1 for stride, size in zip(t.stride(), t.shape))


ARITHMETIC = {
    "add_": "{0}.add_({1})",
    "sub_": "{0}.sub_({1})",
    "mul_": "{0}.mul_({1})",
    "div_": "{0}.div_({1})",
}
UNARY = {
    "relu_": "{0}.relu_()",
    "neg_": "{0}.neg_()",
    "sigmoid_": "{0}.sigmoid_()",
    "exp_": "torch.exp_({0})",
    "zero_": "{0}.zero_()",
}

for _name, _template in ARITHMETIC.items():

    def _arithmetic(d: Draw, name=_name):
        x = d.pick(lambda t: _mutable(t) and not is_bool(t) and (is_float(t) or name != "div_"))
        return None if x is None else (Ref(x.name), d.operand(x, into=True))

    op(_name, "inplace", _template)(_arithmetic)

for _name, _template in UNARY.items():

    def _unary(d: Draw, name=_name):
        return d.one(lambda t: _mutable(t) and (is_float(t) or name in ("relu_", "zero_", "neg_")))

    op(_name, "inplace", _template)(_unary)


@op("clamp_", "inplace", "{0}.clamp_({1}, {2})")
def _clamp_(d: Draw):
    x = d.pick(lambda t: _mutable(t) and not is_bool(t))
    return None if x is None else (Ref(x.name), d.choice([-1, 0]), d.choice([1, 2]))


@op("fill_", "inplace", "{0}.fill_({1})")
def _fill_(d: Draw):
    x = d.pick(_mutable)
    return None if x is None else (Ref(x.name), d.scalar(x.tensor))


@op("copy_", "inplace", "{0}.copy_({1})")
def _copy_(d: Draw):
    x = d.pick(_mutable)
    return None if x is None else (Ref(x.name), d.partner(x, into=True))


@op("masked_fill_", "inplace", "{0}.masked_fill_({1}, {2})")
def _masked_fill_(d: Draw):
    x = d.pick(_mutable)
    if x is None:
        return None
    mask = d.new_input(d.broadcast_shape_for(tuple(x.tensor.shape)), torch.bool)
    return Ref(x.name), mask, d.scalar(x.tensor)


@op("narrow_copy_", "inplace", "{0}.narrow({1}, {2}, {3}).copy_({4})")
def _narrow_copy_(d: Draw):
    x = d.pick(lambda t: _mutable(t) and t.dim() >= 1)
    if x is None:
        return None
    dim = d.dim(x.tensor)
    size = x.tensor.shape[dim]
    start = d.rng.randint(0, size)
    length = d.rng.randint(0, size - start)
    shape = list(x.tensor.shape)
    shape[dim] = length
    source = d.new_input(d.broadcast_shape_for(tuple(shape)), x.tensor.dtype)
    return Ref(x.name), dim, start, length, source


@op("setitem", "inplace", "{0}[{1}] = {2}", statement=True)
def _setitem(d: Draw):
    x = d.pick(lambda t: _mutable(t) and t.dim() >= 1)
    if x is None:
        return None
    sizes = x.tensor.shape[: d.rng.randint(1, x.tensor.dim())]
    items = tuple(draw_slice(d, size) for size in sizes)
    view_shape = tuple(x.tensor[tuple(slice(s.start, s.stop, s.step) for s in items)].shape)
    if d.chance(0.4):
        value = d.scalar(x.tensor)
    else:
        value = d.new_input(d.broadcast_shape_for(view_shape), x.tensor.dtype)
    return Ref(x.name), Index(items), value
