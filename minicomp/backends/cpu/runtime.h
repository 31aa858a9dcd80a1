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
#if defined(__AVX512F__) || defined(__AVX__)
#include <immintrin.h>
#endif

/* Forced inlining lets GCC vectorise loops calling helpers inside `#pragma omp simd`. */
#define MC_INLINE static inline __attribute__((always_inline, unused))

/* Kernels streaming more than a core's caches ask GCC for 512-bit vectors, which -march=native
   on an AVX-512 CPU does not prefer (backends/cpu/vector_width.py); a no-op elsewhere, and
   with -DMC_NARROW_VECTORS in the cflags option. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(MC_NARROW_VECTORS)
#define MC_WIDE_VECTORS __attribute__((target("prefer-vector-width=512")))
#else
#define MC_WIDE_VECTORS
#endif

#ifndef M_PI
#define M_PI 3.14159265358979323846
#endif

/* ---- bit casts (memcpy is the defined way, and compiles to a register move) ---- */

MC_INLINE uint32_t mc_bits_f32(float x) { uint32_t u; memcpy(&u, &x, 4); return u; }
MC_INLINE float mc_from_bits_f32(uint32_t u) { float x; memcpy(&x, &u, 4); return x; }
MC_INLINE uint64_t mc_bits_f64(double x) { uint64_t u; memcpy(&u, &x, 8); return u; }
MC_INLINE double mc_from_bits_f64(uint64_t u) { double x; memcpy(&x, &u, 8); return x; }

/* c ? a : b for c = 0 or 1, by masks: GCC moves the computation of a value that only one arm
   of ?: uses into a branch and then, as float operations may trap, does not vectorise the
   loop. (GCC does not vectorise a conversion to bool either: c is an int.) */
MC_INLINE float mc_select_f32(int c, float a, float b) {
    uint32_t m = 0u - (uint32_t)c;
    return mc_from_bits_f32((mc_bits_f32(a) & m) | (mc_bits_f32(b) & ~m));
}
MC_INLINE double mc_select_f64(int c, double a, double b) {
    uint64_t m = 0u - (uint64_t)c;
    return mc_from_bits_f64((mc_bits_f64(a) & m) | (mc_bits_f64(b) & ~m));
}

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
    /* k = rint(x / ln 2) by the 1.5 * 2^23 trick, read back from the bits as an integer. Out
       of [-104, 89] k is garbage, and the result is replaced at the end (exp(x) is inf above
       ~88.72 and rounds to 0 below ~-103.97); NaN passes through the arithmetic. Clamping x
       first gives the same values, but GCC then splits the function into three paths, one per
       clamp, and vectorises them as masked operations and mask-register logic: 33
       instructions per 16 floats against 30, and 15% slower. */
    float shifted = x * 1.44269504088896341f + 12582912.0f;
    int32_t k = (int32_t)(mc_bits_f32(shifted) - mc_bits_f32(12582912.0f));
    float kf = shifted - 12582912.0f;
    /* Cody-Waite: ln2_hi has few bits, so kf * ln2_hi is exact for |k| <= 256. */
    float r = x - kf * 0.693359375f;
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
    float e = (p * s1) * s2;
    e = x > 89.0f ? INFINITY : e;
    return x < -104.0f ? 0.0f : e;
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

/* e^-s for 0 <= s <= 16, as mc_exp_f32(-s) computes it, bit for bit: in this range 2^k is a
   normal float, so the clamps and the two-step scaling that keep mc_exp_f32 exact near overflow
   and for subnormal results are not needed. erf's large branch (s = x^2 <= 15.4) spent half its
   time in them. */
MC_INLINE float mc_exp_neg_f32(float s) {
    float shifted = s * -1.44269504088896341f + 12582912.0f;
    uint32_t k = mc_bits_f32(shifted) - mc_bits_f32(12582912.0f);
    float kf = shifted - 12582912.0f;
    float r = -s - kf * 0.693359375f;
    r = r - kf * -2.12194440e-4f;
    float q = 1.381461276e-03f;
    q = q * r + 8.368710056e-03f;
    q = q * r + 4.166838899e-02f;
    q = q * r + 1.666652113e-01f;
    q = q * r + 4.999999404e-01f;
    float p = (r * r) * q + r + 1.0f;
    return p * mc_from_bits_f32((k + 127u) << 23);
}

