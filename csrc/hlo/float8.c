/* Low-precision float formats: decoding to and encoding from float32, in programs and on the
 * host. Values of these dtypes are bytes on the device (dtype.h says why), so a conversion is
 * integer arithmetic on the byte plus at most one exact float multiply.
 *
 * The rules are PyTorch's CPU ones (checked against it over every code and dense sweeps of
 * float32 in tests/test_float8.py); they differ per format:
 *   - every format rounds to nearest, ties to even, in the normal and the subnormal range;
 *   - e4m3fn (no infinity) saturates: a magnitude at or above 480 (infinity included) becomes
 *     448 and a rounding that would carry into the NaN code stops at 448; NaN stays NaN (0x7f
 *     with the input's sign);
 *   - e5m2 is IEEE-like: a magnitude at or above 2^16 becomes infinity, NaN 0x7f with the sign;
 *   - the fnuz formats have one NaN (0x80), no infinity and no negative zero: a magnitude at or
 *     above 2^8 (e4m3fnuz) or 2^16 (e5m2fnuz), infinity and NaN all become 0x80, and a value
 *     rounding to zero is +0 whatever its sign (a rounding that overflows lands on 0x80 too);
 *   - e8m0fnu is a bare biased exponent (no sign, no zero, 0xff is NaN): the sign is dropped,
 *     the float32 exponent field is rounded up when the mantissa is above one half, or exactly
 *     one half and the exponent field is nonzero; infinity and NaN become 0xff. Code 0 is
 *     2^-127, so zero and the smallest floats encode as 2^-127.
 * Decoding is exact (every code is a float32 value); NaN decodes to a quiet NaN with the code's
 * sign (positive for the fnuz and e8m0 NaN, which have none). */
#include <math.h>
#include <string.h>

#include "torch_pjrt/lowp.h"

typedef enum {
  KIND_FN,   /* no infinity, saturates (e4m3fn) */
  KIND_IEEE, /* infinity on overflow (e5m2) */
  KIND_FNUZ, /* single NaN 0x80, no negative zero */
  KIND_E8M0  /* exponent only */
} kind_t;

typedef struct {
  pj_dtype_t dt;
  kind_t kind;
  int mbits;     /* mantissa bits */
  int bias;      /* exponent bias */
  uint32_t big;  /* float32 bits of the smallest magnitude that takes the overflow result */
  uint32_t over; /* the overflow result (without sign) */
} fmt_t;

/* One row per 8-bit format. big: 480 = 0x43F00000 (first e4m3fn value past 448 after
 * rounding), 2^16 = 0x47800000, 2^8 = 0x43800000. */
static const fmt_t kFormats[] = {
    {PJ_F8E4M3FN, KIND_FN, 3, 7, 0x43F00000u, 0x7e},
    {PJ_F8E5M2, KIND_IEEE, 2, 15, 0x47800000u, 0x7c},
    {PJ_F8E4M3FNUZ, KIND_FNUZ, 3, 8, 0x43800000u, 0x80},
    {PJ_F8E5M2FNUZ, KIND_FNUZ, 2, 16, 0x47800000u, 0x80},
    {PJ_F8E8M0FNU, KIND_E8M0, 0, 127, 0x7F800000u, 0xff},
};

static const fmt_t *format_of(pj_dtype_t dt) {
  for (size_t i = 0; i < sizeof kFormats / sizeof kFormats[0]; i++)
    if (kFormats[i].dt == dt) return &kFormats[i];
  return NULL;
}

#define QNAN_BITS 0x7FC00000u
#define INF_BITS 0x7F800000u

/* ---- host ---- */

static uint32_t f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, 4);
  return u;
}

static float f32_of(uint32_t u) {
  float f;
  memcpy(&f, &u, 4);
  return f;
}

uint8_t pj_lowp_from_float(pj_dtype_t dt, float f) {
  const fmt_t *m = format_of(dt);
  if (!m) return 0;
  uint32_t bits = f32_bits(f), sign7 = (bits >> 31) << 7, a = bits & 0x7FFFFFFFu;
  if (m->kind == KIND_E8M0) {
    uint32_t ef = (bits >> 23) & 0xFF;
    if (ef == 0xFF) return 0xFF;
    bool up = (bits & 0x400000u) && ((bits & 0x3FFFFFu) || ef > 0);
    return (uint8_t)(ef + up);
  }
  uint32_t code;
  if (a < (uint32_t)(128 - m->bias) << 23) { /* below the smallest normal: subnormal steps */
    code = (uint32_t)nearbyintf(f32_of(a) * ldexpf(1.0f, m->bias - 1 + m->mbits));
  } else {
    int sh = 23 - m->mbits;
    uint32_t r = (a + ((1u << (sh - 1)) - 1) + ((a >> sh) & 1)) >> sh;
    code = r - ((uint32_t)(127 - m->bias) << m->mbits); /* garbage when a is huge: see below */
  }
  if (m->kind == KIND_FNUZ) {
    if (a >= m->big) return 0x80;
    return (uint8_t)(code == 0 ? 0 : code | sign7);
  }
  if (a > INF_BITS) return (uint8_t)(0x7F | sign7);
  if (a >= m->big || code > m->over) code = m->over;
  return (uint8_t)(code | sign7);
}

