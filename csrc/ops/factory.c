/* Factory lowerings: the out= kernels PyTorch's composite factories end in (arange.start_out,
 * linspace.out, logspace.out, eye.out / eye.m_out, tril_indices / triu_indices). Result sizes
 * come from the Meta kernels; values follow CPU's formulas and computation types so results
 * match it bit for bit in most cases (within an ulp where CPU's vectorized loop associates
 * differently). full / zeros / ones / *_like / scalar_tensor are composites over empty + fill_
 * (elementwise.c) and need nothing here. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "table.h"
#include "emit.h"


static pj_val_t bcast(pj_lower_t *L, pj_val_t s, pj_type_t t) {
  return pj_broadcast_in_dim(H, s, pj_type_with_dtype(t, s.t.dtype), NULL);
}

/* A Scalar argument as a 0-d value of dt, converted the way c10::Scalar::to<T> does (floats
 * round, integers truncate toward zero, through the Scalar's own type). */
static pj_val_t scalar_as(pj_lower_t *L, const char *name, pj_dtype_t dt) {
  return pj_convert(H, pj_scalar(L, name), dt);
}

/* CPU's range kernels have no bool instance (linspace and logspace: none for n >= 2), and
 * arange none for complex; the bridge raises CPU's own message first. */
static bool supported(pj_lower_t *L, pj_dtype_t dt, const char *op) {
  bool complex_ok = strcmp(op, "arange_cpu") != 0 && strcmp(op, "range_cpu") != 0;
  if (dt != PJ_BOOL && (complex_ok || !pj_dtype_info(dt)->is_complex)) return true;
  pj_fail(L, PJ_ERR_UNIMPLEMENTED, "\"%s\" not implemented for '%s' on tpu", op,
          pj_dtype_info(dt)->name);
  return false;
}

/* arange: start + step * i in CPU's accumulate type (double for float and double, float for
 * half types, int64 for integers), then converted to the result dtype. */
static pj_status_t *lower_arange(pj_lower_t *L) {
  pj_type_t t = pj_out_type(L, 0);
  bool range = !strcmp(L->c->op, "range");
  if (!supported(L, t.dtype, range ? "range_cpu" : "arange_cpu")) return NULL;
  if (range && t.dtype == PJ_F16) { /* CPU's range kernel has no float16 instance */
    pj_fail(L, PJ_ERR_UNIMPLEMENTED, "\"range_cpu\" not implemented for 'Half'");
    return NULL;
  }
  pj_dtype_t acc = t.dtype == PJ_F32 || t.dtype == PJ_F64 ? PJ_F64
                   : pj_dtype_info(t.dtype)->is_float    ? PJ_F32
                                                         : PJ_I64;
  int64_t n = pj_type_numel(&t);
  if (n == 0) return NULL;
  /* flat, then in the destination's shape: an out= of n elements keeps its shape (see the
   * bridge's range factories) */
  pj_type_t at = pj_type(acc, 1, &n);
  pj_val_t start = bcast(L, scalar_as(L, "start", acc), at);
  pj_val_t step = pj_has(L, "step") ? bcast(L, scalar_as(L, "step", acc), at)
                                    : pj_full(H, at, 1);
  pj_val_t v = pj_convert(H, ADD(start, MUL(step, pj_iota(H, at, 0))), t.dtype);
  pj_set_result(L, 0, pj_reshape(H, v, t.rank, t.dims));
  return NULL;
}

/* ---- linspace / logspace ----
 *
 * CPU's kernels (torch 2.13) compute element i of n = steps, n >= 2, from start and end
 * converted to the result type T, symmetric from both ends (halfway = n / 2):
 *
 *   linspace:  step = (end - start) / (n - 1)          in T (double for integer T)
 *              i <  halfway:  start + step * i
 *              i >= halfway:  end - step * (n - 1 - i)
 *   logspace:  step = double(end - start) / (n - 1)    (end - start in T's own arithmetic)
 *              the same two-sided exponent, in double, and pow(double base, exponent)
 *              (complex T: all of it in T, the power exp(x * log(base)))
 *
 * then converted to T (integers: truncated). Half types round every operation to their own
 * type (c10::Half / BFloat16 arithmetic goes through float and rounds back). The x86 builds of
 * these kernels are compiled with FMA contraction, so where one multiply feeds one add or
 * subtract in float, double or an integer T's double, CPU rounds once: fma_of below does the
 * same. n == 1 fills start (logspace: pow(base, start) in double); n == 0 writes nothing.
 * CPU's checked conversions of start / end to T ("value cannot be converted to type ...") and
 * its dtype refusals are raised by the bridge before a lowering runs (kernel_checks.cpp). */

