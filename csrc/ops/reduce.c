/* Lowerings: reductions (sum, mean, prod, amax/amin, max/min with indices, argmax/argmin,
 * var/std and their _mean forms, vector norms, logsumexp, any/all), scans (cumsum, cumprod) and
 * softmax / log_softmax with their backwards.
 *
 * Conventions shared by every lowering here:
 *  - Output shapes and dtypes come from PyTorch's Meta kernels (pj_out_type); a lowering computes
 *    the reduced value without kept dims and set_out() reshapes it to the destination (keepdim
 *    only inserts size-1 dims, so the element count always agrees).
 *  - bfloat16 / float16 are accumulated in float32 and rounded once at the end, as PyTorch's CPU
 *    kernels do (their acc_type), so results match CPU to the last bit in most cases.
 *  - A dim list that is None or empty means "all dims", as for torch.sum / amax / any.dims. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "table.h"
#include "emit.h"


/* ---- helpers ---- */

static bool is_float(pj_dtype_t dt) { return pj_dtype_info(dt)->is_float; }
static bool is_complex(pj_dtype_t dt) { return pj_dtype_info(dt)->is_complex; }

/* Accumulation dtype: half types widen to float32 (PyTorch CPU's acc_type for reductions). */
static pj_dtype_t acc_of(pj_dtype_t dt) { return dt == PJ_BF16 || dt == PJ_F16 ? PJ_F32 : dt; }

static pj_val_t cst(pj_lower_t *L, pj_val_t like, double v) { return pj_full(H, like.t, v); }

/* A runtime 0-d value broadcast to `like`'s type. */
static pj_val_t bcast_scalar(pj_lower_t *L, pj_val_t s, pj_val_t like) {
  s = pj_convert(H, s, like.t.dtype);
  return pj_broadcast_in_dim(H, s, like.t, NULL);
}

/* Sets destination k from a value with the destination's element count (keepdim or not). */
static void set_out(pj_lower_t *L, int k, pj_val_t v) {
  if (k >= pj_nout(L)) {
    pj_fail(L, PJ_ERR_RUNTIME, "internal: aten::%s has %d destinations, wanted %d", L->c->op,
            pj_nout(L), k + 1);
    return;
  }
  pj_type_t t = pj_out_type(L, k);
  if (v.id >= 0 && pj_type_numel(&v.t) == pj_type_numel(&t)) v = pj_reshape(H, v, t.rank, t.dims);
  pj_set_result(L, k, v);
}

typedef struct {
  int n;                      /* number of reduced dims */
  int64_t dims[PJ_MAX_RANK];  /* reduced dims, ascending */
  bool mask[PJ_MAX_RANK];     /* mask[i]: dim i is reduced */
  int64_t count;              /* elements folded into each result */
} rdims_t;

static void rdims_all(const pj_type_t *t, rdims_t *r) {
  r->n = 0;
  r->count = 1;
  for (int i = 0; i < t->rank; i++) {
    r->mask[i] = true;
    r->dims[r->n++] = i;
    r->count *= t->dims[i];
  }
}

/* Reads the dim list `name` (int, int[] or None) against tensor type t. None or empty: all. */
static void rdims_arg(pj_lower_t *L, const char *name, const pj_type_t *t, rdims_t *r) {
  int64_t raw[PJ_CALL_MAX_INTS];
  int n = pj_ints(L, name, raw, PJ_CALL_MAX_INTS);
  if (n <= 0) {
    rdims_all(t, r);
    return;
  }
  memset(r->mask, 0, sizeof r->mask);
  for (int i = 0; i < n; i++) {
    int d = pj_norm_dim(L, raw[i], t->rank); /* records IndexError when out of range */
    if (t->rank > 0) r->mask[d] = true;      /* dim 0 / -1 of a 0-d tensor reduces nothing */
  }
  r->n = 0;
  r->count = 1;
  for (int i = 0; i < t->rank; i++)
    if (r->mask[i]) {
      r->dims[r->n++] = i;
      r->count *= t->dims[i];
    }
}

