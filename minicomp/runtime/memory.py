"""Workspace planning: intermediates share memory when their lifetimes do not overlap."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

ALIGN = 64


@dataclass(frozen=True)
class Interval:
    """A buffer of `nbytes` live from step `first` to step `last` (inclusive)."""

    nbytes: int
    first: int
    last: int


def plan_offsets(buffers: Sequence[Interval]) -> tuple[list[int], int]:
    """Byte offsets for the buffers (greedy by size, first fit) and the workspace size."""
    order = sorted(range(len(buffers)), key=lambda k: -buffers[k].nbytes)
    placed: list[tuple[int, int, Interval]] = []  # (offset, end, interval)
    offsets = [0] * len(buffers)
    total = 0
    for k in order:
        b = buffers[k]
        size = -(-max(b.nbytes, 1) // ALIGN) * ALIGN
        busy = sorted(
            (o, e) for o, e, other in placed if not (other.last < b.first or b.last < other.first)
        )
        at = 0
        for o, e in busy:
            if at + size <= o:
                break
            at = max(at, e)
        offsets[k] = at
        placed.append((at, at + size, b))
        total = max(total, at + size)
    return offsets, total
