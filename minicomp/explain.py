"""`minicomp.explain`: what minicomp did to a function, stage by stage."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from minicomp import config
from minicomp.ir.graph import ExternOp, FusedOp
from minicomp.ir.printer import function_str


@dataclass
class Explanation:
    """Every graph minicomp compiled for one call, with counts and a printable report."""

    records: list = field(default_factory=list)

    @property
    def kernel_count(self) -> int:
        """Kernels minicomp generated, over every graph."""
        return sum(len(r.kernels) for r in self.records)

    @property
    def aten_op_count(self) -> int:
        """ATen operators in the imported graphs."""
        return sum(r.aten_op_count for r in self.records)

    @property
    def fallbacks(self) -> dict[str, str]:
        """ATen operator → why it runs as an ATen call instead of a generated kernel."""
        out: dict[str, str] = {}
        for r in self.records:
            if r.graph is not None:
                for n in r.graph.nodes:
                    if isinstance(n, ExternOp):
                        out.setdefault(n.name, n.reason)
            if r.error:
                out.setdefault("<whole graph>", r.error)
        return out

    def __str__(self) -> str:
        return "\n".join(_report(r) for r in self.records) + "\n" + self.summary()

    def summary(self) -> str:
        """One line of counts."""
        return (
            f"minicomp: {self.aten_op_count} ATen ops -> {self.kernel_count} kernels, "
            f"{len(self.fallbacks)} ops run by ATen"
        )


def _section(title: str, body: str) -> str:
    return f"==== {title} ====\n{body.rstrip()}\n"


def report(r) -> str:
    """The stage-by-stage text of one CompileRecord."""
    return _report(r)


def _report(r) -> str:
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
    for k in r.kernels:
        parts.append(_section(f"kernel IR: {k.name}", function_str(k)))
    if r.source:
        parts.append(_section("generated source", r.source))
    if r.times:
        parts.append(
            _section(
                "compile time", "\n".join(f"{k}: {v * 1e3:.1f} ms" for k, v in r.times.items())
            )
        )
    if r.error:
        parts.append(_section("fell back to eager", r.error))
    return "\n".join(parts)


def explain(fn: Callable, *args: Any, options: dict | None = None, **kwargs: Any) -> Explanation:
    """Compile `fn` for these arguments and report every stage; runs `fn` once."""
    import torch

    from minicomp.dynamo.backend import make_backend

    records: list = []
    backend = make_backend(config.resolve(options), records)
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=backend)
    compiled(*args, **kwargs)
    torch._dynamo.reset()
    return Explanation(records)


def explain_file(script: str, args: list[str]) -> str:
    """Run a Python script with every graph minicomp compiles reported; the reports' text."""
    import runpy
    import sys

    from minicomp.dynamo import backend

    records: list = []
    saved = sys.argv
    sys.argv = [script, *args]
    try:
        with backend.recording(records):
            runpy.run_path(script, run_name="__main__")
    finally:
        sys.argv = saved
    return str(Explanation(records)) if records else "minicomp compiled nothing in this script"
