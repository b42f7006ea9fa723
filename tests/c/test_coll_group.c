/* In-process collective groups (coll_group.h) with 4 rank threads on the CPU plugin's 4
 * devices: all_reduce and all_gather against host sums, a mismatch reported to every rank
 * naming each rank's call (and the group usable afterwards), differing views reported as such,
 * a rank that never comes (timeouts on the others, then a broken group), a shutdown waking
 * waiters, a rank leaving without breaking the others' send/recv, and send/recv (data, and a size mismatch on both sides).
 * Program rounds (a whole compiled graph run as one program over the ranks' devices) with 2
 * rank threads: the summed result on each rank, ranks bringing different programs (or a
 * program against an ordinary collective) reported to both naming each rank's call, and a
 * failing build reaching both. Needs TORCH_PJRT_PLUGIN. */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ctest.h"
#include "torch_pjrt/coll_group.h"
#include "torch_pjrt/runtime.h"
#include "torch_pjrt/transfer.h"

#define N 4
#define MAXE 64

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* What one rank thread does and what it got. */
typedef struct {
  pj_cgroup_t *g;
  int rank;
  pj_coll_kind_t kind;
  const char *name;
  int64_t numel;  /* elements of the storage */
  int64_t size;   /* elements of the view (1-D) */
  int64_t offset;
  int skip;       /* this rank does not call */
  /* results */
  pj_status_t *st;
  bool views_differ;
  float out[MAXE * N];
  int64_t out_n;
  double seconds;
} job_t;

static float value(int rank, int64_t k) { return (float)(rank * 10 + k); }

static void *rank_main(void *arg) {
  job_t *j = arg;
  if (j->skip) return NULL;
  float host[MAXE];
  for (int64_t k = 0; k < j->numel; k++) host[k] = value(j->rank, k);
  struct PJRT_Buffer *buf;
  OK(pj_transfer_to_device(j->rank, host, PJ_F32, &j->numel, 1, &buf));
  const int64_t stride = 1;
  const pj_coll_view_t v = {1, &j->size, &stride, j->offset, j->numel};
  pj_cgroup_call_t c = {.kind = j->kind, .op = PJ_REDUCE_SUM, .dtype = PJ_F32, .ninputs = 1,
                        .inputs = &v, .buffers = &buf, .name = j->name};
  pj_cgroup_result_t res;
  const double t0 = now_s();
  j->st = pj_cgroup_collective(j->g, j->rank, &c, &res);
  j->seconds = now_s() - t0;
  if (!j->st) {
    j->views_differ = res.views_differ;
    if (res.noutputs == 1) {
      j->out_n = j->kind == PJ_COLL_ALL_GATHER ? N * j->size : j->size;
      EXPECT(res.out_rows == j->out_n);
      OK(pj_marker_wait(res.done));
      OK(pj_transfer_to_host(res.outs[0], j->out, sizeof(float) * (size_t)j->out_n));
      pj_buffer_destroy(res.outs[0]);
    }
    if (res.done) pj_marker_free(res.done);
  }
  pj_buffer_destroy(buf);
  return NULL;
}

/* Runs one round: job[r] prepared by the caller, threads joined. */
static void run(job_t *jobs) {
  pthread_t t[N];
  for (int r = 0; r < N; r++) pthread_create(&t[r], NULL, rank_main, &jobs[r]);
  for (int r = 0; r < N; r++) pthread_join(t[r], NULL);
}

static void prepare(job_t *jobs, pj_cgroup_t *g, pj_coll_kind_t kind, int64_t n) {
  memset(jobs, 0, sizeof(job_t) * N);
  for (int r = 0; r < N; r++) {
    jobs[r].g = g;
    jobs[r].rank = r;
    jobs[r].kind = kind;
    jobs[r].numel = jobs[r].size = n;
  }
}

static bool contains(const pj_status_t *st, const char *text) {
  return st && strstr(pj_status_message(st), text) != NULL;
}

