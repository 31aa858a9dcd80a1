"""Matmul operands read at affine indices (`i + k`, `s * CHUNK + kk`, a slice's offset) are
plain strided reads that the tensor-core template copies with cp.async: their strides and
offsets, the indices that are not plain, and cuda-emu results against float64 / the
reference evaluator."""

import numpy as np
import pytest
import torch
from graph_builder import GraphBuilder, evaluate_graph, random_inputs
from helpers import check_compiled
from schedule_graphs import matmul_problem_of, one_group

from minicomp import config
from minicomp.compiler import compile_graph
from minicomp.dynamo.backend import recording
from minicomp.ir import types as T
from minicomp.ir.compute import reduce
from minicomp.ir.expr import cast, minimum
from minicomp.ir.graph import Graph
from minicomp.passes.graph import split_k
from minicomp.passes.graph.layout import layouts_for
from minicomp.record import CompileRecord
from minicomp.schedule.templates import matmul_problem

EMU = "cuda-emu"
M, N, K = 16, 24, 40


def product(read_a, shape_a, dtype=T.f16, symbols=()) -> Graph:
    """`out[i, j] = sum_r x[read_a(i, r)] * y[r, j]` (f32 accumulation)."""
    g = GraphBuilder()
    syms = [g.symbol(s) for s in symbols]
    x = g.input("x", tuple(d(*syms) if callable(d) else d for d in shape_a), dtype)
    y = g.input("y", (K, N), dtype)

    def body(i, j):
        def term(r):
            return cast(x[read_a(i, r, *syms)], T.f32) * cast(y[r, j], T.f32)

        return cast(reduce("sum", (K,), term), dtype)

    g.output(g.compute("out", (M, N), body))
    return g.build()


def problem_of(g: Graph):
    p = matmul_problem(one_group(g), layouts_for(g))
    assert p is not None and (p.m, p.n, p.k) == (M, N, K)
    return p


def test_a_variable_in_two_indices_adds_its_strides():
    # x[i, i + r]: element (i, r) at i * (ld + 1) + r, a "diagonal band" of x.
    p = problem_of(product(lambda i, r: (i, i + r), (M, M + K)))
    assert p.plain_a.contiguous == "k" and p.plain_a.ld == M + K + 1 and p.plain_a.base == 0


def test_offsets_and_scaled_variables():
    # x[r + 2, 3 * i + 1]: rows of K, unit stride along M ("mn") only when the scale is 1.
    p = problem_of(product(lambda i, r: (r + 2, i + 1), (K + 2, M + 1)))
    assert p.plain_a.contiguous == "mn" and p.plain_a.ld == M + 1
    assert p.plain_a.base == 2 * (M + 1) + 1
    q = problem_of(product(lambda i, r: (r, 3 * i + 1), (K, 3 * M)))
    assert q.plain_a is None and q.a_major == "k"  # no unit stride: computed in registers


