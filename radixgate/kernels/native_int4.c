/* The int4 matmul of many rows, with the very bits of torch's CPU int4 op (built by
 * kernels/native.py; called by runtime/model/linear.py's Int4Linear).
 *
 * torch's AVX-512 int4 op (``_weight_int4pack_mm_for_cpu``) computes each output element
 * C[m, n] as one float32 chain over k = 0 .. K-1 in order:
 *     w = fma(code - 8, scale, zero)            (scale, zero: bf16 -> float32, per 32 of k)
 *     acc = fma(float(A[m, k]), w, acc)          (acc from 0)
 * then rounds acc to bfloat16 (to nearest even). It walks rows 4 at a time and dequantizes
 * the weights again for every 4 rows, converting each activation to float32 one by one:
 * at 2,048 rows it is half again slower than a float32 GEMM. Here a panel of 64 output
 * columns is dequantized once (the same fma, so the same float32 weights) for a chunk of
 * rows, the chunk's activations are widened once, and 6 rows x 64 columns advance together
 * through k in the same order: each element takes the same chain of the same roundings,
 * so the result is the op's, bit for bit, at any row count (tests/test_native_int4.py).
 *
 * Weights: torch's CPU pack for 64-column tiles ([N/64, K, 32] bytes: byte j of row k holds
 * column 64t + j in its low nibble and column 64t + 32 + j in its high one) and its
 * scales-and-zeros [K/group, N, 2] bf16. Only for N a multiple of 64 and K of the group;
 * -3 otherwise, -2 out of memory, -4 built without AVX-512 (the caller runs the op).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#define TILE_N 64
#define ROWS 6              /* rows advanced together: 6 x 4 accumulators + 4 weights */
#define CHUNK_M 96          /* rows a work item takes (16 blocks of 6) */

#ifdef __AVX512F__
#include <immintrin.h>

#include "native_int4.h"

/* float32 -> bfloat16, to nearest even; NaN -> 0xffff (as torch's vectorized conversion). */
static inline __m256i to_bf16(__m512 v) {
    return _mm512_cvtepi32_epi16(int4_bf16_lanes(v));
}

/* The tile's weights for all of k as float32 [K, 64], dequantized as the op does. */
static void dequantize_panel(const uint8_t *tile, const uint16_t *sz, long n0, long N,
                             long K, long group, float *panel) {
    __m512 scale[4], zero[4], w[4];
    for (long k = 0; k < K; k++) {
        if (k % group == 0)
            int4_group_scales(sz, k, group, N, n0, scale, zero);
        int4_dequantize_row(tile, k, scale, zero, w);
        for (int c = 0; c < 4; c++)
            _mm512_storeu_ps(panel + k * TILE_N + c * 16, w[c]);
    }
}

/* ``rows`` (1..ROWS) rows of float32 activations a [rows, K] times the panel -> C (bf16). */
static inline __attribute__((always_inline)) void rows_times_panel(
        const float *a, long K, const float *panel, uint16_t *c, long ldc, const int rows) {
    __m512 acc[ROWS][4];
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < 4; j++) acc[r][j] = _mm512_setzero_ps();
    for (long k = 0; k < K; k++) {
        const float *w = panel + k * TILE_N;
        __m512 w0 = _mm512_loadu_ps(w), w1 = _mm512_loadu_ps(w + 16);
        __m512 w2 = _mm512_loadu_ps(w + 32), w3 = _mm512_loadu_ps(w + 48);
        for (int r = 0; r < rows; r++) {
            __m512 x = _mm512_set1_ps(a[r * K + k]);
            acc[r][0] = _mm512_fmadd_ps(x, w0, acc[r][0]);
            acc[r][1] = _mm512_fmadd_ps(x, w1, acc[r][1]);
            acc[r][2] = _mm512_fmadd_ps(x, w2, acc[r][2]);
            acc[r][3] = _mm512_fmadd_ps(x, w3, acc[r][3]);
        }
    }
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < 4; j++)
            _mm256_storeu_si256((__m256i *)(c + r * ldc + j * 16), to_bf16(acc[r][j]));
}

static void chunk_times_panel(const float *a, long rows, long K, const float *panel,
                              uint16_t *c, long ldc) {
    long r = 0;
    for (; r + ROWS <= rows; r += ROWS)
        rows_times_panel(a + r * K, K, panel, c + r * ldc, ldc, ROWS);
    switch (rows - r) {
        case 5: rows_times_panel(a + r * K, K, panel, c + r * ldc, ldc, 5); break;
        case 4: rows_times_panel(a + r * K, K, panel, c + r * ldc, ldc, 4); break;
        case 3: rows_times_panel(a + r * K, K, panel, c + r * ldc, ldc, 3); break;
        case 2: rows_times_panel(a + r * K, K, panel, c + r * ldc, ldc, 2); break;
        case 1: rows_times_panel(a + r * K, K, panel, c + r * ldc, ldc, 1); break;
        default: break;
    }
}
#endif

/* C [M, N] bf16 = A [M, K] bf16 x the packed int4 weights; ``threads`` workers of torch's
 * OpenMP pool share the (row chunk, column tile) items. Returns 0, or the codes above. */
int rg_int4_mm(const uint16_t *A, const uint8_t *packed, const uint16_t *sz, uint16_t *C,
               long M, long N, long K, long group, int threads) {
#ifndef __AVX512F__
    (void)A; (void)packed; (void)sz; (void)C; (void)M; (void)N; (void)K; (void)group;
    (void)threads;
    return -4;
#else
    if (M <= 0 || N <= 0 || K <= 0 || N % TILE_N || group <= 0 || K % group) return -3;
    long chunks = (M + CHUNK_M - 1) / CHUNK_M, tiles = N / TILE_N, items = chunks * tiles;
    int failed = 0;
    if (threads < 1) threads = 1;
    if (threads > items) threads = (int)items;
    #pragma omp parallel num_threads(threads) if(threads > 1)
    {
        float *panel = aligned_alloc(64, sizeof(float) * (size_t)(K * TILE_N));
        float *a = aligned_alloc(64, sizeof(float) * (size_t)(CHUNK_M * K));
        long widened = -1;                   /* the chunk whose activations ``a`` holds */
        if (panel == NULL || a == NULL) {
            #pragma omp atomic write
            failed = 1;
        }
        /* chunk-major, so a worker's consecutive items share their activations */
        #pragma omp for schedule(static)
        for (long item = 0; item < items; item++) {
            if (panel == NULL || a == NULL) continue;
            long chunk = item / tiles, t = item % tiles;
            long m0 = chunk * CHUNK_M, rows = M - m0 < CHUNK_M ? M - m0 : CHUNK_M;
            if (widened != chunk) {
                for (long i = 0; i < rows * K; i++) a[i] = int4_bf16_to_f32(A[m0 * K + i]);
                widened = chunk;
            }
            dequantize_panel(packed + t * K * 32, sz, t * TILE_N, N, K, group, panel);
            chunk_times_panel(a, rows, K, panel, C + m0 * N + t * TILE_N, N);
        }
        free(panel);
        free(a);
    }
    return failed ? -2 : 0;
#endif
}
