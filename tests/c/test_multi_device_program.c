/* Multi-device programs on the CPU plugin with 4 devices: one program compiled for N replicas
 * and launched on N devices in one call, its collectives (all_reduce sum and max over 2 and 4
 * devices and over sub-groups, all_gather, reduce_scatter, collective_permute, all_to_all)
 * checked on every device's output; replicas placed on devices in a shuffled order; errors as
 * statuses; and placements in the cache keys (memory and disk). Needs TORCH_PJRT_PLUGIN. */
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "ctest.h"
#include "torch_pjrt/disk_cache.h"
#include "torch_pjrt/exec.h"
#include "torch_pjrt/metrics.h"
#include "torch_pjrt/multi_exec.h"
#include "torch_pjrt/runtime.h"
#include "torch_pjrt/stream.h"
#include "torch_pjrt/transfer.h"

#define MAXR 4
#define MAXE 16

/* The reduction regions of all_reduce / reduce_scatter. */
#define SUM_REGION                                          \
  "  ^bb0(%a: tensor<f32>, %b: tensor<f32>):\n"             \
  "    %s = stablehlo.add %a, %b : tensor<f32>\n"           \
  "    stablehlo.return %s : tensor<f32>\n"
#define MAX_REGION                                          \
  "  ^bb0(%a: tensor<f32>, %b: tensor<f32>):\n"             \
  "    %s = stablehlo.maximum %a, %b : tensor<f32>\n"       \
  "    stablehlo.return %s : tensor<f32>\n"

static const char kSum4[] =
    "func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {\n"
    "  %0 = \"stablehlo.all_reduce\"(%x) ({\n" SUM_REGION
    "  }) {replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>} : (tensor<4xf32>) -> "
    "tensor<4xf32>\n"
    "  return %0 : tensor<4xf32>\n"
    "}\n";
static const char kSum2[] =
    "func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {\n"
    "  %0 = \"stablehlo.all_reduce\"(%x) ({\n" SUM_REGION
    "  }) {replica_groups = dense<[[0, 1]]> : tensor<1x2xi64>,\n"
    "      channel_handle = #stablehlo.channel_handle<handle = 1, type = 0>} : "
    "(tensor<4xf32>) -> tensor<4xf32>\n"
    "  return %0 : tensor<4xf32>\n"
    "}\n";
static const char kMax4[] =
    "func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {\n"
    "  %0 = \"stablehlo.all_reduce\"(%x) ({\n" MAX_REGION
    "  }) {replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>} : (tensor<4xf32>) -> "
    "tensor<4xf32>\n"
    "  return %0 : tensor<4xf32>\n"
    "}\n";
/* Two groups of two: sum in each pair, and max too (two outputs). */
static const char kPairs[] =
    "func.func @main(%x: tensor<4xf32>) -> (tensor<4xf32>, tensor<4xf32>) {\n"
    "  %0 = \"stablehlo.all_reduce\"(%x) ({\n" SUM_REGION
    "  }) {replica_groups = dense<[[0, 1], [2, 3]]> : tensor<2x2xi64>} : (tensor<4xf32>) -> "
    "tensor<4xf32>\n"
    "  %1 = \"stablehlo.all_reduce\"(%x) ({\n" MAX_REGION
    "  }) {replica_groups = dense<[[0, 1], [2, 3]]> : tensor<2x2xi64>} : (tensor<4xf32>) -> "
    "tensor<4xf32>\n"
    "  return %0, %1 : tensor<4xf32>, tensor<4xf32>\n"
    "}\n";
static const char kGather[] =
    "func.func @main(%x: tensor<2xf32>) -> tensor<8xf32> {\n"
    "  %0 = \"stablehlo.all_gather\"(%x) {all_gather_dim = 0 : i64,\n"
    "      replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>} : (tensor<2xf32>) -> "
    "tensor<8xf32>\n"
    "  return %0 : tensor<8xf32>\n"
    "}\n";
