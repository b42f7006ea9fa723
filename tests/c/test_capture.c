/* Whole-graph capture without PyTorch: a graph recorded between pj_capture_begin and
 * pj_capture_end becomes a plan whose first run (at the end of the capture) gives the captured
 * storages their values; running the plan over new storages is one program execution that
 * writes the outputs and updates mutated inputs in place, never materializing intermediates;
 * a flush in the middle of a capture breaks it (no plan, the ops still take effect); an aborted
 * capture runs what was recorded; a plan refuses storages of other sizes, or inputs that alias
 * where they did not at capture, and leaves them intact; a plan's constants live with it; a
 * plan's random ops draw from the generator state each run is given, exactly as the same ops
 * run on their own would, and draws a run cannot replay give no plan. A thread's capture takes
 * only that thread's ops: another thread records, flushes and captures beside it. */
#include <pthread.h>
#include <string.h>

#include "ctest_device.h"
#include "torch_pjrt/call.h"
#include "torch_pjrt/capture.h"
#include "torch_pjrt/defer.h"
#include "torch_pjrt/metrics.h"
#include "torch_pjrt/storage.h"
#include "torch_pjrt/transfer.h"

#define N 4

static void read_storage(pj_storage_t *s, float *out, int64_t n) {
  EXPECT(!s->pending);
  OK(pj_storage_materialize(s, PJ_F32));
  OK(pj_transfer_to_host(s->buf, out, (size_t)n * sizeof(float)));
}

static void expect_values(pj_storage_t *s, const float *want, int64_t n) {
  float got[16];
  read_storage(s, got, n);
  for (int64_t i = 0; i < n; i++) {
    if (got[i] != want[i]) {
      fprintf(stderr, "  element %lld: got %g, want %g\n", (long long)i, got[i], want[i]);
      ctest_failures++;
    }
  }
}

/* The call's slot for storage s (appended when new); read marks it a program input. */
static int slot_of(pj_call_t *c, pj_storage_t *s, bool read) {
  for (int i = 0; i < c->nslots; i++)
    if (c->slots[i].storage == s) {
      c->slots[i].read = c->slots[i].read || read;
      return i;
    }
  c->slots[c->nslots] = (pj_slot_t){s, PJ_F32, N, read};
  return c->nslots++;
}

static pj_tensor_desc_t vec(int slot) {
  return (pj_tensor_desc_t){.dtype = PJ_F32, .rank = 1, .sizes = {N}, .strides = {1},
                            .slot = slot};
}

/* out = x <op> y over N floats, op "add" (Tensor, alpha 1) or "mul" (Tensor), as the bridge
 * would describe it; out may be x (in place) or a storage of its own. */
static void binary_call(pj_call_t *c, const char *op, pj_storage_t *x, pj_storage_t *y,
                        pj_storage_t *out) {
  memset(c, 0, sizeof *c);
  c->op = op;
  c->overload = "Tensor";
  int sx = slot_of(c, x, true), sy = slot_of(c, y, true), so = slot_of(c, out, false);
  c->ntensors = 2;
  c->tensors[0] = vec(sx);
  c->tensors[1] = vec(sy);
  c->args[c->nargs++] = (pj_arg_t){.name = "self", .kind = PJ_ARG_TENSOR, .first = 0, .count = 1};
  c->args[c->nargs++] = (pj_arg_t){.name = "other", .kind = PJ_ARG_TENSOR, .first = 1, .count = 1};
  if (!strcmp(op, "add")) {
    c->args[c->nargs++] = (pj_arg_t){.name = "alpha", .kind = PJ_ARG_SCALAR, .first = 0};
    c->scalars[c->nscalars++] = (pj_scalar_t){.dtype = PJ_I64, .i = 1};
  }
  c->nout = 1;
  c->outs[0] = vec(so);
}

/* out = x + v (add.Scalar, alpha 1). */
static void add_scalar_call(pj_call_t *c, pj_storage_t *x, pj_storage_t *out, double v) {
  memset(c, 0, sizeof *c);
  c->op = "add";
  c->overload = "Scalar";
  int sx = slot_of(c, x, true), so = slot_of(c, out, false);
  c->ntensors = 1;
  c->tensors[0] = vec(sx);
  c->nargs = 3;
  c->args[0] = (pj_arg_t){.name = "self", .kind = PJ_ARG_TENSOR, .first = 0, .count = 1};
  c->args[1] = (pj_arg_t){.name = "other", .kind = PJ_ARG_SCALAR, .first = 0};
  c->args[2] = (pj_arg_t){.name = "alpha", .kind = PJ_ARG_SCALAR, .first = 1};
  c->nscalars = 2;
  c->scalars[0] = (pj_scalar_t){.dtype = PJ_F64, .f = v};
  c->scalars[1] = (pj_scalar_t){.dtype = PJ_I64, .i = 1};
  c->nout = 1;
  c->outs[0] = vec(so);
}

static void defer(pj_call_t *c) { OK(pj_call_defer(c)); }

/* Records the test graph f(a, b): t = a + b; out = t * a; a *= b (in place). The intermediate t
 * is dropped by the caller before the capture ends, as a dead Python temporary would be. */