/* x as CPU's C++ casts convert it: half types from a 64-bit value go through float first
 * (their constructors take a float), so a value rounds twice, as it does there. */
static pj_val_t cast_like_cpu(pj_lower_t *L, pj_val_t x, pj_dtype_t dt) {
  if ((dt == PJ_F16 || dt == PJ_BF16) && x.t.dtype != PJ_F32 && x.t.dtype != dt)
    x = pj_convert(H, x, PJ_F32);
  return pj_convert(H, x, dt);
}

/* A value XLA cannot see as a constant: its algebraic simplifier turns a division by a
 * constant into a multiplication by the constant's rounded reciprocal, which is not the
 * correctly rounded quotient CPU computes. */
static pj_val_t opaque(pj_lower_t *L, pj_val_t v) {
  return pj_hlo_op(H, "stablehlo.optimization_barrier", &v, 1, NULL, v.t);
}

/* a * b + c rounded once (a contracted multiply-add), for float32 and float64 values of one
 * type. float32: the product of two floats is exact in double, and the double sum rounded to
 * float differs from a fused result only when that sum itself rounded onto a float tie.
 * float64: Dekker's exact product (Veltkamp splitting) and an exact two-sum, then one final
 * addition of the error terms. Other types: the plain expression. */
static pj_val_t fma_of(pj_lower_t *L, pj_val_t a, pj_val_t b, pj_val_t c) {
  if (a.t.dtype == PJ_F32) {
    pj_val_t a64 = pj_convert(H, a, PJ_F64), b64 = pj_convert(H, b, PJ_F64);
    return pj_convert(H, ADD(MUL(a64, b64), pj_convert(H, c, PJ_F64)), PJ_F32);
  }
  if (a.t.dtype != PJ_F64) return ADD(MUL(a, b), c);
  pj_val_t split = pj_full(H, a.t, 134217729.0); /* 2^27 + 1 */
  pj_val_t ta = MUL(split, a), tb = MUL(split, b);
  pj_val_t ah = SUB(ta, SUB(ta, a)), al = SUB(a, ah);
  pj_val_t bh = SUB(tb, SUB(tb, b)), bl = SUB(b, bh);
  pj_val_t p = MUL(a, b);
  /* p + perr == a * b exactly */
  pj_val_t perr = ADD(ADD(ADD(SUB(MUL(ah, bh), p), MUL(ah, bl)), MUL(al, bh)), MUL(al, bl));
  pj_val_t sum = ADD(p, c);
  pj_val_t bv = SUB(sum, p);
  /* sum + serr == p + c exactly */
  pj_val_t serr = ADD(SUB(p, SUB(sum, bv)), SUB(c, bv));
  return ADD(sum, ADD(serr, perr));
}

/* The two-sided exponent / value of real type st for n >= 2 elements as a 1-D [n]: from s, e
 * (0-d, st) and the step (0-d, st). fused: CPU's multiply-add is contracted (float, double). */
static pj_val_t two_sided(pj_lower_t *L, int64_t n, pj_val_t s, pj_val_t e, pj_val_t step,
                          bool fused) {
  pj_dtype_t st = s.t.dtype;
  pj_type_t it = pj_type(PJ_I64, 1, &n), vt = pj_type(st, 1, &n);
  pj_val_t idx = pj_iota(H, it, 0);
  pj_val_t rev = SUB(pj_full(H, it, (double)(n - 1)), idx);
  pj_val_t fi = cast_like_cpu(L, idx, st), fr = cast_like_cpu(L, rev, st);
  pj_val_t sb = bcast(L, s, vt), eb = bcast(L, e, vt), stepb = bcast(L, step, vt);
  pj_val_t lo, hi;
  if (fused) {
    lo = fma_of(L, stepb, fi, sb);
    hi = fma_of(L, pj_unary(H, "stablehlo.negate", stepb), fr, eb);
  } else {
    lo = ADD(sb, MUL(stepb, fi));
    hi = SUB(eb, MUL(stepb, fr));
  }
  return SEL(CMP("LT", idx, pj_full(H, it, (double)(n / 2))), lo, hi);
}