@pytest.mark.parametrize(
    "read_a, shape_a, symbols",
    [
        (lambda i, r: (i, 2 * r), (M, 2 * K), ()),  # stride 2 along K
        (lambda i, r: (i, K - 1 - r), (M, K), ()),  # K runs backwards
        (lambda i, r: (i, i * r), (M, M * K), ()),  # a product of variables
        (lambda i, r: (i, r // 2), (M, K), ()),  # not affine
        (lambda i, r, n: (i, r + n - K), (M, lambda n: n), ("n",)),  # a size symbol
    ],
    ids=["stride2", "reversed", "product", "idiv", "symbol"],
)
def test_indices_that_are_not_plain(read_a, shape_a, symbols):
    g = product(read_a, shape_a, symbols=symbols)
    p = matmul_problem(one_group(g), layouts_for(g))
    assert p is not None and p.plain_a is None
    assert p.plain_b is not None  # y is read plainly whatever x is


def test_major_of_a_computed_operand_reads_affine_indices():
    # x[r, i + 1] * 2 is computed (a prologue), but its rows run along M with unit stride.
    g = GraphBuilder()
    x, y = g.input("x", (K, M + 1)), g.input("y", (K, N))
    g.output(
        g.compute(
            "out",
            (M, N),
            lambda i, j: reduce("sum", (K,), lambda r: (x[r, i + 1] * 2.0) * y[r, j]),
        )
    )
    p = problem_of(g.build())
    assert p.plain_a is None and p.a_major == "mn"
    assert p.plain_b is not None and p.b_major == "mn"
    # A clamped index (split-K's guarded chunk) is no affine one and is left out; the other
    # index still shows the layout.
    q = problem_of(product(lambda i, r: (minimum(r + 1, K - 1), i + 1), (K, M + 1)))
    assert q.plain_a is None and q.a_major == "mn"


@pytest.mark.parametrize("dtype", [T.f16, T.f32])
def test_diagonal_band_operand_on_the_emulator(dtype):
    # i advances by the row stride plus one: (M + K + 7) + 1 = 64, a multiple of 8, so the
    # f16 operand is copied with cp.async.
    g = product(lambda i, r: (i, i + r), (M, M + K + 7), dtype)
    p = problem_of(g)
    assert p.plain_a.ld % 8 == 0
    record = CompileRecord()
    plan = compile_graph(g, config.resolve({"target": EMU}), record)
    (kernel,) = record.kernels
    assert kernel.attrs.template.startswith("matmul_tc[" if dtype == T.f16 else "matmul_simt[")
    inputs = random_inputs(g, seed=4)
    (expected,) = evaluate_graph(g, inputs)
    (actual,) = plan(*(torch.from_numpy(inputs[v.name]) for v in g.inputs))
    tol = 2e-2 if dtype == T.f16 else 1e-4
    np.testing.assert_allclose(actual.numpy().astype(np.float64), expected, rtol=tol, atol=tol)


def test_sliced_operands_are_plain_with_their_offset():
    h = torch.float16
    p = matmul_problem_of(
        lambda a, b: a[2:, 1:] @ b[:, 3:],
        torch.randn(50, 73, dtype=h),
        torch.randn(72, 43, dtype=h),
        target=EMU,
    )
    assert p.plain_a.contiguous == "k" and p.plain_a.base == 2 * 73 + 1
    assert p.plain_b.contiguous == "mn" and p.plain_b.base == 3


@pytest.mark.parametrize("offset", [8, 1], ids=["aligned", "misaligned"])
def test_sliced_operand_on_the_emulator(offset):
    """A column offset of 8 f16 elements keeps the 16-byte copies aligned; an offset of 1
    makes the kernel find out at run time and load synchronously."""
    h = torch.float16
    a, b = torch.randn(48, 72 + offset, dtype=h), torch.randn(72, 40, dtype=h)
    records: list = []
    with recording(records), torch.no_grad():
        check_compiled(
            lambda a, b: a[:, offset:] @ b,
            a,
            b,
            target=EMU,
            reference_dtype=torch.float64,
            rtol=1e-2,
            atol=1e-2,
        )
    (kernel,) = [k for r in records for k in r.kernels]
    assert kernel.attrs.template.startswith("matmul_tc[")


def test_split_k_partial_operands_are_plain(monkeypatch):
    """The partial product of split-K reads a[m, s * 256 + kk] and b[s * 256 + kk, n]: the
    chunk index is a batch variable with stride 256 (a) and 256 * N (b)."""
    monkeypatch.setattr(split_k, "MIN_K", 1024)
    monkeypatch.setattr(split_k, "MIN_CHUNK", 256)
    h = torch.float16
    a, b = torch.randn(8, 2048, dtype=h), torch.randn(2048, 16, dtype=h)
    p = matmul_problem_of(torch.mm, a, b, target=EMU)
    assert (p.batch, p.m, p.n, p.k) == (8, 8, 16, 256)
    assert p.plain_a.contiguous == "k" and p.plain_a.ld == 2048
    assert p.plain_a.batch_strides == (256,)
    assert p.plain_b.contiguous == "mn" and p.plain_b.ld == 16
    assert p.plain_b.batch_strides == (256 * 16,)
