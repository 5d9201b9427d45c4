/* Every decoder layer of a step of decodes and short chunks in one call (CPU, fp32 activations).
 *
 * Per layer it runs the kernels the layer-by-layer torch path calls, in the same order and on the same buffers'
 * values: RMSNorm, the q|k|v projection, rotary on q and k, the KV cache write, paged decode attention, the output
 * projection, the residual add fused into the second RMSNorm, gate|up, SiLU-and-multiply, down and the residual
 * add. The numbers are therefore bit for bit those of that path. What goes away is the Python between the kernels
 * (about 25 calls a layer; docs/cpu.md).
 *
 * Attention is split as the torch backend splits it: the first `num_decodes` rows (one-token requests) in one call
 * of the C decode kernel, the rows after them (`num_chunks` chunks back to back, e.g. a speculative verification's
 * 1 + k tokens) in one call of the C prefill kernel over their own block tables, starts and lengths. In
 * batch-invariant mode there is no decode kernel: the caller passes num_decodes = 0 and every request as a chunk
 * (a decode as a one-token chunk), as the layer-by-layer path runs it there.
 *
 * The kernels are not linked in: their entry points (int8_linear.c, packed_linear.c, fused_ops.c, paged_decode.c,
 * paged_prefill.c, each already loaded by its own wrapper) arrive as function pointers in `kernels_t`, so each
 * keeps one copy.
 * The KV cache write (fp32 or fp16 caches; fp16 rounds to nearest even, as torch's conversion) is the one step
 * done here.
 *
 * Layouts: hidden [rows, hidden] fp32, the residual stream, updated in place; cos/sin [rows, head_dim / 2] fp32;
 * slots [rows] int64 (cache slot of each row's new token; < 0: not written); block_tables [requests, table_width]
 * int32 and seq_lens [requests] int32, decodes first (requests = num_decodes + num_chunks); chunk_starts
 * [num_chunks + 1] int32, the chunks' first rows counted from row num_decodes (0, ..., rows - num_decodes);
 * caches [blocks, block_size, kv_heads, head_dim] contiguous.
 * Entry point: decode_layers. Returns 0, 1 where a needed attention kernel is missing, or the first failing
 * kernel's nonzero code (2: out of memory).
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#ifdef __F16C__
#include <immintrin.h>
#endif

enum { PROJ_INT8 = 0, PROJ_PACKED_F32 = 1, PROJ_PACKED_CODED = 2 };

/* One projection: which GEMM, its sizes, and its packed tensors in that kernel's argument order. */
typedef struct {
    int kind, in, out, bits, group; /* group: inputs per scale of coded weights */
    int base;                       /* int8 5-bit codes: the code of a stored 0 */
    const void *tensors[3]; /* int8: codes, scales, offsets; packed: values(, scales, offsets) */
    const float *bias;      /* or NULL */
} projection_t;

typedef struct {
    const float *input_norm, *post_norm; /* [hidden] */
    projection_t qkv, o, gate_up, down;
    void *key_cache, *value_cache;
} layer_t;

typedef int (*int8_linear_fn)(const float *, const void *, const void *, const void *, int, int, int,
                              const float *, float *, int, int, int, int);
typedef int (*packed_f32_fn)(const float *, const void *, const float *, float *, int, int, int, int);
typedef int (*packed_coded_fn)(const float *, const void *, const void *, const void *, int, int, const float *,
                               float *, int, int, int, int);
typedef void (*rms_norm_fn)(const void *, void *, const void *, void *, int, int, float, int);
typedef void (*silu_mul_fn)(const void *, void *, int, int, int);
typedef void (*rotary_fn)(void *, int64_t, const void *, const void *, int, int, int, int);
typedef int (*decode_fn)(const void *, const void *, const void *, const int32_t *, int, const int32_t *, void *, int,
                         int, int, int, float, int, int);
typedef int (*prefill_fn)(const void *, const void *, const void *, const int32_t *, int, const int32_t *,
                          const int32_t *, void *, int, int, int, int, int, float, int, int);

