"""Visitor and mutator bases over IR nodes, and the common traversals built on them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from minicomp.ir.node import Node


class Functor:
    """Dispatches `visit(node)` to `visit_<ClassName>` through a table built once per class."""

    _table: dict[type, Callable] | None = None

    @classmethod
    def _dispatch(cls, node_type: type) -> Callable:
        table = cls.__dict__.get("_dispatch_table")
        if table is None:
            table = {}
            cls._dispatch_table = table
        fn = table.get(node_type)
        if fn is None:
            for klass in node_type.__mro__:
                fn = getattr(cls, f"visit_{klass.__name__}", None)
                if fn is not None:
                    break
            table[node_type] = fn = fn or cls.visit_default
        return fn

    def __init__(self):
        self.memo: dict[Node, Any] = {}

    def visit(self, n: Any) -> Any:
        """Visit a node, a tuple of nodes, or pass a leaf value through."""
        if isinstance(n, Node):
            memo = self.memo
            hit = memo.get(n, _MISSING)
            if hit is not _MISSING:
                return hit
            fn = _TABLES.get((type(self), type(n)))
            if fn is None:
                fn = _TABLES[type(self), type(n)] = self._dispatch(type(n))
            out = fn(self, n)
            memo[n] = out
            return out
        if isinstance(n, tuple):
            return self.visit_tuple(n)
        return self.visit_leaf(n)

    def visit_tuple(self, t: tuple) -> Any:
        return tuple(self.visit(x) for x in t)

    def visit_leaf(self, v: Any) -> Any:
        return v

    def visit_default(self, n: Node) -> Any:
        raise NotImplementedError(f"{type(self).__name__} cannot visit {type(n).__name__}")


_MISSING = object()
# (functor class, node class) -> handler: what `_dispatch` finds, without its lookups.
_TABLES: dict[tuple[type, type], Callable] = {}


class Visitor(Functor):
    """Walks every owned child; override `visit_<Node>` to act on some nodes."""

    def visit_default(self, n: Node) -> None:
        for c in n.children():
            self.visit(c)

    def visit_tuple(self, t: tuple) -> None:
        for x in t:
            self.visit(x)

    def visit_leaf(self, v: Any) -> None:
        return None


class Mutator(Functor):
    """Rebuilds a node when one of its owned children changed, else returns it unchanged."""

    def visit_default(self, n: Node) -> Node:
        changes = {}
        for f in n._owned_names:
            old = getattr(n, f)
            new = self.visit(old)
            if new is not old:
                changes[f] = new
        return n.replace(**changes) if changes else n

    def visit_tuple(self, t: tuple) -> tuple:
        new = tuple(self.visit(x) for x in t)
        return t if all(a is b for a, b in zip(new, t)) else new


class _Collector(Visitor):
    def __init__(self, klass: type | tuple[type, ...]):
        super().__init__()
        self.klass = klass
        self.found: list[Node] = []

    def visit_default(self, n: Node) -> None:
        if isinstance(n, self.klass):
            self.found.append(n)
        super().visit_default(n)


def collect(n: Any, klass: type | tuple[type, ...]) -> list:
    """Every distinct node of class `klass` inside `n`, in visiting order."""
    c = _Collector(klass)
    c.visit(n)
    return c.found


class Substitute(Mutator):
    """Replaces nodes by the mapping (variables by expressions, typically)."""

    def __init__(self, mapping: Mapping[Node, Node]):
        super().__init__()
        self.mapping = mapping

    def visit(self, n: Any) -> Any:
        if isinstance(n, Node):
            hit = self.mapping.get(n)
            if hit is not None:
                return hit
        return super().visit(n)


def substitute(n: Any, mapping: Mapping[Node, Node]) -> Any:
    """`n` with every occurrence of a key of `mapping` replaced by its value, at once."""
    return Substitute(mapping).visit(n) if mapping else n
