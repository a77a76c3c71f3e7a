/* Causal attention of a short extend (up to 64 new tokens) over a sequence's paged float32
 * K/V: the suffix prefill of every cache hit (built by kernels/native.py with native.c).
 *
 * torch's CPU flash attention with a mask ran 16 queries over 2,064 keys at ~35 GFLOPS
 * (2.2 ms a layer on two Ice Lake cores): its work splits by query blocks, and 16 queries
 * are one block a head. Here the key blocks are read once per kv head for all of its query
 * heads' rows: a block of K is transposed to [d][16] so that one FMA adds a query dim's
 * products for 16 keys at once (no horizontal sum per score), then an online softmax and the
 * weighted V rows, all in float32.
 *
 * Order: a query vector (row, head) reads its keys in chunks of CHUNK_KEYS positions from
 * position 0, each chunk an online softmax over its key blocks in order and the keys of a
 * block in order, the chunks folded in order; so a row's output never depends on the thread
 * count, on the rows beside it, or on how the work was split (a chunk computed by another
 * worker folds in the same place).
 *
 * Memory: an item holds every head of its rows, so each step reads its 16 slots' K and V
 * lines whole (the cache is [blocks, bs, hkv, d]: one head's rows are one line in hkv); a
 * decode row at 8k context, one head an item, had waited on memory for two thirds of its
 * attention (AMD EPYC: 1.1 against 0.38 ms a layer with the cache warm).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "native_math.h"

#define KEYS 16          /* keys a step: one vector of scores */
#define MAX_VECTORS 1024 /* query vectors (rows x heads) an item */
#define PREFETCH_STEPS 2 /* steps ahead whose K and V lines are asked for (prefetch_step) */
#define CHUNK_KEYS 256   /* a query's keys, in chunks from position 0 (a multiple of KEYS) */
#define MAX_DIM 256

#if defined(__AVX512F__)
#include <immintrin.h>
#define RG_AVX512 1

/* e^x in 16 lanes for x <= 0 (-inf gives 0): the polynomial of exp_nonpositive, lane by lane. */
static inline __m512 exp_lanes(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    __m512 n = _mm512_roundscale_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f),
                                                    _mm512_set1_ps(0.5f)),
                                    _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f),
                               _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x));
    __m512 p = _mm512_set1_ps(1.3888889e-3f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3333338e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1666668e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666667e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.0f));
    __m512i bits = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(p, _mm512_castsi512_ps(bits));
}
#else
#define RG_AVX512 0
#endif

/* The cache's element kinds. Every kind converts to float32 exactly (an 8-bit code times its
 * float16 scale is an exact float32 product), so a query's bits are the same as over a float32
 * copy of the same values: the kernel reads the cache as it is stored, no scratch. */
enum { KV_F32 = 0, KV_BF16 = 1, KV_F16 = 2, KV_I8 = 3, KV_FP8 = 4 };

typedef struct {
    const void *k, *v;                  /* [blocks, bs, hkv, d] of the kind */
    const uint16_t *k_scale, *v_scale;  /* [blocks, bs, hkv] float16: 8-bit kinds only */
    int kind;
    long hkv, d;
} kv_source;

static float fp8_values[256];          /* e4m3fn code -> value (kv_prepare fills it) */

static void kv_prepare(void) {
    for (int c = 0; c < 256; c++) {
        int e = (c >> 3) & 15, m = c & 7;
        float v = e == 15 && m == 7 ? NAN : e == 0 ? (float)m * 0.001953125f
                                                   : ldexpf(1.0f + (float)m / 8.0f, e - 7);
        fp8_values[c] = c & 0x80 ? -v : v;
    }
}

/* Row (slot, kv head g) of K (which 0) or V (which 1) as float32: the row itself for a float32
 * cache, else converted into dst [d]. */
static const float *row_floats(const kv_source *c, int which, long slot, long g, float *dst) {
    const long at = slot * c->hkv + g, d = c->d;
    const void *base = which ? c->v : c->k;
    const uint16_t *scales = which ? c->v_scale : c->k_scale;
    if (c->kind == KV_F32) return (const float *)base + at * d;
    const float scale = c->kind >= KV_I8 ? half_value(scales[at]) : 1.0f;
    const uint8_t *b8 = (const uint8_t *)base + at * d;
    const uint16_t *b16 = (const uint16_t *)base + at * d;
#if RG_AVX512
    for (long i = 0; i < d && c->kind != KV_FP8; i += 16) {
        __m512 x;
        if (c->kind == KV_I8)
            x = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                    _mm_loadu_si128((const __m128i *)(b8 + i)))), _mm512_set1_ps(scale));
        else if (c->kind == KV_F16)
            x = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(b16 + i)));
        else
            x = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(
                    _mm256_loadu_si256((const __m256i *)(b16 + i))), 16));
        _mm512_storeu_ps(dst + i, x);
    }
    if (c->kind != KV_FP8) return dst;
