"""float8 in scripts: the float8 script types (loads, stores, conversions bit for bit with
PyTorch's) and mma_sync_m16n8k32 of float8_e4m3fn / float8_e5m2 operands summed in f32, run in
the emulator against a reference computed here, its compile errors, and NVRTC (sm_89, sm_90
compile without spills; sm_80 refuses it, naming the instruction and sm_89).

The fragments are the 8-bit integer ones (one table in the PTX ISA, "Matrix Fragments for
mma.m16n8k32"), written out in test_script_mma_int8.py. What the tests compare with:

- the emulator's mma: c, then the 32 products added in k order, rounding to nearest after each
  addition (each product of two float8 values is exact in f32), computed here in numpy: equal
  bit for bit. A wrong layout in the emulator gives another sum.
- a GPU's (target cuda, sm_89+): its tensor cores add the exact products in their own order and
  rounding (sm_90 runs two f16 mma's of 16 products each), which PTX leaves unspecified, so the
  result is compared with the float64 sum within 2^-16 of the sum of the terms' magnitudes
  (|c| + sum |a_k b_k|): a few f32 ulps of it, with room for truncating adders.
"""

import numpy as np
import pytest
import torch

import minicomp
from minicomp.script import (
    ScriptError,
    attrs,
    cp_async,
    cp_async_commit,
    cp_async_wait_all,
    f16,
    f32,
    float8_e4m3fn,
    float8_e4m3fnuz,
    float8_e5m2,
    float8_e5m2fnuz,
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
)

TORCH = {
    float8_e4m3fn: torch.float8_e4m3fn,
    float8_e5m2: torch.float8_e5m2,
    float8_e4m3fnuz: torch.float8_e4m3fnuz,
    float8_e5m2fnuz: torch.float8_e5m2fnuz,
}
PAIRS = {
    "e4m3e4m3": (float8_e4m3fn, float8_e4m3fn),
    "e4m3e5m2": (float8_e4m3fn, float8_e5m2),
    "e5m2e4m3": (float8_e5m2, float8_e4m3fn),
    "e5m2e5m2": (float8_e5m2, float8_e5m2),
}
TOLERANCE = 2.0**-16


def skip_without_fp8_mma(target: str) -> None:
    if target == "cuda" and torch.cuda.get_device_capability() < (8, 9):  # pragma: no cover
        pytest.skip("float8 mma needs sm_89 or newer")


def random_fp8(shape, dt, gen, scale: float = 4.0) -> torch.Tensor:
    return (torch.randn(shape, generator=gen) * scale).to(TORCH[dt])


def sequential(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> np.ndarray:
    """c + a @ b as the emulator adds it: c, then each product in k order, in f32."""
    af, bf = a.float().numpy(), b.float().numpy()
    acc = c.numpy().astype(np.float32).copy()
    for k in range(af.shape[1]):
        acc = acc + np.outer(af[:, k], bf[k, :]).astype(np.float32)
    return acc


def check_product(target: str, d, a, b, c) -> None:
    """d is c + a @ b: bit for bit the sequential sum in the emulator, within TOLERANCE of the
    float64 sum on a GPU (see the module doc)."""
    d = d.cpu()
    a, b, c = a.cpu(), b.cpu(), c.cpu()
    if target == "cuda-emu":
        assert np.array_equal(d.numpy(), sequential(a, b, c))
        return
    exact = c.double() + a.double() @ b.double()
    scale = c.double().abs() + a.double().abs() @ b.double().abs()
    assert ((d.double() - exact).abs() <= TOLERANCE * scale).all()


# ---- float8 values: loads, stores, conversions


def convert_kernel(dt):
    @minicomp.script
    def kernel(x: f32[256], bits: dt[256], to_f8: dt[256], to_f32: f32[256], to_f16: f16[256]):
        attrs.grid_dim = 1
        attrs.block_dim = 256
        i = threadIdx.x
        to_f8[i] = dt(x[i])  # round to nearest even, saturating or not as PyTorch does
        to_f32[i] = f32(bits[i])  # exact
        to_f16[i] = bits[i]  # widens implicitly, exactly

    return kernel


CONVERT = {dt: convert_kernel(dt) for dt in TORCH}


@pytest.mark.parametrize("dt", list(TORCH), ids=repr)
def test_float8_conversions_match_torch(script_target, dt):
    """Every one of the 256 bit patterns widened to f32 and f16, and f32 values across the
    format's range (subnormals, ties, overflow, NaN, infinities) narrowed, as PyTorch does."""
    gen = torch.Generator().manual_seed(2)
    tdt = TORCH[dt]
    bits = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(tdt)
    x = torch.randn(256, generator=gen) * torch.logspace(-12, 18, 256, base=2.0)
    x[:4] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0])
    outs = torch.empty(256, dtype=tdt), torch.empty(256), torch.empty(256, dtype=torch.float16)
    CONVERT[dt].with_target(script_target)(x, bits, *outs)
    to_f8, to_f32, to_f16 = (o.cpu() for o in outs)
    assert torch.equal(to_f8.view(torch.uint8), x.cpu().to(tdt).view(torch.uint8))
    wide = bits.cpu().float()
    assert torch.equal(to_f32.isnan(), wide.isnan())
    assert torch.equal(to_f32[~wide.isnan()], wide[~wide.isnan()])
    assert torch.equal(to_f16[~wide.isnan()], bits.cpu().half()[~wide.isnan()])


