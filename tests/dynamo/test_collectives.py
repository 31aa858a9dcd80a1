"""Collectives inside compiled graphs, in one process (a gloo group of world size 1, where an
all-reduce returns its input): ATen calls in program order that nothing fuses across, merges
or drops, inputs c10d may still read kept out of the workspace, no CUDA-graph capture of
them; and DTensor's DeviceMesh inputs passed around the plan."""

import logging

import pytest
import torch
import torch.distributed._functional_collectives  # noqa: F401  (registers _c10d_functional)
from helpers import assert_same, clone_inputs
from helpers_distributed import single_process_group
from torch.fx.experimental.proxy_tensor import make_fx

from minicomp import config
from minicomp.compiler import compile_graph
from minicomp.dynamo import backend
from minicomp.dynamo.decompositions import decomposition_table
from minicomp.dynamo.importer import import_graph
from minicomp.ir.collectives import is_collective, is_wait
from minicomp.ir.graph import ExternOp, FusedOp
from minicomp.record import CompileRecord
from minicomp.runtime import cuda_graphs
from minicomp.runtime.plan import ExternStep, KernelStep

c10d = torch.ops._c10d_functional


@pytest.fixture(scope="module")
def group():
    with single_process_group() as name:
        yield name


def program(group: str):
    def fn(x, y):
        a = x * 2
        r1 = c10d.all_reduce(a, "sum", group)
        r2 = c10d.all_reduce(y, "sum", group)
        r3 = c10d.all_reduce(y, "sum", group)  # the same call again: not merged
        unused = c10d.all_reduce(x, "sum", group)  # its result unread: still issued
        gathered = c10d.all_gather_into_tensor(x.t(), 1, group)  # a transposed input
        scattered = c10d.reduce_scatter_tensor(y * 3, "sum", 1, group)
        b = torch.sin(a) + 1  # after the collectives, independent of them
        w1, w2, w3 = (c10d.wait_tensor(r) for r in (r1, r2, r3))
        c10d.wait_tensor(unused)
        w4, w5 = c10d.wait_tensor(gathered), c10d.wait_tensor(scattered)
        return w1 * b, (w2 + w3).t(), w4 + 1, w5

    return fn


def compiled(fn, target, *args):
    gm = make_fx(fn, decomposition_table=decomposition_table())(*args)
    record = CompileRecord()
    plan = compile_graph(import_graph(gm), config.resolve({"target": target}), record)
    return plan, record


def test_collectives_run_in_program_order_and_nothing_fuses_across_them(group, target):
    fn = program(group)
    args = (torch.randn(5, 3), torch.randn(5, 3))
    plan, record = compiled(fn, target, *args)
    assert_same(tuple(plan(*clone_inputs(args))), fn(*args))

    nodes = record.graph.nodes
    calls = [(k, n) for k, n in enumerate(nodes) if isinstance(n, ExternOp)]
    collectives = [(k, n) for k, n in calls if is_collective(n.target)]
    names = [n.target.__name__.split(".")[0] for _, n in collectives]
    # Six issued, then six waits, as written; none merged (two read y) or dropped.
    issued = ["all_reduce"] * 4 + ["all_gather_into_tensor", "reduce_scatter_tensor"]
    assert names == issued + ["wait_tensor"] * 6
    first, second = (k for k, n in collectives[:2])
    assert collectives[0][1].inputs != collectives[1][1].inputs
    kernels = {k: n for k, n in enumerate(nodes) if isinstance(n, FusedOp)}
    doubling = [k for k, n in kernels.items() if any(m.startswith("mul") for m in n.members)]
    sine = [k for k, n in kernels.items() if any(m.startswith("sin") for m in n.members)]
    # x * 2 is computed before the first collective; sin(a) + 1, which would otherwise fuse
    # with it (and move before every collective), after the last one issued.
    assert doubling and sine and doubling[0] < first and sine[0] > collectives[5][0]
    assert not set(doubling) & set(sine)
    # The all-gather reads a row-major copy of x.t(), made before it.
    gather = collectives[4][1]
    assert record.graph.producers()[gather.inputs[0]] in nodes[: collectives[4][0]]
    assert gather.inputs[0].type.strides == (5, 1)


