/* Paged decode attention for CPUs: one query token per request over its paged context.
 *
 * One task per request (all of its kv heads, whose rows lie side by side in the cache, so a task streams whole
 * rows), or per (request, kv head) when a small batch would leave threads idle; tasks are spread over OpenMP
 * threads (the runtime torch already loaded, so torch's own worker threads). A task reads only its request's
 * blocks, up to its own length, in two passes (keys, then values), prefetching the same row of the next block;
 * scores for eight positions at a time (independent sums, reduced together), softmax and sums in fp32, the GQA
 * group's query heads together. Every query head gets the same numbers whatever the batch or task split.
 * Measurements: docs/cpu.md.
 *
 * Layouts (contiguous): query/out [B, H, D]; key/value cache [N, block_size, Hkv, D]; block_tables [B, nb] int32;
 * seq_lens [B] int32. A query sees positions [max(0, len - window), len); window 0: no sliding window.
 * Entry points: paged_decode_{bf16,f32}_d{64,128} (element type of query, output and cache; head size D), and
 * paged_decode_f32_kvf16_d{64,128} (fp32 query and output over an fp16 cache: half the bytes a step reads).
 */
#include <stdlib.h>

#include "vec.h"

#define MAX_GROUP 16
#define MAX_TASK_QUERIES 32 /* query heads one task computes (its arrays' size) */
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

/* Eight dot products' partial-sum vectors -> their eight sums, each added up in hsum's order (so each score is the
 * same float whichever way it is computed); the steps of that order run on all eight at once, transposing as they
 * go, instead of three (8 lanes) or four (16 lanes) shuffles per score. */
INLINE void sum8(const vf s[8], float out[8]) {
#if LANES == 8
    vf a[4], b[2];
    for (int j = 0; j < 4; j++) /* lanes i + (i + 4): [s_j's four | s_(j+4)'s four] */
        a[j] = __builtin_shuffle(s[j], s[j + 4], (vi){0, 1, 2, 3, 8, 9, 10, 11}) +
               __builtin_shuffle(s[j], s[j + 4], (vi){4, 5, 6, 7, 12, 13, 14, 15});
    for (int j = 0; j < 2; j++) /* then + 2: pairs of scores 2j, 2j + 1, 2j + 4, 2j + 5 */
        b[j] = __builtin_shuffle(a[2 * j], a[2 * j + 1], (vi){0, 1, 8, 9, 4, 5, 12, 13}) +
               __builtin_shuffle(a[2 * j], a[2 * j + 1], (vi){2, 3, 10, 11, 6, 7, 14, 15});
    vf r = __builtin_shuffle(b[0], b[1], (vi){0, 2, 8, 10, 4, 6, 12, 14}) + /* then + 1: scores 0-7 in order */
           __builtin_shuffle(b[0], b[1], (vi){1, 3, 9, 11, 5, 7, 13, 15});
    memcpy(out, &r, sizeof r);
#elif LANES == 16 /* the same order on 16 lanes: + 8 (two scores' halves a vector), + 4, + 2, + 1 */
    vf a[4], b[2];
    for (int j = 0; j < 4; j++) /* [s_j's lanes i + (i + 8) | s_(j+4)'s] */
        a[j] = __builtin_shuffle(s[j], s[j + 4], (vi){0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23}) +
               __builtin_shuffle(s[j], s[j + 4], (vi){8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31});
    for (int k = 0; k < 2; k++) /* + 4: four lanes each of scores 2k, 2k + 1, 2k + 4, 2k + 5 */
        b[k] = __builtin_shuffle(a[2 * k], a[2 * k + 1],
                                 (vi){0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27}) +
               __builtin_shuffle(a[2 * k], a[2 * k + 1],
                                 (vi){4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31});
    vf c = __builtin_shuffle(b[0], b[1], (vi){0, 1, 4, 5, 16, 17, 20, 21, 8, 9, 12, 13, 24, 25, 28, 29}) + /* + 2 */
           __builtin_shuffle(b[0], b[1], (vi){2, 3, 6, 7, 18, 19, 22, 23, 10, 11, 14, 15, 26, 27, 30, 31});
    vf r = __builtin_shuffle(c, (vi){0, 2, 4, 6, 8, 10, 12, 14, 0, 2, 4, 6, 8, 10, 12, 14}) + /* + 1: scores 0-7 */
           __builtin_shuffle(c, (vi){1, 3, 5, 7, 9, 11, 13, 15, 1, 3, 5, 7, 9, 11, 13, 15});
    memcpy(out, &r, sizeof(float) * 8);
#else
    for (int j = 0; j < 8; j++) out[j] = hsum(s[j]);
#endif
}

