/* Lowerings: normalization layers (layer / group / batch norm and their backwards), embedding
 * backward, and losses (nll_loss(2d), mse, binary cross entropy, smooth L1, Huber) with their
 * backwards.
 *
 * Conventions:
 *  - Half types compute in float32 (the acc type PyTorch's CPU kernels use) and round once.
 *  - Multi-output ops produce a candidate value per schema return (plus mutated running stats
 *    for batch norm); put_results() hands them to the destinations in order, skipping returns
 *    that have no destination (masked-off gradients: None from the Meta kernel) and leaving
 *    empty destinations unwritten.
 *  - Losses take reduction as at::Reduction: 0 none, 1 mean, 2 sum. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../hlo/strbuf.h"
#include "table.h"
#include "emit.h"


enum { RED_NONE = 0, RED_MEAN = 1, RED_SUM = 2 };

/* ---- helpers ---- */

static pj_dtype_t acc_of(pj_dtype_t dt) { return dt == PJ_BF16 || dt == PJ_F16 ? PJ_F32 : dt; }

static pj_val_t cst(pj_lower_t *L, pj_val_t like, double v) { return pj_full(H, like.t, v); }

/* Hands candidate results to the destinations in order; present[k] false means "no
 * destination for this one" (a masked-off gradient: None from the Meta kernel). Empty
 * destinations (e.g. batch norm's saved statistics outside training, CPU's convention) are
 * passed but left unwritten. Checks the count so a mismatch between these rules and the
 * bridge's destinations is an error, never a silently misplaced result. */
static void put_results(pj_lower_t *L, const pj_val_t *v, const bool *present, int n) {
  int count = 0;
  for (int i = 0; i < n; i++) count += present[i];
  if (!pj_hlo_ok(H)) return;
  if (count != pj_nout(L)) {
    pj_fail(L, PJ_ERR_RUNTIME, "internal: aten::%s produced %d results for %d destinations",
            L->c->op, count, pj_nout(L));
    return;
  }
  int k = 0;
  for (int i = 0; i < n; i++) {
    if (!present[i]) continue;
    pj_type_t t = pj_out_type(L, k);
    pj_val_t x = v[i];
    if (pj_type_numel(&t) == 0) {
      k++;
      continue;
    }
    if (x.id < 0) {
      pj_fail(L, PJ_ERR_RUNTIME, "internal: aten::%s result %d missing", L->c->op, i);
      return;
    }
    if (pj_type_numel(&x.t) == pj_type_numel(&t)) x = pj_reshape(H, x, t.rank, t.dims);
    pj_set_result(L, k++, x);
  }
}

/* Sum of x over dims [d0, d1) (no kept dims). */
static pj_val_t sum_range(pj_lower_t *L, pj_val_t x, int d0, int d1) {
  int64_t dims[PJ_MAX_RANK];
  int n = 0;
  for (int i = d0; i < d1; i++) dims[n++] = i;
  return pj_reduce(H, x, dims, n, "add");
}

/* Sum over every dim except `keep` (a per-channel reduction). */
static pj_val_t sum_except(pj_lower_t *L, pj_val_t x, int keep) {
  int64_t dims[PJ_MAX_RANK];
  int n = 0;
  for (int i = 0; i < x.t.rank; i++)
    if (i != keep) dims[n++] = i;
  return pj_reduce(H, x, dims, n, "add");
}

/* A value whose dims are x's dims listed in `map` broadcast to x's type. */
static pj_val_t bcast_dims(pj_lower_t *L, pj_val_t v, pj_type_t t, const int64_t *map) {
  return pj_broadcast_in_dim(H, v, pj_type_with_dtype(t, v.t.dtype), map);
}

/* A reduction over the trailing dims [axis, rank) broadcast back to t. */
static pj_val_t bcast_lead(pj_lower_t *L, pj_val_t v, pj_type_t t, int axis) {
  int64_t map[PJ_MAX_RANK];
  for (int i = 0; i < axis; i++) map[i] = i;
  v = pj_reshape(H, v, axis, t.dims);
  return bcast_dims(L, v, t, map);
}

/* A per-channel vector [C] broadcast along dim 1 of t (dim 0 when t is 1-D). */
static pj_val_t bcast_channel(pj_lower_t *L, pj_val_t v, pj_type_t t, int cdim) {
  int64_t map[1] = {cdim};
  return bcast_dims(L, v, t, map);
}

/* The mean of x over `dims` (n elements each; the reduced dims dropped), in two passes:
 * m = sum(x) / n, then m += sum(x - m) / n. Why: a rounded sum / n can be an ulp off, and a
 * normalization divides x - mean by sqrt(var + eps), which for a constant slice (var = 0)
 * amplifies that ulp by 1 / sqrt(eps) (fuzz F19: layer_norm of a row of equal values gave
 * bias - 6e-5 where CPU, whose mean is exact, gives the bias). Invariant: a constant slice of
 * value c gets mean exactly c: m is within a few ulps of c, so c - m is exact (Sterbenz), its
 * partial sums are small multiples of that difference, exact while they fit the significand
 * (measured exact for rows of 3 * 2^20 float32 elements), divided by n it is c - m again, and
 * m + (c - m) = c. (Unless n * c overflows: m is inf and the mean NaN, as before.) For other
 * slices this is the usual corrected two-pass mean, at least as accurate as sum / n. */
static pj_val_t exact_mean(pj_lower_t *L, pj_val_t x, const int64_t *dims, int nd, double n) {
  int64_t keep[PJ_MAX_RANK];
  int nk = 0;
  for (int i = 0; i < x.t.rank; i++) {
    bool reduced = false;
    for (int j = 0; j < nd; j++) reduced |= dims[j] == i;
    if (!reduced) keep[nk++] = i;
  }
  pj_val_t m = pj_reduce(H, x, dims, nd, "add");
  m = DIV(m, cst(L, m, n));
  pj_val_t r = pj_reduce(H, SUB(x, bcast_dims(L, m, x.t, keep)), dims, nd, "add");
  return ADD(m, DIV(r, cst(L, r, n)));
}

/* exact_mean over dims [d0, d1). */
static pj_val_t mean_range(pj_lower_t *L, pj_val_t x, int d0, int d1, double n) {
  int64_t dims[PJ_MAX_RANK];
  int nd = 0;
  for (int i = d0; i < d1; i++) dims[nd++] = i;
  return exact_mean(L, x, dims, nd, n);
}

/* exact_mean over every dim except `keep` (a per-channel mean). */
static pj_val_t mean_except(pj_lower_t *L, pj_val_t x, int keep, double n) {
  int64_t dims[PJ_MAX_RANK];
  int nd = 0;
  for (int i = 0; i < x.t.rank; i++)
    if (i != keep) dims[nd++] = i;
  return exact_mean(L, x, dims, nd, n);
}

static pj_val_t opt_tensor(pj_lower_t *L, const char *name, pj_dtype_t ct) {
  return pj_has(L, name) ? pj_convert(H, pj_tensor(L, name), ct) : (pj_val_t){.id = -1, .sub = -1};
}

static void output_mask(pj_lower_t *L, bool *mask, int n) {
  int64_t m[4] = {1, 1, 1, 1};
  pj_ints(L, "output_mask", m, 4);
  for (int i = 0; i < n; i++) mask[i] = m[i] != 0;
}

/* ---- layer norm ---- */

static pj_status_t *lower_layer_norm(pj_lower_t *L) {
  pj_val_t x = pj_tensor(L, "input");
  int k = pj_list_len(L, "normalized_shape");
  int axis = x.t.rank - k;
  if (axis < 0) {
    pj_fail(L, PJ_ERR_RUNTIME, "internal: bad normalized_shape");
    return NULL;
  }
  pj_dtype_t ct = acc_of(x.t.dtype);
  x = pj_convert(H, x, ct);
  double n = 1;
  for (int i = axis; i < x.t.rank; i++) n *= (double)x.t.dims[i];
  pj_val_t mean = mean_range(L, x, axis, x.t.rank, n);
  pj_val_t d = SUB(x, bcast_lead(L, mean, x.t, axis));
  pj_val_t var = sum_range(L, MUL(d, d), axis, x.t.rank);
  var = DIV(var, cst(L, var, n)); /* biased, as layer_norm defines it */
  pj_val_t rstd = U("rsqrt", ADD(var, cst(L, var, pj_float(L, "eps", 1e-5))));
  pj_val_t y = MUL(d, bcast_lead(L, rstd, x.t, axis));
  pj_val_t w = opt_tensor(L, "weight", ct), b = opt_tensor(L, "bias", ct);
  if (w.id >= 0) y = MUL(y, pj_broadcast_to(H, w, y.t.rank, y.t.dims));
  if (b.id >= 0) y = ADD(y, pj_broadcast_to(H, b, y.t.rank, y.t.dims));
  pj_val_t v[3] = {y, mean, rstd};
  bool p[3] = {true, true, true};
  put_results(L, v, p, 3);
  return NULL;
}

static pj_status_t *lower_layer_norm_backward(pj_lower_t *L) {
  pj_val_t x = pj_tensor(L, "input");
  int axis = x.t.rank - pj_list_len(L, "normalized_shape");
  pj_dtype_t ct = acc_of(x.t.dtype);
  x = pj_convert(H, x, ct);
  pj_val_t g = pj_convert(H, pj_tensor(L, "grad_out"), ct);
  pj_val_t mean = bcast_lead(L, pj_convert(H, pj_tensor(L, "mean"), ct), x.t, axis);
  pj_val_t rstd = bcast_lead(L, pj_convert(H, pj_tensor(L, "rstd"), ct), x.t, axis);
  pj_val_t w = opt_tensor(L, "weight", ct);
  double n = 1;
  for (int i = axis; i < x.t.rank; i++) n *= (double)x.t.dims[i];
  pj_val_t xhat = MUL(SUB(x, mean), rstd);
  pj_val_t gw = w.id >= 0 ? MUL(g, pj_broadcast_to(H, w, g.t.rank, g.t.dims)) : g;
  /* dx = rstd * (gw - mean(gw) - xhat * mean(gw * xhat)), means over the normalized dims */
  pj_val_t m1 = sum_range(L, gw, axis, x.t.rank);
  pj_val_t m2 = sum_range(L, MUL(gw, xhat), axis, x.t.rank);
  m1 = bcast_lead(L, DIV(m1, cst(L, m1, n)), x.t, axis);
  m2 = bcast_lead(L, DIV(m2, cst(L, m2, n)), x.t, axis);
  pj_val_t dx = MUL(rstd, SUB(SUB(gw, m1), MUL(xhat, m2)));
  bool mask[3];
  output_mask(L, mask, 3);
  pj_val_t v[3] = {dx, sum_range(L, MUL(g, xhat), 0, axis), sum_range(L, g, 0, axis)};
  bool p[3] = {mask[0], mask[1] && pj_has(L, "weight"), mask[2] && pj_has(L, "bias")};
  put_results(L, v, p, 3);
  return NULL;
}

/* ---- group norm ---- */

typedef struct {
  int64_t n, c, hxw, g, d; /* d = C / G * HxW: elements per (sample, group) */
} gn_dims_t;

static bool gn_dims(pj_lower_t *L, pj_val_t x, gn_dims_t *s) {
  s->n = pj_int(L, "N", 0);
  s->c = pj_int(L, "C", 0);
  s->hxw = pj_int(L, "HxW", 1);
  s->g = pj_int(L, "group", 1);
  if (s->g <= 0 || s->c % s->g != 0 || s->n * s->c * s->hxw != pj_type_numel(&x.t)) {
    pj_fail(L, PJ_ERR_RUNTIME, "native_group_norm: inconsistent N, C, HxW, group");
    return false;
  }
  s->d = s->c / s->g * s->hxw;
  return true;
}

static pj_status_t *lower_group_norm(pj_lower_t *L) {
  pj_val_t x0 = pj_tensor(L, "input");
  gn_dims_t s;
  if (!gn_dims(L, x0, &s)) return NULL;
  pj_dtype_t ct = acc_of(x0.t.dtype);
  int64_t g3[3] = {s.n, s.g, s.d}, c3[3] = {s.n, s.c, s.hxw};
  pj_val_t x = pj_reshape(H, pj_convert(H, x0, ct), 3, g3);
  pj_val_t mean = mean_range(L, x, 2, 3, (double)s.d);
  pj_val_t d = SUB(x, bcast_lead(L, mean, x.t, 2));
  pj_val_t var = sum_range(L, MUL(d, d), 2, 3);
  var = DIV(var, cst(L, var, (double)s.d));
  pj_val_t rstd = U("rsqrt", ADD(var, cst(L, var, pj_float(L, "eps", 1e-5))));
  pj_val_t y = pj_reshape(H, MUL(d, bcast_lead(L, rstd, x.t, 2)), 3, c3);
  pj_val_t w = opt_tensor(L, "weight", ct), b = opt_tensor(L, "bias", ct);
  if (w.id >= 0) y = MUL(y, bcast_channel(L, w, y.t, 1));
  if (b.id >= 0) y = ADD(y, bcast_channel(L, b, y.t, 1));
  y = pj_reshape(H, y, x0.t.rank, x0.t.dims);
  pj_val_t v[3] = {y, mean, rstd};
  bool p[3] = {true, true, true};
  put_results(L, v, p, 3);
  return NULL;
}

