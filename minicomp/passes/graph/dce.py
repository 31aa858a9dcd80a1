"""Dead-code elimination: drop operators and constants nothing reads."""

from __future__ import annotations

from minicomp.ir.graph import ExternOp, Graph, Value


def eliminate_dead_code(graph: Graph) -> Graph:
    """Drop the operators none of whose outputs a later operator or the graph returns, and the
    constants no remaining operator or output reads.

    The graph is functional, so an operator whose results are unused can go, except an ATen
    call with effects (a mutation, a check that returns nothing, an op PyTorch declares
    effectful: ExternOp.has_effects).
    """
    live: set[Value] = set(graph.output_values())
    kept = []
    for n in reversed(graph.nodes):
        if any(v in live for v in n.outputs) or isinstance(n, ExternOp) and n.has_effects:
            kept.append(n)
            live.update(n.inputs)
    kept.reverse()
    read = {v.name for v in live}
    constants = {k: t for k, t in graph.constants.items() if k in read}
    if len(kept) == len(graph.nodes) and len(constants) == len(graph.constants):
        return graph
    return graph.replace(nodes=tuple(kept), constants=constants)
