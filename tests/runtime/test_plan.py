"""The execution plan: intermediates in a shared workspace, outputs with eager's strides,
fresh output tensors on every call."""

import numpy as np
import pytest
import torch
from graph_builder import GraphBuilder, evaluate_graph, random_inputs
from helpers import check_compiled, compile_minicomp

import minicomp
from minicomp import config
from minicomp.compiler import compile_graph
from minicomp.ir import expr as E
from minicomp.ir.compute import reduce
from minicomp.record import CompileRecord
from minicomp.runtime.memory import ALIGN
from minicomp.runtime.plan import FixedCall


def six_ops(x):
    a = torch.sin(x) * 2.0  # 1, 2
    col = a.sum(dim=0, keepdim=True)  # 3: another domain than the row sum below
    c = a / (col.abs() + 1.0)  # 4, 5, 6 (a denominator near 0 would amplify rounding)
    return torch.tanh(c.sum(dim=1)) * 0.5  # 7, 8, 9


def test_chain_with_intermediates_in_the_workspace_matches_eager(target):
    x = torch.randn(5, 7)
    e = minicomp.explain(six_ops, x, options={"target": target})
    assert e.aten_op_count >= 6
    assert e.kernel_count >= 2, str(e)
    assert e.fallbacks == {}
    assert e.report().count("==== kernel IR:") == e.kernel_count
    check_compiled(six_ops, x, target=target)
    check_compiled(six_ops, torch.randn(5, 7), target=target)


def _workspace_graph():
    """Three kernels in a row; the two intermediates are read only by the next kernel."""
    b = GraphBuilder()
    n = b.symbol("n")
    x = b.input("x", (n, 8))
    a = b.compute("a", (n, 8), lambda i, j: E.call("sin", x[i, j]) * 2.0)
    col = b.compute("col", (1, 8), lambda i, j: reduce("sum", (n,), lambda k: a[k, j]))
    c = b.compute("c", (n, 8), lambda i, j: a[i, j] / (col[0, j] + 1.0))
    row = b.compute("row", (n, 1), lambda i, j: reduce("max", (8,), lambda k: c[i, k]))
    tot = b.compute("tot", (1, 1), lambda i, j: reduce("sum", (n,), lambda k: row[k, 0]))
    out = b.compute("out", (n, 8), lambda i, j: c[i, j] - tot[0, 0])
    b.output(out)
    return b.build()


def test_plan_places_intermediates_in_a_workspace_and_runs_right():
    g = _workspace_graph()
    plan = compile_graph(g, config.resolve({"target": "cpu"}), CompileRecord())
    workspace = {info.name for info in plan.slots if info.workspace}
    assert workspace and "out" not in workspace and "x" not in workspace
    for rows in (3, 9):
        env = {"n": rows}
        offsets, total = plan.layout(env)
        assert set(offsets) == {k for k, info in enumerate(plan.slots) if info.workspace}
        assert all(off % ALIGN == 0 for off in offsets.values())
        assert 0 < total
        inputs = random_inputs(g, seed=rows, sizes=env)
        (expected,) = evaluate_graph(g, inputs, env)
        (actual,) = plan(rows, torch.from_numpy(inputs["x"]))
        np.testing.assert_allclose(actual.numpy(), expected, rtol=1e-5, atol=1e-5)


def test_workspace_memory_is_reused_between_disjoint_lifetimes():
    # Kernels in a chain, alternating row and column sums (which cannot share a kernel),
    # each reading only the previous kernel's result.
    b = GraphBuilder()
    v = b.input("x", (16, 16))
    for k in range(6):
        prev = v
        if k % 2:
            s = b.compute(
                f"s{k}", (1, 16), lambda i, j, p=prev: reduce("sum", (16,), lambda r: p[r, j])
            )
            v = b.compute(f"v{k}", (16, 16), lambda i, j, p=prev, s=s: p[i, j] - s[0, j] * 0.01)
        else:
            s = b.compute(
                f"s{k}", (16, 1), lambda i, j, p=prev: reduce("sum", (16,), lambda r: p[i, r])
            )
            v = b.compute(f"v{k}", (16, 16), lambda i, j, p=prev, s=s: p[i, j] - s[i, 0] * 0.01)
    b.output(v)
    g = b.build()
    plan = compile_graph(g, config.resolve({"target": "cpu"}), CompileRecord())
    sizes = [info.shape({})[0] * info.shape({})[1] * 4 for info in plan.slots if info.workspace]
    assert len(sizes) >= 4
    _, total = plan.layout({})
    assert total < sum(sizes)
    inputs = random_inputs(g)
    (expected,) = evaluate_graph(g, inputs)
    (actual,) = plan(torch.from_numpy(inputs["x"]))
    np.testing.assert_allclose(actual.numpy(), expected, rtol=1e-5, atol=1e-5)


def test_transposed_output_has_eager_strides(target):
    def f(x):
        return x.t() * 2

    x = torch.randn(4, 6)
    out = check_compiled(f, x, target=target)
    assert out.stride() == f(x).stride() == (1, 6)


def test_permuted_3d_output_has_eager_strides(target):
    def f(x):
        return torch.relu(x.permute(2, 0, 1)) + 1

    x = torch.randn(2, 3, 5)
    out = check_compiled(f, x, target=target)
    assert out.stride() == f(x).stride()


