"""Tensor cores and async copies in scripts: mma_sync_m16n8k16, ldmatrix and cp_async kernels
(one tile, and a tensor-core matmul template) against float64 torch matmuls, their compile
errors, and NVRTC compilation for sm_80 and sm_90.

The fragment layouts used here are the PTX ISA's (see minicomp.backends.cuda.intrinsics_mma):
a kernel that gets one wrong computes a wrong product.
"""

import inspect
import math

import pytest
import torch

import minicomp
from minicomp.script import (
    ScriptError,
    attrs,
    bf16,
    blockIdx,
    cp_async,
    cp_async_commit,
    cp_async_wait,
    cp_async_wait_all,
    dim,
    f16,
    f32,
    f64,
    i32,
    ldmatrix_x1,
    ldmatrix_x2,
    ldmatrix_x2_trans,
    ldmatrix_x4,
    ldmatrix_x4_trans,
    mma_sync_m16n8k16,
    register_tensor,
    shared_tensor,
    syncthreads,
    threadIdx,
    unroll,
)

TORCH_TYPES = {f16: torch.float16, bf16: torch.bfloat16}


def nan(*shape):
    return torch.full(shape, math.nan, dtype=torch.float32)


def reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """A @ B in float64 (products of halves are exact in f32: only the sum order differs)."""
    return (a.double() @ b.double()).float()


