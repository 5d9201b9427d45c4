/* y = x @ w.T (+ bias) for weights that are 4-bit grids (w = q * scale + offset per column and GROUP = 32 inputs,
 * as in a model dequantized from GGUF Q4_1: the default model), 8-bit ones (signed codes, scale and offset per
 * 32 or 16 inputs: GGUF Q5_0 / Q5_1 / Q5_K / Q8_0 / Q6_K) or 5-bit ones (codes u + base, u in [0, 31], per 32
 * inputs: GGUF Q5_0 with base -16, Q5_1 / Q5_K with base 0), with x quantized to int8 per row and 32 inputs.
 *
 * Each row's group of 32 inputs becomes a = round(x / s) in [-127, 127] with s = max|x| / 127, so that
 *   y[r][c] = sum over groups g of s[r][g] * (scale[c][g] * (q[c] . a[r]) + offset[c][g] * sum(a[r]))
 * (the scheme of llama.cpp's Q4_1 x Q8_1 dot product). A group whose largest input is more than OUTLIER times its
 * second largest keeps that one input in fp32 (added afterwards as input x its weight column) and quantizes the
 * others against the second largest: without this, the default model's outlier channels round whole groups to
 * zero and the first token of "What is the capital of France?" flips; with it, the logits' teacher-forced KL
 * divergence to exact fp32 is about 0.001, below bf16 weights' 0.0016.
 *
 * The inner sums are exact integers: vpmaddubsw multiplies 32 unsigned codes by 32 signed activations into 16 pair
 * sums, and 8 of them (a whole group) add up in 16 bits without overflow (8 * 2 * 15 * 127 = 30480). Where the
 * CPU has AVX512-VNNI, vpdpbusd adds the same products straight into 32-bit sums, 16 columns a register, in tiles
 * of 8 rows (tile_vnni): the same integers, scaled in the same fp32 operations, so the same numbers bit for bit.
 * Measurements: docs/cpu.md.
 *
 * Each output is the same in-order sum over its groups whatever the row count or tile, and each row is quantized on
 * its own: a prompt's rows give the same numbers whole or split across steps (prefix-cache hits keep greedy text).
 *
 * 8-bit codes c in [-128, 127] against activations a in [-127, 127]: with AVX512-VNNI, vpdpbusd takes the codes
 * as unsigned c + 128 (one xor) and the group's sum of a times 128 is taken off the 32-bit result; on AVX2,
 * vpmaddubsw multiplies |c| by a with c's sign (pairs of at most 2 * 128 * 127 = 32512: no saturation) and
 * vpmaddwd widens each 4-input sum to 32 bits. Both give the exact integer dot product of each weight group, scaled
 * as the 4-bit one is, so the two paths agree bit for bit.
 *
 * 5-bit codes hold the same integers as 8-bit ones in 5 bits a weight: the 4-bit layout's nibbles plus one plane of
 * fifth bits, expanded to bytes in registers (AVX512: one 64-bit mask a quad, a masked add of 16; AVX2: a shuffle
 * and a compare), then multiplied as unsigned u (vpdpbusd, or vpmaddubsw with pairs of at most 2 * 31 * 127) and
 * corrected by base * the group's sum of a: the exact dot product, scaled as the 8-bit codes' is, so a weight gives
 * the same numbers bit for bit in either layout.
 *
 * Layouts (contiguous): x [rows, in] fp32 (in % 32 == 0), bias [out] fp32 or NULL, y [rows, out] fp32. For panels of
 * PANEL = 16 columns (out padded to whole panels with zero codes and scales): 4-bit codes [panels, in / 4, 32] uint8,
 * byte 4j + i of quad t holding column j's input 4t + i in its low nibble and column j + 8's in its high one;
 * 8-bit codes [panels, in / 4, 64] int8, byte 4j + i of quad t holding column j's input 4t + i; 5-bit codes
 * [panels, in / 32, 320] uint8, per group the 4-bit layout of u & 15 for its 8 quads (256 bytes) then each quad's
 * fifth bits as a little-endian 64-bit word (bit 4j + i: column j in 0-15, input 4t + i); scales and offsets
 * [panels, in / group, 16] fp32 (group 32; 16 or 32 for 8-bit codes).
 * Entry point: int8_linear_coded (bits 4, 5 or 8, group, base; packed_linear_coded's argument order with base
 * after group). Returns 0, 2 when out of memory, 3 for bits / group it does not take. Needs AVX2 (the build fails
 * without it).
 */
#include <immintrin.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifndef __AVX2__
#error "int8_linear.c needs AVX2"
#endif

#define PANEL 16
#define GROUP 32
#define TILE_ROWS 6
#define BLOCK_ROWS 96
#define ITEMS_PER_THREAD 4 /* panel chunks per block of rows and thread */
#define QUANTIZE_ROWS 4
#define OUTLIER 2.0f /* an input above this times the rest of its group stays in fp32 (quantize_row) */
#define STRIP 64 /* output columns an outlier pass keeps in registers (add_outliers) */
#define INLINE static inline __attribute__((always_inline))

typedef struct {
    const uint8_t *codes; /* [panels, in / 4, 32] (4 bits), [panels, in / 32, 320] (5), [panels, in / 4, 64] (8) */
    const float *scales, *offsets; /* [panels, in / group, 16] */
    int bits, group;
    int base; /* 5-bit codes: the code of a stored 0 (c = u + base) */
} weights_t;

typedef struct {
    int8_t *q; /* [rows, in] */
    float *scale, *sum; /* [rows, in / 32]: s, and s * (sum of the group's a) */
    int32_t *outliers; /* [rows]: how many of the row's groups keep an input in fp32 (0 in q) */
    int32_t *outlier_k; /* [rows, in / 32]: those inputs, in group order (the first outliers[r] of row r) */
    float *outlier_v; /* [rows, in / 32]: their values */
    int32_t *half_sums; /* [rows, in / 16]: the sum of a over each 16 inputs (8-bit codes' groups of 16) */
} quantized_t;

INLINE float hmax(__m256 v) {
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    return _mm_cvtss_f32(_mm_max_ss(h, _mm_movehdup_ps(h)));
}

INLINE int hsum_epi32(__m256i v) {
    __m128i t = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
    t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1));
    return _mm_cvtsi128_si32(t);
}

