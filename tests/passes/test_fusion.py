"""The fusion pass: which compute ops share a kernel and what each group stores, stated as the
fused graph's text (the pass names the loop variables: o0, r0, acc0), and that the fused graph
(scheduled, built and run on the cpu target) computes what the unfused one does."""

import logging

import networkx as nx
import numpy as np
import torch
from graph_builder import GraphBuilder, evaluate_graph, random_inputs
from helpers_graph import assert_graph_text

from minicomp import config
from minicomp.compiler import compile_graph
from minicomp.ir import expr as E
from minicomp.ir.compute import reduce
from minicomp.ir.graph import ExternOp, FusedOp, Graph, Value
from minicomp.passes.graph.fusion import fuse
from minicomp.record import CompileRecord

aten = torch.ops.aten


# --- helpers -------------------------------------------------------------------------------


def fused_ops(g: Graph) -> list[FusedOp]:
    return [n for n in g.nodes if isinstance(n, FusedOp)]


def assert_well_formed(g: Graph) -> None:
    """Every op reads graph inputs, constants or values of earlier ops; every value is made
    once; every graph output is made; the op graph is a DAG."""
    known = {v.name for v in g.inputs if isinstance(v, Value)} | set(g.constants)
    dag = nx.DiGraph()
    producer: dict[str, int] = {}
    for k, n in enumerate(g.nodes):
        dag.add_node(k)
        for v in n.inputs:
            assert v.name in known, f"{n.name} reads %{v.name} before it is made"
            if v.name in producer:
                dag.add_edge(producer[v.name], k)
        for v in n.outputs:
            assert v.name not in known, f"%{v.name} made twice"
            known.add(v.name)
            producer[v.name] = k
    for o in g.outputs:
        assert not isinstance(o, Value) or o.name in known
    assert nx.is_directed_acyclic_graph(dag)


def run_compiled(g: Graph, inputs: dict, sizes: dict | None = None) -> list:
    """The graph's outputs, compiled for the cpu target (passes, fusion, scheduling, C)."""
    plan = compile_graph(g, config.resolve({"target": "cpu"}), CompileRecord())
    args = [
        sizes[v.name] if isinstance(v, E.Var) else torch.from_numpy(inputs[v.name].copy())
        for v in g.inputs
    ]
    return [o.numpy() if isinstance(o, torch.Tensor) else o for o in plan(*args)]


def assert_compiles_like_reference(g: Graph, seed: int = 0, **sizes) -> None:
    inputs = random_inputs(g, seed, sizes)
    expected = evaluate_graph(g, inputs, sizes)
    actual = run_compiled(g, inputs, sizes)
    assert len(actual) == len(expected)
    for k, (x, e) in enumerate(zip(actual, expected)):
        assert x.shape == e.shape and x.dtype == e.dtype, f"output {k}"
        np.testing.assert_allclose(x, e, rtol=2e-5, atol=1e-5, err_msg=f"output {k}")


# --- graphs --------------------------------------------------------------------------------


def elementwise_chain() -> Graph:
    b = GraphBuilder()
    x = b.input("x", (4, 8))
    y = b.input("y", (1, 8))
    t1 = b.compute("t1", (4, 8), lambda i, j: x[i, j] * 2.0)
    t2 = b.compute("t2", (4, 8), lambda i, j: E.call("exp", t1[i, j]))
    t3 = b.compute("t3", (4, 8), lambda i, j: t2[i, j] + y[0, j])
    b.output(t3)
    return b.build()


def masked_softmax(rows=4) -> Graph:
    b = GraphBuilder()
    n = rows if isinstance(rows, int) else b.symbol(rows)
    x = b.input("x", (n, 16))
    mask = b.input("mask", (1, 16))
    s = b.compute("scale", (n, 16), lambda i, j: x[i, j] * 0.125)
    t = b.compute("masked", (n, 16), lambda i, j: s[i, j] + mask[0, j])
    mx = b.compute("rowmax", (n, 1), lambda i, j: reduce("max", (16,), lambda k: t[i, k]))
    sm = b.compute(
        "rowsum",
        (n, 1),
        lambda i, j: reduce("sum", (16,), lambda k: E.call("exp", t[i, k] - mx[i, 0])),
    )
    out = b.compute("softmax", (n, 16), lambda i, j: E.call("exp", t[i, j] - mx[i, 0]) / sm[i, 0])
    b.output(out)
    return b.build()


