/* The low-precision formats without a plugin: the host codec (constants) round-trips every
 * code, applies each format's overflow and NaN rule (values PyTorch's CPU gives, from the
 * issue), and the in-program conversions build for every pair of dtypes. */
#include <math.h>
#include <string.h>

#include "ctest.h"
#include "torch_pjrt/hlo.h"
#include "torch_pjrt/lowp.h"

static const pj_dtype_t kF8[] = {PJ_F8E4M3FN, PJ_F8E5M2, PJ_F8E4M3FNUZ, PJ_F8E5M2FNUZ,
                                 PJ_F8E8M0FNU};
#define NF8 (sizeof kF8 / sizeof kF8[0])

/* Every non-NaN code decodes to a float32 that encodes back to the same code. */
static void test_round_trip(void) {
  for (size_t f = 0; f < NF8; f++)
    for (int c = 0; c < 256; c++) {
      float v = pj_lowp_to_float(kF8[f], (uint8_t)c);
      if (isnan(v)) continue;
      if (pj_lowp_from_float(kF8[f], v) != c) {
        fprintf(stderr, "%s code %d -> %g -> %d\n", pj_dtype_info(kF8[f])->name, c, v,
                pj_lowp_from_float(kF8[f], v));
        ctest_failures++;
      }
    }
}

/* 1, 500, 1e6, -3e5, NaN, 0.0013 into each format, as PyTorch's CPU encodes them. */
static void test_overflow_rules(void) {
  const float in[6] = {1.0f, 500.0f, 1e6f, -3e5f, NAN, 0.0013f};
  const uint8_t want[NF8][6] = {
      {56, 126, 126, 254, 127, 1},   /* e4m3fn saturates to +-448 */
      {60, 96, 124, 252, 127, 21},   /* e5m2 overflows to +-inf */
      {64, 128, 128, 128, 128, 1},   /* e4m3fnuz: NaN */
      {64, 100, 128, 128, 128, 25},  /* e5m2fnuz: NaN past 57344 */
      {127, 136, 147, 145, 255, 117} /* e8m0fnu: sign dropped */
  };
  for (size_t f = 0; f < NF8; f++)
    for (int i = 0; i < 6; i++) EXPECT(pj_lowp_from_float(kF8[f], in[i]) == want[f][i]);
  EXPECT(pj_lowp_from_float(PJ_F8E4M3FN, -0.0f) == 0x80);
  EXPECT(pj_lowp_from_float(PJ_F8E4M3FNUZ, -0.0f) == 0); /* no negative zero */
  EXPECT(pj_lowp_from_float(PJ_F8E4M3FN, INFINITY) == 0x7e);
  EXPECT(pj_lowp_from_float(PJ_F8E8M0FNU, 0.0f) == 0);
  EXPECT(pj_lowp_to_float(PJ_F8E8M0FNU, 0) == ldexpf(1.0f, -127));
  EXPECT(isinf(pj_lowp_to_float(PJ_F8E5M2, 0xFC)) && pj_lowp_to_float(PJ_F8E5M2, 0xFC) < 0);
}

/* Every conversion into and out of each format builds a valid program; float4 converts to
 * nothing (UNIMPLEMENTED) and has zero as its only constant. */
static void test_programs_build(void) {
  int64_t n = 3;
  for (int from = 0; from < PJ_NUM_DTYPES; from++)
    for (int to = 0; to < PJ_NUM_DTYPES; to++) {
      if (from == to || !(pj_dtype_is_lowp(from) || pj_dtype_is_lowp(to))) continue;
      pj_hlo_t *h = pj_hlo_new();
      pj_val_t x = pj_hlo_param(h, pj_type((pj_dtype_t)from, 1, &n));
      pj_val_t r = pj_convert(h, x, (pj_dtype_t)to);
      char *text = NULL;
      size_t len = 0;
      pj_status_t *st = pj_hlo_finish(h, &r, 1, NULL, &text, &len);
      const bool float4 = from == PJ_F4E2M1FN_X2 || to == PJ_F4E2M1FN_X2;
      EXPECT(float4 ? st != NULL && pj_status_code(st) == PJ_ERR_UNIMPLEMENTED : st == NULL);
      if (st) pj_status_free(st);
      free(text);
      pj_hlo_free(h);
    }
  pj_hlo_t *h = pj_hlo_new();
  pj_val_t z = pj_const(h, PJ_F4E2M1FN_X2, 0.0);
  EXPECT(z.id >= 0);
  pj_val_t one = pj_const(h, PJ_F4E2M1FN_X2, 1.0);
  EXPECT(one.id < 0 && !pj_hlo_ok(h));
  pj_hlo_free(h);
}

int main(void) {
  test_round_trip();
  test_overflow_rules();
  test_programs_build();
  CTEST_DONE();
}
