/* Convenience emitters over the generic builder: shape checks live here so lowerings can
 * assume well-formed operands. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strbuf.h"
#include "torch_pjrt/hlo.h"
#include "torch_pjrt/lowp.h"

static const pj_val_t kBad = {.id = -1, .sub = -1};

static void ints_attr(pj_sb_t *b, const char *name, const int64_t *v, int n) {
  pj_sb_printf(b, "%s = array<i64", name);
  for (int i = 0; i < n; i++) pj_sb_printf(b, i ? ", %lld" : ": %lld", (long long)v[i]);
  pj_sb_puts(b, ">");
}

static void list_attr(pj_sb_t *b, const char *name, const int64_t *v, int n, bool *first) {
  if (n == 0) return;
  pj_sb_printf(b, "%s%s = [", *first ? "" : ", ", name);
  for (int i = 0; i < n; i++) pj_sb_printf(b, i ? ", %lld" : "%lld", (long long)v[i]);
  pj_sb_puts(b, "]");
  *first = false;
}

/* Emits an op whose attributes were accumulated in `b` (freed here). */
static pj_val_t op_with(pj_hlo_t *h, const char *op, const pj_val_t *ins, int n, pj_sb_t *b,
                        pj_type_t t) {
  char *attrs = pj_sb_take(b, NULL);
  pj_val_t r = attrs ? pj_hlo_op(h, op, ins, n, attrs, t)
                     : pj_hlo_fail(h, PJ_ERR_OOM, "out of memory building %s", op);
  free(attrs);
  return r;
}

static void float_literal(char *buf, size_t cap, pj_dtype_t dt, double v) {
  if (isfinite(v)) {
    snprintf(buf, cap, "%.17e", v);
    return;
  }
  /* MLIR parses non-finite floats only as hex bit patterns of the element type. */
  bool neg = signbit(v);
  const char *s;
  switch (dt) {
    case PJ_F16: s = isnan(v) ? "0x7E00" : neg ? "0xFC00" : "0x7C00"; break;
    case PJ_BF16: s = isnan(v) ? "0x7FC0" : neg ? "0xFF80" : "0x7F80"; break;
    case PJ_F64:
      s = isnan(v) ? "0x7FF8000000000000" : neg ? "0xFFF0000000000000" : "0x7FF0000000000000";
      break;
    default: s = isnan(v) ? "0x7FC00000" : neg ? "0xFF800000" : "0x7F800000"; break;
  }
  snprintf(buf, cap, "%s", s);
}

static pj_val_t const_text(pj_hlo_t *h, pj_dtype_t dt, const char *lit) {
  char attrs[160], ts[64];
  pj_type_t t = pj_type_scalar(dt);
  snprintf(attrs, sizeof attrs, "value = dense<%s> : %s", lit, pj_type_str(&t, ts, sizeof ts));
  return pj_hlo_op(h, "stablehlo.constant", NULL, 0, attrs, t);
}

pj_val_t pj_const(pj_hlo_t *h, pj_dtype_t dt, double v) {
  char lit[80];
  const pj_dtype_info_t *info = pj_dtype_info(dt);
  if (dt == PJ_BOOL) return const_text(h, dt, v != 0 ? "true" : "false");
  if (info->is_complex) {
    char re[40];
    float_literal(re, sizeof re, dt == PJ_C64 ? PJ_F32 : PJ_F64, v);
    snprintf(lit, sizeof lit, "(%s, 0.0)", re);
    return const_text(h, dt, lit);
  }
  if (info->is_float) {
    float_literal(lit, sizeof lit, dt, v);
    return const_text(h, dt, lit);
  }
  if (info->is_lowp) { /* the format's code for v, rounded as PyTorch's CPU rounds it */
    if (dt == PJ_F4E2M1FN_X2 && v != 0) /* zero (two +0 halves, byte 0) is its only constant */
      return pj_hlo_fail(h, PJ_ERR_UNIMPLEMENTED, "a constant of dtype %s", info->name);
    snprintf(lit, sizeof lit, "%u",
             dt == PJ_F4E2M1FN_X2 ? 0u : (unsigned)pj_lowp_from_float(dt, (float)v));
    return const_text(h, dt, lit);
  }
  /* Integers: clamp to the type's range so a large double cannot wrap silently. */
  double lo = pj_dtype_lowest(dt), hi = pj_dtype_highest(dt);
  if (isnan(v)) v = 0;
  if (v < lo) v = lo;
  if (v > hi) v = hi;
  if (dt == PJ_U64 && v >= 9223372036854775808.0) { /* past int64: 2^64 (hi) clamps to max */
    snprintf(lit, sizeof lit, "%llu",
             v >= 18446744073709551615.0 ? 18446744073709551615ull : (unsigned long long)v);
    return const_text(h, dt, lit);
  }
  return pj_const_i(h, dt, (int64_t)v);
}

