"""Template hooks: macros expanded at parse time, IR expressions from scope, extra IR params."""

import pytest
import torch

from minicomp.backends.cuda.codegen import render_module
from minicomp.backends.cuda.emu import build_emulated
from minicomp.ir import expr as E
from minicomp.ir import stmt as S
from minicomp.ir import types as T
from minicomp.ir.symbols import launch_dims
from minicomp.script import ScriptError, attrs, blockIdx, f32, script, threadIdx
from minicomp.script.lang import macro


def _fused_kernel(scale: float):
    """A kernel whose load and store are macros over buffers it gets as extra params, the way
    a template computes a fused prologue and epilogue."""
    x = E.Var("in_x", T.PointerType(T.f32))
    bias = E.Var("in_bias", T.PointerType(T.f32))
    y = E.Var("out_y", T.PointerType(T.f32))
    n = E.Var("n", T.i64)

    @macro
    def load(i):
        return E.Load(x, E.cast(i, T.i64)) * scale

    @macro
    def store(i, value):
        return S.Store(y, E.cast(i, T.i64), value + E.Load(bias, E.cast(i, T.i64) % 4))

    size = n

    @script(params=(x, bias, y, n))
    def fused():
        attrs.grid_dim = (size + 31) // 32
        attrs.block_dim = 32
        i = blockIdx.x * 32 + threadIdx.x
        if i < size:
            store(i, load(i))

    return fused


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("macro-kernels"))


def test_macros_compute_at_the_loads_and_stores(cache_dir):
    kernel = _fused_kernel(3.0)
    assert [p.name for p in kernel.ir.params] == ["in_x", "in_bias", "out_y", "n"]
    emu = build_emulated(render_module(kernel.module), [kernel.ir], cache_dir=cache_dir)
    x, bias = torch.randn(70), torch.randn(4)
    y = torch.full((70,), float("nan"))
    args = (x.data_ptr(), bias.data_ptr(), y.data_ptr(), 70)
    grid, block = launch_dims(kernel.ir)(args)
    assert grid == (3, 1, 1) and block == (32, 1, 1)
    emu.launch("fused", grid, block, args)
    torch.testing.assert_close(y, x * 3.0 + bias.repeat(18)[:70])


def test_a_macro_must_return_ir():
    @macro
    def bad(i):
        return "text"

    @script
    def k(out: f32[4]):
        attrs.grid_dim = 1
        attrs.block_dim = 4
        out[threadIdx.x] = bad(threadIdx.x)

    with pytest.raises(ScriptError, match=r"macro bad\(\) returned 'text'") as info:
        _ = k.ir
    assert info.value.lineno == k.fn.__code__.co_firstlineno + 4


def test_a_raw_pointer_from_scope_is_refused():
    buf = E.Var("buf", T.PointerType(T.f32))

    @script(params=(buf,))
    def k(out: f32[4]):
        attrs.grid_dim = 1
        attrs.block_dim = 4
        out[threadIdx.x] = buf[threadIdx.x]

    with pytest.raises(ScriptError, match="'buf' is a pointer variable"):
        _ = k.ir
