"""Grouped convolutions (1 < channels per group < C) as batched GEMMs on the CUDA targets: a
template computes each group's product over (n, g, oo, positions), a view gives back the
(N, O, positions) output."""

import pytest
import torch
import torch.nn.functional as F
from helpers import check_compiled

from minicomp.dynamo.backend import recording
from minicomp.ir.contraction import match_contraction
from minicomp.ir.graph import ExternOp, FusedOp

TARGET = "cuda-emu"
TOLERANCE = {torch.float32: 1e-4, torch.float16: 4e-3}

# name: (input shape, out channels, kernel, stride, padding, dilation, groups, bias, dtype,
#        channels-last)
CONVS = {
    "g2_bias": ((2, 8, 7, 9), 12, (3, 3), 1, 1, 1, 2, True, torch.float32, False),
    "g4_s2_d2_nhwc": ((2, 8, 9, 11), 8, (3, 3), 2, (1, 2), 2, 4, False, torch.float32, True),
    "g2_f16_nhwc_bias": ((2, 8, 7, 9), 16, (3, 3), (2, 1), 1, 1, 2, True, torch.float16, True),
    "g4_f16_s2": ((1, 16, 8, 8), 8, (1, 3), 2, (0, 1), 1, 4, False, torch.float16, False),
    "1d_g2_bias": ((2, 8, 13), 6, (3,), 2, 1, 1, 2, True, torch.float32, False),
    "3d_g2": ((1, 4, 4, 5, 6), 4, (3, 1, 3), 1, (1, 0, 1), 1, 2, False, torch.float32, False),
}
_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}


def _inputs(name):
    shape, cout, kernel, *_, groups, bias, dtype, last = CONVS[name]
    x = torch.randn(shape, dtype=dtype)
    w = torch.randn(cout, shape[1] // groups, *kernel, dtype=dtype) / 3
    if last:
        x = x.to(memory_format=torch.channels_last)
    return x, w, torch.randn(cout, dtype=dtype) if bias else None


def _compile(fn, *args, dtype):
    """check_compiled against float64 on cuda-emu; the CompileRecord."""
    records: list = []
    tol = TOLERANCE[dtype]
    with recording(records), torch.no_grad():
        check_compiled(fn, *args, target=TARGET, rtol=tol, atol=tol, reference_dtype=torch.float64)
    (record,) = records
    return record


def _conv_groups(record):
    nodes = record.graph.nodes
    assert not [n for n in nodes if isinstance(n, ExternOp) and "convolution" in n.name]
    return [n for n in nodes if isinstance(n, FusedOp) and any("conv" in m for m in n.members)]


@pytest.mark.parametrize("name", list(CONVS))
def test_grouped_convolution_is_a_batched_gemm(name):
    _, _, _, stride, padding, dilation, groups, _, dtype, _ = CONVS[name]
    x, w, b = _inputs(name)
    conv = _CONV[x.dim() - 2]

    def fn(x, w, b):
        return conv(x, w, b, stride, padding, dilation, groups)

    record = _compile(fn, x, w, b, dtype=dtype)
    groups_ = _conv_groups(record)
    (product,) = [g for g in groups_ if g.is_reduction]
    c = match_contraction(product)
    assert c is not None
    # The group is the batch, its output channels N, its input channels and taps K.
    assert [e for _, e in c.batch] == [groups]
    # Og on one side (N, or M when a batch of one puts oo before the positions).
    assert [w.shape[0] // groups] in ([e for _, e in c.m], [e for _, e in c.n])
    templates = {k.name: k.attrs.template for k in record.kernels if k.attrs.template}
    assert product.name in templates
    if dtype == torch.float16:
        assert templates[product.name].startswith("matmul_tc")
    # The other group is the view back to (N, O, ...), injective.
    assert all(not g.is_reduction for g in groups_ if g is not product)


def test_grouped_convolution_epilogue_fuses_after_the_view():
    """conv + bias, then relu and a residual: the template computes the bias, the view and
    the rest are one injective kernel."""
    x, w, b = _inputs("g2_bias")
    residual = torch.randn(2, 12, 7, 9)

    def fn(x, w, b, r):
        return torch.relu(F.conv2d(x, w, b, 1, 1, 1, 2) + r)

    record = _compile(fn, x, w, b, residual, dtype=torch.float32)
    groups = [n for n in record.graph.nodes if isinstance(n, FusedOp)]
    assert len(groups) == 2
    product, rest = groups
    assert match_contraction(product) is not None and not rest.is_reduction
    assert any("relu" in m for m in rest.members)


def test_one_output_channel_per_group_stays_a_row_reduction():
    """With Og == 1 there is no N axis: the convolution stays one reduction over (N, O, ...)."""
    x, w = torch.randn(2, 8, 6, 7), torch.randn(4, 2, 3, 3)
    record = _compile(lambda x, w: F.conv2d(x, w, None, 1, 1, 1, 4), x, w, dtype=torch.float32)
    (group,) = _conv_groups(record)
    assert group.is_reduction and match_contraction(group) is None
    assert group.outer_extents == (2, 4, 6, 7)


def test_grouped_convolution_kernels_compile_with_nvrtc(tmp_path):
    """The template and view kernels of grouped convolutions (f16 tensor cores, channels-last
    with bias and relu; f32 SIMT, 2-d and 1-d) compile for sm_80 and sm_90 without local
    memory (the SIMT heuristic keeps guarded windows to few loads per thread)."""
    import minicomp
    from minicomp.backends.cuda import nvrtc

    try:
        nvrtc.nvrtc_version()
    except nvrtc.NvrtcUnavailableError as err:  # pragma: no cover - depends on the machine
        pytest.skip(f"NVRTC unavailable: {err}")
    x, w, b = _inputs("g2_f16_nhwc_bias")
    xf, wf, _ = _inputs("g2_bias")
    x1, w1, b1 = _inputs("1d_g2_bias")

    def fn(x, w, b, xf, wf, x1, w1, b1):
        y = F.conv2d(x, w, b, 2, 1, 1, 2).relu()
        return y, F.conv2d(xf, wf, None, 1, 1, 1, 2), F.conv1d(x1, w1, b1, 2, 1, 1, 2)

    torch._dynamo.reset()
    with torch.no_grad():
        report = minicomp.explain(fn, x, w, b, xf, wf, x1, w1, b1, options={"target": TARGET})
    (record,) = report.records
    kinds = {k.name: k.attrs.template for k in record.kernels}
    assert sorted(t.split("[")[0] for t in kinds.values() if t) == [
        "matmul_simt",
        "matmul_simt",
        "matmul_tc",
    ]
    for arch in ("sm_80", "sm_90"):
        binary = nvrtc.compile_cuda(record.source, arch=arch, cache_dir=str(tmp_path))
        for kernel in record.kernels:
            usage = binary.resources[kernel.name]
            assert usage.spill_stores == 0 and usage.spill_loads == 0, (kernel.name, usage)