/* Row r's x [in] -> its q, scales, sums and outliers. A group whose largest magnitude is more than OUTLIER times
 * its second largest keeps that input in fp32 and quantizes the rest against the second largest: LLM activations
 * have a few channels far above the others (up to 3,000 against < 1 in the default model), and one of them would
 * round its whole group to zero. */
static void quantize_row(const float *x, int in, const quantized_t *qx, int r) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m256i low = _mm256_set1_epi32(-127), high = _mm256_set1_epi32(127);
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const int groups = in / GROUP;
    int outliers = 0;
    for (int g = 0; g < groups; g++) {
        __m256 v[4], mag[4], m = _mm256_setzero_ps();
        for (int i = 0; i < 4; i++) { /* max in this order: NaN inputs then give what they always gave */
            v[i] = _mm256_loadu_ps(x + g * GROUP + 8 * i);
            mag[i] = _mm256_andnot_ps(sign, v[i]);
            m = _mm256_max_ps(m, mag[i]);
        }
        float amax = hmax(m);
        const __m256 top = _mm256_set1_ps(amax);
        uint32_t hits = 0;
        for (int i = 0; i < 4; i++)
            hits |= (uint32_t)_mm256_movemask_ps(_mm256_cmp_ps(mag[i], top, _CMP_EQ_OQ)) << (8 * i);
        const int at = hits ? __builtin_ctz(hits) : GROUP - 1; /* the first largest (NaN inputs: the last) */
        __m256 is_at[4], rest = _mm256_setzero_ps();
        for (int i = 0; i < 4; i++) {
            is_at[i] = _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_add_epi32(lane, _mm256_set1_epi32(8 * i)),
                                                              _mm256_set1_epi32(at)));
            rest = _mm256_max_ps(rest, _mm256_andnot_ps(is_at[i], mag[i]));
        }
        const float second = hmax(rest);
        if (amax > OUTLIER * second) {
            qx->outlier_k[r * groups + outliers] = g * GROUP + at;
            qx->outlier_v[r * groups + outliers++] = x[g * GROUP + at];
            for (int i = 0; i < 4; i++) v[i] = _mm256_andnot_ps(is_at[i], v[i]);
            amax = second;
        }
        const __m256 inverse = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
        __m256i n[4];
        for (int i = 0; i < 4; i++) { /* round to nearest even, clamped against rounding past 127 */
            __m256i rounded = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inverse));
            n[i] = _mm256_min_epi32(_mm256_max_epi32(rounded, low), high);
        }
        const int first = hsum_epi32(_mm256_add_epi32(n[0], n[1]));
        const int second_half = hsum_epi32(_mm256_add_epi32(n[2], n[3]));
        qx->half_sums[(int64_t)r * (in / 16) + 2 * g] = first;
        qx->half_sums[(int64_t)r * (in / 16) + 2 * g + 1] = second_half;
        __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(n[0], n[1]), _mm256_packs_epi32(n[2], n[3]));
        bytes = _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
        _mm256_storeu_si256((__m256i *)(qx->q + (int64_t)r * in + g * GROUP), bytes);
        const int side = r * groups + g;
        qx->scale[side] = amax / 127.0f;
        qx->sum[side] = qx->scale[side] * (float)(first + second_half);
    }
    qx->outliers[r] = outliers;
}

/* One group of one panel against up to 6 rows, in registers: the 16-bit pair sums of row r's columns 0-7 and
 * 8-15 end in a[2r] and a[2r + 1]. Per 4 inputs: one 32-byte load of codes, split into low and high nibbles, then
 * for each row a broadcast of its 4 activations, two vpmaddubsw and two adds. Rows past `rows` are not computed
 * (the assembler text is cut after them); the accumulators a[] are always 12 so that the operand list is one. */
#define CODES(J)                                                                                                   \
    "vmovdqu " #J "*32(%[w]), %%ymm13\n\t"                                                                         \
    "vpsrlw $4, %%ymm13, %%ymm14\n\t"                                                                              \
    "vpand %[nibble], %%ymm13, %%ymm13\n\t"                                                                        \
    "vpand %[nibble], %%ymm14, %%ymm14\n\t"
#define ROW(J, AT, LOW, HIGH)                                                                                      \
    "vpbroadcastd " #J "*4" AT ", %%ymm15\n\t"                                                                     \
    "vpmaddubsw %%ymm15, %%ymm13, %%ymm12\n\t"                                                                     \
    "vpaddw %%ymm12, %[" LOW "], %[" LOW "]\n\t"                                                                   \
    "vpmaddubsw %%ymm15, %%ymm14, %%ymm12\n\t"                                                                     \
    "vpaddw %%ymm12, %[" HIGH "], %[" HIGH "]\n\t"
#define ROWS1(J) CODES(J) ROW(J, "(%[q0])", "a0", "a1")
#define ROWS2(J) ROWS1(J) ROW(J, "(%[q0],%[stride])", "a2", "a3")
#define ROWS3(J) ROWS2(J) ROW(J, "(%[q0],%[stride],2)", "a4", "a5")
#define ROWS4(J) ROWS3(J) ROW(J, "(%[q3])", "a6", "a7")
#define ROWS5(J) ROWS4(J) ROW(J, "(%[q3],%[stride])", "a8", "a9")
#define ROWS6(J) ROWS5(J) ROW(J, "(%[q3],%[stride],2)", "a10", "a11")
#define GROUP_ASM(ROWS)                                                                                            \
    __asm__(ROWS(0) ROWS(1) ROWS(2) ROWS(3) ROWS(4) ROWS(5) ROWS(6) ROWS(7)                                        \
            : [a0] "+x"(a[0]), [a1] "+x"(a[1]), [a2] "+x"(a[2]), [a3] "+x"(a[3]), [a4] "+x"(a[4]),                 \
              [a5] "+x"(a[5]), [a6] "+x"(a[6]), [a7] "+x"(a[7]), [a8] "+x"(a[8]), [a9] "+x"(a[9]),                 \
              [a10] "+x"(a[10]), [a11] "+x"(a[11])                                                                 \
            : [w] "r"(w), [q0] "r"(q0), [q3] "r"(q0 + 3 * stride), [stride] "r"(stride), [nibble] "m"(nibble)      \
            : "ymm12", "ymm13", "ymm14", "ymm15", "memory")

