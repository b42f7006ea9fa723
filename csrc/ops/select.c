/* Lowerings: select family (order statistics and their indices, scans that carry indices,
 * binary search, histograms, equality of whole tensors, fixed-size nonzero).
 *
 * Row layout: ops that work along one dim move it last and flatten the others, so the value is
 * [B, n] (B rows of n elements); per-row positions are i64 [B] or [B, m] and elements are read
 * with one flat gather. Tie-breaking follows CPU's algorithms exactly where they are
 * deterministic functions of the input: median is the stable-sort rank (value, index), kthvalue
 * replays CPU's quickselect step by step in a while loop, searchsorted replays its binary search
 * (so NaN and unsorted boundaries give CPU's answers), cummax/cummin take the latest of equal
 * extremes. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "order.h"
#include "slices.h"
#include "table.h"
#include "emit.h"

static const pj_val_t kBad = {.id = -1, .sub = -1};

static bool is_float(pj_dtype_t dt) { return pj_dtype_info(dt)->is_float; }
static bool is_complex(pj_dtype_t dt) { return pj_dtype_info(dt)->is_complex; }

static pj_val_t csti(pj_lower_t *L, pj_val_t like, int64_t v) {
  return pj_broadcast_in_dim(H, pj_const_i(H, like.t.dtype, v), like.t, NULL);
}
static pj_val_t bcast(pj_lower_t *L, pj_val_t s, pj_type_t t) {
  return pj_broadcast_in_dim(H, s, t, NULL);
}
static pj_val_t isnan_(pj_lower_t *L, pj_val_t x) {
  return is_float(x.t.dtype) ? CMP("NE", x, x) : pj_full(H, pj_type_with_dtype(x.t, PJ_BOOL), 0);
}
static pj_val_t not_(pj_lower_t *L, pj_val_t x) { return U("not", x); }

/* ---- row layout ---- */

typedef struct {
  pj_type_t t;  /* the original type */
  int dim;
  int64_t B, n; /* rows, row length */
  int64_t perm[PJ_MAX_RANK];
} rows_t;

/* x as [B, n] with dim last (0-d: [1, 1]). */
static pj_val_t to_rows(pj_lower_t *L, pj_val_t x, int dim, rows_t *r) {
  r->t = x.t;
  r->dim = dim;
  int rank = x.t.rank, k = 0;
  r->B = 1;
  for (int i = 0; i < rank; i++)
    if (i != dim) r->perm[k++] = i, r->B *= x.t.dims[i];
  if (rank > 0) r->perm[k++] = dim;
  r->n = rank > 0 ? x.t.dims[dim] : 1;
  if (x.id < 0) return kBad;
  if (rank > 1 && dim != rank - 1) x = pj_transpose(H, x, r->perm);
  int64_t d[2] = {r->B, r->n};
  return pj_reshape(H, x, 2, d);
}

/* [B, n] back to the original layout (dim restored from last). */
static pj_val_t from_rows(pj_lower_t *L, pj_val_t v, const rows_t *r) {
  int rank = r->t.rank;
  if (rank == 0) return pj_reshape(H, v, 0, NULL);
  int64_t d[PJ_MAX_RANK], inv[PJ_MAX_RANK];
  for (int i = 0; i < rank; i++) d[i] = r->t.dims[r->perm[i]], inv[r->perm[i]] = i;
  v = pj_reshape(H, v, rank, d);
  if (rank > 1 && r->dim != rank - 1) v = pj_transpose(H, v, inv);
  return v;
}

/* Elements of x [B, n] at per-row positions pos [B] or [B, m] (i64, in range). */
static pj_val_t take_rows(pj_lower_t *L, pj_val_t x, pj_val_t pos) {
  if (x.id < 0 || pos.id < 0) return kBad;
  int64_t n = x.t.dims[1], total = pj_type_numel(&x.t);
  pj_val_t base = MUL(pj_iota(H, pos.t, 0), csti(L, pos, n));
  return pj_gather_1d(H, pj_reshape(H, x, 1, &total), ADD(base, pos));
}

/* Iota along the row dim of a [B, n] shape, i64. */
static pj_val_t col_iota(pj_lower_t *L, pj_type_t t) {
  return pj_iota(H, pj_type_with_dtype(t, PJ_I64), 1);
}

/* A [B] value broadcast along the rows of the [B, n] shape t. */
static pj_val_t bcast_rows(pj_lower_t *L, pj_val_t v, pj_type_t t) {
  int64_t d0 = 0;
  return pj_broadcast_in_dim(H, v, pj_type_with_dtype(t, v.t.dtype), &d0);
}

/* Reduction of [B, n] over its rows' elements to [B]. */
static pj_val_t row_reduce(pj_lower_t *L, pj_val_t x, const char *kind) {
  int64_t one = 1;
  return pj_reduce(H, x, &one, 1, kind);
}

/* A [B] result shaped as destination k (keepdim or not) and set. */
static void set_rowwise(pj_lower_t *L, int k, pj_val_t v) {
  if (k >= pj_nout(L)) return;
  pj_type_t t = pj_out_type(L, k);
  if (pj_type_numel(&t) == 0) return;
  pj_set_result(L, k, pj_reshape(H, v, t.rank, t.dims));
}

/* ---- median / nanmedian ---- */

/* The original position that ends up first when libstdc++'s nth_element (introselect: median
 * of three moved to the front, unguarded partition, insertion sort below 4 elements) selects
 * position 0 of n mutually equivalent elements: where CPU's nanmedian finds the "median" of a
 * row that is all NaN. Only positions move, so it is computed here once per row length. */
static int64_t equivalent_nth0(int64_t n) {
  if (n <= 3 || n > (1 << 24)) return 0;
  int64_t *a = malloc((size_t)n * sizeof *a);
  if (!a) return 0;
  for (int64_t i = 0; i < n; i++) a[i] = i;
  int64_t first = 0, last = n, t;
  while (last - first > 3) {
    int64_t mid = first + (last - first) / 2;
    t = a[first], a[first] = a[mid], a[mid] = t;
    int64_t lo = first + 1, hi = last;
    for (;;) {
      --hi;
      if (!(lo < hi)) break;
      t = a[lo], a[lo] = a[hi], a[hi] = t;
      ++lo;
    }
    if (lo <= 0) first = lo;
    else last = lo;
  }
  int64_t r = a[0];
  free(a);
  return r;
}

/* Row-wise median as CPU computes it: the element of rank (n-1)/2 in the order (value, index),
 * or with NaNs: median returns the first NaN, nanmedian the element of rank (m-1)/2 among the
 * m non-NaN ones (rank 0, a NaN, when all are NaN). */
static void median_rows(pj_lower_t *L, pj_val_t x, bool ignore_nan, pj_val_t *val, pj_val_t *idx) {
  int64_t n = x.t.dims[1];
  pj_val_t ops[2] = {x, col_iota(L, x.t)}, res[2];
  if (!pj_sort_along(L, ops, 2, 1, false, res)) {
    *val = *idx = kBad;
    return;
  }
  pj_val_t nnan = row_reduce(L, pj_convert(H, isnan_(L, x), PJ_I64), "add"); /* [B] */
  pj_val_t pos;
  if (ignore_nan) {
    /* (n - nnan - 1) / 2 with C's truncation: 0 when every element is NaN */
    pj_val_t m = SUB(csti(L, nnan, n), nnan);
    pos = DIV(MAX(SUB(m, csti(L, m, 1)), csti(L, m, 0)), csti(L, m, 2));
  } else {
    pos = SEL(CMP("GT", nnan, csti(L, nnan, 0)), SUB(csti(L, nnan, n), nnan),
              csti(L, nnan, (n - 1) / 2));
  }
  *val = take_rows(L, res[0], pos);
  *idx = take_rows(L, res[1], pos);
  if (ignore_nan && n > 3) /* rows of NaN only: nth_element's arrangement of equivalent ones */
    *idx = SEL(CMP("EQ", nnan, csti(L, nnan, n)), csti(L, nnan, equivalent_nth0(n)), *idx);
}

static pj_status_t *lower_median(pj_lower_t *L) {
  bool ignore_nan = !strcmp(L->c->op, "nanmedian");
  pj_val_t x = pj_tensor(L, "self");
  if (is_complex(x.t.dtype))
    return pj_status_new(PJ_ERR_RUNTIME, "%s() does not support complex inputs", L->c->op);
  rows_t r;
  pj_val_t val, idx;
  if (!pj_has(L, "dim")) { /* the whole tensor: values only */
    int64_t n = pj_type_numel(&x.t);
    if (n == 0) { /* CPU returns NaN for an empty input */
      pj_set_result(L, 0, pj_full(H, pj_out_type(L, 0), NAN));
      return NULL;
    }
    int64_t d[2] = {1, n};
    median_rows(L, pj_reshape(H, x, 2, d), ignore_nan, &val, &idx);
    set_rowwise(L, 0, val);
    return NULL;
  }
  int dim = x.t.rank ? pj_norm_dim(L, pj_int(L, "dim", 0), x.t.rank) : 0;
  pj_val_t xr = to_rows(L, x, dim, &r);
  if (r.B == 0 || r.n == 0) return NULL; /* nothing to write (CPU raises for n == 0) */
  median_rows(L, xr, ignore_nan, &val, &idx);
  set_rowwise(L, 0, val);
  set_rowwise(L, 1, idx);
  return NULL;
}

/* ---- mode ---- */

/* Inclusive running maximum along the rows of an i64 [B, n] by recursive doubling. */
static pj_val_t running_max(pj_lower_t *L, pj_val_t x) {
  int64_t n = x.t.dims[1];
  for (int64_t s = 1; s < n; s *= 2) {
    int64_t st[2] = {0, 0}, lim[2] = {x.t.dims[0], n - s}, lo[2] = {0, s}, hi[2] = {0, 0};
    pj_val_t sh = pj_pad(H, pj_slice(H, x, st, lim, NULL), pj_const_i(H, PJ_I64, INT64_MIN), lo,
                         hi, NULL);
    x = MAX(x, sh);
  }
  return x;
}

/* CPU sorts (value, index) pairs by value and takes the first run of maximal length; its index
 * is the run's last element. The sort here is stable, which is what CPU's sort does on the rows
 * it sorts by insertion (up to 16 elements); NaNs never compare equal, so each is a run of one. */
static pj_status_t *lower_mode(pj_lower_t *L) {
  pj_val_t x = pj_tensor(L, "self");
  if (is_complex(x.t.dtype))
    return pj_status_new(PJ_ERR_RUNTIME, "mode() does not support complex inputs");
  rows_t r;
  int dim = x.t.rank ? pj_norm_dim(L, pj_int(L, "dim", -1), x.t.rank) : 0;
  pj_val_t xr = to_rows(L, x, dim, &r);
  if (r.B == 0 || r.n == 0) return NULL;
  int64_t B = r.B, n = r.n;
  pj_val_t ops[2] = {xr, col_iota(L, xr.t)}, s[2];
  if (!pj_sort_along(L, ops, 2, 1, false, s)) return NULL;
  pj_val_t v = s[0];
  pj_type_t bt = pj_type_with_dtype(v.t, PJ_BOOL);
  /* differs[p]: v[p] != v[p+1], for p < n-1 */
  pj_val_t starts, ends;
  if (n > 1) {
    int64_t a0[2] = {0, 0}, a1[2] = {B, n - 1}, b0[2] = {0, 1}, b1[2] = {B, n};
    pj_val_t differs = CMP("NE", pj_slice(H, v, a0, a1, NULL), pj_slice(H, v, b0, b1, NULL));
    int64_t lo[2] = {0, 1}, hi[2] = {0, 0};
    pj_val_t t = pj_const(H, PJ_BOOL, 1);
    starts = pj_pad(H, differs, t, lo, hi, NULL);
    ends = pj_pad(H, differs, t, hi, lo, NULL);
  } else {
    starts = ends = pj_full(H, bt, 1);
  }
  pj_val_t it = col_iota(L, v.t);
  pj_val_t run_start = running_max(L, SEL(starts, it, csti(L, it, 0)));
  pj_val_t freq = SEL(ends, ADD(SUB(it, run_start), csti(L, it, 1)), csti(L, it, 0));
  pj_val_t maxf = row_reduce(L, freq, "max");
  pj_val_t first = SEL(AND(ends, CMP("EQ", freq, bcast_rows(L, maxf, it.t))), it,
                       csti(L, it, n));
  pj_val_t pos = row_reduce(L, first, "min");
  set_rowwise(L, 0, take_rows(L, v, pos));
  set_rowwise(L, 1, take_rows(L, s[1], pos));
  return NULL;
}

