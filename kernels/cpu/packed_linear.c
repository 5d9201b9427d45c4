/* y = x @ w.T (+ bias) in fp32 against weights packed once into column panels: the fp32 GEMM of CPU steps.
 *
 * The packed weight holds panels of PANEL = 16 output columns; panel p is [in][16] (column 16p + j at [k][j],
 * zero past the last column), so a panel streams contiguously. A register tile of up to TILE_ROWS = 6 rows of x by
 * one panel keeps 6 x 16 accumulators (on AVX2, 12 of its 16 registers, beside two weight vectors and one
 * broadcast; vec.h's vectors, KV of them per panel row) and runs over `in` with one FMA per row and vector per k, carried across k-blocks of K_BLOCK (whose slice of the
 * panel stays in L1) through a small buffer. Each output is therefore the same in-order sum of its k terms whatever
 * the row count or tile: a prompt's rows give the same numbers whole or split across steps. Rows go in blocks of
 * BLOCK_ROWS that stay in L2 while the panels stream; panels are split over OpenMP threads (torch's runtime, as in
 * the other kernels). On the Zen 3 CI machine (AVX2, 2 threads) all linears of the default model's 30 layers take
 * 37 ms for 16 rows against 55-94 ms through torch, 90-115 ms for 64 against 140-165, and about the same for 512.
 *
 * Layouts (contiguous, fp32): x [rows, in], packed [panels, in, 16], bias [out] or NULL, y [rows, out].
 * Entry point: packed_linear_f32. Returns 0.
 */
#include "vec.h"

#define PANEL 16
#define KV (PANEL / LANES) /* vectors per panel row: 2 on AVX2, 1 with AVX-512 */
#define TILE_ROWS 6
#define BLOCK_ROWS 96
#define K_BLOCK 256

/* Rows of x through one panel over k in [k0, k1), `rows` (a constant at each call site) at a time. The partial
 * sums of a k-block wait in `part` ([rows][16], the caller's) between blocks; the last block writes y (+ bias). */
INLINE void tile(const float *x, const float *panel, const float *bias, float *y, float *part, int rows, int in,
                 int out, int col0, int k0, int k1) {
    vf acc[TILE_ROWS][KV];
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < KV; i++) acc[r][i] = k0 ? load_vec(part, r * PANEL + i * LANES, 0) : (vf){0};
    for (int k = k0; k < k1; k++) {
        vf w[KV];
        for (int i = 0; i < KV; i++) w[i] = load_vec(panel, (int64_t)k * PANEL + i * LANES, 0);
        for (int r = 0; r < rows; r++) {
            float xs = x[(int64_t)r * in + k];
            for (int i = 0; i < KV; i++) acc[r][i] += xs * w[i];
        }
    }
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < KV; i++) store_vec(part, r * PANEL + i * LANES, acc[r][i], 0);
    if (k1 < in) return;
    int width = out - col0 < PANEL ? out - col0 : PANEL;
    for (int r = 0; r < rows; r++) {
        float *dst = y + (int64_t)r * out + col0;
        for (int j = 0; j < width; j++) dst[j] = bias ? part[r * PANEL + j] + bias[col0 + j] : part[r * PANEL + j];
    }
}

/* Rows [first, last) (at most BLOCK_ROWS) through one panel: k-blocks of K_BLOCK (the panel's slice stays in L1)
 * outside, row tiles inside. */
INLINE void rows_through_panel(const float *x, const float *panel, const float *bias, float *y, int first,
                               int last, int in, int out, int col0) {
    float parts[BLOCK_ROWS * PANEL];
    for (int k0 = 0; k0 < in; k0 += K_BLOCK) {
        int k1 = k0 + K_BLOCK < in ? k0 + K_BLOCK : in;
        for (int r = first; r < last; r += TILE_ROWS) {
            const float *xr = x + (int64_t)r * in;
            float *yr = y + (int64_t)r * out, *part = parts + (r - first) * PANEL;
            switch (last - r < TILE_ROWS ? last - r : TILE_ROWS) { /* constant counts keep acc in registers */
            case 1: tile(xr, panel, bias, yr, part, 1, in, out, col0, k0, k1); break;
            case 2: tile(xr, panel, bias, yr, part, 2, in, out, col0, k0, k1); break;
            case 3: tile(xr, panel, bias, yr, part, 3, in, out, col0, k0, k1); break;
            case 4: tile(xr, panel, bias, yr, part, 4, in, out, col0, k0, k1); break;
            case 5: tile(xr, panel, bias, yr, part, 5, in, out, col0, k0, k1); break;
            default: tile(xr, panel, bias, yr, part, TILE_ROWS, in, out, col0, k0, k1); break;
            }
        }
    }
}

int packed_linear_f32(const float *x, const float *packed, const float *bias, float *y, int rows, int in, int out,
                      int num_threads) {
    const int panels = (out + PANEL - 1) / PANEL;
#pragma omp parallel num_threads(num_threads)
    for (int first = 0; first < rows; first += BLOCK_ROWS) {
        int last = first + BLOCK_ROWS < rows ? first + BLOCK_ROWS : rows;
#pragma omp for schedule(static)
        for (int p = 0; p < panels; p++)
            rows_through_panel(x, packed + (int64_t)p * in * PANEL, bias, y, first, last, in, out, p * PANEL);
    }
    return 0;
}
