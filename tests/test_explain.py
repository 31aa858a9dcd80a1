"""`minicomp.explain`: the stages it reports, its counts, and the ops it says run by ATen."""

import pytest
import torch

import minicomp


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x):
        return torch.softmax(self.fc2(torch.relu(self.fc1(x))), dim=-1)


@pytest.fixture(scope="module")
def mlp_explanation():
    torch.manual_seed(0)
    with torch.no_grad():
        return minicomp.explain(MLP(), torch.randn(3, 8), options={"target": "cpu"})


def test_report_has_every_stage(mlp_explanation):
    text = str(mlp_explanation)
    assert "==== forward graph: ATen (" in text
    assert "torch.ops.aten." in text  # the ATen graph itself
    for name in (
        "eliminate_dead_code",
        "simplify_views",
        "fold_constants",
        "eliminate_common_subexpressions",
        "fuse",
    ):
        assert f"==== graph IR after {name} (" in text
    assert "==== fused groups (" in text
    assert "==== ops run by ATen (" in text
    assert "==== kernel IR: " in text
    assert "==== generated source ====" in text
    assert "==== compile time ====" in text
    # The sections come in pipeline order.
    order = [
        "forward graph: ATen",
        "graph IR after fuse",
        "fused groups",
        "kernel IR: ",
        "generated source",
    ]
    positions = [text.index(s) for s in order]
    assert positions == sorted(positions)
    assert text.rstrip().splitlines()[-1] == mlp_explanation.summary()


def test_kernel_ir_and_source_name_every_kernel(mlp_explanation):
    text = str(mlp_explanation)
    (record,) = mlp_explanation.records
    assert record.kernels
    for k in record.kernels:
        assert f"==== kernel IR: {k.name} ====" in text
        assert f"def {k.name}(" in text
        assert f"void {k.name}(" in record.source
    assert "#pragma omp" in record.source


def test_counts(mlp_explanation):
    e = mlp_explanation
    assert 0 < e.kernel_count < e.aten_op_count
    assert e.summary() == (
        f"minicomp: {e.aten_op_count} ATen ops -> {e.kernel_count} kernels, "
        f"{len(e.fallbacks)} ops run by ATen"
    )
    assert "<whole graph>" not in e.fallbacks


def test_fallbacks_name_extern_ops_with_their_reason():
    def f(x):
        return torch.cumsum(x, dim=0) * 2 + torch.linalg.inv_ex(x)[0]

    x = torch.randn(3, 3) + 3 * torch.eye(3)
    e = minicomp.explain(f, x, options={"target": "cpu"})
    assert e.fallbacks.get("cumsum.default") == "no lowering"
    assert e.fallbacks.get("linalg_inv_ex.default") == "no lowering"
    text = str(e)
    assert "cumsum.default: no lowering" in text
    assert f"{len(e.fallbacks)} ops run by ATen" in text


def test_fallbacks_name_linalg_inv():
    def f(x):
        return torch.linalg.inv(x) * 2

    x = torch.randn(3, 3) + 3 * torch.eye(3)
    e = minicomp.explain(f, x, options={"target": "cpu"})
    assert "<whole graph>" not in e.fallbacks
    assert e.fallbacks.get("linalg_inv_ex.default") == "no lowering"


def test_a_graph_that_fails_to_compile_is_reported(monkeypatch):
    from minicomp.dynamo import lowering

    def boom(*args, **kwargs):
        raise RuntimeError("simulated scheduler failure")

    monkeypatch.setattr(lowering, "schedule_graph", boom)
    with pytest.warns(UserWarning):
        e = minicomp.explain(lambda x: x.sin() + 1, torch.randn(4), options={"target": "cpu"})
    assert "simulated scheduler failure" in e.fallbacks["<whole graph>"]
    assert "==== fell back to eager ====" in str(e)
    assert e.kernel_count == 0
