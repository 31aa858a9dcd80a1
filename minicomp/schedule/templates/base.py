"""A template as the scheduler and the tuner see it: a name and four functions of a problem."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

from minicomp.backends.cuda.arch import PORTABLE
from minicomp.backends.cuda.sm_count import H100_SMS
from minicomp.config import Options
from minicomp.ir import stmt as S
from minicomp.ir.func import Function
from minicomp.ir.functor import collect

# The most dynamic shared memory a config may take: what every GPU of the limits table lets a
# block have (a kernel is compiled without knowing which one it will run on).
MAX_DYNAMIC_SHARED = PORTABLE.shared_per_block_optin

Config = TypeVar("Config")


def sm_count_of(options: Options | None) -> int:
    """The SMs a template's heuristic fills with blocks (a problem's `sms`): the `sm_count`
    option, which compile_graph resolves from the target; an H100's where no options name
    one (a problem built outside a compile, as tests do)."""
    if options is None or options.sm_count is None:
        return H100_SMS
    return options.sm_count


DEFAULT_ARCH = "sm_90"
"""The architecture a problem is built for where no options name one: an H100's, like
H100_SMS."""


def arch_of(options: Options | None) -> str:
    """The CUDA architecture a template's kernels compile for (a problem's `arch`, which
    decides what they may use: the float8 mma needs sm_89): the `arch` option, which
    compile_graph resolves from the target for the CUDA targets; DEFAULT_ARCH where no
    options name one."""
    if options is None or options.arch is None:
        return DEFAULT_ARCH
    return options.arch


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


class WarpTiled:
    """A config whose block is `warps` warps (a property of the subclass)."""

    warps: int

    @property
    def threads(self) -> int:
        return 32 * self.warps


def search_space(
    problem: Any,
    level: int,
    heuristic: Callable[[Any], Config],
    valid: Callable[[Any, Config], bool],
    level1: Iterable[Config],
    config: Callable[..., Config],
    grid: Iterable[tuple],
) -> list[Config]:
    """The configs of search-space `level` for `problem`: the heuristic's alone at level 0,
    the valid ones of `level1` at level 1, and at level 2 also those of `config(*args)` for
    the argument tuples of `grid`; each once."""
    if level <= 0:
        return [heuristic(problem)]
    configs = [c for c in level1 if valid(problem, c)]
    if level >= 2:
        configs += [c for c in (config(*args) for args in grid) if valid(problem, c)]
    return list(dict.fromkeys(configs))


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
