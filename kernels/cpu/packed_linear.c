/* y = x @ w.T (+ bias) in fp32 against weights packed once into column panels: the fp32 GEMM of CPU steps.
 *
 * The packed weight holds panels of PANEL = 16 output columns; panel p is [in][16] (column 16p + j at [k][j],
 * zero past the last column), so a panel streams contiguously. A register tile of up to TILE_ROWS = 6 rows of x by
 * one panel keeps 6 x 16 accumulators (on AVX2, 12 of its 16 registers, beside two weight vectors and one
 * broadcast; vec.h's vectors, KV of them per panel row) and runs over `in` with one FMA per row and vector per k,
 * carried across k-blocks of K_BLOCK (whose slice of the panel stays in L1) through a small buffer. Each output is
 * therefore the same in-order sum of its k terms whatever the row count or tile: a prompt's rows give the same
 * numbers whole or split across steps. Rows go in blocks of BLOCK_ROWS that stay in L2 while the panels stream;
 * panels are handed out to OpenMP threads as they come free (torch's runtime, as in the other kernels).
 * Measurements: docs/cpu.md.
 *
 * Coded panels: a weight that is exactly q * scale + offset in fp32 for integer codes q and one (scale, offset)
 * per column and group of 32 inputs (16 for GGUF Q6_K's sub-blocks; a GGUF checkpoint's blocks, or a model
 * dequantized from one, like the default model) is packed as those codes, and each k-block of a panel is expanded
 * back into fp32 in L1 before the same tiles run. The expansion is exact where q * scale is (scales of at most 24
 * minus the codes' bits significant bits, as GGUF's are: a fused multiply-add then rounds like the separate
 * ones), so outputs are bit for bit those of the fp32 panels while a decode step streams 0.75 (4-bit) or 1.25
 * (8-bit) bytes per weight instead of 4.
 *
 * Layouts (contiguous): x [rows, in] fp32, bias [out] fp32 or NULL, y [rows, out] fp32; fp32 panels
 * [panels, in, 16]; 4-bit codes [panels, in, 8] uint8 (byte j: column j in the low nibble, j + 8 in the high);
 * 8-bit codes [panels, in, 16] int8; scales and offsets [panels, in / group, 16] fp32 (coded: in % group == 0,
 * group 32, or 16 for 8-bit codes).
 * Entry points: packed_linear_f32, packed_linear_coded. Return 0.
 */
#include <omp.h>

#include "vec.h"

#define PANEL 16
#define KV (PANEL / LANES) /* vectors per panel row: 2 on AVX2, 1 with AVX-512 */
#define TILE_ROWS 6
#define BLOCK_ROWS 96
#define K_BLOCK 256
#define DIRECT_CHUNK 16 /* panels per work item of direct_rows (a multiple of 4) */

typedef struct {
    const void *values; /* fp32 panels, or codes */
    const float *scales, *offsets;
    int bits;        /* 32 (fp32 panels), 8 or 4 */
    int group_shift; /* log2 of the inputs per (scale, offset): 5, or 4 for 8-bit codes */
} weights_t;

/* `rows` rows of x (from the k-block's first input) through a panel's k-block of `count` inputs (w [count][16]).
 * The partial sums wait in `part` ([rows][16], the caller's) between k-blocks; the last block writes y (+ bias). */
INLINE void tile(const float *x, const float *w, const float *bias, float *y, float *part, int rows, int in,
                 int out, int col0, int first_block, int last_block, int count) {
    vf acc[TILE_ROWS][KV];
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < KV; i++) acc[r][i] = first_block ? (vf){0} : load_vec(part, r * PANEL + i * LANES, 0);
    for (int k = 0; k < count; k++) {
        vf wk[KV];
        for (int i = 0; i < KV; i++) wk[i] = load_vec(w, (int64_t)k * PANEL + i * LANES, 0);
        for (int r = 0; r < rows; r++) {
            float xs = x[(int64_t)r * in + k];
            for (int i = 0; i < KV; i++) acc[r][i] += xs * wk[i];
        }
    }
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < KV; i++) store_vec(part, r * PANEL + i * LANES, acc[r][i], 0);
    if (!last_block) return;
    int width = out - col0 < PANEL ? out - col0 : PANEL;
    for (int r = 0; r < rows; r++) {
        float *dst = y + (int64_t)r * out + col0;
        for (int j = 0; j < width; j++) dst[j] = bias ? part[r * PANEL + j] + bias[col0 + j] : part[r * PANEL + j];
    }
}

#ifdef __AVX2__
#include <immintrin.h>
#define DIRECT_ROWS 4 /* up to this many rows skip the tiles (direct(), below) */

/* Row k of panel p as two 8-float halves: fp32 panels loaded, codes expanded (w = q * scale + offset) with the
 * scales and offsets of k's group, `group` = (p * in / group size + k / group size) * 16. */
