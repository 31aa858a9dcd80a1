"""Warpgroup MMA (minicomp.script.wgmma): a one-warpgroup 64xN tile of A @ B.T in cuda-emu
against float64 on fresh inputs (f16 and bf16, every swizzle span, several groups in flight),
the bugs the emulator must catch (a missing wait, an operand overwritten before the wait, a
missing fence, a misaligned swizzled buffer, a descriptor stride off by a row, an incomplete
warpgroup), compile errors, the printed form, and NVRTC for sm_90a (HGMMA, no spills) with
the architecture error elsewhere."""

import math

import pytest
import torch

import minicomp
from minicomp.backends.cuda import nvrtc
from minicomp.backends.cuda.emu import EmulatorError
from minicomp.backends.errors import CompileError
from minicomp.ir.printer import function_str
from minicomp.script import (
    ScriptError,
    attrs,
    bf16,
    dynamic_shared_tensor,
    f8e4m3fn,
    f8e5m2,
    f16,
    f32,
    fence_proxy_async,
    register_tensor,
    shared_tensor,
    syncthreads,
    threadIdx,
    unroll,
    wgmma_commit_group,
    wgmma_fence,
    wgmma_mma_async,
    wgmma_wait_group,
)
from minicomp.script.text import parse_function

TORCH = {
    f16: torch.float16,
    bf16: torch.bfloat16,
    f8e4m3fn: torch.float8_e4m3fn,
    f8e5m2: torch.float8_e5m2,
}