def layer_norm(outputs=("y",)) -> Graph:
    b = GraphBuilder()
    x = b.input("x", (4, 16))
    w = b.input("w", (16,))
    bias = b.input("bias", (16,))
    mean = b.compute("mean", (4, 1), lambda i, j: reduce("sum", (16,), lambda k: x[i, k]) / 16.0)
    xc = b.compute("xc", (4, 16), lambda i, j: x[i, j] - mean[i, 0])
    var = b.compute(
        "var", (4, 1), lambda i, j: reduce("sum", (16,), lambda k: xc[i, k] * xc[i, k]) / 16.0
    )
    rstd = b.compute("rstd", (4, 1), lambda i, j: E.call("rsqrt", var[i, 0] + 1e-5))
    y = b.compute("y", (4, 16), lambda i, j: xc[i, j] * rstd[i, 0] * w[j] + bias[j])
    named = {"y": y, "mean": mean, "rstd": rstd, "xc": xc}
    b.output(*(named[o] for o in outputs))
    return b.build()


# --- structure -----------------------------------------------------------------------------


def test_elementwise_chain_becomes_one_fused_op():
    # The chain is inlined into one expression over the group's inputs; only t3 is stored.
    g = elementwise_chain()
    f = fuse(g)
    assert_well_formed(f)
    assert_graph_text(
        f,
        """
        graph(%x: f32[4, 8], %y: f32[1, 8]):
            %t3: f32[4, 8] = k0_t1_t2_t3(%x, %y)  # fused: t1, t2, t3
                for o0<4, o1<8:
                    %t3[o0, o1] = exp(x[o0, o1] * 2.0) + y[0, o1]
            return (%t3)
        """,
    )
    assert_compiles_like_reference(g)


def test_masked_softmax_is_one_kernel_with_two_reductions_and_one_inner_store():
    # One loop per row: the max, the sum reading it through its accumulator (acc0), and the
    # normalised row stored in the inner loop.
    g = masked_softmax()
    f = fuse(g)
    assert_well_formed(f)
    assert_graph_text(
        f,
        """
        graph(%x: f32[4, 16], %mask: f32[1, 16]):
            %softmax: f32[4, 16] = k0_scale_masked_rowmax(%x, %mask)  # fused: scale, masked, rowmax, rowsum, softmax
                for o0<4:
                    acc0 = max over r0<16: x[o0, r0] * 0.125 + mask[0, r0]
                    acc1 = sum over r0<16: exp(x[o0, r0] * 0.125 + mask[0, r0] - acc0)
                    for r0<16: %softmax[o0, r0] = exp(x[o0, r0] * 0.125 + mask[0, r0] - acc0) / acc1
            return (%softmax)
        """,  # noqa: E501
    )
    assert_compiles_like_reference(g)


def test_a_row_store_reading_a_function_of_another_input_is_one_kernel():
    # Softmax's backward as cross-entropy's gradient has it: g - exp(y) * sum(g). The exp
    # reads only a graph input, so nothing in the group places its axes: its reader does.
    b = GraphBuilder()
    g, y = b.input("g", (4, 16)), b.input("y", (4, 16))
    e = b.compute("e", (4, 16), lambda i, j: E.call("exp", y[i, j]))
    total = b.compute("total", (4, 1), lambda i, j: reduce("sum", (16,), lambda k: g[i, k]))
    b.output(b.compute("grad", (4, 16), lambda i, j: g[i, j] - e[i, j] * total[i, 0]))
    graph = b.build()
    f = fuse(graph)
    assert_well_formed(f)
    assert_graph_text(
        f,
        """
        graph(%g: f32[4, 16], %y: f32[4, 16]):
            %grad: f32[4, 16] = k0_e_total_grad(%y, %g)  # fused: e, total, grad
                for o0<4:
                    acc0 = sum over r0<16: g[o0, r0]
                    for r0<16: %grad[o0, r0] = g[o0, r0] - exp(y[o0, r0]) * acc0
            return (%grad)
        """,
    )
    assert_compiles_like_reference(graph)