static pj_val_t reduce(pj_lower_t *L, pj_val_t x, const rdims_t *r, const char *kind) {
  return pj_reduce(H, x, r->dims, r->n, kind);
}

/* A reduced value (rank - n dims) broadcast back to the full type t (keepdim + expand). */
static pj_val_t expand_back(pj_lower_t *L, pj_val_t v, const pj_type_t *t, const rdims_t *r) {
  int64_t bd[PJ_MAX_RANK];
  int k = 0;
  for (int i = 0; i < t->rank; i++)
    if (!r->mask[i]) bd[k++] = i;
  return pj_broadcast_in_dim(H, v, pj_type_with_dtype(*t, v.t.dtype), bd);
}

/* CPU's error for max/min/argmax-style reductions over an empty extent (recorded in the
 * builder; callers check pj_hlo_ok). `full`: a reduction without a dim argument. */
static void check_nonempty(pj_lower_t *L, const pj_type_t *t, const rdims_t *r, bool full) {
  if (pj_type_numel(t) != 0) return;
  if (full) {
    pj_fail(L, PJ_ERR_RUNTIME,
            "%s(): Expected reduction dim to be specified for input.numel() == 0. Specify the "
            "reduction dim with the 'dim' argument.",
            L->c->op);
    return;
  }
  for (int i = 0; i < r->n; i++)
    if (t->dims[r->dims[i]] == 0) {
      pj_fail(L, PJ_ERR_INDEX, "%s(): Expected reduction dim %lld to have non-zero size.",
              L->c->op, (long long)r->dims[i]);
      return;
    }
}

static pj_status_t *unsupported_complex(pj_lower_t *L) {
  pj_fail(L, PJ_ERR_UNIMPLEMENTED, "aten::%s is not lowered for complex tensors on tpu", L->c->op);
  return NULL;
}

/* ---- sum / mean / prod / nansum ---- */

/* CPU's sums start from +0, so a float sum is never -0 (+0 + -0 is +0); XLA drops the
 * initial value where it simplifies a reduction of one element, or a scan's first element,
 * to the element itself, and keeps its sign. -0 becomes +0; NaN and every other value stay. */
static pj_val_t no_negative_zero(pj_lower_t *L, pj_val_t v) {
  if (!is_float(v.t.dtype)) return v;
  pj_val_t zero = cst(L, v, 0);
  return SEL(CMP("EQ", v, zero), zero, v);
}

static pj_status_t *lower_sum_like(pj_lower_t *L) {
  const char *op = L->c->op;
  pj_val_t x = pj_tensor(L, "self");
  pj_dtype_t out = pj_out_type(L, 0).dtype;
  if (!strcmp(op, "nansum") && (is_complex(x.t.dtype) || is_complex(out))) {
    pj_fail(L, PJ_ERR_RUNTIME, "nansum does not support complex inputs");
    return NULL;
  }
  rdims_t r;
  rdims_arg(L, "dim", &x.t, &r); /* prod.dim_int's single int arrives as a one-element list */
  /* CPU converts to the requested dtype first, then accumulates in that dtype's acc type;
   * integer and bool sums accumulate in the (int64) output type. */
  pj_dtype_t ct = out == PJ_BOOL ? PJ_I64 : acc_of(out);
  x = pj_convert(H, pj_convert(H, x, out == PJ_BOOL ? x.t.dtype : out), ct);
  pj_val_t v;
  if (!strcmp(op, "prod")) {
    v = reduce(L, x, &r, "mul");
  } else {
    if (!strcmp(op, "nansum") && is_float(ct)) x = SEL(CMP("NE", x, x), cst(L, x, 0), x);
    v = no_negative_zero(L, reduce(L, x, &r, "add"));
    if (!strcmp(op, "mean")) v = DIV(v, cst(L, v, (double)r.count));
  }
  set_out(L, 0, v);
  return NULL;
}