/* The AVX2 tiles' fp32 sums of `rows` rows x panel p's 16 columns (+ bias) into y, the padding columns left out. */
INLINE void store_panel(__m256 acc[][2], int rows, int row0, const float *bias, float *y, int out, int64_t p) {
    const int col0 = (int)p * PANEL, width = out - col0 < PANEL ? out - col0 : PANEL;
    for (int r = 0; r < rows; r++) {
        float sums[PANEL], *dst = y + (int64_t)(row0 + r) * out + col0;
        _mm256_storeu_ps(sums, acc[r][0]);
        _mm256_storeu_ps(sums + 8, acc[r][1]);
        for (int j = 0; j < width; j++) dst[j] = bias ? sums[j] + bias[col0 + j] : sums[j];
    }
}

INLINE void group_sums(const uint8_t *w, const int8_t *q0, int64_t stride, int rows, __m256i a[12]) {
    const __m256i nibble = _mm256_set1_epi8(0x0F);
    for (int i = 0; i < 12; i++) a[i] = _mm256_setzero_si256();
    switch (rows) {
    case 1: GROUP_ASM(ROWS1); break;
    case 2: GROUP_ASM(ROWS2); break;
    case 3: GROUP_ASM(ROWS3); break;
    case 4: GROUP_ASM(ROWS4); break;
    case 5: GROUP_ASM(ROWS5); break;
    default: GROUP_ASM(ROWS6); break;
    }
}

/* `rows` (at most 6) quantized rows through panel p: group sums in registers, scaled into fp32 per group in order. */
static void tile(const quantized_t *x, int row0, int rows, const weights_t *wt, const float *bias, float *y, int in,
                 int out, int64_t p) {
    const uint8_t *codes = wt->codes;
    const float *scales = wt->scales, *offsets = wt->offsets;
    const int groups = in / GROUP;
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 acc[TILE_ROWS][2];
    for (int r = 0; r < rows; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int g = 0; g < groups; g++) {
        __m256i a[12];
        group_sums(codes + (p * (in / 4) + g * 8) * 32, x->q + (int64_t)row0 * in + g * GROUP, in, rows, a);
        const float *sc = scales + (p * groups + g) * PANEL, *of = offsets + (p * groups + g) * PANEL;
        for (int r = 0; r < rows; r++) {
            const int at = (row0 + r) * groups + g;
            const __m256 s = _mm256_set1_ps(x->scale[at]), sum = _mm256_set1_ps(x->sum[at]);
            for (int h = 0; h < 2; h++) {
                __m256 dot = _mm256_cvtepi32_ps(_mm256_madd_epi16(a[2 * r + h], ones));
                acc[r][h] = _mm256_fmadd_ps(_mm256_mul_ps(dot, s), _mm256_loadu_ps(sc + 8 * h), acc[r][h]);
                acc[r][h] = _mm256_fmadd_ps(_mm256_loadu_ps(of + 8 * h), sum, acc[r][h]);
            }
        }
    }
    store_panel(acc, rows, row0, bias, y, out, p);
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#define VNNI_ROWS 8 /* rows of a tile on AVX512-VNNI: 8 int32 and 8 fp32 accumulators of 16 columns */

/* `rows` (a constant in each caller, at most VNNI_ROWS) quantized rows through panel p with AVX512-VNNI: each
 * group's 8 quads of codes are widened once to [low nibbles | high nibbles] (columns 0-7 | 8-15 in one register),
 * and vpdpbusd adds each row's 4-input dot products straight into 32-bit sums, with the row's 4 activations
 * broadcast. The group's integer sums are the ones tile() gets through 16-bit pairs (exact either way), and they are
 * scaled in the same fp32 operations in the same order, so both give the same numbers bit for bit. The same group
 * of the next panel is prefetched: at 16 rows the tiles run fast enough for the weights' stream from memory to show
 * (all of the default model's projections at 16 rows, Zen 4: 7.4 -> 5.3 ms). */
INLINE void tile_vnni_rows(const quantized_t *x, int row0, const weights_t *wt, const float *bias, float *y, int in,
                           int out, int64_t p, const int rows) {
    const int groups = in / GROUP;
    const __m512i nibble = _mm512_set1_epi8(0x0F), shift = _mm512_setr_epi64(0, 0, 0, 0, 4, 4, 4, 4);
    const int64_t panel_bytes = (int64_t)(in / 4) * 32;
    const uint8_t *w = wt->codes + p * panel_bytes;
    const float *sc = wt->scales + p * groups * PANEL, *of = wt->offsets + p * groups * PANEL;
    const int8_t *q = x->q + (int64_t)row0 * in;
    const float *s = x->scale + (int64_t)row0 * groups, *sum = x->sum + (int64_t)row0 * groups;
    __m512 acc[VNNI_ROWS];
    for (int r = 0; r < rows; r++) acc[r] = _mm512_setzero_ps();
    for (int g = 0; g < groups; g++, w += 8 * 32) {
        __m512i dot[VNNI_ROWS];
        for (int r = 0; r < rows; r++) dot[r] = _mm512_setzero_si512();
        for (int b = 0; b < 8 * 32; b += 64) __builtin_prefetch(w + panel_bytes + b); /* the next panel's group */
        __builtin_prefetch(sc + (groups + g) * PANEL);
        __builtin_prefetch(of + (groups + g) * PANEL);
        for (int t = 0; t < 8; t++) {
            const __m512i both = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(w + 32 * t)));
            const __m512i codes = _mm512_and_si512(_mm512_srlv_epi64(both, shift), nibble);
            for (int r = 0; r < rows; r++) {
                int32_t four;
                memcpy(&four, q + (int64_t)r * in + g * GROUP + 4 * t, sizeof four);
                dot[r] = _mm512_dpbusd_epi32(dot[r], codes, _mm512_set1_epi32(four));
            }
        }
        const __m512 scale = _mm512_loadu_ps(sc + g * PANEL), offset = _mm512_loadu_ps(of + g * PANEL);
        for (int r = 0; r < rows; r++) {
            const __m512 d = _mm512_mul_ps(_mm512_cvtepi32_ps(dot[r]), _mm512_set1_ps(s[r * groups + g]));
            acc[r] = _mm512_fmadd_ps(d, scale, acc[r]);
            acc[r] = _mm512_fmadd_ps(offset, _mm512_set1_ps(sum[r * groups + g]), acc[r]);
        }
    }
    const int col0 = (int)p * PANEL, width = out - col0 < PANEL ? out - col0 : PANEL;
    const __mmask16 keep = (__mmask16)((1u << width) - 1);
    const __m512 b = bias ? _mm512_maskz_loadu_ps(keep, bias + col0) : _mm512_setzero_ps();
    for (int r = 0; r < rows; r++) {
        const __m512 v = bias ? _mm512_add_ps(acc[r], b) : acc[r];
        _mm512_mask_storeu_ps(y + (int64_t)(row0 + r) * out + col0, keep, v);
    }
}