INLINE void panel_row(const weights_t *wt, int64_t p, int in, int k, int64_t group, __m256 w[2]) {
    if (wt->bits == 32) {
        const float *src = (const float *)wt->values + (p * in + k) * PANEL;
        w[0] = _mm256_loadu_ps(src);
        w[1] = _mm256_loadu_ps(src + 8);
        return;
    }
    const uint8_t *codes = (const uint8_t *)wt->values + (p * in + k) * (wt->bits * PANEL / 8);
    __m256i q[2];
    if (wt->bits == 4) {
        __m256i b = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)codes));
        q[0] = _mm256_and_si256(b, _mm256_set1_epi32(15));
        q[1] = _mm256_srli_epi32(b, 4);
    } else {
        q[0] = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)codes));
        q[1] = _mm256_cvtepi8_epi32(_mm_loadl_epi64((const __m128i *)(codes + 8)));
    }
    for (int h = 0; h < 2; h++)
        w[h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(q[h]), _mm256_loadu_ps(wt->scales + group + 8 * h),
                               _mm256_loadu_ps(wt->offsets + group + 8 * h));
}

INLINE void expand_row(const weights_t *wt, int64_t p, int in, int k, float *w) {
    __m256 row[2];
    panel_row(wt, p, in, k, (p * (in >> wt->group_shift) + (k >> wt->group_shift)) * PANEL, row);
    _mm256_storeu_ps(w, row[0]);
    _mm256_storeu_ps(w + 8, row[1]);
}

/* `rows` rows of x through `count` panels from p0 (rows * count <= 4) in one pass over k: the same in-order FMA
 * sum per output as tile(), with 8 independent sums to hide the FMA latency and coded rows expanded in registers
 * (a decode step: no buffer round trip, which made one row through a coded weight slower than fp32). `bits` is a
 * constant at each call site. */
