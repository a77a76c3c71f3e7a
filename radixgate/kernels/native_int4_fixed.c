/* The int4 matmul with exact integer group sums (built by kernels/native.py; called by
 * runtime/model/linear.py's Int4Linear in both modes where the CPU has AVX512-VNNI).
 *
 * Why: a row's product must not depend on how many rows the call has (the deterministic
 * mode), and the fast kernels for few rows (vector FMAs) and for many (AMX tiles) sum in
 * orders of their own, so float sums could never agree. Integer sums can: they are exact.
 *
 * The arithmetic, per row and per group g of 32 along K (one scale d and one offset m a
 * column: w = code * d + m, code 0..15):
 *   - the row's 32 activations in fixed point: e = the exponent of their largest magnitude,
 *     X = round(x * 2^(13 - e)) (|X| <= 2^14, 15 bits: finer than bf16's 8 for all but the
 *     values far below the group's largest), split X = 256 hi + lo with lo, hi signed bytes;
 *   - I = 256 * sum(hi * code) + sum(lo * code) and S = sum(X): exact integers (|I| < 2^23);
 *   - t = fma(float(I), d, float(S) * m); acc = fma(t, 2^(e - 13), acc), groups in order.
 * C[m, n] = acc rounded to bfloat16 (to nearest even). Every step after the integer sums is
 * one shared function, so the two kernels give the same bits for a row at any row count:
 *   - few rows (``FIXED_AMX_MIN_ROWS`` and below, or no AMX): VPDPBUSD, codes x activation bytes;
 *   - up to ``INT8_TILES_MAX_ROWS`` on AMX: TDPBSUD tiles of the same bytes (16 rows x 32
 *     columns x one group), sums stored and combined 16 columns a vector by the same function;
 *   - more rows on AMX: TDPBF16PS tiles of X in bf16 and the codes unpacked to bf16 (exact:
 *     every partial sum is an integer below 2^24), combined likewise.
 *
 * Weights (made by ``native.int4_fixed_pack``): codes [N/16, K/32, 4, 16, 4] bytes, byte
 * (v, n, j) holding code k = 8v + j (low nibble) and k = 8v + 4 + j (high nibble) of column
 * n of the 16-column block; d and m float16 [N/16, K/32, 2, 16]. N a multiple of 64, K of 32.
 * Returns 0, -3 a shape it does not take, -2 out of memory, -4 built without AVX512-VNNI.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#define GROUP 32
#define BLOCK_N 16               /* columns a vector */
#define TILE_N 64                /* columns a few-row work item */
#define CODE_BYTES 256           /* one block's codes for one group */
#define FIXED_AMX_MIN_ROWS 5     /* above: AMX tiles where present (int8 tiles first) */
#define CHUNK_M 256              /* rows an AMX work item takes */

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VNNI__)
#include <immintrin.h>

#include "native_int4.h"

/* Row ``x`` (K values, float32 or bf16) in fixed point: per group S = sum(X) and
 * p = 2^(e - 13) as float32, and X as hi / lo bytes (``x16`` NULL) or as bf16 (exact). */
