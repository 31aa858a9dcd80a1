"""The wgmma operand forms beyond K-major shared tiles: MN-major ("transposed") shared operands
(trans_a / trans_b, f16 and bf16) and A from registers, in cuda-emu against float64 on fresh
inputs; the planted bugs they must catch (a missing transpose flag, A's registers in the wrong
order); compile errors; the printed form; NVRTC for sm_90a (HGMMA, no spills).

The chained kernel is attention's inner step: S = Q K^T (K-major), S converted to f16 pairs
in registers as the A of O = S V, V [keys, d] read MN-major as it lies in memory."""

import math
import re

import pytest
import torch

import minicomp
from minicomp.backends.cuda import nvrtc
from minicomp.backends.cuda.emu import EmulatorError
from minicomp.ir.printer import function_str
from minicomp.script import (
    ScriptError,
    attrs,
    bf16,
    dynamic_shared_tensor,
    f8e4m3fn,
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

TORCH = {f16: torch.float16, bf16: torch.bfloat16}


def transposed_tile(
    n: int, kt: int, swizzle: int, trans_a: bool, trans_b: bool, dt=f16, bug: str = ""
):
    """out (64 x n) = A (64 x kt) @ B (n x kt).T with A given as `a` [64, kt], or as `a`
    [kt, 64] (A's transpose, rows contiguous) when trans_a; B as `b` [n, kt], or [kt, n] when
    trans_b. A K-major tile is staged as tile_matmul in test_script_wgmma.py stages it; an
    MN-major one as core matrices of 8 K of 8 rows (no swizzle) or as K rows of one swizzle
    span of rows, one block per span of rows, written swizzled."""
    size = 2
    span = max(swizzle // size, 8)  # elements a row of the swizzle span (or a core matrix)
    pattern = max(swizzle // 16, 1)
    a0, a1 = (kt, 64) if trans_a else (64, kt)
    b0, b1 = (kt, n) if trans_b else (n, kt)

    @minicomp.script
    def transposed(a: dt[a0, a1], b: dt[b0, b1], out: f32[64, n]):
        attrs.grid_dim = 1
        attrs.block_dim = 128
        t = threadIdx.x
        if swizzle == 0:
            # [rows / 8, K / 8, 8, 8]: K-major core matrices are 8 rows of 8 K, MN-major 8 K
            # of 8 rows.
            a_s = shared_tensor(dt, (8, kt // 8, 8, 8))
            b_s = shared_tensor(dt, (n // 8, kt // 8, 8, 8))
            for i in range(t, 64 * kt, 128):
                r = i // kt
                k = i % kt
                if trans_a:
                    a_s[r // 8, k // 8, k % 8, r % 8] = a[k, r]
                else:
                    a_s[r // 8, k // 8, r % 8, k % 8] = a[r, k]
            for i in range(t, n * kt, 128):
                r = i // kt
                k = i % kt
                if trans_b:
                    b_s[r // 8, k // 8, k % 8, r % 8] = b[k, r]
                else:
                    b_s[r // 8, k // 8, r % 8, k % 8] = b[r, k]
        else:
            # MN-major: [rows / span, K, span]; K-major: [K / span, rows, span]. Row x of the
            # tensor (all dimensions but the last flattened) holds its chunk c at chunk
            # c ^ (x * swizzle // 128) % pattern (swizzle.h).
            a_at, b_at = 0, 64 * kt * size
            if trans_a:
                a_s = dynamic_shared_tensor(dt, (64 // span, kt, span), at=a_at)
            else:
                a_s = dynamic_shared_tensor(dt, (kt // span, 64, span), at=a_at)
            if trans_b:
                b_s = dynamic_shared_tensor(dt, (n // span, kt, span), at=b_at)
            else:
                b_s = dynamic_shared_tensor(dt, (kt // span, n, span), at=b_at)
            for i in range(t, 64 * kt, 128):
                r = i // kt
                k = i % kt
                if trans_a:
                    c = r % span // 8 ^ (r // span * kt + k) * swizzle // 128 % pattern
                    a_s[r // span, k, c * 8 + r % 8] = a[k, r]
                else:
                    c = k % span // 8 ^ (k // span * 64 + r) * swizzle // 128 % pattern
                    a_s[k // span, r, c * 8 + k % 8] = a[r, k]
            for i in range(t, n * kt, 128):
                r = i // kt
                k = i % kt
                if trans_b:
                    c = r % span // 8 ^ (r // span * kt + k) * swizzle // 128 % pattern
                    b_s[r // span, k, c * 8 + r % 8] = b[k, r]
                else:
                    c = k % span // 8 ^ (k // span * n + r) * swizzle // 128 % pattern
                    b_s[k // span, r, c * 8 + k % 8] = b[r, k]
        fence_proxy_async()
        syncthreads()
        acc = register_tensor(f32, (n // 2,))
        wgmma_fence()
        for s in range(kt // 16):
            if swizzle == 0:
                flags = (False, False) if bug == "no_trans" else (trans_a, trans_b)
                wgmma_mma_async(
                    acc, a_s[0, 2 * s], b_s[0, 2 * s], scale_d=s, trans_a=flags[0], trans_b=flags[1]
                )
            elif trans_a and trans_b:
                wgmma_mma_async(
                    acc,
                    a_s[0, 16 * s, 0],
                    b_s[0, 16 * s, 0],
                    swizzle=swizzle,
                    scale_d=s,
                    trans_a=True,
                    trans_b=True,
                )
            elif trans_b:
                k0 = 16 * s
                wgmma_mma_async(
                    acc,
                    a_s[k0 // span, 0, k0 % span],
                    b_s[0, k0, 0],
                    swizzle=swizzle,
                    scale_d=s,
                    trans_b=True,
                )
            else:
                k0 = 16 * s
                wgmma_mma_async(
                    acc,
                    a_s[0, k0, 0],
                    b_s[k0 // span, 0, k0 % span],
                    swizzle=swizzle,
                    scale_d=s,
                    trans_a=trans_a,
                )
        wgmma_commit_group()
        wgmma_wait_group(0, acc)
        w = t // 32
        lane = t % 32
        for i in unroll(range(n // 2)):
            out[16 * w + lane // 4 + 8 * (i // 2 % 2), 8 * (i // 4) + 2 * (lane % 4) + i % 2] = acc[
                i
            ]

    return transposed


def run(kernel, n, kt, trans_a, trans_b, dt=f16):
    a = torch.randn(64, kt).to(TORCH[dt])
    b = torch.randn(n, kt).to(TORCH[dt])
    out = torch.full((64, n), math.nan)
    kernel.with_target("cuda-emu")(
        a.T.contiguous() if trans_a else a, b.T.contiguous() if trans_b else b, out
    )
    return out, a.double() @ b.double().T


# (n, kt, swizzle, trans_a, trans_b, dtype): both operands MN-major without swizzle, B
# MN-major in two 128-byte spans of rows (attention's V at d = 128), A MN-major under 32 bytes.
CASES = [
    (32, 32, 0, True, True, f16),
    (128, 64, 128, False, True, bf16),
    (16, 32, 32, True, False, f16),
]


@pytest.mark.parametrize(("n", "kt", "swizzle", "trans_a", "trans_b", "dt"), CASES, ids=str)
def test_an_mn_major_tile_matches_float64(n, kt, swizzle, trans_a, trans_b, dt):
    kernel = transposed_tile(n, kt, swizzle, trans_a, trans_b, dt)
    out, want = run(kernel, n, kt, trans_a, trans_b, dt)
    torch.testing.assert_close(out.double(), want, rtol=0, atol=1e-5 * kt)


def test_a_tile_flagged_k_major_reads_the_wrong_elements():
    kernel = transposed_tile(32, 32, 0, True, True, bug="no_trans")
    out, want = run(kernel, 32, 32, True, True)
    assert not torch.allclose(out.double(), want, atol=1e-1), "trans_b must be read"


def chained(d: int, bug: str = ""):
    """out (64 x d) = f16(q @ k.T) @ v for q [64, 64], k and v [64 keys, 64] and [64, d]: one
    warpgroup, S's accumulator converted to f16 in registers as the A of the second product,
    v staged as it lies (d contiguous, one 128-byte span of d a block) and read MN-major.
    `bug`: "order" (S's elements handed over in the wrong register order), "no_trans" (the
    explicit form with trans_b 0)."""

    @minicomp.script
    def chained_products(q: f16[64, 64], k: f16[64, 64], v: f16[64, d], out: f32[64, d]):
        attrs.grid_dim = 1
        attrs.block_dim = 128
        t = threadIdx.x
        q_s = dynamic_shared_tensor(f16, (64, 64), at=0)
        k_s = dynamic_shared_tensor(f16, (64, 64), at=8192)
        v_s = dynamic_shared_tensor(f16, (d // 64, 64, 64), at=16384)
        for i in range(t, 64 * 64, 128):
            r = i // 64
            c = i % 64
            q_s[r, (c // 8 ^ r % 8) * 8 + c % 8] = q[r, c]
            k_s[r, (c // 8 ^ r % 8) * 8 + c % 8] = k[r, c]
        for i in range(t, 64 * d, 128):
            key = i // d
            dd = i % d
            v_s[dd // 64, key, (dd % 64 // 8 ^ key % 8) * 8 + dd % 8] = v[key, dd]
        fence_proxy_async()
        syncthreads()
        s_acc = register_tensor(f32, (32,))
        wgmma_fence()
        for kk in range(4):
            wgmma_mma_async(s_acc, q_s[0, 16 * kk], k_s[0, 16 * kk], swizzle=128, scale_d=kk)
        wgmma_commit_group()
        wgmma_wait_group(0, s_acc)
        p = register_tensor(f16, (32,))
        for i in unroll(range(32)):
            if bug == "order":
                p[i] = f16(s_acc[i ^ 2])
            else:
                p[i] = f16(s_acc[i])
        o = register_tensor(f32, (d // 2,))
        wgmma_fence()
        for kk in range(4):
            if bug == "no_trans":
                wgmma_mma_async(
                    o, p[8 * kk], v_s[0, 16 * kk, 0], d, 128, 0, 0, 8192, 1024, kk, 0, 0
                )
            else:
                wgmma_mma_async(
                    o, p[8 * kk], v_s[0, 16 * kk, 0], swizzle=128, scale_d=kk, trans_b=True
                )
        wgmma_commit_group()
        wgmma_wait_group(0, o)
        w = t // 32
        lane = t % 32
        for i in unroll(range(d // 2)):
            out[16 * w + lane // 4 + 8 * (i // 2 % 2), 8 * (i // 4) + 2 * (lane % 4) + i % 2] = o[i]

    return chained_products


CHAINED = chained(64)


def run_chained(kernel, d):
    q, k, v = (torch.randn(64, n).half() for n in (64, 64, d))
    out = torch.full((64, d), math.nan)
    kernel.with_target("cuda-emu")(q, k, v, out)
    s = (q.double() @ k.double().T).half().double()
    return out.double(), s @ v.double()


def test_s_through_registers_then_v_mn_major_matches_float64():
    out, want = run_chained(CHAINED, 64)
    # S rounded to f16 may round the other way than float64's: a half-ulp of |S| < 32.
    torch.testing.assert_close(out, want, rtol=0, atol=0.2)
    assert (out - want).abs().mean() < 1e-3


def test_s_handed_over_in_the_wrong_register_order_gives_a_wrong_result():
    out, want = run_chained(chained(64, "order"), 64)
    assert not out.isnan().any()
    assert (out - want).abs().mean() > 0.5, "the register order of A must be read"


def test_v_read_k_major_is_refused_where_it_leaves_the_tensor():
    with pytest.raises(EmulatorError, match=r"descriptor of operand v_s places its element"):
        run_chained(chained(64, "no_trans"), 64)


def test_the_chained_kernel_prints_and_parses_back():
    text = function_str(CHAINED.ir)
    assert "wgmma_mma_async(o[0], p[" in text, text
    assert parse_function(text) == CHAINED.ir


# ---- compile errors


def _compile_error(body) -> str:
    with pytest.raises(ScriptError) as err:
        minicomp.script(body).ir  # noqa: B018
    return str(err.value)


def test_float8_operands_are_k_major_only():
    def float8(x: f32[16]):
        attrs.block_dim = 128
        a_s = shared_tensor(f8e4m3fn, (8, 2, 8, 16))
        acc = register_tensor(f32, (8,))
        wgmma_mma_async(acc, a_s, a_s, trans_b=True)

    assert "MN-major, which wgmma has for f16 and bf16 only" in _compile_error(float8)


def test_a_in_registers_is_8_sixteen_bit_elements_without_transpose():
    def transposed(x: f32[16]):
        attrs.block_dim = 128
        a_r = register_tensor(f16, (8,))
        b_s = shared_tensor(f16, (2, 2, 8, 8))
        acc = register_tensor(f32, (8,))
        wgmma_mma_async(acc, a_r, b_s, trans_a=True)

    assert "in registers has no transpose" in _compile_error(transposed)

    def short(x: f32[16]):
        attrs.block_dim = 128
        a_r = register_tensor(bf16, (8,))
        b_s = shared_tensor(bf16, (2, 2, 8, 8))
        acc = register_tensor(f32, (8,))
        wgmma_mma_async(acc, a_r[4], b_s)

    assert "needs 8 bf16 elements; a_r has 4 from there" in _compile_error(short)


def test_an_mn_major_swizzled_operand_spans_whole_rows():
    def narrow(x: f32[16]):
        attrs.block_dim = 128
        a_s = dynamic_shared_tensor(f16, (64, 64), at=0)
        b_s = dynamic_shared_tensor(f16, (64, 64), at=8192)
        acc = register_tensor(f32, (16,))
        wgmma_mma_async(acc, a_s, b_s, swizzle=128, trans_b=True)

    assert "needs 32 rows, whole 128-byte spans of 64" in _compile_error(narrow)


# ---- NVRTC (sm_90a)


def test_the_chained_kernel_compiles_for_sm_90a_to_hgmma(tmp_path):
    try:
        nvrtc.nvrtc_version()
    except nvrtc.NvrtcUnavailableError as err:  # pragma: no cover - depends on the machine
        pytest.skip(f"NVRTC unavailable: {err}")
    from minicomp.backends.cuda import sass

    kernel = chained(128)
    name = kernel.ir.name
    binary = nvrtc.compile_cuda(kernel.source, arch="sm_90a", name=name, cache_dir=str(tmp_path))
    usage = binary.resources[name]
    assert usage.spill_stores == 0 and usage.spill_loads == 0, usage
    assert "serialized" not in binary.log, binary.log
    try:
        text = sass.disassemble(binary.cubin)[name]
    except sass.SassUnavailableError as err:  # pragma: no cover - depends on the machine
        pytest.skip(str(err))
    # What ptxas made of them (CUDA 13): S by `HGMMA.64x64x16.F32 R80, gdesc[UR8], ...` (both
    # operands by descriptor), O by `HGMMA.64x128x16.F32 R24, R112, gdesc[UR4].tnspB, ...`
    # (A from registers, B transposed).
    assert re.search(r"HGMMA\.64x64x16\.F32 R\d+, gdesc\[\w+\], ", text), text
    assert len(re.findall(r"HGMMA\.64x128x16\.F32 R\d+, R\d+, gdesc\[\w+\]\.tnspB", text)) == 4
    (report,) = sass.check_kernels(kernel.source, binary.cubin)
    assert report.ok, report
