"""A template as the scheduler and the tuner see it: a name and four functions of a problem."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from minicomp.ir.func import Function


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