pj_val_t pj_const_i(pj_hlo_t *h, pj_dtype_t dt, int64_t v) {
  char lit[40];
  if (dt == PJ_BOOL) return const_text(h, dt, v ? "true" : "false");
  if (pj_dtype_info(dt)->is_float || pj_dtype_info(dt)->is_complex || pj_dtype_info(dt)->is_lowp)
    return pj_const(h, dt, (double)v);
  size_t bits = 8 * pj_dtype_info(dt)->itemsize;
  if (!pj_dtype_info(dt)->is_signed) {
    /* MLIR rejects a negative literal of an unsigned type: v wraps modulo 2^bits, as a
     * conversion to the type does (-1 is the all-ones mask). */
    uint64_t u = (uint64_t)v;
    if (bits < 64) u &= ((uint64_t)1 << bits) - 1;
    snprintf(lit, sizeof lit, "%llu", (unsigned long long)u);
  } else {
    snprintf(lit, sizeof lit, "%lld", (long long)v);
  }
  return const_text(h, dt, lit);
}

double pj_dtype_lowest(pj_dtype_t dt) {
  switch (dt) {
    case PJ_BOOL: return 0;
    case PJ_U8:
    case PJ_U16:
    case PJ_U32:
    case PJ_U64: return 0;
    case PJ_I8: return -128;
    case PJ_I16: return -32768;
    case PJ_I32: return -2147483648.0;
    case PJ_I64: return -9223372036854775808.0;
    default: return -INFINITY;
  }
}

double pj_dtype_highest(pj_dtype_t dt) {
  switch (dt) {
    case PJ_BOOL: return 1;
    case PJ_U8: return 255;
    case PJ_U16: return 65535;
    case PJ_U32: return 4294967295.0;
    case PJ_U64: return 18446744073709551615.0; /* rounds to 2^64; clamped in pj_const */
    case PJ_I8: return 127;
    case PJ_I16: return 32767;
    case PJ_I32: return 2147483647.0;
    case PJ_I64: return 9223372036854775807.0; /* rounds to 2^63; clamped in pj_const */
    default: return INFINITY;
  }
}

pj_val_t pj_broadcast_in_dim(pj_hlo_t *h, pj_val_t x, pj_type_t t, const int64_t *dims) {
  if (x.id < 0) return kBad;
  if (x.t.rank == t.rank) {
    bool same = pj_type_same_shape(&x.t, &t);
    for (int i = 0; same && i < t.rank; i++) same = dims[i] == i;
    if (same && x.t.dtype == t.dtype) return x;
  }
  pj_sb_t b = {0};
  ints_attr(&b, "broadcast_dimensions", dims, x.t.rank);
  return op_with(h, "stablehlo.broadcast_in_dim", &x, 1, &b, t);
}

pj_val_t pj_full(pj_hlo_t *h, pj_type_t t, double v) {
  pj_val_t c = pj_const(h, t.dtype, v);
  return pj_broadcast_in_dim(h, c, t, NULL);
}

