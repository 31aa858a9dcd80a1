"""Reduction lowerings evaluated by the reference evaluator against PyTorch eager; then a few
compiled for each target, for what only generated kernels get wrong."""

import pytest
import torch
from helpers import assert_same, compile_minicomp
from helpers_lowering import FLOATS, INTS, SPECIALS, check_lowering, make_tensor

aten = torch.ops.aten
SHAPE = (3, 4, 5)
NO_INF = tuple(v for v in SPECIALS if abs(v) != float("inf"))
DIMS = [[1], [0, 2], [-1], [0, 1, 2]]


@pytest.mark.parametrize("dtype", [*FLOATS, *INTS, torch.bool])
@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("dims", DIMS, ids=str)
def test_sum_amax_amin(dims, keepdim, dtype):
    x = make_tensor(SHAPE, dtype)
    check_lowering(aten.sum.dim_IntList, x, dims, keepdim)
    check_lowering(aten.amax.default, x, dims, keepdim)
    check_lowering(aten.amin.default, x, dims, keepdim)


@pytest.mark.parametrize("dtype", [*FLOATS, *INTS, torch.bool])
def test_full_reductions(dtype):
    x = make_tensor(SHAPE, dtype)
    check_lowering(aten.sum.default, x)
    check_lowering(aten.max.default, x)
    check_lowering(aten.min.default, x)
    check_lowering(aten.amax.default, x)
    if dtype != torch.bool:
        check_lowering(aten.argmax.default, x)
        check_lowering(aten.argmin.default, x, None, True)


def test_sum_dtype_and_empty_dims():
    h = make_tensor(SHAPE, torch.float16, special=False)
    check_lowering(aten.sum.dim_IntList, h, [2], dtype=torch.float32)
    check_lowering(aten.sum.dim_IntList, make_tensor(SHAPE, torch.int32), [0], dtype=torch.float64)
    check_lowering(aten.sum.dim_IntList, make_tensor(SHAPE, torch.int8), [], True)
    check_lowering(aten.sum.dim_IntList, make_tensor((), torch.float32), [])
    check_lowering(aten.mean.dim, h, [1], dtype=torch.float64)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("dims", DIMS, ids=str)
def test_mean(dims, dtype):
    x = make_tensor(SHAPE, dtype)
    check_lowering(aten.mean.dim, x, dims)
    check_lowering(aten.mean.dim, x, dims, True)
    check_lowering(aten.mean.default, x)


@pytest.mark.parametrize("dtype", [*FLOATS, *INTS])
def test_prod(dtype):
    x = make_tensor(SHAPE, dtype, low=-2, high=3)
    check_lowering(aten.prod.dim_int, x, 1)
    check_lowering(aten.prod.dim_int, x, -1, True)
    check_lowering(aten.prod.default, make_tensor((2, 3), dtype, low=-2, high=3))


@pytest.mark.parametrize("dtype", [*FLOATS, *INTS, torch.bool])
@pytest.mark.parametrize("keepdim", [False, True])
def test_max_min_dim_and_arg(keepdim, dtype):
    # Few distinct values, so ties (first index wins) are common.
    x = make_tensor(SHAPE, dtype, low=-2, high=2)
    for dim in (0, 2, -2):
        check_lowering(aten.max.dim, x, dim, keepdim)
        check_lowering(aten.min.dim, x, dim, keepdim)
        if dtype != torch.bool:
            check_lowering(aten.argmax.default, x, dim, keepdim)
            check_lowering(aten.argmin.default, x, dim, keepdim)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("correction", [0, 1, 4, 7])
@pytest.mark.parametrize("dims", [[1], [0, 2], None], ids=str)
def test_var_std(dims, correction, dtype):
    # With an infinity in a row, eager's Welford mean is inf or nan by position; use NaNs only.
    x = make_tensor(SHAPE, dtype, special=NO_INF)
    kw = {"correction": correction}
    check_lowering(aten.var.correction, x, dims, **kw)
    check_lowering(aten.std.correction, x, dims, keepdim=True, **kw)
    check_lowering(aten.var_mean.correction, x, dims, **kw)
    check_lowering(aten.std_mean.correction, x, dims, keepdim=True, **kw)