static void record_graph(pj_storage_t *a, pj_storage_t *b, pj_storage_t *out, bool flush_midway) {
  static pj_call_t c;
  pj_storage_t *t;
  OK(pj_storage_new(0, N * sizeof(float), &t));
  binary_call(&c, "add", a, b, t);
  defer(&c);
  binary_call(&c, "mul", t, a, out);
  defer(&c);
  pj_storage_release(t); /* only the graph holds it now */
  if (flush_midway) OK(pj_defer_flush());
  binary_call(&c, "mul", a, b, a);
  defer(&c);
}

/* What f(a, b) gives: out = (a + b) * a, and a's new contents a * b. */
static void graph_reference(const float *a, const float *b, float *out, float *a_new) {
  for (int i = 0; i < N; i++) {
    out[i] = (a[i] + b[i]) * a[i];
    a_new[i] = a[i] * b[i];
  }
}

static void expect_error(pj_status_t *st, const char *what) {
  EXPECT(st != NULL);
  if (!st) return;
  if (!strstr(pj_status_message(st), what)) {
    fprintf(stderr, "  unexpected message: %s\n", pj_status_message(st));
    ctest_failures++;
  }
  pj_status_free(st);
}

static void test_capture_and_run(void) {
  const int64_t live0 = pj_storage_live_count();
  const float av[N] = {1, 2, 3, 4}, bv[N] = {10, 20, 30, 40};
  float want_out[N], want_a[N];
  pj_storage_t *a = ctest_f32_storage(av, N), *b = ctest_f32_storage(bv, N), *out;
  OK(pj_storage_new(0, N * sizeof(float), &out));

  /* an op recorded before the capture runs at its beginning, outside the graph */
  static pj_call_t c;
  pj_storage_t *pre;
  OK(pj_storage_new(0, N * sizeof(float), &pre));
  binary_call(&c, "add", b, b, pre);
  defer(&c);
  EXPECT(pj_defer_pending_ops() == 1);
  EXPECT(!pj_capture_active());
  OK(pj_capture_begin());
  EXPECT(pj_capture_active());
  EXPECT(pj_defer_pending_ops() == 0 && !pre->pending);
  const float want_pre[N] = {20, 40, 60, 80};
  expect_values(pre, want_pre, N);
  pj_storage_release(pre);

  /* a second capture cannot start while one is in progress */
  expect_error(pj_capture_begin(), "already");
  EXPECT(pj_capture_active());

  const int64_t exec0 = pj_metric_get(PJ_METRIC_EXECUTIONS);
  const int64_t caps0 = pj_metric_get(PJ_METRIC_PLAN_CAPTURES);
  const int64_t runs0 = pj_metric_get(PJ_METRIC_PLAN_RUNS);
  const int64_t broken0 = pj_metric_get(PJ_METRIC_PLAN_BROKEN);
  record_graph(a, b, out, false);
  EXPECT(pj_defer_pending_ops() == 3);
  EXPECT(out->pending && a->pending && !b->pending);
  EXPECT(pj_metric_get(PJ_METRIC_EXECUTIONS) == exec0); /* nothing ran yet */

  pj_plan_t *plan = NULL;
  pj_storage_t *ins[2] = {a, b}, *outs[1] = {out};
  OK(pj_capture_end(ins, 2, outs, 1, &plan));
  EXPECT(plan != NULL);
  EXPECT(!pj_capture_active());
  EXPECT(pj_defer_pending_ops() == 0);
  EXPECT(pj_metric_get(PJ_METRIC_EXECUTIONS) == exec0 + 1); /* the capture's own run */
  EXPECT(pj_metric_get(PJ_METRIC_PLAN_CAPTURES) == caps0 + 1);
  EXPECT(pj_metric_get(PJ_METRIC_PLAN_RUNS) == runs0 + 1);
  EXPECT(pj_metric_get(PJ_METRIC_PLAN_BROKEN) == broken0);
  graph_reference(av, bv, want_out, want_a);
  expect_values(out, want_out, N);
  expect_values(a, want_a, N);
  expect_values(b, bv, N);
  if (!plan) {
    pj_storage_release(a);
    pj_storage_release(b);
    pj_storage_release(out);
    return;
  }

  /* three ops; parameters a and b; results out and the mutated a only (t is internal); the
   * add's alpha is the one scalar */
  int nops = -1, nparams = -1, nresults = -1, nscalars = -1;
  pj_plan_stats(plan, &nops, &nparams, &nresults, &nscalars);
  EXPECT(nops == 3);
  EXPECT(nparams == 2);
  EXPECT(nresults == 2);
  EXPECT(nscalars == 0); /* the add.Scalar value is a program constant */
  /* the plan holds no storage: t is gone, a, b and out are the caller's */
  pj_storage_release(a);
  pj_storage_release(b);
  pj_storage_release(out);
  EXPECT(pj_storage_live_count() == live0);

  char *text = NULL;
  OK(pj_plan_text(plan, &text));
  EXPECT(text && strstr(text, "func.func"));
  EXPECT(text && strstr(text, "stablehlo.multiply"));
  free(text);

  /* runs over new storages: one execution each, no compile, the inputs' values used */
  const int64_t compiles0 = pj_metric_get(PJ_METRIC_COMPILES);
  for (int rep = 0; rep < 2; rep++) {
    float a2v[N] = {-1, 0.5f, 2, 3}, b2v[N] = {4, 5, 6, 7};
    for (int i = 0; i < N; i++) a2v[i] += (float)rep, b2v[i] -= (float)(2 * rep);
    pj_storage_t *a2 = ctest_f32_storage(a2v, N), *b2 = ctest_f32_storage(b2v, N), *o2;
    OK(pj_storage_new(0, N * sizeof(float), &o2));
    const int64_t live1 = pj_storage_live_count();
    const int64_t e1 = pj_metric_get(PJ_METRIC_EXECUTIONS), r1 = pj_metric_get(PJ_METRIC_PLAN_RUNS);
    pj_storage_t *ins2[2] = {a2, b2}, *outs2[1] = {o2};
    OK(pj_plan_run(plan, ins2, 2, outs2, 1, NULL));
    EXPECT(pj_metric_get(PJ_METRIC_EXECUTIONS) == e1 + 1);
    EXPECT(pj_metric_get(PJ_METRIC_PLAN_RUNS) == r1 + 1);
    EXPECT(pj_metric_get(PJ_METRIC_COMPILES) == compiles0);
    EXPECT(pj_storage_live_count() == live1); /* no intermediate storage handed out */
    EXPECT(pj_defer_pending_ops() == 0);
    graph_reference(a2v, b2v, want_out, want_a);
    expect_values(o2, want_out, N);
    expect_values(a2, want_a, N); /* updated in place */
    expect_values(b2, b2v, N);
    pj_storage_release(a2);
    pj_storage_release(b2);
    pj_storage_release(o2);
  }

  /* a run first executes what defer_and_fuse recorded (program order): here an op that writes
   * the input the plan then reads */
  {
    const float xv[N] = {1, 1, 2, 2}, bv3[N] = {3, 3, 3, 3};
    pj_storage_t *x = ctest_f32_storage(xv, N), *b3 = ctest_f32_storage(bv3, N), *o3;
    OK(pj_storage_new(0, N * sizeof(float), &o3));
    binary_call(&c, "add", x, x, x); /* x = 2x, recorded */
    defer(&c);
    EXPECT(pj_defer_pending_ops() == 1);
    pj_storage_t *ins3[2] = {x, b3}, *outs3[1] = {o3};
    OK(pj_plan_run(plan, ins3, 2, outs3, 1, NULL));
    EXPECT(pj_defer_pending_ops() == 0);
    float x2[N];
    for (int i = 0; i < N; i++) x2[i] = 2 * xv[i];
    graph_reference(x2, bv3, want_out, want_a);
    expect_values(o3, want_out, N);
    expect_values(x, want_a, N);
    pj_storage_release(x);
    pj_storage_release(b3);
    pj_storage_release(o3);
  }

  /* refused runs: wrong counts, wrong sizes, inputs aliased where they were distinct. Nothing
   * runs and every storage keeps its contents. */
  {
    const float xv[N] = {5, 6, 7, 8}, yv[N] = {1, 2, 3, 4}, big[2 * N] = {1, 2, 3, 4, 5, 6, 7, 8};
    pj_storage_t *x = ctest_f32_storage(xv, N), *y = ctest_f32_storage(yv, N);
    pj_storage_t *x8 = ctest_f32_storage(big, 2 * N), *o, *o8;
    OK(pj_storage_new(0, N * sizeof(float), &o));
    OK(pj_storage_new(0, 2 * N * sizeof(float), &o8));
    const int64_t e1 = pj_metric_get(PJ_METRIC_EXECUTIONS), r1 = pj_metric_get(PJ_METRIC_PLAN_RUNS);

    pj_storage_t *one[1] = {x}, *outs_ok[1] = {o}, *outs_big[1] = {o8};
    expect_error(pj_plan_run(plan, one, 1, outs_ok, 1, NULL), "inputs");
    pj_storage_t *wrong_in[2] = {x8, y};
    expect_error(pj_plan_run(plan, wrong_in, 2, outs_ok, 1, NULL), "byte");
    pj_storage_t *wrong_in2[2] = {x, x8};
    expect_error(pj_plan_run(plan, wrong_in2, 2, outs_ok, 1, NULL), "byte");
    pj_storage_t *good_in[2] = {x, y};
    expect_error(pj_plan_run(plan, good_in, 2, outs_big, 1, NULL), "byte");
    pj_storage_t *aliased[2] = {x, x};
    expect_error(pj_plan_run(plan, aliased, 2, outs_ok, 1, NULL), "alias");
    pj_storage_t *out_is_input[1] = {x};
    expect_error(pj_plan_run(plan, good_in, 2, out_is_input, 1, NULL), "alias");
    /* the captured byte size, but int32 elements where the graph reads float32 */
    const int32_t iv[N] = {7, -7, 70, 700};
    int64_t n = N;
    pj_storage_t *xi;
    OK(pj_storage_new(0, sizeof iv, &xi));
    struct PJRT_Buffer *ibuf;
    OK(pj_transfer_to_device(0, iv, PJ_I32, &n, 1, &ibuf));
    pj_storage_swap(xi, ibuf, PJ_I32);
    pj_storage_t *int_in[2] = {xi, y};
    expect_error(pj_plan_run(plan, int_in, 2, outs_ok, 1, NULL), "float32");

    EXPECT(pj_metric_get(PJ_METRIC_EXECUTIONS) == e1);
    EXPECT(pj_metric_get(PJ_METRIC_PLAN_RUNS) == r1);
    expect_values(x, xv, N);
    expect_values(y, yv, N);
    expect_values(x8, big, 2 * N);
    int32_t iback[N];
    EXPECT(xi->dtype == PJ_I32);
    OK(pj_transfer_to_host(xi->buf, iback, sizeof iback));
    EXPECT(memcmp(iback, iv, sizeof iv) == 0);
    pj_storage_release(xi);
    EXPECT(o->buf == NULL && o8->buf == NULL); /* never written */

    /* the plan still works after refusing */
    OK(pj_plan_run(plan, good_in, 2, outs_ok, 1, NULL));
    graph_reference(xv, yv, want_out, want_a);
    expect_values(o, want_out, N);
    expect_values(x, want_a, N);
    pj_storage_release(x);
    pj_storage_release(y);
    pj_storage_release(x8);
    pj_storage_release(o);
    pj_storage_release(o8);
  }

  pj_plan_free(plan);
  EXPECT(pj_storage_live_count() == live0);
}