/* Up to VNNI_ROWS rows through panel p, with the row count a constant in each instance. */
static void tile_vnni(const quantized_t *x, int row0, int rows, const weights_t *wt, const float *bias, float *y,
                      int in, int out, int64_t p) {
    switch (rows) {
    case 1: tile_vnni_rows(x, row0, wt, bias, y, in, out, p, 1); break;
    case 2: tile_vnni_rows(x, row0, wt, bias, y, in, out, p, 2); break;
    case 3: tile_vnni_rows(x, row0, wt, bias, y, in, out, p, 3); break;
    case 4: tile_vnni_rows(x, row0, wt, bias, y, in, out, p, 4); break;
    case 5: tile_vnni_rows(x, row0, wt, bias, y, in, out, p, 5); break;
    case 6: tile_vnni_rows(x, row0, wt, bias, y, in, out, p, 6); break;
    case 7: tile_vnni_rows(x, row0, wt, bias, y, in, out, p, 7); break;
    default: tile_vnni_rows(x, row0, wt, bias, y, in, out, p, 8); break;
    }
}
#define TILE tile_vnni
#define ROWS_PER_TILE VNNI_ROWS
#else
#define TILE tile
#define ROWS_PER_TILE TILE_ROWS
#endif

/* 8-bit codes. The scaling of one weight group's integer dot products `dot` (columns 0-7 and 8-15) of row r:
 * acc += (dot * s) * scale + offset * (s * sum of a over the group), in this order whatever the path. */
INLINE int group_sum(const quantized_t *x, int64_t row, int in, int k, int group) {
    const int32_t *h = x->half_sums + row * (in / 16) + k * (group / 16);
    return group == 16 ? h[0] : h[0] + h[1];
}

#define TILE8_ROWS 4 /* rows of an AVX2 tile of 8-bit codes: 8 int32 accumulators of 8 columns */

/* `rows` (a constant in each caller, at most TILE8_ROWS) quantized rows through panel p of 8-bit codes with AVX2:
 * per 4 inputs, the codes of columns 0-7 and 8-15 (two registers) as |c|, and per row the 4 activations broadcast
 * with each code's sign (vpsignb), multiplied into pairs (vpmaddubsw) and widened into 32-bit sums (vpmaddwd). */
INLINE void tile8_rows(const quantized_t *x, int row0, const weights_t *wt, const float *bias, float *y, int in,
                       int out, int64_t p, const int rows) {
    const int group = wt->group, wgroups = in / group, groups = in / GROUP;
    const __m256i ones = _mm256_set1_epi16(1);
    const int8_t *w = (const int8_t *)wt->codes + p * (int64_t)(in / 4) * 64;
    const float *sc = wt->scales + p * wgroups * PANEL, *of = wt->offsets + p * wgroups * PANEL;
    const int8_t *q = x->q + (int64_t)row0 * in;
    __m256 acc[TILE8_ROWS][2];
    for (int r = 0; r < rows; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int k = 0; k < wgroups; k++) {
        __m256i dot[TILE8_ROWS][2];
        for (int r = 0; r < rows; r++) dot[r][0] = dot[r][1] = _mm256_setzero_si256();
        for (int t = 0; t < group / 4; t++, w += 64) {
            const __m256i c0 = _mm256_loadu_si256((const __m256i *)w);
            const __m256i c1 = _mm256_loadu_si256((const __m256i *)(w + 32));
            const __m256i m0 = _mm256_abs_epi8(c0), m1 = _mm256_abs_epi8(c1);
            for (int r = 0; r < rows; r++) {
                int32_t four;
                memcpy(&four, q + (int64_t)r * in + k * group + 4 * t, sizeof four);
                const __m256i a = _mm256_set1_epi32(four);
                const __m256i p0 = _mm256_maddubs_epi16(m0, _mm256_sign_epi8(a, c0));
                const __m256i p1 = _mm256_maddubs_epi16(m1, _mm256_sign_epi8(a, c1));
                dot[r][0] = _mm256_add_epi32(dot[r][0], _mm256_madd_epi16(p0, ones));
                dot[r][1] = _mm256_add_epi32(dot[r][1], _mm256_madd_epi16(p1, ones));
            }
        }
        const int g = k * group / GROUP;
        for (int r = 0; r < rows; r++) {
            const float s = x->scale[(int64_t)(row0 + r) * groups + g];
            const __m256 sum = _mm256_set1_ps(s * (float)group_sum(x, row0 + r, in, k, group));
            for (int h = 0; h < 2; h++) {
                const __m256 d = _mm256_mul_ps(_mm256_cvtepi32_ps(dot[r][h]), _mm256_set1_ps(s));
                acc[r][h] = _mm256_fmadd_ps(d, _mm256_loadu_ps(sc + k * PANEL + 8 * h), acc[r][h]);
                acc[r][h] = _mm256_fmadd_ps(_mm256_loadu_ps(of + k * PANEL + 8 * h), sum, acc[r][h]);
            }
        }
    }
    store_panel(acc, rows, row0, bias, y, out, p);
}

static void tile8(const quantized_t *x, int row0, int rows, const weights_t *wt, const float *bias, float *y, int in,
                  int out, int64_t p) {
    switch (rows) {
    case 1: tile8_rows(x, row0, wt, bias, y, in, out, p, 1); break;
    case 2: tile8_rows(x, row0, wt, bias, y, in, out, p, 2); break;
    case 3: tile8_rows(x, row0, wt, bias, y, in, out, p, 3); break;
    default: tile8_rows(x, row0, wt, bias, y, in, out, p, 4); break;
    }
}

/* 5-bit codes (GGUF Q5_0 / Q5_1 / Q5_K: c = u + base, u in [0, 31], base -16 or 0), group 32. Per group of 32
 * inputs: the 4-bit layout's 8 quads of nibbles (256 bytes: byte 4j + i of quad t, column j's u & 15 in the low
 * nibble and column j + 8's in the high one), then each quad's fifth bits as a little-endian 64-bit word (64 bytes):
 * bit 4j + i holds column j's (j in 0-15) fifth bit of input 4t + i, i.e. bit m belongs to byte m of the quad's
 * codes widened to [columns 0-7 | columns 8-15]. The exact dot product of a weight group is u . a + base * sum(a),
 * scaled as the 8-bit codes' is: a 5-bit weight gives the numbers its 8-bit codes give, bit for bit. */