/* ---- while loops ---- */

typedef pj_val_t (*loop_cond_fn)(pj_lower_t *L, const pj_val_t *st, void *user);
typedef void (*loop_body_fn)(pj_lower_t *L, pj_val_t *st, void *user);

#define MAX_LOOP_STATE 12

/* stablehlo.while over state[0..n): cond gives a 0-d bool, body updates the state in place.
 * The regions only use their block arguments (nothing captured from outside). */
static bool while_loop(pj_lower_t *L, pj_val_t *state, int n, loop_cond_fn cond,
                       loop_body_fn body, void *user) {
  pj_type_t ts[MAX_LOOP_STATE];
  pj_val_t a[MAX_LOOP_STATE], res[MAX_LOOP_STATE];
  for (int i = 0; i < n; i++) ts[i] = state[i].t;
  pj_hlo_region_begin(H, ts, n, a);
  pj_val_t p = cond(L, a, user);
  char *cr = pj_hlo_region_end(H, &p, 1);
  pj_hlo_region_begin(H, ts, n, a);
  body(L, a, user);
  char *br = pj_hlo_region_end(H, a, n);
  bool ok = false;
  if (cr && br) {
    size_t len = strlen(cr) + strlen(br) + 4;
    char *both = malloc(len);
    if (both) {
      snprintf(both, len, "%s, %s", cr, br);
      ok = pj_hlo_op_multi(H, "stablehlo.while", state, n, both, NULL, ts, n, res);
      free(both);
    } else {
      pj_fail(L, PJ_ERR_OOM, "out of host memory");
    }
  }
  free(cr);
  free(br);
  for (int i = 0; i < n; i++) state[i] = ok ? res[i] : kBad;
  return ok;
}

/* ---- kthvalue: CPU's quickselect, replayed ---- */

/* CPU's kthvalue runs a median-of-three quickselect (Sedgewick's partition, NaN greatest) on
 * each row and reports the index the k-th element ends up with; among equal values that index
 * depends on the swaps, so the same swaps are made here. Each loop iteration advances every row
 * by one partition setup and one exchange (the element-by-element scans of the partition become
 * one masked min/max each). State: values, indices, L, R, i, j, pivot, phase (0 setup,
 * 1 partitioning, 2 done). */
typedef struct {
  int64_t k, n;
} qs_t;

enum { QA, QIX, QL, QR, QI, QJ, QPIV, QPH, QN };

static pj_val_t gt_or_nan(pj_lower_t *L, pj_val_t x, pj_val_t y) {
  pj_val_t g = CMP("GT", x, y);
  if (!is_float(x.t.dtype)) return g;
  return OR(g, AND(isnan_(L, x), not_(L, isnan_(L, y))));
}

/* Elements of [B, n] at per-row positions clamped into the row. */
static pj_val_t take_clamped(pj_lower_t *L, pj_val_t x, pj_val_t pos) {
  pj_val_t c = MIN(MAX(pos, csti(L, pos, 0)), csti(L, pos, x.t.dims[1] - 1));
  return take_rows(L, x, c);
}

/* Exchanges positions p and q ([B]) of the rows where en ([B] bool) holds. */
static void qs_swap(pj_lower_t *L, pj_val_t *st, pj_val_t en, pj_val_t p, pj_val_t q) {
  pj_val_t it = col_iota(L, st[QA].t);
  pj_val_t enb = bcast_rows(L, en, pj_type_with_dtype(it.t, PJ_BOOL));
  pj_val_t mp = AND(enb, CMP("EQ", it, bcast_rows(L, p, it.t)));
  pj_val_t mq = AND(enb, CMP("EQ", it, bcast_rows(L, q, it.t)));
  for (int k = QA; k <= QIX; k++) {
    pj_val_t a = st[k];
    pj_val_t ap = bcast_rows(L, take_clamped(L, a, p), a.t);
    pj_val_t aq = bcast_rows(L, take_clamped(L, a, q), a.t);
    st[k] = SEL(mp, aq, SEL(mq, ap, a));
  }
}

static pj_val_t qs_cond(pj_lower_t *L, const pj_val_t *st, void *user) {
  (void)user;
  pj_val_t ph = st[QPH];
  int64_t zero = 0;
  return pj_reduce(H, CMP("NE", ph, csti(L, ph, 2)), &zero, 1, "or");
}

static void qs_body(pj_lower_t *L, pj_val_t *st, void *user) {
  const qs_t *q = user;
  pj_val_t one = csti(L, st[QL], 1);
  pj_val_t lo = st[QL], hi = st[QR], ph = st[QPH];
  /* setup of a partition round */
  pj_val_t setup = CMP("EQ", ph, csti(L, ph, 0));
  pj_val_t small = AND(setup, CMP("LE", hi, lo));
  pj_val_t two = AND(setup, CMP("EQ", hi, ADD(lo, one)));
  pj_val_t gen = AND(setup, CMP("GT", hi, ADD(lo, one)));
  pj_val_t lo1 = ADD(lo, one);
  pj_val_t mid = DIV(ADD(lo, hi), csti(L, lo, 2));
  pj_val_t en = OR(gen, AND(two, gt_or_nan(L, take_clamped(L, st[QA], lo),
                                           take_clamped(L, st[QA], hi))));
  qs_swap(L, st, en, SEL(gen, mid, lo), SEL(gen, lo1, hi));
  qs_swap(L, st, AND(gen, gt_or_nan(L, take_clamped(L, st[QA], lo1), take_clamped(L, st[QA], hi))),
          lo1, hi);
  qs_swap(L, st, AND(gen, gt_or_nan(L, take_clamped(L, st[QA], lo), take_clamped(L, st[QA], hi))),
          lo, hi);
  qs_swap(L, st, AND(gen, gt_or_nan(L, take_clamped(L, st[QA], lo1), take_clamped(L, st[QA], lo))),
          lo1, lo);
  st[QPIV] = SEL(gen, take_clamped(L, st[QA], lo), st[QPIV]);
  st[QI] = SEL(gen, lo1, st[QI]);
  st[QJ] = SEL(gen, hi, st[QJ]);
  ph = SEL(OR(small, two), csti(L, ph, 2), SEL(gen, csti(L, ph, 1), ph));
  /* one exchange of the partition: i moves up to the first element not below the pivot, j
   * down to the last not above it */
  pj_val_t part = CMP("EQ", ph, csti(L, ph, 1));
  pj_val_t a = st[QA], it = col_iota(L, a.t);
  pj_val_t pivb = bcast_rows(L, st[QPIV], a.t);
  pj_val_t ib = bcast_rows(L, st[QI], it.t), jb = bcast_rows(L, st[QJ], it.t);
  pj_val_t lob = bcast_rows(L, lo, it.t), hib = bcast_rows(L, hi, it.t);
  pj_val_t ci = AND(AND(CMP("GT", it, ib), CMP("LE", it, hib)), not_(L, gt_or_nan(L, pivb, a)));
  pj_val_t cj = AND(AND(CMP("LT", it, jb), CMP("GE", it, lob)), not_(L, gt_or_nan(L, a, pivb)));
  pj_val_t inew = MIN(row_reduce(L, SEL(ci, it, csti(L, it, q->n)), "min"), hi);
  pj_val_t jnew = MAX(row_reduce(L, SEL(cj, it, csti(L, it, -1)), "max"), lo);
  pj_val_t cross = CMP("LT", jnew, inew);
  qs_swap(L, st, part, SEL(cross, lo, inew), jnew);
  pj_val_t kk = csti(L, lo, q->k);
  pj_val_t fin = AND(part, cross), cont = AND(part, not_(L, cross));
  st[QL] = SEL(AND(fin, CMP("LE", jnew, kk)), inew, lo);
  st[QR] = SEL(AND(fin, CMP("GE", jnew, kk)), SUB(jnew, one), hi);
  st[QI] = SEL(cont, inew, st[QI]);
  st[QJ] = SEL(cont, jnew, st[QJ]);
  st[QPH] = SEL(fin, csti(L, ph, 0), ph);
}

static pj_status_t *lower_kthvalue(pj_lower_t *L) {
  pj_val_t x = pj_tensor(L, "self");
  if (is_complex(x.t.dtype))
    return pj_status_new(PJ_ERR_RUNTIME, "kthvalue() does not support complex inputs");
  rows_t r;
  int dim = x.t.rank ? pj_norm_dim(L, pj_int(L, "dim", -1), x.t.rank) : 0;
  pj_val_t xr = to_rows(L, x, dim, &r);
  int64_t k = pj_int(L, "k", 1);
  if (k < 1 || k > r.n)
    return pj_status_new(PJ_ERR_INDEX, "kthvalue(): selected number k out of range for "
                         "dimension %d", dim);
  if (r.B == 0) return NULL;
  qs_t q = {.k = k - 1, .n = r.n};
  int64_t B = r.B;
  pj_type_t bt = pj_type(PJ_I64, 1, &B);
  pj_val_t st[QN];
  st[QA] = xr;
  st[QIX] = col_iota(L, xr.t);
  st[QL] = pj_full(H, bt, 0);
  st[QR] = pj_full(H, bt, (double)(r.n - 1));
  st[QI] = pj_full(H, bt, 0);
  st[QJ] = pj_full(H, bt, 0);
  st[QPIV] = pj_full(H, pj_type(xr.t.dtype, 1, &B), 0);
  st[QPH] = pj_full(H, bt, 0);
  if (!while_loop(L, st, QN, qs_cond, qs_body, &q)) return NULL;
  pj_val_t pos = pj_full(H, bt, (double)q.k);
  set_rowwise(L, 0, take_rows(L, st[QA], pos));
  set_rowwise(L, 1, take_rows(L, st[QIX], pos));
  return NULL;
}

/* ---- topk: CPU's nth_element and sort, replayed ---- */

/* When k * 64 > n, CPU's topk runs libstdc++'s nth_element (introselect: the median of
 * first+1, middle and last-1 moved to the front as the pivot, an unguarded partition, and an
 * insertion sort once at most 3 elements remain) to put the k-th element in place, then sorts
 * the k-1 before it (an insertion sort up to 16 elements); ties end up where those moves put
 * them. The loop replays the introselect rounds like kthvalue's (one exchange per iteration);
 * the insertion sorts are stable sorts of their ranges. State: values, indices, first, last,
 * lo, hi, pivot, phase (0 round setup, 1 partitioning, 2 done). */
typedef struct {
  int64_t nth, n;
  bool largest;
} ns_t;

enum { NA, NIX, NF, NL, NLO, NHI, NPIV, NPH, NN };

/* CPU's topk order: largest puts NaN first, then larger values; smallest the reverse. */
static pj_val_t topk_before(pj_lower_t *L, pj_val_t a, pj_val_t b, bool largest) {
  if (largest) return gt_or_nan(L, a, b);
  pj_val_t lt = CMP("LT", a, b);
  if (!is_float(a.t.dtype)) return lt;
  return OR(lt, AND(not_(L, isnan_(L, a)), isnan_(L, b)));
}

