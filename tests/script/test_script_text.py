"""Script functions from text (minicomp.script.text), and the parts of the language that the
kernel IR's printed form relies on: dynamic shared tensors placed at a byte offset, a name
declared again in a later block, comment(), and pointer parameters as cp_async sources."""

import pytest
import torch

import minicomp
from minicomp.ir import stmt as S
from minicomp.ir.functor import collect
from minicomp.ir.types import f32 as F32
from minicomp.script import (
    ScriptError,
    attrs,
    comment,
    cp_async,
    cp_async_wait_all,
    dim,
    dynamic_shared_tensor,
    f16,
    f32,
    i32,
    i64,
    ptr,
    shared_tensor,
    syncthreads,
    threadIdx,
)
from minicomp.script.text import parse_function, parse_module

# ---- parsing text ---------------------------------------------------------------------------

SCALE = """\
def scale(x: ptr(f32), n: i32):  # kernel
    attrs.grid_dim = (i64((n + 63) // 64), 1, 1)
    attrs.block_dim = (64, 1, 1)
    i: i32 = blockIdx.x * 64 + threadIdx.x
    if i < n:
        x[i64(i)] = x[i64(i)] * 2.0 + -math.inf * 0.0
"""


def test_parse_function_gives_the_ir_of_the_text():
    f = parse_function(SCALE)
    assert f.name == "scale" and f.kind == "kernel"
    assert [p.name for p in f.params] == ["x", "n"]
    assert f.attrs.block_dim == (64, 1, 1)
    assert f == parse_function(SCALE)


def test_errors_point_at_the_line_of_the_text():
    text = SCALE.replace("* 2.0", "* two")
    with pytest.raises(ScriptError, match=r"<script text \d+>:6: undefined name 'two'") as info:
        parse_function(text)
    assert info.value.lineno == 6 and "x[i64(i)] * two" in str(info.value)


@pytest.mark.parametrize(
    "text, message",
    [
        ("x = 1\n", "function definitions only"),
        (SCALE + "\n\n" + SCALE.replace("scale", "twice"), "defines 2 functions, not one"),
        ("def f(x: f32) -> f32:\n    return x +\n", "invalid syntax"),
    ],
)
def test_text_that_is_not_one_function(text, message):
    with pytest.raises((ScriptError, SyntaxError), match=message):
        parse_function(text)


def test_parse_module_keeps_the_names_written():
    # Device functions keep their names (no `_1` to set them apart from other scripts').
    text = """\
def half(v: f32) -> f32:  # device
    return v * 0.5


def halve(x: ptr(f32)):  # kernel
    attrs.grid_dim = (1, 1, 1)
    attrs.block_dim = (32, 1, 1)
    x[i64(threadIdx.x)] = half(x[i64(threadIdx.x)])
"""
    for _ in range(2):
        module = parse_module(text, "m")
        assert module.name == "m" and [f.name for f in module.functions] == ["half", "halve"]
        assert "half(" in repr(module.functions[1])


# ---- dynamic shared tensors at an offset ----------------------------------------------------


@minicomp.script
def placed(x: f32[64], y: f32[64]):
    attrs.grid_dim = 1
    attrs.block_dim = 64
    a = dynamic_shared_tensor(f32, 64)
    b = dynamic_shared_tensor(f32, 16, at=128)  # elements 32..47 of a
    c = dynamic_shared_tensor(f32, 4)  # after the furthest byte used: element 64 on
    t = threadIdx.x
    a[t] = x[t]
    syncthreads()
    if t < 16:
        y[t] = b[t]
    if t < 4:
        c[t] = 1.0
        y[16 + t] = c[t] + a[t]


def test_dynamic_tensor_at_an_offset_ir():
    f = placed.ir
    sizes = [s.size for s in collect(f.body, S.DeclareArray)]
    # Each array starts the dynamic shared memory; its size counts the elements before it.
    assert sizes == [64, 32 + 16, 64 + 4]
    assert f.attrs.dynamic_smem == (64 + 4) * 4


def test_dynamic_tensor_at_an_offset_aliases(script_target):
    x, y = torch.randn(64), torch.zeros(64)
    placed.with_target(script_target)(x, y)
    assert torch.equal(y[:16], x[32:48])
    assert torch.equal(y[16:20], x[:4] + 1)


