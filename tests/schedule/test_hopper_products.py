"""The Hopper template on the products LLM serving and training run (issue 21): a symbolic M
(the tokens of a serving batch) and N compiled once and run at M below one 64-row tile and at
an odd M over it; a bmm and per-head products (two batch dimensions, a broadcast kv head);
[K, N] and [K, M] (MN-major) operands; each into a poisoned output, against float64; split-K
partials as a batch; explain's reason where a product still falls back; the symbolic kernel
round-trips through script text; symbolic and MN-major kernels build for sm_90a with NVRTC
without spills."""

import pytest
import torch
from schedule_graphs import matmul_problem_of

from minicomp.backends.cuda.tensor_map import tensor_map_arguments
from minicomp.dynamo.backend import recording
from minicomp.ir import types as T
from minicomp.ir.expr import Var
from minicomp.schedule.templates import matmul_hopper, matmul_tc, template_choice

N, K = 130, 192  # an odd column tile; K three 64-wide stages
HOPPER = {"target": "cuda-emu", "arch": "sm_90a", "fallback": "error"}


def poisoned(*shape, dtype=torch.float16):
    return torch.full(shape, float("nan"), dtype=dtype)


def templates(records) -> list[str]:
    return [k.attrs.template.split("[")[0] for r in records for k in r.kernels if k.attrs.template]


def addmm_into(x, w, b, out):
    torch.addmm(b, x, w.t(), out=out)  # C written straight into `out`: its edges are checked


@pytest.fixture(scope="module")
def dynamic_addmm():
    """addmm_into compiled once for sm_90a with M (the tokens) and N dynamic, and its records."""
    records: list = []
    torch._dynamo.reset()
    return torch.compile(addmm_into, backend="minicomp", options=HOPPER), records


@pytest.mark.parametrize(("m", "n"), [(33, N), (67, 72)], ids=["M33_N130", "M67_N72"])
def test_symbolic_sizes_run_the_hopper_template_at_every_size(dynamic_addmm, m, n):
    fn, records = dynamic_addmm
    x, w, b = torch.randn(m, K).half(), torch.randn(n, K).half(), torch.randn(n).half()
    out = poisoned(m, n)
    for t, dims in ((x, (0,)), (w, (0,)), (b, (0,)), (out, (0, 1))):
        for d in dims:
            torch._dynamo.mark_dynamic(t, d)
    with recording(records):
        fn(x, w, b, out)
    expect = x.double() @ w.double().t() + b.double()
    torch.testing.assert_close(out.double(), expect, rtol=1e-2, atol=2e-2)
    # One compile for both: the grid, the tile loop, the guards and the maps read M and N at
    # the launch.
    (record,) = records
    assert templates(records) == [matmul_hopper.NAME]
    ((_, _, choice),) = record.tuning
    assert choice.why == "sm_90a: TMA and wgmma"
    (kernel,) = record.kernels
    a_map, b_map = tensor_map_arguments(kernel)
    assert not isinstance(a_map.shape[0], int) and not isinstance(b_map.shape[0], int)


def batched_products(a, b, q, kv, out, scores, hidden):
    torch.bmm(a, b.transpose(1, 2), out=out)
    # a [3, 67, K] @ b[0].T: its batch and sequence fold into M (indexed as m // 67, m % 67).
    torch.matmul(a, b[0].t(), out=hidden)
    # Per-head scores of q [batch, seq, heads, d] with one shared kv head: q's heads are
    # strided apart from its batches (two batch dimensions), kv's broadcast (stride 0).
    heads = q.shape[2]
    torch.matmul(q.transpose(1, 2), kv.expand(-1, heads, -1, -1).transpose(2, 3), out=scores)