/* erf on |x| < 1 is a (2/sqrt(pi) + s Q(s)) with s = a^2 and Q a minimax sextic fitted in
   double; this is Q(s) s. */
MC_INLINE float mc_erf_small_q_f32(float s) {
    float q = -8.737099051e-06f;
    q = q * s + 1.094916806e-04f;
    q = q * s + -8.442027611e-04f;
    q = q * s + 5.218300037e-03f;
    q = q * s + -2.686454169e-02f;
    q = q * s + 1.128376946e-01f;
    q = q * s + -3.761263788e-01f;
    return q * s;
}

/* erf(x) from a = |x| and its value `small` for a < 1. 1 <= a < 3.92: erf = 1 - e^-s R(a),
   s = a^2, R(a) = erfc(a) e^(a^2) fitted by a degree-9 polynomial in a - 2.45 minimising the
   absolute error of the product. The rounding of s moves e^-s by < 2^-21 relative, at most
   0.15 ulp of the result. Beyond 3.92, erfc < 2^-25 and erf rounds to 1: the formula at 3.92
   gives 1, so a is clamped there (one vector instruction, not a comparison and a select; NaN
   becomes 3.92). NaN is not >= 1 and takes `small`, NaN. Masks, not ?:, which GCC turns into
   a branch around `small` and then cannot vectorise (and the clamped value must not feed
   `small`: GCC then branches around mc_erf_f32's double arithmetic). */
MC_INLINE float mc_erf_select_f32(float x, float a, float small) {
    float c = a < 3.92f ? a : 3.92f;
    float s = c * c;
    float t = c - 2.45f;
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
    float large = 1.0f - mc_exp_neg_f32(s) * r;
    uint32_t is_large = 0u - (uint32_t)(a >= 1.0f);
    uint32_t y = (mc_bits_f32(large) & is_large) | (mc_bits_f32(small) & ~is_large);
    return copysignf(mc_from_bits_f32(y), x);
}

/* Below 1 the constant and the last product are taken in double, so tiny and subnormal a
   give a * 2/sqrt(pi) correctly rounded: in float the constant alone is 0.02 ulp off, which
   misrounds about 1% of them. */
MC_INLINE float mc_erf_f32(float x) {
    float a = fabsf(x);
    float small = (float)((double)a * (1.1283791670955126 + (double)mc_erf_small_q_f32(a * a)));
    return mc_erf_select_f32(x, a, small);
}

/* ---- gelu: x/2 (1 + erf(x/sqrt 2)), branch-free and vectorisable ---- */

/* PyTorch's exact gelu as one function, not erf and four operations: gelu needs erf(x/sqrt 2)
   only to the absolute accuracy of its own result, which two polynomials give without erf's
   exp and its far test. With a = |x| and h = x/2:
   - a < 2.4: erf(x/sqrt 2) = x p(a^2 - 2.88), so gelu = h + (h x) p, the small term added to h
     in one rounding; p of degree 9.
   - 2.4 <= a < 5.55: erfc(a/sqrt 2) = e(a - 3.975) within 7e-9, so gelu = x - (a/2) e for
     x > 0 and -(a/2) e for x < 0; e of degree 11.
   - beyond: x for x > 0 (erfc < 2^-25), -0 for x < 0, which is eager's 0.5 x (1 + erf) once
     its erf has rounded to -1; -inf gives NaN as there (x * 0), +inf gives inf (float64's and
     CUDA's value; eager's vectorised float32 loop gives NaN).
   p and e were fitted in double (Lawson's iteration towards the minimax absolute error of
   erf and erfc, each coefficient rounded to float and the rest refitted). An exhaustive test
   over all floats finds x > 0 within 1.24 ulp and x < 0 within 4.95e-8 |x|: absolute, since
   1 + erf cancels there (eager's own error is 3.6e-7 |x|, the exp-based mc_erf_f32's
   composite 5.1e-8 |x|). Both polynomials are computed and the pieces selected by masks, so
   the loop stays vectorised; x's sign bit is ORed in last, as the sum gives +0 at x = -0
   (every x < 0 has gelu <= 0). */
