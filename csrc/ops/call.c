/* From a pj_call_t to an executed program: cache key, program construction (parameters,
 * lowering, writes into destination views), execution and storage updates. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "lower.h"
#include "torch_pjrt/disk_cache.h"
#include "torch_pjrt/exec.h"
#include "torch_pjrt/metrics.h"
#include "torch_pjrt/runtime.h"
#include "torch_pjrt/transfer.h"
#include "view_io.h"

/* ---- cache key: everything that shapes the program, nothing that is only a runtime value ---- */

typedef struct {
  unsigned char *p;
  size_t len, cap;
  bool failed;
} keybuf_t;

static void kput(keybuf_t *k, const void *data, size_t n) {
  if (k->failed) return;
  if (k->len + n > k->cap) {
    size_t cap = k->cap ? k->cap * 2 : 1024;
    while (cap < k->len + n) cap *= 2;
    unsigned char *p = realloc(k->p, cap);
    if (!p) {
      k->failed = true;
      return;
    }
    k->p = p;
    k->cap = cap;
  }
  memcpy(k->p + k->len, data, n);
  k->len += n;
}
static void kint(keybuf_t *k, int64_t v) { kput(k, &v, sizeof v); }
static void kstr(keybuf_t *k, const char *s) {
  size_t n = s ? strlen(s) : 0;
  kint(k, (int64_t)n);
  kput(k, s ? s : "", n);
}
static void ktensor(keybuf_t *k, const pj_call_t *c, const pj_tensor_desc_t *d) {
  kint(k, d->dtype);
  kint(k, d->rank);
  if (d->rank < 0) return;
  kput(k, d->sizes, sizeof(int64_t) * (size_t)d->rank);
  kput(k, d->strides, sizeof(int64_t) * (size_t)d->rank);
  kint(k, d->offset);
  kint(k, d->slot);
  kint(k, d->wrapped);
  if (d->slot < 0) kint(k, c->scalars[d->scalar].dtype);
}

static bool build_key(const pj_call_t *c, const char *identity, keybuf_t *k) {
  kstr(k, identity);
  kstr(k, c->op);
  kstr(k, c->overload);
  kint(k, c->nargs);
  for (int a = 0; a < c->nargs; a++) {
    const pj_arg_t *g = &c->args[a];
    kstr(k, g->name);
    kint(k, g->kind);
    switch (g->kind) {
      case PJ_ARG_TENSOR:
      case PJ_ARG_TENSORS:
        kint(k, g->count);
        for (int i = 0; i < g->count; i++) ktensor(k, c, &c->tensors[g->first + i]);
        break;
      case PJ_ARG_SCALAR: kint(k, c->scalars[g->first].dtype); break;
      case PJ_ARG_SCALARS:
        kint(k, g->count);
        for (int i = 0; i < g->count; i++) kint(k, c->scalars[g->first + i].dtype);
        break;
      case PJ_ARG_INT:
      case PJ_ARG_BOOL: kint(k, g->i); break;
      case PJ_ARG_FLOAT: kput(k, &g->f, sizeof g->f); break;
      case PJ_ARG_INTS:
        kint(k, g->count);
        kput(k, c->ints + g->first, sizeof(int64_t) * (size_t)g->count);
        break;
      case PJ_ARG_FLOATS:
        kint(k, g->count);
        kput(k, c->floats + g->first, sizeof(double) * (size_t)g->count);
        break;
      case PJ_ARG_STR: kstr(k, g->s); break;
      case PJ_ARG_NONE: break;
    }
  }
  kint(k, c->nslots);
  for (int s = 0; s < c->nslots; s++) {
    kint(k, c->slots[s].dtype);
    kint(k, c->slots[s].numel);
    kint(k, c->slots[s].read);
  }
  kint(k, c->nout);
  for (int o = 0; o < c->nout; o++) ktensor(k, c, &c->outs[o]);
  return !k->failed;
}

/* ---- program construction ---- */

static int64_t desc_numel(const pj_tensor_desc_t *d) {
  int64_t n = 1;
  for (int i = 0; i < d->rank; i++) n *= d->sizes[i];
  return n;
}

