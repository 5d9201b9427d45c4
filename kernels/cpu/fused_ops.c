/* Fused elementwise steps of a decoder layer on CPUs: one pass over the rows instead of a chain of torch ops
 * (each of which, on decode-sized tensors, costs more in dispatch and thread wake-ups than in arithmetic).
 *
 * Numerics follow the torch code they replace, roundings included: a bf16 value is rounded wherever torch would
 * store a bf16 tensor, so results match torch's within one rounding (reduction order aside; exact in fp32 up to it).
 * Rows are split over OpenMP threads (torch's runtime) when there are more than a few. Widths must be multiples
 * of 16 (LANES). Entry points: rms_norm_*, silu_mul_*, rotary_* with * = bf16 or f32.
 */
#include "vec.h"

#define PARALLEL_ROWS 8 /* fewer rows run on the calling thread */

/* exp(-|x|) based logistic: x / (1 + exp(-x)), with the exponent kept non-positive. */
INLINE vf silu_vec(vf x) {
    vi negative = (vi)(x < 0.0f);
    vf magnitude = (vf)((vi)x & 0x7FFFFFFF); /* |x|: clear the sign bit */
    vf e = exp_nonpositive((vf){0} - magnitude);   /* exp(-|x|) in (0, 1] */
    vf one = (vf){0} + 1.0f;
    vf sigmoid_pos = one / (one + e);          /* sigmoid(|x|) */
    vf sigmoid = (vf)(((vi)sigmoid_pos & ~negative) | ((vi)(one - sigmoid_pos) & negative));
    return x * sigmoid;
}

/* residual != NULL: residual = round(x + residual) first, and that sum is normalised. Then per row
 * out = round(weight * round(s / sqrt(mean(s^2) + eps))). */
INLINE void rms_norm_rows(const void *x, void *residual, const void *weight, void *out, int rows, int dim,
                          float eps, int bf16, int num_threads) {
#pragma omp parallel for schedule(static) num_threads(num_threads) if (rows > PARALLEL_ROWS)
    for (int r = 0; r < rows; r++) {
        int64_t base = (int64_t)r * dim;
        vf squares = {0};
        for (int d = 0; d < dim; d += LANES) {
            vf s = load_vec(x, base + d, bf16);
            if (residual) {
                s = round_vec(s + load_vec(residual, base + d, bf16), bf16);
                store_vec(residual, base + d, s, bf16);
            }
            squares += s * s;
        }
        float inv = 1.0f / sqrtf(hsum(squares) / dim + eps);
        const void *src = residual ? residual : x;
        for (int d = 0; d < dim; d += LANES) {
            vf n = round_vec(load_vec(src, base + d, bf16) * inv, bf16);
            store_vec(out, base + d, load_vec(weight, d, bf16) * n, bf16);
        }
    }
}

/* out[r, j] = round(silu(gate_up[r, j])) * gate_up[r, width + j]; gate_up [rows, 2 * width]. */
INLINE void silu_mul_rows(const void *gate_up, void *out, int rows, int width, int bf16, int num_threads) {
#pragma omp parallel for schedule(static) num_threads(num_threads) if (rows > PARALLEL_ROWS)
    for (int r = 0; r < rows; r++) {
        int64_t in = (int64_t)r * 2 * width, o = (int64_t)r * width;
        for (int j = 0; j < width; j += LANES) {
            vf act = round_vec(silu_vec(load_vec(gate_up, in + j, bf16)), bf16);
            store_vec(out, o + j, act * load_vec(gate_up, in + width + j, bf16), bf16);
        }
    }
}

/* In place on x [rows, heads, dim] (rows `row_stride` elements apart), cos/sin [rows, dim / 2]: the halves
 * (a, b) become (a cos - b sin, b cos + a sin), every product rounded as torch rounds it. */
INLINE void rotary_rows(void *x, int64_t row_stride, const void *cos, const void *sin, int rows, int heads, int dim,
                        int bf16, int num_threads) {
    int half = dim / 2;
#pragma omp parallel for schedule(static) num_threads(num_threads) if (rows > PARALLEL_ROWS)
    for (int r = 0; r < rows; r++) {
        for (int h = 0; h < heads; h++) {
            int64_t base = (int64_t)r * row_stride + (int64_t)h * dim;
            for (int j = 0; j < half; j += LANES) {
                vf c = load_vec(cos, (int64_t)r * half + j, bf16), s = load_vec(sin, (int64_t)r * half + j, bf16);
                vf a = load_vec(x, base + j, bf16), b = load_vec(x, base + half + j, bf16);
                store_vec(x, base + j, round_vec(a * c, bf16) - round_vec(b * s, bf16), bf16);
                store_vec(x, base + half + j, round_vec(b * c, bf16) + round_vec(a * s, bf16), bf16);
            }
        }
    }
}

#define ENTRIES(SUFFIX, BF16)                                                                                  \
    void rms_norm_##SUFFIX(const void *x, void *residual, const void *weight, void *out, int rows, int dim,    \
                           float eps, int num_threads) {                                                     \
        rms_norm_rows(x, residual, weight, out, rows, dim, eps, BF16, num_threads);                          \
    }                                                                                                        \
    void silu_mul_##SUFFIX(const void *gate_up, void *out, int rows, int width, int num_threads) {           \
        silu_mul_rows(gate_up, out, rows, width, BF16, num_threads);                                         \
    }                                                                                                        \
    void rotary_##SUFFIX(void *x, int64_t row_stride, const void *cos, const void *sin, int rows, int heads, \
                         int dim, int num_threads) {                                                         \
        rotary_rows(x, row_stride, cos, sin, rows, heads, dim, BF16, num_threads);                           \
    }

ENTRIES(bf16, 1)
ENTRIES(f32, 0)
