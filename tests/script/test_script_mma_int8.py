"""8-bit integer tensor cores in scripts: mma_sync_m16n8k32 (s8/u8 operands, s32 sums) and
ldmatrix of 8-bit elements, run in the emulator against numpy's int64 matmul reduced modulo
2^32 (bit for bit, wrap-around included), their compile errors, and NVRTC compilation for
sm_80, sm_89 and sm_90.

The fragment layouts are written out here from the PTX ISA's tables ("Matrix Fragments for
mma.m16n8k32", .s8/.u8), apart from the emulator's and the renderer's
(minicomp.backends.cuda.intrinsics_mma): a layout wrong in either gives a wrong product.
"""

import numpy as np
import pytest
import torch

import minicomp
from minicomp.backends.cuda.intrinsics_mma import mma_fragment
from minicomp.script import (
    ScriptError,
    attrs,
    cp_async,
    cp_async_commit,
    cp_async_wait_all,
    f16,
    i8,
    i32,
    ldmatrix_x2,
    ldmatrix_x4,
    ldmatrix_x4_trans,
    mma_sync_m16n8k32,
    register_tensor,
    shared_tensor,
    syncthreads,
    threadIdx,
    u8,
)

TORCH_TYPES = {i8: torch.int8, u8: torch.uint8}
PAIRS = {"s8s8": (i8, i8), "s8u8": (i8, u8), "u8s8": (u8, i8), "u8u8": (u8, u8)}


def a_layout(g: int, t: int, i: int) -> tuple[int, int]:
    """A element a_i (i < 16): "row = groupID for ai where 0 <= i < 4 || 8 <= i < 12,
    groupID + 8 otherwise; col = (threadID_in_group * 4) + (i & 0x3) for i < 8, + 16 for
    i >= 8"."""
    row = g if (i < 4 or 8 <= i < 12) else g + 8
    return row, t * 4 + (i & 3) + (16 if i >= 8 else 0)


def b_layout(g: int, t: int, i: int) -> tuple[int, int]:
    """B element b_i (i < 8): "row = (threadID_in_group * 4) + (i & 0x3) for i < 4, + 16 for
    i >= 4; col = groupID"."""
    return t * 4 + (i & 3) + (16 if i >= 4 else 0), g


def c_layout(g: int, t: int, i: int) -> tuple[int, int]:
    return (g if i < 2 else g + 8), t * 2 + (i & 1)


