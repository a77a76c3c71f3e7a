/* Scalar math shared by radixgate's C kernels (native.c, native_extend.c). */
#ifndef RADIXGATE_NATIVE_MATH_H
#define RADIXGATE_NATIVE_MATH_H

#include <math.h>
#include <stdint.h>
#include <string.h>

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

#endif