static void free_statuses(job_t *jobs) {
  for (int r = 0; r < N; r++) {
    pj_status_free(jobs[r].st);
    jobs[r].st = NULL;
  }
}

static void test_all_reduce_all_gather(pj_cgroup_t *g) {
  job_t jobs[N];
  for (int round = 0; round < 3; round++) { /* several rounds: both slots, reused */
    prepare(jobs, g, PJ_COLL_ALL_REDUCE, 5);
    run(jobs);
    for (int r = 0; r < N; r++) {
      EXPECT(!jobs[r].st && !jobs[r].views_differ && jobs[r].out_n == 5);
      for (int64_t k = 0; k < 5 && !jobs[r].st; k++) {
        float want = 0;
        for (int q = 0; q < N; q++) want += value(q, k);
        EXPECT(jobs[r].out[k] == want);
      }
    }
    free_statuses(jobs);
  }
  prepare(jobs, g, PJ_COLL_ALL_GATHER, 3);
  run(jobs);
  for (int r = 0; r < N; r++) {
    EXPECT(!jobs[r].st && jobs[r].out_n == 3 * N);
    for (int q = 0; q < N && !jobs[r].st; q++)
      for (int64_t k = 0; k < 3; k++) EXPECT(jobs[r].out[q * 3 + k] == value(q, k));
  }
  free_statuses(jobs);
  /* views: the same shape read at one offset (from larger storages) on every rank */
  prepare(jobs, g, PJ_COLL_ALL_GATHER, 6);
  for (int r = 0; r < N; r++) jobs[r].size = 2, jobs[r].offset = 3;
  run(jobs);
  for (int r = 0; r < N; r++) {
    EXPECT(!jobs[r].st && jobs[r].out_n == 2 * N);
    for (int q = 0; q < N && !jobs[r].st; q++)
      for (int64_t k = 0; k < 2; k++) EXPECT(jobs[r].out[q * 2 + k] == value(q, 3 + k));
  }
  free_statuses(jobs);
  /* differing views: reported to every rank, nothing run */
  prepare(jobs, g, PJ_COLL_ALL_GATHER, 6);
  for (int r = 0; r < N; r++) jobs[r].size = 2, jobs[r].offset = r;
  run(jobs);
  for (int r = 0; r < N; r++) EXPECT(!jobs[r].st && jobs[r].views_differ && jobs[r].out_n == 0);
  free_statuses(jobs);
}

static void test_mismatch(pj_cgroup_t *g) {
  job_t jobs[N];
  prepare(jobs, g, PJ_COLL_ALL_GATHER, 4);
  jobs[0].kind = PJ_COLL_ALL_REDUCE;
  jobs[2].numel = jobs[2].size = 3;
  run(jobs);
  for (int r = 0; r < N; r++) {
    EXPECT(jobs[r].st);
    EXPECT(contains(jobs[r].st, "rank 0 called all_reduce(float32[4], ReduceOp.SUM)"));
    EXPECT(contains(jobs[r].st, "rank 1 called all_gather(float32[4])"));
    EXPECT(contains(jobs[r].st, "rank 2 called all_gather(float32[3])"));
  }
  if (jobs[0].st) printf("mismatch message: %s\n", pj_status_message(jobs[0].st));
  free_statuses(jobs);
  /* every rank got the error at the same call: the group goes on */
  prepare(jobs, g, PJ_COLL_ALL_REDUCE, 2);
  run(jobs);
  for (int r = 0; r < N; r++) EXPECT(!jobs[r].st && jobs[r].out_n == 2);
  free_statuses(jobs);
  /* the caller's name is part of the call */
  prepare(jobs, g, PJ_COLL_ALL_REDUCE, 2);
  jobs[3].name = "all_reduce_coalesced";
  run(jobs);
  for (int r = 0; r < N; r++) EXPECT(contains(jobs[r].st, "rank 3 called all_reduce_coalesced("));
  free_statuses(jobs);
}

