/* minicomp CUDA tensor-core and async-copy helpers: the device functions behind the kernel-IR
   intrinsics mma_sync_m16n8k16, mma_sync_m16n8k32 (8-bit integers; float8 from sm_89 on),
   ldmatrix_x{1,2,4}[_trans] and cp_async_* (rendered by intrinsics_mma.py). Generated sources
   carry this text after device.h. On the GPU each helper is one PTX instruction in inline
   asm, for sm_80 and newer only (an older architecture gets no definition, so a kernel using
   one fails to compile, naming it). Under the emulator (MC_EMULATE) emu_mma.h defines the
   same names on the host, with the same meaning.

   Operands are C arrays, never packed registers: fragments are uint16_t bit patterns (f16 or
   bf16), bytes (8-bit integers, float8), floats and int32s, packed into the .b32 registers
   PTX wants here, two halves or four bytes a register, the lower index in the low bits
   ("elements low to high" in the PTX ISA's tables). Packing element by element keeps any
   index valid (no 4-byte alignment needed) and lets the compiler keep a register array with
   constant indices in registers. */
#ifndef MINICOMP_MMA_H
#define MINICOMP_MMA_H

#if !defined(MC_EMULATE) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800

MC_DEVICE uint32_t mc_pack_u16x2(const uint16_t* p) {
    return (uint32_t)p[0] | ((uint32_t)p[1] << 16);
}

MC_DEVICE void mc_unpack_u16x2(void* dst, uint32_t r) {
    ((uint16_t*)dst)[0] = (uint16_t)(r & 0xffffu);
    ((uint16_t*)dst)[1] = (uint16_t)(r >> 16);
}

MC_DEVICE uint32_t mc_pack_u8x4(const void* p) {
    const uint8_t* b = (const uint8_t*)p;
    return (uint32_t)b[0] | ((uint32_t)b[1] << 8) | ((uint32_t)b[2] << 16) | ((uint32_t)b[3] << 24);
}

MC_DEVICE void mc_unpack_u8x4(void* dst, uint32_t r) {
    uint8_t* b = (uint8_t*)dst;
    b[0] = (uint8_t)(r & 0xffu);
    b[1] = (uint8_t)((r >> 8) & 0xffu);
    b[2] = (uint8_t)((r >> 16) & 0xffu);
    b[3] = (uint8_t)(r >> 24);
}

/* The .shared address of a generic pointer into shared memory. */
MC_DEVICE uint32_t mc_shared_address(const void* p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* ---- mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32: D = A * B + C ----
   a: this lane's 8 A elements (a0..a7), b: its 4 B elements (b0..b3), c and d: its 4
   accumulators (c0..c3); d may be c. The fragment layouts are the PTX ISA's (see
   intrinsics_mma.py for the table). */
#define MC_MMA_M16N8K16(S)                                                                  \
    MC_DEVICE void mc_mma_m16n8k16_##S(float* d, const uint16_t* a, const uint16_t* b,      \
                                       const float* c) {                                    \
        float d0, d1, d2, d3;                                                               \
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." #S "." #S ".f32 "             \
                     "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n" \
                     : "=f"(d0), "=f"(d1), "=f"(d2), "=f"(d3)                               \
                     : "r"(mc_pack_u16x2(a)), "r"(mc_pack_u16x2(a + 2)),                    \
                       "r"(mc_pack_u16x2(a + 4)), "r"(mc_pack_u16x2(a + 6)),                \
                       "r"(mc_pack_u16x2(b)), "r"(mc_pack_u16x2(b + 2)), "f"(c[0]),         \
                       "f"(c[1]), "f"(c[2]), "f"(c[3]));                                    \
        d[0] = d0;                                                                          \
        d[1] = d1;                                                                          \
        d[2] = d2;                                                                          \
        d[3] = d3;                                                                          \
    }
MC_MMA_M16N8K16(f16)
MC_MMA_M16N8K16(bf16)
#undef MC_MMA_M16N8K16

/* ---- mma.sync.aligned.m16n8k32.row.col.s32.{s8,u8}.{s8,u8}.s32: D = A * B + C ----
   a: this lane's 16 A bytes (a0..a15), b: its 8 B bytes (b0..b7), c and d: its 4 int32
   accumulators; d may be c. No .satfinite: sums wrap modulo 2^32, as PyTorch's int32 does. */
#define MC_MMA_M16N8K32(A, TA, B, TB)                                                        \
    MC_DEVICE void mc_mma_m16n8k32_##A##B(int32_t* d, const TA* a, const TB* b,              \
                                          const int32_t* c) {                                \
        int32_t d0, d1, d2, d3;                                                              \
        asm volatile("mma.sync.aligned.m16n8k32.row.col.s32." #A "." #B ".s32 "              \
                     "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n" \
                     : "=r"(d0), "=r"(d1), "=r"(d2), "=r"(d3)                                \
                     : "r"(mc_pack_u8x4(a)), "r"(mc_pack_u8x4(a + 4)),                       \
                       "r"(mc_pack_u8x4(a + 8)), "r"(mc_pack_u8x4(a + 12)),                  \
                       "r"(mc_pack_u8x4(b)), "r"(mc_pack_u8x4(b + 4)), "r"(c[0]), "r"(c[1]), \
                       "r"(c[2]), "r"(c[3]));                                                \
        d[0] = d0;                                                                           \
        d[1] = d1;                                                                           \
        d[2] = d2;                                                                           \
        d[3] = d3;                                                                           \
    }
