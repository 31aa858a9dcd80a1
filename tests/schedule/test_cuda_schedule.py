"""The CUDA scheduler: launch attributes, intrinsics and parameters of the kernels it makes,
then the kernels run against eager: by a lockstep interpreter of kernel IR defined here (all
threads of the grid step together; it checks barriers are block-uniform, shuffles
warp-uniform and shared memory race-free between barriers), and, where the CUDA renderer
and emulator exist, rendered, emulated and compiled with NVRTC."""

import importlib.util
import math

import numpy as np
import pytest
import torch
from graph_builder import GraphBuilder
from schedule_graphs import full_2d_sum, one_group, poisoned, row_reduce, scale_graph

from minicomp.ir import expr as E
from minicomp.ir import stmt as S
from minicomp.ir import types as T
from minicomp.ir.compute import reduce
from minicomp.ir.evaluate import np_dtype, to_dtype
from minicomp.ir.func import Function, Module
from minicomp.ir.functor import Functor, collect
from minicomp.ir.graph import Graph
from minicomp.ir.types import PointerType, i64
from minicomp.passes.graph.layout import layouts_for
from minicomp.schedule.cuda import BLOCK, MAX_GRID, WARP, WARPS, schedule_cuda


def schedule(g: Graph, **strides) -> Function:
    """The kernel of a graph that fuses into one group; `strides` override value layouts."""
    layouts = layouts_for(g)
    layouts.update(strides)
    return schedule_cuda(one_group(g), layouts)


def calls(f: Function, name: str) -> list[E.Call]:
    return [c for c in collect(f.body, E.Call) if c.name == name]


# --- a lockstep interpreter of kernel IR ------------------------------------------------------


class RaceError(AssertionError):
    """Threads of a block touched shared memory in conflict between two barriers."""


class _Shared:
    """A shared array per block, with the barrier epoch and thread of its last accesses."""

    def __init__(self, blocks: int, size: int, dtype):
        fill = np.nan if np.dtype(dtype).kind == "f" else 0x5A
        self.data = np.full((blocks, size), fill, dtype)
        self.w_epoch = np.full((blocks, size), -1)
        self.w_thread = np.full((blocks, size), -1)
        self.r_epoch = np.full((blocks, size), -1)
        self.r_thread = np.full((blocks, size), -1)

    def read(self, b, slot, t, epoch):
        for bb, ss, tt in zip(b, slot, t):
            if self.w_epoch[bb, ss] == epoch and self.w_thread[bb, ss] != tt:
                raise RaceError(f"thread {tt} reads slot {ss} thread {self.w_thread[bb, ss]} wrote")
            many = self.r_epoch[bb, ss] == epoch and self.r_thread[bb, ss] != tt
            self.r_thread[bb, ss] = -2 if many else tt
            self.r_epoch[bb, ss] = epoch
        return self.data[b, slot]

    def write(self, b, slot, t, value, epoch):
        for bb, ss, tt in zip(b, slot, t):
            for ep, th in ((self.r_epoch, self.r_thread), (self.w_epoch, self.w_thread)):
                if ep[bb, ss] == epoch and th[bb, ss] != tt:
                    raise RaceError(f"thread {tt} overwrites slot {ss} in use by {th[bb, ss]}")
            self.w_epoch[bb, ss], self.w_thread[bb, ss] = epoch, tt
        self.data[b, slot] = value


