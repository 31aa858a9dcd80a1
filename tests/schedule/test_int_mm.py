"""`aten._int_mm` (int8 x int8 -> int32) on the CUDA targets: lowered to a product of 8-bit
integers summed in i32 (passes/graph/anchors.py), computed by matmul_tc with mma m16n8k32 or,
without tensor cores, by matmul_simt in wrapping unsigned arithmetic. Compiled for cuda-emu and
compared with eager `torch._int_mm` on the CPU bit for bit (sums past 2^31 wrap in both),
over sizes, contiguous and transposed operands, u8 activations (torchao's CPU form); a
torchao-style dynamic-quantization linear whose rescale, bias and bf16 cast run in the matmul's
epilogue; the cpu target's ATen call; every level-1 int8 tiling compiled by NVRTC for sm_80,
sm_89 and sm_90 without spills."""

import dataclasses
import warnings

import pytest
import torch
from schedule_graphs import matmul_problem_of

import minicomp
from minicomp.dynamo.backend import recording
from minicomp.ir.func import Module
from minicomp.schedule.templates import matmul_simt, matmul_tc

TARGET = "cuda-emu"
TC, SIMT = matmul_tc.NAME, matmul_simt.NAME


def int8(shape, gen, *, transposed: bool = False, dtype=torch.int8) -> torch.Tensor:
    """Random 8-bit integers of `shape`, stored transposed (a column-major view) when asked."""
    low, high = (-128, 128) if dtype == torch.int8 else (0, 256)
    stored = shape[::-1] if transposed else shape
    t = torch.randint(low, high, stored, generator=gen, dtype=torch.int64).to(dtype)
    return t.t() if transposed else t


def compile_and_compare(fn, *args, options=None) -> list[str | None]:
    """`fn` compiled for cuda-emu equals eager bit for bit (values, dtype, shape, strides);
    returns the template of each kernel (None: the auto-scheduler's).

    Eager runs on row-major copies of the operands: PyTorch 2.13's CPU _int_mm returns
    uninitialised memory for a 1 x K transposed view (strides (1, 1), which PyTorch counts as
    contiguous), whatever its values."""
    torch._dynamo.reset()
    records: list = []
    opts = {"target": TARGET, "fallback": "error", **(options or {})}
    with recording(records), warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback of any kind
        actual = torch.compile(fn, backend="minicomp", options=opts)(*args)
    expected = fn(*(a.clone(memory_format=torch.contiguous_format) for a in args))
    for got, want in zip(actual, expected, strict=True):
        assert got.dtype == want.dtype == torch.int32
        assert got.shape == want.shape and got.stride() == want.stride()
        assert torch.equal(got, want)
    return [k.attrs.template for r in records for k in r.kernels]


def template_name(template: str | None) -> str | None:
    return None if template is None else template.split("[")[0]


# ---- sizes and layouts

KS, NS = (32, 64, 96, 4096), (8, 64, 200)


