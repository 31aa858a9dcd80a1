"""What an op's draw function sees: the values in scope, a random source, a way to add inputs."""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

import torch

from minicomp.fuzz.program import Ref

# No value may grow past this many elements: programs stay cheap to compile and compare.
MAX_NUMEL = 4096
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
INT_DTYPES = (torch.int64, torch.int32, torch.int8, torch.uint8)
# Weighted towards float32, the dtype models use most.
DTYPES = (torch.float32,) * 6 + FLOAT_DTYPES[1:] + (torch.int64,) * 2 + (torch.int32, torch.bool)


@dataclass
class Value:
    """A value in scope while a program is drawn, with its eager result."""

    name: str
    tensor: torch.Tensor
    is_input: bool


def is_float(t: torch.Tensor) -> bool:
    """A floating-point tensor."""
    return t.is_floating_point()


def is_int(t: torch.Tensor) -> bool:
    """An integer tensor (not bool)."""
    return not t.is_floating_point() and t.dtype != torch.bool


def is_bool(t: torch.Tensor) -> bool:
    """A bool tensor."""
    return t.dtype == torch.bool


def _rounded(value: Value) -> bool:
    return not value.is_input and value.tensor.dtype in (torch.float16, torch.bfloat16)


def broadcasts(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...] | None:
    """The broadcast shape of a and b, or None."""
    try:
        return tuple(torch.broadcast_shapes(a, b))
    except RuntimeError:
        return None


def numel(shape: tuple[int, ...]) -> int:
    """The number of elements of a shape."""
    n = 1
    for size in shape:
        n *= size
    return n


NewInput = Callable[..., Ref]


class Draw:
    """The context of one op's draw: pick values, draw dims and literals, add inputs."""

    def __init__(self, rng: random.Random, values: list[Value], new_input: NewInput):
        self.rng = rng
        self.values = values
        self._new_input = new_input

    def pick(
        self, where: Callable[[torch.Tensor], bool] | None = None, *, steep: bool = False
    ) -> Value | None:
        """A value whose tensor satisfies `where`, recent ones more likely; None if none does.

        `steep`: for an op that jumps where its input crosses a point (sign, floor, a
        comparison, argmax, a cast to int). A half-precision value computed by the program is
        rounded differently by a fused kernel, and may cross it: only inputs qualify then.
        """
        found = [
            v
            for v in self.values
            if (where is None or where(v.tensor)) and not (steep and _rounded(v))
        ]
        if not found:
            return None
        return self.rng.choices(found, weights=range(1, len(found) + 1))[0]

    def one(
        self, where: Callable[[torch.Tensor], bool] | None = None, *, steep: bool = False
    ) -> tuple[Ref] | None:
        """The arguments of an op on a single value: a value picked as `pick` does, or None."""
        x = self.pick(where, steep=steep)
        return None if x is None else (Ref(x.name),)

    def chance(self, p: float) -> bool:
        """True with probability p."""
        return self.rng.random() < p

    def choice(self, options):
        """One of `options`."""
        return self.rng.choice(list(options))

    def dim(self, t: torch.Tensor) -> int:
        """A valid dim of t, negative now and then (0 for a 0-d tensor)."""
        rank = max(t.dim(), 1)
        d = self.rng.randrange(rank)
        return d - rank if self.chance(0.3) else d

    def dims(self, t: torch.Tensor) -> tuple[int, ...]:
        """A non-empty set of distinct dims of t, in increasing order."""
        rank = max(t.dim(), 1)
        count = self.rng.randint(1, rank)
        return tuple(sorted(self.rng.sample(range(rank), count)))

    def scalar(self, t: torch.Tensor) -> int | float | bool:
        """A Python number to combine with t: int or float for numbers, bool for bools."""
        if is_bool(t):
            return self.choice([True, False, 1, 2])
        if is_int(t) and self.chance(0.7):
            return self.choice([2, -1, 3, 0, 1])
        return self.choice([0.5, 2.0, -1.5, 3, 0.25, -2])

    def dtype(self) -> torch.dtype:
        """A random dtype, float32 most often."""
        return self.choice(DTYPES)

    def new_input(
        self,
        shape: tuple[int, ...],
        dtype: torch.dtype,
        *,
        high: int | None = None,
        requires_grad: bool | None = None,
    ) -> Ref:
        """A new contiguous input of the program (random requires_grad for floats if None)."""
        if requires_grad is None:
            requires_grad = dtype.is_floating_point and self.chance(0.4)
        return self._new_input(tuple(shape), dtype, high, requires_grad)

    def broadcast_shape_for(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        """A shape that broadcasts *to* `shape`: some leading dims dropped, some sizes 1."""
        keep = self.rng.randint(0, len(shape)) if self.chance(0.5) else len(shape)
        tail = shape[len(shape) - keep :]
        return tuple(1 if self.chance(0.25) else s for s in tail)

    def partner(
        self, x: Value, *, into: bool = False, same_dtype: bool = False, steep: bool = False
    ) -> Ref:
        """A second operand for x: a value in scope or a new input whose shape broadcasts with
        x's (to exactly x's with `into`, as an in-place op needs); x itself now and then."""
        t = x.tensor
        shape = tuple(t.shape)

        def fits(other: torch.Tensor) -> bool:
            out = broadcasts(shape, tuple(other.shape))
            if out is None or numel(out) > MAX_NUMEL or (into and out != shape):
                return False
            return not same_dtype or other.dtype == t.dtype

        if self.chance(0.45):
            found = self.pick(lambda other: other is not t and fits(other), steep=steep)
            if found is not None:
                return Ref(found.name)
        if self.chance(0.15):
            return Ref(x.name)
        dtype = t.dtype if same_dtype or self.chance(0.75) else self.dtype()
        new_shape = self.broadcast_shape_for(shape)
        if not into and self.chance(0.2):
            # A partner with more dims, broadcasting t up.
            new_shape = (self.rng.randint(1, 3), *shape)
        return self.new_input(new_shape, dtype)

    def operand(self, x: Value, *, into: bool = False, steep: bool = False) -> object:
        """A second operand for x: a Python scalar now and then, else a partner tensor."""
        if self.chance(0.3):
            return self.scalar(x.tensor)
        return self.partner(x, into=into, steep=steep)
