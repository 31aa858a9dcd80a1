"""Per-op fallback: a fused group that fails to schedule or compile names the ATen graph nodes
it computes, which the next attempt at the graph runs as ATen calls.

The importer already turns an op without a lowering into an ATen call (an ExternOp); this
does the same for the ops of a kernel that turned out not to compile (a scheduler bug, a
C or CUDA compiler crash), so that one bad kernel costs its own ops eager speed, not the
whole graph's.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeVar

from minicomp.ir.graph import ComputeOp, FusedOp, Graph, Value


class KernelsFailed(Exception):
    """Fused groups that could not be scheduled or built. `externs` maps the ATen graph nodes
    they compute to the reason to run them as ATen calls instead."""

    def __init__(self, externs: dict[str, str], cause: Exception):
        super().__init__(
            f"{len(externs)} ATen ops in failed kernels: {type(cause).__name__}: {cause}"
        )
        self.externs = externs
        self.cause = cause


def group_origins(op: FusedOp, unfused: Graph) -> set[str]:
    """The ATen graph nodes whose computations fused group `op` holds: the producers, in the
    graph before fusion, of its outputs and of what they read inside the group."""
    producers = unfused.producers()
    inputs = set(op.inputs)
    names: set[str] = set()
    seen: set[Value] = set()
    stack = list(op.outputs)
    while stack:
        v = stack.pop()
        if v in seen or v in inputs:
            continue
        seen.add(v)
        names.add(v.name)
        producer = producers.get(v)
        if isinstance(producer, ComputeOp):
            stack.extend(producer.inputs)
    return {o for o in map(unfused.origin_of, names) if o is not None}


def failed(groups: Sequence[FusedOp], unfused: Graph, cause: Exception) -> KernelsFailed:
    """The KernelsFailed for `groups`, whose scheduling or building raised `cause`."""
    reason = f"its fused kernel failed to compile: {type(cause).__name__}: {_first_line(cause)}"
    externs = {name: reason for g in groups for name in sorted(group_origins(g, unfused))}
    return KernelsFailed(externs, cause)


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else ""


T = TypeVar("T")


def failing_subset(items: Sequence[T], works: Callable[[Sequence[T]], bool]) -> list[T]:
    """The items of `items` (on which `works` fails) that make it fail on their own, found by
    bisection; empty where only some combination of them fails."""
    if len(items) == 1:
        return list(items)
    half = len(items) // 2
    found = []
    for part in (items[:half], items[half:]):
        if not works(part):
            found += failing_subset(part, works)
    return found