def test_script_types_print_and_read_back():
    """The printer writes the short names (f8e4m3fn), which read back as the same types."""
    from minicomp.ir.printer import function_str
    from minicomp.script.text import parse_function

    kernel = CONVERT[float8_e5m2]
    text = function_str(kernel.ir)
    assert "ptr(f8e5m2)" in text and "f8e5m2(" in text
    assert parse_function(text) == kernel.ir


# ---- the mma from fragments loaded by the layouts from global memory


def fragment_kernel(ta, tb, k_tiles: int):
    """One warp: D = A @ B + C (A 16 x 32k, B 32k x 8 row-major float8, C and D 16 x 8 f32),
    each lane loading its fragments of each K step straight from global memory."""
    K = 32 * k_tiles

    @minicomp.script
    def kernel(a: ta[16, K], b: tb[K, 8], c: f32[16, 8], d: f32[16, 8]):
        attrs.grid_dim = 1
        attrs.block_dim = 32
        lane = threadIdx.x
        g = lane // 4
        t = lane % 4
        a_frag = register_tensor(ta, (16,))
        b_frag = register_tensor(tb, (8,))
        acc = register_tensor(f32, (4,))
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
def test_mma_random_fragments(script_target, pair, k_tiles):
    """Random float8 operands of every pair of formats (each mma adds 32 products to C)."""
    skip_without_fp8_mma(script_target)
    ta, tb = PAIRS[pair]
    gen = torch.Generator().manual_seed(11 * k_tiles + len(pair))
    a = random_fp8((16, 32 * k_tiles), ta, gen)
    b = random_fp8((32 * k_tiles, 8), tb, gen)
    c = torch.randn(16, 8, generator=gen) * 16
    d = torch.zeros(16, 8)
    FRAGMENT_KERNELS[pair, k_tiles].with_target(script_target)(a, b, c, d)
    check_product(script_target, d, a, b, c)


@pytest.mark.parametrize("dt", [float8_e4m3fn, float8_e5m2], ids=repr)
def test_mma_reads_every_bit_pattern(script_target, dt):
    """A holds every finite pattern (twice; NaNs and infinities, which would poison their
    rows through 0 * NaN, replaced by zeros); B selects one column of A a mma: D's columns are
    A's values widened exactly. Then one NaN in A makes its row of D NaN, as IEEE asks."""
    skip_without_fp8_mma(script_target)
    tdt = TORCH[dt]
    a = torch.arange(512, dtype=torch.int32).remainder(256).to(torch.uint8).view(tdt)
    a = torch.where(a.float().isfinite(), a.float(), 0.0).to(tdt).reshape(16, 32)
    kernel = FRAGMENT_KERNELS[("e4m3e4m3" if dt == float8_e4m3fn else "e5m2e5m2"), 1]
    for first in range(0, 32, 8):
        b = torch.zeros(32, 8)
        b[first + torch.arange(8), torch.arange(8)] = 1.0
        c, d = torch.zeros(16, 8), torch.zeros(16, 8)
        kernel.with_target(script_target)(a, b.to(tdt), c, d)
        assert torch.equal(d.cpu(), a.cpu().float()[:, first : first + 8] + 0.0)  # -0 + 0: +0
    a[3, 5] = float("nan")
    c, d = torch.zeros(16, 8), torch.zeros(16, 8)
    kernel.with_target(script_target)(a, torch.ones(32, 8).to(tdt), c, d)
    assert d.cpu().isnan().sum(1).tolist() == [8 if r == 3 else 0 for r in range(16)]


# ---- cp.async and 8-bit ldmatrix from K-major tiles


