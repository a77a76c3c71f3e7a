/* The int4 matmul on AMX tiles (built by kernels/native.py; called by
 * runtime/model/linear.py's Int4Linear in the default mode, from a few rows on, where the
 * CPU has AMX).
 *
 * Each 64-column tile of torch's CPU int4 pack is dequantized once per call and chunk of
 * 512 rows (w = fma(code - 8, scale, zero) in float32, rounded to bfloat16 to nearest
 * even) into the pair-interleaved layout AMX reads; then 16 rows at a time go through
 * TDPBF16PS over k in steps of 32, in order, into float32 accumulators, rounded to bfloat16
 * at the end. The products are those of the bf16 GEMM over dequantized weights that the
 * default mode ran above 64 rows; at 16 rows 2x faster than torch's int4 op, at 64 rows 6x,
 * at 2,048 even with the GEMM (benchmarks/RESULTS.md). At one row the dequantization costs
 * 3x the op: below ``AMX_INT4_MIN_ROWS`` the op runs.
 *
 * A tile instruction computes each output row from that row's activations alone and the
 * rows of a partial block are zero rows, so a row's result does not depend on the rows
 * beside it (tested); it is not the int4 op's arithmetic, so the deterministic mode, whose
 * one-row steps run the op, does not use it. A CPU-feature emulation of its sums with fma
 * differed in a few elements per thousand (the tile unit's internal order is its own).
 *
 * 0, or -3 (a shape it does not take: N a multiple of 64, K of 32 and of the group), -2 out
 * of memory, -4 no AMX (not built for it, or the kernel refused the tile state).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512F__) && defined(__linux__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "native_int4.h"

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
#define TILE_N 64          /* a pack tile: 4 AMX column tiles of 16 */
#define STEP_K 32          /* k per tile instruction: 16 pairs */
#define CHUNK_M 512        /* rows a work item takes */

static int amx_permitted = -1;

/* Ask the kernel for the AMX tile state (once per process). */
int rg_amx_init(void) {
    if (amx_permitted < 0)
        amx_permitted = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
    return amx_permitted;
}

/* One pack tile's weights as AMX B tiles: vnni[c][k / 2][n][k % 2] (c: the 16-column
 * group), each [c][k0 / 2 .. k0 / 2 + 15] a 1 KiB tile. */
static void dequantize_vnni(const uint8_t *tile, const uint16_t *sz, long n0, long N, long K,
                            long group, uint32_t *vnni) {
    __m512 scale[4], zero[4], w[2][4];
    long pairs = K / 2;
    for (long k = 0; k < K; k += 2) {
        if (k % group == 0)
            int4_group_scales(sz, k, group, N, n0, scale, zero);
        int4_dequantize_row(tile, k, scale, zero, w[0]);
        int4_dequantize_row(tile, k + 1, scale, zero, w[1]);
        for (int c = 0; c < 4; c++) {
            __m512i both = _mm512_or_si512(int4_bf16_lanes(w[0][c]),
                                           _mm512_slli_epi32(int4_bf16_lanes(w[1][c]), 16));
            _mm512_storeu_si512((void *)(vnni + ((c * pairs) + k / 2) * 16), both);
        }
    }
}

/* 16 rows (a [16, K] bf16, row stride lda) times the tile's weights -> acc [16, 64] fp32. */
static void block_times_tile(const uint16_t *a, long lda, const uint32_t *vnni, long K,
                             float *acc) {
    long pairs = K / 2;
    _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
    for (long k = 0; k < K; k += STEP_K) {
        _tile_loadd(4, a + k, lda * 2);
        _tile_loadd(5, vnni + (0 * pairs + k / 2) * 16, 64);
        _tile_dpbf16ps(0, 4, 5);
        _tile_loadd(6, vnni + (1 * pairs + k / 2) * 16, 64);
        _tile_dpbf16ps(1, 4, 6);
        _tile_loadd(5, vnni + (2 * pairs + k / 2) * 16, 64);
        _tile_dpbf16ps(2, 4, 5);
        _tile_loadd(6, vnni + (3 * pairs + k / 2) * 16, 64);
        _tile_dpbf16ps(3, 4, 6);
    }
    _tile_stored(0, acc, TILE_N * 4);
    _tile_stored(1, acc + 16, TILE_N * 4);
    _tile_stored(2, acc + 32, TILE_N * 4);
    _tile_stored(3, acc + 48, TILE_N * 4);
}

static void store_rows(const float *acc, long rows, uint16_t *c, long ldc) {
    for (long r = 0; r < rows; r++)
        for (int j = 0; j < 4; j++) {
            __m512i lanes = int4_bf16_lanes(_mm512_loadu_ps(acc + r * TILE_N + j * 16));
            _mm256_storeu_si256((__m256i *)(c + r * ldc + j * 16), _mm512_cvtepi32_epi16(lanes));
        }
}

int rg_int4_mm_amx(const uint16_t *A, const uint8_t *packed, const uint16_t *sz, uint16_t *C,
                   long M, long N, long K, long group, int threads) {
    if (!rg_amx_init()) return -4;
    if (M <= 0 || N <= 0 || K <= 0 || N % TILE_N || K % STEP_K || group <= 0 || group % 2
        || K % group) return -3;
    long chunks = (M + CHUNK_M - 1) / CHUNK_M, tiles = N / TILE_N, items = chunks * tiles;
    int failed = 0;
    if (threads < 1) threads = 1;
    if (threads > items) threads = (int)items;
    #pragma omp parallel num_threads(threads) if(threads > 1)
    {
        uint32_t *vnni = aligned_alloc(64, sizeof(uint32_t) * (size_t)(K / 2 * TILE_N));
        uint16_t *padded = aligned_alloc(64, sizeof(uint16_t) * (size_t)(16 * K));
        float *acc = aligned_alloc(64, sizeof(float) * 16 * TILE_N);
        int ready = vnni != NULL && padded != NULL && acc != NULL;
        if (!ready) {
            #pragma omp atomic write
            failed = 1;
        } else {
            int4_configure_tiles();
        }
        #pragma omp for schedule(static)
        for (long item = 0; item < items; item++) {
            if (!ready) continue;
            long chunk = item / tiles, t = item % tiles;
            long m0 = chunk * CHUNK_M, end = M - m0 < CHUNK_M ? M : m0 + CHUNK_M;
            dequantize_vnni(packed + t * K * 32, sz, t * TILE_N, N, K, group, vnni);
            for (long m = m0; m < end; m += 16) {
                long rows = end - m < 16 ? end - m : 16;
                const uint16_t *a = A + m * K;
                if (rows < 16) {                         /* zero rows below the last one */
                    memset(padded, 0, sizeof(uint16_t) * (size_t)(16 * K));
                    memcpy(padded, a, sizeof(uint16_t) * (size_t)(rows * K));
                    a = padded;
                }
                block_times_tile(a, K, vnni, K, acc);
                store_rows(acc, rows, C + m * N + t * TILE_N, N);
            }
        }
        if (ready) _tile_release();
        free(vnni);
        free(padded);
        free(acc);
    }
    return failed ? -2 : 0;
}

#else

int rg_amx_init(void) { return 0; }

int rg_int4_mm_amx(const uint16_t *A, const uint8_t *packed, const uint16_t *sz, uint16_t *C,
                   long M, long N, long K, long group, int threads) {
    (void)A; (void)packed; (void)sz; (void)C; (void)M; (void)N; (void)K; (void)group;
    (void)threads;
    return -4;
}

#endif