static void test_timeout(void) {
  pj_cgroup_t *g;
  const int devs[N] = {0, 1, 2, 3};
  OK(pj_cgroup_new(N, devs, 200, &g));
  job_t jobs[N];
  prepare(jobs, g, PJ_COLL_ALL_REDUCE, 2);
  jobs[3].skip = 1;
  const double t0 = now_s();
  run(jobs);
  EXPECT(now_s() - t0 < 5.0);
  for (int r = 0; r < 3; r++) {
    EXPECT(jobs[r].st);
    EXPECT(jobs[r].seconds < 5.0);
  }
  /* whoever timed out first names the missing rank; the others see the broken group */
  int naming = 0;
  for (int r = 0; r < 3; r++) naming += contains(jobs[r].st, "waiting for rank(s) 3");
  EXPECT(naming >= 1);
  if (jobs[0].st) printf("timeout message: %s\n", pj_status_message(jobs[0].st));
  free_statuses(jobs);
  /* broken: every later call fails at once */
  prepare(jobs, g, PJ_COLL_ALL_REDUCE, 2);
  run(jobs);
  for (int r = 0; r < N; r++) EXPECT(contains(jobs[r].st, "cannot be used any more"));
  free_statuses(jobs);
  pj_cgroup_release(g);
}

typedef struct {
  pj_cgroup_t *g;
  double delay;
} shutdown_arg_t;

static void *shutdown_later(void *arg) {
  shutdown_arg_t *a = arg;
  struct timespec ts = {0, (long)(a->delay * 1e9)};
  nanosleep(&ts, NULL);
  pj_cgroup_shutdown(a->g, 2, "its process group was destroyed");
  return NULL;
}

static void test_shutdown_wakes(void) {
  pj_cgroup_t *g;
  const int devs[N] = {0, 1, 2, 3};
  OK(pj_cgroup_new(N, devs, 60000, &g));
  job_t jobs[N];
  prepare(jobs, g, PJ_COLL_ALL_REDUCE, 2);
  jobs[2].skip = jobs[3].skip = 1;
  pthread_t t;
  shutdown_arg_t a = {g, 0.1};
  pthread_create(&t, NULL, shutdown_later, &a);
  run(jobs);
  pthread_join(t, NULL);
  for (int r = 0; r < 2; r++) {
    EXPECT(contains(jobs[r].st, "rank 2 left the group (its process group was destroyed)"));
    EXPECT(jobs[r].seconds < 5.0); /* not the 60 s timeout */
  }
  free_statuses(jobs);
  pj_cgroup_release(g);
}

/* ---- send / recv ---- */

typedef struct {
  pj_cgroup_t *g;
  int rank, peer;
  bool is_send;
  int64_t n;
  uint64_t ticket;
  pj_status_t *st;
  float out[MAXE];
} p2p_job_t;

static void *p2p_main(void *arg) {
  p2p_job_t *j = arg;
  float host[MAXE];
  for (int64_t k = 0; k < j->n; k++) host[k] = j->is_send ? value(j->rank, k) : -1.0f;
  struct PJRT_Buffer *buf;
  OK(pj_transfer_to_device(j->rank, host, PJ_F32, &j->n, 1, &buf));
  pj_cgroup_result_t res;
  j->st = pj_cgroup_p2p(j->g, j->rank, j->peer, 7, j->ticket, j->is_send, PJ_F32, j->n, buf, &res);
  if (!j->st) {
    OK(pj_marker_wait(res.done));
    pj_marker_free(res.done);
    EXPECT(res.noutputs == (j->is_send ? 0 : 1));
    if (!j->is_send) {
      OK(pj_transfer_to_host(res.outs[0], j->out, sizeof(float) * (size_t)j->n));
      pj_buffer_destroy(res.outs[0]);
    }
  }
  pj_buffer_destroy(buf);
  return NULL;
}

