/* Paged attention over float32 data on the host: the core of tpu::paged_attention
 * (csrc/ops/paged_attention.c states the op's contract) for programs on the CPU plugin, called
 * as an XLA FFI custom call (ffi_kernels.c). XLA's CPU code for the same computation (a row
 * gather of every request's context, batched [Q*G, D] x [D, S] products of a few rows, row
 * reductions) costs about 0.5 ms per layer for 8 decoding requests of 128 tokens and grows to
 * 3 ms at 512; here each context row is read once, straight from the cache, per query row.
 *
 * Invariants kept from the XLA form: a query at position p sees key positions s <= p (and
 * p - s < window when window > 0); a padding row (p < 0) gives zeros, never NaN; positions past
 * a query's own are never read, so whatever their slots hold cannot reach the output. Indices
 * out of range are clamped, as XLA's gather clamps them (the lowering reports them as errors
 * through the device-side index checks). */
#pragma GCC optimize("O3") /* lets GCC vectorize the head_size loops below */
#include <math.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "attention_kernel.h"
#include "small_gemm.h"

static int64_t clamp(int64_t v, int64_t hi) { return v < 0 ? 0 : (v >= hi ? hi - 1 : v); }

/* Sixteen partial sums, so the loop vectorizes without reassociating float adds. */
static inline __attribute__((always_inline)) float dot(const float *a, const float *b,
                                                       int64_t n) {
  float acc[16] = {0}, s = 0;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    for (int l = 0; l < 16; l++) acc[l] += a[i + l] * b[i + l];
  for (; i < n; i++) s += a[i] * b[i];
  for (int l = 0; l < 16; l++) s += acc[l];
  return s;
}

/* e^x for the softmax's x <= 0 (a score minus its row's maximum), in a form GCC vectorizes
 * (libm's expf is a call per element: it was most of a decode layer's time). e^x = 2^k * e^r
 * with k = round(x / ln 2) and |r| <= ln 2 / 2, e^r by its Taylor series to r^7 (truncation
 * error below 6e-9 relative, under float32's rounding); ln 2 in two parts keeps r exact.
 * Below -87 (where 2^k leaves float32's normal range) the result is 0, as the softmax's
 * weights of such scores are anyway (expf gives at most 1.6e-38 there). */
static inline __attribute__((always_inline)) float exp_nonpositive(float x) {
  const float ln2_hi = 0.693359375f, ln2_lo = -2.12194440e-4f;
  const int below = x < -87.0f;
  x = below ? 0.0f : x;
  const float kf = floorf(x * 1.44269504f + 0.5f);
  const float r = (x - kf * ln2_hi) - kf * ln2_lo;
  float p = 1.0f / 5040;
  p = p * r + 1.0f / 720;
  p = p * r + 1.0f / 120;
  p = p * r + 1.0f / 24;
  p = p * r + 1.0f / 6;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  union { int32_t i; float f; } scale = {.i = ((int32_t)kf + 127) << 23};
  return below ? 0.0f : p * scale.f;
}

