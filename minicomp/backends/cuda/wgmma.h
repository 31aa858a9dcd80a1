/* minicomp CUDA warpgroup MMA helpers (sm_90a): the device code behind the kernel-IR
   intrinsics wgmma_fence, wgmma_commit_group, wgmma_wait_group and wgmma_mma_async (rendered
   by intrinsics_wgmma.py as calls of the lower-case macros below). Generated sources carry
   this text after mma.h, whose mc_shared_address it uses. wgmma exists only in the
   architecture-specific sm_90a (NVRTC defines __CUDA_ARCH_FEAT_SM90_ALL for it); compiled for
   anything else each helper is a template whose static_assert names the primitive and sm_90a,
   so a kernel using one fails to compile saying so. Under the emulator (MC_EMULATE)
   emu_wgmma.h defines the same macros.

   An mma_async (m64nNk16 of f16/bf16, m64nNk32 of float8) takes this thread's N/2 f32
   accumulators as a register array, and builds the two 64-bit shared-memory matrix
   descriptors from the operands' addresses and the byte offsets the script's layout gives: bits 0-13 the start address >> 4, 16-29 the leading
   byte offset >> 4, 32-45 the stride byte offset >> 4, 62-63 the swizzle mode (0 none, 1
   128-byte, 2 64-byte, 3 32-byte); the base offset (bits 49-51) stays 0, so a swizzled
   operand starts in the first row of an aligned swizzle pattern. The operand lists of each N
   below are mechanical: N/2 "+f" registers, then the descriptors (or A's four registers and
   B's descriptor) and the scale-d flag. */
#ifndef MINICOMP_WGMMA_H
#define MINICOMP_WGMMA_H

#if !defined(MC_EMULATE) && defined(__CUDA_ARCH__)

#define mc_wgmma_fence() mc_wgmma_fence_<>()
#define mc_wgmma_commit_group() mc_wgmma_commit_group_<>()
#define mc_wgmma_wait_group(N) mc_wgmma_wait_group_<N>()
#define mc_wgmma_wait_group_fenced(N, COUNT, acc) mc_wgmma_wait_group_fenced_<N, COUNT>(acc)
#define mc_wgmma_mma_async(N, KIND, TRANS, d, a, ai, lbo_a, sbo_a, b, bi, lbo_b, sbo_b, mode, \
                           scale)                                                              \
    mc_wgmma_mma_async_<N, KIND, TRANS>(d, &(a)[ai], lbo_a, sbo_a, &(b)[bi], lbo_b, sbo_b, mode, \
                                        scale)
#define mc_wgmma_mma_async_rs(N, KIND, TRANS_B, d, a, ai, b, bi, lbo_b, sbo_b, mode, scale) \
    mc_wgmma_mma_async_rs_<N, KIND, TRANS_B>(d, &(a)[ai], &(b)[bi], lbo_b, sbo_b, mode, scale)

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)

template <int Unused = 0>
MC_DEVICE void mc_wgmma_fence_() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}

template <int Unused = 0>
MC_DEVICE void mc_wgmma_commit_group_() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

template <int N>
MC_DEVICE void mc_wgmma_wait_group_() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

/* An empty asm on each of COUNT registers from acc[I], so that no access of them moves across
   it (recursion, not a loop: every index a constant). */
template <int I, int COUNT>
struct McFenceRegisters {
    MC_DEVICE void run(float* acc) {
        asm volatile("" : "+f"(acc[I])::"memory");
        McFenceRegisters<I + 1, COUNT>::run(acc);
    }
};
template <int COUNT>
struct McFenceRegisters<COUNT, COUNT> {
    MC_DEVICE void run(float*) {}
};

/* The wait, then the accumulator's registers fenced, so that no read of them moves above it. */
template <int N, int COUNT>
MC_DEVICE void mc_wgmma_wait_group_fenced_(float* acc) {
    mc_wgmma_wait_group_<N>();
    McFenceRegisters<0, COUNT>::run(acc);
}

MC_DEVICE uint64_t mc_wgmma_desc(const void* p, uint32_t lbo, uint32_t sbo, uint32_t mode) {
    return (uint64_t)((mc_shared_address(p) & 0x3ffffu) >> 4) |
           ((uint64_t)((lbo >> 4) & 0x3fffu) << 16) | ((uint64_t)((sbo >> 4) & 0x3fffu) << 32) |
           ((uint64_t)mode << 62);
}

