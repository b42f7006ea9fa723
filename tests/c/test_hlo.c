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

/* "and" reduces integers bitwise from every bit set (bool: true): its identity. */
static void test_and_identity(void) {
  const pj_dtype_t dts[3] = {PJ_I32, PJ_U8, PJ_BOOL};
  const char *want[3] = {"dense<-1> : tensor<i32>", "dense<255> : tensor<ui8>",
                         "dense<true> : tensor<i1>"};
  for (int i = 0; i < 3; i++) {
    pj_hlo_t *h = pj_hlo_new();
    int64_t n = 4, dim = 0;
    pj_val_t a = pj_hlo_param(h, pj_type(dts[i], 1, &n));
    pj_val_t r = pj_reduce(h, a, &dim, 1, "and");
    char *text = NULL;
    size_t len;
    OK(pj_hlo_finish(h, &r, 1, NULL, &text, &len));
    EXPECT(strstr(text, want[i]));
    free(text);
    pj_hlo_free(h);
  }
}

/* Module-level functions (custom kernels): added once per key however often they are called,
 * printed after @main, called with func.call. */
static void test_module_funcs(void) {
  pj_hlo_t *h = pj_hlo_new();
  int64_t n = 3;
  pj_type_t t = pj_type(PJ_F32, 1, &n);
  pj_val_t a = pj_hlo_param(h, t);
  const char *fn = "func.func private @k1_main(%x: tensor<3xf32>) -> tensor<3xf32> {\n"
                   "  return %x : tensor<3xf32>\n}";
  pj_val_t r1, r2;
  EXPECT(pj_hlo_add_funcs(h, "k1", fn));
  EXPECT(pj_hlo_call(h, "k1_main", &a, 1, &t, 1, &r1));
  EXPECT(pj_hlo_add_funcs(h, "k1", fn));
  EXPECT(pj_hlo_call(h, "k1_main", &r1, 1, &t, 1, &r2));
  char *text = NULL;
  size_t len = 0;
  OK(pj_hlo_finish(h, &r2, 1, NULL, &text, &len));
  const char *def = strstr(text, "@k1_main(%x");
  EXPECT(def && !strstr(def + 1, "@k1_main(%x")); /* defined once */
  EXPECT(def > strstr(text, "func.func @main(")); /* after @main */
  const char *call = strstr(text, "\"func.call\"(%v0) {callee = @k1_main}");
  EXPECT(call && strstr(call + 1, "\"func.call\"(%v1) {callee = @k1_main}"));
  free(text);
  pj_hlo_free(h);
}

int main(void) {
  test_types();
  test_program_text();
  test_sticky_error();
  test_reduce_region();
  test_and_identity();
  test_module_funcs();
  CTEST_DONE();
}
