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
from minicomp.schedule.templates import (
    attention,
    attention_hopper,
    matmul_hopper,
    matmul_simt,
    matmul_tc,
)
from minicomp.schedule.templates.base import arch_of, sm_count_of
from minicomp.schedule.templates.problem import MatmulProblem, matmul_problem
from minicomp.script.errors import ScriptError

log = logging.getLogger(__name__)

TEMPLATES = {t.name: t for t in (matmul_hopper.TEMPLATE, matmul_tc.TEMPLATE, matmul_simt.TEMPLATE)}

# Picks a template's config for one fused group (tune.chooser.make_chooser):
# choose(template, problem, op, why=) -> an object whose `config` is the config (tune.tuner.Choice).
Chooser = Callable[..., Any]


def select_template(problem: MatmulProblem, options: Options | None = None):
    """The template computing `problem` (template_choice's)."""
    return template_choice(problem, options)[0]


def template_choice(problem: MatmulProblem, options: Options | None = None) -> tuple[Any, str]:
    """(the template computing `problem`, why, in a few words for explain). When the
    `tensor_cores` option allows them: the Hopper template (TMA and wgmma) on sm_90a where it
    applies (matmul_hopper.refusal), else the tensor-core one for f16/bf16 operands (and 8-bit
    integers summed in i32, float8 summed in f32 on sm_89+); else the SIMT template."""
    allow_tc = options.tensor_cores if options is not None else True
    if not allow_tc:
        return matmul_simt.TEMPLATE, "the tensor_cores option is off"
    refused = matmul_hopper.refusal(problem)
    if refused is None:
        return matmul_hopper.TEMPLATE, f"{matmul_hopper.WGMMA_ARCH}: TMA and wgmma"
    if matmul_tc.TEMPLATE.applies(problem):
        return matmul_tc.TEMPLATE, f"not {matmul_hopper.NAME}: {refused}"
    return matmul_simt.TEMPLATE, "no tensor-core instruction for these operands"


def attention_choice(problem) -> tuple[Any, str]:
    """(the attention template module computing AttentionProblem `problem`, why, in a few
    words for explain): the Hopper one (TMA and wgmma) on sm_90a where it applies
    (attention_hopper.refusal), else attention.py's (mma.sync, cp.async), which the pass
    checks applies."""
    refused = attention_hopper.refusal(problem)
    if refused is None:
        return attention_hopper, f"{attention_hopper.WGMMA_ARCH}: TMA and wgmma"
    return attention, f"not {attention_hopper.NAME}: {refused}"


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
    template, why = template_choice(problem, options)
    if choose is None:
        config = template.heuristic(problem)
    else:
        config = choose(template, problem, op, why=why).config
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
    "attention_choice",
    "matmul_problem",
    "schedule_contraction",
    "select_template",
    "template_choice",
]
