/* From a pj_call_t to an executed program: cache key, program construction (parameters,
 * lowering, writes into destination views), execution and storage updates. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "call_internal.h"
#include "torch_pjrt/bucket.h"
#include "torch_pjrt/compile_async.h"
#include "../ops/lower.h"
#include "../ops/no_kernel.h"
#include "torch_pjrt/capture.h"
#include "torch_pjrt/defer.h"
#include "torch_pjrt/disk_cache.h"
#include "torch_pjrt/exec.h"
#include "torch_pjrt/metrics.h"
#include "torch_pjrt/runtime.h"
#include "torch_pjrt/transfer.h"
#include "view_io.h"

/* ---- cache key: everything that shapes the program, nothing that is only a runtime value ---- */

void pj_key_put(pj_keybuf_t *k, const void *data, size_t n) {
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
void pj_key_int(pj_keybuf_t *k, int64_t v) { pj_key_put(k, &v, sizeof v); }
/* Length, then the bytes with their NUL, so a decoded string can point into the key. */
void pj_key_str(pj_keybuf_t *k, const char *s) {
  size_t n = s ? strlen(s) : 0;
  pj_key_int(k, (int64_t)n);
  pj_key_put(k, s ? s : "", n + 1);
}
static void ktensor(pj_keybuf_t *k, const pj_tensor_desc_t *d) {
  pj_key_int(k, d->dtype);
  pj_key_int(k, d->rank);
  if (d->rank < 0) return;
  pj_key_put(k, d->sizes, sizeof(int64_t) * (size_t)d->rank);
  pj_key_put(k, d->strides, sizeof(int64_t) * (size_t)d->rank);
  if (d->dyn_offset) { /* a runtime offset: the marker and its scalar, never the value */
    pj_key_int(k, INT64_MIN);
    pj_key_int(k, d->offset_scalar);
  } else {
    pj_key_int(k, d->offset);
  }
  pj_key_int(k, d->slot);
  pj_key_int(k, d->wrapped);
  if (d->slot < 0) pj_key_int(k, d->scalar);
  pj_key_int(k, d->pad_repeats ? d->numel_scalar : -1);
}

bool pj_call_key(const pj_call_t *c, const char *identity, pj_keybuf_t *k) {
  pj_key_str(k, identity);
  pj_key_str(k, c->op);
  pj_key_str(k, c->overload);
  pj_key_int(k, c->nscalars);
  for (int i = 0; i < c->nscalars; i++) pj_key_int(k, c->scalars[i].dtype);
  pj_key_int(k, c->nargs);
  for (int a = 0; a < c->nargs; a++) {
    const pj_arg_t *g = &c->args[a];
    pj_key_str(k, g->name);
    pj_key_int(k, g->kind);
    switch (g->kind) {
      case PJ_ARG_TENSOR:
      case PJ_ARG_TENSORS:
        pj_key_int(k, g->count);
        for (int i = 0; i < g->count; i++) ktensor(k, &c->tensors[g->first + i]);
        break;
      case PJ_ARG_SCALAR: pj_key_int(k, g->first); break;
      case PJ_ARG_SCALARS:
        pj_key_int(k, g->first);
        pj_key_int(k, g->count);
        break;
      case PJ_ARG_INT:
      case PJ_ARG_BOOL: pj_key_int(k, g->i); break;
      case PJ_ARG_FLOAT: pj_key_put(k, &g->f, sizeof g->f); break;
      case PJ_ARG_INTS:
        pj_key_int(k, g->count);
        pj_key_put(k, c->ints + g->first, sizeof(int64_t) * (size_t)g->count);
        break;
      case PJ_ARG_FLOATS:
        pj_key_int(k, g->count);
        pj_key_put(k, c->floats + g->first, sizeof(double) * (size_t)g->count);
        break;
      case PJ_ARG_STR: pj_key_str(k, g->s); break;
      case PJ_ARG_NONE: break;
    }
  }
  pj_key_int(k, c->nslots);
  for (int s = 0; s < c->nslots; s++) {
    pj_key_int(k, c->slots[s].dtype);
    pj_key_int(k, c->slots[s].numel);
    pj_key_int(k, c->slots[s].read);
  }
  pj_key_int(k, c->nout);
  for (int o = 0; o < c->nout; o++) ktensor(k, &c->outs[o]);
  pj_key_int(k, c->checked);
  return !k->failed;
}

/* ---- decoding a key back into a call (defer.c builds fused programs from recorded keys) ---- */

typedef struct {
  const unsigned char *p, *end;
  bool ok;
} reader_t;

static int64_t rint64(reader_t *r) {
  int64_t v = 0;
  if (r->ok && r->end - r->p >= (ptrdiff_t)sizeof v) {
    memcpy(&v, r->p, sizeof v);
    r->p += sizeof v;
  } else {
    r->ok = false;
  }
  return v;
}
static const char *rstr(reader_t *r) {
  int64_t n = rint64(r);
  if (!r->ok || n < 0 || r->end - r->p < n + 1 || r->p[n] != 0) {
    r->ok = false;
    return "";
  }
  const char *s = (const char *)r->p;
  r->p += n + 1;
  return s;
}
static void rbytes(reader_t *r, void *out, size_t n) {
  if (r->ok && (size_t)(r->end - r->p) >= n) {
    memcpy(out, r->p, n);
    r->p += n;
  } else {
    r->ok = false;
  }
}
static bool in_range(int64_t v, int64_t lo, int64_t hi) { return v >= lo && v <= hi; }
static void rtensor(reader_t *r, pj_tensor_desc_t *d) {
  memset(d, 0, sizeof *d);
  d->dtype = (pj_dtype_t)rint64(r);
  int64_t rank = rint64(r);
  if (!in_range(rank, -1, PJ_MAX_RANK)) r->ok = false;
  if (!r->ok) return;
  d->rank = (int)rank;
  if (d->rank < 0) return;
  rbytes(r, d->sizes, sizeof(int64_t) * (size_t)d->rank);
  rbytes(r, d->strides, sizeof(int64_t) * (size_t)d->rank);
  d->offset = rint64(r);
  if (d->offset == INT64_MIN) {
    d->dyn_offset = true;
    d->offset_scalar = (int)rint64(r);
    d->offset = 0;
  }
  d->slot = (int)rint64(r);
  d->wrapped = rint64(r) != 0;
  if (d->slot < 0) d->scalar = (int)rint64(r);
  const int64_t numel_scalar = rint64(r);
  if (!in_range(numel_scalar, -1, PJ_CALL_MAX_SCALARS - 1)) r->ok = false;
  d->pad_repeats = numel_scalar >= 0;
  d->numel_scalar = d->pad_repeats ? (int)numel_scalar : 0;
}

bool pj_call_decode(const unsigned char *key, size_t len, int device, pj_call_t *c) {
  reader_t r = {key, key + len, true};
  (void)rstr(&r); /* identity */
  c->op = rstr(&r);
  c->overload = rstr(&r);
  c->device = device;
  c->nargs = c->ntensors = c->nints = c->nfloats = c->nslots = c->nout = 0;
  int64_t ns = rint64(&r);
  if (!in_range(ns, 0, PJ_CALL_MAX_SCALARS)) return false;
  c->nscalars = (int)ns;
  for (int i = 0; i < c->nscalars; i++)
    c->scalars[i] = (pj_scalar_t){.dtype = (pj_dtype_t)rint64(&r)};
  int64_t na = rint64(&r);
  if (!r.ok || !in_range(na, 0, PJ_CALL_MAX_ARGS)) return false;
  for (int a = 0; a < na && r.ok; a++) {
    pj_arg_t *g = &c->args[c->nargs++];
    memset(g, 0, sizeof *g);
    g->name = rstr(&r);
    g->kind = (pj_arg_kind_t)rint64(&r);
    switch (g->kind) {
      case PJ_ARG_TENSOR:
      case PJ_ARG_TENSORS: {
        int64_t n = rint64(&r);
        if (!in_range(n, 0, PJ_CALL_MAX_TENSORS - c->ntensors)) return false;
        g->first = c->ntensors;
        g->count = (int)n;
        for (int i = 0; i < n && r.ok; i++) rtensor(&r, &c->tensors[c->ntensors++]);
        break;
      }
      case PJ_ARG_SCALAR:
        g->first = (int)rint64(&r);
        g->count = 1;
        break;
      case PJ_ARG_SCALARS:
        g->first = (int)rint64(&r);
        g->count = (int)rint64(&r);
        if (g->first < 0 || g->count < 0 || g->first + g->count > c->nscalars) return false;
        break;
      case PJ_ARG_INT:
      case PJ_ARG_BOOL: g->i = rint64(&r); break;
      case PJ_ARG_FLOAT: rbytes(&r, &g->f, sizeof g->f); break;
      case PJ_ARG_INTS: {
        int64_t n = rint64(&r);
        if (!in_range(n, 0, PJ_CALL_MAX_INTS - c->nints)) return false;
        g->first = c->nints;
        g->count = (int)n;
        rbytes(&r, c->ints + c->nints, sizeof(int64_t) * (size_t)n);
        c->nints += (int)n;
        break;
      }
      case PJ_ARG_FLOATS: {
        int64_t n = rint64(&r);
        if (!in_range(n, 0, PJ_CALL_MAX_INTS - c->nfloats)) return false;
        g->first = c->nfloats;
        g->count = (int)n;
        rbytes(&r, c->floats + c->nfloats, sizeof(double) * (size_t)n);
        c->nfloats += (int)n;
        break;
      }
      case PJ_ARG_STR: g->s = rstr(&r); break;
      case PJ_ARG_NONE: break;
      default: return false;
    }
  }
  int64_t nsl = rint64(&r);
  if (!r.ok || !in_range(nsl, 0, PJ_CALL_MAX_SLOTS)) return false;
  c->nslots = (int)nsl;
  for (int s = 0; s < c->nslots; s++) {
    c->slots[s].storage = NULL;
    c->slots[s].dtype = (pj_dtype_t)rint64(&r);
    c->slots[s].numel = rint64(&r);
    c->slots[s].read = rint64(&r) != 0;
  }
  int64_t no = rint64(&r);
  if (!r.ok || !in_range(no, 0, PJ_CALL_MAX_OUTS)) return false;
  c->nout = (int)no;
  for (int o = 0; o < c->nout; o++) rtensor(&r, &c->outs[o]);
  c->checked = rint64(&r) != 0;
  c->where = NULL;
  c->display = NULL;
  return r.ok && r.p == r.end;
}

/* ---- program construction ---- */

static int64_t desc_numel(const pj_tensor_desc_t *d) {
  int64_t n = 1;
  for (int i = 0; i < d->rank; i++) n *= d->sizes[i];
  return n;
}

bool pj_call_writes_slot(const pj_call_t *c, int s) {
  for (int o = 0; o < c->nout; o++)
    if (c->outs[o].slot == s && desc_numel(&c->outs[o]) > 0) return true;
  return false;
}

pj_status_t *pj_call_emit(pj_hlo_t *h, const pj_call_t *c, pj_lower_fn fn, const pj_val_t *in,
                          const pj_val_t *scalars, pj_val_t *full, bool *written,
                          pj_check_emit_t *chk) {
  pj_val_t *slot_vals = calloc((size_t)c->nslots + 1, sizeof(pj_val_t));
  pj_val_t *scalar_vals = calloc((size_t)c->nscalars + 1, sizeof(pj_val_t));
  pj_val_t *tensor_vals = calloc((size_t)c->ntensors + 1, sizeof(pj_val_t));
  pj_val_t *results = calloc((size_t)c->nout + 1, sizeof(pj_val_t));
  bool *has_result = calloc((size_t)c->nout + 1, sizeof(bool));
  pj_status_t *st = NULL;
  if (!slot_vals || !scalar_vals || !tensor_vals || !results || !has_result) {
    st = pj_status_new(PJ_ERR_OOM, "out of host memory building a program");
    goto done;
  }
  for (int s = 0; s < c->nslots; s++) {
    slot_vals[s] = c->slots[s].read ? in[s] : (pj_val_t){.id = -1};
    full[s] = slot_vals[s];
    written[s] = false;
  }
  for (int i = 0; i < c->nscalars; i++) scalar_vals[i] = scalars[i];
  for (int i = 0; i < c->ntensors; i++) tensor_vals[i].id = -2; /* not yet materialized */
  for (int o = 0; o < c->nout; o++) results[o].id = -1;
  pj_lower_t L = {.h = h,
                  .c = c,
                  .slot_vals = slot_vals,
                  .scalar_vals = scalar_vals,
                  .tensor_vals = tensor_vals,
                  .results = results,
                  .has_result = has_result,
                  .chk = chk};
  /* CPU's dtype checks that live in its kernels come first (no_kernel.c): the error is
   * recorded in the builder, as a lowering's own. */
  st = pj_no_cpu_kernel(&L) ? NULL : fn(&L);
  if (st) goto done;
  /* Every non-empty destination needs a value; an empty one may be left alone. */
  for (int o = 0; o < c->nout && pj_hlo_ok(h); o++)
    if (!has_result[o] && desc_numel(&c->outs[o]) > 0)
      pj_hlo_fail(h, PJ_ERR_RUNTIME, "internal: %s set no result %d", c->op, o);
  /* Writes, in destination order: a later destination in the same storage sees earlier ones. */
  for (int o = 0; o < c->nout && pj_hlo_ok(h); o++) {
    const pj_tensor_desc_t *d = &c->outs[o];
    if (!has_result[o] || desc_numel(d) == 0) continue; /* empty: nothing to write */
    const pj_slot_t *sl = &c->slots[d->slot];
    const pj_val_t *off = d->dyn_offset ? &scalar_vals[d->offset_scalar] : NULL;
    if (d->dtype == sl->dtype) {
      full[d->slot] = pj_view_write_at(h, full[d->slot], sl->numel, sl->dtype, d, off, results[o]);
    } else {
      /* a destination viewing the storage as another dtype: write in that dtype's elements */
      int64_t n = sl->numel * (int64_t)pj_dtype_info(sl->dtype)->itemsize /
                  (int64_t)pj_dtype_info(d->dtype)->itemsize;
      pj_val_t as_view = pj_view_bitcast(h, full[d->slot], d->dtype);
      pj_val_t w = pj_view_write_at(h, as_view, n, d->dtype, d, off, results[o]);
      full[d->slot] = pj_view_bitcast(h, w, sl->dtype);
    }
    written[d->slot] = true;
  }
done:
  free(slot_vals);
  free(scalar_vals);
  free(tensor_vals);
  free(results);
  free(has_result);
  return st;
}

typedef struct {
  pj_call_t *c;
  pj_lower_fn fn;
  const int *written; /* expected written slots (derived from the key) */
  int nwritten;
} single_build_t;

/* One op as a whole program: read slots, then scalars, are the parameters; every written slot
 * is a result aliasing its parameter (if it has one), so its old buffer can be donated. */
static pj_status_t *build_single(void *ctx, char **text, size_t *len) {
  single_build_t *b = ctx;
  pj_call_t *c = b->c;
  pj_hlo_t *h = pj_hlo_new();
  pj_val_t *in = calloc((size_t)c->nslots + 1, sizeof(pj_val_t));
  pj_val_t *scalars = calloc((size_t)c->nscalars + 1, sizeof(pj_val_t));
  pj_val_t *full = calloc((size_t)c->nslots + 1, sizeof(pj_val_t));
  bool *written = calloc((size_t)c->nslots + 1, sizeof(bool));
  int *param_of_slot = calloc((size_t)c->nslots + 1, sizeof(int));
  pj_val_t *outs = calloc((size_t)c->nslots + 2, sizeof(pj_val_t)); /* written slots + check */
  pj_status_t *st = NULL;
  if (!h || !in || !scalars || !full || !written || !param_of_slot || !outs) {
    st = pj_status_new(PJ_ERR_OOM, "out of host memory building a program");
    goto done;
  }
  int nparam = 0;
  for (int s = 0; s < c->nslots; s++) {
    param_of_slot[s] = -1;
    in[s].id = -1;
    if (c->slots[s].read) {
      in[s] = pj_hlo_param(h, pj_type(c->slots[s].dtype, 1, &c->slots[s].numel));
      param_of_slot[s] = nparam++;
    }
  }
  for (int i = 0; i < c->nscalars; i++) scalars[i] = pj_hlo_param(h, pj_type_scalar(c->scalars[i].dtype));
  pj_check_emit_t chk = {.state = {.id = -1}, .op_index = 0};
  st = pj_call_emit(h, c, b->fn, in, scalars, full, written, c->checked ? &chk : NULL);
  if (st) goto done;
  if (!pj_hlo_ok(h)) { /* the lowering's own error (its writes were skipped): report that */
    st = pj_hlo_finish(h, NULL, 0, NULL, text, len);
    goto done;
  }
  int alias[PJ_CALL_MAX_SLOTS + 1], n = 0;
  for (int s = 0; s < c->nslots; s++)
    if (written[s]) {
      if (n >= b->nwritten || b->written[n] != s) {
        st = pj_status_new(PJ_ERR_RUNTIME, "internal: written storages disagree for aten::%s",
                           c->op);
        goto done;
      }
      alias[n] = param_of_slot[s];
      outs[n++] = full[s];
    }
  if (n != b->nwritten) {
    st = pj_status_new(PJ_ERR_RUNTIME, "internal: written storages disagree for aten::%s", c->op);
    goto done;
  }
  pj_val_t state = pj_check_finish(h, &chk);
  if (state.id >= 0) { /* the check state: last result, aliasing the trailing parameter */
    alias[n] = PJ_HLO_ALIAS_LAST;
    outs[n++] = state;
  }
  st = pj_hlo_finish(h, outs, n, alias, text, len);
done:
  pj_hlo_free(h);
  free(in);
  free(scalars);
  free(full);
  free(written);
  free(param_of_slot);
  free(outs);
  return st;
}

/* ---- execution ---- */

/* Uploads a scalar as a 0-d buffer of its dtype. */
pj_status_t *pj_scalar_buffer(int device, const pj_scalar_t *s, struct PJRT_Buffer **out) {
  unsigned char bytes[16] = {0};
  switch (s->dtype) {
    case PJ_F64: memcpy(bytes, &s->f, 8); break;
    case PJ_F32: { float v = (float)s->f; memcpy(bytes, &v, 4); break; }
    case PJ_I64: memcpy(bytes, &s->i, 8); break;
    case PJ_I32: { int32_t v = (int32_t)s->i; memcpy(bytes, &v, 4); break; }
    case PJ_I16: { int16_t v = (int16_t)s->i; memcpy(bytes, &v, 2); break; }
    case PJ_I8: { int8_t v = (int8_t)s->i; memcpy(bytes, &v, 1); break; }
    case PJ_U8: { uint8_t v = (uint8_t)s->i; memcpy(bytes, &v, 1); break; }
    case PJ_U16: { uint16_t v = (uint16_t)s->i; memcpy(bytes, &v, 2); break; }
    case PJ_U32: { uint32_t v = (uint32_t)s->i; memcpy(bytes, &v, 4); break; }
    case PJ_U64: memcpy(bytes, &s->i, 8); break; /* the bits of a uint64 (scalar_value) */
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

pthread_mutex_t pj_run_lock = PTHREAD_MUTEX_INITIALIZER;

/* Scalar arguments repeat (alpha = 1, eps, a learning rate): their 0-d device buffers are kept
 * in a small direct-mapped cache, so a cache-hit op usually costs no upload. Scalar buffers are
 * never donated, so sharing them between executions is safe. An entry used by the call being
 * prepared (same epoch) is never evicted: a colliding scalar of that call gets its own buffer
 * (*owned = true, destroyed by the caller after launch). Guarded by pj_run_lock. */
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
  PJ_TRY(pj_scalar_buffer(device, s, &buf));
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

pj_status_t *pj_program_for_key(const unsigned char *key, size_t len,
                                pj_status_t *(*build)(void *ctx, char **text, size_t *len),
                                void *ctx, const char *what, pj_program_t **out) {
  return pj_program_for_hashed_key(pj_hash_bytes(key, len, 0), key, len, build, ctx, what, out);
}

pj_status_t *pj_program_for_hashed_key(uint64_t hash, const unsigned char *key, size_t len,
                                       pj_status_t *(*build)(void *ctx, char **text, size_t *len),
                                       void *ctx, const char *what, pj_program_t **out) {
  /* Memory cache, then the persistent cache, then compile (and persist). */
  pj_program_t *p = pj_cache_lookup_hashed(hash, key, len);
  if (p) {
    *out = p;
    return NULL;
  }
  /* A background compile of this key (compile_async.h): wait for it. */
  bool queued = false;
  pj_status_t *st = pj_async_compile_take(hash, key, len, &queued, &p);
  if (st) return what ? pj_status_wrap(st, "%s: ", what) : st;
  if (queued && !p && (p = pj_cache_lookup_hashed(hash, key, len))) { /* another thread took it */
    *out = p;
    return NULL;
  }
  if (!p) pj_disk_cache_lookup(key, len, &p);
  if (!p) {
    char *text = NULL;
    size_t tlen = 0;
    st = build(ctx, &text, &tlen);
    if (!st) st = pj_program_compile(text, tlen, &p);
    if (st && text && getenv("TORCH_PJRT_DUMP_ON_ERROR"))
      st = pj_status_wrap(st, "program:\n%s\n", text);
    free(text);
    if (st) return what ? pj_status_wrap(st, "%s: ", what) : st;
    pj_disk_cache_store(key, len, p);
  }
  *out = pj_cache_insert(key, len, p);
  return NULL;
}

pj_status_t *pj_run_program(pj_program_t *prog, int device, struct PJRT_Buffer **bufs,
                            const bool *donate, int nbufs, const pj_scalar_t *scalars,
                            int nscalars, struct PJRT_Buffer **outs, int nouts,
                            const pj_check_site_t *sites, int nsites) {
  const size_t nprog = pj_program_num_outputs(prog);
  const bool checks = nprog == (size_t)nouts + 1;
  if (nprog != (size_t)nouts && !checks)
    return pj_status_new(PJ_ERR_RUNTIME, "internal: program has %zu outputs, expected %d",
                         nprog, nouts);
  size_t nargs = (size_t)nbufs + (size_t)nscalars + checks;
  /* Small calls (nearly all eager ops) use the stack: these allocations were a measurable part
   * of a cache-hit op. */
  enum { SMALL = 32 };
  struct PJRT_Buffer *args_small[SMALL + 1], *outs_small[SMALL + 2];
  bool don_small[SMALL + 1], owned_small[SMALL + 1];
  const bool small = nargs <= SMALL && (size_t)nouts <= SMALL;
  struct PJRT_Buffer **args = small ? args_small : calloc(nargs + 1, sizeof *args);
  bool *don = small ? don_small : calloc(nargs + 1, sizeof *don);
  bool *owned = small ? owned_small : calloc((size_t)nscalars + 1, sizeof *owned);
  struct PJRT_Buffer **all_outs =
      !checks ? outs : small ? outs_small : calloc((size_t)nouts + 2, sizeof *all_outs);
  if (small) {
    memset(don_small, 0, sizeof don_small);
    memset(owned_small, 0, sizeof owned_small);
  }
  pj_status_t *st = NULL;
  int uploaded = 0;
  bool acquired = false;
  if (!args || !don || !owned || !all_outs) {
    st = pj_status_new(PJ_ERR_OOM, "out of host memory");
    goto done;
  }
  for (int i = 0; i < nbufs; i++) {
    args[i] = bufs[i];
    don[i] = donate[i];
  }
  scalar_epoch++;
  for (; uploaded < nscalars; uploaded++) {
    st = cached_scalar_buffer(device, &scalars[uploaded], &args[nbufs + uploaded], &owned[uploaded]);
    if (st) goto done;
  }
  if (checks) { /* the device's check state: the last argument, donated to the last result */
    acquired = true;
    st = pj_checks_acquire(device, &args[nargs - 1]);
    don[nargs - 1] = true;
    if (st) goto done;
  }
  st = pj_program_execute(prog, device, args, nargs, don, all_outs);
  if (checks && !st) memcpy(outs, all_outs, sizeof *outs * (size_t)nouts);
done:
  if (acquired) pj_checks_release(device, st ? NULL : all_outs[nouts], sites, nsites);
  /* buffers uploaded for this call only (see cached_scalar_buffer); PJRT keeps them alive
   * until the launched execution is done with them */
  for (int i = 0; i < uploaded; i++)
    if (owned[i]) pj_buffer_destroy(args[nbufs + i]);
  if (!small) {
    free(args);
    free(don);
    free(owned);
    if (all_outs != outs) free(all_outs);
  }
  return st;
}

/* Runs prog over the call's slots (caller holds pj_run_lock): the read slots' storages are its
 * buffer arguments in slot order (a written one donated), the written slots' storages take its
 * results. Shared by pj_call_run and pj_prepared_run. */
static pj_status_t *execute_slots(pj_program_t *prog, int device, const pj_slot_t *slots,
                                  int nslots, const int *written, int nwritten,
                                  const pj_scalar_t *scalars, int nscalars,
                                  const pj_check_site_t *site) {
  struct PJRT_Buffer *bufs[PJ_CALL_MAX_SLOTS], *outs[PJ_CALL_MAX_SLOTS];
  bool donate[PJ_CALL_MAX_SLOTS];
  int nbufs = 0;
  pj_status_t *st = NULL;
  for (int s = 0, w = 0; s < nslots && !st; s++) {
    const bool writes = w < nwritten && written[w] == s;
    w += writes;
    if (!slots[s].read) continue;
    st = pj_bucket_input_locked(slots[s].storage, slots[s].dtype,
                                (size_t)slots[s].numel * pj_dtype_info(slots[s].dtype)->itemsize);
    donate[nbufs] = writes;
    bufs[nbufs++] = slots[s].storage->buf;
  }
  if (!st)
    st = pj_run_program(prog, device, bufs, donate, nbufs, scalars, nscalars, outs, nwritten,
                        site, 1);
  /* A donated input's memory now belongs to the output; its handle is still destroyed by the
   * swap, like any replaced buffer. */
  for (int i = 0; i < nwritten && !st; i++) {
    const pj_slot_t *sl = &slots[written[i]];
    pj_storage_swap_padded(sl->storage, outs[i], sl->dtype,
                           (size_t)sl->numel * pj_dtype_info(sl->dtype)->itemsize);
  }
  return st;
}

/* The call's key (runtime identity) and written slots (a pure function of the key: slots with a
 * non-empty destination, in slot order; build_single checks that the program agrees). */
static pj_status_t *call_key(const pj_call_t *c, pj_keybuf_t *k, int *written, int *nwritten) {
  pj_runtime_t *rt;
  PJ_TRY(pj_runtime_get(&rt));
  if (!pj_call_key(c, pj_runtime_key_identity(rt), k)) {
    free(k->p);
    k->p = NULL;
    return pj_status_new(PJ_ERR_OOM, "out of host memory building a cache key");
  }
  *nwritten = 0;
  for (int s = 0; s < c->nslots; s++)
    if (pj_call_writes_slot(c, s)) written[(*nwritten)++] = s;
  return NULL;
}

/* Finds or builds and compiles the call's program and runs it now (nothing may be pending). */
static pj_status_t *run_keyed(pj_call_t *c, pj_lower_fn fn, const pj_keybuf_t *k, uint64_t hash,
                              const int *written, int nwritten) {
  single_build_t b = {c, fn, written, nwritten};
  pj_program_t *prog = NULL;
  pthread_mutex_lock(&pj_run_lock);
  /* the op's name is put on an error here, not formatted for every call */
  pj_status_t *st =
      pj_program_for_hashed_key(hash, k->p, k->len, build_single, &b, NULL, &prog);
  if (st) st = pj_status_wrap(st, "aten::%s: ", c->op);
  const pj_check_site_t site = {0, c->display ? c->display : c->op, c->where};
  if (!st)
    st = execute_slots(prog, c->device, c->slots, c->nslots, written, nwritten, c->scalars,
                       c->nscalars, &site);
  pthread_mutex_unlock(&pj_run_lock);
  return st;
}

/* Keys and runs c with its lowering fn now (nothing may be pending). */
static pj_status_t *run_now(pj_call_t *c, pj_lower_fn fn) {
  pj_keybuf_t k = {0};
  int written[PJ_CALL_MAX_SLOTS], nwritten = 0;
  PJ_TRY(call_key(c, &k, written, &nwritten));
  pj_status_t *st = run_keyed(c, fn, &k, pj_hash_bytes(k.p, k.len, 0), written, nwritten);
  free(k.p);
  return st;
}

pj_status_t *pj_call_run(pj_call_t *c) {
  pj_lower_fn fn = pj_lowering_find(c->op);
  if (!fn) return pj_status_new(PJ_ERR_UNIMPLEMENTED, "no lowering for aten::%s", c->op);
  /* Ops recorded by the defer_and_fuse mode come first. */
  PJ_TRY(pj_defer_flush());
  if (!pj_capture_active()) PJ_TRY(pj_bucket_prepare(c, true));
  return run_now(c, fn);
}

pj_status_t *pj_call_run_as_recorded(pj_call_t *c) {
  pj_lower_fn fn = pj_lowering_find(c->op);
  if (!fn) return pj_status_new(PJ_ERR_UNIMPLEMENTED, "no lowering for aten::%s", c->op);
  return run_now(c, fn);
}

pj_status_t *pj_call_run_async(pj_call_t *c, char *(*where_fn)(void)) {
  if (!pj_async_compile_enabled() || pj_capture_active()) return pj_call_run(c);
  pj_lower_fn fn = pj_lowering_find(c->op);
  if (!fn) return pj_status_new(PJ_ERR_UNIMPLEMENTED, "no lowering for aten::%s", c->op);
  /* a trim runs now: only when no queued call (which read the padded buffer) is ahead */
  PJ_TRY(pj_bucket_prepare(c, !pj_defer_each_pending()));
  pj_keybuf_t k = {0};
  int written[PJ_CALL_MAX_SLOTS], nwritten = 0;
  PJ_TRY(call_key(c, &k, written, &nwritten));
  const uint64_t hash = pj_hash_bytes(k.p, k.len, 0);
  pj_status_t *st = NULL;
  bool compiling = false;
  if (!pj_cache_lookup_hashed(hash, k.p, k.len)) {
    compiling = pj_async_compile_pending(hash, k.p, k.len);
    pj_program_t *p = NULL;
    if (!compiling) pj_disk_cache_lookup(k.p, k.len, &p);
    if (p) {
      pthread_mutex_lock(&pj_run_lock); /* inserts (evictions) happen under the run lock */
      pj_cache_insert(k.p, k.len, p);
      pthread_mutex_unlock(&pj_run_lock);
    } else if (!compiling) {
      /* The program is built here, so a lowering's error is the op's own, raised now; only
       * the compile runs in the background. */
      single_build_t b = {c, fn, written, nwritten};
      char *text = NULL;
      size_t tlen = 0;
      st = build_single(&b, &text, &tlen);
      if (st) {
        free(text);
        free(k.p);
        return pj_status_wrap(st, "aten::%s: ", c->op);
      }
      st = pj_async_compile_submit(hash, k.p, k.len, text, tlen, NULL);
      if (st) { /* nothing queued: compile in the op, as without a pool */
        pj_status_free(st);
        st = NULL;
      } else {
        compiling = true;
      }
    }
  }
  if (!compiling && !pj_defer_each_pending()) {
    st = pj_defer_flush(); /* a defer_and_fuse graph of another thread's mode, if any */
    if (!st) st = run_keyed(c, fn, &k, hash, written, nwritten); /* the key hashed once */
    free(k.p);
    return st;
  }
  /* Queued behind its compile, or behind earlier queued calls (program order). */
  bool writes[PJ_CALL_MAX_SLOTS];
  for (int s = 0; s < c->nslots; s++) writes[s] = false;
  for (int i = 0; i < nwritten; i++) writes[written[i]] = true;
  char *where = c->where ? NULL : compiling && where_fn ? where_fn() : NULL;
  char *site = pj_defer_site(c->display ? c->display : c->op, c->where ? c->where : where);
  free(where);
  return pj_defer_record(k.p, k.len, hash, pj_hash_bytes(k.p, k.len, PJ_KEY_SEED2), c->device,
                         c->slots, c->nslots, writes, c->scalars, c->nscalars, site, true);
}

/* ---- prepared calls (call.h) ---- */

struct pj_prepared {
  bool deferred;
  int device;
  int nslots, nwritten, nscalars;
  pj_dtype_t dtype[PJ_PREPARED_MAX_SLOTS];
  int64_t numel[PJ_PREPARED_MAX_SLOTS];
  bool read[PJ_PREPARED_MAX_SLOTS];
  bool writes[PJ_PREPARED_MAX_SLOTS];
  int written[PJ_PREPARED_MAX_SLOTS];
  char op[64];
  uint64_t hash, hash2; /* of the key: pj_hash_bytes seeds 0 and PJ_KEY_SEED2 */
  size_t keylen;
  unsigned char key[];
};

pj_prepared_t *pj_prepared_new(const pj_call_t *c, bool deferred) {
  const char *name = c->display ? c->display : c->op; /* what an index-check error names */
  if (c->nslots > PJ_PREPARED_MAX_SLOTS || strlen(name) >= sizeof((pj_prepared_t *)0)->op)
    return NULL;
  pj_runtime_t *rt = NULL;
  if (!deferred) {
    pj_status_t *st = pj_runtime_get(&rt);
    if (st) {
      pj_status_free(st);
      return NULL;
    }
  }
  pj_keybuf_t k = {0};
  /* the same keys as pj_call_run (runtime identity) and pj_call_defer (none) */
  if (!pj_call_key(c, deferred ? "" : pj_runtime_key_identity(rt), &k)) {
    free(k.p);
    return NULL;
  }
  pj_prepared_t *p = malloc(sizeof *p + k.len);
  if (!p) {
    free(k.p);
    return NULL;
  }
  p->deferred = deferred;
  p->device = c->device;
  p->nslots = c->nslots;
  p->nscalars = c->nscalars;
  p->nwritten = 0;
  for (int s = 0; s < c->nslots; s++) {
    p->dtype[s] = c->slots[s].dtype;
    p->numel[s] = c->slots[s].numel;
    p->read[s] = c->slots[s].read;
    p->writes[s] = pj_call_writes_slot(c, s);
    if (p->writes[s]) p->written[p->nwritten++] = s;
  }
  strcpy(p->op, name);
  p->hash = pj_hash_bytes(k.p, k.len, 0);
  p->hash2 = pj_hash_bytes(k.p, k.len, PJ_KEY_SEED2);
  p->keylen = k.len;
  memcpy(p->key, k.p, k.len);
  free(k.p);
  return p;
}

void pj_prepared_free(pj_prepared_t *p) { free(p); }

/* Records the prepared call in the pending graph: defer_and_fuse's, or (each) Strict's queue
 * behind background compiles. */
static pj_status_t *record_prepared(const pj_prepared_t *p, const pj_slot_t *slots,
                                    const pj_scalar_t *scalars, const char *where, bool each) {
  unsigned char *key = malloc(p->keylen);
  if (!key) return pj_status_new(PJ_ERR_OOM, "out of host memory recording an op");
  memcpy(key, p->key, p->keylen);
  return pj_defer_record(key, p->keylen, p->hash, p->hash2, p->device, slots, p->nslots,
                         p->writes, scalars, p->nscalars, pj_defer_site(p->op, where), each);
}

pj_status_t *pj_prepared_run(const pj_prepared_t *p, pj_storage_t *const *storages,
                             const pj_scalar_t *scalars, const char *where, bool *missed) {
  *missed = false;
  pj_runtime_t *rt; /* a forked child's error, at the op as on the full path */
  PJ_TRY(pj_runtime_get(&rt));
  pj_slot_t slots[PJ_PREPARED_MAX_SLOTS];
  for (int s = 0; s < p->nslots; s++)
    slots[s] = (pj_slot_t){storages[s], p->dtype[s], p->numel[s], p->read[s]};
  if (p->deferred) return record_prepared(p, slots, scalars, where, false);
  /* Strict behind background compiles (pj_call_run_async): queued, in program order. */
  if (!pj_defer_each_pending()) {
    PJ_TRY(pj_defer_flush());
    pj_status_t *st = NULL;
    pthread_mutex_lock(&pj_run_lock);
    pj_program_t *prog = pj_cache_lookup_hashed(p->hash, p->key, p->keylen);
    if (prog) {
      const pj_check_site_t site = {0, p->op, where};
      st = execute_slots(prog, p->device, slots, p->nslots, p->written, p->nwritten, scalars,
                         p->nscalars, &site);
    }
    pthread_mutex_unlock(&pj_run_lock);
    if (prog) return st;
    /* not in the memory cache: still compiling (queue behind it) or evicted (the caller
     * builds the call again) */
    if (!pj_async_compile_pending(p->hash, p->key, p->keylen)) {
      *missed = true;
      return NULL;
    }
  }
  return record_prepared(p, slots, scalars, where, true);
}