@pytest.mark.parametrize("m", [1, 16, 33, 128])
def test_int_mm_matches_eager(m):
    """Every K x N for rows M, in one graph: A and B each contiguous or a transposed view (the
    four combinations, each over several sizes), results bit for bit eager's."""
    gen = torch.Generator().manual_seed(m)
    args = []
    for p, (k, n) in enumerate((k, n) for k in KS for n in NS):
        args.append(int8((m, k), gen, transposed=p % 2 == 1))
        args.append(int8((k, n), gen, transposed=p // 2 % 2 == 1))

    def products(*ab):
        return tuple(torch._int_mm(a, b) for a, b in zip(ab[::2], ab[1::2]))

    used = compile_and_compare(products, *args)
    assert len(used) == len(KS) * len(NS)
    if m == 1:
        # One row is a matrix-vector product: a reduction, no template.
        assert set(used) == {None}
    else:
        assert {template_name(t) for t in used} == {TC}, used


def test_u8_activations():
    """u8 x s8 on tensor cores (torchao's CPU path quantizes activations to u8 around 128;
    eager takes u8 for the first operand only)."""
    gen = torch.Generator().manual_seed(3)
    a = int8((40, 128), gen, dtype=torch.uint8)
    w, b = int8((72, 128), gen).t(), int8((128, 24), gen)
    used = compile_and_compare(lambda a, w, b: (torch._int_mm(a, w), torch._int_mm(a, b)), a, w, b)
    assert [template_name(t) for t in used] == [TC, TC]


def test_prologues_and_unaligned_operands():
    """Operands computed by a fused prologue (staged through registers) and operands whose
    base is not 16-byte aligned (copied element by element at run time)."""
    gen = torch.Generator().manual_seed(4)
    a, b, bt = int8((72, 96), gen), int8((96, 40), gen), int8((96, 40), gen, transposed=True)

    def products(a, b, bt):
        return torch._int_mm(-a, b), torch._int_mm(a, -bt), torch._int_mm(a[:, 1:-1], bt[1:-1])

    used = compile_and_compare(products, a, b, bt)
    assert [template_name(t) for t in used] == [TC, TC, TC]


@pytest.mark.parametrize("transposed", [False, True], ids=["b_kn", "b_nk"])
def test_simt_fallback(transposed):
    """With tensor cores off, matmul_simt computes the product (in u32, wrapping)."""
    gen = torch.Generator().manual_seed(5)
    a, b = int8((33, 96), gen), int8((96, 200), gen, transposed=transposed)
    used = compile_and_compare(
        lambda a, b: (torch._int_mm(a, b),), a, b, options={"tensor_cores": False}
    )
    assert [template_name(t) for t in used] == [SIMT]


# ---- sums past 2^31 wrap as eager's do

WRAP_K = 140_000  # 128 * 128 * WRAP_K > 2^31


def _wrapping_operands(m: int, n: int):
    gen = torch.Generator().manual_seed(m + n)
    a = torch.full((m, WRAP_K), -128, dtype=torch.int8)
    # Rows differ, their sums still past 2^31.
    a[:, ::50] = torch.randint(-128, -64, (m, WRAP_K // 50), generator=gen).to(torch.int8)
    b = torch.full((WRAP_K, n), -128, dtype=torch.int8)
    exact = a.long() @ b.long()
    assert (exact.abs() > 2**31).all()
    return a, b


@pytest.mark.parametrize(
    "m, n, options, kernels",
    [
        # Two SMs and more than 256 outputs: K split neither by split_k nor by
        # split_reductions, the template's own sums wrap.
        (16, 24, {"sm_count": 2}, [TC]),
        (16, 24, {"sm_count": 2, "tensor_cores": False}, [SIMT]),
        # A GPU's SMs: split-K partial products, then their sum (a reduction).
        (16, 8, {}, [TC, None]),
        # Fewer outputs: split_reductions' two passes.
        (16, 8, {"sm_count": 2}, [None, None]),
        (1, 8, {}, [None, None]),
    ],
    ids=["tensor_cores", "simt", "split_k", "split_reduction", "one_row"],
)
def test_overflowing_sums_wrap_like_eager(m, n, options, kernels):
    a, b = _wrapping_operands(m, n)
    used = compile_and_compare(lambda a, b: (torch._int_mm(a, b),), a, b, options=options)
    assert [template_name(t) for t in used] == kernels
    # Eager's sums are the exact ones modulo 2^32.
    exact = a.long() @ b.long()
    assert torch.equal(torch._int_mm(a, b).long(), (exact + 2**31) % 2**32 - 2**31)


# ---- a dynamically quantized linear, as torchao's int8 dynamic-activation config computes it


def dynamic_quant_linear(x, w_q, w_scale, bias):
    """y = x @ w^T + bias with x quantized per row (symmetric int8, scale amax / 127) and w
    per output channel: the int32 product rescaled by both scales, in bf16."""
    x_f = x.float()
    x_scale = (x_f.abs().amax(dim=1, keepdim=True) / 127).clamp(min=1e-5)
    x_q = (x_f / x_scale).round().clamp(-128, 127).to(torch.int8)
    acc = torch._int_mm(x_q, w_q.t())
    y = acc.float() * x_scale * w_scale + bias.float()
    return y.to(torch.bfloat16)


def _quantized_weight(n: int, k: int, gen):
    w = torch.randn(n, k, generator=gen)
    scale = w.abs().amax(dim=1) / 127
    return (w / scale[:, None]).round().clamp(-128, 127).to(torch.int8), scale


@pytest.mark.parametrize("m, k, n", [(33, 96, 200), (16, 256, 64)])
def test_dynamic_quant_linear(m, k, n):
    """Two kernels: the activations' quantization, and the product with the rescale, the bias
    and the bf16 cast in its epilogue (no separate rescale kernel, no ATen call)."""
    gen = torch.Generator().manual_seed(m * n)
    x = torch.randn(m, k, generator=gen).to(torch.bfloat16)
    w_q, w_scale = _quantized_weight(n, k, gen)
    bias = torch.randn(n, generator=gen).to(torch.bfloat16)
    torch._dynamo.reset()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        report = minicomp.explain(
            dynamic_quant_linear, x, w_q, w_scale, bias, options={"target": TARGET}
        )
        torch._dynamo.reset()
        compiled = torch.compile(
            dynamic_quant_linear, backend="minicomp", options={"target": TARGET}
        )
        actual = compiled(x, w_q, w_scale, bias)
    expected = dynamic_quant_linear(x, w_q, w_scale, bias)
    assert actual.dtype == torch.bfloat16 and actual.shape == expected.shape
    # The same int32 sums and scales; only a fused multiply-add may round the f32 rescale
    # differently before the bf16 rounding (a bf16 ulp at most).
    torch.testing.assert_close(actual, expected, rtol=2**-7, atol=1e-3)
    assert report.aten_call_count == 0 and report.kernel_count == 2
    (product,) = [ops for _, ops in report.fused_groups if "_int_mm" in ops]
    assert {"mul", "add", "_to_copy"} <= set(product), product
    (quantize,) = [ops for _, ops in report.fused_groups if "_int_mm" not in ops]
    assert "amax" in quantize and "round" in quantize
    templates = [k.attrs.template for r in report.records for k in r.kernels]
    assert [template_name(t) for t in templates if t] == [TC]


@pytest.mark.parametrize("transposed_b", [False, True])
def test_the_256x64_tiling(monkeypatch, transposed_b):
    """The int8 version of the 256x64 tiling of four 64x64 warps (N <= 64 over a long M), B as
    rows of K (fragments byte by byte) and K-major, partial tiles: equal to eager."""
    cfg = matmul_tc.TcConfig(256, 64, 64, 64, 64, 3)
    fixed = dataclasses.replace(matmul_tc.TEMPLATE, heuristic=lambda problem: cfg)
    monkeypatch.setattr(matmul_tc, "TEMPLATE", fixed)
    gen = torch.Generator().manual_seed(64)
    a, b = int8((300, 192), gen), int8((192, 40), gen, transposed=transposed_b)
    assert cfg in matmul_tc.level1(matmul_problem_of(torch._int_mm, a, b, target=TARGET))
    used = compile_and_compare(lambda a, b: (torch._int_mm(a, b),), a, b)
    assert used == [f"{TC}[{cfg}]"]


def test_int8_tilings_are_tuned():
    """At search space 1 the tuner ranks matmul_tc's level-1 int8 tilings (cuda-emu: by the
    lens's estimate, on random bytes), and the chosen one computes the product exactly."""
    gen = torch.Generator().manual_seed(8)
    a, b = int8((64, 128), gen), int8((128, 96), gen, transposed=True)
    torch._dynamo.reset()
    report = minicomp.explain(
        torch._int_mm, a, b, options={"target": TARGET, "search_space": 1, "fallback": "error"}
    )
    ((_, template, choice),) = [t for r in report.records for t in r.tuning]
    assert template == TC and "ranked by the lens" in choice.describe(), choice.describe()
    candidates = matmul_tc.TEMPLATE.candidates(matmul_problem_of(torch._int_mm, a, b), 1)
    assert choice.config in candidates and len(candidates) > 1
    used = compile_and_compare(
        lambda a, b: (torch._int_mm(a, b),), a, b, options={"search_space": 1}
    )
    assert used == [f"{TC}[{choice.config}]"]


def test_torchao_int8_dynamic_activation_linear():
    """torchao's Int8DynamicActivationInt8WeightConfig on a bf16 linear: the quantized model
    compiled for cuda-emu matches it in eager, with no ATen call left."""
    quantization = pytest.importorskip("torchao.quantization")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.ReLU(), torch.nn.Linear(96, 32))
    model = model.to(torch.bfloat16)
    quantization.quantize_(model, quantization.Int8DynamicActivationInt8WeightConfig())
    x = torch.randn(16, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        expected = model(x)
        torch._dynamo.reset()
        report = minicomp.explain(model, x, options={"target": TARGET})
        torch._dynamo.reset()
        actual = torch.compile(model, backend="minicomp", options={"target": TARGET})(x)
    torch.testing.assert_close(actual, expected, rtol=2**-7, atol=1e-2)
    # At most the weight's transpose, a zero-copy view.
    assert all("view" in reason for reason in report.fallbacks.values()), report.fallbacks
    assert any("_int_mm" in ops for _, ops in report.fused_groups), report.fused_groups


def test_cpu_keeps_the_aten_call():
    """On the cpu target _int_mm stays ATen's int8 GEMM, said so, and still computes."""
    gen = torch.Generator().manual_seed(9)
    a, b = int8((33, 96), gen), int8((96, 64), gen, transposed=True)
    torch._dynamo.reset()
    report = minicomp.explain(torch._int_mm, a, b, options={"target": "cpu"})
    (reason,) = [r for name, r in report.fallbacks.items() if "_int_mm" in name]
    assert reason == "ATen by design on cpu: int8 GEMM"
    torch._dynamo.reset()
    actual = torch.compile(torch._int_mm, backend="minicomp", options={"target": "cpu"})(a, b)
    assert torch.equal(actual, torch._int_mm(a, b))


# ---- NVRTC


def _nvrtc():
    from minicomp.backends.cuda import nvrtc

    try:
        nvrtc.nvrtc_version()
    except nvrtc.NvrtcUnavailableError as err:  # pragma: no cover - depends on the machine
        pytest.skip(f"NVRTC unavailable: {err}")
    return nvrtc


def _nvrtc_problems():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(512, 256, generator=gen).to(torch.bfloat16)
    w_q, w_scale = _quantized_weight(384, 256, gen)
    bias = torch.randn(384, generator=gen).to(torch.bfloat16)
    return {
        # Both operands K-major (torchao's weight is a transposed [N, K]), the rescale fused.
        "dynamic_quant_linear": (dynamic_quant_linear, (x, w_q, w_scale, bias)),
        # B [K, N] row-major: its fragments element by element from rows of K.
        "b_rows_of_k": (torch._int_mm, (int8((512, 256), gen), int8((256, 384), gen))),
        # Operands computed by a prologue: staged through registers.
        "prologues": (
            lambda a, w: torch._int_mm(-a, (-w).t()),
            (int8((512, 256), gen), int8((384, 256), gen)),
        ),
        # A transposed as well, u8 activations.
        "a_rows_of_k": (
            torch._int_mm,
            (int8((512, 256), gen, transposed=True, dtype=torch.uint8), int8((256, 384), gen)),
        ),
    }


@pytest.mark.parametrize(
    "case", ["dynamic_quant_linear", "b_rows_of_k", "prologues", "a_rows_of_k"]
)
def test_level1_int8_tilings_compile_with_nvrtc(case, tmp_path):
    from minicomp.backends.cuda.codegen import render_module

    nvrtc = _nvrtc()
    fn, args = _nvrtc_problems()[case]
    problem = matmul_problem_of(fn, *args, target=TARGET)
    assert matmul_tc.TEMPLATE.applies(problem)
    configs = matmul_tc.TEMPLATE.candidates(problem, 1)
    assert len(configs) >= 4
    archs = [a for a in ("sm_80", "sm_89", "sm_90") if a in nvrtc.supported_archs()]
    for config in configs:
        kernel = matmul_tc.TEMPLATE.instantiate(problem, config)
        source = render_module(Module(kernel.name, (kernel,)))
        assert "mc_mma_m16n8k32_" in source
        for arch in archs:
            binary = nvrtc.compile_cuda(source, arch=arch, name=case, cache_dir=str(tmp_path))
            usage = binary.resources[kernel.name]
            what = (case, str(config), arch, usage)
            assert usage.registers > 0, binary.log
            assert usage.spill_stores == 0 and usage.spill_loads == 0, what
            assert usage.stack_bytes == 0, what
