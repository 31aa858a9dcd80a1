/* minicomp helpers shared by the CPU runtime (runtime.h) and the CUDA device header (device.h),
   spliced into each of them where it includes this file; the code generators inline it, so
   generated sources stay self-contained.

   The including header first defines:
     MC_FN        the qualifiers of every helper (runtime.h: MC_INLINE, device.h: MC_DEVICE);
     MC_FN_PLAIN  those of the helpers with loops, which the CPU runtime leaves to the
                  compiler to inline or not (static inline), and device.h gives MC_DEVICE;
   and before them mc_bits_f32 / mc_from_bits_f32, mc_exp_f32, the math library and the
   INFINITY, NAN and M_PI constants. MC_NATIVE_ERFINV, when defined, makes mc_erfinv_* the
   target's own erfinvf / erfinv (CUDA's) instead of the portable version below. */
#ifndef MINICOMP_COMMON_H
#define MINICOMP_COMMON_H

/* ---- bfloat16, stored as uint16_t bit patterns ---- */

MC_FN float mc_bf16_to_f32(uint16_t h) { return mc_from_bits_f32((uint32_t)h << 16); }

/* Round to nearest even; NaN becomes 0x7fc0 (PyTorch's canonical bfloat16 NaN). */
MC_FN uint16_t mc_f32_to_bf16(float f) {
    uint32_t x = mc_bits_f32(f);
    uint32_t rounded = (x + 0x7fffu + ((x >> 16) & 1u)) >> 16;
    return (uint16_t)(f != f ? 0x7fc0u : rounded);
}

/* ---- float8 (e4m3fn, e5m2, e4m3fnuz, e5m2fnuz), stored as uint8_t bit patterns ----
   PyTorch's conversions bit for bit (c10's fp8*_from_fp32_value / fp8*_to_fp32_value; ir/float8.py
   is the same algorithm in numpy and says what each format does at the edges), in software on
   every target: the GPU's cvt.rn.satfinite.{e4m3,e5m2}x2.f32 (sm_89+) saturates e5m2 too, and
   gives no sign to a NaN, where PyTorch's own CUDA kernels run this same bit arithmetic. Every
   path is computed and the result chosen by masks, so that GCC vectorises loops over them.
   M is the format's mantissa bits, B its exponent bias. */

MC_FN uint32_t mc_select_u32(uint32_t c, uint32_t a, uint32_t b) {
    uint32_t m = 0u - c;
    return (a & m) | (b & ~m);
}

/* The format's magnitude bits for |x| (float32 bits `ax`) below its overflow. Below the smallest
   normal, adding 2^(24 - B - M) puts the value where float32's ulp is the format's smallest
   subnormal, so the adder's rounding is the one wanted (no flush: never built with -ftz);
   above, rebias the exponent and round the dropped bits to nearest even. */
MC_FN uint32_t mc_f8_round(uint32_t ax, uint32_t M, uint32_t B) {
    uint32_t magic = (127u + 1u - B - M + 23u) << 23;
    uint32_t sub = mc_bits_f32(mc_from_bits_f32(ax) + mc_from_bits_f32(magic)) - magic;
    uint32_t shift = 23u - M;
    uint32_t normal = (ax - ((127u - B) << 23) + ((1u << (shift - 1u)) - 1u) + ((ax >> shift) & 1u))
                      >> shift;
    return mc_select_u32(ax < ((127u + 1u - B) << 23), sub, normal);
}

/* The float32 bits of magnitude bits `em` (sign cleared), special values aside. A subnormal
   counts units of 2^(1 - B - M): put it in the mantissa of the power of two with that ulp and
   subtract the power, exactly. */
MC_FN uint32_t mc_f8_widen(uint32_t em, uint32_t M, uint32_t B) {
    uint32_t magic = (127u + 1u - B - M + 23u) << 23;
    uint32_t sub = mc_bits_f32(mc_from_bits_f32(magic | em) - mc_from_bits_f32(magic));
    uint32_t normal = (em << (23u - M)) + ((127u - B) << 23);
    return mc_select_u32(em < (1u << M), sub, normal);
}

/* e4m3fn: no infinity; 0x7f is NaN. Overflow (at and beyond 480, or rounding up into 0x7f)
   and infinities saturate at 448 (PyTorch 2.12 and newer); the _nonsat version is older
   PyTorch's, NaN instead. NaN keeps its sign. */
