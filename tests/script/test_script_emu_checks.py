"""Checked emulation (the emu_checks option): a script kernel that reads or writes outside its
tensors fails with an error naming the kernel, the tensor, the index and the thread, and the
process goes on; a correct kernel computes the same with checks on and off."""

import pytest
import torch

import minicomp
from minicomp.backends.cuda.emu import OutOfBoundsError
from minicomp.script import attrs, blockIdx, dim, f32, i32, shared_tensor, syncthreads, threadIdx


@minicomp.script(target="cuda-emu")
def fill_one_too_many(out: f32[dim.n], n: i32):
    attrs.grid_dim = (n + 63) // 64
    attrs.block_dim = 64
    i = blockIdx.x * 64 + threadIdx.x
    if i <= n:  # the bug: one element too many
        out[i] = 1.0


@minicomp.script(target="cuda-emu")
def difference(x: f32[dim.n], out: f32[dim.n], n: i32):
    attrs.grid_dim = (n + 63) // 64
    attrs.block_dim = 64
    i = blockIdx.x * 64 + threadIdx.x
    if i < n:
        out[i] = x[i] - x[i - 1]  # the bug: x[-1] at i = 0


@minicomp.script(target="cuda-emu")
def block_sums(x: f32[dim.rows, 64], out: f32[dim.rows], rows: i32):
    attrs.grid_dim = rows
    attrs.block_dim = 64
    partial = shared_tensor(f32, 64)
    t = threadIdx.x
    partial[t] = x[blockIdx.x, t]
    syncthreads()
    k = 32
    while k > 0:
        if t < k:
            partial[t] += partial[t + k]
        syncthreads()
        k //= 2
    if t == 0:
        out[blockIdx.x] = partial[0]


def test_a_write_past_the_end_names_kernel_tensor_index_and_thread():
    out = torch.zeros(100)
    with minicomp.config.patch(emu_checks=True), pytest.raises(OutOfBoundsError) as info:
        fill_one_too_many(out)
    error = info.value
    assert (error.kernel, error.tensor, error.index, error.write) == (
        "fill_one_too_many",
        "out",
        100,
        True,
    )
    assert (error.thread, error.block) == ((36, 0, 0), (1, 0, 0))
    assert "writes out[100], out of bounds: out has 100 elements" in str(error)
    assert "thread (36, 0, 0) of block (1, 0, 0)" in str(error)


def test_a_read_before_the_start_is_caught_and_the_process_goes_on():
    x = torch.arange(100.0)
    out = torch.zeros(100)
    with minicomp.config.patch(emu_checks=True):
        with pytest.raises(
            OutOfBoundsError,
            match=r"thread \(0, 0, 0\) of block \(0, 0, 0\) "
            r"reads x\[-1\], out of bounds",
        ) as info:
            difference(x, out)
        assert (info.value.tensor, info.value.index, info.value.write) == ("x", -1, False)
        # The failed launch left the process whole: the next kernel builds and runs.
        rows = torch.randn(3, 64)
        sums = torch.zeros(3)
        block_sums(rows, sums)
    torch.testing.assert_close(sums, rows.sum(1))


def test_a_correct_kernel_computes_the_same_with_checks_on_and_off():
    x = torch.randn(50, 64)
    results = []
    for checks in (False, True):
        out = torch.full((50,), float("nan"))
        with minicomp.config.patch(emu_checks=checks):
            block_sums(x, out)
        results.append(out)
    assert torch.equal(results[0], results[1])
    torch.testing.assert_close(results[1], x.sum(1))