static pj_val_t ns_cond(pj_lower_t *L, const pj_val_t *st, void *user) {
  (void)user;
  int64_t zero = 0;
  return pj_reduce(H, CMP("NE", st[NPH], csti(L, st[NPH], 2)), &zero, 1, "or");
}

static void ns_body(pj_lower_t *L, pj_val_t *st, void *user) {
  const ns_t *q = user;
  pj_val_t one = csti(L, st[NF], 1), ph = st[NPH];
  pj_val_t f = st[NF], l = st[NL];
  pj_val_t setup = CMP("EQ", ph, csti(L, ph, 0));
  pj_val_t big = AND(setup, CMP("GT", SUB(l, f), csti(L, f, 3)));
  /* median of (first+1, mid, last-1) moved to first */
  pj_val_t a = ADD(f, one), b = ADD(f, DIV(SUB(l, f), csti(L, f, 2))), c = SUB(l, one);
  pj_val_t va = take_clamped(L, st[NA], a), vb = take_clamped(L, st[NA], b),
           vc = take_clamped(L, st[NA], c);
  pj_val_t ab = topk_before(L, va, vb, q->largest), bc = topk_before(L, vb, vc, q->largest),
           ac = topk_before(L, va, vc, q->largest);
  pj_val_t t = SEL(ab, SEL(bc, b, SEL(ac, c, a)), SEL(ac, a, SEL(bc, c, b)));
  qs_swap(L, st, big, f, t);
  st[NPIV] = SEL(big, take_clamped(L, st[NA], f), st[NPIV]);
  st[NLO] = SEL(big, ADD(f, one), st[NLO]);
  st[NHI] = SEL(big, l, st[NHI]);
  ph = SEL(big, csti(L, ph, 1), SEL(setup, csti(L, ph, 2), ph));
  /* one exchange of the unguarded partition */
  pj_val_t part = CMP("EQ", ph, csti(L, ph, 1));
  pj_val_t v = st[NA], it = col_iota(L, v.t);
  pj_val_t pivb = bcast_rows(L, st[NPIV], v.t);
  pj_val_t lob = bcast_rows(L, st[NLO], it.t), hib = bcast_rows(L, st[NHI], it.t);
  pj_val_t fb = bcast_rows(L, f, it.t), lb = bcast_rows(L, l, it.t);
  pj_val_t ci = AND(AND(CMP("GE", it, lob), CMP("LT", it, lb)),
                    not_(L, topk_before(L, v, pivb, q->largest)));
  pj_val_t cj = AND(AND(CMP("LT", it, hib), CMP("GE", it, fb)),
                    not_(L, topk_before(L, pivb, v, q->largest)));
  pj_val_t i = row_reduce(L, SEL(ci, it, lb), "min");
  pj_val_t j = row_reduce(L, SEL(cj, it, fb), "max");
  pj_val_t cross = not_(L, CMP("LT", i, j));
  pj_val_t cont = AND(part, not_(L, cross)), fin = AND(part, cross);
  qs_swap(L, st, cont, i, j);
  pj_val_t nth = csti(L, i, q->nth);
  pj_val_t le = CMP("LE", i, nth);
  st[NF] = SEL(AND(fin, le), i, f);
  st[NL] = SEL(AND(fin, not_(L, le)), i, l);
  st[NLO] = SEL(cont, ADD(i, one), st[NLO]);
  st[NHI] = SEL(cont, j, st[NHI]);
  st[NPH] = SEL(fin, csti(L, ph, 0), ph);
}

/* Stable sort of positions [lo, hi) of each row (lo, hi: [B] i64) in topk's order, the other
 * positions left in place. */
static bool sort_range(pj_lower_t *L, pj_val_t *v, pj_val_t *ix, pj_val_t lo, pj_val_t hi,
                       bool largest) {
  pj_val_t it = col_iota(L, v->t);
  pj_val_t seg = SEL(CMP("LT", it, bcast_rows(L, lo, it.t)), csti(L, it, 0),
                     SEL(CMP("LT", it, bcast_rows(L, hi, it.t)), csti(L, it, 1),
                         csti(L, it, 2)));
  /* key 0 (before) and 2 (after) keep their order: position breaks their ties */
  pj_val_t pos = SEL(CMP("EQ", seg, csti(L, seg, 1)), csti(L, it, 0), it);
  pj_type_t sts[8] = {pj_type_scalar(PJ_I64), pj_type_scalar(PJ_I64),
                      pj_type_scalar(PJ_I64), pj_type_scalar(PJ_I64),
                      pj_type_scalar(v->t.dtype), pj_type_scalar(v->t.dtype),
                      pj_type_scalar(PJ_I64), pj_type_scalar(PJ_I64)};
  pj_val_t a[8];
  pj_hlo_region_begin(H, sts, 8, a);
  pj_val_t in = AND(CMP("EQ", a[0], pj_const_i(H, PJ_I64, 1)), CMP("EQ", a[1], a[0]));
  pj_val_t lt = OR(CMP("LT", a[0], a[1]),
                   AND(CMP("EQ", a[0], a[1]),
                       SEL(in, topk_before(L, a[4], a[5], largest), CMP("LT", a[2], a[3]))));
  char *region = pj_hlo_region_end(H, &lt, 1);
  pj_val_t ops[4] = {seg, pos, *v, *ix}, res[4];
  pj_type_t outs[4] = {seg.t, pos.t, v->t, ix->t};
  bool ok = region && pj_hlo_op_multi(H, "stablehlo.sort", ops, 4, region,
                                      "dimension = 1 : i64, is_stable = true", outs, 4, res);
  free(region);
  if (ok) *v = res[2], *ix = res[3];
  return ok;
}

static pj_status_t *lower_topk(pj_lower_t *L) {
  pj_val_t x = pj_tensor(L, "self");
  if (is_complex(x.t.dtype))
    return pj_status_new(PJ_ERR_RUNTIME, "topk does not support complex inputs");
  if (x.t.dtype == PJ_BOOL) /* CPU's kernel checks this (fuzz finding F15), its Meta does not */
    return pj_status_new(PJ_ERR_RUNTIME, "topk does not support bool dtypes on CPU");
  int dim = x.t.rank ? pj_norm_dim(L, pj_int(L, "dim", -1), x.t.rank) : 0;
  int64_t k = pj_int(L, "k", 1);
  bool largest = pj_bool(L, "largest", true), sorted = pj_bool(L, "sorted", true);
  if (x.t.rank == 0 && (k == 0 || k == 1)) { /* CPU: the 0-d input and index 0, for k 0 or 1 */
    pj_set_result(L, 0, x);
    pj_set_result(L, 1, pj_const_i(H, PJ_I64, 0));
    return NULL;
  }
  rows_t r;
  pj_val_t v = to_rows(L, x, dim, &r);
  if (k < 0 || k > r.n) return pj_status_new(PJ_ERR_RUNTIME, "selected index k out of range");
  if (r.B == 0 || k == 0 || v.id < 0) return NULL;
  if (v.t.dtype == PJ_BOOL) v = pj_convert(H, v, PJ_I32);
  int64_t B = r.B, n = r.n;
  pj_val_t ix = col_iota(L, v.t);
  pj_type_t bt = pj_type(PJ_I64, 1, &B);
  if (k * 64 > n) { /* CPU's nth_element + sort path */
    ns_t q = {.nth = k - 1, .n = n, .largest = largest};
    pj_val_t st[NN];
    st[NA] = v;
    st[NIX] = ix;
    st[NF] = pj_full(H, bt, 0);
    st[NL] = pj_full(H, bt, (double)n);
    st[NLO] = st[NHI] = pj_full(H, bt, 0);
    st[NPIV] = pj_full(H, pj_type(v.t.dtype, 1, &B), 0);
    st[NPH] = pj_full(H, bt, 0);
    if (!while_loop(L, st, NN, ns_cond, ns_body, &q)) return NULL;
    v = st[NA], ix = st[NIX];
    if (!sort_range(L, &v, &ix, st[NF], st[NL], largest)) return NULL; /* final insertion sort */
    if (sorted && k > 2 &&
        !sort_range(L, &v, &ix, pj_full(H, bt, 0), pj_full(H, bt, (double)(k - 1)), largest))
      return NULL;
  } else { /* partial_sort on CPU: a stable sort here (ties may be ordered differently) */
    pj_val_t ops[2] = {v, ix}, res[2];
    if (!pj_sort_along(L, ops, 2, 1, largest, res)) return NULL;
    v = res[0], ix = res[1];
  }
  int64_t st0[2] = {0, 0}, lim[2] = {B, k};
  v = pj_slice(H, v, st0, lim, NULL);
  ix = pj_slice(H, ix, st0, lim, NULL);
  rows_t rk = r;
  if (rk.t.rank > 0) rk.t.dims[dim] = k;
  for (int o = 0; o < pj_nout(L) && o < 2; o++) {
    pj_type_t t = pj_out_type(L, o);
    if (pj_type_numel(&t) == 0) continue;
    pj_set_result(L, o, from_rows(L, o == 1 ? ix : v, &rk));
  }
  return NULL;
}

/* ---- searchsorted / bucketize: CPU's binary search, replayed ---- */

/* For each value, CPU's lower bound (first position whose boundary is not below the value:
 * !(b >= v) moves right) or upper bound (!(b > v) moves right), by a fixed number of halving
 * steps over the row of boundaries (through `sorter` when given). */
static pj_status_t *lower_searchsorted(pj_lower_t *L) {
  bool bucketize = !strcmp(L->c->op, "bucketize");
  const char *bname = bucketize ? "boundaries" : "sorted_sequence";
  const char *names[2] = {bname, "self"};
  pj_dtype_t ct = pj_result_type(L, names, 2);
  pj_val_t bd = pj_convert(H, pj_tensor(L, bname), ct);
  const pj_arg_t *sa = pj_arg(L, "self");
  pj_val_t v = pj_convert(H, sa && sa->kind == PJ_ARG_TENSOR ? pj_tensor(L, "self")
                                                             : pj_scalar(L, "self"), ct);
  const char *side = pj_str(L, "side", NULL);
  bool right = pj_bool(L, "right", false) || (side && !strcmp(side, "right"));
  pj_type_t ot = pj_out_type(L, 0);
  if (bd.id < 0 || v.id < 0) return NULL;
  if (pj_type_numel(&ot) == 0) return NULL;
  int64_t M = bd.t.rank ? bd.t.dims[bd.t.rank - 1] : 1;
  if (M == 0) {
    pj_set_result(L, 0, pj_full(H, ot, 0));
    return NULL;
  }
  int64_t total = pj_type_numel(&bd.t);
  pj_val_t bflat = pj_reshape(H, bd, 1, &total);
  pj_val_t sorter = pj_has(L, "sorter") ? pj_convert(H, pj_tensor(L, "sorter"), PJ_I64) : kBad;
  if (sorter.id >= 0) sorter = pj_reshape(H, sorter, 1, &total);
  /* values as [rows, N] with the row base offset of each value */
  pj_type_t it = pj_type_with_dtype(v.t, PJ_I64);
  pj_val_t base = pj_full(H, it, 0);
  if (bd.t.rank > 1) {
    int64_t N = v.t.dims[v.t.rank - 1], rows = pj_type_numel(&v.t) / (N ? N : 1);
    int64_t d2[2] = {rows, N};
    pj_type_t t2 = pj_type(PJ_I64, 2, d2);
    base = pj_reshape(H, MUL(pj_iota(H, t2, 0), pj_full(H, t2, (double)M)), v.t.rank, v.t.dims);
  }
  pj_val_t start = pj_full(H, it, 0), end = pj_full(H, it, (double)M);
  pj_val_t one = pj_full(H, it, 1), two = pj_full(H, it, 2), last = pj_full(H, it, (double)(M - 1));
  for (int64_t span = M; span > 0; span /= 2) { /* floor(log2 M) + 1 steps */
    pj_val_t active = CMP("LT", start, end);
    pj_val_t mid = ADD(start, DIV(SUB(end, start), two));
    pj_val_t pos = ADD(base, MIN(mid, last));
    if (sorter.id >= 0) pos = ADD(base, pj_gather_1d(H, sorter, pos));
    pj_val_t mv = pj_gather_1d(H, bflat, pos);
    pj_val_t go = not_(L, CMP(right ? "GT" : "GE", mv, v));
    start = SEL(AND(active, go), ADD(mid, one), start);
    end = SEL(AND(active, not_(L, go)), mid, end);
  }
  pj_set_result(L, 0, start);
  return NULL;
}

