"""`aten._scaled_mm` (float8 x float8, f32 scales) on the CUDA targets: lowered to a product of
the widened float8 operands summed in f32 whose scales, bias and cast run in the matmul's
epilogue (passes/graph/anchors.py), computed by matmul_tc with the float8 mma m16n8k32 where the
architecture has it (sm_89+) and by matmul_simt elsewhere; forms eager does not compute that way
stay ATen calls.

PyTorch 2.13 runs `_scaled_mm` on the CPU (it dequantizes and multiplies in f32), so the
compiled graphs (cuda-emu) are compared with eager on the same tensors and with a float64
reference from the dequantized operands: within 2^-20 of the sum of the terms' magnitudes
(|scale_a scale_b| sum_k |a_k b_k| + |bias|, f32 sums in another order) plus half an ulp of
the output type (bf16, f16). Also: a torchao float8 training model (Float8Linear, tensorwise
and rowwise recipes: torchao 0.18 builds them on the CPU; its float8 inference configs need a
GPU of compute capability 8.9, so they cannot be built here), the tuner's level-1 float8
tilings, and every level-1 float8 tiling compiled by NVRTC for sm_89 and sm_90 without spills.
"""

import warnings

import pytest
import torch
from schedule_graphs import matmul_problem_of

import minicomp
from minicomp.dynamo.backend import recording
from minicomp.ir import types as T
from minicomp.ir.func import Module
from minicomp.ir.graph import ArgRef, ExternOp, Graph, TensorType, Value
from minicomp.schedule.templates import matmul_simt, matmul_tc

TARGET = "cuda-emu"
TC, SIMT = matmul_tc.NAME, matmul_simt.NAME
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
# Half an ulp of the output type, relative: where the last rounding may differ.
OUT_EPS = {torch.float32: 0.0, torch.bfloat16: 2.0**-8, torch.float16: 2.0**-11}
SUM_EPS = 2.0**-20


def fp8(shape, dtype, gen, *, column_major: bool = False, scale: float = 8.0) -> torch.Tensor:
    """Random float8 values of `shape`; stored transposed (a column-major view) when asked."""
    stored = shape[::-1] if column_major else shape
    t = (torch.randn(stored, generator=gen) * scale).to(dtype)
    return t.t() if column_major else t


def reference(a, b, scale_a, scale_b, bias=None) -> tuple[torch.Tensor, torch.Tensor]:
    """The exact result in float64 from the dequantized operands, and the magnitude the f32
    sums' error is relative to."""
    sa, sb = scale_a.double(), scale_b.double()
    if sa.numel() == 1:
        sa, sb = sa.reshape(()), sb.reshape(())
    exact = (a.double() @ b.double()) * sa * sb
    magnitude = (a.double().abs() @ b.double().abs()) * (sa * sb).abs()
    if bias is not None:
        exact, magnitude = exact + bias.double(), magnitude + bias.double().abs()
    return exact, magnitude


def check_close(got, exact, magnitude, dtype) -> None:
    tol = SUM_EPS * magnitude + OUT_EPS[dtype] * exact.abs()
    err = (got.double() - exact).abs()
    assert (err <= tol).all(), float((err - tol).max())


def compile_and_compare(fn, *args, options=None) -> tuple[list, tuple]:
    """`fn` (returning a tuple of `_scaled_mm` results) compiled for cuda-emu against eager:
    dtypes, shapes and strides equal; returns the records and the compiled results, whose
    values the caller checks against the float64 reference (module doc)."""
    torch._dynamo.reset()
    records: list = []
    opts = {"target": TARGET, "fallback": "error", **(options or {})}
    with recording(records), warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback of any kind
        actual = torch.compile(fn, backend="minicomp", options=opts)(*args)
    expected = fn(*args)
    for got, want in zip(actual, expected, strict=True):
        assert got.dtype == want.dtype and got.shape == want.shape
        assert got.stride() == want.stride()
    return records, actual


def templates(records) -> list:
    return [None if k.attrs.template is None else k.attrs.template.split("[")[0]
            for r in records for k in r.kernels]  # fmt: skip