static pj_status_t *lower_group_norm_backward(pj_lower_t *L) {
  pj_val_t x0 = pj_tensor(L, "input");
  gn_dims_t s;
  if (!gn_dims(L, x0, &s)) return NULL;
  pj_dtype_t ct = acc_of(x0.t.dtype);
  int64_t g3[3] = {s.n, s.g, s.d}, c3[3] = {s.n, s.c, s.hxw}, ng[2] = {s.n, s.g};
  pj_val_t x = pj_reshape(H, pj_convert(H, x0, ct), 3, g3);
  pj_val_t g = pj_reshape(H, pj_convert(H, pj_tensor(L, "grad_out"), ct), 3, c3);
  pj_val_t mean = bcast_lead(L, pj_reshape(H, pj_convert(H, pj_tensor(L, "mean"), ct), 2, ng),
                             x.t, 2);
  pj_val_t rstd = bcast_lead(L, pj_reshape(H, pj_convert(H, pj_tensor(L, "rstd"), ct), 2, ng),
                             x.t, 2);
  pj_val_t xhat = MUL(SUB(x, mean), rstd);        /* [N, G, D] */
  pj_val_t xhat_c = pj_reshape(H, xhat, 3, c3);   /* [N, C, HxW] */
  pj_val_t w = opt_tensor(L, "weight", ct);
  pj_val_t gw = w.id >= 0 ? MUL(g, bcast_channel(L, w, g.t, 1)) : g;
  gw = pj_reshape(H, gw, 3, g3);
  pj_val_t m1 = sum_range(L, gw, 2, 3), m2 = sum_range(L, MUL(gw, xhat), 2, 3);
  m1 = bcast_lead(L, DIV(m1, cst(L, m1, (double)s.d)), x.t, 2);
  m2 = bcast_lead(L, DIV(m2, cst(L, m2, (double)s.d)), x.t, 2);
  pj_val_t dx = MUL(rstd, SUB(SUB(gw, m1), MUL(xhat, m2)));
  dx = pj_reshape(H, dx, x0.t.rank, x0.t.dims);
  bool mask[3];
  output_mask(L, mask, 3);
  pj_val_t v[3] = {dx, sum_except(L, MUL(g, xhat_c), 1), sum_except(L, g, 1)};
  put_results(L, v, mask, 3);
  return NULL;
}

/* ---- weight norm (the fused interface torch._weight_norm calls: dim 0 or the last dim) ----
 * w = v * (g / ||v||), the norm taken over every dim but `dim`; g and the norms have v's rank
 * with size 1 outside `dim`. The backward follows CPU's kernel term by term:
 *   s = sum(grad_w * v),  grad_g = s / norm,  grad_v = (g / norm) * grad_w - (g / norm) *
 *   grad_g / norm * v. */

typedef struct {
  int dim;
  pj_dtype_t ct;
} wn_t;

static bool wn_setup(pj_lower_t *L, pj_val_t v, wn_t *w) {
  int64_t dim = pj_int(L, "dim", 0);
  if (dim < 0) dim += v.t.rank;
  if (v.t.rank == 0 || dim < 0 || dim >= v.t.rank) {
    pj_fail(L, PJ_ERR_RUNTIME, "_weight_norm_interface: dim out of range for a %d-d weight",
            v.t.rank);
    return false;
  }
  w->dim = (int)dim;
  w->ct = acc_of(v.t.dtype);
  return true;
}

/* A per-`dim` sum [C] (or any value with g's numel) as g's shape broadcast to t. */
static pj_val_t wn_bcast(pj_lower_t *L, pj_val_t per, const wn_t *w, pj_type_t t) {
  return bcast_channel(L, pj_reshape(H, per, 1, &t.dims[w->dim]), t, w->dim);
}

static pj_val_t wn_as(pj_lower_t *L, pj_val_t x, int k) {
  pj_type_t t = pj_out_type(L, k);
  return pj_convert(H, x, t.dtype);
}

static pj_status_t *lower_weight_norm(pj_lower_t *L) {
  pj_val_t v = pj_tensor(L, "v");
  wn_t w;
  if (!wn_setup(L, v, &w)) return NULL;
  v = pj_convert(H, v, w.ct);
  pj_val_t g = pj_convert(H, pj_tensor(L, "g"), w.ct);
  pj_val_t norm = U("sqrt", sum_except(L, MUL(v, v), w.dim)); /* [C] */
  pj_val_t a = DIV(pj_reshape(H, g, 1, &v.t.dims[w.dim]), norm);
  pj_val_t r[2] = {wn_as(L, MUL(v, wn_bcast(L, a, &w, v.t)), 0), wn_as(L, norm, 1)};
  bool p[2] = {true, true};
  put_results(L, r, p, 2);
  return NULL;
}

static pj_status_t *lower_weight_norm_backward(pj_lower_t *L) {
  pj_val_t v = pj_tensor(L, "saved_v");
  wn_t w;
  if (!wn_setup(L, v, &w)) return NULL;
  v = pj_convert(H, v, w.ct);
  int64_t c = v.t.dims[w.dim];
  pj_val_t gw = pj_convert(H, pj_tensor(L, "grad_w"), w.ct);
  pj_val_t g = pj_reshape(H, pj_convert(H, pj_tensor(L, "saved_g"), w.ct), 1, &c);
  pj_val_t norm = pj_reshape(H, pj_convert(H, pj_tensor(L, "saved_norms"), w.ct), 1, &c);
  pj_val_t s = sum_except(L, MUL(gw, v), w.dim);
  pj_val_t grad_g = DIV(s, norm);
  pj_val_t a = DIV(g, norm), b = DIV(MUL(a, grad_g), norm);
  pj_val_t grad_v = SUB(MUL(wn_bcast(L, a, &w, v.t), gw), MUL(wn_bcast(L, b, &w, v.t), v));
  pj_val_t r[2] = {wn_as(L, grad_v, 0), wn_as(L, grad_g, 1)};
  bool p[2] = {true, true};
  put_results(L, r, p, 2);
  return NULL;
}

/* ---- batch norm ---- */

/* Forward of the _native_batch_norm_legit family. Candidates:
 * out, save_mean, save_invstd, then the new running mean and variance (present only where the
 * running stats are destinations). In training the batch statistics normalize and the running
 * stats move by `momentum` toward the batch mean and the *unbiased* batch variance; in eval
 * the running stats normalize and save_mean / save_invstd are empty (CPU's convention; the
 * bridge shapes those destinations so) and stay unwritten. */
static void batch_norm_forward(pj_lower_t *L, bool training, bool stats, bool stats_are_dests,
                               bool reserve) {
  pj_val_t x0 = pj_tensor(L, "input");
  pj_dtype_t ct = acc_of(x0.t.dtype);
  pj_val_t x = pj_convert(H, x0, ct);
  int cdim = x.t.rank > 1 ? 1 : 0;
  double count = (double)pj_type_numel(&x.t) / (double)(x.t.rank ? x.t.dims[cdim] : 1);
  pj_val_t rm = stats ? pj_convert(H, pj_tensor(L, "running_mean"), ct) : (pj_val_t){.id = -1};
  pj_val_t rv = stats ? pj_convert(H, pj_tensor(L, "running_var"), ct) : (pj_val_t){.id = -1};
  double eps = pj_float(L, "eps", 1e-5), mom = pj_float(L, "momentum", 0.1);
  pj_val_t mean, invstd, new_rm = rm, new_rv = rv;
  if (training) {
    mean = mean_except(L, x, cdim, count);
    pj_val_t d = SUB(x, bcast_channel(L, mean, x.t, cdim));
    pj_val_t ss = sum_except(L, MUL(d, d), cdim);
    invstd = U("rsqrt", ADD(DIV(ss, cst(L, ss, count)), cst(L, ss, eps)));
    if (stats) {
      pj_val_t unbiased = DIV(ss, cst(L, ss, count - 1));
      new_rm = ADD(MUL(cst(L, mean, mom), mean), MUL(cst(L, rm, 1 - mom), rm));
      new_rv = ADD(MUL(cst(L, rv, mom), unbiased), MUL(cst(L, rv, 1 - mom), rv));
    }
  } else {
    mean = rm;
    invstd = U("rsqrt", ADD(rv, cst(L, rv, eps)));
  }
  pj_val_t y = MUL(SUB(x, bcast_channel(L, mean, x.t, cdim)), bcast_channel(L, invstd, x.t, cdim));
  pj_val_t w = opt_tensor(L, "weight", ct), b = opt_tensor(L, "bias", ct);
  if (w.id >= 0) y = MUL(y, bcast_channel(L, w, y.t, cdim));
  if (b.id >= 0) y = ADD(y, bcast_channel(L, b, y.t, cdim));
  /* the _batch_norm_* ops return an empty uint8 `reserve` (cudnn's workspace) after invstd */
  pj_val_t v[6] = {y, mean, invstd, {.id = -1, .sub = -1}, new_rm, new_rv};
  bool p[6] = {true, true, true, reserve, stats_are_dests, stats_are_dests};
  put_results(L, v, p, 6);
}

/* _native_batch_norm_legit (running stats mutated in place: destinations 3 and 4 by schema),
 * its .no_stats overload, and _native_batch_norm_legit_no_training. */
static pj_status_t *lower_batch_norm_legit(pj_lower_t *L) {
  bool no_training = !strcmp(L->c->op, "_native_batch_norm_legit_no_training");
  bool stats = pj_has(L, "running_mean") && pj_has(L, "running_var");
  bool training = no_training ? false : pj_bool(L, "training", true);
  if (!training && !stats) {
    pj_fail(L, PJ_ERR_RUNTIME, "running_mean and running_var must be defined in evaluation mode");
    return NULL;
  }
  /* _native_batch_norm_legit always has the running stats as destinations (its schema marks
   * them written); native_batch_norm only in training mode (see below). */
  bool stat_dests = stats && !no_training &&
                    (strcmp(L->c->op, "native_batch_norm") != 0 || training);
  batch_norm_forward(L, training, stats, stat_dests, false);
  return NULL;
}

/* _batch_norm_with_update (training; running stats written) and _batch_norm_no_update
 * (evaluation with the running stats; not in the table: its CompositeExplicitAutograd kernel
 * calls CPU's kernel directly, so it needs an explicit PrivateUse1 registration first). */
static pj_status_t *lower_batch_norm_update(pj_lower_t *L) {
  bool update = !strcmp(L->c->op, "_batch_norm_with_update");
  bool stats = pj_has(L, "running_mean") && pj_has(L, "running_var");
  if (!stats) {
    pj_fail(L, PJ_ERR_RUNTIME, "%s: running_mean and running_var must be defined", L->c->op);
    return NULL;
  }
  batch_norm_forward(L, update, true, update, true);
  return NULL;
}

/* native_batch_norm uses the same lowering: its schema does not mark running_mean /
 * running_var as written, but the bridge passes them as destinations 3 and 4 in training mode
 * (dispatch.cpp, mutates_unannotated), which is exactly _native_batch_norm_legit's layout. */

/* native_batch_norm_backward and batch_norm_backward (whose save_var holds the saved inverse
 * std, and `update` plays the role of `train`). */