def test_masked_softmax_with_symbolic_rows_compiles_like_reference():
    g = masked_softmax("n")
    (op,) = fuse(g).nodes
    assert op.outer_extents == (E.size_var("n"),)
    assert_compiles_like_reference(g, n=5)
    assert_compiles_like_reference(g, seed=1, n=1)


def test_value_read_by_consumers_of_different_shapes_is_materialised():
    b = GraphBuilder()
    x = b.input("x", (4, 8))
    a = b.compute("a", (4, 8), lambda i, j: E.call("exp", x[i, j]))
    c1 = b.compute("c1", (4, 8), lambda i, j: a[i, j] + 1.0)
    c2 = b.compute("c2", (2, 8), lambda i, j: a[i + 2, j] * 3.0)
    b.output(c1, c2)
    g = b.build()
    f = fuse(g)
    assert_well_formed(f)
    # c2 has rows of its own: it reads a, which a's kernel stores.
    assert_graph_text(
        f,
        """
        graph(%x: f32[4, 8]):
            %a: f32[4, 8], %c1: f32[4, 8] = k0_a_c1(%x)  # fused: a, c1
                for o0<4, o1<8:
                    %a[o0, o1] = exp(x[o0, o1])
                    %c1[o0, o1] = exp(x[o0, o1]) + 1.0
            %c2: f32[2, 8] = k1_c2(%a)  # fused: c2
                for o0<2, o1<8:
                    %c2[o0, o1] = a[o0 + 2, o1] * 3.0
            return (%c1, %c2)
        """,
    )
    assert_compiles_like_reference(g)


def test_value_read_by_a_row_reduction_and_a_shifted_consumer_is_materialised():
    b = GraphBuilder()
    x = b.input("x", (4, 8))
    a = b.compute("a", (4, 8), lambda i, j: E.call("exp", x[i, j]))
    s = b.compute("s", (4, 1), lambda i, j: reduce("sum", (8,), lambda k: a[i, k]))
    c = b.compute("c", (2, 8), lambda i, j: a[i + 2, j] * 3.0)
    b.output(s, c)
    g = b.build()
    f = fuse(g)
    assert_well_formed(f)
    # a is stored along the row (the inner loop), s once per row.
    assert_graph_text(
        f,
        """
        graph(%x: f32[4, 8]):
            %a: f32[4, 8], %s: f32[4, 1] = k0_a_s(%x)  # fused: a, s
                for o0<4:
                    acc0 = sum over r0<8: exp(x[o0, r0])
                    %s[o0, 0] = acc0
                    for r0<8: %a[o0, r0] = exp(x[o0, r0])
            %c: f32[2, 8] = k1_c(%a)  # fused: c
                for o0<2, o1<8:
                    %c[o0, o1] = a[o0 + 2, o1] * 3.0
            return (%s, %c)
        """,
    )
    assert_compiles_like_reference(g)


def test_transposed_consumer_of_a_reduced_row_is_stored_along_the_row():
    b = GraphBuilder()
    x = b.input("x", (4, 8))
    a = b.compute("a", (4, 8), lambda i, j: E.call("exp", x[i, j]))
    s = b.compute("s", (4, 1), lambda i, j: reduce("sum", (8,), lambda k: a[i, k]))
    t = b.compute("t", (8, 4), lambda i, j: a[j, i] * 2.0 + s[j, 0])
    b.output(s, t)
    g = b.build()
    f = fuse(g)
    assert_well_formed(f)
    assert_graph_text(
        f,
        """
        graph(%x: f32[4, 8]):
            %s: f32[4, 1], %t: f32[8, 4] = k0_a_s_t(%x)  # fused: a, s, t
                for o0<4:
                    acc0 = sum over r0<8: exp(x[o0, r0])
                    %s[o0, 0] = acc0
                    for r0<8: %t[r0, o0] = exp(x[o0, r0]) * 2.0 + acc0
            return (%s, %t)
        """,
    )
    assert_compiles_like_reference(g)


