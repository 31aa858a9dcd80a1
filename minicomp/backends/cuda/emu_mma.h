// minicomp cuda-emu: host versions of mma.h's tensor-core and async-copy helpers.
//
// Compiled after emu.h, whose fibers and warp barrier it builds on. mma.sync and ldmatrix are
// warp collectives: every lane puts its operands in a per-warp exchange slot and waits at the
// warp barrier; the last lane to arrive computes the whole warp's instruction from all 32
// slots and leaves each lane's result in its slot, before any lane goes on, as the hardware
// completes a warp instruction for all lanes at once (so a lane's later stores cannot reach
// another lane's ldmatrix). Slots are double-buffered by the warp's barrier count, as emu.h's
// shuffles are: a lane reuses a buffer only after every lane has passed the next barrier, so
// after every lane read its result from it. The tag of each lane's collective goes in emu.h's
// shuffle slot of the same barrier (zeroed for each block), and a lane that reached another
// collective (another mma type, a shuffle, __syncwarp) fails the block, since PTX leaves such
// a warp undefined.
//
// cp.async copies at issue. PTX makes the destination readable only after cp.async.wait_group
// (or wait_all) covers the copy, and changing the source or reading the destination before
// then is undefined, so a program with defined behaviour cannot tell an immediate copy from a
// late one: commit and wait do nothing here.
#ifndef MC_EMU_MMA_H
#define MC_EMU_MMA_H

