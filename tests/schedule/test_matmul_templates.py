"""Matrix-product templates on the CUDA targets (minicomp.schedule.templates): SIMT (f32, f64)
and tensor cores (f16, bf16), with fused prologues and epilogues, transposed, strided and
batched operands and sizes that are no multiple of any tile, compiled by torch.compile on
cuda-emu against float64 PyTorch; every level-1 candidate compiled by NVRTC without spills."""

import copy
import dataclasses
import functools

import pytest
import torch
import torch.nn.functional as F
from helpers import check_compiled
from schedule_graphs import matmul_problem_of

from minicomp.backends.cuda.arch import PORTABLE
from minicomp.dynamo.backend import recording
from minicomp.ir.func import Module
from minicomp.schedule.templates import TEMPLATES, matmul_simt, matmul_tc

TARGET = "cuda-emu"
SIMT, TC = matmul_simt.NAME, matmul_tc.NAME
TOLERANCE = {
    torch.float32: {"rtol": 1e-4, "atol": 1e-4},
    torch.float64: {"rtol": 1e-9, "atol": 1e-9},
    torch.float16: {"rtol": 1e-2, "atol": 1e-2},
    torch.bfloat16: {"rtol": 2e-2, "atol": 2e-2},
}
TEMPLATE_OF = {torch.float32: SIMT, torch.float64: SIMT, torch.float16: TC, torch.bfloat16: TC}


def run(fn, *args, dtype=torch.float32, options=None, dynamic=False, **tolerance):
    """Compile `fn` for cuda-emu, compare with float64 PyTorch, return the templates used."""
    records: list = []
    tol = {**TOLERANCE[dtype], **tolerance}
    with recording(records), torch.no_grad():
        if options:
            torch._dynamo.reset()
            opts = {"target": TARGET, "fallback": "error", **options}
            expected = fn(*(a.double() if a.is_floating_point() else a for a in args))
            actual = torch.compile(fn, backend="minicomp", options=opts)(*args)
            torch.testing.assert_close(actual, expected.to(actual.dtype), **tol)
        else:
            check_compiled(
                fn,
                *args,
                target=TARGET,
                reference_dtype=torch.float64,
                dynamic=dynamic,
                **tol,
            )
    return [k.attrs.template for r in records for k in r.kernels if k.attrs.template]


def uses(templates: list[str], name: str, count: int = 1) -> bool:
    return sum(t.startswith(name + "[") for t in templates) == count


def operand(shape: tuple[int, int], transposed: bool, dtype) -> torch.Tensor:
    """A matrix of `shape`, stored transposed (a column-major view) when asked."""
    if transposed:
        return torch.randn(shape[::-1], dtype=dtype).t()
    return torch.randn(shape, dtype=dtype)


# ---- plain products over types, transposes and sizes ----

SIZES = {"48x40x72": (48, 40, 72), "33x19x29": (33, 19, 29)}
DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


@pytest.mark.parametrize("size", list(SIZES))
@pytest.mark.parametrize("dt", list(DTYPES))
def test_matmul(dt, size):
    """A and B each row-major or transposed: the four products in one graph (one build)."""
    dtype = DTYPES[dt]
    m, n, k = SIZES[size]
    a, at = operand((m, k), False, dtype), operand((m, k), True, dtype)
    b, bt = operand((k, n), False, dtype), operand((k, n), True, dtype)
    used = run(lambda a, at, b, bt: (a @ b, a @ bt, at @ b, at @ bt), a, at, b, bt, dtype=dtype)
    assert uses(used, TEMPLATE_OF[dtype], 4), used


def test_f64_matmul():
    a, b = torch.randn(37, 50, dtype=torch.float64), torch.randn(50, 23, dtype=torch.float64)
    assert uses(run(torch.mm, a, b, dtype=torch.float64), SIMT)


def test_tensor_cores_off_uses_simt():
    a, b = torch.randn(48, 72).half(), torch.randn(72, 40).half()
    used = run(torch.mm, a, b, dtype=torch.float16, options={"tensor_cores": False})
    assert uses(used, SIMT), used


@pytest.mark.parametrize("dt", ["f32", "f16"])
def test_empty_sizes(dt):
    """M, K or N zero (one product each, in one graph)."""
    dtype = DTYPES[dt]
    args = []
    for m, k, n in ((0, 5, 7), (4, 0, 6), (3, 6, 0)):
        args += [torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype), torch.randn(n)]

    def addmms(*args):
        return tuple(torch.addmm(c.to(a.dtype), a, b) for a, b, c in zip(*[iter(args)] * 3))

    used = run(addmms, *args, dtype=dtype)
    assert all(t.startswith(TEMPLATE_OF[dtype]) for t in used), used