/* A flush forced in the middle of a capture breaks it: no plan, but every op takes effect. */
static void test_broken_capture(void) {
  const int64_t live0 = pj_storage_live_count();
  const float av[N] = {2, -3, 0.25f, 8}, bv[N] = {1, 1, 4, -0.5f};
  float want_out[N], want_a[N];
  pj_storage_t *a = ctest_f32_storage(av, N), *b = ctest_f32_storage(bv, N), *out;
  OK(pj_storage_new(0, N * sizeof(float), &out));
  const int64_t caps0 = pj_metric_get(PJ_METRIC_PLAN_CAPTURES);
  const int64_t broken0 = pj_metric_get(PJ_METRIC_PLAN_BROKEN);
  OK(pj_capture_begin());
  record_graph(a, b, out, true);
  EXPECT(pj_capture_active()); /* still capturing, but broken */
  EXPECT(pj_defer_pending_ops() == 1);
  pj_plan_t *plan = (pj_plan_t *)&plan; /* any non-NULL value: capture_end must reset it */
  pj_storage_t *ins[2] = {a, b}, *outs[1] = {out};
  OK(pj_capture_end(ins, 2, outs, 1, &plan));
  EXPECT(plan == NULL);
  EXPECT(!pj_capture_active());
  EXPECT(pj_defer_pending_ops() == 0);
  EXPECT(pj_metric_get(PJ_METRIC_PLAN_CAPTURES) == caps0);
  EXPECT(pj_metric_get(PJ_METRIC_PLAN_BROKEN) == broken0 + 1);
  graph_reference(av, bv, want_out, want_a);
  expect_values(out, want_out, N);
  expect_values(a, want_a, N);
  expect_values(b, bv, N);
  pj_storage_release(a);
  pj_storage_release(b);
  pj_storage_release(out);
  EXPECT(pj_storage_live_count() == live0);
}

