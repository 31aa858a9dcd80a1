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


def scale_by_true_division(x):
    # int / SymInt is a float (sympy's IntTrueDiv), never the floor quotient.
    return x * (4 / x.shape[0]) + x.shape[-1] / 3


def resize_to_an_eighth(pos, x):
    # F.interpolate's scale comes from true divisions of symbolic sizes (DINOv2's position
    # embeddings are resized this way for every image size).
    size = (x.shape[-2] // 8, x.shape[-1] // 8)
    return torch.nn.functional.interpolate(pos, size=size, mode="bilinear", align_corners=False)


def test_float_valued_sizes_are_true_divisions(target):
    torch.manual_seed(0)
    scaled = compile_minicomp(scale_by_true_division, target, dynamic=True)
    resized = compile_minicomp(resize_to_an_eighth, target, dynamic=True)
    pos = torch.randn(1, 4, 4, 4)
    for n in (3, 5, 6):
        x = torch.randn(n, 7)
        assert_same(scaled(x), scale_by_true_division(x), rtol=1e-6, atol=1e-6)
    for side in (32, 48, 72):
        x = torch.randn(2, 3, side, side)
        assert_same(resized(pos, x), resize_to_an_eighth(pos, x), rtol=1e-5, atol=1e-5)