static void test_p2p(pj_cgroup_t *g) {
  for (int mismatch = 0; mismatch < 2; mismatch++) {
    p2p_job_t s = {g, 1, 3, true, 4, 0, NULL, {0}}, r = {g, 3, 1, false, mismatch ? 5 : 4, 0, NULL, {0}};
    OK(pj_cgroup_p2p_ticket(g, 1, 3, 7, true, &s.ticket));
    OK(pj_cgroup_p2p_ticket(g, 1, 3, 7, false, &r.ticket));
    EXPECT(s.ticket == (uint64_t)mismatch && r.ticket == (uint64_t)mismatch);
    pthread_t a, b;
    pthread_create(&a, NULL, p2p_main, mismatch ? &s : &r); /* either side first */
    pthread_create(&b, NULL, p2p_main, mismatch ? &r : &s);
    pthread_join(a, NULL);
    pthread_join(b, NULL);
    if (!mismatch) {
      EXPECT(!s.st && !r.st);
      for (int64_t k = 0; k < 4 && !r.st; k++) EXPECT(r.out[k] == value(1, k));
    } else {
      EXPECT(contains(s.st, "rank 1 sent 4 float32 elements to rank 3 (tag 7), rank 3 receives 5"));
      EXPECT(contains(r.st, "rank 1 sent 4 float32 elements to rank 3 (tag 7), rank 3 receives 5"));
    }
    pj_status_free(s.st);
    pj_status_free(r.st);
  }
}

/* A rank that finished and left (pj_cgroup_leave) does not break the group for the others:
 * sends and recvs between ranks 1 and 3 go on; a collective (it needs rank 2) and a send to
 * rank 2 fail at once, naming the departure. */
static void test_leave_keeps_others(void) {
  pj_cgroup_t *g;
  const int devs[N] = {0, 1, 2, 3};
  OK(pj_cgroup_new(N, devs, 60000, &g));
  pj_cgroup_leave(g, 2, "its process group was destroyed");
  p2p_job_t s = {g, 1, 3, true, 4, 0, NULL, {0}}, r = {g, 3, 1, false, 4, 0, NULL, {0}};
  OK(pj_cgroup_p2p_ticket(g, 1, 3, 7, true, &s.ticket));
  OK(pj_cgroup_p2p_ticket(g, 1, 3, 7, false, &r.ticket));
  pthread_t a, b;
  pthread_create(&a, NULL, p2p_main, &s);
  pthread_create(&b, NULL, p2p_main, &r);
  pthread_join(a, NULL);
  pthread_join(b, NULL);
  EXPECT(!s.st && !r.st);
  for (int64_t k = 0; k < 4 && !r.st; k++) EXPECT(r.out[k] == value(1, k));
  pj_status_free(s.st);
  pj_status_free(r.st);

  job_t jobs[N];
  prepare(jobs, g, PJ_COLL_ALL_REDUCE, 2);
  jobs[2].skip = 1;
  run(jobs);
  for (int k = 0; k < N; k++) {
    if (k == 2) continue;
    EXPECT(contains(jobs[k].st, "rank 2 left the group (its process group was destroyed)"));
    EXPECT(jobs[k].seconds < 5.0); /* not the 60 s timeout */
  }
  free_statuses(jobs);

  p2p_job_t to_gone = {g, 0, 2, true, 4, 0, NULL, {0}};
  OK(pj_cgroup_p2p_ticket(g, 0, 2, 7, true, &to_gone.ticket));
  p2p_main(&to_gone);
  EXPECT(contains(to_gone.st, "rank 2 left the group (its process group was destroyed) (send to rank 2"));
  pj_status_free(to_gone.st);
  pj_cgroup_release(g);
}

static void test_errors(void) {
  pj_cgroup_t *g = NULL;
  const int dup[2] = {1, 1};
  pj_status_t *st = pj_cgroup_new(2, dup, 1000, &g);
  EXPECT(st && pj_status_code(st) == PJ_ERR_VALUE && !g);
  pj_status_free(st);
  const int devs[2] = {0, 1};
  OK(pj_cgroup_new(2, devs, 1000, &g));
  pj_cgroup_call_t c = {.kind = PJ_COLL_BARRIER};
  pj_cgroup_result_t res;
  st = pj_cgroup_collective(g, 2, &c, &res);
  EXPECT(st && pj_status_code(st) == PJ_ERR_VALUE);
  pj_status_free(st);
  pj_cgroup_shutdown(g, -1, "test");
  st = pj_cgroup_collective(g, 0, &c, &res);
  EXPECT(contains(st, "shut down (test)"));
  pj_status_free(st);
  pj_cgroup_release(g);
}

