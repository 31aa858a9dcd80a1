"""pad_small_channels: convolutions over few input channels read padded, channels-last copies
of their input and weight, which the tensor-core template gathers in 16-byte chunks. Each
convolution is compared with float64 PyTorch on cuda-emu (a checked build: no access out of
bounds), its input NHWC or NCHW, with and without bias; the stem's window loads use their
sectors (the lens)."""

import math

import pytest
import torch
import torch.nn.functional as F
from helpers import check_compiled
from schedule_graphs import matmul_problem_of

from minicomp.dynamo.backend import recording
from minicomp.ir.graph import ComputeOp, ExternOp
from minicomp.passes.graph.small_channels import padded_channels
from minicomp.schedule.templates import matmul_tc

CL = torch.channels_last
TARGET = "cuda-emu"


def _inputs(n, c, hw, o, kernel, dtype, *, channels_last=True):
    x = torch.randn(n, c, *hw, dtype=dtype)
    w = torch.randn(o, c, *kernel, dtype=dtype) / math.sqrt(c * kernel[0] * kernel[1])
    if channels_last:
        x, w = x.to(memory_format=CL), w.to(memory_format=CL)
    return x, w


def _conv(stride, padding, dilation=1):
    def fn(x, w, b=None):
        return F.conv2d(x, w, b, stride, padding, dilation)

    return fn


def _templates(fn, *args, rtol=1e-2, atol=1e-2) -> list[str]:
    records: list = []
    with recording(records), torch.no_grad():
        check_compiled(
            fn, *args, target=TARGET, reference_dtype=torch.float64, rtol=rtol, atol=atol
        )
    return [k.attrs.template or "" for r in records for k in r.kernels]


def _graph(fn, *args):
    """The graph IR after the passes (explain's record) of `fn` on cuda-emu."""
    import minicomp

    torch._dynamo.reset()
    with torch.no_grad():
        report = minicomp.explain(fn, *args, options={"target": TARGET})
    (record,) = report.records
    return record.graph


# ---- what the pass makes ----


@pytest.mark.parametrize(
    ("c", "stride", "expected"),
    [(3, 2, 4), (3, 1, 8), (1, 2, 4), (1, 4, 2), (2, 2, 4), (4, 1, 8), (5, 2, 8), (8, 1, None)],
)
def test_padded_channels_make_each_window_row_start_on_a_chunk(c, stride, expected):
    assert padded_channels(c, stride) == expected
    if expected is not None:
        assert expected >= c and stride * expected % 8 == 0


def test_the_stem_reads_padded_copies_through_views():
    x, w = _inputs(2, 3, (16, 16), 8, (7, 7), torch.float16)
    fn = _conv(2, 3)
    graph = _graph(fn, x, w)
    views = [n for n in graph.nodes if isinstance(n, ExternOp) and "zero-copy view" in n.name]
    assert {v.outputs[0].shape for v in views} == {(2, 22, 88), (8, 7, 32)}
    assert not any(
        isinstance(n, ExternOp) and n.target is torch.ops.aten.convolution.default
        for n in graph.nodes
    )
    p = matmul_problem_of(fn, x, w, target=TARGET)
    assert [x for _, x in p.k_axes] == [7, 32]  # (r, j): a window row, 8 pixels of 4
    assert p.gather_a is not None and p.gather_a.inside is None and p.gather_a.limit == 28
    assert p.plain_b is not None and p.plain_b.ld == 7 * 32
    assert matmul_tc._operand(p, "a").mode == "gather"
    assert matmul_tc._operand(p, "b").mode == "async"


@pytest.mark.parametrize(
    ("c", "dtype"), [(8, torch.float16), (3, torch.float32), (12, torch.float16)]
)
def test_other_convolutions_keep_their_lowering(c, dtype):
    x, w = _inputs(2, c, (9, 9), 8, (3, 3), dtype)
    graph = _graph(_conv(1, 1), x, w)
    names = [n.name for n in graph.nodes if isinstance(n, ExternOp)]
    assert not any("zero-copy view" in n for n in names)
    assert [n for n in graph.nodes if isinstance(n, ComputeOp)] == []  # fused: FusedOps


# ---- on the emulator ----

# name: (in channels, height x width, out channels, kernel, stride, padding, dilation)
CASES = {
    "c3_7x7_s2_p3": (3, (18, 15), 16, (7, 7), 2, 3, 1),
    "c3_3x3_s1_p1": (3, (9, 11), 8, (3, 3), 1, 1, 1),
    "c1_5x5_s2_p2": (1, (13, 12), 16, (5, 5), 2, 2, 1),
    "c1_3x3_s1": (1, (7, 9), 24, (3, 3), 1, 0, 1),
    "c4_3x3_s2_p1": (4, (11, 9), 16, (3, 3), 2, 1, 1),
    "c4_1x1_s1": (4, (6, 7), 16, (1, 1), 1, 0, 1),
    "c2_4x3_s1_p21_d2": (2, (12, 10), 8, (4, 3), 1, (2, 1), (2, 1)),
    "c6_2x2_s2": (6, (8, 8), 8, (2, 2), 2, 0, 1),
}


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32], ids=["f16", "f32"])
def test_small_channel_convolutions_match_eager(name, dtype):
    c, hw, o, kernel, stride, padding, dilation = CASES[name]
    x, w = _inputs(2, c, hw, o, kernel, dtype)
    used = _templates(_conv(stride, padding, dilation), x, w)
    if dtype == torch.float16:  # f32 keeps its lowering (the SIMT template)
        assert sum(t.startswith(matmul_tc.NAME + "[") for t in used) == 1, used


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
def test_nchw_input_with_bias(dtype):
    x, w = _inputs(2, 3, (12, 10), 16, (5, 5), dtype, channels_last=False)
    b = torch.randn(16, dtype=dtype)
    used = _templates(lambda x, w, b: F.relu(_conv(2, 2)(x, w, b)), x, w, b, rtol=2e-2, atol=2e-2)
    assert sum(t.startswith(matmul_tc.NAME + "[") for t in used) == 1, used