/* ---- cummax / cummin ---- */

/* Running (value, index) extremum along the rows by recursive doubling. The combination of an
 * earlier pair a and a later pair b takes b when b is NaN, or when neither is NaN and b is at
 * least (cummax) / at most (cummin) a: CPU's loop, which keeps the latest of equal extremes and
 * the latest NaN. The combination is associative, so doubling gives the sequential result. */
static pj_status_t *lower_cumextremum(pj_lower_t *L) {
  bool is_max = !strcmp(L->c->op, "_cummax_helper");
  pj_val_t x = pj_tensor(L, "self");
  int dim = x.t.rank ? pj_norm_dim(L, pj_int(L, "dim", 0), x.t.rank) : 0;
  rows_t r;
  pj_val_t v = to_rows(L, x, dim, &r);
  if (r.B == 0 || r.n == 0) return NULL;
  if (v.t.dtype == PJ_BOOL) v = pj_convert(H, v, PJ_I32);
  pj_dtype_t dt = v.t.dtype;
  pj_val_t ix = col_iota(L, v.t);
  pj_val_t ident = dt == PJ_I64 ? pj_const_i(H, dt, is_max ? INT64_MIN : INT64_MAX)
                                : pj_const(H, dt, is_max ? pj_dtype_lowest(dt)
                                                         : pj_dtype_highest(dt));
  int64_t B = r.B, n = r.n;
  for (int64_t s = 1; s < n; s *= 2) {
    int64_t st[2] = {0, 0}, lim[2] = {B, n - s}, lo[2] = {0, s}, hi[2] = {0, 0};
    pj_val_t av = pj_pad(H, pj_slice(H, v, st, lim, NULL), ident, lo, hi, NULL);
    pj_val_t ai = pj_pad(H, pj_slice(H, ix, st, lim, NULL), pj_const_i(H, PJ_I64, -1), lo, hi,
                         NULL);
    pj_val_t take_b = CMP(is_max ? "GE" : "LE", v, av);
    if (is_float(dt))
      take_b = OR(isnan_(L, v), AND(not_(L, isnan_(L, av)), take_b));
    v = SEL(take_b, v, av);
    ix = SEL(take_b, ix, ai);
  }
  pj_set_result(L, 0, from_rows(L, v, &r));
  pj_set_result(L, 1, from_rows(L, ix, &r));
  return NULL;
}

/* ---- logcumsumexp ---- */

/* log(exp(a) + exp(b)) as CPU's scan step computes it: max + log1p(exp(min - max)), except when
 * both are the same infinity (then that infinity); a NaN propagates. */
static pj_val_t log_add_exp(pj_lower_t *L, pj_val_t a, pj_val_t b) {
  pj_val_t bn = isnan_(L, b);
  pj_val_t mn = SEL(bn, b, MIN(a, b)), mx = SEL(bn, b, MAX(a, b));
  pj_val_t fin = pj_hlo_op(H, "stablehlo.is_finite", &mn, 1, NULL,
                           pj_type_with_dtype(mn.t, PJ_BOOL));
  pj_val_t r = ADD(mx, U("log_plus_one", U("exponential", SUB(mn, mx))));
  pj_val_t use = OR(CMP("NE", mn, mx), fin);
  return SEL(use, r, a);
}

/* The complex step, as CPU's: the operands ordered by real part (a NaN part anywhere makes the
 * result NaN), equal infinite real parts give the first of the pair (-inf) or log(exp + exp)
 * (+inf), otherwise log1p(exp(min - max)) + max. `a` is the earlier operand. */
static pj_val_t log_add_exp_complex(pj_lower_t *L, pj_val_t a, pj_val_t b) {
  pj_type_t rt = pj_type_with_dtype(a.t, a.t.dtype == PJ_C128 ? PJ_F64 : PJ_F32);
  pj_val_t ar = pj_hlo_op(H, "stablehlo.real", &a, 1, NULL, rt);
  pj_val_t ai = pj_hlo_op(H, "stablehlo.imag", &a, 1, NULL, rt);
  pj_val_t br = pj_hlo_op(H, "stablehlo.real", &b, 1, NULL, rt);
  pj_val_t bi = pj_hlo_op(H, "stablehlo.imag", &b, 1, NULL, rt);
  /* CPU passes (current, accumulated): the later one is first unless its real part is larger */
  pj_val_t b_first = CMP("LT", br, ar);
  pj_val_t mn = SEL(b_first, b, a), mx = SEL(b_first, a, b);
  pj_val_t mnr = SEL(b_first, br, ar), mxr = SEL(b_first, ar, br);
  pj_val_t nan = OR(OR(isnan_(L, ar), isnan_(L, ai)), OR(isnan_(L, br), isnan_(L, bi)));
  pj_val_t fin = pj_hlo_op(H, "stablehlo.is_finite", &mnr, 1, NULL, pj_type_with_dtype(rt, PJ_BOOL));
  pj_val_t same_inf = AND(not_(L, fin), CMP("EQ", mnr, mxr));
  pj_val_t general = ADD(U("log_plus_one", U("exponential", SUB(mn, mx))), mx);
  pj_val_t pos_inf = U("log", ADD(U("exponential", mn), U("exponential", mx)));
  pj_val_t r = SEL(same_inf, SEL(CMP("LT", mnr, pj_full(H, rt, 0)), mn, pos_inf), general);
  pj_val_t nans[2] = {pj_full(H, rt, NAN), pj_full(H, rt, NAN)};
  return SEL(nan, pj_hlo_op(H, "stablehlo.complex", nans, 2, NULL, a.t), r);
}

/* The complex scan runs sequentially, as CPU's loop does: log1p(exp(min - max)) + max keeps
 * imaginary parts unwrapped, so a different grouping can differ by multiples of 2*pi.
 * State: step, running value [B], input [B, n], result [B, n]. */
enum { CS_I, CS_ACC, CS_X, CS_OUT, CS_N };

static pj_val_t cscan_cond(pj_lower_t *L, const pj_val_t *st, void *user) {
  return CMP("LT", st[CS_I], pj_const_i(H, PJ_I64, *(const int64_t *)user));
}

static void cscan_body(pj_lower_t *L, pj_val_t *st, void *user) {
  (void)user;
  pj_val_t x = st[CS_X], zero = pj_const_i(H, PJ_I64, 0);
  int64_t B = x.t.dims[0], col[2] = {B, 1};
  char attrs[64];
  snprintf(attrs, sizeof attrs, "slice_sizes = array<i64: %lld, 1>", (long long)B);
  pj_val_t ins[3] = {x, zero, st[CS_I]};
  pj_val_t xi = pj_hlo_op(H, "stablehlo.dynamic_slice", ins, 3, attrs, pj_type(x.t.dtype, 2, col));
  st[CS_ACC] = log_add_exp_complex(L, st[CS_ACC], pj_reshape(H, xi, 1, &B));
  pj_val_t uins[4] = {st[CS_OUT], pj_reshape(H, st[CS_ACC], 2, col), zero, st[CS_I]};
  st[CS_OUT] = pj_hlo_op(H, "stablehlo.dynamic_update_slice", uins, 4, NULL, st[CS_OUT].t);
  st[CS_I] = ADD(st[CS_I], pj_const_i(H, PJ_I64, 1));
}

static pj_status_t *lower_logcumsumexp(pj_lower_t *L) {
  pj_val_t x = pj_tensor(L, "self");
  pj_type_t ot = pj_out_type(L, 0);
  bool cplx = is_complex(ot.dtype);
  int dim = x.t.rank ? pj_norm_dim(L, pj_int(L, "dim", 0), x.t.rank) : 0;
  pj_dtype_t ct = ot.dtype == PJ_BF16 || ot.dtype == PJ_F16 ? PJ_F32 : ot.dtype;
  rows_t r;
  pj_val_t v = to_rows(L, pj_convert(H, pj_convert(H, x, ot.dtype), ct), dim, &r);
  if (r.B == 0 || r.n == 0) return NULL;
  int64_t B = r.B, n = r.n;
  if (cplx) {
    pj_dtype_t rt = ct == PJ_C128 ? PJ_F64 : PJ_F32;
    pj_val_t parts[2] = {pj_const(H, rt, -INFINITY), pj_const(H, rt, 0)};
    pj_val_t start = pj_hlo_op(H, "stablehlo.complex", parts, 2, NULL, pj_type_scalar(ct));
    /* CPU's scan starts from -inf + 0i: the first element is combined with it too */
    pj_val_t st[CS_N];
    st[CS_I] = pj_const_i(H, PJ_I64, 0);
    st[CS_ACC] = pj_broadcast_in_dim(H, start, pj_type(ct, 1, &B), NULL);
    st[CS_X] = v;
    st[CS_OUT] = v;
    if (!while_loop(L, st, CS_N, cscan_cond, cscan_body, &n)) return NULL;
    pj_set_result(L, 0, from_rows(L, st[CS_OUT], &r));
    return NULL;
  }
  for (int64_t s = 1; s < n; s *= 2) {
    int64_t st[2] = {0, 0}, lim[2] = {B, n - s}, lo[2] = {0, s}, hi[2] = {0, 0};
    pj_val_t a = pj_pad(H, pj_slice(H, v, st, lim, NULL), pj_const(H, ct, -INFINITY), lo, hi,
                        NULL);
    v = log_add_exp(L, a, v);
  }
  pj_set_result(L, 0, from_rows(L, v, &r));
  return NULL;
}

/* ---- nonzero_static ---- */

static pj_status_t *lower_nonzero_static(pj_lower_t *L) {
  pj_val_t x = pj_tensor(L, "self");
  pj_type_t ot = pj_out_type(L, 0);
  int64_t size = ot.dims[0], r = x.t.rank, n = pj_type_numel(&x.t);
  if (size == 0 || r == 0 || x.id < 0) {
    if (pj_type_numel(&ot)) pj_set_result(L, 0, pj_full(H, ot, 0));
    return NULL;
  }
  pj_val_t fill = pj_const_i(H, PJ_I64, pj_int(L, "fill_value", -1));
  int64_t one = 1;
  pj_type_t st = pj_type(PJ_I64, 1, &size);
  pj_val_t pos, cnt;
  if (n == 0) {
    pos = pj_full(H, st, 0);
    cnt = pj_const_i(H, PJ_I64, 0);
  } else {
    pj_val_t m = pj_reshape(H, pj_convert(H, x, PJ_BOOL), 1, &n);
    pos = pj_true_positions(L, m);
    cnt = pj_count_true(L, m);
    int64_t z = 0, lim = size < n ? size : n, lo = 0, hi = size > n ? size - n : 0;
    pos = pj_slice(H, pos, &z, &lim, NULL);
    if (hi) pos = pj_pad(H, pos, pj_const_i(H, PJ_I64, 0), &lo, &hi, NULL);
  }
  pj_val_t valid = CMP("LT", pj_iota(H, st, 0), bcast(L, cnt, st));
  pj_val_t cols[PJ_MAX_RANK];
  int64_t stride = 1;
  int64_t d2[2] = {size, 1};
  for (int d = (int)r - 1; d >= 0; d--) {
    pj_val_t c = pj_binary(H, "stablehlo.remainder", DIV(pos, pj_full(H, st, (double)stride)),
                           pj_full(H, st, (double)x.t.dims[d]));
    c = SEL(valid, c, bcast(L, fill, st));
    cols[d] = pj_reshape(H, c, 2, d2);
    stride *= x.t.dims[d];
  }
  (void)one;
  pj_set_result(L, 0, pj_concat(H, cols, (int)r, 1));
  return NULL;
}

