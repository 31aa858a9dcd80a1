"""Fusion: groups compute ops into kernels (elementwise chains, producers into reductions).

Groups merge greedily, each op's producers into its group in graph order, while the merged
group has a loop nest (passes/graph/loop_nest.py). One more rule keeps matrix products whole:
a group that is a contraction (minicomp.passes.graph.contraction: one sum of a product, which the
matmul and convolution templates compute) never merges with another group holding a
reduction. Two sibling products over equal K extents (`x @ w1 + x @ w2`, a ResNet block's
last convolution and its projection shortcut) would otherwise share a loop nest with two
sums, which is no contraction and runs as slow row reductions; with the rule their joint
consumer fuses into the later product's group as its epilogue and the earlier product is a
kernel of its own. Groups of several reductions that are no contractions (softmax, layer
norm) fuse as before.
"""

from __future__ import annotations

import networkx as nx

from minicomp.ir.graph import ComputeOp, FusedOp, Graph, Op
from minicomp.passes.graph.contraction import match_contraction
from minicomp.passes.graph.loop_nest import NoLoopNest, build_loop_nest, try_loop_nest


class _Groups:
    """Groups of op indices over the op DAG, merged greedily while legal."""

    def __init__(self, graph: Graph):
        self.graph = graph
        self.ops = list(graph.nodes)
        producer = {v: i for i, op in enumerate(self.ops) for v in op.outputs}
        self.dag = nx.DiGraph()
        self.dag.add_nodes_from(range(len(self.ops)))
        for j, op in enumerate(self.ops):
            for v in op.inputs:
                if v in producer:
                    self.dag.add_edge(producer[v], j)
        self.group_of = list(range(len(self.ops)))
        self.members: dict[int, list[int]] = {i: [i] for i in range(len(self.ops))}
        self.graph_outputs = graph.output_values()
        self.rejected: dict[tuple[str, str], str] = {}
        # Each group's loop nest, once built: a group's outputs (and so its nest) change
        # only when the group itself does.
        self.nests: dict[int, FusedOp | None] = {}

    def outputs_of(self, members: list[int]):
        """Values of `members` read outside them or returned by the graph."""
        inside = set(members)
        outs = []
        for i in members:
            for v in self.ops[i].outputs:
                users = {j for j in self.dag.successors(i) if v in self.ops[j].inputs}
                if v in self.graph_outputs or users - inside:
                    outs.append(v)
        return outs

    def would_cycle(self, a: int, b: int) -> bool:
        """Whether merging group a (a producer) into group b closes a cycle through others."""
        ma, mb = set(self.members[a]), set(self.members[b])
        limit = max(mb)
        stack = [s for i in ma for s in self.dag.successors(i) if s not in ma and s not in mb]
        seen = set(stack)
        while stack:
            n = stack.pop()
            for s in self.dag.successors(n):
                if s in mb:
                    return True
                if s <= limit and s not in seen and s not in ma:
                    seen.add(s)
                    stack.append(s)
        return False

    def holds_reduction(self, g: int) -> bool:
        return any(not self.ops[i].definition.is_injective for i in self.members[g])

    def is_contraction(self, g: int) -> bool:
        """Whether group g alone is a contraction a matmul template computes."""
        if g not in self.nests:
            members = self.members[g]
            ops = [self.ops[i] for i in members]
            self.nests[g] = try_loop_nest("candidate", ops, self.outputs_of(members))
        nest = self.nests[g]
        return nest is not None and match_contraction(nest) is not None

    def try_merge(self, a: int, b: int) -> bool:
        if self.would_cycle(a, b):
            return False
        key = (self.ops[self.members[a][-1]].name, self.ops[self.members[b][-1]].name)
        both_reduce = self.holds_reduction(a) and self.holds_reduction(b)
        if both_reduce and (self.is_contraction(a) or self.is_contraction(b)):
            self.rejected[key] = "a contraction shares no kernel with another reduction"
            return False
        members = sorted(self.members[a] + self.members[b])
        try:
            nest = build_loop_nest(
                "candidate", [self.ops[i] for i in members], self.outputs_of(members)
            )
        except NoLoopNest as e:
            self.rejected[key] = str(e)
            return False
        for i in self.members[a]:
            self.group_of[i] = b
        self.members[b] = members
        del self.members[a]
        self.nests.pop(a, None)
        self.nests[b] = nest
        return True

    def run(self) -> None:
        for j, op in enumerate(self.ops):
            if not isinstance(op, ComputeOp):
                continue
            for i in sorted(self.dag.predecessors(j), reverse=True):
                if isinstance(self.ops[i], ComputeOp):
                    gi, gj = self.group_of[i], self.group_of[j]
                    if gi != gj:
                        self.try_merge(gi, gj)


def fuse(graph: Graph) -> Graph:
    """Every compute op of `graph` inside a FusedOp, neighbours fused where legal."""
    groups = _Groups(graph)
    groups.run()
    gdag = nx.DiGraph()
    for g in groups.members:
        gdag.add_node(g)
    for i, j in groups.dag.edges:
        gi, gj = groups.group_of[i], groups.group_of[j]
        if gi != gj:
            gdag.add_edge(gi, gj)
    if not nx.is_directed_acyclic_graph(gdag):
        raise AssertionError("fusion produced a cycle")
    nodes: list[Op] = []
    for _k, g in enumerate(nx.lexicographical_topological_sort(gdag)):
        members = groups.members[g]
        first = groups.ops[members[0]]
        if not isinstance(first, ComputeOp):
            nodes.append(first)
            continue
        ops = [groups.ops[i] for i in members]
        nodes.append(
            build_loop_nest(f"k{len(nodes)}_{_short(ops)}", ops, groups.outputs_of(members))
        )
    return graph.replace(nodes=tuple(nodes))


def _short(ops: list[ComputeOp]) -> str:
    names = []
    for op in ops:
        base = op.name.split(".")[0].strip("_")
        if base not in names:
            names.append(base)
    text = "_".join(names[:3])
    return "".join(c if c.isalnum() or c == "_" else "_" for c in text)[:40]