MC_FN uint8_t mc_f32_to_f8e4m3fn(float f) {
    uint32_t x = mc_bits_f32(f), sign = (x >> 24) & 0x80u, ax = x & 0x7fffffffu;
    uint32_t mag = mc_f8_round(ax, 3u, 7u);
    mag = mc_select_u32((uint32_t)(ax >= 0x43f00000u) | (uint32_t)(mag == 0x7fu), 0x7eu, mag);
    return (uint8_t)(mc_select_u32(ax > 0x7f800000u, 0x7fu, mag) | sign);
}
MC_FN uint8_t mc_f32_to_f8e4m3fn_nonsat(float f) {
    uint32_t x = mc_bits_f32(f), sign = (x >> 24) & 0x80u, ax = x & 0x7fffffffu;
    return (uint8_t)(mc_select_u32(ax >= 0x43f00000u, 0x7fu, mc_f8_round(ax, 3u, 7u)) | sign);
}
MC_FN float mc_f8e4m3fn_to_f32(uint8_t h) {
    uint32_t sign = (uint32_t)(h & 0x80u) << 24, em = h & 0x7fu;
    uint32_t nan = 0x7f800000u | ((em & 7u) << 20);
    return mc_from_bits_f32(sign | mc_select_u32(em == 0x7fu, nan, mc_f8_widen(em, 3u, 7u)));
}

/* e5m2: IEEE-like; overflow gives infinity, NaN keeps its sign. */
MC_FN uint8_t mc_f32_to_f8e5m2(float f) {
    uint32_t x = mc_bits_f32(f), sign = (x >> 24) & 0x80u, ax = x & 0x7fffffffu;
    uint32_t mag = mc_select_u32(ax >= 0x47800000u, 0x7cu, mc_f8_round(ax, 2u, 15u));
    return (uint8_t)(mc_select_u32(ax > 0x7f800000u, 0x7fu, mag) | sign);
}
/* Infinities and NaNs keep their payload, NaNs quietened (c10 widens through float16). */
MC_FN float mc_f8e5m2_to_f32(uint8_t h) {
    uint32_t sign = (uint32_t)(h & 0x80u) << 24, em = h & 0x7fu, payload = (em & 3u) << 21;
    uint32_t special = 0x7f800000u | payload | ((uint32_t)(payload != 0u) << 22);
    return mc_from_bits_f32(sign | mc_select_u32(em >= 0x7cu, special, mc_f8_widen(em, 2u, 15u)));
}

/* fnuz: 0x80 is the one NaN (no infinity, no negative zero); overflow, infinities and NaN give
   it, and a negative value rounding to zero gives +0. */
#define MC_FLOAT8_FNUZ(S, M, B, OVERFLOW)                                        \
    MC_FN uint8_t mc_f32_to_##S(float f) {                                        \
        uint32_t x = mc_bits_f32(f), sign = (x >> 24) & 0x80u, ax = x & 0x7fffffffu; \
        uint32_t mag = mc_f8_round(ax, M, B);                                     \
        mag = mc_select_u32(mag == 0u, 0u, mag | sign);                           \
        return (uint8_t)mc_select_u32(ax >= (OVERFLOW), 0x80u, mag);              \
    }                                                                             \
    MC_FN float mc_##S##_to_f32(uint8_t h) {                                      \
        uint32_t sign = (uint32_t)(h & 0x80u) << 24;                              \
        uint32_t bits = sign | mc_f8_widen(h & 0x7fu, M, B);                      \
        return mc_from_bits_f32(mc_select_u32(h == 0x80u, 0x7f800001u, bits));    \
    }

MC_FLOAT8_FNUZ(f8e4m3fnuz, 3u, 8u, 0x43800000u)
MC_FLOAT8_FNUZ(f8e5m2fnuz, 2u, 16u, 0x47800000u)
#undef MC_FLOAT8_FNUZ

/* ---- max / min: NaN propagates for floats (torch.maximum); ties keep `a` like std::max ---- */

MC_FN float mc_max_f32(float a, float b) { return (a < b || b != b) ? b : a; }
MC_FN float mc_min_f32(float a, float b) { return (b < a || b != b) ? b : a; }
MC_FN double mc_max_f64(double a, double b) { return (a < b || b != b) ? b : a; }
MC_FN double mc_min_f64(double a, double b) { return (b < a || b != b) ? b : a; }

/* ---- integer helpers, one family per type (S is the IR's short type name) ---- */

#define MC_ORDER_HELPERS(T, S)                                                    \
    MC_FN T mc_max_##S(T a, T b) { return a < b ? b : a; }                   \
    MC_FN T mc_min_##S(T a, T b) { return b < a ? b : a; }

/* The divisions of kernels without an error flag (constant divisors, device functions). */
#define MC_PLAIN_DIVISION(T, S)                                                   \
    MC_FN T mc_div_##S(T a, T b) { return mc_checked_div_##S(a, b, 0); }     \
    MC_FN T mc_fmod_##S(T a, T b) { return mc_checked_fmod_##S(a, b, 0); }   \
    MC_FN T mc_floordiv_##S(T a, T b) { return mc_checked_floordiv_##S(a, b, 0); } \
    MC_FN T mc_mod_##S(T a, T b) { return mc_checked_mod_##S(a, b, 0); }