def test_var_default_correction_finite_data():
    x = make_tensor(SHAPE, torch.float64, special=False)
    check_lowering(aten.var.correction, x, [2])
    check_lowering(aten.var_mean.correction, x, [0, 1], keepdim=True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.int64, torch.uint8, torch.bool])
@pytest.mark.parametrize("name", ["any", "all"])
def test_any_all(name, dtype):
    x = make_tensor(SHAPE, dtype, low=0, high=2)
    op = getattr(aten, name)
    check_lowering(op.dim, x, 1)
    check_lowering(op.dim, x, -1, True)
    check_lowering(op.dims, x, [0, 2])
    check_lowering(op.dims, x, None, True)
    check_lowering(op.default, x)


@pytest.mark.parametrize("dtype", [*FLOATS, torch.int32])
def test_logsumexp(dtype):
    x = make_tensor(SHAPE, dtype, low=-30, high=30)
    if dtype.is_floating_point:
        x[0, 1] = float("-inf")
        x[1, 2, :] = float("-inf")
        x[2, 0, 1] = float("inf")
    check_lowering(aten.logsumexp.default, x, [2])
    check_lowering(aten.logsumexp.default, x, [0, 2], True)


def test_symbolic_mean_and_var():
    x = make_tensor((6, 5), torch.float32, special=NO_INF)
    check_lowering(aten.mean.dim, x, [0], sym={6: "s0"})
    check_lowering(aten.var_mean.correction, x, [0], correction=1, sym={6: "s0", 5: "s1"})
    check_lowering(aten.argmax.default, x, None, sym={6: "s0"})


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("ord", [2, 1, float("inf"), float("-inf"), 0, 3, 0.5, -1])
@pytest.mark.parametrize("dim, keepdim", [(None, False), ([-1], True), ([0, 2], False)], ids=str)
def test_linalg_vector_norm(dim, keepdim, ord, dtype):
    x = make_tensor((3, 4, 5), dtype, special=False)
    x[1, 2, :2] = 0.0  # zeros count for ord 0 and give inf terms for negative orders
    check_lowering(aten.linalg_vector_norm.default, x, ord, dim, keepdim)


def _norm_float64(x, ord, dim, keepdim):
    """The norm in float64, scaled by the extreme |x| so no power leaves float range; eager
    itself overflows to inf (or underflows to 0) there, except over a single element."""
    m = x.double().abs()
    s = (m.amax if ord > 0 else m.amin)(dim=dim, keepdim=True)
    safe = torch.where(s == 0, 1.0, s)
    norm = s * ((m / safe) ** ord).sum(dim, keepdim=True) ** (1.0 / ord)
    norm = torch.where((s == 0) | s.isinf(), s, norm)
    return (norm if keepdim else norm.squeeze(dim)).to(x.dtype)


@pytest.mark.parametrize("ord", [1000, -1000, 40, -40, 7])
def test_vector_norms_of_large_orders_neither_overflow_nor_underflow(ord):
    x = make_tensor((3, 5), torch.float32, low=0.25, high=9.0, special=False)
    x[1, :] = 0.0  # all zeros: the norm is 0 for any order
    x[2, 3] = 0.0  # one zero: the norm is 0 for a negative order
    for case in (x, x[:, :1]):  # five elements, and one (where eager is exact too)
        expected = _norm_float64(case, ord, 1, False)
        check_lowering(aten.linalg_vector_norm.default, case, ord, [1], False, expected=expected)
    check_lowering(aten.linalg_vector_norm.default, x[:, :1], ord, [1], True)
    x[0, 1] = float("inf")
    expected = _norm_float64(x, ord, 1, False)
    check_lowering(aten.linalg_vector_norm.default, x, ord, [1], False, expected=expected)


def test_linalg_vector_norm_in_another_dtype():
    x = make_tensor((4, 6), torch.float16, special=False)
    check_lowering(aten.linalg_vector_norm.default, x, 2, [1], False, dtype=torch.float32)


# --- compiled ------------------------------------------------------------------------------