/* ---- equal ---- */

/* torch.equal: same sizes and every element equal after type promotion (NaN is never equal).
 * The result is a 0-d bool that the bridge reads back as a Python bool. */
static pj_status_t *lower_equal(pj_lower_t *L) {
  pj_val_t a = pj_tensor(L, "self"), b = pj_tensor(L, "other");
  if (a.id < 0 || b.id < 0) return NULL;
  if (!pj_type_same_shape(&a.t, &b.t)) {
    pj_set_result(L, 0, pj_const(H, PJ_BOOL, 0));
    return NULL;
  }
  pj_dtype_t ct = pj_promote(a.t.dtype, b.t.dtype);
  pj_val_t eq = CMP("EQ", pj_convert(H, a, ct), pj_convert(H, b, ct));
  int64_t all[PJ_MAX_RANK];
  for (int i = 0; i < eq.t.rank; i++) all[i] = i;
  pj_set_result(L, 0, pj_reduce(H, eq, all, eq.t.rank, "and"));
  return NULL;
}

/* ---- segment_reduce ---- */

/* Segments along `axis` given by lengths [*lead, S] or offsets [*lead, S+1]: each element goes
 * to the segment whose end it is below (elements outside every segment are dropped into a
 * padding segment); reductions start from `initial` (or the identity), so empty segments get
 * it; mean divides the sum by the length, and an empty segment's mean is initial or NaN. */
/* Where each element of a segment_reduce input goes: data viewed as [B, N, R] (N along axis),
 * segments as [B, S]; flat_idx [B*N] is b*(S+1) + segment (S for elements in no segment) and
 * len [B, S] the segment lengths. */
typedef struct {
  int64_t B, N, R, S;
  pj_val_t flat_idx, len;
} segments_t;

static bool segments_of(pj_lower_t *L, pj_val_t data, int axis, segments_t *g) {
  bool use_offsets = !pj_has(L, "lengths");
  pj_val_t seg = pj_convert(H, pj_tensor(L, use_offsets ? "offsets" : "lengths"), PJ_I64);
  if (data.id < 0 || seg.id < 0) return false;
  int64_t B = 1, R = 1, N = data.t.dims[axis];
  for (int i = 0; i < axis; i++) B *= data.t.dims[i];
  for (int i = axis + 1; i < data.t.rank; i++) R *= data.t.dims[i];
  int64_t S = seg.t.dims[seg.t.rank - 1] - (use_offsets ? 1 : 0);
  int64_t d2[2] = {B, seg.t.dims[seg.t.rank - 1]};
  seg = pj_reshape(H, seg, 2, d2);
  pj_val_t ends, start0;
  if (use_offsets) {
    int64_t a[2] = {0, 1}, b[2] = {B, S + 1}, z[2] = {0, 0}, one[2] = {B, 1}, bs[2] = {B, S};
    ends = pj_slice(H, seg, a, b, NULL);
    start0 = pj_slice(H, seg, z, one, NULL);
    g->len = SUB(ends, pj_slice(H, seg, z, bs, NULL));
  } else {
    g->len = seg;
    ends = seg; /* running sum of lengths along the rows */
    for (int64_t s = 1; s < S; s *= 2) {
      int64_t z[2] = {0, 0}, lim[2] = {B, S - s}, lo[2] = {0, s}, hi[2] = {0, 0};
      ends = ADD(ends, pj_pad(H, pj_slice(H, ends, z, lim, NULL), pj_const_i(H, PJ_I64, 0), lo,
                              hi, NULL));
    }
    int64_t one[2] = {B, 1};
    start0 = pj_full(H, pj_type(PJ_I64, 2, one), 0);
  }
  /* segment of element (b, j): the number of ends <= j, S when outside every segment */
  int64_t bNS[3] = {B, N, S}, e0[2] = {0, 2}, two = 2;
  pj_type_t t3 = pj_type(PJ_I64, 3, bNS);
  pj_val_t below = CMP("LE", pj_broadcast_in_dim(H, ends, t3, e0), pj_iota(H, t3, 1));
  pj_val_t sid = pj_reduce(H, pj_convert(H, below, PJ_I64), &two, 1, "add"); /* [B, N] */
  int64_t bN[2] = {B, N}, z0[1] = {0};
  pj_type_t tn = pj_type(PJ_I64, 2, bN);
  pj_val_t before = CMP("LT", pj_iota(H, tn, 1),
                        pj_broadcast_in_dim(H, pj_reshape(H, start0, 1, &B), tn, z0));
  sid = SEL(before, pj_full(H, tn, (double)S), sid);
  int64_t BN = B * N;
  g->flat_idx = pj_reshape(H, ADD(MUL(pj_iota(H, tn, 0), pj_full(H, tn, (double)(S + 1))), sid),
                           1, &BN);
  g->B = B, g->N = N, g->R = R, g->S = S;
  return g->flat_idx.id >= 0;
}

/* Per segment values [B, S, R] (or [B, S] broadcast along R) as one row per element [B*N, R]:
 * elements in no segment read `pad`. */
static pj_val_t per_element(pj_lower_t *L, pj_val_t v, const segments_t *g, double pad) {
  int64_t B = g->B, S = g->S, R = g->R;
  if (R > 1 && pj_type_numel(&v.t) == B * S) { /* one value per segment (lengths) */
    int64_t d2[2] = {B, S};
    v = pj_reshape(H, v, 2, d2);
    int64_t d3[3] = {B, S, R}, dd[2] = {0, 1};
    v = pj_broadcast_in_dim(H, v, pj_type(v.t.dtype, 3, d3), dd);
  } else {
    int64_t d3[3] = {B, S, R};
    v = pj_reshape(H, v, 3, d3);
  }
  int64_t lo[3] = {0, 0, 0}, hi[3] = {0, 1, 0}, f2[2] = {B * (S + 1), R};
  v = pj_pad(H, v, pj_const(H, v.t.dtype, pad), lo, hi, NULL);
  return pj_take_slices(L, pj_reshape(H, v, 2, f2), 0, g->flat_idx);
}

/* Per segment reduction of rows x [B*N, R] to [B, S, R] starting from init. */
static pj_val_t per_segment(pj_lower_t *L, pj_val_t x, const segments_t *g, pj_val_t init,
                            const char *comb) {
  int64_t B = g->B, S = g->S, R = g->R, accd[2] = {B * (S + 1), R};
  pj_type_t acct = pj_type(x.t.dtype, 2, accd);
  pj_val_t acc = pj_put_slices(L, pj_broadcast_in_dim(H, init, acct, NULL), 0, g->flat_idx, x,
                               comb);
  int64_t d3[3] = {B, S + 1, R}, s0[3] = {0, 0, 0}, s1[3] = {B, S, R};
  return pj_slice(H, pj_reshape(H, acc, 3, d3), s0, s1, NULL);
}

static pj_status_t *lower_segment_reduce(pj_lower_t *L) {
  pj_type_t ot = pj_out_type(L, 0);
  pj_val_t data = pj_convert(H, pj_tensor(L, "data"), ot.dtype);
  const char *reduce = pj_str(L, "reduce", "");
  if (data.id < 0 || pj_type_numel(&ot) == 0) return NULL;
  int axis = pj_norm_dim(L, pj_int(L, "axis", 0), data.t.rank);
  const char *comb = !strcmp(reduce, "max")    ? "max"
                     : !strcmp(reduce, "min")  ? "min"
                     : !strcmp(reduce, "prod") ? "mul"
                     : !strcmp(reduce, "sum") || !strcmp(reduce, "mean") ? "add"
                                                                         : NULL;
  if (!comb) return pj_status_new(PJ_ERR_RUNTIME, "unsupported reduction %s", reduce);
  segments_t g;
  if (!segments_of(L, data, axis, &g)) return NULL;
  int64_t B = g.B, N = g.N, R = g.R, S = g.S, BN = B * N;
  pj_val_t flat_idx = g.flat_idx;
  (void)flat_idx;
  pj_dtype_t dt = ot.dtype;
  bool has_init = pj_has(L, "initial");
  pj_val_t init;
  if (has_init) {
    init = pj_convert(H, pj_scalar(L, "initial"), dt);
  } else if (!strcmp(comb, "max") || !strcmp(comb, "min")) {
    bool mx = !strcmp(comb, "max");
    init = dt == PJ_I64 ? pj_const_i(H, dt, mx ? INT64_MIN : INT64_MAX)
                        : pj_const(H, dt, mx ? pj_dtype_lowest(dt) : pj_dtype_highest(dt));
  } else {
    init = pj_const(H, dt, !strcmp(comb, "mul") ? 1 : 0);
  }
  int64_t updd[2] = {BN, R}, s1[3] = {B, S, R};
  pj_val_t r = per_segment(L, pj_reshape(H, data, 2, updd), &g, init, comb);
  if (!strcmp(reduce, "mean")) {
    int64_t dd[2] = {0, 1};
    pj_type_t t3o = pj_type(dt, 3, s1);
    pj_val_t lenf = pj_broadcast_in_dim(H, pj_convert(H, g.len, dt), t3o, dd);
    pj_val_t empty = CMP("EQ", lenf, pj_full(H, t3o, 0));
    pj_val_t q = DIV(r, lenf);
    r = SEL(empty, has_init ? pj_broadcast_in_dim(H, init, t3o, NULL) : pj_full(H, t3o, NAN), q);
  }
  pj_set_result(L, 0, pj_reshape(H, r, ot.rank, ot.dims));
  return NULL;
}

/* Gradient of segment_reduce with respect to data, as CPU computes it: sum and mean spread the
 * segment's gradient (mean divided by the length); max/min give it to the elements equal to the
 * result and to NaNs (see below); prod gives grad * output / x, or for a zero or NaN x, grad
 * times the product of the segment's other elements and initial. */