/* Integer division never traps. A zero divisor gives 0 and, when `flag` is not 0, stores 1 in
   the int32 at address `flag` (a kernel's error_flag): the host then raises PyTorch's
   ZeroDivisionError. Every writer stores the same 1, so racing threads agree. */
MC_FN void mc_flag_zero_division(uint64_t flag) {
    if (flag) *(volatile int32_t*)flag = 1;
}

/* An index read from a tensor, checked against the size of the dimension it indexes: out of
   range, it stores `code` in the error flag (the host raises eager's IndexError) and gives 0,
   so that the load it feeds stays in bounds. The sizes are never 0 (ir/error_flag.py). */
MC_FN int64_t mc_checked_index(int64_t i, int64_t size, int64_t code, uint64_t flag) {
    if ((uint64_t)i < (uint64_t)size) return i;
    if (flag) *(volatile int32_t*)flag = (int32_t)code;
    return 0;
}

/* Truncating (div, fmod: C's / and %) and flooring (floordiv, mod: Python's) division, checked
   (with a flag) and plain (flag 0). MIN / -1 overflows, and x86's idiv faults on it: -1 is
   handled apart, the quotient wrapping to MIN (as PyTorch's floor division gives) and the
   remainder 0. The unsigned type U makes negation and repeated products wrap. */
#define MC_SIGNED_HELPERS(T, U, S)                                                \
    MC_ORDER_HELPERS(T, S)                                                        \
    MC_FN T mc_abs_##S(T a) { return a < 0 ? (T)((U)0 - (U)a) : a; }         \
    MC_FN T mc_checked_div_##S(T a, T b, uint64_t flag) {                     \
        if (b == 0) { mc_flag_zero_division(flag); return 0; }                   \
        return b == -1 ? (T)((U)0 - (U)a) : (T)(a / b);                          \
    }                                                                             \
    MC_FN T mc_checked_fmod_##S(T a, T b, uint64_t flag) {                    \
        if (b == 0) { mc_flag_zero_division(flag); return 0; }                   \
        return b == -1 ? 0 : (T)(a % b);                                         \
    }                                                                             \
    MC_FN T mc_checked_floordiv_##S(T a, T b, uint64_t flag) {                \
        if (b == 0) { mc_flag_zero_division(flag); return 0; }                   \
        if (b == -1) return (T)((U)0 - (U)a);                                     \
        T q = (T)(a / b), r = (T)(a % b);                                         \
        return (r != 0 && ((r < 0) != (b < 0))) ? (T)(q - 1) : q;                 \
    }                                                                             \
    MC_FN T mc_checked_mod_##S(T a, T b, uint64_t flag) {                     \
        if (b == 0) { mc_flag_zero_division(flag); return 0; }                   \
        if (b == -1) return 0;                                                    \
        T r = (T)(a % b);                                                         \
        return (r != 0 && ((r < 0) != (b < 0))) ? (T)(r + b) : r;                 \
    }                                                                             \
    MC_PLAIN_DIVISION(T, S)                                                       \
    MC_FN T mc_pow_##S(T a, T b) {                                            \
        if (b < 0) return a == 1 ? 1 : a == -1 ? ((b & 1) ? -1 : 1) : 0;          \
        U r = 1, x = (U)a;                                                        \
        for (; b; b >>= 1) { if (b & 1) r *= x; x *= x; }                         \
        return (T)r;                                                              \
    }

#define MC_UNSIGNED_HELPERS(T, S)                                                 \
    MC_ORDER_HELPERS(T, S)                                                        \
    MC_FN T mc_abs_##S(T a) { return a; }                                     \
    MC_FN T mc_checked_div_##S(T a, T b, uint64_t flag) {                     \
        if (b == 0) { mc_flag_zero_division(flag); return 0; }                   \
        return (T)(a / b);                                                        \
    }                                                                             \
    MC_FN T mc_checked_fmod_##S(T a, T b, uint64_t flag) {                    \
        if (b == 0) { mc_flag_zero_division(flag); return 0; }                   \
        return (T)(a % b);                                                        \
    }                                                                             \
    MC_FN T mc_checked_floordiv_##S(T a, T b, uint64_t flag) {                \
        return mc_checked_div_##S(a, b, flag);                                    \
    }                                                                             \
    MC_FN T mc_checked_mod_##S(T a, T b, uint64_t flag) {                     \
        return mc_checked_fmod_##S(a, b, flag);                                   \
    }                                                                             \
    MC_PLAIN_DIVISION(T, S)                                                       \
    MC_FN T mc_pow_##S(T a, T b) {                                            \
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
    MC_FN T mc_floordiv_##S(T a, T b) {                                       \
        if (b == 0) return a / b;                                                 \
        T m = fmod##SUF(a, b);                                                    \
        T d = (a - m) / b;                                                        \
        if (m != 0 && ((b < 0) != (m < 0))) d -= 1;                               \
        if (d == 0) return copysign##SUF((T)0, a / b);                            \
        T f = floor##SUF(d);                                                      \
        /* (a - m) / b is an integer up to rounding: snap to the nearest one. */  \
        return d - f > (T)0.5 ? f + 1 : f;                                        \
    }                                                                             \
    MC_FN T mc_mod_##S(T a, T b) {                                            \
        T m = fmod##SUF(a, b);                                                    \
        return (m != 0 && ((b < 0) != (m < 0))) ? m + b : m;                      \
    }

