"""Launch limits of script kernels: attrs.launch_bounds against the launched block, and the
dynamic shared memory a launch asks for (large sizes included)."""

import pytest
import torch

import minicomp
from minicomp.script import (
    ScriptError,
    attrs,
    dim,
    dynamic_shared_tensor,
    f32,
    i32,
    syncthreads,
    threadIdx,
)

BIG = 16384  # floats: 64 KiB of dynamic shared memory, over the 48 KiB without opting in


@minicomp.script
def bounded_add_one(x: f32[dim.n], n: i32, threads: i32):
    attrs.grid_dim = 1
    attrs.block_dim = threads
    attrs.launch_bounds = 128
    i = threadIdx.x
    while i < n:
        x[i] += 1.0
        i += threads


def test_launch_bounds_limit_the_block(script_target):
    assert "__global__ __launch_bounds__(128) void bounded_add_one(" in bounded_add_one.source
    kernel = bounded_add_one.with_target(script_target)
    x = torch.randn(300)
    expected = x + 1
    kernel(x, threads=96)
    assert torch.equal(x, expected)
    with pytest.raises(ScriptError, match=r"bounded_add_one .*256 threads.*launch_bounds \(128\)"):
        kernel(x, threads=256)
    assert torch.equal(x, expected)  # nothing ran


@minicomp.script
def one_block_per_sm(x: f32[256]):
    attrs.grid_dim = 1
    attrs.block_dim = 256
    attrs.min_blocks = 1
    x[threadIdx.x] *= 2.0


def test_min_blocks_is_the_second_launch_bound(script_target):
    assert "__global__ __launch_bounds__(256, 1) void one_block_per_sm(" in one_block_per_sm.source
    x = torch.randn(256)
    expected = x * 2
    one_block_per_sm.with_target(script_target)(x)
    assert torch.equal(x, expected)


def test_min_blocks_needs_a_known_thread_count():
    with pytest.raises(ScriptError, match="min_blocks needs a constant attrs.block_dim"):

        @minicomp.script
        def runtime_block(x: f32[dim.n], n: i32):
            attrs.grid_dim = 1
            attrs.block_dim = n
            attrs.min_blocks = 2
            x[threadIdx.x] = 0.0

        assert runtime_block.ir is None  # compiling raises first

    with pytest.raises(
        ScriptError, match=r"launch_limits.py:\d+: attrs.min_blocks is 1 to 32, not 0"
    ):

        @minicomp.script
        def no_blocks(x: f32[4]):
            attrs.grid_dim = 1
            attrs.block_dim = 4
            attrs.min_blocks = 0
            x[threadIdx.x] = 0.0

        assert no_blocks.ir is None


@minicomp.script
def big_reverse(x: f32[BIG], out: f32[BIG]):
    attrs.grid_dim = 1
    attrs.block_dim = 256
    buf = dynamic_shared_tensor(f32, BIG)
    for k in range(BIG // 256):
        buf[k * 256 + threadIdx.x] = x[k * 256 + threadIdx.x]
    syncthreads()
    for k in range(BIG // 256):
        out[k * 256 + threadIdx.x] = buf[BIG - 1 - k * 256 - threadIdx.x]


def test_dynamic_shared_memory_over_48_kib(script_target):
    assert big_reverse.ir.attrs.dynamic_smem == BIG * 4
    x, out = torch.randn(BIG), torch.full((BIG,), float("nan"))
    big_reverse.with_target(script_target)(x, out)
    assert torch.equal(out, x.flip(0))


@minicomp.script
def asks_too_much(x: f32[4]):
    attrs.grid_dim = 1
    attrs.block_dim = 4
    attrs.dynamic_smem = 228 * 1024
    buf = dynamic_shared_tensor(f32, 4)
    buf[threadIdx.x] = x[threadIdx.x]
    x[threadIdx.x] = buf[3 - threadIdx.x]


def test_too_much_dynamic_shared_memory_is_refused(script_target):
    with pytest.raises(ScriptError, match=rf"asks_too_much .*{228 * 1024} bytes of dynamic"):
        asks_too_much.with_target(script_target)(torch.randn(4))