def test_a_slice_of_the_rows_is_not_stored_along_the_whole_loop():
    # softmax(x)[:2] * 3: the slice reads rows at the loop's own index, but has 2 of its 4;
    # stored in the softmax's loop nest it once wrote past its buffer.
    b = GraphBuilder()
    x = b.input("x", (4, 8))
    a = b.compute("a", (4, 8), lambda i, j: E.call("exp", x[i, j]))
    s = b.compute("s", (4, 1), lambda i, j: reduce("sum", (8,), lambda k: a[i, k]))
    p = b.compute("p", (4, 8), lambda i, j: a[i, j] / s[i, 0])
    head = b.compute("head", (2, 8), lambda i, j: p[i, j] * 3.0)
    # column 0 only: a value of the row, computed in the softmax's nest from its sum
    cls = b.compute("cls", (4, 1), lambda i, j: p[i, j] + 1.0)
    b.output(head, cls)
    g = b.build()
    f = fuse(g)
    assert_well_formed(f)
    assert_graph_text(
        f,
        """
        graph(%x: f32[4, 8]):
            %p: f32[4, 8], %cls: f32[4, 1] = k0_a_s_p(%x)  # fused: a, s, p, cls
                for o0<4:
                    acc0 = sum over r0<8: exp(x[o0, r0])
                    %cls[o0, 0] = exp(x[o0, 0]) / acc0 + 1.0
                    for r0<8: %p[o0, r0] = exp(x[o0, r0]) / acc0
            %head: f32[2, 8] = k1_head(%p)  # fused: head
                for o0<2, o1<8:
                    %head[o0, o1] = p[o0, o1] * 3.0
            return (%head, %cls)
        """,
    )
    assert_compiles_like_reference(g)


def test_the_debug_log_says_why_ops_stay_apart():
    # softmax(x)[:2]: the slice has 2 of the 4 rows the softmax's loop runs over.
    b = GraphBuilder()
    x = b.input("x", (4, 8))
    s = b.compute("s", (4, 1), lambda i, j: reduce("sum", (8,), lambda k: x[i, k]))
    p = b.compute("p", (4, 8), lambda i, j: x[i, j] / s[i, 0])
    head = b.compute("head", (2, 8), lambda i, j: p[i, j] * 3.0)
    b.output(head)
    log, seen = logging.getLogger("minicomp.passes.graph.fusion"), []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = lambda record: seen.append(record.getMessage())
    level = log.level
    log.setLevel(logging.DEBUG)  # setLevel, not `log.level =`: it clears the cached answers
    log.addHandler(handler)
    try:
        fuse(b.build())
    finally:
        log.removeHandler(handler)
        log.setLevel(level)
    assert "not fused: p into head: head covers part of a loop's extent" in seen


def test_sliced_rows_of_fused_normalisations_match_eager(target):
    from helpers import check_compiled

    x = torch.randn(2, 5, 32)
    fns = [
        lambda x: torch.nn.functional.layer_norm(x, (32,))[:, :1] + 1,  # ViT's class token
        lambda x: torch.softmax(x, -1)[:, :2] * 3,
        lambda x: ((x * 2) - (x * 2).sum(-1, keepdim=True))[:1] * 3,
    ]
    for fn in fns:
        check_compiled(fn, x, target=target, rtol=1e-5, atol=1e-5)


