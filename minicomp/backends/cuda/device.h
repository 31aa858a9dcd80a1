/* minicomp CUDA device header: the helpers every generated CUDA source uses (inlined into it).
   It compiles under NVRTC with no include at all, and on the host after the emulator's emu.h
   (which defines MC_EMULATE and supplies the CUDA built-ins it uses). */
#ifndef MINICOMP_DEVICE_H
#define MINICOMP_DEVICE_H

/* NVRTC has no <stdint.h>; its target is LP64, where these are the usual spellings. */
#if defined(__CUDACC_RTC__) && !defined(MC_EMULATE)
typedef signed char int8_t;
typedef short int16_t;
typedef int int32_t;
typedef long long int64_t;
typedef unsigned char uint8_t;
typedef unsigned short uint16_t;
typedef unsigned int uint32_t;
typedef unsigned long long uint64_t;
#endif

/* Helpers a source does not call are expected: keep NVRTC's log to the warnings that matter. */
#ifdef __CUDACC__
#pragma nv_diag_suppress 177
#endif

#ifndef INFINITY
#define INFINITY __int_as_float(0x7f800000)
#endif
#ifndef NAN
#define NAN __int_as_float(0x7fffffff)
#endif
#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif

/* Every helper's qualifiers; emu.h may define MC_DEVICE first to give the host's. */
#ifndef MC_DEVICE
#define MC_DEVICE static __device__ __forceinline__
#endif

/* The launch's dynamic shared memory (its size is the launch's sharedMemBytes); dynamic
   arrays are typed pointers into it. The emulator defines the name as a per-block buffer.
   Device printf needs no declaration: NVRTC has it built in, the emulator uses stdio's. */
#ifndef MC_EMULATE
extern __shared__ __align__(1024) unsigned char mc_dynamic_smem[];
#endif

/* ---- bit casts ---- */

MC_DEVICE uint32_t mc_bits_f32(float x) { return __float_as_uint(x); }
MC_DEVICE float mc_from_bits_f32(uint32_t u) { return __uint_as_float(u); }

/* ---- float16 and bfloat16, stored as uint16_t bit patterns ----
   On the GPU, the hardware converts: cvt.rn.f16.f32 and cvt.f32.f16 (every architecture), and
   cvt.rn.bf16.f32 (sm_80 and newer; bf16 -> f32 is a 16-bit shift, common.h's). These are the
   instructions PyTorch's own CUDA kernels convert with (__float2half, __half2float and, on
   sm_80+, __float2bfloat16), so a value, an infinity or a subnormal comes out as eager's on
   that GPU. NaNs: the PTX ISA promises only a NaN from a plain cvt.rn.{f16,bf16}.f32 (canonical
   NaN is promised only with .relu) and an unspecified NaN from cvt.f32.bf16; whatever bits the
   hardware gives are also eager's there. Eager on the CPU has no one NaN either (c10's scalar
   conversions give sign|0x7e00 and 0x7fc0, its vectorised ones keep the f16 payload or give
   0xffff), and tests compare NaN with NaN, never their bits, so we take the hardware's. The
   emulator (host C++, MC_EMULATE) and an architecture without the bf16 cvt keep the bit
   operations below and common.h's: PyTorch's CPU results bit for bit, NaNs as c10's scalar
   conversions give them.
   The float8 conversions are common.h's bit arithmetic on every architecture, the emulator
   included: sm_89's cvt to e4m3/e5m2 exists only saturating (.satfinite), which PyTorch's
   e5m2 is not. */
#if defined(__CUDA_ARCH__) && !defined(MC_EMULATE)
#define MC_HARDWARE_F16_CONVERSION
#if __CUDA_ARCH__ >= 800 /* cvt to bf16, and to f16x2 / bf16x2 pairs */
#define MC_HARDWARE_BF16_CONVERSION
#endif
#endif

