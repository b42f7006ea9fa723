/* Random lowerings. The bridge appends two 0-d int64 arguments to every op whose schema has a
 * Generator: "__seed" and "__offset", and advances the generator's offset by at least one counter
 * value per output element (plus slack) for every such call. Bits come from Philox-4x32-10
 * computed here in plain integer StableHLO (StableHLO's rng_bit_generator needs a ui64 state,
 * which this builder's dtypes cannot spell; the hand-written Philox also gives the same bits on
 * every backend):
 *
 *   key     = (seed mod 2^32, seed div 2^32)
 *   counter = (c mod 2^32, c div 2^32, 0, 0) with c = offset + i for output element i
 *
 * so element i gets four independent 32-bit words, the same seed and offset always give the
 * same tensor, and calls with different offsets use disjoint counters (the bridge's offset
 * increment is >= the element count). Every 32-bit word is carried as an int64 in [0, 2^32):
 * a product of two such words fits 64 bits, and its high half is a logical right shift.
 *
 * Values from bits: uniform floats take exactly as many random bits as the dtype has mantissa
 * digits (so they are exact in the dtype and never round up to 1), normals use Box-Muller,
 * integers use a modulo of 64 random bits over the requested range, permutations sort random
 * keys. Distribution checks that PyTorch's Meta kernels do not make are made here with CPU's
 * exception types and messages. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "table.h"
#include "emit.h"
#include "random.h"

#define XOR(a, b) pj_binary(H, "stablehlo.xor", a, b)

static const int64_t kMask32 = 0xFFFFFFFFLL;

/* An int64 constant broadcast to t (exact for all 64-bit values, unlike pj_full). */
static pj_val_t ifull(pj_lower_t *L, pj_type_t t, int64_t v) {
  return pj_broadcast_in_dim(H, pj_const_i(H, PJ_I64, v), pj_type_with_dtype(t, PJ_I64), NULL);
}
static pj_val_t fcst(pj_lower_t *L, pj_val_t like, double v) { return pj_full(H, like.t, v); }
static pj_val_t shr(pj_lower_t *L, pj_val_t x, int n) {
  return pj_binary(H, "stablehlo.shift_right_logical", x, ifull(L, x.t, n));
}
static pj_val_t shl(pj_lower_t *L, pj_val_t x, int n) {
  return pj_binary(H, "stablehlo.shift_left", x, ifull(L, x.t, n));
}
/* A 0-d value broadcast to t's shape. */
static pj_val_t bcast(pj_lower_t *L, pj_val_t s, pj_type_t t) {
  return pj_broadcast_in_dim(H, s, pj_type_with_dtype(t, s.t.dtype), NULL);
}

/* ---- Philox-4x32-10 ---- */

/* The four 32-bit words (int64 in [0, 2^32)) of element i of shape t, i in row-major order. */
static bool philox(pj_lower_t *L, pj_type_t shape, pj_val_t w[4]) {
  if (!pj_has(L, "__seed") || !pj_has(L, "__offset")) {
    pj_fail(L, PJ_ERR_RUNTIME, "internal: aten::%s reached a random lowering without generator "
            "state (__seed/__offset)", L->c->op);
    return false;
  }
  pj_type_t t = pj_type_with_dtype(shape, PJ_I64);
  int64_t n = pj_type_numel(&t);
  pj_type_t flat = pj_type(PJ_I64, 1, &n);
  pj_val_t seed = pj_convert(H, pj_scalar(L, "__seed"), PJ_I64);
  pj_val_t off = pj_convert(H, pj_scalar(L, "__offset"), PJ_I64);
  /* Counter budget: the bridge advances the offset by at least B = the destinations' element
   * count per call, so counters [offset, offset + B) are this call's alone. Draws beyond B
   * (e.g. multinomial's per-category keys) reuse that range with the third counter word set to
   * i / B: for every value of that word, calls still use disjoint ranges. */
  int64_t budget = 0;
  for (int k = 0; k < pj_nout(L); k++) {
    pj_type_t ot = pj_out_type(L, k);
    budget += pj_type_numel(&ot);
  }
  if (budget < 1) budget = 1;
  pj_val_t idx = pj_iota(H, flat, 0);
  pj_val_t c2 = ifull(L, flat, 0);
  if (n > budget) {
    pj_val_t b = ifull(L, flat, budget);
    c2 = pj_binary(H, "stablehlo.divide", idx, b);
    idx = pj_binary(H, "stablehlo.remainder", idx, b);
  }
  pj_val_t ctr = ADD(idx, bcast(L, off, flat));
  ctr = pj_reshape(H, ctr, t.rank, t.dims);
  c2 = pj_reshape(H, c2, t.rank, t.dims);
  pj_val_t m32 = pj_const_i(H, PJ_I64, kMask32), s32 = pj_const_i(H, PJ_I64, 32);
  pj_val_t k0 = AND(seed, m32);
  pj_val_t k1 = pj_binary(H, "stablehlo.shift_right_logical", seed, s32);
  pj_val_t c0 = AND(ctr, ifull(L, t, kMask32)), c1 = shr(L, ctr, 32);
  pj_val_t c3 = ifull(L, t, 0);
  pj_val_t mul0 = ifull(L, t, 0xD2511F53LL), mul1 = ifull(L, t, 0xCD9E8D57LL);
  pj_val_t mask = ifull(L, t, kMask32);
  for (int r = 0; r < 10; r++) {
    if (r > 0) { /* key schedule: Weyl sequence mod 2^32 */
      k0 = AND(ADD(k0, pj_const_i(H, PJ_I64, 0x9E3779B9LL)), m32);
      k1 = AND(ADD(k1, pj_const_i(H, PJ_I64, 0xBB67AE85LL)), m32);
    }
    pj_val_t p0 = MUL(mul0, c0), p1 = MUL(mul1, c2); /* < 2^64: exact modulo 2^64 */
    pj_val_t hi0 = shr(L, p0, 32), lo0 = AND(p0, mask);
    pj_val_t hi1 = shr(L, p1, 32), lo1 = AND(p1, mask);
    pj_val_t n0 = XOR(XOR(hi1, c1), bcast(L, k0, t));
    pj_val_t n2 = XOR(XOR(hi0, c3), bcast(L, k1, t));
    c0 = n0;
    c1 = lo1;
    c2 = n2;
    c3 = lo0;
  }
  w[0] = c0;
  w[1] = c1;
  w[2] = c2;
  w[3] = c3;
  return pj_hlo_ok(H);
}