namespace mc_emu {
namespace mma {

// One lane's operands, then its results, in a warp collective.
struct Slot {
    unsigned char bytes[48];
};
static const unsigned MAX_WARPS = 32;  // 1024 threads

// The exchange slots of one warp and one barrier parity (per OS thread, like a block).
static Slot* exchange(unsigned warp, unsigned parity) {
    std::vector<unsigned char>& slots = tls_worker->exchange;
    if (slots.empty()) slots.resize(MAX_WARPS * 2 * 32 * sizeof(Slot));
    return (Slot*)slots.data() + (warp * 2 + parity) * 32;
}

enum Op : unsigned {
    MMA_F16 = 1,
    MMA_BF16,
    LDMATRIX_X1,
    LDMATRIX_X2,
    LDMATRIX_X4,
    LDMATRIX_X1_TRANS,
    LDMATRIX_X2_TRANS,
    LDMATRIX_X4_TRANS,
    MMA_S8S8,
    MMA_S8U8,
    MMA_U8S8,
    MMA_U8U8,
    MMA_E4M3E4M3,
    MMA_E4M3E5M2,
    MMA_E5M2E4M3,
    MMA_E5M2E5M2,
    OP_END
};
static const char* const OP_NAMES[OP_END] = {
    "?",
    "mma.sync.m16n8k16.f16",
    "mma.sync.m16n8k16.bf16",
    "ldmatrix.x1",
    "ldmatrix.x2",
    "ldmatrix.x4",
    "ldmatrix.x1.trans",
    "ldmatrix.x2.trans",
    "ldmatrix.x4.trans",
    "mma.sync.m16n8k32.s8.s8",
    "mma.sync.m16n8k32.s8.u8",
    "mma.sync.m16n8k32.u8.s8",
    "mma.sync.m16n8k32.u8.u8",
    "mma.sync.m16n8k32.e4m3.e4m3",
    "mma.sync.m16n8k32.e4m3.e5m2",
    "mma.sync.m16n8k32.e5m2.e4m3",
    "mma.sync.m16n8k32.e5m2.e5m2",
};
static const uint64_t TAG_MAGIC = 0x6d63ull << 48;  // "mc": not a likely shuffled value

static inline uint64_t tag_of(unsigned op, unsigned gen) {
    return TAG_MAGIC | ((uint64_t)op << 32) | gen;
}

static const char* describe_tag(uint64_t tag) {
    unsigned op = (unsigned)(tag >> 32) & 0xffffu;
    if ((tag & (0xffffull << 48)) == TAG_MAGIC && op > 0 && op < OP_END) return OP_NAMES[op];
    return "a shuffle or __syncwarp";
}

// Ends the block with `message` (the first error stays); the fiber is never resumed.
static void fail(Block* b, Fiber* f, const std::string& message) {
    if (b->error.empty()) b->error = message;
    switch_away(b, f, false);
    abort();
}

static void check_same(Block* b, Fiber* f, Warp& w, unsigned parity, uint64_t tag) {
    for (unsigned i = 0; i < 32; i++) {
        if (w.slots[parity][i] == tag) continue;
        fail(b, f, format("lanes %u and %u of warp %u of block (%u,%u,%u) reach different warp "
                          "instructions (%s and %s); mma and ldmatrix need the whole warp at the "
                          "same one",
                          f->linear & 31, i, f->linear / 32, b->idx.x, b->idx.y, b->idx.z,
                          describe_tag(tag), describe_tag(w.slots[parity][i])));
    }
}

typedef void (*Compute)(Slot* lanes);

// This lane's part of warp collective `op`: `in` goes to its slot, `out` gets its result.
static void collective(unsigned op, const void* in, unsigned in_bytes, void* out,
                       unsigned out_bytes, Compute compute) {
    Block* b = tls_block;
    if (!b) throw PlainModeBarrier();
    Fiber* f = b->current;
    Warp& w = warp_of(b, f);
    if (w.active != 32) {
        fail(b, f, format("%s needs a full warp, but warp %u of block (%u,%u,%u) has %u threads",
                          OP_NAMES[op], f->linear / 32, b->idx.x, b->idx.y, b->idx.z, w.active));
    }
    unsigned lane = f->linear & 31;
    unsigned parity = w.gen & 1;
    uint64_t tag = tag_of(op, w.gen);
    Slot* slots = exchange(f->linear / 32, parity);
    memcpy(slots[lane].bytes, in, in_bytes);
    w.slots[parity][lane] = tag;
    if (w.arrived + 1 == w.active) {  // the last to arrive: the barrier releases after this
        check_same(b, f, w, parity, tag);
        compute(slots);
    }
    warp_barrier(b, f, w);
    check_same(b, f, w, parity, tag);  // the last lane may have been at another instruction
    memcpy(out, slots[lane].bytes, out_bytes);
}

// ---- mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32 ----

static inline float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exponent = (h >> 10) & 0x1fu, mantissa = h & 0x3ffu;
    if (exponent == 0) {  // zero or subnormal: mantissa * 2^-24, exact in float
        float v = (float)mantissa * 0x1p-24f;
        return sign ? -v : v;
    }
    uint32_t bits = exponent == 0x1f ? sign | 0x7f800000u | (mantissa << 13)
                                     : sign | ((exponent + 112u) << 23) | (mantissa << 13);
    return mc_emu_bit_cast<float>(bits);
}

static inline float bf16_to_f32(uint16_t h) { return mc_emu_bit_cast<float>((uint32_t)h << 16); }

struct MmaOperands {
    uint16_t a[8];
    uint16_t b[4];
    float c[4];
};
static_assert(sizeof(MmaOperands) <= sizeof(Slot), "mma operands fit a slot");

// Lane l's four outputs (c_i at row g + 8 * (i >> 1), column 2t + (i & 1), g = l >> 2,
// t = l % 4) into its slot: c plus the K exact products of A's row and B's column, added in
// k order, rounding to nearest after each addition.
template <unsigned K>
MC_LENS_UNINSTRUMENTED static inline void mma_tile_f32(const float (&A)[16][K],
                                                       const float (&B)[K][8], const float* c,
                                                       Slot& lane, unsigned l) {
    unsigned g = l >> 2, t = l & 3;
    float d[4];
    for (unsigned i = 0; i < 4; i++) {
        unsigned row = g + 8 * (i >> 1), col = 2 * t + (i & 1);
        float acc = c[i];
        for (unsigned k = 0; k < K; k++) {
            float product = A[row][k] * B[k][col];
            acc = acc + product;
        }
        d[i] = acc;
    }
    memcpy(lane.bytes, d, sizeof d);
}

// The fragment layouts are the PTX ISA's "Matrix Fragments for mma.m16n8k16 with floating
// point type", with g = lane >> 2 and t = lane % 4:
//   A (16x16, row): a_i at row g + 8 * ((i >> 1) & 1), column 2t + (i & 1) + 8 * (i >> 2)
//   B (16x8, col):  b_i at row 2t + (i & 1) + 8 * (i >> 1), column g
//   C, D (16x8):    c_i at row g + 8 * (i >> 1), column 2t + (i & 1)
// PTX asks for products "with at least single precision" and accumulation "with at least
// single precision", in an unspecified order and rounding. Here every product is exact in
// float (11x11 significant bits for f16; 8x8 for bf16, which only overflow or underflow can
// round) and each output is c, then the 16 products added in k order, rounding to nearest
// after each addition. Hardware keeps the exact products too but adds them in its own order
// with its own rounding, so the two agree exactly whenever every partial sum is a float, and
// otherwise differ by a few float ulps of the sum of |terms|.
template <float (*Widen)(uint16_t)>
MC_LENS_UNINSTRUMENTED static void mma_compute(Slot* lanes) {
    MmaOperands in[32];
    float A[16][16], B[16][8];
    for (unsigned l = 0; l < 32; l++) {
        memcpy(&in[l], lanes[l].bytes, sizeof in[l]);
        unsigned g = l >> 2, t = l & 3;
        for (unsigned i = 0; i < 8; i++) {
            A[g + 8 * ((i >> 1) & 1)][2 * t + (i & 1) + 8 * (i >> 2)] = Widen(in[l].a[i]);
        }
        for (unsigned i = 0; i < 4; i++) B[2 * t + (i & 1) + 8 * (i >> 1)][g] = Widen(in[l].b[i]);
    }
    for (unsigned l = 0; l < 32; l++) mma_tile_f32(A, B, in[l].c, lanes[l], l);
}

static inline void mma_m16n8k16(unsigned op, Compute compute, float* d, const uint16_t* a,
                                const uint16_t* b, const float* c) {
    MC_LENS_COUNT(LENS_MMA, 1);
    MmaOperands in;
    memcpy(in.a, a, sizeof in.a);
    memcpy(in.b, b, sizeof in.b);
    memcpy(in.c, c, sizeof in.c);  // before d is written: d may be c
    collective(op, &in, sizeof in, d, 4 * sizeof(float), compute);
}

// ---- mma.sync.aligned.m16n8k32.row.col.s32.{s8,u8}.{s8,u8}.s32 ----

struct IntMmaOperands {
    unsigned char a[16];
    unsigned char b[8];
    int32_t c[4];
};
static_assert(sizeof(IntMmaOperands) <= sizeof(Slot), "int8 mma operands fit a slot");

// An 8-bit operand's value: its byte read as a signed or an unsigned integer.
template <bool SIGNED>
static inline uint32_t widen8(unsigned char x) {
    return SIGNED ? (uint32_t)(int32_t)(int8_t)x : (uint32_t)x;
}

// The fragment layouts are the PTX ISA's "Matrix Fragments for mma.m16n8k32" (.s8/.u8),
// with g = lane >> 2 and t = lane % 4:
//   A (16x32, row): a_i at row g + 8 * ((i >> 2) & 1), column 4t + (i & 3) + 16 * (i >> 3)
//   B (32x8, col):  b_i at row 4t + (i & 3) + 16 * (i >> 2), column g
//   C, D (16x8):    c_i at row g + 8 * (i >> 1), column 2t + (i & 1)
// Integer products and sums are exact, so order does not matter; without .satfinite the
// result is the exact c + sum of products modulo 2^32, which is what unsigned 32-bit
// arithmetic computes (in any order) and what PyTorch's int32 matmul gives (its sums wrap).
template <bool A_SIGNED, bool B_SIGNED>
MC_LENS_UNINSTRUMENTED static void int_mma_compute(Slot* lanes) {
    IntMmaOperands in[32];
    uint32_t A[16][32], B[32][8];
    for (unsigned l = 0; l < 32; l++) {
        memcpy(&in[l], lanes[l].bytes, sizeof in[l]);
        unsigned g = l >> 2, t = l & 3;
        for (unsigned i = 0; i < 16; i++) {
            A[g + 8 * ((i >> 2) & 1)][4 * t + (i & 3) + 16 * (i >> 3)] =
                widen8<A_SIGNED>(in[l].a[i]);
        }
        for (unsigned i = 0; i < 8; i++) {
            B[4 * t + (i & 3) + 16 * (i >> 2)][g] = widen8<B_SIGNED>(in[l].b[i]);
        }
    }
    for (unsigned l = 0; l < 32; l++) {
        unsigned g = l >> 2, t = l & 3;
        int32_t d[4];
        for (unsigned i = 0; i < 4; i++) {
            unsigned row = g + 8 * (i >> 1), col = 2 * t + (i & 1);
            uint32_t acc = (uint32_t)in[l].c[i];
            for (unsigned k = 0; k < 32; k++) acc += A[row][k] * B[k][col];
            d[i] = (int32_t)acc;  // modulo 2^32 (two's complement, defined since C++20)
        }
        memcpy(lanes[l].bytes, d, sizeof d);
    }
}

static inline void mma_m16n8k32(unsigned op, Compute compute, int32_t* d, const void* a,
                                const void* b, const int32_t* c) {
    MC_LENS_COUNT(LENS_MMA, 1);
    IntMmaOperands in;
    memcpy(in.a, a, sizeof in.a);
    memcpy(in.b, b, sizeof in.b);
    memcpy(in.c, c, sizeof in.c);  // before d is written: d may be c
    collective(op, &in, sizeof in, d, 4 * sizeof(int32_t), compute);
}

// ---- mma.sync.aligned.m16n8k32.row.col.f32.{e4m3,e5m2}.{e4m3,e5m2}.f32 ----

struct Fp8MmaOperands {
    unsigned char a[16];
    unsigned char b[8];
    float c[4];
};
static_assert(sizeof(Fp8MmaOperands) <= sizeof(Slot), "float8 mma operands fit a slot");

// A float8 byte's value, exact in float (common.h's conversions come after this header, in the
// kernel's source): e4m3fn (bias 7, no infinity, 0x7f/0xff NaN) and e5m2 (bias 15, IEEE-like).
static inline float e4m3_to_f32(unsigned char x) {
    unsigned e = (x >> 3) & 0xfu, m = x & 7u;
    float v = (e == 0xfu && m == 7u) ? NAN : e ? ldexpf((float)(8u + m), (int)e - 10)
                                               : ldexpf((float)m, -9);
    return (x & 0x80u) ? -v : v;
}
static inline float e5m2_to_f32(unsigned char x) {
    unsigned e = (x >> 2) & 0x1fu, m = x & 3u;
    float v = e == 0x1fu ? (m ? NAN : INFINITY)
                         : e ? ldexpf((float)(4u + m), (int)e - 17) : ldexpf((float)m, -16);
    return (x & 0x80u) ? -v : v;
}

// The fragments are the .s8/.u8 ones above (one table in the PTX ISA). Every product of two
// float8 values is exact in float (4 x 4 significant bits at most, exponents within float's
// range); as for f16 (mma_compute), each output is c, then the 32 products added in k order,
// rounding to nearest after each addition. Hardware adds them in its own order and rounding
// (sm_90 as two f16 mma's of 16 products each), so the two agree whenever every partial sum is
// a float and otherwise differ by a few float ulps of the sum of |terms|.
template <float (*WidenA)(unsigned char), float (*WidenB)(unsigned char)>
MC_LENS_UNINSTRUMENTED static void fp8_mma_compute(Slot* lanes) {
    Fp8MmaOperands in[32];
    float A[16][32], B[32][8];
    for (unsigned l = 0; l < 32; l++) {
        memcpy(&in[l], lanes[l].bytes, sizeof in[l]);
        unsigned g = l >> 2, t = l & 3;
        for (unsigned i = 0; i < 16; i++) {
            A[g + 8 * ((i >> 2) & 1)][4 * t + (i & 3) + 16 * (i >> 3)] = WidenA(in[l].a[i]);
        }
        for (unsigned i = 0; i < 8; i++) B[4 * t + (i & 3) + 16 * (i >> 2)][g] = WidenB(in[l].b[i]);
    }
    for (unsigned l = 0; l < 32; l++) mma_tile_f32(A, B, in[l].c, lanes[l], l);
}

static inline void fp8_mma_m16n8k32(unsigned op, Compute compute, float* d, const void* a,
                                    const void* b, const float* c) {
    // sm_90 (the lens's default GPU) runs it as two m16n8k16 mma's after unpacking to f16.
    MC_LENS_COUNT(LENS_MMA, 2);
    Fp8MmaOperands in;
    memcpy(in.a, a, sizeof in.a);
    memcpy(in.b, b, sizeof in.b);
    memcpy(in.c, c, sizeof in.c);  // before d is written: d may be c
    collective(op, &in, sizeof in, d, 4 * sizeof(float), compute);
}

// ---- ldmatrix.sync.aligned.m8n8.{x1,x2,x4}{,.trans}.shared.b16 ----

// Lanes 8m..8m+7 give the addresses of rows 0..7 of matrix m (16 bytes each, 16-byte aligned);
// lane l receives two elements of each matrix m, in dst[2m] and dst[2m + 1]: without .trans
// row l / 4, columns 2 * (l % 4) and 2 * (l % 4) + 1; with .trans (the matrix read column-major)
// rows 2 * (l % 4) and 2 * (l % 4) + 1 of column l / 4.
template <unsigned NUM, bool TRANS>
MC_LENS_UNINSTRUMENTED static void ldmatrix_compute(Slot* lanes) {
    const unsigned char* rows[32];
    for (unsigned l = 0; l < 8 * NUM; l++) {
        memcpy(&rows[l], lanes[l].bytes, sizeof rows[l]);
        if ((uintptr_t)rows[l] % 16 && !tls_misaligned) {
            tls_misaligned = rows[l];
            tls_misaligned_bytes = 16;
        }
    }
    for (unsigned l = 0; l < 32; l++) {
        uint16_t out[2 * NUM];
        for (unsigned m = 0; m < NUM; m++) {
            for (unsigned j = 0; j < 2; j++) {
                const unsigned char* src =
                    TRANS ? rows[8 * m + 2 * (l % 4) + j] + 2 * (l / 4)
                          : rows[8 * m + l / 4] + 2 * (2 * (l % 4) + j);
                memcpy(&out[2 * m + j], src, 2);
            }
        }
        memcpy(lanes[l].bytes, out, sizeof out);
    }
}

template <unsigned NUM, bool TRANS>
static inline void ldmatrix(unsigned op, void* dst, const void* row) {
#ifdef MC_EMU_LENS
    // Lanes 8 * NUM and up give no address: their rows are not read.
    if (tls_block && (tls_block->current->linear & 31) < 8 * NUM) {
        MC_LENS_ACCESS(LENS_SITE_LDMATRIX, row, 16, 0);
    }
    MC_LENS_COUNT(LENS_LDMATRIX, 1);
#endif
    collective(op, &row, sizeof row, dst, 4 * NUM, ldmatrix_compute<NUM, TRANS>);
}

// ---- cp.async ----

// Copies the first `src_bytes` of `size` bytes and zeroes the rest; src_bytes outside
// [0, size] (undefined in PTX) is clamped to it.
MC_LENS_UNINSTRUMENTED static inline void async_copy(void* dst, const void* src, unsigned size,
                                                     int src_bytes) {
    if (((uintptr_t)dst | (uintptr_t)src) % size && !tls_misaligned) {
        tls_misaligned = (uintptr_t)src % size ? src : dst;
        tls_misaligned_bytes = size;
    }
    unsigned n = src_bytes < 0 ? 0u : (unsigned)src_bytes < size ? (unsigned)src_bytes : size;
#ifdef MC_EMU_CHECKS
    check_range(src, n, 0);
    check_range(dst, size, 1);
#endif
    MC_LENS_COUNT(LENS_CP_ASYNC, 1);
    if (n) MC_LENS_ACCESS(LENS_SITE_CP_ASYNC, src, n, 0);
    MC_LENS_ACCESS(LENS_SITE_CP_ASYNC, dst, size, 1);
    if (n) memcpy(dst, src, n);
    memset((unsigned char*)dst + n, 0, size - n);
}

}  // namespace mma
}  // namespace mc_emu

