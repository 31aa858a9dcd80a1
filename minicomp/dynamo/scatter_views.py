"""Slice and select assignments into a graph input, as writes into a view of it.

An inference graph that assigns to part of an input (`cache[:, :, 3:5] = x`, `buf[:, 2] = y`)
reaches minicomp as AOTAutograd keeps it: the whole new input computed functionally,
`slice_scatter(input, src, ...)` or `select_scatter(...)`, then `copy_(input, that)`. Run as it
is, that writes every element of the input twice to change a few. Before import, each such
copy becomes `copy_(slice(input, ...), src)`: a copy of the assigned elements only, into a view
of the input that the importer keeps an ATen view (`WRITTEN_VIEW`), which
passes/graph/input_mutations.py may then have `src`'s kernel write directly. The scatter stays
for the graph's other readers of the input's new value, if any (else it goes).
"""

from __future__ import annotations

import torch
import torch.fx

aten = torch.ops.aten

# FX node meta key: a view of a graph input that the graph writes into (the importer makes it
# an ATen view, never a copy).
WRITTEN_VIEW = "minicomp_written_view"
WRITTEN_VIEW_REASON = "a view of its input's memory, which the graph writes into"

_DONE = "minicomp_scatter_views"

# scatter -> the view of its first argument that its second argument fills.
VIEWS = {
    aten.slice_scatter.default: aten.slice.Tensor,
    aten.select_scatter.default: aten.select.int,
}


def write_scatters_into_views(gm: torch.fx.GraphModule) -> None:
    """Rewrite `copy_(input, slice_scatter(input, src, *where))` (or select_scatter) as
    `copy_(slice(input, *where), src)` in `gm`, again on the new copy while its value is such a
    scatter of the view it copies into (once; see the module's doc)."""
    if gm.meta.get(_DONE):
        return
    gm.meta[_DONE] = True
    graph = gm.graph
    work = [n for n in graph.nodes if n.op == "call_function" and n.target is aten.copy_.default]
    changed = False
    while work:
        copy = work.pop()
        new = _rewrite(graph, copy)
        if new is not None:
            work.append(new)
            changed = True
    if changed:
        graph.lint()
        gm.recompile()


def _rewrite(graph: torch.fx.Graph, copy: torch.fx.Node) -> torch.fx.Node | None:
    """The copy replacing `copy` (erased), or None where it is no copy of a scatter into the
    memory it scatters into."""
    if len(copy.args) != 2 or copy.kwargs or copy.users:
        return None
    target, value = copy.args
    if not _writable(target) or not isinstance(value, torch.fx.Node):
        return None
    if value.op != "call_function" or value.target not in VIEWS or value.kwargs:
        return None
    if _memory(value.args[0]) is not _memory(target):
        return None
    src, *where = value.args[1:]
    val = target.meta.get("val")
    if not isinstance(src, torch.fx.Node) or not isinstance(src.meta.get("val"), torch.Tensor):
        return None
    with graph.inserting_before(copy):
        if value.target is aten.slice_scatter.default and _whole(val, *where):
            region = target  # a scatter over all of it: src is the new value
        else:
            view = VIEWS[value.target]
            region = graph.call_function(view, (target, *where))
            fake = torch.fx.node.map_arg(tuple(where), lambda a: a.meta["val"])
            region.meta.update(val=view(val, *fake), **{WRITTEN_VIEW: True})
            for key in ("stack_trace", "nn_module_stack"):
                if key in copy.meta:
                    region.meta[key] = copy.meta[key]
        if src.meta["val"].shape != region.meta["val"].shape:
            return None  # (a view inserted for nothing is dead code the importer skips)
        new = graph.call_function(aten.copy_.default, (region, src))
        new.meta.update(copy.meta)
        new.meta["val"] = region.meta["val"]
    graph.erase_node(copy)
    if not value.users:
        graph.erase_node(value)
    return new


def _writable(n: object) -> bool:
    """Whether `n` is a graph input, or a view of one this rewrite made."""
    return isinstance(n, torch.fx.Node) and (n.op == "placeholder" or n.meta.get(WRITTEN_VIEW))


def _memory(n: object) -> object:
    """`n`, or the node it is a slice of where that slice is all of it (`[:, :]`)."""
    while (
        isinstance(n, torch.fx.Node)
        and n.op == "call_function"
        and n.target is aten.slice.Tensor
        and _whole(n.args[0].meta.get("val"), *n.args[1:])
    ):
        n = n.args[0]
    return n


def _whole(val: object, dim: int = 0, start=None, end=None, step: int = 1) -> bool:
    """Whether slice(val, dim, start, end, step) is all of `val`."""
    if not isinstance(val, torch.Tensor) or not isinstance(dim, int):
        return False
    size = val.shape[dim]
    return (
        start in (None, 0)
        and step == 1
        and (end is None or isinstance(end, int) and (end >= 2**62 or end == size))
    )