typedef struct {
    int8_linear_fn int8_linear;
    packed_f32_fn packed_f32;
    packed_coded_fn packed_coded;
    rms_norm_fn rms_norm;
    silu_mul_fn silu_mul;
    rotary_fn rotary;
    decode_fn decode;   /* for this model's head size and cache dtype; NULL in batch-invariant mode */
    prefill_fn prefill; /* for this cache dtype; NULL where chunks do not run in the C prefill kernel */
} kernels_t;

typedef struct {
    kernels_t k;
    const layer_t *layers;
    int num_layers, hidden, heads, kv_heads, head_dim, intermediate, block_size, window, half_cache;
    float eps, scale;
} model_t;

/* The buffers of one call, each [rows, width]. */
typedef struct {
    float *normed, *qkv, *query, *attn, *proj, *gate_up, *act;
} scratch_t;

/* Which rows attention runs as decodes and which as chunks, and the requests' paged contexts. */
typedef struct {
    int num_decodes, num_chunks, table_width;
    const int32_t *tables, *seq_lens, *chunk_starts;
} split_t;

static int project(const kernels_t *k, const projection_t *p, const float *x, float *y, int rows, int threads) {
    const void *const *t = p->tensors;
    switch (p->kind) {
    case PROJ_INT8:
        return k->int8_linear(x, t[0], t[1], t[2], p->bits, p->group, p->base, p->bias, y, rows, p->in, p->out,
                              threads);
    case PROJ_PACKED_F32:
        return k->packed_f32(x, t[0], p->bias, y, rows, p->in, p->out, threads);
    default:
        return k->packed_coded(x, t[0], t[1], t[2], p->bits, p->group, p->bias, y, rows, p->in, p->out, threads);
    }
}

/* `width` floats -> the cache row at `dst` (fp16 when `half`, width a multiple of 8 for F16C). */
static void store_row(void *dst, const float *src, int width, int half) {
    if (!half) {
        memcpy(dst, src, sizeof(float) * width);
        return;
    }
#ifdef __F16C__
    uint16_t *h = dst;
    for (int i = 0; i < width; i += 8)
        _mm_storeu_si128((__m128i *)(h + i), _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT));
#endif
}

/* Each row's k and v (after rotary) into its slot of the layer's caches. */
static void write_kv(const model_t *m, const layer_t *l, const float *qkv, const int64_t *slots, int rows) {
    const int q_size = m->heads * m->head_dim, kv_size = m->kv_heads * m->head_dim;
    const int qkv_width = l->qkv.out, bytes = m->half_cache ? 2 : 4;
    for (int r = 0; r < rows; r++) {
        if (slots[r] < 0) continue;
        const int64_t at = slots[r] * kv_size * bytes;
        const float *row = qkv + (int64_t)r * qkv_width;
        store_row((char *)l->key_cache + at, row + q_size, kv_size, m->half_cache);
        store_row((char *)l->value_cache + at, row + q_size + kv_size, kv_size, m->half_cache);
    }
}

/* The decodes' rows through the decode kernel, the chunks' rows through the prefill kernel: s->query -> s->attn. */
static int attend(const model_t *m, const layer_t *l, const split_t *p, int threads, const scratch_t *s) {
    const kernels_t *k = &m->k;
    const int64_t q_size = (int64_t)m->heads * m->head_dim;
    if ((p->num_decodes && !k->decode) || (p->num_chunks && !k->prefill)) return 1;
    if (p->num_decodes) {
        const int failed = k->decode(s->query, l->key_cache, l->value_cache, p->tables, p->table_width, p->seq_lens,
                                     s->attn, p->num_decodes, m->heads, m->kv_heads, m->block_size, m->scale,
                                     m->window, threads);
        if (failed || !p->num_chunks) return failed;
    }
    const int64_t row = (int64_t)p->num_decodes;
    return k->prefill(s->query + row * q_size, l->key_cache, l->value_cache, p->tables + row * p->table_width,
                      p->table_width, p->chunk_starts, p->seq_lens + row, s->attn + row * q_size, p->num_chunks,
                      m->heads, m->kv_heads, m->head_dim, m->block_size, m->scale, m->window, threads);
}

