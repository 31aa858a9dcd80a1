"""View and layout lowerings evaluated with numpy and compared with eager PyTorch."""

import sys

import pytest
import torch
from helpers import check_compiled
from helpers_shape import check, rand, refuses

from minicomp.ir.compute import tensor_input
from minicomp.ir.expr import Binary, size_var
from minicomp.ir.functor import collect
from minicomp.ir.types import f32
from minicomp.ops.shape import view_index

aten = torch.ops.aten
DTYPES = [torch.float32, torch.int64, torch.bool]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "src,dst",
    [
        ((4, 6, 8), (24, 8)),
        ((4, 6, 8), (4, 48)),
        ((4, 6, 8), (8, 3, 8)),
        ((2, 3), (3, 2)),
        ((6,), (1, 2, 1, 3, 1)),
        ((1, 2, 1, 3, 1), (6,)),
        ((), (1, 1)),
        ((1,), ()),
        ((0, 3), (3, 0)),
        ((5, 7), (35,)),
    ],
)
def test_view(dtype, src, dst):
    x = rand(*src, dtype=dtype)
    check(aten.view.default, x, list(dst))
    check(aten._unsafe_view.default, x, list(dst))


def test_view_keeps_untouched_dims_free_of_div_mod():
    x = tensor_input("x", (4, 6, 8), f32)
    i = [size_var(f"i{k}") for k in range(2)]
    idx = view_index(i, (24, 8), x.shape)
    assert idx[2] == i[1]
    assert not collect(idx[2], Binary)


def test_view_of_noncontiguous_input_uses_logical_order():
    x = rand(6, 4).t()
    check(aten.reshape.default, x, [2, 12])


def test_view_symbolic():
    check(aten.view.default, rand(7, 4, 3), [7, 12], sym={"s0": 7})
    check(
        aten.view.default,
        rand(7, 4, 3),
        [28, 3],
        sym={"s0": 7},
        out_shapes=[(size_var("s0") * 4, 3)],
    )
    check(aten.view.default, rand(2, 7), [7, 2], sym={"s0": 7})


@pytest.mark.parametrize("dtype", DTYPES)
def test_permute_transpose_t(dtype):
    x = rand(2, 3, 4, dtype=dtype)
    check(aten.permute.default, x, [2, 0, 1])
    check(aten.permute.default, x, [-1, -3, 1])
    check(aten.transpose.int, x, 0, -1)
    check(aten.t.default, rand(3, 5, dtype=dtype))
    check(aten.t.default, rand(3, dtype=dtype))
    check(aten.permute.default, rand(dtype=dtype), [])
    check(aten.alias.default, x)


def test_permute_symbolic():
    check(aten.permute.default, rand(7, 3, 2), [1, 2, 0], sym={"s0": 7})


@pytest.mark.parametrize("dtype", DTYPES)
def test_expand(dtype):
    check(aten.expand.default, rand(3, 1, dtype=dtype), [2, 3, 5])
    check(aten.expand.default, rand(1, 4, dtype=dtype), [-1, 4])
    check(aten.expand.default, rand(dtype=dtype), [2, 2])
    check(aten.expand.default, rand(1, 3, dtype=dtype), [0, 3])
    check(aten.expand.default, rand(7, 1), [7, 4], sym={"s0": 7})


@pytest.mark.parametrize("dtype", DTYPES)
def test_squeeze_unsqueeze(dtype):
    x = rand(1, 3, 1, 2, dtype=dtype)
    check(aten.squeeze.default, x)
    check(aten.squeeze.dim, x, -2)
    check(aten.squeeze.dim, x, 1)
    check(aten.squeeze.dims, x, [0, 1, 2])
    check(aten.squeeze.dims, rand(dtype=dtype), [0])
    for d in (0, 2, 4, -1, -5):
        check(aten.unsqueeze.default, x, d)
    check(aten.unsqueeze.default, rand(dtype=dtype), -1)
    check(aten.squeeze.dims, rand(7, 1), [1], sym={"s0": 7})


