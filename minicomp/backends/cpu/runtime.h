/* minicomp C runtime: the helpers every generated C kernel file uses (inlined into it). */
#ifndef MINICOMP_RUNTIME_H
#define MINICOMP_RUNTIME_H

/* lgamma_r and lgammaf_r: the plain lgamma writes the global signgam, a race in parallel loops. */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <math.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>

/* Forced inlining lets GCC vectorise loops calling helpers inside `#pragma omp simd`. */
#define MC_INLINE static inline __attribute__((always_inline, unused))

#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif

/* ---- bit casts (memcpy is the defined way, and compiles to a register move) ---- */

MC_INLINE uint32_t mc_bits_f32(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
MC_INLINE float mc_from_bits_f32(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }

/* ---- float16, stored as uint16_t bit patterns (bfloat16 is in common.h) ---- */

/* Exact; NaN payloads are kept and quietened (what PyTorch's conversion gives). */
MC_INLINE float mc_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t em = h & 0x7fffu;
    uint32_t normal = (em << 13) + ((uint32_t)(127 - 15) << 23);
    uint32_t quiet = (uint32_t)(em > 0x7c00u) << 22;
    uint32_t special = 0x7f800000u | ((em & 0x3ffu) << 13) | quiet;
    /* A subnormal counts units of 2^-24, which is the ulp of floats in [0.5, 1): put it in
       the mantissa of 0.5 and subtract 0.5, exactly. */
    uint32_t subnormal = mc_bits_f32(mc_from_bits_f32(0x3f000000u | em) - 0.5f);
    /* Selects by masks, not by ?: which GCC may turn into branches around the float
       subtraction and then, as it might trap, not vectorise. */
    uint32_t is_sub = 0u - (uint32_t)(em < 0x0400u);
    uint32_t is_special = 0u - (uint32_t)(em >= 0x7c00u);
    uint32_t mag = (subnormal & is_sub) | (normal & ~is_sub);
    mag = (special & is_special) | (mag & ~is_special);
    return mc_from_bits_f32(sign | mag);
}

/* Round to nearest even, with subnormals, overflow to inf and NaN as sign|0x7e00. */
MC_INLINE uint16_t mc_f32_to_f16(float f) {
    uint32_t x = mc_bits_f32(f);
    uint32_t sign = (x >> 16) & 0x8000u;
    uint32_t ax = x & 0x7fffffffu;
    /* Normal range: rebias the exponent, then round the 13 dropped bits to nearest even. */
    uint32_t normal = (ax - ((uint32_t)(127 - 15) << 23) + 0xfffu + ((ax >> 13) & 1u)) >> 13;
    /* Below 2^-14: adding 0.5 puts the value where float's ulp is 2^-24, f16's subnormal unit,
       so the hardware's rounding is exactly the rounding we want. */
    uint32_t subnormal = mc_bits_f32(mc_from_bits_f32(ax) + 0.5f) - 0x3f000000u;
    uint32_t mag = ax > 0x7f800000u ? 0x7e00u
                 : ax >= 0x477ff000u ? 0x7c00u
                 : ax >= 0x38800000u ? normal : subnormal;
    return (uint16_t)(sign | mag);
}

/* ---- exp: fast, branch-free and vectorisable, max error <= 2 ulp over all floats ---- */

MC_INLINE float mc_exp_f32(float x) {
    /* exp(x) is inf above ~88.72 and rounds to 0 below ~-103.97; clamping keeps k small
       (comparisons are false for NaN, so NaN passes through). */
    float xc = x > 89.0f ? 89.0f : x;
    xc = xc < -104.0f ? -104.0f : xc;
    /* k = rint(x / ln 2) by the 1.5 * 2^23 trick, read back from the bits as an integer. */
    float shifted = xc * 1.44269504088896341f + 12582912.0f;
    int32_t k = (int32_t)(mc_bits_f32(shifted) - mc_bits_f32(12582912.0f));
    float kf = shifted - 12582912.0f;
    /* Cody-Waite: ln2_hi has few bits, so kf * ln2_hi is exact for |k| <= 256. */
    float r = xc - kf * 0.693359375f;
    r = r - kf * -2.12194440e-4f;
    /* exp(r) = 1 + r + r^2 q(r) on |r| <= ln2/2; q a near-minimax quartic (error < 0.1 ulp). */
    float q = 1.381461276e-03f;
    q = q * r + 8.368710056e-03f;
    q = q * r + 4.166838899e-02f;
    q = q * r + 1.666652113e-01f;
    q = q * r + 4.999999404e-01f;
    float p = (r * r) * q + r + 1.0f;
    /* 2^k in two halves, each a normal float, so results near overflow and subnormal results
       are rounded once, by the last product. */
    int32_t k1 = k >> 1;
    int32_t k2 = k - k1;
    float s1 = mc_from_bits_f32((uint32_t)(k1 + 127) << 23);
    float s2 = mc_from_bits_f32((uint32_t)(k2 + 127) << 23);
    return (p * s1) * s2;
}

MC_INLINE double mc_exp_f64(double x) { return exp(x); }

/* ---- tanh and erf: branch-free and vectorisable, max error <= 2 ulp over all floats ---- */

