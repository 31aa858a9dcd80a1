"""Errors of scripts point at the script's own file and line and name what is wrong, at
compile time (syntax, types, names, calls) and at launch (the tensors given)."""

import inspect

import pytest
import torch

import minicomp
from minicomp.script import (
    ScriptError,
    attrs,
    dim,
    exp,
    f16,
    f32,
    i32,
    threadIdx,
)

GLOBAL_TENSOR = torch.zeros(3)


def line_of(fn, text: str) -> int:
    """The line of this file where `text` occurs inside function `fn`."""
    lines, first = inspect.getsourcelines(fn)
    hits = [first + k for k, line in enumerate(lines) if text in line]
    assert len(hits) == 1, (text, hits)
    return hits[0]


def compile_error(sf, marker: str, *words: str) -> ScriptError:
    """Parse `sf`, expecting a ScriptError at the line holding `marker`, naming `words`."""
    with pytest.raises(ScriptError) as info:
        _ = sf.ir
    err = info.value
    line = line_of(sf.fn, marker)
    assert err.filename == __file__ and err.lineno == line
    assert str(err).startswith(f"{__file__}:{line}: ")
    for w in words:
        assert w in err.reason, (w, err.reason)
    return err


@pytest.mark.parametrize(
    "construct,words",
    [
        ("with", "a `with` statement"),
        ("lambda", "a lambda"),
        ("comprehension", "a list comprehension"),
        ("try", "a `try` statement"),
        ("fstring", "an f-string"),
    ],
)
def test_unsupported_syntax(construct, words):
    @minicomp.script
    def k(a: f32[4]):
        attrs.grid_dim = 1
        attrs.block_dim = 4
        if construct == "with":
            with open("x"):  # with here
                pass
        if construct == "lambda":
            a[0] = (lambda: 1.0)()  # lambda here
        if construct == "comprehension":
            a[0] = [x for x in range(3)][0]  # comprehension here
        if construct == "try":
            try:  # try here
                a[0] = 1.0
            finally:
                pass
        if construct == "fstring":
            a[0] = f"{a}"  # fstring here

    compile_error(k, f"# {construct} here", "unsupported syntax", words)


def test_assigning_a_float_to_an_int_variable():
    @minicomp.script
    def k(a: f32[4]):
        attrs.grid_dim = 1
        attrs.block_dim = 4
        x = 0
        x = a[threadIdx.x]  # the mismatch
        a[0] = f32(x)

    compile_error(k, "# the mismatch", "assignment to x", "f32", "i32", "write i32(...)")


def test_storing_a_bool_into_a_half_tensor():
    @minicomp.script
    def k(a: f32[4], out: f16[4]):
        attrs.grid_dim = 1
        attrs.block_dim = 4
        out[threadIdx.x] = a[threadIdx.x] > 0.0  # the store

    compile_error(k, "# the store", "store to out", "bool", "f16", "write f16(...)")


def test_integer_true_division():
    @minicomp.script
    def k(a: i32[4]):
        attrs.grid_dim = 1
        attrs.block_dim = 4
        a[threadIdx.x] = a[threadIdx.x] / 2  # division

    compile_error(k, "# division", "/ on integers", "//")


def test_undefined_name():
    @minicomp.script
    def k(a: f32[4]):
        attrs.grid_dim = 1
        attrs.block_dim = 4
        a[0] = undefined_thing  # noqa: F821 - the undefined name

    compile_error(k, "undefined_thing", "undefined name 'undefined_thing'")


def test_scope_value_of_an_unsupported_kind():
    @minicomp.script
    def k(a: f32[3]):
        attrs.grid_dim = 1
        attrs.block_dim = 3
        a[0] = GLOBAL_TENSOR[0]  # a tensor global

    compile_error(k, "# a tensor global", "'GLOBAL_TENSOR' is a Tensor")


@minicomp.script
def two_args(a: f32, b: f32) -> f32:
    return a + b


@pytest.mark.parametrize(
    "count,words",
    [(3, "two_args() takes 2 arguments, 3 given"), (1, "2 arguments, 1 given (missing b)")],
)
def test_device_function_argument_count(count, words):
    @minicomp.script
    def k(a: f32[4]):
        attrs.grid_dim = 1
        attrs.block_dim = 1
        if count == 3:
            a[0] = two_args(a[0], a[1], a[2])  # the call
        else:
            a[0] = two_args(a[0])  # the call

    err = pytest.raises(ScriptError, lambda: k.ir).value
    lines = [line_of(k.fn, "two_args(a[0], a[1], a[2])"), line_of(k.fn, "two_args(a[0])  #")]
    assert err.lineno == lines[0 if count == 3 else 1]
    assert words in err.reason


def test_device_function_argument_type():
    @minicomp.script
    def k(a: f32[4], n: i32):
        attrs.grid_dim = 1
        attrs.block_dim = 1
        a[0] = two_args(a[0], n)  # the call

    compile_error(k, "# the call", "argument b of two_args()", "i32", "f32")


