"""Reading SASS: opcode counts, each kernel's source, and the check that the instructions a
kernel's source asked for are in the cubin NVRTC built."""

import pytest
from helpers import binary_for_sass

from minicomp.backends.cuda import sass

SNIPPET = """
        /*0080*/                   LEA.HI R42, R0, R5, RZ, 0x5 ;
        /*0090*/              @!P0 LDGSTS.E.BYPASS.128 [R3], desc[UR4][R8.64] ;
        /*00a0*/               @P1 LDG.E.128 R4, desc[UR4][R2.64] ;
        /*00b0*/                   HMMA.16816.F32 R4, R8, R12, R4 ;
        /*00c0*/                   HMMA.16816.F32 R16, R8, R14, R16 ;
        /*00d0*/                   STS.64 [R1], R4 ;
        /*00e0*/                   LDSM.16.M88.4 R8, [R20] ;
"""


def test_opcode_counts_see_predicated_instructions_and_access_widths():
    counts = sass.opcode_counts(SNIPPET)
    assert counts["HMMA"] == 2 and counts["LDGSTS"] == 1 and counts["LDSM"] == 1
    assert counts["LDG"] == 1 and counts["LDG.128"] == 1 and counts["STS.64"] == 1
    assert counts["LEA"] == 1 and "E" not in counts


SOURCE = """
MC_DEVICE void mc_mma_m16n8k16_f16(float* d) { asm volatile("mma.sync..."); }
extern "C" __global__ __launch_bounds__(128, 1) void k0_mm(float* a) {
    mc_cp_async_cg16(a, a);
    mc_ldmatrix_x4(a, a);
    mc_mma_m16n8k16_f16(a, a, a, a);
}
extern "C" __global__ void k1_relu(float* a) { a[0] = 0; }
"""


def test_each_kernel_source_and_what_it_asks_for():
    kernels = sass.kernel_sources(SOURCE)
    assert list(kernels) == ["k0_mm", "k1_relu"]
    assert sass.intended_opcodes(kernels["k0_mm"]) == {"HMMA", "LDSM", "LDGSTS"}
    assert sass.intended_opcodes(kernels["k1_relu"]) == set()  # the header's helper is not a call


MMA_KERNEL = """
__device__ void mc_mma_m16n8k16_f16(float* d, const unsigned* a, const unsigned* b) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}
extern "C" __global__ void with_mma(float* d, const unsigned* a, const unsigned* b) {
    mc_mma_m16n8k16_f16(d + 4 * threadIdx.x, a + 4 * threadIdx.x, b + 2 * threadIdx.x);
}
extern "C" __global__ void claims_ldmatrix(float* d) {
    // a kernel whose source names a helper the machine code does not contain
    if (d == nullptr) { /* mc_ldmatrix_x4 */ }
    d[threadIdx.x] = 1.0f;
}
"""


def test_the_check_finds_the_mma_and_flags_a_missing_instruction(tmp_path):
    binary = binary_for_sass(MMA_KERNEL, "sm_90", str(tmp_path))
    reports = {r.kernel: r for r in sass.check_kernels(MMA_KERNEL, binary.cubin)}
    assert reports["with_mma"].ok and reports["with_mma"].counts["HMMA"] >= 1
    assert reports["with_mma"].intended == ("HMMA",)
    assert not reports["claims_ldmatrix"].ok and reports["claims_ldmatrix"].missing == ("LDSM",)


CLASS_SNIPPET = """
        /*0040*/                   I2F.U32.RP R6, R5 ;
        /*0050*/                   MUFU.RCP R6, R6 ;
        /*0060*/                   F2I.FTZ.U32.TRUNC.NTZ R7, R6 ;
        /*0070*/                   I2FP.F32.S32 R8, R2 ;
        /*0080*/                   IMAD.WIDE R2, R0, 0x4, R2 ;
        /*0090*/                   LEA.HI.X R3, R0, R3, R4, 0x2, P0 ;
        /*00a0*/                   HADD2.F32 R9, -RZ, R9.H0_H0 ;
        /*00b0*/                   F2FP.F16.F32.PACK_AB R9, RZ, R9 ;
        /*00c0*/               @P1 LDG.E.128 R4, desc[UR4][R2.64] ;
        /*00d0*/                   STL [R1], R4 ;
        /*00e0*/                   CALL.REL.NOINC 0x200 ;
        /*00f0*/                   F2F.F64.F32 R10, R8 ;
        /*0100*/                   F2F.F16.F64 R12, R10 ;
"""


def test_instruction_classes_read_the_modifiers():
    counts = sass.full_opcode_counts(CLASS_SNIPPET)
    assert counts["I2F.U32.RP"] == 1 and counts["LDG.E.128"] == 1 and counts["MUFU.RCP"] == 1
    classes = sass.instruction_classes(counts)
    assert list(classes) == list(sass.INSTRUCTION_CLASSES)
    assert classes["integer divide"] == 1 and classes["special function"] == 1
    # The division's I2F and F2I are its own; the I2FP is the kernel's conversion.
    assert classes["int<->float conversion"] == 1
    # f32 -> f64 is no half conversion; f64 -> f16 is.
    assert classes["half conversion"] == 3 and classes["F2FP"] == 1 and classes["F2F"] == 2
    assert classes["global load"] == classes["global load 128-bit"] == 1
    assert classes["wide integer multiply"] == classes["64-bit integer add"] == 1
    assert classes["local (spill) access"] == 1 and classes["calls"] == 1
    assert classes["tensor core"] == 0