def staged_kernel(ta, tb):
    """One warp: C = A @ B^T for A 16 x 64 and B^T 8 x 64 (both K-major float8), staged in
    shared memory by cp_async, fragments by 8-bit ldmatrix, two K steps."""

    @minicomp.script
    def kernel(a: ta[16, 64], bt: tb[8, 64], c: f32[16, 8]):
        attrs.grid_dim = 1
        attrs.block_dim = 32
        lane = threadIdx.x
        a_s = shared_tensor(ta, (16, 80))
        b_s = shared_tensor(tb, (8, 80))
        for q in range(2):
            cp_async(a_s[lane // 4 + q * 8, lane % 4 * 16], a[lane // 4 + q * 8, lane % 4 * 16], 16)
        cp_async(b_s[lane // 4, lane % 4 * 16], bt[lane // 4, lane % 4 * 16], 16)
        cp_async_commit()
        cp_async_wait_all()
        syncthreads()
        a_frag = register_tensor(ta, (16,))
        b_frag = register_tensor(tb, (8,))
        acc = register_tensor(f32, (4,))
        for i in range(4):
            acc[i] = 0.0
        for kk in range(0, 64, 32):
            ldmatrix_x4(a_frag, a_s[lane % 16, kk + lane // 16 * 16])
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
    skip_without_fp8_mma(script_target)
    ta, tb = PAIRS[pair]
    gen = torch.Generator().manual_seed(7 + len(pair))
    a, bt = random_fp8((16, 64), ta, gen), random_fp8((8, 64), tb, gen)
    c = torch.zeros(16, 8)
    STAGED_KERNELS[pair].with_target(script_target)(a, bt, c)
    check_product(script_target, c, a, bt.t(), torch.zeros(16, 8))


# ---- compile errors


def misuse(case: str):
    @minicomp.script
    def kernel(x: i8[64]):
        attrs.grid_dim = 1
        attrs.block_dim = 32
        a_s = shared_tensor(float8_e4m3fn, (16, 32))
        af = register_tensor(float8_e4m3fn, (16,))
        bf = register_tensor(float8_e5m2, (8,))
        ib = register_tensor(i8, (8,))
        hf = register_tensor(f16, (16,))
        acc = register_tensor(f32, (4,))
        iacc = register_tensor(i32, (4,))
        if case == "b_int8":
            mma_sync_m16n8k32(acc, af, ib, acc)
        elif case == "c_i32":
            mma_sync_m16n8k32(iacc, af, bf, iacc)
        elif case == "a_f16":
            mma_sync_m16n8k32(acc, hf, bf, acc)
        elif case == "trans":
            ldmatrix_x4_trans(af, a_s[threadIdx.x % 16, 0])
        elif case == "narrow":
            af[0] = 1.5 * x[0]

    return kernel


MISUSES = {
    "b_int8": r"must hold f8e4m3fn or f8e5m2 elements like a \(f8e4m3fn\)",
    "c_i32": "must hold f32 elements",
    "a_f16": "must hold i8 or u8 or f8e4m3fn or f8e5m2 elements",
    "trans": "transposes 16-bit elements",
    "narrow": "does not convert implicitly to f8e4m3fn; write f8e4m3fn",
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


@pytest.mark.parametrize("arch", ["sm_89", "sm_90"])
@pytest.mark.parametrize("name", list(NVRTC_KERNELS))
def test_kernels_compile_with_nvrtc(name, arch, tmp_path):
    """The kernels compile with fragments and accumulators in registers (no stack frame, no
    spills); where a disassembler is installed, the machine code has the tensor-core mma
    (QMMA on sm_89; HMMA on sm_90, which unpacks the bytes to f16)."""
    nvrtc = _nvrtc()
    if arch not in nvrtc.supported_archs():  # pragma: no cover - depends on NVRTC's version
        pytest.skip(f"NVRTC {nvrtc.nvrtc_version()} has no {arch}")
    kernel = NVRTC_KERNELS[name]
    assert "mc_mma_m16n8k32_e" in kernel.source
    binary = nvrtc.compile_cuda(kernel.source, arch=arch, name=name, cache_dir=str(tmp_path))
    usage = binary.resources[kernel.ir.name]
    assert usage.registers > 0, binary.log
    assert usage.spill_stores == 0 and usage.spill_loads == 0, usage
    assert usage.stack_bytes == 0, usage
    lowered = binary.log.lower()
    assert "error" not in lowered and "warning" not in lowered, binary.log
    from minicomp.backends.cuda import sass

    try:
        (report,) = sass.check_kernels(kernel.source, binary.cubin)
    except sass.SassUnavailableError:  # pragma: no cover - depends on the machine
        return
    assert report.ok and "QMMA|HMMA" in report.intended, report
    counts = sass.opcode_counts(sass.disassemble(binary.cubin)[kernel.ir.name])
    assert counts["QMMA" if arch == "sm_89" else "HMMA"] > 0, counts


def test_sm80_refuses_the_float8_mma(tmp_path):
    """Compiled for sm_80, a kernel using the float8 mma fails, the log naming the instruction
    and the architecture it needs."""
    nvrtc = _nvrtc()
    kernel = FRAGMENT_KERNELS["e4m3e5m2", 1]
    with pytest.raises(nvrtc.CompileError) as err:
        nvrtc.compile_cuda(kernel.source, arch="sm_80", name="fp8_sm80", cache_dir=str(tmp_path))
    message = str(err.value)
    assert "m16n8k32.row.col.f32.e4m3.e5m2.f32" in message and "needs sm_89" in message
    assert "sm_80" in message