/* (steps - 1) as type st, hidden from constant folding (see opaque). */
static pj_val_t steps_less_one(pj_lower_t *L, int64_t n, pj_dtype_t st) {
  return opaque(L, cast_like_cpu(L, pj_const_i(H, PJ_I64, n - 1), st));
}

static pj_val_t re_part(pj_lower_t *L, pj_val_t z, pj_dtype_t pt) {
  return pj_hlo_op(H, "stablehlo.real", &z, 1, NULL, pj_type_with_dtype(z.t, pt));
}
static pj_val_t im_part(pj_lower_t *L, pj_val_t z, pj_dtype_t pt) {
  return pj_hlo_op(H, "stablehlo.imag", &z, 1, NULL, pj_type_with_dtype(z.t, pt));
}
static pj_val_t make_complex(pj_lower_t *L, pj_val_t re, pj_val_t im, pj_dtype_t ct) {
  pj_val_t parts[2] = {re, im};
  return pj_hlo_op(H, "stablehlo.complex", parts, 2, NULL, pj_type_with_dtype(re.t, ct));
}

/* start and end as 0-d values of the result dtype dt (c10::Scalar::to<T>). */
static void endpoints(pj_lower_t *L, pj_dtype_t dt, pj_val_t *s, pj_val_t *e) {
  *s = cast_like_cpu(L, pj_scalar(L, "start"), dt);
  *e = cast_like_cpu(L, pj_scalar(L, "end"), dt);
}

/* Linspace values for n >= 2 as a 1-D [n] of dt. */
static pj_val_t linspace_values(pj_lower_t *L, pj_dtype_t dt, int64_t n) {
  const pj_dtype_info_t *info = pj_dtype_info(dt);
  pj_val_t s, e;
  endpoints(L, dt, &s, &e);
  if (info->is_complex) { /* complex / and * by a real count act on each part alone */
    pj_dtype_t pt = dt == PJ_C128 ? PJ_F64 : PJ_F32;
    pj_val_t parts[2];
    for (int k = 0; k < 2; k++) {
      pj_val_t sk = k ? im_part(L, s, pt) : re_part(L, s, pt);
      pj_val_t ek = k ? im_part(L, e, pt) : re_part(L, e, pt);
      pj_val_t step = DIV(SUB(ek, sk), steps_less_one(L, n, pt));
      parts[k] = two_sided(L, n, sk, ek, step, true);
    }
    return make_complex(L, parts[0], parts[1], dt);
  }
  if (!info->is_float) { /* integers: the step and values in double, truncated at the end */
    pj_val_t sd = pj_convert(H, s, PJ_F64), ed = pj_convert(H, e, PJ_F64);
    pj_val_t step = DIV(SUB(ed, sd), steps_less_one(L, n, PJ_F64));
    return pj_convert(H, two_sided(L, n, sd, ed, step, true), dt);
  }
  pj_val_t step = DIV(SUB(e, s), steps_less_one(L, n, dt));
  return two_sided(L, n, s, e, step, dt == PJ_F32 || dt == PJ_F64);
}

/* A double to integer dtype dt as x86's truncating conversion (what CPU's cast compiles to):
 * toward zero within the 32-bit range (64-bit for int64); outside it, and NaN, the range's
 * minimum; types narrower than 32 bits keep the low bits of the 32-bit result. */
static pj_val_t trunc_like_x86(pj_lower_t *L, pj_val_t v, pj_dtype_t dt) {
  pj_dtype_t wide = dt == PJ_I64 ? PJ_I64 : PJ_I32;
  double lim = dt == PJ_I64 ? 0x1p63 : 0x1p31;
  pj_val_t ok = AND(CMP("GE", v, pj_full(H, v.t, -lim)), CMP("LT", v, pj_full(H, v.t, lim)));
  pj_val_t w = pj_convert(H, SEL(ok, v, pj_full(H, v.t, 0)), wide);
  pj_val_t wmin = pj_broadcast_in_dim(
      H, pj_const_i(H, wide, wide == PJ_I64 ? INT64_MIN : INT32_MIN), w.t, NULL);
  return pj_convert(H, SEL(ok, w, wmin), dt);
}

/* A double result converted to real dtype dt as CPU stores it. */
static pj_val_t store_double(pj_lower_t *L, pj_val_t v, pj_dtype_t dt) {
  if (dt == PJ_BOOL) return CMP("NE", v, pj_full(H, v.t, 0));
  if (pj_dtype_is_integral(dt)) return trunc_like_x86(L, v, dt);
  return cast_like_cpu(L, v, dt);
}