/* wgmma.mma_async.sync.aligned.m64nNkK.f32.A.B with both operands from shared memory, scale-a
   and scale-b 1, scale-d from a register. KIND: 0 f16, 1 bf16 (k16); 2 e4m3.e4m3, 3 e4m3.e5m2,
   4 e5m2.e4m3, 5 e5m2.e5m2 (k32, float8). TRANS: 2 * imm-trans-a + imm-trans-b, 1 where that
   operand is MN-major (16-bit types only: float8 has no transpose operands). */
template <int N, int KIND, int TRANS>
struct McWgmma;

/* The same with A from registers: this thread's 8 f16/bf16 elements as four .f16x2 registers
   (the accumulator's layout, so an f32 accumulator converted pairwise is such an A), B from
   shared memory, K-major (TRANS_B 0) or MN-major (1). A wgmma.fence in the same asm, after the
   registers are packed: ptxas places the packing where it likes, after the script's
   wgmma_fence too, and then inserts a fence of its own that serializes the mma's in flight
   (C7519, an attention's next S = Q K^T during its softmax). */
template <int N, int KIND, int TRANS_B>
struct McWgmmaRs;

#define MC_WGMMA_KIND(N, KIND, TRANS, SHAPE, TRANS_TEXT)                                       \
    template <>                                                                                \
    struct McWgmma<N, KIND, TRANS> {                                                           \
        MC_DEVICE void run(float* d, uint64_t da, uint64_t db, int scale_d) {                  \
            asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, " MC_WG_SCALE_##N ", 0;\n"         \
                         " wgmma.mma_async.sync.aligned.m64n" #N SHAPE " {" MC_WG_REGS_##N      \
                         "}, " MC_WG_TAIL_##N TRANS_TEXT ";\n}\n"                               \
                         : MC_WG_OUTS_##N                                                      \
                         : "l"(da), "l"(db), "r"(scale_d)                                      \
                         : "memory");                                                          \
        }                                                                                      \
    };
#define MC_WGMMA_RS_KIND(N, KIND, TRANS_B, SHAPE, TRANS_TEXT)                                  \
    template <>                                                                                \
    struct McWgmmaRs<N, KIND, TRANS_B> {                                                       \
        MC_DEVICE void run(float* d, const uint16_t* a, uint64_t db, int scale_d) {            \
            asm volatile("{\n .reg .pred p;\n setp.ne.b32 p, " MC_WG_RS_SCALE_##N ", 0;\n"      \
                         " wgmma.fence.sync.aligned;\n"                                        \
                         " wgmma.mma_async.sync.aligned.m64n" #N SHAPE " {" MC_WG_REGS_##N      \
                         "}, " MC_WG_RS_TAIL_##N TRANS_TEXT ";\n}\n"                            \
                         : MC_WG_OUTS_##N                                                      \
                         : "r"(mc_pack_u16x2(a)), "r"(mc_pack_u16x2(a + 2)),                   \
                           "r"(mc_pack_u16x2(a + 4)), "r"(mc_pack_u16x2(a + 6)), "l"(db),      \
                           "r"(scale_d)                                                        \
                         : "memory");                                                          \
        }                                                                                      \
    };
#define MC_WGMMA_SIXTEEN(N, KIND, SHAPE)                    \
    MC_WGMMA_KIND(N, KIND, 0, SHAPE, ", 0, 0")              \
    MC_WGMMA_KIND(N, KIND, 1, SHAPE, ", 0, 1")              \
    MC_WGMMA_KIND(N, KIND, 2, SHAPE, ", 1, 0")              \
    MC_WGMMA_KIND(N, KIND, 3, SHAPE, ", 1, 1")              \
    MC_WGMMA_RS_KIND(N, KIND, 0, SHAPE, ", 0")              \
    MC_WGMMA_RS_KIND(N, KIND, 1, SHAPE, ", 1")
#define MC_WGMMA_N(N)                                          \
    MC_WGMMA_SIXTEEN(N, 0, "k16.f32.f16.f16")                  \
    MC_WGMMA_SIXTEEN(N, 1, "k16.f32.bf16.bf16")                \
    MC_WGMMA_KIND(N, 2, 0, "k32.f32.e4m3.e4m3", "")            \
    MC_WGMMA_KIND(N, 3, 0, "k32.f32.e4m3.e5m2", "")            \
    MC_WGMMA_KIND(N, 4, 0, "k32.f32.e5m2.e4m3", "")            \
    MC_WGMMA_KIND(N, 5, 0, "k32.f32.e5m2.e5m2", "")

#define MC_WG_REGS_8 \
    "%0, %1, %2, %3"
#define MC_WG_TAIL_8 "%4, %5, p, 1, 1"
#define MC_WG_SCALE_8 "%6"
#define MC_WG_OUTS_8 \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
#define MC_WG_RS_TAIL_8 "{%4, %5, %6, %7}, %8, p, 1, 1"
#define MC_WG_RS_SCALE_8 "%9"
MC_WGMMA_N(8)

#define MC_WG_REGS_16 \
    "%0, %1, %2, %3, %4, %5, %6, %7"
#define MC_WG_TAIL_16 "%8, %9, p, 1, 1"
#define MC_WG_SCALE_16 "%10"
#define MC_WG_OUTS_16 \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), \
    "+f"(d[7])
#define MC_WG_RS_TAIL_16 "{%8, %9, %10, %11}, %12, p, 1, 1"
#define MC_WG_RS_SCALE_16 "%13"
MC_WGMMA_N(16)

#define MC_WG_REGS_32 \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
#define MC_WG_TAIL_32 "%16, %17, p, 1, 1"
#define MC_WG_SCALE_32 "%18"
#define MC_WG_OUTS_32 \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), \
    "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), \
    "+f"(d[14]), "+f"(d[15])
#define MC_WG_RS_TAIL_32 "{%16, %17, %18, %19}, %20, p, 1, 1"
#define MC_WG_RS_SCALE_32 "%21"
MC_WGMMA_N(32)

#define MC_WG_REGS_64 \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, " \
    "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define MC_WG_TAIL_64 "%32, %33, p, 1, 1"
#define MC_WG_SCALE_64 "%34"
#define MC_WG_OUTS_64 \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), \
    "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), \
    "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), \
    "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), \
    "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define MC_WG_RS_TAIL_64 "{%32, %33, %34, %35}, %36, p, 1, 1"