/* An aborted capture runs what was recorded (as one defer_and_fuse graph; a capture has no size
 * bound, so nothing ran before the abort) and ends the capture. */
static void test_abort(void) {
  const int64_t live0 = pj_storage_live_count();
  const float av[N] = {1.5f, 2, -1, 0}, bv[N] = {2, 0.5f, 3, 9};
  float want_out[N], want_a[N];
  pj_storage_t *a = ctest_f32_storage(av, N), *b = ctest_f32_storage(bv, N), *out;
  OK(pj_storage_new(0, N * sizeof(float), &out));
  const int old_max = pj_defer_max_ops();
  pj_defer_set_max_ops(1);
  const int64_t exec0 = pj_metric_get(PJ_METRIC_EXECUTIONS);
  OK(pj_capture_begin());
  record_graph(a, b, out, false);
  EXPECT(pj_defer_pending_ops() == 3); /* the size bound does not cut a capture */
  EXPECT(pj_metric_get(PJ_METRIC_EXECUTIONS) == exec0);
  OK(pj_capture_abort());
  pj_defer_set_max_ops(old_max);
  EXPECT(!pj_capture_active());
  EXPECT(pj_defer_pending_ops() == 0);
  EXPECT(pj_metric_get(PJ_METRIC_EXECUTIONS) == exec0 + 1);
  graph_reference(av, bv, want_out, want_a);
  expect_values(out, want_out, N);
  expect_values(a, want_a, N);
  expect_values(b, bv, N);

  /* nothing to end any more */
  pj_plan_t *plan = NULL;
  pj_storage_t *ins[2] = {a, b}, *outs[1] = {out};
  expect_error(pj_capture_end(ins, 2, outs, 1, &plan), "no graph capture");
  EXPECT(plan == NULL);
  /* an empty capture gives no plan and no error */
  OK(pj_capture_begin());
  OK(pj_capture_end(ins, 2, outs, 1, &plan));
  EXPECT(plan == NULL && !pj_capture_active());
  pj_storage_release(a);
  pj_storage_release(b);
  pj_storage_release(out);
  EXPECT(pj_storage_live_count() == live0);
}

/* A storage the graph reads that no input holds (a graph constant) is kept by the plan: later
 * runs read it after the caller dropped it, and freeing the plan releases it. Scalar arguments
 * are kept too. */
