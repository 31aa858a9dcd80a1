"""Column reductions (schedule/cuda_columns.py): which groups put their lanes along a
contiguous output axis, the plan they get, and whole functions compiled for cuda-emu against
eager: vector-matrix products, sums and arg-reductions over a strided axis, softmax over
dim 0, fused epilogues, sizes the vectors and tiles do not divide, views."""

import pytest
import torch
from graph_builder import GraphBuilder
from helpers import check_compiled
from schedule_graphs import one_group

from minicomp.ir import expr as E
from minicomp.ir import types as T
from minicomp.ir.compute import reduce
from minicomp.ir.functor import collect
from minicomp.ir.graph import Graph
from minicomp.passes.graph.layout import layouts_for
from minicomp.schedule.cuda import CudaKernelBuilder, schedule_cuda
from minicomp.schedule.cuda_columns import SMS, ColumnPlan, plan_columns

EMU = "cuda-emu"


def plan(g: Graph, **strides) -> ColumnPlan | None:
    layouts = layouts_for(g)
    layouts.update(strides)
    b = CudaKernelBuilder(one_group(g), layouts)
    return plan_columns(b.op, b.stages, b.buffers, b.out_bufs)


def gemv(k: int, n: int, dtype=T.f16) -> Graph:
    """out[n] = sum_k a[k] * b[k, n], accumulated in f32."""
    g = GraphBuilder()
    a, b = g.input("a", (k,), dtype), g.input("b", (k, n), dtype)

    def body(j):
        return reduce("sum", (k,), lambda r: E.cast(a[r], T.f32) * E.cast(b[r, j], T.f32))

    g.output(g.compute("out", (n,), lambda j: E.cast(body(j), dtype)))
    return g.build()


def column_sum(rows: int, cols: int, kind="sum") -> Graph:
    g = GraphBuilder()
    x = g.input("x", (rows, cols))
    g.output(g.compute("s", (1, cols), lambda i, j: reduce(kind, (rows,), lambda r: x[r, j])))
    return g.build()


def row_sum(rows: int, cols: int) -> Graph:
    g = GraphBuilder()
    x = g.input("x", (rows, cols))
    g.output(g.compute("s", (rows, 1), lambda i, j: reduce("sum", (cols,), lambda c: x[i, c])))
    return g.build()


# --- which groups, which plan -----------------------------------------------------------------


def test_a_gemv_puts_its_lanes_along_n_with_16_byte_vectors():
    p = plan(gemv(4096, 11008))
    assert p is not None and p.vec == 8
    # 43 tiles of 256 columns fill a third of the SMs; narrower tiles spread over all of them.
    assert p.lanes * p.vec < 256 and 11008 // p.width >= SMS
    assert p.lanes * p.vec * 2 >= 32  # a warp's row of columns fills a sector


def test_a_row_reduction_keeps_its_lanes_along_the_row():
    assert plan(row_sum(64, 4096)) is None
    f = schedule_cuda(one_group(row_sum(64, 4096)), layouts_for(row_sum(64, 4096)))
    assert "tx" not in {v.name for v in collect(f.body, E.Var)}


def test_a_transposed_input_decides_by_its_strides():
    # Column sums of a transposed view read along the reduced axis: rows again.
    assert plan(column_sum(300, 64)) is not None
    assert plan(column_sum(300, 64), x=(1, 300)) is None


def test_few_long_columns_keep_all_slices_busy_and_few_rows_need_wide_blocks():
    # 8 reduced elements: at most 8 slices, so at least 32 lanes.
    p = plan(column_sum(8, 4096))
    assert p is not None and p.slices <= 8
    # Odd column counts take scalar columns.
    assert plan(column_sum(100, 1001)).vec == 1
    assert plan(column_sum(100, 1002)).vec == 2


# --- against eager on cuda-emu ------------------------------------------------------------------


def _mv(a, b):
    return torch.matmul(a, b)


@pytest.mark.parametrize(
    "k,n", [(37, 64), (3000, 1000), (333, 1001), (128, 4104), (1024, 8)], ids=str
)
def test_gemv_f16(k, n):
    a = torch.randn(1, k, dtype=torch.float16)
    b = torch.randn(k, n, dtype=torch.float16)
    check_compiled(_mv, a, b, target=EMU, rtol=2e-2, atol=2e-2, reference_dtype=torch.float64)


