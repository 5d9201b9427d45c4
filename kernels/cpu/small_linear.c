/* y = x @ w.T (+ bias) for a few rows of x: decode steps of 1 to 8 requests on CPUs.
 *
 * With so few rows a linear layer is pure weight streaming: each weight row is read once, converted to fp32 in
 * 16-float vectors (GCC vector extensions) and dotted with every row of x, which stays in L1. Output rows are split
 * over OpenMP threads (torch's runtime, as in paged_decode.c). torch's GEMM reaches about half the memory
 * bandwidth at these shapes.
 *
 * Layouts (contiguous): x [rows, in], w [out, in], bias [out] or NULL, y [rows, out]; x, w, bias and y share the
 * element type. Entry points: small_linear_{bf16,f32}. Returns 0, or 1 for more than MAX_ROWS rows or no memory.
 */
#include <stdlib.h>

#include "vec.h"

#define MAX_ROWS 8

/* Output column o for all `rows` rows of x (fp32 copy `xf`, rows of `in`). */
INLINE void one_output(const float *xf, const void *w, const void *bias, void *y, int64_t o, int rows, int in,
                       int out, int bf16) {
    vf acc[MAX_ROWS];
    for (int m = 0; m < rows; m++) acc[m] = (vf){0};
    const int64_t base = o * in;
    int i = 0;
    for (; i + LANES <= in; i += LANES) {
        __builtin_prefetch((const char *)w + (base + i + 8 * in) * (bf16 ? 2 : 4)); /* eight rows ahead */
        vf wv = load_vec(w, base + i, bf16);
        for (int m = 0; m < rows; m++) acc[m] += wv * load_vec(xf, (int64_t)m * in + i, 0);
    }
    float bias_o = bias ? load_scalar(bias, o, bf16) : 0.0f;
    for (int m = 0; m < rows; m++) {
        float sum = hsum(acc[m]);
        for (int j = i; j < in; j++) sum += load_scalar(w, base + j, bf16) * xf[(int64_t)m * in + j];
        store_scalar(y, (int64_t)m * out + o, sum + bias_o, bf16);
    }
}

#define ENTRY(NAME, BF16)                                                                                      \
    int NAME(const void *x, const void *w, const void *bias, void *y, int rows, int in, int out,               \
             int num_threads) {                                                                              \
        if (rows < 1 || rows > MAX_ROWS) return 1;                                                           \
        float *xf = malloc(sizeof(float) * (size_t)rows * (size_t)in);                                       \
        if (!xf) return 1;                                                                                   \
        for (int64_t k = 0; k < (int64_t)rows * in; k++) xf[k] = load_scalar(x, k, BF16);                      \
        _Pragma("omp parallel for schedule(static) num_threads(num_threads)")                                \
        for (int o = 0; o < out; o++) {                                                                      \
            switch (rows) { /* constant row counts: accumulators stay in registers */                        \
            case 1: one_output(xf, w, bias, y, o, 1, in, out, BF16); break;                                  \
            case 2: one_output(xf, w, bias, y, o, 2, in, out, BF16); break;                                  \
            case 3: one_output(xf, w, bias, y, o, 3, in, out, BF16); break;                                  \
            case 4: one_output(xf, w, bias, y, o, 4, in, out, BF16); break;                                  \
            case 5: one_output(xf, w, bias, y, o, 5, in, out, BF16); break;                                  \
            case 6: one_output(xf, w, bias, y, o, 6, in, out, BF16); break;                                  \
            case 7: one_output(xf, w, bias, y, o, 7, in, out, BF16); break;                                  \
            default: one_output(xf, w, bias, y, o, 8, in, out, BF16); break;                                 \
            }                                                                                                \
        }                                                                                                    \
        free(xf);                                                                                            \
        return 0;                                                                                            \
    }

ENTRY(small_linear_bf16, 1)
ENTRY(small_linear_f32, 0)
