"""device.h's f16/bf16 conversions: the GPU's are the hardware's instructions (F2FP, HADD2.F32,
F2F), with none of the bit-rounding sequence the emulator keeps; the emulator's are PyTorch's
CPU conversions bit for bit, NaNs and subnormals included, and its pair conversions equal two
scalar ones."""

import pytest
import torch
from helpers import binary_for_sass

from minicomp.backends.cuda import emu, sass
from minicomp.backends.cuda.codegen import device_header

KERNELS = r"""
#define I (blockIdx.x * blockDim.x + threadIdx.x)
extern "C" __global__ void to_f16(const float* x, uint16_t* y) { y[I] = mc_f32_to_f16(x[I]); }
extern "C" __global__ void to_bf16(const float* x, uint16_t* y) { y[I] = mc_f32_to_bf16(x[I]); }
extern "C" __global__ void from_f16(const uint16_t* x, float* y) { y[I] = mc_f16_to_f32(x[I]); }
extern "C" __global__ void pairs(const float* x, uint32_t* f16, uint32_t* bf16) {
    unsigned i = I;
    f16[i] = mc_f32x2_to_f16x2(x[2 * i], x[2 * i + 1]);
    bf16[i] = mc_f32x2_to_bf16x2(x[2 * i], x[2 * i + 1]);
}
"""
SOURCE = device_header() + KERNELS

# What the bit-rounding versions compile to around each conversion, and a kernel that only
# loads, converts and stores has no other use for: compares, selects, logic, shifts.
SOFTWARE_ROUNDING = ("ISETP", "FSETP", "SEL", "LOP3", "SHF")


def _edge_floats() -> torch.Tensor:
    """Every class of float the conversions treat apart, then random bit patterns."""
    bits = [
        0x00000000, 0x80000000, 0x00000001, 0x007FFFFF, 0x00800000,  # zeros, f32 subnormals
        0x33000000, 0x33000001, 0x337FFFFF, 0x33800000,  # around f16's smallest subnormal
        0x387FC000, 0x387FE000, 0x38800000, 0x38801000,  # f16 subnormal / normal boundary
        0x3F800000, 0x3F801000, 0x3F803000, 0x3F808000, 0x3F818000,  # ties to even
        0x477FE000, 0x477FEFFF, 0x477FF000, 0x47800000,  # f16 overflow boundary
        0x7F7FFFFF, 0x7F7F8000, 0x7F800000, 0xFF800000,  # bf16 overflow, infinities
        0x7FC00000, 0xFFC00000, 0x7F800001, 0x7FBFFFFF, 0xFFFFFFFF, 0x7FC12345,  # NaNs
    ]  # fmt: skip
    fixed = torch.tensor(bits, dtype=torch.int64).to(torch.int32)
    generator = torch.Generator().manual_seed(0)
    rand = torch.randint(-(2**31), 2**31, (4096 - len(bits),), generator=generator)
    return torch.cat([fixed, rand.to(torch.int32)]).view(torch.float32)


@pytest.fixture(scope="module")
def emulated(tmp_path_factory):
    signatures = [
        ("to_f16", "const float*, uint16_t*"),
        ("to_bf16", "const float*, uint16_t*"),
        ("from_f16", "const uint16_t*, float*"),
        ("pairs", "const float*, uint32_t*, uint32_t*"),
    ]
    return emu.build_emulated(
        SOURCE, signatures, cache_dir=str(tmp_path_factory.mktemp("emu_half"))
    )


def _assert_same_halves(bits: torch.Tensor, expected: torch.Tensor) -> None:
    """16-bit patterns equal, but a NaN only needs to be a NaN: PyTorch's CPU has no one NaN
    either (f16: sign|0x7e00 scalar, the payload kept vectorised; bf16: 0x7fc0 scalar, 0xffff
    vectorised). The emulator gives the scalar ones."""
    got = bits.view(expected.dtype)
    nan = expected.isnan()
    assert torch.equal(got.isnan(), nan)
    assert torch.equal(bits[~nan], expected.view(torch.int16)[~nan])


def _run(module, name, n, *tensors):
    """Launches `name` on n threads (a multiple of 256), one element (or pair) each."""
    module.launch(name, n // 256, 256, list(tensors))


@pytest.mark.parametrize("dtype, kernel", [(torch.float16, "to_f16"), (torch.bfloat16, "to_bf16")])
def test_emulator_narrows_like_pytorch_on_the_cpu(emulated, dtype, kernel):
    x = _edge_floats()
    y = torch.zeros(x.numel(), dtype=torch.int16)
    _run(emulated, kernel, x.numel(), x, y)
    _assert_same_halves(y, x.to(dtype))


def test_emulator_widens_every_f16_exactly(emulated):
    h = torch.arange(-(2**15), 2**15, dtype=torch.int32).to(torch.int16)
    y = torch.zeros(h.numel())
    _run(emulated, "from_f16", h.numel(), h, y)
    expected = h.view(torch.float16).float()
    finite = ~expected.isnan()
    assert torch.equal(y[finite].view(torch.int32), expected[finite].view(torch.int32))
    assert y[~finite].isnan().all()


def test_emulator_pairs_equal_two_scalar_conversions(emulated):
    x = _edge_floats()
    f16 = torch.zeros(x.numel() // 2, dtype=torch.int32)
    bf16 = torch.zeros(x.numel() // 2, dtype=torch.int32)
    _run(emulated, "pairs", x.numel() // 2, x, f16, bf16)
    _assert_same_halves(f16.view(torch.int16), x.half())
    _assert_same_halves(bf16.view(torch.int16), x.bfloat16())


@pytest.fixture(scope="module", params=["sm_75", "sm_80", "sm_90"])
def sass_counts(request, tmp_path_factory):
    """Each kernel's SASS opcodes (with modifiers), compiled for one architecture."""
    binary = binary_for_sass(SOURCE, request.param, str(tmp_path_factory.mktemp("cubins")))
    sass_text = sass.disassemble(binary.cubin)
    return request.param, {name: sass.full_opcode_counts(text) for name, text in sass_text.items()}


def _bases(counts) -> set[str]:
    return {full.split(".")[0] for full in counts}


def test_f16_conversions_are_single_instructions(sass_counts):
    arch, counts = sass_counts
    to_f16, from_f16 = counts["to_f16"], counts["from_f16"]
    assert sass.instruction_classes(to_f16)["half conversion"] == 1, to_f16
    assert sum(n for op, n in from_f16.items() if op == "HADD2.F32") == 1, from_f16
    for kernel in (to_f16, from_f16):
        assert not _bases(kernel) & set(SOFTWARE_ROUNDING), (arch, kernel)


def test_bf16_conversions_are_single_instructions_from_sm_80(sass_counts):
    arch, counts = sass_counts
    to_bf16, pairs = counts["to_bf16"], counts["pairs"]
    if arch == "sm_75":  # no bf16 cvt before sm_80: the bit rounding, which still compiles
        assert sass.instruction_classes(to_bf16)["half conversion"] == 0
        return
    assert sass.instruction_classes(to_bf16)["half conversion"] == 1, to_bf16
    assert not _bases(to_bf16) & set(SOFTWARE_ROUNDING), to_bf16
    # One F2FP a pair, packed by the conversion itself.
    assert sum(n for op, n in pairs.items() if op.startswith("F2FP")) == 2, pairs
    assert not _bases(pairs) & {"PRMT", "ISETP", "FSETP", "SEL", "LOP3"}, pairs  # SHF: 2 * i