def assert_matmul_close(c: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    want = reference(a, b)
    scale = a.double().abs() @ b.double().abs()
    torch.testing.assert_close(c.double(), want.double(), rtol=0, atol=1e-5 * scale.max().item())


# ---- one warp, one m16n8k16 tile


def mma_tile(dt, b_transposed: bool):
    """One warp computes C = A @ B for A 16x16 and B 16x8 (given as B^T 8x16 when
    `b_transposed`), staging both in shared memory with cp_async and loading the fragments
    with ldmatrix."""
    b_rows, b_cols = (8, 16) if b_transposed else (16, 8)

    @minicomp.script
    def kernel(a: dt[16, 16], b: dt[b_rows, b_cols], c: f32[16, 8]):
        attrs.grid_dim = 1
        attrs.block_dim = 32
        lane = threadIdx.x
        a_s = shared_tensor(dt, (16, 16))
        b_s = shared_tensor(dt, (b_rows, b_cols))
        # A: 32 16-byte chunks, one a lane; B: 16 chunks.
        cp_async(a_s[lane // 2, lane % 2 * 8], a[lane // 2, lane % 2 * 8], 16)
        if lane < 16:
            if b_transposed:
                cp_async(b_s[lane // 2, lane % 2 * 8], b[lane // 2, lane % 2 * 8], 16)
            else:
                cp_async(b_s[lane, 0], b[lane, 0], 8)
                cp_async(b_s[lane, 4], b[lane, 4], 8)
        cp_async_commit()
        cp_async_wait_all()
        syncthreads()
        a_frag = register_tensor(dt, (8,))
        b_frag = register_tensor(dt, (4,))
        acc = register_tensor(f32, (4,))
        # Lane l names row l % 16 of A's left (l < 16) or right half: a0..a7.
        ldmatrix_x4(a_frag, a_s[lane % 16, lane // 16 * 8])
        if b_transposed:
            # Rows n of B^T, k 0-7 (lanes 0-7) and 8-15 (lanes 8-15).
            ldmatrix_x2(b_frag, b_s[lane % 8, lane // 8 % 2 * 8])
        else:
            ldmatrix_x2_trans(b_frag, b_s[lane % 16, 0])
        for i in range(4):
            acc[i] = 0.0
        mma_sync_m16n8k16(acc, a_frag, b_frag, acc)
        g = lane // 4
        t = lane % 4
        for i in range(4):
            c[g + 8 * (i // 2), 2 * t + i % 2] = acc[i]

    return kernel


MMA_TILES = {(dt.dtype.short, bt): mma_tile(dt, bt) for dt in (f16, bf16) for bt in (False, True)}


@pytest.mark.parametrize("b_transposed", [False, True], ids=["b_kn", "b_nk"])
@pytest.mark.parametrize("dt", [f16, bf16], ids=["f16", "bf16"])
def test_one_mma_tile(script_target, dt, b_transposed):
    kernel = MMA_TILES[dt.dtype.short, b_transposed]
    a = torch.randn(16, 16).to(TORCH_TYPES[dt])
    b = torch.randn(16, 8).to(TORCH_TYPES[dt])
    c = nan(16, 8)
    kernel.with_target(script_target)(a, b.t().contiguous() if b_transposed else b, c)
    assert_matmul_close(c, a, b)


# ---- a tensor-core matmul template


def tc_matmul(BM: int, BN: int, BK: int, WARPS_M: int, WARPS_N: int):
    """A script kernel for C[m, n] = A[m, k] @ B[k, n] (f16 in, f32 out, all row-major) with
    tensor cores: a BM x BN tile a block, WARPS_M x WARPS_N warps each computing a
    (BM / WARPS_M) x (BN / WARPS_N) part of it, K in steps of BK staged through two shared
    buffers by cp_async (the next step's copy runs while this one's mma's do). m, n and k are
    runtime sizes that must be multiples of BM, BN and BK."""
    WM, WN = BM // WARPS_M, BN // WARPS_N
    MI, NI = WM // 16, WN // 8  # mma tiles a warp
    THREADS = 32 * WARPS_M * WARPS_N
    PAD = 8  # keeps rows 16-byte aligned and spreads ldmatrix rows over the banks
    A_CHUNKS, B_CHUNKS = BM * BK // 8, BK * BN // 8  # 16-byte copies a stage
    assert WM % 16 == 0 and WN % 8 == 0 and BK % 16 == 0

    @minicomp.script
    def tc_matmul_kernel(
        a: f16[dim.m, dim.k], b: f16[dim.k, dim.n], c: f32[dim.m, dim.n], m: i32, n: i32, k: i32
    ):
        attrs.grid_dim = (n // BN, m // BM)
        attrs.block_dim = THREADS
        tid = threadIdx.x
        lane = tid % 32
        warp_m = tid // 32 // WARPS_N * WM
        warp_n = tid // 32 % WARPS_N * WN
        m0 = blockIdx.y * BM
        n0 = blockIdx.x * BN
        a_s = shared_tensor(f16, (2, BM, BK + PAD))
        b_s = shared_tensor(f16, (2, BK, BN + PAD))
        a_frag = register_tensor(f16, (MI, 8))
        b_frag = register_tensor(f16, (NI, 4))
        acc = register_tensor(f32, (MI, NI, 4))
        for i in unroll(range(MI)):
            for j in unroll(range(NI)):
                for e in unroll(range(4)):
                    acc[i, j, e] = 0.0
        steps = k // BK
        # Step s copies K-tile s and computes K-tile s - 1: one commit group a step, so
        # waiting for all but the newest group leaves tile s - 1 in shared memory.
        for s in range(steps + 1):
            if s < steps:
                store = s % 2
                k0 = s * BK
                for q in unroll(range((A_CHUNKS + THREADS - 1) // THREADS)):
                    chunk = q * THREADS + tid
                    if A_CHUNKS % THREADS == 0 or chunk < A_CHUNKS:
                        row = chunk // (BK // 8)
                        col = chunk % (BK // 8) * 8
                        cp_async(a_s[store, row, col], a[m0 + row, k0 + col], 16)
                for q in unroll(range((B_CHUNKS + THREADS - 1) // THREADS)):
                    chunk = q * THREADS + tid
                    if B_CHUNKS % THREADS == 0 or chunk < B_CHUNKS:
                        row = chunk // (BN // 8)
                        col = chunk % (BN // 8) * 8
                        cp_async(b_s[store, row, col], b[k0 + row, n0 + col], 16)
            cp_async_commit()
            if s > 0:
                cp_async_wait(1)
                syncthreads()
                load = (s - 1) % 2
                for kk in unroll(range(0, BK, 16)):
                    for i in unroll(range(MI)):
                        # Lane l names row l % 16 of the left (l < 16) or right 16x8 half.
                        row = warp_m + i * 16 + lane % 16
                        ldmatrix_x4(a_frag[i], a_s[load, row, kk + lane // 16 * 8])
                    if NI % 2 == 0:
                        for j in unroll(range(0, NI, 2)):
                            # Lanes 16-31 name the rows of the next 8 columns: the fragments
                            # of tiles j and j + 1 at once, from b_frag[j, 0] on.
                            col = warp_n + j * 8 + lane // 16 * 8
                            ldmatrix_x4_trans(b_frag[j, 0], b_s[load, kk + lane % 16, col])
                    else:
                        for j in unroll(range(NI)):
                            ldmatrix_x2_trans(b_frag[j], b_s[load, kk + lane % 16, warp_n + j * 8])
                    for i in unroll(range(MI)):
                        for j in unroll(range(NI)):
                            mma_sync_m16n8k16(acc[i, j], a_frag[i], b_frag[j], acc[i, j])
                syncthreads()
        g = lane // 4
        t = lane % 4
        for i in unroll(range(MI)):
            for j in unroll(range(NI)):
                for e in unroll(range(4)):
                    row = m0 + warp_m + i * 16 + g + e // 2 * 8
                    c[row, n0 + warp_n + j * 8 + 2 * t + e % 2] = acc[i, j, e]

    return tc_matmul_kernel


# (BM, BN, BK, WARPS_M, WARPS_N): 4 warps of 32x16 (B by ldmatrix_x4_trans), and 4 warps of
# 16x8 (B by ldmatrix_x2_trans) with fewer 16-byte copies a stage than threads.
TC_CONFIGS = {"64x32x32_w2x2": (64, 32, 32, 2, 2), "32x16x16_w2x2": (32, 16, 16, 2, 2)}
TC_KERNELS = {name: tc_matmul(*config) for name, config in TC_CONFIGS.items()}


@pytest.mark.parametrize(
    "shape", [(64, 64, 64), (128, 32, 96)], ids=lambda s: "x".join(map(str, s))
)
@pytest.mark.parametrize("config", list(TC_CONFIGS))
def test_tensor_core_matmul(script_target, config, shape):
    BM, BN, BK, _, _ = TC_CONFIGS[config]
    m, n, k = shape
    if m % BM or n % BN or k % BK:
        pytest.skip(f"{shape} is not a multiple of the {config} tiles")
    a, b = torch.randn(m, k).half(), torch.randn(k, n).half()
    c = nan(m, n)
    TC_KERNELS[config].with_target(script_target)(a, b, c)
    assert_matmul_close(c, a, b)


# ---- cp_async of every size, whole and zero-filled


def async_copies(zfill: bool):
    """One warp copies 224 f32 from global to shared memory: lane l copies 16 bytes at float
    4l, 8 at 128 + 2l and 4 at 192 + l (with `zfill`, reading only counts[3l + size index]
    bytes and zero-filling the rest), in two commit groups; then the shared buffer goes to
    out."""

    @minicomp.script
    def kernel(src: f32[224], counts: i32[96], out: f32[224]):
        attrs.grid_dim = 1
        attrs.block_dim = 32
        lane = threadIdx.x
        buf = shared_tensor(f32, (224,))
        if zfill:
            cp_async(buf[4 * lane], src[4 * lane], 16, counts[3 * lane])
            cp_async_commit()
            cp_async(buf[128 + 2 * lane], src[128 + 2 * lane], 8, src_bytes=counts[3 * lane + 1])
            cp_async(buf[192 + lane], src[192 + lane], 4, src_bytes=counts[3 * lane + 2])
        else:
            cp_async(buf[4 * lane], src[4 * lane], 16)
            cp_async_commit()
            cp_async(buf[128 + 2 * lane], src[128 + 2 * lane], 8)
            cp_async(buf[192 + lane], src[192 + lane], 4)
        cp_async_commit()
        cp_async_wait(0)
        syncthreads()
        for i in range(7):
            out[32 * i + lane] = buf[32 * i + lane]

    return kernel


ASYNC_COPIES = {zfill: async_copies(zfill) for zfill in (False, True)}


@pytest.mark.parametrize("zfill", [False, True], ids=["whole", "zfill"])
def test_async_copies(script_target, zfill):
    src = torch.randn(224)
    sizes = torch.tensor([16, 8, 4], dtype=torch.int32).repeat(32)
    counts = torch.randint(0, 5, (96,), dtype=torch.int32) % (sizes // 4 + 1) * 4  # whole floats
    out = nan(224)
    ASYNC_COPIES[zfill].with_target(script_target)(src, counts, out)
    want = src.clone()
    if zfill:
        # Float j of the copy made by lane l of size index s is kept when 4j < counts[3l + s].
        for lane in range(32):
            for s, (start, floats) in enumerate(((4 * lane, 4), (128 + 2 * lane, 2))):
                for j in range(floats):
                    if 4 * j >= counts[3 * lane + s]:
                        want[start + j] = 0.0
            if counts[3 * lane + 2] == 0:
                want[192 + lane] = 0.0
    assert torch.equal(out, want)


# ---- errors


def line_of(fn, text: str) -> int:
    """The line of this file where `text` occurs inside function `fn`."""
    lines, first = inspect.getsourcelines(fn)
    hits = [first + k for k, line in enumerate(lines) if text in line]
    assert len(hits) == 1, (text, hits)
    return hits[0]


def misuse(case: str):
    """A kernel making mistake `case` on the line marked `# case`."""

    @minicomp.script
    def kernel(a: f16[16, 16], x: f32[16], h: f64[16], k: i32):
        attrs.grid_dim = 1
        attrs.block_dim = 32
        lane = threadIdx.x
        a_s = shared_tensor(f16, (16, 16))
        w_s = shared_tensor(bf16, (16, 16))
        x_s = shared_tensor(f32, (16,))
        h_s = shared_tensor(f64, (16,))
        frag = register_tensor(f16, (8,))
        bfrag = register_tensor(bf16, (4,))
        small = register_tensor(f16, (4,))
        acc = register_tensor(f32, (2, 4))
        facc = register_tensor(f16, (4,))
        if case == "mma_a_shared":
            mma_sync_m16n8k16(acc[0], a_s[0, 0], small, acc[0])  # mma_a_shared
        if case == "mma_a_f32":
            mma_sync_m16n8k16(acc[0], acc, small, acc[0])  # mma_a_f32
        if case == "mma_b_type":
            mma_sync_m16n8k16(acc[0], frag, bfrag, acc[0])  # mma_b_type
        if case == "mma_a_small":
            mma_sync_m16n8k16(acc[0], small, small, acc[0])  # mma_a_small
        if case == "mma_d_element":
            mma_sync_m16n8k16(acc[1, 2], frag, small, acc[0])  # mma_d_element
        if case == "mma_c_f16":
            mma_sync_m16n8k16(acc[0], frag, small, facc)  # mma_c_f16
        if case == "mma_d_scalar":
            mma_sync_m16n8k16(1.0, frag, small, acc[0])  # mma_d_scalar
        if case == "mma_arity":
            mma_sync_m16n8k16(acc[0], frag, small)  # mma_arity
        if case == "ld_src_register":
            ldmatrix_x4(frag, frag[0])  # ld_src_register
        if case == "ld_src_global":
            ldmatrix_x4(frag, a[lane % 16, 0])  # ld_src_global
        if case == "ld_dst_shared":
            ldmatrix_x2(a_s[0, 0], a_s[lane % 16, 0])  # ld_dst_shared
        if case == "ld_dst_width":
            ldmatrix_x2(acc[0], x_s[0])  # ld_dst_width
        if case == "ld_types":
            ldmatrix_x2(small, w_s[lane % 16, 0])  # ld_types
        if case == "ld_dst_small":
            ldmatrix_x4(small, a_s[lane % 16, 0])  # ld_dst_small
        if case == "ld_misaligned":
            ldmatrix_x1(small, a_s[3, 4])  # ld_misaligned
        if case == "cp_dst_global":
            cp_async(a[0, 0], a_s[0, 0], 16)  # cp_dst_global
        if case == "cp_src_shared":
            cp_async(a_s[0, 0], a_s[1, 0], 16)  # cp_src_shared
        if case == "cp_types":
            cp_async(w_s[lane // 2, 0], a[lane // 2, 0], 16)  # cp_types
        if case == "cp_nbytes":
            cp_async(x_s[0], x[0], 12)  # cp_nbytes
        if case == "cp_runtime_nbytes":
            cp_async(x_s[0], x[0], k)  # cp_runtime_nbytes
        if case == "cp_narrow":
            cp_async(h_s[0], h[0], 4)  # cp_narrow
        if case == "cp_past_end":
            cp_async(x_s[14], x[lane], 16)  # cp_past_end
        if case == "cp_src_bytes_float":
            cp_async(x_s[0], x[0], 16, src_bytes=x[1])  # cp_src_bytes_float
        if case == "cp_src_bytes_big":
            cp_async(x_s[0], x[0], 8, 12)  # cp_src_bytes_big
        if case == "cp_keyword":
            cp_async(x_s[0], x[0], 16, bytes=4)  # cp_keyword
        if case == "wait_negative":
            cp_async_wait(-1)  # wait_negative
        if case == "wait_runtime":
            cp_async_wait(k)  # wait_runtime
        if case == "commit_args":
            cp_async_commit(1)  # commit_args
        if case == "wait_all_value":
            x[0] = cp_async_wait_all()  # wait_all_value

    return kernel


MISUSES = {
    "mma_a_shared": ("the a operand of mma_sync_m16n8k16()", "register tensor", "a_s", "shared"),
    "mma_a_f32": ("the a operand", "f16 or bf16", "acc is f32"),
    "mma_b_type": ("the b operand", "f16 elements like a", "bfrag is bf16"),
    "mma_a_small": ("the a operand", "needs 8 f16 elements", "small has 4"),
    "mma_d_element": ("the d operand", "needs 4 f32 elements", "acc has 2 from there"),
    "mma_c_f16": ("the c operand", "f32", "facc is f16"),
    "mma_d_scalar": ("the d operand of mma_sync_m16n8k16()", "takes a tensor", "not"),
    "mma_arity": ("mma_sync_m16n8k16()", "missing c"),
    "ld_src_register": ("the source row of ldmatrix_x4()", "shared tensor", "frag is a register"),
    "ld_src_global": ("the source row of ldmatrix_x4()", "shared tensor", "a is a global"),
    "ld_dst_shared": ("the destination of ldmatrix_x2()", "register tensor", "a_s is a shared"),
    "ld_dst_width": ("the destination of ldmatrix_x2()", "f16 or bf16 or i16 or u16", "f32"),
    "ld_types": ("ldmatrix_x2() loads bf16 elements of w_s into f16", "types must match"),
    "ld_dst_small": ("the destination of ldmatrix_x4()", "needs 8 f16 elements", "small has 4"),
    "ld_misaligned": ("ldmatrix_x1()", "16-byte aligned", "element 52 of a_s", "byte 104"),
    "cp_dst_global": ("the destination of cp_async()", "shared tensor", "a is a global tensor"),
    "cp_src_shared": ("the source of cp_async()", "global tensor", "a_s is a shared tensor"),
    "cp_types": ("cp_async() copies f16 elements of a into bf16 tensor w_s", "must match"),
    "cp_nbytes": ("cp_async() copies 4, 8 or 16 bytes, not 12",),
    "cp_runtime_nbytes": ("the byte count of cp_async()", "compile-time"),
    "cp_narrow": ("cp_async() of 4 bytes", "whole number of f64 elements"),
    "cp_past_end": ("the destination of cp_async()", "needs 4 f32 elements", "x_s has 2"),
    "cp_src_bytes_float": ("src_bytes of cp_async()", "f32 value, not an integer"),
    "cp_src_bytes_big": ("src_bytes of cp_async() must be 0 to 8, not 12",),
    "cp_keyword": ("cp_async() has no argument 'bytes'",),
    "wait_negative": ("cp_async_wait(n)", "n must be >= 0, not -1"),
    "wait_runtime": ("the group count of cp_async_wait()", "compile-time"),
    "commit_args": ("cp_async_commit() takes no arguments, 1 given",),
    "wait_all_value": ("cp_async_wait_all() returns nothing",),
}


@pytest.mark.parametrize("case", list(MISUSES))
def test_misuse_is_a_script_error(case):
    kernel = misuse(case)
    with pytest.raises(ScriptError) as info:
        _ = kernel.ir
    err = info.value
    line = line_of(kernel.fn, f"# {case}")
    assert err.filename == __file__ and err.lineno == line, str(err)
    assert str(err).startswith(f"{__file__}:{line}: ")
    for words in MISUSES[case]:
        assert words in err.reason, (words, err.reason)


def test_outside_a_script_the_primitives_refuse():
    with pytest.raises(TypeError, match="only be used inside a @minicomp.script"):
        cp_async_commit()


# ---- NVRTC


def _nvrtc():
    from minicomp.backends.cuda import nvrtc

    try:
        nvrtc.nvrtc_version()
    except nvrtc.NvrtcUnavailableError as err:  # pragma: no cover - depends on the machine
        pytest.skip(f"NVRTC unavailable: {err}")
    return nvrtc


NVRTC_KERNELS = {
    **{f"tile_{dt}_{'nk' if bt else 'kn'}": k for (dt, bt), k in MMA_TILES.items()},
    **{f"matmul_{name}": k for name, k in TC_KERNELS.items()},
    **{f"async_{'zfill' if z else 'whole'}": k for z, k in ASYNC_COPIES.items()},
}


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("name", list(NVRTC_KERNELS))
def test_kernels_compile_with_nvrtc(name, arch, tmp_path):
    """The kernels above compile for the GPU, fragments and accumulators in registers (no
    stack frame, no spills)."""
    nvrtc = _nvrtc()
    kernel = NVRTC_KERNELS[name]
    binary = nvrtc.compile_cuda(kernel.source, arch=arch, name=name, cache_dir=str(tmp_path))
    usage = binary.resources[kernel.ir.name]
    assert usage.registers > 0, binary.log
    assert usage.spill_stores == 0 and usage.spill_loads == 0, usage
    assert usage.stack_bytes == 0, usage
    lowered = binary.log.lower()
    assert "error" not in lowered and "warning" not in lowered, binary.log
