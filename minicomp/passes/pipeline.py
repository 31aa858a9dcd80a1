"""The pass manager: run a flat list of graph passes in order, optionally tracing each one."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from minicomp.ir.graph import Graph
from minicomp.passes.graph.alias_views import alias_views
from minicomp.passes.graph.anchors import lower_anchors
from minicomp.passes.graph.cse import eliminate_common_subexpressions
from minicomp.passes.graph.dce import eliminate_dead_code
from minicomp.passes.graph.fold_constants import constant_operand_layouts, fold_constants
from minicomp.passes.graph.horizontal import fuse_matmuls_sharing_input
from minicomp.passes.graph.layout import contiguous_extern_inputs
from minicomp.passes.graph.simplify_views import simplify_views
from minicomp.passes.graph.split_k import split_k
from minicomp.passes.graph.split_reductions import split_reductions

GraphPass = Callable[[Graph], Graph]

# Read top to bottom. Dead code goes first so later passes look at less; views collapse
# before CSE, which then sees the canonical index maps; the last DCE drops what folding,
# view collapsing and CSE left unread; views that ATen calls read then become aliases, and
# the ATen calls that need contiguous arguments get copies of the others.
DEFAULT_PASSES: list[GraphPass] = [
    eliminate_dead_code,
    simplify_views,
    fold_constants,
    eliminate_common_subexpressions,
    eliminate_dead_code,
    alias_views,
    contiguous_extern_inputs,
]

# Passes every target runs first. Matrix products sharing their input fuse while they are
# still ATen calls, before the CUDA targets lower them (lower_anchors).
FIRST_PASSES: list[GraphPass] = [fuse_matmuls_sharing_input]

# Passes a target runs before the default ones: ops it computes whole, which the others then
# see as compute ops (views feeding them fuse instead of becoming aliases).
TARGET_FIRST_PASSES: dict[str, list[GraphPass]] = {
    "cuda": [lower_anchors],
    "cuda-emu": [lower_anchors],
}

# Passes a target adds after the default ones (before fusion). Attention calls become kernel
# launches last: views they read are zero-copy aliases by then, and every layout is final
# (the launch takes its tensors' strides). split_k precedes split_reductions, which would
# split a long-K product with few outputs as a row reduction that no matmul template computes.
# Constant operands of products take the layout the templates read before split_k rewrites
# the products' indices.
TARGET_PASSES: dict[str, list[GraphPass]] = {
    "cuda": [constant_operand_layouts, split_k, split_reductions],
    "cuda-emu": [constant_operand_layouts, split_k, split_reductions],
}


def passes_for(target: str) -> list[GraphPass]:
    """The graph passes run before fusion when compiling for `target`."""
    first = FIRST_PASSES + TARGET_FIRST_PASSES.get(target, [])
    return first + list(DEFAULT_PASSES) + TARGET_PASSES.get(target, [])


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
