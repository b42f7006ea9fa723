/* The defer_and_fuse eager mode (see torch_pjrt/defer.h): recording, the loop-period detector,
 * and the flush that builds, caches and runs one program per recorded run of ops. */
#include "torch_pjrt/defer.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "recorder.h"
#include "torch_pjrt/coll_group.h"
#include "../ops/lower.h"
#include "torch_pjrt/bucket.h"
#include "torch_pjrt/capture.h"
#include "torch_pjrt/metrics.h"
#include "torch_pjrt/runtime.h"
#include "torch_pjrt/transfer.h"

/* Loop-period detector. It matters only for loops that never read a result: a loop whose
 * iterations end in a read (loss.item()) is already cut there, the same way every time. So it
 * starts learning only after a graph hit the size bound, and a natural flush (a read, a sync)
 * while nothing is learned switches it off again. While learning, the op hashes are kept;
 * every later position whose hash equals the first one is a candidate period P, verified op by
 * op (h[i] == h[i-P]); a candidate that matches two whole periods is learned. Once learned, the
 * stream is followed by phase and the graph is cut whenever the phase returns to 0, so every
 * iteration runs the same program. A mismatch forgets the period and learning restarts.
 * Phase 0 is a graph's first op: a learned period is rotated to the position its ops have in
 * the graph being recorded, which then simply grows to the period's length (cutting at the
 * period's own first op would leave a short graph, one more program to compile). After a
 * natural flush the next op starts a graph, so it takes phase 0 if it is the period's first
 * op: a loop that reads every N iterations then runs the same programs every N iterations
 * (the full-length one and one for the remainder), not a shifted set each time. */
#define DETECT_CANDIDATES 16
typedef struct {
  bool active; /* learning: a size-bound flush happened since the last natural flush */
  uint64_t *hist;
  int n, cap;
  int cand[DETECT_CANDIDATES];
  int ncand;
  uint64_t *period;
  int plen, phase;
  bool realign; /* a natural flush just happened: the next op may restart the phase at 0 */
} detector_t;

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
/* The recorder's graph, shared by every thread that is not capturing. Guarded by mu. */
static graph_t shared_graph;
/* Capture (capture.h): while capturing, ops are recorded into the capture's own graph, cut only
 * by what forces it to run (a read, a sync, a device change), and any such flush breaks the
 * capture. A process-wide capture (pj_capture_begin: torch.tpu.graph, whose backward runs on
 * the autograd engine's thread) takes every thread's ops and flushes. A thread's capture
 * (pj_capture_begin_thread: a compiled graph's first run) takes only that thread's: other
 * threads keep using the shared graph, or captures of their own (the ranks of
 * torch_pjrt.distributed.run_threads capture their compiled graphs at the same time), and
 * their flushes leave it alone. A thread's own capture comes before a process-wide one. The
 * graph and the draws of a capture are guarded by mu like the shared graph. */
typedef struct {
  graph_t graph;
  bool broken;
  /* the generator draws reported while capturing, in the order they were made (a plan
   * replays them, capture.c) */
  pj_draw_t *draws;
  int ndraws, cap_draws;
} capture_state_t;
static _Thread_local capture_state_t *tl_capture;
static _Atomic(capture_state_t *) process_capture;
/* Set while a capturing thread flushes the shared graph. */
static _Thread_local bool tl_force_shared;

/* The capture the calling thread's ops go to, or NULL. */
static capture_state_t *cur_capture(void) {
  if (tl_force_shared) return NULL;
  return tl_capture ? tl_capture : atomic_load(&process_capture);
}
/* The graph the calling thread records into. */
#define G (*(cur_capture() ? &cur_capture()->graph : &shared_graph))
static detector_t D;
/* The shared graph's op count and kind, readable without mu (a capture's are not here). */
static atomic_int pending_ops;
static atomic_bool each_pending; /* shared_graph.each && shared_graph.nops > 0 */
/* Default size bound. Small on purpose: a graph that reaches it runs asynchronously while the
 * host records the next one, so device work overlaps host dispatch as in Strict (a whole
 * training step as one graph leaves the device idle until the final read). Measured on the
 * TinyGPT step (docs/performance.md): 64 ops beat 2048. Cuts stay deterministic, so every
 * step reuses the same programs. */
static int max_ops = 64;

/* ---- graph bookkeeping ---- */

static size_t ptr_hash(const void *p) {
  uintptr_t v = (uintptr_t)p;
  v ^= v >> 17;
  v *= 0x9E3779B97F4A7C15ull;
  return (size_t)(v >> 20);
}

static bool index_rebuild(graph_t *g, int cap) {
  int *idx = malloc(sizeof(int) * (size_t)cap);
  if (!idx) return false;
  for (int i = 0; i < cap; i++) idx[i] = -1;
  for (int i = 0; i < g->nst; i++) {
    size_t b = ptr_hash(g->st[i].s) & (size_t)(cap - 1);
    while (idx[b] >= 0) b = (b + 1) & (size_t)(cap - 1);
    idx[b] = i;
  }
  free(g->index);
  g->index = idx;
  g->index_cap = cap;
  return true;
}

static int find_store(const graph_t *g, const pj_storage_t *s) {
  if (!g->index_cap) return -1;
  for (size_t b = ptr_hash(s) & (size_t)(g->index_cap - 1);; b = (b + 1) & (size_t)(g->index_cap - 1)) {
    if (g->index[b] < 0) return -1;
    if (g->st[g->index[b]].s == s) return g->index[b];
  }
}

/* Adds a storage; returns its index or -1 when out of memory. */
static int add_store(graph_t *g, pj_storage_t *s, pj_dtype_t dt, int64_t numel, bool param) {
  if (g->nst == g->cap_st) {
    int cap = g->cap_st ? g->cap_st * 2 : 64;
    gstore_t *p = realloc(g->st, sizeof *p * (size_t)cap);
    if (!p) return -1;
    g->st = p;
    g->cap_st = cap;
  }
  if ((g->nst + 1) * 2 > g->index_cap && !index_rebuild(g, g->index_cap ? g->index_cap * 2 : 256))
    return -1;
  int i = g->nst++;
  g->st[i] = (gstore_t){.s = s, .dtype = dt, .numel = numel, .param = param, .fresh = !s->buf};
  pj_storage_retain(s);
  size_t b = ptr_hash(s) & (size_t)(g->index_cap - 1);
  while (g->index[b] >= 0) b = (b + 1) & (size_t)(g->index_cap - 1);
  g->index[b] = i;
  return i;
}

