"""View and layout ops (view, reshape, permute, expand, slicing, select, squeeze...) and joins
(cat, stack)."""

from __future__ import annotations

import torch

from minicomp.fuzz.ops.draw import MAX_NUMEL, Draw, numel
from minicomp.fuzz.ops.table import op
from minicomp.fuzz.program import Index, ListOf, Ref, Slice


def _factor(n: int) -> list[int]:
    factors, p = [], 2
    while p * p <= n:
        while n % p == 0:
            factors.append(p)
            n //= p
        p += 1
    return factors + ([n] if n > 1 else [])


def _new_shape(d: Draw, t: torch.Tensor) -> tuple[int, ...]:
    """Another shape with t's number of elements, with a -1 now and then."""
    n = t.numel()
    if n == 0:
        shape = [0, *(d.choice([1, 2, 3]) for _ in range(d.rng.randint(0, 2)))]
        d.rng.shuffle(shape)
        return tuple(shape)
    rank = d.rng.randint(1, 4)
    shape = [1] * rank
    for f in _factor(n):
        shape[d.rng.randrange(rank)] *= f
    if d.chance(0.3):
        shape[d.rng.randrange(rank)] = -1
    return tuple(shape)


def _merge_or_split(d: Draw, t: torch.Tensor) -> tuple[int, ...]:
    """t's shape with two neighbouring dims merged or one dim split: a view of most layouts."""
    shape = list(t.shape)
    if len(shape) >= 2 and d.chance(0.5):
        i = d.rng.randrange(len(shape) - 1)
        shape[i : i + 2] = [shape[i] * shape[i + 1]]
        return tuple(shape)
    if not shape:
        return (1,)
    i = d.rng.randrange(len(shape))
    factors = _factor(shape[i]) if shape[i] > 1 else [1]
    first = d.choice(factors)
    shape[i : i + 1] = [first, shape[i] // first]
    return tuple(shape)


@op("view", "view", "{0}.view({1})")
def _view(d: Draw):
    x = d.pick()
    if x is None:
        return None
    shape = _merge_or_split(d, x.tensor) if d.chance(0.6) else _new_shape(d, x.tensor)
    return Ref(x.name), shape


@op("reshape", "view", "{0}.reshape({1})")
def _reshape(d: Draw):
    x = d.pick()
    return None if x is None else (Ref(x.name), _new_shape(d, x.tensor))


@op("permute", "view", "{0}.permute({1})")
def _permute(d: Draw):
    x = d.pick(lambda t: t.dim() >= 2)
    if x is None:
        return None
    perm = list(range(x.tensor.dim()))
    d.rng.shuffle(perm)
    return Ref(x.name), tuple(perm)


@op("transpose", "view", "{0}.transpose({1}, {2})")
@op("diagonal", "view", "{0}.diagonal(0, {1}, {2})")
def _two_dims(d: Draw):
    x = d.pick(lambda t: t.dim() >= 2)
    if x is None:
        return None
    a, b = d.rng.sample(range(x.tensor.dim()), 2)
    return Ref(x.name), a, b - x.tensor.dim() if d.chance(0.3) else b


@op("t", "view", "{0}.t()")
def _t(d: Draw):
    return d.one(lambda t: t.dim() <= 2)


@op("mT", "view", "{0}.mT")
def _mT(d: Draw):
    return d.one(lambda t: t.dim() >= 2)


@op("expand", "view", "{0}.expand({1})")
def _expand(d: Draw):
    x = d.pick(lambda t: 1 in t.shape or t.dim() < 3)
    if x is None:
        return None
    shape = [d.choice([2, 3, 4]) if s == 1 and d.chance(0.7) else -1 for s in x.tensor.shape]
    if d.chance(0.4) or all(s == -1 for s in shape):
        shape.insert(0, d.choice([1, 2, 3]))
    out = [s if s != -1 else x.tensor.shape[i - len(shape)] for i, s in enumerate(shape)]
    if numel(tuple(out)) > MAX_NUMEL:
        return None
    return Ref(x.name), tuple(shape)


@op("unsqueeze", "view", "{0}.unsqueeze({1})")
def _unsqueeze(d: Draw):
    x = d.pick(lambda t: t.dim() < 6)
    if x is None:
        return None
    return Ref(x.name), d.rng.randint(-x.tensor.dim() - 1, x.tensor.dim())


@op("squeeze_dim", "view", "{0}.squeeze({1})")
def _squeeze_dim(d: Draw):
    x = d.pick(lambda t: 1 in t.shape)
    if x is None:
        return None
    ones = [i for i, s in enumerate(x.tensor.shape) if s == 1]
    return Ref(x.name), d.choice(ones) if d.chance(0.8) else d.dim(x.tensor)


@op("squeeze", "view", "{0}.squeeze()")
def _squeeze(d: Draw):
    return d.one(lambda t: 1 in t.shape)


@op("flatten", "view", "{0}.flatten({1}, {2})")
def _flatten(d: Draw):
    x = d.pick(lambda t: t.dim() >= 2)
    if x is None:
        return None
    start = d.rng.randrange(x.tensor.dim() - 1)
    return Ref(x.name), start, d.rng.randint(start + 1, x.tensor.dim() - 1)


@op("narrow", "view", "{0}.narrow({1}, {2}, {3})")
def _narrow(d: Draw):
    x = d.pick(lambda t: t.dim() >= 1)
    if x is None:
        return None
    dim = d.dim(x.tensor)
    size = x.tensor.shape[dim]
    start = d.rng.randint(0, size)
    return Ref(x.name), dim, start, d.rng.randint(0, size - start)


@op("select", "view", "{0}.select({1}, {2})")
def _select(d: Draw):
    x = d.pick(lambda t: t.dim() >= 1 and t.numel() > 0)
    if x is None:
        return None
    dim = d.dim(x.tensor)
    size = x.tensor.shape[dim]
    return Ref(x.name), dim, d.rng.randint(-size, size - 1)


def draw_slice(d: Draw, size: int) -> Slice:
    """A `start:stop:step` entry for a dim of `size`: the whole dim now and then."""
    if d.chance(0.4):
        return Slice()
    start = d.choice([None, 0, 1, -2]) if size else None
    stop = d.choice([None, None, -1, size // 2 + 1]) if size else None
    return Slice(start, stop, d.choice([None, None, 2, 3]))


@op("subscript", "view", "{0}[{1}]")
def _subscript(d: Draw):
    x = d.pick(lambda t: t.dim() >= 1)
    if x is None:
        return None
    items: list = []
    for size in x.tensor.shape[: d.rng.randint(1, x.tensor.dim())]:
        roll = d.rng.random()
        if roll < 0.15 and size:
            items.append(d.rng.randint(-size, size - 1))
        elif roll < 0.25:
            items.append(None)
        else:
            items.append(draw_slice(d, size))
    if d.chance(0.2):
        items.insert(0, Ellipsis)
    return Ref(x.name), Index(tuple(items))


@op("unflatten", "view", "{0}.unflatten({1}, {2})")
def _unflatten(d: Draw):
    x = d.pick(lambda t: t.dim() >= 1 and any(s > 1 for s in t.shape))
    if x is None:
        return None
    dim = d.choice([i for i, s in enumerate(x.tensor.shape) if s > 1])
    size = x.tensor.shape[dim]
    first = d.choice(_factor(size))
    return Ref(x.name), dim, (first, -1 if d.chance(0.3) else size // first)


@op("movedim", "view", "{0}.movedim({1}, {2})")
def _movedim(d: Draw):
    x = d.pick(lambda t: t.dim() >= 2)
    return None if x is None else (Ref(x.name), d.dim(x.tensor), d.dim(x.tensor))


@op("chunk", "view", "{0}.chunk({1}, dim={2})[{3}]")
def _chunk(d: Draw):
    x = d.pick(lambda t: t.dim() >= 1 and t.numel() > 0)
    if x is None:
        return None
    return Ref(x.name), d.choice([2, 3]), d.dim(x.tensor), d.choice([0, -1])


@op("split", "view", "{0}.split({1}, dim={2})[{3}]")
def _split(d: Draw):
    x = d.pick(lambda t: t.dim() >= 1 and t.numel() > 0)
    if x is None:
        return None
    return Ref(x.name), d.choice([1, 2, 3]), d.dim(x.tensor), d.choice([0, -1])


@op("unbind", "view", "{0}.unbind({1})[{2}]")
def _unbind(d: Draw):
    x = d.pick(lambda t: t.dim() >= 1 and t.numel() > 0)
    return None if x is None else (Ref(x.name), d.dim(x.tensor), d.choice([0, -1]))


@op("contiguous", "view", "{0}.contiguous()")
def _contiguous(d: Draw):
    return d.one(lambda t: not t.is_contiguous())


@op("clone", "view", "{0}.clone()")
def _clone(d: Draw):
    return d.one()


@op("channels_last", "view", "{0}.contiguous(memory_format=torch.channels_last)")
def _channels_last(d: Draw):
    return d.one(lambda t: t.dim() == 4)


@op("flip", "view", "{0}.flip({1})")
def _flip(d: Draw):
    x = d.pick(lambda t: t.dim() >= 1)
    return None if x is None else (Ref(x.name), d.dims(x.tensor))


@op("roll", "view", "{0}.roll({1}, {2})")
def _roll(d: Draw):
    x = d.pick(lambda t: t.dim() >= 1)
    return None if x is None else (Ref(x.name), d.choice([1, -1, 2]), d.dim(x.tensor))


@op("repeat", "view", "{0}.repeat({1})")
def _repeat(d: Draw):
    x = d.pick(lambda t: t.numel() * 4 <= MAX_NUMEL)
    if x is None:
        return None
    counts = [d.choice([1, 1, 2]) for _ in range(x.tensor.dim())]
    if d.chance(0.3) or not counts:
        counts.insert(0, 2)
    return Ref(x.name), tuple(counts)


@op("tril", "view", "torch.tril({0}, {1})")
def _tril(d: Draw):
    x = d.pick(lambda t: t.dim() >= 2)
    return None if x is None else (Ref(x.name), d.choice([0, 0, 1, -1]))


@op("pad", "view", "F.pad({0}, {1})")
def _pad(d: Draw):
    x = d.pick(lambda t: t.dim() >= 1)
    if x is None:
        return None
    pads = [d.choice([0, 1, 2]) for _ in range(2 * d.rng.randint(1, min(2, x.tensor.dim())))]
    return Ref(x.name), tuple(pads)


def _same_but(d: Draw, t: torch.Tensor, dim: int) -> Ref:
    """An operand for cat with t: t's shape except along dim."""
    found = d.pick(
        lambda o: (
            o.dim() == t.dim()
            and o.dtype == t.dtype
            and all(a == b for i, (a, b) in enumerate(zip(o.shape, t.shape)) if i != dim % t.dim())
        )
    )
    if found is not None and d.chance(0.5):
        return Ref(found.name)
    shape = list(t.shape)
    shape[dim] = d.choice([0, 1, 2, 3])
    dtype = t.dtype if d.chance(0.85) else d.dtype()
    return d.new_input(tuple(shape), dtype)


@op("cat", "join", "torch.cat({0}, dim={1})")
def _cat(d: Draw):
    x = d.pick(lambda t: t.dim() >= 1 and 3 * t.numel() <= MAX_NUMEL)
    if x is None:
        return None
    dim = d.dim(x.tensor)
    others = [_same_but(d, x.tensor, dim) for _ in range(d.rng.randint(1, 2))]
    items = [Ref(x.name), *others]
    d.rng.shuffle(items)
    return ListOf(tuple(items)), dim


@op("stack", "join", "torch.stack({0}, dim={1})")
def _stack(d: Draw):
    x = d.pick(lambda t: 3 * t.numel() <= MAX_NUMEL)
    if x is None:
        return None
    same = d.pick(lambda o: o.shape == x.tensor.shape and o is not x.tensor)
    if same is not None and d.chance(0.6):
        other = Ref(same.name)
    else:
        other = d.new_input(tuple(x.tensor.shape), x.tensor.dtype)
    dim = d.rng.randint(-x.tensor.dim() - 1, x.tensor.dim())
    return ListOf((Ref(x.name), other)), dim
