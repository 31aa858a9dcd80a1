"""Creation ops combined with a value in scope: *_like, arange, full."""

from __future__ import annotations

from minicomp.fuzz.ops.draw import Draw, is_bool
from minicomp.fuzz.ops.table import op
from minicomp.fuzz.program import Ref


@op("zeros_like", "creation", "torch.zeros_like({0})")
def _zeros_like(d: Draw):
    return d.one()


@op("ones_like_add", "creation", "{0} + torch.ones_like({0})")
def _ones_like_add(d: Draw):
    return d.one(lambda t: not is_bool(t))


@op("full_like", "creation", "torch.full_like({0}, {1})")
def _full_like(d: Draw):
    x = d.pick()
    return None if x is None else (Ref(x.name), d.scalar(x.tensor))


@op("arange_add", "creation", "{0} + torch.arange({1})")
def _arange_add(d: Draw):
    x = d.pick(lambda t: t.dim() >= 1 and not is_bool(t))
    return None if x is None else (Ref(x.name), x.tensor.shape[-1])


@op("arange_mul", "creation", "{0} * torch.arange({1}, dtype={2}).view({3})")
def _arange_mul(d: Draw):
    x = d.pick(lambda t: t.dim() >= 2 and t.is_floating_point())
    if x is None:
        return None
    dim = d.rng.randrange(x.tensor.dim())
    shape = tuple(-1 if i == dim else 1 for i in range(x.tensor.dim()))
    return Ref(x.name), x.tensor.shape[dim], x.tensor.dtype, shape
