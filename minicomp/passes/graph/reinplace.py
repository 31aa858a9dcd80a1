"""Scatters into memory nothing reads afterwards write into it: the in-place ATen variant.

A functional `index_put(x, ...)`, `scatter(x, ...)` or `index_add(x, ...)` copies all of `x`
to change a few of its elements. When `x` is the plan's own (an ATen call's fresh result or
a kernel's output, not an input, a constant or memory a view shares) and no later operator
reads it, the call runs as `index_put_(x, ...)` instead and its result is `x`'s memory. The
plan builder then keeps such an `x` out of the workspace when the result escapes the call.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from minicomp.ir.graph import ArgRef, ExternOp, FusedOp, Graph, KernelOp

# The functional ops that copy their whole first argument to change part of it.
SCATTERS = frozenset(
    {
        "index_put",
        "scatter",
        "scatter_add",
        "scatter_reduce",
        "index_add",
        "index_copy",
        "index_fill",
        "masked_scatter",
        "put",
    }
)


def reinplace_scatters(graph: Graph) -> Graph:
    """Run functional scatters as their in-place variants where their input is dead after."""
    position = {}
    for k, n in enumerate(graph.nodes):
        for v in n.inputs:
            position[v] = k  # the last operator reading each value
    outputs = graph.output_values()
    owned = _owned_memory(graph)
    views = [n for n in graph.nodes if isinstance(n, ExternOp) and n.returns_views]
    shared = {v for n in views for v in n.inputs}  # memory a view may still show
    nodes = list(graph.nodes)
    changed = False
    for k, n in enumerate(nodes):
        in_place = _in_place_variant(n)
        if in_place is None:
            continue
        target = n.inputs[0]
        if (
            target in owned
            and target not in outputs
            and target not in shared
            and position.get(target) == k
            and n.inputs.count(target) == 1
            and target.dtype == n.outputs[0].dtype
        ):
            nodes[k] = dataclasses.replace(n, name=f"{n.name} (in place)", target=in_place)
            changed = True
    return graph.replace(nodes=tuple(nodes)) if changed else graph


def _owned_memory(graph: Graph) -> set:
    """Values in memory the plan allocates for them alone: kernel outputs and the results of
    ATen calls that return new tensors (not graph inputs or constants, which no op makes)."""
    owned = set()
    for n in graph.nodes:
        if isinstance(n, (FusedOp, KernelOp)) or isinstance(n, ExternOp) and not n.returns_views:
            owned.update(n.outputs)
    return owned


def _in_place_variant(n: Any) -> Any:
    """The in-place overload of a functional scatter ExternOp whose first argument is its
    first input, or None."""
    if not isinstance(n, ExternOp) or len(n.outputs) != 1 or not n.args:
        return None
    target = n.target
    if not isinstance(target, torch._ops.OpOverload) or n.args[0] != ArgRef(0):
        return None
    name = target._schema.name.split("::")[-1]
    if name not in SCATTERS or target._schema.is_mutable:
        return None
    packet = getattr(torch.ops.aten, f"{name}_", None)
    variant = getattr(packet, target._overloadname, None) if packet is not None else None
    if variant is None:
        return None
    first = variant._schema.arguments[0]
    if first.alias_info is None or not first.alias_info.is_write:
        return None
    functional = [(a.name, str(a.type)) for a in target._schema.arguments]
    if [(a.name, str(a.type)) for a in variant._schema.arguments] != functional:
        return None
    return variant