void pj_graph_clear(graph_t *g) {
  for (int i = 0; i < g->nops; i++) {
    free(g->ops[i].key);
    free(g->ops[i].gslot);
    free(g->ops[i].scalars);
    free(g->ops[i].site);
  }
  for (int i = 0; i < g->nst; i++) {
    if (!g->st[i].s) continue; /* a plan keeps only the storages it needs (capture.c) */
    g->st[i].s->pending = 0;
    pj_storage_release(g->st[i].s);
  }
  free(g->ops);
  free(g->st);
  free(g->index);
  if (g->cgroup) pj_cgroup_release(g->cgroup);
  memset(g, 0, sizeof *g);
}

int pj_graph_sites(const graph_t *g, pj_check_site_t **out) {
  int n = 0;
  *out = NULL;
  for (int i = 0; i < g->nops; i++) n += g->ops[i].site != NULL;
  if (n == 0 || !(*out = malloc(sizeof **out * (size_t)n))) return 0;
  for (int i = 0, j = 0; i < g->nops; i++) {
    const char *site = g->ops[i].site;
    if (site) (*out)[j++] = (pj_check_site_t){i, site, site + strlen(site) + 1};
  }
  return n;
}

char *pj_defer_site(const char *op, const char *where) {
  if (!where) return NULL;
  size_t a = strlen(op) + 1, b = strlen(where) + 1;
  char *s = malloc(a + b);
  if (s) {
    memcpy(s, op, a);
    memcpy(s + a, where, b);
  }
  return s;
}

/* The site of a call that names its source line, or NULL. */
static char *site_of(const pj_call_t *c) {
  return pj_defer_site(c->display ? c->display : c->op, c->where);
}

/* ---- the fused program ---- */

bool pj_graph_scalar_is_constant(const pj_scalar_t *v) {
  return !pj_dtype_info(v->dtype)->is_complex || v->imag == 0;
}

/* A recorded scalar as a constant of dtype dt (the call's scalar type: the value's own). */
static pj_val_t scalar_constant(pj_hlo_t *h, pj_dtype_t dt, const pj_scalar_t *v) {
  const pj_dtype_info_t *info = pj_dtype_info(dt);
  if (dt == PJ_BOOL) return pj_const(h, dt, v->i != 0);
  if (info->is_float || info->is_complex) {
    if (!pj_graph_scalar_is_constant(v))
      return pj_hlo_fail(h, PJ_ERR_RUNTIME, "internal: a complex scalar as a constant");
    return pj_const(h, dt, v->f);
  }
  return pj_const_i(h, dt, v->i);
}

pj_status_t *pj_graph_build(void *ctx, char **text, size_t *len) {
  const pj_graph_build_t *fb = ctx;
  const graph_t *g = fb->g;
  pj_hlo_t *h = pj_hlo_new();
  pj_call_t *c = malloc(sizeof *c);
  pj_val_t *vals = calloc((size_t)g->nst + 1, sizeof(pj_val_t));
  int *param_of = calloc((size_t)g->nst + 1, sizeof(int));
  pj_val_t *outs = calloc((size_t)g->nst + 2, sizeof(pj_val_t));
  int *alias = calloc((size_t)g->nst + 2, sizeof(int));
  int total_scalars = 0;
  for (int i = 0; i < g->nops; i++) total_scalars += g->ops[i].nscalars;
  pj_val_t *scalars = calloc((size_t)total_scalars + 1, sizeof(pj_val_t));
  /* on the heap: a pj_val_t holds PJ_MAX_RANK dims, two slot arrays are over half a MB */
  pj_val_t *in = calloc(PJ_CALL_MAX_SLOTS, sizeof(pj_val_t));
  pj_val_t *full = calloc(PJ_CALL_MAX_SLOTS, sizeof(pj_val_t));
  bool written[PJ_CALL_MAX_SLOTS];
  pj_status_t *st = NULL;
  if (!h || !c || !vals || !param_of || !outs || !alias || !scalars || !in || !full) {
    st = pj_status_new(PJ_ERR_OOM, "out of host memory building a fused program");
    goto done;
  }
  /* Parameters: storages read before being written (graph order), then the generator's seed
   * and base offset if some scalar is bound to them, then the scalars passed as arguments. */
  int nparam = 0;
  for (int i = 0; i < g->nst; i++) {
    param_of[i] = -1;
    vals[i].id = -1;
    if (g->st[i].param && fb->zeros && fb->zeros[i]) {
      vals[i] = pj_full(h, pj_type(g->st[i].dtype, 1, &g->st[i].numel), 0);
    } else if (g->st[i].param) {
      vals[i] = pj_hlo_param(h, pj_type(g->st[i].dtype, 1, &g->st[i].numel));
      param_of[i] = nparam++;
    }
  }
  bool draws = false;
  for (int i = 0; fb->bind && i < total_scalars; i++)
    draws = draws || fb->bind[i].use == PJ_SCALAR_SEED || fb->bind[i].use == PJ_SCALAR_OFFSET;
  pj_val_t seed = {.id = -1}, base = {.id = -1};
  if (draws) {
    seed = pj_hlo_param(h, pj_type_scalar(PJ_I64));
    base = pj_hlo_param(h, pj_type_scalar(PJ_I64));
  }
  int first_scalar = 0;
  pj_check_emit_t chk = {.state = {.id = -1}};
  for (int k = 0; k < g->nops && !st; k++) {
    const dop_t *op = &g->ops[k];
    if (!pj_call_decode(op->key, op->keylen, g->device, c)) {
      st = pj_status_new(PJ_ERR_RUNTIME, "internal: a recorded call could not be decoded");
      break;
    }
    for (int i = 0; i < c->nscalars && !st; i++) {
      const pj_scalar_bind_t *b = fb->bind ? &fb->bind[first_scalar + i] : NULL;
      pj_val_t *v = &scalars[first_scalar + i];
      if (!b || b->use == PJ_SCALAR_ARGUMENT) {
        *v = pj_hlo_param(h, pj_type_scalar(c->scalars[i].dtype));
      } else if (b->use == PJ_SCALAR_CONSTANT) {
        *v = scalar_constant(h, c->scalars[i].dtype, &fb->scalar_values[first_scalar + i]);
      } else if (c->scalars[i].dtype != PJ_I64) {
        st = pj_status_new(PJ_ERR_RUNTIME, "internal: a generator scalar of aten::%s is not "
                           "int64", c->op);
      } else if (b->use == PJ_SCALAR_SEED) {
        *v = seed;
      } else {
        /* wraps modulo 2^64 like the generator's own offset arithmetic */
        *v = pj_binary(h, "stablehlo.add", base, pj_const_i(h, PJ_I64, (int64_t)b->rel));
      }
    }
    if (st) break;
    pj_lower_fn fn = pj_lowering_find(c->op);
    if (!fn) {
      st = pj_status_new(PJ_ERR_UNIMPLEMENTED, "no lowering for aten::%s", c->op);
      break;
    }
    for (int s = 0; s < c->nslots; s++) in[s] = vals[op->gslot[s]];
    chk.op_index = k;
    st = pj_call_emit(h, c, fn, in, scalars + first_scalar, full, written,
                      c->checked && !fb->unchecked ? &chk : NULL);
    if (st) st = pj_status_wrap(st, "aten::%s (op %d of a fused run): ", c->op, k);
    for (int s = 0; s < c->nslots && !st; s++)
      if (written[s]) vals[op->gslot[s]] = full[s];
    first_scalar += c->nscalars;
  }
  if (st) goto done;
  int n = 0;
  for (int i = 0; i < g->nst; i++)
    if (fb->live[i]) {
      alias[n] = param_of[i];
      outs[n++] = vals[i];
    }
  pj_val_t state = pj_check_finish(h, &chk);
  if (state.id >= 0) { /* the check state: last result, aliasing the trailing parameter */
    alias[n] = PJ_HLO_ALIAS_LAST;
    outs[n++] = state;
  }
  st = pj_hlo_finish(h, outs, n, alias, text, len);
done:
  pj_hlo_free(h);
  free(c);
  free(vals);
  free(param_of);
  free(outs);
  free(alias);
  free(scalars);
  free(in);
  free(full);
  return st;
}

