"""The cuda target's runtime: target choice, launch dimensions, architecture choice, and on a
GPU the driver-API launches, streams, threads and CUDA graphs of compiled models."""

import threading
import warnings

import pytest
import torch
from helpers import assert_same

import minicomp
from minicomp.backends.cuda import driver, module
from minicomp.dynamo.backend import recording
from minicomp.ir import expr as E
from minicomp.ir.func import Function, LaunchAttrs
from minicomp.ir.stmt import seq
from minicomp.ir.symbols import launch_dims
from minicomp.ir.types import PointerType, f32, i64
from minicomp.runtime.cuda_graphs import GraphedPlan

gpu = pytest.mark.gpu


def compiled(fn, **options):
    torch._dynamo.reset()
    return torch.compile(fn, backend="minicomp", options={"fallback": "error", **options})


def gelu_ln(x, w, b):
    return torch.nn.functional.layer_norm(torch.nn.functional.gelu(x), (x.shape[-1],), w, b)


# ---- without a GPU ----


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA driver is present")
def test_without_a_driver_the_cuda_target_says_so():
    with pytest.raises(driver.CudaDriverError, match="libcuda.so.1.*cuda-emu"):
        driver.libcuda()


def test_the_cuda_target_refuses_cpu_tensors_by_name():
    x = torch.randn(4, 8)
    with pytest.raises(Exception, match="target 'cuda' needs tensors on a CUDA device"):
        compiled(torch.sin, target="cuda")(x)
    torch._dynamo.reset()
    f = torch.compile(torch.sin, backend="minicomp", options={"target": "cuda"})
    with pytest.warns(UserWarning, match="runs it eagerly.*CUDA device"):
        torch.testing.assert_close(f(x), torch.sin(x))


def test_auto_picks_cpu_for_cpu_tensors():
    records = []
    with recording(records):
        compiled(torch.sin)(torch.randn(3))
    assert [r.target for r in records] == ["cpu"]


def _kernel(grid, block):
    n = E.Var("n", i64)
    params = (E.Var("x", PointerType(f32)), n)
    attrs = LaunchAttrs(grid_dim=grid, block_dim=block)
    return Function("k", params, seq(), "kernel", attrs=attrs)


def test_launch_dims_are_fixed_or_computed_from_the_size_arguments():
    fixed = launch_dims(_kernel((7, 1, 1), (256, 1, 1)))
    assert fixed((0, 123)) == ((7, 1, 1), (256, 1, 1))
    n = E.Var("n", i64)
    blocks = E.minimum(E.maximum((n + 255) // 256, E.const(1)), E.const(2**31 - 1))
    dynamic = launch_dims(_kernel((blocks, 1, 1), (256, 1, 1)))
    assert dynamic((0, 1000)) == ((4, 1, 1), (256, 1, 1))
    assert dynamic((0, 0)) == ((1, 1, 1), (256, 1, 1))


def test_the_arch_is_the_devices_or_an_older_minor_of_its_major(monkeypatch):
    monkeypatch.setattr(module, "supported_archs", lambda library: ("sm_80", "sm_86", "sm_90"))
    for device, expected in (("sm_90", "sm_90"), ("sm_89", "sm_86"), ("sm_87", "sm_86")):
        monkeypatch.setattr(driver, "device_arch", lambda index, d=device: d)
        assert module.pick_arch(0) == expected
    monkeypatch.setattr(driver, "device_arch", lambda index: "sm_75")
    with pytest.raises(driver.CudaDriverError, match="sm_75"):
        module.pick_arch(0)


# ---- on a GPU ----


@gpu
def test_kernels_launch_on_the_current_stream():
    x, w, b = torch.randn(64, 256, device="cuda"), torch.randn(256, device="cuda"), None
    f = compiled(gelu_ln, target="cuda", cuda_graphs=False)
    f(x, w, b)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        x2 = torch.randn(4096, 256, device="cuda")
        out = f(x2, w, b)  # queued behind x2's initialisation on the side stream only
    side.synchronize()
    assert_same(out, gelu_ln(x2, w, b), rtol=1e-4, atol=1e-5)


@gpu
def test_backward_runs_on_autograds_thread_with_the_context_current():
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.LayerNorm(64), torch.nn.Linear(64, 8)
    ).cuda()
    reference = [p.detach().clone() for p in model.parameters()]
    x = torch.randn(16, 32, device="cuda")
    f = compiled(model, target="cuda")
    f(x).square().sum().backward()
    got = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    for p, r in zip(model.parameters(), reference):
        assert torch.equal(p.detach(), r)
    model(x).square().sum().backward()
    for g, p in zip(got, model.parameters()):
        torch.testing.assert_close(g, p.grad, rtol=1e-4, atol=1e-5)


@gpu
def test_a_compiled_function_runs_from_a_new_thread():
    x = torch.randn(1000, device="cuda")
    f = compiled(lambda t: torch.exp(t) * 2 + 1, target="cuda", cuda_graphs=False)
    f(x)
    result = {}
    thread = threading.Thread(target=lambda: result.setdefault("out", f(x)))
    thread.start()
    thread.join()
    torch.testing.assert_close(result["out"], torch.exp(x) * 2 + 1)


def _graphed_plan(records) -> GraphedPlan:
    (plan,) = [r.plan for r in records if isinstance(r.plan, GraphedPlan)]
    return plan


@gpu
def test_graph_replay_matches_eager_for_new_input_values():
    model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.LayerNorm(128))
    model = model.cuda().eval()
    records = []
    with torch.no_grad(), recording(records):
        f = compiled(model, target="cuda")
        for _ in range(5):
            x = torch.randn(32, 64, device="cuda")
            out = f(x)
            expected = model(x)
            assert_same(out, expected, rtol=1e-4, atol=1e-5)
    plan = _graphed_plan(records)
    assert plan.enabled and plan.captures == 1


