"""Vectorised CUDA injective kernels: when the scheduler picks the vector path, the kernels
run in the emulator (direct calls on poisoned outputs, misaligned views included), and whole
functions compiled for cuda-emu through torch.compile against eager."""

import pytest
import torch
import torch._dynamo
from graph_builder import GraphBuilder
from helpers import check_compiled, compile_minicomp
from schedule_graphs import one_group, poisoned

from minicomp.backends.cuda import emu
from minicomp.ir import expr as E
from minicomp.ir import stmt as S
from minicomp.ir import types as T
from minicomp.ir.func import Function, Module
from minicomp.ir.functor import Mutator, collect
from minicomp.ir.graph import Graph
from minicomp.passes.graph.layout import layouts_for
from minicomp.runtime.plan import dims_fn
from minicomp.schedule.cuda import BLOCK, schedule_cuda


def schedule(g: Graph, **strides) -> Function:
    layouts = layouts_for(g)
    layouts.update(strides)
    return schedule_cuda(one_group(g), layouts)


def vector_calls(f: Function, name: str) -> list[E.Call]:
    return [c for c in collect(f.body, E.Call) if c.name == name]


def lanes(f: Function, name: str) -> list[int]:
    """The lane counts of a kernel's `load_vec` or `store_vec` calls."""
    return [c.args[-1].value for c in vector_calls(f, name)]


def unary(shape, dtype=T.f32, out_dtype=None, strides=None) -> Graph:
    b = GraphBuilder()
    x = b.input("x", shape, dtype)
    out_dtype = out_dtype or dtype
    y = b.compute("y", shape, lambda *i: E.cast(E.cast(x[i], T.f32) * 2.0 + 1.0, out_dtype))
    b.output(y)
    return b.build()


def binary(x_shape, y_shape, out_shape, index_y) -> Graph:
    """z = x + y[index_y(i, j)] over a 2-D output."""
    b = GraphBuilder()
    x = b.input("x", x_shape)
    y = b.input("y", y_shape)
    z = b.compute("z", out_shape, lambda i, j: x[i, j] + y[index_y(i, j)])
    b.output(z)
    return b.build()


# --- which kernels vectorise ------------------------------------------------------------------


