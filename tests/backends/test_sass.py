"""Reading SASS: opcode counts, each kernel's source, and the check that the instructions a
kernel's source asked for are in the cubin NVRTC built."""

import pytest

from minicomp.backends.cuda import nvrtc, sass

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
    if sass.find_tool("cuobjdump") is None:
        pytest.skip("cuobjdump is not installed (the `sass` extra)")
    try:
        binary = nvrtc.compile_cuda(MMA_KERNEL, arch="sm_90", cache_dir=str(tmp_path))
    except nvrtc.NvrtcUnavailableError as err:  # pragma: no cover - depends on the machine
        pytest.skip(str(err))
    reports = {r.kernel: r for r in sass.check_kernels(MMA_KERNEL, binary.cubin)}
    assert reports["with_mma"].ok and reports["with_mma"].counts["HMMA"] >= 1
    assert reports["with_mma"].intended == ("HMMA",)
    assert not reports["claims_ldmatrix"].ok and reports["claims_ldmatrix"].missing == ("LDSM",)