class Lockstep(Functor):
    """Runs a kernel with every thread of the grid in lockstep, one numpy lane per thread."""

    def __init__(self, grid: int, block: int, buffers: dict, sizes: dict):
        super().__init__()
        n = grid * block
        self.grid, self.block, self.n = grid, block, n
        gid = np.arange(n, dtype=np.int64)
        self.tid, self.bid = gid % block, gid // block
        self.env = {E.size_var(k): np.full(n, v, np.int64) for k, v in sizes.items()}
        self.buffers, self.shared, self.local = buffers, {}, {}
        self.lanes = np.arange(n)
        self.mask = self.current = np.ones(n, bool)
        self.epoch = 0

    def run(self, body: S.Stmt) -> None:
        with np.errstate(all="ignore"):
            self.exec(body, self.mask)

    # Expressions give arrays of one value per thread; the memo is off (values change).
    def ev(self, e: E.Expr) -> np.ndarray:
        return self._dispatch(type(e))(self, e)

    def visit_Const(self, e):
        return np.full(self.n, e.value, np_dtype(e.dtype))

    def visit_Var(self, e):
        return self.env[e]

    def visit_Cast(self, e):
        return to_dtype(self.ev(e.a), e.dtype)

    def visit_Unary(self, e):
        a = self.ev(e.a)
        return {"neg": np.negative, "not": np.logical_not, "bitnot": np.invert}[e.op](a)

    def visit_Select(self, e):
        return np.where(self.ev(e.cond), self.ev(e.a), self.ev(e.b))

    def visit_Binary(self, e):
        a, b = self.ev(e.a), self.ev(e.b)
        if e.op in ("idiv", "imod") or e.op == "div" and e.dtype.is_integer:
            b = np.where(b == 0, 1, b)  # inactive lanes may divide by zero
            q = np.fmod(a, b) if e.op == "imod" else (a - np.fmod(a, b)) // b
            return q
        fn = _BINARY[e.op]
        return fn(a, b)

    def visit_Call(self, e):
        args = [self.ev(a) for a in e.args]
        launch = {
            "thread_idx_x": self.tid,
            "block_idx_x": self.bid,
            "block_dim_x": np.full(self.n, self.block),
            "grid_dim_x": np.full(self.n, self.grid),
        }
        if e.name in launch:
            return launch[e.name].astype(np.int32)
        if e.name in ("shfl_down_sync", "shfl_xor_sync"):
            return self.shuffle(e.name, *args)
        if e.name == "is_aligned":
            return self.address(e.args[0]) % int(args[1][0]) == 0
        tensors = [torch.from_numpy(np.ascontiguousarray(a)) for a in args]
        return getattr(torch, e.name)(*tensors).numpy()

    def shuffle(self, name, v, arg):
        active = self.current.reshape(-1, WARP)
        if not np.all(active.all(1) | ~active.any(1)):
            raise AssertionError(f"{name} in a partly active warp")
        lane = np.arange(WARP)
        d = int(arg[0])
        src = np.where(lane + d < WARP, lane + d, lane) if name == "shfl_down_sync" else lane ^ d
        return v.reshape(-1, WARP)[:, src].reshape(-1)

    def address(self, first: E.Load) -> np.ndarray:
        """The byte address of a buffer element, per thread (the vector intrinsics')."""
        buf = self.buffers[first.buf.name]
        return buf.ctypes.data + self.ev(first.index) * buf.itemsize

    def vector(self, call: E.Call, m: np.ndarray) -> None:
        """load_vec / store_vec: a register array from or to a buffer, aligned as on a GPU."""
        if call.name == "load_vec":
            reg, first, lanes = call.args
        else:
            buf, index, reg, lanes = call.args
            first = E.Load(buf, index)
        buffer, lanes = self.buffers[first.buf.name], lanes.value
        align = min(16, lanes * buffer.itemsize)
        assert np.all(self.address(first)[m] % align == 0), f"misaligned {call.name}"
        span = self.ev(first.index)[m][:, None] + np.arange(lanes)
        regs = self.local[reg]
        if call.name == "load_vec":
            regs[self.lanes[m], :lanes] = buffer[span]
        else:
            buffer[span] = regs[self.lanes[m], :lanes]

    def visit_Load(self, e):
        idx = self.ev(e.index)
        m = self.current
        out = np.zeros(self.n, np_dtype(e.dtype))
        if e.buf in self.local:
            out[m] = self.local[e.buf][self.lanes[m], idx[m]]
        elif e.buf in self.shared:
            out[m] = self.shared[e.buf].read(self.bid[m], idx[m], self.tid[m], self.epoch)
        else:
            assert idx[m].min(initial=0) >= 0, "load out of bounds"
            out[m] = self.buffers[e.buf.name][idx[m]]
        return out

    # Statements run under a mask of the active threads.
    def exec(self, s: S.Stmt, m: np.ndarray) -> None:
        if not m.any():
            return
        self.current = m
        if isinstance(s, S.Seq):
            for st in s.body:
                self.exec(st, m)
        elif isinstance(s, S.Declare | S.Assign):
            init = getattr(s, "init", None) if isinstance(s, S.Declare) else s.value
            old = self.env.get(s.var, np.zeros(self.n, np_dtype(s.var.dtype)))
            if init is not None:
                self.env[s.var] = np.where(m, to_dtype(self.ev(init), s.var.dtype), old)
            else:
                self.env[s.var] = old
        elif isinstance(s, S.If):
            c = self.ev(s.cond).astype(bool)
            self.exec(s.then, m & c)
            if s.orelse is not None:
                self.exec(s.orelse, m & ~c)
        elif isinstance(s, S.For):
            extent = self.ev(s.extent)
            self.env[s.var] = np.zeros(self.n, np.int64)
            for it in range(int(extent[m].max())):
                self.env[s.var] = np.full(self.n, it, np.int64)
                self.exec(s.body, m & (it < extent))
        elif isinstance(s, S.While):
            alive = m.copy()
            while True:
                self.current = alive
                alive = alive & self.ev(s.cond).astype(bool)
                if not alive.any():
                    break
                self.exec(s.body, alive)
        elif isinstance(s, S.Store):
            self.store(s, m)
        elif isinstance(s, S.DeclareArray) and s.scope == "local":
            fill = np.nan if s.dtype.is_float else 0x5A
            self.local[s.var] = np.full((self.n, s.size), fill, np_dtype(s.dtype))
        elif isinstance(s, S.DeclareArray):
            assert s.scope == "shared"
            self.shared[s.var] = _Shared(self.grid, s.size, np_dtype(s.dtype))
        elif isinstance(s, S.Evaluate) and s.expr.name in ("load_vec", "store_vec"):
            self.vector(s.expr, m)
        elif isinstance(s, S.Evaluate):
            assert s.expr.name == "syncthreads"
            per_block = m.reshape(-1, self.block)
            if not np.all(per_block.all(1) | ~per_block.any(1)):
                raise AssertionError("a barrier some threads of a block skip")
            self.epoch += 1
        else:
            raise NotImplementedError(type(s).__name__)

    def store(self, s: S.Store, m: np.ndarray) -> None:
        idx = self.ev(s.index)[m]
        value = to_dtype(self.ev(s.value), s.buf.type.elem)[m]
        if s.buf in self.local:
            self.local[s.buf][self.lanes[m], idx] = value
            return
        if s.buf in self.shared:
            self.shared[s.buf].write(self.bid[m], idx, self.tid[m], value, self.epoch)
            return
        buf = self.buffers[s.buf.name]
        assert idx.min() >= 0 and idx.max() < buf.size, "store out of bounds"
        buf[idx] = value