/* Floating -> integer as CPU computes it on x86: the value is truncated into a 32-bit integer
 * (64-bit for int64, and for uint8 from float64), where a value out of that range, an infinity
 * or a NaN gives the smallest integer (the conversion instruction's "indefinite" value), and the
 * result keeps that integer's low bits. XLA's convert saturates instead (max float -> int8 is
 * 127 there, 0 on CPU); the two agree on every value the target type holds. uint32 and uint64
 * (and conversions to float types) keep XLA's convert. */
static pj_val_t float_to_int_like_cpu(pj_hlo_t *h, pj_val_t x, pj_dtype_t dt) {
  pj_dtype_t wide;
  switch (dt) {
    case PJ_I8: case PJ_I16: case PJ_I32: case PJ_U16: wide = PJ_I32; break;
    case PJ_U8: wide = x.t.dtype == PJ_F64 ? PJ_I64 : PJ_I32; break;
    case PJ_I64: wide = PJ_I64; break;
    default: return pj_hlo_op(h, "stablehlo.convert", &x, 1, NULL, pj_type_with_dtype(x.t, dt));
  }
  const double limit = wide == PJ_I64 ? 9223372036854775808.0 : 2147483648.0;
  pj_val_t in_range = pj_binary(h, "stablehlo.and", pj_compare(h, "GE", x, pj_full(h, x.t, -limit)),
                                pj_compare(h, "LT", x, pj_full(h, x.t, limit)));
  pj_type_t wt = pj_type_with_dtype(x.t, wide);
  pj_val_t w = pj_hlo_op(h, "stablehlo.convert", &x, 1, NULL, wt);
  w = pj_select(h, in_range, w, pj_full(h, wt, -limit));
  /* integer narrowing keeps the low bits */
  return wide == dt ? w : pj_hlo_op(h, "stablehlo.convert", &w, 1, NULL, pj_type_with_dtype(wt, dt));
}

pj_val_t pj_convert(pj_hlo_t *h, pj_val_t x, pj_dtype_t dt) {
  if (x.id < 0 || x.t.dtype == dt) return x;
  if (pj_dtype_is_lowp(x.t.dtype) || pj_dtype_is_lowp(dt)) return pj_lowp_convert(h, x, dt);
  if (dt == PJ_BOOL) {
    /* torch semantics: nonzero -> true. */
    pj_val_t zero = pj_full(h, x.t, 0);
    return pj_compare(h, "NE", x, zero);
  }
  if (pj_dtype_info(x.t.dtype)->is_complex && !pj_dtype_info(dt)->is_complex)
    x = pj_unary(h, "stablehlo.real", x);
  if (pj_dtype_info(x.t.dtype)->is_float) return float_to_int_like_cpu(h, x, dt);
  return pj_hlo_op(h, "stablehlo.convert", &x, 1, NULL, pj_type_with_dtype(x.t, dt));
}

pj_val_t pj_unary(pj_hlo_t *h, const char *op, pj_val_t x) {
  pj_type_t t = x.t;
  if (x.id >= 0 && (strcmp(op, "stablehlo.real") == 0 || strcmp(op, "stablehlo.imag") == 0 ||
                    (strcmp(op, "stablehlo.abs") == 0 && pj_dtype_info(t.dtype)->is_complex)))
    t.dtype = t.dtype == PJ_C128 ? PJ_F64 : PJ_F32;
  return pj_hlo_op(h, op, &x, 1, NULL, t);
}

pj_val_t pj_binary(pj_hlo_t *h, const char *op, pj_val_t a, pj_val_t b) {
  if (a.id < 0 || b.id < 0) return kBad;
  if (!pj_type_same_shape(&a.t, &b.t) || a.t.dtype != b.t.dtype)
    return pj_hlo_fail(h, PJ_ERR_RUNTIME, "internal: %s operands differ in shape or dtype", op);
  pj_val_t ins[2] = {a, b};
  return pj_hlo_op(h, op, ins, 2, NULL, a.t);
}