static pj_status_t *build_program(pj_call_t *c, pj_lower_fn fn, char **text, size_t *len,
                                  int *written, int *nwritten) {
  pj_hlo_t *h = pj_hlo_new();
  pj_val_t *slot_vals = calloc((size_t)c->nslots + 1, sizeof(pj_val_t));
  pj_val_t *scalar_vals = calloc((size_t)c->nscalars + 1, sizeof(pj_val_t));
  pj_val_t *tensor_vals = calloc((size_t)c->ntensors + 1, sizeof(pj_val_t));
  pj_val_t *results = calloc((size_t)c->nout + 1, sizeof(pj_val_t));
  pj_val_t *full = calloc((size_t)c->nslots + 1, sizeof(pj_val_t));
  bool *has_result = calloc((size_t)c->nout + 1, sizeof(bool));
  int *param_of_slot = calloc((size_t)c->nslots + 1, sizeof(int));
  pj_status_t *st = NULL;
  if (!h || !slot_vals || !scalar_vals || !tensor_vals || !results || !full || !has_result ||
      !param_of_slot) {
    st = pj_status_new(PJ_ERR_OOM, "out of host memory building a program");
    goto done;
  }
  int nparam = 0;
  for (int s = 0; s < c->nslots; s++) {
    param_of_slot[s] = -1;
    slot_vals[s].id = -1;
    if (c->slots[s].read) {
      slot_vals[s] = pj_hlo_param(h, pj_type(c->slots[s].dtype, 1, &c->slots[s].numel));
      param_of_slot[s] = nparam++;
    }
  }
  for (int i = 0; i < c->nscalars; i++) {
    scalar_vals[i] = pj_hlo_param(h, pj_type_scalar(c->scalars[i].dtype));
    nparam++;
  }
  for (int i = 0; i < c->ntensors; i++) tensor_vals[i].id = -2; /* not yet materialized */
  for (int o = 0; o < c->nout; o++) results[o].id = -1;
  pj_lower_t L = {.h = h,
                  .c = c,
                  .slot_vals = slot_vals,
                  .scalar_vals = scalar_vals,
                  .tensor_vals = tensor_vals,
                  .results = results,
                  .has_result = has_result};
  st = fn(&L);
  if (st) goto done;
  /* Every non-empty destination needs a value; an empty one may be left alone. */
  for (int o = 0; o < c->nout && pj_hlo_ok(h); o++)
    if (!has_result[o] && desc_numel(&c->outs[o]) > 0)
      pj_hlo_fail(h, PJ_ERR_RUNTIME, "internal: %s set no result %d", c->op, o);
  /* Writes, in destination order: a later destination in the same storage sees earlier ones. */
  for (int s = 0; s < c->nslots; s++) full[s] = slot_vals[s];
  bool *is_written = calloc((size_t)c->nslots + 1, sizeof(bool));
  if (!is_written) {
    st = pj_status_new(PJ_ERR_OOM, "out of host memory");
    goto done;
  }
  for (int o = 0; o < c->nout && pj_hlo_ok(h); o++) {
    const pj_tensor_desc_t *d = &c->outs[o];
    if (!has_result[o] || desc_numel(d) == 0) continue; /* empty: nothing to write */
    const pj_slot_t *sl = &c->slots[d->slot];
    if (d->dtype == sl->dtype) {
      full[d->slot] = pj_view_write(h, full[d->slot], sl->numel, sl->dtype, d, results[o]);
    } else {
      /* a destination viewing the storage as another dtype: write in that dtype's elements */
      int64_t n = sl->numel * (int64_t)pj_dtype_info(sl->dtype)->itemsize /
                  (int64_t)pj_dtype_info(d->dtype)->itemsize;
      pj_val_t as_view = pj_view_bitcast(h, full[d->slot], d->dtype);
      pj_val_t w = pj_view_write(h, as_view, n, d->dtype, d, results[o]);
      full[d->slot] = pj_view_bitcast(h, w, sl->dtype);
    }
    is_written[d->slot] = true;
  }
  pj_val_t outs[PJ_CALL_MAX_SLOTS];
  int alias[PJ_CALL_MAX_SLOTS];
  *nwritten = 0;
  for (int s = 0; s < c->nslots; s++)
    if (is_written[s]) {
      alias[*nwritten] = param_of_slot[s];
      written[*nwritten] = s;
      outs[(*nwritten)++] = full[s];
    }
  free(is_written);
  st = pj_hlo_finish(h, outs, *nwritten, alias, text, len);
done:
  pj_hlo_free(h);
  free(slot_vals);
  free(scalar_vals);
  free(tensor_vals);
  free(results);
  free(full);
  free(has_result);
  free(param_of_slot);
  return st;
}

/* ---- execution ---- */

