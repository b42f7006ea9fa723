/* In-process collective groups (coll_group.h): the rendezvous of N rank threads and the one
 * program they run together.
 *
 * Rounds. Call #s of the group uses round slot s % 2. A rank can only enter call #s+1 after
 * call #s has run (it waited for that), and call #s runs only once every rank entered it, i.e.
 * left call #s-1 (a rank leaves a round by picking its result). So when any rank enters call
 * #s+2, every rank has picked its result of call #s and that slot was reset by the last picker:
 * two slots are enough, and a slot's `seq` always equals the call entering it (checked).
 *
 * What a waiter may do depends on its round's state: OPEN (ranks still missing) it may give up
 * (timeout, shutdown, broken group) and withdraws its entry; RUNNING (the last arriver is
 * compiling/launching with everyone's buffers, outside the lock) it must wait, since its buffers
 * are in use and its outputs are coming; DONE it picks its result. */
#include "torch_pjrt/coll_group.h"

#include <errno.h>
#include <stdarg.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../hlo/strbuf.h"
#include "call_internal.h"
#include "torch_pjrt/bucket.h"
#include "torch_pjrt/transfer.h"

#define MAXR PJ_COLL_MAX_REPLICAS

typedef enum { R_OPEN, R_RUNNING, R_DONE } rstate_t;

typedef struct {
  uint64_t seq;
  rstate_t state;
  int arrived, picked;
  const pj_cgroup_call_t *calls[MAXR]; /* valid while their callers wait (they block) */
  pj_status_t *error;                  /* DONE with an error: each rank gets a copy */
  bool views_differ;
  int64_t pad_rows;
  int nout;
  int64_t out_numel;
  struct PJRT_Buffer **outs; /* [rank * MAXR + k], owned until picked */
  pj_marker_t *done[MAXR];
  int64_t out_rows[MAXR];
} round_t;

/* One side of a point-to-point transfer waiting for its partner. Lives on its caller's stack. */
typedef struct p2p {
  struct p2p *next;
  int src, dst, tag;
  uint64_t ticket;
  bool is_send;
  pj_dtype_t dtype;
  int64_t numel;
  struct PJRT_Buffer *buf;
  bool matched;  /* a partner took it: the transfer is running, wait for done */
  bool done;
  pj_status_t *error;
  struct PJRT_Buffer *out; /* recv: the data */
  pj_marker_t *marker;
} p2p_t;

typedef struct {
  int src, dst, tag;
  uint64_t sends, recvs;
} channel_t;

struct pj_cgroup {
  pthread_mutex_t mu; /* guards everything below but n and devices (fixed) */
  pthread_cond_t cv;  /* any round or p2p state, broken, left changed */
  int refs;
  int n;
  int devices[MAXR];
  int64_t timeout_ms;
  char *broken; /* first failure after which the ranks may be out of step; NULL while usable */
  /* Ranks that left normally (pj_cgroup_leave) and why: the group stays usable for what does
   * not need them (sends and recvs between the others), calls that need them fail. */
  bool left[MAXR];
  char *left_why[MAXR];
  uint64_t next_seq[MAXR];
  round_t rounds[2];
  p2p_t *waiting;
  channel_t *channels;
  int nchannels, capchannels;
};

/* ---- lifetime ---- */

pj_status_t *pj_cgroup_new(int nranks, const int *devices, int64_t timeout_ms, pj_cgroup_t **out) {
  *out = NULL;
  if (nranks < 1 || nranks > MAXR)
    return pj_status_new(PJ_ERR_VALUE, "collective group of %d ranks (1..%d)", nranks, MAXR);
  if (timeout_ms <= 0) return pj_status_new(PJ_ERR_VALUE, "collective group timeout must be > 0");
  for (int i = 0; i < nranks; i++)
    for (int j = 0; j < i; j++)
      if (devices[i] == devices[j])
        return pj_status_new(PJ_ERR_VALUE, "collective group: ranks %d and %d both on device %d",
                             j, i, devices[i]);
  pj_cgroup_t *g = calloc(1, sizeof *g);
  if (g) {
    g->rounds[0].outs = calloc((size_t)MAXR * MAXR, sizeof(struct PJRT_Buffer *));
    g->rounds[1].outs = calloc((size_t)MAXR * MAXR, sizeof(struct PJRT_Buffer *));
  }
  if (!g || !g->rounds[0].outs || !g->rounds[1].outs) {
    if (g) free(g->rounds[0].outs), free(g->rounds[1].outs);
    free(g);
    return pj_status_new(PJ_ERR_OOM, "out of host memory creating a collective group");
  }
  pthread_mutex_init(&g->mu, NULL);
  /* Deadlines on the monotonic clock: a wall-clock change must not fire or stall timeouts. */
  pthread_condattr_t ca;
  pthread_condattr_init(&ca);
  pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
  pthread_cond_init(&g->cv, &ca);
  pthread_condattr_destroy(&ca);
  g->refs = 1;
  g->n = nranks;
  memcpy(g->devices, devices, sizeof(int) * (size_t)nranks);
  g->timeout_ms = timeout_ms;
  g->rounds[0].seq = 0;
  g->rounds[1].seq = 1;
  *out = g;
  return NULL;
}