#define MC_WG_RS_SCALE_64 "%37"
MC_WGMMA_N(64)

#define MC_WG_REGS_96 \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, " \
    "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, " \
    "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47"
#define MC_WG_TAIL_96 "%48, %49, p, 1, 1"
#define MC_WG_SCALE_96 "%50"
#define MC_WG_OUTS_96 \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), \
    "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), \
    "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), \
    "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), \
    "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
    "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), \
    "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), \
    "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47])
#define MC_WG_RS_TAIL_96 "{%48, %49, %50, %51}, %52, p, 1, 1"
#define MC_WG_RS_SCALE_96 "%53"
MC_WGMMA_N(96)

#define MC_WG_REGS_128 \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, " \
    "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, " \
    "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, " \
    "%53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
#define MC_WG_TAIL_128 "%64, %65, p, 1, 1"
#define MC_WG_SCALE_128 "%66"
#define MC_WG_OUTS_128 \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), \
    "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), \
    "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), \
    "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), \
    "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
    "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), \
    "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), \
    "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), \
    "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
    "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), \
    "+f"(d[62]), "+f"(d[63])
#define MC_WG_RS_TAIL_128 "{%64, %65, %66, %67}, %68, p, 1, 1"
#define MC_WG_RS_SCALE_128 "%69"
MC_WGMMA_N(128)

#define MC_WG_REGS_192 \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, " \
    "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, " \
    "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, " \
    "%53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, " \
    "%70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, " \
    "%87, %88, %89, %90, %91, %92, %93, %94, %95"
#define MC_WG_TAIL_192 "%96, %97, p, 1, 1"
#define MC_WG_SCALE_192 "%98"
#define MC_WG_OUTS_192 \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), \
    "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), \
    "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), \
    "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), \
    "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
    "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), \
    "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), \
    "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), \
    "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
    "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), \
    "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), \
    "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), \
    "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), \
    "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), \
    "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), \
    "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95])
#define MC_WG_RS_TAIL_192 "{%96, %97, %98, %99}, %100, p, 1, 1"
#define MC_WG_RS_SCALE_192 "%101"
MC_WGMMA_N(192)

#define MC_WG_REGS_256 \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, " \
    "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, " \
    "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, " \
    "%53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63, %64, %65, %66, %67, %68, %69, " \
    "%70, %71, %72, %73, %74, %75, %76, %77, %78, %79, %80, %81, %82, %83, %84, %85, %86, " \
    "%87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, %98, %99, %100, %101, %102, " \
    "%103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, %114, %115, %116, " \
    "%117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define MC_WG_TAIL_256 "%128, %129, p, 1, 1"
