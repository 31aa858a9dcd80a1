"""Softmax, log-softmax and layer-norm lowerings evaluated against PyTorch eager."""

import pytest
import torch
from helpers_lowering import FLOATS, SPECIALS, check_lowering, make_tensor

from minicomp.ir.compute import Compute

aten = torch.ops.aten
SHAPE = (3, 4, 6)
NO_INF = tuple(v for v in SPECIALS if abs(v) != float("inf"))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("dim", [0, 1, -1])
@pytest.mark.parametrize("op", [aten._softmax.default, aten._log_softmax.default], ids=str)
def test_softmax(op, dim, dtype):
    x = make_tensor(SHAPE, dtype, low=-20, high=20)
    x[1, 2, :] = float("-inf")  # a whole row of -inf gives nan in eager
    x[2, :, 3] = float("-inf")
    check_lowering(op, x, dim, False)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("op", [aten._softmax.default, aten._log_softmax.default], ids=str)
def test_softmax_half_to_float(op, dtype):
    x = make_tensor(SHAPE, dtype, special=NO_INF)
    # Eager's CPU kernel refuses half_to_float; the reference is the op on float32 data.
    check_lowering(op, x, -1, True, expected=op(x.float(), -1, False))
    check_lowering(op, x, 1, False)


def test_softmax_symbolic_rows():
    x = make_tensor((5, 7), torch.float32)
    check_lowering(aten._softmax.default, x, -1, False, sym={5: "s0", 7: "s1"})


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("affine", ["both", "weight", "none"])
@pytest.mark.parametrize("normalized", [(6,), (4, 6)], ids=str)
def test_native_layer_norm(normalized, affine, dtype):
    # Eager's Welford mean of a row holding an infinity is position-dependent: NaNs only.
    x = make_tensor(SHAPE, dtype, special=NO_INF)
    w = make_tensor(normalized, dtype, special=False) if affine != "none" else None
    b = make_tensor(normalized, dtype, special=False) if affine == "both" else None
    check_lowering(aten.native_layer_norm.default, x, list(normalized), w, b, 1e-5)


def test_layer_norm_constant_rows_and_symbolic_batch():
    x = make_tensor((5, 8), torch.float32, special=False)
    x[2] = 3.0
    w, b = make_tensor((8,), torch.float32), make_tensor((8,), torch.float32, special=False)
    check_lowering(aten.native_layer_norm.default, x, [8], w, b, 1e-5, sym={5: "s0"})
    check_lowering(aten.native_layer_norm.default, x, [8], None, None, 0.0)


def test_reductions_share_the_row_domain():
    from helpers_lowering import lower

    x = make_tensor((3, 8), torch.float32)
    (out,), _ = lower(aten._softmax.default, (x, 1, False), {}, torch.softmax(x, 1))
    reads = {t.name: t for t in _computes_read(out)}
    # Both the max and the exp-sum reduce the same input over the same extents.
    assert {"out_max", "out_sum"} <= set(reads)
    assert reads["out_max"].shape == reads["out_sum"].shape == (3, 1)


def _computes_read(t):
    from minicomp.ir.compute import inputs_of

    seen, stack = [], [t]
    while stack:
        for u in inputs_of(stack.pop()):
            if isinstance(u, Compute) and u not in seen:
                seen.append(u)
                stack.append(u)
    return seen