def aten_calls(records, name: str = "_scaled_mm") -> list:
    return [n for r in records for n in r.graph.nodes if isinstance(n, ExternOp)
            and name in str(n.target)]  # fmt: skip


# ---- what is lowered: sizes, partial tiles, scales, bias, output types, formats

# (M, K, N): M any (one row is a matrix-vector product), K and N multiples of 16 (eager's
# rule); none a multiple of the tiles' 32 or 64 in some, K past one and several K steps.
SIZES = [(1, 64, 48), (16, 32, 16), (33, 48, 208), (128, 4096, 64), (72, 208, 96)]
PAIRS = [(E4M3, E4M3), (E4M3, E5M2), (E5M2, E4M3)]


def _case(gen, m, k, n, pair, rowwise, out_dtype, with_bias):
    a = fp8((m, k), pair[0], gen)
    b = fp8((k, n), pair[1], gen, column_major=True)
    if rowwise:
        sa, sb = torch.rand(m, 1, generator=gen) + 0.5, torch.rand(1, n, generator=gen) + 0.5
    else:
        sa, sb = torch.tensor(0.75), torch.tensor([[1.5]])
    bias = torch.randn(n, generator=gen).to(out_dtype) if with_bias else None
    return a, b, sa, sb, bias


def _cases():
    """Tensorwise (a 0-d and a 1 x 1 scale) and rowwise scales, each output type, with and
    without bias, over the sizes and format pairs eager accepts (rowwise: e4m3fn B, a 16-bit
    output)."""
    out = []
    for i, (m, k, n) in enumerate(SIZES):
        for j, pair in enumerate(PAIRS):
            for out_dtype in (torch.float32, torch.bfloat16, torch.float16):
                rowwise = (i + j) % 2 == 1 and pair[1] == E4M3 and out_dtype != torch.float32
                with_bias = out_dtype != torch.float32 and (i + j) % 3 != 0
                out.append((m, k, n, pair, rowwise, out_dtype, with_bias))
    return out


CASES = _cases()


@pytest.mark.parametrize("m", sorted({m for m, *_ in SIZES}))
def test_scaled_mm_matches_eager(m):
    """Every case of rows M in one graph: each product one template kernel (matrix-vector
    products, M = 1, a reduction) with the scales, bias and cast in its epilogue, no ATen call,
    eager's dtypes, shapes and strides, values within tolerance of the float64 reference."""
    gen = torch.Generator().manual_seed(m)
    cases = [c for c in CASES if c[0] == m]
    tensors = [_case(gen, *c) for c in cases]
    flat = [t for ts in tensors for t in ts if t is not None]

    def products(*args):
        it = iter(args)
        results = []
        for c in cases:
            a, b, sa, sb = next(it), next(it), next(it), next(it)
            bias = next(it) if c[6] else None
            results.append(torch._scaled_mm(a, b, sa, sb, bias=bias, out_dtype=c[5]))
        return tuple(results)

    records, actual = compile_and_compare(products, *flat)
    assert not aten_calls(records)
    used = templates(records)
    assert len(used) == len(cases)
    assert set(used) == ({None} if m == 1 else {TC}), used
    eager = products(*flat)
    for c, ts, got, want in zip(cases, tensors, actual, eager, strict=True):
        exact, magnitude = reference(*ts)
        check_close(got, exact, magnitude, c[5])
        check_close(want, exact, magnitude, c[5])  # the tolerance holds eager too


