"""Two-pass reductions (CUDA targets): which reductions split, into what, and that split graphs
and compiled cuda-emu functions compute what unsplit ones and PyTorch eager do."""

import math

import numpy as np
import pytest
import torch
from graph_builder import GraphBuilder, evaluate_graph, random_inputs
from helpers import check_compiled, compile_minicomp
from helpers_graph import PassGraphBuilder, assert_graph_equal

import minicomp
from minicomp import config
from minicomp.compiler import compile_graph
from minicomp.dynamo.backend import recording
from minicomp.ir import types as T
from minicomp.ir.compute import Compute, Reduce, reduce
from minicomp.ir.expr import Expr, Var, cast, minimum, select
from minicomp.ir.graph import ComputeOp, FusedOp, Graph
from minicomp.passes.graph.split_reductions import (
    MIN_LENGTH,
    SYMBOLIC_CHUNK,
    chunk_size,
    split_reductions,
)
from minicomp.record import CompileRecord
from minicomp.targets import get_target

EMU = "cuda-emu"
# Just above the threshold, and not a multiple of any chunk (the guarded path).
ODD = MIN_LENGTH + 3


# --- graphs --------------------------------------------------------------------------------


def row_reduction(kind, rows, length, dtype=T.f32, acc=None, keep_rows=True) -> Graph:
    """`out[i] = kind over k of x[i, k]` (accumulated in `acc`, cast back to x's type)."""
    b = GraphBuilder()
    x = b.input("x", (rows, length), dtype)
    acc = acc or dtype
    shape = (rows, 1) if keep_rows else (rows,)

    def body(i, *_):
        total = reduce(kind, (length,), lambda k: cast(x[i, k], acc))
        return cast(total, T.i64 if kind.startswith("arg") else dtype)

    b.output(b.compute("out", shape, body))
    return b.build()


def full_reduction(kind, shape, dtype=T.f32) -> Graph:
    b = GraphBuilder()
    x = b.input("x", shape, dtype)
    b.output(b.compute("out", (), lambda: reduce(kind, shape, lambda *r: x[r])))
    return b.build()


def computes(g: Graph) -> list[ComputeOp]:
    return [n for n in g.nodes if isinstance(n, ComputeOp)]


def assert_split_close(g: Graph, inputs=None, seed=0, exact=False, **sizes):
    """The split graph evaluates like `g` (within float reassociation error, or exactly)."""
    s = split_reductions(g)
    assert len(computes(s)) == len(computes(g)) + 1
    inputs = random_inputs(g, seed, sizes) if inputs is None else inputs
    for a, e in zip(evaluate_graph(s, inputs, sizes), evaluate_graph(g, inputs, sizes)):
        assert a.dtype == e.dtype and a.shape == e.shape
        if exact:
            np.testing.assert_array_equal(a, e)
        else:
            np.testing.assert_allclose(a, e, rtol=1e-4, atol=1e-3)
    return s


# --- when to split -------------------------------------------------------------------------


def test_chunk_rule():
    assert chunk_size(1, 2**24) == 16384  # 1024 chunks
    assert chunk_size(2, 2**22) == 8192  # 2 rows x 512 chunks
    assert chunk_size(1, MIN_LENGTH) == 2048  # never shorter than 2048
    assert chunk_size(256, 2**20) == 2**18  # 4 chunks per row
    assert chunk_size(1, MIN_LENGTH - 1) is None
    assert chunk_size(257, 2**20) is None
    assert chunk_size(0, 2**20) is None
    n = GraphBuilder().symbol("n")
    assert chunk_size(1, n) == SYMBOLIC_CHUNK
    assert chunk_size(n, 2**20) is None


def test_short_rows_many_rows_and_symbolic_rows_are_left_alone():
    for g in (row_reduction("sum", 2, MIN_LENGTH - 1), row_reduction("sum", 512, MIN_LENGTH)):
        assert split_reductions(g) is g
    b = GraphBuilder()
    n = b.symbol("n")
    x = b.input("x", (n, MIN_LENGTH))
    b.output(b.compute("out", (n,), lambda i: reduce("sum", (MIN_LENGTH,), lambda k: x[i, k])))
    g = b.build()
    assert split_reductions(g) is g


