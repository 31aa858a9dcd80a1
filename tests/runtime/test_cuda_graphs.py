"""CUDA-graph replay logic (static buffers, in-place parameters, segments), checked on the CPU
with a stand-in graph that re-runs what it captured over the captured slots."""

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from minicomp import config
from minicomp.compiler import compile_graph
from minicomp.dynamo.decompositions import decomposition_table
from minicomp.dynamo.importer import import_graph
from minicomp.record import CompileRecord
from minicomp.runtime import cuda_graphs
from minicomp.runtime.cuda_graphs import GraphedPlan, capturable, segments
from minicomp.runtime.plan import (
    CheckErrorFlag,
    ErrorFlag,
    ExternStep,
    KernelStep,
    ResetErrorFlag,
)


class ReplayGraph:
    """A graph whose replay runs the captured function again: like a CUDA graph, it works on
    the tensors it was captured with, so a missing copy into them shows as a stale result."""

    def __init__(self):
        self.fn = None
        self.replays = 0

    def capture(self, fn):
        self.fn = fn  # a capture records work without doing it

    def replay(self):
        self.replays += 1
        self.fn()


def plan_of(fn, *args):
    gm = make_fx(fn, decomposition_table=decomposition_table())(*args)
    options = config.resolve({"target": "cpu", "cuda_graphs": False})
    return compile_graph(import_graph(gm), options, CompileRecord())


def mlp(x, w, b):
    h = torch.tanh(torch.sin(x) @ w + b)  # a matmul (an ATen call) between kernels
    return h * h.sum(dim=1, keepdim=True), h.amax()


def make_mlp_inputs():
    return torch.randn(6, 5), torch.randn(5, 4), torch.randn(4)


def graphed(fn, *args, static=()):
    graphs = []

    def new_graph():
        graphs.append(ReplayGraph())
        return graphs[-1]

    return GraphedPlan(plan_of(fn, *args), static, new_graph=new_graph), graphs


def assert_same(actual, expected):
    assert len(actual) == len(expected)
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e)


def test_replay_matches_eager_for_new_input_values():
    x, w, b = make_mlp_inputs()
    g, graphs = graphed(mlp, x, w, b, static=(1, 2))
    for _ in range(5):
        x = torch.randn(6, 5)
        assert_same(g(x, w, b), mlp(x, w, b))
    assert g.captures == 1
    # kernel, matmul (eager on CPU tensors), kernels: two captured segments
    assert len(graphs) == 2 and all(gr.replays == 4 for gr in graphs)  # 1 at capture, 3 after


def test_an_input_overwritten_in_place_is_seen_by_replay():
    x, w, b = make_mlp_inputs()
    g, _ = graphed(mlp, x, w, b, static=(1, 2))
    g(x, w, b), g(x, w, b)
    x.copy_(torch.randn(6, 5))
    w.mul_(-2.0)  # an optimizer step: same address, new values
    assert_same(g(x, w, b), mlp(x, w, b))
    assert g.captures == 1


def test_a_parameter_at_a_new_address_is_captured_again():
    x, w, b = make_mlp_inputs()
    g, _ = graphed(mlp, x, w, b, static=(1, 2))
    g(x, w, b), g(x, w, b)
    w2 = torch.randn(5, 4)
    assert_same(g(x, w2, b), mlp(x, w2, b))
    assert g.captures == 2
    assert_same(g(x, w, b), mlp(x, w, b))
    assert g.captures == 3


def test_parameters_that_keep_moving_stop_the_capturing(monkeypatch):
    monkeypatch.setattr(cuda_graphs, "MAX_CAPTURES", 2)
    x, w, b = make_mlp_inputs()
    g, _ = graphed(mlp, x, w, b, static=(1, 2))
    g(x, w, b)
    for _ in range(2):
        w = torch.randn(5, 4)
        assert_same(g(x, w, b), mlp(x, w, b))
    with pytest.warns(UserWarning, match="without CUDA graphs"):
        w = torch.randn(5, 4)
        assert_same(g(x, w, b), mlp(x, w, b))
    assert not g.enabled and g.captures == 2


def test_outputs_stay_valid_after_the_next_call():
    x, w, b = make_mlp_inputs()
    g, _ = graphed(mlp, x, w, b, static=(1, 2))
    g(x, w, b)
    xs = [torch.randn(6, 5) for _ in range(3)]
    outs = [g(xk, w, b) for xk in xs]
    for xk, out in zip(xs, outs):
        assert_same(out, mlp(xk, w, b))


def test_activation_inputs_are_copied_not_captured():
    x, w, b = make_mlp_inputs()
    g, _ = graphed(mlp, x, w, b, static=(1, 2))
    g(x, w, b), g(x, w, b)
    x2 = torch.randn(6, 5)
    out = g(x2, w, b)
    assert_same(out, mlp(x2, w, b))
    x2.fill_(float("nan"))  # the user's tensor changes; the next call passes another one
    assert_same(g(x, w, b), mlp(x, w, b))


def test_symbolic_sizes_run_uncaptured():
    from graph_builder import GraphBuilder

    from minicomp.ir import expr as E

    b = GraphBuilder()
    n = b.symbol("n")
    x = b.input("x", (n, 4))
    b.output(b.compute("y", (n, 4), lambda i, j: E.call("sin", x[i, j])))
    options = config.resolve({"target": "cpu", "cuda_graphs": False})
    plan = compile_graph(b.build(), options, CompileRecord())
    g = GraphedPlan(plan, new_graph=ReplayGraph)
    assert not g.enabled and g.reason == "symbolic sizes"