MC_INLINE float mc_gelu_f32(float x) {
    float a = fabsf(x);
    float h = 0.5f * x;
    float v = a * a - 2.88f;
    float p = -6.825982835e-11f;
    p = p * v + 1.344623524e-09f;
    p = p * v + -2.335809945e-08f;
    p = p * v + 3.875178720e-07f;
    p = p * v + -5.695367690e-06f;
    p = p * v + 7.292629743e-05f;
    p = p * v + -8.026453434e-04f;
    p = p * v + 7.499964908e-03f;
    p = p * v + -6.030670926e-02f;
    p = p * v + 5.364076495e-01f;
    float t = a - 3.975f;
    float e = 1.613609015e-07f;
    e = e * t + -1.274817350e-06f;
    e = e * t + 2.452128228e-06f;
    e = e * t + 6.999307516e-06f;
    e = e * t + -5.359644638e-05f;
    e = e * t + 1.748044015e-04f;
    e = e * t + -3.881910525e-04f;
    e = e * t + 6.265362026e-04f;
    e = e * t + -7.297502016e-04f;
    e = e * t + 5.878297961e-04f;
    e = e * t + -2.956901153e-04f;
    e = e * t + 7.037624164e-05f;
    float tail = mc_select_f32(x > 0.0f, x, x * 0.0f);
    int large = a >= 2.4f;
    float m = mc_select_f32(large, -fabsf(h), h * x);
    float r = m * mc_select_f32(large, e, p) + mc_select_f32(large, tail, h);
    r = mc_select_f32(a >= 5.55f, tail, r);
    return mc_from_bits_f32(mc_bits_f32(r) | (mc_bits_f32(x) & 0x80000000u));
}

/* ---- near versions: cheaper where the argument is in a common range ----

   mc_<f>_near_f32(x) equals mc_<f>_f32(x) within the same error bounds wherever
   mc_<f>_far_f32(x) is 0, and is cheaper. A loop cannot branch per lane without losing its
   vectorisation, so the code generator (codegen.py) runs a vector loop with the near versions,
   OR-reduces the far flags of its arguments, and runs the loop again with the exact versions
   when any was set. They need a hardware fused multiply-add (exact products, and fmaf is a
   libm call without one); elsewhere they are the exact versions and nothing is far. */

#if defined(__FP_FAST_FMAF) || defined(__FMA__)
#define MC_NEAR_MATH 1
#endif

#ifdef MC_NEAR_MATH
/* erf below 1 as a 2/sqrt(pi) + a s Q(s) in float: a times the constant's leading part (its
   float value) is exact in the fma, and the rest (0x1.20dd750429b6dp+0 minus it, a 2^-25
   relative part) is added with the polynomial, so the result is correctly rounded unless it
   is within ~2^-48 relative of a rounding boundary. Below 2^-100, a times the rest is
   subnormal and loses those bits: far. Zero is not (it gives +-0 exactly). */
MC_INLINE float mc_erf_near_f32(float x) {
    float a = fabsf(x);
    float small = fmaf(a, 0x1.20dd76p+0f, a * (mc_erf_small_q_f32(a * a) + -0x1.f7ac92p-25f));
    return mc_erf_select_f32(x, a, small);
}

/* 0 < |x| < 2^-100: one unsigned comparison of the magnitude's bits minus one. */
MC_INLINE int mc_erf_far_f32(float x) {
    return (mc_bits_f32(x) & 0x7fffffffu) - 1u < 0x0d7fffffu;
}
#else
MC_INLINE float mc_erf_near_f32(float x) { return mc_erf_f32(x); }
MC_INLINE int mc_erf_far_f32(float x) { (void)x; return 0; }
#endif

/* ---- sin and cos: branch-free and vectorisable, max error <= 2 ulp over all floats ---- */