_BINARY = {
    "add": np.add,
    "sub": np.subtract,
    "mul": np.multiply,
    "div": np.divide,
    "max": np.maximum,
    "min": np.minimum,
    "lt": np.less,
    "le": np.less_equal,
    "gt": np.greater,
    "ge": np.greater_equal,
    "eq": np.equal,
    "ne": np.not_equal,
    "and": np.logical_and,
    "or": np.logical_or,
}


def launch_dims(f: Function, sizes: dict) -> tuple[int, int]:
    """The grid and block sizes of `f` for these size bindings (one-dimensional launches)."""
    env = Lockstep(1, 1, {}, sizes)
    out = []
    for name in ("grid_dim", "block_dim"):
        x, y, z = getattr(f.attrs, name)
        assert (y, z) == (1, 1)
        out.append(int(x) if isinstance(x, int) else int(env.ev(x)[0]))
    return out[0], out[1]


def flat_view(t: torch.Tensor) -> np.ndarray:
    """The elements a strided tensor spans, as a flat numpy view sharing its memory."""
    span = 1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride())) if t.numel() else 0
    return torch.as_strided(t, (span,), (1,), t.storage_offset()).numpy()


def interpret(f: Function, tensors: dict, sizes: dict | None = None, grid: int | None = None):
    """Run `f` on torch tensors (bound by value name); `grid` launches fewer blocks."""
    sizes = sizes or {}
    full_grid, block = launch_dims(f, sizes)
    buffers = {
        p.name: flat_view(tensors[p.name.split("_", 1)[1]])
        for p in f.params
        if isinstance(p.type, PointerType)
    }
    Lockstep(grid or full_grid, block, buffers, sizes).run(f.body)


def _have(*modules: str) -> bool:
    try:
        return all(importlib.util.find_spec(m) is not None for m in modules)
    except ModuleNotFoundError:
        return False


_HAVE_EMU = _have("minicomp.backends.cuda.codegen", "minicomp.backends.cuda.emu")
_HAVE_NVRTC = _have("minicomp.backends.cuda.codegen", "minicomp.backends.cuda.nvrtc")


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("cuda-schedule-cache"))


def emulate(cache_dir: str):
    """A runner rendering the kernel to CUDA C and running it in the cuda-emu emulator."""
    from minicomp.backends.cuda.codegen import render_module
    from minicomp.backends.cuda.emu import build_emulated

    def run(f: Function, tensors: dict, sizes: dict | None = None, grid: int | None = None):
        sizes = sizes or {}
        full_grid, block = launch_dims(f, sizes)
        source = render_module(Module(f.name, (f,)))
        module = build_emulated(source, [f], cache_dir=cache_dir)
        args = [
            tensors[p.name.split("_", 1)[1]] if isinstance(p.type, PointerType) else sizes[p.name]
            for p in f.params
        ]
        module.launch(f.name, grid or full_grid, block, args)

    return run


@pytest.fixture(
    params=[
        "interpreter",
        pytest.param(
            "emulator",
            marks=pytest.mark.skipif(
                not _HAVE_EMU, reason="minicomp.backends.cuda.codegen/emu not available"
            ),
        ),
    ]
)
def runner(request, cache_dir):
    """Runs a kernel on torch tensors: the lockstep interpreter, or render + cuda-emu."""
    return interpret if request.param == "interpreter" else emulate(cache_dir)


