"""The ATen importer and the torch.compile entry point: lowered ops, ATen fallbacks,
symbolic sizes, multi-output ops, and what happens when compiling a graph fails."""

import warnings

import pytest
import torch
import torch._dynamo
from helpers import check_compiled, compile_minicomp
from torch._dynamo.backends.common import aot_autograd

import minicomp
from minicomp import compiler
from minicomp.dynamo.decompositions import decomposition_table
from minicomp.dynamo.importer import import_graph
from minicomp.ir.compute import Compute
from minicomp.ir.expr import Var
from minicomp.ir.graph import ComputeOp, ExternOp, Graph, Value
from minicomp.ir.types import i64
from minicomp.ops import registry

aten = torch.ops.aten


def imported(fn, *args, dynamic=False) -> Graph:
    """The graph IR the importer makes of `fn`'s forward ATen graph (before any pass)."""
    captured = []

    def fw(gm, example_inputs):
        captured.append(gm)
        return gm

    torch._dynamo.reset()
    backend = aot_autograd(fw_compiler=fw, decompositions=decomposition_table())
    torch.compile(fn, backend=backend, dynamic=dynamic)(*args)
    torch._dynamo.reset()
    (gm,) = captured
    return import_graph(gm)


def externs(g: Graph) -> dict[str, ExternOp]:
    return {n.name: n for n in g.nodes if isinstance(n, ExternOp)}


def producer(g: Graph, v: Value):
    return g.producers()[v]


# --- ops without a lowering ----------------------------------------------------------------


def _cumsum_fn(x):
    return torch.cumsum(x * 2, dim=1) + 1


def test_op_without_a_lowering_becomes_an_extern_op_with_a_reason():
    g = imported(_cumsum_fn, torch.randn(3, 5))
    ext = externs(g)["cumsum.default"]
    assert ext.reason == "no lowering"
    assert ext.target is aten.cumsum.default
    (inp,) = ext.inputs
    assert isinstance(producer(g, inp), ComputeOp)  # x * 2 is lowered
    assert len(ext.outputs) == 1 and ext.result_paths == ((),)
    # The op consuming the extern's result is lowered and reads it.
    assert any(ext.outputs[0] in n.inputs for n in g.nodes if isinstance(n, ComputeOp))


def test_extern_op_result_matches_eager(target):
    check_compiled(_cumsum_fn, torch.randn(3, 5), target=target)


def test_multi_output_extern_maps_each_output(target):
    def f(x):
        values, indices = torch.sort(x, dim=1)
        return values * 2, indices + 1

    x = torch.randn(4, 6)
    g = imported(f, x)
    ext = externs(g)["sort.default"]
    assert ext.result_paths == ((0,), (1,))
    assert [v.dtype.name for v in ext.outputs] == ["float32", "int64"]
    check_compiled(f, x, target=target)


def test_lowering_that_raises_falls_back_to_aten(monkeypatch, target):
    def broken(ctx, *args, **kwargs):
        raise RuntimeError("simulated lowering bug")

    assert registry.lowering_for(aten.exp.default) is not None  # loads the registry
    monkeypatch.setitem(registry._LOWERINGS, aten.exp.default, broken)

    def f(x):
        return torch.exp(x) * 3

    x = torch.randn(5)
    g = imported(f, x)
    ext = externs(g)["exp.default"]
    assert "lowering failed" in ext.reason and "simulated lowering bug" in ext.reason
    assert "RuntimeError" in ext.reason
    check_compiled(f, x, target=target)


def test_lowering_with_a_wrong_shape_falls_back(monkeypatch):
    from minicomp.ir.compute import compute

    def wrong(ctx, x):
        return compute("neg", (1,), lambda i: x[0])

    registry.lowering_for(aten.neg.default)
    monkeypatch.setitem(registry._LOWERINGS, aten.neg.default, wrong)
    g = imported(lambda x: -x + 1, torch.randn(4))
    assert "shape" in externs(g)["neg.default"].reason


# --- symbolic sizes ------------------------------------------------------------------------


def test_symbolic_placeholders_become_size_vars(target):
    def f(x):
        return torch.softmax(x * 2, dim=-1)

    x = torch.randn(5, 7)
    g = imported(f, x, dynamic=True)
    symbols = g.symbols()
    assert symbols and all(isinstance(s, Var) and s.type == i64 for s in symbols)
    (xv,) = [v for v in g.inputs if isinstance(v, Value)]
    assert all(isinstance(d, Var) and d in symbols for d in xv.shape)
    assert isinstance(g.outputs[0], Value) and g.outputs[0].shape == xv.shape
    compiled = compile_minicomp(f, target, dynamic=True)
    for shape in ((5, 7), (3, 9), (6, 2)):
        x = torch.randn(shape)
        torch.testing.assert_close(compiled(x), f(x))