#define FIVE_BIT_GROUP_BYTES 320 /* 256 bytes of nibbles + 8 quads' 64-bit fifth-bit words */

/* One quad's 32 codes of columns 0-7 (h 0) or 8-15 (h 1) with AVX2: the nibbles, and the fifth bits of the quad's
 * 64-bit word spread to bytes (byte 4j + i takes word byte 4h + j / 2, keeps its bit 4 (j % 2) + i) as 16s. */
INLINE __m256i codes5_avx2(__m256i nibbles, __m256i word, __m256i pick, __m256i bit) {
    const __m256i high = _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_shuffle_epi8(word, pick), bit), bit);
    return _mm256_or_si256(nibbles, _mm256_and_si256(high, _mm256_set1_epi8(16)));
}

/* `rows` (a constant in each caller, at most TILE8_ROWS) quantized rows through panel p of 5-bit codes with AVX2:
 * per 4 inputs the codes u of columns 0-7 and 8-15 expanded in two registers, and per row the 4 activations
 * broadcast, multiplied into pairs (vpmaddubsw: u unsigned, at most 2 * 31 * 127) and widened into 32-bit sums. */
INLINE void tile5_rows(const quantized_t *x, int row0, const weights_t *wt, const float *bias, float *y, int in,
                       int out, int64_t p, const int rows) {
    const int groups = in / GROUP;
    const __m256i ones = _mm256_set1_epi16(1), nibble = _mm256_set1_epi8(0x0F);
    const __m256i pick0 = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1,
                                           2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3);
    const __m256i pick1 = _mm256_add_epi8(pick0, _mm256_set1_epi8(4));
    const __m256i bit = _mm256_set1_epi64x(0x8040201008040201LL);
    const uint8_t *w = wt->codes + p * (int64_t)groups * FIVE_BIT_GROUP_BYTES;
    const float *sc = wt->scales + p * groups * PANEL, *of = wt->offsets + p * groups * PANEL;
    const int8_t *q = x->q + (int64_t)row0 * in;
    __m256 acc[TILE8_ROWS][2];
    for (int r = 0; r < rows; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    for (int g = 0; g < groups; g++, w += FIVE_BIT_GROUP_BYTES) {
        __m256i dot[TILE8_ROWS][2];
        for (int r = 0; r < rows; r++) dot[r][0] = dot[r][1] = _mm256_setzero_si256();
        for (int t = 0; t < GROUP / 4; t++) {
            const __m256i packed = _mm256_loadu_si256((const __m256i *)(w + 32 * t));
            int64_t fifth;
            memcpy(&fifth, w + 256 + 8 * t, sizeof fifth);
            const __m256i word = _mm256_set1_epi64x(fifth);
            const __m256i u0 = codes5_avx2(_mm256_and_si256(packed, nibble), word, pick0, bit);
            const __m256i u1 = codes5_avx2(_mm256_and_si256(_mm256_srli_epi16(packed, 4), nibble), word, pick1, bit);
            for (int r = 0; r < rows; r++) {
                int32_t four;
                memcpy(&four, q + (int64_t)r * in + g * GROUP + 4 * t, sizeof four);
                const __m256i a = _mm256_set1_epi32(four);
                dot[r][0] = _mm256_add_epi32(dot[r][0], _mm256_madd_epi16(_mm256_maddubs_epi16(u0, a), ones));
                dot[r][1] = _mm256_add_epi32(dot[r][1], _mm256_madd_epi16(_mm256_maddubs_epi16(u1, a), ones));
            }
        }
        for (int r = 0; r < rows; r++) {
            const float s = x->scale[(int64_t)(row0 + r) * groups + g];
            const int total = group_sum(x, row0 + r, in, g, GROUP);
            const __m256 sum = _mm256_set1_ps(s * (float)total);
            const __m256i based = _mm256_set1_epi32(wt->base * total);
            for (int h = 0; h < 2; h++) {
                const __m256i exact = _mm256_add_epi32(dot[r][h], based);
                const __m256 d = _mm256_mul_ps(_mm256_cvtepi32_ps(exact), _mm256_set1_ps(s));
                acc[r][h] = _mm256_fmadd_ps(d, _mm256_loadu_ps(sc + g * PANEL + 8 * h), acc[r][h]);
                acc[r][h] = _mm256_fmadd_ps(_mm256_loadu_ps(of + g * PANEL + 8 * h), sum, acc[r][h]);
            }
        }
    }
    store_panel(acc, rows, row0, bias, y, out, p);
}