# --- graphs ------------------------------------------------------------------------------


def symbolic_broadcast_add() -> Graph:
    b = GraphBuilder()
    n, m = b.symbol("n"), b.symbol("m")
    return _add_into(b, b.input("x", (n, m)), b.input("y", (1, m)), (n, m))


def _add_into(b, x, y, shape) -> Graph:
    b.output(b.compute("z", shape, lambda i, j: x[i, j] + y[0, j]))
    return b.build()


def full_sum(n) -> Graph:
    b = GraphBuilder()
    x = b.input("x", (n,))
    b.output(b.compute("s", (), lambda: reduce("sum", (n,), lambda k: x[k])))
    return b.build()


def softmax(rows, cols) -> Graph:
    b = GraphBuilder()
    x = b.input("x", (rows, cols))
    mx = b.compute("mx", (rows, 1), lambda i, j: reduce("max", (cols,), lambda k: x[i, k]))
    sm = b.compute(
        "sm",
        (rows, 1),
        lambda i, j: reduce("sum", (cols,), lambda k: E.call("exp", x[i, k] - mx[i, 0])),
    )
    out = b.compute("out", (rows, cols), lambda i, j: E.call("exp", x[i, j] - mx[i, 0]) / sm[i, 0])
    b.output(out)
    return b.build()


def symbolic_softmax(cols=None) -> Graph:
    """Softmax over n rows of m columns (a static column count when `cols` is given)."""
    b = GraphBuilder()
    n = b.symbol("n")
    m = b.symbol("m") if cols is None else cols
    x = b.input("x", (n, m))
    mx = b.compute("mx", (n, 1), lambda i, j: reduce("max", (m,), lambda k: x[i, k]))
    sm = b.compute(
        "sm", (n, 1), lambda i, j: reduce("sum", (m,), lambda k: E.call("exp", x[i, k] - mx[i, 0]))
    )
    out = b.compute("out", (n, m), lambda i, j: E.call("exp", x[i, j] - mx[i, 0]) / sm[i, 0])
    b.output(out)
    return b.build()


def row_sum_and_max(rows, cols) -> Graph:
    """Two reductions of one row stored side by side: scalar stores after a broadcast."""
    b = GraphBuilder()
    x = b.input("x", (rows, cols))
    s = b.compute("s", (rows, 1), lambda i, j: reduce("sum", (cols,), lambda k: x[i, k]))
    mx = b.compute(
        "mx", (rows, 1), lambda i, j: reduce("max", (cols,), lambda k: x[i, k] * s[i, 0])
    )
    b.output(s, mx)
    return b.build()


# --- structure -----------------------------------------------------------------------------


def test_injective_kernel_is_one_guarded_element_per_thread():
    f = schedule(scale_graph((3, 5, 37)))
    assert f.attrs.block_dim == (BLOCK, 1, 1)
    assert f.attrs.grid_dim == (math.ceil(3 * 5 * 37 / BLOCK), 1, 1)
    assert not collect(f.body, S.While) and not collect(f.body, S.For)
    (guard,) = collect(f.body, S.If)
    # The flat index unravels into the three outer variables with idiv/imod.
    ops = {b.op for b in collect(f.body, E.Binary)}
    assert {"idiv", "imod"} <= ops
    assert len(collect(f.body, S.Store)) == 1


def test_injective_kernel_of_a_whole_number_of_blocks_has_no_guard():
    f = schedule(scale_graph((BLOCK, 3)))  # 3 columns: not vectorised
    assert f.attrs.grid_dim == (3, 1, 1)
    assert not collect(f.body, S.If)


def test_one_dimensional_injective_kernel_needs_no_unravel():
    f = schedule(scale_graph((1000,)))
    assert not {"idiv", "imod"} & {b.op for b in collect(f.body, E.Binary)}


def test_launch_indices_are_widened_before_index_arithmetic():
    for f in (schedule(scale_graph((3, 700))), schedule(softmax(3, 3000))):
        launch = [c for c in collect(f.body, E.Call) if c.name.endswith("_x")]
        assert launch and all(c.dtype.name == "int32" for c in launch)
        widened = [c.a for c in collect(f.body, E.Cast) if c.dtype == i64]
        assert set(launch) <= set(widened)


def test_symbolic_injective_kernel_has_a_capped_grid_and_a_grid_stride_loop():
    f = schedule(symbolic_broadcast_add())
    assert [p.name for p in f.params] == ["in_x", "in_y", "out_z", "m", "n"]
    assert f.attrs.block_dim == (BLOCK, 1, 1)
    (loop,) = collect(f.body, S.While)
    assert calls(f, "grid_dim_x")
    for n, m in ((1, 1), (3, 37), (1000, 999), (0, 5)):
        grid, block = launch_dims(f, {"n": n, "m": m})
        assert grid == max(1, math.ceil(n * m / BLOCK)) and block == BLOCK
    grid, _ = launch_dims(f, {"n": 2**40, "m": 2**10})
    assert grid == MAX_GRID


