"""Common-subexpression elimination: operators computing the same thing are computed once."""

from __future__ import annotations

import math
from typing import Any

from minicomp.ir.expr import Const
from minicomp.ir.graph import ComputeOp, ExternOp, Graph, KernelOp, Op, Value
from minicomp.passes.graph.rewrite import rename_op, rename_values

# Extern targets whose name holds one of these draw random numbers: two calls differ.
_RANDOM_WORDS = ("rand", "dropout", "normal", "bernoulli", "uniform", "multinomial")


def eliminate_common_subexpressions(graph: Graph) -> Graph:
    """Merge operators that compute the same values from the same inputs.

    Compute ops match when their definitions are equal up to the output name; extern ops when
    they call the same deterministic target with the same arguments. Later duplicates are
    dropped and their uses read the first one's outputs.
    """
    seen: dict[Any, Op] = {}
    mapping: dict[Value, Value] = {}
    nodes = []
    for n in graph.nodes:
        n = rename_op(n, mapping)
        key = _key(n)
        first = seen.get(key) if key is not None else None
        if first is None:
            if key is not None:
                seen[key] = n
            nodes.append(n)
            continue
        mapping.update(zip(n.outputs, first.outputs))
    if not mapping:
        return graph
    return rename_values(graph.replace(nodes=tuple(nodes)), mapping)


def _key(n: Op) -> Any:
    """What two operators computing the same values share, or None when `n` never merges."""
    types = tuple(v.type for v in n.outputs)
    if isinstance(n, ComputeOp):
        return ("compute", n.inputs, types, n.definition.replace(name=""), _zero_signs(n))
    if isinstance(n, KernelOp):
        scalars = tuple(_tagged(a.value) if isinstance(a, Const) else a for a in n.args)
        return ("kernel", n.function, n.callees, n.inputs, types, scalars)
    if isinstance(n, ExternOp) and not n.has_effects and not _is_random(n.target):
        key = (
            "extern",
            n.target,
            n.inputs,
            types,
            n.result_paths,
            _tagged(n.args),
            _tagged(n.kwargs),
        )
        try:
            hash(key)
        except TypeError:
            return None
        return key
    return None


def _zero_signs(n: ComputeOp) -> frozenset:
    """The signs of the float zero literals in `n`'s definition: structural equality takes
    -0.0 for 0.0, so definitions differing only there must not merge. (A set, so a definition
    holding both signs is only told apart from one holding a single sign.)"""
    from minicomp.ir.node import Node

    signs, stack, seen = set(), [n.definition.body], set()
    while stack:
        x = stack.pop()
        if id(x) in seen:
            continue
        seen.add(id(x))
        if isinstance(x, Const) and x.dtype.is_float and x.value == 0:
            signs.add(math.copysign(1.0, x.value))
        elif isinstance(x, Node):
            stack.extend(x.children())
        elif isinstance(x, tuple):
            stack.extend(x)
    return frozenset(signs)


def _tagged(x: Any) -> Any:
    """`x` with every Python scalar paired with its type: 1, 1.0 and True mean different
    things to ATen (result types), and -0.0 differs from 0.0."""
    if isinstance(x, (tuple, list)):
        return (type(x).__name__, tuple(_tagged(y) for y in x))
    if isinstance(x, float):
        return ("float", x, math.copysign(1.0, x))
    if isinstance(x, (bool, int)):
        return (type(x).__name__, x)
    return x


def _is_random(target: Any) -> bool:
    import torch

    name = str(getattr(target, "__name__", target)).lower() + str(target).lower()
    if any(w in name for w in _RANDOM_WORDS):
        return True
    return torch.Tag.nondeterministic_seeded in getattr(target, "tags", ())
