"""ATen's GEMM in place of a fused matrix product: the rewrite a tuner picks when cuBLAS
measures faster, forced here by a fake chooser on cuda-emu, and the ATen candidate the tuner
times, run on CPU tensors."""

import pytest
import torch
from helpers import check_compiled

import minicomp
from minicomp import compiler, config
from minicomp.dynamo.backend import recording
from minicomp.ir.graph import ExternOp, FusedOp
from minicomp.ir.types import to_torch
from minicomp.passes.graph.aten_contraction import aten_candidate, aten_rewrite, tune_contractions
from minicomp.passes.graph.layout import layouts_for
from minicomp.schedule.templates.problem import matmul_problem
from minicomp.targets import get_target
from minicomp.tune.chooser import make_chooser
from minicomp.tune.tuner import Choice, Workload, outputs_match

TARGET = "cuda-emu"
TOLERANCE = {torch.float32: 1e-4, torch.float16: 4e-3}


def _prefer_aten(asked: list):
    """A make_chooser whose choosers say ATen won wherever it is a candidate (recording each
    question in `asked`), and give the template's heuristic config elsewhere."""

    def make_chooser(options, runner_for):
        def choose(template, problem, op, aten=None, why=""):
            asked.append((op.name, aten is not None))
            config = template.heuristic(problem)
            if aten is None:
                return Choice(config, "heuristic")
            return Choice(config, "tuned", aten=True, time_us=25.0, aten_time_us=12.5)

        return choose

    return make_chooser


def _compile_preferring_aten(monkeypatch, fn, *args, dtype):
    """Compile `fn` on cuda-emu with ATen winning every tuning question, check it against
    float64 eager, and return (the CompileRecord, the questions asked)."""
    asked: list = []
    monkeypatch.setattr(compiler, "make_chooser", _prefer_aten(asked))
    records: list = []
    tol = TOLERANCE[dtype]
    with recording(records), torch.no_grad():
        check_compiled(fn, *args, target=TARGET, rtol=tol, atol=tol, reference_dtype=torch.float64)
    (record,) = records
    return record, asked


