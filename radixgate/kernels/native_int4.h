/* What the int4 kernels share (native_int4.c, native_int4_amx.c, native_int4_fixed.c): torch's
 * CPU int4 pack read one row of k at a time, the weights dequantized as torch's op does, the
 * rounding to bfloat16 and the AMX tile configuration. AVX-512 only. */
#ifndef RADIXGATE_NATIVE_INT4_H
#define RADIXGATE_NATIVE_INT4_H

#ifdef __AVX512F__
#include <immintrin.h>
#include <stdint.h>
#include <string.h>

#define INT4_TILE_N 64      /* torch's pack tile: 64 output columns */

static inline float int4_bf16_to_f32(uint16_t h) {
    uint32_t bits = (uint32_t)h << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* float32 lanes -> bfloat16 to nearest even in the low 16 bits of each 32-bit lane; NaN ->
 * 0xffff (as torch's vectorized conversion). */
static inline __m512i int4_bf16_lanes(__m512 v) {
    __m512i bits = _mm512_castps_si512(v);
    __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    __m512i rounded = _mm512_add_epi32(_mm512_add_epi32(bits, _mm512_set1_epi32(0x7fff)), lsb);
    rounded = _mm512_srli_epi32(rounded, 16);
    __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    return _mm512_mask_blend_epi32(nan, rounded, _mm512_set1_epi32(0xffff));
}

#if defined(__AMX_TILE__) && defined(__linux__)
int rg_amx_init(void);                /* native_int4_amx.c: the tile state, once a process */

struct int4_tile_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
};

/* All 8 AMX tiles as 16 rows x 64 bytes (what both tile kernels use), on this thread. */
static inline void int4_configure_tiles(void) {
    struct int4_tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; t++) { cfg.rows[t] = 16; cfg.colsb[t] = 64; }
    _tile_loadconfig(&cfg);
}
#endif

/* The scale and zero of group ``k / group`` for the tile's 64 columns (scales-and-zeros
 * bf16 [K/group, N, 2]), as float32, 16 columns a vector. */
static inline void int4_group_scales(const uint16_t *sz, long k, long group, long N, long n0,
                                     __m512 scale[4], __m512 zero[4]) {
    const uint16_t *pair = sz + ((k / group) * N + n0) * 2;
    for (int c = 0; c < 4; c++) {
        float s[16], z[16];
        for (int j = 0; j < 16; j++) {
            s[j] = int4_bf16_to_f32(pair[(c * 16 + j) * 2]);
            z[j] = int4_bf16_to_f32(pair[(c * 16 + j) * 2 + 1]);
        }
        scale[c] = _mm512_loadu_ps(s);
        zero[c] = _mm512_loadu_ps(z);
    }
}

/* Row k of a pack tile's weights, float32, columns 16c .. 16c + 15 in w[c]: byte j holds
 * column j (j < 16: bytes 0-15; else 16 + j - 16) in its low nibble and column 32 + j in its
 * high one; w = fma(code - 8, scale, zero), the op's one rounding. */
static inline void int4_dequantize_row(const uint8_t *tile, long k, const __m512 scale[4],
                                       const __m512 zero[4], __m512 w[4]) {
    const __m512 lut = _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
    __m256i bytes = _mm256_loadu_si256((const __m256i *)(tile + k * 32));
    __m512i low = _mm512_cvtepu8_epi32(_mm256_castsi256_si128(bytes));     /* cols 0-15, 32-47 */
    __m512i high = _mm512_cvtepu8_epi32(_mm256_extracti128_si256(bytes, 1)); /* 16-31, 48-63 */
    __m512i codes[4] = {low, high, _mm512_srli_epi32(low, 4), _mm512_srli_epi32(high, 4)};
    for (int c = 0; c < 4; c++)
        w[c] = _mm512_fmadd_ps(_mm512_permutexvar_ps(codes[c], lut), scale[c], zero[c]);
}
#endif

#endif