void pj_cgroup_retain(pj_cgroup_t *g) { __atomic_add_fetch(&g->refs, 1, __ATOMIC_RELAXED); }

static void round_clear(round_t *R, int n) {
  /* Results nobody picked (their rank withdrew or never came back) are freed here. */
  for (int r = 0; r < n; r++) {
    for (int k = 0; k < R->nout; k++) {
      if (R->outs[r * MAXR + k]) pj_buffer_destroy(R->outs[r * MAXR + k]);
      R->outs[r * MAXR + k] = NULL;
    }
    if (R->done[r]) pj_marker_free(R->done[r]);
    R->done[r] = NULL;
    R->calls[r] = NULL;
    R->out_rows[r] = 0;
  }
  pj_status_free(R->error);
  R->error = NULL;
  R->views_differ = false;
  R->pad_rows = 0;
  R->nout = 0;
  R->out_numel = 0;
  R->arrived = R->picked = 0;
  R->state = R_OPEN;
}

void pj_cgroup_release(pj_cgroup_t *g) {
  if (!g || __atomic_sub_fetch(&g->refs, 1, __ATOMIC_ACQ_REL) != 0) return;
  /* Last reference: nobody waits here any more (a waiter holds a reference through its
   * caller). */
  for (int i = 0; i < 2; i++) {
    round_clear(&g->rounds[i], g->n);
    free(g->rounds[i].outs);
  }
  free(g->channels);
  free(g->broken);
  for (int r = 0; r < g->n; r++) free(g->left_why[r]);
  pthread_cond_destroy(&g->cv);
  pthread_mutex_destroy(&g->mu);
  free(g);
}

void pj_cgroup_set_timeout(pj_cgroup_t *g, int64_t timeout_ms) {
  if (timeout_ms <= 0) return;
  pthread_mutex_lock(&g->mu);
  g->timeout_ms = timeout_ms;
  pthread_mutex_unlock(&g->mu);
}

int pj_cgroup_size(const pj_cgroup_t *g) { return g->n; }

static void break_locked(pj_cgroup_t *g, char *msg /* owned */) {
  if (!g->broken) g->broken = msg;
  else free(msg);
  pthread_cond_broadcast(&g->cv);
}

static char *dupf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *dupf(const char *fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof buf, fmt, ap);
  va_end(ap);
  return strdup(buf);
}

void pj_cgroup_shutdown(pj_cgroup_t *g, int rank, const char *why) {
  pthread_mutex_lock(&g->mu);
  if (rank < 0) {
    for (int r = 0; r < g->n; r++) g->left[r] = true;
    break_locked(g, dupf("the collective group was shut down (%s)", why ? why : "destroyed"));
  } else if (rank < g->n) {
    g->left[rank] = true;
    break_locked(g, dupf("rank %d left the group (%s)", rank, why ? why : "aborted"));
  }
  pthread_mutex_unlock(&g->mu);
}

void pj_cgroup_leave(pj_cgroup_t *g, int rank, const char *why) {
  if (rank < 0) return;
  pthread_mutex_lock(&g->mu);
  if (rank < g->n && !g->left[rank]) {
    g->left[rank] = true;
    g->left_why[rank] = dupf("rank %d left the group (%s)", rank, why ? why : "destroyed");
    pthread_cond_broadcast(&g->cv);
  }
  pthread_mutex_unlock(&g->mu);
}

/* ---- waiting ---- */

