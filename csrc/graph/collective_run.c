/* Collectives as whole programs (collective.h): the cache key of a description, the program
 * (its inputs read through their views, then csrc/ops/collective.c's ops), and launching it on
 * the group's devices in the collective order below. */
#include "torch_pjrt/collective.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "call_internal.h"
#include "torch_pjrt/exec.h"
#include "torch_pjrt/multi_exec.h"
#include "torch_pjrt/runtime.h"
#include "torch_pjrt/stream.h"
#include "torch_pjrt/transfer.h"
#include "view_io.h"

/* ---- the key ---- */

pj_status_t *pj_coll_key(const pj_coll_desc_t *d, unsigned char **key, size_t *len) {
  PJ_TRY(pj_coll_check(d));
  pj_runtime_t *rt;
  PJ_TRY(pj_runtime_get(&rt));
  pj_keybuf_t k = {0};
  pj_key_str(&k, pj_runtime_key_identity(rt));
  pj_key_str(&k, "pj_coll");
  const int64_t head[] = {d->kind,       pj_coll_is_reduction(d->kind) ? (int64_t)d->op : -1,
                          d->dtype,      d->ninputs,
                          d->list_out,   d->nreplicas,
                          d->group_size, pj_coll_has_root(d->kind) ? d->root : -1,
                          d->npairs,     d->in_splits != NULL,
                          d->flat_out};
  for (size_t i = 0; i < sizeof head / sizeof *head; i++) pj_key_int(&k, head[i]);
  for (int i = 0; i < d->ninputs; i++) {
    const pj_coll_view_t *v = &d->inputs[i];
    pj_key_int(&k, v->rank);
    pj_key_int(&k, v->offset);
    pj_key_int(&k, v->numel);
    for (int j = 0; j < v->rank; j++) {
      pj_key_int(&k, v->sizes[j]);
      pj_key_int(&k, v->strides[j]);
    }
  }
  /* Groups as replica lists (NULL and the identity listing are one program). */
  for (int g = 0; g < pj_coll_ngroups(d); g++)
    for (int j = 0; j < d->group_size; j++) pj_key_int(&k, pj_coll_member(d, g, j));
  /* out_splits is only checked: equal in_splits make equal programs. */
  if (d->in_splits)
    for (int i = 0; i < d->nreplicas * d->group_size; i++) pj_key_int(&k, d->in_splits[i]);
  for (int i = 0; i < 2 * d->npairs; i++) pj_key_int(&k, d->pairs[i]);
  if (k.failed) {
    free(k.p);
    return pj_status_new(PJ_ERR_OOM, "out of host memory building a cache key");
  }
  *key = k.p;
  *len = k.len;
  return NULL;
}

pj_status_t *pj_coll_build(const pj_coll_desc_t *d, char **text, size_t *len) {
  PJ_TRY(pj_coll_check(d));
  pj_hlo_t *h = pj_hlo_new();
  if (!h) return pj_status_new(PJ_ERR_OOM, "out of host memory building a program");
  pj_val_t in[PJ_COLL_MAX_REPLICAS], res[PJ_COLL_MAX_REPLICAS];
  for (int i = 0; i < d->ninputs; i++)
    in[i] = pj_hlo_param(h, pj_type(d->dtype, 1, &d->inputs[i].numel));
  pj_val_t factor = {.id = -1};
  if (pj_coll_num_args(d) > d->ninputs) factor = pj_hlo_param(h, pj_type_scalar(PJ_F64));
  /* each input read through its view (the same view on every replica) */
  for (int i = 0; i < d->ninputs; i++) {
    const pj_coll_view_t *v = &d->inputs[i];
    pj_tensor_desc_t td;
    memset(&td, 0, sizeof td);
    td.dtype = d->dtype;
    td.rank = v->rank;
    for (int j = 0; j < v->rank; j++) {
      td.sizes[j] = v->sizes[j];
      td.strides[j] = v->strides[j];
    }
    td.offset = v->offset;
    in[i] = pj_view_read(h, in[i], &td);
  }
  const int nout = pj_coll_num_outputs(d);
  pj_status_t *st = pj_coll_emit(h, d, in, factor, res);
  if (!st && d->flat_out)
    for (int k = 0; k < nout; k++) {
      const int64_t n = pj_type_numel(&res[k].t);
      res[k] = pj_reshape(h, res[k], 1, &n);
    }
  if (!st) st = pj_hlo_finish(h, res, nout, NULL, text, len);
  pj_hlo_free(h);
  if (st) return pj_status_wrap(st, "building %s", pj_coll_kind_name(d->kind));
  return NULL;
}

/* ---- running ---- */

/* One collective program in flight at a time, process-wide. XLA's CPU runtime runs each
 * replica of a collective program on a thread of its own and meets them in a rendezvous that
 * aborts the process when a replica has not arrived after 40 seconds ("Termination timeout
 * for `all reduce ...`: Expected 2 threads to join the rendezvous, but only 1 of them arrived
 * on time"). Two collective programs in flight over the same devices could each hold one
 * replica running and waiting while its partner waited behind the other program: DDP with
 * several gradient buckets on 2 rank threads aborted that way about once in 15 runs. So a
 * launch first waits until the previous collective program (and what its devices ran before
 * it) has completed. Compute still overlaps a collective in flight; collectives follow each
 * other. order_mu is never held with pj_run_lock taken first. */
