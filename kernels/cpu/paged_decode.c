/* Paged decode attention for CPUs: one query token per request over its paged context.
 *
 * One task per (request, kv head), spread over OpenMP threads (the runtime torch already loaded, so torch's own
 * worker threads). A task reads only its request's blocks, up to its own length, in two passes (keys, then values)
 * with 16-float vectors (GCC vector extensions: AVX-512 where the build machine has it); scores, softmax and sums
 * in fp32, the GQA group's query heads together.
 *
 * Layouts (contiguous): query/out [B, H, D]; key/value cache [N, block_size, Hkv, D]; block_tables [B, nb] int32;
 * seq_lens [B] int32. A query sees positions [max(0, len - window), len); window 0: no sliding window.
 * Entry points: paged_decode_{bf16,f32}_d{64,128} (element type of query, output and cache; head size D), and
 * paged_decode_f32_kvf16_d{64,128} (fp32 query and output over an fp16 cache: half the bytes a step reads).
 */
#include <stdlib.h>

#include "vec.h"

#define MAX_GROUP 16
#define MAX_VECS (128 / LANES) /* head size up to 128 */

/* Attention shape and data of one call; `bf16` and `dim` are constants in each entry point. */
typedef struct {
    const void *query, *key_cache, *value_cache;
    const int32_t *block_tables, *seq_lens;
    void *out;
    int table_width, heads, kv_heads, block_size, window;
    float scale;
} Call;

/* The same row of the next block (ahead = its distance in elements; 0 in the last block). */
INLINE void prefetch_row(const void *base, int64_t index, int dim, int kv) {
    const char *p = (const char *)base + index * ELEMENT_BYTES(kv);
    for (int b = 0; b < dim * ELEMENT_BYTES(kv); b += 64) __builtin_prefetch(p + b);
}

/* Scores of the group's queries for positions [start, len) into scores[g * span + t]; returns nothing, fills top. */
INLINE void score_keys(const Call *c, const int32_t *table, int start, int len, int kvh, int group, int dim,
                       int kv, const vf qv[][MAX_VECS], float *scores, float *top) {
    int nv = dim / LANES, span = len - start, bs = c->block_size;
    for (int pos = start, t = 0; pos < len; t++) {
        int64_t row = ((int64_t)table[pos / bs] * bs + pos % bs) * c->kv_heads + kvh;
        int64_t ahead = pos / bs + 1 < (len + bs - 1) / bs ? ((int64_t)table[pos / bs + 1] - table[pos / bs]) * bs
                                                              * c->kv_heads * dim : 0;
        for (int end = pos - pos % bs + bs; pos < len && pos < end; pos++, t++, row += c->kv_heads) {
            vf k[MAX_VECS];
            prefetch_row(c->key_cache, row * dim + ahead, dim, kv);
            for (int i = 0; i < nv; i++) k[i] = load_vec(c->key_cache, row * dim + i * LANES, kv);
            for (int g = 0; g < group; g++) {
                vf s = qv[g][0] * k[0];
                for (int i = 1; i < nv; i++) s += qv[g][i] * k[i];
                float score = hsum(s);
                scores[g * span + t] = score;
                top[g] = score > top[g] ? score : top[g];
            }
        }
        t--;
    }
}

/* acc[g] += p[g, t] * v_t over positions [start, len). */
INLINE void weigh_values(const Call *c, const int32_t *table, int start, int len, int kvh, int group, int dim,
                         int kv, const float *probs, vf acc[][MAX_VECS]) {
    int nv = dim / LANES, span = len - start, bs = c->block_size;
    for (int pos = start, t = 0; pos < len; t++) {
        int64_t row = ((int64_t)table[pos / bs] * bs + pos % bs) * c->kv_heads + kvh;
        int64_t ahead = pos / bs + 1 < (len + bs - 1) / bs ? ((int64_t)table[pos / bs + 1] - table[pos / bs]) * bs
                                                              * c->kv_heads * dim : 0;
        for (int end = pos - pos % bs + bs; pos < len && pos < end; pos++, t++, row += c->kv_heads) {
            vf v[MAX_VECS];
            prefetch_row(c->value_cache, row * dim + ahead, dim, kv);
            for (int i = 0; i < nv; i++) v[i] = load_vec(c->value_cache, row * dim + i * LANES, kv);
            for (int g = 0; g < group; g++) {
                float p = probs[g * span + t];
                for (int i = 0; i < nv; i++) acc[g][i] += p * v[i];
            }
        }
        t--;
    }
}