/* Both branches are computed and the result selected, so `#pragma omp simd` loops stay
   vectorised; odd symmetry is applied last by copysignf, which also keeps the sign of -0. */
MC_INLINE float mc_tanh_f32(float x) {
    float a = fabsf(x);
    /* |x| < 0.875: tanh = a + a s P(s) with s = a^2, P a minimax sextic fitted in double
       (relative error < 0.02 ulp); a subnormal a gives a s = 0, hence a itself. */
    float s = a * a;
    float p = -4.822903720e-04f;
    p = p * s + 2.650658833e-03f;
    p = p * s + -8.331559598e-03f;
    p = p * s + 2.169583552e-02f;
    p = p * s + -5.393711105e-02f;
    p = p * s + 1.333306432e-01f;
    p = p * s + -3.333332539e-01f;
    float small = a + a * (s * p);
    /* Above: 1 - 2 / (e^2a + 1), where tanh > 0.7 so the subtraction loses little;
       e^2a overflows to inf beyond a ~ 44 and the quotient to 0, giving exactly 1. */
    float large = 1.0f - 2.0f / (mc_exp_f32(2.0f * a) + 1.0f);
    float r = a < 0.875f ? small : large;
    return copysignf(r, x);
}

MC_INLINE float mc_erf_f32(float x) {
    float a = fabsf(x);
    /* |x| < 1: erf = a (2/sqrt(pi) + s Q(s)) with s = a^2 and Q a minimax sextic fitted in
       double. The constant and the last product are taken in double, so tiny and subnormal
       a give a * 2/sqrt(pi) correctly rounded: in float the constant alone is 0.02 ulp off,
       which misrounds about 1% of them. */
    float s = a * a;
    float q = -8.737099051e-06f;
    q = q * s + 1.094916806e-04f;
    q = q * s + -8.442027611e-04f;
    q = q * s + 5.218300037e-03f;
    q = q * s + -2.686454169e-02f;
    q = q * s + 1.128376946e-01f;
    q = q * s + -3.761263788e-01f;
    float small = (float)((double)a * (1.1283791670955126 + (double)(q * s)));
    /* 1 <= |x| < 3.92: erf = 1 - e^-s R(a), R(a) = erfc(a) e^(a^2) fitted by a degree-9
       polynomial in a - 2.45 minimising the absolute error of the product. The rounding of
       s moves e^-s by < 2^-21 relative, at most 0.15 ulp of the result. */
    float t = a - 2.45f;
    float r = -2.799051981e-05f;
    r = r * t + -4.519362847e-05f;
    r = r * t + -1.157489314e-04f;
    r = r * t + 2.672870760e-04f;
    r = r * t + -7.232685457e-04f;
    r = r * t + 2.692039357e-03f;
    r = r * t + -8.520944975e-03f;
    r = r * t + 2.616828866e-02f;
    r = r * t + -7.690362632e-02f;
    r = r * t + 2.145871371e-01f;
    float large = 1.0f - mc_exp_f32(-s) * r;
    /* Beyond 3.92, erfc < 2^-25 and erf rounds to 1 (inf included; NaN fails both tests and
       takes the NaN of `large`). Masks, not ?:, which GCC turns into a branch around the
       double arithmetic of `small` and then cannot vectorise. */
    uint32_t is_small = 0u - (uint32_t)(a < 1.0f);
    large = a > 3.92f ? 1.0f : large;
    uint32_t y = (mc_bits_f32(small) & is_small) | (mc_bits_f32(large) & ~is_small);
    return copysignf(mc_from_bits_f32(y), x);
}

/* ---- math functions libm lacks ---- */

MC_INLINE float mc_rsqrt_f32(float x) { return 1.0f / sqrtf(x); }
MC_INLINE double mc_rsqrt_f64(double x) { return 1.0 / sqrt(x); }

MC_INLINE float mc_lgamma_f32(float x) { int s; return lgammaf_r(x, &s); }
MC_INLINE double mc_lgamma_f64(double x) { int s; return lgamma_r(x, &s); }

/* ---- helpers shared with the CUDA device header (the code generator inlines common.h) ---- */

#define MC_FN MC_INLINE
#define MC_FN_PLAIN static inline
#include "common.h"

/* OpenMP's own max/min reductions drop NaNs; these combine private copies like the helpers.
   omp_orig is a valid start for every private copy because max and min are idempotent. */
#pragma omp declare reduction(mc_max_f32 : float : omp_out = mc_max_f32(omp_out, omp_in)) \
    initializer(omp_priv = omp_orig)
#pragma omp declare reduction(mc_min_f32 : float : omp_out = mc_min_f32(omp_out, omp_in)) \
    initializer(omp_priv = omp_orig)
#pragma omp declare reduction(mc_max_f64 : double : omp_out = mc_max_f64(omp_out, omp_in)) \
    initializer(omp_priv = omp_orig)
#pragma omp declare reduction(mc_min_f64 : double : omp_out = mc_min_f64(omp_out, omp_in)) \
    initializer(omp_priv = omp_orig)

#endif /* MINICOMP_RUNTIME_H */
