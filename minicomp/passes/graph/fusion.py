"""Fusion: groups compute ops into kernels (elementwise chains, producers into reductions).

Groups merge greedily, each op's producers into its group in graph order, while the merged
group has a loop nest (passes/graph/loop_nest.py) and the groups stay a DAG
(passes/graph/group_dag.py; an op using a data-dependent size follows the ATen call binding
it; the ops between two collectives stay between them, minicomp.ir.collectives). One more
rule keeps matrix products whole: a group that is a contraction (minicomp.ir.contraction: one
sum of a product, which the matmul and convolution templates compute) never merges with
another group holding a reduction. Two sibling products over equal K extents (`x @ w1 + x @
w2`, a ResNet block's last convolution and its projection shortcut) would otherwise share a
loop nest with two sums, which is no contraction and runs as slow row reductions; with the
rule their joint consumer fuses into the later product's group as its epilogue and the
earlier product is a kernel of its own. Groups of several reductions that are no
contractions (softmax, layer norm) fuse as before.

With `tma_products` (the graph compiles for sm_90a, where the Hopper matmul template reads
its operands by TMA, which copies memory as it is), a product the template would take
(matmul_hopper.reads_by_tma) keeps a producer computing one of its operands (a relu, a cast
of A; views still fuse) in a kernel of its own: the operand reaches the product through
memory, as TMA needs it, instead of a prologue only matmul_tc could inline.
"""

from __future__ import annotations

import logging

from minicomp.ir.collectives import barrier_edges, is_collective
from minicomp.ir.compute import TensorElement
from minicomp.ir.contraction import match_contraction
from minicomp.ir.expr import Var
from minicomp.ir.functor import collect
from minicomp.ir.graph import ComputeOp, ExternOp, FusedOp, Graph, Op
from minicomp.passes.graph.group_dag import GroupDag
from minicomp.passes.graph.loop_nest import NoLoopNest, build_loop_nest, try_loop_nest
from minicomp.passes.graph.simplify_views import is_view
from minicomp.schedule.templates.matmul_hopper import reads_by_tma

log = logging.getLogger(__name__)


class _Groups:
    """Groups of op indices over the op DAG, merged greedily while legal."""

    def __init__(self, graph: Graph, tma_products: bool = False):
        self.graph = graph
        self.tma_products = tma_products
        self.ops = list(graph.nodes)
        producer = {v: i for i, op in enumerate(self.ops) for v in op.outputs}
        # The op DAG as successor lists (in first-use order) and predecessor sets; readers[v]
        # are the ops reading value v of its producer.
        self.succ: list[list[int]] = [[] for _ in self.ops]
        self.pred: list[set[int]] = [set() for _ in self.ops]
        self.readers: dict = {}
        for j, op in enumerate(self.ops):
            for v in op.inputs:
                i = producer.get(v)
                if i is None:
                    continue
                self.readers.setdefault(v, set()).add(j)
                self.add_edge(i, j)
        for i, j in _symbol_edges(self.ops) + _collective_edges(self.ops):
            self.add_edge(i, j)
        self.producer = producer
        self.dag = GroupDag(
            len(self.ops), ((i, j) for i in range(len(self.ops)) for j in self.succ[i])
        )
        self.group_of = list(range(len(self.ops)))
        self.members: dict[int, list[int]] = {i: [i] for i in range(len(self.ops))}
        self.graph_outputs = graph.output_values()
        self.rejected: dict[tuple[str, str], str] = {}
        # Each group's loop nest, once built: a group's outputs (and so its nest) change
        # only when the group itself does.
        self.nests: dict[int, FusedOp | None] = {}
        # Whether each op holds a reduction, by id (every loop nest built asks again).
        self._reduces: dict[int, bool] = {}

    def add_edge(self, i: int, j: int) -> None:
        if i not in self.pred[j]:
            self.pred[j].add(i)
            self.succ[i].append(j)

    def reduces(self, op: ComputeOp) -> bool:
        """Whether `op`'s definition holds a reduction, computed once per op."""
        hit = self._reduces.get(id(op))
        if hit is None:
            hit = self._reduces[id(op)] = not op.definition.is_injective
        return hit

    def outputs_of(self, members: list[int]):
        """Values of `members` read outside them or returned by the graph."""
        inside = set(members)
        outs = []
        for i in members:
            for v in self.ops[i].outputs:
                users = self.readers.get(v, ()) if self.producer.get(v) == i else ()
                if v in self.graph_outputs or any(u not in inside for u in users):
                    outs.append(v)
        return outs

    def holds_reduction(self, g: int) -> bool:
        return any(self.reduces(self.ops[i]) for i in self.members[g])

    def is_contraction(self, g: int) -> bool:
        """Whether group g alone is a contraction a matmul template computes."""
        if g not in self.nests:
            members = self.members[g]
            ops = [self.ops[i] for i in members]
            self.nests[g] = try_loop_nest("candidate", ops, self.outputs_of(members), self.reduces)
        nest = self.nests[g]
        return nest is not None and match_contraction(nest) is not None

    def computes_tma_operand(self, a: int, b: int) -> bool:
        """Whether group `a` computes (not only views) an operand of product group `b`, a
        product the Hopper template would take with plain operands."""
        if self.holds_reduction(a) or not self.is_contraction(b):
            return False
        if all(is_view(self.ops[i]) for i in self.members[a]):
            return False
        c = match_contraction(self.nests[b])
        read = {el.tensor.name for el in collect((c.a, c.b), TensorElement)}
        made = {v.name for v in self.outputs_of(self.members[a])}
        return bool(read & made) and reads_by_tma(c)

    def try_merge(self, a: int, b: int) -> bool:
        if self.dag.would_cycle(a, b):
            return False
        key = (self.ops[self.members[a][-1]].name, self.ops[self.members[b][-1]].name)
        both_reduce = self.holds_reduction(a) and self.holds_reduction(b)
        if both_reduce and (self.is_contraction(a) or self.is_contraction(b)):
            self.rejected[key] = "a contraction shares no kernel with another reduction"
            return False
        if self.tma_products and self.computes_tma_operand(a, b):
            self.rejected[key] = "the Hopper matmul reads its operands by TMA, as they are"
            return False
        members = sorted(self.members[a] + self.members[b])
        try:
            nest = build_loop_nest(
                "candidate", [self.ops[i] for i in members], self.outputs_of(members), self.reduces
            )
        except NoLoopNest as e:
            self.rejected[key] = str(e)
            return False
        self.dag.merge(a, b)
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
            for i in sorted(self.pred[j], reverse=True):
                if isinstance(self.ops[i], ComputeOp):
                    gi, gj = self.group_of[i], self.group_of[j]
                    if gi != gj:
                        self.try_merge(gi, gj)

    def nest(self, name: str, g: int) -> FusedOp:
        """Group g's loop nest named `name`: the one built when g last changed, if its
        outputs are still those, else a new one."""
        members = self.members[g]
        ops = [self.ops[i] for i in members]
        outputs = self.outputs_of(members)
        built = self.nests.get(g)
        if built is not None and built.outputs == tuple(outputs):
            return built.replace(name=name)
        return build_loop_nest(name, ops, outputs, self.reduces)


