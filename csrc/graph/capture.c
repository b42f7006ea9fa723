/* Plans (capture.h): a captured graph's program and the wiring of its storages to the inputs
 * and outputs of each run. The recording itself is defer.c's; this file decides each graph
 * storage's role and runs the program. */
#include "torch_pjrt/capture.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "recorder.h"
#include "torch_pjrt/coll_group.h"
#include "torch_pjrt/transfer.h"
#include "torch_pjrt/bucket.h"
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
  /* per graph storage: an output storage the graph reads before writing that was fresh at
   * capture (no buffer: zeros), as every run's output storage is; the program starts it as
   * zeros itself instead of reading a parameter (pj_graph_build_t.zeros) */
  bool *zeros;
  unsigned char *key;
  size_t keylen;
  uint64_t keyhash; /* pj_hash_bytes(key, keylen, 0), once: the key is tens of kilobytes */
  int *same_as; /* per input: the first input that was the same storage at capture */
  pj_scalar_t *scalars;   /* every op's scalars, in op order (values recorded at capture) */
  pj_scalar_bind_t *bind; /* per scalar: how the program gets it (recorder.h) */
  /* The program's scalar arguments as recorded, in argument order: if rng_args, the seed and
   * the base offset (args[0], args[1]: replaced on every run), then the PJ_SCALAR_ARGUMENT
   * scalars in op order. */
  pj_scalar_t *args;
  int nscalars, nargs, nparams, nresults, nin, nout;
  /* Generator draws of a run: ndraws of them (0: the graph draws no random numbers), all from
   * the default generator of rng_device, advancing it by increment in total. rng_args: some
   * scalar is bound to a draw (pj_graph_build then gives the program the seed and base offset
   * arguments; a draw whose op recorded nothing only advances the generator). */
  int ndraws, rng_device;
  uint64_t increment;
  bool rng_args;
};