/* ---- program rounds ---- */

#define PN 4 /* elements of a program round's argument */

/* The program the ranks bring: an all_reduce (sum) of their tensor<4xf32> over both replicas. */
static const char kProgSum2[] =
    "func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {\n"
    "  %0 = \"stablehlo.all_reduce\"(%x) ({\n"
    "  ^bb0(%a: tensor<f32>, %b: tensor<f32>):\n"
    "    %s = stablehlo.add %a, %b : tensor<f32>\n"
    "    stablehlo.return %s : tensor<f32>\n"
    "  }) {replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>} : (tensor<4xf32>) -> "
    "tensor<4xf32>\n"
    "  return %0 : tensor<4xf32>\n"
    "}\n";

static int prog_builds; /* calls of build_text (atomic) */

/* ctx: the text, or NULL for a build that fails. */
static pj_status_t *build_text(void *ctx, char **text, size_t *len) {
  __atomic_add_fetch(&prog_builds, 1, __ATOMIC_RELAXED);
  if (!ctx) return pj_status_new(PJ_ERR_RUNTIME, "this test's build fails on purpose");
  *text = strdup(ctx);
  if (!*text) return pj_status_new(PJ_ERR_OOM, "out of host memory");
  *len = strlen(*text);
  return NULL;
}

typedef struct {
  pj_cgroup_t *g;
  int rank;
  const char *key; /* NULL: an ordinary all_reduce of the same tensor instead of a program */
  uint64_t keyhash;
  const char *text; /* what build returns; NULL: build fails */
  /* results */
  pj_status_t *st;
  bool got_out;  /* outs[0] was handed out */
  bool got_done; /* a marker came back */
  float out[PN];
} prog_job_t;

static float prog_value(int rank, int64_t k) { return (float)(rank + 1 + 10 * k); }

static void *prog_rank_main(void *arg) {
  prog_job_t *j = arg;
  float host[PN];
  int64_t n = PN;
  for (int64_t k = 0; k < n; k++) host[k] = prog_value(j->rank, k);
  struct PJRT_Buffer *buf;
  OK(pj_transfer_to_device(j->rank, host, PJ_F32, &n, 1, &buf));
  const bool donate[1] = {false};
  struct PJRT_Buffer *outs[1] = {NULL};
  const pj_cgroup_program_t p = {.key = j->key, .keylen = j->key ? strlen(j->key) : 0,
                                 .keyhash = j->keyhash, .nops = 1, .build = build_text,
                                 .build_ctx = (void *)j->text, .nargs = 1, .args = &buf,
                                 .donate = donate, .nouts = 1, .outs = outs};
  const int64_t stride = 1;
  const pj_coll_view_t v = {1, &n, &stride, 0, n};
  pj_cgroup_call_t c = {.kind = PJ_COLL_ALL_REDUCE, .op = PJ_REDUCE_SUM, .dtype = PJ_F32,
                        .ninputs = 1, .inputs = &v, .buffers = &buf};
  if (j->key) c.program = &p;
  pj_cgroup_result_t res;
  j->st = pj_cgroup_collective(j->g, j->rank, &c, &res);
  if (!j->key && !j->st && res.noutputs == 1) outs[0] = res.outs[0]; /* the collective's */
  j->got_out = outs[0] != NULL;
  j->got_done = !j->st && res.done != NULL;
  if (j->got_done) {
    OK(pj_marker_wait(res.done));
    pj_marker_free(res.done);
  }
  if (outs[0]) {
    if (!j->st) OK(pj_transfer_to_host(outs[0], j->out, sizeof j->out));
    pj_buffer_destroy(outs[0]);
  }
  pj_buffer_destroy(buf);
  return NULL;
}