def _ties_and_extremes(shape, dtype, seed) -> torch.Tensor:
    """Few distinct values (ties everywhere), with the dtype's extremes (the identities of max
    and min) among them, for integers; NaN and infinities among them, for floats."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(-2, 3, shape, generator=gen).to(dtype)
    if dtype.is_floating_point:
        lo, hi = float("-inf"), float("inf")
    else:
        lo, hi = torch.iinfo(dtype).min, torch.iinfo(dtype).max
    pick = torch.randint(0, 12, shape, generator=gen)
    x[pick == 0], x[pick == 1] = lo, hi
    if dtype.is_floating_point:
        x[(pick == 2) & (torch.rand(shape, generator=gen) < 0.1)] = float("nan")
    return x


def _lone_extremes(shape, dim, dtype, seed) -> torch.Tensor:
    """Ties of small values, and the dtype's extremes once each, late along `dim` (so the
    first of the ties and the extreme are in different threads and warps)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(-2, 3, shape, generator=gen).to(dtype)
    flat = x.view(-1) if dim is None else x
    along = 0 if dim is None else dim
    n = flat.shape[along]
    if dtype.is_floating_point:
        lo, hi = float("-inf"), float("inf")
    else:
        lo, hi = torch.iinfo(dtype).min, torch.iinfo(dtype).max
    flat.narrow(along, n * 2 // 3, 1).fill_(lo)
    flat.narrow(along, n * 5 // 6, 1).fill_(hi)
    return x


ARG_CALLS = {
    "argmax": lambda x, dim: x.argmax(dim, keepdim=dim is not None),
    "argmin": lambda x, dim: torch.argmin(x, dim=dim),
    "max.indices": lambda x, dim: x.max(dim=dim, keepdim=True),
    "min.indices": lambda x, dim: x.min(dim=dim),
}


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("dtype", [torch.int64, torch.float32], ids=str)
@pytest.mark.parametrize("name", list(ARG_CALLS))
def test_compiled_argmax_argmin_take_the_first_of_ties(name, dtype, dynamic, target):
    # Shapes that reach every CUDA reduction: a warp per short row, a block per long or
    # symbolic one, a split over blocks for a long whole-tensor reduction. One graph reduces
    # them all, each with its own kernel: a compile per case cost more than the cases.
    call = ARG_CALLS[name]
    cases = [((1, 2), -1), ((2, 2), 0), ((6, 8), None), ((3, 1500), 1), ((9000,), None)]
    # max()/min() of a whole tensor return no index
    cases = [(shape, dim) for shape, dim in cases if dim is not None or name.startswith("arg")]
    dims = [dim for _, dim in cases]

    def reduce_each(*xs):
        return [call(x, dim) for x, dim in zip(xs, dims, strict=True)]

    compiled = compile_minicomp(reduce_each, target, dynamic)
    inputs = [
        [_ties_and_extremes(shape, dtype, seed=1000 * k + 7) for k, (shape, _) in enumerate(cases)],
        [
            _lone_extremes(shape, dim, dtype, seed=1000 * k + 8)
            for k, (shape, dim) in enumerate(cases)
        ],
    ]
    if not dtype.is_floating_point:  # every element the extreme: index 0
        inputs.append(
            [torch.full(shape, torch.iinfo(dtype).max, dtype=dtype) for shape, _ in cases]
        )
    for xs in inputs:
        assert_same(compiled(*[x.clone() for x in xs]), reduce_each(*xs), equal_nan=True)


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("ord", [3, 0.5, 1, 2, 0, 7.5])
def test_compiled_vector_norm_of_an_empty_reduction_is_zero(ord, dynamic, target):
    # Eager's norm over no elements is 0 for any order that has one (not for negative orders
    # or +-inf, which eager rejects), as is the norm of zeros. One graph takes every shape.
    def norms(*xs):
        return [torch.linalg.vector_norm(x, ord=ord, dim=(0, 1)) for x in xs]

    compiled = compile_minicomp(norms, target, dynamic)
    xs = [torch.randn(shape) for shape in ((0, 1), (0, 3, 2), (2, 0, 4), (3, 4, 2))]
    assert_same(compiled(*xs), norms(*xs))