/* 64 random bits (any int64) from two words. */
static pj_val_t bits64(pj_lower_t *L, pj_val_t hi, pj_val_t lo) { return OR(shl(L, hi, 32), lo); }

/* ---- bits to values ---- */

/* Mantissa digits of a float dtype (the random bits a uniform in [0, 1) of it can hold). */
static int digits_of(pj_dtype_t dt) {
  switch (dt) {
    case PJ_F64: return 53;
    case PJ_F16: return 11;
    case PJ_BF16: return 8;
    default: return 24;
  }
}

/* Compute dtype of a distribution: double for double, float otherwise (CPU's dist_acctype). */
static pj_dtype_t compute_of(pj_dtype_t dt) { return dt == PJ_F64 ? PJ_F64 : PJ_F32; }

/* Uniform in [0, 1) with `digits` random bits (<= 24 from word a; <= 53 from a and b), in ct:
 * k * 2^-digits with k < 2^digits, exact in ct. */
static pj_val_t unit(pj_lower_t *L, pj_val_t a, pj_val_t b, int digits, pj_dtype_t ct) {
  pj_val_t k;
  if (digits <= 32) {
    k = shr(L, a, 32 - digits);
  } else {
    k = OR(shl(L, AND(a, ifull(L, a.t, (1LL << (digits - 32)) - 1)), 32), b);
  }
  pj_val_t f = pj_convert(H, k, ct);
  return MUL(f, fcst(L, f, ldexp(1.0, -digits)));
}

/* Uniform in the open interval (0, 1): (2k + 1) * 2^-digits with k < 2^(digits-1). */
static pj_val_t unit_open(pj_lower_t *L, pj_val_t a, pj_val_t b, pj_dtype_t ct) {
  int digits = ct == PJ_F64 ? 53 : 24;
  pj_val_t k;
  if (digits <= 32) {
    k = shr(L, a, 33 - digits);
  } else {
    k = OR(shl(L, AND(a, ifull(L, a.t, (1LL << (digits - 33)) - 1)), 32), b);
  }
  k = ADD(shl(L, k, 1), ifull(L, k.t, 1));
  pj_val_t f = pj_convert(H, k, ct);
  return MUL(f, fcst(L, f, ldexp(1.0, -digits)));
}

/* Uniform [0, 1) in ct for an output of dtype dt, from words w[0..1]. */
static pj_val_t unit_for(pj_lower_t *L, const pj_val_t *w, pj_dtype_t dt, pj_dtype_t ct) {
  int d = pj_dtype_info(dt)->is_float ? digits_of(dt) : (ct == PJ_F64 ? 53 : 24);
  if (d > digits_of(ct)) d = digits_of(ct);
  return unit(L, w[0], w[1], d, ct);
}

/* Standard normal in ct by Box-Muller from all four words: sqrt(-2 log u1) cos(2 pi u2) with
 * u1 in (0, 1] (so the log is finite) and u2 in [0, 1). */
static pj_val_t std_normal(pj_lower_t *L, const pj_val_t *w, pj_dtype_t ct) {
  int d = digits_of(ct);
  pj_val_t u0 = unit(L, w[0], w[1], d, ct);
  pj_val_t u1 = SUB(fcst(L, u0, 1), u0);
  pj_val_t u2 = unit(L, w[2], w[3], d, ct);
  pj_val_t r = U("sqrt", MUL(fcst(L, u1, -2.0), U("log", u1)));
  return MUL(r, U("cosine", MUL(fcst(L, u2, 2.0 * M_PI), u2)));
}

/* ---- argument helpers ---- */

/* A float or Tensor distribution parameter as a value of ct at shape t (None: dflt). */
static pj_val_t param(pj_lower_t *L, const char *name, double dflt, pj_type_t t, pj_dtype_t ct) {
  const pj_arg_t *a = pj_arg(L, name);
  pj_val_t v;
  if (a && a->kind == PJ_ARG_TENSOR) v = pj_convert(H, pj_tensor(L, name), ct);
  else if (a && a->kind == PJ_ARG_SCALAR) v = pj_convert(H, pj_scalar(L, name), ct);
  else v = pj_const(H, ct, pj_float(L, name, dflt));
  return pj_broadcast_to(H, v, t.rank, t.dims);
}

/* The parts of a complex distribution parameter as values of ct at shape t: a Tensor's real and
 * imaginary parts; a float (or real tensor) stands for both parts (CPU draws a complex tensor's
 * parts as one real tensor of twice the length, view_as_real, so normal_(mean) shifts both). */