def tile_matmul(n: int, kt: int, swizzle: int, dt=f16, bug: str = "", bdt=None):
    """out (64 x n) = a (64 x kt) @ b (n x kt).T by one warpgroup: the tiles are staged in
    shared memory in the layout of `swizzle` (core matrices for 0, else rows of one swizzle
    span, written swizzled), then one mma_async a K step (32 bytes: 16 16-bit or 32 float8
    elements), each its own group, with at most two groups in flight.

    `bug` plants one: "no_wait" (no final wgmma_wait_group), "early_read" (the accumulators
    are stored before the final wait), "overwrite" (a is zeroed before the final wait),
    "no_fence" (no wgmma_fence), "unswizzled" (the tiles are written row-major while the
    descriptors say swizzled), "stride" (the explicit form with a's stride byte offset one
    row short), "misaligned" (a starts one row into its swizzle pattern), "unaligned" (a
    starts 8 bytes into a 16-byte chunk), "three_warps" (only warps 0-2 issue). `bdt` is b's
    type when it differs from a's (float8 pairs)."""
    bdt = bdt or dt
    size = 1 if dt in (f8e4m3fn, f8e5m2) else 2
    core = 16 // size  # elements a row of a core matrix, or a 16-byte chunk
    span = max(swizzle // size, core)  # elements a row of the swizzle span
    step = 32 // size  # K elements a mma_async
    steps = kt // step
    final_wait = 1 if bug in ("no_wait", "early_read") else 0
    row0 = 1 if bug == "misaligned" else 0
    k_shift = 4 if bug == "unaligned" else 0  # elements: a's start 8 bytes off
    # Rows a swizzle pattern has (1: none, for the "unswizzled" bug).
    pattern = swizzle // 16 if swizzle and bug != "unswizzled" else 1
    issuers = 96 if bug == "three_warps" else 128

    @minicomp.script
    def wgmma_tile(a: dt[64, kt], b: bdt[n, kt], out: f32[64, n]):
        attrs.grid_dim = 1
        attrs.block_dim = 128
        t = threadIdx.x
        if swizzle == 0:
            a_s = shared_tensor(dt, (8, kt // core, 8, core))
            b_s = shared_tensor(bdt, (n // 8, kt // core, 8, core))
            for i in range(t, 64 * kt, 128):
                a_s[i // kt // 8, i % kt // core, i // kt % 8, i % core] = a[i // kt, i % kt]
            for i in range(t, n * kt, 128):
                b_s[i // kt // 8, i % kt // core, i // kt % 8, i % core] = b[i // kt, i % kt]
        else:
            a_s = dynamic_shared_tensor(dt, (kt // span, 64 + 8 * row0, span), at=0)
            b_at = (64 + 8 * row0) * kt * size
            b_s = dynamic_shared_tensor(bdt, (kt // span, n, span), at=b_at)
            # Chunk c of row r at chunk c ^ (the row of 128 bytes) % (swizzle / 16): swizzle.h.
            for i in range(t, 64 * kt, 128):
                r = i // kt
                k = i % kt
                c = k % span // core ^ r * swizzle // 128 % pattern
                a_s[k // span, r + row0, c * core + k % core] = a[r, k]
            for i in range(t, n * kt, 128):
                r = i // kt
                k = i % kt
                c = k % span // core ^ r * swizzle // 128 % pattern
                b_s[k // span, r, c * core + k % core] = b[r, k]
        fence_proxy_async()  # the generic-proxy stores, before the async proxy reads them
        syncthreads()
        acc = register_tensor(f32, (n // 2,))
        for i in unroll(range(n // 2)):
            acc[i] = 0.0
        if bug != "no_fence":
            wgmma_fence()
        if issuers == 128 or t < issuers:
            for s in range(steps):
                if swizzle == 0:
                    wgmma_mma_async(acc, a_s[0, 2 * s], b_s[0, 2 * s])
                elif bug == "stride":
                    # The explicit form, as the printer writes it: a's stride 7 rows, not 8.
                    k0 = s * step
                    wgmma_mma_async(
                        acc,
                        a_s[k0 // span, 0, k0 % span],
                        b_s[k0 // span, 0, k0 % span],
                        n,
                        swizzle,
                        16,
                        7 * swizzle,
                        16,
                        8 * swizzle,
                        1,
                    )
                else:
                    k0 = s * step
                    r0 = (t // 1024 + 1) * row0  # a runtime 1 for the "misaligned" bug
                    kx = (t // 1024 + 1) * k_shift  # and 4 for "unaligned"
                    wgmma_mma_async(
                        acc,
                        a_s[k0 // span, r0, k0 % span + kx],
                        b_s[k0 // span, 0, k0 % span],
                        swizzle=swizzle,
                    )
                wgmma_commit_group()
                wgmma_wait_group(2)
        if bug == "overwrite":
            for i in range(t, 64 * kt, 128):
                a_s[i % kt // span, i // kt, i % span] = 0.0
            syncthreads()
        if bug == "early_read":
            wgmma_wait_group(1)
        else:
            wgmma_wait_group(final_wait, acc)
        w = t // 32
        lane = t % 32
        for i in unroll(range(n // 2)):
            out[16 * w + lane // 4 + 8 * (i // 2 % 2), 8 * (i // 4) + 2 * (lane % 4) + i % 2] = acc[
                i
            ]
        if bug == "early_read":
            wgmma_wait_group(0)

    return wgmma_tile


def run(kernel, n: int, kt: int, dt=f16, bdt=None):
    a = torch.randn(64, kt).to(TORCH[dt])
    b = torch.randn(n, kt).to(TORCH[bdt or dt])
    out = torch.full((64, n), math.nan)
    kernel.with_target("cuda-emu")(a, b, out)
    return out, a.double() @ b.double().T


# (n, kt, swizzle, dtype): every swizzle span, both types, N from 8 to 256.
CASES = [(64, 64, 0, f16), (256, 128, 128, bf16), (32, 64, 64, f16), (8, 32, 32, bf16)]


@pytest.mark.parametrize(("n", "kt", "swizzle", "dt"), CASES, ids=lambda v: str(v))
def test_a_tile_matches_float64(n, kt, swizzle, dt):
    out, want = run(tile_matmul(n, kt, swizzle, dt), n, kt, dt)
    # f32 sums of exact products: within a few ulps of the sum of |terms|.
    torch.testing.assert_close(out.double(), want, rtol=0, atol=1e-5 * kt)


@pytest.mark.parametrize(("swizzle", "dt", "bdt"), [(0, f8e4m3fn, f8e5m2), (64, f8e5m2, f8e4m3fn)])
def test_a_float8_tile_matches_float64(swizzle, dt, bdt):
    out, want = run(tile_matmul(32, 128, swizzle, dt, bdt=bdt), 32, 128, dt, bdt)
    torch.testing.assert_close(out.double(), want, rtol=0, atol=1e-5 * 128)


GEMM_128B = tile_matmul(64, 128, 128)


@minicomp.script
def two_warpgroups(a: bf16[128, 32], b: bf16[16, 32], out: f32[128, 16]):
    """out = a @ b.T with 256 threads: warpgroup g multiplies rows 64g to 64g + 63 of a."""
    attrs.grid_dim = 1
    attrs.block_dim = 256
    t = threadIdx.x
    a_s = shared_tensor(bf16, (16, 4, 8, 8))
    b_s = shared_tensor(bf16, (2, 4, 8, 8))
    for i in range(t, 128 * 32, 256):
        a_s[i // 32 // 8, i % 32 // 8, i // 32 % 8, i % 8] = a[i // 32, i % 32]
    for i in range(t, 16 * 32, 256):
        b_s[i // 32 // 8, i % 32 // 8, i // 32 % 8, i % 8] = b[i // 32, i % 32]
    fence_proxy_async()
    syncthreads()
    g = t // 128
    acc = register_tensor(f32, (8,))
    wgmma_fence()
    for s in range(2):
        wgmma_mma_async(acc, a_s[8 * g, 2 * s], b_s[0, 2 * s], scale_d=s)
    wgmma_commit_group()
    wgmma_wait_group(0, acc)
    w = t % 128 // 32
    lane = t % 32
    for i in unroll(range(8)):
        row = 64 * g + 16 * w + lane // 4 + 8 * (i // 2 % 2)
        out[row, 8 * (i // 4) + 2 * (lane % 4) + i % 2] = acc[i]


def test_each_warpgroup_multiplies_its_own_rows():
    a, b = torch.randn(128, 32).bfloat16(), torch.randn(16, 32).bfloat16()
    out = torch.full((128, 16), math.nan)
    two_warpgroups.with_target("cuda-emu")(a, b, out)
    torch.testing.assert_close(out.double(), a.double() @ b.double().T, rtol=0, atol=1e-4)


def test_an_accumulator_read_before_its_wait_is_nan():
    out, _ = run(tile_matmul(16, 64, 0, bug="early_read"), 16, 64)
    assert out.isnan().all(), "the accumulators of a pending mma_async must read as NaN"


def test_a_missing_wait_is_an_error_at_exit():
    with pytest.raises(EmulatorError, match=r"wgmma_tile.*exits with 1 wgmma_mma_async pending"):
        run(tile_matmul(16, 64, 0, bug="no_wait"), 16, 64)


def test_an_operand_overwritten_before_the_wait_gives_a_wrong_result():
    out, want = run(tile_matmul(64, 128, 128, bug="overwrite"), 64, 128)
    # The last two K steps read the zeroed a at the final wait.
    assert not torch.allclose(out.double(), want, atol=1e-2), "the wait must read shared memory"
    assert not out.isnan().any()


def test_a_missing_fence_is_an_error_naming_the_line():
    with pytest.raises(EmulatorError, match=r"wgmma_mma_async \(line \d+\) without a wgmma_fence"):
        run(tile_matmul(16, 32, 0, bug="no_fence"), 16, 32)


def test_data_written_unswizzled_gives_a_wrong_result():
    out, want = run(tile_matmul(16, 64, 128, bug="unswizzled"), 16, 64)
    assert not torch.allclose(out.double(), want, atol=1e-2), "the descriptor's swizzle is read"


def test_a_stride_off_by_one_row_gives_a_wrong_result():
    out, want = run(tile_matmul(16, 64, 128, bug="stride"), 16, 64)
    assert not torch.allclose(out.double(), want, atol=1e-2)


def test_a_swizzled_operand_off_its_pattern_is_an_error():
    with pytest.raises(EmulatorError, match=r"128-byte swizzle but starts at byte 128"):
        run(tile_matmul(16, 64, 128, bug="misaligned"), 16, 64)


def test_an_operand_off_16_bytes_is_an_error():
    with pytest.raises(EmulatorError, match=r"operand a_s starts at byte 8 .*not a multiple of 16"):
        run(tile_matmul(16, 32, 64, bug="unaligned"), 16, 32)


def test_every_thread_of_the_warpgroup_takes_part():
    with pytest.raises(EmulatorError, match=r"thread 0 issued 2 wgmma_mma_async but thread 96"):
        run(tile_matmul(16, 32, 0, bug="three_warps"), 16, 32)


def test_the_lens_counts_a_64xnx16_step_as_n_over_2_mma_at_the_wgmma_rate(tmp_path):
    from minicomp.backends.cuda.emu import build_emulated
    from minicomp.lens.counts import KernelCounts
    from minicomp.lens.devices import H100
    from minicomp.lens.estimate import estimate

    kernel = tile_matmul(16, 32, 0)
    emu = build_emulated(kernel.source, [kernel.ir], lens=True, cache_dir=str(tmp_path))
    a, b, out = torch.randn(64, 32).half(), torch.randn(16, 32).half(), torch.zeros(64, 16)
    sample = emu.launch_counted(kernel.ir.name, 1, 128, [a, b, out])
    # Two K steps of m64n16k16 (2 * 64 * 16 * 16 operations: 8 m16n8k16 each), counted per
    # thread as warp instructions are: 2 each for 4 warps of 32 threads; apart from mma.sync's.
    assert sample.counters["wgmma"] == 2 * 2 * 128, sample.counters
    assert sample.counters["wgmma_instructions"] == 2 * 128 and sample.counters["mma"] == 0
    counts = KernelCounts.from_sample(sample)
    tensor = estimate(counts, H100).times["tensor"]
    assert tensor == pytest.approx(2 * (2 * 64 * 16 * 16) / (H100.wgmma_tflops_f16 * 1e12))
    torch.testing.assert_close(out.double(), a.double() @ b.double().T, rtol=0, atol=1e-4)


def test_an_sm_90_device_builds_wgmma_kernels_for_sm_90a():
    from minicomp.backends.cuda.intrinsics_wgmma import feature_arch
    from minicomp.ir.func import Module

    assert feature_arch("sm_90", Module("m", (GEMM_128B.ir,))) == "sm_90a"
    assert feature_arch("sm_80", Module("m", (GEMM_128B.ir,))) == "sm_80"

    @minicomp.script
    def plain(x: f32[32]):
        attrs.grid_dim = 1
        attrs.block_dim = 32
        x[threadIdx.x] = 0.0

    assert feature_arch("sm_90", Module("m", (plain.ir,))) == "sm_90"


def test_the_tile_prints_and_parses_back():
    text = function_str(GEMM_128B.ir)
    assert "wgmma_mma_async(" in text and "wgmma_wait_group(0, " in text
    assert parse_function(text) == GEMM_128B.ir


# ---- compile errors


def _compile_error(body) -> str:
    with pytest.raises(ScriptError) as err:
        minicomp.script(body).ir  # noqa: B018
    return str(err.value)


def test_operands_are_shared_16_bit_or_float8_tensors_of_one_family():
    def f32_operand(x: f32[16]):
        attrs.block_dim = 128
        a_s = shared_tensor(f32, (8, 2, 8, 8))
        acc = register_tensor(f32, (8,))
        wgmma_mma_async(acc, a_s, a_s)

    assert "a operand of wgmma_mma_async() must hold f16 or bf16" in _compile_error(f32_operand)

    def mixed(x: f32[16]):
        attrs.block_dim = 128
        a_s = shared_tensor(f16, (8, 2, 8, 8))
        b_s = shared_tensor(f8e4m3fn, (8, 2, 8, 16))
        acc = register_tensor(f32, (32,))
        wgmma_mma_async(acc, a_s, b_s)

    assert "b operand of wgmma_mma_async() must hold f16 elements like a" in _compile_error(mixed)

    def register_operand(x: f32[16]):
        attrs.block_dim = 128
        a_r = register_tensor(f16, (8, 2, 8, 8))
        acc = register_tensor(f32, (8,))
        wgmma_mma_async(acc, a_r, a_r)

    assert "must be a shared tensor; a_r is a register tensor" in _compile_error(register_operand)


def test_the_accumulator_is_n_over_2_f32():
    def odd(x: f32[16]):
        attrs.block_dim = 128
        a_s = shared_tensor(f16, (8, 2, 8, 8))
        acc = register_tensor(f32, (12,))
        wgmma_mma_async(acc, a_s, a_s)

    assert "whole register tensor of N/2 f32" in _compile_error(odd)


def test_a_swizzled_operand_is_an_aligned_dynamic_tensor():
    def static(x: f32[16]):
        attrs.block_dim = 128
        a_s = shared_tensor(f16, (64, 64))
        acc = register_tensor(f32, (4,))
        wgmma_mma_async(acc, a_s, a_s, swizzle=128)

    assert "must be a dynamic_shared_tensor placed at a multiple of 1024" in _compile_error(static)

    def misplaced(x: f32[16]):
        attrs.block_dim = 128
        a_s = dynamic_shared_tensor(f16, (64, 64), at=512)
        acc = register_tensor(f32, (4,))
        wgmma_mma_async(acc, a_s, a_s, swizzle=128)

    assert "starts at dynamic shared byte 512" in _compile_error(misplaced)

    def wide(x: f32[16]):
        attrs.block_dim = 128
        a_s = dynamic_shared_tensor(f16, (64, 128), at=0)
        acc = register_tensor(f32, (4,))
        wgmma_mma_async(acc, a_s, a_s, swizzle=128)

    assert "rows of one swizzle span, shape (..., rows, 64)" in _compile_error(wide)


def test_a_core_matrix_tile_needs_its_rows_and_k():
    def short(x: f32[16]):
        attrs.block_dim = 128
        a_s = shared_tensor(f16, (8, 2, 8, 8))
        acc = register_tensor(f32, (32,))
        wgmma_mma_async(acc, a_s[0, 0], a_s[0, 1])

    assert "needs 16 K elements (2 core matrices)" in _compile_error(short)


# ---- NVRTC (sm_90a)


def _nvrtc():
    try:
        nvrtc.nvrtc_version()
    except nvrtc.NvrtcUnavailableError as err:  # pragma: no cover - depends on the machine
        pytest.skip(f"NVRTC unavailable: {err}")


@pytest.mark.parametrize(
    ("n", "dt", "bdt"), [(256, bf16, None), (64, f8e4m3fn, f8e5m2)], ids=["bf16", "float8"]
)
def test_a_tile_compiles_for_sm_90a_to_hgmma(n, dt, bdt, tmp_path):
    _nvrtc()
    from minicomp.backends.cuda import sass

    kernel = tile_matmul(n, 128, 128, dt, bdt=bdt)
    name = kernel.ir.name
    binary = nvrtc.compile_cuda(kernel.source, arch="sm_90a", name=name, cache_dir=str(tmp_path))
    usage = binary.resources[name]
    assert usage.spill_stores == 0 and usage.spill_loads == 0, usage
    # ptxas would say so (C7519) where a branch around the mma_asyncs made it serialize them.
    assert "serialized" not in binary.log, binary.log
    try:
        text = sass.disassemble(binary.cubin)[name]
    except sass.SassUnavailableError as err:  # pragma: no cover - depends on the machine
        pytest.skip(str(err))
    # What ptxas made of them (CUDA 13): HGMMA.64x256x16.F32.BF16 (float8: QGMMA.64x64x32),
    # WARPGROUP.ARRIVE (the fence) and WARPGROUP.DEPBAR.LE (the wait).
    ops = sass.full_opcode_counts(text)
    mma = "QGMMA" if bdt else "HGMMA"
    assert any(op.startswith(mma) for op in ops), sorted(ops)
    assert "WARPGROUP.ARRIVE" in ops and "WARPGROUP.DEPBAR.LE" in ops, sorted(ops)
    (report,) = sass.check_kernels(kernel.source, binary.cubin)
    assert report.ok, report


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_outside_sm_90a_the_error_names_the_primitive(arch, tmp_path):
    _nvrtc()
    with pytest.raises(CompileError, match=r"wgmma_\w+\(\) needs sm_90a"):
        nvrtc.compile_cuda(
            GEMM_128B.source, arch=arch, name=GEMM_128B.ir.name, cache_dir=str(tmp_path)
        )
