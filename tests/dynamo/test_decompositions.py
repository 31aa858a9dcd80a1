"""The decomposition table AOTAutograd traces with gives what eager's ops give, dtypes
included: a training graph's backward may call the ATen backward of an op the forward
decomposed, with the forward's results."""

import copy

import torch
from helpers import assert_same, compile_minicomp
from torch import nn


def loss_of(layer, x):
    return layer(x).float().square().mean()


def test_a_half_precision_weight_normed_layer_trains(target):
    # The norms weight norm saves are float32 in eager for float16 weights, and its backward
    # refuses float16 ones.
    torch.manual_seed(0)
    layer = nn.utils.parametrizations.weight_norm(nn.Linear(33, 4)).half()
    twin = copy.deepcopy(layer)
    x = torch.randn(5, 33, dtype=torch.float16)
    expected = loss_of(layer, x)
    expected.backward()
    got = compile_minicomp(loss_of, target)(twin, x)
    got.backward()
    assert_same(got, expected, rtol=1e-3, atol=1e-3)
    for p, q in zip(twin.parameters(), layer.parameters(), strict=True):
        assert_same(p.grad, q.grad, rtol=1e-2, atol=1e-2)