@pytest.mark.parametrize("at, message", [("8", "multiple of 16 bytes, not 8"), ("n", "compile")])
def test_dynamic_tensor_offset_errors(at, message):
    text = f"""\
def k(x: ptr(f32), n: i32):
    attrs.grid_dim = 1
    attrs.block_dim = 1
    a = dynamic_shared_tensor(f32, 4, at={at})
"""
    with pytest.raises(ScriptError, match=message):
        parse_function(text)


# ---- a name declared again in a later block -------------------------------------------------


@minicomp.script
def two_loops(x: f32[8], y: f32[8]):
    attrs.grid_dim = 1
    attrs.block_dim = 1
    for i in range(4):
        v: f32 = x[i]
        y[i] = v * 2.0
    for i in range(4, 8):
        v: i32 = i32(x[i])  # a new variable: the first v's loop has ended
        y[i] = f32(v)


def test_annotation_declares_again_after_the_block_ended():
    decls = [s.var for s in collect(two_loops.ir.body, S.Declare) if s.var.name.startswith("v")]
    assert [(v.name, v.type.short) for v in decls] == [("v", "f32"), ("v_1", "i32")]
    x, y = torch.tensor([0.5, 1, 2, 3, 4.5, 5.5, -6.5, 7]), torch.zeros(8)
    two_loops.with_target("cuda-emu")(x, y)
    assert torch.equal(y, torch.cat([x[:4] * 2, x[4:].trunc()]))


def test_annotation_in_the_same_block_is_still_an_error():
    text = """\
def k(x: ptr(f32)):
    attrs.grid_dim = 1
    attrs.block_dim = 1
    for i in range(4):
        v: f32 = x[i]
        v: f32 = x[i + 1]
"""
    with pytest.raises(ScriptError, match=r":6: v is already declared"):
        parse_function(text)
    # Nor may a nested block declare again a variable that is still in scope.
    nested = text.replace("        v: f32 = x[i + 1]", "        if i > 0:\n            v: f32")
    with pytest.raises(ScriptError, match=r":7: v is already declared"):
        parse_function(nested)


# ---- comment() ------------------------------------------------------------------------------


@minicomp.script
def commented(x: f32[4]):
    attrs.grid_dim = 1
    attrs.block_dim = 4
    comment("double it\nin place")
    x[threadIdx.x] *= 2.0


def test_comment_is_a_comment_statement():
    (c,) = collect(commented.ir.body, S.Comment)
    assert c.text == "double it\nin place"
    assert "// double it" in commented.source and "// in place" in commented.source
    x = torch.arange(4.0)
    commented.with_target("cuda-emu")(x)
    assert torch.equal(x, torch.arange(4.0) * 2)


def test_comment_takes_one_string():
    text = "def k(x: ptr(f32)):\n    attrs.grid_dim = 1\n    attrs.block_dim = 1\n    comment(3)\n"
    with pytest.raises(ScriptError, match=r":4: comment\(\) takes a string"):
        parse_function(text)


# ---- pointer parameters as whole-tensor operands --------------------------------------------


@minicomp.script
def copy_rows(src: ptr(f16), dst: f16[64], n: i32):
    attrs.grid_dim = 1
    attrs.block_dim = 8
    s = shared_tensor(f16, 64)
    t = threadIdx.x
    cp_async(s[t * 8], src[i64(t) * 8], 16)  # a pointer: no size to check against
    cp_async_wait_all()
    syncthreads()
    for k in range(8):
        dst[t * 8 + k] = s[t * 8 + k]


def test_cp_async_from_a_pointer_parameter():
    src, dst = torch.randn(64).half(), torch.zeros(64, dtype=torch.float16)
    copy_rows.with_target("cuda-emu")(src.data_ptr(), dst, 64)
    assert torch.equal(src, dst)


# ---- blocks keep no placeholders of hoisted declarations -------------------------------------


@minicomp.script
def hoisted(x: f32[dim.n], n: i32):
    attrs.grid_dim = 1
    attrs.block_dim = 1
    for i in range(n):
        if i > 2:
            if i > 5:
                last = x[i]
            else:
                last = 1.0
            x[i] = last  # declared at the start of this block...
        else:
            last = 0.0  # ...then at the start of the loop's
        x[i] = last + 1.0


def test_hoisted_declarations_leave_no_empty_statements():
    f = hoisted.ir
    # The inner declaration of `last` went when the outer one replaced it, without a trace.
    assert [s.var.type for s in collect(f.body, S.Declare)] == [F32]
    assert not [s for s in collect(f.body, S.Seq) if not s.body]
    assert parse_function(repr(f)) == f
