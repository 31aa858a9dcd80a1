"""The function templates call to pick their config for one fused group while a graph
compiles: tuned where the target can time kernels, the template's heuristic elsewhere."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from minicomp.config import Options
from minicomp.ir.graph import FusedOp
from minicomp.tune.tuner import Runner, fusion_signature, tune

# Makes the Runner timing one group's candidates (with `aten`, the ATen candidate, when
# given), or returns None when the group cannot be measured (symbolic sizes, index inputs).
RunnerFactory = Callable[[FusedOp, Callable | None], Runner | None]


def make_chooser(options: Options, runner_for: RunnerFactory | None) -> Callable:
    """The function a CUDA template calls to pick its config for one fused group:
    ``choose(template, problem, op, aten=None, why="") -> tune.tuner.Choice``, `why` saying
    why the caller picked that template (kept in the Choice for explain).

    With a `runner_for` (a target that can time kernels) and search space 1 or 2 it tunes
    (tune/tuner.py) with the group's runner; `aten`, when given, is the ATen candidate: a
    function of a tune.tuner.Workload writing the group's outputs with PyTorch operators.
    Without one, at search space 0, and for groups the factory cannot measure, it returns the
    template's heuristic config.

    A chooser remembers its answers by template and group: the scheduler's call for a group
    that tune_contractions already asked about (with the ATen candidate) gets that answer
    back, without tuning the group a second time. ``choose.decisions()`` lists them as
    (group name, template name, Choice), for the compile record.
    """
    chosen: dict[tuple[str, Any], Any] = {}

    def decide(template: Any, problem: Any, op: FusedOp, aten: Callable | None):
        if runner_for is None:
            return tune(template, problem, options=options, runner=None)
        runner = runner_for(op, aten) if options.search_space > 0 else None
        if runner is None:
            return tune(template, problem, options=options, runner=None, level=0)
        return tune(template, problem, options=options, runner=runner, fusion=fusion_signature(op))

    def choose(
        template: Any, problem: Any, op: FusedOp, aten: Callable | None = None, why: str = ""
    ):
        key = (template.name, op)
        if key not in chosen:
            choice = decide(template, problem, op, aten)
            chosen[key] = dataclasses.replace(choice, why=why) if why else choice
        return chosen[key]

    choose.decisions = lambda: [(op.name, name, c) for (name, op), c in chosen.items()]
    return choose
