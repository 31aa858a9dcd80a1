"""The pass manager: the passes every target runs, and running a flat list of graph passes in
order, optionally tracing each one."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Sequence

from minicomp.ir.graph import Graph
from minicomp.passes.graph.alias_views import alias_views
from minicomp.passes.graph.attention_groups import group_query_attention
from minicomp.passes.graph.cse import eliminate_common_subexpressions
from minicomp.passes.graph.dce import eliminate_dead_code
from minicomp.passes.graph.fold_batch_norm import fold_batch_norms
from minicomp.passes.graph.fold_constants import fold_constants
from minicomp.passes.graph.horizontal import fuse_matmuls_sharing_input
from minicomp.passes.graph.layout import contiguous_extern_inputs
from minicomp.passes.graph.scatter_accumulate import fold_scatter_into_sum
from minicomp.passes.graph.simplify_views import simplify_views

GraphPass = Callable[[Graph], Graph]

# Read top to bottom. Dead code goes first so later passes look at less; views collapse
# before CSE, which then sees the canonical index maps, and attention reads a K/V cache
# repeated over heads (now one view) un-repeated; sums of scattered zeros become
# scatters into the other addend; the last DCE drops what folding, view collapsing, CSE and
# that left unread; views that ATen calls read then become aliases, and the ATen calls that
# need contiguous arguments get copies of the others.
DEFAULT_PASSES: list[GraphPass] = [
    eliminate_dead_code,
    simplify_views,
    group_query_attention,
    fold_constants,
    eliminate_common_subexpressions,
    fold_scatter_into_sum,
    eliminate_dead_code,
    alias_views,
    contiguous_extern_inputs,
]

# Passes every target runs first, on ATen calls the CUDA targets lower later (lower_anchors):
# batch norms with constant statistics fold into the convolution before them, and matrix
# products sharing their input fuse. Each target (minicomp/targets.py) puts its own passes
# around these and the default ones.
FIRST_PASSES: list[GraphPass] = [fold_batch_norms, fuse_matmuls_sharing_input]


def configured(p: Callable[..., Graph], **settings: object) -> GraphPass:
    """Graph pass `p` with keyword `settings` bound (such as the GPU's SM count, which a
    target knows once per compile), under `p`'s name, which traces print."""
    bound = functools.partial(p, **settings)
    functools.update_wrapper(bound, p)
    return bound


def run_passes(graph: Graph, passes: Sequence[GraphPass], *, trace: list | None = None) -> Graph:
    """`graph` after each pass in turn.

    When `trace` is a list, (pass name, seconds, text of the graph after the pass) is appended
    to it for each pass; `minicomp.explain` and the verbose log print it.
    """
    for p in passes:
        start = time.perf_counter()
        graph = p(graph)
        if trace is not None:
            trace.append((p.__name__, time.perf_counter() - start, str(graph)))
    return graph
