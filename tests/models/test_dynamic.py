"""dynamic=True: new batch sizes and sequence lengths reuse one compiled graph."""

import itertools

import torch
from helpers import assert_same, compile_minicomp
from torch._dynamo.utils import counters

HIDDEN = 32
# No size is 0 or 1 (dynamo specializes those) and no two sizes of the first call are equal
# (duck sizing would tie them into one symbol and recompile when they differ).
BATCH_SIZES = (2, 3, 5)
SEQUENCE_LENGTHS = (7, 16, 33)


def softmax_norm_block(x, weight, bias):
    y = torch.softmax(x, dim=-1) * 4.0 + x
    y = torch.nn.functional.layer_norm(y, (HIDDEN,), weight, bias)
    return torch.tanh(y) * 0.5 + torch.sigmoid(y) - 1.0


def test_new_shapes_reuse_one_graph(target):
    torch.manual_seed(0)
    weight, bias = torch.randn(HIDDEN), torch.randn(HIDDEN)
    compiled = compile_minicomp(softmax_norm_block, target, dynamic=True)
    counters.clear()
    for batch, seq in itertools.product(BATCH_SIZES, SEQUENCE_LENGTHS):
        x = torch.randn(batch, seq, HIDDEN)
        expected = softmax_norm_block(x, weight, bias)
        assert_same(compiled(x, weight, bias), expected, rtol=1e-5, atol=1e-5)
    assert counters["stats"]["unique_graphs"] == 1, "the frame was compiled more than once"
    assert not counters["graph_break"]