/* ---- amax / amin / max / min (values) and aminmax ---- */

static pj_val_t extremum(pj_lower_t *L, pj_val_t x, const rdims_t *r, bool is_max) {
  if (x.t.dtype == PJ_BOOL) return reduce(L, x, r, is_max ? "or" : "and");
  pj_val_t m = reduce(L, x, r, is_max ? "max" : "min");
  if (!is_float(x.t.dtype)) return m;
  /* XLA's CPU reductions may drop NaNs; CPU's max/amax propagate them, so a NaN anywhere in
   * the reduced extent makes the result NaN explicitly. */
  pj_val_t any_nan = reduce(L, CMP("NE", x, x), r, "or");
  return SEL(any_nan, cst(L, m, NAN), m);
}

static pj_status_t *lower_amax_amin(pj_lower_t *L) {
  pj_val_t x = pj_tensor(L, "self");
  if (is_complex(x.t.dtype)) return unsupported_complex(L);
  rdims_t r;
  rdims_arg(L, "dim", &x.t, &r);
  check_nonempty(L, &x.t, &r, false);
  if (!pj_hlo_ok(H)) return NULL;
  set_out(L, 0, extremum(L, x, &r, !strcmp(L->c->op, "amax")));
  return NULL;
}

/* The reduced dims of an optional "dim" argument (all dims when absent), with CPU's error for
 * reducing an empty extent; returns whether all dims are reduced. */
static bool extremum_dims(pj_lower_t *L, const pj_type_t *t, rdims_t *r) {
  bool full = !pj_has(L, "dim");
  if (full) rdims_all(t, r);
  else rdims_arg(L, "dim", t, r);
  check_nonempty(L, t, r, full);
  return full;
}

static pj_status_t *lower_aminmax(pj_lower_t *L) {
  pj_val_t x = pj_tensor(L, "self");
  if (is_complex(x.t.dtype)) return unsupported_complex(L);
  rdims_t r;
  extremum_dims(L, &x.t, &r);
  if (!pj_hlo_ok(H)) return NULL;
  set_out(L, 0, extremum(L, x, &r, false));
  set_out(L, 1, extremum(L, x, &r, true));
  return NULL;
}

/* (value, index) of the extreme along one dim: the first index among equal extremes, and the
 * first NaN if any (CPU treats NaN as greater than / less than everything). Two single-operand
 * reductions: the extreme (extremum: NaN when the extent holds one), then the smallest index
 * whose element equals it (or is a NaN, when it is NaN). One variadic (value, index) reduction
 * computes the same, but XLA's CPU backend runs variadic reductions element by element: argmax
 * over [8, 32000] float32 (a serving step's greedy sampler) took 1.06 ms that way and the
 * single-operand max alone 0.11 ms (benchmarks/bench_serving.py's 100M model, stop 32). */
static void arg_extremum(pj_lower_t *L, pj_val_t x, int dim, bool is_max, pj_val_t *val,
                         pj_val_t *idx) {
  if (x.t.dtype == PJ_BOOL) x = pj_convert(H, x, PJ_I32);
  rdims_t r = {.n = 1, .dims = {dim}, .count = x.t.dims[dim]};
  r.mask[dim] = true;
  pj_val_t m = extremum(L, x, &r, is_max);
  pj_val_t mb = expand_back(L, m, &x.t, &r);
  pj_val_t hit = CMP("EQ", x, mb);
  if (is_float(x.t.dtype)) hit = OR(hit, AND(CMP("NE", x, x), CMP("NE", mb, mb)));
  pj_type_t it = pj_type_with_dtype(x.t, PJ_I64);
  /* non-hits get the extent's size (exact as a double constant): every extent holds a hit */
  pj_val_t pos = SEL(hit, pj_iota(H, it, dim), pj_full(H, it, (double)x.t.dims[dim]));
  *val = m;
  *idx = reduce(L, pos, &r, "min");
}