static pj_status_t *lower_batch_norm_backward(pj_lower_t *L) {
  pj_val_t x = pj_tensor(L, "input");
  pj_dtype_t ct = acc_of(x.t.dtype);
  x = pj_convert(H, x, ct);
  pj_val_t g = pj_convert(H, pj_tensor(L, "grad_out"), ct);
  int cdim = x.t.rank > 1 ? 1 : 0;
  double count = (double)pj_type_numel(&x.t) / (double)(x.t.rank ? x.t.dims[cdim] : 1);
  bool train = pj_arg(L, "train") ? pj_bool(L, "train", true) : pj_bool(L, "update", true);
  const char *sname = pj_arg(L, "save_invstd") ? "save_invstd" : "save_var";
  double eps = pj_float(L, "eps", 1e-5);
  pj_val_t mean, invstd;
  if (train) {
    mean = pj_convert(H, pj_tensor(L, "save_mean"), ct);
    invstd = pj_convert(H, pj_tensor(L, sname), ct);
  } else {
    mean = pj_convert(H, pj_tensor(L, "running_mean"), ct);
    pj_val_t rv = pj_convert(H, pj_tensor(L, "running_var"), ct);
    invstd = U("rsqrt", ADD(rv, cst(L, rv, eps)));
  }
  pj_val_t w = opt_tensor(L, "weight", ct);
  pj_val_t xhat = MUL(SUB(x, bcast_channel(L, mean, x.t, cdim)), bcast_channel(L, invstd, x.t, cdim));
  pj_val_t dw = sum_except(L, MUL(g, xhat), cdim), db = sum_except(L, g, cdim);
  pj_val_t scale = w.id >= 0 ? MUL(invstd, w) : invstd;
  pj_val_t dx;
  if (train) { /* dx = (g - mean(g) - xhat * mean(g * xhat)) * invstd * w */
    pj_val_t mg = bcast_channel(L, DIV(db, cst(L, db, count)), x.t, cdim);
    pj_val_t mgx = bcast_channel(L, DIV(dw, cst(L, dw, count)), x.t, cdim);
    dx = MUL(SUB(SUB(g, mg), MUL(xhat, mgx)), bcast_channel(L, scale, x.t, cdim));
  } else {
    dx = MUL(g, bcast_channel(L, scale, x.t, cdim));
  }
  bool mask[3];
  output_mask(L, mask, 3);
  mask[0] = true; /* the Meta kernel always returns grad_input, whatever output_mask[0] says */
  pj_val_t v[3] = {dx, dw, db};
  put_results(L, v, mask, 3);
  return NULL;
}

/* ---- embedding backward ---- */

/* Scatter-adds rows: out[idx[k], :] += upd[k, :] for operand [R, D], idx [K], upd [K, D]. */
static pj_val_t scatter_rows_add(pj_lower_t *L, pj_val_t operand, pj_val_t idx, pj_val_t upd) {
  int64_t kd[2] = {idx.t.dims[0], 1};
  pj_val_t iv = pj_reshape(H, idx, 2, kd);
  pj_type_t st = pj_type_scalar(operand.t.dtype);
  pj_type_t sts[2] = {st, st};
  pj_val_t a[2];
  pj_hlo_region_begin(H, sts, 2, a);
  pj_val_t s = ADD(a[0], a[1]);
  char *region = pj_hlo_region_end(H, &s, 1);
  const char *attrs =
      "scatter_dimension_numbers = #stablehlo.scatter<update_window_dims = [1], "
      "inserted_window_dims = [0], scatter_dims_to_operand_dims = [0], index_vector_dim = 1>, "
      "indices_are_sorted = false, unique_indices = false";
  pj_val_t ins[3] = {operand, iv, upd}, out = {.id = -1, .sub = -1};
  if (region) pj_hlo_op_multi(H, "stablehlo.scatter", ins, 3, region, attrs, &operand.t, 1, &out);
  free(region);
  return out;
}

static pj_status_t *lower_embedding_dense_backward(pj_lower_t *L) {
  pj_val_t g = pj_tensor(L, "grad_output");
  pj_val_t idx = pj_convert(H, pj_tensor(L, "indices"), PJ_I64);
  int64_t nw = pj_int(L, "num_weights", 0), pad = pj_int(L, "padding_idx", -1);
  pj_type_t ot = pj_out_type(L, 0);
  pj_dtype_t ct = acc_of(ot.dtype);
  int64_t k = pj_type_numel(&idx.t), dd = ot.rank > 1 ? ot.dims[1] : 1;
  int64_t kdims[2] = {k, dd};
  g = pj_reshape(H, pj_convert(H, g, ct), 2, kdims);
  idx = pj_reshape(H, idx, 1, &k);
  pj_val_t keep = CMP("NE", idx, pj_full(H, idx.t, (double)pad)); /* padding rows get no grad */
  if (pad < 0) keep = pj_full(H, keep.t, 1);
  int64_t rowmap[1] = {0};
  pj_val_t keep2 = pj_broadcast_in_dim(H, keep, pj_type_with_dtype(g.t, PJ_BOOL), rowmap);
  g = SEL(keep2, g, cst(L, g, 0));
  if (pj_bool(L, "scale_grad_by_freq", false)) {
    /* each row is divided by how often its index occurs in this batch */
    int64_t n1[2] = {nw, 1}, k1[2] = {k, 1};
    pj_val_t counts = scatter_rows_add(L, pj_full(H, pj_type(ct, 2, n1), 0), idx,
                                       pj_full(H, pj_type(ct, 2, k1), 1));
    int64_t nflat = nw;
    pj_val_t freq = pj_gather_1d(H, pj_reshape(H, counts, 1, &nflat), idx);
    g = DIV(g, pj_broadcast_in_dim(H, freq, g.t, rowmap));
  }
  int64_t od[2] = {nw, dd};
  pj_val_t out = scatter_rows_add(L, pj_full(H, pj_type(ct, 2, od), 0), idx, g);
  pj_set_result(L, 0, pj_reshape(H, out, ot.rank, ot.dims));
  return NULL;
}

/* ---- embedding_bag ---- */

/* rows [K, D] of a [R, D] operand at int64 row indices [K] */
static pj_val_t take_rows(pj_lower_t *L, pj_val_t x, pj_val_t rows) {
  int64_t k = rows.t.dims[0], kd[2] = {k, 1}, d = x.t.dims[1];
  char attrs[320];
  snprintf(attrs, sizeof attrs,
           "dimension_numbers = #stablehlo.gather<offset_dims = [1], collapsed_slice_dims = [0], "
           "start_index_map = [0], index_vector_dim = 1>, slice_sizes = array<i64: 1, %lld>, "
           "indices_are_sorted = false",
           (long long)d);
  pj_val_t ins[2] = {x, pj_reshape(H, rows, 2, kd)};
  int64_t od[2] = {k, d};
  return pj_hlo_op(H, "stablehlo.gather", ins, 2, attrs, pj_type(x.t.dtype, 2, od));
}

/* Bag of every index: the number of the first `nbags` offsets <= k, minus one. */
static pj_val_t bag_of_index(pj_lower_t *L, pj_val_t offsets, int64_t nbags, int64_t k) {
  int64_t kb[2] = {k, nbags}, s0 = 0, d0 = 0, d1 = 1;
  pj_val_t off = pj_slice(H, pj_convert(H, offsets, PJ_I64), &s0, &nbags, NULL);
  pj_type_t t = pj_type(PJ_I64, 2, kb);
  pj_val_t le = CMP("LE", pj_broadcast_in_dim(H, off, t, &d1), pj_iota(H, t, 0));
  pj_val_t n = pj_reduce(H, SEL(le, pj_full(H, t, 1), pj_full(H, t, 0)), &d1, 1, "add");
  (void)d0;
  return SUB(n, pj_full(H, n.t, 1));
}

/* [B, K] membership of index k in bag b, padding indices excluded (as ct 0/1) */
static pj_val_t bag_mask(pj_lower_t *L, pj_val_t seg, pj_val_t idx, int64_t nbags, int64_t pad,
                         pj_dtype_t ct) {
  int64_t k = seg.t.dims[0], bk[2] = {nbags, k}, d1 = 1;
  pj_type_t t = pj_type(PJ_I64, 2, bk);
  pj_val_t m = CMP("EQ", pj_broadcast_in_dim(H, seg, t, &d1), pj_iota(H, t, 0));
  if (pad >= 0)
    m = AND(m, pj_broadcast_in_dim(H, CMP("NE", idx, pj_full(H, idx.t, (double)pad)),
                                   pj_type_with_dtype(t, PJ_BOOL), &d1));
  return SEL(m, pj_full(H, pj_type_with_dtype(t, ct), 1), pj_full(H, pj_type_with_dtype(t, ct), 0));
}

static pj_val_t matmul(pj_lower_t *L, pj_val_t a, pj_val_t b, pj_dtype_t ct) {
  int64_t lc = 1, rc = 0;
  return pj_dot_general(H, a, b, NULL, NULL, 0, &lc, &rc, 1, ct);
}

enum { EB_SUM = 0, EB_MEAN = 1, EB_MAX = 2 };

/* _embedding_bag / _embedding_bag_forward_only: (output, offset2bag, bag_size, max_indices).
 * offset2bag holds every index's bag, bag_size the non-padding count per bag, max_indices the
 * weight row of each max (mode max; else the destinations CPU leaves unused get bag_size). */
static pj_status_t *lower_embedding_bag(pj_lower_t *L) {
  pj_val_t w = pj_tensor(L, "weight");
  pj_val_t idx = pj_convert(H, pj_tensor(L, "indices"), PJ_I64);
  pj_type_t ot = pj_out_type(L, 0);
  pj_dtype_t ct = acc_of(ot.dtype);
  int64_t mode = pj_int(L, "mode", 0), pad = pj_int(L, "padding_idx", -1);
  int64_t k = pj_type_numel(&idx.t), nb = ot.dims[0], d = ot.rank > 1 ? ot.dims[1] : 1;
  idx = pj_reshape(H, idx, 1, &k);
  pj_check_index(L, idx, w.t.dims[0], 0, false, PJ_CHECK_EMBEDDING_BAG);
  pj_val_t seg = bag_of_index(L, pj_tensor(L, "offsets"), nb, k);
  pj_val_t m = bag_mask(L, seg, idx, nb, pad, ct);                  /* [B, K] */
  int64_t d1 = 1, d0 = 0;
  pj_val_t cnt = pj_reduce(H, m, &d1, 1, "add");                     /* [B] */
  pj_val_t rows = take_rows(L, pj_convert(H, w, ct), idx);          /* [K, D] */
  pj_val_t out, maxi = {.id = -1, .sub = -1};
  if (mode == EB_MAX) {
    int64_t bkd[3] = {nb, k, d}, m01[2] = {0, 1}, m12[2] = {1, 2};
    pj_type_t t3 = pj_type(ct, 3, bkd), i3 = pj_type(PJ_I64, 3, bkd);
    pj_val_t in = CMP("NE", pj_broadcast_in_dim(H, m, t3, m01), pj_full(H, t3, 0));
    pj_val_t v = SEL(in, pj_broadcast_in_dim(H, rows, t3, m12), pj_full(H, t3, -INFINITY));
    pj_val_t ki = pj_iota(H, i3, 1);
    /* (value, position) max with the first position winning ties */
    pj_type_t sv = pj_type_scalar(ct), si = pj_type_scalar(PJ_I64);
    pj_type_t sts[4] = {sv, si, sv, si};
    pj_val_t a[4];
    pj_hlo_region_begin(H, sts, 4, a);
    pj_val_t pick = OR(CMP("GT", a[0], a[2]), AND(CMP("EQ", a[0], a[2]), CMP("LT", a[1], a[3])));
    pj_val_t rv[2] = {SEL(pick, a[0], a[2]), SEL(pick, a[1], a[3])};
    char *region = pj_hlo_region_end(H, rv, 2);
    int64_t bd[2] = {nb, d};
    pj_type_t outs[2] = {pj_type(ct, 2, bd), pj_type(PJ_I64, 2, bd)};
    pj_val_t ins[4] = {v, ki, pj_const(H, ct, -INFINITY), pj_const_i(H, PJ_I64, 0)}, res[2];
    if (!region) return NULL;
    pj_hlo_op_multi(H, "stablehlo.reduce", ins, 4, region, "dimensions = array<i64: 1>", outs, 2,
                    res);
    free(region);
    pj_val_t empty = CMP("EQ", pj_broadcast_in_dim(H, cnt, outs[0], &d0), pj_full(H, outs[0], 0));
    out = SEL(empty, pj_full(H, outs[0], 0), res[0]);
    int64_t bdn = nb * d;
    pj_val_t row = pj_gather_1d(H, idx, pj_reshape(H, res[1], 1, &bdn));
    maxi = SEL(empty, pj_full(H, outs[1], 0), pj_reshape(H, row, 2, bd));
  } else {
    if (pj_has(L, "per_sample_weights")) {
      int64_t kk = k;
      pj_val_t psw = pj_reshape(H, pj_convert(H, pj_tensor(L, "per_sample_weights"), ct), 1, &kk);
      rows = MUL(rows, pj_broadcast_in_dim(H, psw, rows.t, &d0));
    }
    out = matmul(L, m, rows, ct);
    if (mode == EB_MEAN) {
      pj_val_t c = pj_broadcast_in_dim(H, MAX(cnt, pj_full(H, cnt.t, 1)), out.t, &d0);
      out = DIV(out, c);
    }
  }
  pj_val_t bag_size = pj_convert(H, cnt, PJ_I64);
  if (maxi.id < 0) maxi = bag_size;
  pj_val_t v[4] = {out, seg, bag_size, maxi};
  /* the Meta kernel sizes bag_size (and mean's max_indices) by the offsets, one more than the
   * bags with include_last_offset: the extra entries are 0 */
  for (int i = 2; i < 4 && i < pj_nout(L); i++) {
    pj_type_t t = pj_out_type(L, i);
    if (t.rank == 1 && v[i].t.rank == 1 && t.dims[0] > v[i].t.dims[0]) {
      int64_t lo = 0, hi = t.dims[0] - v[i].t.dims[0], in = 0;
      v[i] = pj_pad(H, v[i], pj_const_i(H, PJ_I64, 0), &lo, &hi, &in);
    }
  }
  bool p[4] = {true, true, true, true};
  put_results(L, v, p, 4);
  return NULL;
}

