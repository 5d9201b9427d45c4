/* Paged prefill attention on CPUs: every prompt chunk of a step against its request's cached context, in one call.
 *
 * A chunk of q_len tokens of request i sits at positions seq_len - q_len .. seq_len - 1 and sees keys at positions
 * <= its own (and > its own - window with a sliding window). For one kv head its query rows are (token, head of
 * the group) pairs; a task takes up to TASK_ROWS of them (a 64-token chunk of a GQA group of 3 is one task, so its
 * context is read once) and walks the context in pieces of PIECE keys, oldest first, with an online softmax. The
 * task's rows are innermost everywhere, so that each step is a register-tiled product with vectors over rows:
 *   - the rows' scaled queries transposed once: qt [head_dim][rows];
 *   - scores st [PIECE][rows] = keys . qt, read straight from the cache's fp32 key rows (16-bit pieces widened),
 *     6 keys x 16 rows of accumulators (12 AVX2 registers) per tile;
 *   - the mask (only in pieces that reach the rows' own positions), running max, rescale, sum and numerators, all
 *     as vectors over rows;
 *   - ot [head_dim][rows] = ot * rescale + values^T . st, 6 head dims x 16 rows per tile.
 * A row's result depends only on its own query and keys, taken in the same order whatever the chunking, so a
 * prompt and its uncached tail after a prefix-cache hit give the same numbers. Tasks (request, kv head, row range)
 * are spread over OpenMP threads (torch's runtime, as in the other kernels). Measurements: docs/cpu.md.
 *
 * Where the build machine has AVX512-BF16 (Zen 4, Sapphire Rapids), bf16 steps multiply in bf16 pairs instead
 * (vdpbf16ps: two products a lane into an fp32 sum, twice the fp32 FMA rate): scores pair head dims of the query
 * and key rows as they lie in the cache; outputs pair keys, with the softmax numerators rounded to bf16 (as a
 * bf16 flash attention does) and the piece's values interleaved by key pairs. Scores, maxima, sums and outputs
 * stay fp32, and the pairs are fixed key positions (pieces start at even keys), so chunking still changes nothing.
 *
 * Layouts (contiguous): query/out [T, H, D] (all the step's tokens; chunks at query_starts), caches
 * [num_blocks, block_size, Hkv, D], block_tables [num_requests][table_stride] int32, query_starts
 * [num_requests + 1] int32, seq_lens [num_requests] int32. block_size and D multiples of 16, D <= MAX_HEAD_DIM.
 * Entry points: paged_prefill_{bf16,f32} (element type of query, output and cache) and paged_prefill_f32_kvf16
 * (fp32 query and output over an fp16 cache). Returns 0, 1 on unsupported sizes, 2 when out of memory.
 */
#include <stdlib.h>

#include "vec.h"

#if defined(__AVX512BF16__) && LANES == 16
#include <immintrin.h>
#define PAIR_DOTS 1 /* bf16 x bf16 steps multiply in pairs (vdpbf16ps) */
#else
#define PAIR_DOTS 0
#endif

#define PIECE 96 /* keys per piece */
#if PAIR_DOTS
#define TASK_ROWS 256 /* rows per task, a multiple of LANES: a 66-token chunk x 3 heads of a group is one (12% faster
                       * than two tasks of 99 rows on Zen 4) */
#else
#define TASK_ROWS 192 /* rows per task, a multiple of LANES (a chunk of 64 tokens x 3 heads of a group is one) */
#endif
#define TILE_A 6 /* register tiles: 6 keys (or head dims) x TILE_VECS row vectors */
#define TILE_VECS 2
#define MAX_HEAD_DIM 128

typedef struct {
    const void *query, *key_cache, *value_cache;
    const int32_t *block_tables, *query_starts, *seq_lens;
    void *out;
    int table_stride, num_heads, num_kv_heads, head_dim, block_size, window;
    float scale;
} Params;

