"""Softmax, log-softmax, layer-norm and batch-norm lowerings evaluated against PyTorch eager."""

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


# ---- batch norm ----

BN_SHAPES = {"NC": (6, 5), "NCL": (4, 5, 7), "NCHW": (2, 5, 4, 6)}


def _bn_params(channels, stats_dtype, affine, seed=0):
    g = torch.Generator().manual_seed(seed)
    mean = torch.randn(channels, generator=g).to(stats_dtype)
    var = (torch.rand(channels, generator=g) + 0.5).to(stats_dtype)
    if not affine:
        return mean, var, None, None
    w = (torch.rand(channels, generator=g) + 0.5).to(stats_dtype)
    return mean, var, w, torch.randn(channels, generator=g).to(stats_dtype)


@pytest.mark.parametrize("dtype", FLOATS + (torch.bfloat16,))
@pytest.mark.parametrize("affine", [True, False], ids=["affine", "plain"])
@pytest.mark.parametrize("shape", list(BN_SHAPES))
def test_batch_norm_inference_lowering(shape, affine, dtype):
    x = make_tensor(BN_SHAPES[shape], dtype, special=NO_INF)
    # Half inputs come with f32 statistics and parameters, as in a module under autocast.
    stats = torch.float32 if dtype in (torch.float16, torch.bfloat16) else dtype
    mean, var, w, b = _bn_params(x.shape[1], stats, affine)
    op = aten._native_batch_norm_legit_no_training.default
    check_lowering(op, x, w, b, mean, var, 0.1, 1e-5)


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("affine", [True, False], ids=["affine", "plain"])
@pytest.mark.parametrize("shape", list(BN_SHAPES))
def test_batch_norm_batch_statistics_lowering(shape, affine, dtype):
    x = make_tensor(BN_SHAPES[shape], dtype, special=False)
    _, _, w, b = _bn_params(x.shape[1], dtype, affine)
    check_lowering(aten._native_batch_norm_legit.no_stats, x, w, b, True, 0.1, 1e-5)


BN_TOLERANCE = {
    torch.float32: (1e-5, 1e-5),
    torch.float16: (2e-3, 2e-3),
    torch.bfloat16: (1e-2, 1e-2),
}


def _compile_records(fn, *args, target, rtol, atol):
    from helpers import check_compiled

    from minicomp.dynamo.backend import recording

    records: list = []
    with recording(records), torch.no_grad():
        check_compiled(fn, *args, target=target, rtol=rtol, atol=atol)
    return records


def _assert_no_batch_norm_extern(records):
    from minicomp.ir.graph import ExternOp

    assert records
    for record in records:
        externs = [n.name for n in record.graph.nodes if isinstance(n, ExternOp)]
        assert not [e for e in externs if "batch_norm" in e], externs


