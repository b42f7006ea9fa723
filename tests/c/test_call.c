/* The call machinery against the real plugin, without PyTorch: strided view reads (transpose,
 * strided slice, expand, overlapping as_strided via gather), writes into views (partial
 * dynamic-update-slice and scatter), scalar arguments, and the executable cache. */
#include <string.h>

#include "ctest_device.h"
#include "torch_pjrt/call.h"
#include "torch_pjrt/exec.h"
#include "torch_pjrt/kernel.h"
#include "torch_pjrt/metrics.h"
#include "torch_pjrt/storage.h"
#include "torch_pjrt/transfer.h"

static void read_storage(pj_storage_t *s, float *out) {
  OK(pj_storage_materialize(s, PJ_F32));
  OK(pj_transfer_to_host(s->buf, out, s->nbytes));
}

static pj_tensor_desc_t view(int rank, const int64_t *sizes, const int64_t *strides, int64_t off,
                             int slot) {
  pj_tensor_desc_t d = {.dtype = PJ_F32, .rank = rank, .offset = off, .slot = slot};
  for (int i = 0; i < rank; i++) {
    d.sizes[i] = sizes[i];
    d.strides[i] = strides[i];
  }
  return d;
}

/* dst view <- src view, through the "_pj_copy" lowering. */
static void copy_view(pj_storage_t *src, pj_tensor_desc_t sv, pj_storage_t *dst,
                      pj_tensor_desc_t dv, int64_t dst_numel) {
  static pj_call_t c;
  memset(&c, 0, sizeof c);
  c.op = "_pj_copy";
  c.overload = "";
  c.nslots = 2;
  c.slots[0] = (pj_slot_t){src, PJ_F32, (int64_t)(src->nbytes / 4), true};
  c.slots[1] = (pj_slot_t){dst, PJ_F32, dst_numel, true};
  c.nargs = 1;
  c.args[0] = (pj_arg_t){.name = "src", .kind = PJ_ARG_TENSOR, .first = 0, .count = 1};
  c.ntensors = 1;
  sv.slot = 0;
  c.tensors[0] = sv;
  c.nout = 1;
  dv.slot = 1;
  c.outs[0] = dv;
  OK(pj_call_run(&c));
}

static void test_views(void) {
  float a[12];
  for (int i = 0; i < 12; i++) a[i] = (float)i;
  pj_storage_t *src = ctest_f32_storage(a, 12);
  float z[12] = {0};
  pj_storage_t *dst = ctest_f32_storage(z, 12);
  float out[12];

  /* transpose of a 3x4 matrix into a contiguous 4x3 */
  int64_t ts[2] = {4, 3}, tst[2] = {1, 4}, cst[2] = {3, 1};
  copy_view(src, view(2, ts, tst, 0, 0), dst, view(2, ts, cst, 0, 1), 12);
  read_storage(dst, out);
  for (int i = 0; i < 4; i++)
    for (int j = 0; j < 3; j++) EXPECT(out[i * 3 + j] == a[j * 4 + i]);

  /* strided slice a.view(3,4)[:, 1::2] (2 cols) into the first 6 elements of dst: a partial
   * write (dynamic_update_slice) must keep dst[6..12) */
  int64_t ss[2] = {3, 2}, sst[2] = {4, 2}, c2[2] = {2, 1};
  copy_view(src, view(2, ss, sst, 1, 0), dst, view(2, ss, c2, 0, 1), 12);
  float before[12];
  memcpy(before, out, sizeof out);
  read_storage(dst, out);
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 2; j++) EXPECT(out[i * 2 + j] == a[i * 4 + 1 + j * 2]);
  for (int k = 6; k < 12; k++) EXPECT(out[k] == before[k]);

  /* expand: a row broadcast over 3 rows (stride 0) written into a column-strided view (scatter
   * path: dst.view(4,3)[:, 0] pattern with stride 3) */
  int64_t es[1] = {4}, est[1] = {1}, ds[1] = {4}, dst_[1] = {3};
  copy_view(src, view(1, es, est, 8, 0), dst, view(1, ds, dst_, 0, 1), 12);
  read_storage(dst, out);
  for (int i = 0; i < 4; i++) EXPECT(out[i * 3] == a[8 + i]);

  /* overlapping as_strided (sizes 3x3, strides 1,1: a sliding window) read via gather */
  int64_t os[2] = {3, 3}, ost[2] = {1, 1}, oc[2] = {3, 1};
  float z9[9] = {0};
  pj_storage_t *d9 = ctest_f32_storage(z9, 9);
  copy_view(src, view(2, os, ost, 2, 0), d9, view(2, os, oc, 0, 1), 9);
  float o9[9];
  read_storage(d9, o9);
  for (int i = 0; i < 3; i++)
    for (int j = 0; j < 3; j++) EXPECT(o9[i * 3 + j] == a[2 + i + j]);

  pj_storage_release(src);
  pj_storage_release(dst);
  pj_storage_release(d9);
}

