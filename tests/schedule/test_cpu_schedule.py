"""The CPU scheduler: loop kinds and kernel parameters of the Function it makes for a fused
group, then the kernels built with the cpu backend and run on torch tensors against eager."""

import numpy as np
import pytest
import torch
from graph_builder import GraphBuilder
from helpers import build_cpu
from schedule_graphs import broadcast_add, full_2d_sum, one_group, poisoned, row_reduce, scale_graph

from minicomp.ir import expr as E
from minicomp.ir.compute import reduce
from minicomp.ir.func import Function, Module
from minicomp.ir.functor import collect, substitute
from minicomp.ir.graph import Graph
from minicomp.ir.simplify import simplify_expr
from minicomp.ir.stmt import DeclareArray, For, If, Store
from minicomp.ir.types import PointerType, f64, to_torch
from minicomp.passes.graph.layout import layouts_for
from minicomp.schedule.cpu import CHUNK, STAGED_TILE, TILE, schedule_cpu


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("schedule-cache"))


def schedule(g: Graph, **strides) -> Function:
    """The kernel of a graph that fuses into one group; `strides` override value layouts."""
    layouts = layouts_for(g)
    layouts.update(strides)
    return schedule_cpu(one_group(g), layouts)


def loops(f: Function) -> list[For]:
    return collect(f.body, For)


def run_kernel(f: Function, cache_dir: str, tensors: dict, sizes: dict | None = None) -> None:
    """Build `f` alone and call it; `tensors` binds buffer params by value name."""
    lib = build_cpu(Module(f.name, (f,)), cache_dir=cache_dir)
    args = []
    for p in f.params:
        if isinstance(p.type, PointerType):
            t = tensors[p.name.split("_", 1)[1]]
            assert t.dtype == to_torch(p.type.elem), p.name
            args.append(t.data_ptr())
        else:
            args.append(sizes[p.name])
    lib.kernel(f.name)(*args)


# --- graphs --------------------------------------------------------------------------------


# --- structure -----------------------------------------------------------------------------


def test_injective_kernel_is_parallel_outside_and_vectorised_inside():
    f = schedule(scale_graph((2, 3, 8)))
    assert [(lp.kind, lp.reductions) for lp in loops(f)] == [
        ("parallel", ()),
        ("parallel", ()),
        ("vectorize", ()),
    ]
    assert [lp.extent for lp in loops(f)] == [E.const(2), E.const(3), E.const(8)]
    assert len(collect(f.body, Store)) == 1


def test_short_one_dimensional_loop_is_one_vector_loop():
    (lp,) = loops(schedule(scale_graph((100,))))
    assert lp.kind == "vectorize" and lp.extent == E.const(100)


def test_long_one_dimensional_loop_is_split_into_parallel_chunks():
    n = 3 * CHUNK + 5
    outer, inner = loops(schedule(scale_graph((n,))))
    assert outer.kind == "parallel" and inner.kind == "vectorize"
    assert outer.extent == E.const(4)


def test_unit_dimensions_get_no_loop():
    f = schedule(scale_graph((4, 1, 8)))
    assert [lp.kind for lp in loops(f)] == ["parallel", "vectorize"]


@pytest.mark.parametrize("kind, clause", [("sum", "add"), ("max", "max"), ("prod", "mul")])
def test_row_reduction_has_parallel_rows_and_a_reduction_clause_on_the_inner_loop(kind, clause):
    f = schedule(row_reduce(kind, cols=64))
    outer, inner = loops(f)
    assert outer.kind == "parallel" and outer.reductions == ()
    assert inner.kind == "vectorize"
    ((op, acc),) = inner.reductions
    assert op == clause and acc.name.startswith("acc")
    assert outer.body.body[0].var == acc  # declared per row, inside the parallel loop


def test_full_reduction_splits_into_parallel_chunks_with_reduction_clauses():
    f = schedule(row_reduce("sum", rows=1, cols=100003))
    outer, inner = loops(f)
    assert outer.kind == "parallel" and inner.kind == "vectorize"
    assert outer.reductions and outer.reductions == inner.reductions
    assert outer.reductions[0][0] == "add"


def test_full_reduction_over_two_dims_puts_the_clause_on_the_parallel_loop():
    outer, inner = loops(schedule(full_2d_sum(300, 337)))
    assert outer.kind == "parallel" and inner.kind == "vectorize"
    assert outer.reductions and outer.reductions == inner.reductions