def test_long_rows_get_a_block_each_with_a_shared_memory_reduction():
    f = schedule(softmax(6, 3000))
    assert f.attrs.block_dim == (BLOCK, 1, 1) and f.attrs.grid_dim == (6, 1, 1)
    (arr,) = collect(f.body, S.DeclareArray)
    assert arr.scope == "shared" and arr.size == WARPS
    # Two stages: two barriers each, and one between them (the array is reused).
    assert str(f).count("syncthreads()") == 5
    deltas = [c.args[1].value for c in calls(f, "shfl_down_sync")]
    assert deltas[:5] == [16, 8, 4, 2, 1] and not calls(f, "shfl_xor_sync")


def test_short_rows_get_a_warp_each_and_no_shared_memory():
    f = schedule(softmax(37, 37))
    assert f.attrs.block_dim == (BLOCK, 1, 1)
    assert f.attrs.grid_dim == (math.ceil(37 / WARPS), 1, 1)
    assert not collect(f.body, S.DeclareArray) and not calls(f, "syncthreads")
    deltas = [c.args[1].value for c in calls(f, "shfl_xor_sync")]
    assert deltas == [16, 8, 4, 2, 1] * 2 and not calls(f, "shfl_down_sync")


def test_few_short_rows_use_a_smaller_block():
    f = schedule(row_reduce("sum", rows=3, cols=100))
    assert f.attrs.block_dim == (3 * WARP, 1, 1) and f.attrs.grid_dim == (1, 1, 1)


def test_symbolic_rows_loop_over_a_capped_grid():
    f = schedule(symbolic_softmax())
    assert [p.name for p in f.params] == ["in_x", "out_out", "m", "n"]
    assert calls(f, "syncthreads") and calls(f, "shfl_down_sync")
    assert launch_dims(f, {"n": 7, "m": 5}) == (7, BLOCK)
    assert launch_dims(f, {"n": 0, "m": 5}) == (1, BLOCK)
    g = schedule(symbolic_softmax(cols=37))
    assert calls(g, "shfl_xor_sync") and not calls(g, "syncthreads")
    assert launch_dims(g, {"n": 17}) == (3, BLOCK)


def test_argmax_shuffles_values_and_indices():
    for cols in (300, 3000):
        f = schedule(row_reduce("argmax", rows=5, cols=cols))
        name = "shfl_xor_sync" if cols < 1024 else "shfl_down_sync"
        types = {c.dtype.name for c in calls(f, name)}
        assert types == {"float32", "int64"}
    shared = {a.dtype.name for a in collect(f.body, S.DeclareArray)}
    assert shared == {"float32", "int64"}


def test_bool_reductions_shuffle_as_int32():
    from minicomp.ir.types import boolean

    f = schedule(row_reduce("any", rows=4, cols=100, dtype=boolean))
    assert {c.dtype.name for c in calls(f, "shfl_xor_sync")} == {"int32"}


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


# --- numerics (interpreter and emulator) -----------------------------


def test_interpreter_catches_a_missing_barrier():
    f = schedule(softmax(2, 3000))
    (sync,) = collect(f.body, S.Evaluate)
    # Dropping the barrier after the first broadcast read lets the next stage overwrite it.
    broken = f.replace(body=_drop(f.body, sync, 2))
    x = torch.randn(2, 3000)
    with pytest.raises(RaceError):
        interpret(broken, {"x": x, "out": poisoned((2, 3000))})


def _drop(s: S.Stmt, victim: S.Stmt, k: int) -> S.Stmt:
    """`s` without occurrence `k` (from 0) of statement `victim`."""
    seen, done = [], []

    def walk(st):
        if isinstance(st, S.Seq):
            kept = []
            for x in st.body:
                if x == victim:
                    seen.append(x)
                    if len(seen) == k + 1:
                        done.append(x)
                        continue
                kept.append(walk(x))
            return S.Seq(tuple(kept))
        if isinstance(st, (S.If, S.While, S.For)):
            changes = {"then": walk(st.then)} if isinstance(st, S.If) else {"body": walk(st.body)}
            if isinstance(st, S.If) and st.orelse is not None:
                changes["orelse"] = walk(st.orelse)
            return st.replace(**changes)
        return st

    out = walk(s)
    assert done
    return out


@pytest.mark.parametrize("cols", [37, 3000])
def test_softmax_rows(cols, runner):
    f = schedule(softmax(5, cols))
    x = torch.randn(5, cols) * 4
    out = poisoned((5, cols))
    runner(f, {"x": x, "out": out})
    torch.testing.assert_close(out, torch.softmax(x, dim=1))