typedef struct {
    int req, kv_head, row0, row1; /* rows [row0, row1) of the chunk's q_len * group rows */
} Task;

typedef struct { /* one task's state: rows innermost, `width` = rows rounded up to LANES */
    float qt[MAX_HEAD_DIM * TASK_ROWS], ot[MAX_HEAD_DIM * TASK_ROWS], st[PIECE * TASK_ROWS];
    float keys[PIECE * MAX_HEAD_DIM], values[PIECE * MAX_HEAD_DIM]; /* 16-bit pieces widened */
    const float *key_rows[PIECE], *value_rows[PIECE]; /* the piece's rows: in the cache (fp32) or in keys/values */
    float max[TASK_ROWS], sum[TASK_ROWS], pos[TASK_ROWS]; /* pos: the row's position, as a float for vector compares */
#if PAIR_DOTS /* bf16 pairs as 32-bit words: query [head_dim / 2][rows], numerators [PIECE / 2][rows], values
               * [PIECE / 2][head_dim] (keys k and k + 1 of the piece in word k / 2) */
    uint32_t qp[MAX_HEAD_DIM / 2 * TASK_ROWS], sp[PIECE / 2 * TASK_ROWS], vp[PIECE / 2 * MAX_HEAD_DIM];
    const uint32_t *key_words[PIECE]; /* the piece's key rows in the cache, as pair words */
#endif
} State;

INLINE int64_t cache_index(const Params *p, int req, int key, int kv_head) {
    int block = p->block_tables[(int64_t)req * p->table_stride + key / p->block_size];
    return (((int64_t)block * p->block_size + key % p->block_size) * p->num_kv_heads + kv_head) * p->head_dim;
}

/* Where row r of task t (token r / group, head r % group of the kv head) sits in query and out. */
INLINE int64_t row_offset(const Params *p, Task t, int r, int group) {
    int token = (t.row0 + r) / group, head = t.kv_head * group + (t.row0 + r) % group;
    return ((int64_t)(p->query_starts[t.req] + token) * p->num_heads + head) * p->head_dim;
}

/* c[tk][vecs row vectors] (+)= sum over d of A(k, d) * b[d][rows], b [*][width], where A comes from the piece's key
 * (or value) rows: A(k, d) = rows[k][d] for scores (keys by head dim), rows[d][k] for outputs (head dims by keys,
 * `by_key` = 0). `tk`, `vecs` and `by_key` are constants at each call site. */
INLINE void tile(const float *const *rows, int k0, const float *b, int width, int depth, float *c, int accumulate,
                 int tk, int vecs, int by_key) {
    vf acc[TILE_A][TILE_VECS];
    for (int k = 0; k < tk; k++)
        for (int v = 0; v < vecs; v++)
            acc[k][v] = accumulate ? load_vec(c, (int64_t)k * width + v * LANES, 0) : (vf){0};
    for (int d = 0; d < depth; d++) {
        vf bv[TILE_VECS];
        for (int v = 0; v < vecs; v++) bv[v] = load_vec(b, (int64_t)d * width + v * LANES, 0);
        const float *row = by_key ? NULL : rows[d] + k0;
        for (int k = 0; k < tk; k++) {
            const float x = by_key ? rows[k0 + k][d] : row[k];
            for (int v = 0; v < vecs; v++) acc[k][v] += x * bv[v];
        }
    }
    for (int k = 0; k < tk; k++)
        for (int v = 0; v < vecs; v++) store_vec(c, (int64_t)k * width + v * LANES, acc[k][v], 0);
}

/* For every tile of the product c [rows_a][width] (TILE_A rows of A by up to TILE_VECS row vectors, smaller at the
 * ends): TILE(K, V), with k0 and r0 (the tile's first A row and row lane) in scope and K, V constants, so that
 * each tile size is its own fully unrolled register tile (12 accumulators on AVX2). */
#define TILE_OF_SIZE(TILE, K) \
    if (vecs == 1) TILE(K, 1); \
    else TILE(K, TILE_VECS)