# ---- strided, offset and batched operands ----


@pytest.mark.parametrize("dt", ["f32", "f16"])
def test_strided_operands(dt):
    dtype = DTYPES[dt]
    a = torch.randn(48, 144, dtype=dtype)[:, ::2]  # stride 2 along K: computed in registers
    b = torch.randn(80, 40, dtype=dtype)[8:]  # a row offset: still aligned
    assert uses(run(torch.mm, a, b, dtype=dtype), TEMPLATE_OF[dtype])


def test_misaligned_base_takes_the_synchronous_path():
    """An f16 view starting one element into its storage: the 16-byte copies cannot be used,
    which the kernel finds out at run time."""
    a = torch.randn(48 * 72 + 1, dtype=torch.float16)[1:].view(48, 72)
    b = torch.randn(72 * 40 + 1, dtype=torch.float16)[1:].view(72, 40)
    assert uses(run(torch.mm, a, b, dtype=torch.float16), TC)


@pytest.mark.parametrize("dt", ["f32", "f16"])
def test_bmm_transposed(dt):
    dtype = DTYPES[dt]
    a, b = torch.randn(3, 24, 72, dtype=dtype), torch.randn(3, 40, 72, dtype=dtype)
    used = run(lambda a, b: torch.bmm(a, b.transpose(1, 2)), a, b, dtype=dtype)
    assert uses(used, TEMPLATE_OF[dtype])


@pytest.mark.parametrize("dt", ["f32", "bf16"])
def test_baddbmm(dt):
    dtype = DTYPES[dt]
    c = torch.randn(3, 1, 40, dtype=dtype)
    a, b = torch.randn(3, 24, 56, dtype=dtype), torch.randn(3, 56, 40, dtype=dtype)
    used = run(lambda c, a, b: torch.baddbmm(c, a, b, beta=0.5, alpha=2.0), c, a, b, dtype=dtype)
    assert uses(used, TEMPLATE_OF[dtype])


@pytest.mark.parametrize("dt", ["f32", "f16"])
def test_linear_3d(dt):
    dtype = DTYPES[dt]
    x, w, bias = (torch.randn(s, dtype=dtype) for s in ((2, 24, 72), (40, 72), (40,)))
    assert uses(run(F.linear, x, w, bias, dtype=dtype), TEMPLATE_OF[dtype])


@pytest.mark.parametrize("dt", ["f32", "f16"])
def test_symbolic_sizes(dt):
    dtype = DTYPES[dt]
    x, w, b = (torch.randn(s, dtype=dtype) for s in ((5, 48, 72), (40, 72), (40,)))
    fn = lambda x, w, b: F.relu(F.linear(x, w, b))  # noqa: E731
    used = run(fn, x, w, b, dtype=dtype, dynamic=True)
    assert uses(used, TEMPLATE_OF[dtype])
    used = run(lambda a, b: torch.bmm(a, b), x, w.t().expand(5, 72, 40), dtype=dtype, dynamic=True)
    assert uses(used, TEMPLATE_OF[dtype])


# ---- fused epilogues and prologues ----


@pytest.mark.parametrize("dt", ["f32", "f16"])
def test_bias_gelu_epilogue(dt):
    dtype = DTYPES[dt]
    x, w, b = torch.randn(48, 72, dtype=dtype), torch.randn(40, 72, dtype=dtype), torch.randn(40)
    b = b.to(dtype)
    used = run(lambda x, w, b: F.gelu(x @ w.t() + b), x, w, b, dtype=dtype)
    assert uses(used, TEMPLATE_OF[dtype]), used


@pytest.mark.parametrize("dt", ["f32", "bf16"])
def test_residual_epilogue(dt):
    dtype = DTYPES[dt]
    x, w, r = (torch.randn(s, dtype=dtype) for s in ((48, 72), (72, 40), (48, 40)))
    used = run(lambda x, w, r: x @ w + r * 0.5, x, w, r, dtype=dtype)
    assert uses(used, TEMPLATE_OF[dtype]), used


def test_cast_epilogue():
    a, b = torch.randn(48, 72), torch.randn(72, 40)
    used = run(lambda a, b: (a @ b).to(torch.float16), a, b, dtype=torch.float16)
    assert uses(used, SIMT), used