@pytest.mark.parametrize("cols", [None, 37])
def test_symbolic_softmax_with_a_short_grid(cols, runner):
    f = schedule(symbolic_softmax(cols))
    for rows, m in ((3, 37), (11, 1500), (9, 1)):
        if cols is not None and m != cols:
            continue
        sizes = {"n": rows} if cols is not None else {"n": rows, "m": m}
        x = torch.randn(rows, m) * 3
        for grid in (None, 2):
            out = poisoned((rows, m))
            runner(f, {"x": x, "out": out}, sizes, grid=grid)
            torch.testing.assert_close(out, torch.softmax(x, dim=1))


def test_full_sum_of_100003_elements(runner):
    f = schedule(full_sum(100003))
    assert f.attrs.grid_dim == (1, 1, 1) and f.attrs.block_dim == (BLOCK, 1, 1)
    x = torch.rand(100003) - 0.25
    out = poisoned(())
    runner(f, {"x": x, "s": out})
    torch.testing.assert_close(out, x.double().sum().float(), rtol=1e-5, atol=1e-3)


def test_full_sum_over_two_flattened_dims(runner):
    f = schedule(full_2d_sum(300, 337))
    x = torch.rand(300, 337)
    out = poisoned((1, 1))
    runner(f, {"x": x, "s": out})
    torch.testing.assert_close(out, x.double().sum().float().reshape(1, 1), rtol=1e-5, atol=1e-3)


def argmax_input(kind, rows, cols) -> torch.Tensor:
    x = torch.randint(-3, 4, (rows, cols)).float()  # many ties
    x[1, 17] = float("nan")
    x[1, cols - 100] = float("nan")
    x[2, :] = 7.0
    x[3, 0] = float("nan")
    x[4, :] = float("-inf") if kind == "argmax" else float("inf")
    x[4, cols - 50] = 0.0
    x[5, :] = float("-inf") if kind == "argmax" else float("inf")
    x[6, cols - 1] = float("nan")
    return x


@pytest.mark.parametrize("kind", ["argmax", "argmin"])
@pytest.mark.parametrize("cols", [300, 3000])
def test_argmax_with_ties_and_nan(kind, cols, runner):
    rows = 7
    x = argmax_input(kind, rows, cols)
    f = schedule(row_reduce(kind, rows=rows, cols=cols))
    out = poisoned((rows, 1), torch.int64)
    runner(f, {"x": x, "s": out})
    assert out.view(-1).tolist() == getattr(torch, kind)(x, dim=1).tolist()


def int_argmax_input(kind, rows, cols, dtype) -> torch.Tensor:
    """Integers with many ties, and rows at the dtype's extremes (max's and min's identities),
    where the first best index is not 0."""
    info = torch.iinfo(dtype)
    best, worst = (info.max, info.min) if kind == "argmax" else (info.min, info.max)
    x = torch.randint(-3, 4, (rows, cols), dtype=dtype)
    x[1, :] = worst  # all equal to the identity: index 0
    x[2, :] = best
    x[3, :] = worst
    x[3, cols - 40] = x[3, cols - 3] = best  # the extreme twice, late in the row
    x[4, :] = 0
    x[4, 70] = x[4, cols - 1] = best
    x[5, :] = worst
    x[5, cols - 1] = worst + (1 if kind == "argmax" else -1)
    x[6, 33] = 9 if kind == "argmax" else -9
    return x


@pytest.mark.parametrize("kind", ["argmax", "argmin"])
@pytest.mark.parametrize("cols", [300, 3000])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_integer_argmax_with_ties_and_extremes(kind, cols, dtype, runner):
    # An int64 argmax's value and index are both int64: they must not share a shared array.
    rows = 7
    x = int_argmax_input(kind, rows, cols, dtype)
    f = schedule(row_reduce(kind, rows=rows, cols=cols, dtype=T.from_torch(dtype)))
    out = poisoned((rows, 1), torch.int64)
    runner(f, {"x": x, "s": out})
    assert out.view(-1).tolist() == getattr(torch, kind)(x, dim=1).tolist()


def test_int64_argmax_keeps_values_and_indices_in_separate_shared_arrays():
    f = schedule(row_reduce("argmax", rows=5, cols=3000, dtype=T.i64))
    arrays = collect(f.body, S.DeclareArray)
    assert [a.dtype.name for a in arrays] == ["int64", "int64"]
    assert len({a.var.name for a in arrays}) == 2


@pytest.mark.parametrize("kind", ["max", "min"])
def test_max_and_min_propagate_nan(kind, runner):
    for cols in (100, 2000):
        x = torch.randn(4, cols)
        x[1, 7] = float("nan")
        x[3, cols - 1] = float("nan")
        f = schedule(row_reduce(kind, rows=4, cols=cols))
        out = poisoned((4, 1))
        runner(f, {"x": x, "s": out})
        expected = getattr(torch, f"a{kind}")(x, dim=1, keepdim=True)
        torch.testing.assert_close(out, expected, equal_nan=True, rtol=0, atol=0)