#define FOR_EACH_TILE(rows_a, width, TILE)                                                                    \
    for (int r0 = 0; r0 < (width); r0 += TILE_VECS * LANES) {                                                 \
        const int vecs = ((width) - r0) / LANES < TILE_VECS ? ((width) - r0) / LANES : TILE_VECS;             \
        for (int k0 = 0; k0 < (rows_a); k0 += TILE_A) {                                                       \
            switch ((rows_a) - k0 < TILE_A ? (rows_a) - k0 : TILE_A) {                                        \
            case 1: TILE_OF_SIZE(TILE, 1); break;                                                             \
            case 2: TILE_OF_SIZE(TILE, 2); break;                                                             \
            case 3: TILE_OF_SIZE(TILE, 3); break;                                                             \
            case 4: TILE_OF_SIZE(TILE, 4); break;                                                             \
            case 5: TILE_OF_SIZE(TILE, 5); break;                                                             \
            default: TILE_OF_SIZE(TILE, TILE_A);                                                              \
            }                                                                                                 \
        }                                                                                                     \
    }

/* c [rows_a][width] (+)= A [rows_a][depth] . b [depth][width] (A as in tile()). */
INLINE void product(const float *const *rows, int by_key, int rows_a, const float *b, int width, int depth, float *c,
                    int accumulate) {
#define FP32_TILE(K, V) tile(rows, k0, b + r0, width, depth, c + (int64_t)k0 * width + r0, accumulate, K, V, by_key)
    FOR_EACH_TILE(rows_a, width, FP32_TILE)
#undef FP32_TILE
}

/* Row pointers of the piece's keys and values [start, start + count) for the task's kv head: into the cache for
 * fp32, else into s->keys and s->values ([PIECE][head_dim]) after widening (`kv`: the cache type), a block at a
 * time. */
INLINE void gather(const Params *p, Task t, State *s, int start, int count, int kv) {
    const int d = p->head_dim, bs = p->block_size;
    for (int j = 0; j < count;) {
        const int key = start + j, n = bs - key % bs < count - j ? bs - key % bs : count - j;
        const int64_t at = cache_index(p, t.req, key, t.kv_head), stride = (int64_t)p->num_kv_heads * d;
        for (int u = 0; u < n; u++, j++) {
            if (!kv) {
                s->key_rows[j] = (const float *)p->key_cache + at + u * stride;
                s->value_rows[j] = (const float *)p->value_cache + at + u * stride;
                continue;
            }
            for (int c = 0; c < d; c += LANES) {
                store_vec(s->keys, j * d + c, load_vec(p->key_cache, at + u * stride + c, kv), 0);
                store_vec(s->values, j * d + c, load_vec(p->value_cache, at + u * stride + c, kv), 0);
            }
            s->key_rows[j] = s->keys + j * d;
            s->value_rows[j] = s->values + j * d;
        }
    }
}

/* Online softmax over the piece's scores st [PIECE][width] (keys [start, start + count)): mask where needed, new
 * max per row, rescale of sum and ot, numerators in place. */
