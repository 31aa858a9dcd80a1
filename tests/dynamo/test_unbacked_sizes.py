"""Data-dependent sizes (nonzero, boolean masks, `.item()`, bincount): the ops defining them
run as ATen calls that bind their size symbols, and the rest of the graph compiles."""

import pytest
import torch
import torch._dynamo
from helpers import assert_same, clone_inputs, compile_minicomp
from torch._dynamo.utils import counters

from minicomp.dynamo.backend import recording
from minicomp.ir.graph import ExternOp


@pytest.fixture(autouse=True)
def _capture_data_dependent_ops():
    with torch._dynamo.config.patch(
        capture_scalar_outputs=True, capture_dynamic_output_shape_ops=True
    ):
        yield


def positive_doubled(x):
    return x[x > 0] * 2 + 1


def normalized_positives(x):
    y = x[x > 0]
    z = torch.softmax(y, 0)
    return (z * y).cumsum(0) + z.max(), y.numel()


def nonzero_positions(x):
    return torch.nonzero(x > 0).float() * 0.5 + 1


def histogram_plus_one(x):
    return torch.bincount(x) + 1


def ones_times_sum(x, n):
    k = n.item()
    return torch.ones(k) * x.sum()


def first_k_scaled(x, n):
    k = n.item()
    torch._check(k >= 0)
    torch._check(k <= x.shape[0])
    return x[:k] * 3


def split_by_counts(x, counts):
    a, b = counts.tolist()
    torch._check(a >= 0)
    torch._check(b >= 0)
    torch._check(a + b == x.shape[0])
    p, q = torch.split(x, [a, b])
    return p.sum() * q.mean()


CASES = [
    (positive_doubled, lambda: (torch.randn(20),)),
    (normalized_positives, lambda: (torch.randn(30),)),
    (nonzero_positions, lambda: (torch.randn(4, 5),)),
    (histogram_plus_one, lambda: (torch.randint(0, 6, (25,)),)),
    (ones_times_sum, lambda: (torch.randn(3), torch.randint(1, 9, ()))),
    (first_k_scaled, lambda: (torch.randn(10), torch.randint(1, 9, ()))),
    (split_by_counts, lambda: (torch.randn(10), torch.tensor([3, 7]))),
]


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize(("fn", "make"), CASES, ids=[fn.__name__ for fn, _ in CASES])
def test_data_dependent_sizes_compile(fn, make, dynamic, target):
    torch.manual_seed(0)
    compiled = compile_minicomp(fn, target, dynamic=dynamic)
    records = []
    counters.clear()
    with recording(records):
        for _ in range(3):  # fresh data: other sizes through the same plan
            args = make()
            assert_same(compiled(*clone_inputs(args)), fn(*args), rtol=1e-5, atol=1e-5)
    assert counters["stats"]["unique_graphs"] == 1, "new data recompiled the frame"
    binders = [n for r in records for n in r.graph.nodes if isinstance(n, ExternOp) and n.binds]
    assert binders, "no ATen call binds the data-dependent size"


def test_gradient_through_a_boolean_mask(target):
    def squares_of_positives(x):
        return (x[x > 0] ** 2).sum()

    compiled = compile_minicomp(squares_of_positives, target)
    for _ in range(2):
        x = torch.randn(20, requires_grad=True)
        x_ref = x.detach().clone().requires_grad_()
        out, expected = compiled(x), squares_of_positives(x_ref)
        assert_same(out, expected, rtol=1e-5, atol=1e-5)
        out.backward()
        expected.backward()
        assert_same(x.grad, x_ref.grad)


def four_positions(x):
    positions = torch.nonzero(x > 0)
    torch._check(positions.size(0) == 4)
    return positions * 10 + 3


def test_a_size_checked_against_a_constant_raises_where_it_differs(target):
    # torch._check(n == 4) makes every size of the graph 4: eager raises where n is not 4, and
    # so must the plan, never run kernels sized for 4 over a result of another size.
    compiled = compile_minicomp(four_positions, target)
    x = torch.tensor([[0.0, 1, -2], [3, 4, 0], [5, -1, 0]])
    assert_same(compiled(x), four_positions(x))
    fewer = torch.tensor([[0.0, 1, -2], [3, 0, 0], [0, -1, 0]])
    with pytest.raises(RuntimeError):
        four_positions(fewer)
    with pytest.raises(RuntimeError, match=r"result.size\(\)\[0\] is 2, but the graph was"):
        compiled(fewer)


def positions_plus(x, y):
    positions = torch.nonzero(x > 0)
    torch._check(positions.size(0) == y.size(0))
    return positions[:, 0].float() + y


def test_a_size_checked_against_another_inputs_size_raises_where_they_differ(target):
    # The count becomes y's size symbol: every call compares the two.
    compiled = compile_minicomp(positions_plus, target, dynamic=True)
    x, y = torch.tensor([1.0, -1, 2, 3, -4, 5]), torch.randn(4)
    assert_same(compiled(x, y), positions_plus(x, y))
    with pytest.raises(RuntimeError):
        positions_plus(x, y[:3])
    with pytest.raises(RuntimeError, match=r"result.size\(\)\[0\] is 4, but the graph was"):
        compiled(x, y[:3])
