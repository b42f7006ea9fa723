/* Helpers shared by the linalg lowering families (linalg_decomp.c, linalg_eig.c): batched
 * [B, m, n] matrix plumbing, per-matrix index access, and while loops over carried state. Small
 * builders are static inline here; the while-loop builder is defined once in linalg_decomp.c.
 * Include after table.h and emit.h (the helpers use the lowering context `L` and emit.h's
 * shorthands). */
#ifndef TORCH_PJRT_OPS_LINALG_UTIL_H
#define TORCH_PJRT_OPS_LINALG_UTIL_H
#include "lower.h"
#include "emit.h"

static inline bool cplx(pj_dtype_t dt) { return pj_dtype_info(dt)->is_complex; }
static inline pj_dtype_t real_of(pj_dtype_t dt) {
  return dt == PJ_C64 ? PJ_F32 : dt == PJ_C128 ? PJ_F64 : dt;
}

static inline pj_type_t ty(pj_dtype_t dt, int rank, int64_t d0, int64_t d1, int64_t d2) {
  int64_t d[3] = {d0, d1, d2};
  return pj_type(dt, rank, d);
}

static inline pj_val_t ci(pj_lower_t *L, int64_t v) { return pj_const_i(H, PJ_I32, v); }

/* 0-d value broadcast to type t (same dtype as x, converted if needed). */
static inline pj_val_t bs(pj_lower_t *L, pj_val_t s, pj_type_t t) {
  return pj_broadcast_in_dim(H, pj_convert(H, s, t.dtype), t, NULL);
}

/* x of rank r broadcast to t along the listed dims of t. */
static inline pj_val_t bdims(pj_lower_t *L, pj_val_t x, pj_type_t t, int64_t a, int64_t b) {
  int64_t d[2] = {a, b};
  return pj_broadcast_in_dim(H, x, pj_type_with_dtype(t, x.t.dtype), d);
}

static inline pj_val_t iota(pj_lower_t *L, pj_type_t t, int dim) {
  return pj_iota(H, pj_type_with_dtype(t, PJ_I32), dim);
}

static inline pj_val_t zeros(pj_lower_t *L, pj_type_t t) { return pj_full(H, t, 0); }

static inline pj_val_t sum1(pj_lower_t *L, pj_val_t x, int64_t dim) { return pj_reduce(H, x, &dim, 1, "add"); }

static inline pj_val_t conj_(pj_lower_t *L, pj_val_t x) {
  if (!cplx(x.t.dtype)) return x;
  pj_val_t re = U("real", x), im = U("imag", x);
  pj_val_t parts[2] = {re, U("negate", im)};
  return pj_hlo_op(H, "stablehlo.complex", parts, 2, NULL, x.t);
}

/* Makes a complex value from real parts (re, im) of the matching real type. */
static inline pj_val_t mkcomplex(pj_lower_t *L, pj_val_t re, pj_val_t im, pj_dtype_t dt) {
  pj_val_t parts[2] = {re, im};
  return pj_hlo_op(H, "stablehlo.complex", parts, 2, NULL, pj_type_with_dtype(re.t, dt));
}

/* [..., m, n] -> [B, m, n]. */
static inline pj_val_t to3(pj_lower_t *L, pj_val_t x) {
  if (x.id < 0) return x;
  int r = x.t.rank;
  int64_t B = 1;
  for (int i = 0; i < r - 2; i++) B *= x.t.dims[i];
  int64_t d[3] = {B, x.t.dims[r - 2], x.t.dims[r - 1]};
  return pj_reshape(H, x, 3, d);
}

/* Broadcasts x's batch dims (all but the last `keep`) to `batch` (nb dims). */
static inline pj_val_t bbatch(pj_lower_t *L, pj_val_t x, const int64_t *batch, int nb, int keep) {
  int64_t d[PJ_MAX_RANK];
  for (int i = 0; i < nb; i++) d[i] = batch[i];
  for (int i = 0; i < keep; i++) d[nb + i] = x.t.dims[x.t.rank - keep + i];
  return pj_broadcast_to(H, x, nb + keep, d);
}