// ---- the names mma.h gives the device code ----

static inline void mc_mma_m16n8k16_f16(float* d, const uint16_t* a, const uint16_t* b,
                                       const float* c) {
    using namespace mc_emu::mma;
    mma_m16n8k16(MMA_F16, mma_compute<f16_to_f32>, d, a, b, c);
}
static inline void mc_mma_m16n8k16_bf16(float* d, const uint16_t* a, const uint16_t* b,
                                        const float* c) {
    using namespace mc_emu::mma;
    mma_m16n8k16(MMA_BF16, mma_compute<bf16_to_f32>, d, a, b, c);
}

#define MC_EMU_MMA_M16N8K32(A, TA, B, TB, OP, A_SIGNED, B_SIGNED)                          \
    static inline void mc_mma_m16n8k32_##A##B(int32_t* d, const TA* a, const TB* b,          \
                                              const int32_t* c) {                            \
        using namespace mc_emu::mma;                                                         \
        mma_m16n8k32(OP, int_mma_compute<A_SIGNED, B_SIGNED>, d, a, b, c);                   \
    }
MC_EMU_MMA_M16N8K32(s8, int8_t, s8, int8_t, MMA_S8S8, true, true)
MC_EMU_MMA_M16N8K32(s8, int8_t, u8, uint8_t, MMA_S8U8, true, false)
MC_EMU_MMA_M16N8K32(u8, uint8_t, s8, int8_t, MMA_U8S8, false, true)
MC_EMU_MMA_M16N8K32(u8, uint8_t, u8, uint8_t, MMA_U8U8, false, false)
#undef MC_EMU_MMA_M16N8K32

