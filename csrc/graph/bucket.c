/* Size buckets (torch_pjrt/bucket.h): the rewrite of a qualifying call to its bucket, and the
 * trim of a padded storage back to its exact size. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "call_internal.h"
#include "torch_pjrt/bucket.h"
#include "torch_pjrt/metrics.h"
#include "torch_pjrt/runtime.h"

int64_t pj_bucket_numel(int64_t n) {
  if (n < 1 || n > PJ_BUCKET_MAX_NUMEL) return n;
  int64_t c = 16;
  while (c < n) c *= 2;
  return c;
}

static int64_t desc_numel(const pj_tensor_desc_t *d) {
  int64_t n = 1;
  for (int i = 0; i < d->rank; i++) n *= d->sizes[i];
  return n;
}

/* Row-major contiguous (a size-1 dimension's stride is free, as PyTorch's is_contiguous). */
static bool row_major(const pj_tensor_desc_t *d) {
  int64_t expect = 1;
  for (int i = d->rank - 1; i >= 0; i--) {
    if (d->sizes[i] != 1 && d->strides[i] != expect) return false;
    expect *= d->sizes[i];
  }
  return true;
}

/* Whether the call reduces over chosen dimensions (a "dim" argument that names some): then
 * only a rank-1 input keeps its meaning as [C]. */
static bool names_dims(const pj_call_t *c) {
  for (int a = 0; a < c->nargs; a++) {
    const pj_arg_t *g = &c->args[a];
    if (strcmp(g->name, "dim") != 0 || g->kind == PJ_ARG_NONE) continue;
    return !(g->kind == PJ_ARG_INTS && g->count == 0);
  }
  return false;
}

/* Whether d can become [C]: the whole of its storage, contiguous, from offset 0, in the
 * storage's own element type, with n elements (n < 0: the first such tensor sets n). A 0-d
 * value (a scalar, or a 0-d tensor read by broadcasting) stays as it is, and so do the 0-d
 * results of a reduction: *keep. */
static bool qualifies(const pj_call_t *c, const pj_tensor_desc_t *d, pj_shape_class_t cls,
                      bool is_out, int64_t *n, bool *keep) {
  *keep = d->rank < 0 || d->slot < 0 || (d->rank == 0 && (!is_out || cls == PJ_SHAPE_IDEMPOTENT));
  if (*keep) return true;
  if (d->rank == 0 || (is_out && cls == PJ_SHAPE_IDEMPOTENT)) return false;
  if (d->rank != 1 && (cls == PJ_SHAPE_PREFIX || (cls == PJ_SHAPE_IDEMPOTENT && names_dims(c))))
    return false;
  if (d->dyn_offset || d->offset != 0 || !row_major(d)) return false;
  const int64_t m = desc_numel(d);
  if (*n < 0) *n = m;
  if (m != *n) return false;
  const pj_slot_t *sl = &c->slots[d->slot];
  return sl->dtype == d->dtype &&
         sl->storage->nbytes == (size_t)m * pj_dtype_info(d->dtype)->itemsize;
}

static void to_bucket(pj_tensor_desc_t *d, int64_t cap) {
  d->rank = 1;
  d->sizes[0] = cap;
  d->strides[0] = 1;
}

/* Written by pj_bucket_set_enabled, read by every Strict call: an atomic, no lock. */
static atomic_bool enabled = true;
void pj_bucket_set_enabled(bool on) { atomic_store(&enabled, on); }
bool pj_bucket_enabled(void) { return atomic_load(&enabled); }

static bool rewrite(pj_call_t *c, pj_shape_class_t cls) {
  if (!atomic_load_explicit(&enabled, memory_order_relaxed)) return false;
  if ((cls != PJ_SHAPE_ELEMENTWISE && cls != PJ_SHAPE_PREFIX && cls != PJ_SHAPE_IDEMPOTENT) ||
      c->nout < 1)
    return false;
  const bool reduces = cls == PJ_SHAPE_IDEMPOTENT;
  if (reduces && c->nscalars >= PJ_CALL_MAX_SCALARS) return false;
  int64_t n = -1;
  bool keep;
  bool touched[PJ_CALL_MAX_SLOTS] = {false};
  /* the tensors of the arguments, then the destinations: every one qualifies, or none moves */
  for (int a = 0; a < c->nargs; a++) {
    const pj_arg_t *g = &c->args[a];
    if (g->kind != PJ_ARG_TENSOR && g->kind != PJ_ARG_TENSORS) continue;
    for (int i = 0; i < g->count; i++) {
      const pj_tensor_desc_t *d = &c->tensors[g->first + i];
      if (!qualifies(c, d, cls, false, &n, &keep)) return false;
      if (!keep) touched[d->slot] = true;
    }
  }
  for (int o = 0; o < c->nout; o++) {
    if (!qualifies(c, &c->outs[o], cls, true, &n, &keep)) return false;
    if (!keep) touched[c->outs[o].slot] = true;
  }
  /* n == cap is rewritten too: a [4, 16] tensor, or a reduction, then shares its bucket's
   * program with the sizes below it */
  if (n < 1 || n > PJ_BUCKET_MAX_NUMEL) return false;
  const int64_t cap = pj_bucket_numel(n);
  /* A storage the program reads must hold a buffer of the bucket (or be about to: pending,
   * with the capacity its recorded write gives it) or none yet (it is read as zeros of the
   * bucket's size); one it only writes gets one. */
  for (int s = 0; s < c->nslots; s++) {
    if (!touched[s] || !c->slots[s].read) continue;
    const pj_storage_t *st = c->slots[s].storage;
    const size_t want = (size_t)cap * pj_dtype_info(c->slots[s].dtype)->itemsize;
    if ((st->buf || st->pending) && pj_storage_next_capacity(st) != want) return false;
  }
  int count_scalar = -1; /* a reduction's inputs read n elements of their [C]: n is an argument */
  if (reduces) {
    count_scalar = c->nscalars++;
    c->scalars[count_scalar] = (pj_scalar_t){.dtype = PJ_I64, .i = n};
  }
  for (int t = 0; t < c->ntensors; t++) {
    pj_tensor_desc_t *d = &c->tensors[t];
    if (d->rank < 1 || d->slot < 0) continue;
    to_bucket(d, cap);
    if (reduces) {
      d->pad_repeats = true;
      d->numel_scalar = count_scalar;
    }
  }
  if (!reduces)
    for (int o = 0; o < c->nout; o++) to_bucket(&c->outs[o], cap);
  for (int s = 0; s < c->nslots; s++)
    if (touched[s]) c->slots[s].numel = cap;
  pj_metric_add(PJ_METRIC_BUCKET_CALLS, 1);
  return true;
}