static void test_scalar_and_cache(void) {
  float a[4] = {1, 2, 3, 4};
  pj_storage_t *s = ctest_f32_storage(a, 4);
  pj_storage_t *o;
  OK(pj_storage_new(0, sizeof a, &o));
  int64_t hits0 = pj_metric_get(PJ_METRIC_CACHE_HITS);
  for (int rep = 0; rep < 2; rep++) {
    static pj_call_t c;
    memset(&c, 0, sizeof c);
    c.op = "add";
    c.overload = "Scalar";
    c.nslots = 2;
    c.slots[0] = (pj_slot_t){s, PJ_F32, 4, true};
    c.slots[1] = (pj_slot_t){o, PJ_F32, 4, false};
    c.nargs = 3;
    c.args[0] = (pj_arg_t){.name = "self", .kind = PJ_ARG_TENSOR, .first = 0, .count = 1};
    c.args[1] = (pj_arg_t){.name = "other", .kind = PJ_ARG_SCALAR, .first = 0};
    c.args[2] = (pj_arg_t){.name = "alpha", .kind = PJ_ARG_SCALAR, .first = 1};
    c.nscalars = 2;
    c.scalars[0] = (pj_scalar_t){.dtype = PJ_F64, .f = 10.0 * (rep + 1)};
    c.scalars[1] = (pj_scalar_t){.dtype = PJ_I64, .i = 2};
    int64_t n = 4, one = 1;
    c.ntensors = 1;
    c.tensors[0] = view(1, &n, &one, 0, 0);
    c.nout = 1;
    c.outs[0] = view(1, &n, &one, 0, 1);
    OK(pj_call_run(&c));
    float out[4];
    read_storage(o, out);
    for (int i = 0; i < 4; i++) EXPECT(out[i] == a[i] + 2.0f * 10.0f * (float)(rep + 1));
  }
  /* the second call differs only in a scalar value: same program */
  EXPECT(pj_metric_get(PJ_METRIC_CACHE_HITS) == hits0 + 1);
  pj_storage_release(s);
  pj_storage_release(o);
  EXPECT(pj_storage_live_count() == 0);
}

/* tpu::kernel_call: a registered kernel (two functions, the entry calling a helper) inlined
 * into the call's program; two kernels of equal types under different ids get different
 * programs (the id is in the key); an unknown id and a conflicting registration are errors. */
static pj_status_t *kernel_call(const char *id, pj_storage_t *x, pj_storage_t *y,
                                pj_storage_t *o) {
  static pj_call_t c;
  memset(&c, 0, sizeof c);
  c.op = "tpu::kernel_call";
  c.overload = "";
  c.nslots = 3;
  c.slots[0] = (pj_slot_t){x, PJ_F32, 4, true};
  c.slots[1] = (pj_slot_t){y, PJ_F32, 4, true};
  c.slots[2] = (pj_slot_t){o, PJ_F32, 4, false};
  c.nargs = 2;
  c.args[0] = (pj_arg_t){.name = "args", .kind = PJ_ARG_TENSORS, .first = 0, .count = 2};
  c.args[1] = (pj_arg_t){.name = "kernel", .kind = PJ_ARG_STR, .s = id};
  int64_t n = 4, one = 1;
  c.ntensors = 2;
  c.tensors[0] = view(1, &n, &one, 0, 0);
  c.tensors[1] = view(1, &n, &one, 0, 1);
  c.nout = 1;
  c.outs[0] = view(1, &n, &one, 0, 2);
  return pj_call_run(&c);
}

static void test_kernel_call(void) {
  const char *mul =
      "func.func private @k1_helper(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {\n"
      "  %0 = stablehlo.multiply %a, %b : tensor<4xf32>\n"
      "  return %0 : tensor<4xf32>\n}\n"
      "func.func private @k1_main(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {\n"
      "  %0 = func.call @k1_helper(%a, %b) : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>\n"
      "  return %0 : tensor<4xf32>\n}";
  const char *sub =
      "func.func private @k2_main(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {\n"
      "  %0 = stablehlo.subtract %a, %b : tensor<4xf32>\n"
      "  return %0 : tensor<4xf32>\n}";
  OK(pj_kernel_register("k1", "k1_main", mul));
  OK(pj_kernel_register("k1", "k1_main", mul)); /* again, same text: a no-op */
  OK(pj_kernel_register("k2", "k2_main", sub));
  pj_status_t *st = pj_kernel_register("k1", "k1_main", sub);
  EXPECT(st && pj_status_code(st) == PJ_ERR_VALUE);
  pj_status_free(st);
  EXPECT(pj_kernel_known("k1") && !pj_kernel_known("k3"));

  float a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8}, out[4];
  pj_storage_t *x = ctest_f32_storage(a, 4), *y = ctest_f32_storage(b, 4), *o;
  OK(pj_storage_new(0, sizeof a, &o));
  OK(kernel_call("k1", x, y, o));
  read_storage(o, out);
  for (int i = 0; i < 4; i++) EXPECT(out[i] == a[i] * b[i]);
  OK(kernel_call("k2", x, y, o));
  read_storage(o, out);
  for (int i = 0; i < 4; i++) EXPECT(out[i] == a[i] - b[i]);
  st = kernel_call("missing", x, y, o);
  EXPECT(st && pj_status_code(st) == PJ_ERR_VALUE);
  pj_status_free(st);
  pj_storage_release(x);
  pj_storage_release(y);
  pj_storage_release(o);
  EXPECT(pj_storage_live_count() == 0);
}

int main(void) {
  CTEST_REQUIRE_PLUGIN();
  test_views();
  test_scalar_and_cache();
  test_kernel_call();
  CTEST_DONE();
}