float pj_lowp_to_float(pj_dtype_t dt, uint8_t c) {
  const fmt_t *m = format_of(dt);
  if (!m) return NAN;
  if (m->kind == KIND_E8M0)
    return c == 0 ? f32_of(0x00400000u) : c == 0xFF ? NAN : f32_of((uint32_t)c << 23);
  if (m->kind == KIND_FNUZ && c == 0x80) return NAN;
  uint32_t sign = (uint32_t)(c >> 7) << 31, mag = c & 0x7Fu;
  uint32_t e = mag >> m->mbits, man = mag & ((1u << m->mbits) - 1);
  uint32_t out;
  if (m->kind == KIND_FN && mag == 0x7F) out = QNAN_BITS;
  else if (m->kind == KIND_IEEE && e == 31) out = man ? QNAN_BITS : INF_BITS;
  else if (e == 0) out = f32_bits((float)man * ldexpf(1.0f, 1 - m->bias - m->mbits));
  else out = ((e - m->bias + 127) << 23) | (man << (23 - m->mbits));
  return f32_of(out | sign);
}

/* ---- programs: integer ops on int32 values of the input's shape ---- */

static pj_val_t ci(pj_hlo_t *h, pj_type_t t, int64_t v) {
  return pj_full(h, pj_type_with_dtype(t, PJ_I32), (double)v);
}
#define BIN(op, a, b) pj_binary(h, "stablehlo." op, (a), (b))
#define AND(a, b) BIN("and", a, b)
#define OR(a, b) BIN("or", a, b)
#define ADD(a, b) BIN("add", a, b)
#define SUB(a, b) BIN("subtract", a, b)
#define SHL(a, n) BIN("shift_left", a, ci(h, (a).t, n))
#define SHR(a, n) BIN("shift_right_logical", a, ci(h, (a).t, n))
#define ANDC(a, v) AND(a, ci(h, (a).t, v))
#define CMPC(dir, a, v) pj_compare(h, dir, a, ci(h, (a).t, v))

static pj_val_t bitcast(pj_hlo_t *h, pj_val_t x, pj_dtype_t dt) {
  return pj_hlo_op(h, "stablehlo.bitcast_convert", &x, 1, NULL, pj_type_with_dtype(x.t, dt));
}

/* Stored bytes (dtype dt, element type ui8) -> float32 values. */
static pj_val_t decode(pj_hlo_t *h, pj_val_t x, const fmt_t *m) {
  x.t.dtype = PJ_U8; /* the same element type: a retag, no op */
  pj_val_t c = pj_convert(h, x, PJ_I32);
  if (m->kind == KIND_E8M0) {
    pj_val_t bits = SHL(c, 23);
    bits = pj_select(h, CMPC("EQ", c, 0), ci(h, c.t, 0x00400000), bits);
    bits = pj_select(h, CMPC("EQ", c, 0xFF), ci(h, c.t, QNAN_BITS), bits);
    return bitcast(h, bits, PJ_F32);
  }
  pj_val_t sign = SHL(ANDC(c, 0x80), 24);
  pj_val_t mag = ANDC(c, 0x7F);
  pj_val_t e = SHR(mag, m->mbits), man = ANDC(mag, (1 << m->mbits) - 1);
  pj_val_t normal = OR(SHL(ADD(e, ci(h, c.t, 127 - m->bias)), 23), SHL(man, 23 - m->mbits));
  /* subnormal: man steps of 2^(1 - bias - mbits), an exact product in float32 */
  pj_val_t sub = BIN("multiply", pj_convert(h, man, PJ_F32),
                     pj_full(h, pj_type_with_dtype(c.t, PJ_F32),
                             ldexp(1.0, 1 - m->bias - m->mbits)));
  pj_val_t bits = pj_select(h, CMPC("EQ", e, 0), bitcast(h, sub, PJ_I32), normal);
  if (m->kind == KIND_FN) {
    bits = pj_select(h, CMPC("EQ", mag, 0x7F), ci(h, c.t, QNAN_BITS), bits);
  } else if (m->kind == KIND_IEEE) {
    pj_val_t special =
        pj_select(h, CMPC("EQ", man, 0), ci(h, c.t, INF_BITS), ci(h, c.t, QNAN_BITS));
    bits = pj_select(h, CMPC("EQ", e, 31), special, bits);
  }
  bits = OR(bits, sign);
  if (m->kind == KIND_FNUZ) bits = pj_select(h, CMPC("EQ", c, 0x80), ci(h, c.t, QNAN_BITS), bits);
  return bitcast(h, bits, PJ_F32);
}