MC_MMA_M16N8K32(s8, int8_t, s8, int8_t)
MC_MMA_M16N8K32(s8, int8_t, u8, uint8_t)
MC_MMA_M16N8K32(u8, uint8_t, s8, int8_t)
MC_MMA_M16N8K32(u8, uint8_t, u8, uint8_t)
#undef MC_MMA_M16N8K32

/* ---- mma.sync.aligned.m16n8k32.row.col.f32.{e4m3,e5m2}.{e4m3,e5m2}.f32: D = A * B + C ----
   The same fragments of float8 bytes (float8_e4m3fn, float8_e5m2), summed in f32: a, b as
   above, c and d this lane's 4 float accumulators. PTX has it from sm_89 on (sm_89: QMMA;
   sm_90 unpacks the bytes to f16 and runs two HMMA.16816). For older architectures each helper
   is a template that fails to compile once a kernel calls it, saying why. */
#if __CUDA_ARCH__ >= 890
#define MC_MMA_M16N8K32_F8(A, B)                                                             \
    MC_DEVICE void mc_mma_m16n8k32_##A##B(float* d, const uint8_t* a, const uint8_t* b,      \
                                          const float* c) {                                  \
        float d0, d1, d2, d3;                                                                \
        asm volatile("mma.sync.aligned.m16n8k32.row.col.f32." #A "." #B ".f32 "             \
                     "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%10, %11, %12, %13};\n" \
                     : "=f"(d0), "=f"(d1), "=f"(d2), "=f"(d3)                                \
                     : "r"(mc_pack_u8x4(a)), "r"(mc_pack_u8x4(a + 4)),                       \
                       "r"(mc_pack_u8x4(a + 8)), "r"(mc_pack_u8x4(a + 12)),                  \
                       "r"(mc_pack_u8x4(b)), "r"(mc_pack_u8x4(b + 4)), "f"(c[0]), "f"(c[1]), \
                       "f"(c[2]), "f"(c[3]));                                                \
        d[0] = d0;                                                                           \
        d[1] = d1;                                                                           \
        d[2] = d2;                                                                           \
        d[3] = d3;                                                                           \
    }
#else
#define MC_MMA_M16N8K32_F8(A, B)                                                             \
    template <bool MC_SM89 = false>                                                          \
    MC_DEVICE void mc_mma_m16n8k32_##A##B(float*, const uint8_t*, const uint8_t*,            \
                                          const float*) {                                    \
        static_assert(MC_SM89, "mma_sync_m16n8k32 of float8 operands (PTX mma.sync.aligned."  \
                               "m16n8k32.row.col.f32." #A "." #B ".f32) needs sm_89 or "    \
                               "newer; this kernel is compiled for an older architecture"); \
    }
#endif
MC_MMA_M16N8K32_F8(e4m3, e4m3)
MC_MMA_M16N8K32_F8(e4m3, e5m2)
MC_MMA_M16N8K32_F8(e5m2, e4m3)
MC_MMA_M16N8K32_F8(e5m2, e5m2)
#undef MC_MMA_M16N8K32_F8

/* ---- ldmatrix.sync.aligned.m8n8.{x1,x2,x4}{,.trans}.shared.b16 ----
   `row` is the address this lane gives (the start of a 16-byte matrix row: lanes 8i..8i+7 name
   the rows of matrix i); `dst` receives 2 elements a matrix, matrix i at dst[2i], dst[2i+1].
   The "memory" clobber keeps earlier shared-memory stores before the load. */
