"""Shared views: a view that several compute ops read becomes a copy of it per reduction.

A view (simplify_views: one element of its single input at remapped indices: permute, expand,
slice, reshape) costs nothing where its reader's kernel reads through it, but fusion puts an
op in one group only: with readers in two groups, one group takes the view and the other reads
it back from memory, so the view is written out whole. Readers that reduce end up in groups of
their own (fusion keeps a contraction apart from other reductions): a transposed weight read
both by a product (a template that takes either layout) and by the sum of its columns
(torchao's int8 dynamic quantization) was written out on every call. Each reducing reader
gets a copy of its own; elementwise readers keep the original, as they may still fuse with
each other around it (a grouped convolution's view back to 4-d read by two epilogues stays
one kernel with both).
"""

from __future__ import annotations

from minicomp.ir.graph import ComputeOp, Graph, Op
from minicomp.passes.graph.rewrite import fresh_name, rename_op, value_names
from minicomp.passes.graph.simplify_views import is_view


def duplicate_shared_views(graph: Graph) -> Graph:
    """`graph` with each view read by several compute ops copied for every reader holding a
    reduction but one that keeps the original (with the elementwise readers, ATen calls and
    the graph's outputs)."""
    users = graph.users()
    names = value_names(graph)
    copies: dict[int, dict] = {}  # reader's id -> {view's value: its copy's value}
    # reader's id -> the copies placed just before it: a copy then sits where its reader does
    # (between the same collectives, which order what fusion may merge).
    before: dict[int, list[Op]] = {}
    for n in graph.nodes:
        if not is_view(n):
            continue
        value = n.outputs[0]
        readers = [u for u in users.get(value, []) if isinstance(u, ComputeOp)]
        # Readers that reduce (sums, products) take a copy each; the original stays with the
        # others, which may fuse with each other around it, or with the first reader.
        reducing = [u for u in readers if not u.is_injective]
        keeps = next((u for u in readers if u.is_injective), readers[0] if readers else None)
        for reader in reducing if len(readers) > 1 else ():
            if reader is keeps:
                continue
            out = value.replace(name=fresh_name(f"{value.name}_", names))
            copy = n.replace(
                name=out.name, outputs=(out,), definition=n.definition.replace(name=out.name)
            )
            before.setdefault(id(reader), []).append(copy)
            copies.setdefault(id(reader), {})[value] = out
    if not before:
        return graph
    nodes: list[Op] = []
    for n in graph.nodes:
        nodes.extend(before.get(id(n), ()))
        nodes.append(rename_op(n, copies[id(n)]) if id(n) in copies else n)
    return graph.replace(nodes=tuple(nodes))