static void quantize_row(const void *x, int bf16, long K, int8_t *hi, int8_t *lo,
                         uint16_t *x16, float *S, float *p) {
    for (long g = 0; g < K / GROUP; g++) {
        __m512 v[2];
        for (int h = 0; h < 2; h++) {
            long k = g * GROUP + h * 16;
            if (bf16) {
                __m256i b = _mm256_loadu_si256((const __m256i *)((const uint16_t *)x + k));
                v[h] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
            } else {
                v[h] = _mm512_loadu_ps((const float *)x + k);
            }
        }
        float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v[0]), _mm512_abs_ps(v[1])));
        int e = 0;
        if (amax > 0 && amax <= 3.4e38f) {
            __m128 ex = _mm_getexp_ss(_mm_set_ss(amax), _mm_set_ss(amax));   /* floor(log2) */
            e = (int)_mm_cvtss_f32(ex);
        }
        __m512 up = _mm512_set1_ps((float)(13 - e)), sum = _mm512_setzero_ps();
        for (int h = 0; h < 2; h++) {
            long k = g * GROUP + h * 16;
            /* to bf16 (nearest even), then to an integer: at most 8 significant bits */
            __m512 y = _mm512_castsi512_ps(_mm512_slli_epi32(
                int4_bf16_lanes(_mm512_scalef_ps(v[h], up)), 16));
            y = _mm512_roundscale_ps(y, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
            sum = _mm512_add_ps(sum, y);                     /* integers below 2^24: exact */
            if (x16 != NULL) {
                __m512i bits = _mm512_srli_epi32(_mm512_castps_si512(y), 16);
                _mm256_storeu_si256((__m256i *)(x16 + k), _mm512_cvtepi32_epi16(bits));
                continue;
            }
            __m512i X = _mm512_cvtps_epi32(y);
            __m512i l = _mm512_sub_epi32(_mm512_and_si512(_mm512_add_epi32(X, _mm512_set1_epi32(128)),
                                                          _mm512_set1_epi32(255)),
                                         _mm512_set1_epi32(128));
            __m512i u = _mm512_srai_epi32(_mm512_sub_epi32(X, l), 8);
            _mm_storeu_si128((__m128i *)(lo + k), _mm512_cvtepi32_epi8(l));
            _mm_storeu_si128((__m128i *)(hi + k), _mm512_cvtepi32_epi8(u));
        }
        S[g] = _mm512_reduce_add_ps(sum);
        p[g] = _mm_cvtss_f32(_mm_scalef_ss(_mm_set_ss(1.0f), _mm_set_ss((float)(e - 13))));
    }
}

/* The one float step both kernels share: a group's exact sum I (an integer, |I| < 2^23, so
 * exact in float32) into the accumulator. */
static inline __m512 add_group(__m512 acc, __m512 I, __m512 d, __m512 m, float S, float p) {
    __m512 t = _mm512_fmadd_ps(I, d, _mm512_mul_ps(_mm512_set1_ps(S), m));
    return _mm512_fmadd_ps(t, _mm512_set1_ps(p), acc);
}

static inline __m512 exact_sum(__m512i hi_sum, __m512i lo_sum) {
    return _mm512_cvtepi32_ps(_mm512_add_epi32(_mm512_slli_epi32(hi_sum, 8), lo_sum));
}

static inline void load_dm(const uint16_t *dm, __m512 *d, __m512 *m) {
    *d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)dm));
    *m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(dm + 16)));
}

static inline void store_bf16(uint16_t *c, __m512 v) {
    _mm256_storeu_si256((__m256i *)c, _mm512_cvtepi32_epi16(int4_bf16_lanes(v)));
}

/* ``R`` rows (row r's bytes at hi / lo + r K, its S and p at + r G) times one 16-column
 * block over all groups (VPDPBUSD: code bytes x activation bytes, 4 k a lane per
 * instruction; each group's codes unpacked once for the R rows) -> acc[R]. */
static inline __attribute__((always_inline)) void rows_times_block(
        const int8_t *hi, const int8_t *lo, const float *S, const float *p, long K,
        const uint8_t *codes, const uint16_t *dm, long groups, const int R, __m512 *acc) {
    const __m512i nibble = _mm512_set1_epi8(15);
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (long g = 0; g < groups; g++) {
        const uint8_t *cg = codes + g * CODE_BYTES;
        __m512i c[8];
        for (int v = 0; v < 4; v++) {
            __m512i both = _mm512_loadu_si512((const void *)(cg + v * 64));
            c[2 * v] = _mm512_and_si512(both, nibble);
            c[2 * v + 1] = _mm512_and_si512(_mm512_srli_epi16(both, 4), nibble);
        }
        __m512 d, m;
        load_dm(dm + g * 2 * BLOCK_N, &d, &m);
        for (int r = 0; r < R; r++) {
            const int32_t *h4 = (const int32_t *)(hi + r * K + g * GROUP);
            const int32_t *l4 = (const int32_t *)(lo + r * K + g * GROUP);
            __m512i hs = _mm512_setzero_si512(), ls = _mm512_setzero_si512();
            for (int i = 0; i < 8; i++) {
                hs = _mm512_dpbusd_epi32(hs, c[i], _mm512_set1_epi32(h4[i]));
                ls = _mm512_dpbusd_epi32(ls, c[i], _mm512_set1_epi32(l4[i]));
            }
            acc[r] = add_group(acc[r], exact_sum(hs, ls), d, m, S[r * groups + g],
                               p[r * groups + g]);
        }
    }
}

struct quantized {
    int8_t *hi, *lo;      /* [M, K]: the few-row kernel's */
    uint16_t *x16;        /* [M_pad, K] bf16, zero rows below M: the tiles' */
    float *S, *p;         /* [M, K / 32] */
};

