/* radixgate's CPU kernels for the decode step's small ops (built by kernels/native.py).
 *
 * A decode step of a small model is mostly per-op overhead: torch's rms_norm of one
 * 576-float row costs ~11 us through ~8 dispatched ops, the lone row's attention ~27 us a
 * layer. These do the same arithmetic in one call each. Every reduction runs in a fixed
 * order per row (16 lanes, then the lanes summed in order, then the tail), so a row's
 * result never depends on how many rows a call has or on the thread count.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "native_math.h"
#ifdef _OPENMP
#include <omp.h>
#endif

#define LANES 16

/* How many workers a parallel region of ``threads`` gets here (1 when built without
 * OpenMP): the test that the kernels really share their work. */
int rg_parallel_width(int threads) {
    int width = 1;
#ifdef _OPENMP
    #pragma omp parallel num_threads(threads)
    {
        #pragma omp single
        width = omp_get_num_threads();
    }
#else
    (void)threads;
#endif
    return width;
}

static inline __attribute__((always_inline)) float dot(const float *a, const float *b, long n) {
    float acc[LANES] = {0};
    long i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int j = 0; j < LANES; j++) acc[j] += a[i + j] * b[i + j];
    for (int w = LANES / 2; w >= 1; w /= 2)        /* a fixed tree: 4 vector steps */
        for (int j = 0; j < w; j++) acc[j] += acc[j + w];
    float s = acc[0];
    for (; i < n; i++) s += a[i] * b[i];
    return s;
}

static inline float bf16_to_f32(uint16_t b) {
    union { uint32_t u; float f; } v;
    v.u = (uint32_t)b << 16;
    return v.f;
}