static const char kScatter[] =
    "func.func @main(%x: tensor<8xf32>) -> tensor<2xf32> {\n"
    "  %0 = \"stablehlo.reduce_scatter\"(%x) ({\n" SUM_REGION
    "  }) {scatter_dimension = 0 : i64,\n"
    "      replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>} : (tensor<8xf32>) -> "
    "tensor<2xf32>\n"
    "  return %0 : tensor<2xf32>\n"
    "}\n";
/* A ring: replica r sends to r + 1 (mod 4). */
static const char kPermute[] =
    "func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {\n"
    "  %0 = \"stablehlo.collective_permute\"(%x) {\n"
    "      source_target_pairs = dense<[[0, 1], [1, 2], [2, 3], [3, 0]]> : tensor<4x2xi64>} : "
    "(tensor<4xf32>) -> tensor<4xf32>\n"
    "  return %0 : tensor<4xf32>\n"
    "}\n";
/* Only 0 -> 1 and 1 -> 0: replicas 2 and 3 receive nothing. */
static const char kSwap[] =
    "func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {\n"
    "  %0 = \"stablehlo.collective_permute\"(%x) {\n"
    "      source_target_pairs = dense<[[0, 1], [1, 0]]> : tensor<2x2xi64>} : "
    "(tensor<4xf32>) -> tensor<4xf32>\n"
    "  return %0 : tensor<4xf32>\n"
    "}\n";
static const char kAllToAll[] =
    "func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {\n"
    "  %0 = \"stablehlo.all_to_all\"(%x) {split_dimension = 0 : i64, concat_dimension = 0 : i64,\n"
    "      split_count = 4 : i64,\n"
    "      replica_groups = dense<[[0, 1, 2, 3]]> : tensor<1x4xi64>} : (tensor<4xf32>) -> "
    "tensor<4xf32>\n"
    "  return %0 : tensor<4xf32>\n"
    "}\n";
/* No collective: the same text compiles portable and for any number of replicas. */
static const char kTwice[] =
    "func.func @main(%x: tensor<4xf32>) -> tensor<4xf32> {\n"
    "  %0 = stablehlo.add %x, %x : tensor<4xf32>\n"
    "  return %0 : tensor<4xf32>\n"
    "}\n";

/* in[r][i] = 10 * r + i + 1 (distinct per replica and element). */
static float input(int r, int i) { return (float)(10 * r + i + 1); }

/* Runs `text` compiled for ndev replicas on `devices` with replica r's one argument of nin
 * elements input(r, .), and copies nout elements of each of its nouts outputs to out[r][k]. */
static void run(const char *text, int ndev, const int *devices, int nin, int nouts, int nout,
                float out[MAXR][2][MAXE]) {
  pj_program_t *p;
  OK(pj_program_compile_multi(text, strlen(text), ndev, devices, &p));
  EXPECT(pj_program_num_outputs(p) == (size_t)nouts);
  pj_placement_t pl = pj_program_placement(p);
  EXPECT(pl.ndev == ndev);
  struct PJRT_Buffer *in[MAXR][1], *res[MAXR][2];
  struct PJRT_Buffer *const *args[MAXR];
  struct PJRT_Buffer **outs[MAXR];
  for (int r = 0; r < ndev; r++) {
    EXPECT(pl.devices[r] == (devices ? devices[r] : r));
    float host[MAXE];
    for (int i = 0; i < nin; i++) host[i] = input(r, i);
    int64_t n = nin;
    OK(pj_transfer_to_device(pl.devices[r], host, PJ_F32, &n, 1, &in[r][0]));
    args[r] = in[r];
    outs[r] = res[r];
  }
  pj_marker_t *done[MAXR];
  OK(pj_program_execute_multi(p, args, 1, NULL, outs, done));
  for (int r = 0; r < ndev; r++) {
    OK(pj_marker_wait(done[r]));
    EXPECT(pj_marker_query(done[r]));
    pj_marker_free(done[r]);
    /* Replica r's outputs live on its device (the copy is counted on the buffer's device). */
    const int64_t before = pj_device_metric_get(pl.devices[r], PJ_DEVICE_METRIC_D2H_TRANSFERS);
    for (int k = 0; k < nouts; k++) {
      OK(pj_transfer_to_host(res[r][k], out[r][k], (size_t)nout * sizeof(float)));
      pj_buffer_destroy(res[r][k]);
    }
    EXPECT(pj_device_metric_get(pl.devices[r], PJ_DEVICE_METRIC_D2H_TRANSFERS) == before + nouts);
    pj_buffer_destroy(in[r][0]);
  }
  pj_program_free(p);
}