/* float32 values -> stored bytes of format m (dtype m->dt). */
static pj_val_t encode(pj_hlo_t *h, pj_val_t f, const fmt_t *m) {
  pj_val_t bits = bitcast(h, f, PJ_I32);
  pj_type_t t = bits.t;
  pj_val_t code;
  if (m->kind == KIND_E8M0) {
    pj_val_t ef = ANDC(SHR(bits, 23), 0xFF);
    pj_val_t half = CMPC("NE", ANDC(bits, 0x400000), 0);
    pj_val_t more = BIN("or", CMPC("NE", ANDC(bits, 0x3FFFFF), 0), CMPC("GT", ef, 0));
    pj_val_t up = pj_convert(h, BIN("and", half, more), PJ_I32);
    code = pj_select(h, CMPC("EQ", ef, 0xFF), ci(h, t, 0xFF), ADD(ef, up));
  } else {
    pj_val_t sign7 = SHL(SHR(bits, 31), 7);
    pj_val_t a = ANDC(bits, 0x7FFFFFFF);
    const int sh = 23 - m->mbits;
    /* normal range: round the float32 mantissa to mbits (nearest, ties to even), rebias */
    pj_val_t r = SHR(ADD(ADD(a, ci(h, t, (1 << (sh - 1)) - 1)), ANDC(SHR(a, sh), 1)), sh);
    pj_val_t normal = SUB(r, ci(h, t, (int64_t)(127 - m->bias) << m->mbits));
    /* subnormal range: the value in units of the smallest subnormal, rounded to even */
    pj_val_t scaled = BIN("multiply", bitcast(h, a, PJ_F32),
                          pj_full(h, f.t, ldexp(1.0, m->bias - 1 + m->mbits)));
    pj_val_t sub = pj_convert(h, pj_unary(h, "stablehlo.round_nearest_even", scaled), PJ_I32);
    code = pj_select(h, CMPC("LT", a, (int64_t)(128 - m->bias) << 23), sub, normal);
    if (m->kind == KIND_FNUZ) {
      code = pj_select(h, CMPC("EQ", code, 0), code, OR(code, sign7));
      code = pj_select(h, CMPC("GE", a, m->big), ci(h, t, 0x80), code);
    } else {
      pj_val_t over = ci(h, t, m->over);
      code = pj_select(h, CMPC("GE", a, m->big), over, BIN("minimum", code, over));
      code = pj_select(h, CMPC("GT", a, INF_BITS), ci(h, t, 0x7F), code);
      code = OR(code, sign7);
    }
  }
  pj_val_t out = pj_convert(h, code, PJ_U8);
  out.t.dtype = m->dt; /* the same element type: a retag, no op */
  return out;
}

/* f (float32) with the sign bit `sign` (int32: 0 or 1 << 31). Float converts on GPUs return
 * the canonical, positive NaN for any NaN input; this restores the source's sign. */
static pj_val_t with_sign(pj_hlo_t *h, pj_val_t f, pj_val_t sign) {
  return bitcast(h, OR(ANDC(bitcast(h, f, PJ_I32), 0x7FFFFFFF), sign), PJ_F32);
}

/* float64 -> float32 as C's conversion rounds it, subnormal results included: the CPU plugin's
 * convert flushes results below 2^-126 to zero, which e8m0fnu would see (its codes 0 and 1 are
 * 2^-127 and 2^-126). Below 2^-126 the result is a count of 2^-149 steps, which is the float32
 * bit pattern itself. */
static pj_val_t f32_of_f64(pj_hlo_t *h, pj_val_t x) {
  pj_type_t tf = pj_type_with_dtype(x.t, PJ_F64);
  pj_val_t ax = pj_unary(h, "stablehlo.abs", x);
  pj_val_t steps = pj_unary(h, "stablehlo.round_nearest_even",
                            BIN("multiply", ax, pj_full(h, tf, ldexp(1.0, 149))));
  pj_val_t sign64 = pj_hlo_op(h, "stablehlo.bitcast_convert", &x, 1, NULL,
                              pj_type_with_dtype(x.t, PJ_I64));
  sign64 = BIN("shift_right_logical", sign64, pj_full(h, sign64.t, 63));
  pj_val_t sign = SHL(pj_convert(h, sign64, PJ_I32), 31);
  pj_val_t sub = bitcast(h, OR(pj_convert(h, steps, PJ_I32), sign), PJ_F32);
  pj_val_t tiny = pj_compare(h, "LT", ax, pj_full(h, tf, ldexp(1.0, -126)));
  pj_val_t f = pj_select(h, tiny, sub, pj_convert(h, x, PJ_F32));
  return with_sign(h, f, sign);
}