#endif
    for (long i = 0; i < d; i++) {
        uint32_t bits;
        switch (c->kind) {
        case KV_I8: dst[i] = (float)(int8_t)b8[i] * scale; break;
        case KV_FP8: dst[i] = fp8_values[b8[i]] * scale; break;
        case KV_F16: dst[i] = half_value(b16[i]); break;
        default: bits = (uint32_t)b16[i] << 16; memcpy(dst + i, &bits, sizeof bits);
        }
    }
    return dst;
}

#if RG_AVX512
/* kt [16 dims][16 keys] = dims [i0, i0 + 16) of the 16 rows: a register transpose (pure data
 * movement, the same values as element by element). */
static inline void transpose16_store(__m512 *r, float *kt) {
    __m512 t[16];
    for (int j = 0; j < 16; j += 2) {
        t[j] = _mm512_unpacklo_ps(r[j], r[j + 1]);
        t[j + 1] = _mm512_unpackhi_ps(r[j], r[j + 1]);
    }
    for (int k = 0; k < 16; k += 4) {           /* r[k + c]: column 4L + c of rows k..k+3 */
        __m512d a = _mm512_castps_pd(t[k]), b = _mm512_castps_pd(t[k + 1]);
        __m512d a2 = _mm512_castps_pd(t[k + 2]), b2 = _mm512_castps_pd(t[k + 3]);
        r[k] = _mm512_castpd_ps(_mm512_unpacklo_pd(a, a2));
        r[k + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(a, a2));
        r[k + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(b, b2));
        r[k + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(b, b2));
    }
    for (int c = 0; c < 4; c++) {
        __m512 v = _mm512_shuffle_f32x4(r[c], r[4 + c], 0x88), w = _mm512_shuffle_f32x4(r[c], r[4 + c], 0xDD);
        __m512 v2 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0x88);
        __m512 w2 = _mm512_shuffle_f32x4(r[8 + c], r[12 + c], 0xDD);
        _mm512_storeu_ps(kt + (c) * KEYS, _mm512_shuffle_f32x4(v, v2, 0x88));
        _mm512_storeu_ps(kt + (8 + c) * KEYS, _mm512_shuffle_f32x4(v, v2, 0xDD));
        _mm512_storeu_ps(kt + (4 + c) * KEYS, _mm512_shuffle_f32x4(w, w2, 0x88));
        _mm512_storeu_ps(kt + (12 + c) * KEYS, _mm512_shuffle_f32x4(w, w2, 0xDD));
    }
}

static inline void transpose16(const float *const *rows, long i0, float *kt) {
    __m512 r[16];
    for (int p = 0; p < 16; p++) r[p] = _mm512_loadu_ps(rows[p] + i0);
    transpose16_store(r, kt);
}

/* K^T [d][16] straight from an int8 cache: each code times its row's scale (the exact product
 * row_floats makes), transposed in registers without the float rows going through memory.
 * Keys p >= n are 0. */
static void transpose_keys_i8(const kv_source *c, const long *slots, long n, long g, float *kt) {
    const int8_t *rows[KEYS];
    __m512 scale[KEYS];
    for (long p = 0; p < KEYS; p++) {
        const long at = p < n ? slots[p] * c->hkv + g : 0;
        rows[p] = (const int8_t *)c->k + at * c->d;
        scale[p] = _mm512_set1_ps(p < n ? half_value(c->k_scale[at]) : 0.0f);
    }
    for (long i0 = 0; i0 < c->d; i0 += 16) {
        __m512 r[16];
        for (int p = 0; p < 16; p++)
            r[p] = p < n ? _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(
                               _mm_loadu_si128((const __m128i *)(rows[p] + i0)))), scale[p])
                         : _mm512_setzero_ps();
        transpose16_store(r, kt + i0 * KEYS);
    }
}
#endif

/* K^T [d][16] of a step's 16 key rows (absent keys point at a zero row). */
static void transpose_keys(const float *const *rows, long d, float *kt) {
#if RG_AVX512
    for (long i0 = 0; i0 < d; i0 += 16) transpose16(rows, i0, kt + i0 * KEYS);
#else
    for (long p = 0; p < KEYS; p++)
        for (long i = 0; i < d; i++) kt[i * KEYS + p] = rows[p][i];
#endif
}