#define MC_EMU_MMA_F8(A, B, OP)                                                                \
    static inline void mc_mma_m16n8k32_##A##B(float* d, const uint8_t* a, const uint8_t* b,    \
                                              const float* c) {                                \
        using namespace mc_emu::mma;                                                           \
        fp8_mma_m16n8k32(OP, fp8_mma_compute<A##_to_f32, B##_to_f32>, d, a, b, c);             \
    }
MC_EMU_MMA_F8(e4m3, e4m3, MMA_E4M3E4M3)
MC_EMU_MMA_F8(e4m3, e5m2, MMA_E4M3E5M2)
MC_EMU_MMA_F8(e5m2, e4m3, MMA_E5M2E4M3)
MC_EMU_MMA_F8(e5m2, e5m2, MMA_E5M2E5M2)
#undef MC_EMU_MMA_F8

#define MC_EMU_LDMATRIX(NAME, NUM, TRANS, OP)                                     \
    static inline void mc_ldmatrix_##NAME(void* dst, const void* row) {           \
        mc_emu::mma::ldmatrix<NUM, TRANS>(mc_emu::mma::OP, dst, row);             \
    }
MC_EMU_LDMATRIX(x1, 1, false, LDMATRIX_X1)
MC_EMU_LDMATRIX(x2, 2, false, LDMATRIX_X2)
MC_EMU_LDMATRIX(x4, 4, false, LDMATRIX_X4)
MC_EMU_LDMATRIX(x1_trans, 1, true, LDMATRIX_X1_TRANS)
MC_EMU_LDMATRIX(x2_trans, 2, true, LDMATRIX_X2_TRANS)
MC_EMU_LDMATRIX(x4_trans, 4, true, LDMATRIX_X4_TRANS)
#undef MC_EMU_LDMATRIX