/* _embedding_bag_backward / _embedding_bag_dense_backward (dense weight gradient). */
static pj_status_t *lower_embedding_bag_backward(pj_lower_t *L) {
  if (pj_bool(L, "sparse", false)) {
    pj_fail(L, PJ_ERR_UNIMPLEMENTED, "%s: sparse gradients are not supported on tpu", L->c->op);
    return NULL;
  }
  pj_type_t ot = pj_out_type(L, 0);
  pj_dtype_t ct = acc_of(ot.dtype);
  pj_val_t g = pj_convert(H, pj_tensor(L, "grad"), ct);              /* [B, D] */
  pj_val_t idx = pj_convert(H, pj_tensor(L, "indices"), PJ_I64);
  int64_t k = pj_type_numel(&idx.t), nb = g.t.dims[0], d = g.t.dims[1], nw = ot.dims[0];
  int64_t mode = pj_int(L, "mode", 0), pad = pj_int(L, "padding_idx", -1), d0 = 0, d1 = 1;
  idx = pj_reshape(H, idx, 1, &k);
  pj_val_t seg = pj_reshape(H, pj_convert(H, pj_tensor(L, "offset2bag"), PJ_I64), 1, &k);
  pj_val_t m = bag_mask(L, seg, idx, nb, pad, ct);
  pj_val_t cnt = pj_reduce(H, m, &d1, 1, "add");
  int64_t od[2] = {nw, d};
  pj_val_t z = pj_full(H, pj_type(ct, 2, od), 0);
  if (mode == EB_MAX) {
    int64_t bd = nb * d;
    pj_val_t mi = pj_reshape(H, pj_convert(H, pj_tensor(L, "maximum_indices"), PJ_I64), 1, &bd);
    pj_type_t it = pj_type(PJ_I64, 1, &bd);
    pj_val_t col = pj_reshape(H, pj_iota(H, pj_type(PJ_I64, 2, (int64_t[]){nb, d}), 1), 1, &bd);
    pj_val_t flat = ADD(MUL(mi, pj_full(H, it, (double)d)), col);
    pj_val_t keep = pj_broadcast_in_dim(H, CMP("GT", cnt, pj_full(H, cnt.t, 0)),
                                        pj_type(PJ_BOOL, 2, (int64_t[]){nb, d}), &d0);
    pj_val_t gv = pj_reshape(H, SEL(keep, g, pj_full(H, g.t, 0)), 1, &bd);
    int64_t nwd = nw * d;
    pj_val_t r = pj_scatter_1d(H, pj_reshape(H, z, 1, &nwd), flat, gv, "add");
    pj_set_result(L, 0, pj_reshape(H, r, 2, od));
    return NULL;
  }
  /* per index: the bag's gradient, weighted, averaged, masked (padding / outside any bag) */
  int64_t kb[2] = {k, nb};
  pj_val_t mt = pj_transpose(H, m, (int64_t[]){1, 0});               /* [K, B] */
  if (mode == EB_MEAN)
    mt = DIV(mt, pj_broadcast_in_dim(H, MAX(cnt, pj_full(H, cnt.t, 1)), pj_type(ct, 2, kb), &d1));
  pj_val_t gk = matmul(L, mt, g, ct);                               /* [K, D] */
  if (pj_has(L, "per_sample_weights")) {
    pj_val_t psw = pj_reshape(H, pj_convert(H, pj_tensor(L, "per_sample_weights"), ct), 1, &k);
    gk = MUL(gk, pj_broadcast_in_dim(H, psw, gk.t, &d0));
  }
  if (pj_bool(L, "scale_grad_by_freq", false)) {
    int64_t n1[2] = {nw, 1}, k1[2] = {k, 1};
    pj_val_t counts = scatter_rows_add(L, pj_full(H, pj_type(ct, 2, n1), 0), idx,
                                       pj_full(H, pj_type(ct, 2, k1), 1));
    int64_t nflat = nw;
    pj_val_t freq = pj_gather_1d(H, pj_reshape(H, counts, 1, &nflat), idx);
    gk = DIV(gk, pj_broadcast_in_dim(H, freq, gk.t, &d0));
  }
  pj_set_result(L, 0, scatter_rows_add(L, z, idx, gk));
  return NULL;
}

/* d output[bag(k)] / d per_sample_weights[k] = weight[indices[k]] (0 for padding). */
static pj_status_t *lower_embedding_bag_psw_backward(pj_lower_t *L) {
  pj_type_t ot = pj_out_type(L, 0);
  pj_dtype_t ct = acc_of(ot.dtype);
  pj_val_t g = pj_convert(H, pj_tensor(L, "grad"), ct);
  pj_val_t idx = pj_convert(H, pj_tensor(L, "indices"), PJ_I64);
  int64_t k = pj_type_numel(&idx.t), pad = pj_int(L, "padding_idx", -1), d1 = 1;
  idx = pj_reshape(H, idx, 1, &k);
  pj_val_t seg = pj_reshape(H, pj_convert(H, pj_tensor(L, "offset2bag"), PJ_I64), 1, &k);
  pj_val_t rows = take_rows(L, pj_convert(H, pj_tensor(L, "weight"), ct), idx);
  pj_val_t gr = take_rows(L, g, seg);
  pj_val_t r = pj_reduce(H, MUL(rows, gr), &d1, 1, "add");
  if (pad >= 0) r = SEL(CMP("EQ", idx, pj_full(H, idx.t, (double)pad)), pj_full(H, r.t, 0), r);
  pj_set_result(L, 0, pj_reshape(H, r, ot.rank, ot.dims));
  return NULL;
}

/* ---- nll_loss / nll_loss2d ---- */

/* Shared by forward and backward. self: [C], [N, C] or [N, C, d1, ...]; target: self's shape
 * without the class dim. Builds the one-hot selection of each target's class (ignored targets
 * select nothing) and the per-element class weight w[target] (0 where ignored). Out-of-range
 * targets (a device-side error on CPU) select nothing here. */
typedef struct {
  pj_val_t onehot; /* bool, self's shape */
  pj_val_t wt;     /* ct, target's shape */
  int cdim;
} nll_parts_t;

static void nll_parts(pj_lower_t *L, pj_type_t st, pj_dtype_t ct, nll_parts_t *p) {
  pj_val_t tgt = pj_convert(H, pj_tensor(L, "target"), PJ_I64);
  int64_t ignore = pj_int(L, "ignore_index", -100);
  p->cdim = st.rank == 1 ? 0 : 1;
  int64_t map[PJ_MAX_RANK];
  int n = 0;
  for (int i = 0; i < st.rank; i++)
    if (i != p->cdim) map[n++] = i;
  pj_val_t tb = pj_broadcast_in_dim(H, tgt, pj_type_with_dtype(st, PJ_I64), map);
  pj_val_t cls = pj_iota(H, pj_type_with_dtype(st, PJ_I64), p->cdim);
  pj_val_t valid = CMP("NE", tgt, pj_full(H, tgt.t, (double)ignore));
  p->onehot = pj_binary(H, "stablehlo.and", CMP("EQ", cls, tb),
                        pj_broadcast_in_dim(H, valid, pj_type_with_dtype(st, PJ_BOOL), map));
  if (pj_has(L, "weight")) {
    pj_val_t w = pj_convert(H, pj_tensor(L, "weight"), ct);
    /* w[target] as a sum over the one-hot class dim (exactly one term is nonzero) */
    pj_val_t wb = pj_broadcast_in_dim(H, w, pj_type_with_dtype(st, ct), (int64_t[]){p->cdim});
    int64_t cd = p->cdim;
    p->wt = pj_reduce(H, SEL(p->onehot, wb, pj_full(H, wb.t, 0)), &cd, 1, "add");
  } else {
    p->wt = pj_convert(H, valid, ct);
  }
}

/* dims = 0, 1, ..., rank - 1 (every dim, for a full reduction); rank <= PJ_MAX_RANK holds for
 * every value (the builder refuses larger types), the clamp keeps the array in bounds anyway. */
static const int64_t *all_dims(int64_t dims[PJ_MAX_RANK], int rank) {
  for (int i = 0; i < rank && i < PJ_MAX_RANK; i++) dims[i] = i;
  return dims;
}

static pj_status_t *lower_nll_loss(pj_lower_t *L) {
  pj_val_t x = pj_tensor(L, "self");
  pj_dtype_t ct = acc_of(x.t.dtype);
  x = pj_convert(H, x, ct);
  nll_parts_t p;
  nll_parts(L, x.t, ct, &p);
  int64_t cd = p.cdim;
  pj_check_index_except(L, pj_tensor(L, "target"), x.t.rank ? x.t.dims[cd] : 1, 0, false,
                        PJ_CHECK_TARGET, pj_int(L, "ignore_index", -100));
  pj_val_t picked = pj_reduce(H, SEL(p.onehot, x, cst(L, x, 0)), &cd, 1, "add");
  pj_val_t loss = U("negate", MUL(picked, p.wt));
  int64_t red = pj_int(L, "reduction", RED_MEAN);
  int64_t all[PJ_MAX_RANK];
  pj_val_t tw = pj_reduce(H, p.wt, all_dims(all, p.wt.t.rank), p.wt.t.rank, "add");
  pj_val_t out = loss;
  if (red != RED_NONE) {
    out = pj_reduce(H, loss, all_dims(all, loss.t.rank), loss.t.rank, "add");
    if (red == RED_MEAN) out = DIV(out, tw);
  } else {
    tw = cst(L, tw, 0); /* CPU leaves total_weight at 0 without reduction */
  }
  pj_val_t v[2] = {out, tw};
  bool pr[2] = {true, true};
  put_results(L, v, pr, 2);
  return NULL;
}

static pj_status_t *lower_nll_loss_backward(pj_lower_t *L) {
  pj_type_t ot = pj_out_type(L, 0);
  pj_dtype_t ct = acc_of(ot.dtype);
  pj_type_t st = pj_type_with_dtype(ot, ct);
  nll_parts_t p;
  nll_parts(L, st, ct, &p);
  int64_t red = pj_int(L, "reduction", RED_MEAN);
  pj_val_t g = pj_convert(H, pj_tensor(L, "grad_output"), ct);
  pj_val_t coef; /* per target element: -w[t] * g (/ total_weight) */
  if (red == RED_NONE) {
    coef = U("negate", MUL(p.wt, g));
  } else {
    pj_val_t gs = pj_reshape(H, g, 0, NULL);
    if (red == RED_MEAN)
      gs = DIV(gs, pj_reshape(H, pj_convert(H, pj_tensor(L, "total_weight"), ct), 0, NULL));
    coef = U("negate", MUL(p.wt, pj_broadcast_in_dim(H, gs, p.wt.t, NULL)));
  }
  int64_t map[PJ_MAX_RANK];
  int n = 0;
  for (int i = 0; i < st.rank; i++)
    if (i != p.cdim) map[n++] = i;
  pj_val_t cb = pj_broadcast_in_dim(H, coef, st, map);
  pj_set_result(L, 0, SEL(p.onehot, cb, pj_full(H, st, 0)));
  return NULL;
}

/* ---- elementwise losses ---- */

/* self and target (and weight) broadcast to their common shape, in the compute dtype. */
static void loss_operands(pj_lower_t *L, pj_dtype_t ct, pj_val_t *x, pj_val_t *t, pj_val_t *w) {
  pj_val_t a = pj_tensor(L, "self"), b = pj_tensor(L, "target");
  pj_val_t c = w && pj_has(L, "weight") ? pj_tensor(L, "weight") : (pj_val_t){.id = -1};
  int rank = a.t.rank > b.t.rank ? a.t.rank : b.t.rank;
  if (c.id >= 0 && c.t.rank > rank) rank = c.t.rank;
  int64_t dims[PJ_MAX_RANK];
  for (int i = 0; i < rank; i++) {
    dims[i] = 1;
    const pj_val_t *vs[3] = {&a, &b, &c};
    for (int j = 0; j < 3; j++) {
      const pj_val_t *v = vs[j];
      int off = rank - v->t.rank;
      if (v->id >= 0 && i >= off && v->t.dims[i - off] != 1) dims[i] = v->t.dims[i - off];
    }
  }
  *x = pj_broadcast_to(H, pj_convert(H, a, ct), rank, dims);
  *t = pj_broadcast_to(H, pj_convert(H, b, ct), rank, dims);
  if (w) *w = c.id >= 0 ? pj_broadcast_to(H, pj_convert(H, c, ct), rank, dims) : c;
}

