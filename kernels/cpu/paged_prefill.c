/* Paged prefill attention on CPUs: every prompt chunk of a step against its request's cached context, in one call.
 *
 * A chunk of q_len tokens of request i sits at positions seq_len - q_len .. seq_len - 1 and sees keys at positions
 * <= its own (and > its own - window with a sliding window). For one kv head its query rows are (token, head of
 * the group) pairs; a task takes up to TASK_ROWS of them and walks the context in 16-key pieces, oldest first,
 * with an online softmax (running max and sum per row, output rescaled as the max grows):
 *   - the piece's keys are transposed once into kt [head_dim][16], shared by all the task's rows;
 *   - rows go TILE_ROWS at a time: scores [rows][16] = q . kt (a register tile of 6 x 16 floats), the mask, then
 *     out[rows][head_dim] = out * rescale + p . v, 16 output columns at a time (again 6 x 16 accumulators).
 * Everything accumulates in fp32 whatever the element type. Tasks (request, kv head, row range) are spread over
 * OpenMP threads (torch's runtime, as in the other kernels).
 *
 * Layouts (contiguous): query/out [T, H, D] (all the step's tokens; chunks at query_starts), caches
 * [num_blocks, block_size, Hkv, D], block_tables [num_requests][table_stride] int32, query_starts
 * [num_requests + 1] int32, seq_lens [num_requests] int32. block_size and D multiples of 16, D <= MAX_HEAD_DIM.
 * Entry points: paged_prefill_{bf16,f32}. Returns 0, 1 on unsupported sizes, 2 when out of memory.
 */
#include <stdlib.h>

#include "vec.h"

#define KEYS 16 /* keys per piece */
#define KV (KEYS / LANES) /* vectors per piece row: 2 on AVX2, 1 with AVX-512 */
#define TILE_ROWS 6
#define TASK_ROWS 96
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

typedef struct { /* one task's running state, rows relative to row0 */
    float q[TASK_ROWS][MAX_HEAD_DIM], acc[TASK_ROWS][MAX_HEAD_DIM], max[TASK_ROWS], sum[TASK_ROWS];
    int pos[TASK_ROWS];
    float kt[MAX_HEAD_DIM][KEYS];
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

/* Scores of `rows` (a constant at the call site) rows against the piece: [rows][KV] vectors. */
INLINE void scores(const State *s, int first, int rows, int head_dim, vf out[][KV]) {
    vf acc[TILE_ROWS][KV];
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < KV; i++) acc[r][i] = (vf){0};
    for (int d = 0; d < head_dim; d++) {
        vf k[KV];
        for (int i = 0; i < KV; i++) k[i] = load_vec(s->kt[d], i * LANES, 0);
        for (int r = 0; r < rows; r++) {
            float q = s->q[first + r][d];
            for (int i = 0; i < KV; i++) acc[r][i] += q * k[i];
        }
    }
    for (int r = 0; r < rows; r++)
        for (int i = 0; i < KV; i++) out[r][i] = acc[r][i];
}

/* acc[rows] = acc * rescale + probs . values over the piece's `valid` keys, KEYS columns at a time. */
INLINE void accumulate(const Params *p, State *s, int first, int rows, const float *probs, const float *rescale,
                       const int64_t *value_at, int valid, int bf16) {
    for (int c = 0; c < p->head_dim; c += KEYS) {
        vf acc[TILE_ROWS][KV];
        for (int r = 0; r < rows; r++)
            for (int i = 0; i < KV; i++) acc[r][i] = load_vec(s->acc[first + r], c + i * LANES, 0) * rescale[r];
        for (int j = 0; j < valid; j++) {
            vf v[KV];
            for (int i = 0; i < KV; i++) v[i] = load_vec(p->value_cache, value_at[j] + c + i * LANES, bf16);
            for (int r = 0; r < rows; r++) {
                float prob = probs[r * KEYS + j];
                for (int i = 0; i < KV; i++) acc[r][i] += prob * v[i];
            }
        }
        for (int r = 0; r < rows; r++)
            for (int i = 0; i < KV; i++) store_vec(s->acc[first + r], c + i * LANES, acc[r][i], 0);
    }
}

/* One tile of rows against the piece starting at key `start` (`valid` keys, `value_at` their value offsets). */
INLINE void tile(const Params *p, State *s, int first, int rows, int start, int valid, const int64_t *value_at,
                 int bf16) {
    vf sc[TILE_ROWS][KV];
    float probs[TILE_ROWS * KEYS], rescale[TILE_ROWS];
    scores(s, first, rows, p->head_dim, sc);
    int32_t positions[KEYS];
    for (int j = 0; j < KEYS; j++) positions[j] = start + j;
    vi key_pos[KV];
    memcpy(key_pos, positions, sizeof key_pos);
    for (int r = 0; r < rows; r++) {
        int pos = s->pos[first + r];
        vi hidden[KV];
        vf x[KV];
        float piece_max = -INFINITY;
        for (int i = 0; i < KV; i++) {
            hidden[i] = (key_pos[i] > pos) | (key_pos[i] >= start + valid);
            if (p->window > 0) hidden[i] |= key_pos[i] <= pos - p->window;
            x[i] = (vf)(((vi)sc[r][i] & ~hidden[i]) | ((vi)((vf){0} - INFINITY) & hidden[i]));
            for (int j = 0; j < LANES; j++) piece_max = x[i][j] > piece_max ? x[i][j] : piece_max;
        }
        float old = s->max[first + r], max = piece_max > old ? piece_max : old;
        if (max == -INFINITY) { /* nothing visible yet: leave the row as it is */
            rescale[r] = 1.0f;
            for (int j = 0; j < KEYS; j++) probs[r * KEYS + j] = 0.0f;
            continue;
        }
        rescale[r] = old == -INFINITY ? 0.0f : expf(old - max);
        s->max[first + r] = max;
        vf total = (vf){0};
        for (int i = 0; i < KV; i++) {
            vf e = (vf)((vi)exp_nonpositive(x[i] - max) & ~hidden[i]);
            total += e;
            memcpy(probs + r * KEYS + i * LANES, &e, sizeof e);
        }
        s->sum[first + r] = s->sum[first + r] * rescale[r] + hsum(total);
    }
    accumulate(p, s, first, rows, probs, rescale, value_at, valid, bf16);
}