/* base ** x for complex x (parts xr, xi of type pt) and a real base: exp(x * log(base)) with
 * log(base) = (log|base|, arg base), as the C library's complex power computes it. */
static pj_val_t complex_pow(pj_lower_t *L, double base, pj_val_t xr, pj_val_t xi) {
  pj_val_t lr = pj_full(H, xr.t, log(fabs(base))), la = pj_full(H, xr.t, atan2(0.0, base));
  pj_val_t zr = SUB(MUL(xr, lr), MUL(xi, la)), zi = ADD(MUL(xr, la), MUL(xi, lr));
  pj_val_t m = U("exponential", zr);
  return make_complex(L, MUL(m, U("cosine", zi)), MUL(m, U("sine", zi)),
                      xr.t.dtype == PJ_F64 ? PJ_C128 : PJ_C64);
}

/* Logspace values for n >= 2 as a 1-D [n] of dt. */
static pj_val_t logspace_values(pj_lower_t *L, pj_dtype_t dt, int64_t n, double base) {
  const pj_dtype_info_t *info = pj_dtype_info(dt);
  pj_val_t s, e;
  endpoints(L, dt, &s, &e);
  if (info->is_complex) {
    /* in the complex type: step * i is a complex product with (i, 0), rounded apart from the
     * addition that follows (no contraction across it) */
    pj_dtype_t pt = dt == PJ_C128 ? PJ_F64 : PJ_F32;
    pj_val_t x[2];
    for (int k = 0; k < 2; k++) {
      pj_val_t sk = k ? im_part(L, s, pt) : re_part(L, s, pt);
      pj_val_t ek = k ? im_part(L, e, pt) : re_part(L, e, pt);
      pj_val_t step = DIV(SUB(ek, sk), steps_less_one(L, n, pt));
      x[k] = two_sided(L, n, sk, ek, step, false);
    }
    return complex_pow(L, base, x[0], x[1]);
  }
  /* end - start in T's arithmetic: narrow integers promote to int (exact), int32 and int64
   * wrap, floating types round to themselves */
  pj_dtype_t at = pj_dtype_is_integral(dt) && dt != PJ_I64 ? PJ_I32 : dt;
  pj_val_t diff = SUB(pj_convert(H, e, at), pj_convert(H, s, at));
  pj_val_t step = DIV(pj_convert(H, diff, PJ_F64), steps_less_one(L, n, PJ_F64));
  pj_val_t x = two_sided(L, n, pj_convert(H, s, PJ_F64), pj_convert(H, e, PJ_F64), step, true);
  pj_val_t p = pj_binary(H, "stablehlo.power", pj_full(H, x.t, base), x);
  return store_double(L, p, dt);
}

/* The n values as the destination's shape: CPU writes them in the destination's row-major
 * order, and an out= tensor keeps its shape when it has n elements (see the bridge). */
static void set_flat(pj_lower_t *L, pj_val_t flat, pj_type_t t) {
  pj_set_result(L, 0, pj_reshape(H, flat, t.rank, t.dims));
}

static pj_status_t *lower_linspace(pj_lower_t *L) {
  pj_type_t t = pj_out_type(L, 0);
  int64_t n = pj_type_numel(&t);
  if (n == 0) return NULL;
  if (n == 1) { /* CPU fills start */
    set_flat(L, pj_reshape(H, cast_like_cpu(L, pj_scalar(L, "start"), t.dtype), 1, &n), t);
    return NULL;
  }
  if (!supported(L, t.dtype, "linspace_cpu")) return NULL;
  set_flat(L, linspace_values(L, t.dtype, n), t);
  return NULL;
}

static pj_status_t *lower_logspace(pj_lower_t *L) {
  pj_type_t t = pj_out_type(L, 0);
  int64_t n = pj_type_numel(&t);
  double base = pj_float(L, "base", 10.0);
  if (n == 0) return NULL;
  pj_dtype_t dt = t.dtype;
  if (n == 1) { /* CPU fills pow(base, start) computed in double (complex: complex double) */
    pj_val_t x = pj_scalar(L, "start"), v;
    if (pj_dtype_info(x.t.dtype)->is_complex) {
      v = complex_pow(L, base, re_part(L, x, PJ_F64), im_part(L, x, PJ_F64));
    } else {
      x = pj_convert(H, x, PJ_F64);
      v = pj_binary(H, "stablehlo.power", pj_full(H, x.t, base), x);
    }
    if (pj_dtype_info(dt)->is_complex) v = pj_convert(H, v, dt);
    else if (pj_dtype_info(v.t.dtype)->is_complex) v = store_double(L, re_part(L, v, PJ_F64), dt);
    else v = store_double(L, v, dt);
    set_flat(L, pj_reshape(H, v, 1, &n), t);
    return NULL;
  }
  if (!supported(L, dt, "logspace_cpu")) return NULL;
  set_flat(L, logspace_values(L, dt, n, base), t);
  return NULL;
}