/* max / min: the full reduction (one result) or .dim (values, indices). */
static pj_status_t *lower_max_min(pj_lower_t *L) {
  bool is_max = !strcmp(L->c->op, "max");
  pj_val_t x = pj_tensor(L, "self");
  if (is_complex(x.t.dtype)) return unsupported_complex(L);
  rdims_t r;
  if (!pj_has(L, "dim")) {
    rdims_all(&x.t, &r);
    check_nonempty(L, &x.t, &r, true);
    if (!pj_hlo_ok(H)) return NULL;
    set_out(L, 0, extremum(L, x, &r, is_max));
    return NULL;
  }
  rdims_arg(L, "dim", &x.t, &r);
  check_nonempty(L, &x.t, &r, false);
  if (!pj_hlo_ok(H)) return NULL;
  if (x.t.rank == 0) { /* 0-d: the value itself at index 0 */
    set_out(L, 0, x);
    set_out(L, 1, pj_const_i(H, PJ_I64, 0));
    return NULL;
  }
  pj_val_t v, i;
  arg_extremum(L, x, (int)r.dims[0], is_max, &v, &i);
  set_out(L, 0, v);
  set_out(L, 1, i);
  return NULL;
}

static pj_status_t *lower_argmax_argmin(pj_lower_t *L) {
  bool is_max = !strcmp(L->c->op, "argmax");
  pj_val_t x = pj_tensor(L, "self");
  if (is_complex(x.t.dtype)) return unsupported_complex(L);
  if (x.t.dtype == PJ_BOOL) { /* CPU's kernel checks this, its Meta kernel does not */
    pj_fail(L, PJ_ERR_RUNTIME, "%s(): does not support bool input", L->c->op);
    return NULL;
  }
  rdims_t r;
  bool full = extremum_dims(L, &x.t, &r);
  if (!pj_hlo_ok(H)) return NULL;
  int dim = 0;
  if (full || x.t.rank == 0) { /* the flat index over all elements */
    int64_t n = pj_type_numel(&x.t);
    x = pj_reshape(H, x, 1, &n);
  } else {
    dim = (int)r.dims[0];
  }
  pj_val_t v, i;
  arg_extremum(L, x, dim, is_max, &v, &i);
  set_out(L, 0, i);
  return NULL;
}

/* ---- var / std / var_mean / std_mean (.correction) ---- */

static pj_status_t *lower_var_std(pj_lower_t *L) {
  const char *op = L->c->op;
  pj_val_t x = pj_tensor(L, "self");
  if (!is_float(x.t.dtype) && !is_complex(x.t.dtype)) { /* Meta accepts these; CPU does not */
    pj_fail(L, PJ_ERR_RUNTIME, "std and var only support floating point and complex dtypes");
    return NULL;
  }
  rdims_t r;
  rdims_arg(L, "dim", &x.t, &r);
  pj_dtype_t ct = acc_of(pj_out_type(L, 0).dtype); /* real, also for a complex input */
  if (!is_complex(x.t.dtype)) x = pj_convert(H, x, ct);
  /* two passes (mean, then squared deviations) for accuracy */
  pj_val_t sum = reduce(L, x, &r, "add");
  pj_val_t mean = DIV(sum, cst(L, sum, (double)r.count));
  pj_val_t d = SUB(x, expand_back(L, mean, &x.t, &r));
  /* |d|^2: for complex deviations the squared modulus re^2 + im^2 */
  pj_val_t d2 = is_complex(d.t.dtype)
                    ? ADD(MUL(U("real", d), U("real", d)), MUL(U("imag", d), U("imag", d)))
                    : MUL(d, d);
  pj_val_t ss = reduce(L, pj_convert(H, d2, ct), &r, "add");
  /* divisor max(N - correction, 0) with the correction a runtime value (default 1) */
  pj_val_t n = cst(L, ss, (double)r.count);
  pj_val_t corr = pj_has(L, "correction") ? bcast_scalar(L, pj_scalar(L, "correction"), ss)
                                          : cst(L, ss, 1);
  pj_val_t div = MAX(SUB(n, corr), cst(L, ss, 0));
  pj_val_t var = DIV(ss, div);
  bool is_std = !strncmp(op, "std", 3);
  set_out(L, 0, is_std ? U("sqrt", var) : var);
  if (strstr(op, "_mean")) set_out(L, 1, mean);
  return NULL;
}