pj_val_t pj_compare(pj_hlo_t *h, const char *dir, pj_val_t a, pj_val_t b) {
  if (a.id < 0 || b.id < 0) return kBad;
  if (!pj_type_same_shape(&a.t, &b.t) || a.t.dtype != b.t.dtype)
    return pj_hlo_fail(h, PJ_ERR_RUNTIME, "internal: compare operands differ");
  char attrs[160];
  const pj_dtype_info_t *info = pj_dtype_info(a.t.dtype);
  const char *ct = info->is_float || info->is_complex ? "FLOAT"
                   : a.t.dtype == PJ_BOOL || !info->is_signed ? "UNSIGNED"
                                                               : "SIGNED";
  snprintf(attrs, sizeof attrs,
           "comparison_direction = #stablehlo<comparison_direction %s>, "
           "compare_type = #stablehlo<comparison_type %s>",
           dir, ct);
  pj_val_t ins[2] = {a, b};
  return pj_hlo_op(h, "stablehlo.compare", ins, 2, attrs, pj_type_with_dtype(a.t, PJ_BOOL));
}

pj_val_t pj_select(pj_hlo_t *h, pj_val_t pred, pj_val_t a, pj_val_t b) {
  if (pred.id < 0 || a.id < 0 || b.id < 0) return kBad;
  pj_val_t ins[3] = {pred, a, b};
  return pj_hlo_op(h, "stablehlo.select", ins, 3, NULL, a.t);
}

pj_val_t pj_broadcast_to(pj_hlo_t *h, pj_val_t x, int rank, const int64_t *dims) {
  if (x.id < 0) return kBad;
  if (x.t.rank > rank)
    return pj_hlo_fail(h, PJ_ERR_RUNTIME, "internal: cannot broadcast rank %d to rank %d",
                       x.t.rank, rank);
  int64_t bd[PJ_MAX_RANK];
  int lead = rank - x.t.rank;
  /* Size-1 dims that must grow are dropped by a reshape first (broadcast_in_dim requires
   * operand dims to be 1 or equal, which already holds; no reshape needed). */
  for (int i = 0; i < x.t.rank; i++) {
    bd[i] = lead + i;
    if (x.t.dims[i] != 1 && x.t.dims[i] != dims[lead + i])
      return pj_hlo_fail(h, PJ_ERR_RUNTIME, "internal: shapes are not broadcastable");
  }
  return pj_broadcast_in_dim(h, x, pj_type(x.t.dtype, rank, dims), bd);
}

pj_val_t pj_reshape(pj_hlo_t *h, pj_val_t x, int rank, const int64_t *dims) {
  if (x.id < 0) return kBad;
  pj_type_t t = pj_type(x.t.dtype, rank, dims);
  if (pj_type_same_shape(&x.t, &t)) return x;
  if (pj_type_numel(&t) != pj_type_numel(&x.t))
    return pj_hlo_fail(h, PJ_ERR_RUNTIME, "internal: reshape changes the element count");
  return pj_hlo_op(h, "stablehlo.reshape", &x, 1, NULL, t);
}

pj_val_t pj_transpose(pj_hlo_t *h, pj_val_t x, const int64_t *perm) {
  if (x.id < 0) return kBad;
  bool ident = true;
  pj_type_t t = x.t;
  for (int i = 0; i < x.t.rank; i++) {
    t.dims[i] = x.t.dims[perm[i]];
    ident = ident && perm[i] == i;
  }
  if (ident) return x;
  pj_sb_t b = {0};
  ints_attr(&b, "permutation", perm, x.t.rank);
  return op_with(h, "stablehlo.transpose", &x, 1, &b, t);
}

