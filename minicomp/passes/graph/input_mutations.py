"""An inference graph's writes of its inputs made in the inputs' own memory.

AOTAutograd keeps the data mutations of an inference graph's inputs in the graph
(keep_inference_input_mutations, dynamo/backend.py): the graph computes each mutated input's
new value functionally and ends with `copy_(input, value)`. Run as it is, that is a new tensor
holding the whole input and a copy of it back. After fusion, each such copy goes away where
the value can be computed in the input's memory instead:

- the value is a functional scatter of the input (`index_put`, `index_copy`, `scatter`...,
  an ATen call: a KV cache written at a step's position) and nothing reads the input's old
  value after it: the scatter runs as its in-place variant (`index_put_`) on the input, and
  writes only the scattered rows;
- the value is the output of a kernel that reads the input, if at all, only at the element it
  writes (`buf.mul_(2)`, `buf.add_(x)`, `buf.copy_(x.sin())`), and nothing reads the input's
  old value after it: the kernel writes it into the input (`Graph.input_writes`, which the
  layouts and the plan builder follow), one pass over the input and no temporary.

A slice or select assignment into an input arrives as a copy into a view of it
(dynamo/scatter_views.py): where the assigned value is a kernel's output that reads no part of
the input, the kernel writes it into the view (taken before the kernel runs); else the copy of
the assigned elements stays.

Anywhere else the copy stays, an ATen `copy_` into the input: correct, as eager, at the cost
of the temporary. An input whose old value is read later (by an operator after the write, a
view of it, or the graph's outputs) keeps it, and so does a value the graph returns (eager's
is a tensor of its own, which a later write into the input must not change).
"""

from __future__ import annotations

import dataclasses

import torch

from minicomp.ir.compute import TensorElement, TensorInput
from minicomp.ir.expr import Expr
from minicomp.ir.functor import Mutator, collect
from minicomp.ir.graph import ArgRef, ExternOp, FusedOp, Graph, Op, StoreStage, Value
from minicomp.passes.graph.reinplace import scatter_in_place

COPY = torch.ops.aten.copy_.default


def write_inputs_in_place(graph: Graph) -> Graph:
    """`graph` with each `copy_(input, value)` (or copy into a view of an input) dropped
    where `value` can be computed in that memory (see the module docstring)."""
    inputs = {v for v in graph.inputs if isinstance(v, Value)}
    views = _input_views(graph, inputs)
    nodes: list[Op | None] = list(graph.nodes)
    before: dict[int, list[Op]] = {}  # node index -> views moved to just before it
    writes = dict(graph.input_writes)
    read_after = _readers(graph)
    position = {v: k for k, n in enumerate(graph.nodes) for v in n.outputs}
    returned = graph.output_values()
    renamed: dict[Value, Value] = {}
    for k, n in enumerate(graph.nodes):
        if not _is_copy(n) or read_after.intersection(n.outputs):
            continue
        target, value = n.inputs
        base, view = (target, None) if target in inputs else views.get(target, (None, None))
        j = position.get(value)
        if base is None or j is None or (value.shape, value.dtype) != (target.shape, target.dtype):
            continue
        aliases = _aliases(graph, base, n)
        if returned & (aliases | _aliases(graph, value, n)):
            continue  # eager returns the old value, or the new one in memory of its own
        if any(
            m is not n and m is not view and aliases.intersection(m.inputs)
            for m in graph.nodes[j + 1 :]
        ):
            continue  # the input's old value is read after the write
        producer = nodes[j]
        if isinstance(producer, ExternOp) and view is None:
            new = scatter_in_place(producer)
            if new is None or producer.inputs[new.args[0].index] is not target:
                continue
            if any(v in aliases for v in producer.inputs if v is not target):
                continue  # it would read what it writes
            nodes[j] = dataclasses.replace(new, name=f"{producer.name} (in place)")
        elif isinstance(producer, FusedOp):
            kernel = None
            if value.name not in writes:
                kernel = _written_in_place(producer, value, target, aliases)
            if kernel is None:
                continue
            nodes[j] = kernel
            writes[value.name] = target.name
            v = graph.nodes.index(view) if view is not None else -1
            if v > j:  # the view the kernel writes into is taken before it runs
                nodes[v] = None
                before.setdefault(j, []).append(view)
        else:
            continue
        nodes[k] = None
        # The input itself, returned (the copy's result): now the value, in its memory.
        renamed.update((o, value) for o in n.outputs)
    if all(n is not None for n in nodes):
        return graph
    kept = tuple(m for j, n in enumerate(nodes) for m in (*before.get(j, ()), n) if m is not None)
    outputs = tuple(renamed.get(o, o) if isinstance(o, Value) else o for o in graph.outputs)
    return graph.replace(nodes=kept, outputs=outputs, input_writes=writes)


