"""Convolutions as implicit GEMMs in the tensor-core template: K ordered (r, s, c) on a
channels-last input, the window read in 16-byte runs of channels (problem.GatheredOperand,
tiles.gather_copy) where C % 8 == 0 (or C < 8, from a padded copy: passes/graph/
small_channels.py), the register path elsewhere; each compared with float64
PyTorch on cuda-emu (checked build: no access out of bounds)."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from helpers import check_compiled
from schedule_graphs import matmul_problem_of

from minicomp.dynamo.backend import recording
from minicomp.schedule.templates import matmul_tc

H = torch.float16
CL = torch.channels_last
TARGET = "cuda-emu"


def _problem(fn, *args):
    return matmul_problem_of(fn, *args, target=TARGET)


def _run(fn, *args) -> list[str]:
    """Compile `fn` for cuda-emu, compare with float64 PyTorch; the templates used."""
    records: list = []
    with recording(records), torch.no_grad():
        check_compiled(
            fn, *args, target=TARGET, reference_dtype=torch.float64, rtol=1e-2, atol=1e-2
        )
    return [k.attrs.template for r in records for k in r.kernels if k.attrs.template]


def _uses_tc(templates: list[str]) -> bool:
    return sum(t.startswith(matmul_tc.NAME + "[") for t in templates) == 1


def _inputs(n, c, hw, o, kernel, *, groups=1, channels_last=True, dtype=H):
    x = torch.randn(n, c, *hw, dtype=dtype)
    w = torch.randn(o, c // groups, *kernel, dtype=dtype) / (c // groups * kernel[0] * kernel[1])
    if channels_last:
        x, w = x.to(memory_format=CL), w.to(memory_format=CL)
    return x, w


def _conv(stride=1, padding=0, dilation=1, groups=1):
    def fn(x, w):
        return F.conv2d(x, w, None, stride, padding, dilation, groups)

    return fn


def _names(axes):
    return [v.name for v, _ in axes]


# ---- the problem: K's order and the operand forms ----


def test_channels_last_window_is_gathered_with_k_ordered_rsc():
    x, w = _inputs(2, 16, (9, 11), 24, (3, 3))
    p = _problem(_conv(padding=1), x, w)
    extents = [x for _, x in p.k_axes]
    assert extents == [3, 3, 16]  # (r, s, c): channels innermost
    assert p.plain_a is None and p.gather_a is not None and p.gather_a.inside is not None
    assert p.plain_b is not None and p.plain_b.contiguous == "k" and p.plain_b.ld == 144
    assert matmul_tc._operand(p, "a").mode == "gather"
    assert "plain=gathered/k:144" in p.signature()


def test_unpadded_strided_window_is_gathered_without_a_guard():
    x, w = _inputs(2, 8, (9, 9), 16, (3, 3))
    p = _problem(_conv(stride=2), x, w)
    assert p.gather_a is not None and p.gather_a.inside is None


def test_channels_not_a_multiple_of_8_stay_in_registers():
    # (fewer than 8 channels read a padded copy: passes/test_small_channels.py)
    x, w = _inputs(2, 12, (9, 11), 16, (3, 3))
    p = _problem(_conv(padding=1), x, w)
    assert [x for _, x in p.k_axes] == [3, 3, 12]  # (r, s, c) still: runs of s and c
    assert p.gather_a is None and matmul_tc._operand(p, "a").mode == "regs"


def test_nchw_input_keeps_the_contraction_order():
    x, w = _inputs(2, 16, (9, 11), 24, (3, 3), channels_last=False)
    p = _problem(_conv(padding=1), x, w)
    assert p.k_axes == p.contraction.k
    assert p.gather_a is None and p.plain_b is not None


def test_nchw_weight_keeps_its_plain_order():
    # Reordering K for the input would make the weight a gather along c: the order stays.
    x, _ = _inputs(2, 16, (9, 11), 24, (3, 3))
    w = torch.randn(24, 16, 3, 3, dtype=H)
    p = _problem(_conv(padding=1), x, w)
    assert p.k_axes == p.contraction.k and p.plain_b is not None and p.gather_a is None


# ---- on the emulator ----

# name: (batch, in channels, height x width, out channels, kernel, stride, padding, dilation,
# groups, channels-last, gathered)
CASES = {
    "3x3_p1": (2, 16, (9, 11), 24, (3, 3), 1, 1, 1, 1, True, True),
    "3x3_s2_b1": (1, 8, (13, 10), 20, (3, 3), 2, 1, 1, 1, True, True),
    "5x3_p21_d2": (2, 24, (11, 9), 16, (5, 3), 1, (2, 1), 2, 1, True, True),
    "1x1_s2": (2, 32, (9, 9), 40, (1, 1), 2, 0, 1, 1, True, True),
    "3x3_valid_s2": (2, 8, (9, 9), 16, (3, 3), 2, 0, 1, 1, True, True),
    "groups2": (2, 32, (7, 9), 32, (3, 3), 1, 1, 1, 2, True, True),
    "c3_7x7_s2": (2, 3, (17, 15), 16, (7, 7), 2, 3, 1, 1, True, True),  # a padded copy
    "c12": (2, 12, (9, 11), 16, (3, 3), 1, 1, 1, 1, True, False),
    "nchw": (2, 16, (9, 11), 24, (3, 3), 1, 1, 1, 1, False, False),
}


@pytest.mark.parametrize("name", list(CASES))
def test_convolution_on_the_emulator(name):
    n, c, hw, o, kernel, stride, padding, dilation, groups, cl, gathered = CASES[name]
    x, w = _inputs(n, c, hw, o, kernel, groups=groups, channels_last=cl)
    fn = _conv(stride, padding, dilation, groups)
    if groups == 1:
        p = _problem(fn, x, w)  # (batch 1: the weight may be operand a, the window b)
        assert (p.gather_a is not None or p.gather_b is not None) == gathered
    assert _uses_tc(_run(fn, x, w))


def test_misaligned_input_takes_the_element_path():
    """A channels-last input starting one element into its storage: the 16-byte copies cannot
    be used, which the kernel finds out at run time."""
    n, c, h, wd = 2, 16, 9, 11
    flat = torch.randn(n * h * wd * c + 1, dtype=H)[1:]
    x = flat.as_strided((n, c, h, wd), (h * wd * c, 1, wd * c, c))
    assert x.data_ptr() % 16 == 2
    _, w = _inputs(n, c, (h, wd), 24, (3, 3))
    fn = _conv(padding=1)
    expected = fn(x.double(), w.double())
    records: list = []
    torch._dynamo.reset()
    opts = {"target": TARGET, "fallback": "error"}
    with recording(records), torch.no_grad():
        actual = torch.compile(fn, backend="minicomp", options=opts)(x, w)  # no copy of x
    torch.testing.assert_close(actual, expected.to(H), rtol=1e-2, atol=1e-2)
    assert _uses_tc([k.attrs.template for r in records for k in r.kernels if k.attrs.template])


# (batch, in channels, height x width, out channels, kernel, stride, padding): M of 288, 270
# and 338, each a whole 256-row tile and a partial one.
WIDE_M_CASES = {
    "3x3_64": (2, 64, (12, 12), 64, (3, 3), 1, 1),
    "stem_c3_7x7_s2": (2, 3, (17, 29), 64, (7, 7), 2, 3),  # a padded copy, runs of 3 of 8
    "1x1_n40": (2, 32, (13, 13), 40, (1, 1), 1, 0),
}


@pytest.mark.parametrize("name", list(WIDE_M_CASES))
def test_256x64_tiles_of_four_64x64_warps(monkeypatch, name):
    """The level-0 tiling of N <= 64 over a long M (ResNet's stem and first stage) on
    gathered windows, partial tiles at M's edge and N's: against float64."""
    cfg = matmul_tc.TcConfig(256, 64, 32, 64, 64, 3)
    assert cfg in matmul_tc.level1(_problem(torch.mm, *(torch.randn(64, 64, dtype=H),) * 2))
    fixed = dataclasses.replace(matmul_tc.TEMPLATE, heuristic=lambda problem: cfg)
    monkeypatch.setattr(matmul_tc, "TEMPLATE", fixed)
    n, c, hw, o, kernel, stride, padding = WIDE_M_CASES[name]
    x, w = _inputs(n, c, hw, o, kernel)
    used = _run(_conv(stride, padding), x, w)
    assert f"{matmul_tc.NAME}[{cfg}]" in used, used


def test_fused_epilogue_and_bias():
    x, w = _inputs(2, 16, (9, 11), 24, (3, 3))
    b = torch.randn(24, dtype=H)
    assert _uses_tc(_run(lambda x, w, b: F.relu(F.conv2d(x, w, b, padding=1)), x, w, b))


# ---- NVRTC ----


def test_level1_configs_compile_with_nvrtc_without_spills(tmp_path):
    """Every level-1 tiling of a gathered padded 3x3 compiles for sm_80 and sm_90 with no
    spills."""
    from minicomp.backends.cuda import nvrtc
    from minicomp.backends.cuda.codegen import render_module
    from minicomp.ir.func import Module
    from minicomp.schedule.templates import TEMPLATES

    try:
        nvrtc.nvrtc_version()
    except nvrtc.NvrtcUnavailableError as err:  # pragma: no cover - depends on the machine
        pytest.skip(f"NVRTC unavailable: {err}")
    x, w = _inputs(4, 64, (14, 14), 64, (3, 3))
    problem = _problem(_conv(padding=1), x, w)
    assert problem.gather_a is not None
    template = TEMPLATES[matmul_tc.NAME]
    for config in template.candidates(problem, 1):
        kernel = template.instantiate(problem, config)
        source = render_module(Module(kernel.name, (kernel,)))
        for arch in ("sm_80", "sm_90"):
            binary = nvrtc.compile_cuda(source, arch=arch, name="conv", cache_dir=str(tmp_path))
            usage = binary.resources[kernel.name]
            what = (str(config), arch, usage)
            assert usage.registers > 0, binary.log
            assert usage.spill_stores == 0 and usage.spill_loads == 0, what