static void param_parts(pj_lower_t *L, const char *name, double dflt, pj_type_t t, pj_dtype_t ct,
                        pj_val_t *re, pj_val_t *im) {
  const pj_arg_t *a = pj_arg(L, name);
  if (a && a->kind == PJ_ARG_TENSOR && pj_dtype_info(pj_tensor(L, name).t.dtype)->is_complex) {
    pj_val_t v = pj_tensor(L, name);
    *re = pj_broadcast_to(H, pj_convert(H, U("real", v), ct), t.rank, t.dims);
    *im = pj_broadcast_to(H, pj_convert(H, U("imag", v), ct), t.rank, t.dims);
    return;
  }
  *re = *im = param(L, name, dflt, t, ct);
}

/* Complex values of dtype dt from real parts re and im of the part dtype's compute type. */
static pj_val_t complex_of(pj_lower_t *L, pj_val_t re, pj_val_t im, pj_dtype_t dt) {
  pj_dtype_t part = dt == PJ_C128 ? PJ_F64 : PJ_F32;
  pj_val_t parts[2] = {pj_convert(H, re, part), pj_convert(H, im, part)};
  return pj_hlo_op(H, "stablehlo.complex", parts, 2, NULL, pj_type_with_dtype(re.t, dt));
}

static bool is_complex_out(pj_dtype_t dt) { return dt == PJ_C64 || dt == PJ_C128; }

static bool require_float(pj_lower_t *L, pj_dtype_t dt, pj_code_t code, const char *what) {
  if (pj_dtype_info(dt)->is_float) return true;
  if (code == PJ_ERR_UNIMPLEMENTED)
    pj_fail(L, code, "\"%s\" not implemented for '%s'", what, pj_dtype_info(dt)->name);
  else
    pj_fail(L, code, "%s", what);
  return false;
}

/* ---- lowerings ---- */

static pj_status_t *lower_uniform(pj_lower_t *L) {
  pj_type_t t = pj_out_type(L, 0);
  if (!is_complex_out(t.dtype) &&
      !require_float(L, t.dtype, PJ_ERR_UNIMPLEMENTED, "check_uniform_bounds"))
    return NULL;
  /* CPU's checks of from and to (within the dtype's finite range, from <= to, to - from too)
   * are the bridge's, made before any call is run or recorded (kernel_checks.cpp,
   * uniform_check), with CPU's exception: an empty complex tensor takes any pair */
  double from = pj_float(L, "from", 0.0), to = pj_float(L, "to", 1.0);
  /* complex: CPU draws the real and the imaginary part each uniform in [from, to) (a real
   * draw over view_as_real); here the real part takes words 0-1, the imaginary part 2-3 */
  bool cx = is_complex_out(t.dtype);
  pj_dtype_t pt = !cx ? t.dtype : t.dtype == PJ_C128 ? PJ_F64 : PJ_F32;
  pj_dtype_t ct = compute_of(pt);
  pj_val_t w[4];
  if (!philox(L, t, w)) return NULL;
  /* CPU: from and to are cast to the dtype first, then x * (to - from) + from in ct */
  pj_val_t lo = pj_convert(H, pj_const(H, pt, from), ct);
  pj_val_t hi = pj_convert(H, pj_const(H, pt, to), ct);
  pj_val_t u = unit_for(L, w, pt, ct);
  pj_val_t r = ADD(MUL(u, bcast(L, SUB(hi, lo), u.t)), bcast(L, lo, u.t));
  if (cx) {
    pj_val_t ui = unit_for(L, w + 2, pt, ct);
    pj_val_t ri = ADD(MUL(ui, bcast(L, SUB(hi, lo), ui.t)), bcast(L, lo, ui.t));
    r = complex_of(L, r, ri, t.dtype);
  }
  pj_set_result(L, 0, r);
  return NULL;
}

static pj_status_t *lower_normal(pj_lower_t *L) {
  pj_type_t t = pj_out_type(L, 0);
  if (is_complex_out(t.dtype)) {
    /* CPU (normal_impl_): a complex tensor's parts are drawn as one real tensor (view_as_real)
     * with std / sqrt(2), so that E|z - mean|^2 = std^2; a float mean shifts both parts, a
     * complex Tensor mean each part by its own. Box-Muller's cosine and sine branches give the
     * two independent normals from one element's four words. */
    pj_dtype_t ct = t.dtype == PJ_C128 ? PJ_F64 : PJ_F32;
    pj_val_t w[4];
    if (!philox(L, t, w)) return NULL;
    int d = digits_of(ct);
    pj_val_t u0 = unit(L, w[0], w[1], d, ct);
    pj_val_t u1 = SUB(fcst(L, u0, 1), u0);
    pj_val_t u2 = unit(L, w[2], w[3], d, ct);
    pj_val_t rad = U("sqrt", MUL(fcst(L, u1, -2.0), U("log", u1)));
    pj_val_t th = MUL(fcst(L, u2, 2.0 * M_PI), u2);
    pj_val_t s = MUL(param(L, "std", 1.0, t, ct), fcst(L, rad, M_SQRT1_2));
    pj_val_t mre, mim;
    param_parts(L, "mean", 0.0, t, ct, &mre, &mim);
    pj_val_t re = ADD(MUL(MUL(rad, U("cosine", th)), s), mre);
    pj_val_t im = ADD(MUL(MUL(rad, U("sine", th)), s), mim);
    pj_set_result(L, 0, complex_of(L, re, im, t.dtype));
    return NULL;
  }
  if (!require_float(L, t.dtype, PJ_ERR_UNIMPLEMENTED, "normal_kernel_cpu")) return NULL;
  pj_dtype_t ct = compute_of(t.dtype);
  pj_val_t w[4];
  if (!philox(L, t, w)) return NULL;
  pj_val_t z = std_normal(L, w, ct);
  pj_val_t r = ADD(MUL(z, param(L, "std", 1.0, t, ct)), param(L, "mean", 0.0, t, ct));
  pj_set_result(L, 0, r);
  return NULL;
}

