"""Helpers the graph passes share: naming new values, renaming values everywhere they are used."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from minicomp.ir.compute import Compute, TensorElement, TensorInput
from minicomp.ir.expr import Const, Expr, Var
from minicomp.ir.functor import Mutator, collect
from minicomp.ir.graph import ComputeOp, FusedOp, Graph, Op, Value


class _RenameInputs(Mutator):
    """Points TensorElements of renamed TensorInputs at the new names."""

    def __init__(self, by_name: Mapping[str, Value]):
        super().__init__()
        self.by_name = by_name

    def visit_TensorElement(self, e: TensorElement) -> TensorElement:
        t = e.tensor
        if isinstance(t, TensorInput) and t.name in self.by_name:
            v = self.by_name[t.name]
            t = TensorInput(v.name, v.shape, v.dtype)
        elif isinstance(t, Compute):
            # Not expected in a graph's definitions, but a nested compute reads inputs too.
            t = self.visit(t)
        indices = self.visit(e.indices)
        if t is e.tensor and indices is e.indices:
            return e
        return TensorElement(t, indices)


def _resolve(mapping: Mapping[Value, Value]) -> dict[Value, Value]:
    """The mapping with chains (a -> b, b -> c) followed to their ends."""
    out = {}
    for old, new in mapping.items():
        seen = {old}
        while new in mapping and new not in seen:
            seen.add(new)
            new = mapping[new]
        out[old] = new
    return out


def rename_op(op: Op, mapping: Mapping[Value, Value]) -> Op:
    """`op` reading `mapping[v]` wherever it read a value `v` (the same op when none is read).

    A compute or fused op reads each value once: repeated inputs are merged (its bodies name
    values, not positions); an extern op keeps its positional inputs as they are.
    """
    if not any(v in mapping for v in op.inputs):
        return op
    inputs = tuple(mapping.get(v, v) for v in op.inputs)
    if not isinstance(op, (ComputeOp, FusedOp)):
        return op.replace(inputs=inputs)
    inputs = tuple(dict.fromkeys(inputs))
    renamer = _RenameInputs({old.name: new for old, new in mapping.items()})
    if isinstance(op, ComputeOp):
        return op.replace(inputs=inputs, definition=renamer.visit(op.definition))
    return op.replace(inputs=inputs, stages=renamer.visit(op.stages))


def rename_values(graph: Graph, mapping: Mapping[Value, Value]) -> Graph:
    """`graph` with every use of a value `v` (operator inputs, the TensorInputs of definitions
    and fused bodies, graph outputs) replaced by `mapping[v]`; the same graph when none is used.

    Chains are followed (a -> b, b -> c sends a to c). Graph inputs and operator outputs are
    left as they are: a pass drops the operators whose outputs it renamed away.
    """
    if not mapping:
        return graph
    mapping = _resolve(mapping)
    nodes = tuple(rename_op(n, mapping) for n in graph.nodes)
    outputs = tuple(mapping.get(o, o) if isinstance(o, Value) else o for o in graph.outputs)
    if all(a is b for a, b in zip(nodes, graph.nodes)) and outputs == graph.outputs:
        return graph
    return graph.replace(nodes=nodes, outputs=outputs)


def inputs_read(d: Compute, candidates: Sequence[Value]) -> tuple[Value, ...]:
    """The values among `candidates` that definition `d` reads, in their order."""
    read = {el.tensor.name for el in collect(d.body, TensorElement)}
    return tuple(v for v in candidates if v.name in read)


def value_names(graph: Graph) -> set[str]:
    """The names of `graph`'s values: inputs, constants and every op's outputs."""
    names = {v.name for v in graph.inputs if isinstance(v, Value)} | set(graph.constants)
    names.update(v.name for n in graph.nodes for v in n.outputs)
    return names


def fresh_name(base: str, used: set[str]) -> str:
    """`base`, or `base` with the first free numeric suffix; recorded in `used`."""
    name, n = base, 1
    while name in used:
        name, n = f"{base}{n}", n + 1
    used.add(name)
    return name


def reads_own_element(e: Expr, name: str, axes: Sequence[Var], shape: Sequence) -> bool:
    """Whether `e` is the element of tensor `name` at the op's own position: indices that are
    its axes, where a size-1 axis may read index 0 instead (simplify_views writes it so)."""
    if not isinstance(e, TensorElement) or e.tensor.name != name or len(e.indices) != len(axes):
        return False
    return all(
        i == v or isinstance(d, int) and d == 1 and isinstance(i, Const) and i.value == 0
        for i, v, d in zip(e.indices, axes, shape)
    )