static pj_val_t apply_reduction(pj_lower_t *L, pj_val_t l) {
  int64_t red = pj_int(L, "reduction", RED_MEAN);
  if (red == RED_NONE) return l;
  int64_t all[PJ_MAX_RANK];
  pj_val_t s = pj_reduce(H, l, all_dims(all, l.t.rank), l.t.rank, "add");
  if (red == RED_MEAN) s = DIV(s, pj_full(H, s.t, (double)pj_type_numel(&l.t)));
  return s;
}

/* grad_output broadcast to the elementwise shape, divided by the element count for mean. */
static pj_val_t reduction_grad(pj_lower_t *L, pj_val_t like) {
  pj_val_t g = pj_convert(H, pj_tensor(L, "grad_output"), like.t.dtype);
  g = pj_broadcast_to(H, g, like.t.rank, like.t.dims);
  if (pj_int(L, "reduction", RED_MEAN) == RED_MEAN)
    g = DIV(g, cst(L, g, (double)pj_type_numel(&like.t)));
  return g;
}

static pj_status_t *lower_mse_loss(pj_lower_t *L) {
  pj_dtype_t ct = acc_of(pj_out_type(L, 0).dtype);
  pj_val_t x, t;
  loss_operands(L, ct, &x, &t, NULL);
  pj_val_t d = SUB(x, t);
  if (!strcmp(L->c->op, "mse_loss")) {
    pj_set_result(L, 0, apply_reduction(L, MUL(d, d)));
  } else {
    pj_val_t g = reduction_grad(L, d);
    pj_set_result(L, 0, MUL(MUL(cst(L, d, 2), d), g));
  }
  return NULL;
}

/* binary_cross_entropy: -w (t log x + (1 - t) log(1 - x)), each log clamped at -100 as CPU
 * does so that x = 0 or 1 gives a finite loss. */
static pj_status_t *lower_bce(pj_lower_t *L) {
  pj_dtype_t ct = acc_of(pj_out_type(L, 0).dtype);
  pj_val_t x, t, w;
  loss_operands(L, ct, &x, &t, &w);
  pj_val_t one = cst(L, x, 1);
  if (!strcmp(L->c->op, "binary_cross_entropy")) {
    pj_val_t lx = MAX(U("log", x), cst(L, x, -100));
    pj_val_t l1x = MAX(U("log_plus_one", U("negate", x)), cst(L, x, -100));
    pj_val_t l = SUB(MUL(SUB(t, one), l1x), MUL(t, lx));
    if (w.id >= 0) l = MUL(l, w);
    pj_set_result(L, 0, apply_reduction(L, l));
  } else {
    /* d/dx = (x - t) / max(x (1 - x), 1e-12) */
    pj_val_t den = MAX(MUL(SUB(one, x), x), cst(L, x, 1e-12));
    pj_val_t gi = MUL(reduction_grad(L, x), DIV(SUB(x, t), den));
    if (w.id >= 0) gi = MUL(gi, w);
    pj_set_result(L, 0, gi);
  }
  return NULL;
}

/* smooth_l1_loss (beta) and huber_loss (delta), forward and backward. */
static pj_status_t *lower_smooth_l1_huber(pj_lower_t *L) {
  const char *op = L->c->op;
  bool huber = !strncmp(op, "huber", 5);
  bool bw = strstr(op, "_backward") != NULL;
  double k = huber ? pj_float(L, "delta", 1.0) : pj_float(L, "beta", 1.0);
  pj_dtype_t ct = acc_of(pj_out_type(L, 0).dtype);
  pj_val_t x, t;
  loss_operands(L, ct, &x, &t, NULL);
  pj_val_t d = SUB(x, t), ad = U("abs", d), kk = cst(L, d, k);
  if (!bw) {
    pj_val_t l;
    if (huber)
      l = SEL(CMP("LT", ad, kk), MUL(cst(L, d, 0.5), MUL(d, d)),
              MUL(kk, SUB(ad, cst(L, d, 0.5 * k))));
    else if (k == 0)
      l = ad;
    else
      l = SEL(CMP("LT", ad, kk), DIV(MUL(cst(L, d, 0.5), MUL(d, d)), kk),
              SUB(ad, cst(L, d, 0.5 * k)));
    pj_set_result(L, 0, apply_reduction(L, l));
    return NULL;
  }
  pj_val_t g = reduction_grad(L, d);
  pj_val_t s;
  pj_val_t pos = CMP("GT", d, kk), neg = CMP("LT", d, U("negate", kk));
  if (huber)
    s = SEL(pos, kk, SEL(neg, U("negate", kk), d));
  else if (k == 0)
    s = U("sign", d);
  else
    s = SEL(pos, cst(L, d, 1), SEL(neg, cst(L, d, -1), DIV(d, kk)));
  pj_set_result(L, 0, MUL(s, g));
  return NULL;
}

/* ---- shrink backwards ---- */

/* A Scalar argument (a runtime 0-d value) converted to t's dtype and broadcast to t. */
static pj_val_t scalar_like(pj_lower_t *L, const char *name, pj_type_t t) {
  return pj_broadcast_in_dim(H, pj_convert(H, pj_scalar(L, name), t.dtype), t, NULL);
}

/* softshrink_backward / hardshrink_backward: the gradient passes where |x| > lambd. */
static pj_status_t *lower_shrink_backward(pj_lower_t *L) {
  pj_type_t ot = pj_out_type(L, 0);
  pj_dtype_t ct = acc_of(ot.dtype);
  pj_val_t x = pj_convert(H, pj_tensor(L, "self"), ct);
  pj_val_t g = pj_tensor(L, pj_arg(L, "grad_out") ? "grad_out" : "grad_output");
  g = pj_broadcast_to(H, pj_convert(H, g, ct), ot.rank, ot.dims);
  x = pj_broadcast_to(H, x, ot.rank, ot.dims);
  pj_val_t lam = scalar_like(L, "lambd", x.t);
  pj_val_t inside = AND(CMP("GE", x, U("negate", lam)), CMP("LE", x, lam));
  pj_set_result(L, 0, SEL(inside, cst(L, g, 0), g));
  return NULL;
}

/* ---- margin losses (backward) ---- */

/* grad_output per sample [N] (reduction none) or a scalar broadcast to [N], divided by N for
 * mean and by `per` (the class count) always. */
static pj_val_t per_sample_grad(pj_lower_t *L, int64_t n, double per, pj_dtype_t ct) {
  pj_val_t g = pj_convert(H, pj_tensor(L, "grad_output"), ct);
  int64_t red = pj_int(L, "reduction", RED_MEAN);
  pj_type_t t = pj_type(ct, 1, &n);
  if (red == RED_NONE && pj_type_numel(&g.t) == n) {
    g = pj_reshape(H, g, 1, &n);
  } else {
    g = pj_broadcast_in_dim(H, pj_reshape(H, g, 0, NULL), t, NULL);
    if (red == RED_MEAN) per *= (double)n;
  }
  return DIV(g, pj_full(H, t, per));
}

/* multi_margin_loss: per sample, sum over j != y of max(0, margin - x[y] + x[j])^p * w[y],
 * divided by C. */
static pj_status_t *lower_multi_margin_backward(pj_lower_t *L) {
  pj_type_t ot = pj_out_type(L, 0);
  pj_dtype_t ct = acc_of(ot.dtype);
  pj_val_t x = pj_convert(H, pj_tensor(L, "self"), ct);
  int64_t c = x.t.rank ? x.t.dims[x.t.rank - 1] : 1, total = pj_type_numel(&x.t);
  int64_t n = c ? total / c : 0, nc[2] = {n, c};
  x = pj_reshape(H, x, 2, nc);
  pj_type_t t2 = x.t, i2 = pj_type_with_dtype(x.t, PJ_I64);
  int64_t d0 = 0, d1 = 1;
  pj_val_t tgt = pj_reshape(H, pj_convert(H, pj_tensor(L, "target"), PJ_I64), 1, &n);
  pj_val_t onehot = CMP("EQ", pj_iota(H, i2, 1), pj_broadcast_in_dim(H, tgt, i2, &d0));
  pj_val_t xy = pj_reduce(H, SEL(onehot, x, pj_full(H, t2, 0)), &d1, 1, "add");
  pj_val_t z = ADD(SUB(scalar_like(L, "margin", t2), pj_broadcast_in_dim(H, xy, t2, &d0)), x);
  pj_val_t active = AND(CMP("GT", z, pj_full(H, t2, 0)), U("not", onehot));
  /* p is 1 or 2 (checked by PyTorch before the backward exists) */
  pj_val_t h = SEL(CMP("EQ", scalar_like(L, "p", t2), pj_full(H, t2, 1)), pj_full(H, t2, 1),
                   MUL(pj_full(H, t2, 2), z));
  pj_val_t coef = per_sample_grad(L, n, (double)c, ct);
  if (pj_has(L, "weight")) {
    pj_val_t w = pj_broadcast_in_dim(H, pj_convert(H, pj_tensor(L, "weight"), ct), t2, &d1);
    coef = MUL(coef, pj_reduce(H, SEL(onehot, w, pj_full(H, t2, 0)), &d1, 1, "add"));
  }
  pj_val_t dj = SEL(active, MUL(h, pj_broadcast_in_dim(H, coef, t2, &d0)), pj_full(H, t2, 0));
  pj_val_t dy = U("negate", pj_reduce(H, dj, &d1, 1, "add"));
  pj_val_t gi = ADD(dj, SEL(onehot, pj_broadcast_in_dim(H, dy, t2, &d0), pj_full(H, t2, 0)));
  pj_set_result(L, 0, pj_reshape(H, gi, ot.rank, ot.dims));
  return NULL;
}

/* multilabel_margin_loss_forward (loss, is_target) and its backward: per sample, the targets
 * are target[0..k) up to the first negative entry; every (target t, non-target j) pair adds
 * max(0, 1 - x[t] + x[j]) / C. Built over [N, K, C] with K = C target slots. */
static pj_status_t *lower_multilabel_margin(pj_lower_t *L) {
  bool bw = strstr(L->c->op, "backward") != NULL;
  pj_val_t x = pj_tensor(L, "self");
  pj_dtype_t ct = acc_of(x.t.dtype);
  x = pj_convert(H, x, ct);
  pj_type_t xt0 = x.t;
  int64_t c = x.t.rank ? x.t.dims[x.t.rank - 1] : 1, total = pj_type_numel(&x.t);
  int64_t n = c ? total / c : 0, nc[2] = {n, c}, nkc[3] = {n, c, c};
  x = pj_reshape(H, x, 2, nc);
  pj_val_t tg = pj_reshape(H, pj_convert(H, pj_tensor(L, "target"), PJ_I64), 2, nc);
  pj_type_t i2 = tg.t, t3 = pj_type(ct, 3, nkc), i3 = pj_type(PJ_I64, 3, nkc);
  pj_type_t b3 = pj_type(PJ_BOOL, 3, nkc);
  int64_t d0 = 0, d1 = 1, d2 = 2, m01[2] = {0, 1}, m02[2] = {0, 2};
  /* slots before the first negative target are valid */
  pj_val_t kio = pj_iota(H, i2, 1);
  pj_val_t stop = pj_reduce(H, SEL(CMP("LT", tg, pj_full(H, i2, 0)), kio, pj_full(H, i2, (double)c)),
                            &d1, 1, "min");
  pj_val_t valid = CMP("LT", kio, pj_broadcast_in_dim(H, stop, i2, &d0)); /* [N, K] */
  pj_val_t onehot = AND(CMP("EQ", pj_broadcast_in_dim(H, tg, i3, m01), pj_iota(H, i3, 2)),
                        pj_broadcast_in_dim(H, valid, b3, m01)); /* [N, K, C] */
  pj_val_t xb = pj_broadcast_in_dim(H, x, t3, m02);
  pj_val_t xt = pj_reduce(H, SEL(onehot, xb, pj_full(H, t3, 0)), &d2, 1, "add"); /* [N, K] */
  pj_val_t z = ADD(SUB(pj_full(H, t3, 1), pj_broadcast_in_dim(H, xt, t3, m01)), xb);
  pj_val_t is_target = bw ? CMP("NE", pj_reshape(H, pj_convert(H, pj_tensor(L, "is_target"), ct),
                                                 2, nc),
                                pj_full(H, x.t, 0))
                          : pj_reduce(H, onehot, &d1, 1, "or"); /* [N, C] */
  pj_val_t m = AND(AND(CMP("GT", z, pj_full(H, t3, 0)), pj_broadcast_in_dim(H, valid, b3, m01)),
                   pj_broadcast_in_dim(H, U("not", is_target), b3, m02));
  if (!bw) {
    int64_t dd[2] = {1, 2};
    pj_val_t l = pj_reduce(H, SEL(m, z, pj_full(H, t3, 0)), dd, 2, "add"); /* [N] */
    l = DIV(l, cst(L, l, (double)c));
    int64_t red = pj_int(L, "reduction", RED_MEAN);
    if (red != RED_NONE) {
      l = pj_reduce(H, l, &d0, 1, "add");
      if (red == RED_MEAN) l = DIV(l, cst(L, l, (double)n));
    }
    pj_val_t it = pj_reshape(H, pj_convert(H, is_target, ct), xt0.rank, xt0.dims);
    pj_val_t v[2] = {l, it};
    bool pr[2] = {true, true};
    put_results(L, v, pr, 2);
    return NULL;
  }
  pj_type_t ot = pj_out_type(L, 0);
  pj_val_t mf = SEL(m, pj_full(H, t3, 1), pj_full(H, t3, 0));
  pj_val_t coef = pj_broadcast_in_dim(H, per_sample_grad(L, n, (double)c, ct), x.t, &d0);
  pj_val_t dj = pj_reduce(H, mf, &d1, 1, "add");                     /* [N, C]: per j */
  pj_val_t dk = pj_reduce(H, mf, &d2, 1, "add");                     /* [N, K]: per slot */
  pj_val_t dt = pj_reduce(H, SEL(onehot, pj_broadcast_in_dim(H, dk, t3, m01), pj_full(H, t3, 0)),
                          &d1, 1, "add");                            /* [N, C]: per class */
  pj_val_t gi = MUL(SUB(dj, dt), coef);
  pj_set_result(L, 0, pj_reshape(H, gi, ot.rank, ot.dims));
  return NULL;
}