/* A task's part of one call: request b's kv heads [kvh, kvh + heads) and their `queries` (= heads * group) query
 * heads, which the task's arrays index from 0. */
typedef struct {
    int b, kvh, heads, group, start, len;
    const int32_t *table;
} Task;

/* Element offsets of position `pos`'s row of the task's first kv head, and of the same row in the next block
 * (0 in the last block): the prefetch distance. */
INLINE int64_t row_of(const Call *c, const Task *t, int pos, int dim) {
    return (((int64_t)t->table[pos / c->block_size] * c->block_size + pos % c->block_size) * c->kv_heads + t->kvh) *
           dim;
}

INLINE int64_t ahead_of(const Call *c, const Task *t, int block, int dim) {
    int last = (t->len - 1) / c->block_size;
    return block < last ? ((int64_t)t->table[block + 1] - t->table[block]) * c->block_size * c->kv_heads * dim : 0;
}

/* The lanes of query . key for each of the task's queries at one position (summed over the head's vectors in
 * order), into lanes[q * stride]. */
INLINE void dot_lanes(const Call *c, const Task *t, int64_t row, int64_t ahead, int dim, int kv,
                      const vf qv[][MAX_VECS], vf *lanes, int stride) {
    int nv = dim / LANES;
    prefetch_row(c->key_cache, row + ahead, t->heads * dim, kv);
    for (int h = 0; h < t->heads; h++) {
        vf k[MAX_VECS];
        for (int i = 0; i < nv; i++) k[i] = load_vec(c->key_cache, row + h * dim + i * LANES, kv);
        for (int g = 0, q = h * t->group; g < t->group; g++, q++) {
            vf s = qv[q][0] * k[0];
            for (int i = 1; i < nv; i++) s += qv[q][i] * k[i];
            lanes[q * stride] = s;
        }
    }
}

/* Scores of the task's queries for positions [start, len) into scores[q * span + t], their maxima into top:
 * block by block, eight positions at a time (independent sums the core can overlap), then one at a time. */
INLINE void score_keys(const Call *c, const Task *t, int dim, int kv, const vf qv[][MAX_VECS], float *scores,
                       float *top) {
    int span = t->len - t->start, bs = c->block_size, queries = t->heads * t->group, step = c->kv_heads * dim;
    for (int pos = t->start; pos < t->len;) {
        int block = pos / bs, end = t->len < (block + 1) * bs ? t->len : (block + 1) * bs;
        int64_t row = row_of(c, t, pos, dim), ahead = ahead_of(c, t, block, dim);
        for (; pos + 8 <= end; pos += 8, row += 8 * step) {
            vf lanes[MAX_TASK_QUERIES][8];
            float sums[8];
            for (int j = 0; j < 8; j++) dot_lanes(c, t, row + j * step, ahead, dim, kv, qv, &lanes[0][j], 8);
            for (int q = 0; q < queries; q++) {
                sum8(lanes[q], sums);
                for (int j = 0; j < 8; j++) {
                    scores[q * span + pos - t->start + j] = sums[j];
                    top[q] = sums[j] > top[q] ? sums[j] : top[q];
                }
            }
        }
        for (; pos < end; pos++, row += step) {
            vf lanes[MAX_TASK_QUERIES];
            dot_lanes(c, t, row, ahead, dim, kv, qv, lanes, 1);
            for (int q = 0; q < queries; q++) {
                float score = hsum(lanes[q]);
                scores[q * span + pos - t->start] = score;
                top[q] = score > top[q] ? score : top[q];
            }
        }
    }
}

