"""The op table: every op the generator draws, registered with its printed form by decorator."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

# Each family with how often the generator draws it, roughly by how many ops it has.
FAMILY_WEIGHTS = {
    "unary": 3,
    "binary": 3,
    "compare": 1,
    "where": 1,
    "cast": 1,
    "reduce": 3,
    "norm": 2,
    "view": 4,
    "join": 1,
    "index": 2,
    "matmul": 1.5,
    "inplace": 2,
    "creation": 0.5,
}
FAMILIES = tuple(FAMILY_WEIGHTS)


@dataclass(frozen=True)
class OpDef:
    """One op: its family, its source template and the function that draws its arguments.

    The template is a str.format pattern over the drawn arguments ({0}, {1}...), which are
    rendered as Python source first. `draw` takes a Draw and returns the argument tuple, or
    None when no value in scope suits the op.
    """

    name: str
    family: str
    template: str
    draw: Callable[[Any], tuple[Any, ...] | None]
    statement: bool = False  # no result: `x[i] = y`


TABLE: dict[str, OpDef] = {}


def op(name: str, family: str, template: str, *, statement: bool = False):
    """Register the decorated draw function as op `name`."""
    assert family in FAMILIES, family

    def register(draw):
        assert name not in TABLE, f"op {name} registered twice"
        TABLE[name] = OpDef(name, family, template, draw, statement)
        return draw

    return register


def ops_of(family: str) -> list[OpDef]:
    """The ops of one family, in registration order."""
    return [d for d in TABLE.values() if d.family == family]