bool pj_graph_key(const graph_t *g, const bool *live, const bool *zeros,
                  const pj_scalar_t *scalar_values, const pj_scalar_bind_t *bind, int nscalars,
                  const char *identity, pj_keybuf_t *k) {
  pj_key_str(k, identity);
  pj_key_str(k, "defer_and_fuse");
  pj_key_int(k, g->nops);
  /* Each op stands by its key's length and 128-bit digest (two independent 64-bit hashes),
   * not its whole key: a graph of 64 ops had a key of about 40 KB, copied, hashed and compared
   * at every flush. Two distinct op keys with equal lengths and both hashes equal would share a
   * program; at 2^-128 per pair that is far below any other failure rate of the system. */
  for (int i = 0; i < g->nops; i++) {
    const dop_t *op = &g->ops[i];
    const uint64_t digest[3] = {(uint64_t)op->keylen, op->hash, op->hash2};
    pj_key_put(k, digest, sizeof digest);
    pj_key_int(k, op->nslots);
    pj_key_put(k, op->gslot, sizeof(int) * (size_t)op->nslots);
  }
  pj_key_int(k, g->nst);
  for (int i = 0; i < g->nst; i++) {
    const gstore_t *s = &g->st[i];
    pj_key_int(k, s->dtype);
    pj_key_int(k, s->numel);
    pj_key_int(k, (int64_t)s->param | (int64_t)s->written << 1 | (int64_t)live[i] << 2 |
                      (int64_t)(zeros && zeros[i]) << 3);
  }
  /* constants are part of the program: their exact bits are part of its key; so are the
   * offsets' distances, which are constants too. Argument values never are. */
  pj_key_int(k, bind ? nscalars : -1);
  for (int i = 0; bind && i < nscalars; i++) {
    pj_key_int(k, bind[i].use);
    if (bind[i].use == PJ_SCALAR_OFFSET) pj_key_int(k, (int64_t)bind[i].rel);
    if (bind[i].use != PJ_SCALAR_CONSTANT) continue;
    const pj_scalar_t *v = &scalar_values[i];
    pj_key_int(k, v->dtype);
    pj_key_int(k, v->i);
    pj_key_put(k, &v->f, sizeof v->f);
    pj_key_put(k, &v->imag, sizeof v->imag);
  }
  return !k->failed;
}

static const char kNeverRan[] =
    "a tensor written by a recorded op that never ran, as an op recorded before it failed "
    "(defer_and_fuse): ";
static const char kFailedOp[] = "a tensor computed by a recorded op that failed (defer_and_fuse): ";

/* Marks s undefined with why's error behind `what`; an error that is already such a read's
 * (an op that read an undefined tensor) is passed on as it is, not prefixed again. */
static void set_failed(pj_storage_t *s, const pj_status_t *why, const char *what) {
  const char *msg = pj_status_message(why);
  const bool relayed = !strncmp(msg, kNeverRan, sizeof kNeverRan - 1) ||
                       !strncmp(msg, kFailedOp, sizeof kFailedOp - 1);
  pj_storage_set_failed(s, why, relayed ? "" : what);
}

/* Marks undefined (pj_storage_set_failed) what the recorded ops from `first` on were to write
 * and never did: their writes did not happen, and a later read must raise `why` rather than
 * return stale or zero contents. c is scratch space for decoding. Out of memory or undecodable,
 * an op's slots are all taken as written (the safe side). */