def test_squeeze_of_unknown_symbolic_size_refuses():
    # Eager squeezes the size-1 dim, but the lowering sees only a symbol there.
    refuses(aten.squeeze.dims, rand(1, 3), [0], sym={"s0": 1})


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "dim,start,end,step",
    [
        (0, 1, 3, 1),
        (1, None, None, 2),
        (-1, -3, sys.maxsize, 1),
        (1, -100, 100, 3),
        (0, 5, 10, 1),
        (1, 2, 1, 1),
        (2, -1, None, 1),
        (0, 0, -1, 2),
    ],
)
def test_slice(dtype, dim, start, end, step):
    check(aten.slice.Tensor, rand(5, 6, 4, dtype=dtype), dim, start, end, step)


def test_slice_symbolic():
    for start in (2, -2, -20, None):
        check(
            aten.slice.Tensor,
            rand(7, 3),
            0,
            start,
            sys.maxsize,
            1,
            sym={"s0": 7},
            out_shapes=None if start is None else [(len(range(7)[start:]), 3)],
        )


@pytest.mark.parametrize("dtype", DTYPES)
def test_select_narrow(dtype):
    x = rand(3, 4, 5, dtype=dtype)
    for dim, index in [(0, 0), (1, -1), (-1, 2), (2, -5)]:
        check(aten.select.int, x, dim, index)
    check(aten.select.int, rand(4, dtype=dtype), 0, -2)
    check(aten.narrow.default, x, 1, 1, 2)
    check(aten.narrow.default, x, -1, -3, 3)
    check(aten.select.int, rand(7, 2), 0, -1, sym={"s0": 7})


@pytest.mark.parametrize("dtype", DTYPES)
def test_cat(dtype):
    a, b, c = rand(2, 3, dtype=dtype), rand(2, 1, dtype=dtype), rand(2, 4, dtype=dtype)
    check(aten.cat.default, [a, b, c], 1)
    check(aten.cat.default, [a, b, c], -1)
    check(aten.cat.default, [a, rand(4, 3, dtype=dtype)])
    check(aten.cat.default, [a])
    check(aten.cat.default, [a, rand(2, 0, dtype=dtype), c], 1)
    check(aten.cat.default, [rand(0, dtype=dtype), a, rand(0, dtype=dtype)], 0)
    check(aten.cat.default, [rand(0, 3, dtype=dtype), rand(0, 3, dtype=dtype)], 0)


def test_cat_promotes_dtypes():
    check(aten.cat.default, [rand(2, dtype=torch.int64), rand(3), rand(1, dtype=torch.bool)])


def test_cat_symbolic():
    x, y = rand(7, 3), rand(7, 2)
    check(aten.cat.default, [x, y], 1, sym={"s0": 7})
    check(aten.cat.default, [x, x], 0, sym={"s0": 7}, out_shapes=[(size_var("s0") * 2, 3)])


@pytest.mark.parametrize("dtype", DTYPES)
def test_split_unbind(dtype):
    x = rand(4, 7, dtype=dtype)
    check(aten.split_with_sizes.default, x, [2, 0, 5], 1)
    check(aten.split_with_sizes.default, x, [1, 3], -2)
    check(aten.split.Tensor, x, 3, 1)
    check(aten.split.Tensor, x, 3, 0)
    check(aten.unbind.int, x, 0)
    check(aten.unbind.int, x, -1)


@pytest.mark.parametrize("dtype", DTYPES)
def test_flip_roll_repeat(dtype):
    x = rand(3, 4, 5, dtype=dtype)
    check(aten.flip.default, x, [0, -1])
    check(aten.flip.default, x, [])
    check(aten.flip.default, rand(dtype=dtype), [])
    check(aten.roll.default, x, [2], [1])
    check(aten.roll.default, x, [-7, 1], [-1, 0])
    check(aten.roll.default, x, [1, 1], [1, 1])
    check(aten.roll.default, x, [5])
    check(aten.roll.default, x, [-61])
    check(aten.repeat.default, x, [2, 1, 3])
    check(aten.repeat.default, x, [2, 1, 1, 2])
    check(aten.repeat.default, rand(1, 2, dtype=dtype), [3, 0])