@pytest.mark.parametrize("kind", ["any", "all"])
def test_reductions_without_an_openmp_clause_run_serially(kind):
    from minicomp.ir.types import boolean

    f = schedule(row_reduce(kind, cols=64, dtype=boolean))
    outer, inner = loops(f)
    assert outer.kind == "parallel" and inner.kind == "serial" and inner.reductions == ()


def test_argmax_updates_through_an_if():
    f = schedule(row_reduce("argmax", cols=64))
    outer, inner = loops(f)
    assert outer.kind == "parallel"
    assert inner.reductions == ()
    assert isinstance(inner.body, If)
    assert collect(inner.body, If)


@pytest.mark.parametrize("kind", ["max", "sum", "argmax"])
def test_a_small_reduction_is_unrolled_under_vector_lanes_across_outputs(kind):
    # A pooling window: vector lanes along the outputs, each lane's window unrolled, and no
    # private accumulators to set up and combine for 9 elements.
    f = schedule(row_reduce(kind, rows=64, cols=9))
    outer, window = loops(f)
    assert outer.kind == "vectorize" and outer.reductions == ()
    assert window.kind == "unroll" and window.reductions == ()


def channels_last_window_max() -> Graph:
    """A pooling window over (2, 8, 4, 6): y[n, c, h, w] = max of x[n, c, h, w + r], r < 3."""
    b = GraphBuilder()
    x = b.input("x", (2, 8, 4, 6))
    y = b.compute(
        "y", (2, 8, 4, 4), lambda n, c, h, w: reduce("max", (3,), lambda r: x[n, c, h, w + r])
    )
    b.output(y)
    return b.build()


def test_a_channels_last_window_is_vectorised_along_the_channels(cache_dir):
    # The outputs' loops follow the output's memory order: channels innermost, so the vector
    # lanes load and store consecutive channels (not the width at a stride of 8).
    x = torch.randn(2, 8, 4, 6).to(memory_format=torch.channels_last)
    out = poisoned((2, 8, 4, 4)).to(memory_format=torch.channels_last)
    f = schedule(channels_last_window_max(), x=x.stride(), y=out.stride())
    *outer, window = loops(f)
    assert [lp.extent for lp in outer] == [E.const(2), E.const(4), E.const(4), E.const(8)]
    assert outer[-1].kind == "vectorize" and window.kind == "unroll"
    run_kernel(f, cache_dir, {"x": x, "y": out})
    expected = x.unfold(3, 3, 1).amax(-1)
    torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_params_are_inputs_then_outputs_then_sorted_symbols():
    b = GraphBuilder()
    n, a = b.symbol("n"), b.symbol("a")
    x = b.input("x", (n, a))
    y = b.input("y", (1, a))
    z = b.compute("z", (n, a), lambda i, j: x[i, j] * y[0, j])
    w = b.compute("w", (n, a), lambda i, j: z[i, j] + 1.0)
    b.output(w, z)
    f = schedule(b.build())
    assert [p.name for p in f.params] == ["in_x", "in_y", "out_z", "out_w", "a", "n"]
    assert all(isinstance(p.type, PointerType) for p in f.params[:4])
    # Symbolic extents become loop bounds read from the size params.
    assert [lp.extent for lp in loops(f)] == [E.size_var("n"), E.size_var("a")]


def test_symbols_only_in_strides_are_params_too():
    b = GraphBuilder()
    n = b.symbol("n")
    x = b.input("x", (4, 8))
    y = b.compute("y", (4, 8), lambda i, j: x[i, j] * 2.0)
    b.output(y)
    f = schedule(b.build(), x=(n, 1))
    assert [p.name for p in f.params] == ["in_x", "out_y", "n"]


def test_strided_inputs_are_loaded_with_their_strides():
    f = schedule(broadcast_add(), x=(1, 4))
    o0, o1 = (lp.var for lp in loops(f))
    loads = {ld.buf.name: ld.index for ld in collect(f.body, E.Load)}
    assert loads["in_x"] == o0 + o1 * 4
    assert loads["in_y"] == o1
    (st,) = collect(f.body, Store)
    assert st.index == o0 * 8 + o1