#ifdef MC_HARDWARE_F16_CONVERSION
MC_DEVICE float mc_f16_to_f32(uint16_t h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

MC_DEVICE uint16_t mc_f32_to_f16(float f) {
    uint16_t h;
    asm("cvt.rn.f16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
#else
/* Exact; NaN payloads are kept and quietened. */
MC_DEVICE float mc_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t em = h & 0x7fffu;
    uint32_t mag;
    if (em >= 0x7c00u) {
        mag = 0x7f800000u | ((em & 0x3ffu) << 13) | ((uint32_t)(em > 0x7c00u) << 22);
    } else if (em < 0x0400u) {
        /* A subnormal counts units of 2^-24, the ulp of floats in [0.5, 1): put it in the
           mantissa of 0.5 and subtract 0.5, exactly (no flush: we never build with -ftz). */
        mag = mc_bits_f32(mc_from_bits_f32(0x3f000000u | em) - 0.5f);
    } else {
        mag = (em << 13) + ((uint32_t)(127 - 15) << 23);
    }
    return mc_from_bits_f32(sign | mag);
}

/* Round to nearest even, with subnormals, overflow to inf and NaN as sign|0x7e00. */
MC_DEVICE uint16_t mc_f32_to_f16(float f) {
    uint32_t x = mc_bits_f32(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;
    uint32_t mag;
    if (ax > 0x7f800000u) {
        mag = 0x7e00u;
    } else if (ax >= 0x477ff000u) {
        mag = 0x7c00u;
    } else if (ax >= 0x38800000u) {
        /* Rebias the exponent, then round the 13 dropped bits to nearest even. */
        mag = (ax - ((uint32_t)(127 - 15) << 23) + 0xfffu + ((ax >> 13) & 1u)) >> 13;
    } else {
        /* Adding 0.5 puts the value where float's ulp is 2^-24, f16's subnormal unit, so the
           float addition rounds exactly as we want. */
        mag = mc_bits_f32(mc_from_bits_f32(ax) + 0.5f) - 0x3f000000u;
    }
    return (uint16_t)(sign | mag);
}
#endif

/* ---- math: CUDA's own functions, under the CPU runtime's helper names ---- */

MC_DEVICE float mc_exp_f32(float x) { return expf(x); }
MC_DEVICE double mc_exp_f64(double x) { return exp(x); }
MC_DEVICE float mc_tanh_f32(float x) { return tanhf(x); }
MC_DEVICE double mc_tanh_f64(double x) { return tanh(x); }
MC_DEVICE float mc_erf_f32(float x) { return erff(x); }
MC_DEVICE double mc_erf_f64(double x) { return erf(x); }
MC_DEVICE float mc_gelu_f32(float x) { return x * 0.5f * (1.0f + erff(x * 0.70710678f)); }
/* CUDA's lgamma keeps no global sign, so it is safe in every thread. */
MC_DEVICE float mc_lgamma_f32(float x) { return lgammaf(x); }
MC_DEVICE double mc_lgamma_f64(double x) { return lgamma(x); }
MC_DEVICE float mc_rsqrt_f32(float x) { return rsqrtf(x); }
MC_DEVICE double mc_rsqrt_f64(double x) { return rsqrt(x); }

/* ---- helpers shared with the CPU runtime (the code generator inlines common.h) ---- */

/* NVRTC has erfinvf / erfinv; the host's libm, under the emulator, has not. */
#ifndef MC_EMULATE
#define MC_NATIVE_ERFINV
#endif
#define MC_FN MC_DEVICE
#define MC_FN_PLAIN MC_DEVICE
/* common.h's f32 -> bf16 is the CPU's bit rounding; where the hardware converts, it is renamed
   out of the way (and left unused) for the one-instruction version after it. */
#ifdef MC_HARDWARE_BF16_CONVERSION
#define mc_f32_to_bf16 mc_f32_to_bf16_by_bits
#endif
#include "common.h"
#ifdef MC_HARDWARE_BF16_CONVERSION
#undef mc_f32_to_bf16
MC_DEVICE uint16_t mc_f32_to_bf16(float f) {
    uint16_t h;
    asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(h) : "f"(f));
    return h;
}
#endif

/* Two floats converted at once, `lo` into the low 16 bits (the order of mma.h's fragments), for
   a vectorised store of halves: the same bits as two scalar conversions. On sm_80+ it is one
   cvt.rn.{f16,bf16}x2.f32 (one F2FP, no packing), which takes its operands high first. */
#ifdef MC_HARDWARE_BF16_CONVERSION
#define MC_F32X2_TO_HALF2(S)                                                      \
    MC_DEVICE uint32_t mc_f32x2_to_##S##x2(float lo, float hi) {                  \
        uint32_t r;                                                               \
        asm("cvt.rn." #S "x2.f32 %0, %1, %2;" : "=r"(r) : "f"(hi), "f"(lo));      \
        return r;                                                                 \
    }
#else
#define MC_F32X2_TO_HALF2(S)                                                      \
    MC_DEVICE uint32_t mc_f32x2_to_##S##x2(float lo, float hi) {                  \
        return (uint32_t)mc_f32_to_##S(lo) | ((uint32_t)mc_f32_to_##S(hi) << 16); \
    }
#endif
MC_F32X2_TO_HALF2(f16)
MC_F32X2_TO_HALF2(bf16)
#undef MC_F32X2_TO_HALF2

/* ---- warp shuffles of 16-bit values (float16 / bfloat16 bit patterns) ---- */

MC_DEVICE uint16_t mc_shfl_down_u16(uint16_t v, unsigned int delta) {
    return (uint16_t)__shfl_down_sync(0xffffffffu, (unsigned int)v, delta);
}
MC_DEVICE uint16_t mc_shfl_xor_u16(uint16_t v, int lane_mask) {
    return (uint16_t)__shfl_xor_sync(0xffffffffu, (unsigned int)v, lane_mask);
}
MC_DEVICE uint16_t mc_shfl_u16(uint16_t v, int src_lane) {
    return (uint16_t)__shfl_sync(0xffffffffu, (unsigned int)v, src_lane);
}

/* ---- vector memory access (the register side is an alignas(16) local array) ---- */

/* Whether `p` is aligned to `bytes` (a power of two). */
MC_DEVICE bool mc_is_aligned(const void* p, unsigned long long bytes) {
    return ((unsigned long long)p & (bytes - 1ull)) == 0;
}

/* One access of N bytes as the built-in vector type T; emu.h has the host versions. */
#ifndef MC_EMULATE
#define MC_VECTOR_ACCESS(N, T)                                                    \
    MC_DEVICE void mc_load_vec##N(void* dst, const void* src) {                   \
        *(T*)dst = *(const T*)src;                                                \
    }                                                                             \
    MC_DEVICE void mc_store_vec##N(void* dst, const void* src) {                  \
        *(T*)dst = *(const T*)src;                                                \
    }