def test_a_reduced_value_broadcast_against_its_input_along_another_axis(target):
    # (2,1,7) + (2,1,5,7) -> (2,2,5,7): output axes 0 and 1 both follow the batch loop, and
    # stored in the reduction's nest only their diagonal was written.
    from helpers import check_compiled

    def f(x):
        y = x * 2
        return torch.amax(y, dim=2) + y

    check_compiled(f, torch.randn(2, 1, 5, 7), target=target)


def test_reductions_over_different_domains_stay_separate_kernels():
    b = GraphBuilder()
    x = b.input("x", (4, 8))
    rs = b.compute("rs", (4, 1), lambda i, j: reduce("sum", (8,), lambda k: x[i, k]))
    cs = b.compute("cs", (1, 8), lambda i, j: reduce("sum", (4,), lambda k: x[k, j]))
    total = b.compute("total", (1, 1), lambda i, j: reduce("sum", (4,), lambda k: rs[k, 0]))
    out = b.compute("out", (4, 8), lambda i, j: x[i, j] - rs[i, 0] * cs[0, j] + total[0, 0])
    b.output(out)
    g = b.build()
    f = fuse(g)
    assert_well_formed(f)
    # Row sums, their total, and the column sums with the consumer (looping over columns).
    assert_graph_text(
        f,
        """
        graph(%x: f32[4, 8]):
            %rs: f32[4, 1] = k0_rs(%x)  # fused: rs
                for o0<4:
                    acc0 = sum over r0<8: x[o0, r0]
                    %rs[o0, 0] = acc0
            %total: f32[1, 1] = k1_total(%rs)  # fused: total
                for ():
                    acc0 = sum over r0<4: rs[r0, 0]
                    %total[0, 0] = acc0
            %out: f32[4, 8] = k2_cs_out(%x, %rs, %total)  # fused: cs, out
                for o0<8:
                    acc0 = sum over r0<4: x[r0, o0]
                    for r0<4: %out[r0, o0] = x[r0, o0] - rs[r0, 0] * acc0 + total[0, 0]
            return (%out)
        """,
    )
    assert_compiles_like_reference(g)


def diamond_through_extern() -> Graph:
    """A → B → extern → C and A → C: merging A's group into C's would close a cycle."""
    b = GraphBuilder()
    x = b.input("x", (4, 4))
    w = b.input("w", (4, 4))
    a = b.compute("A", (4, 4), lambda i, j: x[i, j] * 2.0)
    bb = b.compute("B", (4, 4), lambda i, j: a[i, j] + 1.0)
    m = b.extern("M", aten.mm.default, [bb, w], (4, 4))
    c = b.compute("C", (4, 4), lambda i, j: m[i, j] - a[i, j])
    b.output(c)
    return b.build()


def test_diamond_through_an_extern_is_not_merged_into_a_cycle():
    g = diamond_through_extern()
    f = fuse(g)
    assert_well_formed(f)
    # A joins B before the ATen call, not C after it; C reads A, so A is stored.
    assert_graph_text(
        f,
        """
        graph(%x: f32[4, 4], %w: f32[4, 4]):
            %A: f32[4, 4], %B: f32[4, 4] = k0_A_B(%x)  # fused: A, B
                for o0<4, o1<4:
                    %A[o0, o1] = x[o0, o1] * 2.0
                    %B[o0, o1] = x[o0, o1] * 2.0 + 1.0
            %M: f32[4, 4] = M(%B, %w)  # extern
            %C: f32[4, 4] = k2_C(%M, %A)  # fused: C
                for o0<4, o1<4:
                    %C[o0, o1] = M[o0, o1] - A[o0, o1]
            return (%C)
        """,
    )

    rng = np.random.default_rng(0)
    xs = rng.standard_normal((4, 4)).astype(np.float32)
    ws = rng.standard_normal((4, 4)).astype(np.float32)
    (out,) = run_compiled(g, {"x": xs, "w": ws})
    a = torch.from_numpy(xs) * 2
    expected = (a + 1) @ torch.from_numpy(ws) - a
    np.testing.assert_allclose(out, expected.numpy(), rtol=1e-5, atol=1e-5)