# Reshapes with sizes written in the code (Dynamo makes a closure's ints symbols too).
GUARDED_RESHAPES = {
    "22x-1x6": (lambda x: x.reshape((22, -1, 6)) * 1, (1, 33, 4)),
    "10x-1x4": (lambda x: x.reshape((10, -1, 4)) * 1, (2, 15, 4)),
    "-1x15x7": (lambda x: x.reshape((-1, 15, 7)) * 1, (3, 5, 7)),
}


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("dtype", [torch.bool, torch.float32, torch.int32])
@pytest.mark.parametrize("case", GUARDED_RESHAPES)
def test_reshape_whose_size_holds_only_under_the_guards(case, dtype, dynamic, target):
    """Dynamic reshape((22, -1, 6)) of (1, s97, s69) has ATen size s69*s97 // (22*(s69*s97 //
    132)) last: 6 where the guard 132 | s69*s97 holds, a division by zero at other sizes. The
    lowering's shape is compared with it only where the guards hold."""
    f, shape = GUARDED_RESHAPES[case]
    x = (torch.randn(shape) * 4).to(dtype)
    check_compiled(f, x, target=target, dynamic=dynamic)


def test_lowering_with_a_wrong_symbolic_shape_falls_back(monkeypatch):
    from minicomp.ir.compute import compute

    def wrong(ctx, x):
        return compute("neg", (x.shape[0] + 1,), lambda i: x[0])

    registry.lowering_for(aten.neg.default)
    monkeypatch.setitem(registry._LOWERINGS, aten.neg.default, wrong)
    g = imported(lambda x: -x + 1, torch.randn(4), dynamic=True)
    assert "shape" in externs(g)["neg.default"].reason


# --- multi-output lowerings ----------------------------------------------------------------


def test_var_mean_outputs_are_mapped_in_aten_order(target):
    def f(x):
        var, mean = torch.var_mean(x, dim=1)
        return mean, var

    x = torch.randn(4, 9) * 3 + 1
    g = imported(f, x)
    assert not externs(g)
    mean, var = g.outputs
    assert mean.name != var.name
    mop, vop = producer(g, mean), producer(g, var)
    assert isinstance(mop, ComputeOp) and isinstance(vop, ComputeOp)
    assert "var_mean" in mop.name and "var_mean" in vop.name
    check_compiled(f, x, target=target)


def test_max_dim_values_and_indices_are_mapped(target):
    def f(x):
        values, indices = torch.max(x, dim=1)
        return indices, values * 2

    x = torch.randn(5, 8)
    g = imported(f, x)
    assert not externs(g)
    indices, values = g.outputs
    assert indices.dtype == i64 and values.dtype.name == "float32"
    assert isinstance(producer(g, indices).definition, Compute)
    check_compiled(f, x, target=target)


# --- failures while compiling a graph ------------------------------------------------------


def _fail_planning(monkeypatch):
    """Make building the plan fail: a failure of the graph as a whole, no kernel's."""

    def boom(*args, **kwargs):
        raise RuntimeError("simulated planning failure")

    monkeypatch.setattr(compiler, "PlanBuilder", boom)


def test_fallback_error_raises_on_a_compile_failure(monkeypatch, target):
    _fail_planning(monkeypatch)
    compiled = compile_minicomp(lambda x: torch.sin(x) + 1, target)  # fallback="error"
    with pytest.raises(Exception, match="simulated planning failure"):
        compiled(torch.randn(4))


def test_default_fallback_runs_eagerly_with_a_warning(monkeypatch, target):
    _fail_planning(monkeypatch)

    def f(x):
        return torch.sin(x) + 1

    torch._dynamo.reset()
    compiled = torch.compile(f, backend="minicomp", options={"target": target})
    x = torch.randn(4)
    with pytest.warns(UserWarning, match="runs it eagerly.*simulated planning failure"):
        out = compiled(x)
    torch.testing.assert_close(out, f(x))
    torch._dynamo.reset()


def test_no_warning_when_compiling_succeeds(target):
    torch._dynamo.reset()
    compiled = torch.compile(lambda x: x * 2, backend="minicomp", options={"target": target})
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        compiled(torch.randn(3))
    torch._dynamo.reset()


def test_linalg_inv_compiles_with_inv_as_an_extern_call(target):
    def f(x):
        return torch.linalg.inv(x) * 2

    x = torch.randn(3, 3) + 3 * torch.eye(3)
    check_compiled(f, x, target=target)
    e = minicomp.explain(f, x, options={"target": target})
    assert "<whole graph>" not in e.fallbacks


def test_a_cast_naming_its_own_device_is_lowered(target):
    # Hugging Face masks do `mask.to(device=mask.device, dtype=...)`: only a dtype change.
    def f(m):
        return m.to(device=m.device, dtype=torch.bool) & (m > 0.5)

    assert "_to_copy.default" not in externs(imported(f, torch.rand(3, 4)))
    check_compiled(f, torch.rand(3, 4), target=target)


def test_a_run_time_check_is_called_in_order(target):
    # _assert_async returns nothing; its graph used to run eagerly as a whole.
    def f(x):
        torch._assert_async(x.abs().sum() > 0, "x is all zeros")
        return x * 2

    g = imported(f, torch.ones(3))
    assert externs(g)["_assert_async.msg"].outputs == ()
    compiled = compile_minicomp(f, target)
    assert torch.equal(compiled(torch.ones(3)), torch.full((3,), 2.0))
    with pytest.raises(RuntimeError, match="x is all zeros"):
        compiled(torch.zeros(3))
