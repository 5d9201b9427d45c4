/* 16-float vectors where the build machine has AVX-512, else 8 (GCC vector extensions; a 16-float vector on an
 * AVX2 machine is split through memory and ran ~4x slower in paged_prefill.c), and the
 * loads, stores and math the CPU kernels share. Element type, always a constant at the call sites so that each
 * kernel is compiled once per type: fp32 (0), bf16 (`bf16` = 1) or, for loads only (KV caches), fp16 (F16, 2). */
#ifndef PAGEDSERVE_VEC_H
#define PAGEDSERVE_VEC_H

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __AVX512F__
#define LANES 16
#else
#define LANES 8
#endif
#define INLINE static inline __attribute__((always_inline))

typedef float vf __attribute__((vector_size(LANES * 4)));
typedef uint32_t vu __attribute__((vector_size(LANES * 4)));
typedef int32_t vi __attribute__((vector_size(LANES * 4)));
typedef uint16_t vh __attribute__((vector_size(LANES * 2)));

#define F16 2 /* the element-type code of IEEE half precision */
#define ELEMENT_BYTES(type) ((type) ? 2 : 4)

#ifdef __F16C__
#include <immintrin.h>
#endif

/* LANES halves from `h` -> floats (F16C where the build machine has it, else bit by bit, subnormals included). */
INLINE vf widen_half(const uint16_t *h) {
#if defined(__F16C__) && LANES == 8
    __m128i bits;
    memcpy(&bits, h, sizeof bits);
    return (vf)_mm256_cvtph_ps(bits);
#elif defined(__F16C__) && LANES == 16
    __m256i bits;
    memcpy(&bits, h, sizeof bits);
    return (vf)_mm512_cvtph_ps(bits);
#else
    vf out;
    for (int i = 0; i < LANES; i++) {
        uint32_t sign = (uint32_t)(h[i] & 0x8000) << 16, exponent = (h[i] >> 10) & 31, mantissa = h[i] & 1023;
        float magnitude = exponent == 0 ? ldexpf((float)mantissa, -24)
                          : exponent == 31 ? (mantissa ? NAN : INFINITY)
                                           : ldexpf((float)(mantissa | 1024), (int)exponent - 25);
        uint32_t bits;
        memcpy(&bits, &magnitude, sizeof bits);
        bits |= sign;
        memcpy(&out[i], &bits, sizeof bits);
    }
    return out;
#endif
}

INLINE vf load_vec(const void *base, int64_t index, int bf16) {
    if (bf16 == F16) return widen_half((const uint16_t *)base + index);
    if (bf16) {
        vh h;
        memcpy(&h, (const uint16_t *)base + index, sizeof h);
        return (vf)(__builtin_convertvector(h, vu) << 16);
    }
    vf f;
    memcpy(&f, (const float *)base + index, sizeof f);
    return f;
}

INLINE void store_vec(void *base, int64_t index, vf v, int bf16) {
    if (!bf16) {
        memcpy((float *)base + index, &v, sizeof v);
        return;
    }
    vu bits = (vu)v;
    vu rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16; /* round to nearest even */
    vu nan = (vu)(v != v);
    vh h = __builtin_convertvector((rounded & ~nan) | (0x7FC0 & nan), vh);
    memcpy((uint16_t *)base + index, &h, sizeof h);
}

INLINE float hsum(vf v) {
#if LANES == 16
    v += __builtin_shuffle(v, (vi){8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7});
    v += __builtin_shuffle(v, (vi){4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11});
    v += __builtin_shuffle(v, (vi){2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13});
    v += __builtin_shuffle(v, (vi){1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14});
#else
    v += __builtin_shuffle(v, (vi){4, 5, 6, 7, 0, 1, 2, 3});
    v += __builtin_shuffle(v, (vi){2, 3, 0, 1, 6, 7, 4, 5});
    v += __builtin_shuffle(v, (vi){1, 0, 3, 2, 5, 4, 7, 6});
#endif
    return v[0];
}

/* exp(x) for x <= 0 (scores minus their max), relative error about 2e-7; clamped at 2^-126 below. */
INLINE vf exp_nonpositive(vf x) {
    vf t = x * 1.44269504088896341f; /* exp(x) = 2^t = 2^n * 2^f */
    vi low = (vi)(t < -126.0f);
    t = (vf)(((vi)t & ~low) | ((vi)((vf){0} - 126.0f) & low));
    vi n = __builtin_convertvector(t - 0.5f, vi); /* truncation: for t <= 0, f = t - n lies in (-0.5, 0.5] */
    vf y = (t - __builtin_convertvector(n, vf)) * 0.69314718055994531f;
    vf p = y * (1.0f / 720) + 1.0f / 120;
    p = p * y + 1.0f / 24;
    p = p * y + 1.0f / 6;
    p = p * y + 0.5f;
    p = p * y + 1.0f;
    p = p * y + 1.0f;
    return p * (vf)((n + 127) << 23);
}

INLINE float load_scalar(const void *base, int64_t index, int bf16) {
    if (!bf16) return ((const float *)base)[index];
    if (bf16 == F16) {
        uint16_t lanes[LANES] = {((const uint16_t *)base)[index]};
        return widen_half(lanes)[0];
    }
    uint32_t bits = (uint32_t)((const uint16_t *)base)[index] << 16;
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

/* Round to the element type (nearest even for bf16), staying a float. */
INLINE float round_scalar(float f, int bf16) {
    if (!bf16 || f != f) return f;
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000u;
    memcpy(&f, &bits, sizeof f);
    return f;
}

INLINE vf round_vec(vf v, int bf16) {
    if (!bf16) return v;
    vu bits = (vu)v;
    vu rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000u;
    vu nan = (vu)(v != v);
    return (vf)((rounded & ~nan) | ((vu)v & nan));
}

INLINE void store_scalar(void *base, int64_t index, float f, int bf16) {
    if (!bf16) {
        ((float *)base)[index] = f;
        return;
    }
    uint32_t bits;
    f = round_scalar(f, 1);
    memcpy(&bits, &f, sizeof bits);
    ((uint16_t *)base)[index] = f != f ? 0x7FC0 : (uint16_t)(bits >> 16);
}

#endif
