/* Plans (capture.h): a captured graph's program and the wiring of its storages to the inputs
 * and outputs of each run. The recording itself is defer.c's; this file decides each graph
 * storage's role and runs the program. */
#include "torch_pjrt/capture.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "recorder.h"
#include "torch_pjrt/defer.h"
#include "torch_pjrt/metrics.h"
#include "torch_pjrt/runtime.h"

/* Role of a graph storage in a plan. */
enum {
  ROLE_INTERNAL = -1, /* only the graph uses it: never materialized */
  ROLE_CONSTANT = -2, /* held by the plan (graph->st[i].s stays retained) */
  ROLE_OUTPUT0 = -3   /* ROLE_OUTPUT0 - j: output j */
};

struct pj_plan {
  graph_t g;   /* recorded ops; st[i].s is non-NULL only for constants */
  int *role;   /* per graph storage: input index (>= 0) or a ROLE_* value */
  bool *live;  /* per graph storage: a result of the program */
  unsigned char *key;
  size_t keylen;
  uint64_t keyhash; /* pj_hash_bytes(key, keylen, 0), once: the key is tens of kilobytes */
  int *same_as; /* per input: the first input that was the same storage at capture */
  pj_scalar_t *scalars; /* every op's scalars, in op order (values recorded at capture) */
  int nscalars, nparams, nresults, nin, nout;
  bool const_scalars; /* scalars are program constants (else program arguments) */
};

void pj_plan_free(pj_plan_t *p) {
  if (!p) return;
  pj_graph_clear(&p->g);
  free(p->role);
  free(p->live);
  free(p->key);
  free(p->same_as);
  free(p->scalars);
  free(p);
}

static int index_of(pj_storage_t *const *list, int n, const pj_storage_t *s) {
  for (int i = 0; i < n; i++)
    if (list[i] == s) return i;
  return -1;
}

/* The storage graph storage i reads from or writes to in a run. */
static pj_storage_t *storage_for(const pj_plan_t *p, int i, pj_storage_t *const *inputs,
                                 pj_storage_t *const *outputs) {
  int r = p->role[i];
  if (r >= 0) return inputs[r];
  if (r == ROLE_CONSTANT) return p->g.st[i].s;
  if (r <= ROLE_OUTPUT0) return outputs[ROLE_OUTPUT0 - r];
  return NULL;
}

/* Decides roles, the key and the scalars. Returns false (and leaves the graph to the caller)
 * when the graph cannot be a plan: an output storage the graph reads before writing (its
 * contents would come from before the graph, but each run gets a fresh output storage). */
static pj_status_t *plan_new(graph_t *g, pj_storage_t *const *inputs, int nin,
                             pj_storage_t *const *outputs, int nout, pj_plan_t **out,
                             bool *ok) {
  *ok = false;
  pj_plan_t *p = calloc(1, sizeof *p);
  if (!p) return pj_status_new(PJ_ERR_OOM, "out of host memory capturing a graph");
  p->role = malloc(sizeof(int) * ((size_t)g->nst + 1));
  p->live = calloc((size_t)g->nst + 1, sizeof(bool));
  for (int i = 0; i < g->nops; i++) p->nscalars += g->ops[i].nscalars;
  p->scalars = malloc(sizeof(pj_scalar_t) * ((size_t)p->nscalars + 1));
  p->same_as = malloc(sizeof(int) * ((size_t)nin + 1));
  if (!p->role || !p->live || !p->scalars || !p->same_as) {
    free(p->role);
    free(p->live);
    free(p->scalars);
    free(p->same_as);
    free(p);
    return pj_status_new(PJ_ERR_OOM, "out of host memory capturing a graph");
  }
  for (int k = 0; k < nin; k++) p->same_as[k] = index_of(inputs, k + 1, inputs[k]);
  p->nin = nin;
  p->nout = nout;
  bool usable = true;
  for (int i = 0; i < g->nst; i++) {
    const gstore_t *s = &g->st[i];
    int k = index_of(inputs, nin, s->s), j = index_of(outputs, nout, s->s);
    if (k >= 0) {
      p->role[i] = k;
    } else if (j >= 0) {
      p->role[i] = ROLE_OUTPUT0 - j;
      if (s->param) usable = false;
    } else if (s->param || (s->written && __atomic_load_n(&s->s->refs, __ATOMIC_ACQUIRE) > 1)) {
      p->role[i] = ROLE_CONSTANT; /* read from, or kept alive by someone outside the graph */
    } else {
      p->role[i] = ROLE_INTERNAL;
    }
    p->live[i] = s->written && p->role[i] != ROLE_INTERNAL;
    p->nparams += s->param;
    p->nresults += p->live[i];
  }
  for (int i = 0, n = 0; i < g->nops; i++) {
    memcpy(p->scalars + n, g->ops[i].scalars, sizeof(pj_scalar_t) * (size_t)g->ops[i].nscalars);
    n += g->ops[i].nscalars;
  }
  /* A graph's scalars are the same on every call (the caller keys plans on the values of
   * non-tensor inputs), so they become program constants, unless one cannot be written as one. */
  p->const_scalars = true;
  for (int i = 0; i < p->nscalars; i++)
    p->const_scalars = p->const_scalars && pj_graph_scalar_is_constant(&p->scalars[i]);
  pj_runtime_t *rt;
  pj_status_t *st = pj_runtime_get(&rt);
  pj_keybuf_t k = {0};
  if (!st && !pj_graph_key(g, p->live, p->const_scalars ? p->scalars : NULL, p->nscalars,
                           pj_runtime_identity(rt), &k))
    st = pj_status_new(PJ_ERR_OOM, "out of host memory building a cache key");
  if (st || !usable) {
    free(k.p);
    free(p->role);
    free(p->live);
    free(p->scalars);
    free(p->same_as);
    free(p);
    return st;
  }
  p->key = k.p;
  p->keylen = k.len;
  p->keyhash = pj_hash_bytes(k.p, k.len, 0);
  p->g = *g;
  memset(g, 0, sizeof *g);
  *out = p;
  *ok = true;
  return NULL;
}