INLINE void run_task(const Params *p, Task t, State *s, int bf16) {
    const int group = p->num_heads / p->num_kv_heads, d = p->head_dim;
    const int q_len = p->query_starts[t.req + 1] - p->query_starts[t.req], seq_len = p->seq_lens[t.req];
    const int rows = t.row1 - t.row0;
    for (int r = 0; r < rows; r++) {
        int64_t at = row_offset(p, t, r, group);
        for (int c = 0; c < d; c++) s->q[r][c] = load_scalar(p->query, at + c, bf16) * p->scale;
        memset(s->acc[r], 0, sizeof(float) * d);
        s->max[r] = -INFINITY;
        s->sum[r] = 0.0f;
        s->pos[r] = seq_len - q_len + (t.row0 + r) / group;
    }
    int first_key = p->window > 0 ? s->pos[0] - p->window + 1 : 0;
    first_key = first_key > 0 ? first_key - first_key % KEYS : 0;
    const int last_key = s->pos[rows - 1]; /* rows ascend by position */
    int64_t value_at[KEYS];
    for (int start = first_key; start <= last_key; start += KEYS) {
        int valid = seq_len - start < KEYS ? seq_len - start : KEYS;
        for (int j = 0; j < valid; j++) {
            int64_t at = cache_index(p, t.req, start + j, t.kv_head);
            value_at[j] = at;
            for (int c = 0; c < d; c++) s->kt[c][j] = load_scalar(p->key_cache, at + c, bf16);
        }
        for (int j = valid; j < KEYS; j++)
            for (int c = 0; c < d; c++) s->kt[c][j] = 0.0f;
        int r = 0;
        while (r < rows && s->pos[r] < start) r++; /* rows before the piece see none of it */
        r -= r % TILE_ROWS; /* keep the tiles aligned (a hidden row is masked anyway) */
        for (; r < rows; r += TILE_ROWS) {
            switch (rows - r < TILE_ROWS ? rows - r : TILE_ROWS) { /* constant counts keep tiles in registers */
            case 1: tile(p, s, r, 1, start, valid, value_at, bf16); break;
            case 2: tile(p, s, r, 2, start, valid, value_at, bf16); break;
            case 3: tile(p, s, r, 3, start, valid, value_at, bf16); break;
            case 4: tile(p, s, r, 4, start, valid, value_at, bf16); break;
            case 5: tile(p, s, r, 5, start, valid, value_at, bf16); break;
            default: tile(p, s, r, TILE_ROWS, start, valid, value_at, bf16); break;
            }
        }
    }
    for (int r = 0; r < rows; r++) {
        int64_t at = row_offset(p, t, r, group);
        float inverse = 1.0f / s->sum[r];
        for (int c = 0; c < d; c += LANES) store_vec(p->out, at + c, load_vec(s->acc[r], c, 0) * inverse, bf16);
    }
}

INLINE int run(Params *p, int num_requests, int num_threads, int bf16) {
    if (p->head_dim % LANES || p->head_dim > MAX_HEAD_DIM || p->block_size % KEYS || p->num_kv_heads < 1 ||
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
    for (int i = 0; i < num_requests; i++) {
        int rows = (p->query_starts[i + 1] - p->query_starts[i]) * group;
        for (int h = 0; h < p->num_kv_heads; h++)
            for (int r = 0; r < rows; r += TASK_ROWS)
                tasks[n++] = (Task){i, h, r, r + TASK_ROWS < rows ? r + TASK_ROWS : rows};
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
            if (s) run_task(p, tasks[k], s, bf16);
        free(s);
    }
    free(tasks);
    return failed;
}

#define ENTRY(NAME, BF16)                                                                                      \
    int NAME(const void *query, const void *key_cache, const void *value_cache, const int32_t *block_tables,  \
             int table_stride, const int32_t *query_starts, const int32_t *seq_lens, void *out,              \
             int num_requests, int num_heads, int num_kv_heads, int head_dim, int block_size, float scale,   \
             int window, int num_threads) {                                                                  \
        Params p = {query, key_cache, value_cache, block_tables, query_starts, seq_lens, out, table_stride,   \
                    num_heads, num_kv_heads, head_dim, block_size, window, scale};                           \
        return run(&p, num_requests, num_threads, BF16);                                                         \
    }

ENTRY(paged_prefill_bf16, 1)
ENTRY(paged_prefill_f32, 0)
