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
  pj_val_t mean = sum_range(L, x, axis, x.t.rank);
  mean = DIV(mean, cst(L, mean, n));
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
  pj_val_t mean = sum_range(L, x, 2, 3);
  mean = DIV(mean, cst(L, mean, (double)s.d));
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
    mean = sum_except(L, x, cdim);
    mean = DIV(mean, cst(L, mean, count));
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

static pj_status_t *lower_nll_loss(pj_lower_t *L) {
  pj_val_t x = pj_tensor(L, "self");
  pj_dtype_t ct = acc_of(x.t.dtype);
  x = pj_convert(H, x, ct);
  nll_parts_t p;
  nll_parts(L, x.t, ct, &p);
  int64_t cd = p.cdim;
  pj_val_t picked = pj_reduce(H, SEL(p.onehot, x, cst(L, x, 0)), &cd, 1, "add");
  pj_val_t loss = U("negate", MUL(picked, p.wt));
  int64_t red = pj_int(L, "reduction", RED_MEAN);
  pj_val_t tw = pj_reduce(H, p.wt, (int64_t[]){0, 1, 2, 3, 4, 5, 6, 7}, p.wt.t.rank, "add");
  pj_val_t out = loss;
  if (red != RED_NONE) {
    out = pj_reduce(H, loss, (int64_t[]){0, 1, 2, 3, 4, 5, 6, 7}, loss.t.rank, "add");
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
  int64_t all[PJ_MAX_RANK] = {0, 1, 2, 3, 4, 5, 6, 7};
  pj_val_t s = pj_reduce(H, l, all, l.t.rank, "add");
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

const pj_lowering_entry_t pj_lowerings_nn[] = {
    {"native_layer_norm", lower_layer_norm},
    {"native_layer_norm_backward", lower_layer_norm_backward},
    {"native_group_norm", lower_group_norm},
    {"native_group_norm_backward", lower_group_norm_backward},
    {"_native_batch_norm_legit", lower_batch_norm_legit},
    {"native_batch_norm", lower_batch_norm_legit},
    {"_native_batch_norm_legit_no_training", lower_batch_norm_legit},
    {"_batch_norm_with_update", lower_batch_norm_update},
    {"native_batch_norm_backward", lower_batch_norm_backward},
    {"batch_norm_backward", lower_batch_norm_backward},
    {"embedding_dense_backward", lower_embedding_dense_backward},
    {"nll_loss_forward", lower_nll_loss},
    {"nll_loss2d_forward", lower_nll_loss},
    {"nll_loss_backward", lower_nll_loss_backward},
    {"nll_loss2d_backward", lower_nll_loss_backward},
    {"mse_loss", lower_mse_loss},
    {"mse_loss_backward", lower_mse_loss},
    {"binary_cross_entropy", lower_bce},
    {"binary_cross_entropy_backward", lower_bce},
    {"smooth_l1_loss", lower_smooth_l1_huber},
    {"smooth_l1_loss_backward", lower_smooth_l1_huber},
    {"huber_loss", lower_smooth_l1_huber},
    {"huber_loss_backward", lower_smooth_l1_huber},
    {NULL, NULL},
};