/* Sums and maxima of small integers are exact in float32. */
static int near(float a, float b) { return a == b; }

static void test_all_reduce(void) {
  float out[MAXR][2][MAXE];
  /* Replica r on device 3 - r: replica numbers, not device numbers, name the group members. */
  const int rev[4] = {3, 2, 1, 0};
  run(kSum4, 4, rev, 4, 1, 4, out);
  for (int r = 0; r < 4; r++)
    for (int i = 0; i < 4; i++)
      EXPECT(near(out[r][0][i], input(0, i) + input(1, i) + input(2, i) + input(3, i)));
  run(kMax4, 4, NULL, 4, 1, 4, out);
  for (int r = 0; r < 4; r++)
    for (int i = 0; i < 4; i++) EXPECT(near(out[r][0][i], input(3, i)));
  /* Two replicas on devices 2 and 3 (a channel handle is accepted and changes nothing here). */
  const int upper[2] = {2, 3};
  run(kSum2, 2, upper, 4, 1, 4, out);
  for (int r = 0; r < 2; r++)
    for (int i = 0; i < 4; i++) EXPECT(near(out[r][0][i], input(0, i) + input(1, i)));
  /* Sub-groups {0,1} and {2,3}, sum and max, on a shuffled placement. */
  const int shuffled[4] = {1, 3, 0, 2};
  run(kPairs, 4, shuffled, 4, 2, 4, out);
  for (int r = 0; r < 4; r++) {
    const int lo = r < 2 ? 0 : 2;
    for (int i = 0; i < 4; i++) {
      EXPECT(near(out[r][0][i], input(lo, i) + input(lo + 1, i)));
      EXPECT(near(out[r][1][i], input(lo + 1, i)));
    }
  }
}

static void test_other_collectives(void) {
  float out[MAXR][2][MAXE];
  run(kGather, 4, NULL, 2, 1, 8, out);
  for (int r = 0; r < 4; r++)
    for (int j = 0; j < 8; j++) EXPECT(near(out[r][0][j], input(j / 2, j % 2)));
  /* Replica r keeps elements [2r, 2r + 2) of the sum. */
  run(kScatter, 4, NULL, 8, 1, 2, out);
  for (int r = 0; r < 4; r++)
    for (int i = 0; i < 2; i++) {
      const int j = 2 * r + i;
      EXPECT(near(out[r][0][i], input(0, j) + input(1, j) + input(2, j) + input(3, j)));
    }
  const int rev[4] = {3, 2, 1, 0};
  run(kPermute, 4, rev, 4, 1, 4, out);
  for (int r = 0; r < 4; r++)
    for (int i = 0; i < 4; i++) EXPECT(near(out[r][0][i], input((r + 3) % 4, i)));
  run(kSwap, 4, NULL, 4, 1, 4, out);
  for (int r = 0; r < 4; r++)
    for (int i = 0; i < 4; i++) EXPECT(near(out[r][0][i], r < 2 ? input(1 - r, i) : 0.0f));
  /* Element j of replica r's result is element r of replica j's input. */
  run(kAllToAll, 4, NULL, 4, 1, 4, out);
  for (int r = 0; r < 4; r++)
    for (int j = 0; j < 4; j++) EXPECT(near(out[r][0][j], input(j, r)));
}

static void expect_code(pj_status_t *st, pj_code_t code, const char *what) {
  if (!st || pj_status_code(st) != code)
    fprintf(stderr, "%s: expected code %d, got %s\n", what, (int)code,
            st ? pj_status_message(st) : "success");
  EXPECT(st && pj_status_code(st) == code);
  pj_status_free(st);
}