/* Sets destination k from a value with its element count. */
static inline void set_out(pj_lower_t *L, int k, pj_val_t v) {
  if (k >= pj_nout(L)) return;
  pj_type_t t = pj_out_type(L, k);
  if (pj_type_numel(&t) == 0) {
    pj_set_result(L, k, zeros(L, t));
    return;
  }
  if (v.id >= 0 && pj_type_numel(&v.t) == pj_type_numel(&t)) v = pj_reshape(H, v, t.rank, t.dims);
  pj_set_result(L, k, v);
}

/* Magnitude used for pivoting: |x| (real), |re|+|im| (complex), as LAPACK's i?amax. */
static inline pj_val_t pivmag(pj_lower_t *L, pj_val_t x) {
  if (!cplx(x.t.dtype)) return U("abs", x);
  return ADD(U("abs", U("real", x)), U("abs", U("imag", x)));
}

/* Column k (i32 0-d) of A [B,m,n] as [B,m]; row k as [B,n]. Select-based, so other entries'
 * Inf/NaN do not leak in. */
static inline pj_val_t col_at(pj_lower_t *L, pj_val_t A, pj_val_t k) {
  pj_val_t cols = iota(L, A.t, 2);
  pj_val_t m = CMP("EQ", cols, bs(L, k, cols.t));
  return sum1(L, SEL(m, A, zeros(L, A.t)), 2);
}
/* Element k of v [B,n] as [B]. */
static inline pj_val_t elt_at(pj_lower_t *L, pj_val_t v, pj_val_t k) {
  pj_val_t i = iota(L, v.t, 1);
  return sum1(L, SEL(CMP("EQ", i, bs(L, k, i.t)), v, zeros(L, v.t)), 1);
}
/* v [B,n] with element k replaced by s [B]. */
static inline pj_val_t set_elt(pj_lower_t *L, pj_val_t v, pj_val_t k, pj_val_t s) {
  pj_val_t i = iota(L, v.t, 1);
  return SEL(CMP("EQ", i, bs(L, k, i.t)), bdims(L, s, v.t, 0, -1), v);
}

/* Batched matrix product [B,m,k] x [B,k,n]. */
static inline pj_val_t bmm(pj_lower_t *L, pj_val_t a, pj_val_t b) {
  int64_t lb = 0, rb = 0, lc = 2, rc = 1;
  return pj_dot_general(H, a, b, &lb, &rb, 1, &lc, &rc, 1, a.t.dtype);
}
static inline pj_val_t tr3(pj_lower_t *L, pj_val_t a) {
  int64_t p[3] = {0, 2, 1};
  return pj_transpose(H, a, p);
}
static inline pj_val_t adj3(pj_lower_t *L, pj_val_t a) { return conj_(L, tr3(L, a)); }

/* Identity-like [B,m,n] of dtype dt. */
static inline pj_val_t eye3(pj_lower_t *L, pj_dtype_t dt, int64_t B, int64_t m, int64_t n) {
  pj_type_t t = ty(dt, 3, B, m, n);
  pj_val_t e = CMP("EQ", iota(L, t, 1), iota(L, t, 2));
  return SEL(e, pj_full(H, t, 1), zeros(L, t));
}

/* Keeps the triangle (lower: row >= col + off; upper: col >= row + off) of A [B,m,n]. */
static inline pj_val_t tri(pj_lower_t *L, pj_val_t A, bool lower, int64_t off) {
  pj_val_t r = iota(L, A.t, 1), c = iota(L, A.t, 2);
  pj_val_t d = lower ? SUB(r, c) : SUB(c, r);
  return SEL(CMP("GE", d, pj_full(H, d.t, (double)off)), A, zeros(L, A.t));
}

