/* The background compile pool (compile_async.h) and Strict calls queued behind it
 * (pj_call_run_async): a job's program or its compile error reaches whoever takes it; queued
 * calls run in program order at the flush, with the values a direct run gives. */
#include <string.h>

#include "ctest_device.h"
#include "torch_pjrt/call.h"
#include "torch_pjrt/compile_async.h"
#include "torch_pjrt/defer.h"
#include "torch_pjrt/exec.h"
#include "torch_pjrt/storage.h"
#include "torch_pjrt/transfer.h"

static const char kAdd[] =
    "module {\n"
    "  func.func @main(%arg0: tensor<4xf32>) -> tensor<4xf32> {\n"
    "    %0 = stablehlo.add %arg0, %arg0 : tensor<4xf32>\n"
    "    return %0 : tensor<4xf32>\n"
    "  }\n"
    "}\n";

static char *dup_text(const char *s) {
  char *t = malloc(strlen(s) + 1);
  strcpy(t, s);
  return t;
}

static void test_pool(void) {
  const unsigned char good[] = "test-good-key", bad[] = "test-bad-key", none[] = "test-none";
  const uint64_t hg = pj_hash_bytes(good, sizeof good, 0), hb = pj_hash_bytes(bad, sizeof bad, 0);
  OK(pj_async_compile_submit(hg, good, sizeof good, dup_text(kAdd), strlen(kAdd), NULL));
  OK(pj_async_compile_submit(hb, bad, sizeof bad, dup_text("not a program"), 13, "bad one"));
  EXPECT(pj_async_compile_pending(hg, good, sizeof good));
  EXPECT(pj_async_compile_pending(hb, bad, sizeof bad));
  pj_async_compile_wait_idle();
  EXPECT(pj_async_compile_pending(hg, good, sizeof good)); /* finished, still to be taken */

  bool found = false;
  pj_program_t *p = NULL;
  OK(pj_async_compile_take(hg, good, sizeof good, &found, &p));
  EXPECT(found && p && pj_program_num_outputs(p) == 1);
  pj_program_free(p);
  EXPECT(!pj_async_compile_pending(hg, good, sizeof good));

  pj_status_t *st = pj_async_compile_take(hb, bad, sizeof bad, &found, &p);
  EXPECT(found && !p && st);
  if (st) {
    EXPECT(strstr(pj_status_message(st), "bad one: ") == pj_status_message(st));
    pj_status_free(st);
  }
  st = pj_async_compile_take(pj_hash_bytes(none, sizeof none, 0), none, sizeof none, &found, &p);
  EXPECT(!st && !found && !p);
}

/* out = x + x over n float32 elements (slot 0 read, slot 1 written whole). */
static void add_self(pj_call_t *c, pj_storage_t *x, pj_storage_t *out, int64_t n) {
  memset(c, 0, sizeof *c);
  c->op = "add";
  c->overload = "Tensor";
  c->nslots = 2;
  c->slots[0] = (pj_slot_t){x, PJ_F32, n, true};
  c->slots[1] = (pj_slot_t){out, PJ_F32, n, false};
  pj_tensor_desc_t d = {.dtype = PJ_F32, .rank = 1, .sizes = {n}, .strides = {1}, .slot = 0};
  c->ntensors = 2;
  c->tensors[0] = d;
  c->tensors[1] = d;
  c->nargs = 3;
  c->args[0] = (pj_arg_t){.name = "self", .kind = PJ_ARG_TENSOR, .first = 0, .count = 1};
  c->args[1] = (pj_arg_t){.name = "other", .kind = PJ_ARG_TENSOR, .first = 1, .count = 1};
  c->args[2] = (pj_arg_t){.name = "alpha", .kind = PJ_ARG_SCALAR, .first = 0, .count = 1};
  c->nscalars = 1;
  c->scalars[0] = (pj_scalar_t){.dtype = PJ_I64, .i = 1};
  c->nout = 1;
  d.slot = 1;
  c->outs[0] = d;
}

static void test_queued_calls(void) {
  enum { N = 7 }; /* a size no other test compiles */
  float a[N];
  for (int i = 0; i < N; i++) a[i] = (float)i;
  pj_storage_t *x = ctest_f32_storage(a, N);
  pj_storage_t *y, *z;
  OK(pj_storage_new(0, N * 4, &y));
  OK(pj_storage_new(0, N * 4, &z));
  static pj_call_t c;
  add_self(&c, x, y, N); /* y = 2x: a new program, queued behind its compile */
  OK(pj_call_run_async(&c, NULL));
  EXPECT(pj_defer_pending_ops() == 1);
  add_self(&c, y, z, N); /* z = 2y: same program, queued behind the first call */
  OK(pj_call_run_async(&c, NULL));
  EXPECT(pj_defer_pending_ops() == 2);
  OK(pj_defer_flush());
  EXPECT(pj_defer_pending_ops() == 0);
  float out[N];
  OK(pj_transfer_to_host(z->buf, out, sizeof out));
  for (int i = 0; i < N; i++) EXPECT(out[i] == 4.0f * (float)i);
  /* cached now, nothing pending: a call runs at once */
  add_self(&c, z, y, N);
  OK(pj_call_run_async(&c, NULL));
  EXPECT(pj_defer_pending_ops() == 0);
  OK(pj_transfer_to_host(y->buf, out, sizeof out));
  for (int i = 0; i < N; i++) EXPECT(out[i] == 8.0f * (float)i);
  pj_storage_release(x);
  pj_storage_release(y);
  pj_storage_release(z);
}

int main(void) {
  CTEST_REQUIRE_PLUGIN();
  pj_async_compile_set_threads(2);
  test_pool();
  test_queued_calls();
  CTEST_DONE();
}