/* Uploads a scalar as a 0-d buffer of its dtype. */
static pj_status_t *scalar_buffer(int device, const pj_scalar_t *s, struct PJRT_Buffer **out) {
  unsigned char bytes[16] = {0};
  switch (s->dtype) {
    case PJ_F64: memcpy(bytes, &s->f, 8); break;
    case PJ_F32: { float v = (float)s->f; memcpy(bytes, &v, 4); break; }
    case PJ_I64: memcpy(bytes, &s->i, 8); break;
    case PJ_I32: { int32_t v = (int32_t)s->i; memcpy(bytes, &v, 4); break; }
    case PJ_I16: { int16_t v = (int16_t)s->i; memcpy(bytes, &v, 2); break; }
    case PJ_I8: { int8_t v = (int8_t)s->i; memcpy(bytes, &v, 1); break; }
    case PJ_U8: { uint8_t v = (uint8_t)s->i; memcpy(bytes, &v, 1); break; }
    case PJ_BOOL: bytes[0] = s->i != 0; break;
    case PJ_C128: memcpy(bytes, &s->f, 8); memcpy(bytes + 8, &s->imag, 8); break;
    case PJ_C64: { float v[2] = {(float)s->f, (float)s->imag}; memcpy(bytes, v, 8); break; }
    case PJ_F16:
    case PJ_BF16:
    default:
      return pj_status_new(PJ_ERR_UNIMPLEMENTED, "scalar arguments of dtype %s",
                           pj_dtype_info(s->dtype)->name);
  }
  return pj_transfer_to_device(device, bytes, s->dtype, NULL, 0, out);
}

static pthread_mutex_t run_lock = PTHREAD_MUTEX_INITIALIZER;

/* Scalar arguments repeat (alpha = 1, eps, a learning rate): their 0-d device buffers are kept
 * in a small direct-mapped cache, so a cache-hit op usually costs no upload. Scalar buffers are
 * never donated, so sharing them between executions is safe. An entry used by the call being
 * prepared (same epoch) is never evicted: a colliding scalar of that call gets its own buffer
 * (*owned = true, destroyed by the caller after launch). Guarded by run_lock. */
#define SCALAR_CACHE_SIZE 256
static struct {
  bool used;
  int device;
  uint64_t epoch;
  pj_scalar_t value;
  struct PJRT_Buffer *buf;
} scalar_cache[SCALAR_CACHE_SIZE];
static uint64_t scalar_epoch;

static pj_status_t *cached_scalar_buffer(int device, const pj_scalar_t *s,
                                         struct PJRT_Buffer **out, bool *owned) {
  pj_scalar_t key = {.dtype = s->dtype};
  if (pj_dtype_info(s->dtype)->is_float || pj_dtype_info(s->dtype)->is_complex) {
    key.f = s->f;
    key.imag = s->imag;
  } else {
    key.i = s->i;
  }
  uint64_t hsh = pj_hash_bytes(&key, sizeof key, (uint64_t)device);
  size_t slot = (size_t)(hsh % SCALAR_CACHE_SIZE);
  *owned = false;
  if (scalar_cache[slot].used && scalar_cache[slot].device == device &&
      memcmp(&scalar_cache[slot].value, &key, sizeof key) == 0) {
    scalar_cache[slot].epoch = scalar_epoch;
    *out = scalar_cache[slot].buf;
    return NULL;
  }
  struct PJRT_Buffer *buf;
  PJ_TRY(scalar_buffer(device, s, &buf));
  if (scalar_cache[slot].used && scalar_cache[slot].epoch == scalar_epoch) {
    *owned = true; /* the slot serves another scalar of this call */
    *out = buf;
    return NULL;
  }
  if (scalar_cache[slot].used) pj_buffer_destroy(scalar_cache[slot].buf);
  scalar_cache[slot].used = true;
  scalar_cache[slot].device = device;
  scalar_cache[slot].epoch = scalar_epoch;
  scalar_cache[slot].value = key;
  scalar_cache[slot].buf = buf;
  *out = buf;
  return NULL;
}