static pj_status_t *lower_eye(pj_lower_t *L) {
  pj_type_t t = pj_out_type(L, 0);
  if (t.rank != 2) {
    pj_fail(L, PJ_ERR_RUNTIME, "internal: eye result of rank %d", t.rank);
    return NULL;
  }
  pj_type_t it = pj_type_with_dtype(t, PJ_I64);
  pj_set_result(L, 0, CMP("EQ", pj_iota(H, it, 0), pj_iota(H, it, 1)));
  return NULL;
}

/* tril_indices / triu_indices: the (row, col) pairs of the triangle in row-major order, as a
 * [2, N] tensor. The row-major linear indices inside the triangle are found by sorting all
 * row * col indices with the ones outside pushed past the end; the first N are the triangle. */
static pj_status_t *lower_tri_indices(pj_lower_t *L) {
  pj_type_t t = pj_out_type(L, 0);
  int64_t rows = pj_int(L, "row", 0), cols = pj_int(L, "col", 0), off = pj_int(L, "offset", 0);
  bool lower = !strcmp(L->c->op, "tril_indices");
  int64_t total = rows * cols, n = t.rank == 2 ? t.dims[1] : 0;
  if (total <= 0 || n <= 0) return NULL; /* an empty [2, 0] result: nothing to write */
  pj_type_t ft = pj_type(PJ_I64, 1, &total);
  pj_val_t lin = pj_iota(H, ft, 0);
  pj_val_t c = pj_full(H, ft, (double)cols);
  pj_val_t r = DIV(lin, c), k = pj_binary(H, "stablehlo.remainder", lin, c);
  pj_val_t diag = SUB(k, r); /* col - row */
  pj_val_t in = lower ? CMP("LE", diag, pj_full(H, ft, (double)off))
                      : CMP("GE", diag, pj_full(H, ft, (double)off));
  pj_val_t key = SEL(in, lin, ADD(lin, pj_full(H, ft, (double)total)));
  pj_type_t st = pj_type_scalar(PJ_I64);
  pj_type_t sts[2] = {st, st};
  pj_val_t args[2];
  pj_hlo_region_begin(H, sts, 2, args);
  pj_val_t lt = CMP("LT", args[0], args[1]);
  char *region = pj_hlo_region_end(H, &lt, 1);
  if (!region) return NULL;
  pj_val_t sorted;
  pj_hlo_op_multi(H, "stablehlo.sort", &key, 1, region, "dimension = 0 : i64", &ft, 1, &sorted);
  free(region);
  int64_t s0 = 0, s1 = n, one = 1;
  pj_val_t first = pj_slice(H, sorted, &s0, &s1, &one);
  pj_type_t nt = pj_type(PJ_I64, 1, &n);
  pj_val_t cn = pj_full(H, nt, (double)cols);
  int64_t d1[2] = {1, n};
  pj_val_t parts[2] = {pj_reshape(H, DIV(first, cn), 2, d1),
                       pj_reshape(H, pj_binary(H, "stablehlo.remainder", first, cn), 2, d1)};
  pj_set_result(L, 0, pj_concat(H, parts, 2, 0));
  return NULL;
}

const pj_lowering_entry_t pj_lowerings_factory[] = {
    {"arange", lower_arange, PJ_SHAPE_EXACT},
    {"range", lower_arange, PJ_SHAPE_EXACT}, /* range.out: start + step * i likewise, the size from its Meta */
    {"linspace", lower_linspace, PJ_SHAPE_EXACT},
    {"logspace", lower_logspace, PJ_SHAPE_EXACT},
    {"eye", lower_eye, PJ_SHAPE_EXACT},
    {"tril_indices", lower_tri_indices, PJ_SHAPE_EXACT},
    {"triu_indices", lower_tri_indices, PJ_SHAPE_EXACT},
    {NULL, NULL, PJ_SHAPE_EXACT},
};
