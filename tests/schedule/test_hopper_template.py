"""The Hopper matmul as the compiler's choice (issue 21): torch.compile of a Linear with its bias
and gelu fused on cuda-emu compiled for sm_90a runs the TMA/wgmma template, the plan encoding
its tensor maps at each call, and matches float64 on fresh inputs; explain says which template
and why; sm_90 (cuda-emu's default, the lens's H100) and products the template refuses keep
matmul_tc; the fused kernels build for sm_90a with NVRTC without spills, with HGMMA and
UTMALDG in their SASS; a computed prologue becomes a kernel of its own on sm_90a."""

import copy

import pytest
import torch
import torch.nn.functional as F
from schedule_graphs import matmul_problem_of

import minicomp
from minicomp.backends.cuda.tensor_map import (
    TensorMapError,
    driver_arguments,
    tensor_map_arguments,
)
from minicomp.dynamo.backend import recording
from minicomp.schedule.templates import matmul_hopper, matmul_tc, template_choice

M, N, K = 67, 130, 192  # odd edges: a partial row tile and column tile; K three 64-wide stages
HOPPER = {"target": "cuda-emu", "arch": "sm_90a", "fallback": "error"}
TOLERANCE = {torch.float16: 1e-2, torch.bfloat16: 3e-2}


class LinearGelu(torch.nn.Module):
    def __init__(self, k: int = K, n: int = N):
        super().__init__()
        self.linear = torch.nn.Linear(k, n)

    def forward(self, x):
        return F.gelu(self.linear(x))


def expected(model: LinearGelu, x: torch.Tensor) -> torch.Tensor:
    w, b = model.linear.weight.double(), model.linear.bias.double()
    return F.gelu(x.double() @ w.T + b)


def templates(records) -> list[str]:
    return [k.attrs.template.split("[")[0] for r in records for k in r.kernels if k.attrs.template]


@pytest.fixture(scope="module", params=[torch.float16, torch.bfloat16], ids=["f16", "bf16"])
def compiled_linear(request):
    """A LinearGelu compiled once for sm_90a on cuda-emu, with the templates it used."""
    dtype = request.param
    model = LinearGelu().to(dtype)
    records: list = []
    torch._dynamo.reset()
    fn = torch.compile(model, backend="minicomp", options=HOPPER)
    with torch.no_grad(), recording(records):
        fn(torch.randn(M, K, dtype=dtype))
    return model, fn, templates(records), dtype


def test_a_linear_with_bias_and_gelu_runs_the_hopper_template(compiled_linear):
    model, fn, used, dtype = compiled_linear
    assert used == [matmul_hopper.NAME]
    # Fresh inputs at new addresses each call: the maps are encoded per call, and the output
    # (fresh memory) must be written whole, edges included.
    for _ in range(2):
        x = torch.randn(M, K, dtype=dtype)
        with torch.no_grad():
            out = fn(x)
        tol = TOLERANCE[dtype]
        torch.testing.assert_close(out.double(), expected(model, x), rtol=tol, atol=tol)


def test_a_symbolic_m_runs_clusters_sharing_b_with_the_fused_epilogue():
    # A symbolic M (the heuristic assumes it large) takes pairs of 64 x 64 tiles along M that
    # share B's tile by multicast; at M = 130 (three row tiles) the second pair's second CTA
    # is past C's edge, at M = 67 the first pair's: both must still take part in its copies
    # and barriers, store nothing, and leave the epilogue's bias and gelu right.
    model = LinearGelu().half()
    records: list = []
    torch._dynamo.reset()
    fn = torch.compile(model, backend="minicomp", options=HOPPER)
    for m in (130, 67):
        x = torch.randn(m, K, dtype=torch.float16)
        torch._dynamo.mark_dynamic(x, 0)
        with torch.no_grad(), recording(records):
            out = fn(x)
        torch.testing.assert_close(out.double(), expected(model, x), rtol=1e-2, atol=1e-2)
    ((kernel,),) = [r.kernels for r in records]
    assert kernel.attrs.template == "matmul_hopper[64x64x64_s8_c2b]"
    assert kernel.attrs.cluster_dim == (2, 1, 1)


def test_explain_names_the_hopper_template_and_why():
    model = LinearGelu().half()
    with torch.no_grad():
        report = minicomp.explain(model, torch.randn(M, K).half(), options=HOPPER)
    assert "[matmul_hopper]" in str(report)
    assert "matmul_hopper HopperConfig" in report.ir()
    assert "template: sm_90a: TMA and wgmma" in report.ir()