/* ---- pairwise distances: cdist, pdist ---- */

/* p-norm over the last dim of d (differences). */
static pj_val_t pnorm_last(pj_lower_t *L, pj_val_t d, double p) {
  int64_t last = d.t.rank - 1;
  pj_val_t a = U("abs", d);
  if (p == 0)
    return pj_reduce(H, SEL(CMP("NE", a, cst(L, a, 0)), cst(L, a, 1), cst(L, a, 0)), &last, 1,
                     "add");
  if (p == 1) return pj_reduce(H, a, &last, 1, "add");
  if (p == 2) return U("sqrt", pj_reduce(H, MUL(d, d), &last, 1, "add"));
  if (isinf(p)) {
    pj_val_t mx = pj_reduce(H, a, &last, 1, "max");
    return MAX(mx, cst(L, mx, 0));
  }
  pj_val_t s = pj_reduce(H, pj_binary(H, "stablehlo.power", a, cst(L, a, p)), &last, 1, "add");
  return pj_binary(H, "stablehlo.power", s, cst(L, s, 1.0 / p));
}

/* d(dist)/d(diff) for differences d and their distance (broadcast to d), CPU's formulas. */
static pj_val_t pnorm_grad(pj_lower_t *L, pj_val_t d, pj_val_t dist, double p) {
  pj_val_t zero = cst(L, d, 0), a = U("abs", d), sg = U("sign", d);
  pj_val_t dist0 = CMP("EQ", dist, zero);
  if (p == 0) return zero;
  if (p == 1) return sg;
  if (isinf(p)) return MUL(sg, SEL(CMP("EQ", a, dist), cst(L, d, 1), zero));
  if (p == 2) return SEL(dist0, zero, DIV(d, dist));
  pj_val_t num = pj_binary(H, "stablehlo.power", a, cst(L, d, p - 1));
  pj_val_t den = pj_binary(H, "stablehlo.power", dist, cst(L, d, p - 1));
  pj_val_t r = DIV(MUL(sg, num), den);
  pj_val_t bad = dist0;
  if (p < 1) bad = OR(bad, CMP("EQ", d, zero));
  return SEL(bad, zero, r);
}

/* x [b..., n, m] broadcast to the batch dims of `batch` (rank rb + 2). */
static pj_val_t batch_to(pj_lower_t *L, pj_val_t x, const int64_t *bdims, int nb) {
  int64_t dims[PJ_MAX_RANK];
  for (int i = 0; i < nb; i++) dims[i] = bdims[i];
  dims[nb] = x.t.dims[x.t.rank - 2];
  dims[nb + 1] = x.t.dims[x.t.rank - 1];
  return pj_broadcast_to(H, x, nb + 2, dims);
}

/* diff[b..., i, j, m] = x1[b..., i, m] - x2[b..., j, m] */
static pj_val_t pair_diff(pj_lower_t *L, pj_val_t x1, pj_val_t x2) {
  int nb = x1.t.rank - 2;
  pj_type_t t = x1.t;
  t.rank = nb + 3;
  t.dims[nb + 1] = x2.t.dims[nb];
  t.dims[nb + 2] = x1.t.dims[nb + 1];
  int64_t m1[PJ_MAX_RANK], m2[PJ_MAX_RANK];
  for (int i = 0; i < nb; i++) m1[i] = m2[i] = i;
  m1[nb] = nb;
  m1[nb + 1] = nb + 2;
  m2[nb] = nb + 1;
  m2[nb + 1] = nb + 2;
  return SUB(pj_broadcast_in_dim(H, x1, t, m1), pj_broadcast_in_dim(H, x2, t, m2));
}

static pj_status_t *lower_cdist_forward(pj_lower_t *L) {
  pj_type_t ot = pj_out_type(L, 0);
  pj_dtype_t ct = acc_of(ot.dtype);
  int nb = ot.rank - 2;
  pj_val_t x1 = batch_to(L, pj_convert(H, pj_tensor(L, "x1"), ct), ot.dims, nb);
  pj_val_t x2 = batch_to(L, pj_convert(H, pj_tensor(L, "x2"), ct), ot.dims, nb);
  pj_set_result(L, 0, pnorm_last(L, pair_diff(L, x1, x2), pj_float(L, "p", 2)));
  return NULL;
}

/* Sums v over its leading dims that `t` broadcasts (absent or 1), reshaped to t. */
static pj_val_t sum_to(pj_lower_t *L, pj_val_t v, pj_type_t t) {
  int64_t dims[PJ_MAX_RANK];
  int n = 0, off = v.t.rank - t.rank;
  for (int i = 0; i < v.t.rank; i++)
    if (i < off || (t.dims[i - off] == 1 && v.t.dims[i] != 1)) dims[n++] = i;
  if (n) v = pj_reduce(H, v, dims, n, "add");
  return pj_reshape(H, v, t.rank, t.dims);
}

/* The name of the incoming gradient of _cdist_backward / _pdist_backward: `grad` in torch
 * 2.13's schemas, `grad_output` from 2.14 on (same position, same meaning). Arguments are
 * looked up by their schema names at run time, so asking which one is present serves both
 * releases from one build. */
static const char *dist_grad_name(pj_lower_t *L) {
  return pj_arg(L, "grad_output") ? "grad_output" : "grad";
}

/* Gradient for x1: sum over j of grad[i, j] * d(dist[i, j]) / d(x1[i]). */
static pj_status_t *lower_cdist_backward(pj_lower_t *L) {
  pj_type_t ot = pj_out_type(L, 0);
  pj_dtype_t ct = acc_of(ot.dtype);
  pj_val_t g = pj_convert(H, pj_tensor(L, dist_grad_name(L)), ct);
  pj_val_t dist = pj_convert(H, pj_tensor(L, "cdist"), ct);
  int nb = g.t.rank - 2;
  pj_val_t x1 = batch_to(L, pj_convert(H, pj_tensor(L, "x1"), ct), g.t.dims, nb);
  pj_val_t x2 = batch_to(L, pj_convert(H, pj_tensor(L, "x2"), ct), g.t.dims, nb);
  pj_val_t d = pair_diff(L, x1, x2);
  int64_t map[PJ_MAX_RANK];
  for (int i = 0; i < nb + 2; i++) map[i] = i;
  pj_val_t db = pj_broadcast_in_dim(H, dist, d.t, map);
  pj_val_t gb = pj_broadcast_in_dim(H, g, d.t, map);
  pj_val_t c = MUL(gb, pnorm_grad(L, d, db, pj_float(L, "p", 2)));
  int64_t rd = nb + 1;
  pj_set_result(L, 0, sum_to(L, pj_reduce(H, c, &rd, 1, "add"), ot));
  return NULL;
}

/* A 1-D int64 constant. */
static pj_val_t const_i64(pj_lower_t *L, const int64_t *v, int64_t n) {
  pj_sb_t b = {0};
  pj_type_t t = pj_type(PJ_I64, 1, &n);
  char ts[64];
  pj_sb_puts(&b, "value = dense<[");
  for (int64_t i = 0; i < n; i++) pj_sb_printf(&b, i ? ", %lld" : "%lld", (long long)v[i]);
  pj_sb_printf(&b, "]> : %s", pj_type_str(&t, ts, sizeof ts));
  char *attrs = pj_sb_take(&b, NULL);
  if (!attrs) return pj_fail(L, PJ_ERR_OOM, "out of memory building a constant");
  pj_val_t r = pj_hlo_op(H, "stablehlo.constant", NULL, 0, attrs, t);
  free(attrs);
  return r;
}

/* pdist pairs (i, j), i < j in row-major order, as flat element indices i*m + k and j*m + k,
 * [K, m] each. */
static bool pdist_pairs(pj_lower_t *L, int64_t n, int64_t m, pj_val_t *ei, pj_val_t *ej) {
  int64_t k = n * (n - 1) / 2;
  int64_t *pi = malloc(sizeof(int64_t) * (size_t)(k > 0 ? 2 * k : 1));
  if (!pi) {
    pj_fail(L, PJ_ERR_OOM, "out of host memory building pdist pairs");
    return false;
  }
  int64_t q = 0;
  for (int64_t i = 0; i < n; i++)
    for (int64_t j = i + 1; j < n; j++) {
      pi[q] = i;
      pi[k + q] = j;
      q++;
    }
  pj_val_t vi = const_i64(L, pi, k), vj = const_i64(L, pi + k, k);
  free(pi);
  int64_t km[2] = {k, m}, d0 = 0;
  pj_type_t t = pj_type(PJ_I64, 2, km);
  pj_val_t col = pj_iota(H, t, 1), mm = pj_full(H, t, (double)m);
  *ei = ADD(MUL(pj_broadcast_in_dim(H, vi, t, &d0), mm), col);
  *ej = ADD(MUL(pj_broadcast_in_dim(H, vj, t, &d0), mm), col);
  return true;
}

static pj_status_t *lower_pdist(pj_lower_t *L) {
  bool bw = strstr(L->c->op, "backward") != NULL;
  pj_type_t ot = pj_out_type(L, 0);
  pj_dtype_t ct = acc_of(ot.dtype);
  pj_val_t x = pj_convert(H, pj_tensor(L, "self"), ct);
  if (x.id < 0 || x.t.rank != 2) {
    pj_fail(L, PJ_ERR_RUNTIME, "pdist only supports 2D tensors, got: %dD", x.t.rank);
    return NULL;
  }
  int64_t n = x.t.dims[0], m = x.t.dims[1], nm = n * m, k = n * (n - 1) / 2, d0 = 0;
  if (k == 0 || m == 0) { /* nothing to gather: zero distances / gradients */
    pj_set_result(L, 0, pj_full(H, pj_type_with_dtype(ot, ct), 0));
    return NULL;
  }
  pj_val_t ei, ej;
  if (!pdist_pairs(L, n, m, &ei, &ej)) return NULL;
  pj_val_t flat = pj_reshape(H, x, 1, &nm);
  pj_val_t d = SUB(pj_gather_1d(H, flat, ei), pj_gather_1d(H, flat, ej)); /* [K, m] */
  double p = pj_float(L, "p", 2);
  if (!bw) {
    pj_set_result(L, 0, pnorm_last(L, d, p));
    return NULL;
  }
  pj_val_t g = pj_reshape(H, pj_convert(H, pj_tensor(L, dist_grad_name(L)), ct), 1, &k);
  pj_val_t dist = pj_reshape(H, pj_convert(H, pj_tensor(L, "pdist"), ct), 1, &k);
  pj_val_t c = MUL(pj_broadcast_in_dim(H, g, d.t, &d0),
                   pnorm_grad(L, d, pj_broadcast_in_dim(H, dist, d.t, &d0), p));
  pj_val_t acc = pj_scatter_1d(H, pj_full(H, flat.t, 0), ei, c, "add");
  acc = pj_scatter_1d(H, acc, ej, U("negate", c), "add");
  pj_set_result(L, 0, pj_reshape(H, acc, ot.rank, ot.dims));
  return NULL;
}

/* ---- CTC loss ---- */