#if !RG_AVX512
/* a [d] = a * alpha + sum over the block's visible keys of w[p] * V[p], keys in order. */
static void weigh(float *restrict a, const float *const *vrow, const float *w, long visible,
                  float alpha, long d) {
    for (long i = 0; i < d; i++) a[i] *= alpha;
    for (long p = 0; p < visible; p++)
        for (long i = 0; i < d; i++) a[i] += w[p] * vrow[p][i];
}
#endif

#if RG_AVX512
/* Query vectors 0..V-1 (V <= 4, and C = d / 16 chunks, constants where inlined) over one key
 * block: their scores from the transposed keys kt [d][16], the online softmax, and the
 * weighted V rows. Each vector's sums run in the same order whatever V is (a vector's keys
 * past its own visible ones weigh exactly 0), so grouping never changes a bit. */
static inline __attribute__((always_inline)) void block_vectors(
        const int V, const long C, const float *kt, const float *const *vrow,
        const long *visible, const float *qs, long d, float *peak, float *sum, float *acc) {
    __m512 s0[4], s1[4], s2[4], s3[4];
    for (int v = 0; v < V; v++)
        s0[v] = s1[v] = s2[v] = s3[v] = _mm512_setzero_ps();
    for (long i = 0; i < 16 * C; i += 4) {           /* 16 scores a vector, 4 chains */
        __m512 k0 = _mm512_loadu_ps(kt + i * KEYS), k1 = _mm512_loadu_ps(kt + (i + 1) * KEYS);
        __m512 k2 = _mm512_loadu_ps(kt + (i + 2) * KEYS), k3 = _mm512_loadu_ps(kt + (i + 3) * KEYS);
        for (int v = 0; v < V; v++) {
            const float *qv = qs + v * d + i;
            s0[v] = _mm512_fmadd_ps(_mm512_set1_ps(qv[0]), k0, s0[v]);
            s1[v] = _mm512_fmadd_ps(_mm512_set1_ps(qv[1]), k1, s1[v]);
            s2[v] = _mm512_fmadd_ps(_mm512_set1_ps(qv[2]), k2, s2[v]);
            s3[v] = _mm512_fmadd_ps(_mm512_set1_ps(qv[3]), k3, s3[v]);
        }
    }
    float w[4][KEYS], alpha[4];
    long reach = 0;
    for (int v = 0; v < V; v++) {
        __m512 sv = _mm512_add_ps(_mm512_add_ps(s0[v], s1[v]), _mm512_add_ps(s2[v], s3[v]));
        __mmask16 seen = (__mmask16)((1u << visible[v]) - 1u);
        sv = _mm512_mask_blend_ps(seen, _mm512_set1_ps(-INFINITY), sv);
        float block_max = _mm512_reduce_max_ps(sv), m = block_max > peak[v] ? block_max : peak[v];
        __m512 e = _mm512_maskz_mov_ps(seen, exp_lanes(_mm512_sub_ps(sv, _mm512_set1_ps(m))));
        _mm512_storeu_ps(w[v], e);
        alpha[v] = exp_nonpositive(peak[v] - m);
        sum[v] = sum[v] * alpha[v] + _mm512_reduce_add_ps(e);
        peak[v] = m;
        reach = visible[v] > reach ? visible[v] : reach;
    }
    for (long c0 = 0; c0 < C; c0 += 4) {             /* up to 4 chunks x V vectors at once */
        const long cn = C - c0 < 4 ? C - c0 : 4;
        __m512 a[4][4];
        for (int v = 0; v < V; v++)
            for (long c = 0; c < cn; c++)
                a[v][c] = _mm512_mul_ps(_mm512_loadu_ps(acc + v * d + 16 * (c0 + c)),
                                        _mm512_set1_ps(alpha[v]));
        for (long p = 0; p < reach; p++) {
            __m512 vv[4];
            for (long c = 0; c < cn; c++) vv[c] = _mm512_loadu_ps(vrow[p] + 16 * (c0 + c));
            for (int v = 0; v < V; v++) {
                __m512 wp = _mm512_set1_ps(w[v][p]);
                for (long c = 0; c < cn; c++) a[v][c] = _mm512_fmadd_ps(wp, vv[c], a[v][c]);
            }
        }
        for (int v = 0; v < V; v++)
            for (long c = 0; c < cn; c++) _mm512_storeu_ps(acc + v * d + 16 * (c0 + c), a[v][c]);
    }
}