def test_prologue_epilogue_and_unaligned_operands():
    """A quantized activation computed in the product's prologue (the cast to float8 fused
    into the operand load), an activation after the epilogue, and an operand whose base is
    not 16-byte aligned (copied element by element at run time)."""
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(40, 144, generator=gen)
    w = fp8((144, 80), E4M3, gen, column_major=True)
    big = fp8((40, 160), E4M3, gen)
    s = torch.tensor(0.5)

    def fn(x, w, big, s):
        xq = (x * 16).to(E4M3)
        y = torch._scaled_mm(xq, w, s, s, out_dtype=torch.bfloat16).relu()
        z = torch._scaled_mm(big[:, 16:], w, s, s, out_dtype=torch.float32)
        return y, z

    records, (y, z) = compile_and_compare(fn, x, w, big, s)
    assert not aten_calls(records)
    assert templates(records).count(TC) == 2
    exact, magnitude = reference((x * 16).to(E4M3), w, s, s)
    check_close(y, exact.relu(), magnitude, torch.bfloat16)
    exact, magnitude = reference(big[:, 16:], w, s, s)
    check_close(z, exact, magnitude, torch.float32)


@pytest.mark.parametrize(
    "options, kernel",
    [({"tensor_cores": False}, SIMT), ({"arch": "sm_80"}, SIMT), ({"arch": "sm_89"}, TC)],
    ids=["no_tensor_cores", "sm_80", "sm_89"],
)
def test_without_the_float8_mma_simt_computes_it(options, kernel):
    """Without tensor cores, or compiling for sm_80 (no float8 mma; cuda-emu's CPU tensors
    are eager's CPU _scaled_mm, which any architecture computes), matmul_simt computes the
    product from the widened operands; sm_89 has the mma."""
    gen = torch.Generator().manual_seed(5)
    a, b, sa, sb, bias = _case(gen, 33, 96, 64, (E4M3, E5M2), False, torch.bfloat16, True)

    def fn(a, b, sa, sb, bias):
        return (torch._scaled_mm(a, b, sa, sb, bias=bias, out_dtype=torch.bfloat16),)

    records, (got,) = compile_and_compare(fn, a, b, sa, sb, bias, options=options)
    assert templates(records) == [kernel]
    check_close(got, *reference(a, b, sa, sb, bias), torch.bfloat16)


def test_in_kernel_split_k():
    """A product of few tiles and a long K splits K inside the kernel (f32 partials)."""
    gen = torch.Generator().manual_seed(6)
    a, b = fp8((128, 2048), E4M3, gen), fp8((2048, 128), E4M3, gen, column_major=True)
    s = torch.tensor(0.25)
    records, (got,) = compile_and_compare(
        lambda a, b, s: (torch._scaled_mm(a, b, s, s, out_dtype=torch.float32),), a, b, s
    )
    (kernel,) = [k for r in records for k in r.kernels]
    assert kernel.attrs.template.startswith(TC) and "_k" in kernel.attrs.template
    check_close(got, *reference(a, b, s, s), torch.float32)


# ---- what stays ATen's: eager raises, or computes it another way


def _refused_cases(gen):
    a, b = fp8((32, 64), E4M3, gen), fp8((64, 48), E4M3, gen, column_major=True)
    a5, b5 = fp8((32, 64), E5M2, gen), fp8((64, 48), E5M2, gen, column_major=True)
    one = torch.tensor(1.0)
    rows, cols = torch.rand(32, 1, generator=gen), torch.rand(1, 48, generator=gen)
    bf = torch.bfloat16
    return {
        # cuBLASLt has no e5m2 x e5m2 (eager on CUDA raises; the CPU computes it).
        "e5m2_e5m2": (a5, b5, one, one, {"out_dtype": bf}),
        # A float8 output (out_dtype unset) needs scale_result.
        "fp8_output": (a, b, one, one, {}),
        "scale_result": (a, b, one, one, {"out_dtype": bf, "scale_result": one}),
        # CUDA wants a bias of the output's 16-bit type.
        "bias_f32": (a, b, one, one, {"out_dtype": bf, "bias": torch.randn(48)}),
        "bias_f32_out": (a, b, one, one, {"out_dtype": torch.float32, "bias": torch.randn(48)}),
        # Row-wise: CUTLASS takes an e4m3fn B and a 16-bit output.
        "rowwise_f32": (a, b, rows, cols, {"out_dtype": torch.float32}),
        "rowwise_e5m2_b": (a, b5, rows, cols, {"out_dtype": bf}),
        # CUDA wants A row-major, B column-major, K a multiple of 16.
        "a_column_major": (a.t().contiguous().t(), b, one, one, {"out_dtype": bf}),
        "b_row_major": (a, b.contiguous(), one, one, {"out_dtype": bf}),
        "k_40": (a[:, :40], b.t()[:, :40].t(), one, one, {"out_dtype": bf}),
        # The fnuz formats are ROCm's.
        "fnuz": (
            fp8((32, 64), torch.float8_e4m3fnuz, gen),
            fp8((64, 48), torch.float8_e4m3fnuz, gen, column_major=True),
            one,
            one,
            {"out_dtype": bf},
        ),
    }


