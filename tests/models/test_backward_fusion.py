"""Backward graphs whose fusion once closed a cycle through a third kernel ("fusion produced a
cycle"): they compile whole and their gradients match eager."""

import pytest
import torch
from helpers import assert_same, compile_minicomp


def _check_gradients(fn, make, target, dynamic, tol=1e-5):
    compiled = compile_minicomp(fn, target, dynamic=dynamic)
    for _ in range(2):
        args = make()
        leaves = [a for a in args if a.requires_grad]
        ref_args = [a.detach().clone().requires_grad_(a.requires_grad) for a in args]
        ref_leaves = [a for a in ref_args if a.requires_grad]
        out, expected = compiled(*args), fn(*ref_args)
        assert_same(out, expected, rtol=tol, atol=tol)
        grad = torch.randn_like(expected)
        actual_grads = torch.autograd.grad(out, leaves, grad)
        expected_grads = torch.autograd.grad(expected, ref_leaves, grad)
        assert_same(actual_grads, expected_grads, rtol=tol, atol=tol)


def group_norm_with_its_statistics(x, weight, bias):
    n, c, h, w = x.shape
    out, mean, rstd = torch.native_group_norm(x, weight, bias, n, c, h * w, 2, 1e-5)
    return out * 2 + mean.sum() + rstd.mean()


def group_norm_plus_its_mean(x, weight, bias):
    n, c, h, w = x.shape
    out, mean, _ = torch.native_group_norm(x, weight, bias, n, c, h * w, 2, 1e-5)
    return out + mean.view(n, 2, 1, 1).repeat_interleave(c // 2, 1)


@pytest.mark.parametrize("dynamic", [False, True])
@pytest.mark.parametrize("fn", [group_norm_with_its_statistics, group_norm_plus_its_mean])
def test_group_norm_statistics_backward(fn, dynamic, target):
    torch.manual_seed(0)

    def make():
        return (
            torch.randn(2, 4, 3, 3, requires_grad=True),
            torch.randn(4, requires_grad=True),
            torch.randn(4, requires_grad=True),
        )

    _check_gradients(fn, make, target, dynamic, tol=1e-4)


INDEX = torch.tensor([[0, 1, 2, 3, 0], [1, 1, 0, 2, 3], [2, 0, 3, 3, 1]] * 2)


def scatter_product_total(x, src):
    return torch.scatter_reduce(x, 0, INDEX, src, "prod", include_self=False).sum()


@pytest.mark.parametrize("dynamic", [False, True])
def test_scatter_reduce_product_backward(dynamic, target):
    torch.manual_seed(0)

    def make():
        src = torch.randn(6, 5)
        src[torch.rand(6, 5) < 0.3] = 0  # zeros take the backward's other branch
        return torch.randn(4, 5, requires_grad=True), src.requires_grad_()

    _check_gradients(scatter_product_total, make, target, dynamic)


class ConvBatchNormReLU(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 4, 3)
        self.bn = torch.nn.BatchNorm2d(4).eval()
        with torch.no_grad():
            self.bn.running_mean.uniform_(-1, 1)
            self.bn.running_var.uniform_(0.5, 2)

    def forward(self, x):
        return torch.relu(self.bn(self.conv(x)))


def test_conv_batch_norm_relu_backward_with_dynamic_shapes(target):
    torch.manual_seed(0)
    model = ConvBatchNormReLU()
    compiled = compile_minicomp(model, target, dynamic=True)
    for batch, side in ((2, 8), (3, 10)):
        x = torch.randn(batch, 3, side, side, requires_grad=True)
        x_ref = x.detach().clone().requires_grad_()
        out, expected = compiled(x), model(x_ref)
        assert_same(out, expected, rtol=1e-5, atol=1e-5)
        grad = torch.randn_like(expected)
        params = list(model.parameters())
        actual = torch.autograd.grad(out, [x, *params], grad)
        wanted = torch.autograd.grad(expected, [x_ref, *params], grad)
        assert_same(actual, wanted, rtol=1e-4, atol=1e-4)