static pj_status_t *find_program(pj_call_t *c, pj_lower_fn fn, pj_program_t **prog,
                                 int *written, int *nwritten) {
  pj_runtime_t *rt;
  PJ_TRY(pj_runtime_get(&rt));
  keybuf_t k = {0};
  if (!build_key(c, pj_runtime_identity(rt), &k)) {
    free(k.p);
    return pj_status_new(PJ_ERR_OOM, "out of host memory building a cache key");
  }
  /* The written-slot list is a pure function of the key (slots with a non-empty destination,
   * in slot order); build_program derives the same list. */
  *nwritten = 0;
  for (int s = 0; s < c->nslots; s++) {
    bool w = false;
    for (int o = 0; o < c->nout && !w; o++) w = c->outs[o].slot == s && desc_numel(&c->outs[o]) > 0;
    if (w) written[(*nwritten)++] = s;
  }
  /* Memory cache, then the persistent cache, then compile (and persist). */
  pj_program_t *p = pj_cache_lookup(k.p, k.len);
  pj_status_t *st = NULL;
  if (!p) {
    pj_disk_cache_lookup(k.p, k.len, &p);
    if (!p) {
      char *text = NULL;
      size_t len = 0;
      int check[PJ_CALL_MAX_SLOTS], nw2 = 0;
      st = build_program(c, fn, &text, &len, check, &nw2);
      if (!st && (nw2 != *nwritten || memcmp(check, written, sizeof(int) * (size_t)nw2) != 0))
        st = pj_status_new(PJ_ERR_RUNTIME, "internal: written storages disagree for aten::%s",
                           c->op);
      if (!st) st = pj_program_compile(text, len, &p);
      if (st && text && getenv("TORCH_PJRT_DUMP_ON_ERROR"))
        st = pj_status_wrap(st, "program:\n%s\n", text);
      free(text);
      if (!st) pj_disk_cache_store(k.p, k.len, p);
    }
    if (!st) p = pj_cache_insert(k.p, k.len, p);
  }
  free(k.p);
  if (st) return pj_status_wrap(st, "aten::%s: ", c->op);
  *prog = p;
  return NULL;
}

pj_status_t *pj_call_run(pj_call_t *c) {
  pj_lower_fn fn = pj_lowering_find(c->op);
  if (!fn) return pj_status_new(PJ_ERR_UNIMPLEMENTED, "no lowering for aten::%s", c->op);
  pthread_mutex_lock(&run_lock);
  pj_status_t *st = NULL;
  struct PJRT_Buffer **args = NULL, **outs = NULL;
  bool *donate = NULL, *owned = NULL;
  size_t nargs = 0, first_scalar = 0;
  int written[PJ_CALL_MAX_SLOTS], nwritten = 0;
  pj_program_t *prog = NULL;
  st = find_program(c, fn, &prog, written, &nwritten);
  if (st) goto done;
  args = calloc((size_t)c->nslots + (size_t)c->nscalars + 1, sizeof *args);
  donate = calloc((size_t)c->nslots + (size_t)c->nscalars + 1, sizeof *donate);
  outs = calloc((size_t)nwritten + 1, sizeof *outs);
  if (!args || !donate || !outs) {
    st = pj_status_new(PJ_ERR_OOM, "out of host memory");
    goto done;
  }
  for (int s = 0; s < c->nslots; s++) {
    if (!c->slots[s].read) continue;
    st = pj_storage_materialize(c->slots[s].storage, c->slots[s].dtype);
    if (st) goto done;
    bool w = false;
    for (int i = 0; i < nwritten; i++) w = w || written[i] == s;
    donate[nargs] = w;
    args[nargs++] = c->slots[s].storage->buf;
  }
  scalar_epoch++;
  owned = calloc((size_t)c->nscalars + 1, sizeof *owned);
  if (!owned) {
    st = pj_status_new(PJ_ERR_OOM, "out of host memory");
    goto done;
  }
  first_scalar = nargs;
  for (int i = 0; i < c->nscalars; i++) {
    st = cached_scalar_buffer(c->device, &c->scalars[i], &args[nargs], &owned[i]);
    if (st) goto done;
    nargs++;
  }
  if (pj_program_num_outputs(prog) != (size_t)nwritten) {
    st = pj_status_new(PJ_ERR_RUNTIME, "internal: program has %zu outputs, expected %d",
                       pj_program_num_outputs(prog), nwritten);
  } else {
    st = pj_program_execute(prog, c->device, args, nargs, donate, outs);
  }
  if (st) goto done;
  /* A donated input's memory now belongs to the output; its handle is still destroyed by the
   * swap, like any replaced buffer. */
  for (int i = 0; i < nwritten; i++) {
    pj_slot_t *sl = &c->slots[written[i]];
    pj_storage_swap(sl->storage, outs[i], sl->dtype);
  }
done:
  /* buffers uploaded for this call only (see cached_scalar_buffer); PJRT keeps them alive
   * until the launched execution is done with them */
  for (size_t i = first_scalar; owned && i < nargs; i++)
    if (owned[i - first_scalar]) pj_buffer_destroy(args[i]);
  pthread_mutex_unlock(&run_lock);
  free(owned);
  free(args);
  free(donate);
  free(outs);
  return st;
}