@pytest.mark.parametrize("case", list(_refused_cases(torch.Generator())))
def test_other_forms_stay_aten_calls(case):
    """Forms eager's CUDA kernels refuse (or compute otherwise) stay ATen calls: on cuda-emu
    the CPU's _scaled_mm computes them, bit for bit eager's; on cuda, eager's error."""
    gen = torch.Generator().manual_seed(7)
    a, b, sa, sb, kwargs = _refused_cases(gen)[case]

    def fn(a, b, sa, sb):
        return (torch._scaled_mm(a, b, sa, sb, **kwargs),)

    torch._dynamo.reset()
    records: list = []
    compiled = torch.compile(fn, backend="minicomp", options={"target": TARGET})
    try:
        runs = [fn(a, b, sa, sb)[0] for _ in range(2)]
    except RuntimeError:
        # Some CPUs' oneDNN has no kernel for this form: the compiled ATen call refuses it too.
        with recording(records), pytest.raises(RuntimeError):
            compiled(a, b, sa, sb)
        return
    with recording(records):
        (got,) = compiled(a, b, sa, sb)
    assert len(aten_calls(records)) == 1
    want = runs[0]
    assert got.dtype == want.dtype and got.shape == want.shape
    if not torch.equal(_bits(runs[0]), _bits(runs[1])):
        pytest.skip(f"eager's CPU _scaled_mm ({case}) differs from call to call on this CPU")
    assert torch.equal(_bits(got), _bits(want))


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The bytes of `t`: equal NaNs compare equal."""
    return t.contiguous().view(torch.uint8)


def _scaled_mm_graph(device: str) -> Graph:
    """One `_scaled_mm` call (32 x 64 e4m3fn row-major by 64 x 48 column-major, per-tensor
    scales, bf16 out) as the importer gives it, its tensors on `device`."""

    def value(name, shape, dtype, strides):
        return Value(name, TensorType(shape, dtype, device, strides))

    a = value("a", (32, 64), T.f8e4m3fn, (64, 1))
    b = value("b", (64, 48), T.f8e4m3fn, (1, 64))
    sa, sb = value("sa", (), T.f32, ()), value("sb", (), T.f32, ())
    out = value("out", (32, 48), T.bf16, (48, 1))
    call = ExternOp(
        "scaled_mm",
        (a, b, sa, sb),
        (out,),
        torch.ops.aten._scaled_mm.default,
        tuple(ArgRef(i) for i in range(4)),
        (("out_dtype", torch.bfloat16),),
        ((),),
    )
    return Graph((a, b, sa, sb), (call,), (out,))


@pytest.mark.parametrize(
    "device, arch, lowered",
    [
        ("cuda", "sm_80", False),
        ("cuda", None, False),
        ("cuda", "sm_89", True),
        ("cuda", "sm_90a", True),
        ("cpu", "sm_80", True),
        ("cpu", None, True),
    ],
)
def test_on_cuda_devices_the_lowering_needs_sm89(device, arch, lowered):
    """On a CUDA device eager's kernel needs compute capability 8.9: compiling for sm_80 (or
    an unknown architecture) the call stays ATen's, which raises eager's error there. CPU
    tensors (cuda-emu) are eager's CPU _scaled_mm, which computes them anywhere."""
    from minicomp.passes.graph.anchors import lower_anchors

    after = lower_anchors(_scaled_mm_graph(device), arch=arch)
    assert any(isinstance(n, ExternOp) for n in after.nodes) != lowered


