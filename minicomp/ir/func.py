"""Functions (kernels, device functions, host functions) and modules of the kernel IR."""

from __future__ import annotations

from typing import Any

from minicomp.ir.expr import Var
from minicomp.ir.node import Node, node
from minicomp.ir.stmt import Stmt
from minicomp.ir.types import DataType

FUNC_KINDS = ("kernel", "device", "host")


@node
class Function(Node):
    """A function: a `kernel` (entry point launched by the runtime), `device` or `host` helper.

    `attrs` holds launch attributes and hints as sorted (name, value) pairs, e.g.
    ("grid_dim", ...), ("block_dim", ...), ("dynamic_smem", ...).
    """

    name: str
    params: tuple[Var, ...]
    body: Stmt
    kind: str = "kernel"
    ret: DataType | None = None
    attrs: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self):
        if self.kind not in FUNC_KINDS:
            raise ValueError(f"unknown function kind {self.kind!r}")

    def attr(self, name: str, default: Any = None) -> Any:
        """The value of attribute `name`."""
        return dict(self.attrs).get(name, default)

    def __repr__(self) -> str:
        from minicomp.ir.printer import function_str

        return function_str(self)


@node
class Module(Node):
    """The functions compiled together into one binary."""

    name: str
    functions: tuple[Function, ...]

    def function(self, name: str) -> Function:
        """The function called `name`."""
        for f in self.functions:
            if f.name == name:
                return f
        raise KeyError(name)

    def __repr__(self) -> str:
        from minicomp.ir.printer import module_str

        return module_str(self)