static pj_status_t *lower_log_normal(pj_lower_t *L) {
  pj_type_t t = pj_out_type(L, 0);
  if (!require_float(L, t.dtype, PJ_ERR_UNIMPLEMENTED, "log_normal_cpu")) return NULL;
  pj_dtype_t ct = compute_of(t.dtype);
  pj_val_t w[4];
  if (!philox(L, t, w)) return NULL;
  pj_val_t z = std_normal(L, w, ct);
  pj_val_t r = ADD(MUL(z, param(L, "std", 2.0, t, ct)), param(L, "mean", 1.0, t, ct));
  pj_set_result(L, 0, U("exponential", r));
  return NULL;
}

/* bernoulli_.float (p float), bernoulli_.Tensor (p tensor, broadcast to self), bernoulli.out
 * (p = self): 1 where u < p. */
static pj_status_t *lower_bernoulli(pj_lower_t *L) {
  pj_type_t t = pj_out_type(L, 0);
  const pj_arg_t *pa = pj_arg(L, "p");
  const char *pname = pa && pa->kind != PJ_ARG_NONE ? "p" : "self";
  pj_dtype_t ct = PJ_F32;
  if (pa && pa->kind == PJ_ARG_FLOAT) {
    double p = pa->f;
    if (!(p >= 0 && p <= 1)) {
      pj_fail(L, PJ_ERR_RUNTIME, "bernoulli_ expects p to be in [0, 1], but got p=%g", p);
      return NULL;
    }
  } else if (pj_arg_dtype(L, pname) == PJ_F64) {
    ct = PJ_F64;
  }
  pj_val_t w[4];
  if (!philox(L, t, w)) return NULL;
  pj_val_t u = unit(L, w[0], w[1], digits_of(ct), ct);
  pj_val_t p = param(L, pname, 0.5, t, ct);
  pj_set_result(L, 0, CMP("LT", u, p));
  return NULL;
}

static pj_status_t *lower_exponential(pj_lower_t *L) {
  pj_type_t t = pj_out_type(L, 0);
  if (!pj_dtype_info(t.dtype)->is_float) {
    pj_fail(L, PJ_ERR_RUNTIME, "Exponential distribution is a continuous probability "
            "distribution. dtype must be a floating point but you specified %s",
            pj_dtype_info(t.dtype)->name);
    return NULL;
  }
  pj_dtype_t ct = compute_of(t.dtype);
  pj_val_t w[4];
  if (!philox(L, t, w)) return NULL;
  /* -log(u) / lambda with u in (0, 1): finite and positive */
  pj_val_t u = unit_open(L, w[0], w[1], ct);
  pj_val_t lambd = param(L, "lambd", 1.0, t, ct);
  pj_set_result(L, 0, DIV(U("negate", U("log", u)), lambd));
  return NULL;
}

static pj_status_t *lower_geometric(pj_lower_t *L) {
  pj_type_t t = pj_out_type(L, 0);
  pj_dtype_t ct = compute_of(t.dtype);
  double p = pj_float(L, "p", 0.5);
  pj_val_t w[4];
  if (!philox(L, t, w)) return NULL;
  /* number of trials to the first success: ceil(log(u) / log(1 - p)), u in (0, 1) */
  pj_val_t u = unit_open(L, w[0], w[1], ct);
  pj_val_t r = U("ceil", DIV(U("log", u), fcst(L, u, log1p(-p))));
  pj_set_result(L, 0, r);
  return NULL;
}

static pj_status_t *lower_cauchy(pj_lower_t *L) {
  pj_type_t t = pj_out_type(L, 0);
  if (!require_float(L, t.dtype, PJ_ERR_UNIMPLEMENTED, "cauchy_cpu")) return NULL;
  pj_dtype_t ct = compute_of(t.dtype);
  pj_val_t w[4];
  if (!philox(L, t, w)) return NULL;
  pj_val_t u = unit_open(L, w[0], w[1], ct);
  pj_val_t x = pj_unary(H, "chlo.tan", MUL(fcst(L, u, M_PI), SUB(u, fcst(L, u, 0.5))));
  pj_val_t r = ADD(param(L, "median", 0.0, t, ct), MUL(param(L, "sigma", 1.0, t, ct), x));
  pj_set_result(L, 0, r);
  return NULL;
}

/* ---- random_'s bounds (random.h) ---- */

/* v rounded to `digits` significant bits, ties to even (the FPU's default mode). */
static double round_bits(double v, int digits) {
  if (v == 0 || !isfinite(v)) return v;
  int e;
  double m = frexp(v, &e);
  return ldexp(nearbyint(ldexp(m, digits)), e - digits);
}

/* A double to int64 as x86's truncating conversion does (the instruction CPU's casts compile
 * to): out of range and NaN give INT64_MIN. */
static int64_t trunc_i64(double x) {
  if (!(x >= -0x1p63 && x < 0x1p63)) return INT64_MIN;
  return (int64_t)x;
}

/* (int64)(scalar_t)v for a float dtype, as PyTorch's C++ casts round: through float for the
 * half types (so twice), float16 overflowing to infinity past its largest finite value. */
static int64_t through_float(pj_dtype_t dt, int64_t v) {
  double x;
  switch (dt) {
    case PJ_F64: x = (double)v; break;
    case PJ_F16:
      x = round_bits((float)v, 11);
      if (fabs(x) > 65504.0) x = x > 0 ? INFINITY : -INFINITY;
      break;
    case PJ_BF16: x = round_bits((float)v, 8); break;
    default: x = (float)v; break;
  }
  return trunc_i64(x);
}