#define MC_WG_SCALE_256 "%130"
#define MC_WG_OUTS_256 \
    "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), \
    "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), \
    "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), \
    "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), \
    "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), \
    "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), \
    "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), \
    "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), \
    "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), \
    "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), \
    "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]), "+f"(d[66]), "+f"(d[67]), \
    "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]), "+f"(d[72]), "+f"(d[73]), \
    "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]), "+f"(d[78]), "+f"(d[79]), \
    "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]), "+f"(d[84]), "+f"(d[85]), \
    "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]), "+f"(d[90]), "+f"(d[91]), \
    "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]), "+f"(d[96]), "+f"(d[97]), \
    "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]), "+f"(d[102]), "+f"(d[103]), \
    "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]), "+f"(d[108]), "+f"(d[109]), \
    "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]), "+f"(d[114]), "+f"(d[115]), \
    "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]), "+f"(d[120]), "+f"(d[121]), \
    "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]), "+f"(d[126]), "+f"(d[127])
#define MC_WG_RS_TAIL_256 "{%128, %129, %130, %131}, %132, p, 1, 1"
#define MC_WG_RS_SCALE_256 "%133"
MC_WGMMA_N(256)

#undef MC_WGMMA_N
#undef MC_WGMMA_SIXTEEN
#undef MC_WGMMA_RS_KIND
#undef MC_WGMMA_KIND

template <int N, int KIND, int TRANS>
MC_DEVICE void mc_wgmma_mma_async_(float* d, const void* a, uint32_t lbo_a, uint32_t sbo_a,
                                   const void* b, uint32_t lbo_b, uint32_t sbo_b, uint32_t mode,
                                   int scale_d) {
    McWgmma<N, KIND, TRANS>::run(d, mc_wgmma_desc(a, lbo_a, sbo_a, mode),
                                 mc_wgmma_desc(b, lbo_b, sbo_b, mode), scale_d);
}

template <int N, int KIND, int TRANS_B>
MC_DEVICE void mc_wgmma_mma_async_rs_(float* d, const uint16_t* a, const void* b, uint32_t lbo_b,
                                      uint32_t sbo_b, uint32_t mode, int scale_d) {
    McWgmmaRs<N, KIND, TRANS_B>::run(d, a, mc_wgmma_desc(b, lbo_b, sbo_b, mode), scale_d);
}

#else /* not sm_90a: each helper fails to compile, naming itself */

#define MC_WGMMA_NEEDS_SM90A(NAME)                                                          \
    NAME "() needs sm_90a (wgmma exists only in the architecture-specific sm_90a target); " \
         "this kernel is compiled for another architecture"

template <int Arch = __CUDA_ARCH__>
MC_DEVICE void mc_wgmma_fence_() {
    static_assert(Arch < 0, MC_WGMMA_NEEDS_SM90A("wgmma_fence"));
}
template <int Arch = __CUDA_ARCH__>
MC_DEVICE void mc_wgmma_commit_group_() {
    static_assert(Arch < 0, MC_WGMMA_NEEDS_SM90A("wgmma_commit_group"));
}
template <int N>
MC_DEVICE void mc_wgmma_wait_group_() {
    static_assert(N < 0, MC_WGMMA_NEEDS_SM90A("wgmma_wait_group"));
}
template <int N, int COUNT>
MC_DEVICE void mc_wgmma_wait_group_fenced_(float*) {
    static_assert(N < 0, MC_WGMMA_NEEDS_SM90A("wgmma_wait_group"));
}
template <int N, int KIND, int TRANS>
MC_DEVICE void mc_wgmma_mma_async_(float*, const void*, uint32_t, uint32_t, const void*, uint32_t,
                                   uint32_t, uint32_t, int) {
    static_assert(N < 0, MC_WGMMA_NEEDS_SM90A("wgmma_mma_async"));
}
template <int N, int KIND, int TRANS_B>
MC_DEVICE void mc_wgmma_mma_async_rs_(float*, const uint16_t*, const void*, uint32_t, uint32_t,
                                      uint32_t, int) {
    static_assert(N < 0, MC_WGMMA_NEEDS_SM90A("wgmma_mma_async"));
}
#undef MC_WGMMA_NEEDS_SM90A

#endif /* sm_90a */
#endif /* not emulated */
#endif /* MINICOMP_WGMMA_H */