MC_FLOAT_DIVMOD(float, f32, f)
MC_FLOAT_DIVMOD(double, f64, )

/* ---- math helpers written the same for every target ---- */

/* e / (1 + e) with e = exp(-|x|): no overflow of exp for negative x, so results far below
   zero keep their (subnormal) precision instead of flushing to 0. */
MC_FN float mc_sigmoid_f32(float x) {
    float e = mc_exp_f32(-fabsf(x));
    return (x >= 0 ? 1.0f : e) / (1.0f + e);
}
MC_FN double mc_sigmoid_f64(double x) {
    double e = exp(-fabs(x));
    return (x >= 0 ? 1.0 : e) / (1.0 + e);
}

/* Exact gelu in double by its definition (float32's is each target's own: the CPU runtime's
   polynomials, CUDA's erff). */
MC_FN double mc_gelu_f64(double x) { return x * 0.5 * (1.0 + erf(x * 0.7071067811865476)); }


/* 0/1 results whatever the macros return (signbit may give any nonzero int). */
#define mc_isnan(x) (isnan(x) ? 1 : 0)
#define mc_isinf(x) (isinf(x) ? 1 : 0)
#define mc_signbit(x) (signbit(x) ? 1 : 0)

/* digamma for x > 0: climb to x >= 10 by psi(x) = psi(x + 1) - 1/x, then the asymptotic
   series ln x - 1/2x - sum B_2k / (2k x^2k), truncated where its terms drop below 1e-17. */
MC_FN_PLAIN double mc_digamma_positive(double x) {
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
MC_FN_PLAIN double mc_digamma_f64(double x) {
    if (x == 0) return copysign((double)INFINITY, -x);
    if (x < 0) {
        if (x == floor(x)) return (double)NAN;
        /* Reflection psi(x) = psi(1 - x) - pi / tan(pi x); tan has period pi, so reduce x
           exactly to |f| <= 1/2 first: pi * f then keeps its relative precision at the poles. */
        double f = x - rint(x);
        return mc_digamma_positive(1.0 - x) - M_PI / tan(M_PI * f);
    }
    return x != x ? x : mc_digamma_positive(x);
}

MC_FN float mc_digamma_f32(float x) { return (float)mc_digamma_f64((double)x); }

#ifdef MC_NATIVE_ERFINV
MC_FN float mc_erfinv_f32(float x) { return erfinvf(x); }
MC_FN double mc_erfinv_f64(double x) { return erfinv(x); }
#else
/* Inverse error function: a rational first guess (M. Giles's single-precision fit, "Approximating
   the erfinv function", 2010) refined by Newton steps on erf in double precision. */
MC_FN_PLAIN double mc_erfinv_guess(double y) {
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

MC_FN_PLAIN double mc_erfinv_refined(double y, int steps) {
    if (y != y || y < -1.0 || y > 1.0) return (double)NAN;
    if (y == 1.0 || y == -1.0) return copysign((double)INFINITY, y);
    double x = mc_erfinv_guess(y);
    double t = fabs(y);
    for (int i = 0; i < steps; ++i) {
        /* The residual erf(x) - y; for |y| > 1/2 as (1 - |y|) - erfc(|x|) with the sign of y,
           since 1 - |y| is exact there and erfc keeps its relative precision in the tail,
           where erf(x) - y would cancel. */
        double r = t > 0.5 ? ((1.0 - t) - erfc(fabs(x))) * (y < 0 ? -1.0 : 1.0) : erf(x) - y;
        /* erf'(x) = 2/sqrt(pi) exp(-x^2) */
        x -= r * (0.886226925452758014 * exp(x * x));
    }
    return x;
}

MC_FN double mc_erfinv_f64(double y) { return mc_erfinv_refined(y, 3); }
MC_FN float mc_erfinv_f32(float y) { return (float)mc_erfinv_refined((double)y, 2); }
#endif

#endif /* MINICOMP_COMMON_H */