/* Floats: the smallest from' >= from whose cast does not round below from (CPU moves the
 * bounds inward so that a drawn integer, once cast, stays inside [from, to)). */
static int64_t float_from(pj_dtype_t dt, int64_t from) {
  int64_t p1 = through_float(dt, (int64_t)((uint64_t)from + 1));
  if (p1 >= from) return from;
  uint64_t a = (uint64_t)from + 1;
  if ((int64_t)a < 0) a = 0 - a;
  int n = 0;
  while (a >>= 1) n++;
  int sh = n - digits_of(dt) + 1;
  return sh < 0 || sh > 62 ? p1 : (int64_t)((uint64_t)p1 + ((uint64_t)1 << sh));
}

/* Floats: the largest to' <= to whose to' - 1 does not round up to to or past it. */
static int64_t float_to(pj_dtype_t dt, int64_t to) {
  int64_t m1 = through_float(dt, (int64_t)((uint64_t)to - 1));
  if (m1 < to) return to;
  uint64_t a = (uint64_t)to - 1;
  if ((int64_t)a < 0) a = 0 - a;
  int n = 0;
  while (a >>= 1) n++;
  int sh = n - digits_of(dt) + 1;
  return sh < 0 || sh > 62 ? m1 : (int64_t)((uint64_t)m1 - ((uint64_t)1 << sh));
}

/* The dtype's finite range (floats: lowest to largest finite value), for CPU's bounds checks.
 * uint64's values past int64 cannot be asked for (from and to are int64). */
static void dtype_range(pj_dtype_t dt, double *lo, double *hi) {
  switch (dt) {
    case PJ_F16: *hi = 65504.0; break;
    case PJ_BF16: *hi = 0x1.fep127; break;
    case PJ_F32: *hi = FLT_MAX; break;
    case PJ_F64: *hi = DBL_MAX; break;
    default:
      *lo = pj_dtype_lowest(dt), *hi = pj_dtype_highest(dt);
      return;
  }
  *lo = -*hi;
}

/* v within [lo, hi], compared as CPU does: as doubles for floats, as int64 for integers (where
 * a double bound near 2^63 would round). */
static bool in_range(pj_dtype_t dt, int64_t v, double lo, double hi) {
  if (pj_dtype_info(dt)->is_float) return (double)v >= lo && (double)v <= hi;
  if (dt == PJ_I64) return true;
  if (dt == PJ_U64) return v >= 0;
  return v >= (int64_t)lo && v <= (int64_t)hi;
}

static bool out_of_digits(int64_t v, int digits) {
  int64_t lim = (int64_t)1 << digits;
  return v < -lim || v > lim;
}

void pj_random_bounds(pj_dtype_t dt, bool has_from, int64_t from, bool has_to, int64_t to,
                      pj_random_bounds_t *out) {
  memset(out, 0, sizeof *out);
  const pj_dtype_info_t *info = pj_dtype_info(dt);
  const bool fl = info->is_float;
  if (!fl && !pj_dtype_is_integral(dt) && dt != PJ_BOOL) {
    out->check = PJ_RANDOM_BAD_DTYPE;
    return;
  }
  out->digits = fl ? digits_of(dt) : 0;
  if (!has_from && !has_to) {
    /* random_(): [0, max], with no checks to make (uint64 stops at int64's max) */
    out->to_inc = fl ? (int64_t)1 << out->digits
                     : dt == PJ_BOOL                ? 1
                     : dt == PJ_I64 || dt == PJ_U64 ? INT64_MAX
                                                    : (int64_t)pj_dtype_highest(dt);
    out->range = (uint64_t)out->to_inc + 1;
    return;
  }
  if (!has_from) from = 0; /* random_(to) */
  int64_t to_inc;
  if (has_to) {
    if (from >= to) {
      out->check = PJ_RANDOM_FROM_NOT_LESS, out->msg_a = from, out->msg_b = to;
      return;
    }
    if (fl) {
      from = float_from(dt, from);
      to = float_to(dt, to);
      if (from >= to) {
        out->check = PJ_RANDOM_CAST_FROM_NOT_LESS, out->msg_a = from, out->msg_b = to;
        return;
      }
    }
    to_inc = (int64_t)((uint64_t)to - 1);
  } else if (from == INT64_MIN) {
    /* all 2^64 values: CPU's kernel for it has the 64-bit types only (and bfloat16) */
    if (dt != PJ_I64 && dt != PJ_F64 && dt != PJ_F32 && dt != PJ_BF16)
      out->check = dt == PJ_I8 || dt == PJ_U8 || dt == PJ_I16 || dt == PJ_I32
                       ? PJ_RANDOM_FULL_RANGE_DTYPE
                       : PJ_RANDOM_FULL_RANGE_NO_KERNEL;
    out->from = from, out->to_inc = INT64_MAX, out->range = 0;
    return;
  } else if (fl) {
    to_inc = (int64_t)1 << out->digits;
    from = float_from(dt, from);
    if (from >= to_inc) {
      out->check = PJ_RANDOM_CAST_FROM_TO_INC, out->msg_a = from, out->msg_b = to_inc;
      return;
    }
  } else {
    /* the dtype's max as int64: for uint64 that cast gives -1, which the check refuses */
    to_inc = dt == PJ_BOOL ? 1 : dt == PJ_I64 ? INT64_MAX : dt == PJ_U64 ? -1
                                                          : (int64_t)pj_dtype_highest(dt);
  }
  double lo, hi;
  dtype_range(dt, &lo, &hi);
  if (!in_range(dt, from, lo, hi)) {
    out->check = PJ_RANDOM_FROM_OUT;
    return;
  }
  if (!in_range(dt, to_inc, lo, hi)) {
    out->check = PJ_RANDOM_TO_OUT;
    return;
  }
  out->warn_from = fl && out_of_digits(from, out->digits);
  out->warn_to = fl && out_of_digits(to_inc, out->digits);
  out->from = from;
  out->to_inc = to_inc;
  out->range = (uint64_t)to_inc - (uint64_t)from + 1;
}