@pytest.mark.parametrize("layout", ["NC", "NCL", "NCHW", "NHWC"])
@pytest.mark.parametrize("affine", [True, False], ids=["affine", "plain"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_batch_norm_inference_compiled(target, dtype, affine, layout):
    x = torch.randn(BN_SHAPES.get(layout, BN_SHAPES["NCHW"]), dtype=dtype) * 3 + 1
    if layout == "NHWC":
        x = x.to(memory_format=torch.channels_last)
    mean, var, w, b = _bn_params(x.shape[1], torch.float32, affine, seed=1)

    def fn(x, mean, var, w, b):
        return torch.nn.functional.batch_norm(x, mean, var, w, b, False, 0.1, 1e-5) * 2

    rtol, atol = BN_TOLERANCE[dtype]
    records = _compile_records(fn, x, mean, var, w, b, target=target, rtol=rtol, atol=atol)
    _assert_no_batch_norm_extern(records)


@pytest.mark.parametrize("channels_last", [False, True], ids=["nchw", "nhwc"])
def test_conv_batch_norm_relu_is_one_template_kernel(channels_last):
    from minicomp.ir.contraction import match_contraction
    from minicomp.ir.graph import FusedOp

    torch.manual_seed(0)
    nn = torch.nn
    bn = nn.BatchNorm2d(12)
    bn.running_mean.uniform_(-0.5, 0.5)
    bn.running_var.uniform_(0.5, 2.0)
    bn.weight.data.uniform_(0.5, 1.5)
    bn.bias.data.uniform_(-0.5, 0.5)
    model = nn.Sequential(nn.Conv2d(6, 12, 3, padding=1, bias=False), bn, nn.ReLU()).eval()
    x = torch.randn(2, 6, 9, 11)
    if channels_last:
        model = model.to(memory_format=torch.channels_last)
        x = x.contiguous(memory_format=torch.channels_last)
    records = _compile_records(model, x, target="cuda-emu", rtol=1e-4, atol=1e-4)
    _assert_no_batch_norm_extern(records)
    (record,) = records
    (group,) = [n for n in record.graph.nodes if isinstance(n, FusedOp)]
    assert any("batch_norm" in m for m in group.members)
    assert match_contraction(group) is not None
    (kernel,) = record.kernels
    assert kernel.attrs.template


GN_SHAPES = {"NC": (3, 8), "NCL": (2, 8, 5), "NCHW": (2, 8, 3, 4), "NCDHW": (2, 8, 2, 3, 2)}


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("affine", [True, False], ids=["affine", "plain"])
@pytest.mark.parametrize("groups", [1, 4, 8])
@pytest.mark.parametrize("shape", list(GN_SHAPES))
def test_native_group_norm_lowering(shape, groups, affine, dtype):
    x = make_tensor(GN_SHAPES[shape], dtype, special=False)
    n, c = x.shape[:2]
    hxw = x[0, 0].numel()
    if hxw * c // groups == 1:
        # One element a group: out = (x - x) * rsqrt(eps) is eager's mean rounding x 316.
        pytest.skip("a group of one element normalises rounding noise")
    w = make_tensor((c,), dtype, special=False) if affine else None
    b = make_tensor((c,), dtype, special=False) if affine else None
    check_lowering(aten.native_group_norm.default, x, w, b, n, c, hxw, groups, 1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_group_norm_compiled_after_a_convolution(target, dtype):
    # A UNet / diffusion block: conv, group norm, SiLU; no op may run as ATen but the conv.
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(4, 16, 3, padding=1).to(dtype)
    norm = torch.nn.GroupNorm(4, 16).to(dtype)
    torch.nn.init.normal_(norm.weight)
    torch.nn.init.normal_(norm.bias)

    def block(x):
        return torch.nn.functional.silu(norm(conv(x)))

    rtol, atol = BN_TOLERANCE[dtype]
    records = _compile_records(block, torch.randn(2, 4, 6, 5, dtype=dtype), target=target,
                               rtol=rtol, atol=atol)  # fmt: skip
    from minicomp.ir.graph import ExternOp

    externs = [n.name for r in records for n in r.graph.nodes if isinstance(n, ExternOp)]
    assert not [e for e in externs if "group_norm" in e], externs


# Each statistic of values near 1000 spread by 0.01, with the error float32 allows it (an ulp
# of the mean, 6.1e-5, scaled by what the output does with the mean).
FAR_FROM_ZERO = {
    "layer_norm": (lambda x: torch.nn.functional.layer_norm(x, (4096,)), 6.1e-5 / 0.01),
    "group_norm": (lambda x: torch.nn.functional.group_norm(x.view(4, 8, 512), 2), 6.1e-5 / 0.01),
    "var": (lambda x: torch.var(x, 1), 1e-4 * 1e-5),
    "mean_of_var_mean": (lambda x: torch.var_mean(x, 1)[1], 6.1e-5),
}


@pytest.mark.parametrize("case", sorted(FAR_FROM_ZERO))
def test_statistics_of_values_far_from_zero_are_float32_accurate(case, target):
    # A plain float32 sum of 4096 values near 1000 puts the mean ulps off, which a norm then
    # divides by the std: 0.021 from float64 where eager is 0.003 before the corrected mean.
    from helpers import compile_minicomp

    fn, bound = FAR_FROM_ZERO[case]
    x = 1000 + torch.randn(4, 4096) * 0.01
    got = compile_minicomp(fn, target)(x)
    error = (got.double() - fn(x.double())).abs().max().item()
    assert error <= bound, f"{case}: {error:.3g} from float64 (allowed {bound:.3g})"