def test_batched_and_per_head_products_run_the_hopper_template():
    bf16 = torch.bfloat16
    a, b = torch.randn(3, 67, K, dtype=bf16), torch.randn(3, N, K, dtype=bf16)
    q, kv = torch.randn(2, 67, 3, 64, dtype=bf16), torch.randn(2, 1, 70, 64, dtype=bf16)
    out, hidden = poisoned(3, 67, N, dtype=bf16), poisoned(3, 67, N, dtype=bf16)
    scores = poisoned(2, 3, 67, 70, dtype=bf16)
    records: list = []
    torch._dynamo.reset()
    fn = torch.compile(batched_products, backend="minicomp", options=HOPPER)
    with recording(records):
        fn(a, b, q, kv, out, scores, hidden)
    assert templates(records) == [matmul_hopper.NAME] * 3
    expect = a.double() @ b.double().transpose(1, 2)
    torch.testing.assert_close(out.double(), expect, rtol=3e-2, atol=3e-2)
    expect = a.double() @ b[0].double().t()
    torch.testing.assert_close(hidden.double(), expect, rtol=3e-2, atol=3e-2)
    expect = q.double().transpose(1, 2) @ kv.double().transpose(2, 3)
    torch.testing.assert_close(scores.double(), expect, rtol=3e-2, atol=3e-2)
    # The batch is the maps' outer dimensions: one for the bmm, two for q, one for kv.
    ranks = [[len(m.shape) for m in tensor_map_arguments(k)] for r in records for k in r.kernels]
    assert sorted(ranks) == [[2, 2], [3, 3], [4, 3]]


def test_split_k_partials_run_the_hopper_template():
    # 64 x 64 x 8192: one tile, so the graph splits K into 16 chunks of 512, a batch of
    # partial products reading A and B 1024 bytes apart (passes/graph/split_k.py), then sums.
    a, w = torch.randn(64, 8192).half(), torch.randn(64, 8192).half()
    records: list = []
    torch._dynamo.reset()
    fn = torch.compile(lambda a, w: a @ w.t(), backend="minicomp", options=HOPPER)
    with recording(records):
        out = fn(a, w)
    (record,) = records
    partials, _ = record.kernels
    assert partials.attrs.template.startswith(f"{matmul_hopper.NAME}[")
    a_map, _ = tensor_map_arguments(partials)
    assert (a_map.shape, a_map.strides) == ((16, 64, 512), (512, 8192, 1))
    expect = a.double() @ w.double().t()
    torch.testing.assert_close(out.double(), expect, rtol=1e-2, atol=0.25)


def mn_major_products(a, b, at, w, out, out_t):
    torch.mm(a, b, out=out)  # b [K, N] row-major: B MN-major
    torch.mm(at.t(), w.t(), out=out_t)  # at [K, M]: A MN-major (a transposed view)


def test_mn_major_operands_run_the_hopper_template():
    # A [K, N] B's rows (an [K, M] A's) must be whole 16 bytes: N = 136 (M = 72); K = 200 ends
    # in a partial stage.
    m, n, k = 67, 136, 200
    a, b = torch.randn(m, k).half(), torch.randn(k, n).half()
    at, w = torch.randn(k, 72).half(), torch.randn(N, k).half()
    out, out_t = poisoned(m, n), poisoned(72, N)
    records: list = []
    torch._dynamo.reset()
    fn = torch.compile(mn_major_products, backend="minicomp", options=HOPPER)
    with recording(records):
        fn(a, b, at, w, out, out_t)
    assert templates(records) == [matmul_hopper.NAME] * 2
    torch.testing.assert_close(out.double(), a.double() @ b.double(), rtol=1e-2, atol=2e-2)
    expect = at.double().t() @ w.double().t()
    torch.testing.assert_close(out_t.double(), expect, rtol=1e-2, atol=2e-2)


def test_both_operands_mn_major_in_the_largest_tile():
    # One SM: 128 x 256 tiles (two consumer warpgroups, B in four 64-column spans), one block
    # looping over the four tiles of C.
    m, n, k = 256, 512, 192
    at, b = torch.randn(k, m, dtype=torch.bfloat16), torch.randn(k, n, dtype=torch.bfloat16)
    out = poisoned(m, n, dtype=torch.bfloat16)
    records: list = []
    torch._dynamo.reset()
    options = {**HOPPER, "sm_count": 1}
    fn = torch.compile(
        lambda at, b, out: torch.mm(at.t(), b, out=out), backend="minicomp", options=options
    )
    with recording(records):
        fn(at, b, out)
    ((kernel,),) = [r.kernels for r in records]
    assert kernel.attrs.template == "matmul_hopper[128x256x64_s4]"
    expect = at.double().t() @ b.double()
    torch.testing.assert_close(out.double(), expect, rtol=3e-2, atol=3e-2)