MC_VECTOR_ACCESS(2, unsigned short)
MC_VECTOR_ACCESS(4, unsigned int)
MC_VECTOR_ACCESS(8, uint2)
MC_VECTOR_ACCESS(16, uint4)
/* 32 bytes (an input twice as wide as the output) are two 16-byte accesses. */
MC_DEVICE void mc_load_vec32(void* dst, const void* src) {
    ((uint4*)dst)[0] = ((const uint4*)src)[0];
    ((uint4*)dst)[1] = ((const uint4*)src)[1];
}
MC_DEVICE void mc_store_vec32(void* dst, const void* src) {
    ((uint4*)dst)[0] = ((const uint4*)src)[0];
    ((uint4*)dst)[1] = ((const uint4*)src)[1];
}
#undef MC_VECTOR_ACCESS
#endif

/* ---- atomics the hardware lacks, by compare-and-swap on the enclosing 32-bit word ---- */

/* Adds `v` to the 16-bit value at `p` (rounded once, like a store of the float32 sum) and
   returns the old bits. */
#define MC_ATOMIC_ADD_HALF(S)                                                     \
    MC_DEVICE uint16_t mc_atomic_add_##S(uint16_t* p, float v) {                  \
        unsigned long long address = (unsigned long long)p;                       \
        unsigned int* word = (unsigned int*)(address & ~3ull);                    \
        unsigned int shift = (unsigned int)(address & 2ull) * 8u;                 \
        unsigned int old = *word, assumed;                                        \
        do {                                                                      \
            assumed = old;                                                        \
            uint16_t h = (uint16_t)(assumed >> shift);                            \
            uint16_t r = mc_f32_to_##S(mc_##S##_to_f32(h) + v);                   \
            unsigned int updated =                                                \
                (assumed & ~(0xffffu << shift)) | ((unsigned int)r << shift);     \
            old = atomicCAS(word, assumed, updated);                              \
        } while (old != assumed);                                                 \
        return (uint16_t)(old >> shift);                                          \
    }

MC_ATOMIC_ADD_HALF(f16)
MC_ATOMIC_ADD_HALF(bf16)

/* NaN-propagating float max (atomicMax has no float version); returns the old value. */
MC_DEVICE float mc_atomic_max_f32(float* p, float v) {
    unsigned int* word = (unsigned int*)p;
    unsigned int old = *word, assumed;
    do {
        assumed = old;
        float updated = mc_max_f32(__uint_as_float(assumed), v);
        if (__float_as_uint(updated) == assumed) break;
        old = atomicCAS(word, assumed, __float_as_uint(updated));
    } while (old != assumed);
    return __uint_as_float(old);
}

#endif /* MINICOMP_DEVICE_H */