def test_layer_norm_fuses_into_one_kernel():
    g = layer_norm()
    f = fuse(g)
    assert_well_formed(f)
    assert_graph_text(
        f,
        """
        graph(%x: f32[4, 16], %w: f32[16], %bias: f32[16]):
            %y: f32[4, 16] = k0_mean_xc_var(%x, %w, %bias)  # fused: mean, xc, var, rstd, y
                for o0<4:
                    acc0 = sum over r0<16: x[o0, r0]
                    acc1 = sum over r0<16: (x[o0, r0] - acc0 / 16.0) * (x[o0, r0] - acc0 / 16.0)
                    for r0<16: %y[o0, r0] = (x[o0, r0] - acc0 / 16.0) * rsqrt(acc1 / 16.0 + 1e-05) * w[r0] + bias[r0]
            return (%y)
        """,  # noqa: E501
    )
    assert_compiles_like_reference(g)


def test_graph_outputs_inside_a_chain_are_stored():
    b = GraphBuilder()
    x = b.input("x", (4, 8))
    t1 = b.compute("t1", (4, 8), lambda i, j: x[i, j] + 1.0)
    t2 = b.compute("t2", (4, 8), lambda i, j: t1[i, j] * 2.0)
    t3 = b.compute("t3", (4, 8), lambda i, j: E.call("exp", t2[i, j]))
    b.output(t3, t1)
    g = b.build()
    assert_graph_text(
        fuse(g),
        """
        graph(%x: f32[4, 8]):
            %t1: f32[4, 8], %t3: f32[4, 8] = k0_t1_t2_t3(%x)  # fused: t1, t2, t3
                for o0<4, o1<8:
                    %t1[o0, o1] = x[o0, o1] + 1.0
                    %t3[o0, o1] = exp((x[o0, o1] + 1.0) * 2.0)
            return (%t3, %t1)
        """,
    )
    assert_compiles_like_reference(g)


def test_row_statistics_returned_by_a_fused_reduction_are_stored():
    # mean and rstd once per row, y along it.
    g = layer_norm(outputs=("y", "mean", "rstd"))
    assert_graph_text(
        fuse(g),
        """
        graph(%x: f32[4, 16], %w: f32[16], %bias: f32[16]):
            %mean: f32[4, 1], %rstd: f32[4, 1], %y: f32[4, 16] = k0_mean_xc_var(%x, %w, %bias)  # fused: mean, xc, var, rstd, y
                for o0<4:
                    acc0 = sum over r0<16: x[o0, r0]
                    acc1 = sum over r0<16: (x[o0, r0] - acc0 / 16.0) * (x[o0, r0] - acc0 / 16.0)
                    %mean[o0, 0] = acc0 / 16.0
                    %rstd[o0, 0] = rsqrt(acc1 / 16.0 + 1e-05)
                    for r0<16: %y[o0, r0] = (x[o0, r0] - acc0 / 16.0) * rsqrt(acc1 / 16.0 + 1e-05) * w[r0] + bias[r0]
            return (%y, %mean, %rstd)
        """,  # noqa: E501
    )
    assert_compiles_like_reference(g)


def test_fusion_leaves_externs_and_keeps_graph_inputs_and_outputs():
    g = diamond_through_extern()
    f = fuse(g)
    assert f.inputs == g.inputs and f.outputs == g.outputs
    (ext,) = [n for n in f.nodes if isinstance(n, ExternOp)]
    assert ext is g.nodes[2]


def test_signed_zero_constants_survive_fusion():
    b = GraphBuilder()
    x = b.input("x", (3,))
    pos = b.compute("pos", (3,), lambda i: x[i] * 0.0)
    neg = b.compute("neg", (3,), lambda i: x[i] * -0.0)
    out = b.compute("out", (3,), lambda i: E.select(x[i] > 0.0, pos[i], neg[i]))
    b.output(out)
    xs = np.array([1.0, -1.0, 2.0], np.float32)
    (actual,) = run_compiled(b.build(), {"x": xs})
    expected = torch.where(
        torch.from_numpy(xs) > 0, torch.from_numpy(xs) * 0.0, torch.from_numpy(xs) * -0.0
    )
    np.testing.assert_array_equal(np.signbit(actual), torch.signbit(expected).numpy())