/* float16/bfloat16 -> float32, NaN keeping its sign, as PyTorch's CPU conversion does (e5m2 of
 * a negative NaN is 0xff). Both formats have their sign in bit 15. */
static pj_val_t f32_of_f16(pj_hlo_t *h, pj_val_t x) {
  pj_val_t b16 = pj_hlo_op(h, "stablehlo.bitcast_convert", &x, 1, NULL,
                           pj_type_with_dtype(x.t, PJ_I16));
  b16 = pj_convert(h, b16, PJ_I32);
  pj_val_t sign = SHL(SHR(ANDC(b16, 0x8000), 15), 31);
  return with_sign(h, pj_convert(h, x, PJ_F32), sign);
}

/* float4_e2m1fn_x2 bytes -> float32 values, each byte giving two along `axis` (its low nibble
 * first, as PyTorch packs them). A nibble is sign, 2 exponent bits (bias 1), 1 mantissa bit:
 * 0, 0.5 (subnormal), 1, 1.5, 2, 3, 4, 6 and their negatives. */
pj_val_t pj_lowp_unpack_f4(pj_hlo_t *h, pj_val_t x, int axis) {
  if (x.id < 0) return x;
  if (x.t.dtype != PJ_F4E2M1FN_X2 || axis < 0 || axis >= x.t.rank || x.t.rank >= PJ_MAX_RANK)
    return pj_hlo_fail(h, PJ_ERR_RUNTIME, "internal: unpacking float4 from %s",
                       pj_dtype_info(x.t.dtype)->name);
  x.t.dtype = PJ_U8; /* the same element type: a retag, no op */
  pj_val_t c = pj_convert(h, x, PJ_I32);
  pj_val_t halves[2];
  for (int k = 0; k < 2; k++) {
    pj_val_t n = k ? SHR(c, 4) : ANDC(c, 0xF);
    pj_val_t e = ANDC(SHR(n, 1), 3), man = ANDC(n, 1);
    pj_val_t normal = OR(SHL(ADD(e, ci(h, c.t, 126)), 23), SHL(man, 22));
    pj_val_t sub = pj_select(h, CMPC("EQ", man, 0), ci(h, c.t, 0), ci(h, c.t, 0x3F000000));
    pj_val_t bits = pj_select(h, CMPC("EQ", e, 0), sub, normal);
    bits = OR(bits, SHL(ANDC(n, 8), 28));
    /* a unit dim after `axis`, to interleave the halves */
    int64_t d[PJ_MAX_RANK];
    int r = 0;
    for (int i = 0; i < c.t.rank; i++) {
      d[r++] = c.t.dims[i];
      if (i == axis) d[r++] = 1;
    }
    halves[k] = pj_reshape(h, bitcast(h, bits, PJ_F32), r, d);
  }
  pj_val_t both = pj_concat(h, halves, 2, axis + 1);
  int64_t d[PJ_MAX_RANK];
  for (int i = 0; i < c.t.rank; i++) d[i] = c.t.dims[i] * (i == axis ? 2 : 1);
  return pj_reshape(h, both, c.t.rank, d);
}

pj_val_t pj_lowp_convert(pj_hlo_t *h, pj_val_t x, pj_dtype_t dt) {
  if (x.id < 0 || x.t.dtype == dt) return x;
  const fmt_t *from = format_of(x.t.dtype), *to = format_of(dt);
  if (x.t.dtype == PJ_F4E2M1FN_X2 || dt == PJ_F4E2M1FN_X2)
    return pj_hlo_fail(h, PJ_ERR_UNIMPLEMENTED, "conversion from %s to %s (PyTorch has none)",
                       pj_dtype_info(x.t.dtype)->name, pj_dtype_info(dt)->name);
  /* PyTorch's kernels convert through float32 (a double or int64 rounds to float first) */
  if (x.t.dtype == PJ_C128) x = pj_unary(h, "stablehlo.real", x); /* CPU keeps the real part */
  pj_val_t f = from                                            ? decode(h, x, from)
               : x.t.dtype == PJ_F64                           ? f32_of_f64(h, x)
               : x.t.dtype == PJ_F16 || x.t.dtype == PJ_BF16 ? f32_of_f16(h, x)
                                                               : pj_convert(h, x, PJ_F32);
  return to ? encode(h, f, to) : pj_convert(h, f, dt);
}
