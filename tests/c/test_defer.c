/* The defer_and_fuse recorder without PyTorch: call keys decode back to the same call, a
 * recorded chain of ops runs as one program at the flush with the results Strict gives, a
 * storage nothing else references is not materialized, the fused program is found in the
 * cache the second time, and a run whose fused program cannot be built is replayed op by op. */
#include <string.h>

#include "../../csrc/graph/call_internal.h"
#include "ctest_device.h"
#include "torch_pjrt/call.h"
#include "torch_pjrt/defer.h"
#include "torch_pjrt/metrics.h"
#include "torch_pjrt/storage.h"
#include "torch_pjrt/transfer.h"

/* out = self + alpha * other_scalar, as the bridge would describe add.Scalar (4 floats). */
static void add_scalar_call(pj_call_t *c, pj_storage_t *in, pj_storage_t *out, double v) {
  memset(c, 0, sizeof *c);
  c->op = "add";
  c->overload = "Scalar";
  c->nslots = 2;
  c->slots[0] = (pj_slot_t){in, PJ_F32, 4, true};
  c->slots[1] = (pj_slot_t){out, PJ_F32, 4, in == out};
  c->nargs = 3;
  c->args[0] = (pj_arg_t){.name = "self", .kind = PJ_ARG_TENSOR, .first = 0, .count = 1};
  c->args[1] = (pj_arg_t){.name = "other", .kind = PJ_ARG_SCALAR, .first = 0};
  c->args[2] = (pj_arg_t){.name = "alpha", .kind = PJ_ARG_SCALAR, .first = 1};
  c->nscalars = 2;
  c->scalars[0] = (pj_scalar_t){.dtype = PJ_F64, .f = v};
  c->scalars[1] = (pj_scalar_t){.dtype = PJ_I64, .i = 1};
  c->ntensors = 1;
  c->tensors[0] = (pj_tensor_desc_t){.dtype = PJ_F32, .rank = 1, .sizes = {4}, .strides = {1}};
  c->nout = 1;
  c->outs[0] = (pj_tensor_desc_t){.dtype = PJ_F32, .rank = 1, .sizes = {4}, .strides = {1},
                                  .slot = 1};
  if (in == out) c->nslots = 1, c->outs[0].slot = 0;
}

static void test_key_round_trip(void) {
  static pj_call_t c, d;
  float a[4] = {0};
  pj_storage_t *s = ctest_f32_storage(a, 4), *o;
  OK(pj_storage_new(0, sizeof a, &o));
  add_scalar_call(&c, s, o, 1.5);
  pj_keybuf_t k1 = {0}, k2 = {0};
  EXPECT(pj_call_key(&c, "id", &k1));
  EXPECT(pj_call_decode(k1.p, k1.len, 0, &d));
  EXPECT(strcmp(d.op, "add") == 0 && strcmp(d.overload, "Scalar") == 0);
  EXPECT(d.nscalars == 2 && d.scalars[1].dtype == PJ_I64 && d.args[2].first == 1);
  EXPECT(pj_call_key(&d, "id", &k2));
  EXPECT(k1.len == k2.len && memcmp(k1.p, k2.p, k1.len) == 0);
  /* a truncated key is refused, never read past its end */
  EXPECT(!pj_call_decode(k1.p, k1.len - 3, 0, &d));
  free(k1.p);
  free(k2.p);
  pj_storage_release(s);
  pj_storage_release(o);
}

/* x -> t = x + 1 -> y = t + 2 -> y += 3 (in place); t dies before the flush. */
static void run_chain(float *out, bool drop_t) {
  static pj_call_t c;
  float a[4] = {1, 2, 3, 4};
  pj_storage_t *x = ctest_f32_storage(a, 4), *t, *y;
  OK(pj_storage_new(0, sizeof a, &t));
  OK(pj_storage_new(0, sizeof a, &y));
  add_scalar_call(&c, x, t, 1);
  OK(pj_call_defer(&c));
  add_scalar_call(&c, t, y, 2);
  OK(pj_call_defer(&c));
  add_scalar_call(&c, y, y, 3);
  OK(pj_call_defer(&c));
  EXPECT(pj_defer_pending_ops() == 3);
  EXPECT(y->pending && t->pending && !x->pending);
  char *text = pj_defer_graph_text();
  EXPECT(text && strstr(text, "aten::add.Scalar"));
  free(text);
  if (drop_t) pj_storage_release(t); /* only the graph holds it now */
  OK(pj_defer_flush());
  EXPECT(pj_defer_pending_ops() == 0 && !y->pending);
  EXPECT(y->buf != NULL);
  if (!drop_t) {
    EXPECT(t->buf != NULL);
    pj_storage_release(t);
  }
  OK(pj_transfer_to_host(y->buf, out, sizeof(float) * 4));
  pj_storage_release(x);
  pj_storage_release(y);
}

static void test_fused_chain(void) {
  float out[4];
  int64_t flushes = pj_metric_get(PJ_METRIC_DEFER_FLUSHES);
  int64_t elided = pj_metric_get(PJ_METRIC_DEFER_ELIDED);
  int64_t compiles = pj_metric_get(PJ_METRIC_COMPILES);
  run_chain(out, true);
  for (int i = 0; i < 4; i++) EXPECT(out[i] == (float)(i + 1) + 6.0f);
  EXPECT(pj_metric_get(PJ_METRIC_DEFER_FLUSHES) == flushes + 1);
  EXPECT(pj_metric_get(PJ_METRIC_DEFER_ELIDED) == elided + 1);
  EXPECT(pj_metric_get(PJ_METRIC_COMPILES) == compiles + 1);
  run_chain(out, true); /* the same structure: the cached program */
  EXPECT(pj_metric_get(PJ_METRIC_COMPILES) == compiles + 1);
  run_chain(out, false); /* t alive: another program, which also returns t */
  for (int i = 0; i < 4; i++) EXPECT(out[i] == (float)(i + 1) + 6.0f);
  EXPECT(pj_metric_get(PJ_METRIC_COMPILES) == compiles + 2);
  EXPECT(pj_storage_live_count() == 0);
}

/* A recorded op whose lowering fails: the flush replays the ops one by one, so the op before it
 * takes effect, and reports the failing op. */
static void test_failed_fusion_replays(void) {
  static pj_call_t c;
  float a[4] = {1, 2, 3, 4}, out[4];
  pj_storage_t *x = ctest_f32_storage(a, 4), *y;
  OK(pj_storage_new(0, sizeof a, &y));
  add_scalar_call(&c, x, x, 10); /* x += 10, in place */
  OK(pj_call_defer(&c));
  add_scalar_call(&c, x, y, 1);
  c.args[0].name = "not_self"; /* the lowering finds no "self": it fails at build time */
  OK(pj_call_defer(&c));
  pj_status_t *st = pj_defer_flush();
  EXPECT(st != NULL);
  if (st) {
    EXPECT(strstr(pj_status_message(st), "add") != NULL);
    pj_status_free(st);
  }
  EXPECT(pj_defer_pending_ops() == 0 && !x->pending);
  OK(pj_transfer_to_host(x->buf, out, sizeof out));
  for (int i = 0; i < 4; i++) EXPECT(out[i] == a[i] + 10.0f);
  pj_storage_release(x);
  pj_storage_release(y);
  EXPECT(pj_storage_live_count() == 0);
}

int main(void) {
  CTEST_REQUIRE_PLUGIN();
  test_key_round_trip();
  test_fused_chain();
  test_failed_fusion_replays();
  CTEST_DONE();
}