@gpu
def test_graph_outputs_survive_the_next_replay():
    f = compiled(lambda t: torch.softmax(t * 2, dim=-1), target="cuda")
    xs = [torch.randn(8, 300, device="cuda") for _ in range(4)]
    outs = [f(x) for x in xs]
    for x, out in zip(xs, outs):
        torch.testing.assert_close(out, torch.softmax(x * 2, dim=-1))


@gpu
def test_a_parameter_at_a_new_address_is_handled():
    model = torch.nn.Linear(64, 64).cuda().eval()
    records = []
    x = torch.randn(8, 64, device="cuda")
    with torch.no_grad(), recording(records):
        f = compiled(lambda t: torch.relu(model(t)) + 1, target="cuda")
        f(x), f(x)
        model.weight = torch.nn.Parameter(torch.randn(64, 64, device="cuda"))
        torch.testing.assert_close(f(x), torch.relu(model(x)) + 1)
        model.weight.mul_(-1)  # in place: same address
        torch.testing.assert_close(f(x), torch.relu(model(x)) + 1)


@gpu
def test_an_op_that_syncs_splits_the_graph_into_segments():
    def fn(x):
        y = torch.sin(x) * 2
        host = y.cpu() + 1  # a copy to the host cannot be captured
        return torch.cos(host.cuda()) + y

    records = []
    with recording(records), warnings.catch_warnings():
        warnings.simplefilter("error")
        f = compiled(fn, target="cuda")
        for _ in range(4):
            x = torch.randn(1000, device="cuda")
            torch.testing.assert_close(f(x), fn(x))
    plan = _graphed_plan(records)
    assert plan.captures == 1
    kinds = [seg.graph is not None for seg in plan.captured.segments]
    assert True in kinds and False in kinds


@gpu
def test_cuda_graphs_off_runs_the_plan_directly():
    records = []
    with recording(records):
        f = compiled(lambda t: torch.tanh(t) * 3, target="cuda", cuda_graphs=False)
        x = torch.randn(4096, device="cuda")
        torch.testing.assert_close(f(x), torch.tanh(x) * 3)
    assert not any(isinstance(r.plan, GraphedPlan) for r in records)


@gpu
def test_cpu_targets_refuse_cuda_tensors():
    with pytest.raises(Exception, match="runs kernels on CPU tensors"):
        compiled(torch.sin, target="cpu")(torch.randn(4, device="cuda"))


@gpu
def test_minicomp_explain_reports_the_cuda_kernels():
    x = torch.randn(32, 256, device="cuda")
    e = minicomp.explain(lambda t: torch.softmax(t, -1) * 2, x, options={"target": "cuda"})
    assert e.kernel_count == 1 and "__global__" in e.source()
