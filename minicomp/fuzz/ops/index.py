"""Indexing ops: index_select, gather, embedding, advanced indexing, index_add, scatter_add,
index_put; their indices are literals or index inputs within bounds."""

from __future__ import annotations

import torch

from minicomp.fuzz.ops.draw import Draw, is_float
from minicomp.fuzz.ops.table import op
from minicomp.fuzz.program import Index, Ref, Slice, TensorLiteral


def _indices(d: Draw, size: int, *, unique: bool = False) -> TensorLiteral:
    if size == 0:
        return TensorLiteral(())
    if unique:
        picked = d.rng.sample(range(size), d.rng.randint(1, size))
    else:
        picked = [d.rng.randrange(size) for _ in range(d.rng.randint(0, 4))]
    return TensorLiteral(tuple(picked))


@op("index_select", "index", "{0}.index_select({1}, {2})")
def _index_select(d: Draw):
    x = d.pick(lambda t: t.dim() >= 1)
    if x is None:
        return None
    dim = d.dim(x.tensor)
    return Ref(x.name), dim, _indices(d, x.tensor.shape[dim])


@op("gather", "index", "torch.gather({0}, {1}, {2})")
def _gather(d: Draw):
    x = d.pick(lambda t: t.dim() >= 1 and t.numel() > 0)
    if x is None:
        return None
    dim = d.dim(x.tensor)
    shape = tuple(
        d.rng.randint(1, s) if i != dim % x.tensor.dim() else d.rng.randint(0, 4)
        for i, s in enumerate(x.tensor.shape)
    )
    return Ref(x.name), dim, d.new_input(shape, torch.int64, high=x.tensor.shape[dim])


@op("embedding", "index", "F.embedding({0}, {1})")
def _embedding(d: Draw):
    weight = d.pick(lambda t: is_float(t) and t.dim() == 2 and t.shape[0] > 0)
    if weight is None or d.chance(0.3):
        rows = d.rng.randint(1, 8)
        dtype = d.choice([torch.float32, torch.float32, torch.float16])
        table = d.new_input((rows, d.rng.randint(1, 8)), dtype)
    else:
        table, rows = Ref(weight.name), weight.tensor.shape[0]
    index_shape = tuple(d.rng.randint(0, 4) for _ in range(d.rng.randint(1, 2)))
    return d.new_input(index_shape, torch.int64, high=rows), table


@op("index_tensor", "index", "{0}[{1}]")
def _index_tensor(d: Draw):
    x = d.pick(lambda t: t.dim() >= 1 and t.numel() > 0)
    if x is None:
        return None
    dim = d.rng.randrange(min(x.tensor.dim(), 2))
    index_shape = tuple(d.rng.randint(0, 3) for _ in range(d.rng.randint(1, 2)))
    index = d.new_input(index_shape, torch.int64, high=x.tensor.shape[dim])
    return Ref(x.name), Index((Slice(),) * dim + (index,))


def _addable_into(t: torch.Tensor) -> bool:
    return t.dim() >= 1 and t.numel() > 0 and t.dtype != torch.bool


@op("index_add", "index", "{0}.index_add({1}, {2}, {3})")
def _index_add(d: Draw):
    x = d.pick(_addable_into)
    if x is None:
        return None
    dim = d.dim(x.tensor)
    index = _indices(d, x.tensor.shape[dim])
    shape = list(x.tensor.shape)
    shape[dim] = len(index.values)
    return Ref(x.name), dim, index, d.new_input(tuple(shape), x.tensor.dtype)


@op("scatter_add", "index", "{0}.scatter_add({1}, {2}, {3})")
def _scatter_add(d: Draw):
    x = d.pick(_addable_into)
    if x is None:
        return None
    dim = d.dim(x.tensor)
    shape = tuple(d.rng.randint(1, s) for s in x.tensor.shape)
    index = d.new_input(shape, torch.int64, high=x.tensor.shape[dim])
    return Ref(x.name), dim, index, d.new_input(shape, x.tensor.dtype)


@op("index_put", "index", "{0}.index_put(({1},), {2}, accumulate={3})")
def _index_put(d: Draw):
    x = d.pick(lambda t: t.dim() >= 1 and t.numel() > 0)
    if x is None:
        return None
    accumulate = d.chance(0.5) and x.tensor.dtype != torch.bool
    # Without accumulate, a repeated index writes in an unspecified order: keep them unique.
    index = _indices(d, x.tensor.shape[0], unique=not accumulate)
    value_shape = d.broadcast_shape_for((len(index.values), *x.tensor.shape[1:]))
    return Ref(x.name), index, d.new_input(value_shape, x.tensor.dtype), accumulate