@pytest.mark.parametrize(
    "case,words",
    [
        ("break", ["break is not supported in a loop over a compile-time tuple"]),
        ("attrs", ["attrs.block_dim must be set at the top level"]),
        ("loopvar", ["loop variable j is not visible after its loop"]),
        ("indices", ["too many indices for a"]),
        ("exp", ["exp() needs a floating-point argument", "i32"]),
        ("retype", ["assignment to v", "f32"]),
        ("return", ["returns nothing"]),
        ("tensor", ["cannot assign to a: it is a tensor"]),
        ("bounds", ["index 4 is out of bounds for dimension 0 of a (size 4)"]),
    ],
)
def test_statement_errors(case, words):
    @minicomp.script
    def k(a: f32[4], n: i32):
        attrs.grid_dim = 1
        if case != "attrs":
            attrs.block_dim = 4
        if case == "break":
            for _s in (1, 2):
                break  # the statement
        if case == "attrs":
            if n > 0:
                attrs.block_dim = 4  # the statement
        if case == "loopvar":
            for j in range(3):
                a[j] = 0.0
            a[3] = f32(j)  # the statement
        if case == "indices":
            a[0, 1] = 0.0  # the statement
        if case == "exp":
            a[0] = exp(n)  # the statement
        if case == "retype":
            v = n
            v = a[0]  # noqa: F841 - the statement
        if case == "return":
            return 1  # the statement
        if case == "tensor":
            a = 1.0  # noqa: F841 - the statement
        if case == "bounds":
            a[4] = 1.0  # the statement

    err = pytest.raises(ScriptError, lambda: k.ir).value
    lines, first = inspect.getsourcelines(k.fn)
    start = next(i for i, line in enumerate(lines) if f'case == "{case}":' in line)
    statement = next(i for i in range(start, len(lines)) if "the statement" in lines[i])
    assert err.filename == __file__ and err.lineno == first + statement
    assert str(err).startswith(f"{__file__}:{first + statement}: ")
    for w in words:
        assert w in err.reason, (w, err.reason)


def test_kernel_without_block_dim_points_at_its_definition():
    @minicomp.script
    def no_block(a: f32[4]):
        attrs.grid_dim = 1
        a[0] = 1.0

    compile_error(no_block, "def no_block", "kernel no_block sets no attrs.block_dim")


def test_unknown_launch_attribute_is_named_at_its_line():
    @minicomp.script
    def k(a: f32[4]):
        attrs.grid_dim = 1
        attrs.block_dim = 4
        attrs.max_threads = 4  # the typo
        a[0] = 1.0

    err = compile_error(k, "# the typo", "attrs has no attribute 'max_threads'")
    for known in ("grid_dim", "block_dim", "dynamic_smem", "launch_bounds", "min_blocks"):
        assert known in err.reason


def test_template_attribute_is_a_string():
    @minicomp.script
    def tagged(a: f32[4]):
        attrs.grid_dim = 1
        attrs.block_dim = 4
        attrs.template = "mine[4]"
        a[threadIdx.x] = 1.0

    assert tagged.ir.attrs.template == "mine[4]"

    @minicomp.script
    def k(a: f32[4]):
        attrs.grid_dim = 1
        attrs.block_dim = 4
        attrs.template = 4  # the number
        a[0] = 1.0

    compile_error(k, "# the number", "attrs.template is a string, not the constant 4")


def test_shape_naming_no_parameter():
    @minicomp.script
    def k(a: f32[dim.q], n: i32):
        attrs.grid_dim = 1
        attrs.block_dim = 1

    compile_error(k, "a: f32[dim.q]", "the size 'q' names no int parameter")


def test_calling_a_kernel_or_a_device_function_wrongly():
    @minicomp.script
    def inner(a: f32[4]):
        attrs.grid_dim = 1
        attrs.block_dim = 1

    @minicomp.script
    def outer(a: f32[4]):
        attrs.grid_dim = 1
        attrs.block_dim = 1
        inner(a)  # the call

    compile_error(outer, "# the call", "inner is a kernel")
    with pytest.raises(ScriptError, match="two_args is a device function") as info:
        two_args(1.0, 2.0)
    assert info.value.lineno == line_of(two_args.fn, "def two_args")


# ---- launch ----


@minicomp.script
def launched(
    a: f32[dim.n, 4],
    b: f16[dim.n],
    n: i32,
):
    attrs.grid_dim = 1
    attrs.block_dim = 1
    b[0] = f16(a[0, 0])


def launch_error(*args, words: list[str], param: str | None, target=None):
    kernel = launched.with_target(target) if target else launched
    with pytest.raises(ScriptError) as info:
        kernel(*args)
    err = info.value
    marker = f"    {param}:" if param else "def launched"
    assert err.filename == __file__ and err.lineno == line_of(launched.fn, marker)
    for w in words:
        assert w in err.reason, (w, err.reason)


def test_launch_checks_shapes_dtypes_and_layout():
    a, b = torch.zeros(5, 4), torch.zeros(5, dtype=torch.float16)
    launch_error(
        torch.zeros(5, 3), b, words=["argument a", "shape (n, 4)", "dimension 1 is 3"], param="a"
    )
    launch_error(a, torch.zeros(6, dtype=torch.float16), words=["n is 5"], param="b")
    launch_error(a, torch.zeros(5), words=["argument b", "float16", "float32"], param="b")
    launch_error(torch.zeros(4, 5).t(), b, words=["argument a is not contiguous"], param="a")
    launch_error(torch.zeros(5), b, words=["argument a", "1 dimensions, not 2"], param="a")
    launch_error(a, b, 7, words=["argument a", "n is 7"], param="a")
    launch_error(a, b, 2.5, words=["argument n is a i32 scalar"], param="n")
    launch_error(a, [1.0], words=["argument b", "not a list"], param="b")
    launch_error(a, words=["missing the argument b"], param="b")
    launch_error(a, b, 5, 6, words=["takes 3 arguments, 4 given"], param=None)
    launch_error(a, b, words=["cuda target", "CUDA tensors", "on cpu"], param=None, target="cuda")
