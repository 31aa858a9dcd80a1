"""`minicomp.explain`: what minicomp did to a function, stage by stage."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from minicomp import config
from minicomp.ir.graph import FusedOp
from minicomp.lens.session import recording
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
    def fused_groups(self) -> list[tuple[str, tuple[str, ...]]]:
        """Each generated kernel's name with the kinds of ATen operator it fused (each named
        once, in graph order), over every graph."""
        return [
            (n.name, tuple(dict.fromkeys(m.split(".")[0] for m in n.members)))
            for r in self.records
            if r.graph is not None
            for n in r.graph.nodes
            if isinstance(n, FusedOp)
        ]

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
    """Compile `fn` for these arguments and report every stage; runs `fn` once. With the lens
    option (target cuda-emu), each kernel's report carries its estimated time on the
    lens_device."""
    import torch

    from minicomp.dynamo.backend import make_backend
    from minicomp.dynamo.backend import recording as recording_records

    records: list = []
    resolved = config.resolve(options)
    backend = make_backend(resolved)
    torch._dynamo.reset()
    compiled = torch.compile(fn, backend=backend)
    with recording_records(records, passes=True), recording() as session:
        compiled(*args, **kwargs)
    torch._dynamo.reset()
    if session.launches:
        _attach_estimates(records, session, resolved.lens_device)
    return Explanation(records)


def _attach_estimates(records: list, session: Any, device: str) -> None:
    """Give each record the lens's estimate of every kernel it launched (the first launch)."""
    from minicomp.lens.devices import get_device
    from minicomp.lens.profile import profile_session

    estimates = profile_session(session, get_device(device)).graph.kernels
    for launch, k in zip(session.launches, estimates):
        for r in records:
            if any(f is launch.function for f in r.kernels):
                text = (
                    f"{k.time * 1e6:.2f} us on {k.device.name}, {k.bound}-bound, "
                    f"{k.fraction_of_roofline:.0%} of roofline"
                )
                r.estimates.setdefault(k.kernel, text)


def explain_file(script: str, args: list[str]) -> str:
    """Run a Python script with every graph minicomp compiles reported; the reports' text."""
    import runpy
    import sys

    from minicomp.dynamo import backend

    records: list = []
    saved = sys.argv
    sys.argv = [script, *args]
    try:
        with backend.recording(records, passes=True), recording() as session:
            runpy.run_path(script, run_name="__main__")
    finally:
        sys.argv = saved
    if session.launches:
        _attach_estimates(records, session, config.resolve().lens_device)
    return str(Explanation(records)) if records else "minicomp compiled nothing in this script"