static void fail_writes_from(const graph_t *g, int first, const pj_status_t *why, pj_call_t *c) {
  for (int k = first; k < g->nops; k++) {
    const dop_t *op = &g->ops[k];
    const bool decoded = c && pj_call_decode(op->key, op->keylen, g->device, c);
    for (int s = 0; s < op->nslots; s++) {
      pj_storage_t *st = g->st[op->gslot[s]].s;
      if (st && (!decoded || pj_call_writes_slot(c, s))) set_failed(st, why, kNeverRan);
    }
  }
}

/* After op k of g failed with `why` (the ops before it ran, those after it did not): the ops
 * after k never wrote (fail_writes_from); op k's destinations keep their contents from
 * before it, as CPU leaves an op's destinations when it raises, except those that had none
 * (a fresh storage that no op before k wrote: the op's own new result tensor, which would
 * read as zeros): they are marked undefined too. Out of memory or undecodable, every
 * destination of op k is (the safe side). */
static void fail_after_op(const graph_t *g, int k, const pj_status_t *why, pj_call_t *c) {
  bool *defined = calloc((size_t)g->nst + 1, sizeof(bool)); /* written by an op before k */
  for (int j = 0; j < k && defined; j++) {
    const dop_t *op = &g->ops[j];
    if (!pj_call_decode(op->key, op->keylen, g->device, c)) {
      free(defined);
      defined = NULL;
      break;
    }
    for (int s = 0; s < op->nslots; s++)
      if (pj_call_writes_slot(c, s)) defined[op->gslot[s]] = true;
  }
  const dop_t *op = &g->ops[k];
  const bool decoded = defined && pj_call_decode(op->key, op->keylen, g->device, c);
  for (int s = 0; s < op->nslots; s++) {
    const int gi = op->gslot[s];
    const gstore_t *gs = &g->st[gi];
    if (!gs->s) continue;
    if (decoded && (!pj_call_writes_slot(c, s) || !gs->fresh || defined[gi])) continue;
    set_failed(gs->s, why, kFailedOp);
  }
  free(defined);
  fail_writes_from(g, k + 1, why, c);
}

/* Runs the recorded ops one by one, each as its own program, as Strict would have: used when
 * the fused program cannot be built or compiled (or reads a storage whose contents are
 * undefined), so every op before a failing one takes effect and the error names the op that
 * failed; what the failed op and the ops after it were to write is marked undefined
 * (fail_after_op). `why` (may be NULL) is the reason, consumed. */
pj_status_t *pj_graph_run_each(const graph_t *g, pj_status_t *why) {
  pj_call_t *c = malloc(sizeof *c);
  pj_status_t *st = c ? NULL : pj_status_new(PJ_ERR_OOM, "out of host memory replaying ops");
  int k = 0;
  for (; k < g->nops && !st; k++) {
    const dop_t *op = &g->ops[k];
    if (!pj_call_decode(op->key, op->keylen, g->device, c)) {
      st = pj_status_new(PJ_ERR_RUNTIME, "internal: a recorded call could not be decoded");
      break;
    }
    for (int s = 0; s < c->nslots; s++) c->slots[s].storage = g->st[op->gslot[s]].s;
    memcpy(c->scalars, op->scalars, sizeof *op->scalars * (size_t)op->nscalars);
    if (op->site) {
      c->display = op->site;
      c->where = op->site + strlen(op->site) + 1;
    }
    st = op->collective ? pj_cgroup_run_call(g->cgroup, g->crank, c)
                        : pj_call_run_as_recorded(c);
    if (st) break;
  }
  if (st && !c) fail_writes_from(g, 0, st, NULL);
  else if (st) fail_after_op(g, k, st, c);
  free(c);
  if (st && g->each) { /* Strict: the op raises at this synchronizing point, naming its line */
    pj_status_free(why);
    const char *where = k < g->nops && g->ops[k].site
                            ? g->ops[k].site + strlen(g->ops[k].site) + 1
                            : NULL;
    return pj_status_wrap(st, "tpu op%s%s%s run at this synchronizing point after its program "
                              "compiled in the background: ", where ? " (called" : "",
                          where ? where : "", where ? ")" : "");
  }
  if (st) {
    const bool fused_failed = why != NULL;
    pj_status_free(why);
    return pj_status_wrap(st, fused_failed ? "defer_and_fuse (recorded op run on its own after "
                                             "the fused program failed): "
                                           : "defer_and_fuse (recorded op run on its own): ");
  }
  pj_status_free(why); /* every op ran on its own: only the fusion failed */
  return NULL;
}

static pj_status_t *flush_graph(void);
/* Set on the thread running a flush: the ops it runs call pj_defer_flush, which must not wait
 * for that same flush. */
static _Thread_local bool in_flush;

/* Another thread that asks for a flush while one runs must wait for it (the ops being run may
 * write what it reads next): pending_ops and each_pending keep their values until the flush
 * has run everything, so such a thread takes mu, which the flushing thread holds. */
static void publish_shared_counts(void) {
  atomic_store(&pending_ops, shared_graph.nops);
  atomic_store(&each_pending, shared_graph.nops > 0 && shared_graph.each);
}

static pj_status_t *flush_locked(void) {
  in_flush = true;
  pj_status_t *st = flush_graph();
  in_flush = false;
  if (!cur_capture()) publish_shared_counts();
  return st;
}

/* Builds (or finds) and runs the graph's program, installs the live results, and empties the
 * graph. Caller holds mu (through flush_locked). If the fused program cannot be built or
 * compiled, the ops are replayed one by one (see pj_graph_run_each); a Strict queue ("each")
 * always is. */
