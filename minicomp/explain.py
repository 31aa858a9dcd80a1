"""`minicomp.explain`: what minicomp did to a function, stage by stage."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from minicomp import config
from minicomp.record import report


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
            for name, reason in r.fallbacks.items():
                out.setdefault(name, reason)
            if r.error:
                out.setdefault("<whole graph>", r.error)
        return out

    def __str__(self) -> str:
        return "\n".join(report(r) for r in self.records) + "\n" + self.summary()

    def summary(self) -> str:
        """One line of counts."""
        return (
            f"minicomp: {self.aten_op_count} ATen ops -> {self.kernel_count} kernels, "
            f"{len(self.fallbacks)} ops run by ATen"
        )


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