/* ``tiles``: 0 bytes for VPDPBUSD, BF16_TILES bf16 for its tiles, INT8_TILES bytes with zero
 * rows up to a multiple of 16 (a tile reads 16). */
#define BF16_TILES 1
#define INT8_TILES 2

static int quantize_rows(const void *A, int bf16, long M, long K, int tiles, int threads,
                         struct quantized *q) {
    long padded = (M + 15) / 16 * 16, groups = K / GROUP;
    memset(q, 0, sizeof *q);
    q->S = malloc(sizeof(float) * (size_t)(M * groups));
    q->p = malloc(sizeof(float) * (size_t)(M * groups));
    if (tiles == BF16_TILES) {
        q->x16 = aligned_alloc(64, sizeof(uint16_t) * (size_t)(padded * K));
        if (q->x16) memset(q->x16 + M * K, 0, sizeof(uint16_t) * (size_t)((padded - M) * K));
    } else {
        long rows = tiles ? padded : M;
        q->hi = malloc((size_t)(rows * K));
        q->lo = malloc((size_t)(rows * K));
        if (q->hi && q->lo && rows > M) {
            memset(q->hi + M * K, 0, (size_t)((rows - M) * K));
            memset(q->lo + M * K, 0, (size_t)((rows - M) * K));
        }
    }
    if (!q->S || !q->p || (tiles == BF16_TILES ? !q->x16 : !q->hi || !q->lo)) return -2;
    size_t width = bf16 ? 2 : 4;
    #pragma omp parallel for num_threads(threads) if(threads > 1 && M > 8) schedule(static)
    for (long r = 0; r < M; r++)
        quantize_row((const char *)A + (size_t)(r * K) * width, bf16, K,
                     q->x16 ? NULL : q->hi + r * K, q->x16 ? NULL : q->lo + r * K,
                     q->x16 ? q->x16 + r * K : NULL, q->S + r * groups, q->p + r * groups);
    return 0;
}

static void free_quantized(struct quantized *q) {
    free(q->hi); free(q->lo); free(q->x16); free(q->S); free(q->p);
}

#define FEW_ROWS 4                /* rows sharing one unpacking of the codes */

static void block_rows(const struct quantized *q, long r, long rows, long K, long groups,
                       const uint8_t *codes, const uint16_t *dm, uint16_t *C, long N, long n0) {
    __m512 acc[FEW_ROWS];
    const int8_t *hi = q->hi + r * K, *lo = q->lo + r * K;
    const float *S = q->S + r * groups, *p = q->p + r * groups;
    switch (rows) {
        case 4: rows_times_block(hi, lo, S, p, K, codes, dm, groups, 4, acc); break;
        case 3: rows_times_block(hi, lo, S, p, K, codes, dm, groups, 3, acc); break;
        case 2: rows_times_block(hi, lo, S, p, K, codes, dm, groups, 2, acc); break;
        default: rows_times_block(hi, lo, S, p, K, codes, dm, groups, 1, acc); break;
    }
    for (long i = 0; i < rows; i++)
        store_bf16(C + (r + i) * N + n0, acc[i]);
}

static void few_rows(const struct quantized *q, const uint8_t *codes, const uint16_t *dm,
                     uint16_t *C, long M, long N, long K, int threads) {
    long groups = K / GROUP, tiles = N / TILE_N;
    if (threads > tiles) threads = (int)tiles;
    #pragma omp parallel for num_threads(threads) if(threads > 1) schedule(static)
    for (long t = 0; t < tiles; t++)
        for (long r = 0; r < M; r += FEW_ROWS)
            for (int b = 0; b < TILE_N / BLOCK_N; b++) {
                long block = t * (TILE_N / BLOCK_N) + b;
                block_rows(q, r, M - r < FEW_ROWS ? M - r : FEW_ROWS, K, groups,
                           codes + block * groups * CODE_BYTES, dm + block * groups * 2 * BLOCK_N,
                           C, N, block * BLOCK_N);
            }
}

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__linux__)
#define HAVE_AMX_FIXED 1
#define TILE_BLOCKS 4            /* 16-column blocks an AMX work item takes */
/* Tiles a, b, c, e into sums[0..3] (16 rows of 64 bytes each); tile numbers must be bare
 * literals (the intrinsic pastes them into the register name), hence a macro. */
