/* Size buckets (torch_pjrt/bucket.h) against the real plugin, without PyTorch: the bucket of a
 * size; a call is rewritten only when its storages allow it; a bucketed elementwise op leaves a
 * padded storage whose first n elements are the results; the next size in the bucket compiles
 * nothing; a reduction over a padded storage ignores its padding; a trim gives back an exact
 * buffer with the same elements. */
#include <string.h>

#include "ctest_device.h"
#include "torch_pjrt/bucket.h"
#include "torch_pjrt/call.h"
#include "torch_pjrt/metrics.h"
#include "torch_pjrt/storage.h"
#include "torch_pjrt/transfer.h"

/* A float32 storage of n elements whose buffer is padded to cap elements; the padding holds
 * `pad` (values no reader may see). */
static pj_storage_t *padded_storage(const float *data, int64_t n, int64_t cap, float pad) {
  pj_storage_t *s;
  OK(pj_storage_new(0, (size_t)n * sizeof(float), &s));
  float all[64];
  for (int64_t i = 0; i < cap; i++) all[i] = i < n ? data[i] : pad;
  struct PJRT_Buffer *buf;
  OK(pj_transfer_to_device(0, all, PJ_F32, &cap, 1, &buf));
  pj_storage_swap_padded(s, buf, PJ_F32, (size_t)cap * sizeof(float));
  return s;
}

static pj_tensor_desc_t whole(int64_t n, int slot) {
  pj_tensor_desc_t d = {.dtype = PJ_F32, .rank = 1, .slot = slot};
  d.sizes[0] = n;
  d.strides[0] = 1;
  return d;
}

/* A one-input op on src's n elements into dst (0-d when out_rank is 0). */
static void unary_call(pj_call_t *c, const char *op, pj_storage_t *src, pj_storage_t *dst,
                       int64_t n, int out_rank) {
  memset(c, 0, sizeof *c);
  c->op = op;
  c->overload = "";
  c->nslots = 2;
  c->slots[0] = (pj_slot_t){src, PJ_F32, (int64_t)(src->capacity / 4), true};
  c->slots[1] = (pj_slot_t){dst, PJ_F32, (int64_t)(dst->capacity / 4), false};
  c->nargs = 1;
  c->args[0] = (pj_arg_t){.name = "self", .kind = PJ_ARG_TENSOR, .first = 0, .count = 1};
  c->ntensors = 1;
  c->tensors[0] = whole(n, 0);
  c->nout = 1;
  c->outs[0] = out_rank ? whole(n, 1) : (pj_tensor_desc_t){.dtype = PJ_F32, .slot = 1};
}

static void test_bucket_numel(void) {
  EXPECT(pj_bucket_numel(1) == 16 && pj_bucket_numel(16) == 16 && pj_bucket_numel(17) == 32);
  EXPECT(pj_bucket_numel(1000) == 1024);
  EXPECT(pj_bucket_numel(PJ_BUCKET_MAX_NUMEL) == PJ_BUCKET_MAX_NUMEL);
  EXPECT(pj_bucket_numel(PJ_BUCKET_MAX_NUMEL + 1) == PJ_BUCKET_MAX_NUMEL + 1);
  EXPECT(pj_bucket_numel(0) == 0);
}

static void test_rewrite_and_run(void) {
  static pj_call_t c;
  float a[20], out[20];
  for (int i = 0; i < 20; i++) a[i] = (float)(i % 2 ? -i : i) - 0.5f;

  /* an exact 5-element storage that the call reads: no bucket (its buffer is not one) */
  pj_storage_t *exact = ctest_f32_storage(a, 5), *o;
  OK(pj_storage_new(0, 5 * sizeof(float), &o));
  unary_call(&c, "abs", exact, o, 5, 1);
  EXPECT(!pj_bucket_rewrite(&c));
  /* a view that is not its whole storage: no bucket either */
  unary_call(&c, "abs", exact, o, 4, 1);
  EXPECT(!pj_bucket_rewrite(&c));
  /* an op whose program depends on shapes: none */
  unary_call(&c, "_softmax", exact, o, 5, 1);
  EXPECT(!pj_bucket_rewrite(&c));

  /* a padded input: rewritten to [16]; the result is padded, its first 5 elements are abs */
  pj_storage_t *p5 = padded_storage(a, 5, 16, 1e30f);
  unary_call(&c, "abs", p5, o, 5, 1);
  OK(pj_call_run(&c));
  EXPECT(c.tensors[0].sizes[0] == 16 && c.outs[0].sizes[0] == 16);
  EXPECT(o->capacity == 16 * sizeof(float) && o->nbytes == 5 * sizeof(float));
  OK(pj_transfer_to_host(o->buf, out, o->nbytes));
  for (int i = 0; i < 5; i++) EXPECT(out[i] == (a[i] < 0 ? -a[i] : a[i]));

  /* another size of the same bucket: the same program */
  const int64_t compiles = pj_metric_get(PJ_METRIC_COMPILES);
  pj_storage_t *p9 = padded_storage(a, 9, 16, -7.0f), *o9;
  OK(pj_storage_new(0, 9 * sizeof(float), &o9));
  unary_call(&c, "abs", p9, o9, 9, 1);
  OK(pj_call_run(&c));
  EXPECT(pj_metric_get(PJ_METRIC_COMPILES) == compiles);
  OK(pj_transfer_to_host(o9->buf, out, o9->nbytes));
  for (int i = 0; i < 9; i++) EXPECT(out[i] == (a[i] < 0 ? -a[i] : a[i]));

  /* a reduction ignores the padding (1e30, larger than every element): max of the 5 */
  pj_storage_t *m;
  OK(pj_storage_new(0, sizeof(float), &m));
  unary_call(&c, "max", p5, m, 5, 0);
  OK(pj_call_run(&c));
  EXPECT(c.tensors[0].pad_repeats);
  float mx;
  OK(pj_transfer_to_host(m->buf, &mx, sizeof mx));
  float want = a[0];
  for (int i = 1; i < 5; i++) want = a[i] > want ? a[i] : want;
  EXPECT(mx == want);

  /* a trim makes the buffer exact, same elements */
  OK(pj_bucket_trim(o));
  EXPECT(o->capacity == o->nbytes && pj_buffer_nbytes(o->buf) == 5 * sizeof(float));
  OK(pj_transfer_to_host(o->buf, out, o->nbytes));
  for (int i = 0; i < 5; i++) EXPECT(out[i] == (a[i] < 0 ? -a[i] : a[i]));
  OK(pj_bucket_trim(exact)); /* nothing to do */

  pj_storage_t *all[] = {exact, o, p5, p9, o9, m};
  for (size_t i = 0; i < sizeof all / sizeof all[0]; i++) pj_storage_release(all[i]);
  EXPECT(pj_storage_live_count() == 0);
}

int main(void) {
  CTEST_REQUIRE_PLUGIN();
  test_bucket_numel();
  test_rewrite_and_run();
  CTEST_DONE();
}
