"""Comparing a compiled run with eager: what passes (rounding within the dtype's tolerance, or
as close to float64 as eager is) and what does not (a wrong value, stride, dtype or gradient)."""

import torch

from minicomp.fuzz.check import check_against_eager
from minicomp.fuzz.compare import compare_results, compare_tensor
from minicomp.fuzz.run import Result, evaluate


def _result(*outputs, grads=None):
    return Result(tuple(outputs), (), grads)


def test_a_float32_sum_cast_to_float64_has_float32_tolerance():
    def fn(a):
        return (a.sum().double(),)

    def make_inputs():
        return (torch.randn(5, 2, 4, generator=torch.Generator().manual_seed(37793)),)

    expected = evaluate(fn, make_inputs, backward=False)
    off_by_rounding = _result(expected.outputs[0] + 5e-7)
    assert compare_results(off_by_rounding, expected) is not None
    precision = {torch.float32, torch.float64}
    assert compare_results(off_by_rounding, expected, precision=precision) is None


def _cancelling(a):
    # In float16, eager rounds a * 1000 and the sum: far from the float64 answer, 1.
    return ((a * 1000 + 1) - a * 1000,)


def _inputs():
    return (torch.tensor([3.3, -2.7, 1.1], dtype=torch.float16),)


def _compiled_with(values):
    def compile_(fn, target, dynamic):
        return lambda a: (torch.tensor(values, dtype=torch.float16),)

    return compile_


def test_a_half_result_closer_to_float64_than_eager_passes():
    check_against_eager(_cancelling, _inputs, target="cpu", compiler=_compiled_with([1, 1, 1]))


def test_a_wrong_half_result_fails_though_eager_is_off_too():
    try:
        check_against_eager(_cancelling, _inputs, target="cpu", compiler=_compiled_with([5, 1, 1]))
    except AssertionError as e:
        assert "output 0" in str(e)
    else:
        raise AssertionError("a wrong result passed")


def _promoted_matmul(a, b):
    # a.reciprocal() promotes the integers to the default float dtype; in float32 the
    # product rounds 1e8 + 1 to 1e8, so eager says 0 where float64 says 1.
    return ((a.reciprocal() @ b) - 1e8,)


def _int_and_float_inputs():
    return torch.tensor([[1, 1]]), torch.tensor([[1e8], [1.0]])


def test_the_float64_run_promotes_integers_to_float64_too():
    # The float64 run must not fail (float32 @ float64) and so leave eager's rounding unexcused.
    compiled = _compiled_with_float([[1.0]])
    check_against_eager(_promoted_matmul, _int_and_float_inputs, target="cpu", compiler=compiled)
    assert torch.get_default_dtype() == torch.float32


def _compiled_with_float(values):
    def compile_(fn, target, dynamic):
        return lambda a, b: (torch.tensor(values),)

    return compile_


def test_integers_compare_exactly_and_name_the_first_difference():
    kind, message = compare_tensor(torch.tensor([1, 2, 4]), torch.tensor([1, 2, 3]))
    assert kind == "values"
    assert message == "1 of 3 elements differ; at (2,): 4 (compiled) != 3 (eager)"


def test_strides_count_where_eager_is_dense_and_dims_of_size_1_aside():
    eager = torch.zeros(3, 2).t()
    assert compare_tensor(torch.zeros(2, 3), eager)[0] == "stride"
    assert compare_tensor(torch.zeros(3, 2).t(), eager) is None
    assert compare_tensor(torch.zeros(1, 3), torch.zeros(3, 1).t()) is None
    # Eager's expanded result has no dense layout to match.
    assert compare_tensor(torch.zeros(2, 3), torch.zeros(3).expand(2, 3)) is None
    assert compare_tensor(torch.zeros(3, dtype=torch.int32), torch.zeros(3))[0] == "dtype"


def test_a_missing_gradient_passes_only_where_eager_s_is_zero():
    out = torch.zeros(2)
    zero, nonzero = torch.zeros(3), torch.ones(3)
    assert compare_results(_result(out, grads=(None,)), _result(out, grads=(zero,))) is None
    mismatch = compare_results(_result(out, grads=(None,)), _result(out, grads=(nonzero,)))
    assert mismatch.message == "gradient 0: None (compiled), nonzero (eager)"
    mismatch = compare_results(_result(out, grads=(nonzero,)), _result(out, grads=(None,)))
    assert mismatch.message == "gradient 0: nonzero (compiled), None (eager)"


def test_a_gradient_is_named_by_its_input():
    out, grad = torch.zeros(2), torch.ones(3)
    expected = Result((out,), (), (grad,), wrt=(1,))
    mismatch = compare_results(Result((out,), (), (grad + 1,)), expected, names=("a", "b"))
    assert mismatch.where == "gradient of b"
