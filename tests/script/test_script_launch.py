"""Launching script kernels: the decorator's forms, runtime sizes bound from tensors, target
choice, one build per kernel, raw pointers, and the IR, module and CUDA source it exposes."""

import math

import pytest
import torch

import minicomp
import minicomp.script as ms
from minicomp.ir.functor import collect
from minicomp.ir.stmt import If
from minicomp.script import attrs, blockIdx, dim, f32, i32, i64, ptr, threadIdx
from minicomp.script.function import ScriptFunction
from minicomp.targets import script_target


@ms
def scale_rows(
    x: f32[dim.rows, dim.cols], out: f32[dim.rows, dim.cols], rows: i64, cols: i32, s: f32
):
    attrs.grid_dim = rows
    attrs.block_dim = 64
    r = blockIdx.x
    c = threadIdx.x
    while c < cols:
        out[r, c] = x[r, c] * s
        c += 64


def test_package_is_the_decorator():
    assert isinstance(scale_rows, ScriptFunction) and scale_rows.kind == "kernel"
    assert minicomp.script is ms and "script" in minicomp.__all__
    namespace = {}
    exec("from minicomp.script import *", namespace)
    for name in ("f32", "threadIdx", "syncthreads", "spatial", "exp", "max", "attrs", "ptr"):
        assert name in namespace
    assert namespace["max"](2, 3) == 3  # still Python's max outside scripts


def test_sizes_bind_from_tensors_or_arguments(script_target):
    x = torch.randn(5, 100)
    for call in (
        lambda out: scale_rows.with_target(script_target)(x, out, s=2.0),
        lambda out: scale_rows.with_target(script_target)(x, out, 5, 100, 2.0),
        lambda out: scale_rows.with_target(script_target)(out=out, x=x, s=2.0, cols=100),
    ):
        out = torch.full((5, 100), math.nan)
        call(out)
        assert torch.equal(out, x * 2)


def test_one_build_per_kernel_and_target():
    x = torch.randn(3, 10)
    kernel = ms(scale_rows.fn, target="cuda-emu")
    kernel(x, torch.empty_like(x), s=1.0)
    (built,) = kernel._state.builds.values()
    kernel.with_target("cuda-emu")(x, torch.empty_like(x), s=3.0)
    assert list(kernel._state.builds.values()) == [built]


def test_empty_grid_launches_nothing():
    x = torch.randn(0, 8)
    scale_rows.with_target("cuda-emu")(x, torch.empty_like(x), s=1.0)


def _script_target(requested, device):
    return script_target(requested, device, minicomp.config.resolve()).name


def test_script_target():
    assert _script_target(None, torch.device("cpu")) == "cuda-emu"
    assert _script_target("cuda-emu", None) == "cuda-emu"
    with minicomp.config.patch(target="cuda"):
        assert _script_target(None, torch.device("cpu")) == "cuda"
    with minicomp.config.patch(target="cpu"):
        assert _script_target(None, torch.device("cpu")) == "cuda-emu"


@pytest.mark.parametrize("name, message", [("cpu", "cuda or cuda-emu"), ("tpu", "unknown target")])
def test_a_kernel_on_a_target_without_script_kernels_is_refused(name, message):
    x = torch.randn(4, 8)
    with pytest.raises(ValueError, match=message):
        scale_rows.with_target(name)(x, torch.empty_like(x), s=1.0)


def test_ir_module_and_source():
    f = scale_rows.ir
    assert f.kind == "kernel" and f.name == "scale_rows"
    # Pointers first, then the scalars, as the runtime's launchers expect.
    assert [p.name for p in f.params] == ["x", "out", "rows", "cols", "s"]
    assert f.attrs.block_dim == (64, 1, 1) and f.attrs.grid_dim[1:] == (1, 1)
    assert scale_rows.module.functions == (f,)
    assert 'extern "C" __global__ __launch_bounds__(64) void scale_rows(' in scale_rows.source


def make_doubler(width):
    """`width` appears only in annotations, so it is not in the kernel's closure."""

    @ms
    def doubler(x: f32[width], out: f32[width]):
        attrs.grid_dim = 1
        attrs.block_dim = 32
        t = threadIdx.x
        if t < 8:
            out[t] = x[t] * 2.0

    return doubler


def test_annotation_only_closure_names(script_target):
    kernel = make_doubler(8).with_target(script_target)
    x = torch.randn(8)
    out = torch.full((8,), math.nan)
    kernel(x, out)
    assert torch.equal(out, x * 2)
    with pytest.raises(ms.ScriptError, match="dimension 0 is 9"):
        kernel(torch.randn(9), out)


@ms
def through_pointer(src: ptr(f32), dst: ptr(f32), n: i32):
    attrs.grid_dim = 1
    attrs.block_dim = 32
    t = threadIdx.x
    if t < n:
        dst[t] = src[t] + 1.0


def test_raw_pointers(script_target):
    src = torch.randn(20)
    dst = torch.full((20,), math.nan)
    through_pointer.with_target(script_target)(src, dst, 20)
    assert torch.equal(dst, src + 1)
    if script_target == "cuda-emu":
        dst.fill_(math.nan)
        through_pointer.with_target(script_target)(src.data_ptr(), dst, 10)
        assert torch.equal(dst[:10], src[:10] + 1) and dst[10:].isnan().all()


def make_offset(delta):
    @ms
    def offset(v: f32) -> f32:
        return v + delta

    return offset


ADD_ONE, ADD_TEN = make_offset(1.0), make_offset(10.0)


@ms
def two_instances(x: f32[32], out: f32[32]):
    attrs.grid_dim = 1
    attrs.block_dim = 32
    t = threadIdx.x
    out[t] = ADD_ONE(x[t]) * ADD_TEN(x[t])


def test_template_instances_get_distinct_names(script_target):
    x = torch.randn(32)
    out = torch.full((32,), math.nan)
    two_instances.with_target(script_target)(x, out)
    torch.testing.assert_close(out, (x + 1) * (x + 10))
    names = [f.name for f in two_instances.module.functions]
    assert len(set(names)) == 3 and names[-1] == "two_instances"


def test_exact_mapping_flag():
    @ms
    def k(out: f32[64]):
        attrs.grid_dim = 1
        attrs.block_dim = 64
        t = 63 - threadIdx.x
        for (i,) in ms.spatial(64).on(t):
            out[i] = 1.0
        for (i,) in ms.spatial(64).on(t, exact=True):
            out[i] = 2.0

    # The first loop's worker is not a thread index: it is guarded; the second is told exact.
    assert len(collect(k.ir.body, If)) == 1


@ms
def quoted(x: f32["n", 2], out: f32["n"], n: i32):  # noqa: F821 - sizes as strings
    attrs.grid_dim = 1
    attrs.block_dim = 64
    t = threadIdx.x
    if t < n:
        out[t] = x[t, 0] - x[t, 1]


def test_sizes_as_strings(script_target):
    x = torch.randn(30, 2)
    out = torch.full((30,), math.nan)
    quoted.with_target(script_target)(x, out)
    assert torch.equal(out, x[:, 0] - x[:, 1])
