"""The base of every IR node: frozen, hashed by content once, compared structurally."""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar


class Node:
    """Immutable IR node; subclasses are declared with the `node` decorator."""

    _field_names: ClassVar[tuple[str, ...]] = ()
    # Fields holding references to other definitions rather than owned children;
    # functors do not descend into them.
    _references: ClassVar[tuple[str, ...]] = ()
    # _field_names less _references, computed once per class by `node`.
    _owned_names: ClassVar[tuple[str, ...]] = ()

    def _key(self) -> tuple:
        return tuple([getattr(self, f) for f in self._field_names])

    def __hash__(self) -> int:
        h = self.__dict__.get("_hash")
        if h is None:
            h = hash((type(self).__name__, *self._key()))
            object.__setattr__(self, "_hash", h)
        return h

    def __getstate__(self) -> dict:
        # The cached hash is this process's: string hashes differ between processes, so a
        # node pickled with it (the graph cache) would compare unequal to its own copy.
        state = dict(self.__dict__)
        state.pop("_hash", None)
        return state

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if type(self) is not type(other) or hash(self) != hash(other):
            return False
        return self._key() == other._key()  # type: ignore[attr-defined]

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    def replace(self, **changes: Any) -> Node:
        """A copy of this node with some fields changed."""
        return dataclasses.replace(self, **changes)

    def children(self) -> tuple[Any, ...]:
        """The owned field values, in declaration order."""
        return tuple([getattr(self, f) for f in self._owned_names])


def node(cls: type) -> type:
    """Declare an IR node class: a frozen dataclass with structural hash and equality."""
    cls = dataclasses.dataclass(frozen=True, eq=False, repr=False)(cls)
    cls._field_names = tuple(f.name for f in dataclasses.fields(cls))
    cls._owned_names = tuple(f for f in cls._field_names if f not in cls._references)
    return cls