static int compare_ptr(const void *a, const void *b) {
  uintptr_t x = (uintptr_t) * (pj_storage_t *const *)a, y = (uintptr_t) * (pj_storage_t *const *)b;
  return (x > y) - (x < y);
}

/* Runs the plan; the caller checked the argument counts and flushed the recorder. */
static pj_status_t *plan_run(pj_plan_t *p, pj_storage_t *const *inputs,
                             pj_storage_t *const *outputs) {
  const graph_t *g = &p->g;
  struct PJRT_Buffer **bufs = calloc((size_t)p->nparams + 1, sizeof *bufs);
  struct PJRT_Buffer **outs = calloc((size_t)p->nresults + 1, sizeof *outs);
  bool *donate = calloc((size_t)p->nparams + 1, sizeof(bool));
  pj_storage_t **seen = calloc((size_t)g->nst + 1, sizeof *seen);
  pj_status_t *st = NULL;
  if (!bufs || !outs || !donate || !seen) {
    st = pj_status_new(PJ_ERR_OOM, "out of host memory running a compiled graph");
    goto done;
  }
  /* Every storage must be the size and on the device of the capture, and distinct storages at
   * capture must be distinct now (a donated buffer must not also be read as another one). */
  int nseen = 0;
  for (int i = 0; i < g->nst && !st; i++) {
    if (p->role[i] == ROLE_INTERNAL) continue;
    pj_storage_t *s = storage_for(p, i, inputs, outputs);
    size_t need = (size_t)g->st[i].numel * pj_dtype_info(g->st[i].dtype)->itemsize;
    if (!s || s->device != g->device || s->nbytes != need)
      st = pj_status_new(PJ_ERR_RUNTIME, "compiled graph: storage %d is not the %zu-byte storage "
                         "on device %d the graph was captured with", i, need, g->device);
    seen[nseen++] = s;
  }
  if (!st) { /* sorted, a repeated storage is next to itself: O(n log n) on every run */
    qsort(seen, (size_t)nseen, sizeof *seen, compare_ptr);
    for (int j = 1; j < nseen && !st; j++)
      if (seen[j] == seen[j - 1])
        st = pj_status_new(PJ_ERR_RUNTIME, "compiled graph: inputs alias each other "
                           "differently than at capture");
  }
  /* ... and inputs that were one storage at capture must be one storage now */
  for (int k = 0; k < p->nin && !st; k++)
    if (inputs[k] != inputs[p->same_as[k]])
      st = pj_status_new(PJ_ERR_RUNTIME, "compiled graph: inputs %d and %d were one storage at "
                         "capture and are two now", p->same_as[k], k);
  if (st) goto done;
  pthread_mutex_lock(&pj_run_lock);
  pj_program_t *prog = NULL;
  pj_graph_build_t build = {g, p->live, p->const_scalars ? p->scalars : NULL};
  char what[64];
  snprintf(what, sizeof what, "a compiled graph of %d ops", g->nops);
  st = pj_program_for_hashed_key(p->keyhash, p->key, p->keylen, pj_graph_build, &build, what,
                                 &prog);
  int nbufs = 0;
  for (int i = 0; i < g->nst && !st; i++) {
    if (!g->st[i].param) continue;
    pj_storage_t *s = storage_for(p, i, inputs, outputs);
    st = pj_storage_materialize(s, g->st[i].dtype);
    donate[nbufs] = p->live[i]; /* its result aliases this parameter */
    bufs[nbufs++] = s->buf;
  }
  if (!st)
    st = pj_run_program(prog, g->device, bufs, donate, nbufs, p->scalars,
                        p->const_scalars ? 0 : p->nscalars, outs, p->nresults);
  for (int i = 0, o = 0; i < g->nst && !st; i++)
    if (p->live[i]) pj_storage_swap(storage_for(p, i, inputs, outputs), outs[o++], g->st[i].dtype);
  pthread_mutex_unlock(&pj_run_lock);
  if (!st) pj_metric_add(PJ_METRIC_PLAN_RUNS, 1);
done:
  free(bufs);
  free(outs);
  free(donate);
  free(seen);
  return st;
}