/* random_: integers uniform in [from, to) (to exclusive), or [from, max] when to is None, or
 * [0, max] with no bounds (pj_random_bounds); 64 random bits reduced modulo the range (a
 * compile-time constant; 0 stands for 2^64). Results are from + r. The bridge has already made
 * CPU's checks with CPU's messages; those here keep a lowering from drawing out of range. */
static pj_status_t *lower_random(pj_lower_t *L) {
  pj_type_t t = pj_out_type(L, 0);
  pj_dtype_t dt = t.dtype;
  bool has_from = pj_has(L, "from"), has_to = pj_has(L, "to");
  pj_random_bounds_t rb;
  pj_random_bounds(dt, has_from, has_from ? pj_int(L, "from", 0) : 0, has_to,
                   has_to ? pj_int(L, "to", 0) : 0, &rb);
  const char *name = pj_dtype_info(dt)->name;
  switch (rb.check) {
    case PJ_RANDOM_OK: break;
    case PJ_RANDOM_BAD_DTYPE:
      pj_fail(L, PJ_ERR_UNIMPLEMENTED, "\"random_\" not implemented for '%s'", name);
      return NULL;
    case PJ_RANDOM_FROM_NOT_LESS:
    case PJ_RANDOM_CAST_FROM_NOT_LESS:
    case PJ_RANDOM_CAST_FROM_TO_INC:
      pj_fail(L, PJ_ERR_RUNTIME, "random_ expects 'from' to be less than 'to', but got from=%lld "
              ">= to=%lld", (long long)rb.msg_a, (long long)rb.msg_b);
      return NULL;
    case PJ_RANDOM_FROM_OUT:
      pj_fail(L, PJ_ERR_RUNTIME, "from is out of bounds for %s", name);
      return NULL;
    case PJ_RANDOM_TO_OUT:
      pj_fail(L, PJ_ERR_RUNTIME, "to - 1 is out of bounds for %s", name);
      return NULL;
    case PJ_RANDOM_FULL_RANGE_DTYPE:
      pj_fail(L, PJ_ERR_RUNTIME, "random_full_64_bits_range_kernel_cpu handles only int64, "
              "double, float and bfloat16");
      return NULL;
    case PJ_RANDOM_FULL_RANGE_NO_KERNEL:
      pj_fail(L, PJ_ERR_UNIMPLEMENTED, "\"random_full_64_bits_range_kernel_cpu\" not "
              "implemented for '%s'", name);
      return NULL;
  }
  int64_t from = rb.from;
  uint64_t range = rb.range;
  pj_val_t w[4];
  if (!philox(L, t, w)) return NULL;
  pj_val_t b = bits64(L, w[0], w[1]);
  pj_val_t r;
  if (range == 0) {
    r = b;
  } else if (range <= ((uint64_t)1 << 63)) {
    /* non-negative 63-bit value; signed remainder equals the unsigned one */
    pj_val_t nb = AND(b, ifull(L, b.t, INT64_MAX));
    r = range == ((uint64_t)1 << 63) ? nb
                                     : pj_binary(H, "stablehlo.remainder", nb,
                                                 ifull(L, b.t, (int64_t)range));
  } else {
    /* 2^63 < range < 2^64: b mod range is b, or b - range when b >= range (unsigned);
     * unsigned order is signed order with the sign bit flipped */
    pj_val_t flip = ifull(L, b.t, INT64_MIN);
    pj_val_t ge = CMP("GE", XOR(b, flip), XOR(ifull(L, b.t, (int64_t)range), flip));
    r = SEL(ge, SUB(b, ifull(L, b.t, (int64_t)range)), b);
  }
  pj_val_t v = ADD(r, ifull(L, b.t, from));
  pj_set_result(L, 0, dt == PJ_BOOL ? CMP("NE", v, ifull(L, v.t, 0)) : pj_convert(H, v, dt));
  return NULL;
}

/* Sorts `key` (1-D) ascending carrying `payload`; returns the sorted payload. */
static pj_val_t sort_by_key(pj_lower_t *L, pj_val_t key, pj_val_t payload) {
  pj_type_t sts[4] = {pj_type_scalar(key.t.dtype), pj_type_scalar(key.t.dtype),
                      pj_type_scalar(payload.t.dtype), pj_type_scalar(payload.t.dtype)};
  pj_val_t args[4];
  pj_hlo_region_begin(H, sts, 4, args);
  pj_val_t lt = CMP("LT", args[0], args[1]);
  char *region = pj_hlo_region_end(H, &lt, 1);
  pj_val_t ins[2] = {key, payload}, outs[2];
  pj_type_t ots[2] = {key.t, payload.t};
  if (!region) return pj_hlo_fail(H, PJ_ERR_OOM, "out of memory building a sort");
  pj_hlo_op_multi(H, "stablehlo.sort", ins, 2, region, "dimension = 0 : i64, is_stable = true",
                  ots, 2, outs);
  free(region);
  return outs[1];
}

/* randperm: the order of n random 64-bit keys (ties keep index order; they are rare). */
static pj_status_t *lower_randperm(pj_lower_t *L) {
  pj_type_t t = pj_out_type(L, 0);
  int64_t n = t.rank == 1 ? t.dims[0] : pj_int(L, "n", 0);
  pj_type_t flat = pj_type(PJ_I64, 1, &n);
  pj_val_t w[4];
  if (!philox(L, flat, w)) return NULL;
  pj_val_t perm = sort_by_key(L, bits64(L, w[0], w[1]), pj_iota(H, flat, 0));
  pj_set_result(L, 0, perm);
  return NULL;
}

