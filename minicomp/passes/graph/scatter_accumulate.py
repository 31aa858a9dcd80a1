"""Accumulating scatters into zeros that are then added to a tensor accumulate into it.

An embedding's backward scatters the rows' gradients into a zero tensor of the table's shape
(`index_put(zeros, [rows], grads, accumulate=True)`); a tied table (GPT-2's LM head) then adds
that to the other use's gradient. For a 50257x768 table that is a fill, a copy inside the
functional index_put and a full-size add, each of 150 MB, to change a few rows. Scattering
into the other gradient instead touches only the rows (it is the same sum, in another order):
`a + index_put(zeros, i, v, True)` is `index_put(a, i, v, True)`.
"""

from __future__ import annotations

import dataclasses

import torch
from torch.utils import _pytree as pytree

from minicomp.ir.compute import TensorElement
from minicomp.ir.expr import Binary, Const
from minicomp.ir.graph import ArgRef, ComputeOp, ExternOp, Graph, Op, Value

aten = torch.ops.aten


def fold_scatter_into_sum(graph: Graph) -> Graph:
    """Turn `a + index_put(zeros, i, v, accumulate=True)` into `index_put(a, i, v, True)`."""
    producers = graph.producers()
    users = graph.users()
    outputs = graph.output_values()
    folded: dict[Op, ExternOp] = {}  # the sum -> the scatter that now computes it
    dropped: set[Op] = set()
    for n in graph.nodes:
        if not _accumulating_scatter_into(n, producers, users, outputs, graph.constants):
            continue
        (out,) = n.outputs
        readers = users.get(out, [])
        if out in outputs or len(readers) != 1:
            continue
        addend = _other_addend(readers[0], out)
        if addend is None or addend in n.inputs or not _same_tensor_type(addend, out):
            continue
        folded[readers[0]] = dataclasses.replace(
            n, inputs=(addend, *n.inputs[1:]), outputs=readers[0].outputs
        )
        dropped.add(n)
    if not folded:
        return graph
    nodes = tuple(folded.get(n, n) for n in graph.nodes if n not in dropped)
    return graph.replace(nodes=nodes)


def _accumulating_scatter_into(
    n: Op, producers: dict, users: dict, outputs: set, constants: dict
) -> bool:
    """Whether `n` is index_put(zeros, ..., accumulate=True) whose zeros nothing else reads."""
    if not isinstance(n, ExternOp) or n.target is not aten.index_put.default:
        return False
    accumulate = n.args[3] if len(n.args) > 3 else dict(n.kwargs).get("accumulate", False)
    if accumulate is not True or not n.args or n.args[0] != ArgRef(0):
        return False
    if ArgRef(0) in pytree.tree_leaves((n.args[1:], n.kwargs)):
        return False  # the zeros are read as more than the tensor scattered into
    zeros = n.inputs[0]
    if zeros in outputs or users.get(zeros) != [n]:
        return False
    fill = producers.get(zeros)
    if isinstance(fill, ComputeOp):
        body = fill.definition.body
        return isinstance(body, Const) and body.value == 0
    folded = constants.get(zeros.name)  # a small fill, folded
    return isinstance(folded, torch.Tensor) and not folded.any()


def _other_addend(op: Op, value: Value) -> Value | None:
    """The value `op` adds to `value` elementwise (`op` computing exactly x + value, same
    shape, no broadcast, cast or scale), or None."""
    if not isinstance(op, ComputeOp) or len(op.inputs) != 2 or value not in op.inputs:
        return None
    d = op.definition
    body = d.body
    if not isinstance(body, Binary) or body.op != "add":
        return None
    operands = (body.a, body.b)
    axes = tuple(d.axes)
    if not all(isinstance(e, TensorElement) and tuple(e.indices) == axes for e in operands):
        return None
    names = {e.tensor.name for e in operands}
    if names != {v.name for v in op.inputs}:
        return None
    (other,) = [v for v in op.inputs if v != value]
    return other if _same_tensor_type(other, op.outputs[0]) else None


def _same_tensor_type(a: Value, b: Value) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and a.type.device == b.type.device