/* ---- vector norms ---- */

/* linalg_vector_norm(self, ord, dim, keepdim, dtype) and norm.*(self, p, dim, keepdim, dtype).
 * The order is a Scalar, i.e. a runtime value. The bridge adds "__ord_kind" (PJ_NORM_ORD_*, a
 * compile-time int) naming which order it is, so a program computes that norm alone (the
 * general order, |x|^p summed, costs a pow per element: ten times a 2-norm's work on XLA:CPU);
 * only the general kind reads the order's value at run time, so every p != 0, 1, 2, +-inf
 * shares one program. Without the hint (a builder that does not add it) every special case is
 * computed and the right one selected at run time. */
static pj_status_t *lower_norm(pj_lower_t *L) {
  const char *pname = pj_arg(L, "ord") ? "ord" : "p";
  pj_val_t x = pj_tensor(L, "self");
  pj_dtype_t out = pj_out_type(L, 0).dtype;
  pj_dtype_t ct = acc_of(out);
  rdims_t r;
  rdims_arg(L, "dim", &x.t, &r);
  pj_val_t a;
  if (is_complex(x.t.dtype)) { /* norms of complex vectors are norms of the moduli (real) */
    if (pj_has(L, "dtype")) x = pj_convert(H, x, out == PJ_F64 ? PJ_C128 : PJ_C64);
    a = pj_convert(H, U("abs", x), ct);
  } else {
    x = pj_convert(H, pj_convert(H, x, out), ct);
    a = U("abs", x);
  }
  const int64_t kind = pj_int(L, "__ord_kind", -1);
  if (kind >= 0 && kind != 5 && (pj_type_numel(&x.t) > 0 || kind < 3)) {
    pj_val_t res;
    switch (kind) {
      case 0: res = reduce(L, pj_convert(H, CMP("NE", a, cst(L, a, 0)), ct), &r, "add"); break;
      case 1: res = reduce(L, a, &r, "add"); break;
      case 2: res = U("sqrt", reduce(L, MUL(a, a), &r, "add")); break;
      default: res = extremum(L, a, &r, kind == 3); break;
    }
    set_out(L, 0, res);
    return NULL;
  }
  pj_val_t sq = reduce(L, MUL(a, a), &r, "add");
  pj_val_t p = pj_has(L, pname) ? bcast_scalar(L, pj_scalar(L, pname), sq) : cst(L, sq, 2);
  pj_val_t n2 = U("sqrt", sq);
  pj_val_t n1 = reduce(L, a, &r, "add");
  pj_val_t n0 = reduce(L, pj_convert(H, CMP("NE", a, cst(L, a, 0)), ct), &r, "add");
  pj_val_t pa = pj_binary(H, "stablehlo.power", a, expand_back(L, p, &x.t, &r));
  pj_val_t np = pj_binary(H, "stablehlo.power", reduce(L, pa, &r, "add"),
                          DIV(cst(L, p, 1), p));
  pj_val_t res = np;
  res = SEL(CMP("EQ", p, cst(L, p, 0)), n0, res);
  res = SEL(CMP("EQ", p, cst(L, p, 1)), n1, res);
  res = SEL(CMP("EQ", p, cst(L, p, 2)), n2, res);
  /* inf norms: max/min over an empty extent is an error on CPU, raised when it applies */
  if (pj_type_numel(&x.t) > 0) {
    res = SEL(CMP("EQ", p, cst(L, p, INFINITY)), extremum(L, a, &r, true), res);
    res = SEL(CMP("EQ", p, cst(L, p, -INFINITY)), extremum(L, a, &r, false), res);
  }
  set_out(L, 0, res);
  return NULL;
}

