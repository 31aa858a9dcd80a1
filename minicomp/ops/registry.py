"""The lowering registry: one function per ATen overload, from arguments to compute definitions."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from minicomp.ir.compute import TensorNode
from minicomp.ir.types import DataType


class NotLowerable(Exception):
    """Raised by a lowering that cannot handle these arguments; the op runs as an ATen call."""


# The reason an ATen call carries when no lowering is registered for its op.
NO_LOWERING = "no lowering"


@dataclass(frozen=True)
class LoweringContext:
    """What a lowering may know beyond its arguments: the output types PyTorch computed."""

    name: str
    out_shapes: tuple[tuple, ...]
    out_dtypes: tuple[DataType, ...]
    arg_meta: Any = None

    @property
    def out_shape(self) -> tuple:
        return self.out_shapes[0]

    @property
    def out_dtype(self) -> DataType:
        return self.out_dtypes[0]

    def meta(self, k: int) -> Any:
        """What ATen knew of positional argument `k` (its fake tensor), or None."""
        known = self.arg_meta if isinstance(self.arg_meta, (list, tuple)) else ()
        return known[k] if k < len(known) else None


Lowering = Callable[..., "TensorNode | Sequence[TensorNode]"]
_LOWERINGS: dict[Any, Lowering] = {}


def register_lowering(*targets: Any) -> Callable[[Lowering], Lowering]:
    """Register the decorated function as the lowering of each ATen overload (or packet)."""

    def wrap(fn: Lowering) -> Lowering:
        for t in targets:
            for overload in _overloads(t):
                if overload in _LOWERINGS:
                    raise ValueError(f"{overload} already has a lowering")
                _LOWERINGS[overload] = fn
        return fn

    return wrap


def _overloads(target: Any) -> list[Any]:
    # An OpOverloadPacket (aten.add) registers every overload it has.
    names = getattr(target, "overloads", None)
    if callable(names):
        return [getattr(target, n) for n in names()]
    return [target]


def lowering_for(target: Any) -> Lowering | None:
    """The lowering registered for an ATen overload, if any."""
    _load_all()
    return _LOWERINGS.get(target)


def lowered_ops() -> list[str]:
    """The names of every ATen overload minicomp lowers natively, sorted."""
    _load_all()
    return sorted(str(t) for t in _LOWERINGS)


_loaded = False


def _load_all() -> None:
    global _loaded
    if not _loaded:
        _loaded = True
        import minicomp.ops  # noqa: F401  (each family module registers on import)