/* Lengths (int[] or a tensor) as an int64 [N] value. */
static pj_val_t ctc_lengths(pj_lower_t *L, const char *name, int64_t n) {
  const pj_arg_t *a = pj_arg(L, name);
  if (a && a->kind == PJ_ARG_TENSOR)
    return pj_reshape(H, pj_convert(H, pj_tensor(L, name), PJ_I64), 1, &n);
  int64_t v[1024];
  int k = pj_ints(L, name, v, 1024);
  if (k != n) {
    pj_fail(L, PJ_ERR_RUNTIME, "%s: %s must have %lld entries", L->c->op, name, (long long)n);
    return (pj_val_t){.id = -1, .sub = -1};
  }
  return const_i64(L, v, n);
}

/* log(exp(a) + exp(b) + exp(c)) elementwise, -inf when all are -inf */
static pj_val_t lse3(pj_lower_t *L, pj_val_t a, pj_val_t b, pj_val_t c) {
  pj_val_t m = MAX(MAX(a, b), c);
  pj_val_t ninf = cst(L, m, -INFINITY);
  pj_val_t ms = SEL(CMP("EQ", m, ninf), cst(L, m, 0), m);
  pj_val_t s = ADD(ADD(U("exponential", SUB(a, ms)), U("exponential", SUB(b, ms))),
                   U("exponential", SUB(c, ms)));
  return ADD(U("log", s), ms);
}

/* x shifted right by k along dim 1 (the label dim), -inf shifted in (k < 0: left). */
static pj_val_t shift_s(pj_lower_t *L, pj_val_t x, int k) {
  int64_t s = x.t.dims[1];
  int64_t lo[2] = {0, k > 0 ? k : 0}, hi[2] = {0, k < 0 ? -k : 0}, in[2] = {0, 0};
  pj_val_t p = pj_pad(H, x, pj_const(H, x.t.dtype, -INFINITY), lo, hi, in);
  int64_t st[2] = {0, k < 0 ? -k : 0}, en[2] = {x.t.dims[0], (k < 0 ? -k : 0) + s};
  return pj_slice(H, p, st, en, NULL);
}

typedef struct {
  int64_t t, n, c, sp;  /* sp = 2 * max target length + 1 */
  pj_val_t lpe;         /* [T, N, S'] log prob of each extended label */
  pj_val_t ext;         /* [N, S'] extended labels (int64) */
  pj_val_t skip;        /* [N, S'] bool: the s-2 transition is allowed */
  pj_val_t valid_s;     /* [N, S'] bool: s < 2 * target length + 1 */
  pj_val_t il, tl;      /* [N] int64 */
  pj_val_t lp;          /* [T, N, C] */
} ctc_t;

static bool ctc_setup(pj_lower_t *L, pj_dtype_t ct, ctc_t *q) {
  pj_val_t lp = pj_convert(H, pj_tensor(L, "log_probs"), ct);
  if (lp.id < 0 || lp.t.rank != 3) {
    pj_fail(L, PJ_ERR_UNIMPLEMENTED, "%s: log_probs must be [T, N, C]", L->c->op);
    return false;
  }
  q->lp = lp;
  q->t = lp.t.dims[0];
  q->n = lp.t.dims[1];
  q->c = lp.t.dims[2];
  q->il = ctc_lengths(L, "input_lengths", q->n);
  q->tl = ctc_lengths(L, "target_lengths", q->n);
  pj_val_t tg = pj_convert(H, pj_tensor(L, "targets"), PJ_I64);
  if (!pj_hlo_ok(H)) return false;
  int64_t n = q->n, d0 = 0, d1 = 1;
  /* per-sample targets as [N, Smax]: 2-D as given; 1-D concatenated ones by offsets */
  int64_t smax;
  pj_val_t tg2;
  if (tg.t.rank == 2) {
    smax = tg.t.dims[1];
    tg2 = tg;
  } else {
    smax = tg.t.dims[0] > 0 ? tg.t.dims[0] : 1;
    int64_t nn[2] = {n, n}, ns[2] = {n, smax};
    pj_type_t tn = pj_type(PJ_I64, 2, nn), ts = pj_type(PJ_I64, 2, ns);
    /* exclusive prefix sum of target lengths */
    pj_val_t lower = CMP("LT", pj_iota(H, tn, 1), pj_iota(H, tn, 0));
    pj_val_t off = pj_reduce(H, SEL(lower, pj_broadcast_in_dim(H, q->tl, tn, &d1), pj_full(H, tn, 0)),
                             &d1, 1, "add");
    pj_val_t pos = ADD(pj_broadcast_in_dim(H, off, ts, &d0), pj_iota(H, ts, 1));
    int64_t tot = tg.t.dims[0];
    if (tot == 0) tg2 = pj_full(H, ts, 0);
    else tg2 = pj_gather_1d(H, pj_reshape(H, tg, 1, &tot),
                            MIN(pos, pj_full(H, ts, (double)(tot - 1))));
  }
  /* S' = 2 * max(target_lengths) + 1, as sized by the Meta kernel (log_alpha's last dim) */
  const pj_tensor_desc_t *la = pj_arg(L, "log_alpha") ? pj_tensor_desc(L, "log_alpha") : NULL;
  q->sp = la ? la->sizes[2] : pj_out_type(L, 1).dims[2];
  int64_t nsp[2] = {n, q->sp};
  pj_type_t ti = pj_type(PJ_I64, 2, nsp);
  pj_val_t sidx = pj_iota(H, ti, 1);
  pj_val_t k = pj_binary(H, "stablehlo.divide", SUB(sidx, pj_full(H, ti, 1)), pj_full(H, ti, 2));
  k = MAX(MIN(k, pj_full(H, ti, (double)(smax - 1))), pj_full(H, ti, 0));
  int64_t nsm = n * smax;
  pj_val_t rowoff = MUL(pj_iota(H, ti, 0), pj_full(H, ti, (double)smax));
  pj_val_t lab = pj_gather_1d(H, pj_reshape(H, tg2, 1, &nsm), ADD(rowoff, k));
  pj_val_t odd = CMP("EQ", pj_binary(H, "stablehlo.remainder", sidx, pj_full(H, ti, 2)),
                     pj_full(H, ti, 1));
  pj_val_t blank = pj_full(H, ti, (double)pj_int(L, "blank", 0));
  q->ext = SEL(odd, lab, blank);
  pj_val_t prev = pj_gather_1d(H, pj_reshape(H, tg2, 1, &nsm),
                               ADD(rowoff, MAX(SUB(k, pj_full(H, ti, 1)), pj_full(H, ti, 0))));
  q->skip = AND(AND(odd, CMP("GE", sidx, pj_full(H, ti, 2))), CMP("NE", lab, prev));
  pj_val_t lim = ADD(MUL(pj_broadcast_in_dim(H, q->tl, ti, &d0), pj_full(H, ti, 2)),
                     pj_full(H, ti, 1));
  q->valid_s = CMP("LT", sidx, lim);
  /* lpe[t, n, s] = lp[t, n, ext[n, s]] */
  int64_t tns[3] = {q->t, n, q->sp}, m12[2] = {1, 2};
  pj_type_t t3 = pj_type(PJ_I64, 3, tns);
  pj_val_t flat = ADD(ADD(MUL(pj_iota(H, t3, 0), pj_full(H, t3, (double)(n * q->c))),
                          MUL(pj_iota(H, t3, 1), pj_full(H, t3, (double)q->c))),
                      pj_broadcast_in_dim(H, q->ext, t3, m12));
  int64_t all = q->t * n * q->c;
  q->lpe = pj_gather_1d(H, pj_reshape(H, lp, 1, &all), flat);
  return pj_hlo_ok(H);
}

/* x[t] of a [T, A, B] value at a 0-d int64 t */
static pj_val_t ctc_at(pj_lower_t *L, pj_val_t x, pj_val_t t) {
  char attrs[96];
  snprintf(attrs, sizeof attrs, "slice_sizes = array<i64: 1, %lld, %lld>",
           (long long)x.t.dims[1], (long long)x.t.dims[2]);
  pj_val_t z = pj_const_i(H, PJ_I64, 0);
  pj_val_t ins[4] = {x, t, z, z};
  pj_type_t st = x.t;
  st.dims[0] = 1;
  pj_val_t r = pj_hlo_op(H, "stablehlo.dynamic_slice", ins, 4, attrs, st);
  return pj_reshape(H, r, 2, &x.t.dims[1]);
}

/* x with x[t] = v */
static pj_val_t ctc_put(pj_lower_t *L, pj_val_t x, pj_val_t v, pj_val_t t) {
  int64_t d3[3] = {1, x.t.dims[1], x.t.dims[2]};
  pj_val_t z = pj_const_i(H, PJ_I64, 0);
  pj_val_t ins[5] = {x, pj_reshape(H, v, 3, d3), t, z, z};
  return pj_hlo_op(H, "stablehlo.dynamic_update_slice", ins, 5, NULL, x.t);
}

/* stablehlo.while over st[0..n) with st[0] the 0-d int64 time: runs body while
 * (down ? t >= 0 : t < limit); regions see only their block arguments. */
typedef void (*ctc_body_fn)(pj_lower_t *L, pj_val_t *st);
static void ctc_loop(pj_lower_t *L, pj_val_t *st, int n, int64_t limit, bool down,
                     ctc_body_fn body) {
  pj_type_t ts[10];
  pj_val_t a[10], res[10];
  for (int i = 0; i < n; i++) ts[i] = st[i].t;
  pj_hlo_region_begin(H, ts, n, a);
  pj_val_t p = down ? CMP("GE", a[0], pj_const_i(H, PJ_I64, 0))
                    : CMP("LT", a[0], pj_const_i(H, PJ_I64, limit));
  char *cr = pj_hlo_region_end(H, &p, 1);
  pj_hlo_region_begin(H, ts, n, a);
  body(L, a);
  a[0] = ADD(a[0], pj_const_i(H, PJ_I64, down ? -1 : 1));
  char *br = pj_hlo_region_end(H, a, n);
  if (cr && br) {
    size_t len = strlen(cr) + strlen(br) + 4;
    char *both = malloc(len);
    if (both) {
      snprintf(both, len, "%s, %s", cr, br);
      if (pj_hlo_op_multi(H, "stablehlo.while", st, n, both, NULL, ts, n, res))
        for (int i = 0; i < n; i++) st[i] = res[i];
      free(both);
    } else {
      pj_fail(L, PJ_ERR_OOM, "out of host memory");
    }
  }
  free(cr);
  free(br);
}

static pj_val_t bcast0(pj_lower_t *L, pj_val_t s, pj_type_t t) {
  return pj_broadcast_in_dim(H, s, pj_type_with_dtype(t, s.t.dtype), NULL);
}

/* forward state: t, a, fin, all, lpe, skip (0 / -inf), valid, il */
static void ctc_alpha_body(pj_lower_t *L, pj_val_t *st) {
  pj_val_t a = st[1], ninf = cst(L, a, -INFINITY);
  pj_val_t e = ctc_at(L, st[4], st[0]);
  pj_val_t nxt = ADD(e, lse3(L, a, shift_s(L, a, 1), ADD(shift_s(L, a, 2), st[5])));
  pj_val_t tt = bcast0(L, st[0], st[7].t);
  nxt = SEL(AND(st[6], CMP("LT", tt, st[7])), nxt, ninf);
  st[2] = SEL(CMP("EQ", tt, SUB(st[7], pj_full(H, st[7].t, 1))), nxt, st[2]);
  st[3] = ctc_put(L, st[3], nxt, st[0]);
  st[1] = nxt;
}

/* alpha over all t: [T, N, S'], -inf outside the valid (t, s) ranges; also the negative log
 * likelihood [N]. */
