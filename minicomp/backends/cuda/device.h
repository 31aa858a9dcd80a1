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

/* ---- bit casts ---- */

MC_DEVICE uint32_t mc_bits_f32(float x) { return __float_as_uint(x); }
MC_DEVICE float mc_from_bits_f32(uint32_t u) { return __uint_as_float(u); }

/* ---- float16 / bfloat16, stored as uint16_t bit patterns (the CPU runtime's semantics) ---- */

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

MC_DEVICE float mc_bf16_to_f32(uint16_t h) { return mc_from_bits_f32((uint32_t)h << 16); }

/* Round to nearest even; NaN becomes 0x7fc0 (PyTorch's canonical bfloat16 NaN). */
MC_DEVICE uint16_t mc_f32_to_bf16(float f) {
    uint32_t x = mc_bits_f32(f);
    uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    return (uint16_t)(f != f ? 0x7fc0u : rounded);
}

/* ---- max / min: NaN propagates for floats (torch.maximum); ties keep `a` ---- */

MC_DEVICE float mc_max_f32(float a, float b) { return (a < b || b != b) ? b : a; }
MC_DEVICE float mc_min_f32(float a, float b) { return (b < a || b != b) ? b : a; }
MC_DEVICE double mc_max_f64(double a, double b) { return (a < b || b != b) ? b : a; }
MC_DEVICE double mc_min_f64(double a, double b) { return (b < a || b != b) ? b : a; }

/* ---- integer helpers, one family per type (S is the IR's short type name) ---- */

#define MC_ORDER_HELPERS(T, S)                                                    \
    MC_DEVICE T mc_max_##S(T a, T b) { return a < b ? b : a; }                   \
    MC_DEVICE T mc_min_##S(T a, T b) { return b < a ? b : a; }

/* Division by zero gives 0 rather than trapping; the unsigned type U makes negation and
   repeated products wrap instead of overflowing. */
#define MC_SIGNED_HELPERS(T, U, S)                                                \
    MC_ORDER_HELPERS(T, S)                                                        \
    MC_DEVICE T mc_abs_##S(T a) { return a < 0 ? (T)((U)0 - (U)a) : a; }         \
    MC_DEVICE T mc_floordiv_##S(T a, T b) {                                       \
        if (b == 0) return 0;                                                     \
        if (b == -1) return (T)((U)0 - (U)a);                                     \
        T q = (T)(a / b), r = (T)(a % b);                                         \
        return (r != 0 && ((r < 0) != (b < 0))) ? (T)(q - 1) : q;                 \
    }                                                                             \
    MC_DEVICE T mc_mod_##S(T a, T b) {                                            \
        if (b == 0 || b == -1) return 0;                                          \
        T r = (T)(a % b);                                                         \
        return (r != 0 && ((r < 0) != (b < 0))) ? (T)(r + b) : r;                 \
    }                                                                             \
    MC_DEVICE T mc_pow_##S(T a, T b) {                                            \
        if (b < 0) return a == 1 ? 1 : a == -1 ? ((b & 1) ? -1 : 1) : 0;          \
        U r = 1, x = (U)a;                                                        \
        for (; b; b >>= 1) { if (b & 1) r *= x; x *= x; }                         \
        return (T)r;                                                              \
    }

#define MC_UNSIGNED_HELPERS(T, S)                                                 \
    MC_ORDER_HELPERS(T, S)                                                        \
    MC_DEVICE T mc_abs_##S(T a) { return a; }                                     \
    MC_DEVICE T mc_floordiv_##S(T a, T b) { return b == 0 ? 0 : (T)(a / b); }     \
    MC_DEVICE T mc_mod_##S(T a, T b) { return b == 0 ? 0 : (T)(a % b); }          \
    MC_DEVICE T mc_pow_##S(T a, T b) {                                            \
        T r = 1;                                                                  \
        for (; b; b >>= 1) { if (b & 1) r = (T)(r * a); a = (T)(a * a); }         \
        return r;                                                                 \
    }

MC_SIGNED_HELPERS(int8_t, uint8_t, i8)
MC_SIGNED_HELPERS(int16_t, uint16_t, i16)
MC_SIGNED_HELPERS(int32_t, uint32_t, i32)
MC_SIGNED_HELPERS(int64_t, uint64_t, i64)
MC_UNSIGNED_HELPERS(uint8_t, u8)
MC_UNSIGNED_HELPERS(uint16_t, u16)
MC_UNSIGNED_HELPERS(uint32_t, u32)
MC_UNSIGNED_HELPERS(uint64_t, u64)
MC_ORDER_HELPERS(bool, bool)

/* ---- floor division and modulo of floats, Python's semantics (what PyTorch computes) ---- */

#define MC_FLOAT_DIVMOD(T, S, SUF)                                                \
    MC_DEVICE T mc_floordiv_##S(T a, T b) {                                       \
        if (b == 0) return a / b;                                                 \
        T m = fmod##SUF(a, b);                                                    \
        T d = (a - m) / b;                                                        \
        if (m != 0 && ((b < 0) != (m < 0))) d -= 1;                               \
        if (d == 0) return copysign##SUF((T)0, a / b);                            \
        T f = floor##SUF(d);                                                      \
        /* (a - m) / b is an integer up to rounding: snap to the nearest one. */  \
        return d - f > (T)0.5 ? f + 1 : f;                                        \
    }                                                                             \
    MC_DEVICE T mc_mod_##S(T a, T b) {                                            \
        T m = fmod##SUF(a, b);                                                    \
        return (m != 0 && ((b < 0) != (m < 0))) ? m + b : m;                      \
    }

MC_FLOAT_DIVMOD(float, f32, f)
MC_FLOAT_DIVMOD(double, f64, )