static void test_constant(void) {
  const int64_t live0 = pj_storage_live_count();
  const float kv[N] = {2, 4, 0.5f, -1}, av[N] = {1, 2, 3, 4};
  pj_storage_t *k = ctest_f32_storage(kv, N), *a = ctest_f32_storage(av, N), *t, *out;
  OK(pj_storage_new(0, N * sizeof(float), &t));
  OK(pj_storage_new(0, N * sizeof(float), &out));
  static pj_call_t c;
  OK(pj_capture_begin());
  binary_call(&c, "mul", a, k, t); /* t = a * k */
  defer(&c);
  add_scalar_call(&c, t, out, 0.5); /* out = t + 0.5 */
  defer(&c);
  pj_storage_release(t);
  pj_plan_t *plan = NULL;
  pj_storage_t *ins[1] = {a}, *outs[1] = {out};
  OK(pj_capture_end(ins, 1, outs, 1, &plan));
  EXPECT(plan != NULL);
  float want[N];
  for (int i = 0; i < N; i++) want[i] = av[i] * kv[i] + 0.5f;
  expect_values(out, want, N);
  pj_storage_release(k); /* the plan's own reference remains */
  pj_storage_release(a);
  pj_storage_release(out);
  EXPECT(pj_storage_live_count() == live0 + 1);
  if (plan) {
    int nops, nparams, nresults, nscalars;
    pj_plan_stats(plan, &nops, &nparams, &nresults, &nscalars);
    EXPECT(nops == 2 && nparams == 2 && nresults == 1 && nscalars == 0); /* scalars are program constants */
    const float a2v[N] = {-2, 8, 6, 0.25f};
    pj_storage_t *a2 = ctest_f32_storage(a2v, N), *o2;
    OK(pj_storage_new(0, N * sizeof(float), &o2));
    pj_storage_t *ins2[1] = {a2}, *outs2[1] = {o2};
    OK(pj_plan_run(plan, ins2, 1, outs2, 1, NULL));
    for (int i = 0; i < N; i++) want[i] = a2v[i] * kv[i] + 0.5f;
    expect_values(o2, want, N);
    expect_values(a2, a2v, N);
    pj_storage_release(a2);
    pj_storage_release(o2);
    pj_plan_free(plan);
  }
  EXPECT(pj_storage_live_count() == live0);
}

/* An op that runs immediately while nothing is recorded yet (as a CPU fallback's upload or a
 * Strict op would) breaks the capture: a plan would bake in its one-time result. */
static void test_immediate_op_breaks_capture(void) {
  const float av[N] = {1, 2, 3, 4}, bv[N] = {10, 20, 30, 40};
  pj_storage_t *a = ctest_f32_storage(av, N), *b = ctest_f32_storage(bv, N), *t, *out;
  OK(pj_storage_new(0, N * sizeof(float), &t));
  OK(pj_storage_new(0, N * sizeof(float), &out));
  static pj_call_t c;
  const int64_t broken0 = pj_metric_get(PJ_METRIC_PLAN_BROKEN);
  OK(pj_capture_begin());
  binary_call(&c, "add", a, b, t);
  OK(pj_call_run(&c)); /* runs now: nothing was recorded before it */
  binary_call(&c, "mul", t, a, out);
  defer(&c);
  pj_storage_release(t);
  pj_plan_t *plan = NULL;
  pj_storage_t *ins[2] = {a, b}, *outs[1] = {out};
  OK(pj_capture_end(ins, 2, outs, 1, &plan));
  EXPECT(plan == NULL);
  EXPECT(pj_metric_get(PJ_METRIC_PLAN_BROKEN) == broken0 + 1);
  const float want[N] = {11, 44, 99, 176};
  expect_values(out, want, N);
  pj_plan_free(plan);
  pj_storage_release(a);
  pj_storage_release(b);
  pj_storage_release(out);
}

/* Inputs that were one storage at capture must be one storage at every run. */
static void test_run_refuses_split_alias(void) {
  const float av[N] = {1, 2, 3, 4};
  pj_storage_t *a = ctest_f32_storage(av, N), *out;
  OK(pj_storage_new(0, N * sizeof(float), &out));
  static pj_call_t c;
  OK(pj_capture_begin());
  binary_call(&c, "add", a, a, out);
  defer(&c);
  binary_call(&c, "mul", a, a, a);
  defer(&c);
  pj_plan_t *plan = NULL;
  pj_storage_t *ins[2] = {a, a}, *outs[1] = {out};
  OK(pj_capture_end(ins, 2, outs, 1, &plan));
  EXPECT(plan != NULL);
  if (plan) {
    const float pv[N] = {1, 1, 1, 1}, qv[N] = {5, 5, 5, 5};
    pj_storage_t *p = ctest_f32_storage(pv, N), *q = ctest_f32_storage(qv, N), *o2;
    OK(pj_storage_new(0, N * sizeof(float), &o2));
    pj_storage_t *i2[2] = {p, q}, *o2s[1] = {o2};
    expect_error(pj_plan_run(plan, i2, 2, o2s, 1, NULL), "were one storage at capture");
    expect_values(p, pv, N);
    expect_values(q, qv, N);
    pj_storage_t *i3[2] = {p, p};
    OK(pj_plan_run(plan, i3, 2, o2s, 1, NULL)); /* the captured aliasing still runs */
    const float want_out[N] = {2, 2, 2, 2};
    expect_values(o2, want_out, N);
    pj_storage_release(p);
    pj_storage_release(q);
    pj_storage_release(o2);
    pj_plan_free(plan);
  }
  pj_storage_release(a);
  pj_storage_release(out);
}

/* out = uniform(0, 1) over N floats with the given generator state (the "__seed"/"__offset"
 * scalars the bridge appends to a random op), as the bridge describes uniform_: with read_self
 * the destination is also the op's self tensor (an in-place op reads its target). */
