"""Graph inputs that are opaque objects (a DTensor's DeviceMesh), passed around the plan.

AOTAutograd flattens a DTensor parameter into its local tensor and its DeviceMesh, an opaque
script object (`FakeScriptObject` while tracing); the graph takes the mesh as an input and
returns it again beside each gradient, so that the DTensor can be rebuilt outside. No op of
the graph reads it. The compiled graph is the graph without those inputs (their places among
the outputs hold None), and `passing_opaque` puts each object back where the graph returned
it. An opaque input some op reads stays in the graph, where the importer refuses it (the
graph then runs eagerly, or raises with fallback="error").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx


@dataclass(frozen=True)
class OpaqueInputs:
    """Which inputs of a graph are opaque objects (`positions`, ascending) and where the graph
    returns them: (output position, index into `positions`) pairs."""

    positions: tuple[int, ...]
    returned: tuple[tuple[int, int], ...]

    def kept(self, count: int) -> list[int]:
        """The positions of the other inputs, among `count`."""
        dropped = set(self.positions)
        return [k for k in range(count) if k not in dropped]


def is_opaque(val: Any) -> bool:
    """Whether a placeholder's value is an opaque object (a script object, or a value of a
    type registered with torch._library.opaque_object) rather than a tensor or a number."""
    from torch._library.fake_class_registry import FakeScriptObject
    from torch._library.opaque_object import is_opaque_value

    return isinstance(val, (FakeScriptObject, torch.ScriptObject)) or is_opaque_value(val)


def split_opaque_inputs(gm: torch.fx.GraphModule) -> tuple[torch.fx.GraphModule, OpaqueInputs]:
    """`gm` without the opaque inputs only its output reads (a copy; `gm` itself when it has
    none), and where they were."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    output = next(n for n in gm.graph.nodes if n.op == "output")
    opaque = [
        k
        for k, n in enumerate(placeholders)
        if is_opaque(n.meta.get("val")) and all(u is output for u in n.users)
    ]
    if not opaque:
        return gm, OpaqueInputs((), ())
    index = {placeholders[k]: j for j, k in enumerate(opaque)}
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, Any] = {}
    for n in gm.graph.nodes:
        if n in index:
            env[n] = None
        elif n is output:
            graph.output(torch.fx.map_arg(n.args[0], lambda a: env[a]))
        else:
            env[n] = graph.node_copy(n, lambda a: env[a])
    outs = output.args[0] if isinstance(output.args[0], (list, tuple)) else (output.args[0],)
    returned = tuple((pos, index[a]) for pos, a in enumerate(outs) if a in index)
    return torch.fx.GraphModule(gm, graph), OpaqueInputs(tuple(opaque), returned)


def opaque_kind(val: Any) -> str:
    """What an opaque object is, for messages (the class a FakeScriptObject stands for)."""
    return getattr(val, "script_class_name", None) or type(val).__name__


def passing_opaque(call: Callable[[list], Any], opaque: OpaqueInputs) -> Callable[[list], Any]:
    """`call` (AOTAutograd's boxed convention, over the graph without opaque inputs) as a
    callable of the whole graph's inputs: the opaque ones are taken out of the argument list
    and put back at the outputs where the graph returns them."""
    dropped = set(opaque.positions)

    def run(args: list) -> Any:
        objects = [args[k] for k in opaque.positions]
        kept = [a for k, a in enumerate(args) if k not in dropped]
        args.clear()
        out = call(kept)
        if opaque.returned:
            out = list(out)
            for pos, j in opaque.returned:
                out[pos] = objects[j]
        return out

    run._boxed_call = True
    return run


def kept_positions(positions: Sequence[int], opaque: OpaqueInputs, count: int) -> tuple:
    """`positions` (of the whole graph's inputs) as positions among the kept inputs."""
    kept = opaque.kept(count)
    where = {k: j for j, k in enumerate(kept)}
    return tuple(where[k] for k in positions if k in where)