def test_gemv_f32_with_a_fused_bias_and_relu():
    def fn(x, w, bias):
        return torch.relu(x @ w + bias)

    x, w, bias = torch.randn(1, 700), torch.randn(700, 520), torch.randn(520)
    check_compiled(fn, x, w, bias, target=EMU, rtol=1e-4, atol=1e-4)


def test_gemv_over_views():
    # b a misaligned column window of a wider matrix (scalar fallback of the vector loads),
    # then every other column (strided along n), then a transposed weight.
    big = torch.randn(300, 530, dtype=torch.float16)
    a = torch.randn(1, 300, dtype=torch.float16)
    tol = {"rtol": 2e-2, "atol": 2e-2, "reference_dtype": torch.float64}
    check_compiled(_mv, a, big[:, 3:515], target=EMU, **tol)
    check_compiled(_mv, a, big[:, ::2], target=EMU, **tol)
    check_compiled(_mv, a, big.t().contiguous().t()[:, :512], target=EMU, **tol)


@pytest.mark.parametrize("shape", [(8, 4096), (300, 17), (2000, 96), (5, 3)], ids=str)
def test_sums_over_dim_0(shape):
    x = torch.randn(*shape)
    check_compiled(lambda t: t.sum(0), x, target=EMU, rtol=1e-4, atol=1e-4)
    check_compiled(lambda t: t.mean(0, keepdim=True) * 2, x, target=EMU, rtol=1e-4, atol=1e-4)


def test_sum_over_the_middle_axis_of_3d():
    x = torch.randn(6, 500, 40)
    check_compiled(lambda t: t.sum(1), x, target=EMU, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("kind", ["amax", "amin"])
def test_max_and_min_over_dim_0_propagate_nan(kind):
    x = torch.randn(1500, 40)
    x[7, 3] = float("nan")
    x[1499, 39] = float("nan")
    fn = getattr(torch, kind)
    check_compiled(lambda t: fn(t, 0), x, target=EMU, equal_nan=True, rtol=0, atol=0)


@pytest.mark.parametrize("kind", ["argmax", "argmin"])
@pytest.mark.parametrize("rows", [300, 3000])
def test_argmax_over_dim_0_with_ties_and_nan(kind, rows):
    x = torch.randint(-3, 4, (rows, 24)).float()  # many ties, first index wins
    x[17, 1] = x[rows - 100, 1] = float("nan")
    x[:, 2] = 7.0
    x[:, 4] = float("-inf") if kind == "argmax" else float("inf")
    x[rows - 50, 4] = 0.0
    x[:, 5] = float("-inf") if kind == "argmax" else float("inf")
    x[rows - 1, 6] = float("nan")
    fn = getattr(torch, kind)
    check_compiled(lambda t: fn(t, 0), x, target=EMU)


def test_int64_argmax_over_dim_0():
    x = torch.randint(-2, 3, (700, 33), dtype=torch.int64)
    x[:, 0] = torch.iinfo(torch.int64).min
    x[650, 1] = torch.iinfo(torch.int64).max
    check_compiled(lambda t: torch.argmax(t, 0), x, target=EMU)


def test_any_all_and_prod_over_dim_0():
    b = torch.rand(900, 20) > 0.995
    b[:, 0] = True
    check_compiled(lambda t: (t.any(0), t.all(0)), b, target=EMU)
    x = 1 + torch.randn(50, 70) * 0.01
    check_compiled(lambda t: t.prod(0), x, target=EMU, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("shape", [(3000, 40), (37, 1000), (9, 6)], ids=str)
def test_softmax_and_log_softmax_over_dim_0(shape):
    x = torch.randn(*shape) * 3
    check_compiled(lambda t: torch.softmax(t, 0), x, target=EMU, rtol=1e-5, atol=1e-6)
    check_compiled(lambda t: torch.log_softmax(t, 0), x, target=EMU, rtol=1e-5, atol=1e-5)


def test_var_over_dim_0_f16():
    x = torch.randn(1000, 130, dtype=torch.float16)
    check_compiled(lambda t: t.float().var(0), x, target=EMU, rtol=1e-4, atol=1e-4)