static void uniform_call(pj_call_t *c, pj_storage_t *out, bool read_self, uint64_t seed,
                         uint64_t offset) {
  memset(c, 0, sizeof *c);
  c->op = "uniform";
  c->overload = "";
  int so = slot_of(c, out, read_self);
  if (read_self) {
    c->ntensors = 1;
    c->tensors[0] = vec(so);
    c->args[c->nargs++] = (pj_arg_t){.name = "self", .kind = PJ_ARG_TENSOR, .first = 0, .count = 1};
  }
  c->args[c->nargs++] = (pj_arg_t){.name = "from", .kind = PJ_ARG_FLOAT, .f = 0};
  c->args[c->nargs++] = (pj_arg_t){.name = "to", .kind = PJ_ARG_FLOAT, .f = 1};
  c->args[c->nargs++] = (pj_arg_t){.name = "__seed", .kind = PJ_ARG_SCALAR, .first = 0};
  c->args[c->nargs++] = (pj_arg_t){.name = "__offset", .kind = PJ_ARG_SCALAR, .first = 1};
  c->nscalars = 2;
  c->scalars[0] = (pj_scalar_t){.dtype = PJ_I64, .i = (int64_t)seed};
  c->scalars[1] = (pj_scalar_t){.dtype = PJ_I64, .i = (int64_t)offset};
  c->nout = 1;
  c->outs[0] = vec(so);
}

/* What uniform_call draws when run on its own (one program, as Strict runs it). */
static void uniform_reference(uint64_t seed, uint64_t offset, float *out) {
  static pj_call_t c;
  pj_storage_t *r;
  OK(pj_storage_new(0, N * sizeof(float), &r));
  uniform_call(&c, r, false, seed, offset);
  OK(pj_call_run(&c));
  read_storage(r, out, N);
  pj_storage_release(r);
}

static bool same_floats(const float *x, const float *y) { return !memcmp(x, y, N * sizeof(float)); }

#define SEED 0x123456789abcdefull

/* Records the random test graph g(a): u = uniform (draw 0, a temporary), out = a + u, a draw
 * whose op records nothing (draw 1: it only advances the generator), o2 = uniform_ in place on
 * a fresh storage (draw 2). Draws are noted as the bridge notes them, from the default
 * generator of device 0 starting at `offset` with increments 8, 4, 8 (draw 2 at offset + 12),
 * except that `generator` is draw 2's generator and `skip` moves its offset further on. */
static void record_random_graph(pj_storage_t *a, pj_storage_t *out, pj_storage_t *o2,
                                uint64_t offset, int generator, uint64_t skip, bool note_last) {
  static pj_call_t c;
  pj_storage_t *u;
  OK(pj_storage_new(0, N * sizeof(float), &u));
  pj_capture_note_draw(0, SEED, offset, 8);
  uniform_call(&c, u, false, SEED, offset);
  defer(&c);
  binary_call(&c, "add", a, u, out);
  defer(&c);
  pj_storage_release(u);
  pj_capture_note_draw(0, SEED, offset + 8, 4);
  if (note_last) pj_capture_note_draw(generator, SEED, offset + 12 + skip, 8);
  uniform_call(&c, o2, true, SEED, offset + 12 + skip);
  defer(&c);
}

/* A plan's random ops draw from the state each run is given: the capture's own draws at
 * capture, what the same ops draw on their own for any later state; the generator's seed and
 * base offset are its only scalar arguments, and a fresh output storage an op reads before
 * writing is no parameter (each run's output storage is as fresh). */
