"""Blocks that finish their work together: `threadfence()`, an atomic count, and the memory a
kernel's launcher provides (`attrs.scratch`, `attrs.block_group`), as matmul_tc's in-kernel
split-K uses them. The last block of a group to arrive adds the others' parts, in a fixed
order, without waiting for any block: the emulator may run the blocks one after another."""

import pytest
import torch

import minicomp
from minicomp.ir import stmt as S
from minicomp.ir.expr import Call
from minicomp.ir.func import Function, LaunchAttrs
from minicomp.ir.functor import collect
from minicomp.ir.printer import function_str
from minicomp.ir.scratch import Scratch, scratch_of, scratch_tensors
from minicomp.script import (
    ScriptError,
    atomic_add,
    attrs,
    blockIdx,
    f32,
    i32,
    shared_tensor,
    syncthreads,
    threadfence,
    threadIdx,
)
from minicomp.script.text import parse_function

GROUP = 4  # blocks a group: each sums 32 elements, the last one the group's 4 parts


@minicomp.script
def group_sums(x: f32[1024], parts: f32[1024], count: i32[8], out: f32[8]):
    attrs.grid_dim = 32
    attrs.block_dim = 32
    attrs.scratch = (("parts", 1024, False), ("count", 8, True))
    attrs.block_group = GROUP
    t = threadIdx.x
    b = blockIdx.x
    group = b // GROUP
    parts[b * 32 + t] = x[b * 32 + t] * 2.0
    threadfence()  # the part is seen before the count says so
    syncthreads()
    arrived = shared_tensor(i32, 1)
    if t == 0:
        arrived[0] = atomic_add(count[group], 1)
    syncthreads()
    if arrived[0] == GROUP - 1:
        threadfence()
        if t == 0:
            total: f32 = 0.0
            for k in range(GROUP * 32):  # every part in order, whichever block is last
                total += parts[group * GROUP * 32 + k]
            out[group] = total
            count[group] = 0  # ready for the next launch


def test_the_last_block_of_each_group_adds_the_parts_and_resets_the_count(script_target):
    kernel = group_sums.with_target(script_target)
    x = torch.randn(1024)
    parts = torch.empty(1024)
    count = torch.zeros(8, dtype=torch.int32)
    out = torch.empty(8)
    kernel(x, parts, count, out)
    expected = (2 * x).view(8, 128).sum(1)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)
    assert not count.any()
    first = out.clone()
    kernel(x, parts, count, out)  # the counts are zero again: a second launch runs the same
    assert torch.equal(out, first) and not count.any()


def test_threadfence_is_cudas():
    source = group_sums.source
    assert source.count("__threadfence();") == 2
    assert "threadfence" in {c.name for c in collect(group_sums.ir.body, Call)}
    with pytest.raises(ScriptError, match=r"threadfence\(\) takes 0 arguments"):

        @minicomp.script
        def bad(x: f32[4]):
            attrs.grid_dim = 1
            attrs.block_dim = 4
            threadfence(1)

        _ = bad.ir  # parsing raises


def test_scratch_and_block_group_are_launch_attributes_that_print_and_parse_back():
    f = group_sums.ir
    assert f.attrs.scratch == (("parts", 1024, False), ("count", 8, True))
    assert f.attrs.block_group == GROUP
    text = function_str(f)
    assert "attrs.scratch = (('parts', 1024, False), ('count', 8, True))" in text
    assert "attrs.block_group = 4" in text
    assert parse_function(text) == f
    assert scratch_of(f) == (
        Scratch("parts", torch.float32, 1024, False),
        Scratch("count", torch.int32, 8, True),
    )
    parts, count = scratch_tensors(f, "cpu")
    assert parts.shape == (1024,) and count.dtype == torch.int32 and not count.any()


def test_scratch_names_pointer_parameters():
    f = group_sums.ir
    with pytest.raises(ValueError, match="z is not a pointer parameter"):
        f.replace(attrs=f.attrs.replace(scratch=(("z", 4, True),)))
    with pytest.raises(TypeError, match="scratch is a tuple"):
        LaunchAttrs(scratch=(("parts", -1, False),))
    with pytest.raises(TypeError, match="block_group is a positive int"):
        LaunchAttrs(block_group=0)
    body = S.Seq(())
    with pytest.raises(ValueError, match="y is not a pointer parameter"):
        Function("k", (), body, attrs=LaunchAttrs(scratch=(("y", 1, True),)))


@pytest.mark.parametrize(
    "value, message",
    [
        ("(('n', 4, True),)", "tensor parameter, elements, zeroed"),
        ("(('x', 4, 1),)", "tensor parameter, elements, zeroed"),
        ("(('x', -4, True),)", "tensor parameter, elements, zeroed"),
    ],
)
def test_scratch_errors(value, message):
    text = (
        "def k(x: ptr(f32), n: i32):  # kernel\n"
        "    attrs.grid_dim = (1, 1, 1)\n"
        "    attrs.block_dim = (32, 1, 1)\n"
        f"    attrs.scratch = {value}\n"
    )
    with pytest.raises(ScriptError, match=message):
        parse_function(text)