/* Rows [row0, row1) of the grid (row = r * Q + j), with `sc` scratch for one row's scores
 * ([H][S]). One copy per instruction set, chosen at load time (GCC's ifunc): the head_size loops
 * run 16 lanes wide with AVX-512, 8 with AVX2, 4 with the x86-64 baseline. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && !defined(__SANITIZE_ADDRESS__)
__attribute__((target_clones("avx512f", "avx2", "default")))
#endif
static void attend_rows(const pj_paged_attention_args_t *a, float *out, float *sc, int64_t row0,
                        int64_t row1) {
  const int64_t H = a->heads, G = H / a->kv_heads, D = a->head_size, W = a->kv_heads * 2 * D;
  for (int64_t row = row0; row < row1; row++) {
    const int64_t r = row / a->Q, p = a->query_pos[row];
    const int64_t *slots = a->context_slots + r * a->S;
    float *o = out + row * H * D;
    memset(o, 0, sizeof(float) * (size_t)(H * D));
    if (p < 0 || a->T == 0 || a->nslots == 0) continue; /* padding row: zeros */
    const float *q = a->query + clamp(a->query_index[row], a->T) * H * D;
    int64_t hi = p < a->S - 1 ? p : a->S - 1, lo = 0;
    if (a->window > 0 && p - a->window + 1 > lo) lo = p - a->window + 1;
    const int64_t n = hi - lo + 1;
    if (n <= 0) continue;
    /* Position-major: each context row (every kv head's key and value, contiguous in the
     * cache) is read in one sweep, the next rows prefetched (slots are indirect, so the
     * hardware cannot guess them). */
    for (int64_t s = lo; s <= hi; s++) {
      if (s + 4 <= hi) __builtin_prefetch(a->cache + clamp(slots[s + 4], a->nslots) * W);
      const float *cr = a->cache + clamp(slots[s], a->nslots) * W;
      for (int64_t h = 0; h < H; h++) {
        float v = dot(q + h * D, cr + (h / G) * 2 * D, D) * a->scale;
        if (a->soft_cap > 0) v = a->soft_cap * tanhf(v / a->soft_cap);
        sc[h * n + (s - lo)] = v;
      }
    }
    for (int64_t h = 0; h < H; h++) {
      float *e = sc + h * n, mx = -INFINITY, sum = 0;
      for (int64_t i = 0; i < n; i++) mx = e[i] > mx ? e[i] : mx;
      if (mx == -INFINITY) mx = 0;
      for (int64_t i = 0; i < n; i++) e[i] = exp_nonpositive(e[i] - mx);
      float part[16] = {0};  /* partial sums: the loop vectorizes without reassociating */
      int64_t i = 0;
      for (; i + 16 <= n; i += 16)
        for (int l = 0; l < 16; l++) part[l] += e[i + l];
      for (; i < n; i++) sum += e[i];
      for (int l = 0; l < 16; l++) sum += part[l];
      float inv = sum == 0 ? 1.0f : 1.0f / sum;
      for (int64_t i = 0; i < n; i++) e[i] *= inv;
    }
    for (int64_t s = lo; s <= hi; s++) {
      if (s + 4 <= hi) __builtin_prefetch(a->cache + clamp(slots[s + 4], a->nslots) * W + D);
      const float *cr = a->cache + clamp(slots[s], a->nslots) * W;
      for (int64_t h = 0; h < H; h++) {
        const float w = sc[h * n + (s - lo)], *v = cr + (h / G) * 2 * D + D;
        float *oh = o + h * D;
        for (int64_t d = 0; d < D; d++) oh[d] += w * v[d];
      }
    }
  }
}

typedef struct {
  const pj_paged_attention_args_t *a;
  float *out;
  atomic_int failed; /* a range could not allocate its scratch */
} attend_job_t;

static void attend_range(void *ctx, int64_t row0, int64_t row1) {
  attend_job_t *job = ctx;
  const pj_paged_attention_args_t *a = job->a;
  float *sc = malloc(sizeof(float) * (size_t)(a->heads * (a->S > 0 ? a->S : 1)));
  if (!sc) {
    atomic_store(&job->failed, 1);
    return;
  }
  attend_rows(a, job->out, sc, row0, row1);
  free(sc);
}

/* Grid rows are independent: they run on the product kernels' thread pool (small_gemm.h) when
 * there is enough work to repay a wake-up (a decode layer of the ~100M model: 8 rows of 12 heads
 * over ~100 positions each), otherwise on the calling thread. */
#define ATTENTION_MT_MIN_WORK (1 << 18) /* rows * positions * heads * head_size */

int pj_paged_attention_f32(const pj_paged_attention_args_t *a, float *out) {
  const int64_t rows = a->R * a->Q;
  attend_job_t job = {.a = a, .out = out};
  atomic_init(&job.failed, 0);
  if ((double)rows * (double)a->S * (double)a->heads * (double)a->head_size >= ATTENTION_MT_MIN_WORK)
    pj_host_parallel_for(attend_range, &job, rows, 1);
  else
    attend_range(&job, 0, rows);
  return atomic_load(&job.failed) ? -1 : 0;
}