@pytest.mark.parametrize("cols", [50, 1024])
def test_two_outputs_per_row(cols, runner):
    f = schedule(row_sum_and_max(6, cols))
    x = torch.rand(6, cols)
    s, mx = poisoned((6, 1)), poisoned((6, 1))
    runner(f, {"x": x, "s": s, "mx": mx})
    ref_s = x.sum(dim=1, keepdim=True)
    torch.testing.assert_close(s, ref_s)
    torch.testing.assert_close(mx, (x * s).amax(dim=1, keepdim=True))


def test_broadcast_add_over_a_permuted_input_with_symbolic_sizes(runner):
    f = schedule(symbolic_broadcast_add(), x=(1, E.size_var("n")))
    for n, m in ((4, 8), (37, 29), (300, 5)):
        x = torch.randn(m, n).t()
        y = torch.randn(1, m)
        for grid in (None, 1):
            out = poisoned((n, m))
            runner(f, {"x": x, "y": y, "z": out}, {"n": n, "m": m}, grid=grid)
            torch.testing.assert_close(out, x + y, rtol=0, atol=0)


def test_injective_kernel_with_unit_dims(runner):
    f = schedule(scale_graph((3, 1, 300)))
    x = torch.randn(3, 1, 300)
    out = poisoned((3, 1, 300))
    runner(f, {"x": x, "y": out})
    torch.testing.assert_close(out, x * 2 + 1)


def test_vectorised_broadcast_add_over_misaligned_views(runner):
    f = schedule(symbolic_rows_broadcast_add(64))
    assert calls(f, "load_vec") and calls(f, "store_vec")
    for n, offset, grid in ((37, 0, None), (37, 1, None), (300, 2, 1)):
        x = torch.randn(n * 64 + offset)[offset:].view(n, 64)
        y = torch.randn(1, 64)
        out = poisoned((n, 64))
        runner(f, {"x": x, "y": y, "z": out}, {"n": n}, grid=grid)
        torch.testing.assert_close(out, x + y, rtol=0, atol=0)


def symbolic_rows_broadcast_add(cols: int) -> Graph:
    b = GraphBuilder()
    n = b.symbol("n")
    return _add_into(b, b.input("x", (n, cols)), b.input("y", (1, cols)), (n, cols))


def column_reduce(kind, rows, cols, dtype=T.f32) -> Graph:
    """A reduction over dim 0 of a row-major (rows, cols): lanes along the columns."""
    b = GraphBuilder()
    x = b.input("x", (rows, cols), dtype)
    b.output(b.compute("s", (1, cols), lambda i, j: reduce(kind, (rows,), lambda r: x[r, j])))
    return b.build()


def column_softmax(rows, cols) -> Graph:
    """Softmax over dim 0: two column stages, then a store over the reduced axis."""
    b = GraphBuilder()
    x = b.input("x", (rows, cols))
    mx = b.compute("mx", (1, cols), lambda i, j: reduce("max", (rows,), lambda r: x[r, j]))
    sm = b.compute(
        "sm",
        (1, cols),
        lambda i, j: reduce("sum", (rows,), lambda r: E.call("exp", x[r, j] - mx[0, j])),
    )
    out = b.compute("out", (rows, cols), lambda i, j: E.call("exp", x[i, j] - mx[0, j]) / sm[0, j])
    b.output(out)
    return b.build()


# (rows, cols): few lanes and many slices (a butterfly, then shared memory), 32 or more lanes
# (shared memory only), one slice, a partial last tile, scalar columns.
COLUMN_SHAPES = [(3000, 40), (8, 4096), (2, 1024), (300, 200), (100, 37)]


@pytest.mark.parametrize("shape", COLUMN_SHAPES, ids=str)
@pytest.mark.parametrize("kind", ["sum", "max", "argmax", "argmin"])
def test_column_reductions(kind, shape, runner):
    rows, cols = shape
    f = schedule(column_reduce(kind, rows, cols))
    assert {"tx", "ty"} <= {v.name for v in collect(f.body, E.Var)}
    if kind == "sum":
        x = torch.rand(rows, cols) - 0.25
    elif rows > 100 and cols >= 7:  # ties, NaN and infinities along each column
        x = argmax_input(kind, cols, rows).t().contiguous()
    else:
        x = torch.randint(-3, 4, (rows, cols)).float()
    out = poisoned((1, cols), torch.int64 if kind.startswith("arg") else torch.float32)
    runner(f, {"x": x, "s": out})
    if kind.startswith("arg"):
        assert out.view(-1).tolist() == getattr(torch, kind)(x, dim=0).tolist()
    elif kind == "max":
        expected = x.amax(dim=0, keepdim=True)
        torch.testing.assert_close(out, expected, equal_nan=True, rtol=0, atol=0)
    else:
        torch.testing.assert_close(out, x.double().sum(0, keepdim=True).float())