def test_outputs_are_fresh_tensors_on_every_call(target):
    def f(x):
        return torch.exp(x) + 1

    compiled = compile_minicomp(f, target)
    x = torch.randn(8)
    first = compiled(x)
    kept = first.clone()
    second = compiled(x * 3)
    assert first.data_ptr() != second.data_ptr()
    torch.testing.assert_close(first, kept)
    torch.testing.assert_close(second, f(x * 3))


def test_constant_output_is_a_fresh_tensor_each_call(target):
    def f(x):
        return x + 1, torch.arange(4.0) * 2

    compiled = compile_minicomp(f, target)
    x = torch.randn(3)
    _, c1 = compiled(x)
    c1.add_(100.0)
    _, c2 = compiled(x)
    torch.testing.assert_close(c2, torch.arange(4.0) * 2)
    assert c1.data_ptr() != c2.data_ptr()


def test_broadcast_constant_outputs_share_memory_as_in_eager(target):
    # A constant returned expanded (a broadcast mask or bias) has a zero stride: its elements
    # share memory, as eager's do, which copy_ refuses to write; so does empty_strided with one.
    def f(x):
        bias = torch.arange(4.0).expand(3, 4)
        scale = torch.full((2, 1, 1), 0.5).expand(2, 3, 4)
        return x * bias, bias, scale

    x = torch.randn(3, 4)
    out = check_compiled(f, x, target=target)
    for got, want in zip(out, f(x)):
        assert got.stride() == want.stride()
    empty = compile_minicomp(lambda: torch.empty_strided((5, 5, 5), (2, 0, 1)), target)()
    assert empty.shape == (5, 5, 5) and empty.stride() == (2, 0, 1)  # its values are undefined


def test_dynamic_sizes_replan_the_workspace(target):
    compiled = compile_minicomp(six_ops, target, dynamic=True)
    for rows in (3, 6, 4):
        x = torch.randn(rows, 7)
        torch.testing.assert_close(compiled(x), six_ops(x))


@pytest.mark.parametrize("shape", [(1,), (1, 1)])
def test_single_element_tensors(target, shape):
    check_compiled(lambda x: torch.exp(x) * x.sum(), torch.randn(shape), target=target)


def test_a_plan_of_fixed_sizes_prepares_its_calls_once_and_runs_the_same():
    # Static sizes: binding, workspace layout and allocations are computed once (FixedCall);
    # a call must give what the general path gives, for inputs in the layout the kernels
    # expect or not, and fresh outputs every time.
    b = GraphBuilder()
    x, w = b.input("x", (6, 8)), b.input("w", (8, 5))
    a = b.compute("a", (6, 8), lambda i, j: E.call("sin", x[i, j]) * 2.0)
    mm = b.extern("mm", torch.ops.aten.mm.default, [a, w], (6, 5))
    b.output(b.compute("out", (6, 5), lambda i, j: mm[i, j] + a[i, 0]))
    g = b.build()
    plan = compile_graph(g, config.resolve({"target": "cpu"}), CompileRecord())
    prepared = plan.entry()
    assert isinstance(prepared, FixedCall)
    transposed = torch.randn(8, 6).t()  # not the row-major layout the kernel reads
    for args in ([torch.randn(6, 8), torch.randn(8, 5)], [transposed, torch.randn(8, 5)]):
        (got,) = prepared(args)
        (again,) = prepared(args)
        plan._fixed = False  # the general path, for reference
        (expected,) = plan(*args)
        plan._fixed = None
        torch.testing.assert_close(got, expected)
        torch.testing.assert_close(
            got, torch.sin(args[0]) * 2.0 @ args[1] + torch.sin(args[0][:, :1]) * 2.0
        )
        assert got.data_ptr() != again.data_ptr()


def test_a_plan_with_size_symbols_prepares_each_call():
    plan = compile_graph(_workspace_graph(), config.resolve({"target": "cpu"}), CompileRecord())
    assert plan.entry() == plan.call


def test_an_aten_step_builds_its_arguments_from_the_slots_it_reads():
    from types import SimpleNamespace

    from minicomp.ir import types as T
    from minicomp.ir.graph import ArgRef
    from minicomp.runtime.plan_builder import _args_builder

    slots = [object() for _ in range(6)]
    reads = [4, 1, 5]  # input k of the call sits in slot reads[k]
    static = SimpleNamespace(
        args=(ArgRef(2), (3, 4), ArgRef(0), 1.5),
        kwargs=(("other", ArgRef(1)), ("dim", -1)),
    )
    build = _args_builder(static, reads)
    for _ in range(2):  # a template filled anew on every call
        args, kwargs = build(slots, {})
        assert list(args) == [slots[5], [3, 4], slots[4], 1.5]
        assert kwargs == {"other": slots[1], "dim": -1}
    # A size the binding gives takes the general path.
    n = E.Var("n", T.i64)
    sized = SimpleNamespace(args=(ArgRef(1), (n, 2)), kwargs=())
    args, kwargs = _args_builder(sized, reads)(slots, {"n": 7})
    assert list(args) == [slots[1], [7, 2]] and kwargs == {}