static void test_random_draws(void) {
  const int64_t live0 = pj_storage_live_count();
  const float av[N] = {10, 20, 30, 40};
  pj_storage_t *a = ctest_f32_storage(av, N), *out, *o2;
  OK(pj_storage_new(0, N * sizeof(float), &out));
  OK(pj_storage_new(0, N * sizeof(float), &o2));
  pj_capture_note_draw(0, SEED, 1, 8); /* not capturing: ignored */
  OK(pj_capture_begin());
  record_random_graph(a, out, o2, 100, 0, 0, true);
  pj_plan_t *plan = NULL;
  pj_storage_t *ins[1] = {a}, *outs[2] = {out, o2};
  OK(pj_capture_end(ins, 1, outs, 2, &plan));
  EXPECT(plan != NULL);
  float u0[N], u2[N], got[N], want[N];
  uniform_reference(SEED, 100, u0);
  uniform_reference(SEED, 112, u2);
  EXPECT(!same_floats(u0, u2));
  for (int i = 0; i < N; i++) want[i] = av[i] + u0[i];
  expect_values(out, want, N); /* the capture's run drew the capture's numbers */
  expect_values(o2, u2, N);
  pj_storage_release(out);
  pj_storage_release(o2);
  if (!plan) {
    pj_storage_release(a);
    return;
  }
  int device = -1;
  uint64_t increment = 0;
  EXPECT(pj_plan_draws(plan, &device, &increment) == 3);
  EXPECT(device == 0 && increment == 20);
  int nops, nparams, nresults, nscalars;
  pj_plan_stats(plan, &nops, &nparams, &nresults, &nscalars);
  EXPECT(nops == 3 && nparams == 1 && nresults == 2);
  EXPECT(nscalars == 2); /* seed and base offset; the add's alpha stays a constant */
  pj_scalar_t sc[4];
  EXPECT(pj_plan_scalars(plan, sc, 4) == 2);
  EXPECT(sc[0].dtype == PJ_I64 && sc[0].i == (int64_t)SEED && sc[1].i == 100);
  char *text = NULL;
  OK(pj_plan_text(plan, &text));
  EXPECT(text && strstr(text, "tensor<i64>"));
  free(text);

  /* runs from other states: one execution, no compile, each draw at base + its distance */
  const int64_t compiles0 = pj_metric_get(PJ_METRIC_COMPILES);
  const struct { uint64_t seed, offset; } states[3] = {{SEED, 100}, {SEED, 5000}, {SEED + 1, 100}};
  float first_o2[N] = {0};
  for (int k = 0; k < 3; k++) {
    pj_storage_t *r1, *r2;
    OK(pj_storage_new(0, N * sizeof(float), &r1));
    OK(pj_storage_new(0, N * sizeof(float), &r2));
    pj_storage_t *ins2[1] = {a}, *outs2[2] = {r1, r2};
    const pj_plan_rng_t rng = {states[k].seed, states[k].offset};
    const int64_t e1 = pj_metric_get(PJ_METRIC_EXECUTIONS);
    OK(pj_plan_run(plan, ins2, 1, outs2, 2, &rng));
    EXPECT(pj_metric_get(PJ_METRIC_EXECUTIONS) == e1 + 1);
    uniform_reference(rng.seed, rng.offset, u0);
    uniform_reference(rng.seed, rng.offset + 12, u2);
    for (int i = 0; i < N; i++) want[i] = av[i] + u0[i];
    expect_values(r1, want, N);
    expect_values(r2, u2, N);
    read_storage(r2, got, N);
    if (k == 0) memcpy(first_o2, got, sizeof got);
    else EXPECT(!same_floats(got, first_o2)); /* another state, other numbers */
    pj_storage_release(r1);
    pj_storage_release(r2);
  }
  EXPECT(pj_metric_get(PJ_METRIC_COMPILES) == compiles0);

  /* a drawing plan needs a state */
  {
    pj_storage_t *r1, *r2;
    OK(pj_storage_new(0, N * sizeof(float), &r1));
    OK(pj_storage_new(0, N * sizeof(float), &r2));
    pj_storage_t *ins2[1] = {a}, *outs2[2] = {r1, r2};
    expect_error(pj_plan_run(plan, ins2, 1, outs2, 2, NULL), "random draws");
    EXPECT(r1->buf == NULL && r2->buf == NULL);
    pj_storage_release(r1);
    pj_storage_release(r2);
  }
  pj_plan_free(plan);

  /* draws a run cannot replay give no plan, and the ops still take effect with the captured
   * numbers: a draw from another generator, draws not in a row, an op's pair no draw gave */
  for (int bad = 0; bad < 3; bad++) {
    pj_storage_t *r1, *r2;
    OK(pj_storage_new(0, N * sizeof(float), &r1));
    OK(pj_storage_new(0, N * sizeof(float), &r2));
    const int64_t broken0 = pj_metric_get(PJ_METRIC_PLAN_BROKEN);
    OK(pj_capture_begin());
    record_random_graph(a, r1, r2, 300, bad == 0 ? PJ_GENERATOR_OTHER : 0, bad == 1 ? 4 : 0,
                        bad != 2);
    pj_storage_t *ins2[1] = {a}, *outs2[2] = {r1, r2};
    pj_plan_t *none = (pj_plan_t *)&none;
    OK(pj_capture_end(ins2, 1, outs2, 2, &none));
    EXPECT(none == NULL);
    EXPECT(pj_metric_get(PJ_METRIC_PLAN_BROKEN) == broken0 + 1);
    uniform_reference(SEED, 300, u0);
    uniform_reference(SEED, 312 + (bad == 1 ? 4 : 0), u2);
    for (int i = 0; i < N; i++) want[i] = av[i] + u0[i];
    expect_values(r1, want, N);
    expect_values(r2, u2, N);
    pj_storage_release(r1);
    pj_storage_release(r2);
  }

  /* a plan without draws takes no state */
  {
    pj_storage_t *r1;
    OK(pj_storage_new(0, N * sizeof(float), &r1));
    static pj_call_t c;
    OK(pj_capture_begin());
    binary_call(&c, "add", a, a, r1);
    defer(&c);
    pj_storage_t *ins2[1] = {a}, *outs2[1] = {r1};
    OK(pj_capture_end(ins2, 1, outs2, 1, &plan));
    EXPECT(plan != NULL);
    if (plan) {
      EXPECT(pj_plan_draws(plan, &device, &increment) == 0);
      const pj_plan_rng_t rng = {SEED, 0};
      expect_error(pj_plan_run(plan, ins2, 1, outs2, 1, &rng), "random draws");
      pj_plan_free(plan);
    }
    pj_storage_release(r1);
  }
  pj_storage_release(a);
  EXPECT(pj_storage_live_count() == live0);
}

/* pj_capture_end_unrun (torch.tpu.TPUGraph): the capture runs nothing; every storage it touched
 * is the plan's (no inputs or outputs given), keeps its contents, and one the graph created reads
 * as zeros until a run; each run then updates them all in place. */
