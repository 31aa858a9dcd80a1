"""Matrix products and convolutions become compute ops on the CUDA targets and stay ATen calls
on the CPU."""

import pytest
import torch
import torch.nn.functional as F
from helpers import assert_same, check_compiled, clone_inputs, compile_minicomp
from helpers_graph import PassGraphBuilder, assert_graph_equal
from torch.utils import _pytree as pytree

import minicomp
from minicomp.dynamo.backend import recording
from minicomp.ir import types as T
from minicomp.ir.compute import reduce
from minicomp.ir.contraction import match_contraction
from minicomp.ir.expr import cast, logical_and, maximum, minimum, select
from minicomp.ir.graph import ArgRef, ExternOp, FusedOp
from minicomp.passes.graph.anchors import lower_anchors

aten = torch.ops.aten
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
TOLERANCE = {torch.float32: (1e-4, 1e-4), torch.float16: (2e-3, 2e-3), torch.bfloat16: (2e-2, 2e-2)}


# ---- the pass, on graphs built by hand ----


def conv_args(bias: bool, padding: int, groups: int) -> tuple:
    """aten.convolution's arguments for a 1-d convolution of stride 1 and dilation 1."""
    return (ArgRef(0), ArgRef(1), ArgRef(2) if bias else None, (1,), (padding,), (1,), False,
            (0,), groups)  # fmt: skip


def test_products_become_sums_in_the_accumulator_type():
    b = PassGraphBuilder()
    a, w = b.input("a", (4, 8), T.f16), b.input("w", (8, 5), T.f16)
    p, q = b.input("p", (3, 4, 8)), b.input("q", (3, 8, 2))
    b.output(
        b.extern("mm", aten.mm.default, [a, w], (4, 5), T.f16),
        b.extern("bmm", aten.bmm.default, [p, q], (3, 4, 2)),
    )

    # f16 operands are multiplied and summed in f32, the result cast back.
    e = PassGraphBuilder()
    a, w = e.input("a", (4, 8), T.f16), e.input("w", (8, 5), T.f16)
    p, q = e.input("p", (3, 4, 8)), e.input("q", (3, 8, 2))

    def mm(i, j):
        return cast(
            reduce("sum", (8,), lambda k: cast(a[i, k], T.f32) * cast(w[k, j], T.f32)), T.f16
        )

    def bmm(n, i, j):
        return reduce("sum", (8,), lambda k: p[n, i, k] * q[n, k, j])

    e.output(e.compute("mm", (4, 5), mm), e.compute("bmm", (3, 4, 2), bmm))
    assert_graph_equal(lower_anchors(b.build()), e.build())


def test_addmm_adds_its_scaled_bias_in_a_second_op():
    b = PassGraphBuilder()
    bias, a, w = b.input("bias", (1, 5)), b.input("a", (4, 8)), b.input("w", (8, 5))
    scales = (("beta", 0.5), ("alpha", 2.0))
    b.output(b.extern("y", aten.addmm.default, [bias, a, w], (4, 5), kwargs=scales))

    # The product, then alpha * product + beta * bias (the bias row broadcast over i): two
    # ops named after the call, the product's value after the output.
    e = PassGraphBuilder()
    bias, a, w = e.input("bias", (1, 5)), e.input("a", (4, 8)), e.input("w", (8, 5))
    mm = e.compute(
        "y_mm", (4, 5), lambda i, j: reduce("sum", (8,), lambda k: a[i, k] * w[k, j]), op="y"
    )
    y = e.compute("y", (4, 5), lambda i, j: mm[i, j] * 2.0 + bias[0, j] * 0.5)
    e.output(y)
    assert_graph_equal(lower_anchors(b.build()), e.build())


def test_convolution_is_a_sum_over_channels_and_taps_guarded_at_the_padding():
    b = PassGraphBuilder()
    x, w, bias = b.input("x", (2, 4, 7)), b.input("w", (6, 4, 3)), b.input("bias", (6,))
    args = conv_args(bias=True, padding=1, groups=1)
    b.output(b.extern("y", aten.convolution.default, [x, w, bias], (2, 6, 7), args=args))

    # y[n, o, p] = sum over c, r of x[n, c, p + r - 1] * w[o, c, r], the input 0 outside
    # [0, 7) (the index clamped into range, so the load stays in bounds); then the bias.
    e = PassGraphBuilder()
    x, w, bias = e.input("x", (2, 4, 7)), e.input("w", (6, 4, 3)), e.input("bias", (6,))

    def window(n, c, p, r):
        at = p + r - 1
        inside = logical_and(at >= 0, maximum(at, 0) < 7)
        return select(inside, x[n, c, minimum(maximum(at, 0), 6)], 0.0)

    def conv(n, o, p):
        return reduce("sum", (4, 3), lambda c, r: window(n, c, p, r) * w[o, c, r])

    total = e.compute("y_conv", (2, 6, 7), conv, op="y")
    e.output(e.compute("y", (2, 6, 7), lambda n, o, p: total[n, o, p] + bias[o]))
    assert_graph_equal(lower_anchors(b.build()), e.build())