static void test_errors(void) {
  pj_program_t *p = NULL;
  const size_t len = strlen(kSum2);
  expect_code(pj_program_compile_multi(kSum2, len, 5, NULL, &p), PJ_ERR_VALUE, "5 of 4 devices");
  expect_code(pj_program_compile_multi(kSum2, len, 0, NULL, &p), PJ_ERR_VALUE, "0 devices");
  const int bad[2] = {0, 7}, twice[2] = {1, 1}, neg[2] = {-1, 0};
  expect_code(pj_program_compile_multi(kSum2, len, 2, bad, &p), PJ_ERR_INDEX, "device 7");
  expect_code(pj_program_compile_multi(kSum2, len, 2, neg, &p), PJ_ERR_INDEX, "device -1");
  expect_code(pj_program_compile_multi(kSum2, len, 2, twice, &p), PJ_ERR_VALUE, "device twice");
  EXPECT(p == NULL);
  /* A group naming replica 2 in a 2-replica program: the plugin's compile error, a status (the
   * plugin also logs its verifier's RET_CHECK message on stderr). */
  pj_status_t *st = pj_program_compile_multi(kSum4, strlen(kSum4), 2, NULL, &p);
  EXPECT(st != NULL && p == NULL);
  pj_status_free(st);

  OK(pj_program_compile_multi(kSum2, len, 2, NULL, &p));
  float host[4] = {1, 2, 3, 4};
  int64_t n = 4;
  struct PJRT_Buffer *a0, *a1, *a2;
  OK(pj_transfer_to_device(0, host, PJ_F32, &n, 1, &a0));
  OK(pj_transfer_to_device(1, host, PJ_F32, &n, 1, &a1));
  OK(pj_transfer_to_device(2, host, PJ_F32, &n, 1, &a2));
  struct PJRT_Buffer *l0[2] = {a0, a0}, *l1[2] = {a1, a1};
  struct PJRT_Buffer *const *args[2] = {l0, l1};
  struct PJRT_Buffer *o0[1] = {(struct PJRT_Buffer *)1}, *o1[1] = {(struct PJRT_Buffer *)1};
  struct PJRT_Buffer **outs[2] = {o0, o1};
  pj_metrics_reset();
  expect_code(pj_program_execute_multi(p, args, 2, NULL, outs, NULL), PJ_ERR_VALUE,
              "two arguments for one");
  expect_code(pj_program_execute_multi(p, args, 0, NULL, outs, NULL), PJ_ERR_VALUE,
              "no argument for one");
  /* Replica 1's argument on device 2. */
  struct PJRT_Buffer *w1[1] = {a2};
  struct PJRT_Buffer *const *wrong[2] = {l0, w1};
  expect_code(pj_program_execute_multi(p, wrong, 1, NULL, outs, NULL), PJ_ERR_VALUE,
              "argument on another device");
  struct PJRT_Buffer *none[1] = {NULL};
  struct PJRT_Buffer *const *nulls[2] = {l0, none};
  expect_code(pj_program_execute_multi(p, nulls, 1, NULL, outs, NULL), PJ_ERR_VALUE,
              "NULL argument");
  EXPECT(pj_metric_get(PJ_METRIC_EXECUTIONS) == 0);
  /* A bound program does not run through the one-device entry, nor a portable one here. */
  struct PJRT_Buffer *one = NULL;
  expect_code(pj_program_execute(p, 0, &a0, 1, NULL, &one), PJ_ERR_VALUE, "bound on one device");
  EXPECT(one == NULL);
  pj_program_t *portable;
  OK(pj_program_compile(kTwice, strlen(kTwice), &portable));
  EXPECT(pj_program_placement(portable).ndev == 0);
  struct PJRT_Buffer *const *single[1] = {l0};
  expect_code(pj_program_execute_multi(portable, single, 1, NULL, outs, NULL), PJ_ERR_VALUE,
              "portable through execute_multi");
  pj_program_free(portable);

  /* After the refusals the program still runs (without markers: synchronize covers it). */
  struct PJRT_Buffer *r0[1] = {a0}, *r1[1] = {a1};
  struct PJRT_Buffer *const *good[2] = {r0, r1};
  OK(pj_program_execute_multi(p, good, 1, NULL, outs, NULL));
  EXPECT(pj_metric_get(PJ_METRIC_EXECUTIONS) == 1);
  EXPECT(pj_device_metric_get(0, PJ_DEVICE_METRIC_EXECUTIONS) == 1);
  EXPECT(pj_device_metric_get(1, PJ_DEVICE_METRIC_EXECUTIONS) == 1);
  EXPECT(pj_device_metric_get(2, PJ_DEVICE_METRIC_EXECUTIONS) == 0);
  OK(pj_stream_synchronize(-1));
  EXPECT(pj_stream_pending(0) == 0 && pj_stream_pending(1) == 0);
  float got[4];
  OK(pj_transfer_to_host(o1[0], got, sizeof got));
  EXPECT(got[0] == 2 && got[3] == 8);

  /* Serialized and loaded again, the program is still bound to devices 0 and 1. */
  void *bytes = NULL;
  size_t blen = 0;
  OK(pj_program_serialize(p, &bytes, &blen));
  pj_program_t *q;
  OK(pj_program_deserialize(bytes, blen, &q));
  pj_placement_t ql = pj_program_placement(q);
  EXPECT(ql.ndev == 2 && ql.devices[0] == 0 && ql.devices[1] == 1);
  struct PJRT_Buffer *q0[1], *q1[1];
  struct PJRT_Buffer **qouts[2] = {q0, q1};
  OK(pj_program_execute_multi(q, good, 1, NULL, qouts, NULL));
  OK(pj_transfer_to_host(q0[0], got, sizeof got));
  EXPECT(got[0] == 2 && got[3] == 8);
  free(bytes);
  for (int r = 0; r < 2; r++) {
    pj_buffer_destroy(outs[r][0]);
    pj_buffer_destroy(qouts[r][0]);
  }
  pj_program_free(q);
  pj_buffer_destroy(a0);
  pj_buffer_destroy(a1);
  pj_buffer_destroy(a2);
  pj_program_free(p);
}

