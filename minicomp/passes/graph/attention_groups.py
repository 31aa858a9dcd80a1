"""Grouped-query attention without the repeated K/V: a fused attention call whose key and value
are a repeat over heads (`repeat_interleave(groups, dim=1)`, or `x[:, :, None].expand(...)
.reshape(...)`) reads the un-repeated tensors instead, its query head h reading key/value head
h // groups, as the call computes by itself when given fewer key heads.

After `simplify_views` the repeat is one view over the cache `x` whose indices use the head
axis only as `h // groups` (for one key head, not at all). The same view with `h // groups`
replaced by `h`, over `heads // groups` heads, is the un-repeated tensor: `x` itself when that
is the identity, else a view of `x` (a zero-copy alias once `alias_views` runs, when strided).
The call then reads that; the repeat dies unless something else reads it (a graph output, say,
or another op), which keeps it and its copy.

Only the ATen calls that accept fewer key than query heads are rewritten: CPU flash attention
(`_scaled_dot_product_flash_attention_for_cpu`, which cuda-emu's template launch also
replaces, reading key head h // groups) and CUDA flash attention (`enable_gqa=True` runs it so).
The memory-efficient and cuDNN calls reject such inputs, so a call of either keeps its repeat
here; `lower_attention` reads the un-repeated tensors when it launches the template for one.
"""

from __future__ import annotations

import torch

from minicomp.ir.compute import TensorElement
from minicomp.ir.expr import Binary, Const, Var
from minicomp.ir.functor import collect, substitute
from minicomp.ir.graph import ArgRef, ComputeOp, ExternOp, Graph, TensorType, Value
from minicomp.passes.graph.rewrite import fresh_name, reads_own_element, value_names
from minicomp.passes.graph.simplify_views import is_view

aten = torch.ops.aten


def grouped_ops() -> tuple:
    """The fused attention ops that take key and value with fewer heads than the query (those
    this build has)."""
    names = ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention")
    return tuple(getattr(aten, n).default for n in names if hasattr(aten, n))


def group_query_attention(graph: Graph) -> Graph:
    """Every fused attention call taking grouped heads whose key and value are the same repeat
    over heads of smaller tensors, reading those instead."""
    ops = grouped_ops()
    calls = [n for n in graph.nodes if isinstance(n, ExternOp) and n.target in ops]
    if not calls:
        return graph
    producers = {v: n for n in graph.nodes for v in n.outputs}
    used = value_names(graph)
    rewritten: dict[ExternOp, ExternOp] = {}
    added: dict[ExternOp, list[ComputeOp]] = {}
    for call in calls:
        found = grouped_key_value(call, producers)
        if found is None:
            continue
        (k, v), groups = found
        new_inputs, views = list(call.inputs), []
        for repeat in dict.fromkeys((k, v)):
            source = ungrouped(producers[repeat], groups, used)
            if isinstance(source, ComputeOp):
                views.append(source)
                source = source.outputs[0]
            new_inputs = [source if x == repeat else x for x in new_inputs]
        rewritten[call] = call.replace(inputs=tuple(new_inputs))
        added[call] = views
    if not rewritten:
        return graph
    nodes = []
    for n in graph.nodes:
        nodes.extend(added.get(n, ()))
        nodes.append(rewritten.get(n, n))
    return graph.replace(nodes=tuple(nodes))


def grouped_key_value(call: ExternOp, producers: dict) -> tuple | None:
    """((key, value), groups) when the call's key and value are 4-D repeats over heads with
    the same group count, the query's head count theirs, and no other argument reads them;
    else None."""
    refs = _tensor_arguments(call)
    if not {"query", "key", "value"} <= refs.keys():
        return None
    q, k, v = (call.inputs[refs[name]] for name in ("query", "key", "value"))
    others = {i for name, i in refs.items() if name not in ("key", "value")}
    if refs["key"] in others or refs["value"] in others:
        return None  # sdpa(x, x, x): the query must stay as it is
    if not all(len(t.shape) == 4 for t in (q, k, v)) or q.shape[1] != k.shape[1]:
        return None
    groups = {_groups(producers.get(t)) for t in (k, v)}
    if len(groups) != 1 or None in groups:
        return None
    return (k, v), groups.pop()


def _tensor_arguments(call: ExternOp) -> dict[str, int]:
    """The index into the call's inputs of each tensor argument, by schema name (the
    importer gives a value read twice one input)."""
    names = [a.name for a in call.target._schema.arguments]
    given = [*zip(names, call.args), *call.kwargs]
    return {name: a.index for name, a in given if isinstance(a, ArgRef)}


def _groups(op) -> int | None:
    """g when view `op` ([B, H, S, D]) reads its head axis h only as h // g, g > 1 dividing H
    (for H // g == 1, as no index at all); else None."""
    if op is None or not is_view(op) or len(op.outputs[0].shape) != 4:
        return None
    heads = op.outputs[0].shape[1]
    if not isinstance(heads, int) or heads < 2:
        return None
    indices = op.definition.body.indices
    h = op.definition.axes[1]
    divisors = {q.b.value for q in _quotients(indices, h)}
    if len(divisors) > 1:
        return None
    g = divisors.pop() if divisors else heads
    if not isinstance(g, int) or g < 2 or heads % g:
        return None
    # Any other use of h (h % g, a bare h) would tell the repeated heads apart.
    zero = {q: Const(0, q.dtype) for q in _quotients(indices, h)}
    rest = tuple(substitute(i, zero) for i in indices)
    return None if h in collect(rest, Var) else g


def _quotients(indices: tuple, h: Var) -> list[Binary]:
    """The subexpressions h // c of `indices`, c a constant."""
    return [
        e
        for e in collect(indices, Binary)
        if e.op in ("idiv", "floordiv") and e.a == h and isinstance(e.b, Const)
    ]


def ungrouped(repeat: ComputeOp, groups: int, used: set) -> ComputeOp | Value:
    """The tensor `repeat` repeats `groups` times over heads: its source when that is it,
    else a view of its source over heads // groups heads."""
    d = repeat.definition
    h = d.axes[1]
    heads = {q: h for q in _quotients(d.body.indices, h)}
    indices = tuple(substitute(i, heads) for i in d.body.indices)
    body = TensorElement(d.body.tensor, indices)
    out = repeat.outputs[0]
    shape = (out.shape[0], out.shape[1] // groups, *out.shape[2:])
    src = repeat.inputs[0]
    if shape == tuple(src.shape) and reads_own_element(body, src.name, d.axes, shape):
        return src
    name = fresh_name(f"{src.name}_heads", used)
    value = Value(name, TensorType(shape, out.dtype, out.type.device))
    definition = d.replace(name=name, shape=shape, body=body)
    return ComputeOp(repeat.name, (src,), (value,), definition)