static pj_status_t *flush_graph(void) {
  if (G.nops > 0 && cur_capture()) cur_capture()->broken = true;
  graph_t g = G;
  memset(&G, 0, sizeof G);
  if (g.nops == 0) {
    pj_graph_clear(&g);
    return NULL;
  }
  /* Strict ops behind background compiles: one by one, as Strict runs them; a broken rank
   * capture's collectives: one by one too, each collective its group's (no single-device
   * program can hold one) */
  if (g.each || g.cgroup) {
    /* A collective waits for the other ranks, which may need mu to get there (to record, to
     * begin or end their captures): the detached graph runs without it. */
    if (g.cgroup) pthread_mutex_unlock(&mu);
    pj_status_t *st = pj_graph_run_each(&g, NULL);
    if (g.cgroup) pthread_mutex_lock(&mu);
    pj_graph_clear(&g);
    return st;
  }
  pj_status_t *st = NULL;
  bool *live = calloc((size_t)g.nst + 1, sizeof(bool));
  struct PJRT_Buffer **bufs = calloc((size_t)g.nst + 1, sizeof *bufs);
  struct PJRT_Buffer **outs = calloc((size_t)g.nst + 1, sizeof *outs);
  bool *donate = calloc((size_t)g.nst + 1, sizeof(bool));
  int total_scalars = 0;
  for (int i = 0; i < g.nops; i++) total_scalars += g.ops[i].nscalars;
  pj_scalar_t *scalars = calloc((size_t)total_scalars + 1, sizeof *scalars);
  pj_keybuf_t k = {0};
  bool ran_each = false; /* pj_graph_run_each ran the ops (and marked what a failure lost) */
  if (!live || !bufs || !outs || !donate || !scalars) {
    st = pj_status_new(PJ_ERR_OOM, "out of host memory running a fused graph");
    goto done;
  }
  int nlive = 0, elided = 0;
  for (int i = 0; i < g.nst; i++) {
    /* the graph's own reference is one; anything above is a tensor (or a runtime user) */
    live[i] = g.st[i].written && __atomic_load_n(&g.st[i].s->refs, __ATOMIC_ACQUIRE) > 1;
    nlive += live[i];
    elided += g.st[i].written && !live[i];
  }
  pj_runtime_t *rt;
  st = pj_runtime_get(&rt);
  if (st) goto done;
  if (!pj_graph_key(&g, live, NULL, NULL, NULL, 0, pj_runtime_key_identity(rt), &k)) {
    st = pj_status_new(PJ_ERR_OOM, "out of host memory building a cache key");
    goto done;
  }
  int ns = 0;
  for (int i = 0; i < g.nops; i++) {
    memcpy(scalars + ns, g.ops[i].scalars, sizeof *scalars * (size_t)g.ops[i].nscalars);
    ns += g.ops[i].nscalars;
  }
  /* A storage read whose contents are undefined (written by an op that failed at an earlier
   * flush): op by op, so the ops before its reader take effect and the reader raises. */
  for (int i = 0; i < g.nst; i++)
    if (g.st[i].param && g.st[i].s->failed) {
      st = pj_graph_run_each(&g, NULL);
      ran_each = true;
      goto done;
    }
  char what[64];
  snprintf(what, sizeof what, "a fused run of %d ops", g.nops);
  pj_graph_build_t fb = {&g, live, NULL, NULL, NULL, false};
  pj_program_t *prog = NULL;
  pthread_mutex_lock(&pj_run_lock);
  st = pj_program_for_key(k.p, k.len, pj_graph_build, &fb, what, &prog);
  if (st) {
    pthread_mutex_unlock(&pj_run_lock);
    st = pj_graph_run_each(&g, st);
    ran_each = true;
    goto done;
  }
  int nbufs = 0;
  for (int i = 0; i < g.nst && !st; i++) {
    if (!g.st[i].param) continue;
    st = pj_bucket_input_locked(g.st[i].s, g.st[i].dtype,
                                (size_t)g.st[i].numel * pj_dtype_info(g.st[i].dtype)->itemsize);
    donate[nbufs] = live[i]; /* its result aliases this parameter */
    bufs[nbufs++] = g.st[i].s->buf;
  }
  pj_check_site_t *sites = NULL;
  int nsites = pj_graph_sites(&g, &sites);
  if (!st)
    st = pj_run_program(prog, g.device, bufs, donate, nbufs, scalars, total_scalars, outs, nlive,
                        sites, nsites);
  free(sites);
  for (int i = 0, o = 0; i < g.nst && !st; i++)
    if (live[i])
      pj_storage_swap_padded(g.st[i].s, outs[o++], g.st[i].dtype,
                             (size_t)g.st[i].numel * pj_dtype_info(g.st[i].dtype)->itemsize);
  pthread_mutex_unlock(&pj_run_lock);
  if (!st) {
    pj_metric_add(PJ_METRIC_DEFER_FLUSHES, 1);
    pj_metric_add(PJ_METRIC_DEFER_ELIDED, elided);
  }
done:
  if (st && !ran_each) { /* no result was installed: none of the recorded writes happened */
    pj_call_t *c = malloc(sizeof *c);
    fail_writes_from(&g, 0, st, c);
    free(c);
  }
  free(k.p);
  free(live);
  free(bufs);
  free(outs);
  free(donate);
  free(scalars);
  pj_graph_clear(&g);
  return st;
}

/* ---- loop-period detector ---- */

static void detector_restart(void) {
  D.n = 0;
  D.ncand = 0;
}

static void detector_forget(void) {
  free(D.period);
  D.period = NULL;
  D.plen = D.phase = 0;
  D.realign = false;
  D.active = false;
  detector_restart();
}

/* Called for each op before it is recorded; returns true when the graph should be cut (flushed)
 * before this op because it starts a new loop iteration. */