static struct timespec deadline_after(int64_t ms) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  t.tv_sec += (time_t)(ms / 1000);
  t.tv_nsec += (long)(ms % 1000) * 1000000L;
  if (t.tv_nsec >= 1000000000L) {
    t.tv_sec++;
    t.tv_nsec -= 1000000000L;
  }
  return t;
}

/* false once the deadline passed (NULL deadline: waits for a signal only). */
static bool wait_until(pj_cgroup_t *g, const struct timespec *deadline) {
  if (!deadline) {
    pthread_cond_wait(&g->cv, &g->mu);
    return true;
  }
  return pthread_cond_timedwait(&g->cv, &g->mu, deadline) != ETIMEDOUT;
}

/* ---- fingerprints ---- */

static const char *call_name(const pj_cgroup_call_t *c) {
  if (c->program) return "a compiled graph";
  return c->name ? c->name : pj_coll_kind_name(c->kind);
}

static bool same_shape(const pj_coll_view_t *a, const pj_coll_view_t *b) {
  if (a->rank != b->rank) return false;
  for (int i = 0; i < a->rank; i++)
    if (a->sizes[i] != b->sizes[i]) return false;
  return true;
}

static bool same_view(const pj_coll_view_t *a, const pj_coll_view_t *b) {
  if (!same_shape(a, b) || a->offset != b->offset || a->numel != b->numel) return false;
  for (int i = 0; i < a->rank; i++)
    if (a->sizes[i] > 1 && a->strides[i] != b->strides[i]) return false;
  return true;
}

/* What must agree between two ranks' calls (the view's layout may differ: see views_differ). */
static bool same_call(const pj_cgroup_call_t *a, const pj_cgroup_call_t *b) {
  if (a->program || b->program) {
    const pj_cgroup_program_t *x = a->program, *y = b->program;
    return x && y && x->keyhash == y->keyhash && x->keylen == y->keylen &&
           x->nargs == y->nargs && x->nouts == y->nouts && !memcmp(x->key, y->key, x->keylen);
  }
  if (a->kind != b->kind || strcmp(call_name(a), call_name(b)) != 0) return false;
  if (a->kind == PJ_COLL_BARRIER) return true;
  if (a->dtype != b->dtype || a->ninputs != b->ninputs || a->list_out != b->list_out) return false;
  if (pj_coll_is_reduction(a->kind) && a->op != b->op) return false;
  if (pj_coll_has_root(a->kind) && a->root != b->root) return false;
  if ((a->in_splits == NULL) != (b->in_splits == NULL)) return false;
  for (int i = 0; i < a->ninputs; i++) {
    const pj_coll_view_t *x = &a->inputs[i], *y = &b->inputs[i];
    /* uneven all_to_all: each rank sends its own row count (padded later, see pad_rows) */
    if (a->in_splits && x->rank == y->rank && x->rank > 0) {
      for (int k = 1; k < x->rank; k++)
        if (x->sizes[k] != y->sizes[k]) return false;
    } else if (!same_shape(x, y)) {
      return false;
    }
  }
  return true;
}

static void describe(pj_sb_t *sb, const pj_cgroup_call_t *c, int n) {
  if (c->program) {
    pj_sb_printf(sb, "a compiled graph of %d ops (program key %016llx)", c->program->nops,
                 (unsigned long long)c->program->keyhash);
    return;
  }
  pj_sb_printf(sb, "%s(", call_name(c));
  if (c->kind != PJ_COLL_BARRIER) {
    if (c->ninputs > 1) pj_sb_printf(sb, "%d x ", c->ninputs);
    pj_sb_printf(sb, "%s[", pj_dtype_info(c->dtype)->name);
    if (c->ninputs > 0)
      for (int i = 0; i < c->inputs[0].rank; i++)
        pj_sb_printf(sb, "%s%lld", i ? ", " : "", (long long)c->inputs[0].sizes[i]);
    pj_sb_puts(sb, "]");
    if (pj_coll_is_reduction(c->kind)) pj_sb_printf(sb, ", %s", pj_reduce_op_name(c->op));
    if (pj_coll_has_root(c->kind)) pj_sb_printf(sb, ", root %d", c->root);
    if (c->list_out) pj_sb_puts(sb, ", list");
    if (c->in_splits) {
      pj_sb_puts(sb, ", splits [");
      for (int i = 0; i < n; i++) pj_sb_printf(sb, "%s%lld", i ? ", " : "", (long long)c->in_splits[i]);
      pj_sb_puts(sb, "]");
    }
  }
  pj_sb_puts(sb, ")");
}