def test_collective_inputs_get_memory_of_their_own_and_results_are_not_copied(group, target):
    fn = program(group)
    args = (torch.randn(5, 3), torch.randn(5, 3))
    plan, record = compiled(fn, target, *args)
    steps = [s for s in plan.steps if isinstance(s, ExternStep) and is_collective(s.target)]
    issued = [s for s in steps if not is_wait(s.target)]
    assert issued and all(w is None for s in issued for w in s.expected_strides)
    # The kernel writing x * 2 writes it outside the workspace: c10d may read it after the
    # step that passed it, while later kernels reuse workspace bytes.
    read = {k for s in issued for k in s.reads}
    assert not any(plan.slots[k].workspace for k in read)
    assert any(isinstance(s, KernelStep) and set(s.outputs) & read for s in plan.steps)


def test_cuda_graphs_leave_collectives_out_of_the_capture(group):
    # The planning decision, on cuda-emu's plan with its slots taken for CUDA tensors: each
    # collective and wait runs eagerly, the kernels between them are captured apart.
    fn = program(group)
    plan, _ = compiled(fn, "cuda-emu", torch.randn(5, 3), torch.randn(5, 3))
    devices = ["cuda"] * len(plan.slots)
    cut = cuda_graphs.segments(plan.steps, devices)
    for ok, steps in cut:
        assert not ok or not any(
            isinstance(s, ExternStep) and is_collective(s.target) for s in steps
        )
    assert [ok for ok, _ in cut].count(True) >= 2  # kernels before and after the collectives
    note = cuda_graphs.collectives_note(plan)
    assert note.startswith("12 collective steps") and "run outside CUDA graphs" in note

    messages = []
    handler = logging.Handler()
    handler.emit = lambda r: messages.append(r.getMessage())
    log = logging.getLogger("minicomp.runtime.cuda_graphs")
    old_level = log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        cuda_graphs.GraphedPlan(plan)
    finally:
        log.removeHandler(handler)
        log.setLevel(old_level)
    assert any("collective steps" in m for m in messages)


class ReplayGraph:
    """A stand-in CUDA graph whose replay runs again what it captured, on the same tensors."""

    def capture(self, fn):
        self.fn = fn

    def replay(self):
        self.fn()


def test_replays_wait_on_the_collectives_results_themselves(group):
    # cuda-emu's plan through GraphedPlan with a stand-in graph: the kernels are captured,
    # the collectives run between replays. A collective's result must reach its wait as c10d
    # returned it, not copied into a tensor of the capture (read before the wait).
    fn = program(group)
    plan, _ = compiled(fn, "cuda-emu", torch.randn(5, 3), torch.randn(5, 3))
    graphed = cuda_graphs.GraphedPlan(plan, new_graph=ReplayGraph)
    for _ in range(4):  # warm-up, capture, replays
        args = (torch.randn(5, 3), torch.randn(5, 3))
        assert_same(tuple(graphed(*clone_inputs(args))), fn(*args))
    segments = graphed.captured.segments
    assert any(seg.graph is not None for seg in segments)
    for seg in segments:
        for step in seg.steps:
            if isinstance(step, ExternStep) and is_collective(step.target):
                assert seg.graph is None
                if not is_wait(step.target):
                    assert not set(step.outputs) & set(seg.fixed)


def test_dtensor_device_mesh_inputs_pass_around_the_plan(group, target, monkeypatch):
    # A tensor-parallel module on a mesh of one: AOTAutograd gives each DTensor parameter's
    # graph its DeviceMesh as an input, which the backward returns beside the gradients.
    from helpers_distributed import TensorParallelNet, _tensor_parallel_net

    split = []

    def spy(gm):
        out = real(gm)
        split.append(out[1])
        return out

    real = backend.split_opaque_inputs
    monkeypatch.setattr(backend, "split_opaque_inputs", spy)
    nets = [_tensor_parallel_net() for _ in range(2)]
    assert all(isinstance(n, TensorParallelNet) for n in nets)
    torch._dynamo.reset()
    run = torch.compile(
        nets[1], backend="minicomp", options={"target": target, "fallback": "error"}
    )
    x = torch.randn(4, 8)
    for call in (nets[0], run):
        call(x.clone().requires_grad_()).square().sum().backward()
    grads = [[getattr(p.grad, "_local_tensor", p.grad) for p in n.parameters()] for n in nets]
    assert_same(grads[1], grads[0], rtol=1e-5, atol=1e-6)
    assert any(s.positions for s in split) and any(s.returned for s in split)