static void test_capture_without_run(void) {
  const int64_t live0 = pj_storage_live_count();
  const float av[N] = {1, 2, 3, 4}, bv[N] = {10, 20, 30, 40};
  pj_storage_t *a = ctest_f32_storage(av, N), *b = ctest_f32_storage(bv, N), *out;
  OK(pj_storage_new(0, N * sizeof(float), &out));
  const int64_t exec0 = pj_metric_get(PJ_METRIC_EXECUTIONS);
  OK(pj_capture_begin());
  record_graph(a, b, out, false);
  pj_plan_t *plan = NULL;
  OK(pj_capture_end_unrun(NULL, 0, NULL, 0, &plan));
  EXPECT(plan != NULL);
  EXPECT(pj_metric_get(PJ_METRIC_EXECUTIONS) == exec0);
  EXPECT(!a->pending && !out->pending);
  const float zeros[N] = {0};
  expect_values(a, av, N);
  expect_values(out, zeros, N);
  float want_out[N], want_a[N], cur[N];
  memcpy(cur, av, sizeof cur);
  for (int run = 0; plan && run < 2; run++) {
    OK(pj_plan_run(plan, NULL, 0, NULL, 0, NULL));
    graph_reference(cur, bv, want_out, want_a);
    expect_values(out, want_out, N);
    expect_values(a, want_a, N);
    memcpy(cur, want_a, sizeof cur);
  }
  expect_values(b, bv, N);
  if (plan) pj_plan_free(plan);
  pj_storage_release(a);
  pj_storage_release(b);
  pj_storage_release(out);
  EXPECT(pj_storage_live_count() == live0);
}

/* The other thread of test_thread_capture: while the main thread captures, it is not
 * capturing; its deferred op goes to the shared graph and its flush runs it without breaking
 * the main thread's capture; and it captures a graph of its own. */
static void *other_thread(void *arg) {
  (void)arg;
  EXPECT(!pj_capture_active());
  const float xv[N] = {1, 2, 3, 4}, yv[N] = {10, 20, 30, 40};
  pj_storage_t *x = ctest_f32_storage(xv, N), *y = ctest_f32_storage(yv, N), *sum, *out;
  OK(pj_storage_new(0, N * sizeof(float), &sum));
  OK(pj_storage_new(0, N * sizeof(float), &out));
  pj_call_t c;
  binary_call(&c, "add", x, y, sum);
  defer(&c);
  EXPECT(pj_defer_pending_ops() == 1); /* the shared graph's */
  OK(pj_defer_flush());
  const float want_sum[N] = {11, 22, 33, 44};
  expect_values(sum, want_sum, N);

  OK(pj_capture_begin_thread());
  EXPECT(pj_capture_active());
  record_graph(x, y, out, false);
  pj_plan_t *plan = NULL;
  pj_storage_t *ins[2] = {x, y}, *outs[1] = {out};
  OK(pj_capture_end(ins, 2, outs, 1, &plan));
  EXPECT(plan != NULL);
  float want_out[N], want_x[N];
  graph_reference(xv, yv, want_out, want_x);
  expect_values(out, want_out, N);
  expect_values(x, want_x, N);
  if (plan) pj_plan_free(plan);
  pj_storage_release(x);
  pj_storage_release(y);
  pj_storage_release(sum);
  pj_storage_release(out);
  return NULL;
}

static void test_thread_capture(void) {
  const int64_t live0 = pj_storage_live_count();
  const float av[N] = {2, -3, 0.25f, 8}, bv[N] = {1, 1, 4, -0.5f};
  pj_storage_t *a = ctest_f32_storage(av, N), *b = ctest_f32_storage(bv, N), *out;
  OK(pj_storage_new(0, N * sizeof(float), &out));
  const int64_t broken0 = pj_metric_get(PJ_METRIC_PLAN_BROKEN);
  const int64_t caps0 = pj_metric_get(PJ_METRIC_PLAN_CAPTURES);
  OK(pj_capture_begin_thread());
  expect_error(pj_capture_begin_thread(), "already");
  expect_error(pj_capture_begin(), "already");
  record_graph(a, b, out, false);
  pthread_t t;
  EXPECT(pthread_create(&t, NULL, other_thread, NULL) == 0);
  pthread_join(t, NULL);
  EXPECT(pj_capture_active());
  pj_plan_t *plan = NULL;
  pj_storage_t *ins[2] = {a, b}, *outs[1] = {out};
  OK(pj_capture_end(ins, 2, outs, 1, &plan));
  EXPECT(plan != NULL);
  EXPECT(!pj_capture_active());
  EXPECT(pj_metric_get(PJ_METRIC_PLAN_BROKEN) == broken0); /* neither capture broke */
  EXPECT(pj_metric_get(PJ_METRIC_PLAN_CAPTURES) == caps0 + 2);
  float want_out[N], want_a[N];
  graph_reference(av, bv, want_out, want_a);
  expect_values(out, want_out, N);
  expect_values(a, want_a, N);
  if (plan) pj_plan_free(plan);
  pj_storage_release(a);
  pj_storage_release(b);
  pj_storage_release(out);
  EXPECT(pj_storage_live_count() == live0);
}

int main(void) {
  CTEST_REQUIRE_PLUGIN();
  test_capture_and_run();
  test_broken_capture();
  test_abort();
  test_constant();
  test_capture_without_run();
  test_immediate_op_breaks_capture();
  test_run_refuses_split_alias();
  test_random_draws();
  test_thread_capture();
  EXPECT(pj_storage_live_count() == 0);
  CTEST_DONE();
}