def _is_copy(n: Op) -> bool:
    """Whether `n` is `copy_(destination, value)` (AOTAutograd's of a mutated input)."""
    return (
        isinstance(n, ExternOp)
        and n.target is COPY
        and n.args[:2] == (ArgRef(0), ArgRef(1))
        and len(n.inputs) == 2
        and not n.kwargs
    )


def _input_views(graph: Graph, inputs: set[Value]) -> dict[Value, tuple[Value, ExternOp]]:
    """The values ATen calls return as views of a graph input (its slice or select, which
    the importer keeps a view where the graph writes into it: dynamo/scatter_views.py): value
    -> (input, the call)."""
    out = {}
    for n in graph.nodes:
        first = n.args[0] if isinstance(n, ExternOp) and n.args else None
        if isinstance(first, ArgRef) and n.returns_views and not n.mutates:
            base = n.inputs[first.index]
            if base in inputs and len(n.inputs) == 1 and len(n.outputs) == 1:
                out[n.outputs[0]] = (base, n)
    return out


def _readers(graph: Graph) -> set[Value]:
    """The values some operator reads."""
    return {v for n in graph.nodes for v in n.inputs}


def _aliases(graph: Graph, v: Value, copy: Op) -> set[Value]:
    """`v` and the values ATen calls other than `copy` return as views of it (or of those),
    transitively."""
    out = {v}
    for n in graph.nodes:
        if n is copy:
            continue
        if isinstance(n, ExternOp) and n.returns_views and out.intersection(n.inputs):
            out.update(n.outputs)
    return out


def _written_in_place(
    n: FusedOp, value: Value, target: Value, aliases: set[Value]
) -> FusedOp | None:
    """Kernel `n` computing `value` in the memory of input `target` (whose views are
    `aliases`), or None where it cannot: it must store `value` once, read no view of
    `target`, and read `target` itself, if at all, only at the element it stores `value` to
    (an elementwise kernel) in the stages up to that store. Its reads of `target` then read
    `value`'s own memory, before the store to it.

    Reading through the output, not a second parameter on the same memory: the kernels'
    pointer parameters are `__restrict__`, and a cpu loop whose near math falls back runs
    again, which is only right for loops reading no memory they write
    (backends/cpu/near_math.py)."""
    if aliases.intersection(n.inputs) - {target}:
        return None
    stores = [k for k, s in enumerate(n.stages) if _stores(n, s, value)]
    if len(stores) != 1:
        return None
    if target not in n.inputs:
        return n
    store = n.stages[stores[0]]
    if n.is_reduction or target.type.strides is None:
        return None
    for k, stage in enumerate(n.stages):
        loads = [e for e in collect(stage, TensorElement) if _names(e, target)]
        if loads and (k > stores[0] or any(e.indices != store.indices for e in loads)):
            return None
    mine = TensorInput(value.name, value.shape, value.dtype)
    stages = _ReadFrom(target.name, mine).visit(n.stages)
    return n.replace(inputs=tuple(v for v in n.inputs if v is not target), stages=stages)


def _stores(n: FusedOp, stage: object, value: Value) -> bool:
    return isinstance(stage, StoreStage) and n.outputs[stage.output] is value


def _names(e: TensorElement, v: Value) -> bool:
    return isinstance(e.tensor, TensorInput) and e.tensor.name == v.name


class _ReadFrom(Mutator):
    """Replaces the elements of tensor `name` by the same elements of `tensor`."""

    def __init__(self, name: str, tensor: TensorInput):
        super().__init__()
        self.name = name
        self.tensor = tensor

    def visit_TensorElement(self, e: TensorElement) -> Expr:
        indices = self.visit(e.indices)
        if isinstance(e.tensor, TensorInput) and e.tensor.name == self.name:
            return TensorElement(self.tensor, indices)
        return e if indices == e.indices else TensorElement(e.tensor, indices)