#define STORE_FOUR_TILES(a, b, c, e, sums) do { \
        _tile_stored(a, (sums)[0], 64); _tile_stored(b, (sums)[1], 64); \
        _tile_stored(c, (sums)[2], 64); _tile_stored(e, (sums)[3], 64); \
    } while (0)
/* Every tile 16 rows x 64 bytes (``int4_configure_tiles``). 0-3: the sums of blocks 0-3
 * (float32), 4: the group's activations (bf16), 5-7: codes (bf16 pairs). */

/* A block's codes for all groups as B tiles [groups][16 pairs][16 columns] of bf16 pairs
 * (code k = 2i, code k = 2i + 1). */
static void unpack_codes(const uint8_t *codes, long groups, uint32_t *tiles) {
    const __m512i nibble = _mm512_set1_epi32(15), lut = _mm512_setr_epi32(
        0x0000, 0x3f80, 0x4000, 0x4040, 0x4080, 0x40a0, 0x40c0, 0x40e0, 0x4100, 0x4110, 0x4120,
        0x4130, 0x4140, 0x4150, 0x4160, 0x4170);
    for (long g = 0; g < groups; g++)
        for (int v = 0; v < 4; v++) {
            __m512i both = _mm512_loadu_si512((const void *)(codes + g * CODE_BYTES + v * 64));
            for (int h = 0; h < 2; h++)
                for (int j = 0; j < 4; j += 2) {
                    __m512i c0 = _mm512_and_si512(_mm512_srli_epi32(both, 8 * j + 4 * h), nibble);
                    __m512i c1 = _mm512_and_si512(_mm512_srli_epi32(both, 8 * j + 8 + 4 * h), nibble);
                    __m512i pair = _mm512_or_si512(_mm512_permutexvar_epi32(c0, lut),
                                                   _mm512_slli_epi32(_mm512_permutexvar_epi32(c1, lut), 16));
                    long i = (8 * v + 4 * h + j) / 2;
                    _mm512_storeu_si512((void *)(tiles + (g * 16 + i) * 16), pair);
                }
        }
}

/* 16 rows (from m) times TILE_BLOCKS unpacked blocks (``tiles``: [block][groups * 256]) -> C
 * (bf16), rows below ``rows`` only. */
static inline void combine_tile(const struct quantized *q, long m, long rows, long groups,
                                long g, float sums[TILE_BLOCKS][16][16], const uint16_t *dm,
                                __m512 acc[16][TILE_BLOCKS]) {
    __m512 d[TILE_BLOCKS], mm[TILE_BLOCKS];
    for (int b = 0; b < TILE_BLOCKS; b++)
        load_dm(dm + (b * groups + g) * 2 * BLOCK_N, &d[b], &mm[b]);
    for (long r = 0; r < rows; r++) {
        float S = q->S[(m + r) * groups + g], p = q->p[(m + r) * groups + g];
        for (int b = 0; b < TILE_BLOCKS; b++)
            acc[r][b] = add_group(acc[r][b], _mm512_load_ps(sums[b][r]), d[b], mm[b], S, p);
    }
}

static void rows_times_tile(const struct quantized *q, long m, long rows,
                            long K, const uint32_t *tiles, const uint16_t *dm, uint16_t *C,
                            long N, long n0) {
    long groups = K / GROUP, per_block = groups * 256;
    float sums[2][TILE_BLOCKS][16][16] __attribute__((aligned(64)));   /* groups g, g - 1 */
    __m512 acc[16][TILE_BLOCKS];
    for (int r = 0; r < 16; r++)
        for (int b = 0; b < TILE_BLOCKS; b++) acc[r][b] = _mm512_setzero_ps();
    for (long g = 0; g <= groups; g++) {
        if (g == groups) {
            combine_tile(q, m, rows, groups, g - 1, sums[(g - 1) & 1], dm, acc);
            break;
        }
        _tile_zero(0); _tile_zero(1); _tile_zero(2); _tile_zero(3);
        _tile_loadd(4, q->x16 + m * K + g * GROUP, K * 2);
        _tile_loadd(5, tiles + g * 256, 64);
        _tile_dpbf16ps(0, 4, 5);
        _tile_loadd(6, tiles + per_block + g * 256, 64);
        _tile_dpbf16ps(1, 4, 6);
        _tile_loadd(7, tiles + 2 * per_block + g * 256, 64);
        _tile_dpbf16ps(2, 4, 7);
        _tile_loadd(5, tiles + 3 * per_block + g * 256, 64);
        _tile_dpbf16ps(3, 4, 5);
        STORE_FOUR_TILES(0, 1, 2, 3, sums[g & 1]);
        if (g > 0)               /* the previous group's, while this one's stores complete */
            combine_tile(q, m, rows, groups, g - 1, sums[(g - 1) & 1], dm, acc);
    }
    for (long r = 0; r < rows; r++)
        for (int b = 0; b < TILE_BLOCKS; b++)
            store_bf16(C + (m + r) * N + n0 + b * BLOCK_N, acc[r][b]);
}