INLINE void direct(const float *x, weights_t wt, const float *bias, float *y, int rows, int count, int in, int out,
                   int64_t p0, int bits) {
    __m256 acc[4][4][2];
    wt.bits = bits;
#pragma GCC unroll 4
    for (int r = 0; r < rows; r++)
#pragma GCC unroll 4
        for (int i = 0; i < count; i++) acc[r][i][0] = acc[r][i][1] = _mm256_setzero_ps();
    const int size = 1 << wt.group_shift, groups = in >> wt.group_shift;
    for (int k0 = 0; k0 < in; k0 += size) {
        const int k1 = k0 + size < in ? k0 + size : in;
        const int64_t group = (p0 * groups + k0 / size) * PANEL, panel_groups = (int64_t)groups * PANEL;
        for (int k = k0; k < k1; k++) {
#pragma GCC unroll 4
            for (int i = 0; i < count; i++) {
                __m256 w[2];
                panel_row(&wt, p0 + i, in, k, group + i * panel_groups, w);
#pragma GCC unroll 4
                for (int r = 0; r < rows; r++) {
                    __m256 xs = _mm256_broadcast_ss(x + (int64_t)r * in + k);
                    acc[r][i][0] = _mm256_fmadd_ps(xs, w[0], acc[r][i][0]);
                    acc[r][i][1] = _mm256_fmadd_ps(xs, w[1], acc[r][i][1]);
                }
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < rows; r++)
#pragma GCC unroll 4
        for (int i = 0; i < count; i++) {
            float sums[PANEL];
            _mm256_storeu_ps(sums, acc[r][i][0]);
            _mm256_storeu_ps(sums + 8, acc[r][i][1]);
            int col0 = (int)(p0 + i) * PANEL, width = out - col0 < PANEL ? out - col0 : PANEL;
            float *dst = y + (int64_t)r * out + col0;
            for (int j = 0; j < width; j++) dst[j] = bias ? sums[j] + bias[col0 + j] : sums[j];
        }
}

/* direct() for one shape, with the weight format as a constant. */
INLINE void direct_shape(const float *x, const weights_t *wt, const float *bias, float *y, int rows, int count,
                         int in, int out, int64_t p0) {
    switch (wt->bits) {
    case 4: direct(x, *wt, bias, y, rows, count, in, out, p0, 4); break;
    case 8: direct(x, *wt, bias, y, rows, count, in, out, p0, 8); break;
    default: direct(x, *wt, bias, y, rows, count, in, out, p0, 32); break;
    }
}

/* All rows (at most DIRECT_ROWS) through every panel with direct(): chunks of DIRECT_CHUNK panels handed out as
 * threads come free (a preempted thread holds up one chunk), each in groups of up to 4 / rows. */
static void direct_rows(const float *x, const weights_t *wt, const float *bias, float *y, int rows, int in, int out,
                        int num_threads) {
    const int panels = (out + PANEL - 1) / PANEL, step = rows == 1 ? 4 : rows == 2 ? 2 : 1;
#pragma omp parallel for schedule(dynamic, 1) num_threads(num_threads)
    for (int first = 0; first < panels; first += DIRECT_CHUNK) {
        const int last = first + DIRECT_CHUNK < panels ? first + DIRECT_CHUNK : panels;
        for (int p = first; p < last; p += step) {
            int count = last - p < step ? last - p : step;
            switch (rows * 8 + count) { /* constant counts keep acc in registers */
            case 9: direct_shape(x, wt, bias, y, 1, 1, in, out, p); break;
            case 10: direct_shape(x, wt, bias, y, 1, 2, in, out, p); break;
            case 11: direct_shape(x, wt, bias, y, 1, 3, in, out, p); break;
            case 12: direct_shape(x, wt, bias, y, 1, 4, in, out, p); break;
            case 17: direct_shape(x, wt, bias, y, 2, 1, in, out, p); break;
            case 18: direct_shape(x, wt, bias, y, 2, 2, in, out, p); break;
            case 25: direct_shape(x, wt, bias, y, 3, 1, in, out, p); break;
            default: direct_shape(x, wt, bias, y, 4, 1, in, out, p); break;
            }
        }
    }
}
#else
#define DIRECT_ROWS 0
INLINE void expand_row(const weights_t *wt, int64_t p, int in, int k, float *w) {
    const int row_bytes = wt->bits * PANEL / 8;
    const uint8_t *b = (const uint8_t *)wt->values + (p * in + k) * row_bytes;
    const int64_t g = (p * (in >> wt->group_shift) + (k >> wt->group_shift)) * PANEL;
    for (int j = 0; j < PANEL; j++) {
        int q = wt->bits == 8 ? (int8_t)b[j] : j < PANEL / 2 ? b[j] & 15 : b[j - PANEL / 2] >> 4;
        w[j] = (float)q * wt->scales[g + j] + wt->offsets[g + j];
    }
}

static void direct_rows(const float *x, const weights_t *wt, const float *bias, float *y, int rows, int in, int out,
                        int num_threads) {}
#endif

/* Codes of inputs [k0, k1) of panel p expanded into w [k1 - k0][16]. */
static void expand(const weights_t *wt, int64_t p, int in, int k0, int k1, float *w) {
    for (int k = k0; k < k1; k++) expand_row(wt, p, in, k, w + (int64_t)(k - k0) * PANEL);
}

/* Rows [first, last) (at most BLOCK_ROWS) through panel p: k-blocks of K_BLOCK (the panel's slice, expanded if
 * coded, stays in L1) outside, row tiles inside. */
static void rows_through_panel(const float *x, const weights_t *wt, const float *bias, float *y, int first,
                               int last, int in, int out, int64_t p) {
    float parts[BLOCK_ROWS * PANEL], expanded[K_BLOCK * PANEL];
    for (int k0 = 0; k0 < in; k0 += K_BLOCK) {
        int k1 = k0 + K_BLOCK < in ? k0 + K_BLOCK : in, col0 = (int)p * PANEL;
        const float *w = (const float *)wt->values + (p * in + k0) * PANEL;
        if (wt->bits != 32) {
            expand(wt, p, in, k0, k1, expanded);
            w = expanded;
        }
        for (int r = first; r < last; r += TILE_ROWS) {
            const float *xr = x + (int64_t)r * in + k0;
            float *yr = y + (int64_t)r * out, *part = parts + (r - first) * PANEL;
            int a = k0 == 0, z = k1 == in, n = k1 - k0;
            switch (last - r < TILE_ROWS ? last - r : TILE_ROWS) { /* constant counts keep acc in registers */
            case 1: tile(xr, w, bias, yr, part, 1, in, out, col0, a, z, n); break;
            case 2: tile(xr, w, bias, yr, part, 2, in, out, col0, a, z, n); break;
            case 3: tile(xr, w, bias, yr, part, 3, in, out, col0, a, z, n); break;
            case 4: tile(xr, w, bias, yr, part, 4, in, out, col0, a, z, n); break;
            case 5: tile(xr, w, bias, yr, part, 5, in, out, col0, a, z, n); break;
            default: tile(xr, w, bias, yr, part, TILE_ROWS, in, out, col0, a, z, n); break;
            }
        }
    }
}

static void packed_linear(const float *x, const weights_t *wt, const float *bias, float *y, int rows, int in,
                          int out, int num_threads) {
    if (rows <= DIRECT_ROWS) {
        direct_rows(x, wt, bias, y, rows, in, out, num_threads);
        return;
    }
    const int panels = (out + PANEL - 1) / PANEL;
#pragma omp parallel num_threads(num_threads)
    for (int first = 0; first < rows; first += BLOCK_ROWS) {
        int last = first + BLOCK_ROWS < rows ? first + BLOCK_ROWS : rows;
#pragma omp for schedule(dynamic, 1) /* panels as threads come free: a preempted thread holds up one */
        for (int p = 0; p < panels; p++) rows_through_panel(x, wt, bias, y, first, last, in, out, p);
    }
}

int packed_linear_f32(const float *x, const float *packed, const float *bias, float *y, int rows, int in, int out,
                      int num_threads) {
    weights_t wt = {packed, NULL, NULL, 32, 5};
    packed_linear(x, &wt, bias, y, rows, in, out, num_threads);
    return 0;
}

int packed_linear_coded(const float *x, const void *codes, const float *scales, const float *offsets, int bits,
                        int group, const float *bias, float *y, int rows, int in, int out, int num_threads) {
    weights_t wt = {codes, scales, offsets, bits, group == 16 ? 4 : 5};
    packed_linear(x, &wt, bias, y, rows, in, out, num_threads);
    return 0;
}
