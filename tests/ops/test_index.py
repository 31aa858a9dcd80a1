"""Indexing lowerings evaluated with numpy and compared with eager PyTorch."""

import sys

import pytest
import torch
from helpers import check_compiled
from helpers_shape import check, rand, refuses

from minicomp.dynamo.backend import recording
from minicomp.explain import Explanation
from minicomp.ir.expr import size_var

aten = torch.ops.aten
DTYPES = [torch.float32, torch.int64, torch.bool]
INDEX_DTYPES = [torch.int64, torch.int32]


def idx(values, dtype=torch.int64):
    return torch.tensor(values, dtype=dtype)


def rand_index(size, *shape, dtype=torch.int64):
    """Random in-range indices, negative ones included (valid for advanced indexing)."""
    return torch.randint(-size, size, shape, dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
def test_index_select(dtype, index_dtype):
    x = rand(3, 4, 5, dtype=dtype)
    check(aten.index_select.default, x, 1, idx([0, 3, 3, 1], index_dtype))
    check(aten.index_select.default, x, -1, torch.randint(0, 5, (7,), dtype=index_dtype))
    check(aten.index_select.default, x, 0, idx([], index_dtype))
    check(aten.index_select.default, x, 2, idx(4, index_dtype))
    check(aten.index_select.default, rand(dtype=dtype), 0, idx([0], index_dtype))


def test_index_select_symbolic():
    check(aten.index_select.default, rand(7, 3), 0, idx([6, 0, 2]), sym={"s0": 7})


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("index_dtype", INDEX_DTYPES[:1])
def test_gather(dtype, index_dtype):
    x = rand(3, 4, 5, dtype=dtype)
    check(aten.gather.default, x, 1, torch.randint(0, 4, (3, 6, 5), dtype=index_dtype))
    check(aten.gather.default, x, -1, torch.randint(0, 5, (2, 2, 2), dtype=index_dtype))
    check(aten.gather.default, x, 0, torch.randint(0, 3, (0, 4, 5), dtype=index_dtype))
    check(aten.gather.default, rand(dtype=dtype), 0, idx(0, index_dtype))


@pytest.mark.parametrize("index_dtype", INDEX_DTYPES)
def test_embedding(index_dtype):
    w = rand(10, 4)
    check(aten.embedding.default, w, torch.randint(0, 10, (2, 3), dtype=index_dtype))
    check(aten.embedding.default, w, torch.randint(0, 10, (5,), dtype=index_dtype), 0)
    check(aten.embedding.default, w, idx(7, index_dtype))


def test_embedding_symbolic():
    check(aten.embedding.default, rand(10, 4), torch.randint(0, 10, (7, 2)), sym={"s0": 7})


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "where",
    [
        lambda i, j: [i],
        lambda i, j: [None, i],
        lambda i, j: [None, None, j],
        lambda i, j: [i, j],
        lambda i, j: [None, i, j],
        lambda i, j: [i, None, j],
        lambda i, j: [i[:, None], j],
    ],
)
def test_index_tensor(dtype, where):
    x = rand(3, 4, 5, dtype=dtype)
    i = rand_index(3, 2)
    j = rand_index(4, 2)
    # i stands at dim 0 or 1, j at dim 1 or 2: in range for sizes 3, 4, 5, negatives included.
    check(aten.index.Tensor, x, where(i, j))


def test_index_tensor_int32_scalar_and_empty():
    x = rand(4, 5)
    check(aten.index.Tensor, x, [idx([-1, 2], torch.int32)])
    check(aten.index.Tensor, x, [None, idx(-2)])
    check(aten.index.Tensor, x, [idx([], torch.int64)])
    check(aten.index.Tensor, rand(7, 5), [None, idx([[0, 4], [-1, 1]])], sym={"s0": 7})


def test_index_tensor_refuses_masks():
    x = rand(3, 4)
    refuses(aten.index.Tensor, x, [x > 0])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "dim,start,end,step",
    [(0, None, None, 1), (1, 1, 3, 1), (1, -4, sys.maxsize, 2), (-1, 0, 5, 3), (1, 4, 4, 1)],
)
def test_slice_scatter(dtype, dim, start, end, step):
    x = rand(3, 5, 5, dtype=dtype)
    src = x[(slice(None),) * (dim % 3) + (slice(start, end, step),)]
    check(aten.slice_scatter.default, x, rand(*src.shape, dtype=dtype), dim, start, end, step)


def test_slice_scatter_symbolic():
    x = rand(7, 3)
    check(aten.slice_scatter.default, x, rand(7, 2), 1, 1, sys.maxsize, 1, sym={"s0": 7})
    check(aten.slice_scatter.default, x, rand(2, 3), 0, -3, -1, 1, sym={"s0": 7})


@pytest.mark.parametrize("dtype", DTYPES)
def test_select_scatter(dtype):
    x = rand(3, 4, 5, dtype=dtype)
    check(aten.select_scatter.default, x, rand(3, 5, dtype=dtype), 1, -1)
    check(aten.select_scatter.default, x, rand(4, 5, dtype=dtype), 0, 2)
    check(
        aten.select_scatter.default,
        rand(7, 2),
        rand(2),
        0,
        -3,
        sym={"s0": 7},
        out_shapes=[(size_var("s0"), 2)],
    )


def test_scattering_floats_into_an_integer_tensor_keeps_its_dtype(target):
    # PyTorch's decomposition of select_scatter promotes to float32; eager copies into int64.
    x = torch.randint(-50, 50, (3, 4))
    src = torch.randn(4) * 20
    records = []
    with recording(records):
        out = check_compiled(lambda x, s: torch.select_scatter(x, s, 0, 1), x, src, target=target)
    assert out.dtype == torch.int64 and not Explanation(records).fallbacks
    slab = torch.randn(3, 2) * 20
    out = check_compiled(lambda x, s: torch.slice_scatter(x, s, 1, 1, 3), x, slab, target=target)
    assert out.dtype == torch.int64