static int many_rows(const struct quantized *q, const uint8_t *codes, const uint16_t *dm,
                     uint16_t *C, long M, long N, long K, int threads) {
    long groups = K / GROUP, tiles_n = N / (TILE_BLOCKS * BLOCK_N);
    long chunks = (M + CHUNK_M - 1) / CHUNK_M, items = chunks * tiles_n;
    int failed = 0;
    if (threads > items) threads = (int)items;
    #pragma omp parallel num_threads(threads) if(threads > 1)
    {
        uint32_t *tiles = aligned_alloc(64, sizeof(uint32_t) * (size_t)(TILE_BLOCKS * groups * 256));
        if (tiles == NULL) {
            #pragma omp atomic write
            failed = 1;
        } else {
            int4_configure_tiles();
        }
        #pragma omp for schedule(static)
        for (long item = 0; item < items; item++) {
            if (tiles == NULL) continue;
            long chunk = item / tiles_n, b0 = TILE_BLOCKS * (item % tiles_n);
            long m0 = chunk * CHUNK_M, end = M - m0 < CHUNK_M ? M : m0 + CHUNK_M;
            for (int b = 0; b < TILE_BLOCKS; b++)
                unpack_codes(codes + (b0 + b) * groups * CODE_BYTES, groups,
                             tiles + b * groups * 256);
            for (long m = m0; m < end; m += 16)
                rows_times_tile(q, m, end - m < 16 ? end - m : 16, K, tiles,
                                dm + b0 * groups * 2 * BLOCK_N, C, N, b0 * BLOCK_N);
        }
        if (tiles != NULL) _tile_release();
        free(tiles);
    }
    return failed ? -2 : 0;
}

#if defined(__AMX_INT8__)
#define HAVE_AMX_INT8_FIXED 1
#define INT8_TILES_MAX_ROWS 16   /* rows up to here: int8 tiles (the codes as bytes); above, bf16 */

/* Tiles 0, 1: a group's hi and lo activation bytes (16 rows x 32 bytes); 2, 3: the codes of
 * two blocks (8 quads x 64 bytes: row i is VPDPBUSD's c[i]); 4-7: the sums (hi, lo) x (block
 * 0, 1), 16 x 16 int32. TDPBSUD (signed activations, unsigned codes) gives the very integers
 * of the few-row kernel, then the same combination: the same bits. */
static void configure_int8_tiles(void) {
    struct int4_tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) {
        cfg.rows[t] = t == 2 || t == 3 ? 8 : 16;
        cfg.colsb[t] = t < 2 ? 32 : 64;
    }
    _tile_loadconfig(&cfg);
}

/* Group g's stored sums (hi, lo) x (block 0, 1) into the rows' accumulators. */
static inline void combine_pair(const struct quantized *q, long m, long rows, long groups,
                                long g, int32_t sums[4][16][16], const uint16_t *dm,
                                __m512 acc[16][2]) {
    __m512 d[2], mm[2];
    for (int b = 0; b < 2; b++) load_dm(dm + (b * groups + g) * 2 * BLOCK_N, &d[b], &mm[b]);
    for (long r = 0; r < rows; r++) {
        float S = q->S[(m + r) * groups + g], p = q->p[(m + r) * groups + g];
        for (int b = 0; b < 2; b++) {
            __m512i hs = _mm512_load_si512((const void *)sums[2 * b][r]);
            __m512i ls = _mm512_load_si512((const void *)sums[2 * b + 1][r]);
            acc[r][b] = add_group(acc[r][b], exact_sum(hs, ls), d[b], mm[b], S, p);
        }
    }
}