static pj_status_t *lower_segment_reduce_backward(pj_lower_t *L) {
  pj_type_t ot = pj_out_type(L, 0);
  pj_dtype_t dt = ot.dtype;
  pj_val_t data = pj_convert(H, pj_tensor(L, "data"), dt);
  const char *reduce = pj_str(L, "reduce", "");
  if (data.id < 0 || pj_type_numel(&ot) == 0) return NULL;
  int axis = pj_norm_dim(L, pj_int(L, "axis", 0), data.t.rank);
  segments_t g;
  if (!segments_of(L, data, axis, &g)) return NULL;
  int64_t BN = g.B * g.N, rows[2] = {BN, g.R};
  pj_val_t x = pj_reshape(H, data, 2, rows);
  pj_val_t gr = per_element(L, pj_convert(H, pj_tensor(L, "grad"), dt), &g, 0);
  pj_val_t out = per_element(L, pj_convert(H, pj_tensor(L, "output"), dt), &g, 0);
  pj_val_t zero = pj_full(H, x.t, 0), one = pj_full(H, x.t, 1);
  pj_val_t r;
  if (!strcmp(reduce, "sum")) {
    r = gr;
  } else if (!strcmp(reduce, "mean")) {
    r = DIV(gr, MAX(per_element(L, pj_convert(H, g.len, dt), &g, 1), one));
  } else if (!strcmp(reduce, "max") || !strcmp(reduce, "min")) {
    /* CPU: every NaN element and every element equal to the result takes the gradient; with
     * two or more of them, the positive gradients (only those) are divided by their number */
    pj_val_t eq = OR(CMP("EQ", x, out), isnan_(L, x));
    pj_val_t cnt = per_segment(L, SEL(eq, one, zero), &g, pj_const(H, dt, 0), "add");
    cnt = per_element(L, cnt, &g, 1);
    pj_val_t split = AND(CMP("GE", cnt, pj_full(H, x.t, 2)), CMP("GT", gr, zero));
    r = SEL(eq, SEL(split, DIV(gr, MAX(cnt, one)), gr), zero);
  } else if (!strcmp(reduce, "prod")) {
    pj_val_t special = OR(CMP("EQ", x, zero), isnan_(L, x));
    pj_val_t init = pj_has(L, "initial") ? pj_convert(H, pj_scalar(L, "initial"), dt)
                                         : pj_const(H, dt, 1);
    pj_val_t pnz = per_element(L, per_segment(L, SEL(special, one, x), &g, init, "mul"), &g, 1);
    pj_val_t nz = per_element(L, per_segment(L, SEL(CMP("EQ", x, zero), one, zero), &g,
                                             pj_const(H, dt, 0), "add"), &g, 0);
    pj_val_t nn = per_element(L, per_segment(L, SEL(isnan_(L, x), one, zero), &g,
                                             pj_const(H, dt, 0), "add"), &g, 0);
    /* the others: zeros and NaNs not counting this element */
    pj_val_t oz = SUB(nz, SEL(CMP("EQ", x, zero), one, zero));
    pj_val_t on = SUB(nn, SEL(isnan_(L, x), one, zero));
    pj_val_t excl = SEL(CMP("GT", oz, zero), zero, pnz);
    excl = SEL(CMP("GT", on, zero), pj_full(H, x.t, NAN), excl);
    r = SEL(special, MUL(gr, excl), DIV(MUL(gr, out), x));
  } else {
    return pj_status_new(PJ_ERR_RUNTIME, "unsupported reduction %s", reduce);
  }
  pj_set_result(L, 0, pj_reshape(H, r, ot.rank, ot.dims));
  return NULL;
}

/* ---- histograms ---- */

/* CPU's linspace(lo, hi, bins + 1) in lo's dtype: the first half counts up from lo by the step,
 * the second half down from hi. */
static pj_val_t linspace_edges(pj_lower_t *L, pj_val_t lo, pj_val_t hi, int64_t bins) {
  pj_dtype_t dt = lo.t.dtype;
  int64_t E = bins + 1;
  pj_type_t et = pj_type(dt, 1, &E);
  if (bins == 0) return bcast(L, lo, et);
  pj_val_t step = DIV(SUB(hi, lo), pj_const(H, dt, (double)bins));
  pj_type_t it = pj_type(PJ_I64, 1, &E);
  pj_val_t i = pj_iota(H, it, 0);
  pj_val_t up = ADD(bcast(L, lo, et), MUL(bcast(L, step, et), pj_convert(H, i, dt)));
  pj_val_t down = SUB(bcast(L, hi, et), MUL(bcast(L, step, et),
                                            pj_convert(H, SUB(pj_full(H, it, (double)bins), i), dt)));
  return SEL(CMP("LT", i, pj_full(H, it, (double)(E / 2))), up, down);
}

enum { BIN_LINEAR, BIN_LINEAR_LOCAL, BIN_SEARCH };

/* Bin of each element x [N] (T) among edges [E] (T), as CPU's histogram kernel finds it, and
 * whether the element is counted at all (inside [edges[0], edges[E-1]], not NaN). */
static pj_val_t bin_of(pj_lower_t *L, pj_val_t x, pj_val_t edges, int algo, pj_val_t *inside) {
  int64_t E = edges.t.dims[0], N = x.t.dims[0], z = 0, l1 = 1, e1 = E - 1;
  pj_type_t nt = pj_type(PJ_I64, 1, &N);
  pj_val_t lo = bcast(L, pj_reshape(H, pj_slice(H, edges, &z, &l1, NULL), 0, NULL), x.t);
  pj_val_t hi = bcast(L, pj_reshape(H, pj_slice(H, edges, &e1, &E, NULL), 0, NULL), x.t);
  *inside = AND(CMP("GE", x, lo), CMP("LE", x, hi));
  pj_val_t pos;
  if (algo == BIN_SEARCH) { /* upper_bound over all edges, minus one */
    int64_t ne[2] = {N, E}, d1[1] = {1}, d0[1] = {0};
    pj_type_t t2 = pj_type(x.t.dtype, 2, ne);
    pj_val_t gt = CMP("GT", pj_broadcast_in_dim(H, edges, t2, d1), pj_broadcast_in_dim(H, x, t2, d0));
    pj_val_t it = pj_iota(H, pj_type(PJ_I64, 2, ne), 1);
    pos = SUB(row_reduce(L, SEL(gt, it, pj_full(H, it.t, (double)E)), "min"), pj_full(H, nt, 1));
  } else {
    pj_val_t q = DIV(MUL(SUB(x, lo), pj_full(H, x.t, (double)(E - 1))), SUB(hi, lo));
    q = SEL(*inside, q, pj_full(H, x.t, 0));
    pos = pj_convert(H, q, PJ_I64); /* truncation toward zero, as the C++ cast */
    if (algo == BIN_LINEAR_LOCAL) {
      /* upper_bound among edges[pos-1 .. pos+1] (clamped to the edges), minus one */
      pj_val_t pmin = MAX(SUB(pos, pj_full(H, nt, 1)), pj_full(H, nt, 0));
      pj_val_t pmax = MIN(ADD(pos, pj_full(H, nt, 2)), pj_full(H, nt, (double)E));
      pj_val_t r = pmax;
      for (int k = 2; k >= 0; k--) { /* first candidate whose edge is above x */
        pj_val_t c = ADD(pmin, pj_full(H, nt, k));
        pj_val_t ok = AND(CMP("LT", c, pmax),
                          CMP("GT", pj_gather_1d(H, edges, MIN(c, pj_full(H, nt, (double)(E - 1)))),
                              x));
        r = SEL(ok, c, r);
      }
      pos = SUB(r, pj_full(H, nt, 1));
    }
  }
  pj_val_t last = pj_full(H, nt, (double)(E - 1));
  pos = SEL(CMP("EQ", pos, last), SUB(last, pj_full(H, nt, 1)), pos);
  return MAX(pos, pj_full(H, nt, 0));
}

/* Min and max of each column of x [N, D] as 0-d values of column d (T). */
static void column_range(pj_lower_t *L, pj_val_t x, int d, pj_val_t *mn, pj_val_t *mx) {
  int64_t N = x.t.dims[0], st[2] = {0, d}, lim[2] = {N, d + 1}, z = 0;
  pj_val_t col = pj_reshape(H, pj_slice(H, x, st, lim, NULL), 1, &N);
  *mn = pj_reduce(H, col, &z, 1, "min");
  *mx = pj_reduce(H, col, &z, 1, "max");
}

/* The D-dimensional histogram of x [N, D] over edges[d]: counts (or weights) per cell, divided
 * by the total and the cell sizes when density is set. Returns [E0-1, E1-1, ...] in T. */
static pj_val_t histogram_dd(pj_lower_t *L, pj_val_t x, const pj_val_t *edges, int D, int algo,
                             pj_val_t w, bool density) {
  int64_t N = x.t.dims[0];
  pj_dtype_t dt = x.t.dtype;
  pj_type_t nt = pj_type(PJ_I64, 1, &N);
  pj_val_t flat = pj_full(H, nt, 0), inside = pj_full(H, pj_type(PJ_BOOL, 1, &N), 1);
  int64_t dims[PJ_MAX_RANK], total = 1;
  for (int d = 0; d < D; d++) dims[d] = edges[d].t.dims[0] - 1, total *= dims[d];
  for (int d = 0; d < D; d++) {
    int64_t st[2] = {0, d}, lim[2] = {N, d + 1};
    pj_val_t col = pj_reshape(H, pj_slice(H, x, st, lim, NULL), 1, &N);
    pj_val_t in;
    pj_val_t pos = bin_of(L, col, edges[d], algo, &in);
    inside = AND(inside, in);
    flat = ADD(MUL(flat, pj_full(H, nt, (double)dims[d])), pos);
  }
  flat = SEL(inside, flat, pj_full(H, nt, (double)total)); /* outside: a padding cell */
  int64_t T1 = total + 1, z = 0;
  pj_dtype_t at = dt == PJ_BF16 || dt == PJ_F16 ? PJ_F32 : dt; /* counts past 256 stay exact */
  pj_val_t upd = w.id >= 0 ? pj_convert(H, pj_convert(H, w, dt), at)
                           : pj_full(H, pj_type(at, 1, &N), 1);
  pj_val_t hist = pj_scatter_1d(H, pj_full(H, pj_type(at, 1, &T1), 0), flat, upd, "add");
  hist = pj_convert(H, pj_slice(H, hist, &z, &total, NULL), dt);
  if (density) {
    pj_type_t ht = hist.t;
    hist = DIV(hist, bcast(L, pj_reduce(H, hist, &z, 1, "add"), ht));
    int64_t inner = total;
    for (int d = 0; d < D; d++) {
      int64_t n = dims[d], a0 = 0, a1 = n, b0 = 1, b1 = n + 1;
      inner /= n;
      pj_val_t width = SUB(pj_slice(H, edges[d], &b0, &b1, NULL),
                           pj_slice(H, edges[d], &a0, &a1, NULL));
      int64_t d3[3] = {total / (inner * n), n, inner}, one[1] = {1};
      pj_type_t t3 = pj_type(dt, 3, d3);
      pj_val_t h3 = DIV(pj_reshape(H, hist, 3, d3), pj_broadcast_in_dim(H, width, t3, one));
      hist = pj_reshape(H, h3, 1, &total);
    }
  }
  return pj_reshape(H, hist, D, dims);
}

/* The outer edges of dimension d: range[2d], range[2d+1] if given, else the data's extrema
 * ([0, 1] for no data); an empty range widens by 0.5 each side (histc: by 1). */
static void outer_edges(pj_lower_t *L, pj_val_t x, int d, const double *range, bool histc,
                        pj_val_t *lo, pj_val_t *hi) {
  pj_dtype_t dt = x.t.dtype;
  if (range) {
    *lo = pj_const(H, PJ_F64, range[0]);
    *hi = pj_const(H, PJ_F64, range[1]);
  } else if (x.t.dims[0] == 0) {
    *lo = pj_const(H, PJ_F64, 0);
    *hi = pj_const(H, PJ_F64, 1);
  } else {
    column_range(L, x, d, lo, hi);
    *lo = pj_convert(H, *lo, PJ_F64);
    *hi = pj_convert(H, *hi, PJ_F64);
  }
  pj_val_t same = CMP("EQ", *lo, *hi);
  double widen = histc ? 1 : 0.5;
  *lo = pj_convert(H, SEL(same, SUB(*lo, pj_const(H, PJ_F64, widen)), *lo), dt);
  *hi = pj_convert(H, SEL(same, ADD(*hi, pj_const(H, PJ_F64, widen)), *hi), dt);
}