def test_roll_repeat_flip_symbolic():
    x = rand(7, 3)
    check(aten.roll.default, x, [3], [0], sym={"s0": 7})
    check(aten.roll.default, x, [-9], [0], sym={"s0": 7})
    check(aten.flip.default, x, [0], sym={"s0": 7})
    check(aten.repeat.default, x, [1, 2], sym={"s0": 7})


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "pad", [[1, 2], [0, 0, 2, 1], [-1, 2, 1, -2], [1, 1, 1, 1, 1, 1], [-2, -1], [3, 0, 0, 0]]
)
def test_constant_pad_nd(dtype, pad):
    x = rand(3, 4, 5, dtype=dtype)
    value = True if dtype == torch.bool else 2
    check(aten.constant_pad_nd.default, x, pad, value)
    check(aten.constant_pad_nd.default, x, pad)


def test_constant_pad_nd_empty_and_symbolic():
    check(aten.constant_pad_nd.default, rand(0, 3), [1, 1, 2, 0], -1.5)
    check(aten.constant_pad_nd.default, rand(7, 3), [1, 2], 0.5, sym={"s0": 7})
    check(
        aten.constant_pad_nd.default,
        rand(3, 7),
        [1, 2],
        0.5,
        sym={"s0": 7},
        out_shapes=[(3, size_var("s0") + 3)],
    )


def test_diagonal_unfold():
    x = rand(3, 4, 5)
    for offset, d1, d2 in [(0, 0, 1), (1, 0, 1), (-2, 1, 0), (2, -1, 0), (9, 0, 1)]:
        check(aten.diagonal.default, x, offset, d1, d2)
    check(aten.unfold.default, x, 2, 2, 2)
    check(aten.unfold.default, x, -2, 3, 1)
    check(aten.unfold.default, rand(dtype=torch.int64), 0, 1, 1)


def test_as_strided():
    x = rand(4, 6)
    check(aten.as_strided.default, x, [3, 3], [1, 2], 1)
    check(aten.as_strided.default, x, [2, 4, 3], [12, 3, 1])
    check(aten.as_strided.default, x, [5], [0], 23)
    check(aten.as_strided.default, x[1:], [2, 2], [1, 6], 7)


def test_as_strided_refuses_unknown_storage():
    # A transposed input's storage order is not its logical order.
    refuses(aten.as_strided.default, rand(6, 4).t(), [2, 2], [1, 4])
    # Reading past the input's own elements touches storage it does not own.
    refuses(aten.as_strided.default, rand(12)[:6], [4], [2])


def test_as_strided_from_graph_metadata():
    from types import SimpleNamespace

    from minicomp.ir.evaluate import evaluate
    from minicomp.ops.registry import LoweringContext, NotLowerable, lowering_for

    x = rand(4, 6)
    fn = lowering_for(aten.as_strided.default)
    node = tensor_input("x", (4, 6), f32)
    meta = SimpleNamespace(shape=(4, 6), strides=(6, 1), storage_offset=0)
    ctx = LoweringContext("out", ((3, 2),), (f32,), arg_meta=[meta])
    got = evaluate(fn(ctx, node, [3, 2], [5, 2], 3), {"x": x.numpy()})
    torch.testing.assert_close(torch.from_numpy(got), x.as_strided((3, 2), (5, 2), 3))
    for unknown in (
        None,
        [SimpleNamespace(shape=(4, 6), strides=(6, 1))],
        [SimpleNamespace(shape=(4, 6), strides=(1, 4), storage_offset=0)],
    ):
        with pytest.raises(NotLowerable):
            fn(LoweringContext("out", ((3, 2),), (f32,), arg_meta=unknown), node, [3, 2], [5, 2])


def test_the_imaginary_part_of_a_conjugate_is_negated(target):
    # PyTorch expresses x.conj().imag with a view carrying its negative bit (_neg_view).
    x = torch.randn(3, 4, dtype=torch.complex64)
    out = check_compiled(lambda x: x.conj().imag * 2 + x.real, x, target=target)
    torch.testing.assert_close(out, -2 * x.imag + x.real)
