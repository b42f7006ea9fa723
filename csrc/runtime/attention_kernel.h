/* Paged attention over float32 data on the host (attention_kernel.c). */
#ifndef TORCH_PJRT_ATTENTION_KERNEL_H
#define TORCH_PJRT_ATTENTION_KERNEL_H
#include <stdint.h>

typedef struct {
  const float *query;          /* [T, heads, head_size] */
  const float *cache;          /* [nslots, kv_heads, 2 * head_size]: keys, then values */
  const int64_t *context_slots; /* [R, S]: cache slot of each position of request r */
  const int64_t *query_index;  /* [R, Q]: token of each (request, query row) */
  const int64_t *query_pos;    /* [R, Q]: its position; < 0: a padding row */
  int64_t T, nslots, R, S, Q, heads, kv_heads, head_size;
  float scale, soft_cap;       /* soft_cap > 0: cap * tanh(score / cap) */
  int64_t window;              /* > 0: a query at p sees p - window + 1 .. p */
} pj_paged_attention_args_t;

/* out [R * Q, heads * head_size]: each grid row's attention output (zeros for padding rows).
 * Returns 0, or -1 when scratch memory could not be allocated. */
int pj_paged_attention_f32(const pj_paged_attention_args_t *args, float *out);

#endif
