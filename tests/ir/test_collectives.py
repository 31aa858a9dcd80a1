"""What minicomp.ir.collectives says: which ops communicate, and the ordering edges that pin
the ops of a graph between its collectives."""

import networkx as nx
import torch
import torch.distributed._functional_collectives  # noqa: F401  (registers _c10d_functional)

from minicomp.ir.collectives import barrier_edges, is_collective, is_wait, reason_for
from minicomp.ir.graph import ArgRef, ExternOp, TensorType, Value
from minicomp.ir.types import f32

c10d = torch.ops._c10d_functional


def test_collectives_and_waits_are_told_apart_from_other_ops():
    assert is_collective(c10d.all_reduce.default) and not is_wait(c10d.all_reduce.default)
    assert is_collective(c10d.wait_tensor.default) and is_wait(c10d.wait_tensor.default)
    assert is_collective(c10d.reduce_scatter_tensor.default)
    assert not is_collective(torch.ops.aten.mm.default) and not is_collective(print)
    assert reason_for(c10d.wait_tensor.default) != reason_for(c10d.all_reduce.default)


def test_a_collective_has_effects_though_its_result_is_an_ordinary_tensor():
    v = Value("x", TensorType((4,), f32))
    out = Value("y", TensorType((4,), f32))
    op = ExternOp("r", (v,), (out,), c10d.all_reduce.default, (ArgRef(0), "sum", "0"), (), ((),))
    assert op.has_effects and not op.mutates and not op.returns_views
    plain = op.replace(target=torch.ops.aten.neg.default, args=(ArgRef(0),))
    assert not plain.has_effects


def test_barrier_edges_keep_each_op_between_its_collectives():
    count, collectives = 9, [2, 3, 6]
    dag = nx.DiGraph(barrier_edges(collectives, count))
    dag.add_nodes_from(range(count))
    assert all(i < j for i, j in dag.edges)
    # Whatever order a topological sort picks, no op crosses a collective.
    for order in list(nx.all_topological_sorts(dag))[:200]:
        where = {op: k for k, op in enumerate(order)}
        for c in collectives:
            assert all(where[i] < where[c] for i in range(c))
            assert all(where[j] > where[c] for j in range(c + 1, count))
    assert len(dag.edges) <= 2 * count
    assert barrier_edges([], 5) == []
