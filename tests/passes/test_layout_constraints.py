"""ATen calls get their tensor arguments with the strides they need: eager's for as_strided
(which reads storage) and for custom ops (PyTorch's default, needs_exact_strides), row-major
for ops tagged needs_contiguous_strides, whatever minicomp chose for flexible_layout."""

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_same, compile_minicomp
from helpers_graph import PassGraphBuilder, assert_graph_equal

from minicomp.ir.graph import ArgRef
from minicomp.passes.graph.layout import contiguous_extern_inputs

aten = torch.ops.aten

# The strides each custom op was last called with, by op name.
seen: dict[str, tuple[int, ...]] = {}


def _strides_logging_op(name: str, tags: tuple):
    @torch.library.custom_op(f"minicomp_tests::layout_{name}", mutates_args=(), tags=tags)
    def op(x: torch.Tensor) -> torch.Tensor:
        seen[name] = tuple(x.stride())
        return x * 3

    op.register_fake(lambda x: torch.empty_like(x))
    return op


OPS = {
    "exact_by_default": _strides_logging_op("exact_by_default", ()),
    "exact": _strides_logging_op("exact", (torch.Tag.needs_exact_strides,)),
    "fixed_order": _strides_logging_op("fixed_order", (torch.Tag.needs_fixed_stride_order,)),
    "contiguous": _strides_logging_op("contiguous", (torch.Tag.needs_contiguous_strides,)),
}


def transposed_intermediate(op, x):
    return op(x.t() * 2) + 1


def channels_last_intermediate(op, x):
    return op(x.to(memory_format=torch.channels_last).sin()) - 1


def transposed_input(op, x):
    return op(x.t()) + 1


CASES = {
    transposed_intermediate: (4, 6),
    channels_last_intermediate: (2, 3, 4, 5),
    transposed_input: (4, 6),
}


@pytest.mark.parametrize("case", list(CASES), ids=lambda f: f.__name__)
@pytest.mark.parametrize("name", list(OPS))
def test_custom_ops_get_the_strides_their_tag_asks_for(name, case, target):
    op = OPS[name]
    x = torch.randn(CASES[case])
    expected = case(op, x)
    eager_strides = seen.pop(name)
    got = compile_minicomp(lambda x: case(op, x), target)(x)
    assert_same(got, expected)
    strides = seen.pop(name)
    if name == "contiguous":
        shape = expected.shape
        assert strides == torch.empty(shape).stride()
    else:
        assert strides == eager_strides


@pytest.mark.parametrize("dynamic", [False, True])
def test_as_strided_of_a_channels_last_intermediate_reads_eagers_elements(dynamic, target):
    def strided_window(x):
        y = x * 2  # channels-last, as its input
        return y.as_strided((2, 3, 4), (1, 2, 7))

    x = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
    assert_same(compile_minicomp(strided_window, target, dynamic=dynamic)(x), strided_window(x))


GROUP_NORM_INPUTS = {
    "expanded": lambda: torch.randn(1, 1).expand(1, 4),
    # Varying along the last dim: a group of nearly equal values makes any two float32
    # results differ by more than the tolerance (the output scales the mean's error by 1/std).
    "expanded_4d": lambda: torch.randn(2, 4, 1, 5).expand(2, 4, 3, 5),
    "transposed": lambda: torch.randn(6, 4).t(),
}


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("case", sorted(GROUP_NORM_INPUTS))
def test_group_norm_of_a_non_contiguous_input(case, dynamic, target):
    # native_group_norm checks that its input is contiguous without the tag saying so;
    # group_norm's clone that made it so is an identity copy minicomp drops.
    def fn(x):
        return F.group_norm(x, 2)

    x = GROUP_NORM_INPUTS[case]()
    assert_same(compile_minicomp(fn, target, dynamic=dynamic)(x), fn(x))


def rotary_pairs(x):
    return torch.view_as_complex(x.contiguous())


def float_bits(x):
    return x.contiguous().view(torch.int16)


@pytest.mark.parametrize("fn", [rotary_pairs, float_bits], ids=lambda f: f.__name__)
def test_a_view_as_another_element_type_of_a_copied_input(fn, target):
    # Viewing as a type of another size needs the last stride 1, which the copy gave; minicomp
    # drops the copy as an identity and must make the argument row-major again.
    x = torch.randn(2, 4, 3).permute(1, 2, 0)  # pairs along a dimension of stride 12
    assert_same(compile_minicomp(fn, target)(x), fn(x))


# --- the pass, on graphs built by hand ---------------------------------------------------------


def group_norm(b: PassGraphBuilder, name: str, x, shape, strides=None):
    """native_group_norm of x (N, C) in 2 groups, its mean and rstd results left out: it
    checks that its input is contiguous (layout.py's _CHECKS_CONTIGUOUS)."""
    args = (ArgRef(0), None, None, *shape, 1, 2, 1e-5)
    return b.extern(name, aten.native_group_norm.default, [x], shape, args=args, strides=strides)


def test_calls_that_need_contiguous_arguments_get_row_major_copies():
    b = PassGraphBuilder()
    x = b.input("x", (4, 6), strides=(1, 4))  # a transposed tensor handed in
    y = b.input("y", (6, 4))
    taken = b.compute("x_contiguous", (6, 4), lambda i, j: y[i, j] * 2.0)  # the name is taken
    yt = b.extern("yt", aten.t.default, [y], (4, 6), strides=(1, 4))  # a strided ATen result
    outs = [group_norm(b, f"g{k}", v, (4, 6)) for k, v in enumerate((x, x, yt))]
    b.output(*outs, taken)

    # One copy of each value, made where the first call needs it; both calls of x read it.
    e = PassGraphBuilder()
    x = e.input("x", (4, 6), strides=(1, 4))
    y = e.input("y", (6, 4))
    taken = e.compute("x_contiguous", (6, 4), lambda i, j: y[i, j] * 2.0)
    yt = e.extern("yt", aten.t.default, [y], (4, 6), strides=(1, 4))
    x_copy = e.compute(
        "x_contiguous_1", (4, 6), lambda i, j: x[i, j], op="contiguous", strides=(6, 1)
    )
    g0 = group_norm(e, "g0", x_copy, (4, 6))
    g1 = group_norm(e, "g1", x_copy, (4, 6))
    yt_copy = e.compute(
        "yt_contiguous", (4, 6), lambda i, j: yt[i, j], op="contiguous", strides=(6, 1)
    )
    e.output(g0, g1, group_norm(e, "g2", yt_copy, (4, 6)), taken)
    assert_graph_equal(contiguous_extern_inputs(b.build()), e.build())


def test_flexible_calls_and_row_major_arguments_are_left_alone():
    b = PassGraphBuilder()
    x = b.input("x", (4, 6), strides=(1, 4))
    w = b.input("w", (6, 3))
    col = b.input("col", (4, 1), strides=(1, 7))  # a size-1 dim may have any stride
    product = b.extern("product", aten.mm.default, [x, w], (4, 3))  # reads any layout
    doubled = b.compute("doubled", (4, 6), lambda i, j: x[i, j] * 2.0)  # minicomp's: row-major
    b.output(product, group_norm(b, "g0", col, (4, 1)), group_norm(b, "g1", doubled, (4, 6)))
    g = b.build()
    assert contiguous_extern_inputs(g) is g
