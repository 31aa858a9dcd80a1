"""Zero-copy views: a pure index remapping read by ATen calls becomes a strided alias.

A view, permute, slice or expand feeding a matmul would otherwise be copied by a kernel
first. When the remapping of its input's storage is itself strided (checked on the actual
index map, not by op name), the value is an `as_strided` alias of the input instead.
"""

from __future__ import annotations

import numpy as np

from minicomp.ir import types as T
from minicomp.ir.compute import Compute, TensorElement, TensorInput
from minicomp.ir.evaluate import evaluate
from minicomp.ir.expr import Expr
from minicomp.ir.graph import ArgRef, ComputeOp, ExternOp, Graph, TensorType
from minicomp.passes.graph.layout import layouts_for

# Index maps of views larger than this are not evaluated (the check is exhaustive).
MAX_CHECKED_ELEMENTS = 1 << 22


def strided_view(t, size, stride, offset):
    """`t` seen through sizes and strides, `offset` elements past its own start."""
    return t.as_strided(size, stride, t.storage_offset() + offset)


strided_view.is_view = True


def alias_views(graph: Graph) -> Graph:
    """Replace view-like compute ops that ATen calls read by zero-copy strided aliases."""
    layouts = layouts_for(graph)
    users = graph.users()
    outputs = graph.output_values()
    nodes, changed = [], False
    for n in graph.nodes:
        view = None
        if (
            isinstance(n, ComputeOp)
            and n.outputs[0] not in outputs
            and any(isinstance(u, ExternOp) for u in users.get(n.outputs[0], []))
        ):
            view = _as_alias(n, layouts)
        nodes.append(view or n)
        changed |= view is not None
    return graph.replace(nodes=tuple(nodes)) if changed else graph


def _as_alias(op: ComputeOp, layouts: dict) -> ExternOp | None:
    d = op.definition
    if len(op.inputs) != 1 or not isinstance(d.body, TensorElement):
        return None
    src = op.inputs[0]
    if src.dtype != op.outputs[0].dtype or not _static(d.shape, src.shape, layouts[src.name]):
        return None
    found = _fit_strides(d, layouts[src.name])
    if found is None:
        return None
    strides, offset = found
    out = op.outputs[0]
    value = out.replace(type=TensorType(out.shape, out.dtype, out.type.device, strides))
    args = (ArgRef(0), tuple(d.shape), strides, offset)
    return ExternOp(
        f"{op.name} (zero-copy view)",
        (src,),
        (value,),
        strided_view,
        args,
        (),
        ((),),
        "a view of its input's memory",
    )


def _static(*dims_lists) -> bool:
    return all(not isinstance(x, Expr) for dims in dims_lists for x in dims)


def _fit_strides(d: Compute, src_strides: tuple) -> tuple[tuple, int] | None:
    """Strides and offset reproducing the storage offsets `d` reads, if there are such."""
    numel = int(np.prod(d.shape)) if d.shape else 1
    if numel == 0 or numel > MAX_CHECKED_ELEMENTS:
        return None
    el = d.body
    src = el.tensor
    grids = np.meshgrid(*(np.arange(x, dtype=np.int64) for x in src.shape), indexing="ij")
    base = sum((g * s for g, s in zip(grids, src_strides)), np.zeros(src.shape, np.int64))
    probe = TensorInput(src.name, src.shape, T.i64)
    body = TensorElement(probe, el.indices)
    offsets = evaluate(Compute(d.name, d.shape, d.axes, body), {src.name: base})
    offsets = np.asarray(offsets, np.int64).reshape(d.shape)
    origin = int(offsets.reshape(-1)[0])
    strides = []
    for k, x in enumerate(d.shape):
        if x == 1:
            strides.append(1)
            continue
        step = [0] * len(d.shape)
        step[k] = 1
        strides.append(int(offsets[tuple(step)]) - origin)
    grids = np.meshgrid(*(np.arange(x, dtype=np.int64) for x in d.shape), indexing="ij")
    predicted = origin + sum((g * s for g, s in zip(grids, strides)), np.zeros(d.shape, np.int64))
    if not np.array_equal(predicted, offsets) or origin < 0:
        return None
    return tuple(strides), origin