static pj_status_t *lower_histc(pj_lower_t *L) {
  pj_type_t ot = pj_out_type(L, 0);
  pj_val_t x = pj_tensor(L, "self");
  int64_t bins = pj_int(L, "bins", 100), n = pj_type_numel(&x.t);
  if (x.id < 0 || bins <= 0) return NULL;
  if (n == 0) {
    pj_set_result(L, 0, pj_full(H, ot, 0));
    return NULL;
  }
  x = pj_reshape(H, pj_convert(H, x, ot.dtype), 2, (int64_t[]){n, 1});
  /* min == max (the default 0, 0): the data's extrema */
  pj_val_t mn = pj_convert(H, pj_scalar(L, "min"), PJ_F64);
  pj_val_t mx = pj_convert(H, pj_scalar(L, "max"), PJ_F64);
  pj_val_t dmn, dmx;
  outer_edges(L, x, 0, NULL, true, &dmn, &dmx);
  pj_val_t same = CMP("EQ", mn, mx);
  pj_val_t lo = SEL(same, dmn, pj_convert(H, mn, ot.dtype));
  pj_val_t hi = SEL(same, dmx, pj_convert(H, mx, ot.dtype));
  /* only the outer edges matter without the local search */
  pj_val_t e2[2] = {pj_reshape(H, lo, 1, (int64_t[]){1}), pj_reshape(H, hi, 1, (int64_t[]){1})};
  pj_val_t outer = pj_concat(H, e2, 2, 0);
  /* bins + 1 edges whose ends are lo and hi (the inner ones are not read without the local
   * search) */
  int64_t z1[1] = {0}, inner[1] = {bins - 1};
  pj_val_t edges = pj_pad(H, outer, pj_const(H, ot.dtype, 0), z1, z1, inner);
  pj_set_result(L, 0, histogram_dd(L, x, &edges, 1, BIN_LINEAR, kBad, false));
  return NULL;
}

/* histogram.bin_ct / .bins_tensor: (hist, bin_edges). */
static pj_status_t *lower_histogram(pj_lower_t *L) {
  pj_val_t x = pj_tensor(L, "self");
  pj_type_t ht = pj_out_type(L, 0), et = pj_out_type(L, 1);
  int64_t n = pj_type_numel(&x.t);
  if (x.id < 0) return NULL;
  x = pj_reshape(H, x, 2, (int64_t[]){n, 1});
  pj_val_t w = pj_has(L, "weight") ? pj_reshape(H, pj_tensor(L, "weight"), 1, &n) : kBad;
  bool density = pj_bool(L, "density", false);
  pj_val_t edges;
  int algo;
  const pj_arg_t *b = pj_arg(L, "bins");
  if (b && b->kind == PJ_ARG_TENSOR) {
    edges = pj_convert(H, pj_tensor(L, "bins"), x.t.dtype);
    algo = BIN_SEARCH;
  } else {
    double range[2];
    bool has_range = pj_floats(L, "range", range, 2) == 2;
    pj_val_t lo, hi;
    outer_edges(L, x, 0, has_range ? range : NULL, false, &lo, &hi);
    edges = linspace_edges(L, lo, hi, et.dims[0] - 1);
    algo = BIN_LINEAR_LOCAL;
  }
  pj_set_result(L, 0, pj_reshape(H, histogram_dd(L, x, &edges, 1, algo, w, density), ht.rank,
                                 ht.dims));
  pj_set_result(L, 1, edges);
  return NULL;
}

/* _histogramdd_bin_edges / _histogramdd_from_bin_cts / _histogramdd_from_bin_tensors over the
 * last dim of self as D coordinates. */
static pj_status_t *lower_histogramdd(pj_lower_t *L) {
  const char *op = L->c->op;
  pj_val_t x = pj_tensor(L, "self");
  if (x.id < 0 || x.t.rank < 1) return NULL;
  int D = (int)x.t.dims[x.t.rank - 1];
  if (D > PJ_MAX_RANK) return pj_status_new(PJ_ERR_UNIMPLEMENTED, "histogramdd of %d dims", D);
  int64_t N = D ? pj_type_numel(&x.t) / D : 0, nd[2] = {N, D};
  x = pj_reshape(H, x, 2, nd);
  pj_val_t edges[PJ_MAX_RANK];
  if (!strcmp(op, "_histogramdd_from_bin_tensors")) {
    for (int d = 0; d < D; d++) edges[d] = pj_convert(H, pj_tensor_at(L, "bins", d), x.t.dtype);
  } else {
    int64_t bins[PJ_MAX_RANK];
    double range[2 * PJ_MAX_RANK];
    int nb = pj_ints(L, "bins", bins, PJ_MAX_RANK);
    bool has_range = pj_floats(L, "range", range, 2 * PJ_MAX_RANK) == 2 * D;
    for (int d = 0; d < D; d++) {
      pj_val_t lo, hi;
      outer_edges(L, x, d, has_range ? range + 2 * d : NULL, false, &lo, &hi);
      edges[d] = linspace_edges(L, lo, hi, bins[nb == 1 ? 0 : d]);
    }
  }
  if (!strcmp(op, "_histogramdd_bin_edges")) {
    for (int d = 0; d < D && d < pj_nout(L); d++) pj_set_result(L, d, edges[d]);
    return NULL;
  }
  pj_val_t w = pj_has(L, "weight") ? pj_reshape(H, pj_tensor(L, "weight"), 1, &N) : kBad;
  int algo = !strcmp(op, "_histogramdd_from_bin_tensors") ? BIN_SEARCH : BIN_LINEAR_LOCAL;
  pj_type_t ot = pj_out_type(L, 0);
  pj_set_result(L, 0, pj_reshape(H, histogram_dd(L, x, edges, D, algo, w,
                                                 pj_bool(L, "density", false)),
                                 ot.rank, ot.dims));
  return NULL;
}

/* ---- data-dependent result shapes (dynamic.h) ---- */

/* Inclusive running sum along a 1-D i64 value by recursive doubling. */
static pj_val_t running_sum_1d(pj_lower_t *L, pj_val_t x) {
  int64_t n = x.t.dims[0];
  for (int64_t s = 1; s < n; s *= 2) {
    int64_t z = 0, lim = n - s, lo = s, hi = 0;
    x = ADD(x, pj_pad(H, pj_slice(H, x, &z, &lim, NULL), pj_const_i(H, x.t.dtype, 0), &lo, &hi,
                      NULL));
  }
  return x;
}

/* Run starts of a flat value v [N]: p == 0 or v[p] != v[p-1] (NaNs are never equal). */
static pj_val_t run_starts(pj_lower_t *L, pj_val_t v) {
  int64_t n = v.t.dims[0];
  if (n <= 1) return pj_full(H, pj_type_with_dtype(v.t, PJ_BOOL), 1);
  int64_t a0 = 0, a1 = n - 1, b0 = 1, b1 = n, lo = 1, hi = 0;
  pj_val_t d = CMP("NE", pj_slice(H, v, &b0, &b1, NULL), pj_slice(H, v, &a0, &a1, NULL));
  return pj_pad(H, d, pj_const(H, PJ_BOOL, 1), &lo, &hi, NULL);
}

static pj_val_t flat_of(pj_lower_t *L, pj_val_t x) {
  int64_t n = pj_type_numel(&x.t);
  return pj_reshape(H, x, 1, &n);
}

static const pj_arg_t *call_arg(const pj_call_t *c, const char *name) {
  for (int i = 0; i < c->nargs; i++)
    if (!strcmp(c->args[i].name, name)) return &c->args[i];
  return NULL;
}

static const pj_tensor_desc_t *ctensor(const pj_call_t *c, const char *name) {
  const pj_arg_t *a = call_arg(c, name);
  return a && a->kind == PJ_ARG_TENSOR ? &c->tensors[a->first] : NULL;
}

static bool cflag(const pj_call_t *c, const char *name) {
  const pj_arg_t *a = call_arg(c, name);
  return a && a->kind == PJ_ARG_BOOL && a->i;
}

int pj_select_dynamic(const pj_call_t *c) {
  const char *op = c->op;
  if (!strcmp(op, "_unique2") || !strcmp(op, "_unique") || !strcmp(op, "bincount"))
    return PJ_SHAPE_FROM_COUNT;
  if (!strcmp(op, "unique_consecutive")) {
    const pj_arg_t *d = call_arg(c, "dim");
    return !d || d->kind == PJ_ARG_NONE ? PJ_SHAPE_FROM_COUNT : 0;
  }
  if (!strcmp(op, "repeat_interleave")) {
    const pj_arg_t *os = call_arg(c, "output_size");
    return call_arg(c, "repeats") && !call_arg(c, "self") && (!os || os->kind == PJ_ARG_NONE)
               ? PJ_SHAPE_FROM_COUNT
               : 0;
  }
  if (!strcmp(op, "_logcumsumexp") || !strcmp(op, "histogram") ||
      !strcmp(op, "_histogramdd_bin_edges") || !strcmp(op, "_histogramdd_from_bin_cts") ||
      !strcmp(op, "_histogramdd_from_bin_tensors"))
    return PJ_SHAPE_FROM_ARGS;
  return 0;
}

pj_status_t *pj_select_out_types(const pj_call_t *c, int64_t count, pj_type_t *outs, int max,
                                 int *n) {
  const char *op = c->op;
  *n = 0;
  if (max < 3) return pj_status_new(PJ_ERR_RUNTIME, "internal: no room for results");
  if (!strcmp(op, "_logcumsumexp")) {
    const pj_tensor_desc_t *s = ctensor(c, "self");
    if (!s) return pj_status_new(PJ_ERR_RUNTIME, "internal: _logcumsumexp without self");
    outs[(*n)++] = pj_type(s->dtype, s->rank, s->sizes);
    return NULL;
  }
  if (!strcmp(op, "histogram") || !strncmp(op, "_histogramdd_", 13)) {
    const pj_tensor_desc_t *s = ctensor(c, "self");
    const pj_arg_t *b = call_arg(c, "bins");
    if (!s || !b) return pj_status_new(PJ_ERR_RUNTIME, "internal: aten::%s without self/bins", op);
    if (!pj_dtype_info(s->dtype)->is_float)
      return pj_status_new(PJ_ERR_RUNTIME, "torch.histogramdd: input tensor and bins tensors "
                           "should have the same dtype, but got input %s",
                           pj_dtype_info(s->dtype)->name);
    int D = !strcmp(op, "histogram") ? 1 : (s->rank ? (int)s->sizes[s->rank - 1] : 0);
    if (D > max || D > PJ_MAX_RANK) return pj_status_new(PJ_ERR_UNIMPLEMENTED, "histogramdd of %d dims", D);
    int64_t ne[PJ_MAX_RANK];
    for (int d = 0; d < D; d++) {
      if (b->kind == PJ_ARG_TENSOR) ne[d] = c->tensors[b->first].sizes[0];
      else if (b->kind == PJ_ARG_TENSORS) ne[d] = c->tensors[b->first + d].sizes[0];
      else if (b->kind == PJ_ARG_INT) ne[d] = b->i + 1;
      else if (b->kind == PJ_ARG_INTS) ne[d] = c->ints[b->first + (b->count == 1 ? 0 : d)] + 1;
      else return pj_status_new(PJ_ERR_RUNTIME, "internal: bins of aten::%s", op);
      if (ne[d] < 2) return pj_status_new(PJ_ERR_RUNTIME, "torch.histogramdd(): bins must be > 0");
    }
    if (!strcmp(op, "_histogramdd_bin_edges")) {
      for (int d = 0; d < D; d++) outs[d] = pj_type(s->dtype, 1, &ne[d]);
      *n = D;
      return NULL;
    }
    int64_t hd[PJ_MAX_RANK];
    for (int d = 0; d < D; d++) hd[d] = ne[d] - 1;
    outs[(*n)++] = pj_type(s->dtype, D, hd);
    if (!strcmp(op, "histogram")) outs[(*n)++] = pj_type(s->dtype, 1, &ne[0]);
    return NULL;
  }
  if (!strcmp(op, "_unique2") || !strcmp(op, "_unique") || !strcmp(op, "unique_consecutive")) {
    const pj_tensor_desc_t *s = ctensor(c, "self");
    if (!s) return pj_status_new(PJ_ERR_RUNTIME, "internal: %s without self", op);
    int64_t zero = 0;
    outs[0] = pj_type(s->dtype, 1, &count);
    outs[1] = cflag(c, "return_inverse") ? pj_type(PJ_I64, s->rank, s->sizes)
                                         : pj_type(PJ_I64, 1, &zero);
    outs[2] = cflag(c, "return_counts") ? pj_type(PJ_I64, 1, &count) : pj_type(PJ_I64, 1, &zero);
    *n = !strcmp(op, "_unique") ? 2 : 3;
    return NULL;
  }
  if (!strcmp(op, "bincount")) {
    const pj_tensor_desc_t *s = ctensor(c, "self"), *w = ctensor(c, "weights");
    const pj_arg_t *ml = call_arg(c, "minlength");
    int64_t minlength = ml && ml->kind == PJ_ARG_INT ? ml->i : 0;
    if (!s || s->rank != 1 || pj_dtype_info(s->dtype)->is_float ||
        pj_dtype_info(s->dtype)->is_complex || s->dtype == PJ_BOOL || count < 0)
      return pj_status_new(PJ_ERR_RUNTIME,
                           "bincount only supports 1-d non-negative integral inputs.");
    if (minlength < 0)
      return pj_status_new(PJ_ERR_RUNTIME, "minlength should be >= 0");
    if (w && (w->rank != 1 || w->sizes[0] != s->sizes[0]))
      return pj_status_new(PJ_ERR_RUNTIME, "weights should be 1-d and have the same length as "
                           "input");
    int64_t len = count > minlength ? count : minlength;
    outs[(*n)++] = pj_type(w ? (w->dtype == PJ_F32 ? PJ_F32 : PJ_F64) : PJ_I64, 1, &len);
    return NULL;
  }
  if (!strcmp(op, "repeat_interleave")) {
    const pj_tensor_desc_t *r = ctensor(c, "repeats");
    if (!r || r->rank != 1)
      return pj_status_new(PJ_ERR_RUNTIME, "repeat_interleave only accept 1D vector as repeat");
    /* CPU's kernel takes index types only (its dtype dispatch), before the negative check */
    if (r->dtype != PJ_I64 && r->dtype != PJ_I32)
      return pj_status_new(PJ_ERR_UNIMPLEMENTED, "\"repeat_interleave\" not implemented for '%s'",
                           pj_dtype_info(r->dtype)->name);
    if (count < 0) return pj_status_new(PJ_ERR_RUNTIME, "repeats can not be negative");
    outs[(*n)++] = pj_type(r->dtype, 1, &count);
    return NULL;
  }
  return pj_status_new(PJ_ERR_RUNTIME, "internal: aten::%s is not a dynamic op", op);
}