/* 2/pi in pieces of 29 bits, MC_2_PI_0 + MC_2_PI_1 + ... (its base-2^29 digits, computed with
   mpmath), so that the product of a float (24 bits) and a piece is exact in double. */
#define MC_2_PI_0 0x1.45f306dp-1
#define MC_2_PI_1 0x1.9391054p-30
#define MC_2_PI_2 0x1.4fe13abp-59
#define MC_2_PI_3 0x1.d1f534dp-88
#define MC_2_PI_4 0x1.b81b6c5p-117
#define MC_2_PI_5 0x1.5993c4p-148
#define MC_2_PI_6 0x1.c820ff2p-175

/* x 2/pi = k + f with |f| <= 1/2 + 2^-25 (x = k pi/2 + f pi/2), for every float x >= 0: f as a
   double, k mod 4 in *quadrant.

   Payne-Hanek's reduction without its table. A piece whose product with x is a multiple of 4
   does not change x 2/pi mod 4 and is skipped: a float x >= 2^54 is a multiple of 2^31 and
   MC_2_PI_0 one of 2^-29; from 2^83 on, x MC_2_PI_1 is a multiple of 4 too, and so on.
   The four pieces after the skipped ones suffice for every x: the rest adds less than
   2^54 2^-116 = 2^-62 to f, and |f| >= 2^-29.9 over all floats (least at x = 16367173 * 2^72,
   by an exhaustive search), so f keeps a relative error below 2^-32. The pieces are picked by
   selects, not from a table indexed by x's exponent, which takes gathers to vectorise.
   This is the exact path; below 2^18 the near versions (Cody-Waite in float, further down)
   cost a third of it, and the code generator uses them where a loop can be run again. */
MC_INLINE double mc_reduce_pio2_f32(float ax, uint32_t* quadrant) {
    double x = (double)ax;
    int big1 = x >= 0x1p54, big2 = x >= 0x1p83, big3 = x >= 0x1p112;
    double p0 = big3 ? MC_2_PI_3 : big2 ? MC_2_PI_2 : big1 ? MC_2_PI_1 : MC_2_PI_0;
    double p1 = big3 ? MC_2_PI_4 : big2 ? MC_2_PI_3 : big1 ? MC_2_PI_2 : MC_2_PI_1;
    double p2 = big3 ? MC_2_PI_5 : big2 ? MC_2_PI_4 : big1 ? MC_2_PI_3 : MC_2_PI_2;
    double p3 = big3 ? MC_2_PI_6 : big2 ? MC_2_PI_5 : big1 ? MC_2_PI_4 : MC_2_PI_3;
    /* Exact products, t0 < 2^54, t1 < 2^25, t2 < 2^-4, t3 < 2^-33. Adding then subtracting
       1.5 * 2^54 rounds t0 to a multiple of 4, which leaves |t0| <= 4. */
    double t0 = x * p0, t1 = x * p1, t2 = x * p2, t3 = x * p3;
    t0 = t0 - ((t0 + 0x1.8p54) - 0x1.8p54);
    /* k = rint(t0 + t1 + t2) by the 1.5 * 2^52 trick, its low bits read from the mantissa.
       t0 - k is exact (an integer below 2^26 where t0's last bit is worth 1 or more; else
       within 2^-28.5 t0 + 1 of 0, while t0's last bit is worth 2^-52 t0 or more) but where
       f is near +-1/2 and k = 1; the sums after it round relative to their own values, and
       (t0 - k) + t1 is exact unless |t2| < 2^-29, so f is within 2^-51 |f| + 2^-61 of its
       value. An exhaustive test over all floats finds sin and cos within 0.99 ulp. */
    double shifted = ((t0 + t1) + t2) + 0x1.8p52;
    *quadrant = (uint32_t)mc_bits_f64(shifted);
    return (((t0 - (shifted - 0x1.8p52)) + t1) + t2) + t3;
}

/* sin(ax + shift pi/2) for ax >= 0: sin(r) or cos(r) of r = f pi/2 by the quadrant, negated in
   the upper two. The polynomials are evaluated in float on r = rh + rl (its double value split
   in two floats): sin(r) = r + r s S(s) and cos(r) = 1 - s/2 + s^2 C(s), s = rh^2, S and C
   quadratics fitted by Chebyshev interpolation in mpmath on |r| <= pi/4 (1 + 2^-20), relative
   errors < 2^-26 and 2^-29. */