static void tile5(const quantized_t *x, int row0, int rows, const weights_t *wt, const float *bias, float *y, int in,
                  int out, int64_t p) {
    switch (rows) {
    case 1: tile5_rows(x, row0, wt, bias, y, in, out, p, 1); break;
    case 2: tile5_rows(x, row0, wt, bias, y, in, out, p, 2); break;
    case 3: tile5_rows(x, row0, wt, bias, y, in, out, p, 3); break;
    default: tile5_rows(x, row0, wt, bias, y, in, out, p, 4); break;
    }
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
/* `rows` (a constant in each caller, at most VNNI_ROWS) quantized rows through panel p of 8- or 5-bit codes (`bits`,
 * a constant too) with AVX512-VNNI. 8 bits: each quad's 64 bytes (16 columns x 4 inputs) xor 0x80 are the codes +
 * 128 as unsigned bytes, and 128 x the group's sum of a is taken off after. 5 bits: each quad's 32 bytes of nibbles
 * widened to [low nibbles | high nibbles] as in tile_vnni, plus 16 in the bytes its 64-bit word of fifth bits marks
 * (one masked add), and base x the sum of a added after. vpdpbusd adds each row's 4-input products into 32-bit
 * sums: the exact dot product tile8 / tile5 get, scaled the same way. */
INLINE void wide_vnni_rows(const quantized_t *x, int row0, const weights_t *wt, const float *bias, float *y, int in,
                           int out, int64_t p, const int rows, const int bits) {
    const int group = bits == 5 ? GROUP : wt->group, wgroups = in / group, groups = in / GROUP;
    const int group_bytes = bits == 5 ? FIVE_BIT_GROUP_BYTES : group * 16, correction = bits == 5 ? wt->base : -128;
    const __m512i flip = _mm512_set1_epi8((char)0x80), nibble = _mm512_set1_epi8(0x0F);
    const __m512i sixteen = _mm512_set1_epi8(16), shift = _mm512_setr_epi64(0, 0, 0, 0, 4, 4, 4, 4);
    const int64_t panel_bytes = (int64_t)wgroups * group_bytes;
    const uint8_t *w = wt->codes + p * panel_bytes;
    const float *sc = wt->scales + p * wgroups * PANEL, *of = wt->offsets + p * wgroups * PANEL;
    const int8_t *q = x->q + (int64_t)row0 * in;
    __m512 acc[VNNI_ROWS];
    for (int r = 0; r < rows; r++) acc[r] = _mm512_setzero_ps();
    for (int k = 0; k < wgroups; k++, w += group_bytes) {
        __m512i dot[VNNI_ROWS];
        for (int r = 0; r < rows; r++) dot[r] = _mm512_setzero_si512();
        for (int b = 0; b < group_bytes; b += 64) __builtin_prefetch(w + panel_bytes + b); /* the next panel's */
        __builtin_prefetch(sc + (wgroups + k) * PANEL);
        __builtin_prefetch(of + (wgroups + k) * PANEL);
        for (int t = 0; t < group / 4; t++) {
            __m512i codes;
            if (bits == 5) {
                const __m512i both = _mm512_broadcast_i64x4(_mm256_loadu_si256((const __m256i *)(w + 32 * t)));
                const __m512i low = _mm512_and_si512(_mm512_srlv_epi64(both, shift), nibble);
                uint64_t fifth;
                memcpy(&fifth, w + 256 + 8 * t, sizeof fifth);
                codes = _mm512_mask_add_epi8(low, _cvtu64_mask64(fifth), low, sixteen);
            } else {
                codes = _mm512_xor_si512(_mm512_loadu_si512((const void *)(w + 64 * t)), flip);
            }
            for (int r = 0; r < rows; r++) {
                int32_t four;
                memcpy(&four, q + (int64_t)r * in + k * group + 4 * t, sizeof four);
                dot[r] = _mm512_dpbusd_epi32(dot[r], codes, _mm512_set1_epi32(four));
            }
        }
        const __m512 scale = _mm512_loadu_ps(sc + k * PANEL), offset = _mm512_loadu_ps(of + k * PANEL);
        const int g = k * group / GROUP;
        for (int r = 0; r < rows; r++) {
            const float s = x->scale[(int64_t)(row0 + r) * groups + g];
            const int total = group_sum(x, row0 + r, in, k, group);
            const __m512i exact = _mm512_add_epi32(dot[r], _mm512_set1_epi32(correction * total));
            const __m512 d = _mm512_mul_ps(_mm512_cvtepi32_ps(exact), _mm512_set1_ps(s));
            acc[r] = _mm512_fmadd_ps(d, scale, acc[r]);
            acc[r] = _mm512_fmadd_ps(offset, _mm512_set1_ps(s * (float)total), acc[r]);
        }
    }
    const int col0 = (int)p * PANEL, width = out - col0 < PANEL ? out - col0 : PANEL;
    const __mmask16 keep = (__mmask16)((1u << width) - 1);
    const __m512 b = bias ? _mm512_maskz_loadu_ps(keep, bias + col0) : _mm512_setzero_ps();
    for (int r = 0; r < rows; r++) {
        const __m512 v = bias ? _mm512_add_ps(acc[r], b) : acc[r];
        _mm512_mask_storeu_ps(y + (int64_t)(row0 + r) * out + col0, keep, v);
    }
}

#define WIDE_VNNI(NAME, BITS)                                                                                      \
    static void NAME(const quantized_t *x, int row0, int rows, const weights_t *wt, const float *bias, float *y,    \
                     int in, int out, int64_t p) {                                                                 \
        switch (rows) {                                                                                            \
        case 1: wide_vnni_rows(x, row0, wt, bias, y, in, out, p, 1, BITS); break;                                  \
        case 2: wide_vnni_rows(x, row0, wt, bias, y, in, out, p, 2, BITS); break;                                  \
        case 3: wide_vnni_rows(x, row0, wt, bias, y, in, out, p, 3, BITS); break;                                  \
        case 4: wide_vnni_rows(x, row0, wt, bias, y, in, out, p, 4, BITS); break;                                  \
        case 5: wide_vnni_rows(x, row0, wt, bias, y, in, out, p, 5, BITS); break;                                  \
        case 6: wide_vnni_rows(x, row0, wt, bias, y, in, out, p, 6, BITS); break;                                  \
        case 7: wide_vnni_rows(x, row0, wt, bias, y, in, out, p, 7, BITS); break;                                  \
        default: wide_vnni_rows(x, row0, wt, bias, y, in, out, p, 8, BITS); break;                                 \
        }                                                                                                          \
    }
WIDE_VNNI(tile8_vnni, 8)
WIDE_VNNI(tile5_vnni, 5)
#define TILE8 tile8_vnni
#define TILE5 tile5_vnni
#define ROWS_PER_TILE8 VNNI_ROWS
#else
#define TILE8 tile8
#define TILE5 tile5
#define ROWS_PER_TILE8 TILE8_ROWS
#endif

/* The outliers of one block of rows by channel: the distinct inputs that hold one (`channels` [count]), and the
 * slot (index into channels) of each of the block's outlier entries (`slots`, laid out as quantized_t's). */
typedef struct {
    int count;
    int32_t *channels, *slots;
} outliers_t;

/* Rows [first, last)'s outliers into `o`, with `slot_of` [in] all -1 on entry and on return. */
static void gather_outliers(const quantized_t *x, int first, int last, int groups, int32_t *slot_of, outliers_t *o) {
    o->count = 0;
    for (int r = first; r < last; r++)
        for (int j = 0; j < x->outliers[r]; j++) {
            const int k = x->outlier_k[r * groups + j];
            if (slot_of[k] < 0) {
                slot_of[k] = o->count;
                o->channels[o->count++] = k;
            }
            o->slots[(r - first) * groups + j] = slot_of[k];
        }
    for (int u = 0; u < o->count; u++) slot_of[o->channels[u]] = -1;
}

/* w[u][0, width) = channel u's weights (q * scale + offset, exact in fp32) for columns [c0, c0 + width) (c0 at a
 * panel's start), read from the panels the tiles have just streamed: input k's codes for a panel's 16 columns
 * are byte k % 4 of each 4-byte lane of quad k / 4 (low nibble: columns 0-7, high: 8-15). Whole panels are
 * written (w has STRIP columns a slot). */
/* The same from 8-bit codes: input k's codes for a panel's 16 columns are byte k % 4 of each 4-byte lane of the
 * quad's 64 bytes (columns 0-7, then 8-15), sign-extended. */
static void dequantize_strip8(const weights_t *wt, const outliers_t *o, int in, int c0, int width, float *w) {
    const int wgroups = in / wt->group;
    for (int u = 0; u < o->count; u++) {
        const int k = o->channels[u];
        const __m128i up = _mm_cvtsi32_si128(8 * (3 - k % 4));
        for (int c = 0; c < width; c += PANEL) {
            const int64_t p = (c0 + c) / PANEL;
            const uint8_t *quad = wt->codes + (p * (in / 4) + k / 4) * 64;
            const float *sc = wt->scales + (p * wgroups + k / wt->group) * PANEL;
            const float *of = wt->offsets + (p * wgroups + k / wt->group) * PANEL;
            for (int h = 0; h < 2; h++) {
                const __m256i lanes = _mm256_loadu_si256((const __m256i *)(quad + 32 * h));
                const __m256 v = _mm256_cvtepi32_ps(_mm256_srai_epi32(_mm256_sll_epi32(lanes, up), 24));
                _mm256_storeu_ps(w + u * STRIP + c + 8 * h,
                                 _mm256_fmadd_ps(v, _mm256_loadu_ps(sc + 8 * h), _mm256_loadu_ps(of + 8 * h)));
            }
        }
    }
}

/* The same from 5-bit codes: input k's nibbles as from 4-bit codes, its fifth bits bit 4j + k % 4 of the quad's
 * word (column j), plus the base: the codes 8-bit codes hold, so the same fp32 weights. */
static void dequantize_strip5(const weights_t *wt, const outliers_t *o, int in, int c0, int width, float *w) {
    const int groups = in / GROUP;
    const __m256i nibble = _mm256_set1_epi32(0x0F), one = _mm256_set1_epi32(1), base = _mm256_set1_epi32(wt->base);
    const __m256i columns = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    for (int u = 0; u < o->count; u++) {
        const int k = o->channels[u], t = k % GROUP / 4;
        const __m128i shift = _mm_cvtsi32_si128(8 * (k % 4));
        const __m256i at = _mm256_add_epi32(columns, _mm256_set1_epi32(k % 4));
        for (int c = 0; c < width; c += PANEL) {
            const int64_t p = (c0 + c) / PANEL;
            const uint8_t *group = wt->codes + (p * groups + k / GROUP) * FIVE_BIT_GROUP_BYTES;
            const __m256i lanes = _mm256_srl_epi32(_mm256_loadu_si256((const __m256i *)(group + 32 * t)), shift);
            uint64_t fifth;
            memcpy(&fifth, group + 256 + 8 * t, sizeof fifth);
            const float *sc = wt->scales + (p * groups + k / GROUP) * PANEL;
            const float *of = wt->offsets + (p * groups + k / GROUP) * PANEL;
            for (int h = 0; h < 2; h++) {
                const __m256i low = _mm256_and_si256(_mm256_srli_epi32(lanes, 4 * h), nibble);
                const __m256i word = _mm256_set1_epi32((int32_t)(uint32_t)(fifth >> (32 * h)));
                const __m256i high = _mm256_and_si256(_mm256_srlv_epi32(word, at), one);
                const __m256i code = _mm256_add_epi32(_mm256_add_epi32(low, _mm256_slli_epi32(high, 4)), base);
                _mm256_storeu_ps(w + u * STRIP + c + 8 * h, _mm256_fmadd_ps(_mm256_cvtepi32_ps(code),
                                                                           _mm256_loadu_ps(sc + 8 * h),
                                                                           _mm256_loadu_ps(of + 8 * h)));
            }
        }
    }
}

static void dequantize_strip(const weights_t *wt, const outliers_t *o, int in, int c0, int width, float *w) {
    if (wt->bits == 8) {
        dequantize_strip8(wt, o, in, c0, width, w);
        return;
    }
    if (wt->bits == 5) {
        dequantize_strip5(wt, o, in, c0, width, w);
        return;
    }
    const int groups = in / GROUP;
    const __m256i nibble = _mm256_set1_epi32(0x0F);
    for (int u = 0; u < o->count; u++) {
        const int k = o->channels[u];
        const __m128i shift = _mm_cvtsi32_si128(8 * (k % 4));
        for (int c = 0; c < width; c += PANEL) {
            const int64_t p = (c0 + c) / PANEL;
            const __m256i quad = _mm256_loadu_si256((const __m256i *)(wt->codes + (p * (in / 4) + k / 4) * 32));
            const __m256i lanes = _mm256_srl_epi32(quad, shift);
            const float *sc = wt->scales + (p * groups + k / GROUP) * PANEL;
            const float *of = wt->offsets + (p * groups + k / GROUP) * PANEL;
            const __m256 low = _mm256_cvtepi32_ps(_mm256_and_si256(lanes, nibble));
            const __m256 high = _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(lanes, 4), nibble));
            _mm256_storeu_ps(w + u * STRIP + c, _mm256_fmadd_ps(low, _mm256_loadu_ps(sc), _mm256_loadu_ps(of)));
            _mm256_storeu_ps(w + u * STRIP + c + 8,
                             _mm256_fmadd_ps(high, _mm256_loadu_ps(sc + 8), _mm256_loadu_ps(of + 8)));
        }
    }
}

