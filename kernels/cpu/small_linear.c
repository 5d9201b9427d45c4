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
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define LANES 16
#define MAX_ROWS 8
#define INLINE static inline __attribute__((always_inline))

typedef float vf __attribute__((vector_size(LANES * 4)));
typedef uint32_t vu __attribute__((vector_size(LANES * 4)));
typedef int32_t vi __attribute__((vector_size(LANES * 4)));
typedef uint16_t vh __attribute__((vector_size(LANES * 2)));

INLINE vf load_vec(const void *base, int64_t index, int bf16) {
    if (bf16) {
        vh h;
        memcpy(&h, (const uint16_t *)base + index, sizeof h);
        return (vf)(__builtin_convertvector(h, vu) << 16);
    }
    vf f;
    memcpy(&f, (const float *)base + index, sizeof f);
    return f;
}

INLINE float load_one(const void *base, int64_t index, int bf16) {
    if (!bf16) return ((const float *)base)[index];
    uint32_t bits = (uint32_t)((const uint16_t *)base)[index] << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

INLINE void store_one(void *base, int64_t index, float f, int bf16) {
    if (!bf16) {
        ((float *)base)[index] = f;
        return;
    }
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    uint16_t out = f != f ? 0x7FC0 : (uint16_t)((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16); /* nearest even */
    ((uint16_t *)base)[index] = out;
}

INLINE float hsum(vf v) {
    v += __builtin_shuffle(v, (vi){8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7});
    v += __builtin_shuffle(v, (vi){4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11});
    v += __builtin_shuffle(v, (vi){2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13});
    v += __builtin_shuffle(v, (vi){1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14});
    return v[0];
}

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
    float bias_o = bias ? load_one(bias, o, bf16) : 0.0f;
    for (int m = 0; m < rows; m++) {
        float sum = hsum(acc[m]);
        for (int j = i; j < in; j++) sum += load_one(w, base + j, bf16) * xf[(int64_t)m * in + j];
        store_one(y, (int64_t)m * out + o, sum + bias_o, bf16);
    }
}

#define ENTRY(NAME, BF16)                                                                                      \
    int NAME(const void *x, const void *w, const void *bias, void *y, int rows, int in, int out,               \
             int num_threads) {                                                                              \
        if (rows < 1 || rows > MAX_ROWS) return 1;                                                           \
        float *xf = malloc(sizeof(float) * (size_t)rows * (size_t)in);                                       \
        if (!xf) return 1;                                                                                   \
        for (int64_t k = 0; k < (int64_t)rows * in; k++) xf[k] = load_one(x, k, BF16);                      \
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