/* Counting programs "_pj_count_<op>": one 0-d i64 (negative: invalid input, reported by
 * pj_select_out_types with CPU's message). */
static pj_status_t *lower_select_count(pj_lower_t *L) {
  const char *op = L->c->op + strlen("_pj_count_");
  pj_val_t r = pj_const_i(H, PJ_I64, 0);
  if (!strcmp(op, "_unique2") || !strcmp(op, "_unique") || !strcmp(op, "unique_consecutive")) {
    pj_val_t x = flat_of(L, pj_tensor(L, "self"));
    if (x.id >= 0 && x.t.dims[0] > 0) {
      if (strcmp(op, "unique_consecutive")) {
        pj_val_t res;
        if (!pj_sort_along(L, &x, 1, 0, false, &res)) return NULL;
        x = res;
      }
      r = pj_count_true(L, run_starts(L, x));
    }
  } else if (!strcmp(op, "bincount")) {
    pj_val_t x = flat_of(L, pj_convert(H, pj_tensor(L, "self"), PJ_I64));
    if (x.id >= 0 && x.t.dims[0] > 0) {
      int64_t zero = 0;
      pj_val_t mx = pj_reduce(H, x, &zero, 1, "max"), mn = pj_reduce(H, x, &zero, 1, "min");
      r = SEL(CMP("LT", mn, pj_const_i(H, PJ_I64, 0)), pj_const_i(H, PJ_I64, -1),
              ADD(mx, pj_const_i(H, PJ_I64, 1)));
    }
  } else if (!strcmp(op, "repeat_interleave")) {
    pj_val_t x = flat_of(L, pj_convert(H, pj_tensor(L, "repeats"), PJ_I64));
    if (x.id >= 0 && x.t.dims[0] > 0) {
      int64_t zero = 0;
      pj_val_t mn = pj_reduce(H, x, &zero, 1, "min");
      r = SEL(CMP("LT", mn, pj_const_i(H, PJ_I64, 0)), pj_const_i(H, PJ_I64, -1),
              pj_reduce(H, x, &zero, 1, "add"));
    }
  }
  pj_set_result(L, 0, r);
  return NULL;
}

/* unique (always sorted on CPU, NaNs last and each its own value) and unique_consecutive:
 * values at the run starts, inverse = run number of each element, counts = run lengths. */
static pj_status_t *lower_unique(pj_lower_t *L) {
  bool sorted = strcmp(L->c->op, "unique_consecutive") != 0; /* CPU's unique always sorts */
  int64_t K = pj_int(L, "__count", 0);
  pj_val_t x = pj_tensor(L, "self");
  pj_val_t v = flat_of(L, x);
  if (v.id < 0) return NULL;
  int64_t N = v.t.dims[0];
  if (N == 0 || K == 0) return NULL;
  pj_type_t nt = pj_type(PJ_I64, 1, &N);
  pj_val_t order = pj_iota(H, nt, 0);
  if (sorted) {
    pj_val_t ops[2] = {v, order}, res[2];
    if (!pj_sort_along(L, ops, 2, 0, false, res)) return NULL;
    v = res[0];
    order = res[1];
  }
  pj_val_t starts = run_starts(L, v);
  pj_val_t pos = pj_true_positions(L, starts); /* run starts first */
  int64_t z = 0, k1 = K + 1 <= N ? K + 1 : N;
  pj_val_t first = pj_slice(H, pos, &z, &K, NULL);
  pj_set_result(L, 0, pj_gather_1d(H, v, first));
  if (pj_nout(L) > 1) {
    pj_type_t it = pj_out_type(L, 1);
    if (pj_type_numel(&it) > 0) {
      pj_val_t run = SUB(running_sum_1d(L, pj_convert(H, starts, PJ_I64)), pj_full(H, nt, 1));
      pj_val_t inv = sorted ? pj_scatter_1d(H, pj_full(H, nt, 0), order, run, NULL) : run;
      pj_set_result(L, 1, pj_reshape(H, inv, it.rank, it.dims));
    }
  }
  if (pj_nout(L) > 2) {
    pj_type_t ct = pj_out_type(L, 2);
    if (pj_type_numel(&ct) > 0) {
      /* next run start (N after the last run) minus this one */
      pj_val_t nxt = pj_slice(H, pos, (int64_t[]){1}, &k1, NULL);
      int64_t lo = 0, hi = K - (k1 - 1);
      nxt = pj_pad(H, nxt, pj_const_i(H, PJ_I64, N), &lo, &hi, NULL);
      pj_type_t kt = pj_type(PJ_I64, 1, &K);
      pj_val_t valid = CMP("LT", pj_iota(H, kt, 0), pj_full(H, kt, (double)(K - 1)));
      nxt = SEL(valid, nxt, pj_full(H, kt, (double)N));
      pj_set_result(L, 2, SUB(nxt, first));
    }
  }
  return NULL;
}

/* bincount: weights (or ones) summed into bins; the bin count came from the counting program. */
static pj_status_t *lower_bincount(pj_lower_t *L) {
  pj_type_t ot = pj_out_type(L, 0);
  pj_val_t x = flat_of(L, pj_convert(H, pj_tensor(L, "self"), PJ_I64));
  if (x.id < 0 || pj_type_numel(&ot) == 0) return NULL;
  if (x.t.dims[0] == 0) {
    pj_set_result(L, 0, pj_full(H, ot, 0));
    return NULL;
  }
  pj_val_t w = pj_has(L, "weights") ? pj_convert(H, flat_of(L, pj_tensor(L, "weights")), ot.dtype)
                                    : pj_full(H, pj_type_with_dtype(x.t, ot.dtype), 1);
  pj_set_result(L, 0, pj_scatter_1d(H, pj_full(H, ot, 0), x, w, "add"));
  return NULL;
}

/* repeat_interleave(repeats): output[j] = number of i whose running sum of repeats is <= j,
 * i.e. a running sum over bins marked at each running sum. */
static pj_status_t *lower_repeat_interleave(pj_lower_t *L) {
  pj_type_t ot = pj_out_type(L, 0);
  int64_t T = pj_type_numel(&ot);
  pj_val_t r = flat_of(L, pj_convert(H, pj_tensor(L, "repeats"), PJ_I64));
  if (r.id < 0 || T == 0) return NULL;
  pj_val_t cum = running_sum_1d(L, r);
  int64_t T1 = T + 1;
  pj_type_t t1 = pj_type(PJ_I64, 1, &T1);
  pj_val_t marks = pj_scatter_1d(H, pj_full(H, t1, 0), MIN(cum, pj_full(H, cum.t, (double)T)),
                                 pj_full(H, cum.t, 1), "add");
  int64_t z = 0;
  pj_set_result(L, 0, running_sum_1d(L, pj_slice(H, marks, &z, &T, NULL)));
  return NULL;
}

const pj_lowering_entry_t pj_lowerings_select[] = {
    {"median", lower_median, PJ_SHAPE_EXACT},
    {"nanmedian", lower_median, PJ_SHAPE_EXACT},
    {"mode", lower_mode, PJ_SHAPE_EXACT},
    {"kthvalue", lower_kthvalue, PJ_SHAPE_EXACT},
    {"topk", lower_topk, PJ_SHAPE_EXACT},
    {"searchsorted", lower_searchsorted, PJ_SHAPE_EXACT},
    {"bucketize", lower_searchsorted, PJ_SHAPE_EXACT},
    {"_cummax_helper", lower_cumextremum, PJ_SHAPE_EXACT},
    {"_cummin_helper", lower_cumextremum, PJ_SHAPE_EXACT},
    {"_logcumsumexp", lower_logcumsumexp, PJ_SHAPE_EXACT},
    {"nonzero_static", lower_nonzero_static, PJ_SHAPE_EXACT},
    {"equal", lower_equal, PJ_SHAPE_EXACT},
    {"segment_reduce", lower_segment_reduce, PJ_SHAPE_EXACT},
    {"_segment_reduce_backward", lower_segment_reduce_backward, PJ_SHAPE_EXACT},
    {"_unique", lower_unique, PJ_SHAPE_EXACT},
    {"_pj_count__unique", lower_select_count, PJ_SHAPE_EXACT},
    {"histc", lower_histc, PJ_SHAPE_EXACT},
    {"histogram", lower_histogram, PJ_SHAPE_EXACT},
    {"_histogramdd_bin_edges", lower_histogramdd, PJ_SHAPE_EXACT},
    {"_histogramdd_from_bin_cts", lower_histogramdd, PJ_SHAPE_EXACT},
    {"_histogramdd_from_bin_tensors", lower_histogramdd, PJ_SHAPE_EXACT},
    {"_unique2", lower_unique, PJ_SHAPE_EXACT},
    {"unique_consecutive", lower_unique, PJ_SHAPE_EXACT},
    {"bincount", lower_bincount, PJ_SHAPE_EXACT},
    {"repeat_interleave", lower_repeat_interleave, PJ_SHAPE_EXACT},
    {"_pj_count__unique2", lower_select_count, PJ_SHAPE_EXACT},
    {"_pj_count_unique_consecutive", lower_select_count, PJ_SHAPE_EXACT},
    {"_pj_count_bincount", lower_select_count, PJ_SHAPE_EXACT},
    {"_pj_count_repeat_interleave", lower_select_count, PJ_SHAPE_EXACT},
    {NULL, NULL, PJ_SHAPE_EXACT},
};