# --- contractions stay whole ---------------------------------------------------------------


def sibling_reductions(contractions: bool) -> Graph:
    """Two sums over k joined by an elementwise consumer: matrix products (x @ w1, x @ w2)
    when `contractions`, else row statistics of x (sum of x, sum of x * x)."""
    b = GraphBuilder()
    x = b.input("x", (6, 8))
    w1, w2 = b.input("w1", (8, 5)), b.input("w2", (8, 5))
    if contractions:
        p1 = b.compute("p1", (6, 5), lambda i, j: reduce("sum", (8,), lambda k: x[i, k] * w1[k, j]))
        p2 = b.compute("p2", (6, 5), lambda i, j: reduce("sum", (8,), lambda k: x[i, k] * w2[k, j]))
        out = b.compute("out", (6, 5), lambda i, j: E.maximum(p1[i, j] + p2[i, j], 0.0))
    else:
        p1 = b.compute("p1", (6, 1), lambda i, j: reduce("sum", (8,), lambda k: x[i, k]))
        p2 = b.compute("p2", (6, 1), lambda i, j: reduce("sum", (8,), lambda k: x[i, k] * x[i, k]))
        out = b.compute("out", (6, 8), lambda i, j: x[i, j] * p2[i, 0] - p1[i, 0])
    b.output(out)
    return b.build()


def test_sibling_contractions_stay_separate_kernels_and_the_consumer_joins_the_later():
    from minicomp.ir.contraction import match_contraction

    g = sibling_reductions(contractions=True)
    f = fuse(g)
    assert_well_formed(f)
    assert_graph_text(
        f,
        """
        graph(%x: f32[6, 8], %w1: f32[8, 5], %w2: f32[8, 5]):
            %p1: f32[6, 5] = k0_p1(%x, %w1)  # fused: p1
                for o0<6, o1<5:
                    acc0 = sum over r0<8: x[o0, r0] * w1[r0, o1]
                    %p1[o0, o1] = acc0
            %out: f32[6, 5] = k1_p2_out(%x, %w2, %p1)  # fused: p2, out
                for o0<6, o1<5:
                    acc0 = sum over r0<8: x[o0, r0] * w2[r0, o1]
                    %out[o0, o1] = max(p1[o0, o1] + acc0, 0.0)
            return (%out)
        """,
    )
    for op in fused_ops(f):
        assert match_contraction(op) is not None, op.name
    assert_compiles_like_reference(g)


def test_a_square_weights_transpose_fuses_into_its_product():
    # x [6, 6] @ w.t(): the transpose [6, 6] is shaped like the product's rows but read at
    # [k, n]; it is inlined into the product, not materialised by a kernel of its own.
    b = GraphBuilder()
    x = b.input("x", (6, 6))
    w = b.input("w", (6, 6))
    wt = b.compute("wt", (6, 6), lambda i, j: w[j, i])
    p = b.compute("p", (6, 6), lambda i, j: reduce("sum", (6,), lambda k: x[i, k] * wt[k, j]))
    b.output(p)
    g = b.build()
    f = fuse(g)
    assert_graph_text(
        f,
        """
        graph(%x: f32[6, 6], %w: f32[6, 6]):
            %p: f32[6, 6] = k0_wt_p(%w, %x)  # fused: wt, p
                for o0<6, o1<6:
                    acc0 = sum over r0<6: x[o0, r0] * w[o1, r0]
                    %p[o0, o1] = acc0
            return (%p)
        """,
    )
    assert_compiles_like_reference(g)