MC_INLINE float mc_sin_shifted_f32(float ax, uint32_t shift) {
    uint32_t quadrant;
    double f = mc_reduce_pio2_f32(ax, &quadrant);
    quadrant += shift;
    double r = f * 1.5707963267948966;
    float rh = (float)r;
    float rl = (float)(r - (double)rh);
    float s = rh * rh;
    float ps = -1.958789071e-04f;
    ps = ps * s + 8.332747966e-03f;
    ps = ps * s + -1.666666418e-01f;
    float sin_r = rh + (rl + rh * (s * ps));
    /* w = 1 - s/2 rounded, its rounding error (1 - w) - s/2 (exact) added back with the small
       terms; cos(rh + rl) = cos(rh) - rh rl to first order. */
    float pc = 2.454794230e-05f;
    pc = pc * s + -1.388830249e-03f;
    pc = pc * s + 4.166666418e-02f;
    float hs = 0.5f * s;
    float w = 1.0f - hs;
    float cos_r = w + (((1.0f - w) - hs) + ((s * s) * pc - rh * rl));
    float v = mc_select_f32((int)(quadrant & 1u), cos_r, sin_r);
    return mc_from_bits_f32(mc_bits_f32(v) ^ ((quadrant & 2u) << 30));
}

/* sin is odd: computed on |x|, then given x's sign, so sin(-0) = -0. NaN and +-inf give NaN
   (inf MC_2_PI_0 - inf in the reduction). */
MC_INLINE float mc_sin_f32(float x) {
    float v = mc_sin_shifted_f32(fabsf(x), 0u);
    return mc_from_bits_f32(mc_bits_f32(v) ^ (mc_bits_f32(x) & 0x80000000u));
}

MC_INLINE float mc_cos_f32(float x) { return mc_sin_shifted_f32(fabsf(x), 1u); }

/* Near sin and cos: |x| <= 2^18, max error 1.54 ulp (an exhaustive test over those floats;
   the exact versions' is 0.99 ulp, Sleef's u35 that Inductor calls allows 3.5).
   Cody-Waite in float: q = rint(x 2/pi) by an fma with the 1.5 * 2^23 trick, then
   r = x - q pi/2 with pi/2 in three floats P1 + P2 + P3 (72 bits, by mpmath). x - q P1 is exact
   in the fma (q P1 and x >= 1 are multiples of 2^-23 and |r| < 1; below 1, q <= 1); the other
   two round once each, so |r| is off by at most about an ulp of itself. Where r is tiny,
   x is a multiple of pi/2 to many bits, r - q P2 is exact too, and r stays accurate relative
   to itself. x times 2/pi's float is exact in the fma, but that float is 2^-25 relative off:
   below 2^18, q P1 is then within 2^-6.6 pi/4 of the nearest multiple, and the polynomials are
   fitted to |r| <= pi/4 (1 + 2^-6). Beyond the bound the error grows with that drift and with
   q P3's rounding (1.56 ulp below 2^19, 1.67 below 2^20, by the same test). */
#define MC_TRIG_NEAR_F32 0x1p18f