/* One round of both ranks: jobs[r].g, key, keyhash and text set by the caller. */
static void prog_run(prog_job_t *jobs) {
  pthread_t t[2];
  for (int r = 0; r < 2; r++) {
    jobs[r].rank = r;
    jobs[r].st = NULL;
    jobs[r].got_out = jobs[r].got_done = false;
    pthread_create(&t[r], NULL, prog_rank_main, &jobs[r]);
  }
  for (int r = 0; r < 2; r++) pthread_join(t[r], NULL);
}

static void prog_prepare(prog_job_t *jobs, pj_cgroup_t *g, const char *key, uint64_t keyhash) {
  memset(jobs, 0, sizeof(prog_job_t) * 2);
  for (int r = 0; r < 2; r++) {
    jobs[r].g = g;
    jobs[r].key = key;
    jobs[r].keyhash = keyhash;
    jobs[r].text = kProgSum2;
  }
}

/* Both ranks ran it: each holds the sum of both ranks' inputs on its own device. */
static void expect_summed(const prog_job_t *jobs) {
  for (int r = 0; r < 2; r++) {
    EXPECT(!jobs[r].st && jobs[r].got_out && jobs[r].got_done);
    if (jobs[r].st) printf("program round, rank %d: %s\n", r, pj_status_message(jobs[r].st));
    for (int64_t k = 0; k < PN && jobs[r].got_out && !jobs[r].st; k++)
      EXPECT(jobs[r].out[k] == prog_value(0, k) + prog_value(1, k));
  }
}

static void prog_free_statuses(prog_job_t *jobs) {
  for (int r = 0; r < 2; r++) {
    pj_status_free(jobs[r].st);
    jobs[r].st = NULL;
  }
}

static pj_cgroup_t *new_pair_group(void) {
  pj_cgroup_t *g;
  const int devs[2] = {0, 1};
  OK(pj_cgroup_new(2, devs, 20000, &g));
  return g;
}

static void test_program_round(void) {
  pj_cgroup_t *g = new_pair_group();
  prog_job_t jobs[2];
  const int builds = __atomic_load_n(&prog_builds, __ATOMIC_RELAXED);
  /* three rounds: both slots, and the compiled program found by key after the first */
  for (int round = 0; round < 3; round++) {
    prog_prepare(jobs, g, "test-program-allreduce", 0xc0ffee01u);
    prog_run(jobs);
    expect_summed(jobs);
    prog_free_statuses(jobs);
  }
  EXPECT(__atomic_load_n(&prog_builds, __ATOMIC_RELAXED) == builds + 1);
  /* an ordinary collective after program rounds, in the same group */
  prog_prepare(jobs, g, NULL, 0);
  prog_run(jobs);
  expect_summed(jobs);
  prog_free_statuses(jobs);
  pj_cgroup_release(g);
}

/* Every rank gets the error naming both ranks' calls; nothing built, run or handed out. */
static void expect_differ(const prog_job_t *jobs, const char *rank0, const char *rank1) {
  for (int r = 0; r < 2; r++) {
    EXPECT(jobs[r].st && pj_status_code(jobs[r].st) == PJ_ERR_RUNTIME);
    EXPECT(contains(jobs[r].st, "called different collectives"));
    EXPECT(contains(jobs[r].st, rank0));
    EXPECT(contains(jobs[r].st, rank1));
    EXPECT(!jobs[r].got_out && !jobs[r].got_done);
  }
  if (jobs[0].st) printf("program mismatch message: %s\n", pj_status_message(jobs[0].st));
}