/* Vectors [j0, j0 + count) of an item over one key block, four at a time. */
static void block_all(long count, const float *kt, const float *const *vrow, const long *visible,
                      const float *qs, long d, float *peak, float *sum, float *acc) {
    long j = 0;
    for (; j + 4 <= count; j += 4) {
        if (d == 64) block_vectors(4, 4, kt, vrow, visible + j, qs + j * d, d, peak + j, sum + j, acc + j * d);
        else block_vectors(4, d / 16, kt, vrow, visible + j, qs + j * d, d, peak + j, sum + j, acc + j * d);
    }
    const long left = count - j;            /* 3 or 2 together (a decode row's group of 3) */
    if (left == 3 && d == 64) block_vectors(3, 4, kt, vrow, visible + j, qs + j * d, d, peak + j, sum + j, acc + j * d);
    else if (left == 3) block_vectors(3, d / 16, kt, vrow, visible + j, qs + j * d, d, peak + j, sum + j, acc + j * d);
    else if (left == 2 && d == 64) block_vectors(2, 4, kt, vrow, visible + j, qs + j * d, d, peak + j, sum + j, acc + j * d);
    else if (left == 2) block_vectors(2, d / 16, kt, vrow, visible + j, qs + j * d, d, peak + j, sum + j, acc + j * d);
    else if (left == 1 && d == 64) block_vectors(1, 4, kt, vrow, visible + j, qs + j * d, d, peak + j, sum + j, acc + j * d);
    else if (left == 1) block_vectors(1, d / 16, kt, vrow, visible + j, qs + j * d, d, peak + j, sum + j, acc + j * d);
}
#endif

/* The scores and online softmax of ``count`` vectors over one key block (the build without
 * AVX-512): the same contract as the vector version. */
#if !RG_AVX512
static void block_all(long count, const float *kt, const float *const *vrow, const long *visible,
                      const float *qs, long d, float *peak, float *sum, float *acc) {
    for (long j = 0; j < count; j++) {
        float s[KEYS], m = peak[j], total_w = 0.f;
        for (long p = 0; p < KEYS; p++) s[p] = 0.f;
        for (long i = 0; i < d; i++) {                   /* 16 scores, one FMA a dim */
            float qi = qs[j * d + i];
            for (long p = 0; p < KEYS; p++) s[p] += qi * kt[i * KEYS + p];
        }
        for (long p = 0; p < visible[j]; p++) m = s[p] > m ? s[p] : m;
        for (long p = 0; p < KEYS; p++) {
            s[p] = p < visible[j] ? exp_nonpositive(s[p] - m) : 0.f;
            total_w += s[p];
        }
        float alpha = exp_nonpositive(peak[j] - m);
        sum[j] = sum[j] * alpha + total_w;
        peak[j] = m;
        weigh(acc + j * d, vrow, s, visible[j], alpha, d);
    }
}
#endif

/* What an item reads: a sequence's caches through its block table, its queries' first
 * position, the shapes. */
typedef struct {
    const kv_source *cache;
    const int32_t *table;
    long first, hq, hkv, d, bs;
    long g0, g1;                        /* the kv heads the item computes */
} item_keys;

/* Online-softmax state of an item's vectors: per vector the largest score, the sum of the
 * weights, the weighted V rows [d]. Vector order: kv head g's (row, group head) pairs, so
 * head g's vectors are the run [g * rows * group, (g + 1) * rows * group). */
typedef struct {
    float *peak, *sum, *acc;
} softmax_state;

/* Scratch of one worker: K^T, the converted K and V rows of a step, a zero row. */
typedef struct {
    float *kt, *rows, *zeros;
} step_scratch;

/* Asks for the K and V lines (and scales) of the 16 slots from position pos, every head: the
 * step PREFETCH_STEPS ahead of the one computed, whose blocks the table may scatter anywhere
 * (the hardware prefetchers stop at a block's end). A hint: no value changes. */
static inline void prefetch_line(const void *p) {
#if defined(__x86_64__)
    __asm__ volatile("prefetcht0 (%0)" : : "r"(p));   /* GCC 12 drops a loop of __builtin_prefetch */
#else
    __builtin_prefetch(p, 0, 3);
#endif
}