static bool detector_step(uint64_t h) {
  if (D.plen > 0) {
    if (D.realign && D.period[0] == h) D.phase = 0; /* the graph is empty (just flushed) */
    D.realign = false;
    if (D.period[D.phase] == h) {
      bool cut = D.phase == 0;
      D.phase = (D.phase + 1) % D.plen;
      return cut;
    }
    detector_forget(); /* the loop changed: learn again from this op */
    D.active = true;
  }
  if (!D.active) return false;
  if (D.n == D.cap) {
    /* periods up to twice the size bound are learnable; beyond that, start over */
    int limit = 4 * max_ops + 64;
    int cap = D.cap ? D.cap * 2 : 256;
    if (cap > limit) cap = limit;
    if (cap <= D.cap) {
      detector_restart();
    } else {
      uint64_t *p = realloc(D.hist, sizeof *p * (size_t)cap);
      if (!p) {
        detector_restart();
        return false;
      }
      D.hist = p;
      D.cap = cap;
    }
  }
  if (D.n == D.cap) return false;
  int i = D.n;
  D.hist[D.n++] = h;
  for (int c = 0; c < D.ncand;) {
    int P = D.cand[c];
    if (D.hist[i] != D.hist[i - P]) {
      D.cand[c] = D.cand[--D.ncand];
      continue;
    }
    if (i == 2 * P - 1) {
      /* two whole periods matched: learn it, repeated as often as the size bound holds it
       * (candidates are at most half the bound long), so graphs are about the bound's size */
      int reps = max_ops / P;
      uint64_t *per = malloc(sizeof *per * (size_t)P * (size_t)reps);
      if (!per) {
        detector_restart();
        return false;
      }
      /* hist[j] is at graph position G.nops - i + j (this op is about to be recorded at
       * G.nops; learning may have begun in an earlier graph, hence the modular arithmetic) */
      const int L = P * reps;
      const int q0 = G.nops - i;
      for (int pos = 0; pos < L; pos++) per[pos] = D.hist[(((pos - q0) % P) + P) % P];
      D.period = per;
      D.plen = L;
      D.phase = (G.nops + 1) % L; /* the next op's position */
      detector_restart();
      return false;
    }
    c++;
  }
  if (i > 0 && h == D.hist[0] && D.ncand < DETECT_CANDIDATES && 2 * i <= max_ops)
    D.cand[D.ncand++] = i;
  return false;
}

/* ---- public API ---- */

static pj_status_t *record_call(pj_call_t *c, bool with_site, pj_cgroup_t *cgroup, int crank,
                                bool *recorded);

pj_status_t *pj_call_defer(pj_call_t *c) {
  if (!pj_lowering_find(c->op)) return pj_status_new(PJ_ERR_UNIMPLEMENTED, "no lowering for aten::%s", c->op);
  return record_call(c, true, NULL, 0, NULL);
}

/* pj_defer_record, or with cgroup a collective into the calling thread's own capture (see
 * pj_capture_record_collective: *recorded false, nothing kept, when it cannot go there). */
static pj_status_t *record(unsigned char *key, size_t keylen, uint64_t hash, uint64_t hash2,
                           int device, const pj_slot_t *slots, int nslots, const bool *writes,
                           const pj_scalar_t *scalars, int nscalars, char *site, bool each,
                           pj_cgroup_t *cgroup, int crank, bool *recorded) {
  dop_t op = {.key = key, .keylen = keylen, .hash = hash, .hash2 = hash2, .nslots = nslots,
              .nscalars = nscalars, .site = site, .collective = cgroup != NULL};
  op.gslot = malloc(sizeof(int) * (size_t)(nslots + 1));
  op.scalars = malloc(sizeof(pj_scalar_t) * (size_t)(nscalars + 1));
  if (!op.gslot || !op.scalars) {
    free(op.key);
    free(op.gslot);
    free(op.scalars);
    free(op.site);
    return pj_status_new(PJ_ERR_OOM, "out of host memory recording an op");
  }
  memcpy(op.scalars, scalars, sizeof(pj_scalar_t) * (size_t)nscalars);
  pj_status_t *st = NULL;
  pthread_mutex_lock(&mu);
  const bool cap = cur_capture() != NULL;
  if (cgroup) {
    /* only into this thread's own capture, unbroken, whose collectives are all this group's */
    capture_state_t *c = cur_capture();
    const bool ok = c && c == tl_capture && !c->broken &&
                    (!G.cgroup || (G.cgroup == cgroup && G.crank == crank)) &&
                    (G.nops == 0 || G.device == device);
    if (!ok) {
      pthread_mutex_unlock(&mu);
      free(op.key);
      free(op.gslot);
      free(op.scalars);
      free(op.site);
      *recorded = false;
      return NULL;
    }
  }
  /* the loop detector learns fused graphs only; a Strict queue is cut at the size bound */
  bool cut = !cap && !each && detector_step(op.hash);
  const bool full = !cap && G.nops >= max_ops;
  if (G.nops > 0 && G.each != each) st = flush_locked();
  if (!st && G.nops > 0 && (cut || full || G.device != device)) {
    if (cut) pj_metric_add(PJ_METRIC_DEFER_CUTS, 1);
    else if (full && !each && !D.active) {
      D.active = true; /* a loop without reads, perhaps: learn its period from here */
      detector_restart();
    }
    st = flush_locked();
  }
  /* A storage seen with another element type than the graph's: run what is recorded first. */
  for (int s = 0; s < nslots && !st && G.nops > 0; s++) {
    int gi = find_store(&G, slots[s].storage);
    if (gi >= 0 && (G.st[gi].dtype != slots[s].dtype || G.st[gi].numel != slots[s].numel))
      st = flush_locked();
  }
  if (!st && G.nops == G.cap_ops) {
    int cap = G.cap_ops ? G.cap_ops * 2 : 256;
    dop_t *p = realloc(G.ops, sizeof *p * (size_t)cap);
    if (!p) {
      st = pj_status_new(PJ_ERR_OOM, "out of host memory recording an op");
    } else {
      G.ops = p;
      G.cap_ops = cap;
    }
  }
  for (int s = 0; s < nslots && !st; s++) {
    const pj_slot_t *sl = &slots[s];
    int gi = find_store(&G, sl->storage);
    if (gi < 0) gi = add_store(&G, sl->storage, sl->dtype, sl->numel, sl->read);
    if (gi < 0) st = pj_status_new(PJ_ERR_OOM, "out of host memory recording an op");
    else op.gslot[s] = gi;
  }
  if (st) {
    pthread_mutex_unlock(&mu);
    free(op.key);
    free(op.gslot);
    free(op.scalars);
    free(op.site);
    return st;
  }
  for (int s = 0; s < nslots; s++)
    if (writes[s]) {
      gstore_t *g = &G.st[op.gslot[s]];
      g->written = true;
      if (!g->s->buf) g->s->dtype = g->dtype;
      /* the buffer the write installs (a bucketed Strict call's is padded): later calls
       * recorded before the flush read it at that size */
      const size_t bytes = (size_t)g->numel * pj_dtype_info(g->dtype)->itemsize;
      g->s->pending_capacity = bytes > g->s->nbytes ? bytes : g->s->nbytes;
      g->s->pending = 1;
    }
  G.device = device;
  G.each = each;
  if (cgroup && !G.cgroup) {
    pj_cgroup_retain(cgroup);
    G.cgroup = cgroup;
    G.crank = crank;
  }
  if (recorded) *recorded = true;
  G.ops[G.nops++] = op;
  if (!cap) publish_shared_counts();
  if (!each) pj_metric_add(PJ_METRIC_DEFER_OPS, 1);
  pthread_mutex_unlock(&mu);
  return NULL;
}

