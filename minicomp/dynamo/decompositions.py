"""The decomposition table: PyTorch's core-ATen decompositions, minus ops lowered whole."""

from __future__ import annotations

import functools

import torch

aten = torch.ops.aten

# Ops minicomp lowers better whole than decomposed: a single-pass row kernel each
# (and, later, fused attention templates).
KEEP_WHOLE = (
    aten._softmax.default,
    aten._log_softmax.default,
    aten.softmax.int,
    aten.log_softmax.int,
    aten.native_layer_norm.default,
    aten.layer_norm.default,
)


@functools.cache
def decomposition_table() -> dict:
    """The table AOTAutograd traces with."""
    from torch._decomp import core_aten_decompositions

    table = dict(core_aten_decompositions())
    for op in KEEP_WHOLE:
        table.pop(op, None)
    return table