@pytest.mark.parametrize("shape", [(3000, 40), (37, 1000)], ids=str)
def test_column_softmax(shape, runner):
    f = schedule(column_softmax(*shape))
    x = torch.randn(*shape) * 4
    out = poisoned(shape)
    runner(f, {"x": x, "out": out})
    # Eager's float32 softmax over 3000 rows is itself 1e-5 off; the kernel's is closer.
    torch.testing.assert_close(out, torch.softmax(x.double(), dim=0).float())


def test_column_reduction_over_a_misaligned_view(runner):
    f = schedule(column_reduce("sum", 300, 64))
    assert calls(f, "load_vec")
    x = torch.rand(300 * 64 + 1)[1:].view(300, 64)
    out = poisoned((1, 64))
    runner(f, {"x": x, "s": out})
    torch.testing.assert_close(out, x.double().sum(0, keepdim=True).float())


# --- NVRTC ---------------------------------------------------------------------------------


def every_test_kernel() -> list[Function]:
    """One kernel of each shape the tests above schedule, under distinct names."""
    from minicomp.ir.types import boolean

    permuted = schedule(symbolic_broadcast_add(), x=(1, E.size_var("n")))
    kernels = [
        schedule(scale_graph((3, 5, 37))),
        schedule(scale_graph((4, BLOCK))),
        schedule(scale_graph((BLOCK, 3))),
        schedule(symbolic_rows_broadcast_add(64)),
        schedule(scale_graph((3, 1, 300))),
        permuted,
        schedule(softmax(5, 37)),
        schedule(softmax(5, 3000)),
        schedule(symbolic_softmax()),
        schedule(symbolic_softmax(cols=37)),
        schedule(full_sum(100003)),
        schedule(full_2d_sum(300, 337)),
        schedule(row_sum_and_max(6, 50)),
        schedule(row_sum_and_max(6, 1024)),
        schedule(row_reduce("any", rows=4, cols=100, dtype=boolean)),
        schedule(row_reduce("all", rows=4, cols=3000, dtype=boolean)),
    ]
    for kind in ("argmax", "argmin", "max", "min"):
        kernels += [schedule(row_reduce(kind, rows=7, cols=c)) for c in (300, 3000)]
    for kind in ("argmax", "argmin"):
        kernels += [schedule(row_reduce(kind, rows=7, cols=c, dtype=T.i64)) for c in (300, 3000)]
    for kind in ("sum", "argmax"):
        kernels += [schedule(column_reduce(kind, *shape)) for shape in COLUMN_SHAPES]
    kernels += [schedule(column_reduce("argmax", 300, 40, T.i64)), schedule(column_softmax(37, 40))]
    return [f.replace(name=f"kernel{k}") for k, f in enumerate(kernels)]


@pytest.mark.skipif(not _HAVE_NVRTC, reason="minicomp.backends.cuda.nvrtc not available")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_every_kernel_compiles_with_nvrtc_without_spills(arch, cache_dir):
    from minicomp.backends.cuda.codegen import render_module
    from minicomp.backends.cuda.nvrtc import NvrtcUnavailableError, compile_cuda

    kernels = every_test_kernel()
    source = render_module(Module("cuda_schedule_tests", tuple(kernels)))
    try:
        binary = compile_cuda(source, arch=arch, cache_dir=cache_dir)
    except NvrtcUnavailableError as e:
        pytest.skip(f"NVRTC is not available: {e}")
    assert set(binary.resources) == {f.name for f in kernels}
    for name, res in binary.resources.items():
        assert (res.spill_stores, res.spill_loads) == (0, 0), name


@pytest.mark.parametrize("kind", ["any", "all"])
@pytest.mark.parametrize("cols", [16, 2000])
def test_any_and_all_shuffle_in_every_lane(kind, cols, runner):
    # any/all combine with || and &&: a lane whose answer is already known must still take
    # part in every shuffle, or the warp diverges (a deadlock in the emulator, UB on a GPU).
    from minicomp.ir.types import boolean

    x = torch.rand(5, cols) > 0.5
    x[0] = True
    x[1] = False
    x[2, 3] = not x[2, 4]
    f = schedule(row_reduce(kind, rows=5, cols=cols, dtype=boolean))
    out = torch.full((5, 1), kind == "any")
    out[:] = not out[0, 0]  # poison: the opposite of what a row of the identity gives
    runner(f, {"x": x, "s": out})
    expected = getattr(torch, kind)(x, dim=1, keepdim=True)
    assert out.tolist() == expected.tolist()