@pytest.mark.parametrize(
    "dtype, vec", [(T.f32, 4), (T.f16, 8), (T.bf16, 8), (T.f64, 2), (T.boolean, 8)]
)
def test_vector_width_is_sixteen_bytes_of_the_widest_output(dtype, vec):
    f = schedule(unary((64, 256), T.f32, dtype))
    assert lanes(f, "store_vec") == [vec]
    # The f32 input is loaded as vectors too: 32 bytes (two accesses) under an 8-lane output.
    assert lanes(f, "load_vec") == [vec]
    assert f.attrs.grid_dim == (64 * 256 // vec // BLOCK, 1, 1)
    arrays = collect(f.body, S.DeclareArray)
    assert {a.scope for a in arrays} == {"local"} and {a.size for a in arrays} == {vec}
    # One alignment flag per buffer, tested once before the per-thread work.
    assert len(vector_calls(f, "is_aligned")) == 2
    aligned = {c.args[1].value for c in vector_calls(f, "is_aligned")}
    assert aligned == {min(16, vec * 4), min(16, vec * dtype.nbytes)}


def test_a_narrow_input_is_a_narrow_vector():
    f = schedule(unary((8, 64), T.f16, T.f32))
    assert lanes(f, "load_vec") == [4] and lanes(f, "store_vec") == [4]
    assert {c.args[1].value for c in vector_calls(f, "is_aligned")} == {8, 16}


def test_an_input_too_wide_for_two_accesses_is_read_element_by_element():
    f = schedule(unary((8, 64), T.f64, T.f16))
    assert lanes(f, "store_vec") == [8] and not vector_calls(f, "load_vec")


def test_unit_dims_and_a_single_vector_per_row():
    f = schedule(unary((5, 1, 4)))
    assert lanes(f, "store_vec") == [4] and f.attrs.grid_dim == (1, 1, 1)


@pytest.mark.parametrize(
    "graph, strides",
    [
        (unary((64, 30)), {}),  # 30 is no multiple of 4
        (unary((64, 37), T.f16), {}),
        (unary((64, 12), T.f16), {}),  # a multiple of 4 but not of VEC = 8
        (unary((16, 64)), {"y": (1, 16)}),  # a column-major output
        (unary((16, 64)), {"y": (66, 1)}),  # rows 66 elements apart: no multiple of 4
    ],
)
def test_scalar_kernel_where_no_output_vectorises(graph, strides):
    f = schedule(graph, **strides)
    assert not vector_calls(f, "store_vec") and not vector_calls(f, "load_vec")
    assert not collect(f.body, S.DeclareArray)
    assert f == schedule_cuda_scalar(graph, strides)


def schedule_cuda_scalar(graph: Graph, strides: dict) -> Function:
    """The same group through the scalar path, to show the fallback is today's kernel."""
    from minicomp.schedule.cuda import CudaKernelBuilder

    layouts = layouts_for(graph)
    layouts.update(strides)
    builder = CudaKernelBuilder(one_group(graph), layouts)
    builder.vector_injective = lambda: None
    return builder.build()


def test_symbolic_inner_extent_stays_scalar():
    b = GraphBuilder()
    n = b.symbol("n")
    x = b.input("x", (4, n))
    b.output(b.compute("y", (4, n), lambda i, j: x[i, j] * 2.0))
    assert not vector_calls(schedule(b.build()), "store_vec")


def test_symbolic_rows_loop_over_vectors_with_runtime_stride_checks():
    b = GraphBuilder()
    n, m = b.symbol("n"), b.symbol("m")
    x = b.input("x", (n, m, 8))
    b.output(b.compute("y", (n, m, 8), lambda i, j, k: x[i, j, k] * 2.0))
    f = schedule(b.build())
    assert lanes(f, "store_vec") == [4] and lanes(f, "load_vec") == [4]
    assert collect(f.body, S.While)  # a grid-stride loop
    # The row stride 8 * m is symbolic: whether it is a multiple of 4 is checked at run time.
    flags = [s for s in collect(f.body, S.Declare) if s.var.name.startswith("aligned_")]
    assert flags and all(any(b.op == "imod" for b in collect(s.init, E.Binary)) for s in flags)


def test_which_reads_are_vector_loads():
    b = GraphBuilder()
    x = b.input("x", (16, 64))
    row = b.input("row", (1, 64))
    col = b.input("col", (16, 1))
    xt = b.input("xt", (64, 16))
    w = b.input("w", (16, 64))
    s = b.input("s", ())

    def body(i, j):
        picked = E.select(x[i, j] > 0, w[i, j], s[()])  # w is read only sometimes
        return x[i, j] * row[0, j] + col[i, 0] + xt[j, i] + picked

    b.output(b.compute("z", (16, 64), body))
    f = schedule(b.build())
    loaded = {c.args[1].buf.name for c in vector_calls(f, "load_vec")}
    assert loaded == {"in_x", "in_row"}
    # The others stay scalar loads, VEC of them per thread.
    scalar = {ld.buf.name for ld in collect(f.body, E.Load) if ld.buf.name.startswith("in_")}
    assert {"in_col", "in_xt", "in_w", "in_s"} <= scalar


def test_an_index_shifted_along_the_inner_dim_is_no_vector_load():
    f = schedule(binary((4, 64), (4, 68), (4, 64), lambda i, j: (i, j + 4)))
    assert {c.args[1].buf.name for c in vector_calls(f, "load_vec")} == {"in_x"}


def padded_pixels(rows: int, pixels: int) -> Graph:
    """y[i, 4 p + c] = x[i, 3 p + c] for c < 3, else 0: three f16 channels a pixel padded to
    four (passes/graph/small_channels.py's copy)."""
    b = GraphBuilder()
    x = b.input("x", (rows, 3 * pixels), T.f16)

    def body(i, j):
        c = j % 4
        return E.select(c < 3, x[i, j // 4 * 3 + E.minimum(c, 2)], E.const(0.0, T.f16))

    b.output(b.compute("y", (rows, 4 * pixels), body))
    return b.build()


def test_an_inner_index_divided_by_a_divisor_of_vec_splits_into_chunk_and_lane_parts():
    """With VEC = 8 and the inner variable j = 8 v + k, j // 4 is 2 v + k // 4 and j % 4 is
    k % 4: constants in each unrolled copy, no division of a thread's coordinate per
    element."""
    f = schedule(padded_pixels(4, 12))
    assert lanes(f, "store_vec") == [8]
    divisions = [e for e in collect(f.body, E.Binary) if e.op in ("idiv", "imod")]
    by_lane = [d for d in divisions if "vk" in {v.name for v in collect(d.a, E.Var)}]
    assert by_lane and all(isinstance(d.a, E.Var) for d in by_lane), by_lane


# --- emulated kernels, called directly -------------------------------------------------------


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("cuda-vectorize-cache"))


def launch(f: Function, tensors: dict, cache_dir: str, sizes: dict | None = None, grid=None):
    """Render `f`, build it for the emulator and run it on tensors bound by value name."""
    from minicomp.backends.cuda.codegen import render_module

    sizes = sizes or {}
    module = emu.build_emulated(render_module(Module(f.name, (f,))), [f], cache_dir=cache_dir)
    full_grid, block = (dims_fn(getattr(f.attrs, a))(sizes) for a in ("grid_dim", "block_dim"))
    args = [
        tensors[p.name.split("_", 1)[1]] if isinstance(p.type, T.PointerType) else sizes[p.name]
        for p in f.params
    ]
    module.launch(f.name, grid or full_grid, block, args)


def shifted(shape, offset: int, dtype=torch.float32) -> torch.Tensor:
    """A contiguous tensor `offset` elements into its storage (a misaligned view)."""
    n = 1
    for d in shape:
        n *= d
    base = torch.randn(n + offset).to(dtype)
    return base[offset:].view(shape)


@pytest.mark.parametrize("x_offset", [0, 1, 4])
@pytest.mark.parametrize("y_offset", [0, 2])
def test_misaligned_views_take_the_scalar_copies(x_offset, y_offset, cache_dir):
    f = schedule(unary((32, 64)))
    x = shifted((32, 64), x_offset)
    out_base = poisoned((32 * 64 + y_offset,))
    y = out_base[y_offset:].view(32, 64)
    assert (x.data_ptr() % 16 == 0) == (x_offset % 4 == 0)
    launch(f, {"x": x, "y": y}, cache_dir)
    torch.testing.assert_close(y, x * 2 + 1, rtol=0, atol=0)
    assert out_base[:y_offset].isnan().all()


@pytest.mark.parametrize("pixels", [12, 2])  # 2: one vector a row, its chunk coordinate 0
def test_padded_pixels_in_the_emulator(pixels, cache_dir):
    f = schedule(padded_pixels(4, pixels))
    x = torch.randn(4, 3 * pixels, dtype=torch.float16)
    y = poisoned((4, 4 * pixels), torch.float16)
    launch(f, {"x": x, "y": y}, cache_dir)
    expected = torch.nn.functional.pad(x.view(4, pixels, 3), (0, 1)).view(4, 4 * pixels)
    torch.testing.assert_close(y, expected, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64, torch.float32])
def test_each_dtype_in_the_emulator(dtype, cache_dir):
    dt = T.from_torch(dtype)
    f = schedule(unary((6, 5, 16), dt))
    assert vector_calls(f, "store_vec")
    for offset in (0, 1):
        x = shifted((6, 5, 16), offset, dtype)
        y = poisoned((6, 5, 16), dtype)
        launch(f, {"x": x, "y": y}, cache_dir)
        expected = (x.float() * 2 + 1).to(dtype)
        torch.testing.assert_close(y, expected, rtol=0, atol=0)


def test_symbolic_rows_with_a_short_grid(cache_dir):
    b = GraphBuilder()
    n = b.symbol("n")
    x = b.input("x", (n, 8))
    row = b.input("row", (1, 8))
    b.output(b.compute("y", (n, 8), lambda i, j: x[i, j] - row[0, j]))
    f = schedule(b.build())
    assert vector_calls(f, "store_vec")
    for rows, grid in ((1000, None), (1000, 1), (3, None), (0, None)):
        x, row = torch.randn(rows, 8), shifted((1, 8), 1)
        y = poisoned((rows, 8))
        launch(f, {"x": x, "row": row, "y": y}, cache_dir, {"n": rows}, grid)
        torch.testing.assert_close(y, x - row, rtol=0, atol=0)


class _TrustAlignment(Mutator):
    """Every alignment flag set to true: the kernel a scheduler without the check makes."""

    def visit_Declare(self, s: S.Declare) -> S.Declare:
        if s.var.name.startswith("aligned_"):
            return S.Declare(s.var, E.const(True))
        return s


def test_the_emulator_faults_on_a_misaligned_vector_access(cache_dir):
    f = schedule(unary((4, 64)))
    unchecked = f.replace(name="unchecked", body=_TrustAlignment().visit(f.body))
    x, y = torch.randn(4, 64), poisoned((4, 64))
    launch(unchecked, {"x": x, "y": y}, cache_dir)  # aligned: fine
    torch.testing.assert_close(y, x * 2 + 1)
    with pytest.raises(emu.EmulatorError, match="misaligned 16-byte vector access"):
        launch(unchecked, {"x": shifted((4, 64), 1), "y": y}, cache_dir)


# --- through torch.compile -------------------------------------------------------------------


@pytest.fixture
def launched(monkeypatch) -> list:
    """(kernel source, pointer arguments) of every emulated launch while the test runs."""
    records = []
    original = emu.EmuModule.launch

    def record(self, name, grid, block, args, shared_bytes=0):
        body = self.source[self.source.index(f" {name}(") :].split("\n}\n")[0]
        records.append((body, [a for a in args if isinstance(a, int)]))
        return original(self, name, grid, block, args, shared_bytes)

    monkeypatch.setattr(emu.EmuModule, "launch", record)
    return records


def _vectorised(records) -> bool:
    return any("mc_store_vec" in body for body, _ in records)


def randn(*shape, dtype=torch.float32):
    return torch.randn(*shape).to(dtype)


CASES = [
    ("f32_chain", lambda x: torch.sigmoid(x * 2 + 1) - x, (randn(64, 256),), True),
    ("f16_chain", lambda x: torch.tanh(x * 2) + x, (randn(32, 128, dtype=torch.float16),), True),
    ("bf16_chain", lambda x: x * x - 1, (randn(16, 64, dtype=torch.bfloat16),), True),
    ("f64_chain", lambda x: torch.exp(x) / (1 + x * x), (randn(8, 30, dtype=torch.float64),), True),
    ("f32_to_f16", lambda x: (x * 3 + 1).half(), (randn(16, 64),), True),
    ("f16_to_f32", lambda x: x.float() * 0.5, (randn(16, 64, dtype=torch.float16),), True),
    ("row_vector", lambda x, r: x * r + 1, (randn(32, 64), randn(64)), True),
    ("scalar_tensor", lambda x, s: x - s, (randn(32, 64), randn(())), True),
    ("column", lambda x, c: x / (c + 3), (randn(32, 64), randn(32, 1)), True),
    ("transposed", lambda x, y: x + y.t() * 2, (randn(32, 64), randn(64, 32)), True),
    ("compare", lambda x, y: (x > y) & (y > 0), (randn(8, 64), randn(8, 64)), True),
    ("odd_size", lambda x: x * 2 + 1, (randn(33, 37),), False),
    ("cat_inner", lambda x, y: torch.cat([x, y], 1) * 2, (randn(8, 12), randn(8, 20)), True),
]


@pytest.mark.parametrize("name, fn, args, vector", CASES, ids=[c[0] for c in CASES])
def test_compiled_elementwise(name, fn, args, vector, launched):
    check_compiled(fn, *args, target="cuda-emu")
    assert launched and _vectorised(launched) == vector


@pytest.mark.parametrize(
    "dtype, offset", [(torch.float32, 1), (torch.float32, 2), (torch.float16, 4)]
)
def test_compiled_function_of_a_misaligned_view(dtype, offset, launched):
    base = randn(64 * 128 + offset, dtype=dtype)
    x = base[offset:].view(64, 128)
    y = randn(128, dtype=dtype)
    wide = randn(64, 160, dtype=dtype)
    z = wide[:, offset : offset + 128]  # rows 160 apart, starting `offset` in

    def fn(x, y, z):
        return x * y + z

    expected = fn(x, y, z)
    actual = compile_minicomp(fn, "cuda-emu")(x, y, z)
    torch.testing.assert_close(actual, expected)
    assert _vectorised(launched)
    # The kernel read the views where they are, not aligned copies of them.
    pointers = {p for _, args in launched for p in args}
    assert x.data_ptr() in pointers and z.data_ptr() in pointers
    assert x.data_ptr() % 16 and z.data_ptr() % 16


def test_compiled_with_a_dynamic_batch(launched):
    def fn(x, r):
        return torch.relu(x + r) * 2

    compiled = compile_minicomp(fn, "cuda-emu", dynamic=None)
    r = randn(64)
    for rows in (5, 37, 300):
        x = randn(rows, 64)
        torch._dynamo.mark_dynamic(x, 0)
        torch.testing.assert_close(compiled(x, r), fn(x, r))
    assert _vectorised(launched)


def test_compiled_function_of_a_one_dimensional_slice(launched):
    base = randn(4097)
    x = base[1:]

    def fn(x):
        return torch.sigmoid(x) * 3

    actual = compile_minicomp(fn, "cuda-emu")(x)
    torch.testing.assert_close(actual, fn(x))
    assert _vectorised(launched)
    assert x.data_ptr() % 16 and x.data_ptr() in {p for _, args in launched for p in args}