def test_sm_90_keeps_matmul_tc_and_says_why():
    # cuda-emu's default architecture is the lens's H100, sm_90: no wgmma.
    model = LinearGelu().half()
    x = torch.randn(M, K).half()
    with torch.no_grad():
        report = minicomp.explain(model, x, options={"target": "cuda-emu"})
        out = model(x)
    assert "[matmul_tc]" in str(report)
    assert "not matmul_hopper: wgmma needs sm_90a, not sm_90" in report.ir()
    torch.testing.assert_close(out.double(), expected(model, x), rtol=1e-2, atol=1e-2)


def test_a_k_tma_cannot_read_falls_back_to_matmul_tc():
    # K = 190 halves: rows of 380 bytes, which TMA cannot step (multiples of 16 only).
    model = LinearGelu(k=190).half()
    x = torch.randn(M, 190).half()
    records: list = []
    torch._dynamo.reset()
    fn = torch.compile(model, backend="minicomp", options=HOPPER)
    with torch.no_grad(), recording(records):
        out = fn(x)
    assert templates(records) == [matmul_tc.NAME]
    torch.testing.assert_close(out.double(), expected(model, x), rtol=1e-2, atol=1e-2)
    (record,) = records
    ((_, _, choice),) = record.tuning
    assert "rows start every 380 bytes" in choice.why, choice.why


def test_a_prologue_on_sm_90a_is_a_kernel_of_its_own_before_the_hopper_product():
    # TMA reads A as memory holds it: relu(x) is written out, then read by the product.
    x, w, b = torch.randn(M, K).half(), torch.randn(N, K).half(), torch.randn(N).half()
    records: list = []
    torch._dynamo.reset()
    fn = torch.compile(
        lambda x, w, b: torch.relu(x) @ w.t() + b, backend="minicomp", options=HOPPER
    )
    with recording(records):
        out = fn(x, w, b)
    (record,) = records
    assert [k.attrs.template for k in record.kernels][0] is None  # the relu
    assert templates(records) == [matmul_hopper.NAME]
    expect = torch.relu(x.double()) @ w.double().t() + b.double()
    torch.testing.assert_close(out.double(), expect, rtol=1e-2, atol=1e-2)


def _problem(arch: str, m: int = M, k: int = K, transposed_b: bool = False, relu_a=False):
    def fn(x, w, b):
        x = torch.relu(x) if relu_a else x
        return F.gelu(x @ (w if transposed_b else w.t()) + b)

    w = torch.randn(k, N) if transposed_b else torch.randn(N, k)
    args = (torch.randn(m, k).half(), w.half(), torch.randn(N).half())
    problem = copy.copy(matmul_problem_of(fn, *args))
    problem.arch = arch
    return problem


def test_what_the_template_refuses_and_why():
    assert template_choice(_problem("sm_90a"))[0] is matmul_hopper.TEMPLATE
    refused = {
        "sm_80": "wgmma needs sm_90a, not sm_80",
        "few rows": "M = 16 rows, fewer than a 64-row wgmma tile",
        "[K, N] weight": "B's rows start every 260 bytes from byte 0 (TMA needs multiples of 16)",
        "relu prologue": "A has a fused prologue or a gathered window (TMA copies memory as it is)",
    }
    problems = {
        "sm_80": _problem("sm_80"),
        "few rows": _problem("sm_90a", m=16),
        "[K, N] weight": _problem("sm_90a", transposed_b=True),
        "relu prologue": _problem("sm_90a", relu_a=True),
    }
    for case, problem in problems.items():
        template, why = template_choice(problem)
        assert template is matmul_tc.TEMPLATE and refused[case] in why, (case, why)


def test_an_input_at_an_odd_offset_is_read_from_an_aligned_copy(compiled_linear):
    # Contiguous, but 2 bytes into its storage: TMA needs 16-byte aligned data.
    model, fn, _, dtype = compiled_linear
    x = torch.randn(M * K + 8, dtype=dtype)[1 : 1 + M * K].view(M, K)
    assert x.data_ptr() % 16
    with torch.no_grad():
        out = fn(x)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(out.double(), expected(model, x), rtol=tol, atol=tol)


