/* The StableHLO text builder, without a plugin: type spelling, constants (including
 * non-finite floats), sticky errors, parameter aliasing, regions. */
#include <math.h>
#include <string.h>

#include "ctest.h"
#include "torch_pjrt/hlo.h"

static void test_types(void) {
  char buf[64];
  int64_t d[2] = {2, 3};
  pj_type_t t = pj_type(PJ_F32, 2, d);
  EXPECT(strcmp(pj_type_str(&t, buf, sizeof buf), "tensor<2x3xf32>") == 0);
  pj_type_t s = pj_type_scalar(PJ_BOOL);
  EXPECT(strcmp(pj_type_str(&s, buf, sizeof buf), "tensor<i1>") == 0);
  pj_type_t u = pj_type_scalar(PJ_U8);
  EXPECT(strcmp(pj_type_str(&u, buf, sizeof buf), "tensor<ui8>") == 0);
  EXPECT(pj_type_numel(&t) == 6);
}

static void test_program_text(void) {
  pj_hlo_t *h = pj_hlo_new();
  int64_t n = 4;
  pj_val_t a = pj_hlo_param(h, pj_type(PJ_F32, 1, &n));
  pj_val_t inf = pj_full(h, a.t, INFINITY);
  pj_val_t r = pj_binary(h, "stablehlo.add", a, inf);
  int alias = 0;
  char *text = NULL;
  size_t len = 0;
  OK(pj_hlo_finish(h, &r, 1, &alias, &text, &len));
  EXPECT(strstr(text, "func.func @main(%v0: tensor<4xf32> {tf.aliasing_output = 0 : i32})"));
  EXPECT(strstr(text, "dense<0x7F800000>"));
  EXPECT(strstr(text, "\"stablehlo.add\""));
  EXPECT(strlen(text) == len);
  free(text);
  pj_hlo_free(h);
}

static void test_sticky_error(void) {
  pj_hlo_t *h = pj_hlo_new();
  int64_t n2 = 2, n3 = 3;
  pj_val_t a = pj_hlo_param(h, pj_type(PJ_F32, 1, &n2));
  pj_val_t b = pj_hlo_param(h, pj_type(PJ_F32, 1, &n3));
  pj_val_t r = pj_binary(h, "stablehlo.add", a, b); /* shape mismatch: error recorded */
  EXPECT(r.id < 0);
  pj_val_t r2 = pj_unary(h, "stablehlo.negate", r); /* later ops are no-ops */
  EXPECT(r2.id < 0);
  char *text = NULL;
  size_t len;
  pj_status_t *st = pj_hlo_finish(h, &r2, 1, NULL, &text, &len);
  EXPECT(st != NULL);
  EXPECT(text == NULL);
  EXPECT(st && strstr(pj_status_message(st), "differ"));
  pj_status_free(st);
  pj_hlo_free(h);
}

static void test_reduce_region(void) {
  pj_hlo_t *h = pj_hlo_new();
  int64_t d[2] = {3, 5};
  pj_val_t a = pj_hlo_param(h, pj_type(PJ_F32, 2, d));
  int64_t dim = 1;
  pj_val_t r = pj_reduce(h, a, &dim, 1, "max");
  EXPECT(r.t.rank == 1 && r.t.dims[0] == 3);
  char *text = NULL;
  size_t len;
  OK(pj_hlo_finish(h, &r, 1, NULL, &text, &len));
  EXPECT(strstr(text, "\"stablehlo.reduce\""));
  EXPECT(strstr(text, "^bb0("));
  EXPECT(strstr(text, "dense<0xFF800000>")); /* -inf identity for max */
  free(text);
  pj_hlo_free(h);
}

int main(void) {
  test_types();
  test_program_text();
  test_sticky_error();
  test_reduce_region();
  CTEST_DONE();
}