/* NULL when the round's calls agree; else the error naming each rank's call. */
static pj_status_t *verify(const pj_cgroup_t *g, const round_t *R) {
  bool ok = true;
  for (int r = 1; r < g->n && ok; r++) ok = same_call(R->calls[0], R->calls[r]);
  /* uneven all_to_all: what rank a sends to b is what b expects from a (where b says) */
  if (ok && R->calls[0]->in_splits)
    for (int a = 0; a < g->n && ok; a++)
      for (int b = 0; b < g->n && ok; b++)
        if (R->calls[b]->out_splits)
          ok = R->calls[a]->in_splits[b] == R->calls[b]->out_splits[a];
  if (ok) return NULL;
  pj_sb_t sb = {0};
  pj_sb_printf(&sb, "the ranks of this group called different collectives (or the same one with "
               "sizes that do not fit together) as call #%llu of the group: ",
               (unsigned long long)R->seq);
  for (int r = 0; r < g->n; r++) {
    pj_sb_printf(&sb, "%srank %d called ", r ? ", " : "", r);
    describe(&sb, R->calls[r], g->n);
  }
  char *msg = pj_sb_take(&sb, NULL);
  pj_status_t *st = pj_status_new(PJ_ERR_RUNTIME, "%s", msg ? msg : "collectives differ");
  free(msg);
  return st;
}

/* ---- running a round (the last arriver, outside the lock) ---- */

/* A program round: every rank's arguments, one launch, each rank's results into its own outs. */
static void run_program_round(pj_cgroup_t *g, round_t *R) {
  const pj_cgroup_program_t *p0 = R->calls[0]->program;
  struct PJRT_Buffer *const *args[MAXR];
  struct PJRT_Buffer **outs[MAXR];
  for (int r = 0; r < g->n; r++) {
    args[r] = R->calls[r]->program->args;
    outs[r] = R->calls[r]->program->outs;
  }
  R->error = pj_coll_launch(p0->key, p0->keylen, p0->build, p0->build_ctx, g->n, g->devices,
                            args, (size_t)p0->nargs, p0->donate, outs, R->done);
}

static void run_round(pj_cgroup_t *g, round_t *R) {
  const int n = g->n;
  const pj_cgroup_call_t *c0 = R->calls[0];
  if (c0->program) {
    run_program_round(g, R);
    return;
  }
  if (c0->in_splits && c0->ninputs == 1 && c0->inputs[0].rank > 0) {
    int64_t most = 0;
    bool differ = false;
    for (int r = 0; r < n; r++) {
      const int64_t rows = R->calls[r]->inputs[0].sizes[0];
      differ = differ || rows != c0->inputs[0].sizes[0];
      if (rows > most) most = rows;
    }
    if (differ) {
      R->views_differ = true;
      R->pad_rows = most;
      return;
    }
  }
  for (int r = 1; r < n; r++)
    for (int i = 0; i < c0->ninputs; i++)
      if (!same_view(&c0->inputs[i], &R->calls[r]->inputs[i])) {
        R->views_differ = true;
        return;
      }
  int64_t *in_splits = NULL, *out_splits = NULL;
  struct PJRT_Buffer **inputs = NULL, **outs = NULL;
  pj_marker_t *done[MAXR] = {0};
  double factors[MAXR];
  pj_coll_desc_t d = {
      .kind = c0->kind, .op = c0->op, .dtype = c0->dtype, .ninputs = c0->ninputs,
      .inputs = c0->inputs, .list_out = c0->list_out, .nreplicas = n, .group_size = n,
      .root = c0->root, .flat_out = true};
  pj_status_t *st = NULL;
  const int nin = c0->ninputs;
  if (c0->in_splits) {
    in_splits = malloc(sizeof(int64_t) * (size_t)(n * n));
    bool all_out = true;
    for (int r = 0; r < n; r++) all_out = all_out && R->calls[r]->out_splits;
    if (all_out) out_splits = malloc(sizeof(int64_t) * (size_t)(n * n));
    if (!in_splits || (all_out && !out_splits)) st = pj_status_new(PJ_ERR_OOM, "out of host memory");
    for (int r = 0; r < n && !st; r++)
      for (int k = 0; k < n; k++) {
        in_splits[r * n + k] = R->calls[r]->in_splits[k];
        if (out_splits) out_splits[r * n + k] = R->calls[r]->out_splits[k];
      }
    d.in_splits = in_splits;
    d.out_splits = out_splits;
  }
  const int nout = st ? 0 : pj_coll_num_outputs(&d);
  if (!st) {
    inputs = calloc((size_t)(n * (nin ? nin : 1)), sizeof *inputs);
    outs = calloc((size_t)(n * nout), sizeof *outs);
    if (!inputs || !outs) st = pj_status_new(PJ_ERR_OOM, "out of host memory");
  }
  for (int r = 0; r < n && !st; r++) {
    for (int i = 0; i < nin; i++) inputs[r * nin + i] = R->calls[r]->buffers[i];
    factors[r] = R->calls[r]->factor;
  }
  pj_type_t t;
  if (!st) st = pj_coll_output_type(&d, 0, &t);
  if (!st) st = pj_coll_run(&d, g->devices, inputs, factors, outs, done);
  if (st) {
    R->error = st;
  } else {
    R->nout = nout;
    R->out_numel = pj_type_numel(&t);
    for (int r = 0; r < n; r++) {
      for (int k = 0; k < nout; k++) R->outs[r * MAXR + k] = outs[r * nout + k];
      R->done[r] = done[r];
      R->out_rows[r] = pj_coll_out_rows(&d, r);
    }
  }
  free(in_splits);
  free(out_splits);
  free(inputs);
  free(outs);
}

