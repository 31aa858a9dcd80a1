"""`minicomp.explain`: the stages it reports, its counts, and the ops it says run by ATen."""

import logging

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
    assert "==== inference graph: ATen (" in text
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
        "inference graph: ATen",
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
    from minicomp import compiler

    def boom(*args, **kwargs):
        raise RuntimeError("simulated tuner failure")

    monkeypatch.setattr(compiler, "make_chooser", boom)
    with pytest.warns(UserWarning):
        e = minicomp.explain(lambda x: x.sin() + 1, torch.randn(4), options={"target": "cpu"})
    assert "simulated tuner failure" in e.fallbacks["<whole graph>"]
    assert "==== fell back to eager ====" in str(e)
    assert e.kernel_count == 0


class Block(torch.nn.Module):
    """A pre-norm transformer block: attention, then a GELU MLP, each with a residual."""

    def __init__(self, width=64, heads=2):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)
        self.qkv = torch.nn.Linear(width, 3 * width)
        self.proj = torch.nn.Linear(width, width)
        self.up, self.down = torch.nn.Linear(width, 4 * width), torch.nn.Linear(4 * width, width)

    def forward(self, x):
        b, s, w = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, s, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        a = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(b, s, w))
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm2(x))))


def test_a_transformer_block_shows_fused_epilogues_and_one_attention_kernel():
    """On a CUDA target (emulated here), explain shows the block's linears as template kernels
    with their bias, GELU and residual inside, and the attention as one kernel."""
    from minicomp.ir.graph import ExternOp, FusedOp, KernelOp

    torch.manual_seed(0)
    block = Block().half().eval()
    x = torch.randn(2, 24, 64, dtype=torch.float16)
    torch._dynamo.reset()
    with torch.no_grad():
        report = minicomp.explain(block, x, options={"target": "cuda-emu"})
        expected = block.float()(x.float())
        block.half()
    (record,) = report.records
    nodes = record.graph.nodes
    # Only zero-copy views (q, k and v picked out of the projection) stay with ATen.
    assert all("zero-copy view" in n.name for n in nodes if isinstance(n, ExternOp))
    (attention,) = [n for n in nodes if isinstance(n, KernelOp)]
    assert (attention.function.attrs.template or "").startswith("attention")
    templates = {k.name: (k.attrs.template or "") for k in record.kernels}
    groups = {n.name: n.members for n in nodes if isinstance(n, FusedOp)}
    matmuls = [name for name, t in templates.items() if t.startswith("matmul_tc")]
    assert len(matmuls) == 4  # qkv, proj, up, down
    members = [" ".join(groups[name]) for name in matmuls]
    assert any("gelu" in m for m in members)  # up's bias and GELU in its epilogue
    assert sum("add" in m for m in members) >= 2  # the residual adds after proj and down
    text = str(report)
    assert "attention[" in text and "matmul_tc[" in text
    torch._dynamo.reset()
    out = torch.compile(block, backend="minicomp", options={"target": "cuda-emu"})(x)
    torch.testing.assert_close(out.float(), expected, rtol=2e-2, atol=2e-2)


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def test_verbose_logs_one_line_per_graph_with_its_aten_calls():
    def f(x, w):
        return torch.linalg.inv(x) @ w + 1

    x, w = torch.randn(4, 4) + 4 * torch.eye(4), torch.randn(4, 3)
    torch._dynamo.reset()
    compiled = torch.compile(f, backend="minicomp", options={"target": "cpu", "verbose": 1})
    handler = _Lines()
    logging.getLogger("minicomp").addHandler(handler)
    try:
        torch.testing.assert_close(compiled(x, w), f(x, w))
    finally:
        logging.getLogger("minicomp").removeHandler(handler)
    torch._dynamo.reset()
    (line,) = [m for m in handler.lines if "inference graph" in m]
    externs = line.splitlines()[1:]
    assert f"{len(externs)} ATen calls" in line.splitlines()[0]
    assert "  extern linalg_inv_ex.default: no lowering" in externs