def test_cpu_keeps_the_aten_call():
    """On the cpu target _scaled_mm stays ATen's (it dequantizes into a BLAS GEMM), said so."""
    gen = torch.Generator().manual_seed(10)
    a, b = fp8((33, 64), E4M3, gen), fp8((64, 48), E4M3, gen, column_major=True)
    s = torch.tensor(0.5)

    def fn(a, b, s):
        return torch._scaled_mm(a, b, s, s, out_dtype=torch.bfloat16)

    torch._dynamo.reset()
    report = minicomp.explain(fn, a, b, s, options={"target": "cpu"})
    (reason,) = [r for name, r in report.fallbacks.items() if "_scaled_mm" in name]
    assert reason == "ATen by design on cpu: float8 GEMM (dequantized to a BLAS GEMM)"
    torch._dynamo.reset()
    actual = torch.compile(fn, backend="minicomp", options={"target": "cpu"})(a, b, s)
    assert torch.equal(actual, fn(a, b, s))


# ---- torchao's float8 training linear (tensorwise and rowwise)


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_torchao_float8_linear(recipe):
    """torchao's Float8Linear (convert_to_float8_training) dynamically quantizes activations and
    weights and multiplies them with _scaled_mm: compiled for cuda-emu, every product is a
    float8 matmul_tc kernel, no ATen call, and the forward and the input's gradient match
    eager's."""
    float8 = pytest.importorskip("torchao.float8")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 96), torch.nn.ReLU(), torch.nn.Linear(96, 32))
    model = model.to(torch.bfloat16)
    float8.convert_to_float8_training(
        model, config=float8.Float8LinearConfig.from_recipe_name(recipe)
    )
    x = torch.randn(16, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        expected = model(x)
        torch._dynamo.reset()
        report = minicomp.explain(model, x, options={"target": TARGET})
        torch._dynamo.reset()
        actual = torch.compile(model, backend="minicomp", options={"target": TARGET})(x)
    torch.testing.assert_close(actual, expected, rtol=2**-7, atol=1e-2)
    assert not report.fallbacks, report.fallbacks
    used = [k.attrs.template for r in report.records for k in r.kernels if k.attrs.template]
    assert len(used) == 2 and all(t.startswith(TC) for t in used), used
    # Training: the backward's products (e5m2 gradients) too.
    x.requires_grad_()
    torch._dynamo.reset()
    out = torch.compile(model, backend="minicomp", options={"target": TARGET})(x)
    out.float().sum().backward()
    grad, x.grad = x.grad, None
    model(x).float().sum().backward()
    torch.testing.assert_close(grad, x.grad, rtol=2**-7, atol=1e-2)


# ---- tuning and NVRTC


def test_float8_tilings_are_tuned():
    """At search space 1 the tuner ranks matmul_tc's level-1 float8 tilings (K steps of 64, as
    for int8; cuda-emu: by the lens's estimate), and the chosen one computes the product."""
    gen = torch.Generator().manual_seed(9)
    a, b = fp8((64, 128), E4M3, gen), fp8((128, 96), E4M3, gen, column_major=True)
    s = torch.tensor(0.5)

    def fn(a, b, s):
        return torch._scaled_mm(a, b, s, s, out_dtype=torch.float32)

    torch._dynamo.reset()
    report = minicomp.explain(
        fn, a, b, s, options={"target": TARGET, "search_space": 1, "fallback": "error"}
    )
    ((_, template, choice),) = [t for r in report.records for t in r.tuning]
    assert template == TC and "ranked by the lens" in choice.describe(), choice.describe()
    problem = matmul_problem_of(fn, a, b, s)
    candidates = matmul_tc.TEMPLATE.candidates(problem, 1)
    assert len(candidates) > 1 and all(c.bk == 64 for c in candidates)
    # The level-1 tilings and the heuristic's (here K split in two inside the kernel).
    assert choice.config in [*candidates, matmul_tc.TEMPLATE.heuristic(problem)]
    records, (got,) = compile_and_compare(
        lambda *t: (fn(*t),), a, b, s, options={"search_space": 1}
    )
    assert [k.attrs.template for r in records for k in r.kernels] == [f"{TC}[{choice.config}]"]
    check_close(got, *reference(a, b, s, s), torch.float32)


def _nvrtc():
    from minicomp.backends.cuda import nvrtc

    try:
        nvrtc.nvrtc_version()
    except nvrtc.NvrtcUnavailableError as err:  # pragma: no cover - depends on the machine
        pytest.skip(f"NVRTC unavailable: {err}")
    return nvrtc


def _nvrtc_problems():
    gen = torch.Generator().manual_seed(0)
    x = fp8((512, 256), E4M3, gen)
    w = fp8((256, 384), E4M3, gen, column_major=True)
    rows, cols = torch.rand(512, 1, generator=gen), torch.rand(1, 384, generator=gen)
    bias = torch.randn(384, generator=gen).to(torch.bfloat16)
    s = torch.tensor(0.5)
    return {
        # torchao's forward: rowwise scales and a bias in the epilogue, bf16 out.
        "rowwise_bias": (
            lambda x, w, r, c, b: torch._scaled_mm(x, w, r, c, bias=b, out_dtype=torch.bfloat16),
            (x, w, rows, cols, bias),
        ),
        # An e5m2 operand (a gradient), f32 out.
        "e5m2_f32": (
            lambda x, w, s: torch._scaled_mm(x, w, s, s, out_dtype=torch.float32),
            (fp8((512, 256), E5M2, gen), w, s),
        ),
        # The activation quantized in the prologue: staged through registers.
        "prologue": (
            lambda x, w, s: torch._scaled_mm(x.to(E4M3), w, s, s, out_dtype=torch.float16),
            (torch.randn(512, 256, generator=gen), w, s),
        ),
    }


@pytest.mark.parametrize("arch", ["sm_89", "sm_90"])
@pytest.mark.parametrize("case", ["rowwise_bias", "e5m2_f32", "prologue"])
def test_level1_float8_tilings_compile_with_nvrtc(case, arch, tmp_path):
    """Every level-1 float8 tiling of the architecture compiles for it without spills: sm_89's
    all of them (QMMA); sm_90's, which unpacks the fragments to f16 registers, those of warps of
    at most 32 accumulators a thread (sm_80 has no float8 mma: the template does not apply)."""
    from minicomp.backends.cuda.codegen import render_module

    nvrtc = _nvrtc()
    if arch not in nvrtc.supported_archs():  # pragma: no cover - depends on NVRTC's version
        pytest.skip(f"NVRTC {nvrtc.nvrtc_version()} has no {arch}")
    fn, args = _nvrtc_problems()[case]
    problem = matmul_problem_of(fn, *args, target=TARGET)
    problem.arch = arch
    assert matmul_tc.TEMPLATE.applies(problem) and matmul_tc.mma_of(problem) is matmul_tc.FP8_MMA
    configs = matmul_tc.TEMPLATE.candidates(problem, 1)
    assert len(configs) >= 4
    if arch == "sm_89" and case != "prologue":
        assert len(configs) == len(matmul_tc.level1(problem))
    for config in configs:
        kernel = matmul_tc.TEMPLATE.instantiate(problem, config)
        source = render_module(Module(kernel.name, (kernel,)))
        assert "mc_mma_m16n8k32_e" in source
        binary = nvrtc.compile_cuda(source, arch=arch, name=case, cache_dir=str(tmp_path))
        usage = binary.resources[kernel.name]
        what = (case, str(config), arch, usage)
        assert usage.registers > 0, binary.log
        assert usage.spill_stores == 0 and usage.spill_loads == 0, what
        assert usage.stack_bytes == 0, what


def test_sm80_problems_take_the_simt_template():
    fn, args = _nvrtc_problems()["e5m2_f32"]
    problem = matmul_problem_of(fn, *args, target=TARGET)
    problem.arch = "sm_80"
    assert not matmul_tc.TEMPLATE.applies(problem)