def wrapped(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> np.ndarray:
    """c + a @ b in exact integers, reduced modulo 2^32 to int32 (what PyTorch's int32 sums
    give, and mma without .satfinite)."""
    exact = a.numpy().astype(np.int64) @ b.numpy().astype(np.int64) + c.numpy().astype(np.int64)
    return ((exact + 2**31) % 2**32 - 2**31).astype(np.int32)


def random_int8(shape, dt, gen) -> torch.Tensor:
    low, high = (-128, 128) if dt == i8 else (0, 256)
    return torch.randint(low, high, shape, generator=gen).to(TORCH_TYPES[dt])


def test_layouts_cover_each_element_once():
    for operand, layout, count, shape in (
        ("a", a_layout, 16, (16, 32)),
        ("b", b_layout, 8, (32, 8)),
        ("c", c_layout, 4, (16, 8)),
    ):
        seen = np.zeros(shape, dtype=int)
        for lane in range(32):
            for i in range(count):
                row, col = layout(lane >> 2, lane % 4, i)
                seen[row, col] += 1
                assert mma_fragment(operand, lane, i, "m16n8k32") == (row, col)
        assert (seen == 1).all(), operand
        with pytest.raises(ValueError):
            mma_fragment(operand, 0, count, "m16n8k32")


# ---- fragments loaded by the layouts from global memory


def fragment_kernel(ta, tb, k_tiles: int):
    """One warp: D = A @ B + C (A 16 x 32k, B 32k x 8 row-major, C and D 16 x 8 int32), each
    lane loading its fragments of each K step straight from global memory by the layouts."""
    K = 32 * k_tiles

    @minicomp.script
    def kernel(a: ta[16, K], b: tb[K, 8], c: i32[16, 8], d: i32[16, 8]):
        attrs.grid_dim = 1
        attrs.block_dim = 32
        lane = threadIdx.x
        g = lane // 4
        t = lane % 4
        a_frag = register_tensor(ta, (16,))
        b_frag = register_tensor(tb, (8,))
        acc = register_tensor(i32, (4,))
        for i in range(4):
            acc[i] = c[g + 8 * (i // 2), 2 * t + i % 2]
        for kt in range(k_tiles):
            for i in range(16):
                a_frag[i] = a[g + 8 * (i // 4 % 2), kt * 32 + t * 4 + i % 4 + 16 * (i // 8)]
            for i in range(8):
                b_frag[i] = b[kt * 32 + t * 4 + i % 4 + 16 * (i // 4), g]
            mma_sync_m16n8k32(acc, a_frag, b_frag, acc)
        for i in range(4):
            d[g + 8 * (i // 2), 2 * t + i % 2] = acc[i]

    return kernel


FRAGMENT_KERNELS = {(p, kt): fragment_kernel(*PAIRS[p], kt) for p in PAIRS for kt in (1, 3)}


@pytest.mark.parametrize("k_tiles", [1, 3])
@pytest.mark.parametrize("pair", list(PAIRS))
def test_mma_random_fragments_exact(script_target, pair, k_tiles):
    """Random 8-bit operands of every signedness: D equals the integer product bit for bit."""
    ta, tb = PAIRS[pair]
    gen = torch.Generator().manual_seed(17 * k_tiles + len(pair))
    a = random_int8((16, 32 * k_tiles), ta, gen)
    b = random_int8((32 * k_tiles, 8), tb, gen)
    c = torch.randint(-(2**31), 2**31, (16, 8), generator=gen, dtype=torch.int64).to(torch.int32)
    d = torch.zeros(16, 8, dtype=torch.int32)
    FRAGMENT_KERNELS[pair, k_tiles].with_target(script_target)(a, b, c, d)
    assert np.array_equal(d.numpy(), wrapped(a, b, c))


def test_mma_wraps_around(script_target):
    """Sums past 2^31 wrap as PyTorch's int32 arithmetic does (no .satfinite clamping)."""
    a = torch.full((16, 96), 255, dtype=torch.uint8)
    b = torch.full((96, 8), 255, dtype=torch.uint8)
    c = torch.full((16, 8), 2**31 - 10, dtype=torch.int32)
    d = torch.zeros(16, 8, dtype=torch.int32)
    FRAGMENT_KERNELS["u8u8", 3].with_target(script_target)(a, b, c, d)
    expected = wrapped(a, b, c)
    assert np.array_equal(d.numpy(), expected)
    assert (expected < 0).all()  # 2^31 - 10 + 96 * 255^2 wrapped to a negative int32


# ---- cp.async and 8-bit ldmatrix from K-major tiles


def staged_kernel(ta, tb):
    """One warp: C = A @ B^T for A 16 x 64 and B^T 8 x 64 (both K-major), staged in shared
    memory by cp_async (16 bytes a chunk), fragments by 8-bit ldmatrix, two K steps."""

    @minicomp.script
    def kernel(a: ta[16, 64], bt: tb[8, 64], c: i32[16, 8]):
        attrs.grid_dim = 1
        attrs.block_dim = 32
        lane = threadIdx.x
        # Rows padded by 16 bytes, as the matmul template pads them.
        a_s = shared_tensor(ta, (16, 80))
        b_s = shared_tensor(tb, (8, 80))
        for q in range(2):  # A: 64 chunks of 16 bytes; B: 32
            cp_async(a_s[lane // 4 + q * 8, lane % 4 * 16], a[lane // 4 + q * 8, lane % 4 * 16], 16)
        cp_async(b_s[lane // 4, lane % 4 * 16], bt[lane // 4, lane % 4 * 16], 16)
        cp_async_commit()
        cp_async_wait_all()
        syncthreads()
        a_frag = register_tensor(ta, (16,))
        b_frag = register_tensor(tb, (8,))
        acc = register_tensor(i32, (4,))
        for i in range(4):
            acc[i] = 0
        for kk in range(0, 64, 32):
            # Lane l names row l % 16 at k + 16 * (l // 16): a0..a15.
            ldmatrix_x4(a_frag, a_s[lane % 16, kk + lane // 16 * 16])
            # Rows n of B^T at k (lanes 0-7) and k + 16 (lanes 8-15): b0..b7.
            ldmatrix_x2(b_frag, b_s[lane % 8, kk + lane // 8 % 2 * 16])
            mma_sync_m16n8k32(acc, a_frag, b_frag, acc)
        g = lane // 4
        t = lane % 4
        for i in range(4):
            c[g + 8 * (i // 2), 2 * t + i % 2] = acc[i]

    return kernel


STAGED_KERNELS = {p: staged_kernel(*PAIRS[p]) for p in PAIRS}


@pytest.mark.parametrize("pair", list(PAIRS))
def test_async_copy_ldmatrix_mma(script_target, pair):
    ta, tb = PAIRS[pair]
    gen = torch.Generator().manual_seed(5 + len(pair))
    a, bt = random_int8((16, 64), ta, gen), random_int8((8, 64), tb, gen)
    c = torch.zeros(16, 8, dtype=torch.int32)
    STAGED_KERNELS[pair].with_target(script_target)(a, bt, c)
    assert np.array_equal(c.numpy(), wrapped(a, bt.t(), torch.zeros(16, 8, dtype=torch.int32)))


# ---- compile errors


def misuse(case: str):
    @minicomp.script
    def kernel(x: i8[64], h: f16[64]):
        attrs.grid_dim = 1
        attrs.block_dim = 32
        a_s = shared_tensor(i8, (16, 32))
        af = register_tensor(i8, (16,))
        bf = register_tensor(i8, (8,))
        hf = register_tensor(f16, (8,))
        acc = register_tensor(i32, (4,))
        facc = register_tensor(f16, (4,))
        if case == "a_f16":
            mma_sync_m16n8k32(acc, hf, bf, acc)
        elif case == "a_small":
            mma_sync_m16n8k32(acc, bf, bf, acc)
        elif case == "c_f16":
            mma_sync_m16n8k32(acc, af, bf, facc)
        elif case == "trans":
            ldmatrix_x4_trans(af, a_s[threadIdx.x % 16, 0])
        elif case == "ld_small":
            ldmatrix_x4(bf, a_s[threadIdx.x % 16, 0])

    return kernel


MISUSES = {
    "a_f16": "must hold i8 or u8 or f8e4m3fn or f8e5m2 elements",
    "a_small": "needs 16 i8 elements",
    "c_f16": "must hold i32 elements",
    "trans": "transposes 16-bit elements",
    "ld_small": "needs 16 i8 elements",
}


@pytest.mark.parametrize("case", list(MISUSES))
def test_misuse_is_a_script_error(case):
    with pytest.raises(ScriptError, match=MISUSES[case]):
        _ = misuse(case).ir


# ---- NVRTC


def _nvrtc():
    from minicomp.backends.cuda import nvrtc

    try:
        nvrtc.nvrtc_version()
    except nvrtc.NvrtcUnavailableError as err:  # pragma: no cover - depends on the machine
        pytest.skip(f"NVRTC unavailable: {err}")
    return nvrtc


NVRTC_KERNELS = {
    **{f"fragments_{p}": FRAGMENT_KERNELS[p, 3] for p in PAIRS},
    **{f"staged_{p}": k for p, k in STAGED_KERNELS.items()},
}


@pytest.mark.parametrize("arch", ["sm_80", "sm_89", "sm_90"])
@pytest.mark.parametrize("name", list(NVRTC_KERNELS))
def test_kernels_compile_with_nvrtc(name, arch, tmp_path):
    """The kernels compile for the GPU with fragments and accumulators in registers (no stack
    frame, no spills), the mma as PTX's integer m16n8k32."""
    nvrtc = _nvrtc()
    if arch not in nvrtc.supported_archs():  # pragma: no cover - depends on NVRTC's version
        pytest.skip(f"NVRTC {nvrtc.nvrtc_version()} has no {arch}")
    kernel = NVRTC_KERNELS[name]
    assert "mc_mma_m16n8k32_" in kernel.source
    binary = nvrtc.compile_cuda(kernel.source, arch=arch, name=name, cache_dir=str(tmp_path))
    usage = binary.resources[kernel.ir.name]
    assert usage.registers > 0, binary.log
    assert usage.spill_stores == 0 and usage.spill_loads == 0, usage
    assert usage.stack_bytes == 0, usage
    lowered = binary.log.lower()
    assert "error" not in lowered and "warning" not in lowered, binary.log