/* float32 -> bfloat16, round to nearest even (torch's rounding; NaN stays NaN). */
static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* x [rows, n] float32, in place: x += delta (delta_kind 0: none, 1: bfloat16, 2: float32);
 * then, when out is not NULL, out = x * 1/sqrt(mean(x^2) + eps) * w (HF's LlamaRMSNorm),
 * float32, or rounded to bfloat16 when out_bf16 (what torch's .to(bfloat16) gives). */
void rg_add_rms_norm(float *x, const void *delta, int delta_kind, const float *w, void *out,
                     int out_bf16, long rows, long n, float eps) {
    for (long r = 0; r < rows; r++) {
        float *xr = x + r * n;
        if (delta_kind == 1) {
            const uint16_t *d = (const uint16_t *)delta + r * n;
            for (long i = 0; i < n; i++) xr[i] += bf16_to_f32(d[i]);
        } else if (delta_kind == 2) {
            const float *d = (const float *)delta + r * n;
            for (long i = 0; i < n; i++) xr[i] += d[i];
        }
        if (out == NULL) continue;
        float inv = 1.0f / sqrtf(dot(xr, xr, n) / (float)n + eps);
        if (out_bf16) {
            uint16_t *o = (uint16_t *)out + r * n;
            for (long i = 0; i < n; i++) o[i] = f32_to_bf16((xr[i] * inv) * w[i]);
        } else {
            float *o = (float *)out + r * n;
            for (long i = 0; i < n; i++) o[i] = (xr[i] * inv) * w[i];
        }
    }
}

/* One kv head's query group of one row (inlined with d a constant where it is 64 or 128). */
static inline __attribute__((always_inline)) void attend_group(
        const float *qg, const float *k_cache, const float *v_cache, const int32_t *table,
        long len, long group, long hkv, long g, const long d, long bs, float scale,
        float *scores, float *og) {
    float peak[64], total[64];
    for (long h = 0; h < group; h++) peak[h] = -INFINITY, total[h] = 0.f;
    for (long b = 0, p = 0; p < len; b++) {          /* scores, their maxima */
        const float *kp = k_cache + ((long)table[b] * bs * hkv + g) * d;
        for (long end = p + bs < len ? p + bs : len; p < end; p++, kp += hkv * d)
            for (long h = 0; h < group; h++) {
                float s = dot(qg + h * d, kp, d) * scale;
                scores[h * len + p] = s;
                if (s > peak[h]) peak[h] = s;
            }
    }
    for (long h = 0; h < group; h++)                 /* weights, their sums in order */
        for (long p = 0; p < len; p++) {
            float w = exp_nonpositive(scores[h * len + p] - peak[h]);
            scores[h * len + p] = w;
            total[h] += w;
        }
    for (long i = 0; i < group * d; i++) og[i] = 0.f;
    for (long b = 0, p = 0; p < len; b++) {          /* each V row read once a group */
        const float *vp = v_cache + ((long)table[b] * bs * hkv + g) * d;
        for (long end = p + bs < len ? p + bs : len; p < end; p++, vp += hkv * d)
            for (long h = 0; h < group; h++) {
                float w = scores[h * len + p];
                float *acc = og + h * d;
                for (long i = 0; i < d; i++) acc[i] += w * vp[i];
            }
    }
    for (long h = 0; h < group; h++) {
        float inv = 1.0f / total[h];
        for (long i = 0; i < d; i++) og[h * d + i] *= inv;
    }
}

/* One query per row over its paged float32 K/V. q, out [rows, hq, d]; caches [blocks, bs,
 * hkv, d]; tables int32 [rows, table_stride] (block ids); lens int32 [rows] (positions
 * 0..len-1 are read). Query head h reads kv head h / (hq / hkv). The (row, kv head) items
 * are split among ``threads`` workers of the process's OpenMP pool (torch's: this library
 * is loaded beside it); each item runs whole on one worker in the same order, so the result
 * never depends on the thread count. Returns 0; -1 when a table names a block outside
 * [0, num_blocks) or a length exceeds its table (nothing is read past the caches or the
 * tables); -2 out of memory; -3 heads that do not group (hq % hkv) or groups over 64. */
int rg_decode_attention(const float *q, const float *k_cache, const float *v_cache,
                        const int32_t *tables, long table_stride, const int32_t *lens,
                        long rows, long hq, long hkv, long d, long bs, long num_blocks,
                        float scale, int threads, float *out) {
    long group = hq / hkv, max_len = 0;
    if (hkv <= 0 || hq % hkv != 0 || group > 64) return -3;
    for (long r = 0; r < rows; r++) {
        if (lens[r] > max_len) max_len = lens[r];
        if (lens[r] < 0 || lens[r] > table_stride * bs) return -1;
        for (long b = 0; b * bs < lens[r]; b++) {
            int32_t block = tables[r * table_stride + b];
            if (block < 0 || block >= num_blocks) return -1;
        }
    }
    long items = rows * hkv;
    int failed = 0;
    if (threads < 1) threads = 1;
    if (threads > items) threads = (int)items;
    #pragma omp parallel num_threads(threads) if(threads > 1)
    {
        float *scores = malloc(sizeof(float) * (size_t)(group * (max_len > 0 ? max_len : 1)));
        if (scores == NULL) {
            #pragma omp atomic write
            failed = 1;
        }
        #pragma omp for schedule(static)
        for (long item = 0; item < items; item++) {
            if (scores == NULL) continue;
            long r = item / hkv, g = item % hkv;
            const float *qg = q + (r * hq + g * group) * d;
            float *og = out + (r * hq + g * group) * d;
            const int32_t *table = tables + r * table_stride;
            if (d == 64)
                attend_group(qg, k_cache, v_cache, table, lens[r], group, hkv, g, 64, bs, scale, scores, og);
            else if (d == 128)
                attend_group(qg, k_cache, v_cache, table, lens[r], group, hkv, g, 128, bs, scale, scores, og);
            else
                attend_group(qg, k_cache, v_cache, table, lens[r], group, hkv, g, d, bs, scale, scores, og);
        }
        free(scores);
    }
    return failed ? -2 : 0;
}

/* The indices of the k largest values of each row of x [rows, n] (k <= 64), in no order:
 * one pass a row keeping the k best seen, the first of equal values kept. */
int rg_topk_indices(const float *x, long rows, long n, long k, int64_t *out) {
    if (k <= 0 || k > 64 || k > n) return -3;
    for (long r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        float best[64];
        int64_t *ids = out + r * k;
        long low = 0;
        for (long j = 0; j < k; j++) {
            best[j] = xr[j], ids[j] = j;
            if (best[j] < best[low]) low = j;
        }
        float floor_value = best[low];
        for (long i = k; i < n; i++) {
            if (!(xr[i] > floor_value)) continue;     /* NaN never enters */
            best[low] = xr[i], ids[low] = i;
            low = 0;
            for (long j = 1; j < k; j++)
                if (best[j] < best[low]) low = j;
            floor_value = best[low];
        }
    }
    return 0;
}

/* Rope and the K/V store of one layer in one pass. qkv [t, (hq + 2 hkv) d] float32 (q, k, v
 * heads side by side); cos, sin [t, d] (sin's first half negated: x*cos + swap(x)*sin with
 * swap exchanging the halves is HF's rotate_half rope). Writes q rotated into q_out
 * [t, hq, d], k rotated and v into cache slot slots[i] ([num_slots, hkv, d] caches; -1:
 * skipped): float32 values, or (k_scale and v_scale given) int8 codes with their float16
 * scales [num_slots, hkv], quantized as quantize_row_i8 says. Returns 0, or -1 (nothing
 * written) when a slot lies outside [-1, num_slots). */
int rg_rope_store(const void *qkv_in, int qkv_bf16, long t, long hq, long hkv, long d,
                  const float *cos, const float *sin, const int64_t *slots, void *k_cache,
                  void *v_cache, uint16_t *k_scale, uint16_t *v_scale, long num_slots,
                  float *q_out) {
    long half = d / 2, width = (hq + 2 * hkv) * d;
    const int codes = k_scale != NULL;
    for (long i = 0; i < t; i++)
        if (slots[i] < -1 || slots[i] >= num_slots) return -1;
    float *widened = NULL, rotated[1024];
    if (d > 1024) return -3;
    if (qkv_bf16) {                      /* bf16 products read as float32: exact */
        widened = malloc(sizeof(float) * (size_t)(t * width));
        if (widened == NULL) return -2;
        const uint16_t *b = (const uint16_t *)qkv_in;
        for (long j = 0; j < t * width; j++) widened[j] = bf16_to_f32(b[j]);
    }
    const float *qkv = qkv_bf16 ? widened : (const float *)qkv_in;
    for (long i = 0; i < t; i++) {
        const float *row = qkv + i * width, *c = cos + i * d, *s = sin + i * d;
        for (long h = 0; h < hq + hkv; h++) {
            const float *x = row + h * d;
            const long at = slots[i] * hkv + (h - hq);     /* the k head's cache row */
            float *y;
            if (h < hq) y = q_out + (i * hq + h) * d;
            else if (slots[i] < 0) continue;
            else y = codes ? rotated : (float *)k_cache + at * d;
            for (long j = 0; j < half; j++) y[j] = x[j] * c[j] + x[j + half] * s[j];
            for (long j = half; j < d; j++) y[j] = x[j] * c[j] + x[j - half] * s[j];
            if (h >= hq && codes) quantize_row_i8(y, d, (int8_t *)k_cache + at * d, k_scale + at);
        }
        if (slots[i] < 0) continue;
        const float *v = row + (hq + hkv) * d;
        for (long g = 0; g < hkv; g++) {
            const long at = slots[i] * hkv + g;
            if (codes) quantize_row_i8(v + g * d, d, (int8_t *)v_cache + at * d, v_scale + at);
            else memcpy((float *)v_cache + at * d, v + g * d, sizeof(float) * (size_t)d);
        }
    }
    free(widened);
    return 0;
}

/* The gated MLP's activation in bfloat16 as torch computes it: out = bf16(bf16(silu(g)) * u)
 * for gate_up [t, 2i] (gate, then up, per row) -> out [t, i]. */
#if defined(__AVX512F__)
#include <immintrin.h>
/* torch's own vectorized e^x (SLEEF's expf16_u10 in libtorch_cpu, what its AVX-512 silu
 * calls), handed over by kernels/native.py; NULL: the scalar loop below. */
typedef __m512 (*exp16_fn)(__m512);
static exp16_fn torch_exp16 = NULL;

void rg_set_exp16(void *fn) { torch_exp16 = (exp16_fn)fn; }
int rg_exp16_in_use(void) { return torch_exp16 != NULL; }

static inline __m512 bf16_lanes(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(
        _mm256_loadu_si256((const __m256i *)p)), 16));
}