bool pj_bucket_rewrite(pj_call_t *c) { return rewrite(c, pj_lowering_shape_class(c->op)); }

/* ---- trim ---- */

typedef struct {
  pj_dtype_t dtype;
  int64_t capacity, numel; /* elements */
} trim_t;

static pj_status_t *build_trim(void *ctx, char **text, size_t *len) {
  const trim_t *t = ctx;
  pj_hlo_t *h = pj_hlo_new();
  if (!h) return pj_status_new(PJ_ERR_OOM, "out of host memory building a program");
  pj_val_t x = pj_hlo_param(h, pj_type(t->dtype, 1, &t->capacity));
  const int64_t start = 0, limit = t->numel;
  pj_val_t y = pj_slice(h, x, &start, &limit, NULL);
  pj_status_t *st = pj_hlo_finish(h, &y, 1, NULL, text, len);
  pj_hlo_free(h);
  return st;
}

pj_status_t *pj_bucket_trim_locked(pj_storage_t *s) {
  /* undefined contents stay as they are: their readers raise (pj_storage_readable) */
  if (!s->buf || s->capacity <= s->nbytes || s->failed) return NULL;
  const size_t item = pj_dtype_info(s->dtype)->itemsize;
  trim_t t = {s->dtype, (int64_t)(s->capacity / item), (int64_t)(s->nbytes / item)};
  pj_runtime_t *rt;
  PJ_TRY(pj_runtime_get(&rt));
  pj_keybuf_t k = {0};
  pj_key_str(&k, pj_runtime_key_identity(rt));
  pj_key_str(&k, "pj_bucket_trim");
  pj_key_int(&k, t.dtype);
  pj_key_int(&k, t.capacity);
  pj_key_int(&k, t.numel);
  if (k.failed) {
    free(k.p);
    return pj_status_new(PJ_ERR_OOM, "out of host memory building a cache key");
  }
  pj_program_t *prog = NULL;
  pj_status_t *st =
      pj_program_for_key(k.p, k.len, build_trim, &t, "the trim of a padded storage", &prog);
  free(k.p);
  struct PJRT_Buffer *in = s->buf, *out = NULL;
  const bool donate = false;
  if (!st) st = pj_run_program(prog, s->device, &in, &donate, 1, NULL, 0, &out, 1, NULL, 0);
  if (!st) {
    pj_storage_swap(s, out, s->dtype);
    pj_metric_add(PJ_METRIC_BUCKET_TRIMS, 1);
  }
  return st;
}

pj_status_t *pj_bucket_trim(pj_storage_t *s) {
  if (!s->buf || s->capacity <= s->nbytes) return NULL;
  pthread_mutex_lock(&pj_run_lock);
  pj_status_t *st = pj_bucket_trim_locked(s);
  pthread_mutex_unlock(&pj_run_lock);
  return st;
}

pj_status_t *pj_bucket_input_locked(pj_storage_t *s, pj_dtype_t dt, size_t bytes) {
  if (s->buf && s->capacity > bytes && bytes == s->nbytes) PJ_TRY(pj_bucket_trim_locked(s));
  return pj_storage_materialize_padded(s, dt, bytes);
}

pj_status_t *pj_bucket_prepare(pj_call_t *c, bool may_trim) {
  const pj_shape_class_t cls = pj_lowering_shape_class(c->op);
  if (rewrite(c, cls) || cls != PJ_SHAPE_EXACT_INPUTS || !may_trim) return NULL;
  for (int i = 0; i < c->nslots; i++) {
    pj_slot_t *sl = &c->slots[i];
    pj_storage_t *s = sl->storage;
    if (!sl->read || !s->buf || s->pending || s->capacity <= s->nbytes || sl->dtype != s->dtype)
      continue;
    PJ_TRY(pj_bucket_trim(s));
    sl->numel = (int64_t)(s->nbytes / pj_dtype_info(sl->dtype)->itemsize);
  }
  return NULL;
}