/* ---- collectives ---- */

static pj_status_t *check_call(const pj_cgroup_t *g, int rank, const pj_cgroup_call_t *c) {
  if (rank < 0 || rank >= g->n)
    return pj_status_new(PJ_ERR_VALUE, "rank %d is not in a group of %d", rank, g->n);
  if (c->program) {
    const pj_cgroup_program_t *p = c->program;
    if (p->nargs < 0 || p->nouts < 0 || (p->nargs && !p->args) || (p->nouts && !p->outs) ||
        !p->key || !p->build)
      return pj_status_new(PJ_ERR_VALUE, "a compiled graph's round without its key, build, "
                           "arguments or outputs");
    return NULL;
  }
  if ((unsigned)c->kind >= PJ_COLL_NUM_KINDS)
    return pj_status_new(PJ_ERR_VALUE, "unknown collective kind %d", (int)c->kind);
  if (c->ninputs < 0 || c->ninputs > MAXR || (c->ninputs && (!c->inputs || !c->buffers)))
    return pj_status_new(PJ_ERR_VALUE, "%s: %d inputs without views or buffers", call_name(c),
                         c->ninputs);
  for (int i = 0; i < c->ninputs; i++)
    if (!c->buffers[i])
      return pj_status_new(PJ_ERR_VALUE, "%s: input %d has no buffer", call_name(c), i);
  return NULL;
}

/* A rank an OPEN round still waits for that left the group (it can never come), or -1. */
static int gone_missing(const pj_cgroup_t *g, const round_t *R) {
  for (int r = 0; r < g->n; r++)
    if (g->left[r] && !R->calls[r]) return r;
  return -1;
}

/* The missing ranks of an OPEN round, for messages. */
static void missing(const pj_cgroup_t *g, const round_t *R, char *buf, size_t cap) {
  size_t at = 0;
  buf[0] = 0;
  for (int r = 0; r < g->n && at + 16 < cap; r++)
    if (!R->calls[r]) at += (size_t)snprintf(buf + at, cap - at, "%s%d", at ? ", " : "", r);
}