static inline void prefetch_step(const kv_source *c, const int32_t *table, long pos, long bs) {
    const long esize = c->kind == KV_F32 ? 4 : c->kind >= KV_I8 ? 1 : 2;
    const long slot = (long)table[pos / bs] * bs + pos % bs, row = c->hkv * c->d * esize;
    const char *k = (const char *)c->k + slot * row, *v = (const char *)c->v + slot * row;
    for (long off = 0; off < KEYS * row; off += 64) {
        prefetch_line(k + off);
        prefetch_line(v + off);
    }
    if (c->kind >= KV_I8)
        for (long off = 0; off < KEYS * c->hkv * 2; off += 64) {
            prefetch_line((const char *)(c->k_scale + slot * c->hkv) + off);
            prefetch_line((const char *)(c->v_scale + slot * c->hkv) + off);
        }
}

/* The item's query rows [r0, r1) (every head, ``scaled``: q times the scale, in vector order)
 * over the keys [k0, k1): ``st`` starts empty. Each step converts the 16 slots' rows of one
 * kv head after the other, so it reads the slots' K and V lines whole and in order (one head
 * a pass read one 64-byte line in three: a decode row at 8k context waited on memory for two
 * thirds of its attention). */
static void attend_keys(const item_keys *it, const float *scaled, long r0, long r1, long k0,
                        long k1, step_scratch *sc, softmax_state *st) {
    const long d = it->d, group = it->hq / it->hkv, rows = r1 - r0, per_g = rows * group;
    for (long j = it->g0 * per_g; j < it->g1 * per_g; j++) st->peak[j] = -INFINITY, st->sum[j] = 0.f;
    memset(st->acc + it->g0 * per_g * d, 0, sizeof(float) * (size_t)((it->g1 - it->g0) * per_g * d));
    for (long start = k0; start < k1; start += KEYS) {
        const long n = k1 - start < KEYS ? k1 - start : KEYS;
        long slots[KEYS], visible[MAX_VECTORS], from = 0;
        if (it->bs % KEYS == 0 && start + PREFETCH_STEPS * KEYS < k1)
            prefetch_step(it->cache, it->table, start + PREFETCH_STEPS * KEYS, it->bs);
        if (it->bs % KEYS == 0) {                        /* the step inside one block */
            const long base = (long)it->table[start / it->bs] * it->bs + start % it->bs;
            for (long p = 0; p < n; p++) slots[p] = base + p;
        } else {
            for (long p = 0; p < n; p++) {
                const long pos = start + p;
                slots[p] = (long)it->table[pos / it->bs] * it->bs + pos % it->bs;
            }
        }
        for (long j = 0; j < per_g; j++) {               /* keys of this block each sees */
            const long seen = it->first + r0 + j / group + 1 - start;
            visible[j] = seen <= 0 ? 0 : (seen > n ? n : seen);
            if (visible[j] == 0) from = j + 1;            /* rows in order: a prefix sees none */
        }
        if (from == per_g) continue;
        for (long g = it->g0; g < it->g1; g++) {
            const float *vrow[KEYS], *krow[KEYS];
            const int keys_i8 = RG_AVX512 && it->cache->kind == KV_I8;
            for (long p = 0; p < KEYS; p++) {            /* K^T [d][16], absent keys 0 */
                if (!keys_i8)
                    krow[p] = p < n ? row_floats(it->cache, 0, slots[p], g, sc->rows + p * d) : sc->zeros;
                vrow[p] = p < n ? row_floats(it->cache, 1, slots[p], g, sc->rows + (KEYS + p) * d)
                                : NULL;
            }
#if RG_AVX512
            if (keys_i8) transpose_keys_i8(it->cache, slots, n, g, sc->kt);
            else
#endif
                transpose_keys(krow, d, sc->kt);
            const long at = g * per_g + from;
            block_all(per_g - from, sc->kt, vrow, visible + from, scaled + at * d, d,
                      st->peak + at, st->sum + at, st->acc + at * d);
        }
    }
}

/* Folds chunk c's state of one vector (peak pc, sum sc, weighted rows ac) into the running
 * state (*m, *s, o) of the chunks before it. Chunk 0's state is taken as it is, so a query
 * whose keys fit one chunk gets the plain online softmax's bits. */
static void fold_chunk(float *m, float *s, float *o, float pc, float sc, const float *ac, long d) {
    const float top = pc > *m ? pc : *m, a = exp_nonpositive(*m - top), b = exp_nonpositive(pc - top);
    *s = *s * a + sc * b;
    for (long i = 0; i < d; i++) o[i] = o[i] * a + ac[i] * b;
    *m = top;
}