def _symbolic_problem(*dims: tuple[str, int]):
    """The product x @ w.t() on sm_90a with dimensions `dims` ("x" or "w", dimension) dynamic."""
    marks = {"x": torch.randn(67, K).half(), "w": torch.randn(N, K).half()}
    for name, d in dims:
        torch._dynamo.mark_dynamic(marks[name], d)
    x, w = marks["x"], marks["w"]
    problem = matmul_problem_of(lambda x, w: x @ w.t(), x, w)
    problem.arch = "sm_90a"
    return problem


def test_a_symbolic_k_falls_back_with_the_reason():
    # TMA steps rows by a multiple of 16 bytes, which a symbolic K leaves unknown until run time.
    problem = _symbolic_problem(("x", 1), ("w", 1))
    template, why = template_choice(problem)
    assert template is matmul_tc.TEMPLATE
    assert why == "not matmul_hopper: A's strides are symbolic"


def test_a_batch_stride_tma_cannot_step_falls_back_with_the_reason():
    # Batches 12865 halves apart: TMA steps every dimension by a multiple of 16 bytes.
    a = torch.randn(3, 67 * K + 1).half()[:, : 67 * K].view(3, 67, K)
    b = torch.randn(3, N, K).half()
    problem = matmul_problem_of(lambda a, b: torch.bmm(a, b.transpose(1, 2)), a, b)
    problem.arch = "sm_90a"
    template, why = template_choice(problem)
    assert template is matmul_tc.TEMPLATE
    assert "A's batch stride is 25730 bytes (TMA needs a positive multiple of 16)" in why


def test_the_symbolic_kernel_builds_for_sm_90a_without_spills(tmp_path):
    from minicomp.ir.printer import function_str
    from minicomp.script.text import parse_function

    problem = _symbolic_problem(("x", 0))
    assert template_choice(problem)[0] is matmul_hopper.TEMPLATE
    kernel = matmul_hopper.instantiate(problem, matmul_hopper.heuristic(problem))
    # Its maps' symbolic shapes print as script text and parse back.
    assert parse_function(function_str(kernel)).attrs == kernel.attrs
    # A's map views the buffer at the launch's M; at M = 0 it has nothing to read (TMA has no
    # map of an empty dimension): zero bytes, which the kernel, with no tiles, never reads.
    a_map, _ = tensor_map_arguments(kernel)
    (m,) = a_map.symbols  # the kernel's one size parameter
    assert a_map.shape == (Var(m, T.i64), K)
    assert a_map.view(torch.zeros(5 * K).half(), [5]).shape == (5, K)
    assert a_map.encode(torch.zeros(0).half(), [0]) == bytes(128)
    _build_without_spills(kernel, tmp_path)


def test_mn_major_kernels_build_for_sm_90a_without_spills(tmp_path):
    # Both operands MN-major, in the largest tile and a one-warpgroup one, and that one in
    # pairs along N sharing A's boxes by multicast.
    at, b = torch.randn(K, 72).half(), torch.randn(K, 136).half()
    problem = matmul_problem_of(lambda at, b: at.t() @ b, at, b)
    problem.arch = "sm_90a"
    assert (problem.plain_a.contiguous, problem.plain_b.contiguous) == ("mn", "mn")
    one = matmul_hopper.CONFIGS[2]
    pairs = matmul_hopper.HopperConfig(one.bn, one.consumers, one.stages, cluster=2, share="a")
    for config in (matmul_hopper.CONFIGS[0], one, pairs):
        _build_without_spills(matmul_hopper.instantiate(problem, config), tmp_path)


def _build_without_spills(kernel, tmp_path):
    from minicomp.backends.cuda import nvrtc
    from minicomp.backends.cuda.codegen import render_module
    from minicomp.ir.func import Module

    try:
        nvrtc.nvrtc_version()
    except nvrtc.NvrtcUnavailableError as err:  # pragma: no cover - depends on the machine
        pytest.skip(f"NVRTC unavailable: {err}")
    source = render_module(Module(kernel.name, (kernel,)))
    binary = nvrtc.compile_cuda(source, arch="sm_90a", cache_dir=str(tmp_path))
    usage = binary.resources[kernel.name]
    assert usage.spill_stores == 0 and usage.spill_loads == 0, (kernel.attrs.template, usage)