static pthread_mutex_t order_mu = PTHREAD_MUTEX_INITIALIZER;
static pj_marker_t *in_flight[PJ_COLL_MAX_REPLICAS];
static int n_in_flight;

/* Waits for the collective in flight (order_mu held). */
static pj_status_t *wait_in_flight(void) {
  pj_status_t *st = NULL;
  for (int i = 0; i < n_in_flight; i++) {
    pj_status_t *w = pj_marker_wait(in_flight[i]);
    if (!st) st = w;
    else pj_status_free(w);
    pj_marker_free(in_flight[i]);
  }
  n_in_flight = 0;
  return st;
}

/* Remembers what the launched collective's devices have in flight (order_mu held). */
static void note_in_flight(const int *devs, int R) {
  for (int r = 0; r < R; r++) {
    pj_marker_t *m = NULL;
    pj_status_t *st = pj_marker_record(devs[r], &m);
    if (st) pj_status_free(st); /* no marker: nothing to wait for on that device */
    else in_flight[n_in_flight++] = m;
  }
}

pj_status_t *pj_coll_launch(const void *key, size_t keylen,
                            pj_status_t *(*build)(void *ctx, char **text, size_t *len), void *ctx,
                            int ndev, const int *devices, struct PJRT_Buffer *const *const *args,
                            size_t nargs, const bool *donate, struct PJRT_Buffer **const *outs,
                            pj_marker_t **done) {
  pj_status_t *st = NULL;
  pthread_mutex_lock(&order_mu);
  /* a failure of the previous collective was its callers' to see; this one still runs */
  pj_status_t *prev = wait_in_flight();
  if (prev) pj_status_free(prev);
  pthread_mutex_lock(&pj_run_lock);
  const pj_placement_t pl = {ndev, devices};
  pj_program_t *p = pj_cache_lookup_placed(&pl, key, keylen);
  if (!p) { /* the text only on a miss: the key was enough to find a compiled one */
    char *text = NULL;
    size_t len = 0;
    st = build(ctx, &text, &len);
    if (!st) st = pj_program_for_placement(key, keylen, text, len, ndev, devices, &p);
    free(text);
  }
  if (!st) st = pj_program_execute_multi(p, args, nargs, donate, outs, done);
  pthread_mutex_unlock(&pj_run_lock);
  if (!st) note_in_flight(devices, ndev);
  pthread_mutex_unlock(&order_mu);
  return st;
}

static pj_status_t *build_desc(void *ctx, char **text, size_t *len) {
  return pj_coll_build(ctx, text, len);
}

pj_status_t *pj_coll_run(const pj_coll_desc_t *d, const int *devices,
                         struct PJRT_Buffer *const *inputs, const double *factors,
                         struct PJRT_Buffer **outs, pj_marker_t **done) {
  unsigned char *key = NULL;
  size_t keylen = 0;
  PJ_TRY(pj_coll_key(d, &key, &keylen));
  const int R = d->nreplicas, nin = d->ninputs, nargs = pj_coll_num_args(d);
  const int nout = pj_coll_num_outputs(d);
  if (nargs > nin && !factors) {
    free(key);
    return pj_status_new(PJ_ERR_VALUE, "%s: PREMUL_SUM without factors",
                         pj_coll_kind_name(d->kind));
  }
  int devs[PJ_COLL_MAX_REPLICAS];
  for (int r = 0; r < R; r++) devs[r] = devices ? devices[r] : r;
  /* Per replica: its inputs, then its factor uploaded for this call (PJRT keeps an argument
   * alive until the launched execution is done with it, so it is destroyed right after). */
  struct PJRT_Buffer *argv[PJ_COLL_MAX_REPLICAS * (PJ_COLL_MAX_REPLICAS + 1)];
  struct PJRT_Buffer *const *args[PJ_COLL_MAX_REPLICAS];
  struct PJRT_Buffer **outv[PJ_COLL_MAX_REPLICAS];
  struct PJRT_Buffer *fbuf[PJ_COLL_MAX_REPLICAS] = {0};
  pj_status_t *st = NULL;
  for (int r = 0; r < R && !st; r++) {
    for (int i = 0; i < nin; i++) argv[r * nargs + i] = inputs[r * nin + i];
    if (nargs > nin) {
      st = pj_transfer_to_device(devs[r], &factors[r], PJ_F64, NULL, 0, &fbuf[r]);
      argv[r * nargs + nin] = fbuf[r];
    }
    args[r] = &argv[r * nargs];
    outv[r] = &outs[r * nout];
  }
  if (!st)
    st = pj_coll_launch(key, keylen, build_desc, (void *)d, R, devs, args, (size_t)nargs, NULL,
                        outv, done);
  for (int r = 0; r < R; r++)
    if (fbuf[r]) pj_buffer_destroy(fbuf[r]);
  free(key);
  if (st) return pj_status_wrap(st, "%s", pj_coll_kind_name(d->kind));
  return NULL;
}