/* dst[0, width) += each outlier value x its channel's strip, in order: whole strips in registers. */
INLINE void add_row_strip(float *dst, const float *w, const int32_t *slots, const float *values, int n, int width) {
    if (width == STRIP) {
        __m256 acc[STRIP / 8];
        for (int i = 0; i < STRIP / 8; i++) acc[i] = _mm256_loadu_ps(dst + 8 * i);
        for (int j = 0; j < n; j++) {
            const __m256 v = _mm256_set1_ps(values[j]);
            const float *src = w + slots[j] * STRIP;
            for (int i = 0; i < STRIP / 8; i++) acc[i] = _mm256_fmadd_ps(v, _mm256_loadu_ps(src + 8 * i), acc[i]);
        }
        for (int i = 0; i < STRIP / 8; i++) _mm256_storeu_ps(dst + 8 * i, acc[i]);
        return;
    }
    for (int j = 0; j < n; j++) {
        const float *src = w + slots[j] * STRIP;
        int c = 0;
        for (; c + 8 <= width; c += 8)
            _mm256_storeu_ps(dst + c, _mm256_fmadd_ps(_mm256_set1_ps(values[j]), _mm256_loadu_ps(src + c),
                                                      _mm256_loadu_ps(dst + c)));
        for (; c < width; c++) dst[c] = fmaf(values[j], src[c], dst[c]);
    }
}