def test_the_pass_runs_for_the_cuda_targets_only():
    for target in ("cuda", "cuda-emu"):
        assert split_reductions in get_target(target).passes
    assert split_reductions not in get_target("cpu").passes


# --- what the split looks like --------------------------------------------------------------


# The variables the pass adds: the chunk (c), the element within it (k), and the chunk the
# final reduction runs over (j).
c, k, j = (Var(name, T.i64) for name in "ckj")


def test_full_sum_splits_into_partials_and_a_final_reduction():
    # 32771 elements: 17 chunks of 2048, the last one holding 3.
    g = full_reduction("sum", (ODD,))

    # Each partial sums one chunk; elements past the end read a clamped index in the untaken
    # branch of a select, which gives the sum's identity. Both ops keep the original's name.
    e = PassGraphBuilder()
    x = e.input("x", (ODD,))
    at = c * 2048 + k
    element = select(at < ODD, x[minimum(at, ODD - 1)], 0.0)
    partial = Compute("out_partial", (17,), (c,), Reduce("sum", (k,), (2048,), element))
    partial = e.add(partial, op="out")
    e.output(e.add(Compute("out", (), (), Reduce("sum", (j,), (17,), partial[j]))))
    assert_graph_equal(split_reductions(g), e.build())
    assert_split_close(g)


def test_chunks_that_tile_the_reduction_need_no_guard():
    g = full_reduction("sum", (2**16,))  # 32 chunks of 2048

    e = PassGraphBuilder()
    x = e.input("x", (2**16,))
    partial = Compute("out_partial", (32,), (c,), Reduce("sum", (k,), (2048,), x[c * 2048 + k]))
    partial = e.add(partial, op="out")
    e.output(e.add(Compute("out", (), (), Reduce("sum", (j,), (32,), partial[j]))))
    assert_graph_equal(split_reductions(g), e.build())


def test_row_sum_keeps_its_rows_and_its_accumulator_type():
    # Two rows of 131172 f16 elements, summed in f32: 65 chunks of 2048 per row.
    n = 2**17 + 100
    g = row_reduction("sum", 2, n, T.f16, acc=T.f32)

    # The partials are f32 sums, the chunk index last; the final op sums them and casts back.
    e = PassGraphBuilder()
    x = e.input("x", (2, n), T.f16)
    i0, i1 = Var("i0", T.i64), Var("i1", T.i64)
    at = c * 2048 + k
    element = select(at < n, cast(x[i0, minimum(at, n - 1)], T.f32), 0.0)
    partial = Compute("out_partial", (2, 1, 65), (i0, i1, c), Reduce("sum", (k,), (2048,), element))
    partial = e.add(partial, op="out")
    total = Reduce("sum", (j,), (65,), partial[i0, i1, j])
    e.output(e.add(Compute("out", (2, 1), (i0, i1), cast(total, T.f16))))
    assert_graph_equal(split_reductions(g), e.build())
    assert_split_close(g)