pj_val_t pj_slice(pj_hlo_t *h, pj_val_t x, const int64_t *start, const int64_t *limit,
                  const int64_t *strides) {
  if (x.id < 0) return kBad;
  pj_type_t t = x.t;
  int64_t ones[PJ_MAX_RANK];
  bool ident = true;
  for (int i = 0; i < x.t.rank; i++) {
    ones[i] = strides ? strides[i] : 1;
    if (start[i] < 0 || limit[i] > x.t.dims[i] || limit[i] < start[i] || ones[i] < 1)
      return pj_hlo_fail(h, PJ_ERR_RUNTIME, "internal: slice out of bounds");
    t.dims[i] = (limit[i] - start[i] + ones[i] - 1) / ones[i];
    ident = ident && start[i] == 0 && limit[i] == x.t.dims[i] && ones[i] == 1;
  }
  if (ident) return x;
  pj_sb_t b = {0};
  ints_attr(&b, "start_indices", start, x.t.rank);
  pj_sb_puts(&b, ", ");
  ints_attr(&b, "limit_indices", limit, x.t.rank);
  pj_sb_puts(&b, ", ");
  ints_attr(&b, "strides", ones, x.t.rank);
  return op_with(h, "stablehlo.slice", &x, 1, &b, t);
}

pj_val_t pj_concat(pj_hlo_t *h, const pj_val_t *xs, int n, int dim) {
  if (n == 1) return xs[0];
  if (n < 1) return pj_hlo_fail(h, PJ_ERR_RUNTIME, "internal: empty concatenate");
  pj_type_t t = xs[0].t;
  t.dims[dim] = 0;
  for (int i = 0; i < n; i++) t.dims[dim] += xs[i].t.dims[dim];
  char attrs[64];
  snprintf(attrs, sizeof attrs, "dimension = %d : i64", dim);
  return pj_hlo_op(h, "stablehlo.concatenate", xs, n, attrs, t);
}

pj_val_t pj_pad(pj_hlo_t *h, pj_val_t x, pj_val_t padval, const int64_t *lo, const int64_t *hi,
                const int64_t *interior) {
  if (x.id < 0) return kBad;
  pj_type_t t = x.t;
  int64_t zeros[PJ_MAX_RANK] = {0};
  if (!interior) interior = zeros;
  for (int i = 0; i < t.rank; i++)
    t.dims[i] = lo[i] + hi[i] + x.t.dims[i] + (x.t.dims[i] > 0 ? (x.t.dims[i] - 1) * interior[i] : 0);
  pj_sb_t b = {0};
  ints_attr(&b, "edge_padding_low", lo, t.rank);
  pj_sb_puts(&b, ", ");
  ints_attr(&b, "edge_padding_high", hi, t.rank);
  pj_sb_puts(&b, ", ");
  ints_attr(&b, "interior_padding", interior, t.rank);
  pj_val_t ins[2] = {x, padval};
  return op_with(h, "stablehlo.pad", ins, 2, &b, t);
}

pj_val_t pj_iota(pj_hlo_t *h, pj_type_t t, int dim) {
  char attrs[64];
  snprintf(attrs, sizeof attrs, "iota_dimension = %d : i64", dim);
  return pj_hlo_op(h, "stablehlo.iota", NULL, 0, attrs, t);
}