pj_status_t *pj_cgroup_collective(pj_cgroup_t *g, int rank, const pj_cgroup_call_t *call,
                                  pj_cgroup_result_t *res) {
  memset(res, 0, sizeof *res);
  PJ_TRY(check_call(g, rank, call));
  pthread_mutex_lock(&g->mu);
  if (g->broken) {
    pj_status_t *st = pj_status_new(PJ_ERR_RUNTIME, "this group cannot be used any more: %s",
                                    g->broken);
    pthread_mutex_unlock(&g->mu);
    return st;
  }
  const uint64_t seq = g->next_seq[rank];
  round_t *R = &g->rounds[seq % 2];
  if (R->seq != seq || R->calls[rank]) { /* the invariant at the top of the file */
    pthread_mutex_unlock(&g->mu);
    return pj_status_new(PJ_ERR_RUNTIME, "internal: rank %d entered call #%llu in the slot of #%llu",
                         rank, (unsigned long long)seq, (unsigned long long)R->seq);
  }
  g->next_seq[rank]++;
  R->calls[rank] = call;
  R->arrived++;
  if (R->arrived == g->n) {
    R->error = verify(g, R);
    if (!R->error) {
      R->state = R_RUNNING;
      pthread_mutex_unlock(&g->mu);
      run_round(g, R);
      pthread_mutex_lock(&g->mu);
    }
    R->state = R_DONE;
    pthread_cond_broadcast(&g->cv);
  } else {
    const struct timespec deadline = deadline_after(g->timeout_ms);
    bool timed_out = false;
    while (R->state != R_DONE) {
      const int gone = R->state == R_OPEN ? gone_missing(g, R) : -1;
      if (R->state == R_OPEN && (g->broken || timed_out || gone >= 0)) {
        /* Give up: withdraw, so the round can never run with this rank's buffers. */
        char who[256];
        missing(g, R, who, sizeof who);
        R->calls[rank] = NULL;
        R->arrived--;
        pj_status_t *st;
        if (timed_out && !g->broken && gone < 0) {
          char *msg = dupf("rank %d timed out after %.3f s in %s, call #%llu of the group, "
                           "waiting for rank(s) %s", rank, (double)g->timeout_ms / 1000,
                           call_name(call), (unsigned long long)seq, who);
          st = pj_status_new(PJ_ERR_RUNTIME, "%s", msg ? msg : "timed out");
          break_locked(g, msg);
        } else {
          /* A departure is named only when nothing broke the group: a break says more. */
          const char *why = g->broken ? g->broken : g->left_why[gone];
          st = pj_status_new(PJ_ERR_RUNTIME, "%s (call #%llu of the group, %s, gave up)",
                             why ? why : "a rank left the group", (unsigned long long)seq,
                             call_name(call));
        }
        pthread_mutex_unlock(&g->mu);
        return st;
      }
      /* RUNNING: the launch is under way with our buffers; it ends without us. */
      timed_out = !wait_until(g, R->state == R_OPEN ? &deadline : NULL);
    }
  }
  /* Pick this rank's result. */
  pj_status_t *st = NULL;
  if (R->error) {
    st = pj_status_new(PJ_ERR_RUNTIME, "%s", pj_status_message(R->error));
  } else {
    res->views_differ = R->views_differ;
    res->pad_rows = R->pad_rows;
    res->out_numel = R->out_numel;
    res->noutputs = R->views_differ ? 0 : R->nout;
    for (int k = 0; k < res->noutputs; k++) {
      res->outs[k] = R->outs[rank * MAXR + k];
      R->outs[rank * MAXR + k] = NULL;
    }
    res->done = R->done[rank];
    R->done[rank] = NULL;
    res->out_rows = R->out_rows[rank];
  }
  R->calls[rank] = NULL;
  if (++R->picked == g->n) {
    round_clear(R, g->n);
    R->seq += 2;
  }
  pthread_mutex_unlock(&g->mu);
  return st;
}

/* ---- a recorded collective run on its own ---- */

static const pj_arg_t *call_arg(const pj_call_t *c, const char *name) {
  for (int i = 0; i < c->nargs; i++)
    if (!strcmp(c->args[i].name, name)) return &c->args[i];
  return NULL;
}