static int count_entries(const char *dir) {
  DIR *d = opendir(dir);
  int n = 0;
  for (struct dirent *e; d && (e = readdir(d));)
    n += strlen(e->d_name) > 4 && strcmp(e->d_name + strlen(e->d_name) - 4, ".pjx") == 0;
  if (d) closedir(d);
  return n;
}

static void remove_dir(const char *dir) {
  DIR *d = opendir(dir);
  char path[4096];
  for (struct dirent *e; d && (e = readdir(d));) {
    if (e->d_name[0] == '.') continue;
    snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
    unlink(path);
  }
  if (d) closedir(d);
  rmdir(dir);
}

/* One key, one text: portable, on devices {0,1}, on {1,0} and on {0,1,2} are four programs
 * in memory and four entries on disk, and each comes back as itself. */
static void test_cache_keys(void) {
  char dir[] = "/tmp/pj_multi_cache_XXXXXX";
  EXPECT(mkdtemp(dir) != NULL);
  OK(pj_disk_cache_configure(dir, 0));
  pj_cache_clear();
  const char key[] = "the same key";
  const size_t tl = strlen(kTwice);

  pj_program_t *single;
  OK(pj_program_compile(kTwice, tl, &single));
  pj_disk_cache_store(key, sizeof key, single);
  EXPECT(pj_cache_insert(key, sizeof key, single) == single);
  EXPECT(pj_cache_size() == 1);

  const int d01[2] = {0, 1}, d10[2] = {1, 0};
  pj_program_t *two, *swapped, *three, *again;
  OK(pj_program_for_placement(key, sizeof key, kTwice, tl, 2, d01, &two));
  EXPECT(two != single && pj_cache_size() == 2);
  OK(pj_program_for_placement(key, sizeof key, kTwice, tl, 2, d10, &swapped));
  EXPECT(swapped != two && pj_cache_size() == 3);
  OK(pj_program_for_placement(key, sizeof key, kTwice, tl, 3, NULL, &three));
  EXPECT(pj_cache_size() == 4);
  OK(pj_program_for_placement(key, sizeof key, kTwice, tl, 2, d01, &again));
  EXPECT(again == two && pj_cache_size() == 4);
  EXPECT(pj_cache_lookup(key, sizeof key) == single);
  pj_placement_t pl = {2, d01};
  EXPECT(pj_cache_lookup_placed(&pl, key, sizeof key) == two);
  pl.devices = d10;
  EXPECT(pj_cache_lookup_placed(&pl, key, sizeof key) == swapped);
  EXPECT(count_entries(dir) == 4);

  /* From disk: each placement loads its own executable. */
  pj_cache_clear();
  pj_metrics_reset();
  pj_program_t *loaded;
  pj_disk_cache_lookup(key, sizeof key, &loaded);
  EXPECT(loaded != NULL && pj_program_placement(loaded).ndev == 0);
  pj_program_free(loaded);
  OK(pj_program_for_placement(key, sizeof key, kTwice, tl, 2, d10, &swapped));
  EXPECT(pj_metric_get(PJ_METRIC_DISK_HITS) == 2);
  EXPECT(pj_metric_get(PJ_METRIC_COMPILES) == 0);
  pj_placement_t got = pj_program_placement(swapped);
  EXPECT(got.ndev == 2 && got.devices[0] == 1 && got.devices[1] == 0);
  /* It runs: replica 0 on device 1. */
  float host[4] = {1, 2, 3, 4}, res[4];
  int64_t n = 4;
  struct PJRT_Buffer *in1, *in0, *o[2][1];
  OK(pj_transfer_to_device(1, host, PJ_F32, &n, 1, &in1));
  OK(pj_transfer_to_device(0, host, PJ_F32, &n, 1, &in0));
  struct PJRT_Buffer *l0[1] = {in1}, *l1[1] = {in0};
  struct PJRT_Buffer *const *args[2] = {l0, l1};
  struct PJRT_Buffer **outs[2] = {o[0], o[1]};
  OK(pj_program_execute_multi(swapped, args, 1, NULL, outs, NULL));
  for (int r = 0; r < 2; r++) {
    OK(pj_transfer_to_host(o[r][0], res, sizeof res));
    EXPECT(res[0] == 2 && res[3] == 8);
    pj_buffer_destroy(o[r][0]);
  }
  pj_buffer_destroy(in0);
  pj_buffer_destroy(in1);
  /* A portable lookup never returns a bound entry: a key stored only bound is a miss. */
  const char other[] = "only bound";
  OK(pj_program_for_placement(other, sizeof other, kTwice, tl, 2, d01, &two));
  pj_disk_cache_lookup(other, sizeof other, &loaded);
  EXPECT(loaded == NULL);
  EXPECT(pj_cache_lookup(other, sizeof other) == NULL);

  OK(pj_stream_synchronize(-1));
  pj_cache_clear();
  OK(pj_disk_cache_configure(NULL, 0));
  remove_dir(dir);
}

int main(void) {
  if (!getenv("TORCH_PJRT_PLUGIN")) {
    fprintf(stderr, "TORCH_PJRT_PLUGIN must name the CPU plugin .so (make ctest sets it)\n");
    return 1;
  }
  OK(pj_runtime_configure(getenv("TORCH_PJRT_PLUGIN"), 4));
  pj_runtime_t *rt;
  OK(pj_runtime_get(&rt));
  EXPECT(pj_runtime_device_count(rt) == 4);
  for (int d = 0; d < 4; d++) EXPECT(pj_runtime_device_id(rt, d) >= 0);
  EXPECT(pj_runtime_device_id(rt, 4) == -1);
  test_all_reduce();
  test_other_collectives();
  test_errors();
  test_cache_keys();
  OK(pj_stream_synchronize(-1));
  CTEST_DONE();
}