pj_val_t pj_reduce(pj_hlo_t *h, pj_val_t x, const int64_t *dims, int ndims, const char *kind) {
  if (x.id < 0) return kBad;
  pj_dtype_t dt = x.t.dtype;
  double init;
  const char *op;
  if (!strcmp(kind, "add")) { init = 0; op = "stablehlo.add"; }
  else if (!strcmp(kind, "mul")) { init = 1; op = "stablehlo.multiply"; }
  else if (!strcmp(kind, "max")) { init = pj_dtype_lowest(dt); op = "stablehlo.maximum"; }
  else if (!strcmp(kind, "min")) { init = pj_dtype_highest(dt); op = "stablehlo.minimum"; }
  else if (!strcmp(kind, "and")) { init = 1; op = "stablehlo.and"; }
  else if (!strcmp(kind, "or")) { init = 0; op = "stablehlo.or"; }
  else if (!strcmp(kind, "xor")) { init = 0; op = "stablehlo.xor"; }
  else return pj_hlo_fail(h, PJ_ERR_RUNTIME, "internal: unknown reduction %s", kind);
  if (ndims == 0) return x;
  /* "and"'s identity is every bit set: true for bool, -1 / the all-ones mask for integers
   * (1 would clear every bit but the lowest of an integer reduction) */
  pj_val_t initv = (dt == PJ_I64 && !strcmp(kind, "max")) ? pj_const_i(h, dt, INT64_MIN)
                   : (dt == PJ_I64 && !strcmp(kind, "min")) ? pj_const_i(h, dt, INT64_MAX)
                   : !strcmp(kind, "and")                   ? pj_const_i(h, dt, -1)
                                                            : pj_const(h, dt, init);
  pj_type_t st = pj_type_scalar(dt);
  pj_type_t sts[2] = {st, st};
  pj_val_t args[2];
  pj_hlo_region_begin(h, sts, 2, args);
  pj_val_t r = pj_binary(h, op, args[0], args[1]);
  char *region = pj_hlo_region_end(h, &r, 1);
  pj_type_t t = {.dtype = dt, .rank = 0};
  for (int i = 0; i < x.t.rank; i++) {
    bool reduced = false;
    for (int j = 0; j < ndims; j++) reduced = reduced || dims[j] == i;
    if (!reduced) t.dims[t.rank++] = x.t.dims[i];
  }
  pj_sb_t b = {0};
  ints_attr(&b, "dimensions", dims, ndims);
  char *attrs = pj_sb_take(&b, NULL);
  pj_val_t ins[2] = {x, initv}, res = kBad;
  if (region && attrs) pj_hlo_op_multi(h, "stablehlo.reduce", ins, 2, region, attrs, &t, 1, &res);
  free(region);
  free(attrs);
  return res;
}

/* Read by every product the builder emits, written by the bridge between ops: atomic, since
 * several host threads may build programs at once. */
static _Atomic int g_f32_product_precision = PJ_PRECISION_HIGHEST;

void pj_hlo_set_f32_product_precision(pj_precision_t p) {
  if (p >= PJ_PRECISION_DEFAULT && p < PJ_PRECISION_COUNT) g_f32_product_precision = (int)p;
}

pj_precision_t pj_hlo_f32_product_precision(void) {
  return (pj_precision_t)g_f32_product_precision;
}

const char *pj_hlo_precision_config(pj_dtype_t dt) {
  if (dt != PJ_F32 && dt != PJ_C64) return "";
  switch (pj_hlo_f32_product_precision()) {
    case PJ_PRECISION_HIGHEST:
      return ", precision_config = [#stablehlo<precision HIGHEST>, #stablehlo<precision HIGHEST>]";
    case PJ_PRECISION_HIGH:
      return ", precision_config = [#stablehlo<precision HIGH>, #stablehlo<precision HIGH>]";
    default:
      return "";
  }
}

pj_val_t pj_dot_general(pj_hlo_t *h, pj_val_t a, pj_val_t b, const int64_t *lb, const int64_t *rb,
                        int nb, const int64_t *lc, const int64_t *rc, int nc, pj_dtype_t dt) {
  if (a.id < 0 || b.id < 0) return kBad;
  /* Result dims: batch, then lhs free, then rhs free (StableHLO's fixed order). */
  pj_type_t t = {.dtype = dt, .rank = 0};
  for (int i = 0; i < nb; i++) t.dims[t.rank++] = a.t.dims[lb[i]];
  for (int pass = 0; pass < 2; pass++) {
    const pj_val_t *x = pass ? &b : &a;
    const int64_t *bd = pass ? rb : lb, *cd = pass ? rc : lc;
    for (int i = 0; i < x->t.rank; i++) {
      bool used = false;
      for (int j = 0; j < nb; j++) used = used || bd[j] == i;
      for (int j = 0; j < nc; j++) used = used || cd[j] == i;
      if (!used) t.dims[t.rank++] = x->t.dims[i];
    }
  }
  pj_sb_t s = {0};
  bool first = true;
  pj_sb_puts(&s, "dot_dimension_numbers = #stablehlo.dot<");
  list_attr(&s, "lhs_batching_dimensions", lb, nb, &first);
  list_attr(&s, "rhs_batching_dimensions", rb, nb, &first);
  list_attr(&s, "lhs_contracting_dimensions", lc, nc, &first);
  list_attr(&s, "rhs_contracting_dimensions", rc, nc, &first);
  pj_sb_puts(&s, ">");
  pj_sb_puts(&s, pj_hlo_precision_config(a.t.dtype));
  pj_val_t ins[2] = {a, b};
  return op_with(h, "stablehlo.dot_general", ins, 2, &s, t);
}