INLINE void softmax_piece(const Params *p, State *s, int width, int start, int count, int masked) {
    const int d = p->head_dim;
    for (int r = 0; r < width; r += LANES) {
        const vf pos = load_vec(s->pos, r, 0), minus_inf = (vf){0} - INFINITY;
        vf top = load_vec(s->max, r, 0);
        for (int j = 0; j < count; j++) {
            vf x = load_vec(s->st, (int64_t)j * width + r, 0);
            if (masked) {
                const float key = (float)(start + j);
                vi hidden = (vi)(key > pos);
                if (p->window > 0) hidden |= (vi)(key <= pos - (float)p->window);
                x = (vf)(((vi)x & ~hidden) | ((vi)minus_inf & hidden));
                store_vec(s->st, (int64_t)j * width + r, x, 0);
            }
            top = (vf)(((vi)x & (vi)(x > top)) | ((vi)top & ~(vi)(x > top)));
        }
        /* rows that saw no key yet keep max -inf: use 0 as the reference so that nothing becomes NaN */
        const vi none = (vi)(top == minus_inf);
        const vf ref = (vf)((vi)top & ~none), old = load_vec(s->max, r, 0);
        const vf rescale = (vf)((vi)exp_nonpositive(old - ref) & ~(vi)(old == minus_inf));
        vf total = (vf){0};
        for (int j = 0; j < count; j++) {
            vf x = load_vec(s->st, (int64_t)j * width + r, 0);
            vf e = (vf)((vi)exp_nonpositive(x - ref) & ~(vi)(x == minus_inf));
            store_vec(s->st, (int64_t)j * width + r, e, 0);
            total += e;
        }
        store_vec(s->max, r, top, 0);
        store_vec(s->sum, r, load_vec(s->sum, r, 0) * rescale + total, 0);
        for (int c = 0; c < d; c++) {
            const int64_t at = (int64_t)c * width + r;
            store_vec(s->ot, at, load_vec(s->ot, at, 0) * rescale, 0);
        }
    }
}

#if PAIR_DOTS
/* c[tk][vecs row vectors] = mult * (or +=) sum over pairs j of A(k, j) . b[j][rows] (b [*][width] pair words),
 * where A(k, j) is word j of key row k0 + k (`by_key`: scores) or word k0 + k of value pair j (`pairs` [j][stride]:
 * outputs). `tk`, `vecs` and `by_key` are constants at each call site. */
INLINE void pair_tile(const uint32_t *const *rows, const uint32_t *pairs, int stride, int k0, const uint32_t *b,
                      int width, int depth, float *c, int accumulate, float mult, int tk, int vecs, int by_key) {
    __m512 acc[TILE_A][TILE_VECS];
    for (int k = 0; k < tk; k++)
        for (int v = 0; v < vecs; v++)
            acc[k][v] = accumulate ? _mm512_loadu_ps(c + (int64_t)k * width + v * LANES) : _mm512_setzero_ps();
    for (int j = 0; j < depth; j++) {
        __m512bh bv[TILE_VECS];
        for (int v = 0; v < vecs; v++) bv[v] = (__m512bh)_mm512_loadu_si512(b + (int64_t)j * width + v * LANES);
        for (int k = 0; k < tk; k++) {
            const uint32_t word = by_key ? rows[k0 + k][j] : pairs[(int64_t)j * stride + k0 + k];
            const __m512bh x = (__m512bh)_mm512_set1_epi32((int)word);
            for (int v = 0; v < vecs; v++) acc[k][v] = _mm512_dpbf16_ps(acc[k][v], x, bv[v]);
        }
    }
    const __m512 m = _mm512_set1_ps(mult);
    for (int k = 0; k < tk; k++)
        for (int v = 0; v < vecs; v++)
            _mm512_storeu_ps(c + (int64_t)k * width + v * LANES, accumulate ? acc[k][v] : _mm512_mul_ps(acc[k][v], m));
}

/* c [rows_a][width] as pair_tile. */
INLINE void pair_product(const uint32_t *const *rows, const uint32_t *pairs, int stride, int by_key, int rows_a,
                         const uint32_t *b, int width, int depth, float *c, int accumulate, float mult) {
#define PAIR_TILE(K, V) pair_tile(rows, pairs, stride, k0, b + r0, width, depth, c + (int64_t)k0 * width + r0, \
                                  accumulate, mult, K, V, by_key)
    FOR_EACH_TILE(rows_a, width, PAIR_TILE)
#undef PAIR_TILE
}

/* Row r's query (bf16) -> its pair words qp[j][r], unscaled (the scale multiplies the fp32 scores). */
INLINE void pair_query_row(const Params *p, State *s, int64_t at, int r, int width) {
    const uint32_t *words = (const uint32_t *)((const uint16_t *)p->query + at);
    for (int j = 0; j < p->head_dim / 2; j++) s->qp[(int64_t)j * width + r] = words[j];
}