/* float32 lanes -> bfloat16, round to nearest even, NaN kept quiet (f32_to_bf16's rule). */
static inline __m256i bf16_round(__m512 x) {
    __m512i u = _mm512_castps_si512(x);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    __m512i rounded = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
    __mmask16 nan = _mm512_cmp_ps_mask(x, x, _CMP_UNORD_Q);
    __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(0x40));
    return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet));
}
#else
void rg_set_exp16(void *fn) { (void)fn; }
int rg_exp16_in_use(void) { return 0; }
#endif

/* out [t, inner] = silu(gate) * up in bfloat16 from gate_up [t, 2 inner] (gate, then up),
 * rounded as torch rounds: the silu (x / (1 + e^-x) in float32) to bf16, then the product. */
void rg_silu_mul_bf16(const uint16_t *gate_up, long t, long inner, uint16_t *out) {
    for (long r = 0; r < t; r++) {
        const uint16_t *g = gate_up + r * 2 * inner, *u = g + inner;
        uint16_t *o = out + r * inner;
        long j = 0;
#if defined(__AVX512F__)
        if (torch_exp16 != NULL)
            for (; j + 16 <= inner; j += 16) {
                __m512 x = bf16_lanes(g + j);
                __m512 e = torch_exp16(_mm512_sub_ps(_mm512_setzero_ps(), x));
                __m512 silu = _mm512_div_ps(x, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
                __m256i silu16 = bf16_round(silu);
                __m512 back = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(silu16), 16));
                _mm256_storeu_si256((__m256i *)(o + j), bf16_round(_mm512_mul_ps(back, bf16_lanes(u + j))));
            }
#endif
        for (; j < inner; j++) {
            float x = bf16_to_f32(g[j]);
            float silu = bf16_to_f32(f32_to_bf16(x / (1.0f + expf(-x))));
            o[j] = f32_to_bf16(silu * bf16_to_f32(u[j]));
        }
    }
}

/* Each row's greedy pick of x [rows, n]: the first index of its largest value, NaN read as
 * -inf (all -inf or NaN: index 0), as torch's max over nan_to_num(x, nan=-inf) picks. */
void rg_argmax_rows(const float *x, long rows, long n, int64_t *out) {
    for (long r = 0; r < rows; r++) {
        const float *xr = x + r * n;
        long best = 0;
        float top = isnan(xr[0]) ? -INFINITY : xr[0];
        for (long i = 1; i < n; i++)
            if (xr[i] > top) top = xr[i], best = i;     /* NaN compares false */
        out[r] = best;
    }
}