/* 16 rows (from m; ``rows`` real) times two 16-column blocks (codes of block 0, then block 1
 * at + groups blocks) -> C (bf16). Group g's tiles are issued before group g - 1's sums are
 * combined (the combination order, group by group, is unchanged). */
static void rows_times_pair(const struct quantized *q, long m, long rows, long K,
                            const uint8_t *codes, const uint16_t *dm, uint16_t *C, long N,
                            long n0) {
    const long groups = K / GROUP;
    const __m512i nibble = _mm512_set1_epi8(15);
    int32_t sums[2][4][16][16] __attribute__((aligned(64)));   /* groups g and g - 1 */
    uint8_t quads[2][8][64] __attribute__((aligned(64)));
    __m512 acc[16][2];
    for (int r = 0; r < 16; r++) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
    for (long g = 0; g <= groups; g++) {
        if (g == groups) {
            combine_pair(q, m, rows, groups, g - 1, sums[(g - 1) & 1], dm, acc);
            break;
        }
        for (int b = 0; b < 2; b++)
            for (int v = 0; v < 4; v++) {
                __m512i both = _mm512_loadu_si512((const void *)(codes + (b * groups + g) * CODE_BYTES + v * 64));
                _mm512_store_si512((void *)quads[b][2 * v], _mm512_and_si512(both, nibble));
                _mm512_store_si512((void *)quads[b][2 * v + 1],
                                   _mm512_and_si512(_mm512_srli_epi16(both, 4), nibble));
            }
        _tile_loadd(0, q->hi + m * K + g * GROUP, K);
        _tile_loadd(1, q->lo + m * K + g * GROUP, K);
        _tile_loadd(2, quads[0], 64);
        _tile_loadd(3, quads[1], 64);
        _tile_zero(4); _tile_zero(5); _tile_zero(6); _tile_zero(7);
        _tile_dpbsud(4, 0, 2);
        _tile_dpbsud(5, 1, 2);
        _tile_dpbsud(6, 0, 3);
        _tile_dpbsud(7, 1, 3);
        STORE_FOUR_TILES(4, 5, 6, 7, sums[g & 1]);
        if (g > 0)               /* the previous group's, while this one's stores complete */
            combine_pair(q, m, rows, groups, g - 1, sums[(g - 1) & 1], dm, acc);
    }
    for (long r = 0; r < rows; r++)
        for (int b = 0; b < 2; b++) store_bf16(C + (m + r) * N + n0 + b * BLOCK_N, acc[r][b]);
}

static void middle_rows(const struct quantized *q, const uint8_t *codes, const uint16_t *dm,
                        uint16_t *C, long M, long N, long K, int threads) {
    const long groups = K / GROUP, pairs = N / (2 * BLOCK_N);
    if (threads > pairs) threads = (int)pairs;
    #pragma omp parallel num_threads(threads) if(threads > 1)
    {
        configure_int8_tiles();
        #pragma omp for schedule(static)
        for (long pair = 0; pair < pairs; pair++)
            for (long m = 0; m < M; m += 16)
                rows_times_pair(q, m, M - m < 16 ? M - m : 16, K,
                                codes + 2 * pair * groups * CODE_BYTES,
                                dm + 2 * pair * groups * 2 * BLOCK_N, C, N, 2 * pair * BLOCK_N);
        _tile_release();
    }
}
#endif
#endif

/* C [M, N] bf16 = A [M, K] (float32, or bf16 where ``a_bf16``) x the fixed-point int4
 * weights. ``amx``: 1 lets more than FIXED_AMX_MIN_ROWS rows take the tiles (int8 tiles up
 * to INT8_TILES_MAX_ROWS rows, bf16 above), 0 never (for tests: the same bits every way), -1
 * the bf16 tiles always, -2 the int8 tiles always, where built. */