/* ---- logsumexp ---- */

static pj_status_t *lower_logsumexp(pj_lower_t *L) {
  pj_val_t x = pj_tensor(L, "self");
  rdims_t r;
  rdims_arg(L, "dim", &x.t, &r);
  x = pj_convert(H, x, acc_of(pj_out_type(L, 0).dtype));
  /* subtract the max (of the real parts for complex input); an infinite max (all -inf, or
   * +inf present) is replaced by 0 so the shift cannot make inf - inf = NaN, and added back
   * after the log */
  pj_val_t m = reduce(L, is_complex(x.t.dtype) ? U("real", x) : x, &r, "max");
  m = SEL(CMP("EQ", U("abs", m), cst(L, m, INFINITY)), cst(L, m, 0), m);
  m = pj_convert(H, m, x.t.dtype);
  pj_val_t s = reduce(L, U("exponential", SUB(x, expand_back(L, m, &x.t, &r))), &r, "add");
  set_out(L, 0, ADD(U("log", s), m));
  return NULL;
}

/* ---- any / all ---- */

static pj_status_t *lower_any_all(pj_lower_t *L) {
  pj_val_t x = pj_convert(H, pj_tensor(L, "self"), PJ_BOOL);
  rdims_t r;
  rdims_arg(L, "dim", &x.t, &r);
  set_out(L, 0, reduce(L, x, &r, !strcmp(L->c->op, "any") ? "or" : "and"));
  return NULL;
}

static pj_status_t *lower_count_nonzero(pj_lower_t *L) {
  pj_val_t x = pj_tensor(L, "self");
  rdims_t r;
  rdims_arg(L, "dim", &x.t, &r);
  pj_val_t nz = pj_convert(H, pj_convert(H, x, PJ_BOOL), PJ_I64);
  set_out(L, 0, reduce(L, nz, &r, "add"));
  return NULL;
}

/* hash_tensor (mode 0, the only one CPU has): each element widened to its 64-bit kind (float64,
 * int64, uint64; bool as 0 / 1), its bits read as uint64, xor-reduced over dim (all when
 * empty). CPU has no kernel for complex inputs. */
static pj_status_t *lower_hash_tensor(pj_lower_t *L) {
  pj_val_t x = pj_tensor(L, "self");
  if (x.id < 0) return NULL;
  if (pj_int(L, "mode", 0) != 0) {
    pj_fail(L, PJ_ERR_RUNTIME, "Unknown hash_tensor mode: %lld", (long long)pj_int(L, "mode", 0));
    return NULL;
  }
  const pj_dtype_info_t *info = pj_dtype_info(x.t.dtype);
  if (info->is_complex) {
    pj_fail(L, PJ_ERR_UNIMPLEMENTED, "\"xor_sum\" not implemented for '%s'", info->name);
    return NULL;
  }
  pj_dtype_t wide = x.t.dtype == PJ_BOOL || x.t.dtype == PJ_U8 || x.t.dtype == PJ_U16 ||
                            x.t.dtype == PJ_U32 || x.t.dtype == PJ_U64
                        ? PJ_U64
                    : info->is_float || info->is_lowp ? PJ_F64
                                                      : PJ_I64;
  pj_val_t w = pj_convert(H, x, wide);
  if (wide != PJ_U64)
    w = pj_hlo_op(H, "stablehlo.bitcast_convert", &w, 1, NULL, pj_type_with_dtype(w.t, PJ_U64));
  rdims_t r;
  rdims_arg(L, "dim", &x.t, &r);
  set_out(L, 0, reduce(L, w, &r, "xor"));
  return NULL;
}

/* ---- scans ---- */

/* Inclusive scan along dim by recursive doubling: log2(n) steps of x = x (op) shift(x, s), the
 * shift padding with the identity. O(n log n) work, no quadratic windows. */
