"""Fusion legality: the DAG of fused groups, merged only where no cycle closes.

Groups are the nodes of a networkx DiGraph with an edge where some member of one reads a
value (or a size symbol) that a member of the other makes. Merging a producer group into a
consumer group contracts the edge between them; that is legal unless another path joins
them, through any other group (a member of which may sit anywhere in the op order), which
the contraction would turn into a cycle.

Each group keeps a position in a topological order of the DAG, so a search for such a path
stops at groups ordered after the consumer; after a merge the groups between the two are
reordered as in Pearce and Kelly's dynamic topological sort: the consumer's ancestors first,
then the merged group, then the producer's descendants.
"""

from __future__ import annotations

from collections.abc import Iterable

import networkx as nx


class GroupDag:
    """Groups (named by ints) of an op DAG, merged by `merge` while it stays acyclic."""

    def __init__(self, count: int, edges: Iterable[tuple[int, int]]):
        """Groups 0..count-1, each one op, with `edges` (i, j) for i < j: op j reads op i."""
        self.dag = nx.DiGraph()
        self.dag.add_nodes_from(range(count))
        self.dag.add_edges_from(edges)
        self.position = {g: g for g in range(count)}

    def reaches_around(self, a: int, b: int) -> list[int] | None:
        """The groups reachable from a and ordered before b, if no path from a to b passes
        through one of them; None where one does (merging a and b would close a cycle)."""
        limit = self.position[b]
        found: set[int] = set()
        stack = [s for s in self.dag.successors(a) if s != b]
        while stack:
            g = stack.pop()
            if g == b:
                return None
            if g in found or self.position[g] > limit:
                continue
            found.add(g)
            stack.extend(self.dag.successors(g))
        return list(found)

    def would_cycle(self, a: int, b: int) -> bool:
        """Whether merging group a (a producer) into group b closes a cycle."""
        return self.reaches_around(a, b) is None

    def merge(self, a: int, b: int) -> None:
        """Contract group a into group b (b keeps its name); a must not `would_cycle` into b."""
        after = self.reaches_around(a, b)
        if after is None:
            raise ValueError(f"merging group {a} into {b} would close a cycle")
        before = self._ancestors_after(b, self.position[a])
        for p in self.dag.predecessors(a):
            if p != b:
                self.dag.add_edge(p, b)
        for s in self.dag.successors(a):
            if s != b:
                self.dag.add_edge(b, s)
        self.dag.remove_node(a)
        # The moved groups take their own positions back: the consumer's ancestors the lowest
        # (none moves later), the producer's descendants the highest (none moves earlier).
        slots = sorted(self.position[g] for g in (*before, a, b, *after))
        del self.position[a]
        before.sort(key=self.position.get)
        after.sort(key=self.position.get)
        for g, slot in zip(before + [b], slots):
            self.position[g] = slot
        for g, slot in zip(after, slots[len(before) + 2 :]):
            self.position[g] = slot

    def _ancestors_after(self, b: int, floor: int) -> list[int]:
        """The groups from which b is reachable and ordered after position `floor`."""
        found: set[int] = set()
        stack = list(self.dag.predecessors(b))
        while stack:
            g = stack.pop()
            if g in found or self.position[g] <= floor:
                continue
            found.add(g)
            stack.extend(self.dag.predecessors(g))
        return list(found)

    def order(self) -> list[int]:
        """The groups in topological order, the smallest name first among the ready ones."""
        return list(nx.lexicographical_topological_sort(self.dag, key=lambda g: g))