pj_status_t *pj_defer_record(unsigned char *key, size_t keylen, uint64_t hash, uint64_t hash2,
                             int device, const pj_slot_t *slots, int nslots, const bool *writes,
                             const pj_scalar_t *scalars, int nscalars, char *site, bool each) {
  return record(key, keylen, hash, hash2, device, slots, nslots, writes, scalars, nscalars, site,
                each, NULL, 0, NULL);
}

/* Records a full call (pj_call_defer, pj_capture_record_collective): its key and written
 * slots taken here; with_site, its source line too (site_of gives NULL also when out of
 * memory: the error then names no line). */
static pj_status_t *record_call(pj_call_t *c, bool with_site, pj_cgroup_t *cgroup, int crank,
                                bool *recorded) {
  pj_keybuf_t k = {0};
  if (!pj_call_key(c, "", &k)) {
    free(k.p);
    return pj_status_new(PJ_ERR_OOM, "out of host memory building a cache key");
  }
  bool writes[PJ_CALL_MAX_SLOTS];
  for (int s = 0; s < c->nslots; s++) writes[s] = pj_call_writes_slot(c, s);
  return record(k.p, k.len, pj_hash_bytes(k.p, k.len, 0), pj_hash_bytes(k.p, k.len, PJ_KEY_SEED2),
                c->device, c->slots, c->nslots, writes, c->scalars, c->nscalars,
                with_site ? site_of(c) : NULL, false, cgroup, crank, recorded);
}

pj_status_t *pj_capture_record_collective(pj_call_t *c, pj_cgroup_t *g, int rank,
                                          bool *recorded) {
  *recorded = false;
  if (!g || strcmp(c->op, "_pj_collective") != 0 || c->nout != 1)
    return pj_status_new(PJ_ERR_VALUE, "pj_capture_record_collective: not a _pj_collective call");
  return record_call(c, false, g, rank, recorded);
}

/* A flush during a capture the calling thread records into: the capture breaks, its graph
 * runs, and so does the shared one (what this thread reads next may have been written there
 * before). */
static pj_status_t *flush_capturing(void) {
  pthread_mutex_lock(&mu);
  capture_state_t *c = cur_capture();
  if (!c) { /* a process-wide capture ended meanwhile */
    pthread_mutex_unlock(&mu);
    return pj_defer_flush();
  }
  c->broken = true;
  pj_status_t *st = in_flush ? NULL : flush_locked();
  if (!st && !in_flush && shared_graph.nops > 0) {
    tl_force_shared = true; /* G is the shared graph for this flush */
    st = flush_locked();
    tl_force_shared = false;
  }
  pthread_mutex_unlock(&mu);
  return st;
}

pj_status_t *pj_defer_flush(void) {
  /* Whatever asks for a flush is about to run something or read device state right away (an
   * op in Strict, a host copy, a CPU fallback, an event): during this thread's capture that
   * breaks it even when nothing is recorded yet, or the plan would bake in what that did
   * once. Another thread's capture is not affected. */
  if (cur_capture()) return flush_capturing();
  if (in_flush || atomic_load_explicit(&pending_ops, memory_order_acquire) == 0) return NULL;
  pthread_mutex_lock(&mu);
  /* a flush at a natural boundary (a read, a sync) is a boundary the loop already has */
  if (D.plen == 0) {
    D.active = false;
    detector_restart();
  } else {
    D.realign = true;
  }
  pj_status_t *st = flush_locked();
  pthread_mutex_unlock(&mu);
  return st;
}

int pj_defer_pending_ops(void) {
  if (!cur_capture()) return atomic_load(&pending_ops);
  pthread_mutex_lock(&mu); /* the capture's graph: the calling thread's recorded ops */
  const int n = G.nops;
  pthread_mutex_unlock(&mu);
  return n;
}

bool pj_defer_each_pending(void) { return atomic_load(&each_pending); }

pj_status_t *pj_defer_flush_queued(void) {
  if (in_flush || !atomic_load(&each_pending)) return NULL;
  pthread_mutex_lock(&mu);
  pj_status_t *st = NULL;
  if (!cur_capture()) st = shared_graph.each ? flush_locked() : NULL;
  pthread_mutex_unlock(&mu);
  return st;
}

/* ---- capture (capture.h; the plan itself is capture.c's) ---- */

static pj_status_t *capture_begin(bool whole_process) {
  if (tl_capture || atomic_load(&process_capture))
    return pj_status_new(PJ_ERR_RUNTIME, "a graph capture is already in progress");
  capture_state_t *c = calloc(1, sizeof *c);
  if (!c) return pj_status_new(PJ_ERR_OOM, "out of host memory starting a graph capture");
  pthread_mutex_lock(&mu);
  pj_status_t *st = NULL;
  if (whole_process && atomic_load(&process_capture))
    st = pj_status_new(PJ_ERR_RUNTIME, "a graph capture is already in progress");
  if (!st) st = flush_locked(); /* program order: what was recorded before runs first */
  if (!st && whole_process) atomic_store(&process_capture, c);
  else if (!st) tl_capture = c;
  pthread_mutex_unlock(&mu);
  if (st) free(c);
  return st;
}