static inline pj_val_t diag3(pj_lower_t *L, pj_val_t A) { /* [B,m,n] -> [B,min(m,n)] */
  int64_t K = A.t.dims[1] < A.t.dims[2] ? A.t.dims[1] : A.t.dims[2];
  int64_t s[3] = {0, 0, 0}, l[3] = {A.t.dims[0], K, K};
  pj_val_t sq = pj_slice(H, A, s, l, NULL);
  return sum1(L, SEL(CMP("EQ", iota(L, sq.t, 1), iota(L, sq.t, 2)), sq, zeros(L, sq.t)), 2);
}

static inline pj_val_t slice3(pj_lower_t *L, pj_val_t A, int64_t m, int64_t n) {
  int64_t s[3] = {0, 0, 0}, l[3] = {A.t.dims[0], m, n};
  return pj_slice(H, A, s, l, NULL);
}

static inline double eps_of(pj_dtype_t dt) { /* unit roundoff times 2 (machine epsilon) */
  return dt == PJ_F64 || dt == PJ_C128 ? 2.220446049250313e-16 : 1.1920928955078125e-07;
}

/* ---- per-matrix indices: idx is [B] i32, one index per matrix of the batch ---- */

/* [B] -> t, along t's dim 0 (and `keep`, -1 for none) */
static inline pj_val_t bk(pj_lower_t *L, pj_val_t k, pj_type_t t, int64_t keep) {
  return bdims(L, k, pj_type_with_dtype(t, PJ_I32), 0, keep);
}

/* v [B,n] at per-matrix index idx [B] -> [B] */
static inline pj_val_t pick(pj_lower_t *L, pj_val_t v, pj_val_t idx) {
  pj_val_t i = pj_iota(H, pj_type_with_dtype(v.t, PJ_I32), 1);
  return sum1(L, SEL(CMP("EQ", i, bk(L, idx, v.t, -1)), v, zeros(L, v.t)), 1);
}
/* column / row idx [B] of A [B,n,n] -> [B,n] */
static inline pj_val_t colv(pj_lower_t *L, pj_val_t A, pj_val_t idx) {
  pj_val_t c = iota(L, A.t, 2);
  return sum1(L, SEL(CMP("EQ", c, bk(L, idx, A.t, -1)), A, zeros(L, A.t)), 2);
}
static inline pj_val_t rowv(pj_lower_t *L, pj_val_t X, pj_val_t idx) {
  pj_val_t r = iota(L, X.t, 1);
  return sum1(L, SEL(CMP("EQ", r, bk(L, idx, X.t, -1)), X, zeros(L, X.t)), 1);
}

/* ---- while loops ---- */

typedef void (*body_fn)(pj_lower_t *L, pj_val_t i, pj_val_t *st, void *ctx);
typedef pj_val_t (*cond_fn)(pj_lower_t *L, pj_val_t *st, void *ctx);

/* Most carried values a loop may have (besides its counter). */
#define MAX_STATE 15

/* for (i = 0; i < n && cond(st); i++) st = body(i, st), as one stablehlo.while. `cond`, when
 * set, is evaluated on the state in the condition region and ANDed in (a convergence test), so
 * n is a hard bound on the iterations. Loop bodies only use their carried values and
 * constants made inside the body (no implicit captures). */
void pj_linalg_loop_while(pj_lower_t *L, int64_t n, pj_val_t *st, int ns, body_fn body,
                          cond_fn cond, void *ctx);

static inline void loop_while(pj_lower_t *L, int64_t n, pj_val_t *st, int ns, body_fn body,
                              cond_fn cond, void *ctx) {
  pj_linalg_loop_while(L, n, st, ns, body, cond, ctx);
}

static inline void loop(pj_lower_t *L, int64_t n, pj_val_t *st, int ns, body_fn body, void *ctx) {
  pj_linalg_loop_while(L, n, st, ns, body, NULL, ctx);
}

#endif