#ifdef MC_NEAR_MATH
MC_INLINE float mc_sin_shifted_near_f32(float ax, uint32_t shift) {
    float shifted = fmaf(ax, 0x1.45f306p-1f, 0x1.8p23f);
    float q = shifted - 0x1.8p23f;
    uint32_t quadrant = mc_bits_f32(shifted) + shift;
    float r = fmaf(-q, 0x1.921fb6p+0f, ax);
    r = fmaf(-q, -0x1.777a5cp-25f, r);
    r = fmaf(-q, -0x1.ee59dap-50f, r);
    /* sin r = r + r s S(s), cos r = 1 + s C(s), s = r^2, S and C fitted in mpmath (Lawson's
       iteration towards minimax relative error over |r| <= pi/4 (1 + 2^-6)), relative errors
       below 2^-27 and 2^-30. */
    float s = r * r;
    float ps = -1.9505032105e-04f;
    ps = ps * s + 8.3320857957e-03f;
    ps = ps * s + -1.6666653752e-01f;
    float sin_r = fmaf(r * s, ps, r);
    float pc = 2.4421440685e-05f;
    pc = pc * s + -1.3887214009e-03f;
    pc = pc * s + 4.1666641831e-02f;
    pc = pc * s + -0.5f;
    float cos_r = fmaf(s, pc, 1.0f);
    /* The odd quadrants take cos r: a mask from the quadrant's low bit, shifted into the sign
       and spread by the arithmetic shift (three vector instructions, mc_select_f32's five). */
    uint32_t odd = (uint32_t)((int32_t)(quadrant << 31) >> 31);
    uint32_t v = (mc_bits_f32(cos_r) & odd) | (mc_bits_f32(sin_r) & ~odd);
    return mc_from_bits_f32(v ^ ((quadrant & 2u) << 30));
}

/* sin(-0) = -0 as in mc_sin_f32; NaN gives NaN; infinities are far (and give NaN too). */
MC_INLINE float mc_sin_near_f32(float x) {
    float v = mc_sin_shifted_near_f32(fabsf(x), 0u);
    return mc_from_bits_f32(mc_bits_f32(v) ^ (mc_bits_f32(x) & 0x80000000u));
}

MC_INLINE float mc_cos_near_f32(float x) { return mc_sin_shifted_near_f32(fabsf(x), 1u); }

MC_INLINE int mc_trig_far_f32(float x) { return fabsf(x) > MC_TRIG_NEAR_F32; }
#else
MC_INLINE float mc_sin_near_f32(float x) { return mc_sin_f32(x); }
MC_INLINE float mc_cos_near_f32(float x) { return mc_cos_f32(x); }
MC_INLINE int mc_trig_far_f32(float x) { (void)x; return 0; }
#endif

/* ---- log: branch-free and vectorisable, max error <= 2 ulp over all floats ---- */

/* m with x = 2^e m, m in [sqrt(1/2), sqrt(2)), for x > 0, from the bits: subtracting the bits
   of sqrt(1/2) (0x3f3504f3) makes the exponent field count e from there, and adding them back
   to the mantissa field gives m. A subnormal x is scaled by 2^23 first (a select: both are
   computed). Other x give meaningless finite values. */
MC_INLINE float mc_log_split_f32(float x, int32_t* e) {
    uint32_t tiny = 0u - (uint32_t)(x < 0x1p-126f);
    uint32_t u = (mc_bits_f32(x * 0x1p23f) & tiny) | (mc_bits_f32(x) & ~tiny);
    uint32_t t = u - 0x3f3504f3u;
    *e = ((int32_t)t >> 23) - (int32_t)(tiny & 23u);
    return mc_from_bits_f32((t & 0x7fffffu) + 0x3f3504f3u);
}

MC_INLINE float mc_log_f32(float x) {
    int32_t e;
    float m = mc_log_split_f32(x, &e);
    /* log(1 + f) = f - f^2/2 + f^3 P(f), f = m - 1 in [-0.293, 0.415] (exact by Sterbenz's
       lemma), P of degree 8 fitted by Chebyshev interpolation in mpmath (f^3 P within 2^-27
       of its value relative to log(1 + f)). log(1) = 0 exactly: e and f are 0. An
       exhaustive test over all floats finds log within 1.18 ulp. */
    float f = m - 1.0f;
    float p = 6.971611828e-02f;
    p = p * f + -1.147973388e-01f;
    p = p * f + 1.168541983e-01f;
    p = p * f + -1.242568716e-01f;
    p = p * f + 1.424905807e-01f;
    p = p * f + -1.666780263e-01f;
    p = p * f + 2.000071555e-01f;
    p = p * f + -2.499999702e-01f;
    p = p * f + 3.333333135e-01f;
    float f2 = f * f;
    float hf2 = 0.5f * f2;
    /* e ln2 in two parts: ln2 rounded down to 16 bits (so e times it is exact, |e| < 256), and
       the rest. Where e != 0, |e ln2| >= 0.69 > 2 |log(1 + f)|: the sum does not cancel. */
    float ef = (float)e;
    float r = ef * 0.693145751953125f + ((f - hf2) + (f2 * f * p + ef * 1.428606765e-06f));
    /* log(+-0) = -inf, log(x < 0) = NaN, log(NaN) = NaN, log(inf) = inf. */
    float nonpositive = x == 0.0f ? -INFINITY : NAN;
    r = mc_select_f32(x > 0.0f, r, nonpositive);
    return mc_select_f32(x == INFINITY, x, r);
}