def test_depthwise_convolution_unrolls_its_taps_and_guards_only_the_edge_ones():
    b = PassGraphBuilder()
    x, w = b.input("x", (2, 4, 7)), b.input("w", (4, 1, 3))
    args = conv_args(bias=False, padding=1, groups=4)
    b.output(b.extern("y", aten.convolution.default, [x, w], (2, 4, 7), args=args))

    # One output per thread: the three taps summed in the expression, the first guarded at
    # the left edge, the last at the right one. (Each tap's offset is an integer added.)
    e = PassGraphBuilder()
    x, w = e.input("x", (2, 4, 7)), e.input("w", (4, 1, 3))

    def conv(n, o, p):
        left = select(p + -1 >= 0, x[n, o, maximum(p + -1, 0)], 0.0)
        right = select(p + 1 < 7, x[n, o, minimum(p + 1, 6)], 0.0)
        return left * w[o, 0, 0] + x[n, o, p] * w[o, 0, 1] + right * w[o, 0, 2]

    e.output(e.compute("y", (2, 4, 7), conv))
    assert_graph_equal(lower_anchors(b.build()), e.build())


def test_grouped_convolution_is_a_batched_sum_and_a_view():
    b = PassGraphBuilder()
    x, w = b.input("x", (2, 4, 7)), b.input("w", (6, 2, 3))
    args = conv_args(bias=False, padding=0, groups=2)
    b.output(b.extern("y", aten.convolution.default, [x, w], (2, 6, 5), args=args))

    # Output channel o = 3g + oo of group g reads input channels 2g, 2g + 1: computed over
    # (n, g, oo, p), g read by both operands (a batch axis), then viewed back as (n, o, p).
    e = PassGraphBuilder()
    x, w = e.input("x", (2, 4, 7)), e.input("w", (6, 2, 3))

    def conv(n, g, oo, p):
        return reduce("sum", (2, 3), lambda c, r: x[n, g * 2 + c, p + r] * w[g * 3 + oo, c, r])

    groups = e.compute("y_groups", (2, 2, 3, 5), conv, op="y")
    e.output(e.compute("y", (2, 6, 5), lambda n, o, p: groups[n, o // 3, o % 3, p]))
    assert_graph_equal(lower_anchors(b.build()), e.build())


def test_calls_it_cannot_lower_stay_aten_calls():
    b = PassGraphBuilder()
    s = b.symbol("s")
    a, w, bias = b.input("a", (4, 8)), b.input("w", (8, 5)), b.input("bias", (5,))
    i, iw = b.input("i", (4, 8), T.i64), b.input("iw", (8, 5), T.i64)
    h = b.input("h", (8, 5), T.f16)
    x, wt = b.input("x", (2, 4, 7)), b.input("wt", (4, 6, 3))
    transposed = (ArgRef(0), ArgRef(1), None, (1,), (0,), (1,), True, (0,), 1)
    b.output(
        b.extern("ints", aten.mm.default, [i, iw], (4, 5), T.i64),  # no accumulator type
        b.extern("mixed", aten.mm.default, [a, h], (4, 5)),  # f32 times f16
        # A scale known at run time only.
        b.extern("scaled", aten.addmm.default, [bias, a, w], (4, 5), kwargs=(("alpha", s * 2),)),
        b.extern("transposed", aten.convolution.default, [x, wt], (2, 6, 9), args=transposed),
    )
    g = b.build()
    assert lower_anchors(g) is g


def _explain(fn, *args, target):
    torch._dynamo.reset()
    return minicomp.explain(fn, *args, options={"target": target})


def _check_each(fn, cases: dict, *, target: str, tolerance: dict) -> list:
    """`fn` on each case's arguments (case name: argument tuple), compiled once for all of
    them, each result compared with float64 eager within its dtype's (rtol, atol); the
    CompileRecords. One compilation for all the cases, as a compilation costs more than its
    kernels, and most on cuda-emu, which builds every kernel in C."""
    names = list(cases)
    sizes = [len(cases[name]) for name in names]

    def each(*flat):
        out, at = {}, 0
        for name, size in zip(names, sizes):
            out[name] = fn(*flat[at : at + size])
            at += size
        return out

    flat = [a for name in names for a in cases[name]]
    if target == "cuda":
        flat = [a.to("cuda") if isinstance(a, torch.Tensor) else a for a in flat]
    reference = [
        a.double() if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in flat
    ]
    records: list = []
    with recording(records), torch.no_grad():
        expected = each(*reference)
        actual = compile_minicomp(each, target)(*clone_inputs(flat))
    for name in names:
        got = actual[name]
        want = pytree.tree_map(lambda e, a: e.to(a.dtype), expected[name], got)
        rtol, atol = tolerance[pytree.tree_leaves(got)[0].dtype]
        assert_same({name: got}, {name: want}, rtol=rtol, atol=atol)
    return records


def test_linear_with_activation(target):
    def fn(x, w, b):
        return torch.nn.functional.gelu(torch.nn.functional.linear(x, w, b))

    cases = {
        str(dtype): (
            torch.randn(6, 24, dtype=dtype),
            torch.randn(40, 24, dtype=dtype),
            torch.randn(40, dtype=dtype),
        )
        for dtype in DTYPES
    }
    _check_each(fn, cases, target=target, tolerance=TOLERANCE)


def test_products_with_scales_and_transposes(target):
    def fn(a, b, bias, c, d, e):
        x = torch.addmm(bias, a.t(), b, beta=0.5, alpha=2.0)
        y = torch.baddbmm(e, c, d.transpose(1, 2), beta=0.0, alpha=-1.5)
        return x, torch.bmm(c, d.transpose(1, 2)) + y, torch.mm(a.t(), b)

    def inputs(dtype):
        a, b = torch.randn(17, 9, dtype=dtype), torch.randn(17, 11, dtype=dtype)
        bias = torch.randn(1, 11, dtype=dtype)
        c, d = torch.randn(3, 5, 7, dtype=dtype), torch.randn(3, 6, 7, dtype=dtype)
        e = torch.full((3, 5, 6), float("nan"), dtype=dtype)  # beta=0 ignores even NaN
        return a, b, bias, c, d, e

    cases = {str(dtype): inputs(dtype) for dtype in DTYPES}
    _check_each(fn, cases, target=target, tolerance=TOLERANCE)


def test_cuda_targets_fuse_the_product_with_its_epilogue(target):
    x, w, b = torch.randn(4, 8), torch.randn(16, 8), torch.randn(16)

    def fn(x, w, b):
        return torch.relu(torch.nn.functional.linear(x, w, b)) * 3

    with torch.no_grad():
        report = _explain(fn, x, w, b, target=target)
    (record,) = report.records
    nodes = record.graph.nodes
    externs = [n.name for n in nodes if isinstance(n, ExternOp)]
    if target == "cpu":
        assert any("addmm" in name for name in externs)
        return
    assert not externs
    (group,) = [n for n in nodes if isinstance(n, FusedOp)]
    assert any("addmm" in m for m in group.members) and any("relu" in m for m in group.members)


# ---- convolutions: implicit GEMM (groups == 1), unrolled taps (depthwise), grouped ----


def _compiled_records(fn, *args, target, rtol, atol, reference_dtype=torch.float64, **kw):
    """check_compiled's comparison, and the CompileRecords of the compilation."""
    records: list = []
    with recording(records), torch.no_grad():
        check_compiled(
            fn, *args, target=target, rtol=rtol, atol=atol, reference_dtype=reference_dtype, **kw
        )
    return records


def _assert_conv_kernels(records, kind: str) -> None:
    """On the CUDA targets: no convolution left to ATen, and each convolution's group computed
    as `kind`: "template" (a matched contraction a matmul template ran; a grouped
    convolution's view back to 4-d is an injective group of its own), "injective" (the
    unrolled taps) or "reduction" (the auto-scheduler's rows)."""
    for record in records:
        nodes = record.graph.nodes
        assert not [n.name for n in nodes if isinstance(n, ExternOp) and "convolution" in n.name]
        groups = [n for n in nodes if isinstance(n, FusedOp)]
        convs = [g for g in groups if any("convolution" in m for m in g.members)]
        assert convs
        templates = {k.name for k in record.kernels if k.attrs.template}
        if kind == "template":
            assert any(g.is_reduction for g in convs)
        for g in convs:
            contraction = match_contraction(g)
            if kind == "template":
                if g.is_reduction:
                    assert contraction is not None and g.name in templates, g.name
            else:
                assert contraction is None and g.name not in templates
                assert g.is_reduction == (kind == "reduction"), g.name


CONV_TOLERANCE = {
    torch.float32: (1e-4, 1e-4),
    torch.float16: (4e-3, 4e-3),
    torch.bfloat16: (2e-2, 3e-2),
}
# name: (in channels, out channels, kernel, stride, padding, dilation, groups, bias, kind)
CONVS = {
    "3x3": (8, 16, (3, 3), 1, 1, 1, 1, True, "template"),
    "3x5_s2_p12": (8, 12, (3, 5), 2, (1, 2), 1, 1, False, "template"),
    "d2_s12": (8, 16, (3, 3), (1, 2), 2, 2, 1, True, "template"),
    "1x1_s2": (8, 16, (1, 1), 2, 0, 1, 1, False, "template"),
    "depthwise": (8, 8, (3, 3), 2, 1, 1, 8, True, "injective"),
    "depthwise_x2_d2": (8, 16, (3, 3), 1, 2, 2, 8, False, "injective"),
    "groups2": (8, 16, (3, 3), 1, 1, 1, 2, True, "template"),
}


def _conv_inputs(name, dtype, channels_last):
    cin, cout, kernel, *_, groups, bias, _ = CONVS[name]
    x = torch.randn(2, cin, 9, 11, dtype=dtype)
    w = torch.randn(cout, cin // groups, *kernel, dtype=dtype) / 3
    if channels_last:
        x, w = (t.to(memory_format=torch.channels_last) for t in (x, w))
    return x, w, torch.randn(cout, dtype=dtype) if bias else None


@pytest.mark.parametrize("name", list(CONVS))
def test_convolution(target, name):
    # Every dtype, NCHW and NHWC, in one compilation (see _check_each).
    _, _, _, stride, padding, dilation, groups, _, kind = CONVS[name]

    def fn(x, w, b):
        return F.conv2d(x, w, b, stride, padding, dilation, groups)

    cases = {
        f"{dtype}-{layout}": _conv_inputs(name, dtype, layout == "nhwc")
        for dtype in DTYPES
        for layout in ("nchw", "nhwc")
    }
    records = _check_each(fn, cases, target=target, tolerance=CONV_TOLERANCE)
    if target != "cpu":
        _assert_conv_kernels(records, kind)


@pytest.mark.parametrize("name", ["3x3", "depthwise", "groups2"])
def test_convolution_epilogues(target, name):
    """conv + bias + relu, and conv + residual + relu, each one kernel on the CUDA targets (a
    grouped convolution's template, then its view back to 4-d fused with the epilogue)."""
    x, w, b = _conv_inputs(name, torch.float32, False)
    *_, stride, padding, dilation, groups, _, kind = CONVS[name]
    residual = torch.randn(F.conv2d(x, w, b, stride, padding, dilation, groups).shape)

    def fn(x, w, b, residual):
        y = F.conv2d(x, w, b, stride, padding, dilation, groups)
        return torch.relu(y), torch.relu(y + residual) * 0.5

    records = _compiled_records(fn, x, w, b, residual, target=target, rtol=1e-4, atol=1e-4)
    if target == "cpu":
        return
    _assert_conv_kernels(records, kind)
    (record,) = records
    groups = [n for n in record.graph.nodes if isinstance(n, FusedOp)]
    assert len(groups) == (2 if name == "groups2" else 1)


def test_depthwise_separable_block(target):
    """depthwise -> scale -> relu -> pointwise: on the CUDA targets the depthwise taps are the
    pointwise product's prologue, one template kernel."""

    def fn(x, wd, scale, wp, b):
        y = torch.relu(F.conv2d(x, wd, None, 1, 1, 1, 8) * scale[:, None, None])
        return torch.relu(F.conv2d(y, wp, b))

    x, wd, _ = _conv_inputs("depthwise", torch.float32, False)
    args = (x, wd, torch.randn(8), torch.randn(24, 8, 1, 1), torch.randn(24))
    records = _compiled_records(fn, *args, target=target, rtol=1e-4, atol=1e-4)
    if target != "cpu":
        _assert_conv_kernels(records, "template")
        assert len([n for n in records[0].graph.nodes if isinstance(n, FusedOp)]) == 1


def test_convolution_symbolic_sizes_and_1d(target):
    def fn(x, w, b, s, v):
        return F.conv2d(x, w, b, 1, 1).relu(), F.conv1d(s, v, None, 2, 1)

    x, w, b = _conv_inputs("3x3", torch.float32, False)
    s, v = torch.randn(2, 8, 13), torch.randn(6, 8, 3)
    _compiled_records(fn, x, w, b, s, v, target=target, rtol=1e-4, atol=1e-4, dynamic=True)


class _Bottleneck(torch.nn.Module):
    """A ResNet bottleneck block: 1x1, 3x3 (stride 2), 1x1 convolutions with batch norms and
    a strided 1x1 projection on the shortcut."""

    def __init__(self, cin: int, width: int, cout: int):
        super().__init__()
        nn = torch.nn
        self.conv1, self.bn1 = nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, stride=2, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.conv3, self.bn3 = nn.Conv2d(width, cout, 1, bias=False), nn.BatchNorm2d(cout)
        self.down = nn.Sequential(
            nn.Conv2d(cin, cout, 1, stride=2, bias=False), nn.BatchNorm2d(cout)
        )
        for bn in (self.bn1, self.bn2, self.bn3, self.down[1]):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 2.0)
            bn.weight.data.uniform_(0.5, 1.5)
            bn.bias.data.uniform_(-0.5, 0.5)

    def forward(self, x):
        y = torch.relu(self.bn1(self.conv1(x)))
        y = torch.relu(self.bn2(self.conv2(y)))
        return torch.relu(self.bn3(self.conv3(y)) + self.down(x))


def test_resnet_bottleneck(target):
    """The block with its batch norms, and with them folded into the convolutions (one
    compilation for both)."""
    import copy

    from torch.nn.utils.fusion import fuse_conv_bn_eval

    torch.manual_seed(0)
    # Channels as in ResNet-50's layer2.0 (tests/passes/test_fusion.py has the case where the
    # shortcut and conv3 reduce over equal extents).
    block = _Bottleneck(16, 8, 32).eval()
    folded = copy.deepcopy(block)
    folded.conv1 = fuse_conv_bn_eval(folded.conv1, folded.bn1)
    folded.conv2 = fuse_conv_bn_eval(folded.conv2, folded.bn2)
    folded.conv3 = fuse_conv_bn_eval(folded.conv3, folded.bn3)
    folded.down[0] = fuse_conv_bn_eval(folded.down[0], folded.down[1])
    folded.bn1 = folded.bn2 = folded.bn3 = folded.down[1] = torch.nn.Identity()

    def both(x):
        return {"bn": block(x), "folded": folded(x)}

    x = torch.randn(2, 16, 9, 11).to(memory_format=torch.channels_last)
    records = _compiled_records(both, x, target=target, rtol=1e-4, atol=1e-4, reference_dtype=None)
    if target != "cpu":
        _assert_conv_kernels(records, "template")


def test_convolution_kernels_compile_with_nvrtc(tmp_path):
    """The CUDA C of implicit-GEMM (tensor cores and SIMT), depthwise, grouped convolutions
    and pooling compiles for sm_80 and sm_90 without spills."""
    from minicomp.backends.cuda import nvrtc

    try:
        nvrtc.nvrtc_version()
    except nvrtc.NvrtcUnavailableError as err:  # pragma: no cover - depends on the machine
        pytest.skip(f"NVRTC unavailable: {err}")

    def fn(x, w, wd, wg, xf, wf):
        y = torch.relu(F.conv2d(x, w, None, 2, 1))
        y = F.conv2d(y, wd, None, 1, 1, 1, 16) + F.conv2d(y, wg, None, 1, 1, 1, 2)
        z = F.max_pool2d(F.conv2d(xf, wf, None, 1, (0, 1), 2), 3, 2, 1)
        return y, z + F.avg_pool2d(z, 3, 1, 1, count_include_pad=False)

    h = torch.float16
    args = (
        torch.randn(2, 8, 9, 11, dtype=h),
        torch.randn(16, 8, 3, 3, dtype=h),
        torch.randn(16, 1, 3, 3, dtype=h),
        torch.randn(16, 8, 3, 3, dtype=h),
        torch.randn(2, 8, 9, 11),
        torch.randn(16, 8, 3, 3),
    )
    torch._dynamo.reset()
    with torch.no_grad():
        report = minicomp.explain(fn, *args, options={"target": "cuda-emu"})
    (record,) = report.records
    assert {k.attrs.template.split("[")[0] for k in record.kernels if k.attrs.template} == {
        "matmul_tc",
        "matmul_simt",
    }
    for arch in ("sm_80", "sm_90"):
        binary = nvrtc.compile_cuda(record.source, arch=arch, cache_dir=str(tmp_path))
        for kernel in record.kernels:
            usage = binary.resources[kernel.name]
            assert usage.spill_stores == 0 and usage.spill_loads == 0, (kernel.name, usage)
