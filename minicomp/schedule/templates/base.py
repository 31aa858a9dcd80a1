"""A template as the scheduler and the tuner see it: a name and four functions of a problem."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from minicomp.ir import stmt as S
from minicomp.ir.func import Function
from minicomp.ir.functor import collect


def _always(problem: Any) -> bool:
    return True


@dataclass(frozen=True)
class Template:
    """A template module's interface (minicomp.tune.tuner.Template): `space(problem, level)`
    lists the candidate configs of a search-space level, `heuristic(problem)` is the level-0
    config, `instantiate(problem, config)` the kernel, `applies(problem)` whether the template
    computes the problem at all."""

    name: str
    space: Callable[[Any, int], list]
    heuristic: Callable[[Any], Any]
    instantiate: Callable[[Any, Any], Function]
    applies: Callable[[Any], bool] = _always

    def candidates(self, problem: Any, level: int) -> list:
        """The configs of search-space `level` for `problem`."""
        return self.space(problem, level)

    def signature(self, problem: Any) -> str:
        """The tuning database's key of `problem`."""
        return problem.signature()


def finish(kernel: Function, name: str, template: str, **attrs: Any) -> Function:
    """A template's kernel, named `name`, its launch attributes recording
    `template` (and `attrs`, such as min_blocks).

    Raises ValueError when two declarations share a variable (IR variables are equal by name
    and type: an inlined fragment must not reuse a name of the kernel's)."""
    seen: set = set()
    for node in collect(kernel.body, (S.Declare, S.DeclareArray, S.For)):
        if node.var in seen:
            raise ValueError(f"{template}: {node.var.name} is declared twice")
        seen.add(node.var)
    return kernel.replace(name=name, attrs=kernel.attrs.replace(template=template, **attrs))