pj_status_t *pj_plan_capture(graph_t *g, pj_storage_t *const *inputs, int nin,
                             pj_storage_t *const *outputs, int nout, pj_plan_t **plan) {
  *plan = NULL;
  bool ok = false;
  pj_plan_t *p = NULL;
  pj_status_t *st = plan_new(g, inputs, nin, outputs, nout, &p, &ok);
  if (st || !ok) {
    /* not a plan: run it as defer_and_fuse would have, op by op if need be */
    pj_status_t *why = st ? st : pj_status_new(PJ_ERR_UNIMPLEMENTED, "not capturable");
    st = pj_graph_run_each(g, why);
    pj_metric_add(PJ_METRIC_PLAN_BROKEN, 1);
    pj_graph_clear(g);
    return st;
  }
  st = plan_run(p, inputs, outputs);
  const bool failed = st != NULL;
  /* the fused program failed (e.g. it did not compile): run the ops on their own */
  if (failed) st = pj_graph_run_each(&p->g, st);
  /* Every result is installed: the capture's storages are no longer pending, and the plan
   * keeps only its constants. */
  for (int i = 0; i < p->g.nst; i++) {
    if (!p->g.st[i].s) continue;
    p->g.st[i].s->pending = 0;
    if (p->role[i] != ROLE_CONSTANT || failed) {
      pj_storage_release(p->g.st[i].s);
      p->g.st[i].s = NULL;
    }
  }
  if (failed) {
    pj_metric_add(PJ_METRIC_PLAN_BROKEN, 1);
    pj_plan_free(p);
    return st;
  }
  pj_metric_add(PJ_METRIC_PLAN_CAPTURES, 1);
  *plan = p;
  return NULL;
}

pj_status_t *pj_plan_run(pj_plan_t *p, pj_storage_t *const *inputs, int nin,
                         pj_storage_t *const *outputs, int nout) {
  if (nin != p->nin || nout != p->nout)
    return pj_status_new(PJ_ERR_RUNTIME, "compiled graph: %d inputs and %d outputs given, "
                         "captured with %d and %d", nin, nout, p->nin, p->nout);
  pj_status_t *st = pj_defer_flush(); /* program order: what is recorded runs first */
  return st ? st : plan_run(p, inputs, outputs);
}

pj_status_t *pj_plan_text(pj_plan_t *p, char **text) {
  size_t len = 0;
  pj_graph_build_t build = {&p->g, p->live, p->const_scalars ? p->scalars : NULL};
  return pj_graph_build(&build, text, &len);
}

/* Public encoding of a role (capture.h): inputs as themselves, constants as PJ_PLAN_CONSTANT,
 * output j as -2 - j. */
static int public_role(int r) {
  if (r >= 0) return r;
  if (r == ROLE_CONSTANT) return PJ_PLAN_CONSTANT;
  return -2 - (ROLE_OUTPUT0 - r);
}

int pj_plan_params(const pj_plan_t *p, int *src, int cap) {
  int n = 0;
  for (int i = 0; i < p->g.nst; i++)
    if (p->g.st[i].param) {
      if (n < cap) src[n] = public_role(p->role[i]);
      n++;
    }
  return n;
}

int pj_plan_results(const pj_plan_t *p, int *dst, int cap) {
  int n = 0;
  for (int i = 0; i < p->g.nst; i++)
    if (p->live[i]) {
      if (n < cap) dst[n] = public_role(p->role[i]);
      n++;
    }
  return n;
}

int pj_plan_scalars(const pj_plan_t *p, pj_scalar_t *out, int cap) {
  if (p->const_scalars) return 0;
  int n = p->nscalars < cap ? p->nscalars : cap;
  if (n > 0) memcpy(out, p->scalars, sizeof *out * (size_t)n);
  return p->nscalars;
}

void pj_plan_stats(const pj_plan_t *p, int *nops, int *nparams, int *nresults, int *nscalars) {
  *nops = p->g.nops;
  *nparams = p->nparams;
  *nresults = p->nresults;
  *nscalars = p->const_scalars ? 0 : p->nscalars;
}
