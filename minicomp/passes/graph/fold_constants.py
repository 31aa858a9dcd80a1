"""Constant folding: compute ops whose inputs are all constants are evaluated at compile time."""

from __future__ import annotations

from typing import Any

from minicomp.ir.compute import Reduce
from minicomp.ir.expr import Var
from minicomp.ir.functor import collect
from minicomp.ir.graph import ComputeOp, Graph

# Bigger results stay computed at run time: a folded broadcast would only fill memory.
MAX_FOLDED_ELEMENTS = 2**20


def fold_constants(graph: Graph) -> Graph:
    """Replace each compute op reading only constants (or nothing, like full or arange) and
    producing at most MAX_FOLDED_ELEMENTS elements of a static shape by a constant.

    Values are computed by the reference evaluator in the op's own dtype, so folding never
    changes them. Folded constants are contiguous CPU tensors. A graph output may become a
    constant: the runtime returns a fresh copy of it, never the constant itself. The constants
    the folded ops read stay until dead-code elimination drops them.
    """
    constants = dict(graph.constants)
    nodes = []
    for n in graph.nodes:
        value = _fold(n, constants) if isinstance(n, ComputeOp) else None
        if value is None:
            nodes.append(n)
        else:
            constants[n.outputs[0].name] = value
    if len(nodes) == len(graph.nodes):
        return graph
    return graph.replace(nodes=tuple(nodes), constants=constants)


def _fold(n: ComputeOp, constants: dict[str, Any]) -> Any:
    """The value of `n` as a torch tensor, or None when it is not to be folded."""
    import torch

    from minicomp.ir.evaluate import evaluate
    from minicomp.ir.types import to_torch

    out = n.outputs[0]
    if any(v.name not in constants for v in n.inputs) or _has_free_symbols(n):
        return None
    shape = out.shape
    if not all(isinstance(d, int) for d in shape) or _numel(shape) > MAX_FOLDED_ELEMENTS:
        return None
    arrays = {v.name: _to_numpy(constants[v.name]) for v in n.inputs}
    try:
        result = evaluate(n.definition, arrays, {})
    except (ZeroDivisionError, IndexError, ValueError):
        # Undefined at run time too (division by zero, an index out of range): leave it there.
        return None
    return torch.from_numpy(result.copy()).to(to_torch(out.dtype)).reshape(shape)


def _has_free_symbols(n: ComputeOp) -> bool:
    """Whether the definition uses size symbols (variables other than its own axes)."""
    d = n.definition
    bound = set(d.axes)
    for r in collect(d.body, Reduce):
        bound.update(r.axes)
    return any(v not in bound for v in collect(d, Var))


def _numel(shape: tuple) -> int:
    out = 1
    for d in shape:
        out *= d
    return out


def _to_numpy(t: Any):
    """A constant as the numpy array the evaluator expects (bf16 as float32, exact)."""
    import torch

    t = t.detach().cpu().contiguous()
    if t.dtype == torch.bfloat16:
        t = t.float()
    return t.numpy()