// The 8-bit forms move the same bytes (one instruction in PTX: .b16 registers unpacked).
static inline void mc_ldmatrix_x1_b8(void* dst, const void* row) { mc_ldmatrix_x1(dst, row); }
static inline void mc_ldmatrix_x2_b8(void* dst, const void* row) { mc_ldmatrix_x2(dst, row); }
static inline void mc_ldmatrix_x4_b8(void* dst, const void* row) { mc_ldmatrix_x4(dst, row); }

#define MC_EMU_CP_ASYNC(NAME, N)                                                            \
    static inline void mc_cp_async_##NAME(void* dst, const void* src) {                     \
        mc_emu::mma::async_copy(dst, src, N, N);                                            \
    }                                                                                       \
    static inline void mc_cp_async_##NAME##_zfill(void* dst, const void* src, int src_bytes) { \
        mc_emu::mma::async_copy(dst, src, N, src_bytes);                                    \
    }
MC_EMU_CP_ASYNC(ca4, 4)
MC_EMU_CP_ASYNC(ca8, 8)
MC_EMU_CP_ASYNC(cg16, 16)
#undef MC_EMU_CP_ASYNC

static inline void mc_cp_async_commit() {}
template <int N>
static inline void mc_cp_async_wait() {
    static_assert(N >= 0, "cp.async.wait_group takes a count of groups");
}
static inline void mc_cp_async_wait_all() {}

#endif  // MC_EMU_MMA_H