pj_status_t *pj_cgroup_run_call(pj_cgroup_t *g, int rank, const pj_call_t *c) {
  const pj_arg_t *self = call_arg(c, "self"), *kind = call_arg(c, "kind"),
                 *op = call_arg(c, "reduce_op");
  if (!self || self->kind != PJ_ARG_TENSOR || !kind || !op || c->nout != 1)
    return pj_status_new(PJ_ERR_RUNTIME, "internal: a recorded collective without its arguments");
  const pj_tensor_desc_t *in = &c->tensors[self->first], *out = &c->outs[0];
  pj_storage_t *src = c->slots[in->slot].storage, *dst = c->slots[out->slot].storage;
  const pj_dtype_t dt = in->dtype;
  const size_t item = pj_dtype_info(dt)->itemsize;
  pj_coll_view_t view = {in->rank, in->sizes, in->strides, in->offset, 0};
  pj_cgroup_call_t call = {.kind = (pj_coll_kind_t)kind->i, .op = (pj_reduce_op_t)op->i,
                           .dtype = dt, .ninputs = 1, .inputs = &view};
  struct PJRT_Buffer *buf = NULL;
  pthread_mutex_lock(&pj_run_lock); /* no program replaces the buffer between our read and the group's */
  pj_status_t *st = pj_storage_readable(src);
  if (!st && !src->buf) st = pj_storage_materialize(src, dt);
  if (!st) st = pj_bucket_trim_locked(src);
  if (!st) {
    buf = src->buf;
    view.numel = (int64_t)(src->nbytes / item);
  }
  pthread_mutex_unlock(&pj_run_lock);
  PJ_TRY(st);
  call.buffers = &buf;
  pj_cgroup_result_t res;
  PJ_TRY(pj_cgroup_collective(g, rank, &call, &res));
  if (res.views_differ || res.noutputs != 1 ||
      (size_t)res.out_numel * item != dst->nbytes) {
    for (int k = 0; k < res.noutputs; k++) pj_buffer_destroy(res.outs[k]);
    if (res.done) pj_marker_free(res.done);
    return pj_status_new(PJ_ERR_RUNTIME, "%s of a compiled graph run op by op: the ranks' "
                         "inputs differ in layout, or the result does not fill its storage",
                         pj_coll_kind_name(call.kind));
  }
  pthread_mutex_lock(&pj_run_lock);
  pj_storage_swap(dst, res.outs[0], out->dtype);
  pthread_mutex_unlock(&pj_run_lock);
  pj_marker_free(res.done); /* the buffer carries its own readiness */
  return NULL;
}

/* ---- point-to-point ---- */

static channel_t *channel_locked(pj_cgroup_t *g, int src, int dst, int tag) {
  for (int i = 0; i < g->nchannels; i++) {
    channel_t *c = &g->channels[i];
    if (c->src == src && c->dst == dst && c->tag == tag) return c;
  }
  if (g->nchannels == g->capchannels) {
    const int cap = g->capchannels ? 2 * g->capchannels : 8;
    channel_t *p = realloc(g->channels, sizeof *p * (size_t)cap);
    if (!p) return NULL;
    g->channels = p;
    g->capchannels = cap;
  }
  channel_t *c = &g->channels[g->nchannels++];
  *c = (channel_t){src, dst, tag, 0, 0};
  return c;
}

pj_status_t *pj_cgroup_p2p_ticket(pj_cgroup_t *g, int src, int dst, int tag, bool is_send,
                                  uint64_t *ticket) {
  if (src < 0 || src >= g->n || dst < 0 || dst >= g->n || src == dst)
    return pj_status_new(PJ_ERR_VALUE, "send/recv between ranks %d and %d of a group of %d",
                         src, dst, g->n);
  pthread_mutex_lock(&g->mu);
  channel_t *c = channel_locked(g, src, dst, tag);
  if (c) *ticket = is_send ? c->sends++ : c->recvs++;
  pthread_mutex_unlock(&g->mu);
  return c ? NULL : pj_status_new(PJ_ERR_OOM, "out of host memory");
}

static void unlink_p2p(pj_cgroup_t *g, p2p_t *e) {
  for (p2p_t **p = &g->waiting; *p; p = &(*p)->next)
    if (*p == e) {
      *p = e->next;
      return;
    }
}

static pj_status_t *p2p_mismatch(const p2p_t *s, const p2p_t *r) {
  return pj_status_new(PJ_ERR_RUNTIME,
                       "send and recv do not match: rank %d sent %lld %s elements to rank %d "
                       "(tag %d), rank %d receives %lld %s elements",
                       s->src, (long long)s->numel, pj_dtype_info(s->dtype)->name, s->dst, s->tag,
                       r->dst, (long long)r->numel, pj_dtype_info(r->dtype)->name);
}

