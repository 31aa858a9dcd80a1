"""Collectives in a graph: which ATen calls communicate with other processes, and which waits.

A traced DTensor or functional-collectives program holds `_c10d_functional` calls: a
collective (`all_reduce`, `all_gather_into_tensor`, `reduce_scatter_tensor`, `broadcast`,
`all_to_all_single`...) starts the communication and returns a tensor that is not ready, and
`wait_tensor` on that tensor waits for it and returns it. minicomp runs them as ATen calls
(c10d does the work) with these rules, which the passes and the plan builder read from here:

- every rank must issue the same collectives in the same order, so a collective call is never
  dropped, merged with another or folded (`ExternOp.has_effects`), and the ops of a graph keep
  their place relative to its collectives (fusion adds ordering edges: `barrier_edges`);
- c10d may read a collective's input until the wait, on its own thread or stream: that input
  never shares bytes of the plan's workspace with later steps (the plan builder gives it memory
  of its own) and the call's result is not copied before the wait;
- a collective step is not recorded in a CUDA graph (runtime/cuda_graphs.py).
"""

from __future__ import annotations

from typing import Any

# Namespaces of the ops that communicate: the functional collectives, their autograd forms,
# and c10d's own in-place ops (what an untraced ProcessGroup call lowers to).
NAMESPACES = ("_c10d_functional", "_c10d_functional_autograd", "c10d")

COLLECTIVE_REASON = "ATen by design: a collective, run by c10d in program order"
WAIT_REASON = "ATen by design: waits for a collective, in program order"


def is_collective(target: Any) -> bool:
    """Whether `target` is an op that communicates with other processes, or waits for one."""
    return getattr(target, "namespace", None) in NAMESPACES


def is_wait(target: Any) -> bool:
    """Whether `target` waits for a collective's result (and returns it)."""
    return is_collective(target) and getattr(target, "__name__", "").startswith("wait_tensor")


def reason_for(target: Any) -> str:
    """The reason a collective or a wait runs as an ATen call."""
    return WAIT_REASON if is_wait(target) else COLLECTIVE_REASON


def barrier_edges(collectives: list[int], count: int) -> list[tuple[int, int]]:
    """Ordering edges (i, j), i < j, among `count` ops in program order that pin each of
    `collectives` (ascending indices) in place: every op before a collective runs before it,
    every op after it runs after it. Each op gets an edge from the collective before it and
    one to the collective after it, so the edges number about 2 * count."""
    edges: list[tuple[int, int]] = []
    previous = None
    bounds = [*collectives, count]
    start = 0
    for c in bounds:
        for i in range(start, c):
            if previous is not None:
                edges.append((previous, i))
            if c < count:
                edges.append((i, c))
        if previous is not None and c < count:
            edges.append((previous, c))
        previous, start = c, c + 1
    return edges