def test_the_maps_view_the_operands_buffers():
    problem = _problem("sm_90a")
    config = matmul_hopper.heuristic(problem)
    kernel = matmul_hopper.instantiate(problem, config)
    a_map, b_map = tensor_map_arguments(kernel)
    assert (a_map.param, a_map.shape, a_map.strides) == ("tma_a", (M, K), (K, 1))
    assert (b_map.param, b_map.shape, b_map.strides) == ("tma_b", (N, K), (K, 1))
    # What the cuda target gives cuTensorMapEncodeTiled for A (innermost first; no GPU needed).
    x = torch.zeros(M, K, dtype=torch.float16)
    args = driver_arguments(a_map.view(x), a_map.type)
    assert args["globalAddress"] == x.data_ptr()
    assert (args["globalDim"], args["globalStrides"]) == ([K, M], [2 * K])
    assert args["boxDim"] == [64, config.bm]  # a stage: BM rows of 64 halves (128 bytes)
    assert args["swizzle"] == 3  # CU_TENSOR_MAP_SWIZZLE_128B
    # A buffer the map cannot describe is an error naming the kernel and the map.
    with pytest.raises(TensorMapError, match=f"kernel {kernel.name}: tensor map tma_a holds f"):
        a_map.encode(torch.zeros(M * K, dtype=torch.float32))


def test_the_fused_kernels_build_for_sm_90a_without_spills(tmp_path):
    from minicomp.backends.cuda import nvrtc, sass
    from minicomp.backends.cuda.codegen import render_module
    from minicomp.ir.func import Module

    try:
        nvrtc.nvrtc_version()
    except nvrtc.NvrtcUnavailableError as err:  # pragma: no cover - depends on the machine
        pytest.skip(f"NVRTC unavailable: {err}")
    problem = _problem("sm_90a", m=512, k=256)
    for config in matmul_hopper.space(problem, 1):
        kernel = matmul_hopper.instantiate(problem, config)
        source = render_module(Module(kernel.name, (kernel,)))
        binary = nvrtc.compile_cuda(source, arch="sm_90a", cache_dir=str(tmp_path))
        usage = binary.resources[kernel.name]
        assert usage.spill_stores == 0 and usage.spill_loads == 0, (config, usage)
        assert usage.registers * config.threads <= 65536, (config, usage)
        try:
            ops = sass.full_opcode_counts(sass.disassemble(binary.cubin)[kernel.name])
        except sass.SassUnavailableError as err:  # pragma: no cover - depends on the machine
            pytest.skip(str(err))
        for prefix in ("HGMMA", "UTMALDG"):
            assert any(op.startswith(prefix) for op in ops), (config, prefix)


def test_the_cuda_target_compiles_for_sm_90a_on_an_sm_90_device(monkeypatch):
    # Its binary runs on that device only: wgmma, and so the Hopper template, are allowed.
    from minicomp.backends.cuda import module
    from minicomp.targets import TARGETS

    options = minicomp.config.resolve()
    for device, expected in (("sm_90", "sm_90a"), ("sm_89", "sm_89")):
        monkeypatch.setattr(module, "pick_arch", lambda index, library=None, d=device: d)
        assert TARGETS["cuda"].arch(options, 0) == expected


def test_the_epilogue_stores_whole_sectors_without_bank_conflicts():
    """The lens on a product with an f16 C (issue 16's sector goal): each consumer warp stages
    its fragment in shared memory and stores C along its rows, so every global access of the
    kernel (TMA's loads, C's stores) uses at least 90% of its sectors' bytes, and the staging
    rows' writes and reads have no bank conflicts."""
    from minicomp.lens.counts import KernelCounts
    from minicomp.lens.session import recording as lens_recording

    a, b = torch.randn(128, 64, dtype=torch.float16), torch.randn(192, 64, dtype=torch.float16)
    fn = torch.compile(lambda a, b: a @ b.T, backend="minicomp", options={**HOPPER, "lens": True})
    torch._dynamo.reset()
    with lens_recording() as session:
        out = fn(a, b)
    torch._dynamo.reset()
    torch.testing.assert_close(out.double(), a.double() @ b.double().T, rtol=1e-2, atol=1e-2)
    (launch,) = session.launches
    assert launch.function.attrs.template.startswith("matmul_hopper[")
    counts = KernelCounts.from_sample(launch.sample)
    stored = counts.global_store_bytes / (32 * counts.global_store_sectors)
    assert counts.sector_efficiency >= 0.9 and stored >= 0.9, (counts.sector_efficiency, stored)
    assert counts.bank_conflict_factor == 1.0