def test_a_frozen_stem_folds_its_padded_weight():
    """Frozen (a constant weight, its batch norm folded in), the weight's copy and its view
    are computed at compile time: the graph launches the input's copy and the convolution."""
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 16, 7, stride=2, padding=3, bias=False)
    bn = torch.nn.BatchNorm2d(16)
    bn.running_mean.normal_()
    bn.running_var.uniform_(0.5, 2.0)
    model = torch.nn.Sequential(conv, bn, torch.nn.ReLU()).eval().half()
    model = model.to(memory_format=CL)
    x = torch.randn(2, 3, 20, 18, dtype=torch.float16).to(memory_format=CL)
    records: list = []
    torch._dynamo.reset()
    opts = {"target": TARGET, "fallback": "error", "freeze": True}
    with recording(records), torch.no_grad():
        expected = model.float()(x.float()).half()
        model.half()
        actual = torch.compile(model, backend="minicomp", options=opts)(x)
    torch.testing.assert_close(actual, expected, rtol=2e-2, atol=2e-2)
    (record,) = records
    templates = [k.attrs.template or "" for k in record.kernels]
    assert len(templates) == 2 and templates[1].startswith(matmul_tc.NAME), templates
    assert any("padded_weight" in name for name in record.graph.constants)


def test_infinities_beside_a_window_stay_out_of_it():
    """The run of the stem's window row is padded from 28 to 32 elements with pixels of the
    next windows: an inf there must not give 0 * inf = nan in this window's sum."""
    x, w = _inputs(1, 3, (9, 16), 8, (7, 7), torch.float16)
    x[0, :, :, 12] = torch.inf  # read by the output columns whose windows cover column 12
    fn = _conv(2, 3)
    expected = fn(x.double(), w.double())
    torch._dynamo.reset()
    opts = {"target": TARGET, "fallback": "error"}
    with torch.no_grad():
        actual = torch.compile(fn, backend="minicomp", options=opts)(x, w)
    assert torch.equal(actual.isnan(), expected.isnan()), "nan where eager has none"
    finite = expected.isfinite()
    torch.testing.assert_close(actual[finite], expected[finite].half(), rtol=1e-2, atol=1e-2)


def test_the_stem_window_is_read_in_whole_sectors():
    """The lens on the ResNet stem (3 -> 64, 7x7, stride 2, channels-last, f16): the
    template's global loads use at least 90% of the sectors they move, and its shared tiles
    have no bank conflicts."""
    from minicomp.lens.profile import LENS_OPTIONS
    from minicomp.lens.session import recording as lens_recording

    x, w = _inputs(2, 3, (64, 64), 64, (7, 7), torch.float16)
    torch._dynamo.reset()
    compiled = torch.compile(
        _conv(2, 3), backend="minicomp", options={"search_space": 0, **LENS_OPTIONS}
    )
    with lens_recording(sample_only=True) as session:
        compiled(x, w)
    (c,) = [
        launch.sample.counters
        for launch in session.launches
        if (launch.function.attrs.template or "").startswith(matmul_tc.NAME)
    ]
    assert c["global_load_bytes"] >= 0.9 * 32 * c["global_load_sectors"], c
    assert c["shared_wavefronts"] <= 1.05 * c["shared_ideal_wavefronts"], c


def test_level1_configs_of_the_padded_stem_compile_with_nvrtc_without_spills(tmp_path):
    """The gather with a run limit (the stem's partial chunks) costs no spills: every level-1
    tiling compiles for sm_80 and sm_90 without local memory."""
    from minicomp.backends.cuda import nvrtc
    from minicomp.backends.cuda.codegen import render_module
    from minicomp.ir.func import Module
    from minicomp.schedule.templates import TEMPLATES

    try:
        nvrtc.nvrtc_version()
    except nvrtc.NvrtcUnavailableError as err:  # pragma: no cover - depends on the machine
        pytest.skip(f"NVRTC unavailable: {err}")
    x, w = _inputs(4, 3, (32, 32), 64, (7, 7), torch.float16)
    problem = matmul_problem_of(_conv(2, 3), x, w, target=TARGET)
    assert problem.gather_a is not None and problem.gather_a.limit == 28
    template = TEMPLATES[matmul_tc.NAME]
    for config in template.candidates(problem, 1):
        kernel = template.instantiate(problem, config)
        source = render_module(Module(kernel.name, (kernel,)))
        for arch in ("sm_80", "sm_90"):
            binary = nvrtc.compile_cuda(source, arch=arch, name="stem", cache_dir=str(tmp_path))
            usage = binary.resources[kernel.name]
            assert usage.registers > 0, binary.log
            assert usage.spill_stores == 0 and usage.spill_loads == 0, (str(config), arch, usage)
