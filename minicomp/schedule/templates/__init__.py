"""Templates for fused groups the auto-scheduler computes poorly: matrix products (SIMT and
tensor cores) with their prologues and epilogues inlined at the loads and stores.

Each template is a module with a script-DSL kernel and its search space beside it, exposed as
an object with the tuner's interface (minicomp.tune.tuner.Template): `name`,
`candidates(problem, level)`, `heuristic(problem)` (the level-0 config, chosen without
measuring), `instantiate(problem, config)` (a kernel Function named after the fused group,
its parameters the group's inputs, outputs and size symbols) and `signature(problem)` (the
tuning database's key).

`schedule_contraction(op, layouts, options)` is what the CUDA scheduler calls: the kernel of
a fused group that is a matrix product, or None (the auto-scheduler then computes it).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

from minicomp.config import Options
from minicomp.ir.func import Function
from minicomp.ir.graph import FusedOp
from minicomp.schedule.common import Strides
from minicomp.schedule.templates import matmul_simt, matmul_tc
from minicomp.schedule.templates.base import arch_of, sm_count_of
from minicomp.schedule.templates.problem import MatmulProblem, matmul_problem
from minicomp.script.errors import ScriptError

log = logging.getLogger(__name__)

TEMPLATES = {t.name: t for t in (matmul_tc.TEMPLATE, matmul_simt.TEMPLATE)}

# Picks a template's config for one fused group (tune.chooser.make_chooser):
# choose(template, problem, op) -> an object whose `config` is the config (tune.tuner.Choice).
Chooser = Callable[..., Any]


def select_template(problem: MatmulProblem, options: Options | None = None):
    """The template computing `problem`: tensor cores for f16/bf16 operands (and 8-bit
    integers summed in i32, float8 summed in f32 on sm_89+) when the `tensor_cores` option
    allows them, else the SIMT template."""
    allow_tc = options.tensor_cores if options is not None else True
    if allow_tc and matmul_tc.TEMPLATE.applies(problem):
        return matmul_tc.TEMPLATE
    return matmul_simt.TEMPLATE


def schedule_contraction(
    op: FusedOp,
    layouts: Mapping[str, Strides],
    options: Options | None = None,
    choose: Chooser | None = None,
) -> Function | None:
    """The template kernel of fused group `op`, or None when it is not a matrix product a
    template computes. `choose` picks the config (default: the template's heuristic), for the
    GPU of `options.sm_count` SMs."""
    problem = matmul_problem(op, layouts, sm_count_of(options), arch_of(options))
    if problem is None:
        return None
    template = select_template(problem, options)
    if choose is None:
        config = template.heuristic(problem)
    else:
        config = choose(template, problem, op).config
    try:
        return template.instantiate(problem, config)
    except ScriptError as err:
        # A combination the template does not handle: the auto-scheduler's kernel is slow
        # but correct, which beats failing the whole graph.
        log.warning(
            "minicomp: %s cannot compute %s (%s); auto-scheduling it", template.name, op.name, err
        )
        return None


__all__ = [
    "TEMPLATES",
    "MatmulProblem",
    "matmul_problem",
    "schedule_contraction",
    "select_template",
]