/* Indices reshaped to [..., 1]: the trailing dim is the index vector. */
static pj_val_t index_vectors(pj_hlo_t *h, pj_val_t idx) {
  int64_t d[PJ_MAX_RANK + 1];
  for (int i = 0; i < idx.t.rank; i++) d[i] = idx.t.dims[i];
  d[idx.t.rank] = 1;
  if (idx.t.rank + 1 > PJ_MAX_RANK)
    return pj_hlo_fail(h, PJ_ERR_UNIMPLEMENTED, "index tensors of rank %d", idx.t.rank);
  return pj_reshape(h, idx, idx.t.rank + 1, d);
}

pj_val_t pj_gather_1d(pj_hlo_t *h, pj_val_t operand, pj_val_t indices) {
  if (operand.id < 0 || indices.id < 0) return kBad;
  /* an empty operand has nothing to read (every index into it is out of range) and StableHLO
   * rejects a slice of 1 there; no result element depends on it */
  if (operand.t.dims[0] == 0 || pj_type_numel(&indices.t) == 0)
    return pj_full(h, pj_type_with_dtype(indices.t, operand.t.dtype), 0);
  int r = indices.t.rank;
  pj_val_t iv = index_vectors(h, indices);
  char attrs[320];
  snprintf(attrs, sizeof attrs,
           "dimension_numbers = #stablehlo.gather<collapsed_slice_dims = [0], "
           "start_index_map = [0], index_vector_dim = %d>, slice_sizes = array<i64: 1>, "
           "indices_are_sorted = false",
           r);
  pj_val_t ins[2] = {operand, iv};
  return pj_hlo_op(h, "stablehlo.gather", ins, 2, attrs,
                   pj_type_with_dtype(indices.t, operand.t.dtype));
}

pj_val_t pj_scatter_1d(pj_hlo_t *h, pj_val_t operand, pj_val_t indices, pj_val_t updates,
                       const char *combiner) {
  if (operand.id < 0 || indices.id < 0 || updates.id < 0) return kBad;
  int r = indices.t.rank;
  pj_val_t iv = index_vectors(h, indices);
  pj_type_t st = pj_type_scalar(operand.t.dtype);
  pj_type_t sts[2] = {st, st};
  pj_val_t args[2];
  pj_hlo_region_begin(h, sts, 2, args);
  pj_val_t res = args[1];
  if (combiner) {
    const char *op = !strcmp(combiner, "add") ? "stablehlo.add"
                     : !strcmp(combiner, "mul") ? "stablehlo.multiply"
                     : !strcmp(combiner, "max") ? "stablehlo.maximum"
                                                 : "stablehlo.minimum";
    res = pj_binary(h, op, args[0], args[1]);
  }
  char *region = pj_hlo_region_end(h, &res, 1);
  char attrs[320];
  snprintf(attrs, sizeof attrs,
           "scatter_dimension_numbers = #stablehlo.scatter<inserted_window_dims = [0], "
           "scatter_dims_to_operand_dims = [0], index_vector_dim = %d>, "
           "indices_are_sorted = false, unique_indices = false",
           r);
  pj_val_t ins[3] = {operand, iv, updates}, out = kBad;
  if (region) pj_hlo_op_multi(h, "stablehlo.scatter", ins, 3, region, attrs, &operand.t, 1, &out);
  free(region);
  return out;
}