static void test_program_round_mismatch(void) {
  pj_cgroup_t *g = new_pair_group();
  prog_job_t jobs[2];
  const int builds = __atomic_load_n(&prog_builds, __ATOMIC_RELAXED);
  /* another key (and hash) on rank 1 */
  prog_prepare(jobs, g, "test-program-allreduce", 0xc0ffee01u);
  jobs[1].key = "test-program-other";
  jobs[1].keyhash = 0xc0ffee02u;
  prog_run(jobs);
  expect_differ(jobs, "rank 0 called a compiled graph of 1 ops (program key 00000000c0ffee01)",
                "rank 1 called a compiled graph of 1 ops (program key 00000000c0ffee02)");
  prog_free_statuses(jobs);
  /* the same hash and length, other bytes: the key itself is compared */
  prog_prepare(jobs, g, "test-program-allreduce", 0xc0ffee01u);
  jobs[1].key = "test-program-allreducf";
  prog_run(jobs);
  expect_differ(jobs, "rank 0 called a compiled graph of 1 ops",
                "rank 1 called a compiled graph of 1 ops");
  prog_free_statuses(jobs);
  EXPECT(__atomic_load_n(&prog_builds, __ATOMIC_RELAXED) == builds);
  /* both ranks failed at the same call: the group goes on */
  prog_prepare(jobs, g, "test-program-allreduce", 0xc0ffee01u);
  prog_run(jobs);
  expect_summed(jobs);
  prog_free_statuses(jobs);
  pj_cgroup_release(g);
}

static void test_program_round_vs_collective(void) {
  pj_cgroup_t *g = new_pair_group();
  prog_job_t jobs[2];
  /* rank 0 a program, rank 1 an ordinary all_reduce; then the other way round */
  for (int prog_rank = 0; prog_rank < 2; prog_rank++) {
    prog_prepare(jobs, g, "test-program-allreduce", 0xc0ffee01u);
    jobs[1 - prog_rank].key = NULL;
    prog_run(jobs);
    char prog_call[128], coll_call[128];
    snprintf(prog_call, sizeof prog_call,
             "rank %d called a compiled graph of 1 ops (program key 00000000c0ffee01)", prog_rank);
    snprintf(coll_call, sizeof coll_call, "rank %d called all_reduce(float32[4], ReduceOp.SUM)",
             1 - prog_rank);
    expect_differ(jobs, prog_call, coll_call);
    prog_free_statuses(jobs);
  }
  prog_prepare(jobs, g, "test-program-allreduce", 0xc0ffee01u);
  prog_run(jobs);
  expect_summed(jobs);
  prog_free_statuses(jobs);
  pj_cgroup_release(g);
}

/* The last arriver's build fails (a key never compiled): both ranks get its error, the group
 * goes on. */
static void test_program_round_build_error(void) {
  pj_cgroup_t *g = new_pair_group();
  prog_job_t jobs[2];
  prog_prepare(jobs, g, "test-program-build-fails", 0xbadu);
  jobs[0].text = jobs[1].text = NULL;
  prog_run(jobs);
  for (int r = 0; r < 2; r++) {
    EXPECT(contains(jobs[r].st, "this test's build fails on purpose"));
    EXPECT(!jobs[r].got_out && !jobs[r].got_done);
  }
  prog_free_statuses(jobs);
  prog_prepare(jobs, g, "test-program-allreduce", 0xc0ffee01u);
  prog_run(jobs);
  expect_summed(jobs);
  prog_free_statuses(jobs);
  pj_cgroup_release(g);
}

int main(void) {
  if (!getenv("TORCH_PJRT_PLUGIN")) {
    fprintf(stderr, "TORCH_PJRT_PLUGIN must name the CPU plugin .so (make ctest sets it)\n");
    return 1;
  }
  OK(pj_runtime_configure(getenv("TORCH_PJRT_PLUGIN"), N));
  pj_cgroup_t *g;
  const int devs[N] = {0, 1, 2, 3};
  OK(pj_cgroup_new(N, devs, 30000, &g));
  test_all_reduce_all_gather(g);
  test_mismatch(g);
  test_p2p(g);
  pj_cgroup_release(g);
  test_timeout();
  test_shutdown_wakes();
  test_leave_keeps_others();
  test_errors();
  test_program_round();
  test_program_round_mismatch();
  test_program_round_vs_collective();
  test_program_round_build_error();
  OK(pj_stream_synchronize(-1));
  CTEST_DONE();
}