def test_loops_follow_the_output_strides():
    """An output laid out column-major is written with its rows innermost: the vector loop
    steps through consecutive addresses, and so does the read of an input in the same layout
    (a permute saved for backward; Inductor returns it as a view)."""
    f = schedule(scale_graph((6, 40)), x=(1, 6), y=(1, 6))
    outer, inner = loops(f)
    assert (outer.extent, outer.kind) == (E.const(40), "parallel")
    assert (inner.extent, inner.kind) == (E.const(6), "vectorize")
    (st,) = collect(f.body, Store)
    assert st.index == inner.var + outer.var * 6  # unit stride along the vector loop
    # Row-major strides keep the logical order.
    outer, inner = loops(schedule(scale_graph((6, 40))))
    assert (outer.extent, inner.extent) == (E.const(6), E.const(40))


def test_a_column_major_output_is_computed_in_memory_order(cache_dir):
    x = torch.randn(40, 6).t()  # (6, 40) with strides (1, 6)
    f = schedule(scale_graph((6, 40)), x=x.stride(), y=x.stride())
    out = poisoned((40, 6)).t()
    run_kernel(f, cache_dir, {"x": x, "y": out})
    torch.testing.assert_close(out, x * 2.0 + 1.0, rtol=0, atol=0)


def test_a_transposing_copy_walks_square_tiles():
    """x column-major, y row-major: the loop writing y contiguously reads x across memory.
    Both loops split into TILE x TILE tiles; in a tile the loop reading x in order is
    innermost, and the tiles follow y's order."""
    f = schedule(scale_graph((40, 72)), x=(1, 40))
    tile_rows, tile_cols, rows, cols = loops(f)
    assert [lp.var.name for lp in (tile_rows, tile_cols, rows, cols)] == [
        "o0_t", "o1_t", "o1_i", "o0_i"
    ]  # fmt: skip
    assert (tile_rows.extent, tile_cols.extent) == (E.const(5), E.const(9))
    assert (rows.extent, cols.extent) == (E.const(TILE), E.const(TILE))
    assert cols.kind == "vectorize"
    (load,) = collect(f.body, E.Load)
    at = {tile_rows.var: 2, tile_cols.var: 3, rows.var: 5, cols.var: 7}
    value = simplify_expr(substitute(load.index, {v: E.const(k) for v, k in at.items()}))
    assert value == E.const((2 * TILE + 7) + (3 * TILE + 5) * 40)  # x[row, col] at stride 40
    # A copy that reads and writes in the same order, or too small to tile, keeps its loops.
    assert len(loops(schedule(scale_graph((40, 72))))) == 2
    assert len(loops(schedule(scale_graph((6, 72)), x=(1, 6)))) == 2


@pytest.mark.parametrize("shape", [(64, 48), (37, 51), (3, 67, 45), (3, 32, 80)], ids=str)
def test_tiled_transposes_write_every_element(cache_dir, shape):
    # Ragged edges (sizes no multiple of TILE), a batch dim outside the tiles, and tiles
    # transposed in registers (sizes multiples of STAGED_TILE).
    x = torch.randn(*shape[:-2], shape[-1], shape[-2]).transpose(-1, -2)
    f = schedule(scale_graph(shape), x=x.stride())
    assert len(loops(f)) == len(shape) + 2
    staged = all(n % STAGED_TILE == 0 for n in shape[-2:])
    assert bool(collect(f.body, DeclareArray)) == staged
    out = poisoned(shape)
    run_kernel(f, cache_dir, {"x": x, "y": out})
    torch.testing.assert_close(out, x * 2.0 + 1.0, rtol=0, atol=0)


def transposed_sum() -> Graph:
    """z = x + y + w, all (32, 48): x and y will be column-major, w row-major like z."""
    b = GraphBuilder()
    x, y, w = (b.input(name, (32, 48)) for name in "xyw")
    z = b.compute("z", (32, 48), lambda i, j: x[i, j] * 2.0 + y[i, j] - w[i, j])
    b.output(z)
    return b.build()