/* Inclusive cumulative sum along dim 1 of a 2-D value: a reduce_window whose window spans the
 * whole row, padded on the left (exact f32/f64 adds; a matmul by a triangular matrix could run
 * at reduced precision on accelerators). */
static pj_val_t cumsum_last(pj_lower_t *L, pj_val_t x) {
  int64_t n = x.t.dims[1];
  pj_type_t st = pj_type_scalar(x.t.dtype);
  pj_type_t sts[2] = {st, st};
  pj_val_t args[2];
  pj_hlo_region_begin(H, sts, 2, args);
  pj_val_t sum = ADD(args[0], args[1]);
  char *region = pj_hlo_region_end(H, &sum, 1);
  if (!region) return pj_hlo_fail(H, PJ_ERR_OOM, "out of memory building a cumsum");
  char attrs[256];
  snprintf(attrs, sizeof attrs,
           "window_dimensions = array<i64: 1, %lld>, padding = dense<[[0, 0], [%lld, 0]]> : "
           "tensor<2x2xi64>",
           (long long)n, (long long)(n - 1));
  pj_val_t ins[2] = {x, pj_const(H, x.t.dtype, 0)}, out;
  pj_hlo_op_multi(H, "stablehlo.reduce_window", ins, 2, region, attrs, &x.t, 1, &out);
  free(region);
  return out;
}

/* multinomial over the last dim of a 1-D or 2-D weight tensor.
 * With replacement: inverse CDF, the index is the number of categories whose cumulative weight
 * is <= u * total (zero-weight categories can never be chosen).
 * Without: Gumbel top-k, the k largest log(w) - log(-log(u)) in decreasing order. */
static pj_status_t *lower_multinomial(pj_lower_t *L) {
  pj_type_t ot = pj_out_type(L, 0);
  pj_val_t p = pj_tensor(L, "self");
  if (p.id < 0) return NULL;
  bool repl = pj_bool(L, "replacement", false);
  int64_t k = ot.dims[ot.rank - 1];
  pj_dtype_t ct = p.t.dtype == PJ_F64 ? PJ_F64 : PJ_F32;
  int64_t rows = p.t.rank == 2 ? p.t.dims[0] : 1, ncat = p.t.dims[p.t.rank - 1];
  int64_t pd[2] = {rows, ncat};
  pj_val_t w = pj_reshape(H, pj_convert(H, p, ct), 2, pd);
  pj_val_t idx;
  if (repl) {
    pj_val_t cdf = cumsum_last(L, w);
    int64_t sd[2] = {rows, k};
    pj_type_t st = pj_type(ct, 2, sd);
    pj_val_t r4[4];
    if (!philox(L, st, r4)) return NULL;
    pj_val_t u = unit(L, r4[0], r4[1], digits_of(ct), ct);
    int64_t last = ncat - 1;
    int64_t s0[2] = {0, last}, s1[2] = {rows, ncat}, one[2] = {1, 1};
    pj_val_t total = pj_slice(H, cdf, s0, s1, one); /* [rows, 1] */
    pj_val_t target = MUL(u, pj_broadcast_to(H, total, 2, sd)); /* [rows, k] */
    int64_t d3[3] = {rows, k, ncat};
    pj_type_t t3 = pj_type(ct, 3, d3);
    int64_t bc[2] = {0, 2}, bt[2] = {0, 1};
    pj_val_t c3 = pj_broadcast_in_dim(H, cdf, t3, bc);
    pj_val_t tg3 = pj_broadcast_in_dim(H, target, t3, bt);
    pj_val_t cnt = pj_convert(H, CMP("LE", c3, tg3), PJ_I64);
    int64_t rd = 2;
    idx = pj_reduce(H, cnt, &rd, 1, "add");
    idx = pj_binary(H, "stablehlo.minimum", idx, ifull(L, idx.t, last));
  } else {
    pj_type_t wt = pj_type(ct, 2, pd);
    pj_val_t r4[4];
    if (!philox(L, wt, r4)) return NULL;
    pj_val_t u = unit_open(L, r4[0], r4[1], ct);
    pj_val_t g = U("negate", U("log", U("negate", U("log", u))));
    pj_val_t key = ADD(U("log", w), g); /* zero weight: -inf, chosen last */
    /* sort each row descending by key carrying the category index */
    pj_type_t it = pj_type(PJ_I64, 2, pd);
    pj_type_t sts[4] = {pj_type_scalar(ct), pj_type_scalar(ct), pj_type_scalar(PJ_I64),
                        pj_type_scalar(PJ_I64)};
    pj_val_t args[4];
    pj_hlo_region_begin(H, sts, 4, args);
    pj_val_t gt = CMP("GT", args[0], args[1]);
    char *region = pj_hlo_region_end(H, &gt, 1);
    if (!region) return NULL;
    pj_val_t ins[2] = {key, pj_iota(H, it, 1)}, outs[2];
    pj_type_t ots[2] = {key.t, it};
    pj_hlo_op_multi(H, "stablehlo.sort", ins, 2, region, "dimension = 1 : i64, is_stable = true",
                    ots, 2, outs);
    free(region);
    int64_t s0[2] = {0, 0}, s1[2] = {rows, k}, one[2] = {1, 1};
    idx = pj_slice(H, outs[1], s0, s1, one);
  }
  pj_set_result(L, 0, pj_reshape(H, idx, ot.rank, ot.dims));
  return NULL;
}