/* ---- math: CUDA's own functions, under the CPU runtime's helper names ---- */

MC_DEVICE float mc_exp_f32(float x) { return expf(x); }
MC_DEVICE double mc_exp_f64(double x) { return exp(x); }
MC_DEVICE float mc_tanh_f32(float x) { return tanhf(x); }
MC_DEVICE double mc_tanh_f64(double x) { return tanh(x); }
MC_DEVICE float mc_erf_f32(float x) { return erff(x); }
MC_DEVICE double mc_erf_f64(double x) { return erf(x); }
/* CUDA's lgamma keeps no global sign, so it is safe in every thread. */
MC_DEVICE float mc_lgamma_f32(float x) { return lgammaf(x); }
MC_DEVICE double mc_lgamma_f64(double x) { return lgamma(x); }
MC_DEVICE float mc_rsqrt_f32(float x) { return rsqrtf(x); }
MC_DEVICE double mc_rsqrt_f64(double x) { return rsqrt(x); }

/* e / (1 + e) with e = exp(-|x|): exp never overflows, so results far below zero keep their
   (subnormal) precision instead of flushing to 0. */
MC_DEVICE float mc_sigmoid_f32(float x) {
    float e = expf(-fabsf(x));
    return (x >= 0 ? 1.0f : e) / (1.0f + e);
}
MC_DEVICE double mc_sigmoid_f64(double x) {
    double e = exp(-fabs(x));
    return (x >= 0 ? 1.0 : e) / (1.0 + e);
}

/* 0/1 results whatever the built-ins return. */
#define mc_isnan(x) (isnan(x) ? 1 : 0)
#define mc_isinf(x) (isinf(x) ? 1 : 0)
#define mc_signbit(x) (signbit(x) ? 1 : 0)

/* digamma for x > 0: climb to x >= 10 by psi(x) = psi(x + 1) - 1/x, then the asymptotic
   series ln x - 1/2x - sum B_2k / (2k x^2k), truncated where its terms drop below 1e-17. */
MC_DEVICE double mc_digamma_positive(double x) {
    double acc = 0.0;
    while (x < 10.0) {
        acc -= 1.0 / x;
        x += 1.0;
    }
    double z = 1.0 / (x * x);
    double series = z * (1.0 / 12 - z * (1.0 / 120 - z * (1.0 / 252 - z * (1.0 / 240
                  - z * (1.0 / 132 - z * (691.0 / 32760 - z / 12.0))))));
    return acc + log(x) - 0.5 / x - series;
}

/* PyTorch's conventions: psi(+-0) = -+inf, NaN at negative integers. */
MC_DEVICE double mc_digamma_f64(double x) {
    if (x == 0) return copysign((double)INFINITY, -x);
    if (x < 0) {
        if (x == floor(x)) return (double)NAN;
        /* Reflection psi(x) = psi(1 - x) - pi / tan(pi x), with x reduced exactly to
           |f| <= 1/2 first so that pi * f keeps its relative precision at the poles. */
        double f = x - rint(x);
        return mc_digamma_positive(1.0 - x) - M_PI / tan(M_PI * f);
    }
    return x != x ? x : mc_digamma_positive(x);
}

MC_DEVICE float mc_digamma_f32(float x) { return (float)mc_digamma_f64((double)x); }

#ifndef MC_EMULATE
MC_DEVICE float mc_erfinv_f32(float x) { return erfinvf(x); }
MC_DEVICE double mc_erfinv_f64(double x) { return erfinv(x); }
#else
/* The host's libm has no erfinv: a rational first guess (M. Giles's single-precision fit,
   "Approximating the erfinv function", 2010) refined by Newton steps on erf in double. */
MC_DEVICE double mc_erfinv_guess(double y) {
    double w = -log((1.0 - y) * (1.0 + y));
    double p;
    if (w < 5.0) {
        w -= 2.5;
        p = 2.81022636e-08;
        p = 3.43273939e-07 + p * w;
        p = -3.5233877e-06 + p * w;
        p = -4.39150654e-06 + p * w;
        p = 0.00021858087 + p * w;
        p = -0.00125372503 + p * w;
        p = -0.00417768164 + p * w;
        p = 0.246640727 + p * w;
        p = 1.50140941 + p * w;
    } else {
        w = sqrt(w) - 3.0;
        p = -0.000200214257;
        p = 0.000100950558 + p * w;
        p = 0.00134934322 + p * w;
        p = -0.00367342844 + p * w;
        p = 0.00573950773 + p * w;
        p = -0.0076224613 + p * w;
        p = 0.00943887047 + p * w;
        p = 1.00167406 + p * w;
        p = 2.83297682 + p * w;
    }
    return p * y;
}

MC_DEVICE double mc_erfinv_refined(double y, int steps) {
    if (y != y || y < -1.0 || y > 1.0) return (double)NAN;
    if (y == 1.0 || y == -1.0) return copysign((double)INFINITY, y);
    double x = mc_erfinv_guess(y);
    double t = fabs(y);
    for (int i = 0; i < steps; ++i) {
        /* For |y| > 1/2 the residual is (1 - |y|) - erfc(|x|), signed like y: erf(x) - y
           would cancel in the tail. */
        double r = t > 0.5 ? ((1.0 - t) - erfc(fabs(x))) * (y < 0 ? -1.0 : 1.0) : erf(x) - y;
        x -= r * (0.886226925452758014 * exp(x * x)); /* 1 / erf'(x) */
    }
    return x;
}

MC_DEVICE double mc_erfinv_f64(double y) { return mc_erfinv_refined(y, 3); }
MC_DEVICE float mc_erfinv_f32(float y) { return (float)mc_erfinv_refined((double)y, 2); }
#endif

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