def test_kernels_are_capturable_and_syncing_or_host_ops_are_not():
    kernel = KernelStep("k", lambda *a: None, [0, 1], [1], [])

    def extern(op, reads=(0,), outputs=(1,)):
        return ExternStep("e", op, lambda s, e: ((), {}), list(outputs), [()], [None], list(reads))

    cuda = ["cuda", "cuda", "cpu"]
    assert capturable(kernel, cuda)
    assert capturable(extern(torch.ops.aten.mm.default), cuda)
    assert not capturable(extern(torch.ops.aten.nonzero.default), cuda)
    assert not capturable(extern(torch.ops.aten._local_scalar_dense.default), cuda)
    assert not capturable(extern(torch.ops.aten.mm.default, outputs=(2,)), cuda)  # to CPU
    assert not capturable(extern(print), cuda)
    steps = [kernel, extern(torch.ops.aten.mm.default), extern(torch.ops.aten.nonzero.default)]
    steps.append(kernel)
    assert [(ok, len(s)) for ok, s in segments(steps, cuda)] == [(True, 2), (False, 1), (True, 1)]


def test_the_error_flag_check_is_captured_on_cuda_and_read_on_the_host_elsewhere():
    # On cuda the check is an asynchronous assert (no synchronization, no graph break); the
    # cpu and cuda-emu targets read host memory after the kernels.
    cuda = ["cuda", "cuda"]
    assert capturable(CheckErrorFlag(ErrorFlag("cuda")), cuda)
    assert not capturable(CheckErrorFlag(ErrorFlag("cpu")), cuda)
    assert capturable(ResetErrorFlag(ErrorFlag("cuda")), cuda)


def test_an_input_in_another_layout_is_restrided_at_every_replay():
    x, w, b = make_mlp_inputs()
    g, _ = graphed(mlp, x, w, b, static=(1, 2))
    wt = torch.randn(4, 5).t()  # a parameter in another layout: copied, not captured
    g(x, wt, b)
    for _ in range(3):
        xt = torch.randn(5, 6).t()  # same shape, column-major: the plan restrides it
        assert_same(g(xt, wt, b), mlp(xt, wt, b))
    assert g.captures == 1


def test_outputs_dropped_before_the_next_call_are_not_copied():
    """A training step's pattern: each call's results are used and freed before the next call,
    so the replay hands out the graph's own output tensors, with no copy."""
    x, w, b = make_mlp_inputs()
    g, _ = graphed(mlp, x, w, b, static=(1, 2))
    g(x, w, b)
    addresses = set()
    for _ in range(4):
        xk = torch.randn(6, 5)
        out = g(xk, w, b)
        assert_same(out, mlp(xk, w, b))
        addresses.add(tuple(t.data_ptr() for t in out))
        del out
    assert g.direct and len(addresses) == 1  # the same graph memory every call


def test_a_view_kept_of_a_result_is_never_overwritten():
    x, w, b = make_mlp_inputs()
    g, _ = graphed(mlp, x, w, b, static=(1, 2))
    g(x, w, b), g(x, w, b)
    x1 = torch.randn(6, 5)
    kept = g(x1, w, b)[0][1:]  # the result list is dropped, a view of an output is not
    x2 = torch.randn(6, 5)
    assert_same(g(x2, w, b), mlp(x2, w, b))
    torch.testing.assert_close(kept, mlp(x1, w, b)[0][1:])
    assert not g.direct  # from now on outputs are copied
    del kept
    x3 = torch.randn(6, 5)
    first = g(x3, w, b)
    assert_same(g(x, w, b), mlp(x, w, b))
    assert_same(first, mlp(x3, w, b))


def decode_step(cache, state, x, i):
    cache.index_copy_(0, i, x)  # an in-place ATen call on the input
    state.copy_(x.cos().expand_as(state))  # a kernel writing into the input
    return cache.sum(0)


@pytest.mark.parametrize("static", [(0, 1), ()], ids=["captured in place", "copied"])
def test_written_inputs_reach_the_callers_tensors_at_every_replay(static):
    cache, state, x = torch.randn(8, 4), torch.randn(3, 4), torch.randn(1, 4)
    traced = torch.func.functionalize(decode_step, remove="mutations")
    gm = make_fx(traced, decomposition_table=decomposition_table())(
        cache.clone(), state.clone(), x, torch.tensor([3])
    )
    options = config.resolve({"target": "cpu", "cuda_graphs": False})
    plan = compile_graph(import_graph(gm), options, CompileRecord())
    assert [pos for pos, _ in plan.written_inputs] == [0, 1]
    g = GraphedPlan(plan, static, new_graph=ReplayGraph)
    cache_ref, state_ref = cache.clone(), state.clone()
    for step in (3, 0, 7, 5):
        x, i = torch.randn(1, 4), torch.tensor([step])
        assert_same(g(cache, state, x, i), [decode_step(cache_ref, state_ref, x, i)])
        torch.testing.assert_close(cache, cache_ref)
        torch.testing.assert_close(state, state_ref)
    assert g.captures == 1 and g.enabled