/* ---- pow: branch-free and vectorisable, max error <= 2 ulp ---- */

/* |x|^y = 2^(y log2|x|), in double: where the result is a finite nonzero float, |y log2|x||
   < 150, and y log2|x| must be within 2^-28 of its value for the result to be within 0.01 ulp
   of its, so log2|x| needs a relative error below 2^-36: out of reach in float.
   log2(1 + f) = f Q(f) with Q of degree 13 (relative error < 2^-38) and 2^g = E(g) on
   |g| <= 1/2 of degree 8 (< 2^-39), fitted by Chebyshev interpolation in mpmath. The double
   result is rounded to float once, which rounds subnormal results correctly too, and
   overflows to inf; the tests' samples find pow within 0.51 ulp. */
MC_INLINE float mc_pow_f32(float x, float y) {
    float ax = fabsf(x);
    int32_t e;
    double f = (double)(mc_log_split_f32(ax, &e) - 1.0f);
    double q = -6.80628759039059589e-02;
    q = q * f + 1.31137437536866824e-01;
    q = q * f + -1.34789287383660417e-01;
    q = q * f + 1.30628902560210952e-01;
    q = q * f + -1.42523407554100173e-01;
    q = q * f + 1.60182261302960260e-01;
    q = q * f + -1.80432685210201171e-01;
    q = q * f + 2.06108695283066246e-01;
    q = q * f + -2.40446626777273048e-01;
    q = q * f + 2.88538762329967446e-01;
    q = q * f + -3.60673789771006947e-01;
    q = q * f + 4.80898349072796105e-01;
    q = q * f + -7.21347520343086357e-01;
    q = q * f + 1.44269504088620337e+00;
    double l2 = (double)e + f * q;
    /* log2 of 0 is -inf, of inf inf, of NaN NaN (the split gave them finite values). */
    double special = mc_select_f64(ax == 0.0f, -(double)INFINITY, (double)ax);
    l2 = mc_select_f64((ax > 0.0f) & (ax < INFINITY), l2, special);
    double z = (double)y * l2;
    /* Clamped (NaN passes; masks, as GCC makes branches of these ?:): 2^200 overflows a
       float, 2^-200 rounds to 0, and 2^k stays a normal double. k = rint(z) by the
       1.5 * 2^52 trick; its low bits, plus the bias, shifted into the exponent give 2^k
       (1.5 * 2^52 has zeros in its low 12 bits). */
    z = mc_select_f64(z > 200.0, 200.0, z);
    z = mc_select_f64(z < -200.0, -200.0, z);
    double shifted = z + 0x1.8p52;
    double g = z - (shifted - 0x1.8p52);
    double p = 1.32552248786688168e-06;
    p = p * g + 1.53100794022492960e-05;
    p = p * g + 1.54034558524538382e-04;
    p = p * g + 1.33334505680006454e-03;
    p = p * g + 9.61812915940255843e-03;
    p = p * g + 5.55041094120593270e-02;
    p = p * g + 2.40226506958129887e-01;
    p = p * g + 6.93147180545933494e-01;
    p = p * g + 1.0;
    double scale = mc_from_bits_f64((mc_bits_f64(shifted) + 1023u) << 52);
    float r = (float)(p * scale);
    /* C99's special cases, which PyTorch follows. y is an integer if |y| >= 2^23 or rounding
       it (adding and subtracting 2^23) leaves it unchanged; an odd one is below 2^24. A
       negative x (-0 and -inf included) with an odd y negates the result; a finite negative
       x with a non-integral y gives NaN. */
    float ay = fabsf(y);
    int is_int = (ay >= 0x1p23f) | ((ay + 0x1p23f) - 0x1p23f == ay);
    int32_t yi = (int32_t)(ay < 0x1p24f ? ay : 0.0f);
    uint32_t odd = 0u - (uint32_t)(is_int & yi & 1);
    r = mc_from_bits_f32(mc_bits_f32(r) ^ (mc_bits_f32(x) & 0x80000000u & odd));
    r = mc_select_f32((x < 0.0f) & (x > -INFINITY) & !is_int, NAN, r);
    /* pow(x, +-0) = 1 and pow(1, y) = 1, even for NaN; pow(-1, +-inf) = 1. */
    return mc_select_f32((y == 0.0f) | (x == 1.0f) | ((x == -1.0f) & (ay == INFINITY)), 1.0f, r);
}