/* Attention half of a layer: hidden -> s->attn (the attention output, before o_proj). */
static int attention(const model_t *m, const layer_t *l, const float *hidden, int rows, const float *cos,
                     const float *sin, const int64_t *slots, const split_t *p, int threads, const scratch_t *s) {
    const kernels_t *k = &m->k;
    const int q_size = m->heads * m->head_dim, qkv_width = l->qkv.out;
    k->rms_norm(hidden, NULL, l->input_norm, s->normed, rows, m->hidden, m->eps, threads);
    int failed = project(k, &l->qkv, s->normed, s->qkv, rows, threads);
    if (failed) return failed;
    k->rotary(s->qkv, qkv_width, cos, sin, rows, m->heads, m->head_dim, threads);
    k->rotary(s->qkv + q_size, qkv_width, cos, sin, rows, m->kv_heads, m->head_dim, threads);
    write_kv(m, l, s->qkv, slots, rows);
    for (int r = 0; r < rows; r++) /* the queries, contiguous */
        memcpy(s->query + (int64_t)r * q_size, s->qkv + (int64_t)r * qkv_width, sizeof(float) * q_size);
    return attend(m, l, p, threads, s);
}

/* MLP half: hidden += o_proj(attn); hidden += down(silu(gate) * up) of the normed sum. */
static int mlp(const model_t *m, const layer_t *l, float *hidden, int rows, int threads, const scratch_t *s) {
    const kernels_t *k = &m->k;
    int failed = project(k, &l->o, s->attn, s->proj, rows, threads);
    if (failed) return failed;
    k->rms_norm(s->proj, hidden, l->post_norm, s->normed, rows, m->hidden, m->eps, threads);
    if ((failed = project(k, &l->gate_up, s->normed, s->gate_up, rows, threads))) return failed;
    k->silu_mul(s->gate_up, s->act, rows, m->intermediate, threads);
    if ((failed = project(k, &l->down, s->act, s->proj, rows, threads))) return failed;
    const int64_t n = (int64_t)rows * m->hidden;
    for (int64_t i = 0; i < n; i++) hidden[i] += s->proj[i];
    return 0;
}

int decode_layers(const model_t *m, float *hidden, int rows, const float *cos, const float *sin, const int64_t *slots,
                  const int32_t *tables, int table_width, const int32_t *seq_lens, int num_decodes, int num_chunks,
                  const int32_t *chunk_starts, int threads) {
#ifndef __F16C__
    if (m->half_cache) return 1;
#endif
    if (num_chunks && chunk_starts[num_chunks] != rows - num_decodes) return 1;
    const int64_t q_size = (int64_t)m->heads * m->head_dim, qkv = q_size + 2 * (int64_t)m->kv_heads * m->head_dim;
    const int64_t widths[] = {m->hidden, qkv, q_size, q_size, m->hidden, 2 * (int64_t)m->intermediate,
                              m->intermediate};
    int64_t total = 0;
    for (int i = 0; i < 7; i++) total += widths[i] * rows;
    float *base = malloc(sizeof(float) * total);
    if (!base) return 2;
    float *parts[7];
    for (int64_t i = 0, at = 0; i < 7; at += widths[i] * rows, i++) parts[i] = base + at;
    const scratch_t s = {parts[0], parts[1], parts[2], parts[3], parts[4], parts[5], parts[6]};
    const split_t split = {num_decodes, num_chunks, table_width, tables, seq_lens, chunk_starts};
    int failed = 0;
    for (int i = 0; i < m->num_layers && !failed; i++) {
        failed = attention(m, &m->layers[i], hidden, rows, cos, sin, slots, &split, threads, &s);
        if (!failed) failed = mlp(m, &m->layers[i], hidden, rows, threads, &s);
    }
    free(base);
    return failed;
}