/* Columns [col0, col1) of rows [first, last): y += each outlier input x its weight column, in group order per row
 * (the same fused multiply-adds on the same values whatever the grouping below). The default model's outliers sit
 * in few channels (a 96-row block of its 576-input layers: about 320 outliers in 26 channels), so each channel's
 * weights are dequantized once per strip of STRIP columns, and a row's strip of y stays in registers across its
 * outliers. Returns 2 when out of memory. */
static int add_outliers(const quantized_t *x, const weights_t *wt, float *y, int first, int last, int in, int out,
                        int col0, int col1) {
    const int groups = in / GROUP, rows = last - first, end = col1 < out ? col1 : out;
    int total = 0;
    for (int r = first; r < last; r++) total += x->outliers[r];
    if (!total) return 0;
    int32_t *ints = malloc(sizeof(int32_t) * ((size_t)in + total + (size_t)rows * groups));
    if (!ints) return 2;
    int32_t *slot_of = ints;
    outliers_t o = {0, ints + in, ints + in + total};
    for (int k = 0; k < in; k++) slot_of[k] = -1;
    gather_outliers(x, first, last, groups, slot_of, &o);
    float *w = malloc(sizeof(float) * STRIP * (size_t)o.count);
    for (int c0 = col0; w && c0 < end; c0 += STRIP) {
        const int width = end - c0 < STRIP ? end - c0 : STRIP;
        dequantize_strip(wt, &o, in, c0, width, w);
        for (int r = first; r < last; r++)
            add_row_strip(y + (int64_t)r * out + c0, w, o.slots + (r - first) * groups, x->outlier_v + r * groups,
                          x->outliers[r], width);
    }
    const int failed = !w;
    free(ints);
    free(w);
    return failed ? 2 : 0;
}

/* The whole product: rows quantized, then work items of row tiles through panels, then each item's outliers. */
static int run(const float *x, const weights_t *wt, const float *bias, float *y, int rows, int in, int out,
               int num_threads) {
    const int groups = in / GROUP, panels = (out + PANEL - 1) / PANEL;
    const size_t sides = (size_t)rows * groups;
    int8_t *q = malloc((size_t)rows * in + 64);
    /* scale, sum, outlier_v, outlier_k, outliers, half_sums */
    float *side = malloc(sizeof(float) * (6 * sides + rows) + 64);
    if (!q || !side) {
        free(q);
        free(side);
        return 2;
    }
    int32_t *ints = (int32_t *)(side + 3 * sides);
    const quantized_t qx = {q, side, side + sides, ints + sides, ints, side + 2 * sides, ints + sides + rows};
    const int tile_rows = wt->bits == 4 ? ROWS_PER_TILE : ROWS_PER_TILE8; /* 5 bits: 8-bit codes' tiles */
    /* Work items of BLOCK_ROWS rows x `chunk` panels, handed out as threads come free: a thread that the OS
     * preempts (the gateway and scheduler share these cores) holds up one item, not a fixed half of the work. */
    const int threads = num_threads > 0 ? num_threads : 1, per_thread = ITEMS_PER_THREAD * threads;
    const int chunk = (panels + per_thread - 1) / per_thread, chunks = (panels + chunk - 1) / chunk;
    const int items = (rows + BLOCK_ROWS - 1) / BLOCK_ROWS * chunks;
    int failed = 0;
#pragma omp parallel num_threads(num_threads)
    {
#pragma omp for schedule(dynamic, QUANTIZE_ROWS)
        for (int r = 0; r < rows; r++) quantize_row(x + (int64_t)r * in, in, &qx, r);
        /* per item: every row tile through the item's panels (the tile's int8 rows stay in L1 while the codes
         * stream past), then the item's outliers */
#pragma omp for schedule(dynamic, 1)
        for (int item = 0; item < items; item++) {
            const int first = item / chunks * BLOCK_ROWS, last = first + BLOCK_ROWS < rows ? first + BLOCK_ROWS : rows;
            const int p0 = item % chunks * chunk, p1 = p0 + chunk < panels ? p0 + chunk : panels;
            for (int r = first; r < last; r += tile_rows) {
                const int n = last - r < tile_rows ? last - r : tile_rows;
                for (int p = p0; p < p1; p++) {
                    if (wt->bits == 8)
                        TILE8(&qx, r, n, wt, bias, y, in, out, p);
                    else if (wt->bits == 5)
                        TILE5(&qx, r, n, wt, bias, y, in, out, p);
                    else
                        TILE(&qx, r, n, wt, bias, y, in, out, p);
                }
            }
            if (add_outliers(&qx, wt, y, first, last, in, out, p0 * PANEL, p1 * PANEL)) {
#pragma omp atomic write
                failed = 1;
            }
        }
    }
    free(q);
    free(side);
    return failed ? 2 : 0;
}

/* bits 4 or 5 (group 32) or 8 (group 16 or 32), with packed_linear_coded's argument order and `base` (5-bit codes:
 * -16 or 0; else ignored) after `group`. */
int int8_linear_coded(const float *x, const uint8_t *codes, const float *scales, const float *offsets, int bits,
                      int group, int base, const float *bias, float *y, int rows, int in, int out, int num_threads) {
    const int four_or_five = (bits == 4 || bits == 5) && group == GROUP;
    if (!(four_or_five || (bits == 8 && (group == 16 || group == GROUP))) || in % GROUP) return 3;
    const weights_t wt = {codes, scales, offsets, bits, group, bits == 5 ? base : 0};
    return run(x, &wt, bias, y, rows, in, out, num_threads);
}
