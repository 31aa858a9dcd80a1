"""Fusion legality: merging groups of the op DAG never closes a cycle, including one through
a third group, and the groups' positions stay a topological order."""

import random

import networkx as nx
import pytest

from minicomp.passes.graph.group_dag import GroupDag


def test_a_path_through_another_group_forbids_the_merge():
    # Ops: e=0, a=1, c=2 (reads e, a), b=3 (reads a, e). Once e and c share a kernel, a
    # reaches b through it: a -> {e, c} -> b, though no op after a leads to b.
    dag = GroupDag(4, [(0, 2), (1, 2), (1, 3), (0, 3)])
    dag.merge(0, 2)
    assert dag.would_cycle(1, 3)
    with pytest.raises(ValueError, match="cycle"):
        dag.merge(1, 3)


def test_a_direct_edge_alone_merges():
    dag = GroupDag(3, [(0, 1), (1, 2)])
    assert not dag.would_cycle(0, 1)
    dag.merge(0, 1)
    dag.merge(1, 2)
    assert dag.order() == [2]


def test_ready_groups_come_out_smallest_name_first():
    dag = GroupDag(4, [(0, 3), (1, 2)])
    assert dag.order() == [0, 1, 2, 3]
    dag.merge(1, 2)
    assert dag.order() == [0, 2, 3]


def _contracted(graph: nx.DiGraph, a: int, b: int) -> nx.DiGraph:
    merged = nx.contracted_nodes(graph, b, a, self_loops=False)
    return nx.DiGraph(merged)


@pytest.mark.parametrize("seed", range(20))
def test_random_merges_agree_with_contracting_the_graph(seed):
    rng = random.Random(seed)
    count = rng.randint(5, 30)
    edges = {(i, j) for j in range(count) for i in range(j) if rng.random() < 0.2}
    dag = GroupDag(count, edges)
    reference = nx.DiGraph()
    reference.add_nodes_from(range(count))
    reference.add_edges_from(edges)
    for _ in range(4 * count):
        if not reference.edges:
            break
        a, b = rng.choice(sorted(reference.edges))
        closes = not nx.is_directed_acyclic_graph(_contracted(reference, a, b))
        assert dag.would_cycle(a, b) == closes
        if not closes:
            dag.merge(a, b)
            reference = _contracted(reference, a, b)
        assert set(dag.dag.edges) == set(reference.edges)
        for u, v in reference.edges:
            assert dag.position[u] < dag.position[v], "positions are no topological order"
