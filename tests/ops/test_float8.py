"""float8 graphs compiled for each target, bit for bit against eager: torchao-style per-tensor
and per-row dynamic quantization, dequantization, chains of casts, and the few float8 ops
eager computes (abs, mul, copies, views, cat, where), every one in a kernel (no ATen call)."""

import pytest
import torch
from helpers import clone_inputs, compile_minicomp
from helpers_float8 import bits, boundary_floats, float8_params
from helpers_lowering import check_lowering
from torch.utils import _pytree as pytree

import minicomp

aten = torch.ops.aten
E4M3 = torch.float8_e4m3fn
E5M2 = torch.float8_e5m2
E4M3_MAX = torch.finfo(E4M3).max


def quantize(x):
    """Per-tensor dynamic scaling as torchao's float8 training writes it."""
    amax = x.abs().max()
    scale = E4M3_MAX / amax.clamp(min=1e-12)
    q = (x * scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)
    return q, scale


def quantize_rows(x):
    """Per-row scales (torchao's rowwise recipe), the scale's reciprocal kept for the matmul."""
    amax = x.abs().amax(dim=-1, keepdim=True).float()
    scale = E4M3_MAX / torch.clamp(amax, min=1e-12)
    q = (x.float() * scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)
    return q, scale.reciprocal()


def dequantize(q, scale):
    return q.to(torch.float32) / scale


def quantize_round_trip(x):
    q, scale = quantize(x)
    return dequantize(q, scale).to(torch.bfloat16)


def cast_chain(x):
    y = x.to(E5M2).to(torch.bfloat16).to(E4M3).to(torch.float16) * 2
    return y, y.to(torch.float8_e4m3fnuz).to(torch.float8_e5m2fnuz), x.double().to(E5M2)


def float8_ops(q, r):
    """What eager computes on float8 tensors: abs, products (in float32, rounded), copies of
    strided views, concatenation, where, comparisons."""
    t = q.t().contiguous()
    both = torch.cat([q.abs(), q * r])
    picked = torch.where(q.float() > 0, q, r)
    return t, both, picked, q == r, q.isnan()


def assert_bitwise(actual, expected):
    """Same structure, dtypes, shapes, strides and bits (NaNs of float8 bit for bit too)."""
    a_leaves, a_spec = pytree.tree_flatten(actual)
    e_leaves, e_spec = pytree.tree_flatten(expected)
    assert a_spec == e_spec
    for k, (a, e) in enumerate(zip(a_leaves, e_leaves, strict=True)):
        assert a.dtype == e.dtype and a.shape == e.shape, (k, a.dtype, e.dtype, a.shape)
        assert a.stride() == e.stride(), (k, a.stride(), e.stride())
        a, e = a.cpu(), e.cpu()
        if e.is_floating_point() and e.itemsize > 1:
            nan = e.isnan()
            assert torch.equal(a.isnan(), nan), k
            assert torch.equal(bits(a)[~nan], bits(e)[~nan]), k
        else:
            assert torch.equal(
                bits(a) if e.is_floating_point() else a, bits(e) if e.is_floating_point() else e
            ), k


def check_float8(fn, *args, target: str):
    """`fn` compiled for `target` gives eager's bits, with every op in a kernel."""
    expected = fn(*clone_inputs(args))
    actual = compile_minicomp(fn, target)(*clone_inputs(args))
    assert_bitwise(actual, expected)
    torch._dynamo.reset()
    report = minicomp.explain(fn, *args, options={"target": target})
    assert report.aten_call_count == 0, report.fallbacks
    assert report.kernel_count >= 1


def _activations(*shape, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=g) * torch.logspace(-3, 3, shape[-1])
    return x


def test_per_tensor_quantization(target):
    check_float8(quantize, _activations(48, 160), target=target)


def test_per_row_quantization(target):
    x = _activations(32, 96).to(torch.bfloat16)
    x[3] = 0  # an all-zero row: the clamp keeps its scale finite
    check_float8(quantize_rows, x, target=target)


def test_dequantization(target):
    q, scale = quantize(_activations(40, 72, seed=1))
    check_float8(dequantize, q, scale, target=target)


def test_quantize_dequantize_fused(target):
    check_float8(quantize_round_trip, _activations(16, 200, seed=2), target=target)


def test_cast_chain_with_special_values(target):
    """Saturation and overflow to inf, NaN, subnormals, zeros of both signs, through formats
    with and without infinity and negative zero."""
    specials = torch.tensor(
        [0.0, -0.0, 1e-10, -3e-3, 2.0**-9, 2.0**-17, 464.0, 480.0, 6e4, 1e6, -1e6]
        + [float("inf"), float("-inf"), float("nan")]
    )
    x = torch.cat([specials, _activations(1, 250, seed=3).flatten()]).reshape(12, 22)
    check_float8(cast_chain, x, target=target)


def _nonzero_float8(*shape, seed):
    """Values of both signs in [2^-6, 448): eager's float8 abs gives -0 and NaN their sign
    back in its vectorised loop and not in its scalar one, so zeros and NaNs have no one
    expected bit pattern there."""
    g = torch.Generator().manual_seed(seed)
    magnitude = torch.exp2(torch.rand(*shape, generator=g) * 14.8 - 6)
    sign = torch.randint(0, 2, shape, generator=g) * 2 - 1
    return (magnitude * sign).to(E4M3)


def test_float8_ops_eager_computes(target):
    q, r = _nonzero_float8(24, 40, seed=4), _nonzero_float8(24, 40, seed=5)
    check_float8(float8_ops, q, r, target=target)


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fnuz, torch.float8_e5m2fnuz])
def test_fnuz_round_trip(target, dtype):
    x = _activations(8, 64, seed=6)
    check_float8(lambda x: (x.to(dtype), x.to(dtype).float() * 0.5), x, target=target)


@pytest.mark.parametrize("dt", float8_params())
def test_cast_lowerings_evaluate_like_eager(dt):
    """_to_copy to and from float8 (float64 rounding through float32), by the reference
    evaluator."""
    x = boundary_floats(dt)
    (q,) = check_lowering(aten._to_copy.default, x, dtype=dt)
    assert torch.equal(bits(q), bits(x.to(dt)))
    (q,) = check_lowering(aten._to_copy.default, x.double(), dtype=dt)
    assert torch.equal(bits(q), bits(x.double().to(dt)))
    (back,) = check_lowering(aten._to_copy.default, x.to(dt), dtype=torch.float32)
    assert torch.equal(bits(back), bits(x.to(dt).float()))