/* The piece's numerators st [count][width] -> bf16 pair words sp [(count + 1) / 2][width] (an odd count's last
 * partner is 0). */
INLINE void pair_numerators(State *s, int width, int count) {
    for (int j = 0; 2 * j < count; j++)
        for (int r = 0; r < width; r += LANES) {
            const vf low = load_vec(s->st, (int64_t)2 * j * width + r, 0);
            const vf high = 2 * j + 1 < count ? load_vec(s->st, (int64_t)(2 * j + 1) * width + r, 0) : (vf){0};
            const vu word = ((vu)round_vec(low, 1) >> 16) | ((vu)round_vec(high, 1) & 0xFFFF0000u);
            memcpy(s->sp + (int64_t)j * width + r, &word, sizeof word);
        }
}

/* The piece's key rows as pair words, and its value rows interleaved by key pairs into vp [j][head_dim] (key 2j's
 * value in the low half of word j, 2j + 1's in the high one, 0 past `count`). */
INLINE void pair_keys_values(const Params *p, Task t, State *s, int start, int count) {
    const int d = p->head_dim;
    const uint16_t *keys = p->key_cache, *values = p->value_cache;
    for (int k = 0; k < count; k++) {
        const int64_t at = cache_index(p, t.req, start + k, t.kv_head);
        s->key_words[k] = (const uint32_t *)(keys + at);
        const uint16_t *row = values + at;
        uint32_t *word = s->vp + (int64_t)(k / 2) * d;
        if (k % 2 == 0)
            for (int c = 0; c < d; c++) word[c] = row[c];
        else
            for (int c = 0; c < d; c++) word[c] |= (uint32_t)row[c] << 16;
    }
}

/* One piece in bf16 pairs: scores, online softmax, outputs (as the fp32 path, with pair dot products). */
INLINE void pair_piece(const Params *p, Task t, State *s, int width, int start, int count, int masked) {
    const int d = p->head_dim;
    pair_keys_values(p, t, s, start, count);
    pair_product(s->key_words, NULL, 0, 1, count, s->qp, width, d / 2, s->st, 0, p->scale); /* st = keys . q */
    softmax_piece(p, s, width, start, count, masked);
    pair_numerators(s, width, count);
    pair_product(NULL, s->vp, d, 0, d, s->sp, width, (count + 1) / 2, s->ot, 1, 1.0f); /* ot += values^T . st */
}
#endif

INLINE void run_task(const Params *p, Task t, State *s, int bf16, int kv) {
    const int group = p->num_heads / p->num_kv_heads, d = p->head_dim;
    const int q_len = p->query_starts[t.req + 1] - p->query_starts[t.req], seq_len = p->seq_lens[t.req];
    const int rows = t.row1 - t.row0, width = (rows + LANES - 1) / LANES * LANES;
    const int pairs = PAIR_DOTS && bf16 == 1 && kv == 1; /* bf16 query and cache: multiply in pairs */
    for (int r = 0; r < width; r++) {
        const int real = r < rows ? r : rows - 1; /* padding rows repeat the last one and are never stored */
        const int64_t at = row_offset(p, t, real, group);
#if PAIR_DOTS
        if (pairs) pair_query_row(p, s, at, r, width);
        else
#endif
            for (int c = 0; c < d; c++) s->qt[c * width + r] = load_scalar(p->query, at + c, bf16) * p->scale;
        for (int c = 0; c < d; c++) s->ot[c * width + r] = 0.0f;
        s->max[r] = -INFINITY;
        s->sum[r] = 0.0f;
        s->pos[r] = (float)(seq_len - q_len + (t.row0 + real) / group);
    }
    const int first_pos = seq_len - q_len + t.row0 / group, last_pos = seq_len - q_len + (t.row1 - 1) / group;
    int first_key = p->window > 0 ? first_pos - p->window + 1 : 0;
    first_key = first_key > 0 ? first_key : 0;
    first_key -= pairs ? first_key % 2 : 0; /* key pairs at even positions (the window mask hides the extra one) */
    for (int start = first_key; start <= last_pos; start += PIECE) {
        const int count = last_pos + 1 - start < PIECE ? last_pos + 1 - start : PIECE;
        const int masked = start + count - 1 > first_pos || (p->window > 0 && start <= last_pos - p->window);
#if PAIR_DOTS
        if (pairs) {
            pair_piece(p, t, s, width, start, count, masked);
            continue;
        }
#endif
        gather(p, t, s, start, count, kv);
        product(s->key_rows, 1, count, s->qt, width, d, s->st, 0); /* st = keys . qt */
        softmax_piece(p, s, width, start, count, masked);
        product(s->value_rows, 0, d, s->st, width, count, s->ot, 1); /* ot += values^T . st */
    }
    for (int r = 0; r < rows; r++) {
        const int64_t at = row_offset(p, t, r, group);
        const float inverse = 1.0f / s->sum[r];
        for (int c = 0; c < d; c++) store_scalar(p->out, at + c, s->ot[c * width + r] * inverse, bf16);
    }
}

