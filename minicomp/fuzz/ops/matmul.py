"""Matrix products: matmul (@) over ranks 1 to 4, mm, bmm, linear with and without bias,
addmm; the second operand is drawn to fit the first."""

from __future__ import annotations

from minicomp.fuzz.ops.draw import Draw, Value, is_float
from minicomp.fuzz.ops.table import op
from minicomp.fuzz.program import Ref


def _operand(d: Draw, x: Value, shape: tuple[int, ...]) -> Ref:
    found = d.pick(lambda t: tuple(t.shape) == shape and t.dtype == x.tensor.dtype)
    if found is not None and d.chance(0.5):
        return Ref(found.name)
    return d.new_input(shape, x.tensor.dtype)


def _size(d: Draw) -> int:
    return d.choice([1, 2, 3, 4, 5, 8, 16, 0])


@op("matmul", "matmul", "{0} @ {1}")
def _matmul(d: Draw):
    x = d.pick(lambda t: is_float(t) and 1 <= t.dim() <= 4)
    if x is None:
        return None
    shape = tuple(x.tensor.shape)
    k = shape[-1]
    rank = d.choice([1, 2, 2, 3])
    if rank == 1:
        other = (k,)
    elif rank == 2:
        other = (k, _size(d))
    else:
        batch = shape[-3] if len(shape) >= 3 and d.chance(0.7) else d.choice([1, 2])
        other = (batch, k, _size(d))
    return Ref(x.name), _operand(d, x, other)


@op("mm", "matmul", "torch.mm({0}, {1})")
def _mm(d: Draw):
    x = d.pick(lambda t: is_float(t) and t.dim() == 2)
    if x is None:
        return None
    return Ref(x.name), _operand(d, x, (x.tensor.shape[1], _size(d)))


@op("bmm", "matmul", "torch.bmm({0}, {1})")
def _bmm(d: Draw):
    x = d.pick(lambda t: is_float(t) and t.dim() == 3)
    if x is None:
        return None
    b, _, k = x.tensor.shape
    return Ref(x.name), _operand(d, x, (b, k, _size(d)))


@op("linear", "matmul", "F.linear({0}, {1}, {2})")
def _linear(d: Draw):
    x = d.pick(lambda t: is_float(t) and t.dim() >= 1)
    if x is None:
        return None
    n = _size(d)
    weight = _operand(d, x, (n, x.tensor.shape[-1]))
    bias = _operand(d, x, (n,)) if d.chance(0.6) else None
    return Ref(x.name), weight, bias


@op("addmm", "matmul", "torch.addmm({2}, {0}, {1}, beta={3}, alpha={4})")
def _addmm(d: Draw):
    x = d.pick(lambda t: is_float(t) and t.dim() == 2)
    if x is None:
        return None
    n = _size(d)
    other = _operand(d, x, (x.tensor.shape[1], n))
    bias = _operand(d, x, d.choice([(n,), (1, n), (x.tensor.shape[0], n)]))
    return Ref(x.name), other, bias, d.choice([1, 0.5]), d.choice([1, 2])