def test_sibling_reductions_that_are_no_contractions_still_share_a_kernel():
    g = sibling_reductions(contractions=False)
    f = fuse(g)
    assert_well_formed(f)
    assert_graph_text(
        f,
        """
        graph(%x: f32[6, 8], %w1: f32[8, 5], %w2: f32[8, 5]):
            %out: f32[6, 8] = k0_p1_p2_out(%x)  # fused: p1, p2, out
                for o0<6:
                    acc0 = sum over r0<8: x[o0, r0]
                    acc1 = sum over r0<8: x[o0, r0] * x[o0, r0]
                    for r0<8: %out[o0, r0] = x[o0, r0] * acc1 - acc0
            return (%out)
        """,
    )
    assert_compiles_like_reference(g)


def _contraction_kernels(records) -> list[FusedOp]:
    """Every fused group of `records` holding a reduction; each asserted to be a contraction
    that a matmul template computed."""
    from minicomp.ir.contraction import match_contraction

    found = []
    for record in records:
        assert not [n.name for n in record.graph.nodes if isinstance(n, ExternOp)]
        templates = {k.name for k in record.kernels if k.attrs.template}
        for op in fused_ops(record.graph):
            if op.is_reduction:
                assert match_contraction(op) is not None, op.name
                assert op.name in templates, op.name
                found.append(op)
    return found


def _compile_on_cuda_emu(fn, *args) -> tuple[object, list]:
    from helpers import compile_minicomp

    from minicomp.dynamo.backend import recording

    records: list = []
    with recording(records), torch.no_grad():
        actual = compile_minicomp(fn, "cuda-emu")(*args)
    return actual, records


def test_sum_of_two_products_uses_two_template_kernels():
    x, w1, w2 = torch.randn(24, 40), torch.randn(40, 36), torch.randn(40, 36)

    def fn(x, w1, w2):
        return torch.relu(x @ w1 + x @ w2)

    actual, records = _compile_on_cuda_emu(fn, x, w1, w2)
    assert len(_contraction_kernels(records)) == 2
    expected = fn(x.double(), w1.double(), w2.double())
    torch.testing.assert_close(actual, expected.float(), rtol=1e-4, atol=1e-4)


class _ProjectionBlock(torch.nn.Module):
    """A ResNet bottleneck with a strided projection shortcut whose input has as many channels
    as the block's width, so conv3 and the shortcut reduce over equal extents."""

    def __init__(self, channels: int, cout: int):
        super().__init__()
        nn = torch.nn

        def conv_bn(cin, co, kernel, stride=1):
            conv = nn.Conv2d(cin, co, kernel, stride, kernel // 2, bias=False)
            return nn.Sequential(conv, nn.BatchNorm2d(co))

        self.branch = nn.Sequential(
            conv_bn(channels, channels, 1),
            nn.ReLU(),
            conv_bn(channels, channels, 3, 2),
            nn.ReLU(),
            conv_bn(channels, cout, 1),
        )
        self.shortcut = conv_bn(channels, cout, 1, 2)
        for m in self.modules():
            if isinstance(m, nn.BatchNorm2d):
                m.running_mean.uniform_(-0.5, 0.5)
                m.running_var.uniform_(0.5, 2.0)
                m.weight.data.uniform_(0.5, 1.5)
                m.bias.data.uniform_(-0.5, 0.5)

    def forward(self, x):
        return torch.relu(self.branch(x) + self.shortcut(x))


def test_bottleneck_with_projection_of_equal_extents_keeps_both_convolutions_templates():
    import copy

    torch.manual_seed(0)
    block = _ProjectionBlock(16, 32).eval()
    x = torch.randn(2, 16, 9, 11).to(memory_format=torch.channels_last)
    actual, records = _compile_on_cuda_emu(block, x)
    # conv1, conv2, conv3 and the shortcut: four templates, batch norms in their epilogues.
    convs = _contraction_kernels(records)
    assert len(convs) == 4
    assert all(any("convolution" in m for m in op.members) for op in convs)
    with torch.no_grad():
        expected = copy.deepcopy(block).double()(x.double())
    torch.testing.assert_close(actual, expected.float(), rtol=1e-4, atol=1e-4)