def test_reduction_over_several_axes_unravels_the_chunk_index():
    # 37 x 1 x 1031 = 38147 elements: 19 chunks of 2048, each element found back by its
    # row-major coordinates (the unit axis reads 0).
    g = full_reduction("sum", (37, 1, 1031))

    e = PassGraphBuilder()
    x = e.input("x", (37, 1, 1031))
    at = minimum(c * 2048 + k, 38146)
    element = select(c * 2048 + k < 38147, x[at // 1031, 0, at % 1031], 0.0)
    partial = Compute("out_partial", (19,), (c,), Reduce("sum", (k,), (2048,), element))
    partial = e.add(partial, op="out")
    e.output(e.add(Compute("out", (), (), Reduce("sum", (j,), (19,), partial[j]))))
    assert_graph_equal(split_reductions(g), e.build())
    assert_split_close(g)
    assert_split_close(full_reduction("max", (1031, 37)), exact=True)


@pytest.mark.parametrize("kind", ["max", "min", "prod", "any", "all"])
def test_guarded_elements_are_the_identity(kind):
    # All-negative max, all-positive min, all-true all: a wrong fill value would win.
    rng = np.random.default_rng(1)
    x = rng.uniform(1.0, 2.0, (3, ODD)).astype(np.float32)
    if kind == "max":
        x = -x
    if kind == "prod":
        x = (1 + (x - 1.5) * 1e-4).astype(np.float32)
    acc = T.boolean if kind in ("any", "all") else None
    g = row_reduction(kind, 3, ODD, acc=acc)
    assert_split_close(g, {"x": x}, exact=kind != "prod")


def test_argmax_splits_into_chunk_argmaxes_and_the_best_of_their_values():
    g = row_reduction("argmax", 2, ODD, keep_rows=False)

    # Each partial is the flat index of its chunk's best element (past the end: -inf, which
    # never wins); the final op takes the partial index whose element value is best.
    e = PassGraphBuilder()
    x = e.input("x", (2, ODD))
    i0 = Var("i0", T.i64)
    at = c * 2048 + k
    element = select(at < ODD, x[i0, minimum(at, ODD - 1)], -math.inf)
    best_in_chunk = Reduce("argmax", (k,), (2048,), element) + c * 2048
    partial = e.add(Compute("out_partial", (2, 17), (i0, c), best_in_chunk), op="out")
    best_chunk = Reduce("argmax", (j,), (17,), x[i0, partial[i0, j]])
    e.output(e.add(Compute("out", (2,), (i0,), partial[i0, best_chunk])))
    assert_graph_equal(split_reductions(g), e.build())


@pytest.mark.parametrize("kind", ["argmax", "argmin"])
def test_arg_reductions_keep_first_of_ties_and_first_nan(kind):
    rng = np.random.default_rng(2)
    x = rng.integers(-3, 4, (2, ODD)).astype(np.float32)
    g = row_reduction(kind, 2, ODD, keep_rows=False)
    assert_split_close(g, {"x": x}, exact=True)
    x[0, [5000, 20000, ODD - 1]] = np.nan
    x[1, ODD - 1] = np.nan
    assert_split_close(g, {"x": x}, exact=True)


def test_symbolic_length_splits_into_a_symbolic_number_of_chunks():
    b = GraphBuilder()
    n = b.symbol("n")
    x = b.input("x", (n,))
    b.output(b.compute("out", (), lambda: reduce("sum", (n,), lambda k: x[k])))
    g = b.build()

    # Chunks of SYMBOLIC_CHUNK (4096), ceil(n / 4096) of them, every one guarded.
    e = PassGraphBuilder()
    n = e.symbol("n")
    x = e.input("x", (n,))
    chunks = (n + 4095) // 4096
    at = c * 4096 + k
    element = select(at < n, x[minimum(at, n - 1)], 0.0)
    partial = Compute("out_partial", (chunks,), (c,), Reduce("sum", (k,), (4096,), element))
    partial = e.add(partial, op="out")
    e.output(e.add(Compute("out", (), (), Reduce("sum", (j,), (chunks,), partial[j]))))
    assert_graph_equal(split_reductions(g), e.build())
    for size in (5000, 3 * SYMBOLIC_CHUNK, 70001):
        assert_split_close(g, n=size)


# --- fusion and kernels ---------------------------------------------------------------------


def test_producers_fuse_into_the_partial_and_consumers_into_the_final_kernel():
    b = GraphBuilder()
    x, y = b.input("x", (ODD,)), b.input("y", (ODD,))
    m = b.compute("mul", (ODD,), lambda i: x[i] * y[i])
    t = b.compute("total", (), lambda: reduce("sum", (ODD,), lambda k: m[k]))
    b.output(b.compute("half", (), lambda: t[()] * 0.5))
    g = b.build()
    record = CompileRecord()
    plan = compile_graph(g, config.resolve({"target": EMU}), record)
    first, second = [n for n in record.graph.nodes if isinstance(n, FusedOp)]
    assert len(record.graph.nodes) == 2 and len(record.kernels) == 2
    assert set(first.members) == {"mul", "total"} and first.inner_extents == (2048,)
    assert set(second.members) == {"total", "half"}
    inputs = random_inputs(g, seed=3)
    (expected,) = evaluate_graph(g, inputs)
    (actual,) = plan(*(torch.from_numpy(inputs[v.name]) for v in g.inputs))
    np.testing.assert_allclose(actual.numpy(), expected, rtol=1e-4, atol=1e-3)


def test_explain_counts_two_kernels_for_a_long_sum():
    x = torch.randn(2**16)
    assert minicomp.explain(lambda x: x.sum(), x, options={"target": EMU}).kernel_count == 2
    short = torch.randn(1000)
    assert minicomp.explain(lambda x: x.sum(), short, options={"target": EMU}).kernel_count == 1


# --- end to end on cuda-emu against eager ----------------------------------------------------


def test_full_reductions():
    # One compilation for every kind (compiling dominates the emulator's test time).
    def fn(x):
        stats = (x.sum(), x.amax(), x.amin(), x.mean(), x.pow(2).sum().sqrt())
        return stats + (x.argmax(), x.argmin())

    check_compiled(fn, torch.randn(2**16 + 77), target=EMU, rtol=1e-4, atol=1e-3)


def test_prod_near_one():
    x = 1 + 1e-3 * torch.randn(ODD)
    check_compiled(torch.prod, x, target=EMU, rtol=1e-4, atol=0)


def test_any_and_all():
    x = torch.zeros(ODD, dtype=torch.bool)
    check_compiled(lambda x: (x.any(), x.all(), (~x).all()), x, target=EMU)
    x[ODD - 2] = True
    check_compiled(lambda x: (x.any(), (~x).all()), x, target=EMU)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_sums(dtype):
    x = torch.rand(2**17 + 1000).to(dtype)
    # One unit in the last place of the result: the accumulation order differs from eager's.
    tol = {"rtol": 2e-3, "atol": 0} if dtype == torch.float16 else {}
    check_compiled(torch.sum, x, target=EMU, reference_dtype=torch.float64, **tol)


def test_row_and_column_reductions():
    def fn(x, t):
        rows = (x.sum(dim=1), x.sum(dim=1, keepdim=True), torch.max(x.round(), dim=1))
        return rows + (t.sum(dim=0),)

    x, t = torch.randn(2, 2**16 + 5), torch.randn(ODD, 3)
    check_compiled(fn, x, t, target=EMU, rtol=1e-4, atol=1e-3)


def test_int_sums():
    # int32 sums to int64, and the split keeps the int64 accumulator.
    i64 = torch.randint(-(2**40), 2**40, (ODD,))
    i32 = torch.randint(2**30, 2**31 - 1, (ODD,), dtype=torch.int32)
    check_compiled(lambda a, b: (a.sum(), b.sum()), i64, i32, target=EMU)


def test_row_statistics_chained_through_split_reductions():
    # Each statistic's second reduction reads the first one's split result.
    def fn(x):
        norm = torch.nn.functional.layer_norm(x, x.shape[-1:])
        return torch.softmax(x, -1), x.var(), torch.logsumexp(x, -1), norm

    check_compiled(fn, torch.randn(1, ODD), target=EMU, rtol=1e-4, atol=1e-5)


def test_dynamic_length_reuses_one_compilation():
    records: list = []
    with recording(records):
        compiled = compile_minicomp(lambda x: x.sum(), EMU, dynamic=True)
        for n in (50_000, 3 * SYMBOLIC_CHUNK + 1):
            x = torch.randn(n)
            torch.testing.assert_close(compiled(x), x.sum(), rtol=1e-4, atol=1e-3)
    (record,) = records
    assert len(record.kernels) == 2
    partial = record.graph.nodes[0]
    assert isinstance(partial.outer_extents[0], Expr)
