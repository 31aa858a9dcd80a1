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

Anywhere else the copy stays, an ATen `copy_` into the input: correct, as eager, at the cost
of the temporary. An input whose old value is read later (by an operator after the write, a
view of it, or the graph's outputs) keeps it.
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
    """`graph` with each `copy_(input, value)` dropped where `value` can be computed in the
    input's memory (see the module docstring)."""
    inputs = {v for v in graph.inputs if isinstance(v, Value)}
    nodes: list[Op | None] = list(graph.nodes)
    writes = dict(graph.input_writes)
    read_after = _readers(graph)
    position = {v: k for k, n in enumerate(graph.nodes) for v in n.outputs}
    returned = graph.output_values()
    renamed: dict[Value, Value] = {}
    for k, n in enumerate(graph.nodes):
        if not _is_input_copy(n, inputs) or read_after.intersection(n.outputs):
            continue
        target, value = n.inputs
        j = position.get(value)
        if j is None or (value.shape, value.dtype) != (target.shape, target.dtype):
            continue
        aliases = _aliases(graph, target, n)
        if returned & aliases or any(
            m is not n and aliases.intersection(m.inputs) for m in graph.nodes[j + 1 :]
        ):
            continue  # the input's old value is read after the write
        producer = nodes[j]
        if isinstance(producer, ExternOp):
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
        else:
            continue
        nodes[k] = None
        # The input itself, returned (the copy's result): now the value, in its memory.
        renamed.update((o, value) for o in n.outputs)
    if all(n is not None for n in nodes):
        return graph
    kept = tuple(n for n in nodes if n is not None)
    outputs = tuple(renamed.get(o, o) if isinstance(o, Value) else o for o in graph.outputs)
    return graph.replace(nodes=kept, outputs=outputs, input_writes=writes)


def _is_input_copy(n: Op, inputs: set[Value]) -> bool:
    """Whether `n` is AOTAutograd's `copy_(input, value)` of a graph input."""
    return (
        isinstance(n, ExternOp)
        and n.target is COPY
        and n.args[:2] == (ArgRef(0), ArgRef(1))
        and len(n.inputs) == 2
        and n.inputs[0] in inputs
        and n.inputs[1] is not n.inputs[0]
        and not n.kwargs
    )


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