static pj_val_t scan(pj_lower_t *L, pj_val_t x, int dim, const char *op, double identity) {
  int64_t n = x.t.dims[dim];
  int rank = x.t.rank;
  for (int64_t s = 1; s < n; s *= 2) {
    int64_t start[PJ_MAX_RANK] = {0}, limit[PJ_MAX_RANK], lo[PJ_MAX_RANK] = {0},
            hi[PJ_MAX_RANK] = {0};
    for (int i = 0; i < rank; i++) limit[i] = x.t.dims[i];
    limit[dim] = n - s;
    lo[dim] = s;
    pj_val_t shifted = pj_pad(H, pj_slice(H, x, start, limit, NULL),
                              pj_const(H, x.t.dtype, identity), lo, hi, NULL);
    x = pj_binary(H, op, x, shifted);
  }
  return x;
}

static pj_status_t *lower_cumsum_cumprod(pj_lower_t *L) {
  bool prod = !strcmp(L->c->op, "cumprod");
  pj_val_t x = pj_tensor(L, "self");
  pj_dtype_t out = pj_out_type(L, 0).dtype;
  int dim = pj_norm_dim(L, pj_int(L, "dim", 0), x.t.rank);
  pj_dtype_t ct = out == PJ_BOOL ? PJ_I64 : acc_of(out);
  x = pj_convert(H, pj_convert(H, x, out == PJ_BOOL ? x.t.dtype : out), ct);
  if (x.t.rank == 0) {
    set_out(L, 0, x); /* CPU copies a 0-d input, -0 included */
    return NULL;
  }
  pj_val_t v = scan(L, x, dim, prod ? "stablehlo.multiply" : "stablehlo.add", prod ? 1 : 0);
  set_out(L, 0, prod ? v : no_negative_zero(L, v));
  return NULL;
}

/* ---- softmax family ---- */

/* The softmax dim as a reduction over one axis of a value of rank >= 1 (0-d is viewed as [1]). */
static pj_val_t as_rank1(pj_lower_t *L, pj_val_t x) {
  int64_t one = 1;
  return x.t.rank == 0 ? pj_reshape(H, x, 1, &one) : x;
}

static void one_dim(pj_lower_t *L, const pj_type_t *t, int64_t dim, rdims_t *r) {
  memset(r, 0, sizeof *r);
  int d = pj_norm_dim(L, dim, t->rank);
  r->n = 1;
  r->dims[0] = d;
  r->mask[d] = true;
  r->count = t->dims[d];
}

static pj_status_t *lower_softmax(pj_lower_t *L) {
  bool logsm = !strcmp(L->c->op, "_log_softmax");
  pj_val_t x = pj_tensor(L, "self");
  int64_t dim = pj_int(L, "dim", -1);
  pj_norm_dim(L, dim, x.t.rank); /* CPU checks the dim first, for every dtype and size */
  if (!pj_hlo_ok(H)) return NULL;
  pj_dtype_t ct = acc_of(pj_out_type(L, 0).dtype);
  if (is_complex(ct)) return unsupported_complex(L);
  if (!is_float(ct)) { /* integer or bool: CPU returns an empty input as it is, else raises */
    if (pj_type_numel(&x.t) == 0) {
      set_out(L, 0, pj_full(H, pj_out_type(L, 0), 0));
      return NULL;
    }
    pj_fail(L, PJ_ERR_UNIMPLEMENTED, "\"%s_lastdim_kernel_impl\" not implemented for '%s'",
            logsm ? "log_softmax" : "softmax", pj_dtype_info(ct)->name);
    return NULL;
  }
  x = as_rank1(L, pj_convert(H, x, ct));
  rdims_t r;
  one_dim(L, &x.t, dim, &r);
  if (!pj_hlo_ok(H)) return NULL;
  /* numerically stable: subtract the row max (a row of all -inf stays NaN, as on CPU) */
  pj_val_t m = reduce(L, x, &r, "max");
  pj_val_t sh = SUB(x, expand_back(L, m, &x.t, &r));
  pj_val_t e = U("exponential", sh);
  pj_val_t s = expand_back(L, reduce(L, e, &r, "add"), &x.t, &r);
  set_out(L, 0, logsm ? SUB(sh, U("log", s)) : DIV(e, s));
  return NULL;
}