# Kernels that each show one instruction class. NVRTC has no cuda_fp16.h here: the half
# conversions are the PTX that __float2half and __half2float are made of.
CLASS_KERNELS = r"""
typedef unsigned short u16;
__device__ u16 f2h(float x) { u16 h; asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(x)); return h; }
__device__ float h2f(u16 h) { float x; asm("cvt.f32.f16 %0, %1;" : "=f"(x) : "h"(h)); return x; }
extern "C" __global__ void udiv(unsigned* a, unsigned n) { a[threadIdx.x] /= n; }
extern "C" __global__ void divmod(int* a, int n) {
    int i = a[threadIdx.x];
    a[threadIdx.x] = i / n + i % n;
}
extern "C" __global__ void by_constant(int* a) { a[threadIdx.x] /= 7; }
extern "C" __global__ void div64(long long* a, long long n) { a[threadIdx.x] /= n; }
extern "C" __global__ void halves(const float* x, u16* y) {
    y[threadIdx.x] = f2h(h2f(y[threadIdx.x]) + x[threadIdx.x]);
}
extern "C" __global__ void convert(const int* a, float* b) {
    b[threadIdx.x] = (float)a[threadIdx.x];
    ((int*)b)[threadIdx.x + 32] = (int)b[threadIdx.x + 64];
}
extern "C" __global__ void index32(const float* a, float* b, int n) {
    b[threadIdx.x] = a[threadIdx.x * n];
}
extern "C" __global__ void index64(const float* a, float* b, int n) {
    b[threadIdx.x] = a[(long long)threadIdx.x * n];
}
extern "C" __global__ void local_array(float* a, int k) {
    float t[256];  // indexed at run time: it lives in local memory
    for (int j = 0; j < 256; ++j) t[j] = a[j * blockDim.x + threadIdx.x];
    t[k & 255] += 1.0f;
    float s = 0.0f;
    for (int j = 0; j < 256; ++j) s += t[j] * t[(j * k) & 255];
    a[threadIdx.x] = s;
}
extern "C" __global__ void vector_copy(const float4* a, float4* b) {
    __shared__ float4 s[128];
    s[threadIdx.x] = a[threadIdx.x];
    __syncthreads();
    b[threadIdx.x] = s[127 - threadIdx.x];
}
extern "C" __global__ void sfu(float* a) { a[threadIdx.x] = __expf(a[threadIdx.x]); }
extern "C" __global__ void tensor(float* d, const unsigned* b, const float* g) {
    __shared__ __align__(16) unsigned s[512];
    unsigned dst = (unsigned)__cvta_generic_to_shared(s + 4 * threadIdx.x);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" :: "r"(dst), "l"(g + 4 * threadIdx.x));
    asm volatile("cp.async.wait_all;");
    __syncthreads();
    unsigned a0, a1, a2, a3;
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(a0), "=r"(a1), "=r"(a2), "=r"(a3) : "r"(dst));
    float* e = d + 4 * threadIdx.x;
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(e[0]), "+f"(e[1]), "+f"(e[2]), "+f"(e[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b[0]), "r"(b[1]));
}
"""


@pytest.fixture(scope="module", params=["sm_80", "sm_90"])
def classes(request, tmp_path_factory):
    """Each CLASS_KERNELS kernel's instruction classes, compiled for one architecture."""
    binary = binary_for_sass(CLASS_KERNELS, request.param, str(tmp_path_factory.mktemp("cubins")))
    return {
        name: sass.instruction_classes(sass.full_opcode_counts(text))
        for name, text in sass.disassemble(binary.cubin).items()
    }


def test_integer_division_by_a_runtime_value_is_counted(classes):
    assert classes["udiv"]["integer divide"] == 1
    assert classes["divmod"]["integer divide"] == 1  # quotient and remainder share one
    assert classes["by_constant"]["integer divide"] == 0  # a multiply-high instead
    # 64-bit: the subroutine and its 32-bit fast path, reached by a call.
    assert classes["div64"]["integer divide"] == 2 and classes["div64"]["calls"] == 1
    assert classes["udiv"]["int<->float conversion"] == 0  # the division's I2F and F2I


def test_conversions(classes):
    assert classes["halves"]["half conversion"] == 2 and classes["halves"]["F2FP"] == 1
    assert classes["convert"]["int<->float conversion"] == 2


def test_64_bit_index_arithmetic(classes):
    assert classes["index64"]["wide integer multiply"] >= 1
    assert classes["index64"]["64-bit integer add"] > classes["index32"]["64-bit integer add"]


def test_local_memory_accesses(classes):
    assert classes["local_array"]["local (spill) access"] > 0
    assert classes["vector_copy"]["local (spill) access"] == 0


def test_memory_barrier_and_special_function_classes(classes):
    copy = classes["vector_copy"]
    assert copy["global load 128-bit"] == copy["global store 128-bit"] == 1
    assert copy["shared 128-bit"] == 2 and copy["barrier"] == 1
    assert classes["sfu"]["special function"] == 1


def test_tensor_core_classes(classes):
    tensor = classes["tensor"]
    assert tensor["tensor core"] == tensor["ldmatrix"] == tensor["async copy"] == 1