void pj_plan_free(pj_plan_t *p) {
  if (!p) return;
  pj_graph_clear(&p->g);
  free(p->role);
  free(p->live);
  free(p->zeros);
  free(p->key);
  free(p->same_as);
  free(p->scalars);
  free(p->bind);
  free(p->args);
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

/* The draw (index into draws) a random op was given (seed, offset) from, searching from
 * *cursor (ops come in draw order, so the search is usually one step); -1 when none. */
static int find_draw(const pj_draw_t *draws, int ndraws, uint64_t seed, uint64_t offset,
                     int *cursor) {
  for (int n = 0; n < ndraws; n++) {
    int d = (*cursor + n) % ndraws;
    if (draws[d].seed == seed && draws[d].offset == offset) {
      *cursor = (d + 1) % ndraws;
      return d;
    }
  }
  return -1;
}

/* Binds every random op's "__seed"/"__offset" scalars to the capture's draws (p->bind) and
 * sets p->ndraws, rng_device and increment. A run can replay the draws only if they are what
 * one generator handed out in a row: all from the default generator of the graph's device
 * (the one a run draws from), one seed, and each draw's offset where the previous one left
 * the generator. Then draw d's offset is the first one's plus a constant distance, whatever
 * base a run starts from. *why is set (static text) when the graph cannot be a plan so: a
 * draw from another generator, draws not in a row, or a random op whose pair is no draw's
 * (its numbers would be the capture's on every run). */
static pj_status_t *bind_draws(pj_plan_t *p, const graph_t *g, const pj_draw_t *draws,
                               int ndraws, const char **why) {
  *why = NULL;
  for (int d = 0; d < ndraws && !*why; d++) {
    if (draws[d].generator != g->device)
      *why = "a random op draws from a generator other than the device's default one";
    else if (d > 0 && (draws[d].seed != draws[0].seed ||
                       draws[d].offset != draws[d - 1].offset + draws[d - 1].increment))
      *why = "the generator's draws are not consecutive";
    else
      p->increment += draws[d].increment; /* modulo 2^64, as the generator's offset */
  }
  if (*why) return NULL;
  p->ndraws = ndraws;
  p->rng_device = g->device;
  pj_call_t *c = malloc(sizeof *c);
  if (!c) return pj_status_new(PJ_ERR_OOM, "out of host memory capturing a graph");
  pj_status_t *st = NULL;
  int cursor = 0;
  for (int k = 0, first = 0; k < g->nops && !st && !*why; first += g->ops[k++].nscalars) {
    const dop_t *op = &g->ops[k];
    if (op->nscalars < 2) continue; /* no room for a seed and an offset */
    if (!pj_call_decode(op->key, op->keylen, g->device, c)) {
      st = pj_status_new(PJ_ERR_RUNTIME, "internal: a recorded call could not be decoded");
      break;
    }
    int si = -1, oi = -1;
    for (int a = 0; a < c->nargs; a++) {
      if (c->args[a].kind != PJ_ARG_SCALAR) continue;
      if (!strcmp(c->args[a].name, "__seed")) si = first + c->args[a].first;
      if (!strcmp(c->args[a].name, "__offset")) oi = first + c->args[a].first;
    }
    if (si < 0 && oi < 0) continue;
    int d = -1;
    if (si >= 0 && oi >= 0 && p->scalars[si].dtype == PJ_I64 && p->scalars[oi].dtype == PJ_I64)
      d = find_draw(draws, ndraws, (uint64_t)p->scalars[si].i, (uint64_t)p->scalars[oi].i,
                    &cursor);
    if (d < 0) {
      *why = "a random op's seed and offset come from no generator draw of the capture";
      break;
    }
    p->bind[si] = (pj_scalar_bind_t){PJ_SCALAR_SEED, 0};
    p->bind[oi] = (pj_scalar_bind_t){PJ_SCALAR_OFFSET, draws[d].offset - draws[0].offset};
    p->rng_args = true;
  }
  free(c);
  return st;
}

/* Whether graph storage i is a program parameter. */
static bool is_param(const pj_plan_t *p, int i) { return p->g.st[i].param && !p->zeros[i]; }

/* Decides roles, the key and the scalars' binding; sets *out, or *why (static text) and leaves
 * the graph to the caller when the graph cannot be a plan: an output storage the graph reads
 * before writing that held data before it (its contents would come from before the graph, but
 * each run gets a fresh output storage; a fresh one reads as zeros, at capture as in every
 * run, so the program makes those zeros), or random draws a run cannot replay (bind_draws). */
static pj_status_t *plan_new(graph_t *g, const pj_draw_t *draws, int ndraws,
                             pj_storage_t *const *inputs, int nin, pj_storage_t *const *outputs,
                             int nout, pj_plan_t **out, const char **why) {
  *why = NULL;
  pj_plan_t *p = calloc(1, sizeof *p);
  if (!p) return pj_status_new(PJ_ERR_OOM, "out of host memory capturing a graph");
  p->role = malloc(sizeof(int) * ((size_t)g->nst + 1));
  p->live = calloc((size_t)g->nst + 1, sizeof(bool));
  p->zeros = calloc((size_t)g->nst + 1, sizeof(bool));
  for (int i = 0; i < g->nops; i++) p->nscalars += g->ops[i].nscalars;
  p->scalars = malloc(sizeof(pj_scalar_t) * ((size_t)p->nscalars + 1));
  p->bind = calloc((size_t)p->nscalars + 1, sizeof *p->bind);
  p->args = malloc(sizeof(pj_scalar_t) * ((size_t)p->nscalars + 2));
  p->same_as = malloc(sizeof(int) * ((size_t)nin + 1));
  pj_status_t *st = NULL;
  pj_keybuf_t key = {0};
  if (!p->role || !p->live || !p->zeros || !p->scalars || !p->bind || !p->args || !p->same_as) {
    st = pj_status_new(PJ_ERR_OOM, "out of host memory capturing a graph");
    goto fail;
  }
  for (int k = 0; k < nin; k++) p->same_as[k] = index_of(inputs, k + 1, inputs[k]);
  p->nin = nin;
  p->nout = nout;
  for (int i = 0; i < g->nst; i++) {
    const gstore_t *s = &g->st[i];
    int k = index_of(inputs, nin, s->s), j = index_of(outputs, nout, s->s);
    if (k >= 0) {
      p->role[i] = k;
    } else if (j >= 0) {
      p->role[i] = ROLE_OUTPUT0 - j;
      p->zeros[i] = s->param && s->fresh;
      if (s->param && !s->fresh) *why = "an output storage holds data the graph reads";
    } else if (s->param || (s->written && __atomic_load_n(&s->s->refs, __ATOMIC_ACQUIRE) > 1)) {
      p->role[i] = ROLE_CONSTANT; /* read from, or kept alive by someone outside the graph */
    } else {
      p->role[i] = ROLE_INTERNAL;
    }
    p->live[i] = s->written && p->role[i] != ROLE_INTERNAL;
    p->nparams += s->param && !p->zeros[i];
    p->nresults += p->live[i];
  }
  for (int i = 0, n = 0; i < g->nops; i++) {
    memcpy(p->scalars + n, g->ops[i].scalars, sizeof(pj_scalar_t) * (size_t)g->ops[i].nscalars);
    n += g->ops[i].nscalars;
  }
  /* A graph's scalars are the same on every call (the caller keys plans on the values of
   * non-tensor inputs), so they become program constants, except the generator's (new on
   * every run) and those that cannot be written as one. */
  for (int i = 0; i < p->nscalars; i++)
    p->bind[i].use = pj_graph_scalar_is_constant(&p->scalars[i]) ? PJ_SCALAR_CONSTANT
                                                                 : PJ_SCALAR_ARGUMENT;
  if (!*why) st = bind_draws(p, g, draws, ndraws, why);
  /* A program over a group's devices gets no device's index-check state (one per device):
   * such a graph runs op by op instead, its checks in place. */
  if (!st && !*why && g->cgroup) {
    pj_check_site_t *sites = NULL;
    if (pj_graph_sites(g, &sites) > 0) *why = "index checks in a graph with collectives";
    free(sites);
  }
  if (st || *why) goto fail;
  if (p->rng_args) {
    p->args[p->nargs++] = (pj_scalar_t){.dtype = PJ_I64, .i = (int64_t)draws[0].seed};
    p->args[p->nargs++] = (pj_scalar_t){.dtype = PJ_I64, .i = (int64_t)draws[0].offset};
  }
  for (int i = 0; i < p->nscalars; i++)
    if (p->bind[i].use == PJ_SCALAR_ARGUMENT) p->args[p->nargs++] = p->scalars[i];
  pj_runtime_t *rt;
  st = pj_runtime_get(&rt);
  if (!st && !pj_graph_key(g, p->live, p->zeros, p->scalars, p->bind, p->nscalars,
                           pj_runtime_key_identity(rt), &key))
    st = pj_status_new(PJ_ERR_OOM, "out of host memory building a cache key");
  if (st) goto fail;
  p->key = key.p;
  p->keylen = key.len;
  p->keyhash = pj_hash_bytes(key.p, key.len, 0);
  p->g = *g;
  memset(g, 0, sizeof *g);
  *out = p;
  return NULL;
fail:
  free(key.p);
  pj_plan_free(p); /* its graph is still empty: g stays the caller's */
  return st;
}

static int compare_ptr(const void *a, const void *b) {
  uintptr_t x = (uintptr_t) * (pj_storage_t *const *)a, y = (uintptr_t) * (pj_storage_t *const *)b;
  return (x > y) - (x < y);
}

/* Runs a plan whose graph holds collectives (graph_t.cgroup): one program over the group's
 * devices, launched by the last rank to arrive with every rank's arguments (coll_group.h's
 * program round; the ranks' program keys are compared first). This rank's arguments are its
 * parameters' buffers, then its scalar arguments uploaded to its device; its results come back
 * on its device and are installed as plan_run installs them. The caller validated the
 * storages; args are this run's scalar arguments. */
static pj_status_t *plan_run_spmd(pj_plan_t *p, pj_storage_t *const *inputs,
                                  pj_storage_t *const *outputs, const pj_scalar_t *args) {
  const graph_t *g = &p->g;
  const int nargs = p->nparams + p->nargs;
  struct PJRT_Buffer **argv = calloc((size_t)nargs + 1, sizeof *argv);
  struct PJRT_Buffer **outs = calloc((size_t)p->nresults + 1, sizeof *outs);
  bool *donate = calloc((size_t)nargs + 1, sizeof(bool));
  pj_status_t *st = NULL;
  if (!argv || !outs || !donate) {
    st = pj_status_new(PJ_ERR_OOM, "out of host memory running a compiled graph");
    goto done;
  }
  pthread_mutex_lock(&pj_run_lock);
  for (int i = 0, n = 0; i < g->nst && !st; i++) {
    if (!is_param(p, i)) continue;
    pj_storage_t *s = storage_for(p, i, inputs, outputs);
    st = pj_bucket_input_locked(s, g->st[i].dtype,
                                (size_t)g->st[i].numel * pj_dtype_info(g->st[i].dtype)->itemsize);
    donate[n] = p->live[i];
    argv[n++] = s->buf;
  }
  pthread_mutex_unlock(&pj_run_lock);
  /* Nothing else of this rank runs meanwhile: it is this thread's graph, and the thread waits
   * in the round below. */
  for (int k = 0; k < p->nargs && !st; k++)
    st = pj_scalar_buffer(g->device, &args[k], &argv[p->nparams + k]);
  if (st) goto done;
  pj_graph_build_t build = {g, p->live, p->zeros, p->scalars, p->bind, false};
  const pj_cgroup_program_t prog = {.key = p->key, .keylen = p->keylen, .keyhash = p->keyhash,
                                    .nops = g->nops, .build = pj_graph_build,
                                    .build_ctx = &build, .nargs = nargs, .args = argv,
                                    .donate = donate, .nouts = p->nresults, .outs = outs};
  const pj_cgroup_call_t call = {.program = &prog};
  pj_cgroup_result_t res;
  st = pj_cgroup_collective(g->cgroup, g->crank, &call, &res);
  if (st) goto done;
  if (res.done) pj_marker_free(res.done); /* the results carry their own readiness */
  pthread_mutex_lock(&pj_run_lock);
  for (int i = 0, o = 0; i < g->nst; i++)
    if (p->live[i]) pj_storage_swap(storage_for(p, i, inputs, outputs), outs[o++], g->st[i].dtype);
  pthread_mutex_unlock(&pj_run_lock);
  pj_metric_add(PJ_METRIC_PLAN_RUNS, 1);
done:
  /* scalar buffers made for this run (PJRT keeps them alive while the execution needs them) */
  for (int k = 0; argv && k < p->nargs; k++)
    if (argv[p->nparams + k]) pj_buffer_destroy(argv[p->nparams + k]);
  free(argv);
  free(outs);
  free(donate);
  return st;
}

/* Runs the plan; the caller checked the argument counts, flushed the recorder and gave rng
 * when the plan draws. */
static pj_status_t *plan_run(pj_plan_t *p, pj_storage_t *const *inputs,
                             pj_storage_t *const *outputs, const pj_plan_rng_t *rng) {
  const graph_t *g = &p->g;
  struct PJRT_Buffer **bufs = calloc((size_t)p->nparams + 1, sizeof *bufs);
  struct PJRT_Buffer **outs = calloc((size_t)p->nresults + 1, sizeof *outs);
  bool *donate = calloc((size_t)p->nparams + 1, sizeof(bool));
  pj_storage_t **seen = calloc((size_t)g->nst + 1, sizeof *seen);
  /* this run's scalar arguments: a copy, so runs of one plan on several threads do not race */
  pj_scalar_t *args = malloc(sizeof *args * ((size_t)p->nargs + 1));
  pj_status_t *st = NULL;
  if (!bufs || !outs || !donate || !seen || !args) {
    st = pj_status_new(PJ_ERR_OOM, "out of host memory running a compiled graph");
    goto done;
  }
  memcpy(args, p->args, sizeof *args * (size_t)p->nargs);
  if (p->rng_args) {
    args[0].i = (int64_t)rng->seed;
    args[1].i = (int64_t)rng->offset;
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
  if (g->cgroup) {
    st = plan_run_spmd(p, inputs, outputs, args);
    goto done;
  }
  pthread_mutex_lock(&pj_run_lock);
  pj_program_t *prog = NULL;
  pj_graph_build_t build = {g, p->live, p->zeros, p->scalars, p->bind, false};
  char what[64];
  snprintf(what, sizeof what, "a compiled graph of %d ops", g->nops);
  st = pj_program_for_hashed_key(p->keyhash, p->key, p->keylen, pj_graph_build, &build, what,
                                 &prog);
  int nbufs = 0;
  for (int i = 0; i < g->nst && !st; i++) {
    if (!is_param(p, i)) continue;
    pj_storage_t *s = storage_for(p, i, inputs, outputs);
    /* the graph takes exact buffers: one an eager op padded (bucket.h) is trimmed */
    st = pj_bucket_input_locked(s, g->st[i].dtype,
                                (size_t)g->st[i].numel * pj_dtype_info(g->st[i].dtype)->itemsize);
    donate[nbufs] = p->live[i]; /* its result aliases this parameter */
    bufs[nbufs++] = s->buf;
  }
  pj_check_site_t *sites = NULL;
  int nsites = pj_graph_sites(g, &sites);
  if (!st)
    st = pj_run_program(prog, g->device, bufs, donate, nbufs, args, p->nargs, outs,
                        p->nresults, sites, nsites);
  free(sites);
  for (int i = 0, o = 0; i < g->nst && !st; i++)
    if (p->live[i]) pj_storage_swap(storage_for(p, i, inputs, outputs), outs[o++], g->st[i].dtype);
  pthread_mutex_unlock(&pj_run_lock);
  if (!st) pj_metric_add(PJ_METRIC_PLAN_RUNS, 1);
done:
  free(bufs);
  free(outs);
  free(donate);
  free(seen);
  free(args);
  return st;
}

pj_status_t *pj_plan_capture(graph_t *g, const pj_draw_t *draws, int ndraws,
                             pj_storage_t *const *inputs, int nin, pj_storage_t *const *outputs,
                             int nout, bool run, pj_plan_t **plan) {
  *plan = NULL;
  const char *reason = NULL;
  pj_plan_t *p = NULL;
  pj_status_t *st = plan_new(g, draws, ndraws, inputs, nin, outputs, nout, &p, &reason);
  if (st || reason) {
    /* not a plan: run it as defer_and_fuse would have, op by op if need be */
    pj_status_t *why =
        st ? st : pj_status_new(PJ_ERR_UNIMPLEMENTED, "not capturable: %s", reason);
    st = pj_graph_run_each(g, why);
    pj_metric_add(PJ_METRIC_PLAN_BROKEN, 1);
    pj_graph_clear(g);
    return st;
  }
  if (!run) { /* recorded only (pj_capture_end_unrun): nothing the graph writes changes */
    for (int i = 0; i < p->g.nst; i++) {
      pj_storage_t *s = p->g.st[i].s;
      if (!s) continue;
      s->pending = 0; /* its write is the plan's now: the storage keeps what it held */
      /* one the graph created and the plan keeps reads as zeros until a run writes it */
      if (p->role[i] == ROLE_CONSTANT && !s->buf && !st)
        st = pj_storage_materialize(s, p->g.st[i].dtype);
      if (p->role[i] != ROLE_CONSTANT) {
        pj_storage_release(s);
        p->g.st[i].s = NULL;
      }
    }
    if (st) {
      pj_plan_free(p);
      return st;
    }
    pj_metric_add(PJ_METRIC_PLAN_CAPTURES, 1);
    *plan = p;
    return NULL;
  }
  /* the capture's own run draws what the capture drew (the generator already moved past it) */
  const pj_plan_rng_t captured = {ndraws ? draws[0].seed : 0, ndraws ? draws[0].offset : 0};
  st = plan_run(p, inputs, outputs, &captured);
  const bool failed = st != NULL;
  /* the fused program failed (e.g. it did not compile): run the ops on their own; not a
   * program over a group's devices, whose failure (a rendezvous error, ranks that captured
   * different graphs) op by op would only meet again in mismatched rounds */
  if (failed && !p->g.cgroup) st = pj_graph_run_each(&p->g, st);
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
                         pj_storage_t *const *outputs, int nout, const pj_plan_rng_t *rng) {
  if (nin != p->nin || nout != p->nout)
    return pj_status_new(PJ_ERR_RUNTIME, "compiled graph: %d inputs and %d outputs given, "
                         "captured with %d and %d", nin, nout, p->nin, p->nout);
  /* a plan with draws must get a fresh state (else it would repeat some earlier numbers); one
   * without must not (the caller advanced a generator for nothing) */
  if ((p->ndraws > 0) != (rng != NULL))
    return pj_status_new(PJ_ERR_RUNTIME, "compiled graph: it makes %d random draws, and was "
                         "%s generator state", p->ndraws, rng ? "given" : "not given");
  pj_status_t *st = pj_defer_flush(); /* program order: what is recorded runs first */
  return st ? st : plan_run(p, inputs, outputs, rng);
}

int pj_plan_draws(const pj_plan_t *p, int *device, uint64_t *increment) {
  if (p->ndraws > 0) {
    *device = p->rng_device;
    *increment = p->increment;
  }
  return p->ndraws;
}

pj_status_t *pj_plan_text(pj_plan_t *p, char **text) {
  size_t len = 0;
  /* the exported text is the program without the device's index-check state */
  pj_graph_build_t build = {&p->g, p->live, p->zeros, p->scalars, p->bind, true};
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
    if (is_param(p, i)) {
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
  int n = p->nargs < cap ? p->nargs : cap;
  if (n > 0) memcpy(out, p->args, sizeof *out * (size_t)n);
  return p->nargs;
}

void pj_plan_stats(const pj_plan_t *p, int *nops, int *nparams, int *nresults, int *nscalars) {
  *nops = p->g.nops;
  *nparams = p->nparams;
  *nresults = p->nresults;
  *nscalars = p->nargs;
}
