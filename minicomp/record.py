"""What happened while compiling one graph, and its stage-by-stage text.

The compiler fills a CompileRecord as it goes; the torch.compile backend keeps the records
its callers ask for, and `minicomp.explain` and the verbose log print them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from minicomp.config import Options
from minicomp.ir.func import Function
from minicomp.ir.graph import ExternOp, FusedOp, Graph
from minicomp.ir.printer import function_str


@dataclass
class CompileRecord:
    """What happened while compiling one graph; `report` prints it."""

    kind: str = "forward"  # AOTAutograd's compiler: forward, backward or inference
    compile_id: str = ""  # Dynamo's id of the frame compile it came from ("3/1"), if any
    aten_graph: str = ""
    aten_op_count: int = 0
    aten_ops: dict[str, int] = field(default_factory=dict)  # ATen op -> its nodes in the graph
    passes: list = field(default_factory=list)  # (name, seconds, graph text)
    graph: Graph | None = None
    kernels: list[Function] = field(default_factory=list)
    source: str = ""
    times: dict[str, float] = field(default_factory=dict)
    error: str = ""
    target: str = ""  # the name of the target the graph was compiled for
    plan: Any = None  # what runs the graph: a Plan, or a GraphedPlan on cuda
    trace: bool = False  # keep the graph text after every pass (explain, verbose)
    options: Options | None = None  # what the graph was compiled with
    tuning: list = field(default_factory=list)  # (group, template, tune.tuner.Choice)
    estimates: dict[str, str] = field(default_factory=dict)  # kernel -> the lens's estimate
    cache: str = ""  # what the whole-graph cache did: hit, stored, off or not kept (why)

    @property
    def fallbacks(self) -> dict[str, str]:
        """ATen operator -> why it runs as an ATen call, in the compiled graph."""
        if self.graph is None:
            return {}
        return {n.name: n.reason for n in self.graph.nodes if isinstance(n, ExternOp)}


def _section(title: str, body: str) -> str:
    return f"==== {title} ====\n{body.rstrip()}\n"


def report(r: CompileRecord) -> str:
    """The stage-by-stage text of one CompileRecord."""
    parts = [_section(f"{r.kind} graph: ATen ({r.aten_op_count} ops)", r.aten_graph)]
    for name, seconds, text in r.passes:
        parts.append(_section(f"graph IR after {name} ({seconds * 1e3:.1f} ms)", text))
    if r.graph is not None:
        groups = [n for n in r.graph.nodes if isinstance(n, FusedOp)]
        lines = [f"{g.name}: {', '.join(g.members)}" for g in groups]
        parts.append(_section(f"fused groups ({len(groups)})", "\n".join(lines) or "(none)"))
        externs = [n for n in r.graph.nodes if isinstance(n, ExternOp)]
        lines = [f"{n.name}: {n.reason}" for n in externs]
        parts.append(_section(f"ops run by ATen ({len(externs)})", "\n".join(lines) or "(none)"))
    if r.tuning:
        lines = [
            f"{group}: {template} {c.config}\n    {c.describe()}" for group, template, c in r.tuning
        ]
        parts.append(_section(f"template configs ({len(r.tuning)})", "\n".join(lines)))
    if r.estimates:
        lines = [f"{name}: {text}" for name, text in r.estimates.items()]
        parts.append(_section("estimated time per launch (the lens)", "\n".join(lines)))
    for k in r.kernels:
        title = f"kernel IR: {k.name}"
        if k.name in r.estimates:
            title += f" (estimated {r.estimates[k.name]})"
        parts.append(_section(title, function_str(k)))
    if r.source:
        parts.append(_section("generated source", r.source))
    if r.cache:
        parts.append(_section("graph cache", r.cache))
    if r.times:
        parts.append(
            _section(
                "compile time", "\n".join(f"{k}: {v * 1e3:.1f} ms" for k, v in r.times.items())
            )
        )
    if r.error:
        parts.append(_section("fell back to eager", r.error))
    return "\n".join(parts)