/* ---- transposes ---- */

#ifdef __AVX__
/* Transposes the 8x8 block of rows r[0..7] in registers: unpack pairs of rows, shuffle pairs
   of pairs, then swap 128-bit halves (24 shuffles). */
MC_INLINE void mc_transpose8_regs_f32(__m256* r) {
    __m256 t[8];
    for (int i = 0; i < 4; ++i) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 2; ++i) {
        r[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        r[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
        r[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        r[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
    for (int i = 0; i < 4; ++i) {
        t[i] = _mm256_permute2f128_ps(r[i], r[i + 4], 0x20);
        t[i + 4] = _mm256_permute2f128_ps(r[i], r[i + 4], 0x31);
    }
    for (int i = 0; i < 8; ++i) r[i] = t[i];
}
#endif

/* dst[j * 16 + i] = src[i * stride + j] for i, j < 16: a 16x16 tile of a strided matrix read
   row by row and written transposed into a local array, through registers (GCC vectorises
   neither the strided gathers nor the scattered stores of the plain loops well). */
MC_INLINE void mc_transpose16_f32(const float* src, int64_t stride, float* dst) {
#if defined(__AVX512F__)
    /* Rows in 16 zmm registers: unpack pairs, shuffle pairs of pairs, then exchange 128-bit
       lanes twice (64 shuffles). */
    __m512 r[16], t[16];
    for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(src + i * stride);
    for (int i = 0; i < 8; ++i) {
        t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 4; ++i) {
        r[4 * i] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        r[4 * i + 1] = _mm512_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
        r[4 * i + 2] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        r[4 * i + 3] = _mm512_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
    for (int i = 0; i < 2; ++i) {
        for (int j = 0; j < 4; ++j) {
            t[8 * i + j] = _mm512_shuffle_f32x4(r[8 * i + j], r[8 * i + 4 + j], 0x88);
            t[8 * i + 4 + j] = _mm512_shuffle_f32x4(r[8 * i + j], r[8 * i + 4 + j], 0xDD);
        }
    }
    for (int j = 0; j < 8; ++j) {
        _mm512_storeu_ps(dst + 16 * j, _mm512_shuffle_f32x4(t[j], t[8 + j], 0x88));
        _mm512_storeu_ps(dst + 16 * (8 + j), _mm512_shuffle_f32x4(t[j], t[8 + j], 0xDD));
    }
#elif defined(__AVX__)
    /* Four 8x8 blocks, block (bi, bj) of src to block (bj, bi) of dst. */
    for (int bi = 0; bi < 2; ++bi) {
        for (int bj = 0; bj < 2; ++bj) {
            __m256 r[8];
            const float* block = src + 8 * bi * stride + 8 * bj;
            for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(block + i * stride);
            mc_transpose8_regs_f32(r);
            for (int j = 0; j < 8; ++j) _mm256_storeu_ps(dst + (8 * bj + j) * 16 + 8 * bi, r[j]);
        }
    }
#else
    for (int i = 0; i < 16; ++i) {
        for (int j = 0; j < 16; ++j) dst[j * 16 + i] = src[i * stride + j];
    }
#endif
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