CASES = {
    "mm": (lambda x, w: x @ w, [(6, 8), (8, 5)]),
    "bmm": (lambda a, b: torch.bmm(a, b), [(3, 4, 7), (3, 7, 5)]),
    "addmm_relu": (lambda x, w, b: torch.relu(torch.addmm(b, x, w)), [(6, 8), (8, 5), (5,)]),
    "x_wt_bias": (lambda x, w, b: x @ w.t() + b, [(6, 8), (5, 8), (5,)]),
    "bmm_transposed": (lambda a, b: torch.bmm(a.transpose(1, 2), b) * 2, [(3, 7, 4), (3, 7, 5)]),
    "linear_3d": (lambda x, w: torch.nn.functional.linear(x, w), [(2, 3, 8), (5, 8)]),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("name", list(CASES))
def test_aten_gemm_replaces_the_group(monkeypatch, name, dtype):
    fn, shapes = CASES[name]
    args = [torch.randn(s, dtype=dtype) for s in shapes]
    record, asked = _compile_preferring_aten(monkeypatch, fn, *args, dtype=dtype)
    assert asked and all(with_aten for _, with_aten in asked)
    nodes = record.graph.nodes
    (gemm,) = [n for n in nodes if isinstance(n, ExternOp) and n.name.endswith("_gemm")]
    assert gemm.target in (torch.ops.aten.mm.default, torch.ops.aten.bmm.default)
    # Eager's mm gives f16 for f16 inputs: the GEMM computes in the operands' type.
    assert to_torch(gemm.outputs[0].dtype) == dtype
    assert "cuBLAS measured faster than the fused template: 12.5 us against 25.0 us" in (
        gemm.reason
    )
    # No template kernel left: only an injective epilogue (or view copy), if anything.
    assert not any(k.attrs.template for k in record.kernels)
    assert not any(n.is_reduction for n in nodes if isinstance(n, FusedOp))


def test_widened_operand_runs_in_the_accumulator_type(monkeypatch):
    """An f16 x widened to w's f32: the f32 result is never rounded to f16 on its way, x is
    converted first."""

    def fn(x, w):
        return torch.relu(x.to(w.dtype) @ w.t())

    x, w = torch.randn(6, 8, dtype=torch.float16), torch.randn(5, 8)
    record, _ = _compile_preferring_aten(monkeypatch, fn, x, w, dtype=torch.float32)
    externs = {n.target for n in record.graph.nodes if isinstance(n, ExternOp)}
    assert torch.ops.aten._to_copy.default in externs and torch.ops.aten.mm.default in externs


def test_rounded_accumulator_runs_in_the_operand_type(monkeypatch):
    """relu(x @ w).float() in f16: the epilogue rounds the product to f16 first, so an f16
    GEMM computes the same, and nothing is converted."""

    def fn(x, w):
        return torch.relu(x @ w).float()

    x, w = torch.randn(6, 8, dtype=torch.float16), torch.randn(8, 5, dtype=torch.float16)
    record, _ = _compile_preferring_aten(monkeypatch, fn, x, w, dtype=torch.float16)
    externs = [n for n in record.graph.nodes if isinstance(n, ExternOp)]
    assert [n.target for n in externs] == [torch.ops.aten.mm.default]
    assert to_torch(externs[0].outputs[0].dtype) == torch.float16


def test_computed_prologue_stays_fused(monkeypatch):
    """An operand that computes something is no GEMM operand: the template keeps the group,
    and nobody offers ATen as a candidate."""

    def fn(x, w):
        return (x * 2) @ w

    x, w = torch.randn(6, 8), torch.randn(8, 5)
    record, asked = _compile_preferring_aten(monkeypatch, fn, x, w, dtype=torch.float32)
    assert not [n for n in record.graph.nodes if isinstance(n, ExternOp)]
    assert [with_aten for _, with_aten in asked] == [False]
    assert any(k.attrs.template for k in record.kernels)


def test_explain_shows_why_aten_runs(monkeypatch):
    monkeypatch.setattr(compiler, "make_chooser", _prefer_aten([]))
    x, w, b = torch.randn(6, 8), torch.randn(5, 8), torch.randn(5)
    torch._dynamo.reset()
    with torch.no_grad():
        report = minicomp.explain(
            lambda x, w, b: torch.relu(x @ w.t() + b), x, w, b, options={"target": TARGET}
        )
    text = str(report)
    assert "cuBLAS measured faster than the fused template: 12.5 us against 25.0 us" in text
    assert any(name.endswith("_gemm") for name in report.fallbacks)


# ---- the pieces, on a fused group compiled for cuda-emu ----


def _fused_group(fn, *args):
    """The graph (after fusion) of `fn` on cuda-emu, its layouts, and its one contraction."""
    torch._dynamo.reset()
    with torch.no_grad():
        report = minicomp.explain(fn, *args, options={"target": TARGET})
    graph = report.records[0].graph
    layouts = layouts_for(graph)
    (op,) = [n for n in graph.nodes if isinstance(n, FusedOp) and n.is_reduction]
    return graph, layouts, op


def _workload(op, layouts, args):
    """The group's inputs (`args`, told apart by their shapes) and fresh outputs in its
    layouts."""
    by_shape = {tuple(a.shape): a for a in args}
    assert len(by_shape) == len(args)
    inputs = [by_shape[tuple(v.shape)] for v in op.inputs]
    assert all(tuple(t.stride()) == layouts[v.name] for v, t in zip(op.inputs, inputs))
    outputs = [
        torch.empty_strided(v.shape, layouts[v.name], dtype=to_torch(v.dtype)) for v in op.outputs
    ]
    return Workload(inputs, outputs)


def _nhwc(*shape):
    return torch.randn(shape).to(memory_format=torch.channels_last)


CANDIDATES = {
    # name: (function, its arguments, whether an epilogue kernel follows the GEMM)
    "gemm_only": (lambda x, w: x @ w.t(), lambda: [torch.randn(7, 12), torch.randn(9, 12)], False),
    "bias_relu": (
        lambda x, w, b: torch.relu(x @ w.t() + b),
        lambda: [torch.randn(7, 12), torch.randn(9, 12), torch.randn(9)],
        True,
    ),
    # The GEMM's (N * H * W, O) rows are the channels-last output: viewed, not copied.
    "conv_1x1_nhwc": (
        torch.nn.functional.conv2d,
        lambda: [_nhwc(2, 12, 3, 5), _nhwc(9, 12, 1, 1)],
        False,
    ),
}


@pytest.mark.parametrize("name", list(CANDIDATES))
def test_aten_candidate_on_a_cpu_workload(name):
    """The tuner's ATen candidate writes the group's outputs: the GEMM straight into the
    output's memory, or the GEMM then the epilogue kernel (built here for the cpu target)."""
    fn, make_args, epilogue = CANDIDATES[name]
    args = make_args()
    graph, layouts, op = _fused_group(fn, *args)
    assert {v.name for v in op.inputs} <= {v.name for v in graph.inputs}
    rewrite = aten_rewrite(matmul_problem(op, layouts), set())
    assert (rewrite.epilogue is not None) == epilogue
    run = aten_candidate(rewrite, layouts, target=get_target("cpu"))
    w = _workload(op, layouts, args)
    for t in w.outputs:
        t.fill_(float("nan"))
    run(w)
    expected = fn(*(a.double() for a in args)).float()
    torch.testing.assert_close(w.outputs[0], expected, rtol=1e-4, atol=1e-4)
    assert outputs_match(w.outputs[0], expected)


def test_tune_contractions_asks_once_per_group():
    """The real chooser (heuristics, on cuda-emu) keeps the group, and answers the
    scheduler's later question about it with the answer it already gave."""
    x, w = torch.randn(6, 8), torch.randn(8, 5)
    graph, layouts, op = _fused_group(lambda x, w: torch.relu(x @ w), x, w)
    options = config.resolve({"target": TARGET})
    choose = make_chooser(options, get_target(TARGET).runner_factory(layouts, options, None))
    tuned = tune_contractions(graph, choose, layouts, options=options, target=get_target(TARGET))
    assert tuned is graph
    from minicomp.schedule.templates import select_template

    problem = matmul_problem(op, layouts)
    template = select_template(problem, options)
    first = choose(template, problem, op, lambda w: None)
    assert not first.aten and choose(template, problem, op) is first


class _EmulatedRunner:
    """The tuner's Runner for one group on the CPU: the heuristic config's kernel runs in the
    emulator, other configs refuse to load (keeping the test short), and the clock says the
    ATen candidate takes half the template's time."""

    arch, l2_bytes, compile_job = "emu", 0, None

    def __init__(self, op, layouts, aten, options):
        self.op, self.layouts, self.aten, self.options = op, layouts, aten, options
        self.loaded = 0

    def render(self, kernel):
        from minicomp.backends.cuda.codegen import render_module
        from minicomp.ir.func import Module

        return render_module(Module(kernel.name, (kernel,)))

    def load(self, kernel, source):
        if self.loaded:
            raise RuntimeError("one config is enough here")
        self.loaded += 1
        fns, _ = get_target(TARGET).build([kernel], self.options)
        fn = fns[kernel.name]
        return lambda w: fn(*(t.data_ptr() for t in (*w.inputs, *w.outputs)))

    def workload(self, seed):
        gen = torch.Generator().manual_seed(seed)

        def tensor(v):
            t = torch.empty_strided(v.shape, self.layouts[v.name], dtype=to_torch(v.dtype))
            return t.uniform_(-1, 1, generator=gen)

        return Workload([tensor(v) for v in self.op.inputs], [tensor(v) for v in self.op.outputs])

    def timer(self, launch, workloads):
        return 1e-5 if launch is self.aten else 2e-5


def test_tuner_checks_and_times_the_aten_candidate(tmp_path):
    """The tuner runs the ATen candidate on the same workload as the template's kernel, finds
    the same outputs, and keeps it as faster: tune_contractions then rewrites the group, and
    the stored record gives the same answer without measuring."""
    from minicomp.schedule.templates import select_template
    from minicomp.tune.database import TuningDatabase
    from minicomp.tune.tuner import tune

    x, w, b = torch.randn(6, 8), torch.randn(5, 8), torch.randn(5)
    graph, layouts, op = _fused_group(lambda x, w, b: torch.relu(x @ w.t() + b), x, w, b)
    options = config.resolve({"target": "cuda", "search_space": 1, "tune_budget": 0})
    database = TuningDatabase(str(tmp_path / "tuning.sqlite"))
    runs = []

    def choose(template, problem, op, aten=None, why=""):
        runner = _EmulatedRunner(op, layouts, aten, options) if aten is not None else None
        runs.append(runner)
        return tune(
            template, problem, options=options, runner=runner, database=database, progress=False
        )

    tuned = tune_contractions(graph, choose, layouts, options=options, target=get_target("cpu"))
    (gemm,) = [n for n in tuned.nodes if isinstance(n, ExternOp) and n.name.endswith("_gemm")]
    assert "10.0 us against 20.0 us" in gemm.reason
    problem = matmul_problem(op, layouts)
    again = choose(select_template(problem, options), problem, op, lambda w: None)
    assert again.how == "database" and again.aten