/* out rows [r0, r1) of every head from the final state: the weighted rows over their sum. */
static void write_rows(const item_keys *it, long r0, long r1, const softmax_state *st, float *out) {
    const long d = it->d, group = it->hq / it->hkv, per_g = (r1 - r0) * group;
    for (long j = it->g0 * per_g; j < it->g1 * per_g; j++) {
        const long g = j / per_g, row = r0 + (j % per_g) / group, head = g * group + j % group;
        const float inv = 1.0f / st->sum[j];
        float *o = out + (row * it->hq + head) * d;
        for (long i = 0; i < d; i++) o[i] = st->acc[j * d + i] * inv;
    }
}

/* Vector j's query, times the scale, into scaled (vector order). */
static void scale_queries(const item_keys *it, const float *q, float scale, long r0, long r1,
                          float *scaled) {
    const long d = it->d, group = it->hq / it->hkv, per_g = (r1 - r0) * group;
    for (long j = it->g0 * per_g; j < it->g1 * per_g; j++) {
        const long g = j / per_g, row = r0 + (j % per_g) / group, head = g * group + j % group;
        const float *qv = q + (row * it->hq + head) * d;
        for (long i = 0; i < d; i++) scaled[j * d + i] = qv[i] * scale;
    }
}

/* The chunks a tile's last row reads: a query at position p reads chunks 0 .. p / CHUNK_KEYS. */
static inline long tile_chunks(long first, long r1) { return (first + r1 - 1) / CHUNK_KEYS + 1; }

/* A tile whole on one worker: its chunks in order, each folded in as it ends. */
static void tile_whole(const item_keys *it, const float *q, float scale, long r0, long r1,
                       step_scratch *sc, softmax_state *run, softmax_state *chunk, float *scaled,
                       float *out) {
    const long d = it->d, group = it->hq / it->hkv, per_g = (r1 - r0) * group;
    const long last = it->first + r1 - 1, chunks = tile_chunks(it->first, r1);
    scale_queries(it, q, scale, r0, r1, scaled);
    attend_keys(it, scaled, r0, r1, 0, last + 1 < CHUNK_KEYS ? last + 1 : CHUNK_KEYS, sc, run);
    for (long c = 1; c < chunks; c++) {
        const long k0 = c * CHUNK_KEYS, k1 = last + 1 < k0 + CHUNK_KEYS ? last + 1 : k0 + CHUNK_KEYS;
        attend_keys(it, scaled, r0, r1, k0, k1, sc, chunk);
        for (long j = it->g0 * per_g; j < it->g1 * per_g; j++)
            if (it->first + r0 + (j % per_g) / group >= k0)     /* the rows that reach it */
                fold_chunk(run->peak + j, run->sum + j, run->acc + j * d, chunk->peak[j],
                           chunk->sum[j], chunk->acc + j * d, d);
    }
    write_rows(it, r0, r1, run, out);
}

/* Work items of one call. Item i: sequence seq[i], rows [r0[i], r1[i]), kv heads [g0[i],
 * g1[i]); chunk[i] -1 for a tile whole on one worker, else that one chunk of a split tile
 * (every head), whose state goes to the partials at part[i] (folded, in chunk order, by the
 * split tile's item of chunk 0). */
typedef struct {
    long *seq, *r0, *r1, *chunk, *part, *g0;
    long count, parts, hkv;
} item_list;

/* A sequence whose queries fit one tile (decode rows, drafts, short extends) splits its
 * chunks over workers: a decode row at 8k context is then 32 items, not one; within one
 * chunk (up to 256 positions, few bytes to read) it splits by kv head instead, so that a
 * short decode row is not one worker's alone. Longer prompts keep each tile whole, every
 * head (their tiles already give every worker work). No split changes a bit: a vector's
 * chunks fold in the same order whoever computes them. */
static long items_of(long q_len, long first, long tile, long hkv) {
    if (q_len > tile) return (q_len + tile - 1) / tile;
    const long chunks = tile_chunks(first, q_len);
    return chunks > 1 ? chunks : hkv;
}