int rg_int4_mm_fixed(const void *A, int a_bf16, const uint8_t *codes, const uint16_t *dm,
                     uint16_t *C, long M, long N, long K, int amx, int threads) {
    if (M <= 0 || N <= 0 || K <= 0 || N % TILE_N || K % GROUP) return -3;
    if (threads < 1) threads = 1;
    int tiles = 0;
#ifdef HAVE_AMX_FIXED
    if ((amx < 0 || (amx > 0 && M > FIXED_AMX_MIN_ROWS)) && rg_amx_init())
        tiles = BF16_TILES;
#ifdef HAVE_AMX_INT8_FIXED
    if (tiles && (amx == -2 || (amx > 0 && M <= INT8_TILES_MAX_ROWS)))
        tiles = INT8_TILES;
#endif
#endif
    struct quantized q;
    int status = quantize_rows(A, a_bf16, M, K, tiles, threads, &q);
    if (status == 0) {
#ifdef HAVE_AMX_INT8_FIXED
        if (tiles == INT8_TILES)
            middle_rows(&q, codes, dm, C, M, N, K, threads);
        else
#endif
#ifdef HAVE_AMX_FIXED
        if (tiles == BF16_TILES)
            status = many_rows(&q, codes, dm, C, M, N, K, threads);
        else
#endif
            few_rows(&q, codes, dm, C, M, N, K, threads);
    }
    free_quantized(&q);
    return status;
}

int rg_int4_fixed_has_amx(void) {
#ifdef HAVE_AMX_FIXED
    return rg_amx_init();
#else
    return 0;
#endif
}

#else

int rg_int4_mm_fixed(const void *A, int a_bf16, const uint8_t *codes, const uint16_t *dm,
                     uint16_t *C, long M, long N, long K, int amx, int threads) {
    (void)A; (void)a_bf16; (void)codes; (void)dm; (void)C; (void)M; (void)N; (void)K;
    (void)amx; (void)threads;
    return -4;
}

int rg_int4_fixed_has_amx(void) { return 0; }

#endif

#include "native_math.h"

/* One Q4_0 / Q4_1 tensor's GGUF blocks straight into the layout above, the arithmetic of
 * kernels/native.py int4_fixed_pack on gguf_quants.group_codes' codes, bit for bit:
 * blocks [rows, k / 32] of 18 (Q4_0: d, 16 code bytes) or 20 bytes (Q4_1: d, m, 16 code
 * bytes; low nibbles are elements 0..15, high 16..31), rows already in the model's order.
 * Writes rows / 16 row tiles of codes (packed [rows / 16, k / 32, 4, 16, 4]) and d, m
 * (dm [rows / 16, k / 32, 2, 16] float16) with the loader's steps: zero = m + 8 d (Q4_0:
 * 0) and m' = zero - 8 d in float32, rounded to float16 to nearest even. Returns 0; -1
 * where d or m' does not fit float16 (nothing to rely on: the caller packs otherwise); -3
 * rows not a multiple of 16 or k of 32. */
int rg_int4_fixed_from_q4(const uint8_t *blocks, int q4_1, long rows, long k, uint8_t *packed,
                          uint16_t *dm) {
    if (rows <= 0 || rows % 16 || k <= 0 || k % GROUP) return -3;
    const long groups = k / GROUP, size = q4_1 ? 20 : 18;
    for (long row = 0; row < rows; row++) {
        const long tile = row / 16, r = row % 16;
        for (long g = 0; g < groups; g++) {
            const uint8_t *b = blocks + (row * groups + g) * size, *qs = b + (q4_1 ? 4 : 2);
            uint16_t d_bits;
            memcpy(&d_bits, b, 2);
            if ((d_bits & 0x7c00u) == 0x7c00u) return -1;             /* inf or NaN */
            const float d = half_value(d_bits);
            float zero = 0.0f;
            if (q4_1) {
                uint16_t m_bits;
                memcpy(&m_bits, b + 2, 2);
                zero = half_value(m_bits) + 8.0f * d;
            }
            const float m = zero - 8.0f * d;
            const uint16_t m_bits = half_bits(m);
            if ((m_bits & 0x7c00u) == 0x7c00u || ((m_bits & 0x7fffu) == 0 && m != 0.0f)) return -1;
            uint16_t *out = dm + (tile * groups + g) * 32;
            out[r] = d_bits, out[16 + r] = m_bits;
            uint8_t *p = packed + (tile * groups + g) * 256;          /* [4][16][4] */
            for (int a = 0; a < 4; a++)
                for (int e = 0; e < 4; e++) {
                    const int t = a * 8 + e, u = t + 4;                /* low and high nibble */
                    const uint8_t lo = t < 16 ? qs[t] & 15 : qs[t - 16] >> 4;
                    const uint8_t hi = u < 16 ? qs[u] & 15 : qs[u - 16] >> 4;
                    p[(a * 16 + r) * 4 + e] = (uint8_t)(lo | hi << 4);
                }
        }
    }
    return 0;
}