INLINE int run(Params *p, int num_requests, int num_threads, int bf16, int kv) {
    if (p->head_dim % 16 || p->head_dim > MAX_HEAD_DIM || p->block_size % 16 || p->num_kv_heads < 1 ||
        p->num_heads % p->num_kv_heads)
        return 1;
    const int group = p->num_heads / p->num_kv_heads;
    int num_tasks = 0;
    for (int i = 0; i < num_requests; i++) {
        int rows = (p->query_starts[i + 1] - p->query_starts[i]) * group;
        num_tasks += p->num_kv_heads * ((rows + TASK_ROWS - 1) / TASK_ROWS);
    }
    Task *tasks = malloc(sizeof(Task) * (size_t)(num_tasks ? num_tasks : 1));
    if (!tasks) return 2;
    int n = 0;
    for (int i = 0; i < num_requests; i++) { /* rows split evenly: 198 rows are three tasks of 66 */
        int rows = (p->query_starts[i + 1] - p->query_starts[i]) * group, parts = (rows + TASK_ROWS - 1) / TASK_ROWS;
        for (int h = 0; h < p->num_kv_heads; h++)
            for (int k = 0; k < parts; k++)
                tasks[n++] = (Task){i, h, (int)((int64_t)rows * k / parts), (int)((int64_t)rows * (k + 1) / parts)};
    }
    int failed = 0;
#pragma omp parallel num_threads(num_threads)
    {
        State *s = aligned_alloc(64, (sizeof(State) + 63) / 64 * 64);
        if (!s) {
#pragma omp atomic write
            failed = 2;
        }
#pragma omp for schedule(dynamic, 1)
        for (int k = 0; k < num_tasks; k++)
            if (s) run_task(p, tasks[k], s, bf16, kv);
        free(s);
    }
    free(tasks);
    return failed;
}

#define ENTRY(NAME, BF16, KV)                                                                                  \
    int NAME(const void *query, const void *key_cache, const void *value_cache, const int32_t *block_tables,  \
             int table_stride, const int32_t *query_starts, const int32_t *seq_lens, void *out,              \
             int num_requests, int num_heads, int num_kv_heads, int head_dim, int block_size, float scale,   \
             int window, int num_threads) {                                                                  \
        Params p = {query, key_cache, value_cache, block_tables, query_starts, seq_lens, out, table_stride,   \
                    num_heads, num_kv_heads, head_dim, block_size, window, scale};                           \
        return run(&p, num_requests, num_threads, BF16, KV);                                                     \
    }

ENTRY(paged_prefill_bf16, 1, 1)
ENTRY(paged_prefill_f32, 0, 0)
ENTRY(paged_prefill_f32_kvf16, 0, F16)