static int list_items(const int32_t *cu_q, const int32_t *totals, long seqs, long tile, long hq,
                      long hkv, long d, item_list *list) {
    long count = 0;
    for (long s = 0; s < seqs; s++)
        count += items_of(cu_q[s + 1] - cu_q[s], totals[s] - (cu_q[s + 1] - cu_q[s]), tile, hkv);
    const long room = count > 0 ? count : 1;
    list->seq = malloc(sizeof(long) * (size_t)(6 * room));
    if (list->seq == NULL) return -2;
    list->r0 = list->seq + room, list->r1 = list->r0 + room;
    list->chunk = list->r1 + room, list->part = list->chunk + room, list->g0 = list->part + room;
    list->hkv = hkv;
    long i = 0, parts = 0;
    for (long s = 0; s < seqs; s++) {
        const long q_len = cu_q[s + 1] - cu_q[s], first = totals[s] - q_len;
        const int short_q = q_len <= tile, by_head = short_q && tile_chunks(first, q_len) == 1;
        const long n = items_of(q_len, first, tile, hkv);
        for (long j = 0; j < n; j++, i++) {
            list->seq[i] = s, list->part[i] = parts, list->g0[i] = by_head ? j : -1;
            list->r0[i] = short_q ? 0 : j * tile;
            list->r1[i] = short_q || (j + 1) * tile > q_len ? q_len : (j + 1) * tile;
            list->chunk[i] = short_q && !by_head ? j : -1;
            if (list->chunk[i] >= 0) parts += q_len * hq * (d + 2);
        }
    }
    list->count = count, list->parts = parts;
    return 0;
}

/* The state of a split tile's chunk c in the partials (its item's ``part``). */
static softmax_state chunk_partial(float *partials, long part, long nv, long d) {
    softmax_state st = {partials + part, partials + part + nv, partials + part + 2 * nv};
    return st;
}

/* A split tile's chunks folded in order (chunk 0 taken as it is), then its rows written. */
static void fold_split_tile(const item_keys *it, long q_len, float *partials, long part0,
                            long chunks, float *out) {
    const long d = it->d, group = it->hq / it->hkv, nv = q_len * it->hq, per_g = q_len * group;
    const long stride = nv * (d + 2);
    softmax_state run = chunk_partial(partials, part0, nv, d);
    for (long c = 1; c < chunks; c++) {
        softmax_state ch = chunk_partial(partials, part0 + c * stride, nv, d);
        for (long j = 0; j < nv; j++)
            if (it->first + (j % per_g) / group >= c * CHUNK_KEYS)
                fold_chunk(run.peak + j, run.sum + j, run.acc + j * d, ch.peak[j], ch.sum[j],
                           ch.acc + j * d, d);
    }
    write_rows(it, 0, q_len, &run, out);
}

/* Causal attention of every sequence of a step, whatever its query count: the deterministic
 * mode's one attention (decode rows, cache-hit extends and whole prompts alike). Sequence s
 * owns query rows [cu_q[s], cu_q[s + 1]) of q [rows, hq, d], its queries at positions
 * totals[s] - q_len .. totals[s] - 1, its keys through tables[s] (int32, table_width a row).
 * The caches hold ``kind`` (KV_F32 .. KV_FP8; the 8-bit kinds with float16 scales per row),
 * read in place and converted exactly (kv_source).
 * A query's keys run in chunks of CHUNK_KEYS from position 0, each an online softmax over its
 * keys in order, folded in chunk order (fold_chunk). Items (tiles of ``tile_rows`` rows, every
 * head, whole or split by chunk: list_items) go to ``threads`` workers, dynamic; so a query's
 * output is the same bits however the step was made up (rows beside it, its sequence's query
 * count, the tile, the thread count). Returns 0; -1 a block id outside the cache or a table
 * too short; -2 out of memory; -3 a shape not taken. */