pj_status_t *pj_capture_begin(void) { return capture_begin(true); }
pj_status_t *pj_capture_begin_thread(void) { return capture_begin(false); }

bool pj_capture_active(void) { return cur_capture() != NULL; }

void pj_capture_note_draw(int generator, uint64_t seed, uint64_t offset, uint64_t increment) {
  if (!cur_capture()) return;
  pthread_mutex_lock(&mu);
  capture_state_t *c = cur_capture();
  if (c && !c->broken) {
    if (c->ndraws == c->cap_draws) {
      int cap = c->cap_draws ? c->cap_draws * 2 : 16;
      pj_draw_t *p = realloc(c->draws, sizeof *p * (size_t)cap);
      if (p) {
        c->draws = p;
        c->cap_draws = cap;
      }
    }
    /* a draw the plan would not know of would replay the capture's numbers: no plan then */
    if (c->ndraws < c->cap_draws) c->draws[c->ndraws++] = (pj_draw_t){generator, seed, offset, increment};
    else c->broken = true;
  }
  pthread_mutex_unlock(&mu);
}

/* Ends the calling thread's current capture: its state goes (its graph is empty by now).
 * Caller holds mu. */
static void capture_state_free(void) {
  capture_state_t *c = cur_capture();
  if (c == tl_capture) tl_capture = NULL;
  else atomic_store(&process_capture, NULL);
  pj_graph_clear(&c->graph);
  free(c->draws);
  free(c);
}

pj_status_t *pj_capture_abort(void) {
  pthread_mutex_lock(&mu);
  pj_status_t *st = flush_locked(); /* what was recorded runs, as defer_and_fuse would */
  if (cur_capture()) capture_state_free();
  pthread_mutex_unlock(&mu);
  return st;
}

static pj_status_t *capture_finish(pj_storage_t *const *inputs, int nin,
                                   pj_storage_t *const *outputs, int nout, bool run,
                                   pj_plan_t **plan) {
  *plan = NULL;
  pthread_mutex_lock(&mu);
  capture_state_t *c = cur_capture();
  if (!c) {
    pthread_mutex_unlock(&mu);
    return pj_status_new(PJ_ERR_RUNTIME, "no graph capture is in progress");
  }
  if (c->broken || G.nops == 0) {
    if (c->broken) pj_metric_add(PJ_METRIC_PLAN_BROKEN, 1);
    pj_status_t *st = flush_locked();
    capture_state_free();
    pthread_mutex_unlock(&mu);
    return st;
  }
  graph_t g = G;
  memset(&G, 0, sizeof G);
  /* the capture's draws go with its graph */
  pj_draw_t *d = c->draws;
  int nd = c->ndraws;
  c->draws = NULL;
  capture_state_free();
  pthread_mutex_unlock(&mu);
  pj_status_t *st = pj_plan_capture(&g, d, nd, inputs, nin, outputs, nout, run, plan);
  free(d);
  return st;
}

pj_status_t *pj_capture_end(pj_storage_t *const *inputs, int nin, pj_storage_t *const *outputs,
                            int nout, pj_plan_t **plan) {
  return capture_finish(inputs, nin, outputs, nout, true, plan);
}

pj_status_t *pj_capture_end_unrun(pj_storage_t *const *inputs, int nin,
                                  pj_storage_t *const *outputs, int nout, pj_plan_t **plan) {
  return capture_finish(inputs, nin, outputs, nout, false, plan);
}

void pj_defer_set_max_ops(int n) {
  pthread_mutex_lock(&mu);
  max_ops = n < 1 ? 1 : n;
  pthread_mutex_unlock(&mu);
}
int pj_defer_max_ops(void) { return max_ops; }

void pj_defer_reset_detector(void) {
  pthread_mutex_lock(&mu);
  detector_forget();
  pthread_mutex_unlock(&mu);
}

/* "aten::<op>.<overload>" from a recorded key (identity "", then op, then overload). */
static void key_op_name(const dop_t *op, char *out, size_t n) {
  const unsigned char *p = op->key;
  int64_t len;
  memcpy(&len, p, 8);
  p += 8 + len + 1;
  memcpy(&len, p, 8);
  const char *name = (const char *)p + 8;
  p += 8 + len + 1;
  const char *ovl = (const char *)p + 8;
  snprintf(out, n, "aten::%s%s%s", name, *ovl ? "." : "", ovl);
}

char *pj_defer_graph_text(void) {
  pthread_mutex_lock(&mu);
  size_t cap = 256 + (size_t)shared_graph.nops * 160, len = 0;
  char *text = malloc(cap);
  if (!text) {
    pthread_mutex_unlock(&mu);
    return NULL;
  }
  len += (size_t)snprintf(text, cap, "pending graph: %d ops, %d storages\n", shared_graph.nops, shared_graph.nst);
  for (int i = 0; i < shared_graph.nops; i++) {
    const dop_t *op = &shared_graph.ops[i];
    char name[128], line[1024];
    key_op_name(op, name, sizeof name);
    int w = snprintf(line, sizeof line, "  %d: %s", i, name);
    for (int s = 0; s < op->nslots && w < (int)sizeof line - 32; s++) {
      const gstore_t *g = &shared_graph.st[op->gslot[s]];
      w += snprintf(line + w, sizeof line - (size_t)w, " s%llu:%s", (unsigned long long)g->s->id,
                    pj_dtype_info(g->dtype)->name);
    }
    if (len + (size_t)w + 2 > cap) {
      cap = (len + (size_t)w + 2) * 2;
      char *p = realloc(text, cap);
      if (!p) break;
      text = p;
    }
    memcpy(text + len, line, (size_t)w);
    len += (size_t)w;
    text[len++] = '\n';
    text[len] = 0;
  }
  pthread_mutex_unlock(&mu);
  return text;
}