static void ctc_alpha(pj_lower_t *L, const ctc_t *q, pj_val_t *alpha, pj_val_t *nll) {
  int64_t nsp[2] = {q->n, q->sp}, d0 = 0, d1 = 1;
  pj_type_t tf = pj_type(q->lpe.t.dtype, 2, nsp), ti = pj_type(PJ_I64, 2, nsp);
  pj_val_t ninf = pj_full(H, tf, -INFINITY);
  pj_val_t ilb = pj_broadcast_in_dim(H, q->il, ti, &d0);
  pj_val_t zero_t = pj_const_i(H, PJ_I64, 0);
  pj_val_t a0 = SEL(CMP("LT", pj_iota(H, ti, 1), pj_full(H, ti, 2)), ctc_at(L, q->lpe, zero_t),
                    ninf);
  a0 = SEL(AND(q->valid_s, CMP("LT", pj_full(H, ti, 0), ilb)), a0, ninf);
  pj_val_t fin = SEL(CMP("EQ", pj_full(H, ti, 0), SUB(ilb, pj_full(H, ti, 1))), a0, ninf);
  pj_val_t all = ctc_put(L, pj_full(H, q->lpe.t, -INFINITY), a0, zero_t);
  pj_val_t st[8] = {pj_const_i(H, PJ_I64, 1), a0, fin, all, q->lpe,
                    SEL(q->skip, pj_full(H, tf, 0), ninf), q->valid_s, ilb};
  ctc_loop(L, st, 8, q->t, false, ctc_alpha_body);
  *alpha = st[3];
  fin = st[2];
  /* end in the last label or the blank after it */
  pj_val_t lim = ADD(MUL(pj_broadcast_in_dim(H, q->tl, ti, &d0), pj_full(H, ti, 2)),
                     pj_full(H, ti, 1));
  pj_val_t sidx = pj_iota(H, ti, 1);
  pj_val_t last = OR(CMP("EQ", sidx, SUB(lim, pj_full(H, ti, 1))),
                     CMP("EQ", sidx, SUB(lim, pj_full(H, ti, 2))));
  pj_val_t f = SEL(last, fin, ninf);
  pj_val_t m = pj_reduce(H, f, &d1, 1, "max");
  pj_val_t ms = SEL(CMP("EQ", m, cst(L, m, -INFINITY)), cst(L, m, 0), m);
  pj_val_t s = pj_reduce(H, U("exponential", SUB(f, pj_broadcast_in_dim(H, ms, tf, &d0))), &d1, 1,
                         "add");
  *nll = U("negate", ADD(U("log", s), ms));
}

/* backward state: t, b, all, lpe, skip_next (0 / -inf), valid, last, il */
static void ctc_beta_body(pj_lower_t *L, pj_val_t *st) {
  pj_val_t b = st[1], ninf = cst(L, b, -INFINITY);
  pj_val_t e = ctc_at(L, st[3], st[0]);
  pj_val_t tt = bcast0(L, st[0], st[7].t);
  pj_val_t endt = SUB(st[7], pj_full(H, st[7].t, 1));
  pj_val_t init = SEL(st[6], e, ninf);
  pj_val_t rec = ADD(e, lse3(L, b, shift_s(L, b, -1), ADD(shift_s(L, b, -2), st[4])));
  pj_val_t nb = SEL(CMP("EQ", tt, endt), init, SEL(CMP("LT", tt, endt), rec, ninf));
  nb = SEL(st[5], nb, ninf);
  st[2] = ctc_put(L, st[2], nb, st[0]);
  st[1] = nb;
}

static pj_val_t ctc_zero_inf(pj_lower_t *L, pj_val_t nll, pj_val_t v) {
  if (!pj_bool(L, "zero_infinity", false)) return v;
  int64_t d0 = 0;
  pj_val_t inf = CMP("EQ", nll, cst(L, nll, INFINITY));
  if (v.t.rank == 1) return SEL(inf, cst(L, v, 0), v);
  /* v [T, N, C]: per sample n on dim 1 */
  (void)d0;
  int64_t d1 = 1;
  pj_val_t b = pj_broadcast_in_dim(H, inf, pj_type_with_dtype(v.t, PJ_BOOL), &d1);
  return SEL(b, cst(L, v, 0), v);
}

static pj_status_t *lower_ctc_loss(pj_lower_t *L) {
  pj_dtype_t ct = acc_of(pj_out_type(L, 0).dtype);
  ctc_t q;
  if (!ctc_setup(L, ct, &q)) return NULL;
  pj_val_t alpha, nll;
  ctc_alpha(L, &q, &alpha, &nll);
  nll = ctc_zero_inf(L, nll, nll);
  /* log_alpha is [N, T, S'] */
  int64_t perm[3] = {1, 0, 2};
  pj_val_t la = alpha.id >= 0 ? pj_transpose(H, alpha, perm) : alpha;
  pj_val_t v[2] = {nll, la};
  bool p[2] = {true, true};
  put_results(L, v, p, 2);
  return NULL;
}

/* grad[t, n, c] = (exp(lp) - exp(log sum_{s: ext_s = c} exp(alpha + beta) + nll - lp)) * g[n],
 * 0 for t >= input length; alpha is recomputed, beta runs the recursion backwards in time. */
static pj_status_t *lower_ctc_loss_backward(pj_lower_t *L) {
  pj_type_t ot = pj_out_type(L, 0);
  pj_dtype_t ct = acc_of(ot.dtype);
  ctc_t q;
  if (!ctc_setup(L, ct, &q)) return NULL;
  pj_val_t alpha, nll;
  ctc_alpha(L, &q, &alpha, &nll);
  if (alpha.id < 0) return NULL;
  int64_t nsp[2] = {q.n, q.sp}, d0 = 0, d1 = 1;
  pj_type_t tf = pj_type(ct, 2, nsp), ti = pj_type(PJ_I64, 2, nsp);
  pj_val_t ninf = pj_full(H, tf, -INFINITY);
  pj_val_t ilb = pj_broadcast_in_dim(H, q.il, ti, &d0);
  pj_val_t lim = ADD(MUL(pj_broadcast_in_dim(H, q.tl, ti, &d0), pj_full(H, ti, 2)),
                     pj_full(H, ti, 1));
  pj_val_t sidx = pj_iota(H, ti, 1);
  pj_val_t last = OR(CMP("EQ", sidx, SUB(lim, pj_full(H, ti, 1))),
                     CMP("EQ", sidx, SUB(lim, pj_full(H, ti, 2))));
  pj_val_t skip_next = shift_s(L, SEL(q.skip, pj_full(H, tf, 0), ninf), -2); /* allow s -> s+2 */
  pj_val_t st[8] = {pj_const_i(H, PJ_I64, q.t - 1), ninf, pj_full(H, q.lpe.t, -INFINITY), q.lpe,
                    skip_next, q.valid_s, last, ilb};
  ctc_loop(L, st, 8, 0, true, ctc_beta_body);
  pj_val_t beta = st[2];
  pj_val_t ab = ADD(alpha, beta); /* [T, N, S'] */
  int64_t d2 = 2;
  pj_val_t m = pj_reduce(H, ab, &d2, 1, "max"); /* [T, N] */
  pj_val_t ms = SEL(CMP("EQ", m, cst(L, m, -INFINITY)), cst(L, m, 0), m);
  int64_t m01[2] = {0, 1};
  pj_val_t ex = U("exponential", SUB(ab, pj_broadcast_in_dim(H, ms, ab.t, m01)));
  /* sum over s with ext[n, s] == c: batched over n, [N, T, S'] x [N, S', C] */
  int64_t nsc[3] = {q.n, q.sp, q.c}, m12[2] = {0, 1};
  pj_type_t t3 = pj_type(PJ_I64, 3, nsc);
  pj_val_t oh = CMP("EQ", pj_broadcast_in_dim(H, q.ext, t3, m12), pj_iota(H, t3, 2));
  pj_val_t ohf = SEL(oh, pj_full(H, pj_type(ct, 3, nsc), 1), pj_full(H, pj_type(ct, 3, nsc), 0));
  int64_t perm[3] = {1, 0, 2};
  pj_val_t exn = pj_transpose(H, ex, perm); /* [N, T, S'] */
  int64_t lb = 0, rb = 0, lc = 2, rc = 1;
  pj_val_t sc = pj_dot_general(H, exn, ohf, &lb, &rb, 1, &lc, &rc, 1, ct); /* [N, T, C] */
  sc = pj_transpose(H, sc, perm);                                        /* [T, N, C] */
  int64_t m01b[2] = {0, 1};
  pj_val_t lcab = ADD(U("log", sc), pj_broadcast_in_dim(H, ms, sc.t, m01b));
  pj_val_t lp = q.lp;
  pj_val_t nllb = pj_broadcast_in_dim(H, nll, lp.t, &d1);
  pj_val_t g = pj_reshape(H, pj_convert(H, pj_tensor(L, "grad"), ct), 1, &q.n);
  pj_val_t gb = pj_broadcast_in_dim(H, g, lp.t, &d1);
  pj_val_t r = MUL(SUB(U("exponential", lp), U("exponential", SUB(ADD(lcab, nllb), lp))), gb);
  int64_t tn[2] = {q.t, q.n};
  pj_type_t tnt = pj_type(PJ_I64, 2, tn);
  pj_val_t tvalid = CMP("LT", pj_iota(H, tnt, 0), pj_broadcast_in_dim(H, q.il, tnt, &d1));
  r = SEL(pj_broadcast_in_dim(H, tvalid, pj_type_with_dtype(lp.t, PJ_BOOL), m01b), r,
          pj_full(H, lp.t, 0));
  r = ctc_zero_inf(L, nll, r);
  (void)d0;
  pj_set_result(L, 0, r);
  return NULL;
}

const pj_lowering_entry_t pj_lowerings_nn[] = {
    {"native_layer_norm", lower_layer_norm, PJ_SHAPE_EXACT},
    {"native_layer_norm_backward", lower_layer_norm_backward, PJ_SHAPE_EXACT},
    {"native_group_norm", lower_group_norm, PJ_SHAPE_EXACT},
    {"native_group_norm_backward", lower_group_norm_backward, PJ_SHAPE_EXACT},
    {"_weight_norm_interface", lower_weight_norm, PJ_SHAPE_EXACT},
    {"_weight_norm_interface_backward", lower_weight_norm_backward, PJ_SHAPE_EXACT},
    {"_native_batch_norm_legit", lower_batch_norm_legit, PJ_SHAPE_EXACT},
    {"native_batch_norm", lower_batch_norm_legit, PJ_SHAPE_EXACT},
    {"_native_batch_norm_legit_no_training", lower_batch_norm_legit, PJ_SHAPE_EXACT},
    {"_batch_norm_with_update", lower_batch_norm_update, PJ_SHAPE_EXACT},
    {"native_batch_norm_backward", lower_batch_norm_backward, PJ_SHAPE_EXACT},
    {"batch_norm_backward", lower_batch_norm_backward, PJ_SHAPE_EXACT},
    {"embedding_dense_backward", lower_embedding_dense_backward, PJ_SHAPE_EXACT},
    {"_embedding_bag", lower_embedding_bag, PJ_SHAPE_EXACT},
    {"_embedding_bag_forward_only", lower_embedding_bag, PJ_SHAPE_EXACT},
    {"_embedding_bag_backward", lower_embedding_bag_backward, PJ_SHAPE_EXACT},
    {"_embedding_bag_dense_backward", lower_embedding_bag_backward, PJ_SHAPE_EXACT},
    {"_embedding_bag_per_sample_weights_backward", lower_embedding_bag_psw_backward, PJ_SHAPE_EXACT},
    {"nll_loss_forward", lower_nll_loss, PJ_SHAPE_EXACT},
    {"nll_loss2d_forward", lower_nll_loss, PJ_SHAPE_EXACT},
    {"nll_loss_backward", lower_nll_loss_backward, PJ_SHAPE_EXACT},
    {"nll_loss2d_backward", lower_nll_loss_backward, PJ_SHAPE_EXACT},
    {"mse_loss", lower_mse_loss, PJ_SHAPE_EXACT},
    {"mse_loss_backward", lower_mse_loss, PJ_SHAPE_EXACT},
    {"binary_cross_entropy", lower_bce, PJ_SHAPE_EXACT},
    {"binary_cross_entropy_backward", lower_bce, PJ_SHAPE_EXACT},
    {"smooth_l1_loss", lower_smooth_l1_huber, PJ_SHAPE_EXACT},
    {"smooth_l1_loss_backward", lower_smooth_l1_huber, PJ_SHAPE_EXACT},
    {"huber_loss", lower_smooth_l1_huber, PJ_SHAPE_EXACT},
    {"huber_loss_backward", lower_smooth_l1_huber, PJ_SHAPE_EXACT},
    {"softshrink_backward", lower_shrink_backward, PJ_SHAPE_EXACT},
    {"hardshrink_backward", lower_shrink_backward, PJ_SHAPE_EXACT},
    {"multi_margin_loss_backward", lower_multi_margin_backward, PJ_SHAPE_EXACT},
    {"multilabel_margin_loss_forward", lower_multilabel_margin, PJ_SHAPE_EXACT},
    {"multilabel_margin_loss_backward", lower_multilabel_margin, PJ_SHAPE_EXACT},
    {"_cdist_forward", lower_cdist_forward, PJ_SHAPE_EXACT},
    {"_cdist_backward", lower_cdist_backward, PJ_SHAPE_EXACT},
    {"_pdist_forward", lower_pdist, PJ_SHAPE_EXACT},
    {"_pdist_backward", lower_pdist, PJ_SHAPE_EXACT},
    {"_ctc_loss", lower_ctc_loss, PJ_SHAPE_EXACT},
    {"_ctc_loss_backward", lower_ctc_loss_backward, PJ_SHAPE_EXACT},
    {NULL, NULL, PJ_SHAPE_EXACT},
};
