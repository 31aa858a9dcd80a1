"""`minicomp.explain`: its summary (graphs, ATen calls by reason, graph breaks, recompiles),
the details on request, its counts, and the ops it says run by ATen."""

import inspect
import logging
import os

import pytest
import torch

import minicomp
from minicomp.dynamo.backend import recording
from minicomp.dynamo.watch import watching
from minicomp.explain import Explanation, ScriptError, reason_group


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
    text = mlp_explanation.report()
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
    assert text.endswith(mlp_explanation.summary())


def test_kernel_ir_and_source_name_every_kernel(mlp_explanation):
    text = mlp_explanation.report()
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
    assert str(e) == e.summary()
    assert e.summary().splitlines()[0] == (
        f"minicomp compiled 1 graph (1 inference): {e.aten_op_count} ATen ops in -> "
        f"{e.kernel_count} kernels out, {e.aten_call_count} calls made to ATen"
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
    assert "    unsupported (no lowering): cumsum, linalg_inv_ex" in text
    assert f"{e.aten_call_count} calls made to ATen" in text


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
    assert "==== fell back to eager ====" in e.report()
    assert "runs eagerly" in str(e) and "simulated tuner failure" in str(e)
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
    text = report.report()
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


# ---- the summary: where graphs come from, graph breaks, recompiles, ATen by design ----


def _breaks_at_print(x):
    y = x.sin()
    print("a graph break")
    return y.cos() + 1


def _line_of(fn, text: str) -> int:
    lines, first = inspect.getsourcelines(fn)
    return first + next(k for k, line in enumerate(lines) if text in line)


def test_summary_names_the_graph_break_and_counts_the_recompiles():
    with torch.no_grad():
        e = minicomp.explain(_breaks_at_print, torch.randn(4), options={"target": "cpu"})
    (brk,) = e.graph_breaks
    assert (brk.filename, brk.lineno) == (__file__, _line_of(_breaks_at_print, 'print("'))
    assert brk.line == 'print("a graph break")' and "print" in brk.reason
    assert len(e.records) == 2 and not e.recompiles
    text = str(e)
    assert f"{os.path.basename(__file__)}:{brk.lineno} in _breaks_at_print" in text
    assert "graph breaks: 1" in text and "recompiles: 0" in text
    first = _line_of(_breaks_at_print, "def ")
    assert "from _breaks_at_print at " in text and f"test_explain.py:{first} (Dynamo" in text


def test_recompiles_are_counted_with_dynamos_guard_failures():
    def twice(x):
        return x.sin() + 1

    torch._dynamo.reset()
    compiled = torch.compile(twice, backend="minicomp", options={"target": "cpu"})
    records: list = []
    with watching() as run, recording(records, passes=True):
        compiled(torch.randn(4))
        compiled(torch.randn(4, 3))  # another rank: Dynamo compiles the frame again
    torch._dynamo.reset()
    e = Explanation(records, run)
    (again,) = e.recompiles
    assert again.compile_id.endswith("/1") and "rank" in again.recompile_reason
    assert [r.compile_id for r in records] == [again.compile_id[:-1] + "0", again.compile_id]
    text = str(e)
    assert "recompiles: 1" in text and "a recompile)" in text


def test_a_cpu_matmul_is_aten_by_design_not_unsupported():
    e = minicomp.explain(lambda a, b: torch.relu(a @ b), torch.randn(4, 8), torch.randn(8, 3))
    text = str(e)
    assert "calls made to ATen   1 each run (by design 1)" in text
    assert "    ATen by design on cpu: BLAS GEMM: mm" in text
    assert "no lowering" not in text


def test_calls_to_aten_are_grouped_by_reason():
    def f(x, w):
        return torch.cumsum(x @ w, 0) @ w.t()

    e = minicomp.explain(f, torch.randn(4, 8), torch.randn(8, 8), options={"target": "cpu"})
    lines = str(e).splitlines()
    at = next(k for k, line in enumerate(lines) if line.startswith("  calls made to ATen"))
    assert lines[at].endswith("4 each run (by design 2, zero-copy views 1, unsupported 1)")
    assert lines[at + 1 : at + 4] == [
        "    ATen by design on cpu: BLAS GEMM: mm x2",
        "    views (no copy): permute",
        "    unsupported (no lowering): cumsum",
    ]


def test_details_come_on_request(mlp_explanation):
    e = mlp_explanation
    summary = str(e)
    (record,) = e.records
    assert "def " not in summary and "#pragma" not in summary
    ir = e.ir()
    assert "graph IR after the last pass" in ir
    assert all(f"kernel IR: {k.name}" in ir for k in record.kernels)
    assert "after fuse" in e.after_pass("fuse")
    with pytest.raises(ValueError, match="the passes that ran: .*eliminate_dead_code.*fuse"):
        e.after_pass("no_such_pass")
    assert e.after_pass("eliminate_dead_code").count("run 2 of 2") == 1


def test_the_runtime_header_is_left_out_of_every_source():
    from minicomp.backends.cpu.codegen import runtime_header

    with torch.no_grad():
        e = minicomp.explain(_breaks_at_print, torch.randn(4), options={"target": "cpu"})
    assert len([r for r in e.records if r.source]) == 2
    marker = max(runtime_header().splitlines(), key=len)
    for text in (e.source(), e.report(), e.ir(), str(e)):
        assert text.count(marker) == 0
    assert e.source().count("runtime.h, minicomp's runtime header") == 2


def test_write_puts_every_stage_in_files(tmp_path, mlp_explanation):
    e = mlp_explanation
    written = e.write(str(tmp_path))
    (record,) = e.records
    folder = tmp_path / "graph-1-inference"
    assert (tmp_path / "summary.txt").read_text().strip() == e.summary()
    assert "torch.ops.aten." in (folder / "aten_graph.py").read_text()
    passes = sorted(p.name for p in (folder / "passes").iterdir())
    assert len(passes) == len(record.passes) and passes[0].startswith("00-")
    assert {p.stem for p in (folder / "kernels").iterdir()} == {k.name for k in record.kernels}
    source = (folder / "source.c").read_text()
    assert '#include "../runtime.h"' in source and "#pragma omp" in source
    assert (tmp_path / "runtime.h").read_text().strip() in record.source
    assert len(written) == len(list(p for p in tmp_path.rglob("*") if p.is_file()))


def test_explain_file_on_a_missing_script_or_one_that_raises(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such script"):
        minicomp.explain_file(str(tmp_path / "absent.py"), [])
    script = tmp_path / "fails.py"
    script.write_text("def boom():\n    raise KeyError('gone')\n\nboom()\n")
    with pytest.raises(ScriptError, match=r"fails.py raised KeyError: 'gone'") as info:
        minicomp.explain_file(str(script), [])
    assert 'fails.py", line 2, in boom' in info.value.tail


@pytest.mark.parametrize(
    "reason, group",
    [
        ("ATen by design on cpu: BLAS GEMM", "by design"),
        ("oneDNN convolution, channels-last, weight prepacked", "by design"),
        (
            "cuBLAS measured faster than the fused template: 1.0 us against 2.0 us",
            "measured faster",
        ),
        ("a view of its input's memory", "zero-copy views"),
        ("its result defines a data-dependent size", "effects, custom ops, data-dependent sizes"),
        ("its fused kernel failed to compile: RuntimeError: x", "kernel failed to compile"),
        ("no lowering", "unsupported"),
        ("input dtype complex64", "unsupported"),
    ],
)
def test_reasons_fall_in_their_groups(reason, group):
    assert reason_group(reason) == group