/* acc[q] += p[q, t] * v_t over positions [start, len), in position order. */
INLINE void weigh_values(const Call *c, const Task *t, int dim, int kv, const float *probs, vf acc[][MAX_VECS]) {
    int nv = dim / LANES, span = t->len - t->start, bs = c->block_size, step = c->kv_heads * dim;
    for (int pos = t->start; pos < t->len;) {
        int block = pos / bs, end = t->len < (block + 1) * bs ? t->len : (block + 1) * bs;
        int64_t row = row_of(c, t, pos, dim), ahead = ahead_of(c, t, block, dim);
        for (; pos < end; pos++, row += step) {
            prefetch_row(c->value_cache, row + ahead, t->heads * dim, kv);
            for (int h = 0; h < t->heads; h++) {
                vf v[MAX_VECS];
                for (int i = 0; i < nv; i++) v[i] = load_vec(c->value_cache, row + h * dim + i * LANES, kv);
                for (int g = 0, q = h * t->group; g < t->group; g++, q++) {
                    float p = probs[q * span + pos - t->start];
                    for (int i = 0; i < nv; i++) acc[q][i] += p * v[i];
                }
            }
        }
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

/* One task; `scores` has room for its queries * span floats. `bf16`: the query and output type, `kv`: the cache's. */
INLINE void attend(const Call *c, Task *t, int dim, int bf16, int kv, float *scores) {
    int nv = dim / LANES, queries = t->heads * t->group, span = t->len - t->start;
    int64_t head0 = ((int64_t)t->b * c->heads + (int64_t)t->kvh * t->group) * dim;
    vf qv[MAX_TASK_QUERIES][MAX_VECS], acc[MAX_TASK_QUERIES][MAX_VECS];
    float top[MAX_TASK_QUERIES], total[MAX_TASK_QUERIES];
    for (int q = 0; q < queries; q++) {
        top[q] = -INFINITY;
        for (int i = 0; i < nv; i++) {
            qv[q][i] = load_vec(c->query, head0 + q * dim + i * LANES, bf16) * c->scale;
            acc[q][i] = (vf){0};
        }
    }
    score_keys(c, t, dim, kv, qv, scores, top);
    for (int q = 0; q < queries; q++) total[q] = exponentiate(scores + q * span, span, top[q]);
    weigh_values(c, t, dim, kv, scores, acc);
    for (int q = 0; q < queries; q++)
        for (int i = 0; i < nv; i++) store_vec(c->out, head0 + q * dim + i * LANES, acc[q][i] / total[q], bf16);
}

/* kv heads per task: all of a request's (up to MAX_TASK_QUERIES query heads), whose rows lie side by side in the
 * cache, so a task reads whole rows; fewer when that leaves under 4 tasks a thread (small batches). Every query
 * head gets the same numbers either way. */
INLINE int heads_per_task(int batch, int kv_heads, int group, int num_threads) {
    int heads = kv_heads < MAX_TASK_QUERIES / group ? kv_heads : MAX_TASK_QUERIES / group;
    while (heads > 1 && (int64_t)batch * ((kv_heads + heads - 1) / heads) < 4 * num_threads) heads--;
    return heads;
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
        int per_task = heads_per_task(batch, kv_heads, group, num_threads);                                  \
        int chunks = (kv_heads + per_task - 1) / per_task;                                                   \
        _Pragma("omp parallel for collapse(2) schedule(dynamic, 1) num_threads(num_threads)")                \
        for (int b = 0; b < batch; b++)                                                                      \
            for (int chunk = 0; chunk < chunks; chunk++) {                                                   \
                int len = seq_lens[b], kvh = chunk * per_task;                                               \
                if (len <= 0) continue;                                                                      \
                Task t = {b, kvh, kv_heads - kvh < per_task ? kv_heads - kvh : per_task, group,              \
                          window > 0 && len > window ? len - window : 0, len,                                \
                          block_tables + (int64_t)b * table_width};                                          \
                float *scores = malloc(sizeof(float) * t.heads * group * (len - t.start));                   \
                if (scores) attend(&c, &t, DIM, BF16, KV, scores);                                           \
                else {                                                                                       \
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