/* Softmax numerators in place; returns their sum. */
INLINE float exponentiate(float *row, int span, float top) {
    vf sum = {0};
    int t = 0;
    for (; t + LANES <= span; t += LANES) {
        vf e = exp_nonpositive(load_vec(row, t, 0) - top);
        memcpy(row + t, &e, sizeof e);
        sum += e;
    }
    float total = hsum(sum);
    for (; t < span; t++) {
        row[t] = expf(row[t] - top);
        total += row[t];
    }
    return total;
}

/* One (request b, kv head kvh); `scores` has room for group * span floats. `bf16`: the query and output type,
 * `kv`: the cache's. */
INLINE void attend(const Call *c, int b, int kvh, int group, int dim, int bf16, int kv, float *scores) {
    int len = c->seq_lens[b], nv = dim / LANES;
    int start = (c->window > 0 && len > c->window) ? len - c->window : 0, span = len - start;
    const int32_t *table = c->block_tables + (int64_t)b * c->table_width;
    int64_t head0 = ((int64_t)b * c->heads + (int64_t)kvh * group) * dim;
    vf qv[MAX_GROUP][MAX_VECS], acc[MAX_GROUP][MAX_VECS];
    float top[MAX_GROUP], total[MAX_GROUP];
    for (int g = 0; g < group; g++) {
        top[g] = -INFINITY;
        for (int i = 0; i < nv; i++) {
            qv[g][i] = load_vec(c->query, head0 + g * dim + i * LANES, bf16) * c->scale;
            acc[g][i] = (vf){0};
        }
    }
    score_keys(c, table, start, len, kvh, group, dim, kv, qv, scores, top);
    for (int g = 0; g < group; g++) total[g] = exponentiate(scores + g * span, span, top[g]);
    weigh_values(c, table, start, len, kvh, group, dim, kv, scores, acc);
    for (int g = 0; g < group; g++)
        for (int i = 0; i < nv; i++) store_vec(c->out, head0 + g * dim + i * LANES, acc[g][i] / total[g], bf16);
}

/* Each entry point has its own parallel region, so that `dim` and the types are constants in the outlined loop.
 * Returns 0, or 1 when the shape is unsupported or scratch memory ran out. */
#define ENTRY(NAME, DIM, BF16, KV)                                                                              \
    int NAME(const void *query, const void *key_cache, const void *value_cache, const int32_t *block_tables,   \
             int table_width, const int32_t *seq_lens, void *out, int batch, int heads, int kv_heads,            \
             int block_size, float scale, int window, int num_threads) {                                      \
        Call c = {query, key_cache, value_cache, block_tables, seq_lens, out,                                 \
                  table_width, heads, kv_heads, block_size, window, scale};                                   \
        int group = heads / kv_heads, failed = 0;                                                            \
        if (group > MAX_GROUP || group * kv_heads != heads) return 1;                                        \
        _Pragma("omp parallel for collapse(2) schedule(dynamic, 1) num_threads(num_threads)")                \
        for (int b = 0; b < batch; b++)                                                                      \
            for (int h = 0; h < kv_heads; h++) {                                                             \
                float *scores = seq_lens[b] > 0 ? malloc(sizeof(float) * group * seq_lens[b]) : NULL;        \
                if (scores) attend(&c, b, h, group, DIM, BF16, KV, scores);                                  \
                else if (seq_lens[b] > 0) {                                                                  \
                    _Pragma("omp atomic write") failed = 1;                                                  \
                }                                                                                            \
                free(scores);                                                                                \
            }                                                                                                \
        return failed;                                                                                       \
    }

ENTRY(paged_decode_bf16_d64, 64, 1, 1)
ENTRY(paged_decode_bf16_d128, 128, 1, 1)
ENTRY(paged_decode_f32_d64, 64, 0, 0)
ENTRY(paged_decode_f32_d128, 128, 0, 0)
ENTRY(paged_decode_f32_kvf16_d64, 64, 0, F16)
ENTRY(paged_decode_f32_kvf16_d128, 128, 0, F16)