static pj_status_t *lower_softmax_backward(pj_lower_t *L) {
  bool logsm = !strcmp(L->c->op, "_log_softmax_backward_data");
  pj_dtype_t ct = acc_of(pj_out_type(L, 0).dtype);
  pj_val_t g = as_rank1(L, pj_convert(H, pj_tensor(L, "grad_output"), ct));
  pj_val_t y = as_rank1(L, pj_convert(H, pj_tensor(L, "output"), ct));
  rdims_t r;
  one_dim(L, &y.t, pj_int(L, "dim", -1), &r);
  if (!pj_hlo_ok(H)) return NULL;
  pj_val_t res;
  if (logsm) { /* d/dx log_softmax: g - exp(y) * sum(g) */
    pj_val_t s = expand_back(L, reduce(L, g, &r, "add"), &y.t, &r);
    res = SUB(g, MUL(U("exponential", y), s));
  } else { /* d/dx softmax: y * (g - sum(g * y)) */
    pj_val_t gy = MUL(g, y);
    pj_val_t s = expand_back(L, reduce(L, gy, &r, "add"), &y.t, &r);
    res = SUB(gy, MUL(y, s));
  }
  set_out(L, 0, res);
  return NULL;
}

const pj_lowering_entry_t pj_lowerings_reduce[] = {
    {"sum", lower_sum_like, PJ_SHAPE_EXACT},
    {"nansum", lower_sum_like, PJ_SHAPE_EXACT},
    {"mean", lower_sum_like, PJ_SHAPE_EXACT},
    {"prod", lower_sum_like, PJ_SHAPE_EXACT},
    {"amax", lower_amax_amin, PJ_SHAPE_IDEMPOTENT},
    {"amin", lower_amax_amin, PJ_SHAPE_IDEMPOTENT},
    {"aminmax", lower_aminmax, PJ_SHAPE_IDEMPOTENT},
    {"max", lower_max_min, PJ_SHAPE_IDEMPOTENT},
    {"min", lower_max_min, PJ_SHAPE_IDEMPOTENT},
    {"argmax", lower_argmax_argmin, PJ_SHAPE_EXACT},
    {"argmin", lower_argmax_argmin, PJ_SHAPE_EXACT},
    {"var", lower_var_std, PJ_SHAPE_EXACT},
    {"std", lower_var_std, PJ_SHAPE_EXACT},
    {"var_mean", lower_var_std, PJ_SHAPE_EXACT},
    {"std_mean", lower_var_std, PJ_SHAPE_EXACT},
    {"linalg_vector_norm", lower_norm, PJ_SHAPE_EXACT},
    {"norm", lower_norm, PJ_SHAPE_EXACT},
    {"logsumexp", lower_logsumexp, PJ_SHAPE_EXACT},
    {"any", lower_any_all, PJ_SHAPE_IDEMPOTENT},
    {"all", lower_any_all, PJ_SHAPE_IDEMPOTENT},
    {"count_nonzero", lower_count_nonzero, PJ_SHAPE_EXACT},
    {"hash_tensor", lower_hash_tensor, PJ_SHAPE_EXACT},
    {"cumsum", lower_cumsum_cumprod, PJ_SHAPE_PREFIX},
    {"cumprod", lower_cumsum_cumprod, PJ_SHAPE_PREFIX},
    {"_softmax", lower_softmax, PJ_SHAPE_EXACT},
    {"_log_softmax", lower_softmax, PJ_SHAPE_EXACT},
    {"_softmax_backward_data", lower_softmax_backward, PJ_SHAPE_EXACT},
    {"_log_softmax_backward_data", lower_softmax_backward, PJ_SHAPE_EXACT},
    {NULL, NULL, PJ_SHAPE_EXACT},
};