def fuse(graph: Graph, tma_products: bool = False) -> Graph:
    """Every compute op of `graph` inside a FusedOp, neighbours fused where legal; with
    `tma_products`, the operands of products the Hopper matmul takes computed apart (see the
    module doc)."""
    groups = _Groups(graph, tma_products)
    groups.run()
    for (a, b), why in groups.rejected.items():  # TORCH_LOGS=+minicomp shows why ops stay apart
        log.debug("not fused: %s into %s: %s", a, b, why)
    nodes: list[Op] = []
    for g in groups.dag.order():
        members = groups.members[g]
        first = groups.ops[members[0]]
        if not isinstance(first, ComputeOp):
            nodes.append(first)
            continue
        ops = [groups.ops[i] for i in members]
        nodes.append(groups.nest(f"k{len(nodes)}_{_short(ops)}", g))
    return graph.replace(nodes=tuple(nodes))


def _symbol_edges(ops: list[Op]) -> list[tuple[int, int]]:
    """(i, j) where op j uses a size symbol that ATen call i binds (a data-dependent size):
    j must run after i, though it reads none of i's values."""
    binder = {
        name: i for i, op in enumerate(ops) if isinstance(op, ExternOp) for name, _ in op.binds
    }
    if not binder:
        return []
    edges = []
    for j, op in enumerate(ops):
        for name in {v.name for v in collect(op, Var)} & binder.keys():
            if binder[name] < j:
                edges.append((binder[name], j))
    return edges


def _collective_edges(ops: list[Op]) -> list[tuple[int, int]]:
    """Edges that keep every op between the collectives around it in program order (see
    minicomp.ir.collectives): no group spans a collective, and collectives and waits keep
    their order."""
    collectives = [
        i for i, op in enumerate(ops) if isinstance(op, ExternOp) and is_collective(op.target)
    ]
    return barrier_edges(collectives, len(ops)) if collectives else []


def _short(ops: list[ComputeOp]) -> str:
    names = []
    for op in ops:
        base = op.name.split(".")[0].strip("_")
        if base not in names:
            names.append(base)
    text = "_".join(names[:3])
    return "".join(c if c.isalnum() or c == "_" else "_" for c in text)[:40]