def test_a_float32_transpose_moves_whole_tiles_through_registers(cache_dir):
    """Extents multiples of STAGED_TILE: every float32 load striding along the output's rows
    is read a tile at a time into a local array, transposed (mc_transpose16_f32); the tile's
    loop then reads it, and the other loads, in the output's order, vectorised."""
    x, y = (torch.randn(48, 32).t() for _ in range(2))
    w = torch.randn(32, 48)
    f = schedule(transposed_sum(), x=x.stride(), y=y.stride())
    tile_rows, tile_cols, rows, cols = loops(f)
    assert (tile_rows.extent, tile_cols.extent) == (E.const(2), E.const(3))
    assert (rows.kind, cols.kind) == ("serial", "vectorize")
    assert tile_rows.kind == tile_cols.kind == "parallel"
    arrays = collect(f.body, DeclareArray)
    calls = [c for c in collect(f.body, E.Call) if c.name == "transpose16_f32"]
    assert len(arrays) == len(calls) == 2  # x and y, not w
    # x's tile starts at x[16 * tile_rows, 16 * tile_cols], rows 32 floats apart.
    tile, buf, start, stride = calls[0].args
    assert (tile, buf.name, stride) == (arrays[0].var, "in_x", E.const(32))
    corner = simplify_expr(
        substitute(start, {tile_rows.var: E.const(1), tile_cols.var: E.const(2)})
    )
    assert corner == E.const(16 + 32 * 32)
    out = poisoned((32, 48))
    run_kernel(f, cache_dir, {"x": x, "y": y, "w": w, "z": out})
    torch.testing.assert_close(out, x * 2.0 + y - w, rtol=0, atol=0)


def test_other_types_transpose_through_square_tiles(cache_dir):
    # mc_transpose16_f32 moves 4-byte floats only: a float64 transpose keeps TILE x TILE
    # tiles read in order.
    g = GraphBuilder()
    x = g.input("x", (32, 48), f64)
    y = g.compute("y", (32, 48), lambda i, j: x[i, j] * 2.0)
    g.output(y)
    xt = torch.randn(48, 32, dtype=torch.float64).t()
    f = schedule(g.build(), x=xt.stride())
    assert not collect(f.body, DeclareArray)
    assert [lp.extent for lp in loops(f)][2:] == [E.const(TILE), E.const(TILE)]
    out = poisoned((32, 48), torch.float64)
    run_kernel(f, cache_dir, {"x": xt, "y": out})
    torch.testing.assert_close(out, xt * 2.0, rtol=0, atol=0)


# --- numerics ------------------------------------------------------------------------------


def test_broadcast_add_over_a_permuted_input(cache_dir):
    x = torch.randn(8, 4).t()  # (4, 8) with strides (1, 4)
    y = torch.randn(1, 8)
    assert x.stride() == (1, 4)
    f = schedule(broadcast_add(), x=x.stride())
    out = poisoned((4, 8))
    run_kernel(f, cache_dir, {"x": x, "y": y, "z": out})
    torch.testing.assert_close(out, x + y, rtol=0, atol=0)


def test_full_reduction_of_100003_elements(cache_dir):
    n = 100003
    f = schedule(row_reduce("sum", rows=1, cols=n))
    x = torch.rand(1, n) - 0.25
    out = poisoned((1, 1))
    run_kernel(f, cache_dir, {"x": x, "s": out})
    expected = x.double().sum(dim=1, keepdim=True).float()
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-3)


def test_full_reduction_over_two_dims(cache_dir):
    f = schedule(full_2d_sum(300, 337))
    x = torch.rand(300, 337)
    out = poisoned((1, 1))
    run_kernel(f, cache_dir, {"x": x, "s": out})
    expected = x.double().sum().float().reshape(1, 1)
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-3)


@pytest.mark.parametrize("kind", ["argmax", "argmin"])
def test_argmax_with_ties_and_nan(cache_dir, kind):
    rows, cols = 5, 300
    x = torch.randint(-3, 4, (rows, cols)).float()  # many ties
    x[1, 17] = float("nan")
    x[1, 200] = float("nan")
    x[2, :] = 7.0
    x[3, 0] = float("nan")
    x[4, :] = float("-inf") if kind == "argmax" else float("inf")
    x[4, 250] = 0.0
    f = schedule(row_reduce(kind, rows=rows, cols=cols))
    out = poisoned((rows,), torch.int64)
    # The graph reduces to (rows, 1); the kernel stores through strides (1, ...).
    out2 = out.view(rows, 1)
    run_kernel(f, cache_dir, {"x": x, "s": out2})
    expected = getattr(torch, kind)(x, dim=1)
    assert out.tolist() == expected.tolist()