/* Runs the pair's permute outside the lock: replica 0 is the sender, 1 the receiver. */
static pj_status_t *run_p2p(pj_cgroup_t *g, p2p_t *s, p2p_t *r) {
  const int64_t one = 1;
  const pj_coll_view_t v = {1, &s->numel, &one, 0, s->numel};
  const int pair[2] = {0, 1};
  const int devices[2] = {g->devices[s->src], g->devices[s->dst]};
  pj_coll_desc_t d = {.kind = PJ_COLL_PERMUTE, .dtype = s->dtype, .ninputs = 1, .inputs = &v,
                      .nreplicas = 2, .group_size = 2, .npairs = 1, .pairs = pair,
                      .flat_out = true};
  struct PJRT_Buffer *in[2] = {s->buf, r->buf}, *out[2] = {0};
  pj_marker_t *done[2] = {0};
  PJ_TRY(pj_coll_run(&d, devices, in, NULL, out, done));
  pj_buffer_destroy(out[0]); /* the sender's own input back: nobody needs it */
  s->marker = done[0];
  r->out = out[1];
  r->marker = done[1];
  return NULL;
}

pj_status_t *pj_cgroup_p2p(pj_cgroup_t *g, int rank, int peer, int tag, uint64_t ticket,
                           bool is_send, pj_dtype_t dt, int64_t numel, struct PJRT_Buffer *buf,
                           pj_cgroup_result_t *res) {
  memset(res, 0, sizeof *res);
  if (rank < 0 || rank >= g->n || peer < 0 || peer >= g->n || rank == peer)
    return pj_status_new(PJ_ERR_VALUE, "send/recv between ranks %d and %d of a group of %d",
                         rank, peer, g->n);
  if (!buf) return pj_status_new(PJ_ERR_VALUE, "send/recv without a buffer");
  p2p_t me = {.src = is_send ? rank : peer, .dst = is_send ? peer : rank, .tag = tag,
              .ticket = ticket, .is_send = is_send, .dtype = dt, .numel = numel, .buf = buf};
  pthread_mutex_lock(&g->mu);
  if (g->broken) {
    pj_status_t *st = pj_status_new(PJ_ERR_RUNTIME, "this group cannot be used any more: %s",
                                    g->broken);
    pthread_mutex_unlock(&g->mu);
    return st;
  }
  p2p_t *partner = NULL;
  for (p2p_t *e = g->waiting; e; e = e->next)
    if (e->src == me.src && e->dst == me.dst && e->tag == tag && e->ticket == ticket &&
        e->is_send != is_send) {
      partner = e;
      break;
    }
  if (partner) {
    unlink_p2p(g, partner);
    partner->matched = true;
    p2p_t *s = is_send ? &me : partner, *r = is_send ? partner : &me;
    pj_status_t *st = NULL;
    if (s->dtype != r->dtype || s->numel != r->numel) {
      st = p2p_mismatch(s, r);
    } else {
      pthread_mutex_unlock(&g->mu);
      st = run_p2p(g, s, r);
      pthread_mutex_lock(&g->mu);
    }
    if (st) partner->error = pj_status_new(PJ_ERR_RUNTIME, "%s", pj_status_message(st));
    partner->done = true;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    if (st) return st;
  } else {
    me.next = g->waiting;
    g->waiting = &me;
    const struct timespec deadline = deadline_after(g->timeout_ms);
    bool timed_out = false;
    while (!me.done) {
      if (!me.matched && (g->broken || g->left[peer] || timed_out)) {
        unlink_p2p(g, &me);
        const char *dir = is_send ? "send to" : "recv from";
        pj_status_t *st;
        if (g->broken) /* the group's first failure says why */
          st = pj_status_new(PJ_ERR_RUNTIME, "%s (%s rank %d, tag %d, gave up)", g->broken, dir,
                             peer, tag);
        else if (g->left[peer]) /* the peer's leave reason, when it gave one */
          st = pj_status_new(PJ_ERR_RUNTIME, "%s (%s rank %d, tag %d, gave up)",
                             g->left_why[peer] ? g->left_why[peer] : "the peer left the group",
                             dir, peer, tag);
        else
          st = pj_status_new(PJ_ERR_RUNTIME,
                             "rank %d timed out after %.3f s in a %s rank %d (tag %d): "
                             "the matching %s never came",
                             rank, (double)g->timeout_ms / 1000, dir, peer, tag,
                             is_send ? "recv" : "send");
        pthread_mutex_unlock(&g->mu);
        return st;
      }
      timed_out = !wait_until(g, me.matched ? NULL : &deadline);
    }
    pthread_mutex_unlock(&g->mu);
    if (me.error) return me.error;
  }
  res->done = me.marker;
  if (!is_send) {
    res->noutputs = 1;
    res->outs[0] = me.out;
    res->out_rows = res->out_numel = numel;
  }
  return NULL;
}