def test_two_outputs():
    a, b = torch.randn(48, 72), torch.randn(72, 40)
    used = run(lambda a, b: ((y := a @ b), torch.tanh(y)), a, b)
    assert uses(used, SIMT), used


@pytest.mark.parametrize("dt", ["f32", "f16"])
def test_relu_prologue(dt):
    dtype = DTYPES[dt]
    a, b = torch.randn(48, 72, dtype=dtype), torch.randn(40, 72, dtype=dtype)
    used = run(lambda a, b: torch.relu(a) @ (b * 2).t(), a, b, dtype=dtype)
    assert uses(used, TEMPLATE_OF[dtype]), used


def test_cast_prologue_to_tensor_cores():
    """Autocast's pattern: f32 activations cast to f16 before the product."""
    x, w = torch.randn(48, 72), torch.randn(40, 72).half()
    used = run(lambda x, w: x.to(w.dtype) @ w.t(), x, w, dtype=torch.float16)
    assert uses(used, TC), used


def test_widening_prologue_on_simt():
    x, w = torch.randn(48, 72).half(), torch.randn(72, 40)
    used = run(lambda x, w: x.to(w.dtype) @ w, x, w)
    assert uses(used, SIMT), used


# ---- every template config ----


def _config_by_n(monkeypatch, module, configs) -> list[int]:
    """Make `module`'s template pick configs[i] for the product whose N is 33 + i; those Ns."""
    by_n = {33 + i: c for i, c in enumerate(configs)}
    fixed = dataclasses.replace(module.TEMPLATE, heuristic=lambda problem: by_n[problem.n])
    monkeypatch.setattr(module, "TEMPLATE", fixed)
    return list(by_n)


def test_simt_configs(monkeypatch):
    """Every level-1 tiling computes the same fused product (partial tiles): one product per
    config, told apart by N, in one graph."""
    configs = matmul_simt._F32_LEVEL1
    ns = _config_by_n(monkeypatch, matmul_simt, configs)
    x = torch.randn(40, 72)
    wbs = [t for n in ns for t in (torch.randn(72, n), torch.randn(n))]

    def products(x, *wbs):
        return tuple(torch.tanh(x.t().t() @ w + b) for w, b in zip(wbs[::2], wbs[1::2]))

    used = run(products, x, *wbs)
    assert sorted(used) == sorted(f"{SIMT}[{c}]" for c in configs)


def test_tc_configs(monkeypatch):
    """Every level-1 tiling computes the same product (a transposed A, partial tiles, a fused
    relu): one product per config, told apart by N, in one graph."""
    configs = matmul_tc._LEVEL1
    ns = _config_by_n(monkeypatch, matmul_tc, configs)
    a = torch.randn(72, 40, dtype=torch.float16).t()
    bs = [torch.randn(72, n, dtype=torch.float16) for n in ns]
    used = run(lambda a, *bs: tuple(F.relu(a @ b) for b in bs), a, *bs, dtype=torch.float16)
    assert sorted(used) == sorted(f"{TC}[{c}]" for c in configs)


@pytest.mark.slow
@pytest.mark.parametrize("dt", ["f16", "bf16"])
def test_larger_tensor_core_product(dt):
    dtype = DTYPES[dt]
    x, w, b = (torch.randn(s, dtype=dtype) for s in ((2, 150, 264), (200, 264), (200,)))
    used = run(lambda x, w, b: F.silu(F.linear(x, w, b)), x, w, b, dtype=dtype)
    assert uses(used, TC), used


# ---- the problem description ----


def _problem(fn, *args):
    return matmul_problem_of(fn, *args, target=TARGET)


def test_problem_operands_and_signature():
    h = torch.float16
    p = _problem(lambda a, b: a.t() @ b, torch.randn(72, 48, dtype=h), torch.randn(72, 40, dtype=h))
    assert (p.batch, p.m, p.n, p.k) == (1, 48, 40, 72)
    assert p.plain_a.contiguous == "mn" and p.plain_a.ld == 48
    assert p.plain_b.contiguous == "mn" and p.plain_b.ld == 40
    assert [v.name for v in p.params] == [v.name for v in p.sig.inputs + p.sig.outputs]
    a, b = torch.randn(72, 48, dtype=h), torch.randn(72, 40, dtype=h)
    q = _problem(lambda a, b: torch.relu(a.t()) @ b, a, b)
    assert q.plain_a is None and q.a_major == "mn"
    # Same shapes, a different prologue: a different signature.
    assert p.signature() != q.signature()
    assert p.signature() == p.signature() and "bmnk=1,48,40,72" in p.signature()