MC_DEVICE void mc_ldmatrix_x1(void* dst, const void* row) {
    uint32_t r0;
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n"
                 : "=r"(r0)
                 : "r"(mc_shared_address(row))
                 : "memory");
    mc_unpack_u16x2(dst, r0);
}
MC_DEVICE void mc_ldmatrix_x1_trans(void* dst, const void* row) {
    uint32_t r0;
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n"
                 : "=r"(r0)
                 : "r"(mc_shared_address(row))
                 : "memory");
    mc_unpack_u16x2(dst, r0);
}
MC_DEVICE void mc_ldmatrix_x2(void* dst, const void* row) {
    uint32_t r0, r1;
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r0), "=r"(r1)
                 : "r"(mc_shared_address(row))
                 : "memory");
    mc_unpack_u16x2(dst, r0);
    mc_unpack_u16x2((uint16_t*)dst + 2, r1);
}
MC_DEVICE void mc_ldmatrix_x2_trans(void* dst, const void* row) {
    uint32_t r0, r1;
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r0), "=r"(r1)
                 : "r"(mc_shared_address(row))
                 : "memory");
    mc_unpack_u16x2(dst, r0);
    mc_unpack_u16x2((uint16_t*)dst + 2, r1);
}
MC_DEVICE void mc_ldmatrix_x4(void* dst, const void* row) {
    uint32_t r0, r1, r2, r3;
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(mc_shared_address(row))
                 : "memory");
    mc_unpack_u16x2(dst, r0);
    mc_unpack_u16x2((uint16_t*)dst + 2, r1);
    mc_unpack_u16x2((uint16_t*)dst + 4, r2);
    mc_unpack_u16x2((uint16_t*)dst + 6, r3);
}
MC_DEVICE void mc_ldmatrix_x4_trans(void* dst, const void* row) {
    uint32_t r0, r1, r2, r3;
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r0), "=r"(r1), "=r"(r2), "=r"(r3)
                 : "r"(mc_shared_address(row))
                 : "memory");
    mc_unpack_u16x2(dst, r0);
    mc_unpack_u16x2((uint16_t*)dst + 2, r1);
    mc_unpack_u16x2((uint16_t*)dst + 4, r2);
    mc_unpack_u16x2((uint16_t*)dst + 6, r3);
}

/* The same loads into 8-bit elements (the _b8 forms, no .trans): dst receives 4 bytes a
   matrix, register by register, byte by byte (a byte array has no alignment to rely on). */
#define MC_LDMATRIX_B8(NAME, REGS)                                                         \
    MC_DEVICE void mc_ldmatrix_##NAME##_b8(void* dst, const void* row) {                   \
        uint32_t r[4];                                                                     \
        uint16_t halves[8];                                                                \
        mc_ldmatrix_##NAME(halves, row);                                                   \
        for (int i = 0; i < REGS; i++) r[i] = mc_pack_u16x2(halves + 2 * i);              \
        for (int i = 0; i < REGS; i++) mc_unpack_u8x4((uint8_t*)dst + 4 * i, r[i]);        \
    }
MC_LDMATRIX_B8(x1, 1)
MC_LDMATRIX_B8(x2, 2)
MC_LDMATRIX_B8(x4, 4)
#undef MC_LDMATRIX_B8

/* ---- cp.async: global -> shared copies, completed by commit/wait groups ----
   16 bytes bypass L1 (.cg); 4 and 8 bytes can only be .ca. The _zfill forms copy the first
   `src_bytes` (0 to the size) and fill the rest of the destination with zeros, which lets a
   tile load past the end of a tensor without reading there. Both addresses are aligned to the
   copy size. The "memory" clobbers keep the compiler from moving shared-memory accesses across
   the copies and the waits. */
#define MC_CP_ASYNC(NAME, CACHE, N)                                                         \
    MC_DEVICE void mc_cp_async_##NAME(void* dst, const void* src) {                         \
        asm volatile("cp.async." #CACHE ".shared.global [%0], [%1], " #N ";\n"              \
                     :                                                                      \
                     : "r"(mc_shared_address(dst)), "l"(src)                                \
                     : "memory");                                                           \
    }                                                                                       \
    MC_DEVICE void mc_cp_async_##NAME##_zfill(void* dst, const void* src, int src_bytes) {  \
        asm volatile("cp.async." #CACHE ".shared.global [%0], [%1], " #N ", %2;\n"          \
                     :                                                                      \
                     : "r"(mc_shared_address(dst)), "l"(src), "r"(src_bytes)                \
                     : "memory");                                                           \
    }
MC_CP_ASYNC(ca4, ca, 4)
MC_CP_ASYNC(ca8, ca, 8)
MC_CP_ASYNC(cg16, cg, 16)
#undef MC_CP_ASYNC

MC_DEVICE void mc_cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

/* Waits until at most N of this thread's committed groups are pending. */
template <int N>
MC_DEVICE void mc_cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

MC_DEVICE void mc_cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

#endif /* sm_80 and newer, not emulated */
#endif /* MINICOMP_MMA_H */