def test_row_reduction_with_symbolic_sizes_bound_at_run_time(cache_dir):
    b = GraphBuilder()
    n, m = b.symbol("n"), b.symbol("m")
    x = b.input("x", (n, m))
    s = b.compute("s", (n, 1), lambda i, j: reduce("max", (m,), lambda k: x[i, k] * 2.0))
    b.output(s)
    f = schedule(b.build())
    assert [p.name for p in f.params] == ["in_x", "out_s", "m", "n"]
    for rows, cols in ((3, 37), (5, 1000), (1, 1)):
        x = torch.randn(rows, cols)
        out = poisoned((rows, 1))
        run_kernel(f, cache_dir, {"x": x, "s": out}, {"n": rows, "m": cols})
        expected = (x * 2).amax(dim=1, keepdim=True)
        torch.testing.assert_close(out, expected, rtol=0, atol=0)


def test_softmax_kernel_matches_eager(cache_dir):
    b = GraphBuilder()
    x = b.input("x", (6, 33))
    mx = b.compute("mx", (6, 1), lambda i, j: reduce("max", (33,), lambda k: x[i, k]))
    sm = b.compute(
        "sm", (6, 1), lambda i, j: reduce("sum", (33,), lambda k: E.call("exp", x[i, k] - mx[i, 0]))
    )
    out = b.compute("out", (6, 33), lambda i, j: E.call("exp", x[i, j] - mx[i, 0]) / sm[i, 0])
    b.output(out)
    f = schedule(b.build())
    xs = torch.randn(6, 33) * 4
    res = poisoned((6, 33))
    run_kernel(f, cache_dir, {"x": xs, "out": res})
    torch.testing.assert_close(res, torch.softmax(xs, dim=1))
    assert not np.isnan(res.numpy()).any()


def _softmax_graph(out_dtype=None) -> Graph:
    b = GraphBuilder()
    x = b.input("x", (6, 33))
    mx = b.compute("mx", (6, 1), lambda i, j: reduce("max", (33,), lambda k: x[i, k]))
    sm = b.compute(
        "sm", (6, 1), lambda i, j: reduce("sum", (33,), lambda k: E.call("exp", x[i, k] - mx[i, 0]))
    )

    def normalise(i, j):
        e = E.call("exp", x[i, j] - mx[i, 0]) / sm[i, 0]
        return e if out_dtype is None else E.cast(e, out_dtype)

    b.output(b.compute("out", (6, 33), normalise))
    return b.build()


def test_a_costly_value_the_row_store_repeats_is_computed_once():
    f = schedule(_softmax_graph())
    assert str(f).count("exp(") == 1
    # The sum loop writes the exps into the output row, which the last loop then reads.
    stores = collect(f.body, Store)
    assert len(stores) == 2 and stores[0].buf == stores[1].buf


def test_a_value_the_output_type_cannot_hold_exactly_is_recomputed():
    from minicomp.ir.types import f16

    f = schedule(_softmax_graph(out_dtype=f16))
    assert str(f).count("exp(") == 2


def test_a_costly_value_every_pass_of_a_row_uses_is_computed_once(cache_dir):
    # A layer norm over an erf-GELU: the sum, the variance and the store all need gelu(x).
    b = GraphBuilder()
    x = b.input("x", (5, 40))
    g = b.compute("g", (5, 40), lambda i, j: x[i, j] * E.call("erf", x[i, j] * 0.7))
    mean = b.compute("mean", (5, 1), lambda i, j: reduce("sum", (40,), lambda k: g[i, k]) / 40.0)
    var = b.compute(
        "var",
        (5, 1),
        lambda i, j: reduce(
            "sum", (40,), lambda k: (g[i, k] - mean[i, 0]) * (g[i, k] - mean[i, 0])
        ),
    )
    b.output(b.compute("y", (5, 40), lambda i, j: (g[i, j] - mean[i, 0]) / (var[i, 0] + 1.0)))
    f = schedule(b.build())
    assert str(f).count("erf(") == 1
    xs = torch.randn(5, 40)
    out = poisoned((5, 40))
    run_kernel(f, cache_dir, {"x": xs, "y": out})
    gs = xs * torch.erf(xs * 0.7)
    m = gs.mean(1, keepdim=True)
    expected = (gs - m) / (((gs - m) ** 2).sum(1, keepdim=True) + 1.0)
    torch.testing.assert_close(out, expected)
