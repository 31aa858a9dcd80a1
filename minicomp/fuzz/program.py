"""A fuzz program as data: its inputs' specs and a list of op applications over named values."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Ref:
    """A named value used as an argument: an input or an earlier step's result."""

    name: str


@dataclass(frozen=True)
class ListOf:
    """Several arguments passed as one list, as torch.cat takes its tensors."""

    items: tuple[Any, ...]


@dataclass(frozen=True)
class Slice:
    """One `start:stop:step` entry of a subscript."""

    start: int | None = None
    stop: int | None = None
    step: int | None = None


@dataclass(frozen=True)
class Index:
    """A subscript `x[...]`: Slices, ints, None (a new axis), Ellipsis and Refs (index tensors)."""

    items: tuple[Any, ...]


@dataclass(frozen=True)
class TensorLiteral:
    """A small int64 tensor written into the program, such as an index_select index."""

    values: tuple[int, ...]


@dataclass(frozen=True)
class Layout:
    """How an input's memory is laid out.

    kind is one of LAYOUTS. `arg` is, for permuted: the permutation applied to a contiguous
    base; for strided: a (start, step) pair per dim of a sliced base; for expanded: the dims
    broadcast from size 1; otherwise empty.
    """

    kind: str = "contiguous"
    arg: tuple[Any, ...] = ()


LAYOUTS = ("contiguous", "permuted", "strided", "channels_last", "expanded")
CONTIGUOUS = Layout()


@dataclass(frozen=True)
class InputSpec:
    """One argument of the program: shape, dtype, layout, requires_grad and its data's seed.

    Integer inputs hold small signed values, or indices in [0, high) when `high` is set.
    """

    name: str
    shape: tuple[int, ...]
    dtype: torch.dtype
    seed: int
    layout: Layout = CONTIGUOUS
    requires_grad: bool = False
    high: int | None = None


@dataclass(frozen=True)
class Step:
    """`out = <op applied to args>`; `out` is None for a statement such as `x[0] = y`."""

    out: str | None
    op: str
    args: tuple[Any, ...]


@dataclass(frozen=True)
class Program:
    """A straight-line function of its inputs returning the values named in `outputs`."""

    inputs: tuple[InputSpec, ...]
    steps: tuple[Step, ...]
    outputs: tuple[str, ...]


@dataclass(frozen=True)
class Case:
    """One program run one way: on a target, with or without dynamic shapes and backward."""

    program: Program
    target: str
    dynamic: bool = False
    backward: bool = False
    seed: int | None = None  # the generator seed the program came from, when it did


def refs(value: Any) -> list[str]:
    """The names a step argument refers to, in order."""
    if isinstance(value, Ref):
        return [value.name]
    if isinstance(value, ListOf | Index):
        return [name for item in value.items for name in refs(item)]
    if isinstance(value, tuple):
        return [name for item in value for name in refs(item)]
    return []


def step_refs(step: Step) -> list[str]:
    """The names a step reads."""
    return refs(step.args)