/* native_dropout_backward(grad, mask, scale) = grad * mask * scale in the opmath type. */
static pj_status_t *lower_native_dropout_backward(pj_lower_t *L) {
  pj_type_t t = pj_out_type(L, 0);
  pj_dtype_t ct = pj_dtype_info(t.dtype)->is_float ? compute_of(t.dtype) : t.dtype;
  pj_val_t g = pj_broadcast_to(H, pj_convert(H, pj_tensor(L, "grad_output"), ct), t.rank, t.dims);
  pj_val_t m = pj_broadcast_to(H, pj_convert(H, pj_tensor(L, "mask"), ct), t.rank, t.dims);
  pj_val_t s = pj_full(H, g.t, pj_float(L, "scale", 1.0));
  pj_set_result(L, 0, MUL(MUL(g, m), s));
  return NULL;
}

/* native_dropout(input, p, train) -> (output, mask): mask ~ bernoulli(1 - p) (u >= p with u
 * uniform in [0, 1)), output = input * mask / (1 - p) (0 when p == 1), in the opmath type.
 * Eval mode (train == False) is the identity with an all-true mask. The bridge passes
 * __seed/__offset for this op although its schema has no Generator. */
static pj_status_t *lower_native_dropout(pj_lower_t *L) {
  pj_type_t t = pj_out_type(L, 0);
  pj_dtype_t ct = pj_dtype_info(t.dtype)->is_float ? compute_of(t.dtype) : t.dtype;
  pj_val_t x = pj_convert(H, pj_tensor(L, "input"), ct);
  double p = pj_float(L, "p", 0.5);
  if (pj_has(L, "train") && !pj_bool(L, "train", true)) {
    pj_set_result(L, 0, x);
    pj_set_result(L, 1, pj_full(H, pj_type_with_dtype(t, PJ_BOOL), 1));
    return NULL;
  }
  pj_val_t w[4];
  if (!philox(L, t, w)) return NULL;
  pj_dtype_t uct = ct == PJ_F64 ? PJ_F64 : PJ_F32;
  pj_val_t u = unit(L, w[0], w[1], digits_of(uct), uct);
  pj_val_t keep = CMP("GE", u, fcst(L, u, p));
  pj_val_t scale = pj_full(H, x.t, p >= 1.0 ? 0.0 : 1.0 / (1.0 - p));
  pj_set_result(L, 0, MUL(MUL(x, pj_convert(H, keep, ct)), scale));
  pj_set_result(L, 1, keep);
  return NULL;
}

/* rrelu_with_noise(self, noise!, lower, upper, training) -> out. Training: each negative
 * element gets a slope u * (upper - lower) + lower (u uniform in [0, 1)), positive ones 1; the
 * slopes are written into noise and out = self * noise. Eval: one slope (lower + upper) / 2
 * for negative elements, noise untouched. Destinations: out, then noise. */
static pj_status_t *lower_rrelu_with_noise(pj_lower_t *L) {
  pj_type_t t = pj_out_type(L, 0);
  if (!require_float(L, t.dtype, PJ_ERR_UNIMPLEMENTED, "rrelu_with_noise")) return NULL;
  pj_dtype_t ct = compute_of(t.dtype);
  pj_val_t x = pj_convert(H, pj_tensor(L, "self"), ct);
  pj_val_t lo = param(L, "lower", 0.125, t, ct), hi = param(L, "upper", 1.0 / 3.0, t, ct);
  pj_val_t neg = CMP("LT", x, pj_full(H, x.t, 0.0));
  if (!pj_bool(L, "training", false)) {
    pj_val_t slope = MUL(ADD(lo, hi), pj_full(H, x.t, 0.5));
    pj_set_result(L, 0, SEL(neg, MUL(x, slope), x));
    if (pj_nout(L) > 1) pj_set_result(L, 1, pj_tensor(L, "noise"));
    return NULL;
  }
  pj_val_t w[4];
  if (!philox(L, t, w)) return NULL;
  pj_val_t u = unit_for(L, w, t.dtype, ct);
  pj_val_t noise = SEL(neg, ADD(MUL(u, SUB(hi, lo)), lo), pj_full(H, x.t, 1.0));
  pj_set_result(L, 0, MUL(x, noise));
  if (pj_nout(L) > 1) pj_set_result(L, 1, noise);
  return NULL;
}

const pj_lowering_entry_t pj_lowerings_random[] = {
    {"rrelu_with_noise", lower_rrelu_with_noise, PJ_SHAPE_EXACT},
    {"native_dropout", lower_native_dropout, PJ_SHAPE_EXACT},
    {"uniform", lower_uniform, PJ_SHAPE_ELEMENTWISE},
    {"normal", lower_normal, PJ_SHAPE_ELEMENTWISE},
    {"log_normal", lower_log_normal, PJ_SHAPE_ELEMENTWISE},
    {"bernoulli", lower_bernoulli, PJ_SHAPE_ELEMENTWISE},
    {"exponential", lower_exponential, PJ_SHAPE_ELEMENTWISE},
    {"geometric", lower_geometric, PJ_SHAPE_ELEMENTWISE},
    {"cauchy", lower_cauchy, PJ_SHAPE_ELEMENTWISE},
    {"random", lower_random, PJ_SHAPE_ELEMENTWISE},
    {"randperm", lower_randperm, PJ_SHAPE_EXACT},
    {"multinomial", lower_multinomial, PJ_SHAPE_EXACT},
    {"native_dropout_backward", lower_native_dropout_backward, PJ_SHAPE_EXACT},
    {NULL, NULL, PJ_SHAPE_EXACT},
};