# ---- shared-memory banks ----


@pytest.mark.parametrize("wn", [8, 16, 24, 32, 64])
def test_staging_rows_put_each_phase_of_pair_stores_on_every_bank(wn):
    """A lane of mma group g, quad t stores its accumulator pairs (8 bytes) at row g or
    g + 8, column 2t + 8j of its warp's staging rows: each 16-lane phase touches 32 banks."""
    row = wn + matmul_tc.staging_pad(wn)
    for first_row in (0, 4, 8, 12):
        for j in range(wn // 8):
            words = [
                ((first_row + g) * row + j * 8 + t * 2 + half) % 32
                for g in range(4)
                for t in range(4)
                for half in range(2)
            ]
            assert len(set(words)) == 32, (wn, row, first_row, j)


def test_a_product_has_no_bank_conflicts_in_its_tiles():
    """The lens on a tensor-core product with a 64x64 warp tile (a ResNet 1x1 convolution's
    shape): its cp.async stores, ldmatrix reads and epilogue staging cost the ideal
    wavefronts (the staging once cost x1.3 of the ideal)."""
    from minicomp.lens.profile import LENS_OPTIONS
    from minicomp.lens.session import recording as lens_recording

    a, b = torch.randn(256, 64, dtype=torch.float16), torch.randn(64, 256, dtype=torch.float16)
    torch._dynamo.reset()
    compiled = torch.compile(torch.mm, backend="minicomp", options={**LENS_OPTIONS})
    with lens_recording(sample_only=True) as session:
        compiled(a, b)
    (launch,) = session.launches
    assert launch.function.attrs.template.startswith(TC), launch.function.attrs.template
    c = launch.sample.counters
    assert c["shared_wavefronts"] == c["shared_ideal_wavefronts"], c


# ---- NVRTC ----


def _nvrtc():
    from minicomp.backends.cuda import nvrtc

    try:
        nvrtc.nvrtc_version()
    except nvrtc.NvrtcUnavailableError as err:  # pragma: no cover - depends on the machine
        pytest.skip(f"NVRTC unavailable: {err}")
    return nvrtc


def _nvrtc_problems():
    h = torch.float16
    return {
        "simt_linear_gelu": (
            lambda x, w, b: F.gelu(x @ w.t() + b),
            (torch.randn(512, 256), torch.randn(384, 256), torch.randn(384)),
        ),
        "tc_linear_gelu": (
            lambda x, w, b: F.gelu(x @ w.t() + b),
            tuple(torch.randn(s, dtype=h) for s in ((512, 256), (384, 256), (384,))),
        ),
        "tc_prologue": (
            lambda a, b: torch.relu(a) @ (b * 2),
            (torch.randn(512, 256, dtype=h), torch.randn(256, 384, dtype=h)),
        ),
        "tc_transposed_prologue": (
            lambda a, b: torch.relu(a).t() @ (b.t() * 2),
            (torch.randn(256, 512, dtype=h), torch.randn(384, 256, dtype=h)),
        ),
        "tc_transposed": (
            lambda a, b: a.t() @ b,
            (torch.randn(256, 512, dtype=h), torch.randn(256, 384, dtype=h)),
        ),
        # Convolutions load through guarded windows, which cost registers at every load.
        "simt_grouped_conv": (
            lambda x, w: F.conv2d(x, w, padding=1, groups=4),
            (torch.randn(8, 64, 28, 28), torch.randn(64, 16, 3, 3)),
        ),
        "simt_conv1d_strided": (
            lambda x, w: F.conv1d(x, w, padding=2, stride=2),
            (torch.randn(8, 32, 100), torch.randn(48, 32, 5)),
        ),
    }


NVRTC_PROBLEMS = ["simt_linear_gelu", "tc_linear_gelu", "tc_prologue", "simt_grouped_conv"]
NVRTC_SLOW = ["tc_transposed_prologue", "tc_transposed", "simt_conv1d_strided"]


def _check_level1_space(case: str, tmp_path) -> None:
    from minicomp.backends.cuda.codegen import render_module

    nvrtc = _nvrtc()
    fn, args = _nvrtc_problems()[case]
    problem = _problem(fn, *args)
    template = TEMPLATES[TC if case.startswith("tc") else SIMT]
    configs = template.candidates(problem, 1)
    assert len(configs) >= 4
    for config in configs:
        kernel = template.instantiate(problem, config)
        source = render_module(Module(kernel.name, (kernel,)))
        if "conv" in case:  # one block per SM is enough: ptxas must not spill for a second
            assert f"__launch_bounds__({config.threads}, 1)" in source
        for arch in ("sm_80", "sm_90"):
            binary = nvrtc.compile_cuda(source, arch=arch, name=case, cache_dir=str(tmp_path))
            usage = binary.resources[kernel.name]
            what = (case, str(config), arch, usage)
            assert usage.registers > 0, binary.log
            assert usage.spill_stores == 0 and usage.spill_loads == 0, what
            assert usage.stack_bytes == 0, what


@pytest.mark.parametrize("case", NVRTC_PROBLEMS)
def test_level1_spaces_compile_with_nvrtc(case, tmp_path):
    _check_level1_space(case, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("case", NVRTC_SLOW)
def test_more_level1_spaces_compile_with_nvrtc(case, tmp_path):
    _check_level1_space(case, tmp_path)


@functools.cache
def _square_problem(dtype: torch.dtype):
    """The problem of a 64 x 64 x 64 product (built once; tests copy it before changing it)."""
    return _problem(torch.mm, torch.randn(64, 64, dtype=dtype), torch.randn(64, 64, dtype=dtype))


def test_level2_spaces_are_larger():
    """Level 2 adds valid tilings, each within the shared memory every GPU of the limits table
    lets a block have: 99 KiB (sm_86, sm_89), so a 106 KiB tiling is out."""
    p = _square_problem(torch.float16)
    tc1, tc2 = matmul_tc.space(p, 1), matmul_tc.space(p, 2)
    assert len(tc2) > len(tc1) and all(matmul_tc.valid(p, c) for c in tc2)
    limit = PORTABLE.shared_per_block_optin
    assert limit == 99 * 1024 and all(matmul_tc.shared_bytes(p, c) <= limit for c in tc2)
    at_106k = matmul_tc.TcConfig(256, 128, 64, 64, 64, 2)
    assert matmul_tc.shared_bytes(p, at_106k) == 106 * 1024 and not matmul_tc.valid(p, at_106k)
    q = _square_problem(torch.float32)
    s1, s2 = matmul_simt.space(q, 1), matmul_simt.space(q, 2)
    assert len(s2) > len(s1) and all(matmul_simt.valid(q, c) for c in s2)


def test_heuristic_rules():
    """Large problems get the large tiles; a small M or N gets tiles no larger than needed."""
    p, q = copy.copy(_square_problem(torch.float16)), copy.copy(_square_problem(torch.float32))
    for problem in (p, q):
        problem.m, problem.n = 4096, 4096
    assert str(matmul_simt.heuristic(q)) == "128x128x8_t8x8"
    big = matmul_tc.heuristic(p)
    assert (big.bm * big.bn, big.wm, big.wn) == (256 * 128, 64, 64)
    for problem in (p, q):
        problem.m = 20
    assert matmul_simt.heuristic(q).bm == 32 and matmul_tc.heuristic(p).bm == 32


def test_tile_work_is_the_heuristics_busiest_sm():
    """The work split-K weighs is the busiest SM's at the heuristic's tile, in multiply-adds
    per element of K: ceil(blocks / SMs) * bm * bn * step_cost."""
    p = copy.copy(_square_problem(torch.float16))
    p.m, p.n = 1568, 512
    # 104 half tiles (128 x 64, warps 64 x 32, step cost 1.40625) on 132 SMs.
    assert str(matmul_tc.heuristic(p)) == "128x64x32_w64x32_s3"
    assert matmul_tc.tile_work(1, 1568, 512, 132) == 128 * 64 * 1.40625
    # Two such products (a split in 2) take 104 full tiles: step cost 1.
    assert matmul_tc.level0_tile(matmul_tc.space(p, 1), 2, 1568, 512, 132)[0].bn == 128
    assert matmul_tc.tile_work(2, 1568, 512, 132) == 128 * 128
    # On 16 SMs every tiling runs in rounds: 26 blocks of 128 x 256 in 2.
    cfg, work = matmul_tc.level0_tile(matmul_tc.space(p, 1), 1, 1568, 512, 16)
    assert (cfg.bm, cfg.bn, work) == (128, 256, 2 * 128 * 256)
