/* Scalar math shared by radixgate's C kernels (native.c, native_extend.c): e^x, float16
 * conversions and the int8 KV quantization. */
#ifndef RADIXGATE_NATIVE_MATH_H
#define RADIXGATE_NATIVE_MATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#endif

/* e^x for x <= 0 (a score minus its row's peak), branch-free so the loop vectorizes:
 * x = n ln2 + r, |r| <= ln2/2, e^r by its degree-6 Taylor polynomial (relative error
 * under 3e-7), 2^n put in the exponent bits; below -87 it is 2^-126 times e^(x+87)... 0. */
static inline float exp_nonpositive(float x) {
    x = x < -87.0f ? -87.0f : x;
    float n = floorf(x * 1.44269504088896341f + 0.5f);
    float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float p = 1.0f + r * (1.0f + r * (0.5f + r * (1.6666667e-1f + r * (4.1666668e-2f
              + r * (8.3333338e-3f + r * 1.3888889e-3f)))));
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

/* A float16's value (bits h) as float32: exact. */
static inline float half_value(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16, e = (h >> 10) & 0x1fu, m = h & 0x3ffu, bits;
    if (e == 0) {                                   /* zero or subnormal: m * 2^-24 */
        float f = (float)m * 5.9604644775390625e-8f;
        return sign ? -f : f;
    }
    bits = sign | (e == 0x1f ? 0x7f800000u | (m << 13) : ((e + 112u) << 23) | (m << 13));
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* f rounded to float16 bits, to nearest even (as torch's .to(float16)); f finite. */
static inline uint16_t half_bits(float f) {
    uint32_t x;
    memcpy(&x, &f, sizeof x);
    uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    x &= 0x7fffffffu;
    if (x >= 0x477ff000u) return sign | 0x7c00u;         /* rounds past 65504: infinity */
    if (x < 0x38800000u) {                               /* below 2^-14: a subnormal */
        float a;
        memcpy(&a, &x, sizeof a);
        return sign | (uint16_t)rintf(a * 16777216.0f); /* exact scaling; 1024 is 2^-14 */
    }
    return sign | (uint16_t)((x + 0xfffu + ((x >> 13) & 1u) - 0x38000000u) >> 13);
}

/* One (token, head) row of d values to int8 codes and its float16 scale, the arithmetic of
 * kernels/reference.py quantize_kv: scale = f16(clamp(absmax / 127, 2^-24, 65504)), code =
 * round-half-even(clamp(x / scale, -127, 127)). */
static inline void quantize_row_i8(const float *x, long d, int8_t *codes, uint16_t *scale) {
    float peak = 0.f;
    long i = 0;
#if defined(__AVX512F__)
    __m512 peaks = _mm512_setzero_ps();
    for (; i + 16 <= d; i += 16) peaks = _mm512_max_ps(peaks, _mm512_abs_ps(_mm512_loadu_ps(x + i)));
    peak = _mm512_reduce_max_ps(peaks);                 /* max is exact in any order */
#endif
    for (; i < d; i++) peak = fabsf(x[i]) > peak ? fabsf(x[i]) : peak;
    float s = peak / 127.0f;
    s = s < 5.9604644775390625e-8f ? 5.9604644775390625e-8f : s > 65504.0f ? 65504.0f : s;
    *scale = half_bits(s);
    const float sf = half_value(*scale);
    i = 0;
#if defined(__AVX512F__)
    const __m512 sv = _mm512_set1_ps(sf), lo = _mm512_set1_ps(-127.0f), hi = _mm512_set1_ps(127.0f);
    for (; i + 16 <= d; i += 16) {                      /* the same IEEE ops, 16 at once */
        __m512 c = _mm512_min_ps(_mm512_max_ps(_mm512_div_ps(_mm512_loadu_ps(x + i), sv), lo), hi);
        c = _mm512_roundscale_ps(c, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm_storeu_si128((__m128i *)(codes + i), _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(c)));
    }
#endif
    for (; i < d; i++) {
        float c = x[i] / sf;
        c = c < -127.0f ? -127.0f : c > 127.0f ? 127.0f : c;
        codes[i] = (int8_t)rintf(c);
    }
}

#endif