int rg_ragged_attention_kv(const float *q, int kind, const void *k_cache, const void *v_cache,
                           const uint16_t *k_scale, const uint16_t *v_scale,
                           const int32_t *tables, long table_width, const int32_t *cu_q,
                           const int32_t *totals, long seqs, long hq, long hkv, long d, long bs,
                           long num_blocks, float scale, long tile_rows, int threads, float *out) {
    if (hkv <= 0 || hq % hkv || d % 16 || d > MAX_DIM || bs < 1 || seqs < 0) return -3;
    if (kind < KV_F32 || kind > KV_FP8 || (kind >= KV_I8 && (k_scale == NULL || v_scale == NULL)))
        return -3;
    if (kind == KV_FP8) kv_prepare();
    const kv_source cache = {k_cache, v_cache, k_scale, v_scale, kind, hkv, d};
    const long tile = MAX_VECTORS / hq < tile_rows ? MAX_VECTORS / hq : tile_rows;
    if (tile < 1) return -3;
    for (long s = 0; s < seqs; s++) {
        long q_len = cu_q[s + 1] - cu_q[s], total = totals[s], need = (total + bs - 1) / bs;
        if (q_len < 1 || q_len > total) return -3;
        if (need > table_width) return -1;
        for (long b = 0; b < need; b++)
            if (tables[s * table_width + b] < 0 || tables[s * table_width + b] >= num_blocks)
                return -1;
    }
    item_list list;
    if (list_items(cu_q, totals, seqs, tile, hq, hkv, d, &list)) return -2;
    float *partials = list.parts ? malloc(sizeof(float) * (size_t)list.parts) : NULL;
    if (list.parts && partials == NULL) {
        free(list.seq);
        return -2;
    }
    int failed = 0;
    if (threads < 1) threads = 1;
    if (threads > list.count) threads = list.count > 0 ? (int)list.count : 1;
    #pragma omp parallel num_threads(threads) if(threads > 1)
    {
        const size_t state = (size_t)(tile * hq * d);
        float *scratch = malloc(sizeof(float) * ((size_t)(d * KEYS * 3 + d) + 3 * state));
        float *peaks = malloc(sizeof(float) * (size_t)(4 * MAX_VECTORS));
        if (scratch == NULL || peaks == NULL) {
            #pragma omp atomic write
            failed = 1;
        }
        step_scratch sc = {scratch, scratch + d * KEYS, scratch + 3 * d * KEYS};
        float *scaled = scratch + 3 * d * KEYS + d;
        softmax_state run = {peaks, peaks + MAX_VECTORS, scaled + state};
        softmax_state chunk = {peaks + 2 * MAX_VECTORS, peaks + 3 * MAX_VECTORS, scaled + 2 * state};
        if (scratch != NULL) memset(sc.zeros, 0, sizeof(float) * (size_t)d);
        #pragma omp for schedule(dynamic, 1)
        for (long i = list.count - 1; i >= 0; i--) {       /* longest (last rows) first */
            if (scratch == NULL || peaks == NULL) continue;
            const long s = list.seq[i], q_len = cu_q[s + 1] - cu_q[s], g0 = list.g0[i];
            const item_keys it = {&cache, tables + s * table_width, totals[s] - q_len, hq, hkv, d, bs,
                                  g0 < 0 ? 0 : g0, g0 < 0 ? hkv : g0 + 1};
            const float *qs = q + (long)cu_q[s] * hq * d;
            if (list.chunk[i] < 0) {
                tile_whole(&it, qs, scale, list.r0[i], list.r1[i], &sc, &run, &chunk, scaled,
                           out + (long)cu_q[s] * hq * d);
                continue;
            }
            const long c = list.chunk[i], k0 = c * CHUNK_KEYS, last = totals[s] - 1;
            softmax_state st = chunk_partial(partials, list.part[i], q_len * hq, d);
            scale_queries(&it, qs, scale, 0, q_len, scaled);
            attend_keys(&it, scaled, 0, q_len, k0, last + 1 < k0 + CHUNK_KEYS ? last + 1 : k0 + CHUNK_KEYS,
                        &sc, &st);
        }
        #pragma omp for schedule(dynamic, 1)
        for (long i = 0; i < list.count; i++) {            /* split tiles: fold their chunks */
            if (list.chunk[i] != 0) continue;
            const long s = list.seq[i], q_len = cu_q[s + 1] - cu_q[s];
            const item_keys it = {&cache, tables + s * table_width, totals[s] - q_len, hq, hkv, d, bs,
                                  0, hkv};
            fold_split_tile(&it, q_len, partials, list.part[i], tile_chunks(it.first, q_len),
                            out + (long)cu_q[s] * hq * d);
        }
        free(scratch);
        free(peaks);
    }
    free(partials);
    free(list.seq);
    return failed ? -2 : 0;
}

/* q [q_len, hq, d] (query i at position total - q_len + i), causal over the float32 caches
 * [blocks, bs, hkv, d] through table (int32 block ids, at least ceil(total / bs) of them)
 * -> out [q_len, hq, d]: rg_ragged_attention_kv with one sequence, tiles of 8 rows (the same
 * items, the same bits). Returns 0; -1 a block id outside the cache or a table too short;
 * -2 out of memory; -3 a shape not taken (hq % hkv, d a multiple of 16 up to 256, q_len
 * 1..64 and at most total). */
int rg_extend_attention(const float *q, const float *k_cache, const float *v_cache,
                        const int32_t *table, long table_len, long q_len, long total,
                        long hq, long hkv, long d, long bs, long num_blocks, float scale,
                        int threads, float *out) {
    if (q_len < 1 || q_len > 64) return -3;
    const int32_t cu_q[2] = {0, (int32_t)q_len}, totals[1] = {(int32_t)total};
    return rg_ragged_attention_kv(q, KV_F32, k_cache, v_cache, NULL, NULL, table, table_len, cu_q,
                                  totals, 1, hq, hkv, d, bs, num_blocks, scale, 8, threads, out);
}
